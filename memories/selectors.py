"""Reads of memories: lists with filters, hybrid search, near-duplicate lookup.

Search reads the database once for candidates (full-text BM25 on either database,
plus a vector scan when an embedder is configured) and leaves the scoring to the pure
functions of memories.ranking."""
import logging
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import NamedTuple

from django.conf import settings
from django.db import connection
from django.db.models import DateTimeField
from django.shortcuts import get_object_or_404
from django.utils import timezone

from kinsite.llm.gateway import llm_embed
from kinsite.llm.providers import get_default_provider
from kinsite.models import Kin, Team
from kinsite.rawsql import aware_datetime
from kinsite.softcache import soft_cache_get, soft_cache_set
from kinsite.textsearch import fts5_match_expression, query_terms
from memories import ranking
from memories.models import Memory, MemoryChange

logger = logging.getLogger(__name__)


def memory_list(*, team: Team, kin: Kin | None = None, include_shared: bool = True, category: str = "",
                status: str = "", subject: str = ""):
    """A kin's memories (plus the team-shared ones unless include_shared is False),
    or with kin=None only the team-shared ones; filters are exact matches."""
    qs = Memory.objects.filter(team=team)
    if kin is None:
        qs = qs.filter(kin__isnull=True)
    elif include_shared:
        qs = qs.filter(kin=kin) | qs.filter(kin__isnull=True)
    else:
        qs = qs.filter(kin=kin)
    if category:
        qs = qs.filter(category=category)
    if status:
        qs = qs.filter(status=status)
    if subject:
        qs = qs.filter(subject__iexact=subject)
    return qs


def memory_get(*, team: Team, memory_id: int) -> Memory:
    return get_object_or_404(Memory, team=team, pk=memory_id)


def memory_history(*, memory: Memory):
    return MemoryChange.objects.filter(memory=memory).select_related("actor_user").order_by("created_at", "id")


@dataclass
class MemoryHit:
    """One search result: the memory, its final score and what the score was made of
    (components: text, vector, importance, recency, subject; see memories.ranking)."""

    memory: Memory
    score: float
    components: dict[str, float] = field(default_factory=dict)


# --- embeddings -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Embedding:
    vector: tuple[float, ...]
    model: str

    def as_bytes(self) -> bytes:
        return ranking.vector_to_bytes(self.vector)


def memory_embed(*, team: Team, kin: Kin | None, text: str, purpose: str) -> Embedding | None:
    """The embedding of `text` from the default provider, or None when it has no
    embedder or the call fails (logged: a memory is never lost to its vector)."""
    provider = get_default_provider()
    if not getattr(provider, "supports_embeddings", False) or not text.strip():
        return None
    try:
        [vector] = llm_embed(purpose=purpose, texts=[text], team=team, kin=kin, provider=provider)
    except Exception:
        logger.warning("Embedding for %s failed; going on without a vector", purpose, exc_info=True)
        return None
    if not vector:
        return None
    return Embedding(vector=tuple(float(x) for x in vector), model=_embedding_model_name(provider))


def _embedding_model_name(provider) -> str:
    # Vectors of different models are not comparable; rows record which model made theirs.
    return (getattr(provider, "embedding_model", "") or f"{provider.name}-embedding")[:200]


# Without pgvector the vector side is a scan in Python, so it is bounded: the most
# recently updated memories of the scope that carry a vector of the query's model.
VECTOR_SCAN_LIMIT = 2_000


def _vector_similarities(scope, embedding: Embedding) -> dict[int, float]:
    rows = (
        scope.filter(embedding__isnull=False, embedding_model=embedding.model)
        .order_by("-updated_at", "-id")
        .values_list("id", "embedding")[:VECTOR_SCAN_LIMIT]
    )
    similarities = {}
    for memory_id, data in rows:
        vector = ranking.vector_from_bytes(data)
        if vector is not None and len(vector) == len(embedding.vector):
            similarities[memory_id] = ranking.cosine(embedding.vector, vector)
    return similarities


# --- full text --------------------------------------------------------------------------------

# BM25 parameters, the usual defaults (SQLite's FTS5 bm25() uses the same).
BM25_K1 = 1.2
BM25_B = 0.75
# A match in the subject counts half a match in the content (the tsvector weights it B,
# FTS5 gets the column weight); matching the subject is rewarded again by ranking.
SUBJECT_WEIGHT = 0.5
# BM25 needs the scope's document count and average length. Counting them reads every
# active memory of the scope, too slow per query at 100,000 memories, so they are cached
# briefly: a minute-old count barely moves BM25, and idf is clamped so it stays positive.
SCOPE_STATS_SECONDS = 60
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


