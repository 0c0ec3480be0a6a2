"""Growth curves (issue 19): history search, memory search and prompt assembly, through
the API, at 1,000 / 10,000 / 100,000 messages in a session and 10,000 / 100,000 /
1,000,000 memories in a team, all timed interleaved in one run on PostgreSQL, drawn as a
PNG (bench/results/growth-postgresql.png) with the JSON beside it. See docs/benchmarks.md,
"Growth curves", and bench/JOURNAL.md for its runs.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/kinsite python bench/growth.py
    ... --no-million     # skip the team of 1,000,000 memories (the slowest load)
    python bench/growth.py --redraw     # the PNG again from the JSON, nothing measured

One throwaway database per team size (`--database` prefix + _10000, _100000, _1000000;
dropped at the end), so a small team's search does not read GIN posting lists a million
memories long. A team of N memories has a "big" kin holding 10 % of them, 0.9 % are
team-shared and the rest belong to regular kins of at most 9,900 each (at 1,000,000:
bench/memory_growth.py's layout). The sessions (bench/synthetic.py messages_copy) belong
to the big kin of the smallest team; every other team's big kin has a session of the
smallest size, for the prompt's memory axis. Data is loaded by COPY with the tables kept
by triggers filled by their triggers (see bench/synthetic.py), then VACUUM ANALYZE."""
import argparse
import json
import math
import os
import random
import sys
import time
from collections import defaultdict
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    RESULTS_DIR,
    MachineWatch,
    ThrowawayDatabase,
    database_version,
    latency_summary,
    machine_state_line,
    write_results,
)
from bench.synthetic import (  # noqa: E402
    HISTORY_KINDS,
    MEMORY_KINDS,
    HistoryCorpus,
    memories_copy,
    memory_query,
    messages_copy,
)

NAME = "growth"
SESSION_SIZES = (1_000, 10_000, 100_000)
MEMORY_SIZES = (10_000, 100_000, 1_000_000)
SEARCH_LIMIT = 10
REGULAR_KIN_MAX = 9_900
WARM_UP = 1  # rounds of every call, untimed
# series name -> (axis, label); the axis says which size a point is.
SERIES = {
    "history_search": ("messages", "history search"),
    "prompt_by_messages": ("messages", "prompt preview"),
    "memory_search_regular": ("memories", "memory search, regular kin"),
    "memory_search_big": ("memories", "memory search, big kin (10 %)"),
    "prompt_by_memories": ("memories", "prompt preview (big kin)"),
}


def memory_layout(total: int) -> dict:
    """The kins of a team of `total` memories (see the module's docstring)."""
    big, shared = total // 10, total * 9 // 1000
    rest = total - big - shared
    regular = max(9, math.ceil(rest / REGULAR_KIN_MAX))
    return {"regular_kins": regular, "per_regular_kin": rest // regular, "big_kin": big, "shared": shared}


class Stores:
    """One connection per team size, swapped in as the default one before each call
    (memory_growth does the same), so calls on every size alternate in one process. A
    store of database None uses the default connection as it is (the tests)."""

    def __init__(self, databases: dict[int, str | None]):
        from django.db import connections

        self.base = connections["default"]
        self.wrappers = {size: self.base if database is None
                         else self.base.__class__({**self.base.settings_dict, "NAME": database}, alias="default")
                         for size, database in databases.items()}

    def use(self, size: int) -> None:
        from django.db import connections

        connections["default"] = self.wrappers[size]

    def close(self) -> None:
        from django.db import connections

        for wrapper in self.wrappers.values():
            if wrapper is not self.base:
                wrapper.close()
        connections["default"] = self.base


def offset_ids(offset: int) -> None:
    """Teams, kins and sessions of this database start at `offset`, so no per-process cache
    keyed by ids (the vector caches) mixes two databases' rows."""
    from django.db import connection

    from kinsite.models import Kin, Team
    from sessions_app.models import Session

    with connection.cursor() as cursor:
        for table in (Team._meta.db_table, Kin._meta.db_table, Session._meta.db_table):
            cursor.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                           f"greatest({offset}, (SELECT coalesce(max(id), 0) + 1 FROM {table})))")


