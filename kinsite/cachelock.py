"""A lock in Django's cache (Redis when REDIS_URL is set) for background jobs that
must not run twice at once for the same row: compaction, introspection, consolidation."""
import contextlib
import uuid
from collections.abc import Iterator

from django.conf import settings
from django.core.cache import cache


@contextlib.contextmanager
def cache_lock(key: str, *, owner: str = "") -> Iterator[str | None]:
    """Try to take `key` without waiting. Yields None when taken, else the current
    holder's value ("<owner>:<token>"), so a caller can tell its own duplicate
    delivery from another job. The lock expires with the task's hard time limit, so a
    killed worker cannot hold it for ever, and only its holder releases it (a lock
    that expired and was taken again belongs to its new owner)."""
    value = f"{owner}:{uuid.uuid4().hex}"
    acquired = cache.add(key, value, timeout=settings.CELERY_TASK_TIME_LIMIT)
    try:
        yield None if acquired else (cache.get(key) or "")
    finally:
        if acquired and cache.get(key) == value:
            cache.delete(key)
