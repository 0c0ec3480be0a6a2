"""Chat load test: POST /sessions/{id}/messages/ through the Procfile's gunicorn (several
workers) on PostgreSQL and Redis, the model being the fake OpenAI server with a fixed
delay. Closed-loop virtual users at rising concurrency; per level the throughput,
p50/p95/p99/max latency and errors, then every message sent is looked up in the
database: lost (sent but not stored, or answered 2xx without a stored reply) must be 0.
See bench/README.md.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/kinsite REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python bench/load_chat.py [--mode sync|async|both] [--levels 1,2,4,8,16,32]
"""
import argparse
import asyncio
import math
import os
import random
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import RESULTS_DIR, ROOT, ThrowawayDatabase, latency_summary, write_results  # noqa: E402

DEFAULT_DATABASE = "kinsite_bench_load"
STARTUP_SECONDS = 60
# The longest a request (or an async turn, until done) may take before it counts as an error.
REQUEST_TIMEOUT_SECONDS = 120.0
# A few words after each message's unique marker, so the prompt is not just the marker.
PHRASES = (
    "how is the report coming along?",
    "can you remind me what we decided about the launch date?",
    "please summarise the last meeting in two sentences.",
    "what should I tell the client about the delay?",
    "thanks, that helps a lot.",
)
# The fake model answers from a subprocess: the load generator keeps its process to itself.
FAKE_SERVER = """
import collections, sys
from http.server import ThreadingHTTPServer
from tests.support.fake_openai import FakeOpenAIServer
ThreadingHTTPServer.request_queue_size = 256  # socketserver's default backlog of 5 drops bursts of connects
server = FakeOpenAIServer(delay=float(sys.argv[1]))
server.received = collections.deque(maxlen=100)  # it keeps every request otherwise
server.start()
print(server.port, flush=True)
sys.stdin.read()  # until the bench closes our stdin (or stops us)
server.stop()
"""


# --- the processes under test --------------------------------------------------------------


def procfile() -> dict[str, str]:
    entries = {}
    for line in (ROOT / "Procfile").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, command = line.split(":", 1)
            entries[name.strip()] = command.strip()
    return entries


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Processes:
    """The subprocesses of one run, each leading its own process group: stopping one
    reaches gunicorn's and Celery's children, and Ctrl-C in the terminal reaches only the
    bench, which then stops them all. Logs go to a temp directory, kept after a failure."""

    def __init__(self):
        self.logdir = Path(tempfile.mkdtemp(prefix="kinsite-load-"))
        self.running: dict[str, subprocess.Popen] = {}

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        # SIGTERM to all first, so their graceful shutdowns overlap.
        for process in self.running.values():
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for name in list(self.running):
            self.stop(name)
        if exc_type is None:
            shutil.rmtree(self.logdir, ignore_errors=True)
        else:
            print(f"the processes' logs are in {self.logdir}", file=sys.stderr)

    def start(self, name: str, argv: list[str], env: dict, **popen) -> subprocess.Popen:
        with (self.logdir / f"{name}.log").open("wb") as log:
            popen.setdefault("stdout", log)
            process = subprocess.Popen(argv, cwd=ROOT, env=env, stderr=log, start_new_session=True, **popen)
        self.running[name] = process
        return process

    def start_procfile(self, name: str, entry: str, env: dict) -> subprocess.Popen:
        return self.start(name, ["sh", "-c", f"exec {procfile()[entry]}"], env)

    def stop(self, name: str) -> None:
        process = self.running.pop(name)
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=5)
            except ProcessLookupError:
                pass
        if process.stdin:
            process.stdin.close()
        if process.stdout:
            process.stdout.close()

    def log(self, name: str) -> str:
        path = self.logdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def check_alive(self) -> None:
        for name, process in self.running.items():
            if process.poll() is not None:
                raise SystemExit(f"{name} exited with {process.returncode}:\n{self.log(name)[-3000:]}")


