"""Full-text candidates on SQLite: FTS5 finds the memories, BM25 is computed here with the
statistics of the memories that match, as on PostgreSQL (postgres.py)."""
from django.db import connection

from kinsite.rawsql import aware_datetime
from kinsite.textsearch import fts5_match_expression
from memories.search.candidates import BM25_B, BM25_K1, SUBJECT_WEIGHT, TextMatch, hit_columns_sql

# highlight()'s opening marker, one character: the marked column's length minus its own
# is how many times the term occurs there (the closing marker is empty).
_MARK = "|"


def text_scores(terms: list[str], scope_sql: str, params: dict, limit: int) -> list[TextMatch]:
    """BM25 over memories_memory_fts, an external-content FTS5 table kept by triggers
    (migration 0002), columns (subject, content). FTS5's own bm25() takes N and the
    average length from the whole table (every kin and team), so memories about other
    things, sharing no query word, changed the order of those that match; here the
    collection is the memories in scope that match a term, as on PostgreSQL: N is the sum
    of the terms' document frequencies, the average length the candidates'.

    Term frequency is as in FTS5's bm25(): how many times the term occurs in the content,
    plus SUBJECT_WEIGHT times in the subject (the porter stemmer's forms count alike: "paint",
    "painted", "painting"). A memory about the thing asked names it more than once; with a
    term frequency of 1 whatever the count, LoCoMo recall@10 was 0.011 lower (bench/README.md,
    "SQLite: term frequency"). The occurrences are counted with highlight() on each term's own
    match, so each term's postings are read once, and only memories in scope are counted.
    Length is in characters: FTS5 gives no token count outside its auxiliary functions, and
    BM25 only uses it relative to the average (token counts did no better on LoCoMo)."""
    params = {**params, "subject_weight": SUBJECT_WEIGHT, "mark": _MARK, "k1": BM25_K1, "b": BM25_B,
              "limit": limit}
    hit_queries, tf_columns, df_columns, idf_columns, score_terms = [], [], [], [], []
    for i, term in enumerate(terms):
        params[f"term{i}"] = fts5_match_expression([term])
        hit_queries.append(
            f"SELECT {i} AS term, m.id, length(m.content) + length(m.subject) AS length,"
            f" {_occurrences(1, 'm.content')} + %(subject_weight)s * {_occurrences(0, 'm.subject')} AS tf"
            f" FROM memories_memory_fts JOIN memories_memory m ON m.id = memories_memory_fts.rowid"
            f" WHERE memories_memory_fts MATCH %(term{i})s AND m.status = 'active' AND {scope_sql}"
        )
        tf_columns.append(f"total(CASE WHEN term = {i} THEN tf END) AS tf{i}")
        df_columns.append(f"sum(tf{i} > 0) AS df{i}")
        idf_columns.append(f"ln(1.0 + (f.n - f.df{i} + 0.5) / (f.df{i} + 0.5)) AS idf{i}")
        score_terms.append(f"w.idf{i} * c.tf{i} * (%(k1)s + 1.0) / (c.tf{i} + %(k1)s"
                           f" * (1.0 - %(b)s + %(b)s * c.length / w.avg_length))")
    sql = f"""
        WITH hits AS MATERIALIZED (
            {" UNION ALL ".join(hit_queries)}
        ),
        candidates AS MATERIALIZED (
            SELECT id, max(length) AS length, {", ".join(tf_columns)} FROM hits GROUP BY id
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


def _occurrences(column: int, text: str) -> str:
    """How many times the matched term occurs in the FTS5 column (0 subject, 1 content),
    `text` being that column of the memory: highlight() returns the text with the mark
    before each occurrence, so the count does not depend on the text's own characters."""
    return f"(length(highlight(memories_memory_fts, {column}, %(mark)s, '')) - length({text}))"