def build_team(*, memories: int, session_sizes: tuple[int, ...], corpus: HistoryCorpus, seed: int) -> dict:
    """A team with its API token, kins, memories and the big kin's sessions, in the current
    database. Returns what the measuring needs and the load times."""
    from django.test import Client

    from kinsite.services import api_token_issue, team_create
    from sessions_app.services import kin_create, session_create

    team = team_create(name=f"Growth {memories}", slug=f"growth-{memories}-{seed}")
    _, raw_token = api_token_issue(team=team, name="bench")
    layout = memory_layout(memories)
    kins = [kin_create(team=team, name=f"Kin {n}") for n in range(layout["regular_kins"])]
    big_kin = kin_create(team=team, name="Big kin")
    owners = [(kin.pk, layout["per_regular_kin"]) for kin in kins]
    owners += [(big_kin.pk, layout["big_kin"]), (None, layout["shared"])]
    loaded = memories_copy(team=team, owners=owners, seed=seed)
    print(f"  team of {loaded['memories']:,} memories loaded in {loaded['load_seconds']} s", flush=True)
    sessions, message_seconds = {}, {}
    for size in session_sizes:
        session = session_create(kin=big_kin, title=f"{size} messages")
        sessions[size] = session.pk
        message_seconds[size] = round(messages_copy(session.pk, size, corpus), 1)
        print(f"  session of {size:,} messages loaded in {message_seconds[size]} s", flush=True)
    from django.db import connection

    with connection.cursor() as cursor:
        # What autovacuum does within a minute of such a bulk load (the postings and counters too).
        for table in ("sessions_app_event", "sessions_app_searchposting", "sessions_app_messagecount"):
            cursor.execute(f"VACUUM ANALYZE {table}")
    return {"team_id": team.pk, "client": Client(HTTP_AUTHORIZATION=f"Bearer {raw_token}"),
            "regular_kins": [kin.pk for kin in kins], "big_kin": big_kin.pk, "sessions": sessions,
            "layout": {**layout, "memories": loaded["memories"]},
            "load_seconds": {"memories": loaded["load_seconds"], **{str(k): v for k, v in message_seconds.items()}}}


def delete_team(team_id: int) -> None:
    """Every row the benchmark made for a team: the cascade from the team, and the vector
    scope rows, which have no foreign key (memories 0006)."""
    from kinsite.models import Team
    from memories.models import MemoryTermCount, MemoryVectorScope

    Team.objects.filter(pk=team_id).delete()
    MemoryVectorScope.objects.filter(team_id=team_id).delete()
    MemoryTermCount.objects.filter(team_id=team_id).delete()  # the delete trigger leaves none; to be sure


def run(*, databases: dict[int, str | None], session_sizes: tuple[int, ...], rounds: int, per_kind: int,
        seed: int, delete_rows: bool) -> dict:
    """Load, measure interleaved, and return the figures. `databases`: team size -> its
    database (None: the default connection's, for every size). The sessions go to the
    smallest team. delete_rows: delete what was made at the end (when the databases are
    not thrown away)."""
    from django.core.management import call_command
    from django.db import connection

    if connection.vendor != "postgresql":
        raise SystemExit("bench/growth.py measures PostgreSQL: set DATABASE_URL")
    memory_sizes = tuple(sorted(databases))
    stores = Stores(databases)
    corpus = HistoryCorpus(seed)
    teams: dict[int, dict] = {}
    try:
        for index, size in enumerate(memory_sizes):
            stores.use(size)
            if databases[size] is not None:
                call_command("migrate", verbosity=0)
                offset_ids((index + 1) * 100_000)
            teams[size] = build_team(memories=size, corpus=corpus, seed=seed + index,
                                     session_sizes=session_sizes if index == 0 else session_sizes[:1])
        version = database_version(connection)
        figures = measure(stores=stores, teams=teams, session_sizes=session_sizes, rounds=rounds,
                          per_kind=per_kind, seed=seed, corpus=corpus)
    finally:
        if delete_rows:
            for size, team in teams.items():
                stores.use(size)
                delete_team(team["team_id"])
        stores.close()
    smallest = teams[memory_sizes[0]]
    return {"database_version": version, "session_sizes": list(session_sizes), "memory_sizes": list(memory_sizes),
            "teams": {str(size): {"layout": team["layout"], "load_seconds": team["load_seconds"]}
                      for size, team in teams.items()},
            "sessions_in_team": memory_sizes[0], "search_limit": SEARCH_LIMIT, "rounds": rounds,
            "per_kind_per_round": per_kind, "seed": seed, **figures,
            "notes": f"sessions belong to the big kin of the {smallest['layout']['memories']:,}-memory team"}