def child_env(*, port: int, llm_base_url: str, data_dir: str, args) -> dict:
    """The environment of every process under test: the deployment's settings, with the
    model faked, per-token rate limits off (one token drives all the load) and
    introspection off (no background job competes with the turns, and none is left
    queued when there is no Celery worker)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLM_", "API_RATE_", "PYTEST_"))}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        DJANGO_SETTINGS_MODULE="kinsite.settings",
        CELERY_TASK_ALWAYS_EAGER="false",
        DEBUG="false",
        KINSITE_DATA_DIR=data_dir,
        LLM_BASE_URL=llm_base_url,
        LLM_API_KEY="load-test",
        LLM_MODEL="fake-model",
        LLM_MAX_RETRIES="0",  # a model error shows as a 502, not as a slow retry
        LLM_TIMEOUT_SECONDS="60",
        API_RATE_CHAT="",
        INTROSPECTION_ENABLED="false",
        PORT=str(port),
        WEB_CONCURRENCY=str(args.web_workers),
        GUNICORN_THREADS=str(args.threads),
        WORKER_CONCURRENCY=str(args.worker_concurrency),
        LOG_LEVEL=os.environ.get("LOG_LEVEL", "INFO"),
    )
    return env


def start_fake_model(processes: Processes, delay_ms: float) -> str:
    fake = processes.start("fake-model", [sys.executable, "-c", FAKE_SERVER, str(delay_ms / 1000)],
                           dict(os.environ), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = fake.stdout.readline().strip()
    if not line.isdigit():
        processes.check_alive()
        raise SystemExit(f"the fake model did not start: {line!r}")
    return f"http://127.0.0.1:{line}/v1"


def wait_for_web(processes: Processes, base: str) -> dict:
    deadline = time.monotonic() + STARTUP_SECONDS
    while True:
        processes.check_alive()
        try:
            response = httpx.get(f"{base}/healthz", timeout=2)
            if response.status_code == 200:
                return response.json()
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(
                f"gunicorn did not answer /healthz in {STARTUP_SECONDS} s:\n{processes.log('web')[-3000:]}"
            )
        time.sleep(0.2)


def celery_nodes(redis_url: str) -> list[str]:
    """The node names of the Celery workers that consume from this Redis db."""
    from celery import Celery

    probe = Celery("load-probe", broker=redis_url, set_as_current=False)
    try:
        return sorted(name for reply in probe.control.ping(timeout=1.0) or [] for name in reply)
    finally:
        probe.close()


def wait_for_celery_workers(processes: Processes, redis_url: str, names: set[str]) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while not names <= set(celery_nodes(redis_url)):
        processes.check_alive()
        if time.monotonic() > deadline:
            raise SystemExit(f"Celery workers {sorted(names)} did not answer a ping in {STARTUP_SECONDS} s")
        time.sleep(0.5)


class CpuMeter:
    """CPU seconds (user + system) spent by each part of the system under test, read from
    /proc, so a level's cost per request can be told apart from the machine's other load:
    the web processes and the Celery workers (their process groups), the fake model, the
    PostgreSQL backends serving our database (when the server is on this machine; a backend
    that closed during the level takes its time with it), and the load generator itself."""

    TICKS = os.sysconf("SC_CLK_TCK")

    def __init__(self, processes: Processes, database_is_local: bool):
        self.processes = processes
        self.database_is_local = database_is_local

    def snapshot(self) -> dict[str, dict[int, float]]:
        groups = {name: process.pid for name, process in self.processes.running.items()}
        parts: dict[str, dict[int, float]] = {"web": {}, "celery": {}, "fake_model": {}, "database": {}}
        backends = self._backend_pids() if self.database_is_local else set()
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                pid = int(stat.parent.name)
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
            seconds = (int(fields[11]) + int(fields[12])) / self.TICKS  # utime, stime
            group = int(fields[2])
            if pid in backends:
                parts["database"][pid] = seconds
            elif group == groups.get("web"):
                parts["web"][pid] = seconds
            elif group == groups.get("fake-model"):
                parts["fake_model"][pid] = seconds
            elif any(group == pgid for name, pgid in groups.items() if name.startswith("worker")):
                parts["celery"][pid] = seconds
        usage = resource.getrusage(resource.RUSAGE_SELF)
        parts["load_generator"] = {os.getpid(): usage.ru_utime + usage.ru_stime}
        return parts

    @staticmethod
    def _backend_pids() -> set[int]:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                           "AND pid <> pg_backend_pid()")
            return {pid for (pid,) in cursor.fetchall()}

    @staticmethod
    def per_request_ms(before: dict, after: dict, requests: int) -> dict[str, float] | None:
        if not requests:
            return None
        spent = {part: sum(seconds - before[part].get(pid, 0.0) for pid, seconds in after[part].items())
                 for part in after}
        figures = {part: round(seconds * 1000 / requests, 1) for part, seconds in spent.items()}
        figures["server"] = round(sum(figures[part] for part in ("web", "celery", "database")), 1)
        return figures


# --- the load ------------------------------------------------------------------------------


@dataclass
class Sent:
    """One chat message the load generator sent and what came back."""

    content: str  # unique: "[load <run> <mode> c<users> u<user> #<n>] ..."
    session_id: int
    status: int | None = None  # the POST's HTTP status; None: no answer
    error: str = ""  # the transport error's class name, when there was no answer
    reached_server: bool = True  # False when the connection could not even be opened
    latency_ms: float = 0.0  # sync: the POST; async: from the POST until the poll saw the turn finished
    accept_ms: float | None = None  # async: the POST's 202 alone
    turn_id: int | None = None
    reply_id: int | None = None
    turn_status: str = ""  # done, failed; async also "unfinished" when polling gave up
    polls: int = 0  # async: GET /turns/{id}/ requests made
    stored_claim: bool | None = None  # an error answer's details.stored (e.g. a 503 says whether it kept the message)


class Budget:
    """When a level's virtual users stop: after `duration` seconds, or after `requests`
    messages in all (the users are coroutines of one loop, so no lock is needed)."""

    def __init__(self, *, duration: float | None, requests: int | None):
        self.deadline = time.monotonic() + duration if duration else None
        self.remaining = requests

    def take(self) -> bool:
        if self.remaining is not None:
            if self.remaining <= 0:
                return False
            self.remaining -= 1
            return True
        return time.monotonic() < self.deadline


async def post_sync(client: httpx.AsyncClient, record: Sent, body: dict) -> None:
    started = time.perf_counter()
    try:
        response = await client.post(f"/api/v1/sessions/{record.session_id}/messages/", json=body)
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        record.error, record.reached_server = type(exc).__name__, False
    except httpx.TransportError as exc:
        record.error = type(exc).__name__
    else:
        record.status = response.status_code
        if response.status_code == 201:
            data = response.json()
            record.turn_id, record.turn_status = data["turn"]["id"], data["turn"]["status"]
            record.reply_id = (data.get("reply") or {}).get("id")
        else:
            record.stored_claim = stored_claim(response)
    record.latency_ms = (time.perf_counter() - started) * 1000


def stored_claim(response: httpx.Response) -> bool | None:
    """What an error answer says about the message: SPEC §11's `details.stored`, if given."""
    try:
        stored = response.json()["error"]["details"]["stored"]
    except (ValueError, KeyError, TypeError):
        return None
    return stored if isinstance(stored, bool) else None


