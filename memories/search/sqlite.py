"""Full-text candidates on SQLite: FTS5 finds the memories, BM25 is computed here with the
statistics of the memories that match, as on PostgreSQL (postgres.py)."""
from django.db import connection

from kinsite import bm25
from kinsite.rawsql import aware_datetime
from kinsite.textsearch import fts5_match_expression
from memories.search.candidates import SUBJECT_WEIGHT, TextMatch, hit_columns_sql

# Occurrences are counted for this many times `limit` of the best memories by a score that
# counts every matching term once (see text_scores).
RECOUNT_FACTOR = 2
# highlight()'s opening marker: the marked text's length minus the text's own is how many
# times the term occurs in it (the closing marker is empty).
_MARK = "|"


def text_scores(terms: list[str], scope_sql: str, params: dict, limit: int) -> list[TextMatch]:
    """BM25 over memories_memory_fts (external-content FTS5 kept by triggers, migration 0002;
    columns subject, content). FTS5's own bm25() takes N and the average length from the
    whole table, so unrelated memories reordered the matching ones; here, as on PostgreSQL,
    the collection is the memories in scope that match a term. Length is in characters:
    FTS5 gives no token count outside its auxiliary functions, and BM25 uses it relatively.

    Term frequency is as in FTS5's bm25(): the term's occurrences in the content (stemmed
    forms alike) plus SUBJECT_WEIGHT times those in the subject, as a memory about the thing
    asked often names it twice. Counting takes highlight(), too slow for every candidate, so
    two passes: every candidate is scored counting each term once, then the RECOUNT_FACTOR ×
    `limit` best again with occurrences counted (on LoCoMo, the same memories as counting all)."""
    params = {**params, **bm25.PARAMS, "match": fts5_match_expression(terms), "subject_weight": SUBJECT_WEIGHT,
              "mark": _MARK, "recount": RECOUNT_FACTOR * limit, "limit": limit}
    once_columns, df_columns, idf_columns, occurrences = [], [], [], []
    for i, term in enumerate(terms):
        params[f"term{i}"] = fts5_match_expression([term])
        params[f"content{i}"] = "content : " + params[f"term{i}"]
        params[f"subject{i}"] = "subject : " + params[f"term{i}"]
        once_columns.append(
            f"CASE WHEN m.id IN (SELECT rowid FROM memories_memory_fts WHERE memories_memory_fts MATCH %(content{i})s)"
            f" THEN 1.0 WHEN m.id IN (SELECT rowid FROM memories_memory_fts"
            f" WHERE memories_memory_fts MATCH %(subject{i})s) THEN %(subject_weight)s ELSE 0.0 END AS tf{i}"
        )
        df_columns.append(f"sum(tf{i} > 0) AS df{i}")
        idf_columns.append(f"{bm25.idf_sql('f.n', f'f.df{i}', vendor='sqlite')} AS idf{i}")
        # highlight() only works on the cursor of the MATCH, so CROSS JOIN keeps the FTS5
        # table the outer loop. The unary + keeps the id list a filter: as a constraint, FTS5
        # would look each id up in the term's postings, reading them again each time.
        occurrences.append(
            f"SELECT {i} AS term, m.id, length(m.content) + length(m.subject) AS length,"
            f" {_occurrences(1, 'm.content')} + %(subject_weight)s * {_occurrences(0, 'm.subject')} AS tf"
            f" FROM memories_memory_fts CROSS JOIN memories_memory m ON m.id = memories_memory_fts.rowid"
            f" WHERE memories_memory_fts MATCH %(term{i})s AND +memories_memory_fts.rowid IN (SELECT id FROM first)"
        )
    counted_columns = [f"total(CASE WHEN o.term = {i} THEN o.tf END) AS tf{i}" for i in range(len(terms))]
    sql = f"""
        WITH candidates AS MATERIALIZED (
            SELECT m.id, length(m.content) + length(m.subject) AS length, {", ".join(once_columns)}
            FROM memories_memory_fts
            JOIN memories_memory m ON m.id = memories_memory_fts.rowid
            WHERE memories_memory_fts MATCH %(match)s AND m.status = 'active' AND {scope_sql}
        ),
        frequencies AS MATERIALIZED (
            SELECT avg(length) AS avg_length, {", ".join(df_columns)} FROM candidates
        ),
        weights AS MATERIALIZED (
            SELECT max(coalesce(f.avg_length, 1.0), 1.0) AS avg_length, {", ".join(idf_columns)}
            FROM (SELECT *, {" + ".join(f"df{i}" for i in range(len(terms)))} AS n FROM frequencies) f
        ),
        first AS MATERIALIZED (
            SELECT c.id, {_bm25(len(terms))} AS score
            FROM candidates c CROSS JOIN weights w
            ORDER BY score DESC, c.id
            LIMIT %(recount)s
        ),
        occurrences AS MATERIALIZED (
            {" UNION ALL ".join(occurrences)}
        ),
        best AS (
            SELECT c.id, {_bm25(len(terms))} AS score
            FROM (SELECT o.id, max(o.length) AS length, {", ".join(counted_columns)}
                  FROM occurrences o GROUP BY o.id) c
            CROSS JOIN weights w
            ORDER BY score DESC, c.id
            LIMIT %(limit)s
        )
        SELECT best.id, best.score, m.importance, m.category, m.updated_at, m.subject, {hit_columns_sql("m")}
        FROM best JOIN memories_memory m ON m.id = best.id
        ORDER BY best.score DESC, best.id
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [TextMatch(row[0], float(row[1]), row[2], row[3], aware_datetime(row[4]), row[5], row[6:])
                for row in cursor.fetchall()]


def _bm25(term_count: int) -> str:
    """The BM25 score of a candidate `c` (id, length, tf0..) with the collection's weights `w`."""
    norm = bm25.length_norm_sql("c.length", "w.avg_length", vendor="sqlite")
    return " + ".join(bm25.term_score_sql(f"w.idf{i}", f"c.tf{i}", norm, vendor="sqlite") for i in range(term_count))


def _occurrences(column: int, text: str) -> str:
    """How many times the matched term occurs in the FTS5 column (0 subject, 1 content),
    `text` being that column of the memory: highlight() returns the text with the mark
    before each occurrence, so the count does not depend on the text's own characters."""
    return f"(length(highlight(memories_memory_fts, {column}, %(mark)s, '')) - length({text}))"
