"""Full-text candidates on PostgreSQL: BM25 over the stored tsvector, with the scope's
statistics from the trigger-kept counters (MemoryTermCount) and query lexemes cached per
process."""
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.db import connection

from kinsite import bm25
from memories.models import MemoryTermCount
from memories.search.candidates import SUBJECT_WEIGHT, TextMatch, hit_columns_sql

# Common terms: a lexeme in at least this share of the scope's memories (and in at least
# COMMON_TERM_MIN_DOCS of them) still scores but does not pull memories in as candidates,
# as in Lucene's CommonTermsQuery: scoring every memory that says "team" is most of a
# search's cost, and one lacking every rarer word of the query is rarely what it is about.
# A query of common terms only (or whose rarer terms match nothing) takes its candidates
# from its rarest common term. Scopes too small to have common terms are searched
# exhaustively, which is cheap there. Values chosen on LoCoMo (docs/benchmarks.md).
COMMON_TERM_SHARE = 0.005
COMMON_TERM_MIN_DOCS = 250
# A lexeme in this many memories is common whatever the scope's size, so a search's cost
# stays bounded (by share alone, a scope of 1,000,000 would pull in up to 5,000 candidates
# per "rare" lexeme). It only bites above 200,000 memories in scope.
COMMON_TERM_MAX_DOCS = 1_000
# A query of common terms only reads at most this many memories of its rarest common term,
# in heap order (about the oldest first): for one common word BM25 orders thousands of
# matches only by length, and ranking weighs recency and importance over those read.
FALLBACK_CANDIDATES = 2_000


@dataclass(frozen=True)
class ScopeStats:
    """What BM25 needs about a scope beyond the matching memories: its active memory count
    and the document frequency of every common lexeme asked about. avg_length is unused by
    the search (BM25 takes the candidates'); it shows the trigger-kept total length is right."""

    count: int
    avg_length: float
    common: dict[str, int] = field(default_factory=dict)


def scope_stats(params: dict, include_shared: bool, lexemes: list[str] | None) -> ScopeStats:
    """The scope's BM25 statistics (params as scope_sql makes them), with the common ones
    among `lexemes` (None: every common lexeme of the scope, for benchmarks). Exact and
    current: triggers keep the counters in every memory write's transaction (migration
    0012), and one row per scope and lexeme is read, so the cost does not grow with the scope."""
    kin_keys = [0] if "kin" not in params else [params["kin"], 0] if include_shared else [params["kin"]]
    wanted = "" if lexemes is None else "AND lexeme = ANY(%(lexemes)s)"
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT lexeme, sum(documents), sum(total_length) FROM {MemoryTermCount._meta.db_table} "
            f"WHERE team_id = %(team)s AND kin_key = ANY(%(kin_keys)s) {wanted} GROUP BY lexeme",
            {"team": params["team"], "kin_keys": kin_keys, "lexemes": ["", *(lexemes or [])]},
        )
        documents = {lexeme: (int(count), int(length)) for lexeme, count, length in cursor.fetchall()}
    count, total_length = documents.pop("", (0, 0))
    min_docs = common_threshold(count)
    common = {lexeme: ndoc for lexeme, (ndoc, _) in documents.items() if ndoc >= min_docs}
    return ScopeStats(count=count, avg_length=max(total_length / count if count else 1.0, 1.0), common=common)


def common_threshold(count: int) -> int:
    """How many of a scope's `count` memories a lexeme must be in to be common."""
    return max(COMMON_TERM_MIN_DOCS, min(math.ceil(COMMON_TERM_SHARE * count), COMMON_TERM_MAX_DOCS))


# Query terms' lexemes ('english' configuration), cached per process: a word's lexemes
# never change, and most words of a message were seen before. Terms are \w+ runs
# (query_terms), so a term's lexemes are the same alone as within the query. Emptied when full.
LEXEME_CACHE_TERMS = 50_000
_term_lexemes: dict[str, tuple[str, ...]] = {}


def _query_lexemes(terms: list[str]) -> list[str]:
    """The distinct lexemes of the terms, sorted; [] when all are PostgreSQL stop words."""
    known = {term: _term_lexemes[term] for term in terms if term in _term_lexemes}
    missing = [term for term in terms if term not in known]
    if missing:
        with connection.cursor() as cursor:
            cursor.execute("SELECT t, array(SELECT lexeme FROM unnest(to_tsvector('english', t))) "
                           "FROM unnest(%s::text[]) AS t", [missing])
            found = {term: tuple(lexemes) for term, lexemes in cursor.fetchall()}
        if len(_term_lexemes) + len(found) > LEXEME_CACHE_TERMS:
            _term_lexemes.clear()
        _term_lexemes.update(found)
        known.update(found)
    return sorted({lexeme for lexemes in known.values() for lexeme in lexemes})


