"""Verified API tokens remembered in process memory for a short while, so an API request
skips the token's three-table database lookup.

Entries are keyed by digest, never the raw token, and live TTL_SECONDS at most. A save or
delete of a token, team or user (signals, kinsite.apps) clears this process's entries and,
after commit, bumps a generation in the shared cache; an entry is used only under the current
generation, so a revoked token is refused by the next request in any process. Changes that
bypass the signals (.update(), raw SQL) are seen within TTL_SECONDS."""
from __future__ import annotations

import copy
import logging
import threading
import time

from django.core.cache import cache
from django.db import transaction

from kinsite.models import ApiToken

logger = logging.getLogger(__name__)

TTL_SECONDS = 30.0
MAX_ENTRIES = 10_000
GENERATION_KEY = "kinsite:api-token-generation"

_lock = threading.Lock()
# digest -> (monotonic expiry, generation it was verified under, the token with its team and user)
_entries: dict[str, tuple[float, int | None, ApiToken]] = {}


def cached_token(digest: str) -> ApiToken | None:
    """The verified token of `digest`, a copy of its own for this request (views must not
    share row objects between threads), or None when it has to be looked up."""
    with _lock:
        entry = _entries.get(digest)
    if entry is None:
        return None
    expires, generation, token = entry
    if time.monotonic() >= expires or generation is None or generation != _generation():
        _forget(digest)
        return None
    return _copy(token)


def remember_token(digest: str, token: ApiToken, *, generation: int | None) -> None:
    """Keep `token` (just read from the database, active) under the generation read before
    that lookup: a change committed in between bumped it, so the entry is never used."""
    if generation is None:
        return  # the cache is not answering: nothing can invalidate the entry elsewhere
    with _lock:
        if len(_entries) >= MAX_ENTRIES:
            _entries.clear()
        _entries[digest] = (time.monotonic() + TTL_SECONDS, generation, _copy(token))


def token_used(digest: str, when) -> None:
    """Record on the remembered token that its last_used_at was written (auth writes it at
    most once a minute)."""
    with _lock:
        entry = _entries.get(digest)
        if entry is not None:
            entry[2].last_used_at = when


def current_generation() -> int | None:
    return _generation()


def tokens_forget_all(**_signal_kwargs) -> None:
    """A token, team or user changed: forget this process's entries now and, once the change
    is committed, every process's (the shared generation moves on)."""
    with _lock:
        _entries.clear()
    transaction.on_commit(_bump_generation)


def _bump_generation() -> None:
    with _lock:
        _entries.clear()  # again: a request may have cached the old row before the commit
    try:
        if not cache.add(GENERATION_KEY, 1, timeout=None):
            cache.incr(GENERATION_KEY)
    except Exception:
        # Other processes then keep their entries for up to TTL_SECONDS; say so loudly.
        logger.exception("API token cache: the shared generation could not be bumped")


def _generation() -> int | None:
    try:
        return cache.get_or_set(GENERATION_KEY, 0, timeout=None)
    except Exception:
        logger.warning("API token cache: the shared generation could not be read", exc_info=True)
        return None


def _forget(digest: str) -> None:
    with _lock:
        _entries.pop(digest, None)


def _copy(token: ApiToken) -> ApiToken:
    token_copy = copy.copy(token)
    token_copy.team = copy.copy(token.team)
    if token.user is not None:
        token_copy.user = copy.copy(token.user)
    return token_copy
