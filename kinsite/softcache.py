"""Reads and writes of values that are only a cache (search statistics): with the cache
(Redis) unreachable a read misses, with a warning, and a write is dropped, so the caller
computes the value again, slower but answering, instead of failing its API call or turn."""
import logging
from contextlib import suppress

from django.core.cache import cache
from redis.exceptions import RedisError

logger = logging.getLogger(__name__)


def soft_cache_get(key: str, *, what: str):
    """The cached value, or None when it is missing or the cache is unreachable; `what`
    names the value in the warning."""
    try:
        return cache.get(key)
    except RedisError as exc:
        logger.warning("Cache unreachable, %s computed without it: %s", what, exc)
        return None


def soft_cache_set(key: str, value, seconds: int) -> None:
    with suppress(RedisError):  # the read before it has logged the outage
        cache.set(key, value, seconds)