@dataclass(frozen=True)
class ScopeStats:
    """What BM25 needs to know about a scope beyond the matching memories: its active
    memory count, their average tsvector length, and the document frequency of every
    common lexeme (see COMMON_TERM_SHARE)."""

    count: int
    avg_length: float
    common: dict[str, int] = field(default_factory=dict)


class TextMatch(NamedTuple):
    """A full-text candidate: BM25 score plus the fields ranking needs, and the memory's
    row (`row`, see _memory_from_row), read by the same query so search reads no candidate
    again."""

    id: int
    score: float
    importance: int
    category: str
    updated_at: datetime
    subject: str
    row: tuple


# The columns a search hit is built from: all of a memory's but its embedding (never
# shown, and up to kilobytes). Timestamps travel as text and are parsed only for the
# hits (Django's timestamptz loader is Python and ran for every candidate).
_HIT_FIELDS = [f for f in Memory._meta.concrete_fields if f.name != "embedding"]
_HIT_TIMESTAMPS = {i for i, f in enumerate(_HIT_FIELDS) if isinstance(f, DateTimeField)}
_HIT_ATTNAMES = [f.attname for f in _HIT_FIELDS]


def _hit_columns_sql(alias: str) -> str:
    return ", ".join(
        f"CAST({alias}.{f.column} AS TEXT)" if i in _HIT_TIMESTAMPS else f"{alias}.{f.column}"
        for i, f in enumerate(_HIT_FIELDS)
    )


def _memory_from_row(row: tuple) -> Memory:
    """A Memory instance from the _hit_columns_sql columns, its embedding deferred."""
    values = [aware_datetime(value) if i in _HIT_TIMESTAMPS and value is not None else value
              for i, value in enumerate(row)]
    return Memory.from_db(connection.alias, _HIT_ATTNAMES, values)


def _scope_sql(*, team: Team, kin: Kin | None, include_shared: bool) -> tuple[str, dict]:
    params = {"team": team.pk}
    # PostgreSQL: the ids are cast to bigint, the columns' type, because btree_gin's
    # operator classes (migration 0003) only serve same-type comparisons.
    cast = "::bigint" if connection.vendor == "postgresql" else ""
    if kin is None:
        return f"m.team_id = %(team)s{cast} AND m.kin_id IS NULL", params
    params["kin"] = kin.pk
    if include_shared:
        return f"m.team_id = %(team)s{cast} AND (m.kin_id = %(kin)s{cast} OR m.kin_id IS NULL)", params
    return f"m.team_id = %(team)s{cast} AND m.kin_id = %(kin)s{cast}", params


def _text_scores(*, terms: list[str], team: Team, kin: Kin | None, include_shared: bool,
                 limit: int) -> list[TextMatch]:
    """Active memories in scope matching the terms, best BM25 score first."""
    scope_sql, params = _scope_sql(team=team, kin=kin, include_shared=include_shared)
    if connection.vendor == "postgresql":
        return _text_scores_postgresql(terms, scope_sql, params, limit, include_shared)
    return _text_scores_sqlite(terms, scope_sql, params, limit)


def _scope_stats_postgresql(scope_sql: str, params: dict, include_shared: bool) -> ScopeStats:
    key = f"memories:bm25:v2:{params['team']}:{params.get('kin', 'shared')}:{int(include_shared)}"
    stats = soft_cache_get(key, what="BM25 statistics")
    if stats is None:
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT count(*), coalesce(avg(length(m.search_tsv)), 1) FROM memories_memory m "
                f"WHERE m.status = 'active' AND {scope_sql}",
                params,
            )
            count, avg_length = cursor.fetchone()
            min_docs = max(COMMON_TERM_MIN_DOCS, math.ceil(COMMON_TERM_SHARE * count))
            common = {}
            if count >= min_docs:
                # ts_stat() counts every lexeme of the scope in one pass. It takes its rows
                # as query text, so the scope's ids (integers) are written into it.
                rows_sql = f"SELECT m.search_tsv FROM memories_memory m WHERE m.status = 'active' AND {scope_sql}"
                cursor.execute("SELECT word, ndoc FROM ts_stat(%(rows)s) WHERE ndoc >= %(min_docs)s",
                               {"rows": rows_sql % {k: int(v) for k, v in params.items()}, "min_docs": min_docs})
                common = {word: int(ndoc) for word, ndoc in cursor.fetchall()}
        stats = ScopeStats(count=int(count), avg_length=max(float(avg_length), 1.0), common=common)
        soft_cache_set(key, stats, SCOPE_STATS_SECONDS)
    return stats


