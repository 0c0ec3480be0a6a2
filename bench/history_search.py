"""History-search benchmark on LoCoMo: imports five long conversations through the
API, asks every QA question through GET /sessions/{id}/history/search/, and
reports evidence recall@5/10/20 and search latency. See bench/README.md.

    python bench/history_search.py                     # SQLite (a temp file)
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/kinsite python bench/history_search.py
    python bench/history_search.py --filler 9450       # ~10,000 messages per session

With DATABASE_URL it creates and drops a throwaway database (`kinsite_bench`, or
--database) on that server; nothing is written to the configured databases."""
import argparse
import json
import os
import platform
import random
import re
import statistics
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    ROOT,
    MachineWatch,
    ThrowawayDatabase,
    database_version,
    machine_state_line,
    percentile,
)
from bench.synthetic import PEOPLE, message_text  # noqa: E402

BENCH_DATABASE = "kinsite_bench"
KS = (5, 10, 20)
SEARCH_LIMIT = max(KS)
# Imported turns of one LoCoMo session start at its date_time and are this far apart.
TURN_SPACING = timedelta(seconds=15)
IMPORT_BATCH = 1000
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
# Evidence ids look like "D3:5"; a few strings are malformed ("D8:6; D9:17",
# "D:11:26", "D"), so every id-shaped run in a string counts and the rest is dropped.
EVIDENCE_ID = re.compile(r"D\s*:?\s*(\d+)\s*:\s*(\d+)")
SESSION_KEY = re.compile(r"session_(\d+)")
# Filler (--filler): synthetic messages dated from this long before a conversation's
# first LoCoMo session to the end of its last one, never inside a LoCoMo session, so
# every LoCoMo turn keeps its LoCoMo neighbours.
FILLER_LEAD = timedelta(days=60)
FILLER_WORDS = (5, 40)


# --- LoCoMo -----------------------------------------------------------------------


def load_conversations(data_dir: Path) -> list[tuple[str, dict]]:
    files = sorted(data_dir.glob("*.json"), key=lambda path: path.stem)
    if not files:
        raise SystemExit(f"no LoCoMo conversations (*.json) in {data_dir}")
    return [(path.stem, json.loads(path.read_text())) for path in files]


def parse_session_time(text: str) -> datetime:
    """'1:56 pm on 8 May, 2023' -> an aware datetime (UTC)."""
    return datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)


def conversation_turns(conversation: dict) -> list[dict]:
    """Every turn as an import item, sessions in order, each session starting at its date_time."""
    numbers = sorted(
        int(match.group(1))
        for key in conversation
        if (match := SESSION_KEY.fullmatch(key)) and conversation[key]
    )
    items = []
    for number in numbers:
        start = parse_session_time(conversation[f"session_{number}_date_time"])
        for position, turn in enumerate(conversation[f"session_{number}"]):
            content = turn["text"]
            if turn.get("blip_caption"):
                content = f"{content} [shares a photo: {turn['blip_caption']}]"
            items.append(
                {
                    "content": content,
                    "sender": turn["speaker"],
                    "created_at": (start + position * TURN_SPACING).isoformat(),
                    "external_id": turn["dia_id"],
                }
            )
    return items


def filler_turns(turns: list[dict], count: int, rng: random.Random) -> list[dict]:
    """`count` synthetic import items for a conversation whose LoCoMo items are `turns`:
    text of bench/synthetic.py; half the senders are the conversation's two speakers,
    half other names; no external_id, so a filler message is never evidence."""
    speakers = sorted({turn["sender"] for turn in turns})
    others = [name for name in PEOPLE if name not in speakers]
    times = [datetime.fromisoformat(turn["created_at"]) for turn in turns]
    # A LoCoMo session is a run of turns TURN_SPACING apart; filler stays out of each run.
    windows, start = [], times[0]
    for previous, current in pairwise(times):
        if current - previous != TURN_SPACING:
            windows.append((start, previous))
            start = current
    windows.append((start, times[-1]))
    first, span = times[0] - FILLER_LEAD, (times[-1] - times[0] + FILLER_LEAD).total_seconds()
    items = []
    while len(items) < count:
        moment = first + timedelta(seconds=rng.uniform(0, span))
        if any(low <= moment <= high for low, high in windows):
            continue
        sender = rng.choice(speakers) if rng.random() < 0.5 else rng.choice(others)
        items.append({"content": message_text(rng, min_words=FILLER_WORDS[0], max_words=FILLER_WORDS[1]),
                      "sender": sender, "created_at": moment.isoformat()})
    return sorted(items, key=lambda item: item["created_at"])


