"""A chat turn as server-sent events (the protocol: docs/api.md#streaming): a streamed post
runs the turn in a thread of the web process while the response follows the turn's events
(turns/events.py). `done` is built by the caller from the stored turn, so it is what the
non-streaming answer would have been.

A turn run again streams its new attempt from the start. A follower that already sent some
of the stopped attempt's events sends `reset` first; one that sent none skips them silently;
one resuming with Last-Event-ID after any event but `message` counts as having sent them.

A client that disconnects only stops its response: the thread runs on and stores the reply.
Under ASGI the body is an async generator: Django would read a sync iterator to its end
before sending anything.
"""
from __future__ import annotations

import asyncio
import json
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.db import connection
from django.http import StreamingHttpResponse
from rest_framework.utils.encoders import JSONEncoder

from kinsite.api.errors import error_body
from sessions_app.models import Event, Session, Turn
from sessions_app.turns.events import (
    DELTA,
    END,
    RESET,
    TOOL_CALL,
    TOOL_RESULT,
    TurnEvent,
    event_id_or_none,
    turn_events_aread,
    turn_events_read,
)
from sessions_app.turns.jobs import UNFINISHED
from sessions_app.turns.services import turn_post

logger = logging.getLogger(__name__)

CONTENT_TYPE = "text/event-stream"
# How long one wait for the turn's next event lasts; between waits the stored turn is read,
# in case its end was not published (Redis away) or it was failed by the stalled sweep.
POLL_SECONDS = 2.0
# An idle stream sends a comment this often, so proxies and clients do not time it out.
KEEPALIVE_SECONDS = 15.0
KEEPALIVE = b": keep-alive\n\n"
# The events that show a client part of an attempt (a RESET voids them).
PROGRESS = (DELTA, TOOL_CALL, TOOL_RESULT)
# The `message` event's id: before any of the turn's events (a resume from it replays them all).
MESSAGE_EVENT_ID = "0"

DoneBody = Callable[[Turn], dict]
MessageBody = Callable[[Event], dict]


def turn_post_streamed(*, session: Session, content: str, sender: str = "",
                       platform: str = Event.Platform.API) -> Turn:
    """Run a turn as a sync post does, but in a thread, returning once the message is stored.
    Raises what a sync post raises before storing anything; after that the thread stores the
    outcome whatever happens to the caller (follow it with turn_event_stream).

    Inside a transaction (ATOMIC_REQUESTS, a test's) the turn runs in the caller's thread and
    is over on return: a thread's own connection could not see the uncommitted rows, and on
    SQLite's shared-cache test database could not even write to a table written to."""
    if connection.in_atomic_block:
        return _turn_post_here(session=session, content=content, sender=sender, platform=platform)
    handoff: queue.Queue[Turn | BaseException] = queue.Queue(maxsize=1)
    opened = threading.Event()

    def hand_over(turn: Turn) -> None:
        opened.set()
        handoff.put(turn)

    def run() -> None:
        try:
            turn_post(session=session, content=content, sender=sender, platform=platform, opened=hand_over)
        except BaseException as exc:
            if not opened.is_set():
                handoff.put(exc)
            else:
                _log_turn_failure(session, exc)
        finally:
            connection.close()

    threading.Thread(target=run, name=f"turn-stream-session-{session.pk}", daemon=True).start()
    result = handoff.get()
    if isinstance(result, BaseException):
        raise result
    return result


def _turn_post_here(*, session: Session, content: str, sender: str, platform: str) -> Turn:
    """turn_post_streamed in the caller's thread: what failed before the turn was stored is
    raised; a failure after it is stored on the turn, for the stream's error event."""
    opened: list[Turn] = []
    try:
        turn_post(session=session, content=content, sender=sender, platform=platform, opened=opened.append)
    except Exception as exc:
        if not opened:
            raise
        _log_turn_failure(session, exc)
    return Turn.objects.get(pk=opened[0].pk)  # as it ended


