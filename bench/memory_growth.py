"""Memory-search growth benchmark (PostgreSQL): lexical search p95 at 10,000 memories
against 1,000,000 in one team, by query kind, timed interleaved in one run. See
bench/JOURNAL.md, "Memory search at 1,000,000 memories".

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/kinsite python bench/memory_growth.py

Two throwaway databases, one per layout, so the small team's search does not read a
table (or GIN posting lists) a million memories long:
- small: 10 kins x 990 memories + 100 team-shared = 10,000;
- large: 90 kins x 9,900 + one "big" kin of 100,000 + 9,000 team-shared = 1,000,000.
A search is a kin's own memories plus the team's shared ones (memories.search.scope_sql),
so a regular kin of the large team searches ~19,000 memories and the big kin ~109,000.

The corpus is bench/synthetic.py's sentences (a ~120-word Zipf vocabulary: every word of
it is "common" at scale) plus, on a third of the memories, a reference drawn from 200,000
made-up codes, so rare words exist. Query kinds: rare (a sentence with a code), common
(a sentence of the vocabulary only), names (one or two people), one_word (a common
topic), many_words (a 30-60-word message). The searches of both layouts alternate in
random order (one open connection per database), so both see the same machine. Memories are loaded with COPY,
the search indexes built after the load, then VACUUM ANALYZE; both databases are dropped.
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
from bench.synthetic import MEMORY_KINDS, memories_copy, memory_query  # noqa: E402

KINDS = MEMORY_KINDS
LAYOUTS = {
    # name: (regular kins, memories per regular kin, big kin's memories, shared memories)
    "10k": (10, 990, 0, 100),
    "1m": (90, 9_900, 100_000, 9_000),
}


def load(*, layout: tuple[int, int, int, int], seed: int, id_offset: int) -> dict:
    """The layout's team, kins and memories in the current database (bench/synthetic.py
    memories_copy). Ids start at id_offset so the two databases' teams and kins never
    share an id: no per-process cache keyed by ids (the vector caches) mixes the two."""
    from django.db import connection

    from kinsite.models import Kin, Team
    from kinsite.services import team_create
    from sessions_app.services import kin_create

    regular, per_kin, big, shared = layout
    with connection.cursor() as cursor:
        for table in (Team._meta.db_table, Kin._meta.db_table):
            cursor.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), {id_offset})")
    team = team_create(name="Growth team", slug=f"growth{id_offset}")
    kins = [kin_create(team=team, name=f"Kin {n}") for n in range(regular)]
    big_kin = kin_create(team=team, name="Big kin") if big else None
    owners = [(kin.pk, per_kin) for kin in kins] + ([(big_kin.pk, big)] if big_kin else []) + [(None, shared)]
    loaded = memories_copy(team=team, owners=owners, seed=seed)
    return {"team": team, "kins": kins, "big_kin": big_kin, **loaded}


def use_database(name: str) -> None:
    """Point the default connection at another database (the next query reconnects)."""
    from django.db import connection

    connection.close()
    connection.settings_dict["NAME"] = name


def load_baseline(path: Path):
    """A text_scores to time against the current one: memories/search/postgres.py of
    another version (e.g. `git show main:memories/search/postgres.py > /tmp/before.py`),
    loaded as a module of its own."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("baseline_postgres", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.text_scores


