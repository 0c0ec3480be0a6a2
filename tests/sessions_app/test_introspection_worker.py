"""Introspection on a real Celery worker process with the Redis broker (SPEC §7, §12):
a checkpoint request from the API ends in a finished run, done by the worker, whose
model is the fake OpenAI-compatible server reached over HTTP."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from kinsite.celery import app as celery_app
from memories.models import Memory
from sessions_app.models import Event, IntrospectionRun
from tests.factories import KinFactory, MessageFactory, SessionFactory
from tests.support.fake_openai import FakeOpenAIServer

BASE_DIR = Path(settings.BASE_DIR)
WORKER_START_SECONDS = 30
RUN_FINISH_SECONDS = 60


def _database_url() -> str:
    """The URL of the test database this test runs on (pytest-django's test_<name>)."""
    db = connection.settings_dict
    auth = db["USER"] or ""
    if db.get("PASSWORD"):
        auth += f":{db['PASSWORD']}"
    host = f"{auth}@" if auth else ""
    return f"postgres://{host}{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def _start_worker(llm_base_url: str, log_path: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "kinsite.settings",
        "DATABASE_URL": _database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "CELERY_TASK_ALWAYS_EAGER": "0",
        "LLM_BASE_URL": llm_base_url,
        "LLM_API_KEY": "test-key",
        "LLM_MODEL": "fake-model",
        "EMBEDDINGS": "endpoint",
        "LLM_EMBEDDING_MODEL": "fake-embedding",
        "LLM_MAX_RETRIES": "0",
        "LLM_TIMEOUT_SECONDS": "10",
    }
    celery = Path(sys.executable).with_name("celery")
    command = [str(celery), "-A", "kinsite", "worker", "--pool=solo", "--concurrency=1",
               "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel=INFO"]
    log = log_path.open("w")
    return subprocess.Popen(command, cwd=BASE_DIR, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def _stop(worker: subprocess.Popen) -> None:
    if worker.poll() is None:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=10)


def _wait_for(predicate, timeout: float, what: str, worker: subprocess.Popen, log_path: Path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if worker.poll() is not None:
            pytest.fail(f"the worker exited ({worker.returncode}) waiting for {what}:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout}s waiting for {what}:\n{log_path.read_text()[-3000:]}")


@pytest.fixture
def not_eager(settings):
    """This test's requests enqueue to Redis instead of running tasks in-process."""
    if not settings.REDIS_URL:
        pytest.skip("needs REDIS_URL (the Celery broker)")
    # Read Celery's value before touching settings: its config is loaded lazily from
    # Django settings, so reading it afterwards would "restore" the override.
    previous = celery_app.conf.task_always_eager
    settings.CELERY_TASK_ALWAYS_EAGER = False
    celery_app.conf.task_always_eager = False
    yield
    celery_app.conf.task_always_eager = previous


@pytest.mark.postgres
def test_checkpoint_request_is_run_by_a_real_worker(transactional_db, not_eager, api_client, team, tmp_path):
    session = SessionFactory(kin=KinFactory(team=team))
    MessageFactory(session=session, content="Deploys happen on Tuesdays only.", sender="Maria")
    log_path = tmp_path / "worker.log"
    with FakeOpenAIServer() as fake:
        fake.tool_call("memory_add", {"content": "Deploys happen on Tuesdays only.", "category": "decision",
                                      "subject": "deploys", "importance": 8})
        fake.reply("Stored the deploy rule.")
        worker = _start_worker(fake.base_url, log_path)
        try:
            _wait_for(lambda: "ready" in log_path.read_text(), WORKER_START_SECONDS, "the worker to start",
                      worker, log_path)

            response = api_client.post(f"/api/v1/sessions/{session.pk}/checkpoint/")

            assert response.status_code == 202, response.content
            run_id = response.json()["run"]["id"]
            run = _wait_for(
                lambda: IntrospectionRun.objects.filter(pk=run_id, status__in=["done", "failed"]).first(),
                RUN_FINISH_SECONDS, f"introspection run {run_id} to finish", worker, log_path,
            )
        finally:
            _stop(worker)

        chat_requests = fake.requests_to("chat")

    assert run.status == "done", run.error
    assert run.trigger == "checkpoint" and run.event_count == 1
    memory = Memory.objects.get()
    assert memory.content == "Deploys happen on Tuesdays only."
    assert memory.source_ref == f"introspection_run:{run.pk}"
    assert Event.objects.filter(session=session, kind="introspection_end").count() == 1
    assert len(chat_requests) == 2
    assert {tool["function"]["name"] for tool in chat_requests[0]["tools"]} == {
        "memory_recall", "memory_add", "memory_update", "memory_delete", "working_memory_update",
        "session_description_update",
    }
