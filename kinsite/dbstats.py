"""Planner statistics after bulk writes (PostgreSQL): where autovacuum is off or lags, search
would be planned over a table the planner still believes empty, many times slower. So a bulk
write (message or kin import) ends by analysing the tables it grew past autovacuum's own
threshold; small writes cost one query."""
import logging

from django.db import connection, models, transaction

logger = logging.getLogger(__name__)

# autovacuum's defaults: a table is due when rows changed since its last analysis pass 50 + 10 %.
ANALYZE_THRESHOLD = 50
ANALYZE_SCALE_FACTOR = 0.1

# Table names go into ANALYZE as identifiers; this check keeps anything but real tables out.
_STALE_TABLES = """
    SELECT s.relname FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
    WHERE s.schemaname = current_schema() AND s.relname = ANY(%s)
      AND s.n_mod_since_analyze > %s + %s * GREATEST(c.reltuples, 0)
"""


def analyze_stale_tables(tables: list[str]) -> list[str]:
    """ANALYZE those of `tables` changed past autovacuum's threshold since their last analysis;
    answers the tables analysed (none on SQLite, which needs no such statistics here)."""
    if connection.vendor != "postgresql" or not tables:
        return []
    with connection.cursor() as cursor:
        if connection.pg_version >= 150000:
            # Make this connection's own recent writes visible in pg_stat_user_tables now
            # (before PostgreSQL 15 the collector lags; the next bulk write catches up).
            cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute(_STALE_TABLES, [tables, ANALYZE_THRESHOLD, ANALYZE_SCALE_FACTOR])
        stale = [row[0] for row in cursor.fetchall()]
        for table in stale:
            cursor.execute(f"ANALYZE {connection.ops.quote_name(table)}")
    if stale:
        logger.info("Analysed %s after a bulk write", ", ".join(stale))
    return stale


def analyze_after_commit(*tables: type[models.Model] | str) -> None:
    """Run analyze_stale_tables for these models (or table names) once the transaction commits.
    A failure is logged, never raised: the write has committed."""
    names = [table if isinstance(table, str) else table._meta.db_table for table in tables]

    def analyze():
        try:
            analyze_stale_tables(names)
        except Exception:
            logger.warning("Could not analyse %s after a bulk write", ", ".join(names), exc_info=True)

    transaction.on_commit(analyze)