def run(*, databases: dict[str, str], rounds: int, per_kind: int, seed: int, baseline: Path | None = None) -> dict:
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection

    from memories.search import postgres
    from memories.search.selectors import memory_search

    loaded = {}
    for offset, (layout, database) in enumerate(databases.items()):
        use_database(database)
        call_command("migrate", verbosity=0)
        loaded[layout] = load(layout=LAYOUTS[layout], seed=seed + offset, id_offset=(offset + 1) * 1000)
        print(f"  loaded {layout}: {loaded[layout]['memories']:,} memories in {loaded[layout]['load_seconds']} s",
              flush=True)
    version = database_version(connection)
    rng = random.Random(seed + 99)
    # One open connection per database; the default alias is pointed at one or the other
    # before each search, so searches of both layouts alternate in random order and see
    # the same machine (this 2-core machine's speed swings within minutes).
    from django.db import connections

    base = connections["default"]
    wrappers = {layout: base.__class__({**base.settings_dict, "NAME": database}, alias="default")
                for layout, database in databases.items()}
    tasks = []  # (layout, "regular" | "big", kins, kind), per_kind of each per round
    for layout in databases:
        data = loaded[layout]
        groups = [("regular", data["kins"])] + ([("big", [data["big_kin"]])] if data["big_kin"] else [])
        tasks += [(layout, group, kins, kind) for group, kins in groups for kind in KINDS] * per_kind
    # With a baseline, every search is also made by the baseline's text_scores, in the same
    # shuffled order, so both versions see the same machine.
    current = postgres.text_scores
    versions = {"": current, " (baseline)": load_baseline(baseline)} if baseline else {"": current}
    tasks = [(layout + suffix, group, kins, kind) for layout, group, kins, kind in tasks for suffix in versions]
    for layout, wrapper in wrappers.items():  # untimed: each connection's catalog caches and plans
        connections["default"] = wrapper
        memory_search(team=loaded[layout]["team"], kin=loaded[layout]["kins"][0], query="warm up",
                      limit=settings.MEMORY_TOP_K)
    latencies: dict[tuple[str, str], dict[str, list[float]]] = {}
    hit_counts: list[int] = []
    with MachineWatch() as machine:
        for _ in range(rounds):
            rng.shuffle(tasks)
            for name, group, kins, kind in tasks:
                layout, suffix = name.split(" ")[0], name[len(name.split(" ")[0]):]
                connections["default"] = wrappers[layout]
                postgres.text_scores = versions[suffix]
                kin, text = rng.choice(kins), memory_query(rng, kind)
                started = time.perf_counter()
                try:
                    hits = memory_search(team=loaded[layout]["team"], kin=kin, query=text,
                                         limit=settings.MEMORY_TOP_K)
                finally:
                    postgres.text_scores = current
                elapsed = (time.perf_counter() - started) * 1000
                latencies.setdefault((name, group), {}).setdefault(kind, []).append(elapsed)
                hit_counts.append(len(hits))
    for wrapper in wrappers.values():
        wrapper.close()
    connections["default"] = base
    figures = {}
    for (layout, group), by_kind in sorted(latencies.items(), key=lambda item: (
            list(databases).index(item[0][0].split(" ")[0]), item[0][1] != "regular", item[0][0])):
        every = [value for values in by_kind.values() for value in values]
        name, _, suffix = layout.partition(" ")
        figures[f"{name}_{group}" + (f" {suffix}" if suffix else "")] = {"all": latency_summary(every),
                                        **{kind: latency_summary(values) for kind, values in by_kind.items()}}
    return {
        "database_version": version,
        "layouts": {name: {"regular_kins": LAYOUTS[name][0], "per_regular_kin": LAYOUTS[name][1],
                           "big_kin": LAYOUTS[name][2], "shared": LAYOUTS[name][3],
                           "memories": loaded[name]["memories"], "load_seconds": loaded[name]["load_seconds"]}
                    for name in databases},
        "baseline": str(baseline) if baseline else None,
        "rounds": rounds,
        "per_kind_per_round": per_kind,
        "top_k": settings.MEMORY_TOP_K,
        "mean_hits": round(sum(hit_counts) / len(hit_counts), 2),
        "search": figures,
        "machine_state": machine.figures,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="rounds, each timing both layouts in turn")
    parser.add_argument("--per-kind", type=int, default=10, help="searches per query kind, kin group and round")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every layout's memory counts (smoke runs)")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a memories/search/postgres.py of another version: its text_scores is timed too, "
                             "interleaved with the current one")
    parser.add_argument("--database", default="kinsite_bench_growth",
                        help="prefix of the two throwaway databases (<prefix>_10k, <prefix>_1m)")
    args = parser.parse_args(argv)
    if not args.database.isidentifier():
        parser.error(f"--database must be a plain name, not {args.database!r}")
    for name, (regular, per_kin, big, shared) in LAYOUTS.items():
        LAYOUTS[name] = (regular, int(per_kin * args.scale), int(big * args.scale), int(shared * args.scale))
    databases = {layout: f"{args.database}_{layout}" for layout in LAYOUTS}
    small, large = (ThrowawayDatabase(name) for name in databases.values())
    with small, large:
        if small.admin_params is None:
            raise SystemExit("bench/memory_growth.py needs PostgreSQL (DATABASE_URL)")
        import django

        django.setup()
        from django.db import connection

        figures = run(databases=databases, rounds=args.rounds, per_kind=args.per_kind, seed=args.seed,
                      baseline=args.baseline.resolve() if args.baseline else None)
        vendor = connection.vendor
    print(f"memory search growth — {figures['database_version']}, lexical, top {figures['top_k']}, "
          f"{figures['rounds']} interleaved rounds, mean hits {figures['mean_hits']}")
    for name, layout in figures["layouts"].items():
        big = f" + a kin of {layout['big_kin']:,}" if layout["big_kin"] else ""
        print(f"  {name}: {layout['memories']:,} memories ({layout['regular_kins']} kins x "
              f"{layout['per_regular_kin']:,}{big} + {layout['shared']:,} shared), "
              f"loaded in {layout['load_seconds']} s")
    print(f"  {'p50 / p95 ms':<25}" + "".join(f"{kind:>16}" for kind in ("all", *KINDS)))
    for group, by_kind in figures["search"].items():
        print(f"  {group:<25}" + "".join(f"{by_kind[kind]['p50_ms']:>8} / {by_kind[kind]['p95_ms']:<5}"
                                         for kind in ("all", *KINDS)))
    print("  " + machine_state_line(figures["machine_state"]))
    print(f"wrote {write_results('memory_growth', vendor, figures)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