def bm25_idf(*, count: int, df: int | float) -> float:
    """Lucene's BM25 idf; the count is clamped to df because cached counts can lag."""
    return math.log(1.0 + (max(count, df) - df + 0.5) / (df + 0.5))


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


def _text_scores_postgresql(terms, scope_sql, params, limit, include_shared):
    """BM25 over the stored tsvector (migration 0002: content weight A, subject B; GIN
    indexes per scope: migration 0003). ts_rank has no inverse document frequency, so
    BM25 is computed here. Candidates are the memories matching the query's rare
    lexemes (common ones only add to their scores; see COMMON_TERM_SHARE), so the
    rare lexemes' document frequencies are counted exactly among the candidates; the
    common lexemes' come with the cached scope statistics, as do count and average length.

    Term frequency is 1 for a match in the content and SUBJECT_WEIGHT for a match in the
    subject only. Memories are a sentence or two, so a term rarely repeats; testing `@@`
    per query lexeme (C code) in one pass over the candidates, instead of unnesting every
    candidate's tsvector, keeps a query that touches thousands of memories fast. The
    per-lexeme columns are generated from the lexeme count only; lexemes travel as
    parameters. Arithmetic is float8: numeric ln() was most of the cost."""
    lexemes = _query_lexemes(terms)
    if not lexemes:
        return []  # only PostgreSQL stop words
    stats = _scope_stats_postgresql(scope_sql, params, include_shared)
    common = [lexeme for lexeme in lexemes if lexeme in stats.common]
    rare = [lexeme for lexeme in lexemes if lexeme not in stats.common]
    rarest_common = min(common, key=lambda lexeme: (stats.common[lexeme], lexeme)) if common else None
    params = {**params, "subject_weight": SUBJECT_WEIGHT, "n": stats.count, "avg_length": stats.avg_length,
              "k1": BM25_K1, "b": BM25_B, "limit": limit}

    def matching(lexemes_of_tsquery: list[str], name: str) -> str:
        params[name] = " | ".join(_tsquery_literal(lexeme) for lexeme in lexemes_of_tsquery)
        return (f"SELECT m.id, m.search_tsv FROM memories_memory m "
                f"WHERE m.status = 'active' AND m.search_tsv @@ %({name})s::tsquery AND {scope_sql}")

    ctes = []
    if rare:
        ctes.append(f"rare_matches AS MATERIALIZED ({matching(rare, 'rare')})")
        matches = "SELECT id, search_tsv FROM rare_matches"
        if rarest_common is not None:
            # Planned as a one-time filter: the scan only runs when no rare lexeme matched.
            matches += (f" UNION ALL {matching([rarest_common], 'fallback')}"
                        f" AND NOT EXISTS (SELECT 1 FROM rare_matches)")
    else:
        matches = matching([rarest_common], "fallback")

    tf_columns, df_columns, score_terms = [], [], []
    for i, lexeme in enumerate(lexemes):
        params[f"any{i}"] = _tsquery_literal(lexeme)
        params[f"content{i}"] = _tsquery_literal(lexeme) + ":A"
        tf_columns.append(
            f"CASE WHEN c.search_tsv @@ %(any{i})s::tsquery THEN CASE WHEN c.search_tsv @@ %(content{i})s::tsquery "
            f"THEN 1.0::float8 ELSE %(subject_weight)s::float8 END ELSE 0.0::float8 END AS tf{i}"
        )
        if lexeme in stats.common:
            params[f"idf{i}"] = bm25_idf(count=stats.count, df=stats.common[lexeme])
            idf = f"%(idf{i})s::float8"
        else:
            # The idf is computed once, with the document frequency, not per candidate.
            df = f"count(*) FILTER (WHERE tf{i} > 0)::float8"
            df_columns.append(f"ln(1.0::float8 + (greatest(%(n)s::float8, {df}) - {df} + 0.5::float8)"
                              f" / ({df} + 0.5::float8)) AS idf{i}")
            idf = f"d.idf{i}"
        score_terms.append(f"{idf} * c.tf{i} * (%(k1)s::float8 + 1.0::float8) / (c.tf{i} + c.norm)")
    ctes.append(f"""candidates AS MATERIALIZED (
            SELECT c.id,
                   %(k1)s::float8 * (1.0::float8 - %(b)s::float8
                       + %(b)s::float8 * length(c.search_tsv)::float8 / %(avg_length)s::float8) AS norm,
                   {", ".join(tf_columns)}
            FROM ({matches}) c
        )""")
    if df_columns:
        ctes.append(f"document_frequency AS (SELECT {', '.join(df_columns)} FROM candidates)")
    ctes.append(f"""best AS (
            SELECT c.id, {" + ".join(score_terms)} AS score
            FROM candidates c {"CROSS JOIN document_frequency d" if df_columns else ""}
            ORDER BY score DESC, c.id
            LIMIT %(limit)s
        )""")
    # For ranking, updated_at travels as epoch seconds: loading timestamptz through
    # Django's Python loader was about half the cost of reading the ~50 rows. The rest of
    # each row is the hit's memory, should ranking keep it (_hit_memories).
    sql = f"""
        WITH {", ".join(ctes)}
        SELECT best.id, best.score, m.importance, m.category, EXTRACT(EPOCH FROM m.updated_at)::float8, m.subject,
               {_hit_columns_sql("m")}
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


def _text_scores_sqlite(terms, scope_sql, params, limit):
    # memories_memory_fts is an external-content FTS5 table kept by triggers (migration
    # 0002), columns (subject, content). bm25() is lower-is-better; its statistics cover
    # the whole table, which is cheap and close enough.
    sql = f"""
        SELECT m.id, -bm25(memories_memory_fts, %(subject_weight)s, 1.0) AS score,
               m.importance, m.category, m.updated_at, m.subject, {_hit_columns_sql("m")}
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


