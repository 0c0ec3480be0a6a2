"""Memory-search relevance benchmark on LoCoMo: every dialogue turn becomes a memory of
one kin (plus synthetic filler), every QA question is a query, and the turns it cites
are the answer key. Reports evidence recall, hit rate, MRR, latency and BM25 candidate
counts for a grid of common-term settings (memories.search.postgres.COMMON_TERM_SHARE /
COMMON_TERM_MIN_DOCS) against an exhaustive baseline. See bench/README.md.

    python bench/memory_relevance.py                 # SQLite (a temp file): default setting only
    ... bench/memory_relevance.py --filler 0,10000,50000   # recall as the kins grow (by_filler in the JSON)
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/kinsite python bench/memory_relevance.py
    ... bench/memory_relevance.py --embeddings http://127.0.0.1:8765/v1   # + MiniLM: hybrid vs lexical
    ... bench/memory_relevance.py --embeddings local --filler 0,10000 --replay   # the in-process model

With --embeddings (local: the in-process model, EMBEDDINGS=local; or an OpenAI-compatible
endpoint, e.g. bench/embeddings_server.py) the memories are then embedded, at each filler
size, through Kinsite's re-embedding job (memories.reembed, the real embedder and vector
storage) and every question is asked again under each fusion of FUSIONS
(memories.ranking.fuse swapped, as the common-term constants are). With --replay it is asked
once, and each fusion (also those of REPLAY_FUSIONS) is scored by ranking the candidates
that search recorded; --candidates-out / --replay-from keep them for later.
"""
import argparse
import os
import random
import statistics
import sys
import time
import uuid
from collections import defaultdict
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    RESULTS_DIR,
    ROOT,
    ThrowawayDatabase,
    database_version,
    latency_summary,
    write_results,
)
from bench.history_search import (  # noqa: E402
    CATEGORIES,
    conversation_turns,
    evidence_ids,
    load_conversations,
    parse_session_time,
)
from bench.synthetic import PEOPLE, sentence  # noqa: E402

BENCH_DATABASE = "kinsite_bench_relevance"
DATA_DIR = ROOT.parent / "shared" / "bench-data" / "locomo-dev"
ADVERSARIAL = 5
# Every memory gets the same importance and category, so ranking's importance factor and
# per-category half-life do not favour any of them; recency still acts (real dates).
IMPORTANCE = 5
CATEGORY = "fact"
DEFAULT_SHARES = (0.05, 0.02, 0.01, 0.005)
DEFAULT_MIN_DOCS = (250, 100)
# Nothing is ever common: every memory matching any query lexeme is a candidate.
EXHAUSTIVE = {"share": 1.01, "min_docs": 10**9}
# memory_search ranks the best max(limit * 5, 50) BM25 candidates (limit 10 here).
BM25_LIST = 50


# --- loading ----------------------------------------------------------------------------------


def questions_of(conversation: dict, dia_ids: set[str], per_conversation: int | None):
    """(qa, evidence dia_ids) of every non-adversarial question with evidence among the
    turns, in file order, and what was left out. Adversarial questions (category 5) pin
    on one speaker what the other one said; the right answer is that it was never said,
    so their evidence turns are no answer key for a search."""
    kept, skipped = [], {"adversarial": 0, "no_evidence": 0}
    for qa in conversation["qa"]:
        if qa.get("category") == ADVERSARIAL:
            skipped["adversarial"] += 1
            continue
        evidence = [dia_id for dia_id in evidence_ids(qa.get("evidence") or []) if dia_id in dia_ids]
        if not evidence:
            skipped["no_evidence"] += 1
            continue
        kept.append((qa, evidence))
    return kept[:per_conversation] if per_conversation is not None else kept, skipped


def load_conversation(*, team, conversation_id: str, conversation: dict):
    """One kin holding the conversation's turns as memories. Returns (kin, {dia_id: memory id})."""
    from memories.models import Memory
    from sessions_app.services import kin_create

    kin = kin_create(team=team, name=f"LoCoMo {conversation_id}")
    turns = conversation_turns(conversation)
    turn_rows = [
        Memory(team=team, kin=kin, category=CATEGORY, importance=IMPORTANCE, source="api",
               content=f"{turn['sender']}: {turn['content']}", subject=turn["sender"],
               source_ref=turn["external_id"])
        for turn in turns
    ]
    # Rows go in directly, as in bench/synthetic.py: the services' duplicate check is slow
    # at this size and would merge short turns ("Thanks!") into one memory.
    Memory.objects.bulk_create(turn_rows, batch_size=2000)
    # bulk_create stamps updated_at (auto_now) with the present; bulk_update does not, so
    # the turns' LoCoMo times go in afterwards.
    for row, turn in zip(turn_rows, turns, strict=True):
        row.updated_at = datetime.fromisoformat(turn["created_at"])
    Memory.objects.bulk_update(turn_rows, ["updated_at"], batch_size=500)
    return kin, {turn["external_id"]: row.pk for row, turn in zip(turn_rows, turns, strict=True)}


def add_filler(*, team, kin, conversation: dict, count: int, rng: random.Random) -> None:
    """`count` synthetic memories more in the kin, each dated at the start of a random
    session of the conversation, so filler is neither newer nor older than the turns.
    PostgreSQL: by COPY (its triggers fill the tsvector and the term counters), ten times
    faster than bulk_create at 50,000 a kin; SQLite: bulk_create."""
    from django.db import connection

    from memories.models import Memory

    session_starts = [parse_session_time(conversation[key]) for key in sorted(conversation)
                      if key.endswith("_date_time") and conversation.get(key.removesuffix("_date_time"))]
    rows = [(sentence(rng), rng.choice(PEOPLE), rng.choice(session_starts)) for _ in range(count)]
    if connection.vendor == "postgresql":
        columns = ("team_id, kin_id, category, content, subject, importance, status, source, source_ref, "
                   "retrieval_count, embedding_model, vector_seq, created_at, updated_at")
        with connection.cursor() as cursor, cursor.copy(f"COPY memories_memory ({columns}) FROM STDIN") as copy:
            for content, subject, moment in rows:
                copy.write_row((team.pk, kin.pk, CATEGORY, content, subject, IMPORTANCE, "active", "api", "",
                                0, "", 0, moment, moment))
        return
    filler_rows = [Memory(team=team, kin=kin, category=CATEGORY, importance=IMPORTANCE, source="api",
                          content=content, subject=subject) for content, subject, _ in rows]
    Memory.objects.bulk_create(filler_rows, batch_size=2000)
    by_date = defaultdict(list)
    for row, (_, _, moment) in zip(filler_rows, rows, strict=True):
        by_date[moment].append(row.pk)
    for moment, ids in by_date.items():
        Memory.objects.filter(pk__in=ids).update(updated_at=moment)


# --- candidates (PostgreSQL) ------------------------------------------------------------------


