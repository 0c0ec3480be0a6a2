"""Memory-search benchmark: 100,000 memories across 10 kins of one team, then
p50/p95 latency of memories.search.memory_search for queries drawn from the
same vocabulary. See bench/README.md.

    python bench/memory_search.py                 # SQLite (a temp file)
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/kinsite python bench/memory_search.py
"""
import argparse
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


def run(*, kins: int, per_kin: int, queries: int, seed: int) -> dict:
    from django.conf import settings
    from django.db import connection

    from memories.search import memory_search

    team, kin_rows, load_seconds = memories_populate(kins=kins, per_kin=per_kin, seed=seed)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # fresh planner statistics after the bulk load
    rng = random.Random(seed + 1)
    query_texts = [sentence(rng) for _ in range(queries)]
    for kin in kin_rows:  # warm-up: connections, caches, plans
        memory_search(team=team, kin=kin, query=query_texts[0], limit=settings.MEMORY_TOP_K)
    latencies, hit_counts = [], []
    with MachineWatch() as machine:
        for index, text in enumerate(query_texts):
            kin = kin_rows[index % len(kin_rows)]
            started = time.perf_counter()
            hits = memory_search(team=team, kin=kin, query=text, limit=settings.MEMORY_TOP_K)
            latencies.append((time.perf_counter() - started) * 1000)
            hit_counts.append(len(hits))
    return {
        "database_version": database_version(connection),
        "memories": kins * per_kin,
        "kins": kins,
        "queries": queries,
        "top_k": settings.MEMORY_TOP_K,
        "load_seconds": round(load_seconds, 1),
        "mean_hits": round(sum(hit_counts) / len(hit_counts), 2),
        "search": latency_summary(latencies),
        "machine_state": machine.figures,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kins", type=int, default=10)
    parser.add_argument("--per-kin", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    with ThrowawayDatabase("kinsite_bench_memory"):
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection

        call_command("migrate", verbosity=0)
        figures = run(kins=args.kins, per_kin=args.per_kin, queries=args.queries, seed=args.seed)
        vendor = connection.vendor
    search = figures["search"]
    print(f"memory search — {figures['database_version']}: {figures['memories']:,} memories in {figures['kins']} kins, "
          f"{figures['queries']} queries (top {figures['top_k']}), loaded in {figures['load_seconds']} s")
    print(f"  p50 {search['p50_ms']} ms · p95 {search['p95_ms']} ms · p99 {search['p99_ms']} ms · "
          f"max {search['max_ms']} ms · mean hits {figures['mean_hits']}")
    print("  " + machine_state_line(figures["machine_state"]))
    print(f"wrote {write_results('memory_search', vendor, figures)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
