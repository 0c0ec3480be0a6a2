"""Issue 16, acceptance 1: streamed chat turns end to end over HTTP on both sides. The real
OpenAI-compatible client (settings.LLM_BASE_URL) streams from the fake model server's
chunks, and the API is read with httpx, event by event as they arrive, from both servers:
live_server (WSGI) and the ASGI application under uvicorn (what the Procfile runs).

Also what a follower sees when turn ids repeat (a recreated database over a Redis that kept
the old turns' events) and when a turn runs again (turns/events.py: one stream per turn row,
a `reset` event before a re-run's events)."""
from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import httpx
import pytest
import uvicorn
from django.core.asgi import get_asgi_application
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.utils import timezone

from kinsite.services import api_token_issue
from memories.models import Memory
from sessions_app.models import Event, Turn
from sessions_app.turns.events import DELTA, turn_event_publish
from sessions_app.turns.jobs import turns_recover_stalled
from tests.factories import KinFactory, SessionFactory, TeamFactory
from tests.support.fake_openai import FakeOpenAIServer
from tests.support.sse import ServerSentEvent, sse_events

pytestmark = pytest.mark.usefixtures("empty_cache")

STREAM = {"Accept": "text/event-stream"}
REPLY_PIECES = ["Hello", " there,", " streaming", " friend."]
REPLY = "".join(REPLY_PIECES)
# Chunks the fake model sends before it holds: the role chunk and two pieces of text.
HOLD_AFTER = 3
# How long a test waits for something another thread does (a wait, not a speed limit).
WAIT_SECONDS = 10


@pytest.fixture
def model_server(settings) -> Iterator[FakeOpenAIServer]:
    """The fake model server as the configured endpoint: turns go through the provider the
    settings build, over HTTP. The timeout outlasts a held stream; no retries, so each model
    call is one scripted answer."""
    with FakeOpenAIServer() as server:
        settings.LLM_BASE_URL = server.base_url
        settings.LLM_API_KEY = "test-key"
        settings.LLM_MODEL = "fake-model"
        settings.LLM_EMBEDDING_MODEL = ""
        settings.LLM_TIMEOUT_SECONDS = WAIT_SECONDS
        settings.LLM_MAX_RETRIES = 0
        yield server


class AsgiServer:
    """The project's ASGI application under uvicorn, in a thread of this process (as
    live_server runs the WSGI one): the production web process serves streams this way
    (Procfile: gunicorn with uvicorn workers), as async generators on an event loop."""

    def __init__(self) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0))
        config = uvicorn.Config(get_asgi_application(), lifespan="off", log_level="warning",
                                timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]},
                                       name="asgi-test-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.socket.getsockname()[1]}"

    def start(self) -> None:
        self.thread.start()
        wait_until(lambda: self.server.started, "the ASGI server to start")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(WAIT_SECONDS)
        self.socket.close()


@pytest.fixture(scope="module")
def asgi_server() -> Iterator[AsgiServer]:
    # As kinsite/asgi.py sets for production: no persistent connections, since each request
    # runs in a thread of its own (one kept open would outlive its thread, and block the
    # test database's removal).
    database = connections.settings[DEFAULT_DB_ALIAS]
    previous = database["CONN_MAX_AGE"]
    database["CONN_MAX_AGE"] = 0
    server = AsgiServer()
    server.start()
    yield server
    server.stop()
    database["CONN_MAX_AGE"] = previous


@pytest.fixture(params=["wsgi", "asgi"])
def server_url(request, transactional_db) -> str:
    """Each test runs against both servers: live_server (WSGI, a thread per stream) and
    uvicorn (ASGI, the production one)."""
    return request.getfixturevalue("live_server" if request.param == "wsgi" else "asgi_server").url


@pytest.fixture
def api(transactional_db, server_url) -> Iterator[tuple[object, httpx.Client]]:
    """A session and an httpx client of its team on the server."""
    team = TeamFactory()
    session = SessionFactory(kin=KinFactory(team=team))
    _, raw = api_token_issue(team=team, name="stream-http")
    client = httpx.Client(base_url=server_url, headers={"Authorization": f"Bearer {raw}"}, timeout=WAIT_SECONDS)
    yield session, client
    client.close()