class CandidateCounter:
    """How many memories the BM25 query scores for a question under the current common-term
    setting: those matching the query's non-common lexemes, or, when there are none or
    they match nothing, those matching its rarest common lexeme (the selector's rule).
    Uses the selector's own scope statistics; counts are memoised per (kin, lexemes)."""

    def __init__(self):
        self.lexemes: dict[str, list[str]] = {}
        self.counts: dict[tuple, int] = {}

    def __call__(self, *, team, kin, question: str) -> int:
        from django.db import connection

        from kinsite.textsearch import query_terms
        from memories.search import candidates as search_candidates, postgres

        if question not in self.lexemes:
            with connection.cursor() as cursor:
                cursor.execute("SELECT DISTINCT lexeme FROM unnest(to_tsvector('english', %s)) ORDER BY lexeme",
                               [" ".join(query_terms(question))])
                self.lexemes[question] = [row[0] for row in cursor.fetchall()]
        lexemes = self.lexemes[question]
        if not lexemes:
            return 0
        scope_sql, params = search_candidates.scope_sql(team=team, kin=kin, include_shared=True)
        stats = postgres.scope_stats(params, True, lexemes)
        rare = [lexeme for lexeme in lexemes if lexeme not in stats.common]
        common = sorted((lexeme for lexeme in lexemes if lexeme in stats.common),
                        key=lambda lexeme: (stats.common[lexeme], lexeme))
        count = self._count(scope_sql, params, kin, rare) if rare else 0
        if count == 0 and common:
            count = self._count(scope_sql, params, kin, common[:1])
        return count

    def _count(self, scope_sql: str, params: dict, kin, lexemes: list[str]) -> int:
        from django.db import connection

        key = (kin.pk, tuple(lexemes))
        if key not in self.counts:
            tsquery = " | ".join("'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'" for lexeme in lexemes)
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT count(*) FROM memories_memory m WHERE m.status = 'active' "
                               f"AND m.search_tsv @@ %(tsquery)s::tsquery AND {scope_sql}",
                               {**params, "tsquery": tsquery})
                self.counts[key] = cursor.fetchone()[0]
        return self.counts[key]


# --- figures ----------------------------------------------------------------------------------


def question_row(evidence: list[int], found: list[int], ks: tuple[int, ...]) -> dict:
    row = {}
    for k in ks:
        top = set(found[:k])
        row[f"recall@{k}"] = sum(1 for memory_id in evidence if memory_id in top) / len(evidence)
        row[f"hit@{k}"] = 1.0 if top & set(evidence) else 0.0
    first = next((rank for rank, memory_id in enumerate(found, start=1) if memory_id in evidence), None)
    row["mrr"] = 1.0 / first if first else 0.0
    return row


def summary(rows: list[dict], ks: tuple[int, ...]) -> dict:
    names = [f"{metric}@{k}" for k in ks for metric in ("recall", "hit")] + ["mrr"]
    return {"questions": len(rows), **{name: round(statistics.fmean(row[name] for row in rows), 4) for name in names}}


def setting_name(share: float, min_docs: int) -> str:
    if (share, min_docs) == (EXHAUSTIVE["share"], EXHAUSTIVE["min_docs"]):
        return "exhaustive"
    return f"share {share:g} / min {min_docs}"


# --- fusions (with --embeddings) --------------------------------------------------------------

EMBEDDING_MODEL = "all-MiniLM-L6-v2"


def fusion_weighted(*, text_weight: float = 0.5, vector_weight: float = 0.5, floor: float = 0.35):
    """The weighted mean of BM25 / best BM25 and (cosine - floor) / (1 - floor): memories.ranking
    before the fusion was chosen on this benchmark (0.5 / 0.5 / 0.35, made for a fake embedder)."""
    from memories.ranking import Relevance

    def fuse(candidates):
        best_text = max((c.text_score for c in candidates), default=0.0)
        fused = {}
        for c in candidates:
            text = c.text_score / best_text if best_text > 0 and c.text_score > 0 else 0.0
            weights, value, vector = text_weight, text_weight * text, 0.0
            if c.vector_similarity is not None:
                vector = min(max((c.vector_similarity - floor) / (1 - floor), 0.0), 1.0)
                weights += vector_weight
                value += vector_weight * vector
            fused[c.id] = Relevance(value=value / weights, text=text, vector=vector)
        return fused
    return fuse


def fusion_relative(*, text_weight: float = 0.5, vector_weight: float = 0.5, floor: float = 0.2,
                    min_spread: float = 0.0, text_only_admits: float | None = None):
    """Both signals scaled by the best candidate's: BM25 / best BM25 and (cosine - floor) /
    max(best cosine - floor, min_spread), then their weighted mean (memories.ranking.fuse is
    this with 0.5 / 0.5 / 0.2 / 0.3). text_only_admits: a candidate without a text match gets
    a vector signal only at this cosine or above (None: always)."""
    from memories.ranking import Relevance

    def fuse(candidates):
        best_text = max((c.text_score for c in candidates), default=0.0)
        best_cosine = max((c.vector_similarity for c in candidates if c.vector_similarity is not None), default=0.0)
        spread = max(best_cosine - floor, min_spread)
        fused = {}
        for c in candidates:
            text = c.text_score / best_text if best_text > 0 and c.text_score > 0 else 0.0
            weights, value, vector = text_weight, text_weight * text, 0.0
            if c.vector_similarity is not None:
                admitted = text > 0 or text_only_admits is None or c.vector_similarity >= text_only_admits
                if spread > 0 and admitted:
                    vector = max((c.vector_similarity - floor) / spread, 0.0)
                weights += vector_weight
                value += vector_weight * vector
            fused[c.id] = Relevance(value=value / weights, text=text, vector=vector)
        return fused
    return fuse


def fusion_standout(*, text_weight: float = 0.5, vector_weight: float = 0.5, floor: float = 0.2,
                    min_spread: float = 0.3, reference: float = 0.3):
    """The shipped fusion with the vector weight scaled by how far the best cosine stands out
    from the candidates' median cosine: vector_weight × min((best - median) / reference, 1). A
    question whose nearest memories are all about equally near gets little from the vectors."""
    from memories.ranking import Relevance

    def fuse(candidates):
        best_text = max((c.text_score for c in candidates), default=0.0)
        cosines = [c.vector_similarity for c in candidates if c.vector_similarity is not None]
        best_cosine = max(cosines, default=0.0)
        spread = max(best_cosine - floor, min_spread)
        confidence = min(max((best_cosine - statistics.median(cosines)) / reference, 0.0), 1.0) if cosines else 0.0
        weight = vector_weight * confidence
        fused = {}
        for c in candidates:
            text = c.text_score / best_text if best_text > 0 and c.text_score > 0 else 0.0
            weights, value, vector = text_weight, text_weight * text, 0.0
            if c.vector_similarity is not None:
                vector = max((c.vector_similarity - floor) / spread, 0.0)
                weights += weight
                value += weight * vector
            fused[c.id] = Relevance(value=value / weights, text=text, vector=vector)
        return fused
    return fuse


def fusion_minmax(*, text_weight: float = 0.5, vector_weight: float = 0.5):
    """Min-max scaling of each signal over the candidates (Weaviate's relative score fusion):
    (score - lowest) / (highest - lowest), BM25 over the text matches, cosine over all; then
    the weighted mean. No floor: the worst candidate is 0 whatever its cosine."""
    from memories.ranking import Relevance

    def scaled(value, low, high):
        return (value - low) / (high - low) if high > low else 1.0

    def fuse(candidates):
        texts = [c.text_score for c in candidates if c.text_score > 0]
        cosines = [c.vector_similarity for c in candidates if c.vector_similarity is not None]
        fused = {}
        for c in candidates:
            text = scaled(c.text_score, min(texts), max(texts)) if c.text_score > 0 else 0.0
            weights, value, vector = text_weight, text_weight * text, 0.0
            if c.vector_similarity is not None:
                vector = scaled(c.vector_similarity, min(cosines), max(cosines))
                weights += vector_weight
                value += vector_weight * vector
            fused[c.id] = Relevance(value=value / weights, text=text, vector=vector)
        return fused
    return fuse


