"""Request-cost benchmark (SPEC §14, issue 19): the server CPU of a sync chat turn with an
instant (0 ms) model, and what the memory and history search APIs add to their selectors.

Everything runs in this process through Django's test client (the whole WSGI stack:
middleware, token auth, throttle, DRF, serializers), so the CPU measured is the server's:
time.thread_time() around each request. The model is an in-process stand-in that answers at
once and streams its reply as word pieces, as a real streamed reply arrives. Search API and
bare selector alternate query by query, so both see the same machine. --profile adds a
cProfile of the turns (top entries by own time and cumulative time). See bench/README.md.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/kinsite REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python bench/request_cost.py [--turns 300] [--searches 300] [--profile]
"""
import argparse
import cProfile
import io
import os
import pstats
import random
import statistics
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
from bench.synthetic import memories_populate, message_text, sentence, session_populate  # noqa: E402

TARGET_TURN_CPU_MS = 15.0
TARGET_API_OVERHEAD_MS = 3.0
WARM_UP = 10
REPLY = ("Step one is the venue, step two the guest list; I will check both with Maria "
         "tomorrow and tell you by noon what is still open.")


class InstantModel:
    """A model that answers at once: the same short reply, streamed in word pieces when the
    caller streams (a sync turn always does: turns publish deltas). No recording, no copies:
    its own cost stays out of the server's figure as much as possible."""

    name = "instant"
    model = "instant-model"
    supports_embeddings = False

    def chat(self, messages, *, tools=None, json_mode=False, model=None, temperature=None, on_delta=None):
        from kinsite.llm.types import ChatResult, text_pieces

        if on_delta is not None:
            for piece in text_pieces(REPLY):
                on_delta(piece)
        return ChatResult(content=REPLY, tool_calls=[], model=model or self.model, tokens_in=1000, tokens_out=30,
                          finish_reason="stop", attempts=1)


def build(*, memories: int, messages: int, seed: int):
    """A team with one kin of `memories` memories and a session of `messages` messages, all
    but the newest 40 covered by a summary (as compaction leaves a long session), an API token."""
    from kinsite.services import api_token_issue
    from sessions_app.models import Event, Summary

    team, kins, _ = memories_populate(kins=1, per_kin=memories, seed=seed)
    kin = kins[0]
    # No introspection runs: nothing consumes the queue here (the turn's counter update still runs).
    kin.overrides = {"introspection": {"enabled": False}}
    kin.save(update_fields=["overrides"])
    session, _ = session_populate(kin=kin, messages=messages, seed=seed)
    events = list(Event.objects.filter(session=session).order_by("created_at", "id"))
    covered = events[:-40]
    Summary.objects.create(
        session=session, content="The team planned the launch; Maria owns the venue, Tom the guest list.",
        first_event=covered[0], last_event=covered[-1], first_at=covered[0].created_at,
        last_at=covered[-1].created_at, message_count=len(covered), token_count=20,
        seen_through_id=covered[-1].pk,
    )
    _, raw = api_token_issue(team=team, name="bench")
    return team, kin, session, raw


def cpu_ms(action) -> tuple[float, float]:
    """(thread CPU ms, wall ms) of action()."""
    wall, cpu = time.perf_counter(), time.thread_time()
    action()
    return (time.thread_time() - cpu) * 1000, (time.perf_counter() - wall) * 1000


