"""A per-session lock, so two turns of one session run one after the other.

With REDIS_URL a Redis lock shared by every process, else (embedded mode: one process) a
threading lock. The Redis lock has a lease, so a killed worker cannot block a session for
ever; a turn renews it before each model call. Turns must not interleave, so when Redis does
not answer no turn runs: LockUnavailable (503), or LockLost for a renewal after the lease."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

import redis
from django.conf import settings
from redis.exceptions import LockError

from kinsite.errors import REDIS_UNREACHABLE, Conflict, ServiceUnavailable

# How long a turn waits for the session's previous turn to finish.
DEFAULT_WAIT_SECONDS = 300.0
# Margin on top of one model call's worst case (timeout × attempts plus backoff).
LEASE_MARGIN_SECONDS = 60.0
LOCK_KEY = "kinsite:session-turn:{session_id}"


class SessionBusy(Conflict):
    code = "session_busy"


class LockUnavailable(ServiceUnavailable):
    """Redis, which holds the session locks, did not answer."""


class LockLost(LockUnavailable):
    """The lease ran out before its renewal (Redis was slow to answer, or lost its data in a
    restart): another process may hold the session now, so the turn must not go on."""


def wait_seconds() -> float:
    """How long taking a session's lock waits for the turn before it (TURN_LOCK_WAIT_SECONDS)."""
    return getattr(settings, "TURN_LOCK_WAIT_SECONDS", DEFAULT_WAIT_SECONDS)


def lease_seconds() -> float:
    """How long the Redis lock lives unrenewed: one model call at its slowest (every attempt
    timing out, with backoff) plus a margin, since the turn renews it before each call."""
    attempts = settings.LLM_MAX_RETRIES + 1
    backoff = sum(settings.LLM_RETRY_BACKOFF_SECONDS * 2**i for i in range(attempts))
    return settings.LLM_TIMEOUT_SECONDS * attempts + backoff + LEASE_MARGIN_SECONDS


# A lease renewed this recently has nearly all its minutes left: renewing again (before each
# fast model call) would cost a Redis round trip for nothing.
RENEW_AFTER_SECONDS = 0.5


class SessionLock:
    """What `session_lock` yields; `refresh()` renews the lease (a no-op locally)."""

    def __init__(self, redis_lock=None):
        self._redis_lock = redis_lock
        self._renewed_at = time.monotonic()

    def refresh(self) -> None:
        if self._redis_lock is None or time.monotonic() - self._renewed_at < RENEW_AFTER_SECONDS:
            return
        try:
            self._redis_lock.reacquire()
        except REDIS_UNREACHABLE as exc:
            raise _unavailable(self._redis_lock.name, exc) from exc
        except LockError as exc:
            raise LockLost(
                f"The session lock was lost before the turn could renew it: {exc}",
                details={"service": "redis", "lock": self._redis_lock.name},
            ) from exc
        self._renewed_at = time.monotonic()


@lru_cache(maxsize=4)
def _redis_client(url: str):
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=settings.REDIS_CONNECT_TIMEOUT_SECONDS,
        socket_timeout=settings.REDIS_SOCKET_TIMEOUT_SECONDS,
    )


def _unavailable(key: str, exc: Exception) -> LockUnavailable:
    return LockUnavailable(
        f"The session lock service (Redis) is unreachable: {exc}",
        details={"service": "redis", "lock": key},
    )


_local_guard = threading.Lock()
_local_locks: dict[int, threading.Lock] = {}


def _local_lock(session_id: int) -> threading.Lock:
    # Never freed: a few bytes per session that chatted, affordable in the embedded mode.
    with _local_guard:
        return _local_locks.setdefault(session_id, threading.Lock())


@contextmanager
def session_lock(session_id: int, timeout: float | None = None) -> Iterator[SessionLock]:
    """Hold the session's turn lock; waits up to `timeout` seconds (default
    TURN_LOCK_WAIT_SECONDS or 300) and raises SessionBusy (409) if it cannot get it."""
    wait = timeout if timeout is not None else wait_seconds()
    busy = SessionBusy(
        f"Session {session_id} is still answering an earlier message; try again shortly.",
        details={"session": session_id},
    )
    if settings.REDIS_URL:
        lock = _redis_client(settings.REDIS_URL).lock(
            LOCK_KEY.format(session_id=session_id), timeout=lease_seconds(), blocking_timeout=wait
        )
        try:
            acquired = lock.acquire()
        except REDIS_UNREACHABLE as exc:
            raise _unavailable(lock.name, exc) from exc
        if not acquired:
            raise busy
        try:
            yield SessionLock(lock)
        finally:
            try:
                lock.release()
            except LockError:
                pass  # the lease ran out; whoever holds the lock now keeps it
            except REDIS_UNREACHABLE:
                pass  # Redis went away; the lease ends on its own and must not hide the outcome
    else:
        lock = _local_lock(session_id)
        if not lock.acquire(timeout=wait):
            raise busy
        try:
            yield SessionLock()
        finally:
            lock.release()
