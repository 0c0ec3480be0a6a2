"""docs/deployment.md on one machine, as written: the systemd units' ExecStart lines, read
from that page, started the way systemd would (kinsite-web, kinsite-worker@1 and @2, one
kinsite-beat) against the test database and a spare Redis db. /healthz answers through
gunicorn, both Celery workers answer a ping under their own node names, several async chat
turns are answered and shared between the two workers (the model is the fake OpenAI
server), and beat schedules the idle-introspection scan, which a worker runs."""
import os
import re
import shelve
import shlex
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import celery
import httpx
import pytest
import redis
from celery.beat import ScheduleEntry
from django.conf import settings
from django.db import connection

from kinsite.celery import app as celery_app
from kinsite.services import api_token_issue
from tests.factories import KinFactory, SessionFactory, TeamFactory
from tests.ops.test_serve_command import REPO, free_port

pytestmark = pytest.mark.postgres

STARTUP_SECONDS = 40
TURN_SECONDS = 30
BEAT_SECONDS = 20
# Where the documented units install the code; the test runs them from this checkout.
INSTALL_DIR = "/srv/kinsite"
ASYNC_TURNS = 8
MODEL_DELAY_SECONDS = 0.4  # long enough that one worker cannot take every turn


def readme_units() -> tuple[dict[str, dict[str, str]], list[str]]:
    """The systemd units of docs/deployment.md ({unit: {key: value}}) and the worker
    instances its `systemctl enable` line starts."""
    deployment = (REPO / "docs" / "deployment.md").read_text()
    block = re.search(r"```ini\n(.*?)```", deployment, re.S).group(1)
    units: dict[str, dict[str, str]] = {}
    current = None
    for line in block.splitlines():
        if match := re.match(r"# /etc/systemd/system/(\S+)", line):
            current = units.setdefault(match.group(1), {})
        elif current is not None and re.match(r"\w+=", line):
            key, value = line.split("=", 1)
            current[key] = value
    instances = re.findall(r"kinsite-worker@(\w+)", re.search(r"systemctl enable --now ([^)\n]+)", block).group(1))
    return units, instances


def systemd_argv(unit: dict[str, str], *, instance: str = "", port: int, state_dir: Path) -> list[str]:
    """A unit's ExecStart as systemd would run it (specifiers expanded, no shell), moved from
    INSTALL_DIR to this checkout: this virtualenv, a temp state directory, a free port."""
    assert unit["WorkingDirectory"] == INSTALL_DIR and unit["EnvironmentFile"] == "/etc/kinsite.env"
    specifiers = {"i": instance, "H": socket.gethostname(), "%": "%"}
    command = re.sub(r"%(.)", lambda m: specifiers[m.group(1)], unit["ExecStart"])
    command = command.replace(f"{INSTALL_DIR}/.venv/bin/", f"{Path(sys.executable).parent}/")
    command = command.replace(f"{INSTALL_DIR}/var/", f"{state_dir}/")
    command = re.sub(r"(--bind \S+):8000\b", rf"\g<1>:{port}", command)
    assert INSTALL_DIR not in command, command
    return shlex.split(command)


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def committed_database_url() -> str:
    """The database pytest-django created for this run (committed rows: transactional_db)."""
    db = connection.settings_dict
    auth = quote(db["USER"] or "", safe="")
    if db["PASSWORD"]:
        auth += ":" + quote(db["PASSWORD"], safe="")
    host = f"{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}"
    return f"postgres://{auth}@{host}/{quote(db['NAME'], safe='')}"


def spare_redis_url() -> str:
    """Another db on the test Redis: the subprocesses' broker queue and cache, flushed freely."""
    parts = urlsplit(settings.REDIS_URL)
    db = int(parts.path.strip("/") or 0)
    return urlunsplit(parts._replace(path=f"/{(db - 1) % 16}"))


