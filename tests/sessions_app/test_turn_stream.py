"""Streamed chat turns (Accept: text/event-stream) read over real HTTP from the live server:
events arrive as the turn runs, the last one is the stored turn, and what the client does
with its connection changes nothing that is stored. Also: a streamed post made inside a
transaction (the test client's), GET /turns/{id}/events/ refusing a client that wants JSON
only, and the schema declaring the streams as they are sent."""
from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from kinsite.llm.providers import provider_override
from kinsite.llm.types import LLMHTTPError
from kinsite.services import api_token_issue
from sessions_app.models import Event, Turn
from tests.factories import KinFactory, SessionFactory, TeamFactory
from tests.sessions_app.test_api_access import assert_api_error
from tests.support.held_model import HeldProvider
from tests.support.sse import parse_sse, sse_events

pytestmark = pytest.mark.usefixtures("empty_cache")

STREAM = {"Accept": "text/event-stream"}


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


# --- inside a transaction, through Django's test client (which reads a stream whole) ------------


def _post_stream_in_test_client(api_client, session, content: str, query: str = ""):
    return api_client.post(f"/api/v1/sessions/{session.pk}/messages/{query}", {"content": content},
                           format="json", HTTP_ACCEPT="text/event-stream")


@pytest.mark.parametrize("query", ["", "?format=sse"])
def test_a_streamed_post_inside_a_transaction_streams_the_whole_turn(api_client, chat_session, model, query):
    # The test's transaction holds the session uncommitted: the turn cannot run on another connection.
    model.add("Hello there, streaming friend.")

    response = _post_stream_in_test_client(api_client, chat_session, "hi", query)

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/event-stream")
    events = parse_sse(b"".join(response.streaming_content))
    assert [e.event for e in events[:1] + events[-1:]] == ["message", "done"]
    assert {e.event for e in events[1:-1]} == {"delta"}
    assert "".join(e.data["text"] for e in events[1:-1]) == "Hello there, streaming friend."
    turn = Turn.objects.get(session=chat_session)
    turn_json = api_client.get(f"/api/v1/turns/{turn.pk}/").json()
    assert turn_json["status"] == "done" and turn_json["reply"]["content"] == "Hello there, streaming friend."
    assert events[-1].data == {"message": turn_json["message"], "reply": turn_json["reply"], "turn": turn_json}
    assert events[0].data == turn_json["message"]


def test_a_failed_event_read_does_not_end_the_stream_the_stored_turn_does(api_client, chat_session, model,
                                                                          monkeypatch):
    """Redis away while a client follows: the reads fail, the stream goes on from the stored
    turn and ends with `done` (the reply whole), not with an error the user would resend over."""
    model.add("Stored whatever happens to the bus.")

    def unreadable(*args, **kwargs):
        raise ConnectionError("Redis went away")

    monkeypatch.setattr("sessions_app.turns.stream.turn_events_read", unreadable)
    response = _post_stream_in_test_client(api_client, chat_session, "hi")

    events = parse_sse(b"".join(response.streaming_content))
    assert [e.event for e in events] == ["message", "done"]
    assert events[-1].data["reply"]["content"] == "Stored whatever happens to the bus."


def test_a_streamed_post_inside_a_transaction_whose_model_fails_ends_with_the_error(api_client, chat_session, model):
    model.add(LLMHTTPError("the model endpoint said no", status_code=400))

    response = _post_stream_in_test_client(api_client, chat_session, "hi")

    assert response.status_code == 200
    events = parse_sse(b"".join(response.streaming_content))
    assert [e.event for e in events] == ["message", "error"]
    turn = Turn.objects.get(session=chat_session)
    error = events[-1].data["error"]
    assert error["code"] == "llm_error" and "the model endpoint said no" in error["message"]
    assert error["details"] == {"turn": turn.pk, "message": turn.user_message_id, "stored": True}
    assert turn.status == Turn.Status.FAILED and turn.user_message.content == "hi"


# --- GET /turns/{id}/events/: the stream, or 406 for a client that wants JSON only ---------------


@pytest.fixture
def finished_turn(api_client, chat_session, model) -> Turn:
    model.add("Done already.")
    assert api_client.post(f"/api/v1/sessions/{chat_session.pk}/messages/", {"content": "hi"},
                           format="json").status_code == 201
    return Turn.objects.get(session=chat_session)


@pytest.mark.parametrize("query, accept", [
    ("?format=json", None),
    ("", "application/json"),
])
def test_turn_events_answer_406_to_a_client_that_wants_json_only(api_client, finished_turn, query, accept):
    headers = {"HTTP_ACCEPT": accept} if accept else {}

    response = api_client.get(f"/api/v1/turns/{finished_turn.pk}/events/{query}", **headers)

    error = assert_api_error(response, 406, code="not_acceptable")
    assert f"/api/v1/turns/{finished_turn.pk}/" in error["message"]


@pytest.mark.parametrize("query, accept", [
    ("", None), ("", "*/*"), ("", "text/event-stream"), ("", "application/json, text/event-stream"),
    ("?format=sse", None),
])
def test_turn_events_stream_to_any_client_that_takes_a_stream(api_client, finished_turn, query, accept):
    headers = {"HTTP_ACCEPT": accept} if accept else {}

    response = api_client.get(f"/api/v1/turns/{finished_turn.pk}/events/{query}", **headers)

    assert response.status_code == 200 and response["Content-Type"].startswith("text/event-stream")
    events = parse_sse(b"".join(response.streaming_content))
    assert [events[0].event, events[-1].event] == ["message", "done"]
    assert events[-1].data["reply"]["content"] == "Done already."


def test_the_schema_declares_event_streams_only_where_the_api_streams(api_client):
    schema = api_client.get("/api/v1/schema/?format=json").json()

    streams = {
        (path, method, code): media["text/event-stream"]["schema"]
        for path, operations in schema["paths"].items()
        for method, operation in operations.items()
        for code, answer in operation["responses"].items()
        if "text/event-stream" in (media := answer.get("content", {}))
    }
    assert set(streams) == {
        ("/api/v1/sessions/{session_id}/messages/", "post", "200"),
        ("/api/v1/turns/{turn_id}/events/", "get", "200"),
    }
    for event in streams.values():  # one event each: OpenAPI 3.0 describes a stream event by event
        assert event["type"] == "object" and event["required"] == ["id", "event", "data"]
        assert event["properties"]["data"]["type"] == "string"  # the event's JSON, as sent
        assert set(event["properties"]["event"]["enum"]) == {
            "message", "delta", "tool_call", "tool_result", "reset", "done", "error",
        }
    events_answers = schema["paths"]["/api/v1/turns/{turn_id}/events/"]["get"]["responses"]
    assert list(events_answers["406"]["content"]) == ["application/json"]
