"""Streaming latency: how long after the model sends its first token the API client gets
its first `delta` event, through the Procfile's web process (gunicorn with uvicorn workers)
on PostgreSQL and Redis (the turn-events bus), at 1 and 8 concurrent streams.

The fake OpenAI server runs in a subprocess and streams every answer in word chunks,
`--chunk-ms` apart, after `--delay-ms`. It stamps each chunk with time.monotonic() (one
clock for every process on the machine) and reports the stamp of each answer's first
content chunk on its stdout, keyed by the marker the bench put in the message. The client
stamps the arrival of the first `delta` event the same way. Per level: first token → first
delta, the POST → first token (the turn's work before the model answers) and the whole
stream, p50/p95/p99/max; and every turn is checked in the database (done, reply stored).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/kinsite REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python bench/stream_latency.py [--levels 1,8] [--streams 40]
"""
import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import RESULTS_DIR, ThrowawayDatabase, database_version, latency_summary, write_results  # noqa: E402
from bench.load_chat import Processes, child_env, free_port, parse_levels, procfile, wait_for_web  # noqa: E402

DEFAULT_DATABASE = "kinsite_bench_stream"
MARKER = re.compile(r"\[stream [0-9a-f]{8} \w+ #\d+\]")
# The fake model, in its own process: it answers every chat request by streaming an echo of
# the message, and prints "<marker> <monotonic time of the first content chunk>" per answer.
FAKE_SERVER = r"""
import json, re, sys, threading, time
from http.server import ThreadingHTTPServer
from tests.support.fake_openai import FakeOpenAIServer
ThreadingHTTPServer.request_queue_size = 256
server = FakeOpenAIServer(delay=float(sys.argv[1]), chunk_delay=float(sys.argv[2]))
server.start()
print("port", server.port, flush=True)
marker = re.compile(sys.argv[3])
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
seen, waiting = 0, []
while not stop.wait(0.005):
    new = server.received[seen:]
    seen += len(new)
    waiting.extend(new)
    for request in list(waiting):
        # The role chunk is the first one sent, the first content piece the second.
        if len(request.chunks_sent_at) >= 2:
            waiting.remove(request)
            # The prompt holds the session's earlier messages too: the newest marker is this one's.
            found = marker.findall(json.dumps(request.body))
            if found:
                print("first", found[-1].replace(" ", "_"), repr(request.chunks_sent_at[1]), flush=True)
server.stop()
"""


class FirstTokens:
    """The fake model's report: marker → monotonic time of the first content chunk."""

    def __init__(self, process: subprocess.Popen):
        self.times: dict[str, float] = {}
        self.port = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(process,), daemon=True)
        self._thread.start()

    def _read(self, process) -> None:
        for line in process.stdout:
            parts = line.split()
            if parts[:1] == ["port"]:
                self.port = int(parts[1])
                self._ready.set()
            elif parts[:1] == ["first"]:
                self.times[parts[1].replace("_", " ")] = float(parts[2])
        self._ready.set()

    def wait_ready(self) -> int:
        if not self._ready.wait(30) or self.port is None:
            raise SystemExit("the fake model did not start")
        return self.port


async def one_stream(client: httpx.AsyncClient, *, session_id: int, content: str) -> dict:
    """POST one message as a stream; the monotonic times of the POST, of the first delta and
    of the end, and the turn id from the `done` event."""
    record = {"content": content, "posted": time.monotonic(), "first_delta": None, "ended": None,
              "turn": None, "status": None, "error": ""}
    try:
        async with client.stream("POST", f"/api/v1/sessions/{session_id}/messages/", json={"content": content},
                                 headers={"Accept": "text/event-stream"}) as response:
            record["status"] = response.status_code
            if response.status_code != 200:
                record["error"] = (await response.aread()).decode(errors="replace")[:200]
                return record
            event = None
            async for line in response.aiter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:") and event:
                    if event == "delta" and record["first_delta"] is None:
                        record["first_delta"] = time.monotonic()
                    elif event == "done":
                        record["turn"] = json.loads(line[5:])["turn"]["id"]
                    elif event == "error":
                        record["error"] = line[5:].strip()[:200]
                elif not line:
                    event = None
    except httpx.TransportError as exc:
        record["error"] = type(exc).__name__
    record["ended"] = time.monotonic()
    return record