async def post_async(client: httpx.AsyncClient, record: Sent, body: dict, poll_seconds: float) -> None:
    started = time.perf_counter()
    try:
        response = await client.post(f"/api/v1/sessions/{record.session_id}/messages/?async=1", json=body)
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        record.error, record.reached_server = type(exc).__name__, False
        record.latency_ms = (time.perf_counter() - started) * 1000
        return
    except httpx.TransportError as exc:
        record.error = type(exc).__name__
        record.latency_ms = (time.perf_counter() - started) * 1000
        return
    record.status = response.status_code
    record.accept_ms = (time.perf_counter() - started) * 1000
    if response.status_code != 202:
        record.latency_ms = record.accept_ms
        record.stored_claim = stored_claim(response)
        return
    record.turn_id = response.json()["turn"]["id"]
    record.turn_status = "unfinished"
    while time.perf_counter() - started < REQUEST_TIMEOUT_SECONDS:
        await asyncio.sleep(poll_seconds)
        record.polls += 1
        try:
            turn = (await client.get(f"/api/v1/turns/{record.turn_id}/")).json()
        except (httpx.TransportError, ValueError):
            continue  # counted by the database check if the turn never finishes
        if turn["status"] in ("done", "failed"):
            record.turn_status = turn["status"]
            record.reply_id = (turn.get("reply") or {}).get("id")
            break
    record.latency_ms = (time.perf_counter() - started) * 1000


