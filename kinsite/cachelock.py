"""A lock in Django's cache (Redis when REDIS_URL is set) for background jobs that
must not run twice at once for the same row: compaction, introspection, consolidation."""
import contextlib
import pickle
import uuid
from collections.abc import Iterator

from django.conf import settings
from django.core.cache import cache, caches
from django.core.cache.backends.locmem import LocMemCache

from kinsite.rediscache import RedisCache

# Deletes KEYS[1] only while it still holds ARGV[1]: compare and delete in one step.
_DELETE_IF_HELD = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


@contextlib.contextmanager
def cache_lock(key: str, *, owner: str = "") -> Iterator[str | None]:
    """Try to take `key` without waiting. Yields None when taken, else the holder's value
    ("<owner>:<token>"), so a caller can tell its own duplicate delivery from another job.
    It expires with the task's hard time limit (a killed worker cannot hold it for ever),
    and only its holder releases it."""
    value = f"{owner}:{uuid.uuid4().hex}"
    acquired = cache.add(key, value, timeout=settings.CELERY_TASK_TIME_LIMIT)
    try:
        yield None if acquired else (cache.get(key) or "")
    finally:
        if acquired:
            _delete_if_held(key, value)


def _delete_if_held(key: str, value: str) -> bool:
    """Delete `key` if it still holds `value`, in one step: between a read and a delete the lock
    could expire and be taken by a new owner. Django's cache has no compare-and-delete, so this
    reaches into the two backends Kinsite configures."""
    backend = caches["default"]
    if isinstance(backend, RedisCache):
        redis_key = backend.make_and_validate_key(key)
        client = backend._cache.get_client(redis_key, write=True)
        stored = backend._cache._serializer.dumps(value)  # as Django's backend wrote it
        return bool(client.eval(_DELETE_IF_HELD, 1, redis_key, stored))
    if isinstance(backend, LocMemCache):
        local_key = backend.make_and_validate_key(key)
        with backend._lock:  # the lock every LocMemCache read and write takes
            if backend._has_expired(local_key) or pickle.loads(backend._cache[local_key]) != value:
                return False
            return backend._delete(local_key)
    raise NotImplementedError(f"cache_lock has no atomic release for {type(backend).__name__}")
