"""Memory-search benchmark: 100,000 memories across 10 kins of one team, then
p50/p95 latency of memories.search.selectors.memory_search for queries drawn from the
same vocabulary. See bench/README.md.

    python bench/memory_search.py                 # SQLite (a temp file)
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/kinsite python bench/memory_search.py
    ... bench/memory_search.py --vectors          # every memory with a 384-d vector
    ... bench/memory_search.py --vectors --kins 1 --per-kin 100000   # one 100,000-memory kin
    DATABASE_URL=<a pgvector server's, scripts/pgvector_server.py> ... --vectors --hnsw ...

With --vectors, queries are embedded too (a deterministic hashed bag of words, 384
dimensions: cheap, offline, and the scan costs the same whatever the values), and it also
times the first search of each kin on an empty vector cache (cold: the kin's matrix is
built from the database), the vector scan alone, and the duplicate check of a write
(memory_find_duplicate, as memory_add runs it). With --hnsw (PostgreSQL with pgvector), the
HNSW index is built after the load (timed, as `manage.py vector_index --build` builds it),
so scopes large enough search through it, and the recall of the vector scan against the
exact scan is measured on the first 50 queries.
"""
import argparse
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    MachineWatch,
    ThrowawayDatabase,
    database_version,
    latency_summary,
    machine_state_line,
    write_results,
)
from bench.synthetic import memories_populate, sentence  # noqa: E402

VECTOR_DIMENSIONS = 384
# Dense pseudo-embeddings: a bag of words hashed into HASHED_WORDS slots, projected onto
# VECTOR_DIMENSIONS by a fixed Gaussian matrix. Cosines stay about those of the bags (texts
# sharing words point the same way), but vary around them, as real embeddings do. A sparse
# bag in 384 slots put thousands of the corpus's memories at exactly one cosine from a
# query, a plateau no HNSW graph search can cross (bench/JOURNAL.md, issue 17).
HASHED_WORDS = 4096
_projection = None


def dense_bag_of_words(text: str) -> list[float]:
    import hashlib
    import re

    import numpy as np

    global _projection
    if _projection is None:
        _projection = np.random.default_rng(17).standard_normal((HASHED_WORDS, VECTOR_DIMENSIONS))
    slots = [int.from_bytes(hashlib.md5(word.encode()).digest()[:4], "big") % HASHED_WORDS
             for word in re.findall(r"\w+", text.lower())]
    vector = _projection[slots].sum(axis=0) if slots else np.zeros(VECTOR_DIMENSIONS)
    norm = float(np.linalg.norm(vector))
    return (vector / norm if norm else vector).tolist()


class HashedEmbedder:
    """The scripted provider with dense_bag_of_words vectors (built lazily: Django is set up first)."""

    @staticmethod
    def create():
        from tests.support.scripted_model import ScriptedProvider

        class Embedder(ScriptedProvider):
            def embed_result(self, texts, *, model=None):
                result = super().embed_result(texts, model=model)
                result.vectors = [dense_bag_of_words(t) for t in texts]
                return result

        return Embedder()