async def run_level(*, base: str, token: str, label: str, session_ids: list[int], streams: int) -> list[dict]:
    users = len(session_ids)
    records: list[dict] = []
    limits = httpx.Limits(max_connections=users + 4, max_keepalive_connections=users + 4)
    words = " ".join(f"word{index}" for index in range(30))
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {token}"}, limits=limits,
                                 timeout=httpx.Timeout(120.0)) as client:
        counter = iter(range(streams))

        async def user(session_id: int) -> None:
            for number in counter:
                content = f"[stream {label} #{number}] {words}"
                records.append(await one_stream(client, session_id=session_id, content=content))

        await asyncio.gather(*(user(session_id) for session_id in session_ids))
    return records


def level_figures(records: list[dict], first_tokens: FirstTokens, users: int) -> dict:
    # The model's report of a stream's first chunk may trail the client by a few ms.
    deadline = time.monotonic() + 5
    streamed = [MARKER.search(r["content"]).group(0) for r in records if r["first_delta"]]
    while time.monotonic() < deadline and any(marker not in first_tokens.times for marker in streamed):
        time.sleep(0.05)
    token_to_delta, post_to_token, whole = [], [], []
    missing = 0
    for record in records:
        marker = MARKER.search(record["content"]).group(0)
        first_token = first_tokens.times.get(marker)
        if record["first_delta"] is None or first_token is None:
            missing += 1
            continue
        token_to_delta.append((record["first_delta"] - first_token) * 1000)
        post_to_token.append((first_token - record["posted"]) * 1000)
        whole.append((record["ended"] - record["posted"]) * 1000)
    return {
        "concurrent_streams": users,
        "streams": len(records),
        "measured": len(token_to_delta),
        "unmeasured": missing,
        "errors": [r["error"] for r in records if r["error"]][:5],
        "first_token_to_first_delta": latency_summary(token_to_delta) if token_to_delta else None,
        "post_to_first_token": latency_summary(post_to_token) if post_to_token else None,
        "whole_stream": latency_summary(whole) if whole else None,
    }


def stored_check(records: list[dict]) -> dict:
    from sessions_app.models import Turn

    ids = [r["turn"] for r in records if r["turn"]]
    done = Turn.objects.filter(pk__in=ids, status=Turn.Status.DONE, reply__isnull=False).count()
    return {"streams": len(records), "done_event": len(ids), "done_with_reply_stored": done}