def fusion_split(*, text: str = "best", vector: str = "shipped", text_weight: float = 0.5,
                 vector_weight: float = 0.5, floor: float = 0.2, min_spread: float = 0.3, text_low_cap: float = 1.0):
    """Which half of min-max scaling does the work. text: "best" (BM25 / best BM25, shipped) or
    "minmax" ((BM25 - lowest) / (best - lowest), over the text matches). vector: "shipped"
    ((cosine - floor) / max(best - floor, min_spread)) or "minmax" over every candidate, or
    "minmax floored": min-max from min(lowest cosine, floor), by at least min_spread, and 0 at
    or below the floor (so unrelated nearest neighbours still add nothing). text_low_cap: with
    "minmax", the lowest BM25 is taken as at most text_low_cap × the best (0.5: of two close text
    matches the weaker is not sent to 0 in a small kin)."""
    from memories.ranking import Relevance

    def fuse(candidates):
        texts = [c.text_score for c in candidates if c.text_score > 0]
        cosines = [c.vector_similarity for c in candidates if c.vector_similarity is not None]
        best_text = max(texts, default=0.0)
        low_text = min(min(texts, default=0.0), text_low_cap * best_text)
        best_cos, low_cos = max(cosines, default=0.0), min(cosines, default=0.0)
        fused = {}
        for c in candidates:
            if c.text_score <= 0:
                t = 0.0
            elif text == "minmax":
                t = (c.text_score - low_text) / (best_text - low_text) if best_text > low_text else 1.0
            else:
                t = c.text_score / best_text
            weights, value, v = text_weight, text_weight * t, 0.0
            if c.vector_similarity is not None:
                if vector == "minmax":
                    v = (c.vector_similarity - low_cos) / (best_cos - low_cos) if best_cos > low_cos else 1.0
                elif vector == "minmax floored":
                    low = min(low_cos, floor)
                    v = ((c.vector_similarity - low) / max(best_cos - low, min_spread)
                         if c.vector_similarity > floor else 0.0)
                else:
                    v = max((c.vector_similarity - floor) / max(best_cos - floor, min_spread), 0.0)
                weights += vector_weight
                value += vector_weight * v
            fused[c.id] = Relevance(value=value / weights, text=t, vector=v)
        return fused
    return fuse


def fusion_dbsf(*, text_weight: float = 0.5, vector_weight: float = 0.5, sigmas: float = 3.0):
    """Distribution-based score fusion (Qdrant's DBSF): each signal scaled from mean - 3σ to
    mean + 3σ of its own scores over the candidates, clipped to 0..1, then the weighted mean.
    A non-match in the words is 0."""
    from memories.ranking import Relevance

    def bounds(values):
        if len(values) < 2:
            return (0.0, max(values, default=1.0))
        mean, deviation = statistics.fmean(values), statistics.pstdev(values)
        return (mean - sigmas * deviation, mean + sigmas * deviation) if deviation > 0 else (0.0, mean)

    def scaled(value, low_high):
        low, high = low_high
        return min(max((value - low) / (high - low), 0.0), 1.0) if high > low else 1.0

    def fuse(candidates):
        text_bounds = bounds([c.text_score for c in candidates if c.text_score > 0])
        vector_bounds = bounds([c.vector_similarity for c in candidates if c.vector_similarity is not None])
        fused = {}
        for c in candidates:
            text = scaled(c.text_score, text_bounds) if c.text_score > 0 else 0.0
            weights, value, vector = text_weight, text_weight * text, 0.0
            if c.vector_similarity is not None:
                vector = scaled(c.vector_similarity, vector_bounds)
                weights += vector_weight
                value += vector_weight * vector
            fused[c.id] = Relevance(value=value / weights, text=text, vector=vector)
        return fused
    return fuse


def fusion_rrf(*, k: int = 60, floor: float = 0.2, vector_weight: float = 1.0):
    """Reciprocal-rank fusion: 1 / (k + rank) in the BM25 list plus vector_weight / (k + rank)
    in the cosine list (the candidates at `floor` or above), scaled so that first in both is 1."""
    from memories.ranking import Relevance

    def fuse(candidates):
        by_text = sorted((c for c in candidates if c.text_score > 0), key=lambda c: (-c.text_score, c.id))
        by_vector = sorted((c for c in candidates if c.vector_similarity is not None and c.vector_similarity >= floor),
                           key=lambda c: (-c.vector_similarity, c.id))
        text = {c.id: 1 / (k + rank) for rank, c in enumerate(by_text, start=1)}
        vector = {c.id: vector_weight / (k + rank) for rank, c in enumerate(by_vector, start=1)}
        best = (1 + vector_weight) / (k + 1)
        return {c.id: Relevance(value=(text.get(c.id, 0.0) + vector.get(c.id, 0.0)) / best,
                                text=text.get(c.id, 0.0) * (k + 1), vector=vector.get(c.id, 0.0) * (k + 1))
                for c in candidates}
    return fuse


def fusion_text_only():
    """The words alone, on the hybrid candidates: a check of the replay (it must equal the
    lexical run, whose candidates are the same BM25 list without the vectors' additions)."""
    from memories.ranking import Relevance

    def fuse(candidates):
        best_text = max((c.text_score for c in candidates), default=0.0)
        return {c.id: Relevance(value=c.text_score / best_text if best_text > 0 else 0.0,
                                text=c.text_score / best_text if best_text > 0 else 0.0, vector=0.0)
                for c in candidates}
    return fuse


def fusion_vector_only():
    """The cosine alone (text ignored): what the vectors find by themselves."""
    from memories.ranking import Relevance

    def fuse(candidates):
        return {c.id: Relevance(value=max(c.vector_similarity or 0.0, 0.0), text=0.0,
                                vector=max(c.vector_similarity or 0.0, 0.0)) for c in candidates}
    return fuse


# name -> a fuse function to put in memories.ranking.fuse's place; None: the shipped one.
FUSIONS = {
    "shipped (memories.ranking.fuse)": None,
    "vector only": fusion_vector_only,
    "weighted 0.5/0.5 floor 0.35 (before)": lambda: fusion_weighted(floor=0.35),
    "weighted 0.5/0.5 floor 0.2": lambda: fusion_weighted(floor=0.2),
    "weighted 0.5/0.5 floor 0.1": lambda: fusion_weighted(floor=0.1),
    "relative 0.5/0.5 floor 0.2": lambda: fusion_relative(floor=0.2),
    "relative 0.6/0.4 floor 0.2": lambda: fusion_relative(text_weight=0.6, vector_weight=0.4, floor=0.2),
    "relative 0.4/0.6 floor 0.2": lambda: fusion_relative(text_weight=0.4, vector_weight=0.6, floor=0.2),
    "relative 0.5/0.5 floor 0.1": lambda: fusion_relative(floor=0.1),
    "relative 0.5/0.5 floor 0.3": lambda: fusion_relative(floor=0.3),
    "rrf k=60 floor 0.2": lambda: fusion_rrf(k=60, floor=0.2),
    "rrf k=60 floor 0": lambda: fusion_rrf(k=60, floor=0.0),
    "rrf k=20 floor 0.2": lambda: fusion_rrf(k=20, floor=0.2),
    "rrf k=10 floor 0.2": lambda: fusion_rrf(k=10, floor=0.2),
}
# More variants, scored by --replay (cheap there: no search is run again).
REPLAY_FUSIONS = {
    "words only (replayed)": fusion_text_only,
    **{f"relative {tw:g}/{1 - tw:g} floor {floor:g} spread 0.3": (
        lambda tw=tw, floor=floor: fusion_relative(text_weight=tw, vector_weight=round(1 - tw, 2), floor=floor,
                                                   min_spread=0.3))
       for tw in (0.5, 0.6, 0.7, 0.8) for floor in (0.2, 0.3, 0.4)},
    **{f"relative 0.5/0.5 floor 0.2 spread {spread:g}": (
        lambda spread=spread: fusion_relative(floor=0.2, min_spread=spread)) for spread in (0.4, 0.5, 0.6)},
    **{f"relative 0.5/0.5 floor 0.2 spread 0.3 no-text needs ≥{admit:g}": (
        lambda admit=admit: fusion_relative(floor=0.2, min_spread=0.3, text_only_admits=admit))
       for admit in (0.4, 0.5, 0.6, 1.01)},
    **{f"standout 0.5/0.5 floor 0.2 spread 0.3 ref {ref:g}": (lambda ref=ref: fusion_standout(reference=ref))
       for ref in (0.2, 0.3, 0.4)},
    "minmax 0.5/0.5": fusion_minmax,
    "minmax 0.6/0.4": lambda: fusion_minmax(text_weight=0.6, vector_weight=0.4),
    "text minmax + vector shipped": lambda: fusion_split(text="minmax"),
    "text minmax (low ≤ best/2) + vector shipped": lambda: fusion_split(text="minmax", text_low_cap=0.5),
    "text best + vector minmax": lambda: fusion_split(vector="minmax"),
    "text minmax + vector minmax floored 0.2": lambda: fusion_split(text="minmax", vector="minmax floored"),
    "text minmax + vector shipped floor 0.1": lambda: fusion_split(text="minmax", floor=0.1),
    "text minmax + vector shipped floor 0.3": lambda: fusion_split(text="minmax", floor=0.3),
    "text minmax + vector shipped 0.6/0.4": lambda: fusion_split(text="minmax", text_weight=0.6, vector_weight=0.4),
    "text minmax + vector shipped 0.4/0.6": lambda: fusion_split(text="minmax", text_weight=0.4, vector_weight=0.6),
    "dbsf 0.5/0.5": fusion_dbsf,
    "dbsf 0.6/0.4": lambda: fusion_dbsf(text_weight=0.6, vector_weight=0.4),
    "rrf k=60 floor 0.3": lambda: fusion_rrf(k=60, floor=0.3),
    "rrf k=60 floor 0.2 vector ×0.5": lambda: fusion_rrf(k=60, floor=0.2, vector_weight=0.5),
    "rrf k=10 floor 0.3": lambda: fusion_rrf(k=10, floor=0.3),
}
ALL_FUSIONS = {**FUSIONS, **REPLAY_FUSIONS}


