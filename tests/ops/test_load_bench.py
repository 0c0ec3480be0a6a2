"""bench/load_chat.py end to end with tiny parameters: the Procfile's gunicorn and two Celery
workers against a throwaway database, sync and async chat turns at two concurrency levels
and with users sharing sessions, and a JSON report whose every level has lost nothing."""
import json
import os
import subprocess
import sys

import pytest
from django.conf import settings
from django.db import connection

from tests.ops.test_deployment import committed_database_url, spare_redis_url
from tests.ops.test_serve_command import REPO

pytestmark = pytest.mark.postgres


def test_load_bench_loses_no_message_at_any_level(tmp_path):
    if not settings.REDIS_URL:
        pytest.skip("needs REDIS_URL (the PostgreSQL + Redis pass)")
    name = connection.settings_dict["NAME"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "LLM_"))}
    env.update(
        # The test database's server; the bench creates and drops a database of its own there.
        DATABASE_URL=committed_database_url(),
        # The spare db: the bench's Celery workers consume from it, and nothing else does.
        REDIS_URL=spare_redis_url(),
    )
    result = subprocess.run(
        [sys.executable, "bench/load_chat.py", "--mode", "both", "--levels", "1,4", "--shared-users", "4",
         "--users-per-session", "2", "--requests-per-level", "8", "--delay-ms", "50", "--web-workers", "2",
         "--threads", "2", "--database", f"{name}_load_bench"[:63], "--out", str(tmp_path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=180,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "lost: 0, duplicated: 0" in result.stdout

    figures = json.loads((tmp_path / "load_chat-postgresql.json").read_text())
    assert figures["settings"]["web_workers_booted"] == 2
    assert figures["lost"] == 0 and figures["duplicated"] == 0 and figures["stored_after_refusal"] == 0
    shape = [(level["mode"], level["users"], level["sessions"]) for level in figures["levels"]]
    assert shape == [("sync", 1, 1), ("sync", 4, 4), ("sync", 4, 2), ("async", 1, 1), ("async", 4, 4), ("async", 4, 2)]
    for level in figures["levels"]:
        assert level["requests"] == 8, level
        assert level["lost"] == 0 and level["missing_messages"] == 0 and level["duplicated_messages"] == 0, level
        assert level["server_errors"] == 0 and level["errors"] == {}, level
        assert level["ok"] == level["requests"] and level["throughput_rps"] > 0, level
        latency = level["latency_ms"]
        assert latency["count"] == level["ok"]
        assert 50 <= latency["p50_ms"] <= latency["p95_ms"] <= latency["p99_ms"] <= latency["max_ms"], level
        assert level["cpu_ms_per_ok_request"]["web"] > 0, level  # the /proc meter found gunicorn's processes
