"""README "Deployment" on one machine, as written: the Procfile's three commands (web:
gunicorn with two workers, worker: Celery with concurrency 2, beat: one) against the test
database and a spare Redis db. /healthz answers through gunicorn, an async chat turn is
answered by the worker (the model is the fake OpenAI server) and beat schedules the
idle-introspection scan, which the worker runs."""
import os
import re
import shelve
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import celery
from celery.beat import ScheduleEntry
import httpx
import pytest
import redis
from django.conf import settings
from django.db import connection

from kinsite.celery import app as celery_app
from kinsite.services import api_token_issue
from tests.factories import KinFactory, SessionFactory, TeamFactory
from tests.ops.test_serve_command import REPO, free_port

pytestmark = pytest.mark.postgres

STARTUP_SECONDS = 25
TURN_SECONDS = 20
BEAT_SECONDS = 15


def procfile() -> dict[str, str]:
    entries = {}
    for line in (REPO / "Procfile").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, command = line.split(":", 1)
            entries[name.strip()] = command.strip()
    return entries


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


def stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    # Each process leads its own group (start_new_session), so this reaches gunicorn's and
    # Celery's children too, and nothing else.
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=5)


def test_procfile_serves_chat_through_gunicorn_worker_and_beat(transactional_db, tmp_path, fake_llm):
    if not settings.REDIS_URL:
        pytest.skip("needs REDIS_URL (the PostgreSQL + Redis pass)")
    kin = KinFactory(team=TeamFactory())
    session = SessionFactory(kin=kin)
    _, token = api_token_issue(team=kin.team, name="deploy-check")

    port = free_port()
    redis_url = spare_redis_url()
    beat_schedule = tmp_path / "celerybeat-schedule"
    seed_beat_schedule(beat_schedule)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "LLM_", "API_RATE_"))}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
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
        LOG_LEVEL="INFO",
        PORT=str(port),
        WEB_CONCURRENCY="2",
        WORKER_CONCURRENCY="2",
        BEAT_SCHEDULE_FILE=str(beat_schedule),
    )
    broker = redis.Redis.from_url(redis_url)
    broker.flushdb()  # no tasks left over from an earlier, interrupted run

    processes: dict[str, subprocess.Popen] = {}
    logs: dict[str, Path] = {}
    try:
        for name, command in procfile().items():
            logs[name] = tmp_path / f"{name}.log"
            with logs[name].open("wb") as log:
                processes[name] = subprocess.Popen(
                    ["sh", "-c", f"exec {command}"], cwd=REPO, env=env,
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                )
        assert set(processes) == {"web", "worker", "beat"}
        base = f"http://127.0.0.1:{port}"

        def health():
            try:
                return httpx.get(f"{base}/healthz", timeout=2)
            except httpx.TransportError:
                return None

        response = wait_until(health, seconds=STARTUP_SECONDS, what="gunicorn", processes=processes, logs=logs)
        assert response.status_code == 200, response.text
        assert response.headers["server"].startswith("gunicorn")
        assert response.json()["database"]["vendor"] == "postgresql"
        assert response.json()["broker"]["kind"] == "redis"

        # An async chat turn: gunicorn queues it, the worker answers it through the model.
        auth = {"Authorization": f"Bearer {token}"}
        fake_llm.reply("Answered by a Celery worker.")
        posted = httpx.post(
            f"{base}/api/v1/sessions/{session.pk}/messages/?async=1",
            json={"content": "Hello from the deployment check.", "sender": "Maria"}, headers=auth, timeout=10,
        )
        assert posted.status_code == 202, posted.text
        turn_url = f"{base}/api/v1/turns/{posted.json()['turn']['id']}/"

        def finished_turn():
            turn = httpx.get(turn_url, headers=auth, timeout=5).json()
            return turn if turn["status"] in ("done", "failed") else None

        turn = wait_until(finished_turn, seconds=TURN_SECONDS, what="the worker to answer the turn",
                          processes=processes, logs=logs)
        assert turn["status"] == "done", turn
        assert turn["reply"]["content"] == "Answered by a Celery worker."

        # Beat sends the idle scan; a worker runs it.
        scan_ran = re.compile(r"sessions_app\.tasks\.scan_idle_sessions_task\[[^\]]+\] succeeded")
        wait_until(lambda: scan_ran.search(logs["worker"].read_text()), seconds=BEAT_SECONDS,
                   what="beat's idle scan to run on the worker", processes=processes, logs=logs)
        assert "Sending due task introspect-idle-sessions" in logs["beat"].read_text()

        # As the README says: two web processes, two worker processes.
        assert len(re.findall(r"Booting worker with pid", logs["web"].read_text())) == 2
        assert re.search(r"concurrency:\s*2 \(prefork\)", logs["worker"].read_text())
    finally:
        for process in processes.values():
            stop(process)
        broker.flushdb()
        broker.close()