def run(*, kins: int, per_kin: int, queries: int, seed: int, with_vectors: bool = False,
        with_hnsw: bool = False) -> dict:
    from contextlib import nullcontext

    from django.conf import settings
    from django.db import connection

    from kinsite.llm.gateway import endpoint_model_name
    from kinsite.llm.providers import provider_override
    from memories import ranking
    from memories.search.selectors import memory_search

    embed = provider = None
    if with_vectors:
        provider = HashedEmbedder.create()
        model = endpoint_model_name(provider)

        def embed(text):
            return ranking.vector_to_bytes(dense_bag_of_words(text)), model

    team, kin_rows, load_seconds = memories_populate(kins=kins, per_kin=per_kin, seed=seed, embed=embed)
    parked = park_oldest(kin_rows[0], embed) if with_vectors else None
    with connection.cursor() as cursor:
        # Fresh planner statistics after the bulk load; on PostgreSQL also clear the dead rows the
        # load's updates left (about one per memory), as autovacuum would before long.
        cursor.execute("VACUUM ANALYZE" if connection.vendor == "postgresql" else "ANALYZE")
    hnsw_figures = hnsw_build() if with_hnsw else {}
    table_sizes = table_sizes_mb(connection)
    rng = random.Random(seed + 1)
    query_texts = [sentence(rng) for _ in range(queries)]
    cold = []
    with provider_override(provider) if provider else nullcontext():
        for kin in kin_rows:  # warm-up: connections, caches, plans (and with vectors: cold searches)
            started = time.perf_counter()
            memory_search(team=team, kin=kin, query=query_texts[0], limit=settings.MEMORY_TOP_K)
            cold.append((time.perf_counter() - started) * 1000)
        latencies, hit_counts = [], []
        with MachineWatch() as machine:
            for index, text in enumerate(query_texts):
                kin = kin_rows[index % len(kin_rows)]
                started = time.perf_counter()
                hits = memory_search(team=team, kin=kin, query=text, limit=settings.MEMORY_TOP_K)
                latencies.append((time.perf_counter() - started) * 1000)
                hit_counts.append(len(hits))
        vector_figures = vector_timings(team, kin_rows, provider, rng, queries) if with_vectors else {}
        if parked is not None:
            hits = memory_search(team=team, kin=kin_rows[0], query=PARKED_QUERY, limit=settings.MEMORY_TOP_K)
            found = [hit.memory.pk for hit in hits]
            vector_figures["oldest_found_by_meaning"] = {
                "query": PARKED_QUERY, "memory": PARKED_CONTENT,
                "rank": found.index(parked) + 1 if parked in found else None,
                "text_score": next((hit.components.get("text") for hit in hits if hit.memory.pk == parked), None),
            }
        if with_hnsw:
            hnsw_figures["recall_at_50"] = hnsw_recall(team, kin_rows, provider, query_texts[:50])
    return {
        "database_version": database_version(connection),
        "memories": kins * per_kin,
        "kins": kins,
        "queries": queries,
        "top_k": settings.MEMORY_TOP_K,
        "load_seconds": round(load_seconds, 1),
        "table_sizes_mb": table_sizes,
        "mean_hits": round(sum(hit_counts) / len(hit_counts), 2),
        "search": latency_summary(latencies),
        "vectors": with_vectors,
        **vector_figures,
        **hnsw_figures,
        "machine_state": machine.figures,
    }


def hnsw_build() -> dict:
    """Build the HNSW index of the 384-d vectors as `manage.py vector_index --build` does;
    its build time (the slow part of deploying pgvector) and size."""
    from django.db import connection

    from memories import vectorindex

    if vectorindex.vector_mode() != vectorindex.MODE_PGVECTOR:
        raise SystemExit("--hnsw needs PostgreSQL with pgvector (scripts/pgvector_server.py starts one)")
    started = time.monotonic()
    outcome = vectorindex.hnsw_index_build(VECTOR_DIMENSIONS)
    seconds = time.monotonic() - started
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_relation_size(to_regclass(%s))", [vectorindex.hnsw_index_name(VECTOR_DIMENSIONS)])
        size = cursor.fetchone()[0] or 0
    return {"vector_mode": "pgvector", "hnsw_build": outcome, "hnsw_build_seconds": round(seconds, 1),
            "hnsw_index_mb": round(size / 1024 / 1024, 1)}