def server_stats(base_url: str) -> dict | None:
    """bench/embeddings_server.py's counters (vectors computed and served from its cache), or
    None from another endpoint."""
    import httpx

    try:
        response = httpx.get(base_url.rstrip("/").removesuffix("/v1") + "/stats", timeout=5)
        return response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


LOCAL = "local"
LOCAL_CACHE = RESULTS_DIR / "embeddings-cache-local.sqlite3"


def embedder_settings(embeddings: str, model: str) -> dict:
    """The settings that make `embeddings` the embedder: "local" is the in-process model
    (EMBEDDINGS=local, kinsite.llm.local_embedder), anything else an OpenAI-compatible base
    URL serving `model` (EMBEDDINGS=endpoint through Kinsite's own client)."""
    if embeddings == LOCAL:
        return {"EMBEDDINGS": "local"}
    return {"EMBEDDINGS": "endpoint", "LLM_BASE_URL": embeddings, "LLM_API_KEY": "", "LLM_EMBEDDING_MODEL": model}


class CachedLocalEmbedder:
    """While the re-embedding job runs (and only then), the local embedder's embed() answers
    from a SQLite cache of vectors by SHA-256 of the text (bench/embeddings_server.py's
    VectorCache), computing only texts it has not seen, each once: the filler repeats itself,
    and a rerun then costs no model time. The queries of the searches are embedded by the model
    itself, so their time is the model's."""

    def __init__(self, path: Path | None):
        self.path = path
        self.computed = self.cached = 0
        self.compute_seconds = 0.0

    def __enter__(self):
        from bench.embeddings_server import VectorCache
        from kinsite.llm import local_embedder

        self.model = local_embedder.MODEL_NAME
        self.embedder = local_embedder.local_embedder()
        self.real = self.embedder.embed
        self.cache = VectorCache(self.path) if self.path is not None else None
        self.embedder.embed = self.embed  # the instance's attribute, not the class's
        return self

    def __exit__(self, *exc):
        del self.embedder.embed

    def embed(self, texts):
        import numpy as np

        from bench.embeddings_server import VectorCache

        keys = [VectorCache.key(text) for text in texts]
        found = self.cache.get_many(self.model, sorted(set(keys))) if self.cache is not None else {}
        missing = {}
        for key, text in zip(keys, texts, strict=True):
            if key not in found:
                missing.setdefault(key, text)
        if missing:
            begun = time.perf_counter()
            computed = dict(zip(missing, self.real(list(missing.values())), strict=True))
            self.compute_seconds += time.perf_counter() - begun
            if self.cache is not None:
                self.cache.put_many(self.model, computed)
            found.update(computed)
        self.computed += len(missing)
        self.cached += len(texts) - len(missing)
        return np.stack([found[key] for key in keys]).astype(np.float32)

    def stats(self) -> dict:
        return {"computed": self.computed, "cached": self.cached, "compute_seconds": round(self.compute_seconds, 1),
                "cache": str(self.path) if self.path is not None else None}


def embed_all(*, model: str) -> dict:
    """Every active memory gets a vector of `model` through the re-embedding job (the real
    client, batches of memories.reembed.BATCH_SIZE, the real vector storage). Its slices are
    run here, one after the other: main() makes Celery eager, so a slice's follow-up task
    (sent on commit) also runs in this process; inside a test's transaction it is never sent."""
    from memories.models import EmbeddingRun, Memory
    from memories.reembed import memories_to_reembed, reembed_run, reembed_start

    started = time.perf_counter()
    run = reembed_start(model=model)
    for _ in range(10_000):  # a slice ends after CELERY_TASK_SOFT_TIME_LIMIT at most
        run.refresh_from_db()
        if run.status not in (EmbeddingRun.Status.PENDING, EmbeddingRun.Status.RUNNING):
            break
        reembed_run(run_id=run.pk)
    if run.status != EmbeddingRun.Status.DONE:
        raise SystemExit(f"re-embedding did not finish: {run.status} {run.error}")
    left = memories_to_reembed(model).count()
    if left:
        raise SystemExit(f"{left} memories have no vector of {model} after the re-embedding run")
    return {"model": model, "memories": Memory.objects.filter(status=Memory.Status.ACTIVE).count(),
            "newly_embedded": run.total, "seconds": round(time.perf_counter() - started, 1)}


# --- the run ----------------------------------------------------------------------------------


def run(*, data_dir: Path = DATA_DIR, conversations: int | None = None, questions_per_conversation: int | None = None,
        filler: int | list[int] = 10_000, shares=DEFAULT_SHARES, min_docs=DEFAULT_MIN_DOCS, seed: int = 7,
        embeddings: str = "", embedding_model: str = EMBEDDING_MODEL, fusions=tuple(FUSIONS), replay: bool = False,
        embedding_cache: Path | None = LOCAL_CACHE, candidates_out: Path | None = None) -> dict:
    """Loads the memories into the current database, then asks every question under each
    setting, without embeddings. `filler`: memories added to each kin, or several sizes:
    the kins grow from the smallest to the largest (the same filler, more of it), and every
    size is asked in turn (`by_filler`; the top-level figures are the largest size's). The
    cache is cleared between settings (nothing cached may outlive a setting; the scope
    statistics were cached until memories migration 0012); a private in-process cache is
    used for that, never the deployment's Redis. With `embeddings` ("local": the in-process
    model, EMBEDDINGS=local; else an OpenAI-compatible base URL serving `embedding_model`),
    then, at every filler size, embeds every memory and asks every question again under
    each of `fusions` (names of FUSIONS), at the default common-term setting. With `replay`
    each question is asked once (the shipped fusion) and every fusion is scored by ranking
    the candidates that search handed memories.ranking.rank, with its fuse swapped (the
    candidates do not depend on the fusion, so this is what the search would return);
    `fusions` may then also name REPLAY_FUSIONS. `embedding_cache`: the local embedder's
    vector cache for the re-embedding job (None: none). `candidates_out`: a pickle of the
    recorded candidates (with `replay`), for --replay-from."""
    from django.conf import settings
    from django.test import override_settings

    private_cache = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                                 "LOCATION": f"memory-relevance-{uuid.uuid4()}"}}
    known = ALL_FUSIONS if replay else FUSIONS
    unknown = [name for name in fusions if name not in known]
    if unknown:
        raise SystemExit(f"unknown fusions {unknown}; known: {list(known)}")
    sizes = sorted({filler} if isinstance(filler, int) else set(filler))
    # No embedder for the lexical runs, whatever the environment configures.
    with override_settings(CACHES=private_cache, LLM_EMBEDDING_MODEL="", EMBEDDINGS="off"):
        return _run(data_dir=data_dir, conversations=conversations, per_conversation=questions_per_conversation,
                    sizes=sizes, shares=tuple(shares), min_docs=tuple(min_docs), seed=seed,
                    top_k=settings.MEMORY_TOP_K, embeddings=embeddings, embedding_model=embedding_model,
                    fusions=tuple(fusions), replay=replay, embedding_cache=embedding_cache,
                    candidates_out=candidates_out)


