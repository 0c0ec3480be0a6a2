"""History-search growth benchmark (issue 19): does a search's cost grow with the
history? On PostgreSQL, builds a session of 1,000 and one of 100,000 synthetic
messages (a Zipf-distributed vocabulary, so some words are on most messages and most
words on few), then runs a query mix (rare word, common words only, a speaker's name,
one word, many words) through the API, INTERLEAVED between the two sessions, and
reports p50/p95 per size and per query kind and the 100k/1k ratio. See bench/README.md.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/kinsite python bench/history_growth.py
    ... --compare-with /work/main     # also the selectors of another checkout, interleaved

It creates and drops a throwaway database (--database, default
kinsite_bench_history_growth) on the DATABASE_URL server."""
import argparse
import importlib.util
import os
import random
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    ROOT,
    MachineWatch,
    ThrowawayDatabase,
    database_version,
    latency_summary,
    machine_state_line,
    write_results,
)
from bench.synthetic import HISTORY_KINDS, HistoryCorpus, messages_copy  # noqa: E402

DEFAULT_DATABASE = "kinsite_bench_history_growth"
SIZES = (1_000, 100_000)
SEARCH_LIMIT = 10
KINDS = HISTORY_KINDS
# Issue 19's acceptance 1 names "a mix of rare-word and common-word-only queries": that
# mix gets its own p50/p95 and ratio beside "all" (every kind, many-word queries included).
ACCEPTANCE_MIX = ("rare", "common")


def load_selectors(checkout: Path):
    """The history_search of another checkout's sessions_app/selectors.py (same models)."""
    spec = importlib.util.spec_from_file_location("compared_selectors", checkout / "sessions_app" / "selectors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.history_search


def run(*, sizes: tuple[int, ...], queries_per_kind: int, seed: int, compare_with: Path | None,
        overlap: bool) -> dict:
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client

    from kinsite.services import api_token_issue, team_create
    from sessions_app import selectors

    if connection.vendor != "postgresql":
        raise SystemExit("history_growth measures the PostgreSQL path: set DATABASE_URL")
    call_command("migrate", verbosity=0)
    team = team_create(name="History growth bench", slug="history-growth-bench")
    _, raw_token = api_token_issue(team=team, name="bench")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw_token}")
    kin = client.post("/api/v1/kins/", {"name": "Reader"}, content_type="application/json").json()

    corpus = HistoryCorpus(seed)
    sessions, load_seconds = {}, {}
    for size in sizes:
        session = client.post(f"/api/v1/kins/{kin['id']}/sessions/", {"title": f"{size} messages"},
                              content_type="application/json").json()
        sessions[size] = session["id"]
        load_seconds[size] = round(messages_copy(session["id"], size, corpus), 1)
        print(f"loaded {size} messages in {load_seconds[size]} s", flush=True)
    with connection.cursor() as cursor:
        # What autovacuum does within a minute of such a bulk load (bench/history_search.py does the same).
        cursor.execute("VACUUM ANALYZE")

    codes = {"current": selectors.history_search}
    if compare_with is not None:
        codes["compared"] = load_selectors(compare_with)
    query_rng = random.Random(seed + 1)
    queries = [(kind, corpus.query(kind, query_rng)) for _ in range(queries_per_kind) for kind in KINDS]

    def search(code: str, size: int, text: str):
        selectors.history_search = codes[code]
        try:
            started = time.perf_counter()
            response = client.get(f"/api/v1/sessions/{sessions[size]}/history/search/",
                                  {"q": text, "limit": SEARCH_LIMIT})
            elapsed = (time.perf_counter() - started) * 1000
        finally:
            selectors.history_search = codes["current"]
        if response.status_code != 200:
            raise SystemExit(f"search {text!r} answered {response.status_code}: {response.content[:300]!r}")
        return elapsed, [hit["id"] for hit in response.json()["results"]]

    # Warm-up: connections, caches (the compared code's common-term cache), plans.
    for code in codes:
        for size in sizes:
            for _, text in queries[: len(KINDS)]:
                search(code, size, text)

    latencies = defaultdict(list)  # (code, size, kind) -> ms
    hits = {}  # (code, size, text) -> ids
    order_rng = random.Random(seed + 2)
    with MachineWatch() as machine:
        for kind, text in queries:
            # Every query runs on both sizes (and both codes) back to back, in a shuffled
            # order, so a slow moment of the shared machine falls on all of them alike.
            runs = [(code, size) for code in codes for size in sizes]
            order_rng.shuffle(runs)
            for code, size in runs:
                elapsed, ids = search(code, size, text)
                latencies[(code, size, kind)].append(elapsed)
                hits[(code, size, text)] = ids

    figures = {"sizes": list(sizes), "load_seconds": {str(k): v for k, v in load_seconds.items()},
               "queries_per_kind": queries_per_kind, "search_limit": SEARCH_LIMIT, "seed": seed,
               "database_version": database_version(connection), "machine_state": machine.figures,
               "compared_with": str(compare_with) if compare_with else None, "codes": {}}
    for code in codes:
        per_size = {}
        for size in sizes:
            all_ms = [ms for kind in KINDS for ms in latencies[(code, size, kind)]]
            mix_ms = [ms for kind in ACCEPTANCE_MIX for ms in latencies[(code, size, kind)]]
            per_size[str(size)] = {"all": latency_summary(all_ms), "rare_and_common": latency_summary(mix_ms),
                                   **{kind: latency_summary(latencies[(code, size, kind)]) for kind in KINDS}}
        small, large = per_size[str(sizes[0])], per_size[str(sizes[-1])]
        figures["codes"][code] = {
            "latency": per_size,
            "p95_ratio": round(large["all"]["p95_ms"] / small["all"]["p95_ms"], 2),
            "p50_ratio": round(large["all"]["p50_ms"] / small["all"]["p50_ms"], 2),
            "rare_and_common_p95_ratio": round(
                large["rare_and_common"]["p95_ms"] / small["rare_and_common"]["p95_ms"], 2),
        }
    if overlap:
        figures["top10_overlap_with_exhaustive"] = exhaustive_overlap(queries, sessions, hits)
    return figures


