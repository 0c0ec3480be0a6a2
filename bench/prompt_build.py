"""Prompt-build benchmark: a team with 10 kins of 10,000 memories each and one session
of 10,000 messages, then p50/p95/p99 of sessions_app.prompt.assembly.prompt_assemble for that
session (memory search + history selection + sections), the queries it runs and what
it builds, plus where the time goes. See bench/README.md.

    python bench/prompt_build.py                  # SQLite (a temp file)
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/kinsite python bench/prompt_build.py
"""
import argparse
import gc
import os
import random
import statistics
import sys
import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext
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
from bench.synthetic import SESSION_USERS, memories_populate, message_text, session_populate  # noqa: E402

TARGET_P50_MS = 20.0
TARGET_P99_MS = 50.0
WARM_UP = 5
# The incoming messages a kin is asked to answer: shorter than the stored history's.
INCOMING_WORDS = (5, 30)

# Which part of the assembly a query belongs to, by a fragment of its SQL (first match wins).
QUERY_KINDS = (
    ("running_tokens", "history: events"),
    # The message counts (counters kept by triggers) had their own query until the evening of 2026-12-02.
    ("consolidation_experienceversion", "session extras (experience, parent, summary, message counts)"),
    ("to_tsvector('english', t)", "memories: query lexemes"),
    ("memories_memorytermcount", "memories: scope stats"),
    ("ts_stat(", "memories: scope stats"),
    ("avg(length(", "memories: scope stats"),
    ("memories_memory_fts", "memories: BM25 candidates"),
    ("rare_matches", "memories: BM25 candidates"),
    ("candidates AS", "memories: BM25 candidates"),
    ("RETURNING", "memories: fetch hits + mark retrieved"),
    ('UPDATE "memories_memory"', "memories: mark retrieved"),
    ('FROM "memories_memory"', "memories: fetch hits"),
)


def query_kind(sql: str) -> str:
    return next((kind for fragment, kind in QUERY_KINDS if fragment in sql), "other")


# --- one assembly, as the turn and the preview call it ---------------------------------------


def assemble_turn(session, text, sender, platform, around=nullcontext):
    """The chat turn's path (sessions_app.turns): the user's message is stored first (not
    timed), then the prompt is assembled for it. The served memories are counted as
    retrieved afterwards, not timed, as the turn does when it stores its reply (until
    2026-12-03 the count was an UPDATE inside the assembly). The message is removed
    afterwards so every assembly sees the same session. `around()` is entered around
    the assembly alone (the profile's instruments)."""
    from django.utils import timezone

    from kinsite.tokencount import count_tokens
    from memories.services import memories_mark_retrieved
    from sessions_app.models import Event
    from sessions_app.prompt.assembly import prompt_assemble

    message = Event.objects.create(session=session, kind=Event.Kind.MESSAGE, role=Event.Role.USER, content=text,
                                   sender=sender, platform=platform, token_count=count_tokens(text),
                                   created_at=timezone.now())
    try:
        with around():
            started = time.perf_counter()
            prompt = prompt_assemble(session=session, message_text=text, sender=sender, platform=platform,
                                     current_event=message)
            elapsed = (time.perf_counter() - started) * 1000
        memories_mark_retrieved(memory_ids=prompt.memory_ids)
        return prompt, elapsed
    finally:
        Event.objects.filter(pk=message.pk).delete()


def assemble_preview(session, text, sender, platform, around=nullcontext):
    """The prompt preview's path (API and dashboard): the message is not stored (it is
    counted as if it were) and nothing is counted as retrieved."""
    from sessions_app.prompt.assembly import prompt_assemble

    with around():
        started = time.perf_counter()
        prompt = prompt_assemble(session=session, message_text=text, sender=sender, platform=platform)
        elapsed = (time.perf_counter() - started) * 1000
    return prompt, elapsed


MODES = {"turn": assemble_turn, "preview": assemble_preview}


def sizes_of(prompt) -> dict:
    sections = {section.id: section.tokens for section in prompt.sections}
    return {
        "system_tokens": prompt.system_tokens,
        "history_messages": len(prompt.history),
        "history_tokens": prompt.history_tokens,
        "memories_tokens": sections.get("memories", 0),
        "sections": len(prompt.sections),
    }


def summarise(values: list[float]) -> dict:
    return {"mean": round(statistics.fmean(values), 1), "min": min(values), "max": max(values)}