async def virtual_user(client, *, mode, label, user, session_id, budget, records, poll_seconds):
    number = 0
    rng = random.Random(f"{label}-{user}")
    while budget.take():
        number += 1
        record = Sent(content=f"[{label} u{user} #{number}] {rng.choice(PHRASES)}", session_id=session_id)
        records.append(record)
        body = {"content": record.content, "sender": f"user {user}", "platform": "api"}
        if mode == "sync":
            await post_sync(client, record, body)
        else:
            await post_async(client, record, body, poll_seconds)


async def run_level(*, base, token, mode, label, session_ids, users, budget, poll_seconds) -> tuple[list[Sent], float]:
    records: list[Sent] = []
    limits = httpx.Limits(max_connections=users, max_keepalive_connections=users)
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {token}"}, limits=limits,
                                 timeout=REQUEST_TIMEOUT_SECONDS) as client:
        started = time.perf_counter()
        await asyncio.gather(*(
            virtual_user(client, mode=mode, label=label, user=user, session_id=session_ids[user % len(session_ids)],
                         budget=budget, records=records, poll_seconds=poll_seconds)
            for user in range(users)
        ))
        elapsed = time.perf_counter() - started
    return records, elapsed


# --- the check: every message in the database ----------------------------------------------


def stored_check(records: list[Sent], session_ids: list[int]) -> dict:
    """Looks every message sent up in the database by its unique content.

    A message must be stored exactly once when the server took it: answered 2xx, answered
    5xx (the turn failed, the message stays; SPEC §13), or no answer after the request went
    out (the client cannot tell, so the server must have kept it). A 4xx refused it before
    storing anything. An error answer that says `details.stored` is held to its word (a 503
    while Redis is down keeps an async message but not a sync one). A 2xx turn must end
    with its reply stored (sync: the reply the response named); an async turn that is still
    pending or running after the level's polling is lost work. A failed turn is an error,
    not a loss: its message is stored and the turn says why."""
    from sessions_app.models import Event, Turn

    stored = Counter(
        Event.objects.filter(session_id__in=session_ids, role=Event.Role.USER).values_list("content", flat=True)
    )
    turns = {
        content: (status, reply_id)
        for content, status, reply_id in Turn.objects.filter(session_id__in=session_ids)
        .values_list("user_message__content", "status", "reply_id")
    }
    reply_ids = {r.reply_id for r in records if r.reply_id}
    replies = set(Event.objects.filter(pk__in=reply_ids, session_id__in=session_ids, role=Event.Role.ASSISTANT)
                  .values_list("pk", flat=True))
    check = Counter(missing_messages=0, duplicated_messages=0, missing_replies=0, unfinished_turns=0,
                    stored_after_refusal=0)
    for record in records:
        count = stored[record.content]
        if record.stored_claim is not None:
            taken = record.stored_claim
        elif record.status is None:
            taken = record.reached_server
        else:
            taken = 200 <= record.status < 300 or record.status >= 500
        if taken and count == 0:
            check["missing_messages"] += 1
        if count > 1:
            check["duplicated_messages"] += count - 1
        if record.status is not None and not taken and count:
            check["stored_after_refusal"] += 1  # the answer said it was not kept, yet it was
        if record.status is not None and 200 <= record.status < 300 and count:
            status, reply_id = turns.get(record.content, (None, None))
            if status in ("pending", "running"):
                check["unfinished_turns"] += 1
            elif status == "done" and (reply_id is None or reply_id != record.reply_id or reply_id not in replies):
                check["missing_replies"] += 1
    check["lost"] = check["missing_messages"] + check["missing_replies"] + check["unfinished_turns"]
    return dict(check)