def run(args, processes: Processes) -> dict:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from kinsite.services import api_token_issue, team_create

    fake = processes.start("fake-model", [sys.executable, "-c", FAKE_SERVER, str(args.delay_ms / 1000),
                                          str(args.chunk_ms / 1000), MARKER.pattern],
                           dict(os.environ), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    first_tokens = FirstTokens(fake)
    llm_base_url = f"http://127.0.0.1:{first_tokens.wait_ready()}/v1"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = child_env(port=port, llm_base_url=llm_base_url, data_dir=str(processes.logdir / "data"), args=args)
    processes.start_procfile("web", "web", env)
    call_command("migrate", verbosity=0)
    team = team_create(name="Stream bench", slug="stream-bench")
    _, token = api_token_issue(team=team, name="stream bench")
    health = wait_for_web(processes, base)
    headers = {"Authorization": f"Bearer {token}"}
    kin = httpx.post(f"{base}/api/v1/kins/", json={"name": "Stream kin", "role": "Assistant"}, headers=headers,
                     timeout=30).json()

    def new_sessions(count: int) -> list[int]:
        return [httpx.post(f"{base}/api/v1/kins/{kin['id']}/sessions/", json={"title": f"stream {i}"},
                           headers=headers, timeout=30).json()["id"] for i in range(count)]

    run_id = uuid.uuid4().hex[:8]
    # Warm-up (not measured): every web worker loads the token encoding and opens its connections.
    warm = max(args.levels) * 2
    asyncio.run(run_level(base=base, token=token, label=f"{run_id} warmup",
                          session_ids=new_sessions(max(args.levels)), streams=warm))
    levels = []
    for users in args.levels:
        records = asyncio.run(run_level(base=base, token=token, label=f"{run_id} c{users}",
                                        session_ids=new_sessions(users), streams=args.streams))
        figures = level_figures(records, first_tokens, users)
        figures["stored"] = stored_check(records)
        levels.append(figures)
        print(row(figures), flush=True)
        processes.check_alive()
    return {
        "database": database_version(connection),
        "settings": {
            "levels": args.levels, "streams_per_level": args.streams, "model_delay_ms": args.delay_ms,
            "chunk_ms": args.chunk_ms, "reply_words": 30, "web_workers": args.web_workers,
            "web_command": procfile()["web"], "healthz": health,
        },
        "levels": levels,
    }


HEADER = (f"{'streams':>7} {'n':>4}  {'token→delta p50':>15} {'p95':>7} {'p99':>7} {'max':>7}  "
          f"{'post→token p50':>14} {'whole p50':>9}  stored")


def row(level: dict) -> str:
    delta = level["first_token_to_first_delta"] or {}
    token = level["post_to_first_token"] or {}
    whole = level["whole_stream"] or {}

    def ms(summary, key, width=7):
        return f"{summary[key]:{width}.1f}" if key in summary else f"{'-':>{width}}"

    stored = level["stored"]
    return (f"{level['concurrent_streams']:>7} {level['measured']:>4}  {ms(delta, 'p50_ms', 15)} "
            f"{ms(delta, 'p95_ms')} {ms(delta, 'p99_ms')} {ms(delta, 'max_ms')}  {ms(token, 'p50_ms', 14)} "
            f"{ms(whole, 'p50_ms', 9)}  {stored['done_with_reply_stored']}/{stored['streams']}"
            + (f"  errors: {level['errors']}" if level["errors"] else ""))


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=parse_levels, default=[1, 8], help="concurrent streams (default 1,8)")
    parser.add_argument("--streams", type=int, default=40, help="streams per level (default 40)")
    parser.add_argument("--delay-ms", type=float, default=200.0, help="the fake model's delay before answering")
    parser.add_argument("--chunk-ms", type=float, default=20.0, help="the fake model's time between chunks")
    parser.add_argument("--web-workers", type=int, default=int(os.environ.get("WEB_CONCURRENCY") or 2),
                        help="gunicorn (uvicorn) worker processes (default WEB_CONCURRENCY or 2)")
    parser.add_argument("--database", default=DEFAULT_DATABASE, help="the throwaway database's name")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="where the JSON goes")
    args = parser.parse_args(argv)
    args.threads, args.worker_concurrency = 4, 1  # child_env's other knobs (no Celery worker runs here)
    if not os.environ.get("DATABASE_URL", "").startswith(("postgres", "pgsql")) or \
            not os.environ.get("REDIS_URL", "").startswith("redis"):
        raise SystemExit("bench/stream_latency.py needs DATABASE_URL (PostgreSQL) and REDIS_URL (Redis) set.")
    signal.signal(signal.SIGTERM, _interrupt)
    print(HEADER, flush=True)
    try:
        with ThrowawayDatabase(args.database), Processes() as processes:
            try:
                figures = run(args, processes)
            except Exception:
                if tail := processes.log("web")[-2000:]:
                    print(f"--- web log (last lines) ---\n{tail}", file=sys.stderr)
                raise
    except KeyboardInterrupt:
        print("interrupted: the processes are stopped and the database is dropped", file=sys.stderr)
        return 130
    print(f"wrote {write_results('stream_latency', 'postgresql', figures, out_dir=args.out)}")
    unstored = sum(level["stored"]["streams"] - level["stored"]["done_with_reply_stored"]
                   for level in figures["levels"])
    if unstored:
        print(f"FAILED: {unstored} streamed turns without a stored reply", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