def text_scores(terms: list[str], scope_sql: str, params: dict, limit: int,
                include_shared: bool) -> list[TextMatch]:
    """BM25 over the stored tsvector (content weight A, subject B: migration 0002); computed
    here as ts_rank has no inverse document frequency. Candidates are the memories matching
    the query's rare lexemes, whose document frequencies are counted among them; common
    lexemes only add to their scores, with frequencies from the scope's counters. Every
    read is bounded: a rare lexeme matches fewer than COMMON_TERM_MAX_DOCS memories, and
    the common-only fallback reads at most FALLBACK_CANDIDATES.

    BM25's collection is the memories matching the query, not the whole scope: N is the sum
    of the query lexemes' document frequencies, the average length the candidates'. So
    memories sharing no query word change nothing; scope-wide statistics flattened the idf
    gap and penalised longer memories, costing recall at scale (docs/concepts/memories.md).

    Term frequency is 1 for a content match, SUBJECT_WEIGHT for a subject-only one (memories
    are short; a term rarely repeats), so one `@@` per lexeme over the candidates replaces
    unnesting their tsvectors. Lexemes travel as parameters. Arithmetic is float8: numeric
    ln() was most of the cost."""
    lexemes = _query_lexemes(terms)
    if not lexemes:
        return []  # only PostgreSQL stop words
    stats = scope_stats(params, include_shared, lexemes)
    common = [lexeme for lexeme in lexemes if lexeme in stats.common]
    rare = [lexeme for lexeme in lexemes if lexeme not in stats.common]
    rarest_common = min(common, key=lambda lexeme: (stats.common[lexeme], lexeme)) if common else None
    params = {**params, **bm25.PARAMS, "subject_weight": SUBJECT_WEIGHT, "n": stats.count, "limit": limit}

    def matching(lexemes_of_tsquery: list[str], name: str) -> str:
        params[name] = " | ".join(_tsquery_literal(lexeme) for lexeme in lexemes_of_tsquery)
        return (f"SELECT m.id, m.search_tsv FROM memories_memory m "
                f"WHERE m.status = 'active' AND m.search_tsv @@ %({name})s::tsquery AND {scope_sql}")

    ctes = []
    fallback = ""
    if rarest_common is not None:
        fallback = matching([rarest_common], "fallback")
        if rare:
            # Planned as a one-time filter: the scan only runs when no rare lexeme matched.
            fallback += " AND NOT EXISTS (SELECT 1 FROM rare_matches)"
        if stats.common[rarest_common] > FALLBACK_CANDIDATES:
            fallback = f"({fallback} LIMIT %(fallback_limit)s)"
            params["fallback_limit"] = FALLBACK_CANDIDATES
    if rare:
        ctes.append(f"rare_matches AS MATERIALIZED ({matching(rare, 'rare')})")
        matches = "SELECT id, search_tsv FROM rare_matches" + (f" UNION ALL {fallback}" if fallback else "")
    else:
        matches = fallback

    tf_columns, df_columns, idf_columns, score_terms = [], [], [], []
    for i, lexeme in enumerate(lexemes):
        params[f"any{i}"] = _tsquery_literal(lexeme)
        params[f"content{i}"] = _tsquery_literal(lexeme) + ":A"
        tf_columns.append(
            f"CASE WHEN c.search_tsv @@ %(any{i})s::tsquery THEN CASE WHEN c.search_tsv @@ %(content{i})s::tsquery "
            f"THEN 1.0::float8 ELSE %(subject_weight)s::float8 END ELSE 0.0::float8 END AS tf{i}"
        )
        if lexeme in stats.common:
            params[f"df{i}"] = float(stats.common[lexeme])
            df_columns.append(f"%(df{i})s::float8 AS df{i}")
        else:
            # Counted once among the candidates (every memory matching a rare lexeme is one).
            df_columns.append(f"count(*) FILTER (WHERE tf{i} > 0)::float8 AS df{i}")
        idf_columns.append(f"{bm25.idf_sql('f.n', f'f.df{i}', vendor='postgresql')} AS idf{i}")
        score_terms.append(bm25.term_score_sql(f"s.idf{i}", f"s.tf{i}", "s.norm", vendor="postgresql"))
    ctes.append(f"""candidates AS MATERIALIZED (
            SELECT c.id, length(c.search_tsv)::float8 AS length, {", ".join(tf_columns)}
            FROM ({matches}) c
        )""")
    # One row of collection statistics; the idf clamps N to each df, as the counters and
    # the candidates are two reads a write may commit between.
    ctes.append(f"""frequencies AS MATERIALIZED (
            SELECT avg(length) AS avg_length, {", ".join(df_columns)} FROM candidates
        )""")
    ctes.append(f"""weights AS MATERIALIZED (
            SELECT greatest(coalesce(f.avg_length, 1.0::float8), 1.0::float8) AS avg_length, {", ".join(idf_columns)}
            FROM (SELECT *, least(%(n)s::float8, {" + ".join(f"df{i}" for i in range(len(lexemes)))}) AS n
                  FROM frequencies) f
        )""")
    ctes.append(f"""best AS (
            SELECT s.id, {" + ".join(score_terms)} AS score
            FROM (SELECT c.*, w.*, {bm25.length_norm_sql("c.length", "w.avg_length", vendor="postgresql")} AS norm
                  FROM candidates c CROSS JOIN weights w
                  OFFSET 0) s  -- not flattened: the length norm is computed once per candidate, not per lexeme
            ORDER BY score DESC, s.id
            LIMIT %(limit)s
        )""")
    # updated_at travels as epoch seconds (timestamptz through Django's loader was half the
    # read's cost); the rest of the row is the hit's memory (selectors._hit_memories).
    sql = f"""
        WITH {", ".join(ctes)}
        SELECT best.id, best.score, m.importance, m.category, EXTRACT(EPOCH FROM m.updated_at)::float8, m.subject,
               {hit_columns_sql("m")}
        FROM best JOIN memories_memory m ON m.id = best.id
        ORDER BY best.score DESC, best.id
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [TextMatch(row[0], float(row[1]), row[2], row[3], datetime.fromtimestamp(row[4], UTC), row[5], row[6:])
                for row in cursor.fetchall()]


def _tsquery_literal(lexeme: str) -> str:
    # A quoted tsquery operand: the lexeme is matched as is, never parsed as an operator.
    return "'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'"
