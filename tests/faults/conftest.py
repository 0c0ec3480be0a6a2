"""The fault suite's pieces: a model that fails in each of the ways an HTTP endpoint can,
a Redis server the test stops and starts, and Celery workers it can kill."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import kombu.pools
import pytest
import redis
from django.conf import settings as django_settings

from kinsite.celery import app as celery_app
from tests.ops.test_deployment import committed_database_url
from tests.ops.test_serve_command import REPO, free_port
from tests.support.fake_openai import FakeOpenAIServer

# The gateway's limits in this suite: one retry, and a timeout far below the stall. The
# timeout holds for every model call here, not only the stalled ones: at 0.3 s a scripted
# answer that a loaded CI machine (2 cores) served late was retried, the retry took the next
# scripted answer, and the turn ran without its tool call. 1.5 s is ~30 times a normal
# answer's time and keeps a timeout test at a few seconds.
LLM_TIMEOUT_SECONDS = 1.5
LLM_MAX_RETRIES = 1
STALL_SECONDS = 4.0


# --- the model ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelFault:
    """One way the model endpoint fails, scripted for every HTTP attempt of `calls` model calls."""

    name: str
    error_code: str  # the LLMError code the gateway raises
    attempts: int  # HTTP attempts one model call makes before giving up
    script: Callable[[FakeOpenAIServer], None]  # one failing HTTP answer

    def inject(self, fake: FakeOpenAIServer, calls: int = 1) -> None:
        for _ in range(calls * self.attempts):
            self.script(fake)


MODEL_FAULTS = [
    # Slower than LLM_TIMEOUT_SECONDS on every attempt.
    ModelFault("timeout", "llm_timeout", LLM_MAX_RETRIES + 1, lambda fake: fake.stall(STALL_SECONDS)),
    # A server error on every attempt (retried, then given up).
    ModelFault("http_500", "llm_http_error", LLM_MAX_RETRIES + 1,
               lambda fake: fake.error(500, "upstream exploded")),
    # 200 with a body that is not JSON: not retried, the endpoint is broken.
    ModelFault("malformed_json", "llm_bad_response", 1,
               lambda fake: fake.raw('{"choices": [{"message": ', content_type="application/json")),
]


@pytest.fixture
def fake_model(settings) -> Iterator[FakeOpenAIServer]:
    """The fake OpenAI-compatible server as the configured endpoint: every gateway call
    goes through the real provider that settings build (LLM_BASE_URL, LLM_TIMEOUT_SECONDS,
    LLM_MAX_RETRIES), over HTTP."""
    with FakeOpenAIServer() as fake:
        settings.LLM_BASE_URL = fake.base_url
        settings.LLM_API_KEY = "test-key"
        settings.LLM_MODEL = "fake-model"
        settings.LLM_EMBEDDING_MODEL = ""
        settings.LLM_TIMEOUT_SECONDS = LLM_TIMEOUT_SECONDS
        settings.LLM_MAX_RETRIES = LLM_MAX_RETRIES
        settings.LLM_RETRY_BACKOFF_SECONDS = 0.01
        yield fake


@pytest.fixture
def eager_celery(settings) -> Iterator[None]:
    """Tasks run in-process, whatever CELERY_TASK_ALWAYS_EAGER says."""
    # Read Celery's value first: its config loads lazily from Django settings.
    previous = celery_app.conf.task_always_eager
    settings.CELERY_TASK_ALWAYS_EAGER = True
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = previous


# --- Redis ---------------------------------------------------------------------------------------


class RedisServer:
    """A throwaway redis-server without persistence: stopping it loses every key (queue,
    cache, locks), as a Redis restart without AOF does."""

    def __init__(self, directory: Path):
        self.port = free_port()
        self.directory = directory
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_connect_timeout=1, socket_timeout=2)

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.directory)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                with self.client() as client:
                    client.ping()
                return
            except redis.ConnectionError as exc:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError(f"redis-server did not start on port {self.port}") from exc
                time.sleep(0.02)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        self.process = None

    def kill(self) -> None:
        """SIGKILL, as a crash or the OOM killer ends Redis: every connection drops at once."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None


@pytest.fixture
def redis_server(tmp_path) -> Iterator[RedisServer]:
    if not django_settings.REDIS_URL:
        pytest.skip("needs REDIS_URL (the PostgreSQL + Redis pass)")
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed; the Redis fault tests need it")
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()


