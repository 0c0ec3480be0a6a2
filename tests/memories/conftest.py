"""Fixtures shared by the memories tests."""
import uuid

import pytest


@pytest.fixture
def private_cache(settings):
    """A private cache per test: search caches BM25 scope statistics, and a private cache
    keeps runs independent. Not autouse: the modules that need it say
    `pytestmark = pytest.mark.usefixtures("private_cache")`."""
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                                   "LOCATION": f"memories-tests-{uuid.uuid4()}"}}


@pytest.fixture(autouse=True)
def _fresh_vector_cache():
    """Each test starts with an empty per-process vector cache (memories.search.vectors),
    as a new process would: ids and generations repeat across tests' databases."""
    from memories.search.vectors import vector_cache_clear

    vector_cache_clear()
    yield
    vector_cache_clear()
