"""Memory-search benchmark: 100,000 memories across 10 kins of one team, then
p50/p95 latency of memories.selectors.memory_search for queries drawn from the
same vocabulary. See bench/README.md.

    python bench/memory_search.py                 # SQLite (a temp file)
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/kinsite python bench/memory_search.py
"""
import argparse
import random
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ThrowawayDatabase, database_version, latency_summary, write_results  # noqa: E402

# A synthetic but word-rich corpus: people, topics and details combine into
# sentences, with a Zipf-like skew so some words are common and most are rare.
PEOPLE = ["Maria", "Tom", "Aisha", "Kenji", "Lena", "Omar", "Priya", "Lucas", "Sofia", "Ivan",
          "Chen", "Fatima", "Jonas", "Amara", "Diego", "Hana", "Noah", "Zara", "Mateo", "Yuki"]
TOPICS = """invoice report deployment database migration dashboard budget hiring roadmap contract
customer export pipeline backup release onboarding pricing newsletter survey audit incident
forecast warehouse inventory shipping payroll training workshop interview launch campaign
vendor license server cluster queue cache schema index query latency outage rollback feature
design review meeting retro sprint ticket bug patch security password token permission""".split()
DETAILS = """monday tuesday wednesday thursday friday weekly monthly quarterly yearly urgent
postgres redis celery django python csv json excel slack email telegram discord whatsapp
berlin london tokyo lagos lima toronto sydney mumbai paris cairo short long formal casual
green blue red coffee tea vegan spicy morning evening remote office hybrid metric imperial""".split()
TEMPLATES = [
    "{p} prefers {d} updates about the {t}",
    "The {t} for {p} is due every {d}",
    "{p} decided to move the {t} to {d}",
    "{p} owns the {t} and reviews it on {d}",
    "Remember that the {t} uses {d} and {d2}",
    "{p} asked to keep {t} answers {d}",
    "Team agreed the {t} {t2} happens {d}",
    "{p} knows the {t} runbook for {d2} {d}",
]
CATEGORIES = ["fact", "preference", "decision", "knowledge"]


def zipf_choice(rng: random.Random, words: list[str]) -> str:
    # Rank r is drawn with weight 1/r: a handful of words dominate, as in real notes.
    return rng.choices(words, weights=[1 / (rank + 1) for rank in range(len(words))])[0]


def sentence(rng: random.Random) -> str:
    return rng.choice(TEMPLATES).format(
        p=rng.choice(PEOPLE), t=zipf_choice(rng, TOPICS), t2=zipf_choice(rng, TOPICS),
        d=zipf_choice(rng, DETAILS), d2=zipf_choice(rng, DETAILS),
    )


def populate(*, kins: int, per_kin: int, seed: int):
    from django.utils import timezone

    from kinsite.services import team_create
    from memories.models import Memory
    from sessions_app.services import kin_create

    rng = random.Random(seed)
    team = team_create(name="Bench team", slug="bench")
    kin_rows = [kin_create(team=team, name=f"Kin {n}") for n in range(kins)]
    now = timezone.now()
    started = time.monotonic()
    for kin in kin_rows:
        # Rows are inserted directly: the benchmark measures search, and the
        # services' duplicate check would make loading 100,000 rows take minutes.
        rows = [
            Memory(
                team=team, kin=kin, category=rng.choice(CATEGORIES), content=sentence(rng),
                subject=rng.choice(PEOPLE), importance=rng.randint(1, 10), source="api",
            )
            for _ in range(per_kin)
        ]
        Memory.objects.bulk_create(rows, batch_size=2000)
    # Spread updated_at over a year so recency decay has work to do.
    ids = list(Memory.objects.values_list("id", flat=True))
    for start in range(0, len(ids), 5000):
        chunk = ids[start:start + 5000]
        Memory.objects.filter(id__in=chunk).update(updated_at=now - timedelta(days=rng.randint(0, 365)))
    return team, kin_rows, time.monotonic() - started


def run(*, kins: int, per_kin: int, queries: int, seed: int) -> dict:
    from django.conf import settings
    from django.db import connection

    from memories.selectors import memory_search

    team, kin_rows, load_seconds = populate(kins=kins, per_kin=per_kin, seed=seed)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # fresh planner statistics after the bulk load
    rng = random.Random(seed + 1)
    query_texts = [sentence(rng) for _ in range(queries)]
    for kin in kin_rows:  # warm-up: connections, caches, plans
        memory_search(team=team, kin=kin, query=query_texts[0], limit=settings.MEMORY_TOP_K)
    latencies, hit_counts = [], []
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
    print(f"wrote {write_results('memory_search', vendor, figures)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
