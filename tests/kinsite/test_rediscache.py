"""The Redis cache backend (kinsite/rediscache.py) serves every call from one redis-py client
per connection pool and still reads and writes as Django's does. Needs REDIS_URL."""
import uuid

import pytest
from django.conf import settings

from kinsite.rediscache import RedisCache

pytestmark = pytest.mark.skipif(not settings.REDIS_URL, reason="needs Redis (REDIS_URL)")


@pytest.fixture
def redis_cache():
    backend = RedisCache(settings.REDIS_URL, {"KEY_PREFIX": f"test-rediscache-{uuid.uuid4()}"})
    yield backend
    backend.delete_many(["counter", "value", "other", "missing"])


def test_every_call_uses_the_same_client(redis_cache):
    client = redis_cache._cache.get_client()
    assert redis_cache._cache.get_client("key", write=True) is client


def test_values_are_written_and_read_as_by_djangos_backend(redis_cache):
    assert redis_cache.add("counter", 1, timeout=60) and not redis_cache.add("counter", 5, timeout=60)
    assert redis_cache.incr("counter") == 2 and redis_cache.get("counter") == 2
    redis_cache.set("value", {"team": 3, "names": ["Maria"]}, timeout=60)
    redis_cache.set_many({"other": "x"}, timeout=60)
    assert redis_cache.get_many(["value", "other", "missing"]) == {"value": {"team": 3, "names": ["Maria"]},
                                                                  "other": "x"}
    assert redis_cache.get_or_set("missing", 7, timeout=1) == 7
    redis_cache.delete("value")
    assert redis_cache.get("value", "gone") == "gone"