def exhaustive_overlap(queries, sessions, hits) -> dict:
    """Per size and kind, the mean share of the current code's top 10 that an exhaustive
    BM25 (every posting of every query term read and scored exactly) also ranks top 10."""
    from sessions_app import selectors
    from sessions_app.models import Session

    saved = selectors.TERM_CANDIDATES, selectors.RESCORE_POOL
    selectors.TERM_CANDIDATES = selectors.RESCORE_POOL = 10**9
    try:
        shares = defaultdict(list)
        for size, session_id in sessions.items():
            session = Session.objects.get(pk=session_id)
            for kind, text in queries:
                exact = [hit.id for hit in selectors.history_search(query=text, limit=SEARCH_LIMIT, session=session)]
                found = hits[("current", size, text)]
                if exact:
                    shares[(size, kind)].append(len(set(exact) & set(found)) / len(exact))
    finally:
        selectors.TERM_CANDIDATES, selectors.RESCORE_POOL = saved
    return {str(size): {kind: round(sum(s) / len(s), 3) if (s := shares[(size, kind)]) else None for kind in KINDS}
            for size in sessions}


def print_figures(figures: dict) -> None:
    print(f"history search growth — {figures['database_version']}, "
          f"{figures['queries_per_kind']} queries per kind, limit {figures['search_limit']}, "
          "API latency in ms (p50 / p95)")
    header = f"{'code':<9} {'messages':>8} " + " ".join(f"{kind:>14}" for kind in (*KINDS, "all"))
    print(header)
    print("-" * len(header))
    for code, result in figures["codes"].items():
        for size, per_kind in result["latency"].items():
            cells = " ".join(f"{per_kind[kind]['p50_ms']:>6.1f} /{per_kind[kind]['p95_ms']:>6.1f}"
                             for kind in (*KINDS, "all"))
            print(f"{code:<9} {size:>8} {cells}")
        sizes = figures["sizes"]
        print(f"{code:<9} p95 ratio {sizes[-1]}/{sizes[0]}: {result['p95_ratio']}, p50 ratio {result['p50_ratio']}")
        mix = {size: per_kind["rare_and_common"] for size, per_kind in result["latency"].items()}
        print(f"{code:<9} rare and common queries only: p95 "
              + " / ".join(f"{summary['p95_ms']:.1f}" for summary in mix.values())
              + f" ms, ratio {result['rare_and_common_p95_ratio']}")
    if "top10_overlap_with_exhaustive" in figures:
        print(f"top-10 overlap with exhaustive BM25: {figures['top10_overlap_with_exhaustive']}")
    print(machine_state_line(figures["machine_state"]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", default=DEFAULT_DATABASE, help="throwaway database name (dropped at the end)")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="session sizes, smallest first")
    parser.add_argument("--queries", type=int, default=40, help="queries per kind")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--compare-with", type=Path, default=None,
                        help="another checkout whose sessions_app/selectors.py is measured interleaved")
    parser.add_argument("--no-overlap", action="store_true", help="skip the top-10 overlap with exhaustive BM25")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="where the JSON goes")
    args = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kinsite.settings")
    with ThrowawayDatabase(args.database):
        import django

        django.setup()
        figures = run(sizes=tuple(int(size) for size in args.sizes.split(",")), queries_per_kind=args.queries,
                      seed=args.seed, compare_with=args.compare_with.resolve() if args.compare_with else None,
                      overlap=not args.no_overlap)

    print_figures(figures)
    path = write_results("history_growth", "postgresql", figures, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
