"""Streamed chat turns (Accept: text/event-stream) read over real HTTP from the live server:
events arrive as the turn runs, the last one is the stored turn, and what the client does
with its connection changes nothing that is stored."""
from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest

from kinsite.llm.providers import ScriptedProvider, provider_override
from kinsite.services import api_token_issue
from sessions_app.models import Event, Turn
from tests.factories import KinFactory, SessionFactory, TeamFactory
from tests.support.sse import sse_events

pytestmark = pytest.mark.usefixtures("empty_cache")

STREAM = {"Accept": "text/event-stream"}


class HeldProvider(ScriptedProvider):
    """A scripted model that stops streaming after `hold_after` pieces of text until the
    test sets `release` (`held` is set once it waits)."""

    def __init__(self, *args, hold_after: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.hold_after = hold_after
        self.held = threading.Event()
        self.release = threading.Event()

    def chat(self, messages, *, on_delta=None, **kwargs):
        if on_delta is None:
            return super().chat(messages, **kwargs)
        sent = 0

        def hold_then_pass(piece: str) -> None:
            nonlocal sent
            on_delta(piece)
            sent += 1
            if sent == self.hold_after:
                self.held.set()
                assert self.release.wait(10), "the test never released the model"

        return super().chat(messages, on_delta=hold_then_pass, **kwargs)


@pytest.fixture
def stream_setup(transactional_db, live_server):
    team = TeamFactory()
    session = SessionFactory(kin=KinFactory(team=team))
    _, raw = api_token_issue(team=team, name="stream")
    client = httpx.Client(base_url=live_server.url, headers={"Authorization": f"Bearer {raw}"}, timeout=10)
    yield session, client
    client.close()


@pytest.fixture
def held_model() -> Iterator[HeldProvider]:
    provider = HeldProvider(hold_after=2)
    with provider_override(provider):
        yield provider


def _post_stream(client: httpx.Client, session, content: str):
    return client.stream("POST", f"/api/v1/sessions/{session.pk}/messages/", json={"content": content},
                         headers=STREAM)


def test_deltas_arrive_before_the_turn_ends_and_the_last_event_is_the_stored_turn(stream_setup, held_model):
    session, client = stream_setup
    held_model.add("Hello there, streaming friend.")
    with _post_stream(client, session, "hi") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        events = sse_events(response)
        first = next(events)
        deltas = [next(events), next(events)]
        # The model is held after two pieces: the turn is still running and nothing is stored.
        assert held_model.held.wait(5)
        turn = Turn.objects.get(session=session)
        assert turn.status == Turn.Status.RUNNING and turn.reply_id is None
        held_model.release.set()
        rest = list(events)

    assert first.event == "message" and first.data["content"] == "hi" and first.data["role"] == "user"
    assert [e.event for e in deltas] == ["delta", "delta"]
    assert [e.event for e in rest[:-1]] == ["delta"] * (len(rest) - 1)
    assert "".join(e.data["text"] for e in deltas + rest[:-1]) == "Hello there, streaming friend."
    done = rest[-1]
    assert done.event == "done"
    turn_json = client.get(f"/api/v1/turns/{turn.pk}/").json()
    assert done.data == {"message": turn_json["message"], "reply": turn_json["reply"], "turn": turn_json}
    assert turn_json["status"] == "done" and turn_json["reply"]["content"] == "Hello there, streaming friend."
    assert list(Event.objects.filter(session=session).values_list("role", "content").order_by("id")) == [
        ("user", "hi"), ("assistant", "Hello there, streaming friend."),
    ]
    ids = [e.id for e in [first, *deltas, *rest]]
    assert all(ids) and len(set(ids[:-1])) == len(ids) - 1  # each event but the last has its own id
