"""A turn's progress as it happens (reply text deltas, tool calls and their results, its end),
for whoever follows the turn (turns/stream.py serves them as SSE: docs/api.md#streaming).

With REDIS_URL the events go to one Redis stream per turn, so a web process can follow a turn
a worker runs; without it (the embedded mode: one process) to a store in memory. Event ids
order a turn's events, so a reader asks for those after the last it saw. Events are progress,
not the record: publishing never fails a turn, and readers take its outcome from the stored turn.

A stream is named by the turn's id and creation time: ids repeat when a database is created
again while Redis keeps the old streams. A turn run again keeps its stream (ids only grow, so
Last-Event-ID still resumes); each new attempt starts with a RESET event.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

import redis
import redis.asyncio
from django.conf import settings

from sessions_app.models import Turn

logger = logging.getLogger(__name__)

# What a turn publishes: a piece of reply text, a tool call about to run, its result, and
# the last event, once the turn is done or failed and stored ({"status", "code"}); and the
# start of an attempt after the first ({"attempt"}), when the turn runs again.
DELTA, TOOL_CALL, TOOL_RESULT, END, RESET = "delta", "tool_call", "tool_result", "end", "reset"
STREAM_KEY = "kinsite:turn-events:{stream}"
# A turn's events are kept this long after its last one (for late followers and resumes).
RETAIN_SECONDS = 3600
# At most about this many events per turn (a long reply is a few thousand deltas).
MAX_EVENTS_PER_TURN = 20_000
# The in-memory store keeps this many turns at most (and none older than RETAIN_SECONDS).
MEMORY_MAX_TURNS = 200
# After a failed publish (Redis away or hanging), publishing pauses this long in the process:
# each attempt could wait the full socket timeout, and a reply has hundreds of deltas.
PUBLISH_PAUSE_SECONDS = 30.0
# An event id: a Redis stream id ("1700000000000-0") or the memory store's sequence number.
_EVENT_ID = re.compile(r"^\d{1,20}(-\d{1,20})?$")


@dataclass(frozen=True)
class TurnEvent:
    id: str
    kind: str
    data: dict[str, Any]


def turn_event_publish(turn: Turn, kind: str, data: dict[str, Any]) -> None:
    """Record one event of a running turn. Never raises: a follower missing an event
    falls back to the stored turn, a turn failing for it would lose the reply. After a
    failure, publishing to Redis pauses for PUBLISH_PAUSE_SECONDS (see there)."""
    global _publish_paused_until
    if not settings.REDIS_URL:
        _memory.publish(turn_stream(turn), kind, data)
        return
    if time.monotonic() < _publish_paused_until:
        return
    try:
        _redis_publish(turn_stream(turn), kind, data)
    except Exception:
        _publish_paused_until = time.monotonic() + PUBLISH_PAUSE_SECONDS
        logger.warning("Turn %s: the %s event was not published; turn events pause for %.0f s",
                       turn.pk, kind, PUBLISH_PAUSE_SECONDS, exc_info=True)


_publish_paused_until = 0.0


def turn_events_read(turn: Turn, *, after: str | None, timeout: float) -> list[TurnEvent]:
    """The turn's events after the event id `after` (None: from the first), waiting up to
    `timeout` seconds for one if there is none yet; [] when none came."""
    after = event_id_or_none(after)
    if settings.REDIS_URL:
        return _redis_read(turn_stream(turn), after=after, timeout=timeout)
    return _memory.read(turn_stream(turn), after=after, timeout=timeout)


async def turn_events_aread(turn: Turn, *, after: str | None, timeout: float) -> list[TurnEvent]:
    """turn_events_read for an event loop: the wait holds no thread (redis.asyncio's XREAD
    BLOCK; the memory store is polled)."""
    after = event_id_or_none(after)
    if settings.REDIS_URL:
        return await _redis_aread(turn_stream(turn), after=after, timeout=timeout)
    deadline = time.monotonic() + timeout
    while True:
        events = _memory.read(turn_stream(turn), after=after, timeout=0)
        if events or time.monotonic() >= deadline:
            return events
        await asyncio.sleep(MEMORY_POLL_SECONDS)


def turn_events_forget(turn: Turn) -> None:
    """Drop the turn's stream now (an erasure: its deltas hold the reply's text). Logged, never
    raised: the stream expires by itself after RETAIN_SECONDS."""
    if not settings.REDIS_URL:
        _memory.forget(turn_stream(turn))
        return
    try:
        _redis_client(settings.REDIS_URL).delete(_key(turn_stream(turn)))
    except Exception:
        logger.warning("Turn %s: its event stream was not dropped; it expires within %d s",
                       turn.pk, RETAIN_SECONDS, exc_info=True)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def turn_stream(turn: Turn) -> str:
    """The name of the turn's event stream: its id and its creation time in microseconds,
    so that a later turn given the same id (a database created again) has its own."""
    created = (turn.created_at - _EPOCH) // timedelta(microseconds=1)  # exact: no float
    return f"{turn.pk}:{created}"


MEMORY_POLL_SECONDS = 0.05


def event_id_or_none(value: str | None) -> str | None:
    """An event id as a client may send it back (Last-Event-ID); anything else is None."""
    if value is None:
        return None
    value = value.strip()
    return value if _EVENT_ID.match(value) else None


# --- Redis streams ------------------------------------------------------------------------------


def _key(stream: str) -> str:
    return STREAM_KEY.format(stream=stream)


@lru_cache(maxsize=4)
def _redis_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=settings.REDIS_CONNECT_TIMEOUT_SECONDS,
        socket_timeout=settings.REDIS_SOCKET_TIMEOUT_SECONDS,
    )


# A reply's deltas are one XADD each; the expiry is (re)set with a stream's first event in this
# process, its END, and otherwise at most every EXPIRY_REFRESH_SECONDS (an EXPIRE per delta
# doubles publishing's cost), reaching that much further past RETAIN_SECONDS.
EXPIRY_REFRESH_SECONDS = 60.0
_expiry_set: dict[str, float] = {}  # stream -> when this process last set its expiry (monotonic)
_EXPIRY_TRACKED_MAX = 1000


def _redis_publish(stream: str, kind: str, data: dict[str, Any]) -> None:
    key = _key(stream)
    client = _redis_client(settings.REDIS_URL)
    fields = {"kind": kind, "data": json.dumps(data)}
    now = time.monotonic()
    if kind != END and now - _expiry_set.get(stream, -math.inf) < EXPIRY_REFRESH_SECONDS:
        client.xadd(key, fields, maxlen=MAX_EVENTS_PER_TURN, approximate=True)
        return
    pipe = client.pipeline(transaction=False)
    pipe.xadd(key, fields, maxlen=MAX_EVENTS_PER_TURN, approximate=True)
    pipe.expire(key, int(RETAIN_SECONDS + EXPIRY_REFRESH_SECONDS))
    pipe.execute()
    if kind == END:
        _expiry_set.pop(stream, None)
    else:
        if len(_expiry_set) >= _EXPIRY_TRACKED_MAX:
            _expiry_set.clear()  # turns whose process never published their end; they only lose the shortcut
        _expiry_set[stream] = now


def _block_ms(timeout: float) -> int | None:
    # XREAD BLOCK must end before the client's socket timeout, or the wait reads as an outage.
    if timeout <= 0:
        return None  # no BLOCK: answer at once
    # A second of margin, or half the timeout when it is short (never a busy loop of 1 ms waits).
    socket_timeout = settings.REDIS_SOCKET_TIMEOUT_SECONDS
    limit = max(socket_timeout - 1, socket_timeout / 2)
    return max(1, int(min(timeout, limit) * 1000))


def _redis_events(reply) -> list[TurnEvent]:
    events = []
    for _key_name, entries in reply or []:
        for event_id, fields in entries:
            events.append(TurnEvent(
                id=event_id.decode(), kind=fields[b"kind"].decode(), data=json.loads(fields[b"data"]),
            ))
    return events


def _redis_read(stream: str, *, after: str | None, timeout: float) -> list[TurnEvent]:
    client = _redis_client(settings.REDIS_URL)
    return _redis_events(client.xread({_key(stream): after or "0"}, block=_block_ms(timeout)))


# redis.asyncio clients belong to the event loop that made them: one per loop.
_async_clients: dict[int, redis.asyncio.Redis] = {}


async def _redis_aread(stream: str, *, after: str | None, timeout: float) -> list[TurnEvent]:
    loop = asyncio.get_running_loop()
    client = _async_clients.get(id(loop))
    if client is None:
        client = _async_clients[id(loop)] = redis.asyncio.Redis.from_url(
            settings.REDIS_URL,
            socket_connect_timeout=settings.REDIS_CONNECT_TIMEOUT_SECONDS,
            socket_timeout=settings.REDIS_SOCKET_TIMEOUT_SECONDS,
        )
    return _redis_events(await client.xread({_key(stream): after or "0"}, block=_block_ms(timeout)))


# --- in memory (embedded mode) ------------------------------------------------------------------


class _MemoryStore:
    """The events of the latest MEMORY_MAX_TURNS turns (by turn_stream), in one process;
    ids are 1, 2, 3 … per turn."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._turns: OrderedDict[str, list[TurnEvent]] = OrderedDict()
        self._touched: dict[str, float] = {}  # each stream's last publish (monotonic)

    def publish(self, stream: str, kind: str, data: dict[str, Any]) -> None:
        with self._changed:
            now = time.monotonic()
            events = self._turns.setdefault(stream, [])
            self._turns.move_to_end(stream)
            self._touched[stream] = now
            # Past the cap only the end is kept: the follower's `done` carries the whole reply.
            if len(events) < MAX_EVENTS_PER_TURN or kind == END:
                events.append(TurnEvent(id=str(len(events) + 1), kind=kind, data=data))
            # Least recently published first: drop while too many, or too old.
            while self._turns:
                oldest = next(iter(self._turns))
                if len(self._turns) <= MEMORY_MAX_TURNS and now - self._touched[oldest] <= RETAIN_SECONDS:
                    break
                del self._turns[oldest], self._touched[oldest]
            self._changed.notify_all()

    def read(self, stream: str, *, after: str | None, timeout: float) -> list[TurnEvent]:
        seen = int(after.split("-")[0]) if after else 0
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                events = self._turns.get(stream, [])[seen:]
                remaining = deadline - time.monotonic()
                if events or remaining <= 0:
                    return list(events)
                self._changed.wait(remaining)

    def forget(self, stream: str) -> None:
        with self._changed:
            self._turns.pop(stream, None)
            self._touched.pop(stream, None)

    def clear(self) -> None:
        with self._changed:
            self._turns.clear()
            self._touched.clear()


_memory = _MemoryStore()
