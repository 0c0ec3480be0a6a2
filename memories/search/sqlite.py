"""Full-text candidates on SQLite: FTS5 finds the memories, BM25 is computed here with the
statistics of the memories that match, as on PostgreSQL (postgres.py)."""
from django.db import connection

from kinsite.rawsql import aware_datetime
from kinsite.textsearch import fts5_match_expression
from memories.search.candidates import BM25_B, BM25_K1, SUBJECT_WEIGHT, TextMatch, hit_columns_sql


def text_scores(terms: list[str], scope_sql: str, params: dict, limit: int) -> list[TextMatch]:
    """BM25 over memories_memory_fts, an external-content FTS5 table kept by triggers
    (migration 0002), columns (subject, content). FTS5's own bm25() takes N and the
    average length from the whole table (every kin and team), so memories about other
    things, sharing no query word, changed the order of those that match; here the
    collection is the memories in scope that match a term, as on PostgreSQL: N is the sum
    of the terms' document frequencies, the average length the candidates'.

    Term frequency is 1 for a match in the content and SUBJECT_WEIGHT for one in the
    subject only (as postgres.text_scores): each term's matches in each column are read
    once (an FTS5 lookup per candidate re-read the term's postings every time: 150 ms a
    search at 600 memories). Length is in characters: FTS5 gives no token count outside its auxiliary
    functions, and BM25 only uses it relative to the average."""
    params = {**params, "match": fts5_match_expression(terms), "subject_weight": SUBJECT_WEIGHT,
              "k1": BM25_K1, "b": BM25_B, "limit": limit}
    tf_columns, df_columns, idf_columns, score_terms = [], [], [], []
    for i, term in enumerate(terms):
        params[f"content{i}"] = "content : " + fts5_match_expression([term])
        params[f"subject{i}"] = "subject : " + fts5_match_expression([term])
        tf_columns.append(
            f"CASE WHEN m.id IN (SELECT rowid FROM memories_memory_fts WHERE memories_memory_fts MATCH %(content{i})s)"
            f" THEN 1.0 WHEN m.id IN (SELECT rowid FROM memories_memory_fts"
            f" WHERE memories_memory_fts MATCH %(subject{i})s) THEN %(subject_weight)s ELSE 0.0 END AS tf{i}"
        )
        df_columns.append(f"sum(tf{i} > 0) AS df{i}")
        idf_columns.append(f"ln(1.0 + (f.n - f.df{i} + 0.5) / (f.df{i} + 0.5)) AS idf{i}")
        score_terms.append(f"w.idf{i} * c.tf{i} * (%(k1)s + 1.0) / (c.tf{i} + %(k1)s"
                           f" * (1.0 - %(b)s + %(b)s * c.length / w.avg_length))")
    sql = f"""
        WITH candidates AS MATERIALIZED (
            SELECT m.id, length(m.content) + length(m.subject) AS length, {", ".join(tf_columns)}
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
        best AS (
            SELECT c.id, {" + ".join(score_terms)} AS score
            FROM candidates c CROSS JOIN weights w
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