def time_mode(mode: str, session, incoming) -> dict:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    assemble = MODES[mode]
    for text, sender, platform in incoming[:WARM_UP]:  # connections, caches (BM25 scope stats), plans
        assemble(session, text, sender, platform)
    latencies, sizes = [], defaultdict(list)
    for text, sender, platform in incoming:
        prompt, elapsed = assemble(session, text, sender, platform)
        latencies.append(elapsed)
        for key, value in sizes_of(prompt).items():
            sizes[key].append(value)
    # The queries of one more assembly, outside the timed runs (capturing costs a little).
    capture = CaptureQueriesContext(connection)
    assemble(session, *incoming[0], around=lambda: capture)
    return {"latency": latency_summary(latencies), "queries": len(capture.captured_queries),
            "sizes": {key: summarise(v) for key, v in sizes.items()}}


# --- where the time goes ---------------------------------------------------------------------


class Stopwatch:
    """Accumulates time per named part of one assembly."""

    def __init__(self):
        self.parts = defaultdict(float)

    def wrap(self, name, function):
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.parts[name] += (time.perf_counter() - started) * 1000
        return timed


@contextmanager
def instrumented(watch: Stopwatch, queries: list):
    """Times prompt_assemble's parts by wrapping the functions sessions_app.prompt.assembly and its
    reads call (looked up as module globals at call time), and every SQL statement by kind."""
    from django.db import connection

    from sessions_app.prompt import assembly, reads

    def sql_timer(execute, sql, params, many, ctx):
        started = time.perf_counter()
        try:
            return execute(sql, params, many, ctx)
        finally:
            elapsed = (time.perf_counter() - started) * 1000
            kind = query_kind(sql)
            watch.parts["sql: " + kind] += elapsed
            queries.append((kind, elapsed, sql, params))

    wrapped = {
        "memory_search": "memory search",
        "_history_entries": "history: entries (query + rows)",
        "select_history": "history: select_history",
        "build_sections": "sections: build_sections",
        "render_system_prompt": "sections: render_system_prompt",
        "count_tokens": "sections: count_tokens",
    }
    originals = {(module, name): getattr(module, name)
                 for module in (assembly, reads) for name in wrapped if hasattr(module, name)}
    try:
        for (module, name), function in originals.items():
            setattr(module, name, watch.wrap(wrapped[name], function))
        with connection.execute_wrapper(sql_timer):
            yield
    finally:
        for (module, name), function in originals.items():
            setattr(module, name, function)


