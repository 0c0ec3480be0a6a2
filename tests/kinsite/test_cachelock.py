"""The cache lock (kinsite/cachelock.py) is released only by its holder, in one step: a lock
that expired and was taken by a new owner stays the new owner's even when the first owner's
release comes late, on the local-memory cache and on Redis."""
import time
import uuid

import pytest
from django.conf import settings as django_settings
from django.core.cache import cache, caches

from kinsite.cachelock import cache_lock

TTL_SECONDS = 1  # Redis keeps whole seconds


@pytest.fixture(params=["locmem", "redis"])
def lock_cache(request, settings):
    """Each test runs on a private local-memory cache and, with REDIS_URL, on Redis."""
    prefix = f"test-cachelock-{uuid.uuid4()}"
    if request.param == "locmem":
        settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                                       "LOCATION": prefix}}
    else:
        if not django_settings.REDIS_URL:
            pytest.skip("needs Redis (REDIS_URL)")
        settings.CACHES = {"default": {"BACKEND": "kinsite.rediscache.RedisCache",
                                       "LOCATION": django_settings.REDIS_URL, "KEY_PREFIX": prefix}}
    settings.CELERY_TASK_TIME_LIMIT = TTL_SECONDS
    yield caches["default"]
    cache.delete("job-lock")


def test_late_release_leaves_the_new_owners_lock(lock_cache):
    with cache_lock("job-lock", owner="first") as held:
        assert held is None
        time.sleep(TTL_SECONDS + 0.2)  # the first owner's lock expires while it still works
        assert lock_cache.add("job-lock", "second:token", timeout=60)  # a new owner takes it
    assert cache.get("job-lock") == "second:token"


def test_lock_changing_hands_during_the_release_is_not_deleted(lock_cache, monkeypatch):
    """The window a get-then-delete leaves: the releaser reads its own value, the lock
    expires and a new owner takes it, then the releaser deletes. Whatever the release reads
    is made slow here so the expiry and the new owner's take fall inside it."""
    real_get = lock_cache.get
    taken = []

    def slow_get(key, *args, **kwargs):
        value = real_get(key, *args, **kwargs)
        time.sleep(TTL_SECONDS + 0.2)
        taken.append(lock_cache.add(key, "second:token", timeout=60))
        return value

    with cache_lock("job-lock", owner="first") as held:
        assert held is None
        monkeypatch.setattr(lock_cache, "get", slow_get)
    monkeypatch.undo()
    if not taken:  # a release that read nothing: the lock expires and the new owner takes it now
        time.sleep(TTL_SECONDS + 0.2)
        taken.append(lock_cache.add("job-lock", "second:token", timeout=60))
    assert taken == [True]
    assert cache.get("job-lock") == "second:token"


def test_holder_releases_its_own_lock(lock_cache):
    with cache_lock("job-lock", owner="first") as held:
        assert held is None
        with cache_lock("job-lock", owner="other") as other_held:
            assert other_held.startswith("first:")
        assert cache.get("job-lock").startswith("first:")  # the refused caller took nothing
    assert cache.get("job-lock") is None