def level_figures(*, mode, users, session_ids, records, elapsed, check, load_before, cpu) -> dict:
    ok = [r for r in records if r.status is not None and 200 <= r.status < 300 and r.turn_status != "failed"
          and r.turn_status != "unfinished"]
    errors = Counter()
    for record in records:
        if record.error:
            errors[record.error] += 1
        elif record.status is not None and not 200 <= record.status < 300:
            errors[str(record.status)] += 1
        elif record.turn_status in ("failed", "unfinished"):
            errors[f"turn {record.turn_status}"] += 1
    figures = {
        "mode": mode,
        "users": users,
        "sessions": len(session_ids),
        "users_per_session": math.ceil(users / len(session_ids)),
        "seconds": round(elapsed, 2),
        "requests": len(records),
        "ok": len(ok),
        "throughput_rps": round(len(ok) / elapsed, 2) if elapsed else 0.0,
        "latency_ms": latency_summary([r.latency_ms for r in ok]) if ok else None,
        "errors": dict(sorted(errors.items())),
        "server_errors": sum(1 for r in records if r.status is not None and r.status >= 500),
        **check,
        "load_average_1min": {"before": load_before, "after": round(os.getloadavg()[0], 2)},
        "cpu_ms_per_ok_request": cpu,
    }
    if mode == "async":
        accepted = [r.accept_ms for r in records if r.status == 202]
        figures["accept_latency_ms"] = latency_summary(accepted) if accepted else None
        figures["polls"] = sum(r.polls for r in records)
    return figures


# --- the run -------------------------------------------------------------------------------


class Api:
    """Setup calls through gunicorn, as a client would make them."""

    def __init__(self, base: str, token: str):
        self.client = httpx.Client(base_url=f"{base}/api/v1/", headers={"Authorization": f"Bearer {token}"},
                                   timeout=30)

    def post(self, path: str, body: dict) -> dict:
        response = self.client.post(path, json=body)
        if response.status_code != 201:
            raise SystemExit(f"POST {path} answered {response.status_code}: {response.text[:500]}")
        return response.json()


def plan(args) -> list[tuple[str, int, int]]:
    """(mode, users, users per session) for every level, in order."""
    modes = ["sync", "async"] if args.mode == "both" else [args.mode]
    levels = []
    for mode in modes:
        levels += [(mode, users, 1) for users in args.levels]
        if args.shared_users:
            levels.append((mode, args.shared_users, args.users_per_session))
    return levels


def run(args, processes: Processes) -> dict:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from bench.common import database_version
    from kinsite.services import api_token_issue, team_create

    redis_url = os.environ["REDIS_URL"]
    # Another worker on this db would take our async turns and look them up in its own database.
    if args.mode != "sync" and (others := celery_nodes(redis_url)):
        raise SystemExit(f"Celery workers already consume from {redis_url}: {', '.join(others)}. "
                         "Use a Redis db of its own (REDIS_URL=redis://host:6379/N).")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    llm_base_url = start_fake_model(processes, args.delay_ms)
    env = child_env(port=port, llm_base_url=llm_base_url, data_dir=str(processes.logdir / "data"), args=args)
    # The processes boot while the database is migrated: neither touches the tables before a request.
    processes.start_procfile("web", "web", env)
    worker_names = set()
    if args.mode != "sync":
        for number in range(1, args.celery_workers + 1):
            worker = processes.start_procfile(f"worker{number}", "worker", env)
            # The Procfile names each worker after its process id (one machine, several workers).
            worker_names.add(f"worker-{worker.pid}@{socket.gethostname()}")
    call_command("migrate", verbosity=0)
    team = team_create(name="Load test", slug="load-test")
    _, token = api_token_issue(team=team, name="load test")
    health = wait_for_web(processes, base)
    if args.mode != "sync":
        wait_for_celery_workers(processes, redis_url, worker_names)

    api = Api(base, token)
    kin = api.post("kins/", {"name": "Load test kin", "role": "Assistant"})

    def new_sessions(count: int, title: str) -> list[int]:
        return [api.post(f"kins/{kin['id']}/sessions/", {"title": f"{title} {i}"})["id"] for i in range(count)]

    run_id = uuid.uuid4().hex[:8]
    # Warm-up (not measured): a message per gunicorn thread, so that every thread has opened
    # its database connection and every process (Celery's too) has loaded the token encoding.
    for mode in ["sync", "async"] if args.mode == "both" else [args.mode]:
        users = args.web_workers * args.threads
        asyncio.run(run_level(base=base, token=token, mode=mode, label=f"warm-up {run_id}",
                              session_ids=new_sessions(users, "warm-up"), users=users,
                              budget=Budget(duration=None, requests=users), poll_seconds=args.poll_ms / 1000))

    booted = len(re.findall(r"Booting worker with pid", processes.log("web")))
    database_host = connection.settings_dict["HOST"] or "localhost"
    meter = CpuMeter(processes, database_is_local=database_host in ("localhost", "127.0.0.1", "::1")
                     or database_host.startswith("/"))
    load_start = round(os.getloadavg()[0], 2)
    levels = []
    for mode, users, per_session in plan(args):
        session_ids = new_sessions(math.ceil(users / per_session), f"{mode} c{users}")
        label = f"load {run_id} {mode} c{users}" + (f"/{per_session}" if per_session > 1 else "")
        load_before = round(os.getloadavg()[0], 2)
        budget = Budget(duration=args.duration if not args.requests_per_level else None,
                        requests=args.requests_per_level or None)
        cpu_before = meter.snapshot()
        records, elapsed = asyncio.run(run_level(base=base, token=token, mode=mode, label=label,
                                                 session_ids=session_ids, users=users, budget=budget,
                                                 poll_seconds=args.poll_ms / 1000))
        cpu = meter.per_request_ms(cpu_before, meter.snapshot(), sum(1 for r in records if r.status in (201, 202)))
        processes.check_alive()
        figures = level_figures(mode=mode, users=users, session_ids=session_ids, records=records, elapsed=elapsed,
                                check=stored_check(records, session_ids), load_before=load_before, cpu=cpu)
        levels.append(figures)
        print(row(figures), flush=True)

    return {
        "database": database_version(connection),
        "settings": {
            "mode": args.mode,
            "levels": args.levels,
            "shared_level": {"users": args.shared_users, "users_per_session": args.users_per_session}
            if args.shared_users else None,
            "duration_s": None if args.requests_per_level else args.duration,
            "requests_per_level": args.requests_per_level or None,
            "model_delay_ms": args.delay_ms,
            "web_workers": args.web_workers,
            "web_workers_booted": booted,
            "threads": args.threads,
            "celery_workers": args.celery_workers if args.mode != "sync" else 0,
            "worker_concurrency": args.worker_concurrency if args.mode != "sync" else 0,
            "poll_ms": args.poll_ms if args.mode != "sync" else None,
            "web_command": procfile()["web"],
            "worker_command": procfile()["worker"] if args.mode != "sync" else None,
            "healthz": health,
        },
        "load_average_1min": {"before": load_start, "after": round(os.getloadavg()[0], 2)},
        "levels": levels,
        "lost": sum(level["lost"] for level in levels),
        "duplicated": sum(level["duplicated_messages"] for level in levels),
        "stored_after_refusal": sum(level["stored_after_refusal"] for level in levels),
    }