def seed_beat_schedule(path: Path) -> None:
    """A schedule file whose entries last ran an hour ago, so beat sends them at once
    instead of at the next minute boundary (the stored last run is kept; the schedule
    itself still comes from kinsite/celery.py)."""
    last_run = celery_app.now() - timedelta(hours=1)
    entries = {
        name: ScheduleEntry(name=name, app=celery_app, last_run_at=last_run, **spec)
        for name, spec in celery_app.conf.beat_schedule.items()
    }
    with shelve.open(str(path)) as store:
        store.update(
            entries=entries,
            __version__=celery.__version__,
            tz=celery_app.conf.timezone,
            utc_enabled=celery_app.conf.enable_utc,
        )


def worker_nodes(broker_url: str) -> set[str]:
    """The node names of the Celery workers that answer a ping on this broker."""
    # Not the current app: shared tasks sent later in this test process would go to it.
    probe = celery.Celery("deploy-probe", broker=broker_url, set_as_current=False)
    try:
        return {name for reply in probe.control.ping(timeout=1.0) or [] for name in reply}
    finally:
        probe.close()


def wait_until(check, *, seconds: float, what: str, processes: dict, logs: dict):
    deadline = time.monotonic() + seconds
    while True:
        result = check()
        if result:
            return result
        for name, process in processes.items():
            if process.poll() is not None:
                pytest.fail(f"{name} exited with {process.returncode}:\n{logs[name].read_text()[-3000:]}")
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {n} ---\n{log.read_text()[-2000:]}" for n, log in logs.items())
            pytest.fail(f"Timed out waiting for {what}.\n{tails}")
        time.sleep(0.2)


def stop_all(processes: list[subprocess.Popen]) -> None:
    """SIGTERM to all at once (warm shutdowns in parallel), then SIGKILL to any left after 15 s.
    Each process leads its own group (start_new_session), so this reaches gunicorn's and
    Celery's children too, and nothing else."""
    running = [process for process in processes if process.poll() is None]
    for process in running:
        os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    for process in running:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)


