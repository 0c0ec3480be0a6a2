"""Full-text candidates on PostgreSQL: BM25 over the stored tsvector, with the scope's
statistics read from the counters the database keeps (MemoryTermCount) and the lexemes
of query terms kept per process."""
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.db import connection

from kinsite import bm25
from memories.models import MemoryTermCount
from memories.search.candidates import SUBJECT_WEIGHT, TextMatch, hit_columns_sql

# Common terms (PostgreSQL). A lexeme in at least this share of the scope's memories, and
# in at least COMMON_TERM_MIN_DOCS of them, is common: it still scores, but it does not
# pull memories in as candidates, as in Lucene's CommonTermsQuery. Scoring every memory
# that says "prefers" or "team" was most of a search's time at 100,000 memories, and
# such a memory lacking every rarer word of the query is rarely what the query is about.
# A query made only of common terms (or whose rarer terms match nothing) takes its
# candidates from its rarest common term. Below COMMON_TERM_MIN_DOCS matches, scoring
# them all takes well under a millisecond, so small scopes are searched exhaustively.
# The values were chosen on LoCoMo (bench/memory_relevance.py): at 0.5 % a person's name
# is common in a 10,000-40,000-memory scope, which cut BM25 candidates five- to
# fifteen-fold with recall@10 no lower than an exhaustive search on any question; a
# floor of 100 documents instead of 250 lost a question, its topic word turned common.
COMMON_TERM_SHARE = 0.005
COMMON_TERM_MIN_DOCS = 250
# Bounds that keep a search's cost from growing with its scope (bench/memory_growth.py:
# 1,000,000 memories in a team, one kin of 100,000). A lexeme in COMMON_TERM_MAX_DOCS
# memories is common whatever the scope's size: by share alone, a scope of 1,000,000
# would pull in up to 5,000 candidates per "rare" lexeme. It only bites above 200,000
# memories in scope (0.5 % of them), so the LoCoMo-chosen thresholds stand below that.
COMMON_TERM_MAX_DOCS = 1_000
# A query of common terms only reads at most this many memories matching its rarest
# common term (when that term has more): in a kin of 100,000, a person's name matched
# 9,000, and reading and scoring them was most of the search (13 of 16 ms). Which ones
# are read is the heap's order (about the oldest first): for one common word the BM25
# order among thousands of matches is only their length, and ranking weighs recency
# and importance over the 50 best of whichever are read.
FALLBACK_CANDIDATES = 2_000


@dataclass(frozen=True)
class ScopeStats:
    """What BM25 needs to know about a scope beyond the matching memories: its active
    memory count and the document frequency of every common lexeme asked about (see
    COMMON_TERM_SHARE). avg_length, the scope's average tsvector length from the same
    counter row, is not used by the search (BM25 takes the candidates', see text_scores):
    it shows the counters' total length, which the triggers keep, is right."""

    count: int
    avg_length: float
    common: dict[str, int] = field(default_factory=dict)


def scope_stats(params: dict, include_shared: bool, lexemes: list[str] | None) -> ScopeStats:
    """The scope's BM25 statistics (params as scope_sql makes them: team, and kin unless
    the scope is the shared memories), with the common ones among `lexemes` (None: every
    common lexeme of the scope, for benchmarks). Exact and current: the counters are
    kept by triggers in the transaction of every memory write (migration 0012), and the
    query reads one row per scope and lexeme, so its cost does not grow with the scope
    (counting over the scope took 30 ms at 19,000 memories, 150 ms at 109,000)."""
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


# The lexemes of query terms (PostgreSQL's 'english' configuration), kept per process:
# a word's lexemes never change, and a message is mostly words seen before, so a search
# seldom needs the round trip for them. Terms are \w+ runs (query_terms), so a term's
# lexemes are the same alone as within the query text (checked on every LoCoMo turn and
# question). Bounded: emptied when full.
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
    """BM25 over the stored tsvector (migration 0002: content weight A, subject B; GIN
    indexes per scope: migration 0003). ts_rank has no inverse document frequency, so
    BM25 is computed here. Candidates are the memories matching the query's rare
    lexemes (common ones only add to their scores; see COMMON_TERM_SHARE), so the
    rare lexemes' document frequencies are counted exactly among the candidates; the
    common lexemes' come from the scope's counters (scope_stats). Every read is bounded
    whatever the scope's size: rare lexemes match fewer than COMMON_TERM_MAX_DOCS
    memories each, and the common-only fallback reads at most FALLBACK_CANDIDATES.

    BM25's collection is the memories that match the query, not the whole scope: N is
    the sum of the query lexemes' document frequencies (at most the scope's count), and
    the average length is the candidates'. Over the whole scope, every memory about
    something else added ln(N) alike to every lexeme's idf, which flattened the gap
    between a speaker's name (in half the conversation) and the rare word that finds the
    answer, and the many short ones shortened the average length, which then penalised
    every longer memory that matched: on LoCoMo with 50,000 unrelated memories per kin,
    recall@10 fell from 0.632 to 0.577 (bench/README.md, "recall at scale"). With the
    matching memories' statistics, memories that share no query word change nothing.

    Term frequency is 1 for a match in the content and SUBJECT_WEIGHT for a match in the
    subject only. Memories are a sentence or two, so a term rarely repeats; testing `@@`
    per query lexeme (C code) in one pass over the candidates, instead of unnesting every
    candidate's tsvector, keeps a query that touches thousands of memories fast. The
    per-lexeme columns are generated from the lexeme count only; lexemes travel as
    parameters. Arithmetic is float8: numeric ln() was most of the cost."""
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
    # The collection's statistics (see the docstring), one row computed once; the idf
    # clamps N to each df, as the counters and the candidates are two reads and a write
    # may commit between them.
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
    # For ranking, updated_at travels as epoch seconds: loading timestamptz through
    # Django's Python loader was about half the cost of reading the ~50 rows. The rest of
    # each row is the hit's memory, should ranking keep it (memories.search.selectors._hit_memories).
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