def hnsw_recall(team, kin_rows, provider, texts) -> dict:
    """Mean share of the exact 50 nearest (the exact scan, forced) that the index path found,
    and how many of the searches the index answered (the others fell back to the exact scan)."""
    from django.conf import settings
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from kinsite.llm.gateway import endpoint_model_name
    from memories.embeddings import Embedding
    from memories.search import vectors

    model = endpoint_model_name(provider)
    shares, through_index = [], 0
    for index, vector in enumerate(provider.embed_result(texts).vectors):
        kin = kin_rows[index % len(kin_rows)]
        embedding = Embedding(vector=tuple(vector), model=model)
        with CaptureQueriesContext(connection) as queries:
            found = vectors.nearest(team=team, kin=kin, include_shared=True, embedding=embedding, k=50)
        through_index += any("<=>" in query["sql"] for query in queries.captured_queries)
        minimum = settings.MEMORY_VECTOR_HNSW_MIN_SCOPE
        settings.MEMORY_VECTOR_HNSW_MIN_SCOPE = 10**12  # every scope "small": the exact path answers
        try:
            exact = vectors.nearest(team=team, kin=kin, include_shared=True, embedding=embedding, k=50)
        finally:
            settings.MEMORY_VECTOR_HNSW_MIN_SCOPE = minimum
        # Ties at the 50th cosine (the synthetic corpus repeats sentences) make the exact set
        # one of several: count by cosine, not id, with float32 rounding's slack (pgvector and
        # numpy sum in different orders).
        floor = min(exact.values()) - 1e-5
        shares.append(sum(1 for memory_id, cosine in found.items() if memory_id in exact or cosine >= floor)
                      / len(exact))
    return {"recall": round(sum(shares) / len(shares), 4), "searches": len(shares), "through_index": through_index}


# Acceptance 1 of issue 17 at the benchmark's size: the oldest memory of the first kin says
# PARKED_CONTENT, which shares no word with PARKED_QUERY, and its vector is the query's (what
# a real embedder makes of two sentences that mean the same); search must find it. The query
# shares only stop words with the corpus, so no memory matches it by full text, while its
# vector, like a real embedding, is near many memories rather than orthogonal to all (an
# HNSW graph cannot navigate to a point orthogonal to everything; real embeddings have none).
PARKED_CONTENT = "Automobile sits parked downstairs, level two"
PARKED_QUERY = "where is it on the car"


def park_oldest(kin, embed) -> int:
    """Rewrite the kin's first memory as PARKED_CONTENT (a fact of middling importance) with
    PARKED_QUERY's vector, older than every other memory; its id."""
    from datetime import timedelta

    from django.db.models import Min

    from memories.models import Memory, MemoryVector

    memory_id = Memory.objects.filter(kin=kin).order_by("id").values_list("id", flat=True).first()
    oldest = Memory.objects.filter(kin=kin).aggregate(oldest=Min("updated_at"))["oldest"]
    vector, model = embed(PARKED_QUERY)
    Memory.objects.filter(pk=memory_id).update(content=PARKED_CONTENT, subject="", category="fact", importance=5,
                                               embedding_model=model, updated_at=oldest - timedelta(days=1))
    MemoryVector.objects.filter(memory_id=memory_id).update(vector=vector)
    return memory_id


def table_sizes_mb(connection) -> dict:
    """PostgreSQL: the heap size (MiB, pg_relation_size) of the memories table and, where it
    exists, of the memory vector table: the heap the full-text candidates query reads."""
    if connection.vendor != "postgresql":
        return {}
    sizes = {}
    with connection.cursor() as cursor:
        for table in ("memories_memory", "memories_memoryvector"):
            cursor.execute("SELECT pg_relation_size(to_regclass(%s))", [table])
            size = cursor.fetchone()[0]
            if size is not None:
                sizes[table] = round(size / 1024 / 1024, 1)
    return sizes


