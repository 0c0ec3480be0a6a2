"""How streams are served in production (docs/deployment.md, "How streams are served"): the Procfile's
web line, with ONE worker process, keeps more streamed chat turns open than a threaded
WSGI server would have threads, and still answers other requests meanwhile: /healthz, an
API read and a non-streamed chat turn. The model is the fake OpenAI server, streaming over
HTTP and holding every streamed answer after its first piece until the test lets go; then
every stream ends with its `done` event and every reply is stored."""
import os
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from django.conf import settings

from kinsite.services import api_token_issue
from sessions_app.models import Event, Turn
from tests.factories import KinFactory, SessionFactory, TeamFactory
from tests.ops.test_deployment import committed_database_url, spare_redis_url, stop_all, wait_until
from tests.ops.test_serve_command import REPO, free_port
from tests.support.sse import sse_events

pytestmark = pytest.mark.postgres

STARTUP_SECONDS = 40
# More open streams than the threads a WSGI worker would have had (the old Procfile: 4).
OPEN_STREAMS = 12
WAIT_SECONDS = 30


def procfile_web() -> str:
    for line in (REPO / "Procfile").read_text().splitlines():
        if line.startswith("web:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError("the Procfile has no web line")


def procfile_web_start(tmp_path, *, port: int, **env_overrides) -> tuple[subprocess.Popen, Path]:
    """The Procfile's web line as production runs it (one worker, DEBUG off) against the test
    database, with `env_overrides` on top; the process and its log file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "LLM_", "API_RATE_"))}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        DJANGO_SETTINGS_MODULE="kinsite.settings",
        DATABASE_URL=committed_database_url(),
        DEBUG="false",
        KINSITE_DATA_DIR=str(tmp_path / "data"),
        INTROSPECTION_ENABLED="false",
        PORT=str(port),
        WEB_CONCURRENCY="1",
        **env_overrides,
    )
    log_path = tmp_path / "web.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(["sh", "-c", f"exec {procfile_web()}"], cwd=REPO, env=env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    return process, log_path


def test_open_streams_do_not_starve_other_requests(transactional_db, tmp_path, fake_llm):
    if not settings.REDIS_URL:
        pytest.skip("needs REDIS_URL (the PostgreSQL + Redis pass)")
    kin = KinFactory(team=TeamFactory())
    streamed = [SessionFactory(kin=kin) for _ in range(OPEN_STREAMS)]
    plain = SessionFactory(kin=kin)
    _, token = api_token_issue(team=kin.team, name="streams")
    releases = [fake_llm.stream(f"Streamed answer number {n} in several pieces.", hold_after=2)
                for n in range(OPEN_STREAMS)]

    port = free_port()
    web, log_path = procfile_web_start(
        tmp_path, port=port, REDIS_URL=spare_redis_url(), CELERY_TASK_ALWAYS_EAGER="false",
        LLM_BASE_URL=fake_llm.base_url, LLM_API_KEY="test-key", LLM_MODEL="fake-model", LLM_MAX_RETRIES="0",
        LLM_TIMEOUT_SECONDS="60",
    )
    processes, logs = {"web": web}, {"web": log_path}
    base = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {token}"}
    first_delta = [threading.Event() for _ in range(OPEN_STREAMS)]
    outcomes: list[list] = [[] for _ in range(OPEN_STREAMS)]

    def follow(number: int) -> None:
        with httpx.Client(base_url=base, headers=auth, timeout=WAIT_SECONDS) as client, client.stream(
            "POST", f"/api/v1/sessions/{streamed[number].pk}/messages/", json={"content": f"stream {number}"},
            headers={"Accept": "text/event-stream"},
        ) as response:
            assert response.status_code == 200, response.read()
            for event in sse_events(response):
                outcomes[number].append(event)
                if event.event == "delta":
                    first_delta[number].set()

    def health():
        try:
            return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    threads = [threading.Thread(target=follow, args=(n,), daemon=True) for n in range(OPEN_STREAMS)]
    try:
        wait_until(health, seconds=STARTUP_SECONDS, what="the web process", processes=processes, logs=logs)
        for thread in threads:
            thread.start()
        for number, got in enumerate(first_delta):
            assert got.wait(WAIT_SECONDS), f"stream {number} got no delta:\n{log_path.read_text()[-3000:]}"
        # Every stream is open, its model call held mid-answer: the one worker still answers.
        assert Turn.objects.filter(session__in=streamed, status=Turn.Status.RUNNING).count() == OPEN_STREAMS
        with httpx.Client(base_url=base, headers=auth, timeout=WAIT_SECONDS) as client:
            assert client.get("/healthz").status_code == 200
            kins = client.get("/api/v1/kins/")
            assert kins.status_code == 200 and [k["id"] for k in kins.json()["results"]] == [kin.pk]
            posted = client.post(f"/api/v1/sessions/{plain.pk}/messages/", json={"content": "not streamed"})
            assert posted.status_code == 201, posted.text
            assert posted.json()["turn"]["status"] == "done"
        assert Turn.objects.filter(session__in=streamed, status=Turn.Status.RUNNING).count() == OPEN_STREAMS

        for release in releases:
            release.set()
        for thread in threads:
            thread.join(WAIT_SECONDS)
            assert not thread.is_alive()
    finally:
        for release in releases:
            release.set()
        stop_all([web])

    # The fake model hands its scripted answers out in the order the calls came, whichever session made them.
    answers = sorted(f"Streamed answer number {n} in several pieces." for n in range(OPEN_STREAMS))
    streamed_texts = []
    for events in outcomes:
        assert events[0].event == "message" and events[-1].event == "done", [e.event for e in events]
        text = "".join(e.data["text"] for e in events if e.event == "delta")
        assert events[-1].data["reply"]["content"] == text
        streamed_texts.append(text)
    assert sorted(streamed_texts) == answers
    replies = Event.objects.filter(session__in=streamed, role=Event.Role.ASSISTANT)
    assert sorted(replies.values_list("content", flat=True)) == answers