def _run(*, data_dir, conversations, per_conversation, sizes, shares, min_docs, seed, top_k,
         embeddings, embedding_model, fusions, replay, embedding_cache, candidates_out) -> dict:
    from django.db import connection

    from kinsite.services import team_create
    from memories.search import postgres

    ks = tuple(sorted({5, 10, top_k}))
    limit = max(ks)
    loaded = load_conversations(data_dir)[:conversations]
    team = team_create(name="LoCoMo relevance bench", slug=f"locomo-relevance-{uuid.uuid4().hex[:8]}")
    rng = random.Random(seed)
    started = time.perf_counter()
    kins, questions = {}, []
    skipped = {"adversarial": 0, "no_evidence": 0}
    for conversation_id, conversation in loaded:
        kin, memory_ids = load_conversation(team=team, conversation_id=conversation_id, conversation=conversation)
        kins[conversation_id] = kin
        kept, left_out = questions_of(conversation, set(memory_ids), per_conversation)
        for reason, count in left_out.items():
            skipped[reason] += count
        questions += [{"conversation": conversation_id, "category": CATEGORIES.get(qa.get("category"), "?"),
                       "question": qa["question"], "evidence": evidence,
                       "evidence_memory_ids": [memory_ids[dia_id] for dia_id in evidence]}
                      for qa, evidence in kept]
    load_seconds = time.perf_counter() - started

    default = (postgres.COMMON_TERM_SHARE, postgres.COMMON_TERM_MIN_DOCS)
    if connection.vendor == "postgresql":
        grid = [(share, docs) for share in shares for docs in min_docs]
        if default not in grid:
            grid.insert(0, default)
        grid.append((EXHAUSTIVE["share"], EXHAUSTIVE["min_docs"]))
    else:
        grid = [default]  # SQLite has no common-term split: one setting is all there is
    count_candidates = CandidateCounter() if connection.vendor == "postgresql" else None

    by_filler, loaded_filler, dump = [], 0, []
    for size in sizes:
        begun = time.perf_counter()
        for conversation_id, conversation in loaded:
            add_filler(team=team, kin=kins[conversation_id], conversation=conversation, count=size - loaded_filler,
                       rng=rng)
        loaded_filler = size
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")  # fresh planner statistics after the bulk load
        filler_seconds = time.perf_counter() - begun
        load_seconds += filler_seconds
        count_candidates = CandidateCounter() if count_candidates is not None else None  # counts change with filler
        results = _ask_grid(grid, questions, kins, team=team, ks=ks, limit=limit,
                            count_candidates=count_candidates, default=default)
        lexical = next(result for result in results if result["default"])
        print(f"filler {size:,} per kin: R@10 {lexical['overall']['recall@10']:.3f} (default setting)", flush=True)
        hybrid = None
        if embeddings:
            hybrid = _hybrid(questions, kins, team=team, ks=ks, limit=limit, embeddings=embeddings,
                             model=embedding_model, fusions=fusions, lexical=lexical, replay=replay,
                             embedding_cache=embedding_cache)
            if hybrid.get("recorded") is not None:
                dump.append({"filler_per_kin": size, "lexical": {key: lexical[key] for key in (
                    "name", "overall", "by_category", "by_conversation", "per_question_recall")},
                    "recorded": hybrid.pop("recorded")})
        by_filler.append({
            "filler_per_kin": size,
            "filler_seconds": round(filler_seconds, 1),
            "scope_sizes": {conversation_id: kin.memories.filter(status="active").count()
                            for conversation_id, kin in kins.items()},
            "settings": results,
            "recommended": recommend(results),
            "hybrid": hybrid,
        })

    last = by_filler[-1]
    if candidates_out is not None and dump:
        import pickle

        candidates_out.parent.mkdir(parents=True, exist_ok=True)
        with open(candidates_out, "wb") as file:
            pickle.dump({"questions": questions, "ks": ks, "database_version": database_version(connection),
                         "by_filler": dump}, file)
        print(f"wrote the recorded candidates to {candidates_out}", flush=True)
    for figures in by_filler:
        fused = figures["hybrid"]["fusions"] if figures["hybrid"] else []
        for result in figures["settings"] + fused:
            result.pop("per_question_recall", None)  # only needed for the comparisons above

    return {
        "database_version": database_version(connection),
        "data": str(data_dir),
        "conversations": len(loaded),
        "turn_memories": sum(len(conversation_turns(conversation)) for _, conversation in loaded),
        "filler_per_kin": last["filler_per_kin"],
        "scope_sizes": last["scope_sizes"],
        "load_seconds": round(load_seconds, 1),
        "questions": len(questions),
        "skipped_questions": skipped,
        "ks": list(ks),
        "top_k": top_k,
        "search_limit": limit,
        "default_setting": setting_name(*default),
        "settings": last["settings"],
        "recommended": last["recommended"],
        "by_filler": by_filler,
        "hybrid": last["hybrid"],
        "answer_key": questions,
    }


def _ask_grid(grid, questions, kins, *, team, ks, limit, count_candidates, default) -> list[dict]:
    """Every question under each setting of the grid, compared with the exhaustive one."""
    from django.core.cache import cache

    from memories.search import postgres
    from memories.search.selectors import memory_search

    results = []
    try:
        for share, docs in grid:
            postgres.COMMON_TERM_SHARE, postgres.COMMON_TERM_MIN_DOCS = share, docs
            cache.clear()
            for kin in kins.values():  # warm-up: plans, lexemes
                memory_search(team=team, kin=kin, query="hello there", limit=limit)
            results.append(_ask(questions, kins, team=team, ks=ks, limit=limit, count_candidates=count_candidates,
                                share=share, min_docs=docs, default=default))
    finally:
        postgres.COMMON_TERM_SHARE, postgres.COMMON_TERM_MIN_DOCS = default
        cache.clear()
    exhaustive = next((result for result in results if result["exhaustive"]), None)
    if exhaustive is not None:
        for result in results:
            # Positions in answer_key of the questions whose recall@10 differs from the baseline's.
            pairs = list(enumerate(zip(result["per_question_recall"], exhaustive["per_question_recall"], strict=True)))
            result["worse_than_exhaustive"] = [index for index, (ours, theirs) in pairs if ours < theirs]
            result["better_than_exhaustive"] = [index for index, (ours, theirs) in pairs if ours > theirs]
    return results