def evidence_ids(raw: list[str]) -> list[str]:
    ids = []
    for text in raw:
        for session, turn in EVIDENCE_ID.findall(text):
            dia_id = f"D{int(session)}:{int(turn)}"
            if dia_id not in ids:
                ids.append(dia_id)
    return ids


# --- figures ------------------------------------------------------------------------


def recall_summary(rows: list[dict]) -> dict:
    return {
        "questions": len(rows),
        **{f"recall@{k}": round(statistics.fmean(row[f"recall@{k}"] for row in rows), 4) for k in KS},
    }


# --- the run ------------------------------------------------------------------------


class Api:
    """The Django test client with a bearer token: the real views, serializers and database."""

    def __init__(self, raw_token: str):
        from django.test import Client

        self.client = Client(HTTP_AUTHORIZATION=f"Bearer {raw_token}")

    def post(self, path: str, body) -> dict:
        response = self.client.post(f"/api/v1/{path}", data=json.dumps(body), content_type="application/json")
        if response.status_code != 201:
            raise SystemExit(f"POST {path} answered {response.status_code}: {response.content[:500]!r}")
        return response.json()

    def get(self, path: str, params: dict):
        return self.client.get(f"/api/v1/{path}", params)


def run(data_dir: Path, filler: int = 0, seed: int = 7) -> dict:
    from django.core.management import call_command
    from django.db import connection

    from kinsite.services import api_token_issue, team_create

    call_command("migrate", verbosity=0)
    team = team_create(name="LoCoMo bench", slug="locomo-bench")
    _, raw_token = api_token_issue(team=team, name="bench")
    api = Api(raw_token)

    conversations = load_conversations(data_dir)
    kin = api.post("kins/", {"name": "LoCoMo reader"})
    rng = random.Random(seed)
    imported, session_sizes = 0, []
    import_started = time.perf_counter()
    sessions = {}
    for conversation_id, conversation in conversations:
        session = api.post(f"kins/{kin['id']}/sessions/", {"title": f"LoCoMo {conversation_id}"})
        turns = conversation_turns(conversation)
        # Filler goes through the same import API as the turns (about 2 s per 10,000 messages).
        items = turns + filler_turns(turns, filler, rng)
        for start in range(0, len(items), IMPORT_BATCH):
            batch = items[start : start + IMPORT_BATCH]
            result = api.post(f"sessions/{session['id']}/messages/import/", {"messages": batch})
            assert result == {"created": len(batch), "skipped": 0}, result
        imported += len(items)
        session_sizes.append(len(items))
        sessions[conversation_id] = (session["id"], {turn["external_id"] for turn in turns})
    import_seconds = time.perf_counter() - import_started
    if filler:
        # What autovacuum does within a minute of a bulk load this size: without planner
        # statistics and a visibility map, the first searches over 50,000 fresh rows
        # measured about half again slower. The default run (2,760 rows) is measured as before.
        # The search postings (migration 0018, ~15 rows per message) are vacuumed too, as
        # autovacuum would after so many inserts.
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE sessions_app_event, sessions_app_searchposting"
                           if connection.vendor == "postgresql" else "ANALYZE")

    # Warm-up: the first requests pay for connections and caches. Not a QA question.
    for session_id, _ in sessions.values():
        api.get(f"sessions/{session_id}/history/search/", {"q": "hello", "limit": SEARCH_LIMIT})

    rows, latencies_ms = [], []
    dropped_evidence, skipped_questions, failed_searches = [], 0, []
    with MachineWatch() as machine:
        for conversation_id, conversation in conversations:
            session_id, dia_ids = sessions[conversation_id]
            for qa in conversation["qa"]:
                evidence = evidence_ids(qa.get("evidence") or [])
                dropped_evidence += [f"{conversation_id}/{dia_id}" for dia_id in evidence if dia_id not in dia_ids]
                evidence = [dia_id for dia_id in evidence if dia_id in dia_ids]
                if not evidence:
                    skipped_questions += 1
                    continue
                params = {"q": qa["question"], "limit": SEARCH_LIMIT}
                started = time.perf_counter()
                response = api.get(f"sessions/{session_id}/history/search/", params)
                latencies_ms.append((time.perf_counter() - started) * 1000)
                if response.status_code != 200:
                    failed_searches.append({"question": qa["question"], "status": response.status_code})
                    found = []
                else:
                    found = [hit["external_id"] for hit in response.json()["results"]]
                row = {"category": qa.get("category")}
                for k in KS:
                    row[f"recall@{k}"] = len(set(evidence) & set(found[:k])) / len(evidence)
                rows.append(row)

    by_category = defaultdict(list)
    for row in rows:
        by_category[row["category"]].append(row)
    return {
        "benchmark": "history_search",
        "date": datetime.now(UTC).date().isoformat(),
        "vendor": connection.vendor,
        "database_version": database_version(connection),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "data": str(data_dir),
        "conversations": len(conversations),
        "messages": imported,
        "filler_per_session": filler,
        "filler_seed": seed,
        "messages_per_session": {"min": min(session_sizes), "max": max(session_sizes)},
        "import_seconds": round(import_seconds, 2),
        "analyzed_after_import": bool(filler),
        "search_limit": SEARCH_LIMIT,
        "skipped_questions_without_evidence": skipped_questions,
        "dropped_unknown_evidence_ids": dropped_evidence,
        "failed_searches": failed_searches,
        "overall": recall_summary(rows),
        "by_category": {
            CATEGORIES.get(category, str(category)): recall_summary(category_rows)
            for category, category_rows in sorted(by_category.items(), key=lambda item: str(item[0]))
        },
        "latency_ms": {
            "p50": round(percentile(latencies_ms, 0.50), 2),
            "p95": round(percentile(latencies_ms, 0.95), 2),
            "max": round(max(latencies_ms), 2),
            "searches": len(latencies_ms),
        },
        "machine_state": machine.figures,
    }