def _forget_broker_pools(*, close: bool) -> None:
    """Make the app look up its broker pools again (they are cached for the URL it first
    used). With `close`, the current ones are closed and dropped from kombu's registry;
    the suite's own broker's pools are left open, since eager tasks use them too."""
    current = [pool for pool in (celery_app._pool, celery_app.amqp._producer_pool) if pool is not None]
    if close:
        for group in (kombu.pools.connections, kombu.pools.producers):
            for stored_key, pool in list(group.items()):
                if pool in current:
                    dict.__delitem__(group, stored_key)  # the stored key is already kombu's hash
        for pool in current:
            pool.force_close_all()
    celery_app._pool = None
    celery_app.amqp._producer_pool = None


@pytest.fixture
def on_redis(redis_server, settings) -> Iterator[RedisServer]:
    """This test process uses `redis_server` for everything: cache, session locks, rate-limit
    counters and the Celery broker (tasks are sent to it, not run in-process)."""
    previous = (celery_app.conf.broker_url, celery_app.conf.task_always_eager)
    settings.REDIS_URL = redis_server.url
    settings.CACHES = {
        "default": {
            "BACKEND": "kinsite.rediscache.RedisCache",  # as kinsite/settings.py
            "LOCATION": redis_server.url,
            "OPTIONS": {
                "socket_connect_timeout": settings.REDIS_CONNECT_TIMEOUT_SECONDS,
                "socket_timeout": settings.REDIS_SOCKET_TIMEOUT_SECONDS,
            },
        }
    }
    settings.CELERY_BROKER_URL = redis_server.url
    settings.CELERY_TASK_ALWAYS_EAGER = False
    celery_app.conf.broker_url = redis_server.url
    celery_app.conf.task_always_eager = False
    _forget_broker_pools(close=False)
    yield redis_server
    _forget_broker_pools(close=True)
    celery_app.conf.broker_url, celery_app.conf.task_always_eager = previous


# --- Celery workers ---------------------------------------------------------------------------


class Worker:
    """A `celery worker` process (its own process group) on the test database."""

    def __init__(self, *, name: str, redis_url: str, llm_base_url: str, log_path: Path,
                 env: dict[str, str] | None = None, pool: str = "solo", concurrency: int = 1):
        self.log_path = log_path
        environment = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "LLM_", "API_RATE_"))}
        environment.update(
            DJANGO_SETTINGS_MODULE="kinsite.settings",
            DATABASE_URL=committed_database_url(),
            REDIS_URL=redis_url,
            CELERY_TASK_ALWAYS_EAGER="false",
            LLM_BASE_URL=llm_base_url,
            LLM_API_KEY="test-key",
            LLM_MODEL="fake-model",
            LLM_MAX_RETRIES="0",
            LLM_TIMEOUT_SECONDS="30",
            LOG_LEVEL="INFO",
            **(env or {}),
        )
        celery = Path(sys.executable).with_name("celery")
        # By default one process that is the task's process too, so SIGKILL ends the task with the
        # worker; pool="prefork" runs tasks in child processes, as the Procfile's worker does.
        command = [str(celery), "-A", "kinsite", "worker", f"--hostname={name}@%h", f"--pool={pool}",
                   f"--concurrency={concurrency}", "--prefetch-multiplier=1", "--without-gossip",
                   "--without-mingle", "--without-heartbeat", "--loglevel=INFO"]
        with log_path.open("wb") as log:
            self.process = subprocess.Popen(command, cwd=REPO, env=environment, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL, as the OOM killer or a lost machine does: no warm shutdown, no ack."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


def wait_for(check, *, seconds: float, what: str, workers=()):
    """Poll `check` until it returns something truthy; fail with the workers' logs."""
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        for worker in workers:
            if worker.process.poll() is not None:
                pytest.fail(f"a worker exited ({worker.process.returncode}) waiting for {what}:\n"
                            f"{worker.log()[-3000:]}")
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- worker ---\n{worker.log()[-3000:]}" for worker in workers)
            pytest.fail(f"timed out after {seconds}s waiting for {what}\n{logs}")
        time.sleep(0.1)


@pytest.fixture
def workers(tmp_path) -> Iterator[Callable[..., Worker]]:
    """Start workers with `workers(redis_url=..., llm_base_url=...)`; all are stopped at the end."""
    started: list[Worker] = []

    def start(**kwargs) -> Worker:
        name = f"faults{len(started) + 1}"
        worker = Worker(name=name, log_path=tmp_path / f"{name}.log", **kwargs)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()