def _hybrid(questions, kins, *, team, ks, limit, embeddings, model, fusions, lexical, replay=False,
            embedding_cache=LOCAL_CACHE) -> dict:
    """With the embedder configured: every memory embedded (those still without a vector of
    the model), then every question under each fusion, at the default common-term setting;
    compared question by question with the lexical run of that setting. With `replay`, one
    live run of the shipped fusion, then every fusion scored on its recorded candidates (the
    record is returned as "recorded")."""
    from django.test import override_settings

    import memories.search.selectors
    from memories import ranking
    from memories.embeddings import embedding_model_current
    from memories.search import postgres
    from memories.search.selectors import memory_search

    default = (postgres.COMMON_TERM_SHARE, postgres.COMMON_TERM_MIN_DOCS)
    local = embeddings == LOCAL
    before = None if local else server_stats(embeddings)
    shipped, embed = ranking.fuse, memories.search.selectors.memory_embed
    embed_ms = []

    def timed_embed(**kwargs):
        # The query's embedding (the in-process model, or the round trip to the endpoint), part
        # of each search's time: measured apart.
        begun = time.perf_counter()
        try:
            return embed(**kwargs)
        finally:
            embed_ms.append((time.perf_counter() - begun) * 1000)

    def ask_live(name, on_searched=None, after_warmup=None):
        ranking.fuse = shipped if FUSIONS.get(name) is None else FUSIONS[name]()
        for kin in kins.values():  # warm-up: each scope's vector matrix, statistics, plans
            memory_search(team=team, kin=kin, query="hello there", limit=limit)
        if after_warmup is not None:
            after_warmup()
        embed_ms.clear()
        result = _ask(questions, kins, team=team, ks=ks, limit=limit, count_candidates=None,
                      share=default[0], min_docs=default[1], default=default, on_searched=on_searched)
        result.update(name=name, default=FUSIONS.get(name, 0) is None, exhaustive=False, replayed=False,
                      query_embedding=latency_summary(embed_ms))
        _compare(result, lexical["per_question_recall"])
        print(f"  {name}: R@10 {result['overall']['recall@10']:.3f}", flush=True)
        return result

    memories.search.selectors.memory_embed = timed_embed
    results, recorded = [], None
    with override_settings(**embedder_settings(embeddings, model)):
        model = embedding_model_current()
        if local:
            with CachedLocalEmbedder(embedding_cache) as cached:
                embedded = embed_all(model=model)
            embedded["local"] = cached.stats()
        else:
            embedded = embed_all(model=model)
        print(f"embedded {embedded['newly_embedded']:,} memories with {model} in {embedded['seconds']} s "
              f"({embedded['memories']:,} active)", flush=True)
        try:
            if not replay:
                results = [ask_live(name) for name in fusions]
            else:
                recorded, slot, real_rank = [], [], ranking.rank

                def recording_rank(candidates, **kwargs):
                    candidates = list(candidates)
                    slot.append((candidates, kwargs))
                    return real_rank(candidates, **kwargs)

                def searched():
                    # What ranking.rank got for this question (None: search stopped before it).
                    recorded.append(slot[-1] if slot else None)
                    slot.clear()

                live_name = next(iter(FUSIONS))  # the shipped fusion
                ranking.rank = recording_rank
                try:
                    live = ask_live(live_name, on_searched=searched, after_warmup=slot.clear)
                finally:
                    ranking.rank = real_rank
                results = replay_fusions(recorded, questions, fusions, ks=ks,
                                         lexical_recall=lexical["per_question_recall"])
                for result in results:
                    if result["default"]:
                        if result["per_question_recall"] != live["per_question_recall"]:
                            raise SystemExit("the replay of the shipped fusion differs from its live run")
                        result.update(search=live["search"], query_embedding=live["query_embedding"])
        finally:
            ranking.fuse, memories.search.selectors.memory_embed = shipped, embed
    after = None if local else server_stats(embeddings)
    server = None
    if before is not None and after is not None:
        server = {"computed": after["computed"] - before["computed"], "cached": after["cached"] - before["cached"],
                  "compute_seconds": round(after["compute_seconds"] - before["compute_seconds"], 1)}
    return {"endpoint": embeddings, "model": model, "embedded": embedded, "server": server,
            "lexical": {"name": lexical["name"], "overall": lexical["overall"], "by_category": lexical["by_category"],
                        "by_conversation": lexical["by_conversation"], "search": lexical["search"]},
            "fusions": results, "replayed": replay, "recorded": recorded}


def _compare(result: dict, lexical_recall: list[float]) -> None:
    pairs = list(zip(result["per_question_recall"], lexical_recall, strict=True))
    result["worse_than_lexical"] = [index for index, (ours, theirs) in enumerate(pairs) if ours < theirs]
    result["better_than_lexical"] = [index for index, (ours, theirs) in enumerate(pairs) if ours > theirs]


def replay_fusions(recorded: list, questions: list[dict], names, *, ks, lexical_recall=None) -> list[dict]:
    """Each fusion of `names` (ALL_FUSIONS) scored on recorded searches: memories.ranking.rank
    run again on the candidates and arguments each question's search gave it, with
    ranking.fuse swapped. Pure Python, no database."""
    from memories import ranking

    shipped, results = ranking.fuse, []
    recall_key = f"recall@{10 if 10 in ks else max(ks)}"
    try:
        for name in names:
            factory = ALL_FUSIONS[name]
            ranking.fuse = shipped if factory is None else factory()
            rows, by_category, by_conversation = [], defaultdict(list), defaultdict(list)
            for question, entry in zip(questions, recorded, strict=True):
                found = [] if entry is None else [r.id for r in ranking.rank(entry[0], **entry[1])]
                row = question_row(question["evidence_memory_ids"], found, ks)
                rows.append(row)
                by_category[question["category"]].append(row)
                by_conversation[question["conversation"]].append(row)
            result = {"name": name, "default": factory is None, "exhaustive": False, "replayed": True,
                      "overall": summary(rows, ks),
                      "by_category": {key: summary(value, ks) for key, value in sorted(by_category.items())},
                      "by_conversation": {key: summary(value, ks) for key, value in sorted(by_conversation.items())},
                      "per_question_recall": [row[recall_key] for row in rows]}
            if lexical_recall is not None:
                _compare(result, lexical_recall)
            results.append(result)
    finally:
        ranking.fuse = shipped
    return results


def _ask(questions, kins, *, team, ks, limit, count_candidates, share, min_docs, default, on_searched=None) -> dict:
    """Every question under the setting in force; figures of this setting."""
    from kinsite.textsearch import query_terms
    from memories.search import candidates as search_candidates, postgres
    from memories.search.selectors import _text_scores as search_text_scores, memory_search

    rows, latencies, candidates, bm25_rows = [], [], [], []
    by_category, by_conversation = defaultdict(list), defaultdict(list)
    for question in questions:
        kin = kins[question["conversation"]]
        begun = time.perf_counter()
        hits = memory_search(team=team, kin=kin, query=question["question"], limit=limit)
        latencies.append((time.perf_counter() - begun) * 1000)
        if on_searched is not None:
            on_searched()
        row = question_row(question["evidence_memory_ids"], [hit.memory.pk for hit in hits], ks)
        rows.append(row)
        by_category[question["category"]].append(row)
        by_conversation[question["conversation"]].append(row)
        if count_candidates is not None:
            candidates.append(count_candidates(team=team, kin=kin, question=question["question"]))
        # Where evidence is lost, outside the timed part: the BM25 list search ranks (its
        # top candidate_limit) and that list's own top 10, before ranking reorders it.
        text_ids = [match.id for match in search_text_scores(
            terms=query_terms(question["question"]), team=team, kin=kin, include_shared=True, limit=BM25_LIST)]
        evidence = question["evidence_memory_ids"]
        bm25_rows.append({f"recall@{k}": sum(1 for i in evidence if i in set(text_ids[:k])) / len(evidence)
                          for k in (10, BM25_LIST)})
    common_lexemes = None
    if count_candidates is not None:
        # The common lexemes of each scope under this setting.
        common_lexemes = {}
        for conversation_id, kin in kins.items():
            _, params = search_candidates.scope_sql(team=team, kin=kin, include_shared=True)
            stats = postgres.scope_stats(params, True, None)
            common_lexemes[conversation_id] = {"threshold": postgres.common_threshold(stats.count),
                                               "count": len(stats.common)}
    recall_key = f"recall@{10 if 10 in ks else max(ks)}"
    return {
        "name": setting_name(share, min_docs),
        "share": share,
        "min_docs": min_docs,
        "default": (share, min_docs) == default,
        "exhaustive": (share, min_docs) == (EXHAUSTIVE["share"], EXHAUSTIVE["min_docs"]),
        "overall": summary(rows, ks),
        "by_category": {name: summary(category_rows, ks) for name, category_rows in sorted(by_category.items())},
        "by_conversation": {name: summary(conversation_rows, ks)
                            for name, conversation_rows in sorted(by_conversation.items())},
        "bm25_list": {name: round(statistics.fmean(row[name] for row in bm25_rows), 4)
                      for name in ("recall@10", f"recall@{BM25_LIST}")},
        "mean_candidates": round(statistics.fmean(candidates), 1) if candidates else None,
        "max_candidates": max(candidates) if candidates else None,
        "common_lexemes": common_lexemes,
        "search": latency_summary(latencies),
        "per_question_recall": [row[recall_key] for row in rows],
    }