def profile(session, incoming) -> dict:
    """The turn's path again with every part timed (the wrappers cost a little, so these
    runs are not the headline figures), and the queries of each assembly counted with
    CaptureQueriesContext."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    parts_per_run, query_counts, kinds_per_run, slowest, totals = [], [], [], [], []
    for text, sender, platform in incoming:
        watch, queries = Stopwatch(), []

        @contextmanager
        def around():
            # Used by assemble_turn within this iteration, so the loop variables are the current ones.
            with CaptureQueriesContext(connection) as captured, instrumented(watch, queries):  # noqa: B023
                yield
            query_counts.append(len(captured.captured_queries))

        _, elapsed = assemble_turn(session, text, sender, platform, around=around)
        totals.append(elapsed)
        parts_per_run.append(dict(watch.parts))
        kinds = defaultdict(int)
        for kind, *_ in queries:
            kinds[kind] += 1
        kinds_per_run.append(kinds)
        slowest.extend(queries)
    runs = len(incoming)
    # A part that did not run in an assembly took 0 ms there.
    names = {name for run_parts in parts_per_run for name in run_parts}
    parts = {name: [run_parts.get(name, 0.0) for run_parts in parts_per_run] for name in names}

    def mean(values):
        return round(sum(values) / runs, 2)

    all_kinds = sorted({kind for kinds in kinds_per_run for kind in kinds})
    return {
        "runs": runs,
        "total": latency_summary(totals),
        "queries_per_assembly": summarise(query_counts),
        "queries_by_kind": {kind: mean([kinds.get(kind, 0) for kinds in kinds_per_run]) for kind in all_kinds},
        "breakdown": breakdown_of(parts, totals, runs),
        "_slowest": sorted(slowest, key=lambda q: -q[1]),
    }


# How the timed parts nest: each top-level part with the parts measured inside it. SQL of
# a kind not listed here ran directly in prompt_inputs_for.
NESTED = {
    "memory search": ("sql: memories: query lexemes", "sql: memories: scope stats", "sql: memories: BM25 candidates",
                      "sql: memories: fetch hits", "sql: memories: mark retrieved",
                      "sql: memories: fetch hits + mark retrieved"),
    "history: entries (query + rows)": ("sql: history: events",),
    "sections: build_sections": ("sections: count_tokens",),
}


def breakdown_of(parts: dict, totals: list[float], runs: int) -> list[dict]:
    """Mean and p50 of each part per assembly, nested parts under their parent, and the
    rest: Python in prompt_inputs_for and prompt_assemble outside the timed functions
    (building the ORM queries, HistoryEntry and message dicts, participants, the inputs)."""
    def row(name, values, level):
        return {"part": name, "level": level, "mean_ms": round(sum(values) / runs, 2),
                "p50_ms": round(statistics.median(values), 2)}

    children = {child for nested in NESTED.values() for child in nested}
    top = sorted((name for name in parts if name not in children), key=lambda name: -sum(parts[name]))
    rows = []
    for name in top:
        rows.append(row(name, parts[name], 0))
        rows.extend(row(child, parts[child], 1) for child in NESTED.get(name, ()) if child in parts)
    rest = [total - sum(parts[name][i] for name in top)
            for i, total in enumerate(totals)]
    rows.append(row("rest (Python outside the timed functions)", rest, 0))
    rows.append(row("total (instrumented)", totals, 0))
    return rows


def explain(queries, limit: int = 4) -> list[dict]:
    """EXPLAIN ANALYZE (PostgreSQL) or EXPLAIN QUERY PLAN (SQLite) of the slowest query of
    each of the `limit` slowest kinds."""
    from django.db import connection

    seen, plans = set(), []
    for kind, elapsed, sql, params in queries:
        if kind in seen or not sql.lstrip().upper().startswith(("SELECT", "WITH")):
            continue
        seen.add(kind)
        prefix = "EXPLAIN (ANALYZE, BUFFERS) " if connection.vendor == "postgresql" else "EXPLAIN QUERY PLAN "
        with connection.cursor() as cursor:
            cursor.execute(prefix + sql, params)
            plan = "\n".join(" | ".join(str(col) for col in row) for row in cursor.fetchall())
        plans.append({"kind": kind, "ms": round(elapsed, 2), "sql": " ".join(sql.split()), "plan": plan})
        if len(plans) >= limit:
            break
    return plans


# --- the run ---------------------------------------------------------------------------------


def run(*, kins: int, per_kin: int, messages: int, assemblies: int, profile_runs: int, seed: int,
        modes: list[str], with_explain: bool) -> dict:
    from django.db import connection

    team, kin_rows, memory_seconds = memories_populate(kins=kins, per_kin=per_kin, seed=seed)
    kin = kin_rows[0]
    session, message_seconds = session_populate(kin=kin, messages=messages, seed=seed + 2)
    with connection.cursor() as cursor:
        # Fresh planner statistics after the bulk load; on PostgreSQL also the visibility
        # map that autovacuum keeps on a live table (it vacuums after this many inserts),
        # without which no index-only scan is planned (the message counts, migration 0006).
        cursor.execute("VACUUM ANALYZE" if connection.vendor == "postgresql" else "ANALYZE")
    # A web worker freezes what it loaded at startup out of the garbage collector
    # (kinsite/wsgi.py); the benchmark process does the same once its data is loaded, so
    # full collections walk what an assembly allocates, not the load's leftovers.
    gc.collect()
    gc.freeze()
    rng = random.Random(seed + 3)
    incoming = [
        (message_text(rng, min_words=INCOMING_WORDS[0], max_words=INCOMING_WORDS[1]), *rng.choice(SESSION_USERS))
        for _ in range(assemblies)
    ]

    figures = {
        "database_version": database_version(connection),
        "memories": kins * per_kin,
        "kins": kins,
        "messages": messages,
        "history_budget": kin.effective_history_budget,
        "assemblies": assemblies,
        "load_seconds": {"memories": round(memory_seconds, 1), "messages": round(message_seconds, 1)},
        "target": {"p50_ms": TARGET_P50_MS, "p99_ms": TARGET_P99_MS},
    }
    # Other work on the machine, and the machine's own speed of the hour, move every
    # figure; both are recorded with them (bench/common.py: python_speed_ms).
    load_before = os.getloadavg()[0]
    with MachineWatch() as machine:
        for mode in modes:
            figures[mode] = time_mode(mode, session, incoming)
    figures["load_average_1min"] = {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)}
    figures["machine_state"] = machine.figures
    if profile_runs:
        profiled = profile(session, incoming[:profile_runs])
        slowest = profiled.pop("_slowest")
        figures["profile"] = profiled
        if with_explain:
            figures["explain"] = explain(slowest)
    if "turn" in figures:
        turn = figures["turn"]["latency"]
        figures["target"]["met"] = turn["p50_ms"] <= TARGET_P50_MS and turn["p99_ms"] <= TARGET_P99_MS
    return figures


def report(figures: dict) -> None:
    print(f"prompt build — {figures['database_version']}: {figures['memories']:,} memories in {figures['kins']} kins, "
          f"{figures['messages']:,} messages in the session, budget {figures['history_budget']:,} tokens; "
          f"loaded in {figures['load_seconds']['memories']} s + {figures['load_seconds']['messages']} s")
    if "load_average_1min" in figures:
        load = figures["load_average_1min"]
        print(f"  machine load (1-min average) {load['before']} before timing, {load['after']} after")
    if "machine_state" in figures:
        print("  " + machine_state_line(figures["machine_state"]))
    print(f"  {'path':<8} {'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7} {'max ms':>7} {'queries':>7}  {'system tok':>10} "
          f"{'history msgs':>12} {'history tok':>11}")
    for mode in MODES:
        if mode not in figures:
            continue
        latency, sizes = figures[mode]["latency"], figures[mode]["sizes"]
        print(f"  {mode:<8} {latency['p50_ms']:>7} {latency['p95_ms']:>7} {latency['p99_ms']:>7} "
              f"{latency['max_ms']:>7} {figures[mode]['queries']:>7}  "
              f"{sizes['system_tokens']['mean']:>10} {sizes['history_messages']['mean']:>12} "
              f"{sizes['history_tokens']['mean']:>11}")
    if "met" in figures["target"]:
        print(f"  target (turn, PostgreSQL): p50 ≤ {TARGET_P50_MS:g} ms, p99 ≤ {TARGET_P99_MS:g} ms — "
              f"{'met' if figures['target']['met'] else 'missed'} on this database")
    profiled = figures.get("profile")
    if profiled:
        queries = profiled["queries_per_assembly"]
        print(f"  queries per turn assembly: {queries['min']}–{queries['max']} "
              f"({', '.join(f'{k} {v:g}' for k, v in profiled['queries_by_kind'].items())})")
        print(f"  where the time goes ({profiled['runs']} instrumented turn assemblies, "
              f"p50 {profiled['total']['p50_ms']} ms with the instruments):")
        for part in profiled["breakdown"]:
            print(f"    {part['mean_ms']:>7.2f} ms mean  {part['p50_ms']:>7.2f} ms p50  "
                  f"{'   ' * part['level']}{part['part']}")
    for plan in figures.get("explain", []):
        print(f"\n  -- {plan['kind']} ({plan['ms']} ms): {plan['sql'][:300]}")
        print("\n".join("     " + line for line in plan["plan"].splitlines()))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kins", type=int, default=10)
    parser.add_argument("--per-kin", type=int, default=10_000)
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--assemblies", type=int, default=300)
    parser.add_argument("--profile-runs", type=int, default=100,
                        help="instrumented turn assemblies for the time breakdown (0: none)")
    parser.add_argument("--modes", default="turn,preview", help="turn, preview or both (comma-separated)")
    parser.add_argument("--explain", action="store_true", help="print the plans of the slowest queries")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    if unknown := set(modes) - set(MODES):
        parser.error(f"unknown modes: {sorted(unknown)}")
    with ThrowawayDatabase("kinsite_bench_prompt"):
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection

        call_command("migrate", verbosity=0)
        figures = run(kins=args.kins, per_kin=args.per_kin, messages=args.messages, assemblies=args.assemblies,
                      profile_runs=min(args.profile_runs, args.assemblies), seed=args.seed, modes=modes,
                      with_explain=args.explain)
        vendor = connection.vendor
    report(figures)
    print(f"wrote {write_results('prompt_build', vendor, figures)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
