"""The production web worker (Procfile `web`): uvicorn under gunicorn, with limits on what a
client may send and how long it may take (docs/deployment.md#limits-at-the-edge).

uvicorn parses HTTP itself, so gunicorn's `--limit-request-*` options do nothing for it, and
h11's own cap misses a head that arrives at once. This worker applies gunicorn's three limits
to every head (414 or 431), and answers 408 and closes when a head takes longer than
WEB_READ_TIMEOUT_SECONDS from its first byte, or a body longer than that between two reads.
"""
from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from http import HTTPStatus

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn_worker import UvicornWorker

# gunicorn's ceilings for its limits (gunicorn/http/message.py); 0 there means "the most".
MAX_REQUEST_LINE = 8190
MAX_HEADERS = 32768
MAX_HEADER_FIELD_SIZE = 8190


@dataclass(frozen=True)
class RequestLimits:
    line: int  # bytes of the request line (method, target, version)
    fields: int  # header fields
    field_size: int  # bytes of one header field ("Name: value")
    read_timeout: float  # seconds; see the module's docstring

    @classmethod
    def from_gunicorn(cls, cfg, *, read_timeout: float) -> RequestLimits:
        return cls(
            line=min(cfg.limit_request_line or MAX_REQUEST_LINE, MAX_REQUEST_LINE),
            fields=min(cfg.limit_request_fields or MAX_HEADERS, MAX_HEADERS),
            field_size=cfg.limit_request_field_size or MAX_HEADER_FIELD_SIZE,
            read_timeout=read_timeout,
        )

    @property
    def head_bytes(self) -> int:
        """The most a whole head within the limits can take, CRLFs included: h11 buffers up to
        this much of a head that has not arrived yet."""
        return self.line + 2 + self.fields * (self.field_size + 2) + 2

    def refusal(self, request: h11.Request) -> h11.RemoteProtocolError | None:
        """Why `request`'s head is over a limit, as the error the connection answers with."""
        line = len(request.method) + len(request.target) + len(b"  HTTP/") + len(request.http_version)
        if line > self.line:
            return h11.RemoteProtocolError(f"Request line too long ({line} > {self.line} bytes).", 414)
        if len(request.headers) > self.fields:
            return h11.RemoteProtocolError(f"Too many header fields ({len(request.headers)} > {self.fields}).", 431)
        for name, value in request.headers.raw_items():
            size = len(name) + len(b": ") + len(value)
            if size > self.field_size:
                return h11.RemoteProtocolError(f"Header field too long ({size} > {self.field_size} bytes).", 431)
        return None


class _LimitedConnection(h11.Connection):
    """h11's connection refusing a head over the limits as a malformed one, keeping the error
    so the protocol can answer with its status (uvicorn's handler has only a generic 400)."""

    def __init__(self, limits: RequestLimits):
        super().__init__(h11.SERVER, max_incomplete_event_size=limits.head_bytes)
        self.limits = limits
        self.refused: h11.RemoteProtocolError | None = None

    def next_event(self):
        try:
            event = super().next_event()
            if isinstance(event, h11.Request) and (refused := self.limits.refusal(event)):
                raise refused
            return event
        except h11.RemoteProtocolError as exc:
            self.refused = exc
            raise


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with RequestLimits: the limits on the head, the read timeout."""

    def __init__(self, *args, limits: RequestLimits, **kwargs):
        super().__init__(*args, **kwargs)
        self.conn = _LimitedConnection(limits)
        self.limits = limits
        self.read_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport):
        super().connection_made(transport)
        self._read_deadline()

    def connection_lost(self, exc):
        self._read_done()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.read_timer is None and self.conn.their_state is h11.IDLE:
            self._read_deadline()  # the first byte of a request on a kept-alive connection
        super().data_received(data)

    def handle_events(self) -> None:
        # Called for data received and, once a response is done, for a pipelined request.
        super().handle_events()
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            self._read_deadline()  # the body moves: its next read has the whole timeout again
        elif state is not h11.IDLE:
            self._read_done()  # read whole (or refused): what follows is the response's time
        # IDLE: a head still arriving keeps the deadline its first byte set.

    def _read_deadline(self) -> None:
        self._read_done()
        self.read_timer = self.loop.call_later(self.limits.read_timeout, self._read_timed_out)

    def _read_done(self) -> None:
        if self.read_timer is not None:
            self.read_timer.cancel()
            self.read_timer = None

    def _read_timed_out(self) -> None:
        self.read_timer = None
        if self.transport.is_closing():
            return
        if self.flow.read_paused:
            # uvicorn stopped reading (the app has not taken the body so far): not the client's wait.
            self._read_deadline()
            return
        buffered, _ = self.conn.trailing_data
        response_started = self.cycle is not None and self.cycle.response_started
        if (self.conn.their_state is h11.SEND_BODY or buffered) and not response_started:
            message = f"Request not received within {self.limits.read_timeout:g} s."
            self.logger.warning("%s Closing the connection.", message)
            self._write_error(408, message)
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        refused = self.conn.refused
        if refused is None:
            super().send_400_response(msg)
            return
        self.logger.info("Request refused: %s", refused)  # uvicorn has logged a warning
        self._write_error(refused.error_status_hint, str(refused))
        self.transport.close()

    def _write_error(self, status: int, message: str) -> None:
        # Written as bytes, not through h11: a refusal may come in any state of the exchange,
        # and the connection is closed right after it.
        body = message.encode()
        reason = HTTPStatus(status).phrase.encode()
        self.transport.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (status, reason, len(body), body)
        )


class KinsiteUvicornWorker(UvicornWorker):
    """uvicorn_worker's worker on LimitedH11Protocol: gunicorn's request limits from its
    command line, the read timeout from WEB_READ_TIMEOUT_SECONDS (Django's settings)."""

    def load_wsgi(self):
        super().load_wsgi()  # imports kinsite.asgi: Django's settings are ready from here on
        from django.conf import settings

        limits = RequestLimits.from_gunicorn(self.cfg, read_timeout=settings.WEB_READ_TIMEOUT_SECONDS)
        self.config.http = functools.partial(LimitedH11Protocol, limits=limits)
