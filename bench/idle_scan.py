"""Idle-introspection scan benchmark (SPEC §14): 100,000 sessions of which 100 are
due; times idle_sessions_due() — the beat task's query — and prints its query plan,
which must use the partial index session_introspection_due. See bench/README.md.

    python bench/idle_scan.py                     # SQLite (a temp file)
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/kinsite python bench/idle_scan.py

With DATABASE_URL it creates and drops a throwaway database `kinsite_bench_idle`."""
import argparse
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ThrowawayDatabase, database_version, latency_summary, write_results  # noqa: E402

INDEX = "session_introspection_due"
BATCH = 5_000


def populate(*, sessions: int, due: int, active_flagged: int) -> dict:
    """`sessions` sessions over 10 kins: `due` flagged and idle 30 min with a message each;
    `active_flagged` flagged but active a minute ago (the next scans' work); the rest idle
    for days with nothing new (introspected already, flag cleared)."""
    from django.utils import timezone

    from kinsite.models import Kin, Team
    from sessions_app.models import Event, Session

    team = Team.objects.create(name="Bench", slug="bench-idle")
    kins = Kin.objects.bulk_create([Kin(team=team, name=f"Kin {i}") for i in range(10)])
    now = timezone.now()
    # Spread the due sessions over the id range, so nothing depends on their position.
    step = sessions // due
    kinds = ["old"] * sessions
    for i in range(due):
        kinds[i * step] = "due"
    placed = 0
    for i in range(sessions):
        if kinds[i] == "old" and placed < active_flagged and i % 7 == 3:
            kinds[i] = "active"
            placed += 1
    when = {"due": timedelta(minutes=30), "active": timedelta(minutes=1), "old": timedelta(days=3)}
    due_ids = []
    for start in range(0, sessions, BATCH):
        rows = [
            Session(kin=kins[i % len(kins)], title=f"s{i}", last_activity_at=now - when[kinds[i]],
                    introspection_pending=kinds[i] != "old")
            for i in range(start, min(start + BATCH, sessions))
        ]
        created = Session.objects.bulk_create(rows)
        due_ids.extend(s.pk for s, i in zip(created, range(start, sessions), strict=False) if kinds[i] == "due")
    Event.objects.bulk_create([
        Event(session_id=session_id, content="something worth remembering", sender="Maria", token_count=4,
              created_at=now - timedelta(minutes=30))
        for session_id in due_ids
    ])
    return {"sessions": sessions, "due": len(due_ids), "flagged_not_idle": placed,
            "not_flagged": sessions - len(due_ids) - placed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--due", type=int, default=100)
    parser.add_argument("--active-flagged", type=int, default=2_000)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()

    with ThrowawayDatabase("kinsite_bench_idle"):
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection
        from django.test.utils import CaptureQueriesContext
        from django.utils import timezone

        from sessions_app.introspection.services import idle_sessions_due, idle_sessions_flagged

        call_command("migrate", verbosity=0)
        started = time.perf_counter()
        sizes = populate(sessions=args.sessions, due=args.due, active_flagged=args.active_flagged)
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
        print(f"populated {sizes} in {time.perf_counter() - started:.1f} s")

        now = timezone.now()
        cutoff = now - timedelta(minutes=10)
        plan = idle_sessions_flagged(cutoff=cutoff).explain()
        with CaptureQueriesContext(connection) as queries:
            found = idle_sessions_due(now)
        assert len(found) == sizes["due"], (len(found), sizes)
        timings = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            idle_sessions_due(now)
            timings.append((time.perf_counter() - t0) * 1000)

        figures = {
            "database": database_version(connection),
            **sizes,
            "found_due": len(found),
            "queries_per_scan": len(queries),
            "scan": latency_summary(timings),
            "index_used": INDEX in plan,
            "query_plan": plan.splitlines(),
        }
        path = write_results("idle_scan", connection.vendor, figures)
        print(f"{figures['database']}: {sizes['sessions']:,} sessions, {sizes['due']} due, "
              f"{sizes['flagged_not_idle']:,} flagged but active")
        print(f"idle_sessions_due(): found {len(found)} in {len(queries)} queries; "
              f"p50 {figures['scan']['p50_ms']} ms, p95 {figures['scan']['p95_ms']} ms, "
              f"max {figures['scan']['max_ms']} ms over {args.repeat} scans")
        print(f"index {INDEX} used: {figures['index_used']}")
        print("plan of the candidate query:\n  " + "\n  ".join(figures["query_plan"]))
        print(f"wrote {path}")
        if not figures["index_used"]:
            raise SystemExit("the scan's query does not use the partial index")


if __name__ == "__main__":
    main()
