"""bench/memory_search.py --vectors, small, inside the test database: the search figures have
their fields, and the kin's oldest memory, which shares no word with the query, is found by
meaning (issue 17, acceptance 1; the benchmark itself runs it at 100,000 memories)."""
import re

import pytest

from bench.memory_search import PARKED_CONTENT, PARKED_QUERY, run
from kinsite.textsearch import query_terms
from memories.models import Memory

pytestmark = pytest.mark.django_db(transaction=True)  # PostgreSQL's VACUUM runs outside a transaction


def test_the_oldest_memory_is_found_by_meaning_and_the_figures_are_reported():
    def words(text):
        return set(re.findall(r"\w+", text.lower()))

    assert not words(PARKED_QUERY) & words(PARKED_CONTENT)
    assert query_terms(PARKED_QUERY)  # a query search answers (not only stop words)
    figures = run(kins=2, per_kin=400, queries=20, seed=3, with_vectors=True)
    parked = Memory.objects.get(content=PARKED_CONTENT)
    assert parked.updated_at == Memory.objects.filter(kin=parked.kin).earliest("updated_at").updated_at
    assert figures["oldest_found_by_meaning"]["rank"] == 1
    assert figures["oldest_found_by_meaning"]["text_score"] == 0
    assert figures["memories"] == 800 and figures["mean_hits"] > 0
    for name in ("search", "vector_scan", "duplicate_check", "cold_search"):
        assert figures[name]["p95_ms"] >= figures[name]["p50_ms"] > 0