def post_streamed(client: httpx.Client, session, content: str):
    return client.stream("POST", f"/api/v1/sessions/{session.pk}/messages/", json={"content": content},
                         headers=STREAM)


def follow(client: httpx.Client, turn_id: int, last_event_id: str | None = None):
    headers = {**STREAM, "Last-Event-ID": last_event_id} if last_event_id else STREAM
    return client.stream("GET", f"/api/v1/turns/{turn_id}/events/", headers=headers)


def take(events: Iterator[ServerSentEvent], count: int) -> list[ServerSentEvent]:
    return [next(events) for _ in range(count)]


def texts(events: list[ServerSentEvent]) -> str:
    return "".join(event.data["text"] for event in events if event.event == "delta")


def wait_until(check, what: str):
    deadline = time.monotonic() + WAIT_SECONDS
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return value


def assert_done_is_the_stored_turn(client: httpx.Client, done: ServerSentEvent, turn_id: int) -> dict:
    assert done.event == "done"
    turn_json = client.get(f"/api/v1/turns/{turn_id}/").json()
    assert done.data == {"message": turn_json["message"], "reply": turn_json["reply"], "turn": turn_json}
    return turn_json


# --- acceptance 1 ------------------------------------------------------------------------------


def test_deltas_arrive_while_the_model_still_streams_and_done_is_the_stored_turn(api, model_server):
    session, client = api
    resume = model_server.stream(pieces=REPLY_PIECES, hold_after=HOLD_AFTER)
    with post_streamed(client, session, "hi") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response)
        message, *early = take(events, 3)
        # The model sent two pieces and holds: the client has them, the turn has no reply yet.
        assert [e.event for e in early] == ["delta", "delta"] and texts(early) == "Hello there,"
        assert len(model_server.received[0].chunks_sent_at) == HOLD_AFTER
        turn_id = Turn.objects.get(session=session).pk
        running = client.get(f"/api/v1/turns/{turn_id}/").json()
        assert running["status"] == "running" and running["reply"] is None
        resume.set()
        rest = list(events)

    assert message.event == "message" and message.data["content"] == "hi" and message.data["role"] == "user"
    assert [e.event for e in rest] == ["delta", "delta", "done"]
    turn_json = assert_done_is_the_stored_turn(client, rest[-1], turn_id)
    assert turn_json["status"] == "done"
    assert texts(early + rest) == turn_json["reply"]["content"] == REPLY
    assert message.data == turn_json["message"]
    # The real client asked the endpoint for a stream.
    assert model_server.requests[0]["stream"] is True


def test_a_client_that_disconnects_mid_stream_still_gets_its_reply_stored(api, model_server):
    session, client = api
    resume = model_server.stream(pieces=REPLY_PIECES, hold_after=HOLD_AFTER)
    with post_streamed(client, session, "hi, then gone") as response:
        events = sse_events(response)
        assert [e.event for e in take(events, 3)] == ["message", "delta", "delta"]
    # The client is gone; only then does the model go on.
    turn = Turn.objects.get(session=session)
    assert turn.status == Turn.Status.RUNNING
    resume.set()

    wait_until(lambda: Turn.objects.filter(pk=turn.pk, status=Turn.Status.DONE).exists(), "the turn to finish")
    turn.refresh_from_db()
    assert turn.reply.content == REPLY and turn.error == ""
    assert list(Event.objects.filter(session=session).order_by("id").values_list("role", "content")) == [
        ("user", "hi, then gone"), ("assistant", REPLY),
    ]
    # A client coming back gets the whole turn.
    with follow(client, turn.pk) as response:
        again = list(sse_events(response))
    assert texts(again) == REPLY
    assert_done_is_the_stored_turn(client, again[-1], turn.pk)