def print_table(figures: dict) -> None:
    sizes = figures["messages_per_session"]
    print(
        f"history search on LoCoMo ({figures['conversations']} conversations, {figures['messages']} messages, "
        f"{figures['filler_per_session']} filler and {sizes['min']}-{sizes['max']} messages per session) "
        f"— {figures['database_version']}"
    )
    header = f"{'category':<12} {'questions':>9} " + " ".join(f"{f'R@{k}':>6}" for k in KS)
    print(header)
    print("-" * len(header))
    for name, summary in [*figures["by_category"].items(), ("overall", figures["overall"])]:
        recalls = " ".join(f"{summary[f'recall@{k}']:>6.3f}" for k in KS)
        print(f"{name:<12} {summary['questions']:>9} {recalls}")
    latency = figures["latency_ms"]
    print(
        f"search latency over {latency['searches']} API calls: p50 {latency['p50']:.1f} ms, "
        f"p95 {latency['p95']:.1f} ms (max {latency['max']:.1f} ms); import {figures['import_seconds']:.1f} s"
    )
    print(machine_state_line(figures["machine_state"]))
    if figures["failed_searches"]:
        print(f"FAILED searches: {len(figures['failed_searches'])}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data", type=Path, default=ROOT.parent / "shared" / "bench-data" / "locomo-dev", help="LoCoMo directory"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="where the JSON goes")
    parser.add_argument("--filler", type=int, default=0,
                        help="synthetic messages added to each session (9450: ~10,000 per session)")
    parser.add_argument("--seed", type=int, default=7, help="seed of the filler")
    parser.add_argument("--database", default=BENCH_DATABASE,
                        help="name of the throwaway PostgreSQL database (dropped at the end)")
    args = parser.parse_args(argv)
    data_dir = args.data.resolve()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kinsite.settings")
    with ThrowawayDatabase(args.database):
        import django

        django.setup()
        figures = run(data_dir, filler=args.filler, seed=args.seed)

    print_table(figures)
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = f"-filler{args.filler}" if args.filler else ""
    path = args.out / f"history_search-{figures['vendor']}{suffix}.json"
    path.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"wrote {path}")
    return 1 if figures["failed_searches"] else 0


if __name__ == "__main__":
    sys.exit(main())