# --- duplicates -------------------------------------------------------------------------------

# How many full-text neighbours are compared term by term: a true duplicate shares
# nearly all its terms, so it ranks at the top of its own BM25 search.
DUPLICATE_TEXT_CANDIDATES = 20


def memory_find_duplicate(*, team: Team, kin: Kin | None, content: str, subject: str = "",
                          embedding: Embedding | None = None, exclude_id: int | None = None) -> Memory | None:
    """An active memory in the same scope (the kin's own, or the team-shared ones
    when kin is None) that says the same thing as `content`, or None. Same thing:
    nearly the same stemmed terms, or (both embedded) a near-identical vector; two set
    subjects that differ are never the same (thresholds: memories.ranking)."""
    scope = memory_list(team=team, kin=kin, include_shared=False, status=Memory.Status.ACTIVE)
    if exclude_id is not None:
        scope = scope.exclude(pk=exclude_id)
    new_terms = ranking.term_set(content)
    search_terms = query_terms(content)
    if not new_terms or not search_terms:
        # Nothing but stop words and punctuation, or no word the full-text index could find
        # its twin by (symbols only): only the same text is the same thing.
        return scope.filter(content__iexact=content.strip()).order_by("-updated_at", "-id").first()

    scored: dict[int, float] = {}
    text_ids = [match.id for match in _text_scores(
        terms=search_terms, team=team, kin=kin, include_shared=False, limit=DUPLICATE_TEXT_CANDIDATES,
    )]
    vector_similarities = _vector_similarities(scope, embedding) if embedding is not None else {}
    near_vectors = [i for i, s in vector_similarities.items() if s >= ranking.DUPLICATE_MIN_COSINE]
    candidates = scope.filter(pk__in=set(text_ids) | set(near_vectors)).only("id", "content", "subject")
    by_id = {memory.pk: memory for memory in candidates}
    for memory in by_id.values():
        old_terms = ranking.term_set(memory.content)
        similarity = vector_similarities.get(memory.pk)
        if ranking.is_duplicate(new_terms=new_terms, old_terms=old_terms, new_subject=subject,
                                old_subject=memory.subject, vector_similarity=similarity):
            scored[memory.pk] = max(ranking.jaccard(new_terms, old_terms), similarity or 0.0)
    if not scored:
        return None
    best_id = max(scored, key=lambda memory_id: (scored[memory_id], memory_id))
    return Memory.objects.get(pk=best_id)