@pytest.mark.parametrize("break_with", ["drop", "error", "garbage"])
def test_a_model_error_mid_stream_ends_with_an_error_event_and_keeps_the_message(api, model_server, break_with):
    session, client = api
    # The role chunk and two pieces, then the connection drops, an error object or a broken chunk.
    model_server.stream(pieces=REPLY_PIECES, break_after=HOLD_AFTER, break_with=break_with)
    with post_streamed(client, session, "this will break") as response:
        assert response.status_code == 200
        received = list(sse_events(response))

    assert [e.event for e in received] == ["message", "delta", "delta", "error"]
    assert texts(received) == "Hello there,"
    error = received[-1].data
    turn = Turn.objects.get(session=session)
    message = Event.objects.get(session=session)  # the user's message, and no reply
    assert set(error) == {"error"} and set(error["error"]) == {"code", "message", "details"}
    assert error["error"]["code"] == "llm_error"
    assert error["error"]["details"] == {"turn": turn.pk, "message": message.pk, "stored": True}
    assert f"message {message.pk}" in error["error"]["message"] and turn.error in error["error"]["message"]
    assert (message.role, message.content) == ("user", "this will break")
    assert turn.status == Turn.Status.FAILED and turn.reply is None and turn.user_message == message
    assert "broke off" in turn.error
    assert client.get(f"/api/v1/turns/{turn.pk}/").json()["status"] == "failed"


def test_a_tool_call_streamed_in_fragments_shows_as_tool_events_before_the_reply(api, model_server):
    session, client = api
    arguments = {"content": "Maria prefers weekly reports.", "category": "preference", "subject": "Maria"}
    model_server.stream(tool_calls=[{"name": "memorize", "arguments": arguments, "id": "call_w1"}])
    model_server.stream(pieces=["Noted:", " weekly", " reports."])
    with post_streamed(client, session, "Remember: I like weekly reports.") as response:
        received = list(sse_events(response))

    assert [e.event for e in received] == ["message", "tool_call", "tool_result", "delta", "delta", "delta", "done"]
    call, result = received[1].data, received[2].data
    # The arguments came in 8-character fragments and were put back together.
    assert len(json.dumps(arguments)) > 8
    assert (call["id"], call["name"], json.loads(call["arguments"])) == ("call_w1", "memorize", arguments)
    assert (result["id"], result["name"]) == ("call_w1", "memorize") and '"status": "created"' in result["content"]
    turn_json = assert_done_is_the_stored_turn(client, received[-1], received[-1].data["turn"]["id"])
    assert turn_json["reply"]["content"] == texts(received) == "Noted: weekly reports."
    assert turn_json["tool_calls"] == 1
    assert Memory.objects.get().content == "Maria prefers weekly reports."
    # The model's second call carried the tool's answer.
    second = model_server.requests_to("chat")[1]["messages"]
    assert second[-1] == {"role": "tool", "tool_call_id": "call_w1", "content": result["content"]}


def test_an_async_post_is_followed_to_done_and_last_event_id_resumes_without_repeats(api, model_server):
    session, client = api
    resume = model_server.stream(pieces=REPLY_PIECES, hold_after=HOLD_AFTER)
    # With eager tasks (both test passes) the 202 comes once the turn is done: post from a thread.
    posted: dict = {}
    poster = threading.Thread(target=lambda: posted.update(response=client.post(
        f"/api/v1/sessions/{session.pk}/messages/?async=1", json={"content": "async hi"})))
    poster.start()
    try:
        wait_until(lambda: len(model_server.received) == 1 and
                   len(model_server.received[0].chunks_sent_at) == HOLD_AFTER, "the model to hold")
        turn = Turn.objects.get(session=session)
        assert turn.is_async

        # A follower while the model holds: the message and the two pieces so far; then it goes.
        with follow(client, turn.pk) as response:
            first = take(sse_events(response), 3)
        assert [e.event for e in first] == ["message", "delta", "delta"]
        assert first[0].data["content"] == "async hi"

        # It comes back after the first piece: the second piece again, nothing before it.
        with follow(client, turn.pk, last_event_id=first[1].id) as response:
            events = sse_events(response)
            second_piece = next(events)
            resume.set()
            rest = list(events)
    finally:
        resume.set()
        poster.join(WAIT_SECONDS)

    assert posted["response"].status_code == 202
    assert (second_piece.event, second_piece.id, second_piece.data) == ("delta", first[2].id, first[2].data)
    assert [e.event for e in rest] == ["delta", "delta", "done"]
    assert texts([first[1], second_piece, *rest]) == REPLY
    turn_json = assert_done_is_the_stored_turn(client, rest[-1], turn.pk)
    assert turn_json["reply"]["content"] == REPLY and turn_json["is_async"] is True
    ids = [e.id for e in [first[0], first[1], second_piece, *rest[:-1]]]
    assert len(set(ids)) == len(ids)

    # Resuming after the last delta of a finished turn: only the last event.
    with follow(client, turn.pk, last_event_id=rest[-2].id) as response:
        assert [e.event for e in sse_events(response)] == ["done"]


