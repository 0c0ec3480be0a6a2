"""Memory-search relevance benchmark on LoCoMo: every dialogue turn becomes a memory of
one kin (plus synthetic filler), every QA question is a query, and the turns it cites
are the answer key. Reports evidence recall, hit rate, MRR, latency and BM25 candidate
counts for a grid of common-term settings (memories.search.postgres.COMMON_TERM_SHARE /
COMMON_TERM_MIN_DOCS) against an exhaustive baseline. See bench/README.md.

    python bench/memory_relevance.py                 # SQLite (a temp file): default setting only
    ... bench/memory_relevance.py --filler 0,10000,50000   # recall as the kins grow (by_filler in the JSON)
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/kinsite python bench/memory_relevance.py
    ... bench/memory_relevance.py --embeddings http://127.0.0.1:8765/v1   # + MiniLM: hybrid vs lexical

With --embeddings (an OpenAI-compatible endpoint, e.g. bench/embeddings_server.py) the
memories are then embedded through Kinsite's re-embedding job (memories.reembed, the real
client and vector storage) and every question is asked again under each fusion of
FUSIONS (memories.ranking.fuse swapped, as the common-term constants are).
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


def fusion_relative(*, text_weight: float = 0.5, vector_weight: float = 0.5, floor: float = 0.2):
    """Both signals scaled by the best candidate's: BM25 / best BM25 and (cosine - floor) /
    (best cosine - floor), then their weighted mean."""
    from memories.ranking import Relevance

    def fuse(candidates):
        best_text = max((c.text_score for c in candidates), default=0.0)
        best_cosine = max((c.vector_similarity for c in candidates if c.vector_similarity is not None), default=0.0)
        fused = {}
        for c in candidates:
            text = c.text_score / best_text if best_text > 0 and c.text_score > 0 else 0.0
            weights, value, vector = text_weight, text_weight * text, 0.0
            if c.vector_similarity is not None:
                if best_cosine > floor:
                    vector = max((c.vector_similarity - floor) / (best_cosine - floor), 0.0)
                weights += vector_weight
                value += vector_weight * vector
            fused[c.id] = Relevance(value=value / weights, text=text, vector=vector)
        return fused
    return fuse


def fusion_rrf(*, k: int = 60, floor: float = 0.2):
    """Reciprocal-rank fusion: 1 / (k + rank) in the BM25 list plus 1 / (k + rank) in the
    cosine list (the candidates at `floor` or above), scaled so that first in both is 1."""
    from memories.ranking import Relevance

    def fuse(candidates):
        by_text = sorted((c for c in candidates if c.text_score > 0), key=lambda c: (-c.text_score, c.id))
        by_vector = sorted((c for c in candidates if c.vector_similarity is not None and c.vector_similarity >= floor),
                           key=lambda c: (-c.vector_similarity, c.id))
        text = {c.id: 1 / (k + rank) for rank, c in enumerate(by_text, start=1)}
        vector = {c.id: 1 / (k + rank) for rank, c in enumerate(by_vector, start=1)}
        best = 2 / (k + 1)
        return {c.id: Relevance(value=(text.get(c.id, 0.0) + vector.get(c.id, 0.0)) / best,
                                text=text.get(c.id, 0.0) * (k + 1), vector=vector.get(c.id, 0.0) * (k + 1))
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


def server_stats(base_url: str) -> dict | None:
    """bench/embeddings_server.py's counters (vectors computed and served from its cache), or
    None from another endpoint."""
    import httpx

    try:
        response = httpx.get(base_url.rstrip("/").removesuffix("/v1") + "/stats", timeout=5)
        return response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


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
            "seconds": round(time.perf_counter() - started, 1)}


# --- the run ----------------------------------------------------------------------------------


def run(*, data_dir: Path = DATA_DIR, conversations: int | None = None, questions_per_conversation: int | None = None,
        filler: int | list[int] = 10_000, shares=DEFAULT_SHARES, min_docs=DEFAULT_MIN_DOCS, seed: int = 7,
        embeddings: str = "", embedding_model: str = EMBEDDING_MODEL, fusions=tuple(FUSIONS)) -> dict:
    """Loads the memories into the current database, then asks every question under each
    setting, without embeddings. `filler`: memories added to each kin, or several sizes:
    the kins grow from the smallest to the largest (the same filler, more of it), and every
    size is asked in turn (`by_filler`; the top-level figures are the largest size's). The
    cache is cleared between settings (nothing cached may outlive a setting; the scope
    statistics were cached until memories migration 0012); a private in-process cache is
    used for that, never the deployment's Redis. With `embeddings` (an OpenAI-compatible
    base URL serving `embedding_model`), then embeds every memory and asks every question
    again under each of `fusions` (names of FUSIONS), at the default common-term setting
    and the largest filler size."""
    from django.conf import settings
    from django.test import override_settings

    private_cache = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                                 "LOCATION": f"memory-relevance-{uuid.uuid4()}"}}
    unknown = [name for name in fusions if name not in FUSIONS]
    if unknown:
        raise SystemExit(f"unknown fusions {unknown}; known: {list(FUSIONS)}")
    sizes = sorted({filler} if isinstance(filler, int) else set(filler))
    # No embedder for the lexical runs, whatever the environment configures.
    with override_settings(CACHES=private_cache, LLM_EMBEDDING_MODEL=""):
        return _run(data_dir=data_dir, conversations=conversations, per_conversation=questions_per_conversation,
                    sizes=sizes, shares=tuple(shares), min_docs=tuple(min_docs), seed=seed,
                    top_k=settings.MEMORY_TOP_K, embeddings=embeddings, embedding_model=embedding_model,
                    fusions=tuple(fusions))


def _run(*, data_dir, conversations, per_conversation, sizes, shares, min_docs, seed, top_k,
         embeddings, embedding_model, fusions) -> dict:
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

    by_filler, loaded_filler = [], 0
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
        by_filler.append({
            "filler_per_kin": size,
            "filler_seconds": round(filler_seconds, 1),
            "scope_sizes": {conversation_id: kin.memories.filter(status="active").count()
                            for conversation_id, kin in kins.items()},
            "settings": results,
            "recommended": recommend(results),
        })
        print(f"filler {size:,} per kin: R@10 {next(r for r in results if r['default'])['overall']['recall@10']:.3f} "
              f"(default setting)", flush=True)

    last = by_filler[-1]
    lexical = next(result for result in last["settings"] if result["default"])
    hybrid = None
    if embeddings:
        hybrid = _hybrid(questions, kins, team=team, ks=ks, limit=limit, embeddings=embeddings,
                         model=embedding_model, fusions=fusions, lexical=lexical)
    for result in [r for figures in by_filler for r in figures["settings"]] + (hybrid["fusions"] if hybrid else []):
        del result["per_question_recall"]  # only needed for the comparisons above

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
        "hybrid": hybrid,
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


def _hybrid(questions, kins, *, team, ks, limit, embeddings, model, fusions, lexical) -> dict:
    """With the embedder configured: every memory embedded, then every question under each
    fusion, at the default common-term setting; compared question by question with the
    lexical run of that setting."""
    from django.test import override_settings

    import memories.search.selectors
    from memories import ranking
    from memories.search import postgres
    from memories.search.selectors import memory_search

    default = (postgres.COMMON_TERM_SHARE, postgres.COMMON_TERM_MIN_DOCS)
    before = server_stats(embeddings)
    shipped, embed = ranking.fuse, memories.search.selectors.memory_embed
    embed_ms = []

    def timed_embed(**kwargs):
        # The query's round trip to the endpoint, part of each search's time: measured apart.
        begun = time.perf_counter()
        try:
            return embed(**kwargs)
        finally:
            embed_ms.append((time.perf_counter() - begun) * 1000)

    memories.search.selectors.memory_embed = timed_embed
    results = []
    with override_settings(LLM_BASE_URL=embeddings, LLM_API_KEY="", LLM_EMBEDDING_MODEL=model):
        embedded = embed_all(model=model)
        print(f"embedded {embedded['memories']:,} memories with {model} in {embedded['seconds']} s", flush=True)
        try:
            for name in fusions:
                ranking.fuse = shipped if FUSIONS[name] is None else FUSIONS[name]()
                for kin in kins.values():  # warm-up: each scope's vector matrix, statistics, plans
                    memory_search(team=team, kin=kin, query="hello there", limit=limit)
                embed_ms.clear()
                result = _ask(questions, kins, team=team, ks=ks, limit=limit, count_candidates=None,
                              share=default[0], min_docs=default[1], default=default)
                result.update(name=name, default=FUSIONS[name] is None, exhaustive=False,
                              query_embedding=latency_summary(embed_ms))
                pairs = list(zip(result["per_question_recall"], lexical["per_question_recall"], strict=True))
                result["worse_than_lexical"] = [index for index, (ours, theirs) in enumerate(pairs) if ours < theirs]
                result["better_than_lexical"] = [index for index, (ours, theirs) in enumerate(pairs) if ours > theirs]
                results.append(result)
                print(f"  {name}: R@10 {result['overall']['recall@10']:.3f}", flush=True)
        finally:
            ranking.fuse, memories.search.selectors.memory_embed = shipped, embed
    after = server_stats(embeddings)
    server = None
    if before is not None and after is not None:
        server = {"computed": after["computed"] - before["computed"], "cached": after["cached"] - before["cached"],
                  "compute_seconds": round(after["compute_seconds"] - before["compute_seconds"], 1)}
    return {"endpoint": embeddings, "model": model, "embedded": embedded, "server": server,
            "lexical": {"name": lexical["name"], "overall": lexical["overall"], "by_category": lexical["by_category"],
                        "search": lexical["search"]},
            "fusions": results}


def _ask(questions, kins, *, team, ks, limit, count_candidates, share, min_docs, default) -> dict:
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
    if figures.get("hybrid"):
        print_hybrid(figures["hybrid"], figures["ks"])


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


def print_hybrid(hybrid: dict, ks) -> None:
    embedded, server = hybrid["embedded"], hybrid["server"]
    served = f"; server: {server['computed']:,} computed, {server['cached']:,} from its cache" if server else ""
    print(f"\nwith embeddings: {hybrid['model']} at {hybrid['endpoint']}, {embedded['memories']:,} memories "
          f"embedded in {embedded['seconds']} s{served}")
    header = (f"{'fusion':<38} " + " ".join(f"{f'R@{k}':>6}" for k in ks) + " "
              + " ".join(f"{f'hit@{k}':>6}" for k in ks) + f" {'MRR':>6} {'p50 ms':>7} {'p95 ms':>7}"
              f" {'emb p50':>7} {'worse':>5} {'better':>6}")
    print(header)
    print("-" * len(header))
    rows = [{**hybrid["lexical"], "name": f"lexical only ({hybrid['lexical']['name']})"}] + hybrid["fusions"]
    for result in rows:
        overall = result["overall"]
        worse = str(len(result["worse_than_lexical"])) if "worse_than_lexical" in result else "-"
        better = str(len(result["better_than_lexical"])) if "better_than_lexical" in result else "-"
        embedding = f"{result['query_embedding']['p50_ms']:.1f}" if "query_embedding" in result else "-"
        print(f"{result['name'] + (' *' if result.get('default') else ''):<38} "
              + " ".join(f"{overall[f'recall@{k}']:>6.3f}" for k in ks) + " "
              + " ".join(f"{overall[f'hit@{k}']:>6.3f}" for k in ks)
              + f" {overall['mrr']:>6.3f} {result['search']['p50_ms']:>7.1f} {result['search']['p95_ms']:>7.1f}"
              f" {embedding:>7} {worse:>5} {better:>6}")
    print("* memories.ranking.fuse as shipped; emb p50: the query's embedding call, within the search's time; "
          "worse/better: questions whose R@10 differs from lexical only")
    categories = sorted(hybrid["lexical"]["by_category"])
    print(f"\nR@10 by category\n{'fusion':<38} " + " ".join(f"{name:>11}" for name in categories))
    for result in rows:
        print(f"{result['name']:<38} " + " ".join(f"{result['by_category'][name]['recall@10']:>11.3f}"
                                                   for name in categories))


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
    parser.add_argument("--embeddings", default="", metavar="URL",
                        help="OpenAI-compatible embeddings endpoint (e.g. bench/embeddings_server.py at "
                             "http://127.0.0.1:8765/v1): also embed the memories and compare fusions")
    parser.add_argument("--embedding-model", default=EMBEDDING_MODEL)
    parser.add_argument("--fusions", default=",".join(FUSIONS),
                        help="with --embeddings: which of FUSIONS to run, comma-separated")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="where the JSON goes")
    parser.add_argument("--database", default=BENCH_DATABASE,
                        help="name of the throwaway PostgreSQL database (created and dropped)")
    args = parser.parse_args(argv)
    shares = [float(value) for value in args.shares.split(",") if value.strip()]
    min_docs = [int(value) for value in args.min_docs.split(",") if value.strip()]
    fusions = [name.strip() for name in args.fusions.split(",") if name.strip()]
    filler = [int(value) for value in args.filler.split(",") if value.strip()]
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
                      embedding_model=args.embedding_model, fusions=fusions)
        vendor = connection.vendor
    print_table(figures)
    name = "memory_relevance-embeddings" if args.embeddings else "memory_relevance"
    print(f"wrote {write_results(name, vendor, figures, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
