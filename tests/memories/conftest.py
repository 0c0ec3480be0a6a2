"""Fixtures shared by the memories tests."""
import uuid

import pytest


@pytest.fixture
def private_cache(settings):
    """A private cache per test, so nothing cached through Django's cache (search's BM25
    statistics were, until memories migration 0012) leaks between runs. Not autouse: the modules that need it say
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


@pytest.fixture
def pgvector_db(transactional_db):
    """A database in the pgvector mode (memories.vectorindex), committed for real: an HNSW
    index is built CONCURRENTLY, which no transaction block allows. Skipped on databases
    without pgvector; in scripts/test's pgvector pass (KINSITE_TEST_PGVECTOR set) a missing
    extension fails instead, so that pass never passes by skipping. The indexes a test
    builds are dropped after it (a flush leaves DDL alone)."""
    import os

    from django.db import connection

    from memories import vectorindex

    if vectorindex.vector_mode() != vectorindex.MODE_PGVECTOR:
        if os.environ.get("KINSITE_TEST_PGVECTOR"):
            pytest.fail("KINSITE_TEST_PGVECTOR is set, but this database has no pgvector column")
        pytest.skip("needs PostgreSQL with pgvector (scripts/test's third pass)")
    yield
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname FROM pg_indexes WHERE indexname LIKE 'memoryvector_hnsw_%%'")
        for (name,) in cursor.fetchall():
            cursor.execute(f"DROP INDEX IF EXISTS {name}")