# --- search -----------------------------------------------------------------------------------


def memory_search(*, team: Team, kin: Kin | None, query: str, limit: int | None = None,
                  include_shared: bool = True, count_retrieval: bool = False,
                  category: str = "") -> list[MemoryHit]:
    """Active memories ranked by hybrid relevance (memories.ranking): a kin's own plus,
    with include_shared, the team-shared ones (kin=None: the shared ones only). Any
    query text is safe; a query without a word yields []. With count_retrieval (the
    recall tool) each returned memory counts one retrieval."""
    limit = settings.MEMORY_TOP_K if limit is None else limit
    terms = query_terms(query or "")
    if not terms or limit <= 0:
        return []
    # Ranking may reorder BM25's list by importance, recency and subject, so it gets
    # more than `limit` candidates to choose from.
    candidate_limit = max(limit * 5, 50)
    text_matches = {match.id: match for match in _text_scores(
        terms=terms, team=team, kin=kin, include_shared=include_shared, limit=candidate_limit)}
    vector_similarities: dict[int, float] = {}
    embedding = memory_embed(team=team, kin=kin, text=" ".join(query.split())[:8000], purpose="memory_search")
    if embedding is not None:
        scope = memory_list(team=team, kin=kin, include_shared=include_shared, status=Memory.Status.ACTIVE)
        similarities = _vector_similarities(scope, embedding)
        nearest = sorted(similarities, key=lambda i: -similarities[i])[:candidate_limit]
        vector_similarities = {i: similarities[i] for i in set(nearest) | (set(text_matches) & set(similarities))}
    fields = {i: (m.importance, m.category, m.updated_at, m.subject) for i, m in text_matches.items()}
    vector_only = set(vector_similarities) - set(text_matches)
    if vector_only:
        rows = Memory.objects.filter(pk__in=vector_only, status=Memory.Status.ACTIVE).values_list(
            "id", "importance", "category", "updated_at", "subject")
        fields.update((row[0], row[1:]) for row in rows)
    candidates = [
        ranking.Candidate(
            id=memory_id,
            text_score=text_matches[memory_id].score if memory_id in text_matches else 0.0,
            vector_similarity=vector_similarities.get(memory_id),
            importance=importance,
            category=memory_category,
            updated_at=updated_at,
            subject=subject,
        )
        for memory_id, (importance, memory_category, updated_at, subject) in fields.items()
        if not category or memory_category == category
    ]
    if not candidates:
        return []
    ranked = ranking.rank(candidates, query=query, now=timezone.now(),
                          half_life_days=settings.MEMORY_HALF_LIFE_DAYS, limit=limit)
    if not ranked:
        return []
    memories = _hit_memories([r.id for r in ranked], text_matches, kin=kin)
    if count_retrieval:
        # A write in a read: the recall tool counts what it serves. The prompt does not
        # (its turn counts the served memories when it stores the reply).
        from memories.services import memories_mark_retrieved  # services import this module

        retrieved_at = memories_mark_retrieved(memory_ids=list(memories))
        for memory in memories.values():
            memory.retrieval_count += 1
            memory.last_retrieved_at = retrieved_at
    return [MemoryHit(memory=memories[r.id], score=r.score, components=r.components())
            for r in ranked if r.id in memories]


def _hit_memories(ids: list[int], text_matches: dict[int, TextMatch], *, kin: Kin | None) -> dict[int, Memory]:
    """The hits as model instances (only the hits: building one per candidate was a third
    of a search's time). Full-text hits come from their candidate rows; only hits found by
    vector alone are read. Their kin is the searching kin or none (the scope), so it is
    set here rather than joined."""
    memories = {i: _memory_from_row(text_matches[i].row) for i in ids if i in text_matches}
    if missing := [i for i in ids if i not in memories]:
        memories.update(Memory.objects.filter(pk__in=missing, status=Memory.Status.ACTIVE).defer("embedding").in_bulk())
    kin_field = Memory._meta.get_field("kin")
    for memory in memories.values():
        if memory.kin_id is None:
            kin_field.set_cached_value(memory, None)
        elif kin is not None and memory.kin_id == kin.pk:
            kin_field.set_cached_value(memory, kin)
    return memories