def _log_turn_failure(session: Session, exc: BaseException) -> None:
    if getattr(exc, "status", 500) >= 500 and not hasattr(exc, "code"):
        logger.error("A streamed turn of session %s failed", session.pk, exc_info=exc)
    else:
        # The turn stored its failure; the stream's error event says it.
        logger.info("A streamed turn of session %s failed: %s", session.pk, exc)


def turn_event_stream(request, turn: Turn, *, done_body: DoneBody, message_body: MessageBody,
                      last_event_id: str | None = None, failed_body: DoneBody | None = None) -> StreamingHttpResponse:
    """The SSE response following `turn` to its end. `message_body` and `done_body` build the
    `message` and `done` events' JSON (the caller's serializers: this package sits below the
    API); `failed_body`, if given, adds keys to the `error` event's (the dashboard's rendered
    entry); `last_event_id` resumes after that event, without `message` again."""
    follower = _TurnFollower(turn=turn, done_body=done_body, message_body=message_body,
                             last_event_id=event_id_or_none(last_event_id), failed_body=failed_body)
    django_request = getattr(request, "_request", request)  # a DRF Request wraps Django's
    content = _async_stream(follower) if isinstance(django_request, ASGIRequest) else _sync_stream(follower)
    response = StreamingHttpResponse(content, content_type=CONTENT_TYPE)
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass each event on at once
    return response


def sse_event(*, event: str, data: dict, event_id: str | None) -> bytes:
    """One server-sent event: its id, its name and its JSON on one data line."""
    lines = [f"id: {event_id}"] if event_id is not None else []
    # ASCII: a lone surrogate (half an emoji from a provider that split one) cannot break the encoding.
    lines += [f"event: {event}", f"data: {json.dumps(data, cls=JSONEncoder, ensure_ascii=True)}"]
    return ("\n".join(lines) + "\n\n").encode()


class _TurnFollower:
    """What both flavours of the stream share: the events to send, from the stored turn and
    the turn's published events; they differ only in how they wait."""

    def __init__(self, *, turn: Turn, done_body: DoneBody, message_body: MessageBody, last_event_id: str | None,
                 failed_body: DoneBody | None = None):
        self.turn = turn  # whose event stream is followed (turn_stream: its id and creation time)
        self.turn_id = turn.pk
        self.done_body = done_body
        self.failed_body = failed_body
        self.message_body = message_body
        self.resumed = last_event_id is not None
        self.last_id = last_event_id or MESSAGE_EVENT_ID
        # The client may show progress of an attempt that a RESET will void.
        self.progress_sent = self.last_id != MESSAGE_EVENT_ID
        self.ended = False  # the turn's END event was read
        self.error_code = ""  # the END event's, for the error event
        self.idle_since = time.monotonic()
        # A turn already finished has published all its events: read them without waiting.
        self.wait_seconds = 0 if turn.status not in UNFINISHED else POLL_SECONDS
        self.read_errors = 0

    def opening(self) -> list[bytes]:
        if self.resumed:
            return []
        message = Turn.objects.select_related("user_message").get(pk=self.turn_id).user_message
        data = self.message_body(message) if message is not None else {}
        return [sse_event(event="message", data=data, event_id=MESSAGE_EVENT_ID)]

    def take(self, events: list[TurnEvent]) -> list[bytes]:
        chunks = []
        restarts = [index for index, event in enumerate(events) if event.kind == RESET]
        if restarts:
            # The turn runs again: what came before its last start is a stopped attempt's.
            reset = events[restarts[-1]]
            if self.progress_sent:
                chunks.append(sse_event(event=RESET, data=reset.data, event_id=reset.id))
                self.progress_sent = False
            self.last_id = reset.id
            events = events[restarts[-1] + 1:]
        for event in events:
            self.last_id = event.id
            if event.kind == END:
                self.ended = True
                self.error_code = event.data.get("code") or ""
                break
            chunks.append(sse_event(event=event.kind, data=event.data, event_id=event.id))
            self.progress_sent = self.progress_sent or event.kind in PROGRESS
        if chunks or self.ended:
            self.idle_since = time.monotonic()
        return chunks

    def read_failed(self, exc: Exception) -> None:
        """A read of the turn's events failed (Redis away): the stream goes on from the stored
        turn, so deltas may miss text, `done` never. Logged once per stream."""
        if not self.read_errors:
            logger.warning("Turn %s: reading its events failed (%s); following the stored turn",
                           self.turn_id, exc)
        self.read_errors += 1

    def keepalive(self) -> list[bytes]:
        if time.monotonic() - self.idle_since < KEEPALIVE_SECONDS:
            return []
        self.idle_since = time.monotonic()
        return [KEEPALIVE]

    def turn_finished(self) -> bool:
        return not Turn.objects.filter(pk=self.turn_id, status__in=UNFINISHED).exists()

    def closing(self) -> bytes:
        """The last event, from the stored turn: `done`, or `error` in the API's error shape."""
        turn = Turn.objects.select_related("user_message", "reply").get(pk=self.turn_id)
        if turn.status == Turn.Status.DONE:
            return sse_event(event="done", data=self.done_body(turn), event_id=self.last_id)
        return self._error(turn)

    def failure(self, exc: Exception) -> bytes:
        """The stream itself broke (a bug, the database away): the turn may still finish."""
        logger.exception("The event stream of turn %s broke", self.turn_id)
        return sse_event(event="error", event_id=self.last_id, data=error_body(
            "stream_failed",
            f"The event stream broke ({type(exc).__name__}); the turn may still finish: poll "
            f"GET /api/v1/turns/{self.turn_id}/.",
            {"turn": self.turn_id, "stored": True},
        ))

    def _error(self, turn: Turn) -> bytes:
        message_id = turn.user_message_id
        data = error_body(
            self.error_code or "turn_failed",
            f"The turn failed: {turn.error} Your message is stored (message {message_id}); see turn {turn.pk}.",
            {"turn": turn.pk, "message": message_id, "stored": True},
        )
        if self.failed_body is not None:
            data = {**self.failed_body(turn), **data}
        return sse_event(event="error", event_id=self.last_id, data=data)


