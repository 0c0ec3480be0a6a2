"""The full-text counters of memory scopes (MemoryTermCount, kept by the triggers of
migration 0012 on PostgreSQL): equal to a recount after every kind of write, untouched by
retrieval marks, and what search's BM25 statistics read instead of the scope."""
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from memories import services
from memories.models import Memory, MemoryTermCount
from memories.search import postgres
from memories.search.selectors import memory_search
from memories.services import Actor
from tests.factories import KinFactory, MemoryFactory

pytestmark = pytest.mark.postgres


def add(team, kin, content, **kwargs):
    return services.memory_add(team=team, kin=kin, content=content, actor=Actor(label="test"), **kwargs).memory


def counters() -> dict[tuple, tuple[int, int]]:
    return {(row.team_id, row.kin_key, row.lexeme): (row.documents, row.total_length)
            for row in MemoryTermCount.objects.all()}


def recount() -> dict[tuple, tuple[int, int]]:
    """The counters as they should be, counted over the active memories."""
    with connection.cursor() as cursor:
        cursor.execute("""
            SELECT team_id, coalesce(kin_id, 0), '', count(*), sum(length(search_tsv))
            FROM memories_memory WHERE status = 'active' GROUP BY 1, 2
            UNION ALL
            SELECT team_id, coalesce(kin_id, 0), lexeme, count(*), 0
            FROM memories_memory, unnest(tsvector_to_array(search_tsv)) AS lexeme
            WHERE status = 'active' GROUP BY 1, 2, 3
        """)
        return {(team, kin_key, lexeme): (int(documents), int(length))
                for team, kin_key, lexeme, documents, length in cursor.fetchall()}


def test_counters_match_a_recount_after_every_kind_of_write(team, kin):
    other = KinFactory(team=team)
    actor = Actor(label="test")
    steps = []
    first = add(team, kin, "Maria prefers espresso after lunch", subject="maria")
    second = add(team, kin, "The espresso machine is in the kitchen")
    shared = add(team, None, "The printer toner is in the cupboard")
    steps.append("add (own and shared)")
    MemoryFactory.create_batch(5, team=team, kin=other, content="Kenji owns the quarterly budget")
    steps.append("bulk insert")
    services.memory_update(memory=first, actor=actor, content="Maria prefers green tea after lunch")
    steps.append("content edit")
    services.memory_update(memory=first, actor=actor, subject="tea")
    steps.append("subject edit")
    services.memory_delete(memory=second, actor=actor)
    steps.append("delete (status)")
    services.memory_supersede(memory=shared, actor=actor, reason="newer")
    steps.append("supersede")
    Memory.objects.filter(pk=second.pk).update(status=Memory.Status.ACTIVE)
    steps.append("reactivate")
    Memory.objects.filter(pk=first.pk).update(kin=other)
    steps.append("move to another kin")
    Memory.objects.filter(pk=first.pk).update(kin=None)
    steps.append("move to shared")
    Memory.objects.filter(kin=other).delete()
    steps.append("row delete")
    assert counters() == recount(), steps
    assert counters()[(team.pk, kin.pk, "espresso")] == (1, 0)
    assert counters()[(team.pk, 0, "")][0] == 1  # the moved memory; the toner one is superseded
    kin.delete()  # its memories go with it
    assert counters() == recount()
    # Counters that fall to 0 are removed: no scope keeps rows for lexemes it no longer has.
    assert not MemoryTermCount.objects.filter(kin_key__in=[kin.pk, other.pk]).exists()
    assert not MemoryTermCount.objects.filter(documents__lte=0).exists()


def test_each_step_keeps_the_counters_exact(team, kin):
    # The same writes, checked one by one (a wrong step above would only show at the end).
    actor = Actor(label="test")
    memory = add(team, kin, "Tom owns the quarterly budget report")
    assert counters() == recount()
    services.memory_update(memory=memory, actor=actor, content="Tom owns the yearly budget")
    assert counters() == recount()
    assert (team.pk, kin.pk, "quarter") not in counters()
    services.memory_delete(memory=memory, actor=actor)
    assert counters() == recount() == {}


def test_retrieval_marks_do_not_rewrite_the_counters(team, kin):
    memory = add(team, kin, "The staging server runs in Frankfurt")

    def row_versions():
        with connection.cursor() as cursor:
            cursor.execute("SELECT lexeme, xmin::text FROM memories_memorytermcount")
            return dict(cursor.fetchall())

    before = row_versions()
    services.memories_mark_retrieved(memory_ids=[memory.pk])
    Memory.objects.filter(pk=memory.pk).update(importance=9)
    assert row_versions() == before


def test_statistics_are_read_from_the_counters_of_the_query_lexemes(team, kin, monkeypatch):
    monkeypatch.setattr(postgres, "COMMON_TERM_MIN_DOCS", 3)
    monkeypatch.setattr(postgres, "COMMON_TERM_SHARE", 0.3)
    for person in ("Tom", "Aisha", "Kenji", "Lena"):
        add(team, kin, f"{person} prefers updates about the roadmap")
    add(team, None, "Omar prefers answers in bullet points")
    add(team, kin, "The espresso machine is in the kitchen")

    stats = postgres.scope_stats({"team": team.pk, "kin": kin.pk}, True, ["prefer", "espresso", "zebra"])
    # 6 memories in scope (5 own, 1 shared): "prefer" in 5 is common, "espresso" in 1 is not.
    assert (stats.count, stats.common) == (6, {"prefer": 5})
    assert stats.avg_length == pytest.approx(sum(v[1] for k, v in recount().items() if k[2] == "") / 6)
    own_only = postgres.scope_stats({"team": team.pk, "kin": kin.pk}, False, ["prefer"])
    assert (own_only.count, own_only.common) == (5, {"prefer": 4})
    assert postgres.scope_stats({"team": team.pk}, True, None).count == 1  # the shared scope

    # A search reads the memories once (the BM25 statement); the statistics come from the counters.
    postgres._query_lexemes(["prefers", "espresso"])  # lexemes known, as after a first search
    with CaptureQueriesContext(connection) as queries:
        hits = memory_search(team=team, kin=kin, query="prefers espresso", limit=10)
    assert hits and hits[0].memory.content.startswith("The espresso")
    statements = [query["sql"] for query in queries.captured_queries]
    assert len(statements) == 2
    assert "memories_memorytermcount" in statements[0] and "memories_memory " not in statements[0]
    assert "memories_memory m" in statements[1]
