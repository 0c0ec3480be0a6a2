"""A bulk write leaves PostgreSQL's planner statistics current (kinsite.dbstats): a message
import that grows the history search tables past autovacuum's threshold analyses them (this
machine's autovacuum is off, as a lagging one would be), a small one does not, and a kin
import does the same for the tables it fills."""
import pytest
from django.db import connection

from kinsite.dbstats import ANALYZE_THRESHOLD, analyze_stale_tables
from tests.factories import MemoryFactory, MessageFactory
from transfer.selectors import kin_export_document

pytestmark = pytest.mark.django_db(transaction=True)

SEARCH_TABLES = ["sessions_app_event", "sessions_app_searchposting"]


@pytest.fixture(autouse=True)
def postgresql_only():
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL pass: SQLite keeps no planner statistics to refresh")


def analysed(tables=SEARCH_TABLES) -> dict:
    """Each table's last manual ANALYZE and its rows changed since the last analysis."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute("SELECT relname, last_analyze, n_mod_since_analyze FROM pg_stat_user_tables "
                       "WHERE relname = ANY(%s)", [tables])
        return {name: (last, changed) for name, last, changed in cursor.fetchall()}


def messages(count: int, prefix: str) -> list[dict]:
    return [{"content": f"Region {i} gets the revised churn numbers by Friday.", "sender": "Maria",
             "external_id": f"{prefix}-{i}"} for i in range(count)]


def test_a_large_import_analyses_the_search_tables_and_a_small_one_does_not(api_client, chat_session):
    analyze_stale_tables(SEARCH_TABLES)  # whatever earlier tests left: start from fresh statistics
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE sessions_app_event, sessions_app_searchposting")
    before = analysed()

    response = api_client.post(f"/api/v1/sessions/{chat_session.pk}/messages/import/",
                               {"messages": messages(1000, "big")}, format="json")

    assert response.status_code == 201, response.content[:300]
    after = analysed()
    for table in SEARCH_TABLES:
        assert after[table][0] > before[table][0], (table, before, after)  # analysed by the import
        assert after[table][1] < ANALYZE_THRESHOLD, (table, after)

    small = api_client.post(f"/api/v1/sessions/{chat_session.pk}/messages/import/",
                            {"messages": messages(20, "small")}, format="json")

    assert small.status_code == 201
    later = analysed()
    assert later["sessions_app_event"][0] == after["sessions_app_event"][0]  # 20 rows: not due
    assert later["sessions_app_event"][1] == 20


def test_a_kin_import_analyses_the_tables_it_fills(api_client, chat_session):
    for i in range(300):
        MessageFactory(session=chat_session, content=f"Message {i} about the churn report.")
        MemoryFactory(team=chat_session.kin.team, kin=chat_session.kin, content=f"Maria prefers report {i}.")
    document = kin_export_document(kin=chat_session.kin, include_sessions=True)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE sessions_app_event, memories_memory")
    before = analysed(["sessions_app_event", "memories_memory"])

    response = api_client.post("/api/v1/kins/import/", document, format="json")

    assert response.status_code == 201, response.content[:300]
    after = analysed(["sessions_app_event", "memories_memory"])
    for table in ("sessions_app_event", "memories_memory"):
        assert after[table][0] > before[table][0], (table, before, after)