def _sync_stream(follower: _TurnFollower) -> Iterator[bytes]:
    try:
        yield from follower.opening()
        while not follower.ended:
            events = _read(follower, timeout=follower.wait_seconds)
            yield from follower.take(events)
            if events:
                continue
            if follower.turn_finished():
                # Its events were all published before it was stored: read what is left.
                yield from follower.take(_read(follower, timeout=0))
                break
            yield from follower.keepalive()
        yield follower.closing()
    except Exception as exc:
        yield follower.failure(exc)


def _read(follower: _TurnFollower, *, timeout: float) -> list[TurnEvent]:
    """The turn's next events; none when they cannot be read (Redis away), after waiting as
    the read would have: the stored turn still says how the turn ended."""
    try:
        return turn_events_read(follower.turn, after=follower.last_id, timeout=timeout)
    except Exception as exc:
        follower.read_failed(exc)
        time.sleep(timeout)
        return []


async def _async_stream(follower: _TurnFollower) -> AsyncIterator[bytes]:
    # Database reads run in the request's thread (sync_to_async's default), as the view did.
    try:
        for chunk in await sync_to_async(follower.opening)():
            yield chunk
        while not follower.ended:
            events = await _aread(follower, timeout=follower.wait_seconds)
            for chunk in follower.take(events):
                yield chunk
            if events:
                continue
            if await sync_to_async(follower.turn_finished)():
                for chunk in follower.take(await _aread(follower, timeout=0)):
                    yield chunk
                break
            for chunk in follower.keepalive():
                yield chunk
        yield await sync_to_async(follower.closing)()
    except Exception as exc:
        yield follower.failure(exc)


async def _aread(follower: _TurnFollower, *, timeout: float) -> list[TurnEvent]:
    """_read for the event loop."""
    try:
        return await turn_events_aread(follower.turn, after=follower.last_id, timeout=timeout)
    except Exception as exc:
        follower.read_failed(exc)
        await asyncio.sleep(timeout)
        return []
