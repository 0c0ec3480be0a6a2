"""Planner statistics after bulk writes (PostgreSQL).

The planner picks the search queries' plans from each table's statistics, which ANALYZE
keeps and autovacuum refreshes once a table has changed by about a tenth. An installation
whose autovacuum is off or lags would plan history search over a table it still believes
empty: right after importing 100,000 messages a search took 1–2 s until ANALYZE, 30–50 ms
after. So a bulk write (message import, kin import) ends by analysing the tables it grew
past autovacuum's own threshold; below it nothing runs, so small writes cost one query."""
import logging

from django.db import connection, models, transaction

logger = logging.getLogger(__name__)

# autovacuum's defaults (autovacuum_analyze_threshold, autovacuum_analyze_scale_factor): a
# table is due when the rows changed since its last analysis pass 50 + 10 % of its rows.
ANALYZE_THRESHOLD = 50
ANALYZE_SCALE_FACTOR = 0.1

# A table name goes into ANALYZE as an identifier; these are our own models' tables, but
# the check keeps anything else out.
_STALE_TABLES = """
    SELECT s.relname FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
    WHERE s.schemaname = current_schema() AND s.relname = ANY(%s)
      AND s.n_mod_since_analyze > %s + %s * GREATEST(c.reltuples, 0)
"""


def analyze_stale_tables(tables: list[str]) -> list[str]:
    """ANALYZE those of `tables` changed past autovacuum's threshold since their last
    analysis; answers the tables analysed (none on SQLite, whose planner needs no such
    statistics for these queries)."""
    if connection.vendor != "postgresql" or not tables:
        return []
    with connection.cursor() as cursor:
        if connection.pg_version >= 150000:
            # Make this connection's own recent writes visible in pg_stat_user_tables: they
            # are flushed when the backend is next idle, at most once a second unless forced
            # (before PostgreSQL 15 the collector lags anyway; the next bulk write catches up).
            cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute(_STALE_TABLES, [tables, ANALYZE_THRESHOLD, ANALYZE_SCALE_FACTOR])
        stale = [row[0] for row in cursor.fetchall()]
        for table in stale:
            cursor.execute(f"ANALYZE {connection.ops.quote_name(table)}")
    if stale:
        logger.info("Analysed %s after a bulk write", ", ".join(stale))
    return stale


def analyze_after_commit(*tables: type[models.Model] | str) -> None:
    """Run analyze_stale_tables for these models (or raw table names) once the current
    transaction commits (at once outside one). A failure is logged, never raised: the
    write has committed, and autovacuum or the next bulk write catches up."""
    names = [table if isinstance(table, str) else table._meta.db_table for table in tables]

    def analyze():
        try:
            analyze_stale_tables(names)
        except Exception:
            logger.warning("Could not analyse %s after a bulk write", ", ".join(names), exc_info=True)

    transaction.on_commit(analyze)
