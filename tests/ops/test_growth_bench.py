"""bench/growth.py at tiny sizes on the test database: its bulk loads leave the tables
kept by triggers as the triggers' own definitions compute them, and a run writes the
JSON with every series at every size and the PNG, and leaves no row behind."""
import importlib
import json

import pytest
from django.db import connection

from bench.growth import SERIES, build_team, delete_team, report, run
from bench.synthetic import HistoryCorpus
from kinsite.models import ApiToken, Kin, Team
from memories.models import Memory, MemoryTermCount, MemoryVectorScope
from sessions_app.models import Event, MessageCount, Session

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]  # VACUUM runs outside a transaction

postings = importlib.import_module("sessions_app.migrations.0018_event_search_postings")
term_counts = importlib.import_module("memories.migrations.0012_memory_term_counts")


def rows_differing(stored: str, expected: str) -> int:
    """Rows in one query's result and not the other's (as multisets)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM (({stored}) EXCEPT ALL ({expected})) a")
        missing = cursor.fetchone()[0]
        cursor.execute(f"SELECT count(*) FROM (({expected}) EXCEPT ALL ({stored})) b")
        return missing + cursor.fetchone()[0]


def table_rows(table: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {table}")
        return cursor.fetchone()[0]


def test_bulk_loads_leave_the_tables_kept_by_triggers_right():
    team = build_team(memories=300, session_sizes=(40, 15), corpus=HistoryCorpus(5), seed=5)

    assert Memory.objects.filter(team_id=team["team_id"]).count() == team["layout"]["memories"] > 250
    assert Event.objects.filter(kind=Event.Kind.MESSAGE).count() == 55
    assert table_rows("sessions_app_searchposting") > 55
    assert rows_differing(
        "SELECT event_id, session_id, kin_id, lexeme, tf, doc_length, impact FROM sessions_app_searchposting",
        postings.POSTING_ROWS.format(source="sessions_app_event"),
    ) == 0
    assert sum(MessageCount.objects.values_list("message_count", flat=True)) == 55
    assert MemoryTermCount.objects.count() > 10
    assert rows_differing(
        "SELECT team_id, kin_key, lexeme, documents, total_length FROM memories_memorytermcount",
        term_counts._COUNTERS.format(sign=1, rows="memories_memory"),
    ) == 0
    # What the vector trigger would have written for a one-statement load: generation 1.
    scopes = {(scope.team_id, scope.kin_key): scope.generation for scope in MemoryVectorScope.objects.all()}
    assert len(scopes) == len(team["regular_kins"]) + 2  # the regular kins, the big kin, the shared scope
    assert set(scopes.values()) == {1}
    assert set(Memory.objects.values_list("vector_seq", flat=True)) == {1}
    # The vector trigger is on again: a later write bumps its scope.
    big = Memory.objects.filter(kin_id=team["big_kin"]).first()
    Memory.objects.filter(pk=big.pk).update(status=Memory.Status.DELETED)
    assert MemoryVectorScope.objects.get(team_id=team["team_id"], kin_key=team["big_kin"]).generation == 2

    delete_team(team["team_id"])
    assert table_rows("sessions_app_searchposting") == 0
    assert not MemoryTermCount.objects.exists() and not MemoryVectorScope.objects.exists()


def test_a_run_writes_every_series_at_every_size_and_a_png_and_leaves_no_rows(tmp_path):
    figures = run(databases={200: None, 400: None}, session_sizes=(20, 60), rounds=1, per_kind=1, seed=3,
                  delete_rows=True)
    json_path, png_path = report(figures, tmp_path)

    written = json.loads(json_path.read_text())
    assert set(written["series"]) == set(SERIES)
    for name, series in written["series"].items():
        sizes = ["20", "60"] if series["axis"] == "messages" else ["200", "400"]
        assert list(series["points"]) == sizes, name
        for point in series["points"].values():
            assert point["all"]["count"] == 5  # five query kinds, one call each
            assert point["all"]["p95_ms"] >= point["all"]["p50_ms"] > 0
    assert written["load_average"]["before"] and written["machine_state"]["python_speed_ms"]
    assert png_path.read_bytes().startswith(b"\x89PNG") and png_path.stat().st_size > 10_000
    assert png_path == json_path.with_suffix(".png")

    for model in (Team, Kin, ApiToken, Session, Event, MessageCount, Memory, MemoryTermCount, MemoryVectorScope):
        assert not model.objects.exists(), model.__name__
    assert table_rows("sessions_app_searchposting") == 0
