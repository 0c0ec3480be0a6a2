"""Full-text candidates on SQLite: FTS5's own bm25()."""
from django.db import connection

from kinsite.rawsql import aware_datetime
from kinsite.textsearch import fts5_match_expression
from memories.search.candidates import SUBJECT_WEIGHT, TextMatch, hit_columns_sql


def text_scores(terms: list[str], scope_sql: str, params: dict, limit: int) -> list[TextMatch]:
    # memories_memory_fts is an external-content FTS5 table kept by triggers (migration
    # 0002), columns (subject, content). bm25() is lower-is-better; its statistics cover
    # the whole table, which is cheap and close enough.
    sql = f"""
        SELECT m.id, -bm25(memories_memory_fts, %(subject_weight)s, 1.0) AS score,
               m.importance, m.category, m.updated_at, m.subject, {hit_columns_sql("m")}
        FROM memories_memory_fts
        JOIN memories_memory m ON m.id = memories_memory_fts.rowid
        WHERE memories_memory_fts MATCH %(match)s AND m.status = 'active' AND {scope_sql}
        ORDER BY score DESC, m.id
        LIMIT %(limit)s
    """
    params = {**params, "match": fts5_match_expression(terms), "subject_weight": SUBJECT_WEIGHT, "limit": limit}
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [TextMatch(row[0], float(row[1]), row[2], row[3], aware_datetime(row[4]), row[5], row[6:])
                for row in cursor.fetchall()]
