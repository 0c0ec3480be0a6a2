"""The turn-event bus (sessions_app/turns/events.py) on its own: the in-memory store stays
bounded (turns, events per turn, age), a Redis that fails or hangs pauses publishing
instead of slowing every delta of a turn, and an event's JSON survives a lone surrogate."""
import json
import time
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from sessions_app.turns import events
from sessions_app.turns.stream import sse_event


@pytest.fixture
def store(monkeypatch):
    store = events._MemoryStore()
    monkeypatch.setattr(events, "_memory", store)
    return store


def a_turn(pk: int) -> SimpleNamespace:
    return SimpleNamespace(pk=pk, created_at=datetime(2026, 12, 4, 12, 0, pk, tzinfo=UTC))


def kinds(store, turn) -> list[str]:
    return [event.kind for event in store.read(events.turn_stream(turn), after=None, timeout=0)]


def test_the_memory_store_keeps_the_newest_turns_only(store, monkeypatch, settings):
    settings.REDIS_URL = ""
    monkeypatch.setattr(events, "MEMORY_MAX_TURNS", 2)
    turns = [a_turn(n) for n in (1, 2, 3)]
    for turn in turns:
        events.turn_event_publish(turn, events.DELTA, {"text": "hi"})
    assert [kinds(store, turn) for turn in turns] == [[], ["delta"], ["delta"]]


def test_the_memory_store_drops_turns_idle_longer_than_the_retention(store, monkeypatch, settings):
    settings.REDIS_URL = ""
    monkeypatch.setattr(events, "RETAIN_SECONDS", 0.05)
    old, new = a_turn(1), a_turn(2)
    events.turn_event_publish(old, events.DELTA, {"text": "old"})
    time.sleep(0.1)
    events.turn_event_publish(new, events.DELTA, {"text": "new"})
    assert kinds(store, old) == [] and kinds(store, new) == ["delta"]


def test_past_the_cap_a_turn_keeps_only_its_end(store, monkeypatch, settings):
    settings.REDIS_URL = ""
    monkeypatch.setattr(events, "MAX_EVENTS_PER_TURN", 3)
    turn = a_turn(1)
    for number in range(5):
        events.turn_event_publish(turn, events.DELTA, {"text": str(number)})
    events.turn_event_publish(turn, events.END, {"status": "done", "code": ""})
    assert kinds(store, turn) == ["delta", "delta", "delta", "end"]


def test_a_failed_publish_pauses_publishing_instead_of_waiting_on_every_delta(monkeypatch, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    calls = []

    def failing(stream, kind, data):
        calls.append(kind)
        raise ConnectionError("Redis hangs")

    monkeypatch.setattr(events, "_redis_publish", failing)
    monkeypatch.setattr(events, "_publish_paused_until", 0.0)
    turn = a_turn(1)
    for _ in range(50):
        events.turn_event_publish(turn, events.DELTA, {"text": "x"})  # never raises
    assert calls == ["delta"]  # one attempt, then the pause

    monkeypatch.setattr(events, "_publish_paused_until", 0.0)  # the pause is over
    events.turn_event_publish(turn, events.END, {"status": "done", "code": ""})
    assert calls == ["delta", "end"]


def test_an_event_with_a_lone_surrogate_is_sent_and_reads_back_the_same():
    chunk = sse_event(event="delta", data={"text": "half an emoji \ud83d"}, event_id="7")
    data_line = next(line for line in chunk.decode("ascii").splitlines() if line.startswith("data: "))
    assert json.loads(data_line[len("data: "):]) == {"text": "half an emoji \ud83d"}


@pytest.mark.parametrize(("socket_timeout", "wait", "block_ms"), [
    (5, 2.0, 2000),   # the whole wait fits
    (5, 10.0, 4000),  # a second before the socket timeout
    (1, 2.0, 500),    # a short socket timeout: half of it, not a 1 ms busy loop
    (5, 0, None),     # no wait: no BLOCK
])
def test_a_blocking_read_ends_before_the_socket_timeout(settings, socket_timeout, wait, block_ms):
    settings.REDIS_SOCKET_TIMEOUT_SECONDS = socket_timeout
    assert events._block_ms(wait) == block_ms


def test_a_redis_stream_lives_the_retention_after_its_last_event(settings):
    """Deltas are one XADD each: the stream's expiry is set with its first event and its end,
    and again when this process last set it EXPIRY_REFRESH_SECONDS ago."""
    if not settings.REDIS_URL:
        pytest.skip("needs REDIS_URL (the turn event streams)")
    turn = SimpleNamespace(pk=987_654, created_at=datetime.now(UTC))
    stream = events.turn_stream(turn)
    client = events._redis_client(settings.REDIS_URL)
    key = events._key(stream)
    client.delete(key)
    try:
        for _ in range(30):
            events.turn_event_publish(turn, events.DELTA, {"text": "x"})
        assert client.xlen(key) == 30
        assert client.ttl(key) >= events.RETAIN_SECONDS

        client.persist(key)  # as if the expiry had been set long ago and were running out
        events._expiry_set[stream] -= events.EXPIRY_REFRESH_SECONDS + 1
        events.turn_event_publish(turn, events.DELTA, {"text": "x"})
        assert client.ttl(key) >= events.RETAIN_SECONDS

        client.persist(key)
        events.turn_event_publish(turn, events.END, {"status": "done", "code": ""})
        assert client.ttl(key) >= events.RETAIN_SECONDS
        assert stream not in events._expiry_set
    finally:
        client.delete(key)
