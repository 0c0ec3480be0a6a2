"""The README's run command (scripts/serve, docs/getting-started.md) on the embedded defaults:
migrate, create_demo, runserver (scripts/serve minus the venv step) in a fresh data
directory, checked over HTTP."""
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A port on 127.0.0.1 to start a server on: bound, then released for the server to take
    (tests/support/outbound.closed_port keeps its port bound, so no server could)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def embedded_env(data_dir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "LLM_BASE_URL"}}
    env.update(KINSITE_DATA_DIR=str(data_dir), DEBUG="true", DJANGO_SETTINGS_MODULE="kinsite.settings")
    return env


def manage(*args, env) -> str:
    result = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def first_answer(url: str, *, seconds: float = 30) -> httpx.Response:
    """GET `url` until runserver answers (any status), for up to `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return httpx.get(url, timeout=2)
        except httpx.TransportError:
            assert time.monotonic() < deadline, "runserver did not start"
            time.sleep(0.2)


@pytest.mark.sqlite
def test_run_command_serves_dashboard_and_healthz_with_demo_data(tmp_path):
    env = embedded_env(tmp_path)
    manage("migrate", "--no-input", "-v", "0", env=env)
    first = json.loads(manage("create_demo", env=env).strip().splitlines()[-1])
    second = json.loads(manage("create_demo", env=env).strip().splitlines()[-1])
    assert set(first) == {
        "token", "team", "kin_id", "session_id", "workflow_id", "dashboard_user", "dashboard_password",
    }
    # Idempotent: the same rows, a fresh token each time.
    assert (first["kin_id"], first["session_id"], first["workflow_id"]) == (
        second["kin_id"], second["session_id"], second["workflow_id"])
    assert isinstance(first["workflow_id"], int)
    assert first["token"] != second["token"]

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        health = first_answer(f"{base}/healthz")
        assert health.status_code == 200
        assert health.json()["database"]["vendor"] == "sqlite"

        with httpx.Client(base_url=base, follow_redirects=True, timeout=10) as browser:
            login_page = browser.get("/login/")
            csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login_page.text).group(1)
            kins_page = browser.post(
                "/login/",
                data={"username": first["dashboard_user"], "password": first["dashboard_password"],
                      "csrfmiddlewaretoken": csrf},
            )
            assert kins_page.status_code == 200
            assert "Ada" in kins_page.text
            assert browser.get("/static/kinsite/dashboard.css").status_code == 200

        auth = {"Authorization": f"Bearer {second['token']}"}
        kins = httpx.get(f"{base}/api/v1/kins/", headers=auth)
        assert kins.status_code == 200
        assert [k["id"] for k in kins.json()["results"]] == [first["kin_id"]]
        # The demo kin has memories, created once however often create_demo runs.
        memories = httpx.get(f"{base}/api/v1/kins/{first['kin_id']}/memories/", headers=auth).json()["results"]
        assert len(memories) == 4
        assert all(len(httpx.get(f"{base}/api/v1/memories/{m['id']}/history/", headers=auth).json()["results"]) == 1
                   for m in memories)
        # The demo workflow exists, ran once (eager Celery) and the demo session is attached to it.
        workflow = httpx.get(f"{base}/api/v1/workflows/{first['workflow_id']}/", headers=auth)
        assert workflow.status_code == 200
        assert {node["status"] for node in workflow.json()["nodes"]} == {"done"}
        session = httpx.get(f"{base}/api/v1/sessions/{first['session_id']}/", headers=auth).json()
        assert session["workflow"] == first["workflow_id"]
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.mark.sqlite
def test_run_command_prints_each_log_record_once(tmp_path):
    # DEBUG=true as scripts/serve sets it: Django then gives its "django" logger a console
    # handler of its own, which printed every django.* record a second time via the root's.
    env = embedded_env(tmp_path)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        missing = first_answer(f"http://127.0.0.1:{port}/no-such-page/")
        assert missing.status_code == 404
    finally:
        server.terminate()
        _, stderr = server.communicate(timeout=10)
    lines = stderr.splitlines()
    # One warning from django.request and one access line from django.server.
    assert [line for line in lines if "no-such-page" in line and "Not Found" in line] == ["Not Found: /no-such-page/"]
    assert len([line for line in lines if '"GET /no-such-page/ HTTP/1.1" 404' in line]) == 1