def vector_timings(team, kin_rows, provider, rng, count: int) -> dict:
    """The vector scan alone (warm), the duplicate check of a write (warm), and the cold
    search: the first of a kin after this process's vector cache is emptied."""
    from django.conf import settings

    from kinsite.llm.gateway import endpoint_model_name
    from memories.embeddings import Embedding
    from memories.search import vectors
    from memories.search.selectors import memory_find_duplicate, memory_search

    model = endpoint_model_name(provider)
    texts = [sentence(rng) for _ in range(count)]
    embeddings = [Embedding(vector=tuple(v), model=model) for v in provider.embed_result(texts).vectors]
    scans, duplicates, cold = [], [], []
    for index, (text, embedding) in enumerate(zip(texts, embeddings, strict=True)):
        kin = kin_rows[index % len(kin_rows)]
        started = time.perf_counter()
        vectors.nearest(team=team, kin=kin, include_shared=True, embedding=embedding, k=50)
        scans.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        memory_find_duplicate(team=team, kin=kin, content=text, embedding=embedding)
        duplicates.append((time.perf_counter() - started) * 1000)
    for index in range(max(3, len(kin_rows))):
        kin = kin_rows[index % len(kin_rows)]
        vectors.vector_cache_clear()
        started = time.perf_counter()
        memory_search(team=team, kin=kin, query=texts[index], limit=settings.MEMORY_TOP_K)
        cold.append((time.perf_counter() - started) * 1000)
    return {
        "vector_dimensions": VECTOR_DIMENSIONS,
        "vector_scan": latency_summary(scans),
        "duplicate_check": latency_summary(duplicates),
        "cold_search": latency_summary(cold),
        # What the last cold search left in the cache: one kin's matrix (and the empty shared one).
        "vector_cache_mb": round(vectors.vector_cache_bytes() / 1024 / 1024, 1),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kins", type=int, default=10)
    parser.add_argument("--per-kin", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--vectors", action="store_true",
                        help="store a 384-d vector with every memory and embed the queries")
    parser.add_argument("--hnsw", action="store_true",
                        help="with --vectors on PostgreSQL with pgvector: build the HNSW index after the load (timed)")
    parser.add_argument("--database", default="",
                        help="PostgreSQL: the throwaway database's name (dropped before and after), so two runs "
                             "at once on one server do not drop each other's (default kinsite_bench_memory, "
                             "with --vectors kinsite_bench_memory_vectors)")
    args = parser.parse_args(argv)
    if args.hnsw and not args.vectors:
        parser.error("--hnsw needs --vectors")
    database = args.database or ("kinsite_bench_memory_vectors" if args.vectors else "kinsite_bench_memory")
    if not database.isidentifier():
        parser.error(f"--database must be a plain name (letters, digits, underscores), not {database!r}")
    # The bench's own embedder stands in for an endpoint (--vectors); without it, words only.
    os.environ.setdefault("EMBEDDINGS", "endpoint" if args.vectors else "off")
    with ThrowawayDatabase(database):
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection

        call_command("migrate", verbosity=0)
        figures = run(kins=args.kins, per_kin=args.per_kin, queries=args.queries, seed=args.seed,
                      with_vectors=args.vectors, with_hnsw=args.hnsw)
        vendor = connection.vendor
    search = figures["search"]
    print(f"memory search — {figures['database_version']}: {figures['memories']:,} memories in {figures['kins']} kins, "
          f"{figures['queries']} queries (top {figures['top_k']}), loaded in {figures['load_seconds']} s")
    if figures["table_sizes_mb"]:
        print("  heap: " + " · ".join(f"{table} {size} MiB" for table, size in figures["table_sizes_mb"].items()))
    print(f"  p50 {search['p50_ms']} ms · p95 {search['p95_ms']} ms · p99 {search['p99_ms']} ms · "
          f"max {search['max_ms']} ms · mean hits {figures['mean_hits']}")
    if figures["vectors"]:
        for name in ("vector_scan", "duplicate_check", "cold_search"):
            part = figures[name]
            print(f"  {name.replace('_', ' ')}: p50 {part['p50_ms']} ms · p95 {part['p95_ms']} ms · "
                  f"max {part['max_ms']} ms")
        print(f"  vector cache holding one kin: {figures['vector_cache_mb']} MiB")
        parked = figures["oldest_found_by_meaning"]
        print(f"  the oldest memory, no word shared with the query, found by meaning: rank {parked['rank']} "
              f"(text score {parked['text_score']})")
    if figures.get("hnsw_build"):
        print(f"  HNSW index: built in {figures['hnsw_build_seconds']} s, {figures['hnsw_index_mb']} MiB; "
              f"recall of the 50 nearest against the exact scan {figures['recall_at_50']['recall']} "
              f"({figures['recall_at_50']['through_index']} of {figures['recall_at_50']['searches']} "
              f"searches through the index)")
    print("  " + machine_state_line(figures["machine_state"]))
    name = "memory_search_vectors" if figures["vectors"] else "memory_search"
    if figures.get("hnsw_build"):
        name += "_hnsw"
    print(f"wrote {write_results(name, vendor, figures)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