# --- one event stream per turn row, and per attempt ----------------------------------------------


def restart_turn_ids(at: int) -> None:
    """The next turn gets id `at`, as in a database created again (a test run, a restored
    backup, a bench run) while Redis kept the events of the old database's turns."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT setval(pg_get_serial_sequence('sessions_app_turn', 'id'), %s, false)", [at])
        else:
            cursor.execute("UPDATE sqlite_sequence SET seq = %s WHERE name = 'sessions_app_turn'", [at - 1])


def test_a_new_turn_with_an_old_turns_id_streams_only_its_own_events(api, model_server):
    session, client = api
    # An old turn streams two pieces and fails: its events (deltas, a failed end) stay behind.
    model_server.stream(pieces=["Stale", " words", " here"], break_after=HOLD_AFTER, break_with="error")
    with post_streamed(client, session, "old question") as response:
        assert [e.event for e in sse_events(response)] == ["message", "delta", "delta", "error"]
    old_id = Turn.objects.get(session=session).pk
    Turn.objects.filter(pk=old_id).delete()
    restart_turn_ids(old_id)

    resume = model_server.stream(pieces=REPLY_PIECES, hold_after=HOLD_AFTER)
    with post_streamed(client, session, "new question") as response:
        events = sse_events(response)
        early = take(events, 3)
        turn = Turn.objects.get(session=session)
        assert turn.pk == old_id and turn.status == Turn.Status.RUNNING
        resume.set()
        received = early + list(events)

    assert [e.event for e in received] == ["message", "delta", "delta", "delta", "delta", "done"]
    assert received[0].data["content"] == "new question"
    assert texts(received) == REPLY
    assert_done_is_the_stored_turn(client, received[-1], turn.pk)
    with follow(client, turn.pk) as response:
        again = list(sse_events(response))
    assert [e.event for e in again] == [e.event for e in received] and texts(again) == REPLY


def test_a_turn_run_again_streams_a_reset_then_its_new_attempt(api, model_server):
    session, client = api
    message = Event.objects.create(session=session, role=Event.Role.USER, content="are you there?")
    # The process running the turn's first attempt streamed a piece of its reply, then died.
    turn = Turn.objects.create(session=session, user_message=message, status=Turn.Status.RUNNING, attempts=1,
                               started_at=timezone.now() - timedelta(hours=1))
    turn_event_publish(turn, DELTA, {"text": "Partial answ"})
    model_server.stream(pieces=REPLY_PIECES)

    with follow(client, turn.pk) as response:
        events = sse_events(response)
        before = take(events, 2)
        assert [e.event for e in before] == ["message", "delta"] and texts(before) == "Partial answ"
        # The stalled sweep takes the turn over and sends its task again (run here: tasks are eager).
        assert turns_recover_stalled().requeued == [turn.pk]
        after = list(events)

    # This follower showed the first attempt's text: it is told to drop it.
    assert [e.event for e in after] == ["reset", "delta", "delta", "delta", "delta", "done"]
    assert after[0].data == {"attempt": 2}
    assert texts(after) == REPLY
    turn_json = assert_done_is_the_stored_turn(client, after[-1], turn.pk)
    assert turn_json["reply"]["content"] == REPLY

    # A follower from the start sees the last attempt only, with nothing to drop.
    with follow(client, turn.pk) as response:
        fresh = list(sse_events(response))
    assert [e.event for e in fresh] == ["message", "delta", "delta", "delta", "delta", "done"]
    assert texts(fresh) == REPLY
    # One resuming after the first attempt's piece gets the reset first.
    with follow(client, turn.pk, last_event_id=before[1].id) as response:
        resumed = list(sse_events(response))
    assert [e.event for e in resumed][:2] == ["reset", "delta"] and texts(resumed) == REPLY
