"""Memory search: the hybrid search behind the prompt, the recall tool, the API and the
dashboard (memory_search), and the near-duplicate lookup of memory writes. Candidates are
read once (full-text BM25 from postgres.py or sqlite.py, plus the nearest vectors in scope
from vectors.py, scanned meanwhile on a scan thread); scoring is memories.ranking's. Only
reads: embedding the query is memories.embeddings', counting retrievals the caller's."""
from dataclasses import dataclass, field

from django.conf import settings
from django.db import connection
from django.utils import timezone

from kinsite.models import Kin, Team
from kinsite.textsearch import query_terms
from memories import ranking
from memories.embeddings import Embedding, memory_embed
from memories.models import Memory
from memories.search import postgres, sqlite, vectors
from memories.search.candidates import TextMatch, matches_by_id, memory_from_row, scope_sql
from memories.selectors import memory_list


@dataclass
class MemoryHit:
    """One search result: the memory, its final score and what the score was made of
    (components: text, vector, importance, recency, subject; see memories.ranking)."""

    memory: Memory
    score: float
    components: dict[str, float] = field(default_factory=dict)


def _text_scores(*, terms: list[str], team: Team, kin: Kin | None, include_shared: bool,
                 limit: int) -> list[TextMatch]:
    """Active memories in scope matching the terms, best BM25 score first."""
    where, params = scope_sql(team=team, kin=kin, include_shared=include_shared)
    if connection.vendor == "postgresql":
        return postgres.text_scores(terms, where, params, limit, include_shared)
    return sqlite.text_scores(terms, where, params, limit)


# --- duplicates -------------------------------------------------------------------------------

# How many full-text neighbours are compared term by term: a true duplicate shares
# nearly all its terms, so it ranks at the top of its own BM25 search.
DUPLICATE_TEXT_CANDIDATES = 20
# How many of the nearest vectors at DUPLICATE_MIN_COSINE or more are compared.
DUPLICATE_VECTOR_CANDIDATES = 20


def memory_find_duplicate(*, team: Team, kin: Kin | None, content: str, subject: str = "",
                          embedding: Embedding | None = None) -> Memory | None:
    """An active memory in the same scope (the kin's own, or the team-shared ones
    when kin is None) that says the same thing as `content`, or None. Same thing:
    nearly the same stemmed terms, or (both embedded) a near-identical vector; two set
    subjects that differ are never the same (thresholds: memories.ranking)."""
    scope = memory_list(team=team, kin=kin, include_shared=False, status=Memory.Status.ACTIVE)
    new_terms = ranking.term_set(content)
    search_terms = query_terms(content)
    if not new_terms or not search_terms:
        # Nothing but stop words and punctuation, or no word the full-text index could find
        # its twin by (symbols only): only the same text is the same thing.
        return scope.filter(content__iexact=content.strip()).order_by("-updated_at", "-id").first()

    pending = vectors.near_duplicates_start(
        team=team, kin=kin, embedding=embedding, min_cosine=ranking.DUPLICATE_MIN_COSINE,
        k=DUPLICATE_VECTOR_CANDIDATES,
    ) if embedding is not None else None
    text_ids = [match.id for match in _text_scores(
        terms=search_terms, team=team, kin=kin, include_shared=False, limit=DUPLICATE_TEXT_CANDIDATES,
    )]
    vector_similarities = pending.result(also=set(text_ids)) if pending is not None else {}
    near_vectors = [i for i, s in vector_similarities.items() if s >= ranking.DUPLICATE_MIN_COSINE]
    # The candidates are read whole (their vectors live in MemoryVector), so the duplicate is not read again.
    candidates = scope.filter(pk__in=set(text_ids) | set(near_vectors))
    by_id = {memory.pk: memory for memory in candidates}
    scored: dict[int, float] = {}
    for memory in by_id.values():
        old_terms = ranking.term_set(memory.content)
        similarity = vector_similarities.get(memory.pk)
        if ranking.is_duplicate(new_terms=new_terms, old_terms=old_terms, new_subject=subject,
                                old_subject=memory.subject, vector_similarity=similarity,
                                new_text=content, old_text=memory.content):
            scored[memory.pk] = max(ranking.jaccard(new_terms, old_terms), similarity or 0.0)
    if not scored:
        return None
    return by_id[max(scored, key=lambda memory_id: (scored[memory_id], memory_id))]


# --- search -----------------------------------------------------------------------------------


def memory_search(*, team: Team, kin: Kin | None, query: str, limit: int | None = None,
                  include_shared: bool = True, category: str = "") -> list[MemoryHit]:
    """Active memories ranked by hybrid relevance (memories.ranking): a kin's own plus,
    with include_shared, the team-shared ones (kin=None: the shared ones only). Any query
    text is safe; a query without a word yields []."""
    limit = settings.MEMORY_TOP_K if limit is None else limit
    terms = query_terms(query or "")
    if not terms or limit <= 0:
        return []
    # Ranking may reorder BM25's list by importance, recency and subject, so it gets
    # more than `limit` candidates to choose from.
    candidate_limit = max(limit * 5, 50)
    embedding = memory_embed(team=team, kin=kin, text=" ".join(query.split())[:8000], purpose="memory_search")
    # result(also=...) adds the text candidates' own similarities to the nearest.
    pending = vectors.nearest_start(team=team, kin=kin, include_shared=include_shared, embedding=embedding,
                                    k=candidate_limit) if embedding is not None else None
    text_matches = {match.id: match for match in _text_scores(
        terms=terms, team=team, kin=kin, include_shared=include_shared, limit=candidate_limit)}
    vector_similarities = pending.result(also=set(text_matches)) if pending is not None else {}
    # The memories found by vector alone, read once: ranking's fields, and the hits' rows.
    vector_only = matches_by_id(set(vector_similarities) - set(text_matches),
                                team=team, kin=kin, include_shared=include_shared)
    matches = {**{match.id: match for match in vector_only}, **text_matches}
    candidates = [
        ranking.Candidate(
            id=memory_id,
            text_score=match.score,
            vector_similarity=vector_similarities.get(memory_id),
            importance=match.importance,
            category=match.category,
            updated_at=match.updated_at,
            subject=match.subject,
        )
        for memory_id, match in matches.items()
        if not category or match.category == category
    ]
    if not candidates:
        return []
    ranked = ranking.rank(candidates, query=query, now=timezone.now(),
                          half_life_days=settings.MEMORY_HALF_LIFE_DAYS, limit=limit)
    if not ranked:
        return []
    memories = _hit_memories([r.id for r in ranked], matches, kin=kin)
    return [MemoryHit(memory=memories[r.id], score=r.score, components=r.components()) for r in ranked]


def _hit_memories(ids: list[int], matches: dict[int, TextMatch], *, kin: Kin | None) -> dict[int, Memory]:
    """The hits as model instances, from their candidate rows (only the hits: building one
    per candidate is costly). Their kin is the searching kin or none, set here, not joined."""
    memories = {i: memory_from_row(matches[i].row) for i in ids}
    kin_field = Memory._meta.get_field("kin")
    for memory in memories.values():
        if memory.kin_id is None:
            kin_field.set_cached_value(memory, None)
        elif kin is not None and memory.kin_id == kin.pk:
            kin_field.set_cached_value(memory, kin)
    return memories