def measure(*, stores: Stores, teams: dict, session_sizes, rounds: int, per_kind: int, seed: int,
            corpus: HistoryCorpus) -> dict:
    """Every (series, size, kind) call per_kind times a round, the round shuffled, so a slow
    moment of the shared machine falls on every size alike."""
    smallest = min(teams)
    calls = []  # (series, size, kind)
    for size in session_sizes:
        calls += [("history_search", size, kind) for kind in HISTORY_KINDS]
        calls += [("prompt_by_messages", size, kind) for kind in MEMORY_KINDS]
    for size in teams:
        calls += [(series, size, kind) for series in ("memory_search_regular", "memory_search_big",
                                                      "prompt_by_memories") for kind in MEMORY_KINDS]
    rng = random.Random(seed + 1)

    def request(series: str, size: int, kind: str):
        """(store, path, params) of one call; the texts are drawn here, outside the timing."""
        if series == "history_search":
            team = teams[smallest]
            return smallest, f"/api/v1/sessions/{team['sessions'][size]}/history/search/", {
                "q": corpus.query(kind, rng), "limit": SEARCH_LIMIT}
        if series.startswith("memory_search"):
            team = teams[size]
            kin = rng.choice(team["regular_kins"]) if series == "memory_search_regular" else team["big_kin"]
            # The default limit: MEMORY_TOP_K, as the prompt asks for.
            return size, f"/api/v1/kins/{kin}/memories/search/", {"q": memory_query(rng, kind)}
        # The incoming message: a memory query of the kind and a word of the history's vocabulary.
        store = smallest if series == "prompt_by_messages" else size
        team = teams[store]
        session = team["sessions"][size if series == "prompt_by_messages" else session_sizes[0]]
        return store, f"/api/v1/sessions/{session}/prompt/", {
            "message": f"{memory_query(rng, kind)} {corpus.query('one_word', rng)}", "sender": "Maria"}

    def call(store: int, path: str, params: dict) -> float:
        stores.use(store)
        client = teams[store]["client"]
        started = time.perf_counter()
        response = client.get(path, params)
        elapsed = (time.perf_counter() - started) * 1000
        if response.status_code != 200:
            raise SystemExit(f"GET {path} {params} answered {response.status_code}: {response.content[:300]!r}")
        return elapsed

    for _ in range(WARM_UP):  # untimed: connections, plans, caches
        for series, size, kind in calls:
            call(*request(series, size, kind))
    latencies: dict[tuple[str, int], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    load_before = os.getloadavg()
    with MachineWatch() as machine:
        for _ in range(rounds):
            order = calls * per_kind
            rng.shuffle(order)
            for series, size, kind in order:
                latencies[(series, size)][kind].append(call(*request(series, size, kind)))
    load_after = os.getloadavg()
    series_figures = {}
    for name, (axis, label) in SERIES.items():
        points = {}
        for (series, size), by_kind in sorted(latencies.items()):
            if series == name:
                every = [ms for values in by_kind.values() for ms in values]
                points[str(size)] = {"all": latency_summary(every),
                                     **{kind: latency_summary(values) for kind, values in by_kind.items()}}
        series_figures[name] = {"axis": axis, "label": label, "points": points}
    return {"series": series_figures, "machine_state": machine.figures,
            "load_average": {"before": [round(x, 2) for x in load_before],
                             "after": [round(x, 2) for x in load_after]}}


def table(figures: dict) -> str:
    """A Markdown table: p50 / p95 ms of every series at every size, and the p95 ratio of
    the largest size to the smallest."""
    lines = ["| series | size | p50 ms | p95 ms | p95 / smallest's |", "| --- | --- | --- | --- | --- |"]
    for series in figures["series"].values():
        points = series["points"]
        first = next(iter(points.values()))["all"]["p95_ms"]
        for size, point in points.items():
            lines.append(f"| {series['label']} | {int(size):,} {series['axis']} | {point['all']['p50_ms']} | "
                         f"{point['all']['p95_ms']} | {point['all']['p95_ms'] / first:.2f} |")
    return "\n".join(lines)


def draw(figures: dict, path: Path) -> Path:
    """Two panels, log x: per-session series against messages, per-team series against
    memories; p50 solid, p95 dashed, one colour per series."""
    import matplotlib

    matplotlib.use("Agg")  # no display: write the file only
    from matplotlib import pyplot

    fig, axes = pyplot.subplots(1, 2, figsize=(12, 6), sharey=True)
    panels = {"messages": axes[0], "memories": axes[1]}
    colours = iter(pyplot.rcParams["axes.prop_cycle"].by_key()["color"])
    for series in figures["series"].values():
        axis, colour = panels[series["axis"]], next(colours)
        sizes = [int(size) for size in series["points"]]
        for share, style in (("p50_ms", "-"), ("p95_ms", "--")):
            values = [point["all"][share] for point in series["points"].values()]
            axis.plot(sizes, values, style, color=colour, marker="o",
                      label=f"{series['label']} {share.split('_')[0]}")
    for name, axis in panels.items():
        axis.set_xscale("log")
        axis.set_xlabel(f"{name} in a {'session' if name == 'messages' else 'team'} (log scale)")
        axis.set_ylim(bottom=0)
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    axes[0].set_ylabel("API latency, ms")
    state, load = figures.get("machine_state", {}), figures.get("load_average", {})
    fig.suptitle(f"Kinsite growth — {figures.get('database_version', '')}, {figures.get('date', '')[:16]} UTC; "
                 f"load {load.get('before', ['?'])[0]}–{load.get('after', ['?'])[0]}, "
                 f"CPU busy {state.get('busy_percent', '?')} % (shared machine)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    pyplot.close(fig)
    return path


def report(figures: dict, out_dir: Path) -> tuple[Path, Path]:
    """Print the table, write the JSON and draw the PNG beside it."""
    print(f"growth — {figures['database_version']}, {figures['rounds']} rounds x {figures['per_kind_per_round']} "
          f"per kind, API latency; {figures['notes']}")
    print(table(figures))
    print(machine_state_line(figures["machine_state"]) + f"; load average {figures['load_average']}")
    json_path = write_results(NAME, "postgresql", figures, out_dir)
    png_path = draw(json.loads(json_path.read_text()), json_path.with_suffix(".png"))
    print(f"wrote {json_path} and {png_path}")
    return json_path, png_path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-million", action="store_true", help="skip the team of 1,000,000 memories")
    parser.add_argument("--redraw", action="store_true", help="draw the PNG from the JSON, measure nothing")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--per-kind", type=int, default=3, help="calls per series, size and query kind per round")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every size (smoke runs)")
    parser.add_argument("--seed", type=int, default=19)
    parser.add_argument("--database", default="kinsite_bench_growth_curves",
                        help="prefix of the throwaway databases (<prefix>_10000, ...)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="where the JSON and PNG go")
    args = parser.parse_args(argv)
    json_path = args.out / f"{NAME}-postgresql.json"
    if args.redraw:
        print(f"drew {draw(json.loads(json_path.read_text()), json_path.with_suffix('.png'))}")
        return 0
    if not args.database.isidentifier():
        parser.error(f"--database must be a plain name, not {args.database!r}")
    memory_sizes = MEMORY_SIZES[:-1] if args.no_million else MEMORY_SIZES
    memory_sizes = tuple(int(size * args.scale) for size in memory_sizes)
    session_sizes = tuple(int(size * args.scale) for size in SESSION_SIZES)
    databases = {size: f"{args.database}_{size}" for size in memory_sizes}
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kinsite.settings")
    with ExitStack() as throwaways:  # every database made is dropped, whatever fails
        for name in databases.values():
            if throwaways.enter_context(ThrowawayDatabase(name)).admin_params is None:
                raise SystemExit("bench/growth.py measures PostgreSQL: set DATABASE_URL")
        import django

        django.setup()
        figures = run(databases=databases, session_sizes=session_sizes, rounds=args.rounds,
                      per_kind=args.per_kind, seed=args.seed, delete_rows=False)
    report(figures, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