def test_readme_units_run_web_two_workers_and_beat(transactional_db, tmp_path, fake_llm):
    if not settings.REDIS_URL:
        pytest.skip("needs REDIS_URL (the PostgreSQL + Redis pass)")
    units, instances = readme_units()
    assert set(units) == {"kinsite-web.service", "kinsite-worker@.service", "kinsite-beat.service"}
    assert instances == ["1", "2"]

    kin = KinFactory(team=TeamFactory())
    sessions = [SessionFactory(kin=kin) for _ in range(ASYNC_TURNS)]
    _, token = api_token_issue(team=kin.team, name="deploy-check")

    port = free_port()
    state_dir = tmp_path / "var"
    state_dir.mkdir()
    commands = {"web": systemd_argv(units["kinsite-web.service"], port=port, state_dir=state_dir)}
    for instance in instances:
        commands[f"worker@{instance}"] = systemd_argv(units["kinsite-worker@.service"], instance=instance, port=port,
                                                      state_dir=state_dir)
    commands["beat"] = systemd_argv(units["kinsite-beat.service"], port=port, state_dir=state_dir)
    seed_beat_schedule(Path(option(commands["beat"], "--schedule")))

    redis_url = spare_redis_url()
    # /etc/kinsite.env: the deployment's settings, pointed at the test database and the fake model.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "LLM_", "API_RATE_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="kinsite.settings",
        DATABASE_URL=committed_database_url(),
        REDIS_URL=redis_url,
        CELERY_TASK_ALWAYS_EAGER="false",
        DEBUG="false",
        KINSITE_DATA_DIR=str(tmp_path / "data"),
        LLM_BASE_URL=fake_llm.base_url,
        LLM_API_KEY="test-key",
        LLM_MODEL="fake-model",
        LLM_MAX_RETRIES="0",
        LLM_TIMEOUT_SECONDS="10",
    )
    fake_llm.delay = MODEL_DELAY_SECONDS
    broker = redis.Redis.from_url(redis_url)
    broker.flushdb()  # no tasks left over from an earlier, interrupted run

    processes: dict[str, subprocess.Popen] = {}
    logs: dict[str, Path] = {}
    try:
        for name, argv in commands.items():
            logs[name] = tmp_path / f"{name}.log"
            with logs[name].open("wb") as log:
                processes[name] = subprocess.Popen(
                    argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                )
        base = f"http://127.0.0.1:{port}"

        def health():
            try:
                return httpx.get(f"{base}/healthz", timeout=2)
            except httpx.TransportError:
                return None

        response = wait_until(health, seconds=STARTUP_SECONDS, what="gunicorn", processes=processes, logs=logs)
        assert response.status_code == 200, response.text
        assert response.headers["server"] == "uvicorn"  # gunicorn runs uvicorn workers (kinsite.asgi)
        assert response.json()["database"]["vendor"] == "postgresql"
        assert response.json()["broker"]["kind"] == "redis"

        # Both workers are up, each under its own node name (worker%i@%H).
        expected_nodes = {option(commands[f"worker@{i}"], "--hostname") for i in instances}
        assert expected_nodes == {f"worker{i}@{socket.gethostname()}" for i in instances}
        wait_until(lambda: worker_nodes(redis_url) >= expected_nodes, seconds=STARTUP_SECONDS,
                   what="both Celery workers to answer a ping", processes=processes, logs=logs)

        # Async chat turns: gunicorn queues them, the two workers share them.
        auth = {"Authorization": f"Bearer {token}"}
        turn_urls = {}
        with httpx.Client(base_url=base, headers=auth, timeout=10) as client:
            for number, session in enumerate(sessions):
                content = f"Deployment check {number}."
                posted = client.post(f"/api/v1/sessions/{session.pk}/messages/?async=1",
                                     json={"content": content, "sender": "Maria"})
                assert posted.status_code == 202, posted.text
                turn_urls[content] = f"/api/v1/turns/{posted.json()['turn']['id']}/"

            def finished_turns():
                turns = {content: client.get(url).json() for content, url in turn_urls.items()}
                return turns if all(t["status"] in ("done", "failed") for t in turns.values()) else None

            turns = wait_until(finished_turns, seconds=TURN_SECONDS, what="the workers to answer the turns",
                               processes=processes, logs=logs)
        for content, turn in turns.items():
            assert turn["status"] == "done", turn
            assert turn["reply"]["content"] == f"echo: [Maria] {content}"
        ran_turn = re.compile(r"sessions_app\.turn_tasks\.run_turn_task\[[^\]]+\] succeeded")
        turns_per_worker = {i: len(ran_turn.findall(logs[f"worker@{i}"].read_text())) for i in instances}
        assert sum(turns_per_worker.values()) == ASYNC_TURNS, turns_per_worker
        assert all(turns_per_worker.values()), f"one worker ran every turn: {turns_per_worker}"

        # Beat sends the idle scan; a worker runs it.
        scan_ran = re.compile(r"sessions_app\.tasks\.scan_idle_sessions_task\[[^\]]+\] succeeded")
        wait_until(lambda: any(scan_ran.search(logs[f"worker@{i}"].read_text()) for i in instances),
                   seconds=BEAT_SECONDS, what="beat's idle scan to run on a worker", processes=processes, logs=logs)
        assert "Sending due task introspect-idle-sessions" in logs["beat"].read_text()

        # As the units say: the web unit's gunicorn workers, each worker's pool, no name clash.
        web_workers = int(option(commands["web"], "--workers"))
        assert len(re.findall(r"Booting worker with pid", logs["web"].read_text())) == web_workers
        for instance in instances:
            worker_log = logs[f"worker@{instance}"].read_text()
            concurrency = option(commands[f"worker@{instance}"], "--concurrency")
            assert re.search(rf"concurrency:\s*{concurrency} \(prefork\)", worker_log)
            assert "DuplicateNodenameWarning" not in worker_log
    finally:
        stop_all(list(processes.values()))
        broker.flushdb()
        broker.close()