def recommend(results: list[dict], tolerance: float = 0.01) -> dict | None:
    """The setting with the fewest mean candidates whose recall@10 is within `tolerance`
    of the exhaustive baseline's (PostgreSQL only)."""
    exhaustive = next((result for result in results if result["exhaustive"]), None)
    if exhaustive is None:
        return None
    floor = exhaustive["overall"]["recall@10"] - tolerance
    good = [result for result in results if not result["exhaustive"] and result["overall"]["recall@10"] >= floor]
    if not good:
        return {"name": None, "tolerance": tolerance, "reason": "no setting within tolerance"}
    best = min(good, key=lambda result: (result["mean_candidates"], -result["overall"]["recall@10"]))
    return {"name": best["name"], "share": best["share"], "min_docs": best["min_docs"], "tolerance": tolerance,
            "recall@10": best["overall"]["recall@10"], "exhaustive_recall@10": exhaustive["overall"]["recall@10"],
            "mean_candidates": best["mean_candidates"], "exhaustive_mean_candidates": exhaustive["mean_candidates"]}


# --- output -----------------------------------------------------------------------------------


def differing(result: dict, how: str) -> str:
    questions = result.get(f"{how}_than_exhaustive")
    return "-" if questions is None else str(len(questions))


def print_table(figures: dict) -> None:
    print(f"memory relevance on LoCoMo — {figures['database_version']}: {figures['conversations']} conversations, "
          f"{figures['turn_memories']:,} turn memories + filler per kin, "
          f"{figures['questions']} questions (skipped: {figures['skipped_questions']}); "
          f"loaded in {figures['load_seconds']} s")
    for size in figures["by_filler"]:
        print(f"\n{size['filler_per_kin']:,} filler per kin (scopes of {min(size['scope_sizes'].values()):,}-"
              f"{max(size['scope_sizes'].values()):,} memories, filler loaded in {size['filler_seconds']} s)")
        print_settings(size, figures["ks"])
    for size in figures["by_filler"]:
        if size.get("hybrid"):
            print_hybrid(size["hybrid"], figures["ks"], size["filler_per_kin"])
    print_fusion_grid(figures["by_filler"])


def print_settings(figures: dict, ks) -> None:
    header = (f"{'setting':<22} {'thresh':>6} {'common':>6} "
              + " ".join(f"{f'R@{k}':>6}" for k in ks) + " " + " ".join(f"{f'hit@{k}':>6}" for k in ks)
              + f" {'MRR':>6} {'bm25@10':>7} {'bm25@50':>7} {'cand':>7} {'p50 ms':>7} {'p95 ms':>7} {'worse':>5}"
              f" {'better':>6}")
    print(header)
    print("-" * len(header))
    for result in figures["settings"]:
        overall, common = result["overall"], result["common_lexemes"]
        shown = common and not result["exhaustive"]  # the exhaustive threshold is out of reach by design
        threshold = f"{statistics.fmean(c['threshold'] for c in common.values()):.0f}" if shown else "-"
        n_common = f"{statistics.fmean(c['count'] for c in common.values()):.0f}" if common else "-"
        candidates = f"{result['mean_candidates']:.1f}" if result["mean_candidates"] is not None else "-"
        print(f"{result['name'] + (' *' if result['default'] else ''):<22} {threshold:>6} {n_common:>6} "
              + " ".join(f"{overall[f'recall@{k}']:>6.3f}" for k in ks) + " "
              + " ".join(f"{overall[f'hit@{k}']:>6.3f}" for k in ks)
              + f" {overall['mrr']:>6.3f} {result['bm25_list']['recall@10']:>7.3f}"
              f" {result['bm25_list'][f'recall@{BM25_LIST}']:>7.3f} {candidates:>7} {result['search']['p50_ms']:>7.1f}"
              f" {result['search']['p95_ms']:>7.1f}"
              f" {differing(result, 'worse'):>5} {differing(result, 'better'):>6}")
    print("* the current default; thresh/common: mean over kins of the common-term threshold (docs) and of the "
          "number of common lexemes; bm25@k: evidence recall of the BM25 list before ranking; worse/better: "
          "questions whose R@10 differs from exhaustive")
    categories = sorted({name for result in figures["settings"] for name in result["by_category"]})
    first = figures["settings"][0]["by_category"]
    counts = ", ".join(f"{name} {first[name]['questions']}" for name in categories)
    print(f"\nR@10 by category (questions: {counts})")
    print(f"{'setting':<22} " + " ".join(f"{name:>11}" for name in categories))
    for result in figures["settings"]:
        print(f"{result['name']:<22} "
              + " ".join(f"{result['by_category'][name]['recall@10']:>11.3f}" for name in categories))
    if figures["recommended"]:
        print(f"\nfewest candidates with R@10 within {figures['recommended']['tolerance']} of exhaustive: "
              f"{figures['recommended']['name']}")


def print_hybrid(hybrid: dict, ks, size: int | None = None) -> None:
    embedded, server = hybrid["embedded"], hybrid["server"]
    served = f"; server: {server['computed']:,} computed, {server['cached']:,} from its cache" if server else ""
    if embedded.get("local"):
        cached = embedded["local"]
        served = (f"; local model: {cached['computed']:,} computed in {cached['compute_seconds']} s,"
                  f" {cached['cached']:,} from its cache")
    at = f" at {size:,} filler per kin" if size is not None else ""
    how = " (fusions scored by replaying the shipped run's candidates)" if hybrid.get("replayed") else ""
    print(f"\nwith embeddings{at}: {hybrid['model']} ({hybrid['endpoint']}), {embedded['newly_embedded']:,} memories "
          f"embedded in {embedded['seconds']} s{served}{how}")
    conversations = sorted(hybrid["lexical"]["by_conversation"])
    header = (f"{'fusion':<52} " + " ".join(f"{f'R@{k}':>6}" for k in ks) + " "
              + " ".join(f"{f'hit@{k}':>6}" for k in ks) + f" {'MRR':>6} {'ΔR@10':>6} {'conv Δ min..max':>16}"
              f" {'p50 ms':>7} {'emb p50':>7} {'worse':>5} {'better':>6}")
    print(header)
    print("-" * len(header))
    rows = [{**hybrid["lexical"], "name": f"lexical only ({hybrid['lexical']['name']})"}] + hybrid["fusions"]
    words = hybrid["lexical"]
    for result in rows:
        overall = result["overall"]
        worse = str(len(result["worse_than_lexical"])) if "worse_than_lexical" in result else "-"
        better = str(len(result["better_than_lexical"])) if "better_than_lexical" in result else "-"
        embedding = f"{result['query_embedding']['p50_ms']:.1f}" if "query_embedding" in result else "-"
        search = f"{result['search']['p50_ms']:.1f}" if "search" in result else "-"
        delta = overall["recall@10"] - words["overall"]["recall@10"]
        deltas = [result["by_conversation"][c]["recall@10"] - words["by_conversation"][c]["recall@10"]
                  for c in conversations] if "by_conversation" in result else [0.0]
        print(f"{result['name'] + (' *' if result.get('default') else ''):<52} "
              + " ".join(f"{overall[f'recall@{k}']:>6.3f}" for k in ks) + " "
              + " ".join(f"{overall[f'hit@{k}']:>6.3f}" for k in ks)
              + f" {overall['mrr']:>6.3f} {delta:>+6.3f} {f'{min(deltas):+.3f}..{max(deltas):+.3f}':>16}"
              f" {search:>7} {embedding:>7} {worse:>5} {better:>6}")
    print("* memories.ranking.fuse as shipped; ΔR@10: against lexical only; conv Δ: the same per conversation; "
          "emb p50: the query's embedding, within the search's time; worse/better: questions whose R@10 differs "
          "from lexical only")
    categories = sorted(hybrid["lexical"]["by_category"])
    print(f"\nR@10 by category\n{'fusion':<52} " + " ".join(f"{name:>11}" for name in categories))
    for result in rows:
        print(f"{result['name']:<52} " + " ".join(f"{result['by_category'][name]['recall@10']:>11.3f}"
                                                   for name in categories))