# --- the report ----------------------------------------------------------------------------

HEADER = (f"{'mode':<6} {'users':>5} {'sess':>4} {'reqs':>6} {'ok':>6} {'req/s':>7} {'p50':>7} {'p95':>7} "
          f"{'p99':>7} {'max':>7} {'cpu':>5} {'5xx':>4} {'lost':>4} {'dup':>4}  {'load':<11} errors")


def row(level: dict) -> str:
    latency = level["latency_ms"] or {}

    def ms(key):
        return f"{latency[key]:7.0f}" if key in latency else f"{'-':>7}"

    load = "{before:.2f}-{after:.2f}".format(**level["load_average_1min"])
    cpu = f"{level['cpu_ms_per_ok_request']['server']:.0f}" if level["cpu_ms_per_ok_request"] else "-"
    errors = ", ".join(f"{name}: {count}" for name, count in level["errors"].items()) or "-"
    return (f"{level['mode']:<6} {level['users']:>5} {level['sessions']:>4} {level['requests']:>6} {level['ok']:>6} "
            f"{level['throughput_rps']:>7.1f} {ms('p50_ms')} {ms('p95_ms')} {ms('p99_ms')} {ms('max_ms')} {cpu:>5} "
            f"{level['server_errors']:>4} {level['lost']:>4} {level['duplicated_messages']:>4}  {load:<11} {errors}")


def report(figures: dict) -> None:
    settings = figures["settings"]
    print()
    print(f"{figures['database']}; gunicorn {settings['web_workers']} workers x {settings['threads']} threads; "
          f"model delay {settings['model_delay_ms']:g} ms; latency in ms over the 2xx answers "
          f"(async: from the POST until the turn is done); cpu: server CPU ms per accepted message "
          f"(web + Celery + PostgreSQL backends)")
    print(HEADER)
    for level in figures["levels"]:
        print(row(level))
    load = figures["load_average_1min"]
    refused = f", stored after refusal: {figures['stored_after_refusal']}" if figures["stored_after_refusal"] else ""
    print(f"lost: {figures['lost']}, duplicated: {figures['duplicated']}{refused}; "
          f"1-minute load average {load['before']} before the levels, {load['after']} after")