def run(*, memories: int, messages: int, turns: int, searches: int, seed: int, profile: bool) -> dict:
    from django.core.cache import cache
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from kinsite.llm.providers import provider_override
    from memories.search.selectors import memory_search
    from sessions_app.models import CompactionRun
    from sessions_app.selectors import history_search

    rng = random.Random(seed)
    team, kin, session, raw = build(memories=memories, messages=messages, seed=seed)
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    turn_url = f"/api/v1/sessions/{session.pk}/messages/"

    def post_turn():
        text = message_text(rng, min_words=5, max_words=20)
        response = client.post(turn_url, {"content": text, "sender": "Maria"}, content_type="application/json")
        assert response.status_code == 201, response.content

    figures = {"database_version": database_version(connection), "memories": memories, "messages": messages}
    with provider_override(InstantModel()):
        cache.clear()
        for _ in range(WARM_UP):
            post_turn()
        with CaptureQueriesContext(connection) as captured:
            post_turn()
        figures["turn_queries"] = len(captured.captured_queries)
        figures["turn_statements"] = [query["sql"][:160] for query in captured.captured_queries]

        cpu, wall = [], []
        with MachineWatch() as watch:
            for _ in range(turns):
                c, w = cpu_ms(post_turn)
                cpu.append(c)
                wall.append(w)
        figures["turn_cpu"] = latency_summary(cpu)
        figures["turn_wall"] = latency_summary(wall)
        figures["turn_machine_state"] = watch.figures
        if profile:
            profiler = cProfile.Profile(time.thread_time)  # CPU, not waits on the database
            profiler.enable()
            for _ in range(100):
                post_turn()
            profiler.disable()
            figures["turn_profile"] = {order: profile_top(profiler, order) for order in ("tottime", "cumulative")}
    figures["compactions_requested"] = CompactionRun.objects.filter(session=session).count()

    # Search: the API and its selector, alternating in a random order for each query.
    queries = [" ".join(sentence(rng).split()[:rng.randint(2, 6)]) for _ in range(searches)]
    memory_url = f"/api/v1/kins/{kin.pk}/memories/search/"
    history_url = f"/api/v1/sessions/{session.pk}/history/search/"
    kinds = {
        "memory_api": lambda q: _ok(client.get(memory_url, {"q": q})),
        "memory_selector": lambda q: memory_search(team=team, kin=kin, query=q),
        "history_api": lambda q: _ok(client.get(history_url, {"q": q})),
        "history_selector": lambda q: history_search(session=session, query=q, limit=20),
    }
    for query in queries[:WARM_UP]:
        for action in kinds.values():
            action(query)
    samples = {kind: {"cpu": [], "wall": []} for kind in kinds}
    with MachineWatch() as watch:
        for query in queries:
            order = list(kinds)
            rng.shuffle(order)
            for kind in order:
                c, w = cpu_ms(lambda kind=kind, query=query: kinds[kind](query))
                samples[kind]["cpu"].append(c)
                samples[kind]["wall"].append(w)
    figures["search_machine_state"] = watch.figures
    if profile:
        profiler = cProfile.Profile(time.thread_time)
        profiler.enable()
        for query in queries[:100]:
            kinds["memory_api"](query)
            kinds["history_api"](query)
        profiler.disable()
        figures["search_profile"] = {order: profile_top(profiler, order) for order in ("tottime", "cumulative")}
    for kind, values in samples.items():
        figures[kind] = {"cpu": latency_summary(values["cpu"]), "wall": latency_summary(values["wall"])}
    for what in ("memory", "history"):
        api, selector = samples[f"{what}_api"], samples[f"{what}_selector"]
        figures[f"{what}_api_adds"] = {
            measure: round(statistics.median(api[measure]) - statistics.median(selector[measure]), 2)
            for measure in ("cpu", "wall")
        }
        with CaptureQueriesContext(connection) as captured:
            kinds[f"{what}_api"](queries[0])
        figures[f"{what}_api_queries"] = len(captured.captured_queries)
    return figures


def _ok(response):
    assert response.status_code == 200, response.content
    return response


def profile_top(profiler: cProfile.Profile, order: str, count: int = 45) -> str:
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).strip_dirs().sort_stats(order).print_stats(count)
    return out.getvalue()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=10_000)
    parser.add_argument("--messages", type=int, default=2_000)
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--searches", type=int, default=300)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--profile", action="store_true", help="also profile 100 turns (cProfile)")
    parser.add_argument("--database", default="kinsite_bench_request",
                        help="PostgreSQL: the throwaway database's name (dropped before and after)")
    args = parser.parse_args(argv)
    if not args.database.isidentifier():
        parser.error(f"--database must be a plain name, not {args.database!r}")
    # The chat rate limit still runs (its cache read and write are part of a turn's cost),
    # at a rate this benchmark does not reach.
    os.environ["API_RATE_CHAT"] = "1000000/min"
    with ThrowawayDatabase(args.database):
        import django

        django.setup()
        from django.conf import settings
        from django.core.management import call_command
        from django.db import connection

        call_command("migrate", verbosity=0)
        figures = run(memories=args.memories, messages=args.messages, turns=args.turns, searches=args.searches,
                      seed=args.seed, profile=args.profile)
        figures["redis"] = bool(settings.REDIS_URL)
        vendor = connection.vendor
    figures["load_average"] = os.getloadavg()
    turn = figures["turn_cpu"]
    print(f"request cost — {figures['database_version']}, Redis {'on' if figures['redis'] else 'off'}: "
          f"a kin of {figures['memories']:,} memories, a session of {figures['messages']:,} messages")
    print(f"  sync turn, server CPU: p50 {turn['p50_ms']} ms · p95 {turn['p95_ms']} ms "
          f"(target p50 ≤ {TARGET_TURN_CPU_MS}); wall p50 {figures['turn_wall']['p50_ms']} ms; "
          f"{figures['turn_queries']} statements; compactions requested {figures['compactions_requested']}")
    print("  " + machine_state_line(figures["turn_machine_state"]))
    for what in ("memory", "history"):
        api, selector, adds = figures[f"{what}_api"], figures[f"{what}_selector"], figures[f"{what}_api_adds"]
        print(f"  {what} search: API wall p50 {api['wall']['p50_ms']} ms, selector {selector['wall']['p50_ms']} ms "
              f"→ the API adds {adds['wall']} ms wall, {adds['cpu']} ms CPU (target ≤ {TARGET_API_OVERHEAD_MS}); "
              f"{figures[f'{what}_api_queries']} statements through the API")
    print("  " + machine_state_line(figures["search_machine_state"]))
    print(f"  load average {figures['load_average']}")
    if args.profile:
        for what, title in (("turn_profile", "100 turns"), ("search_profile", "100 memory + 100 history searches")):
            for order, text in figures[what].items():
                print(f"\n--- {title}, CPU by {order} ---")
                print("\n".join(line for line in text.splitlines() if line.strip()))
    print(f"wrote {write_results('request_cost', vendor, figures)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