def print_fusion_grid(by_filler: list[dict]) -> None:
    """Recall@10 of every fusion at every filler size, with its gain over the words alone."""
    sizes = [size for size in by_filler if size.get("hybrid")]
    if len(sizes) < 2:
        return
    print("\nR@10 by filler size (Δ: against lexical only at that size; min Δ conv: the worst conversation)")
    header = f"{'fusion':<52} " + " ".join(f"{format(size['filler_per_kin'], ','):>7} {'Δ':>6} {'min Δ conv':>10}"
                                             for size in sizes)
    print(header)
    print("-" * len(header))
    words = [s["hybrid"]["lexical"] for s in sizes]
    names = [result["name"] for result in sizes[0]["hybrid"]["fusions"]]
    print(f"{'lexical only':<52} " + " ".join(f"{w['overall']['recall@10']:>7.3f} {'':>6} {'':>10}" for w in words))
    for name in names:
        cells = []
        for size, lexical in zip(sizes, words, strict=True):
            result = next(r for r in size["hybrid"]["fusions"] if r["name"] == name)
            worst = min(result["by_conversation"][c]["recall@10"] - lexical["by_conversation"][c]["recall@10"]
                        for c in lexical["by_conversation"])
            cells.append(f"{result['overall']['recall@10']:>7.3f} "
                         f"{result['overall']['recall@10'] - lexical['overall']['recall@10']:>+6.3f} {worst:>+10.3f}")
        print(f"{name:<52} " + " ".join(cells))


def replay_from(path: Path, fusions: list[str], out: Path) -> int:
    """--replay-from: every fusion scored on a pickle of recorded candidates (--candidates-out);
    no database, no embedder."""
    import pickle

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kinsite.settings")
    os.environ.setdefault("SECRET_KEY", "kinsite-bench-only-secret-key-not-for-deployments")
    with open(path, "rb") as file:
        data = pickle.load(file)
    ks, questions = tuple(data["ks"]), data["questions"]
    by_filler = []
    for size in data["by_filler"]:
        lexical = size["lexical"]
        results = replay_fusions(size["recorded"], questions, fusions, ks=ks,
                                 lexical_recall=lexical["per_question_recall"])
        for result in results:
            del result["per_question_recall"]
        hybrid = {"endpoint": "(replayed)", "model": "(replayed)", "replayed": True, "server": None,
                  "embedded": {"newly_embedded": 0, "memories": 0, "seconds": 0},
                  "lexical": {key: value for key, value in lexical.items() if key != "per_question_recall"},
                  "fusions": results}
        by_filler.append({"filler_per_kin": size["filler_per_kin"], "hybrid": hybrid})
        print_hybrid(hybrid, ks, size["filler_per_kin"])
    print_fusion_grid(by_filler)
    figures = {"replayed_from": str(path), "database_version": data["database_version"], "ks": list(ks),
               "questions": len(questions), "by_filler": by_filler}
    print(f"wrote {write_results('memory_relevance-replay', 'candidates', figures, out)}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA_DIR, help="LoCoMo directory")
    parser.add_argument("--conversations", type=int, default=None, help="only the first N conversations")
    parser.add_argument("--questions-per-conversation", type=int, default=None, help="only the first N questions")
    parser.add_argument("--filler", default="10000",
                        help="synthetic memories added to each kin; several sizes comma-separated (0,10000,50000)")
    parser.add_argument("--shares", default=",".join(map(str, DEFAULT_SHARES)), help="COMMON_TERM_SHARE grid")
    parser.add_argument("--min-docs", default=",".join(map(str, DEFAULT_MIN_DOCS)), help="COMMON_TERM_MIN_DOCS grid")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--embeddings", default="", metavar="local|URL",
                        help="also embed the memories and compare fusions, at every filler size: 'local' is the "
                             "in-process model (EMBEDDINGS=local), a URL an OpenAI-compatible endpoint "
                             "(EMBEDDINGS=endpoint; e.g. bench/embeddings_server.py at http://127.0.0.1:8765/v1)")
    parser.add_argument("--embedding-model", default=EMBEDDING_MODEL, help="the endpoint's model (not for local)")
    parser.add_argument("--embedding-cache", default=str(LOCAL_CACHE),
                        help="with --embeddings local: the re-embedding job's vector cache (SQLite), 'none' for none")
    parser.add_argument("--fusions", default="",
                        help="with --embeddings: which fusions to run, comma-separated (default: all of FUSIONS, "
                             "with --replay all of FUSIONS and REPLAY_FUSIONS)")
    parser.add_argument("--replay", action="store_true",
                        help="with --embeddings: ask each question once (the shipped fusion) and score every fusion "
                             "on the candidates that search gave memories.ranking.rank")
    parser.add_argument("--candidates-out", type=Path, default=None,
                        help="with --replay: write the recorded candidates to this pickle")
    parser.add_argument("--replay-from", type=Path, default=None,
                        help="no database: score the fusions on a pickle written by --candidates-out")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="where the JSON goes")
    parser.add_argument("--database", default=BENCH_DATABASE,
                        help="name of the throwaway PostgreSQL database (created and dropped)")
    args = parser.parse_args(argv)
    shares = [float(value) for value in args.shares.split(",") if value.strip()]
    min_docs = [int(value) for value in args.min_docs.split(",") if value.strip()]
    fusions = [name.strip() for name in args.fusions.split(",") if name.strip()]
    if not fusions:
        fusions = list(ALL_FUSIONS if args.replay or args.replay_from else FUSIONS)
    filler = [int(value) for value in args.filler.split(",") if value.strip()]
    if args.replay_from:
        return replay_from(args.replay_from, fusions, args.out)
    if args.embeddings:
        # The re-embedding job runs in this process (its task eager), never through a broker.
        os.environ["CELERY_TASK_ALWAYS_EAGER"] = "true"

    with ThrowawayDatabase(args.database):
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection

        call_command("migrate", verbosity=0)
        figures = run(data_dir=args.data.resolve(), conversations=args.conversations,
                      questions_per_conversation=args.questions_per_conversation, filler=filler,
                      shares=shares, min_docs=min_docs, seed=args.seed, embeddings=args.embeddings,
                      embedding_model=args.embedding_model, fusions=fusions, replay=args.replay,
                      embedding_cache=None if args.embedding_cache == "none" else Path(args.embedding_cache),
                      candidates_out=args.candidates_out)
        vendor = connection.vendor
    print_table(figures)
    name = "memory_relevance-embeddings" if args.embeddings else "memory_relevance"
    print(f"wrote {write_results(name, vendor, figures, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