def parse_levels(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {text!r}") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError("levels must be positive numbers")
    return levels


def preflight(database: str) -> None:
    """Refuse clearly before touching anything: the load test needs the real services."""
    url = os.environ.get("DATABASE_URL", "")
    if urlparse(url).scheme not in ("postgres", "postgresql", "pgsql"):
        raise SystemExit("bench/load_chat.py needs PostgreSQL: set DATABASE_URL=postgres://user@host:5432/db "
                         "(it works in a throwaway database on that server).")
    if urlparse(os.environ.get("REDIS_URL", "")).scheme not in ("redis", "rediss"):
        raise SystemExit("bench/load_chat.py needs Redis: set REDIS_URL=redis://host:6379/N "
                         "(the broker, cache and session locks of the processes under test).")
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", database):
        raise SystemExit(f"--database must be a plain PostgreSQL name, not {database!r}")


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=parse_levels, default=[1, 2, 4, 8, 16, 32],
                        help="concurrent virtual users per level, one session each (default 1,2,4,8,16,32)")
    parser.add_argument("--shared-users", type=int, default=8,
                        help="then one level with this many users sharing sessions (the session lock; 0: none)")
    parser.add_argument("--users-per-session", type=int, default=4, help="users per session in that level")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per level (default 15)")
    parser.add_argument("--requests-per-level", type=int, default=0,
                        help="instead of --duration: this many messages per level in all")
    parser.add_argument("--delay-ms", type=float, default=200.0, help="the fake model's delay per call")
    parser.add_argument("--mode", choices=["sync", "async", "both"], default="sync",
                        help="sync: POST and wait for the reply; async: ?async=1, then poll the turn")
    parser.add_argument("--web-workers", type=int, default=int(os.environ.get("WEB_CONCURRENCY") or 4),
                        help="gunicorn worker processes (default WEB_CONCURRENCY or 4)")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("GUNICORN_THREADS") or 4),
                        help="threads per gunicorn worker (default GUNICORN_THREADS or 4; "
                             "the Procfile's uvicorn workers ignore it)")
    parser.add_argument("--celery-workers", type=int, default=2, help="Celery worker processes (async mode)")
    parser.add_argument("--worker-concurrency", type=int, default=int(os.environ.get("WORKER_CONCURRENCY") or 2),
                        help="pool processes per Celery worker (default WORKER_CONCURRENCY or 2)")
    parser.add_argument("--poll-ms", type=float, default=100.0,
                        help="async: how often a user polls its turn (the polls are load too)")
    parser.add_argument("--database", default=DEFAULT_DATABASE, help="the throwaway database's name")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="where the JSON goes")
    args = parser.parse_args(argv)
    if args.users_per_session < 1 or args.shared_users < 0:
        parser.error("--users-per-session must be at least 1 and --shared-users not negative")
    preflight(args.database)

    # SIGTERM (a CI timeout, kill) unwinds like Ctrl-C, so the processes stop and the database is dropped.
    signal.signal(signal.SIGTERM, _interrupt)
    print(HEADER, flush=True)
    try:
        with ThrowawayDatabase(args.database), Processes() as processes:
            try:
                figures = run(args, processes)
            except Exception:
                for name in processes.running:
                    if name != "fake-model" and (tail := processes.log(name)[-2000:]):
                        print(f"--- {name} log (last lines) ---\n{tail}", file=sys.stderr)
                raise
    except KeyboardInterrupt:
        print("interrupted: the processes are stopped and the database is dropped", file=sys.stderr)
        return 130
    report(figures)
    print(f"wrote {write_results('load_chat', 'postgresql', figures, out_dir=args.out)}")
    if figures["lost"] or figures["duplicated"] or figures["stored_after_refusal"]:
        print(f"FAILED: {figures['lost']} lost, {figures['duplicated']} duplicated, "
              f"{figures['stored_after_refusal']} stored after a refusal", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
