"""Work left stuck by a process or Redis dying at the wrong moment (SPEC §12, §13), and the
sweeps beat runs every minute to take it over: a real redis-server the test stops and
starts, real Celery workers and a real gunicorn it SIGKILLs. The sweeps are called as
beat's tasks call them; the clock is moved on by ageing the rows."""
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from django.db.models import F

from kinsite.services import api_token_issue
from kinsite.tasks import recover_stalled_jobs_task, requeue_jobs_task
from memories.models import Memory
from sessions_app.introspection import jobs as introspection
from sessions_app.introspection.jobs import introspection_recover_stalled, introspection_requeue, run_stalled_after
from sessions_app.locks import LOCK_KEY as TURN_LOCK_KEY
from sessions_app.models import Event, IntrospectionRun, Session, Turn
from sessions_app.turns.jobs import turn_stalled_after, turns_recover_stalled, turns_requeue
from tests.factories import IntrospectionRunFactory, MessageFactory, SessionFactory, TurnFactory
from tests.faults.conftest import wait_for
from tests.ops.test_deployment import committed_database_url
from tests.ops.test_serve_command import REPO, free_port
from tests.support.clock import age

pytestmark = pytest.mark.postgres

VISIBILITY_TIMEOUT_SECONDS = 2
MODEL_STALL_SECONDS = 60  # longer than the test: the process dies inside this call
WORK_SECONDS = 30
HANG_SECONDS = 5


def post(api_client, session, content, *, is_async=False):
    return api_client.post(f"/api/v1/sessions/{session.pk}/messages/" + ("?async=1" if is_async else ""),
                           {"content": content, "sender": "Maria"}, format="json")


def cache_key(key: str) -> str:
    """The Redis key of a Django cache key (version 1, no prefix)."""
    return f":1:{key}"


def test_an_async_turn_whose_worker_dies_and_whose_task_redis_loses_is_run_again_by_the_sweep(
    transactional_db, api_client, chat_session, on_redis, fake_llm, workers
):
    """A worker stores a tool round of an async turn, then is SIGKILLed in its next model
    call; Redis restarts before anyone delivers the task again, losing it with the lock.

    The user sees: the turn polled as `running` while nobody runs it, then, once the sweep
    took it over, `done` with one reply. Stored: the message, the tool round and its memory
    from the dead worker, as they were; the rerun adds the reply. Runs again: the sweep
    leaves the turn alone within its lease, then makes it pending and queues it; a second
    worker runs it once, its model call seeing the stored tool round."""
    fake_llm.tool_call("memorize", {"content": "The launch is on Friday.", "category": "decision",
                                    "subject": "launch"}, call_id="call_1")
    fake_llm.stall(MODEL_STALL_SECONDS)
    fake_llm.reply("Noted: the launch is on Friday.")
    response = post(api_client, chat_session, "Remember: the launch is on Friday.", is_async=True)
    assert response.status_code == 202, response.content
    turn_id = response.json()["turn"]["id"]

    first = workers(redis_url=on_redis.url, llm_base_url=fake_llm.base_url)
    wait_for(lambda: len(fake_llm.requests_to("chat")) == 2, seconds=WORK_SECONDS,
             what="the first worker to reach its second model call", workers=[first])
    first.kill()
    on_redis.stop()
    on_redis.start()  # without persistence: the unacknowledged task, the lock and the marker are gone

    turn = Turn.objects.get(pk=turn_id)
    assert turn.status == "running" and turn.tool_calls == 1 and turn.attempts == 1
    assert api_client.get(f"/api/v1/turns/{turn_id}/").json()["status"] == "running"
    with on_redis.client() as broker:
        assert broker.llen("celery") == 0 and broker.zcard("unacked_index") == 0
    assert turns_recover_stalled().requeued == []  # within its lease it may still be running

    age(Turn.objects.filter(pk=turn_id), "started_at", turn_stalled_after() + timedelta(seconds=1))
    assert turns_recover_stalled().requeued == [turn_id]
    assert api_client.get(f"/api/v1/turns/{turn_id}/").json()["status"] == "pending"
    with on_redis.client() as broker:
        assert broker.llen("celery") == 1

    second = workers(redis_url=on_redis.url, llm_base_url=fake_llm.base_url)
    turn = wait_for(lambda: Turn.objects.filter(pk=turn_id, status__in=["done", "failed"]).first(),
                    seconds=WORK_SECONDS, what="the second worker to run the turn again", workers=[second])

    assert turn.status == "done", turn.error
    assert turn.reply.content == "Noted: the launch is on Friday."
    assert turn.tool_calls == 1 and turn.attempts == 2
    kinds = list(Event.objects.filter(session=chat_session).order_by("id").values_list("role", "kind"))
    assert kinds == [("user", "message"), ("assistant", "tool_call"), ("tool", "tool_result"),
                     ("assistant", "message")]
    assert Memory.objects.count() == 1
    requests = fake_llm.requests_to("chat")
    assert len(requests) == 3
    assert any(m["role"] == "tool" and m["tool_call_id"] == "call_1" for m in requests[2]["messages"])
    assert turns_recover_stalled().requeued == [] and turns_requeue() == []


def start_web(*, port: int, redis_url: str, llm_base_url: str, log_path: Path) -> subprocess.Popen:
    """gunicorn on the test database, as the Procfile runs it (its own process group)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "LLM_", "API_RATE_"))}
    environment.update(
        DJANGO_SETTINGS_MODULE="kinsite.settings", DATABASE_URL=committed_database_url(), REDIS_URL=redis_url,
        CELERY_TASK_ALWAYS_EAGER="false", DEBUG="false", LLM_BASE_URL=llm_base_url, LLM_API_KEY="test-key",
        LLM_MODEL="fake-model", LLM_MAX_RETRIES="0", LLM_TIMEOUT_SECONDS="30",
    )
    gunicorn = Path(sys.executable).with_name("gunicorn")
    command = [str(gunicorn), "kinsite.asgi:application", "--worker-class", "kinsite.webworker.KinsiteUvicornWorker",
               "--bind", f"127.0.0.1:{port}", "--workers", "1"]
    with log_path.open("wb") as log:
        return subprocess.Popen(command, cwd=REPO, env=environment, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def test_a_sync_turn_whose_web_process_is_killed_is_run_again_by_the_sweep_once_its_lock_is_free(
    transactional_db, api_client, chat_session, on_redis, fake_llm, tmp_path, workers
):
    """gunicorn runs a sync turn and is SIGKILLed while the model answers.

    The user sees: a broken connection; the turn polled as `running` while the dead
    process's session lock lives; then `pending` and `done`, with the reply to the message.
    Stored: the message and one reply. Runs again: the sweep leaves the turn alone while its
    lock is held, and once the lock is free makes it pending and queues it, as an async
    turn; a worker runs it (its second start)."""
    fake_llm.stall(MODEL_STALL_SECONDS)
    fake_llm.reply("Friday.")
    _, token = api_token_issue(team=chat_session.kin.team, name="web")
    port = free_port()
    log_path = tmp_path / "web.log"
    web = start_web(port=port, redis_url=on_redis.url, llm_base_url=fake_llm.base_url, log_path=log_path)
    outcome = {}

    def post_sync():
        try:
            outcome["response"] = httpx.post(
                f"http://127.0.0.1:{port}/api/v1/sessions/{chat_session.pk}/messages/",
                json={"content": "What is the launch date?", "sender": "Maria"},
                headers={"Authorization": f"Bearer {token}"}, timeout=WORK_SECONDS,
            )
        except httpx.TransportError as exc:
            outcome["error"] = exc

    try:
        def healthy():
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
            except httpx.TransportError:
                if web.poll() is not None:
                    pytest.fail(f"gunicorn exited:\n{log_path.read_text()[-3000:]}")
                return False

        wait_for(healthy, seconds=WORK_SECONDS, what="gunicorn to answer")
        poster = threading.Thread(target=post_sync)
        poster.start()
        wait_for(lambda: fake_llm.requests_to("chat"), seconds=WORK_SECONDS, what="the turn's model call")
    finally:
        if web.poll() is None:
            os.killpg(web.pid, signal.SIGKILL)
        web.wait(timeout=10)
    poster.join(timeout=10)
    assert "error" in outcome, outcome  # the client's connection broke

    turn = Turn.objects.get()
    assert turn.status == "running" and not turn.is_async
    age(Turn.objects.filter(pk=turn.pk), "started_at", turn_stalled_after() + timedelta(seconds=1))
    assert turns_recover_stalled().requeued == []  # the dead process's lock still lives
    assert Turn.objects.get(pk=turn.pk).status == "running"

    with on_redis.client() as redis_client:
        assert redis_client.pexpire(TURN_LOCK_KEY.format(session_id=chat_session.pk), 1)  # its lease runs out
    time.sleep(0.05)
    stalled = turns_recover_stalled()
    assert stalled.requeued == [turn.pk] and stalled.failed == []
    assert api_client.get(f"/api/v1/turns/{turn.pk}/").json()["status"] == "pending"

    worker = workers(redis_url=on_redis.url, llm_base_url=fake_llm.base_url)
    turn = wait_for(lambda: Turn.objects.filter(pk=turn.pk, status__in=["done", "failed"]).first(),
                    seconds=WORK_SECONDS, what="a worker to run the turn again", workers=[worker])

    assert turn.status == "done", turn.error
    assert turn.reply.content == "Friday." and turn.attempts == 2 and not turn.is_async
    polled = api_client.get(f"/api/v1/turns/{turn.pk}/").json()
    assert polled["status"] == "done" and polled["reply"]["content"] == "Friday."
    kinds = list(Event.objects.filter(session=chat_session).order_by("id").values_list("role", "kind"))
    assert kinds == [("user", "message"), ("assistant", "message")]
    assert len(fake_llm.requests_to("chat")) == 2
    assert fake_llm.requests_to("chat")[1]["messages"][-1] == {"role": "user",
                                                                "content": "[Maria] What is the launch date?"}


def test_an_introspection_run_whose_worker_dies_is_failed_by_the_sweep_not_left_running(
    transactional_db, api_client, chat_session, on_redis, fake_llm, workers
):
    """A worker running a checkpoint's introspection run is SIGKILLed in its model call; its
    task comes back (visibility timeout) to a second worker while the run's lock still lives.

    The user sees: the run `running`, and it stays so: the redelivery takes itself for a
    duplicate of a run in progress and ends. Once past Celery's hard time limit, with the
    lock gone, the sweep fails it with an error saying the worker stopped and nothing was
    applied. Stored: the start event only; no end event, the cursor unchanged. Runs again:
    the session keeps its introspection flag, so the idle scan introspects the same events."""
    MessageFactory(session=chat_session, content="Deploys happen on Tuesdays.", sender="Maria")
    Session.objects.filter(pk=chat_session.pk).update(introspection_pending=True)  # as a turn leaves it
    fake_llm.stall(MODEL_STALL_SECONDS)
    env = {"CELERY_BROKER_VISIBILITY_TIMEOUT": str(VISIBILITY_TIMEOUT_SECONDS)}
    response = api_client.post(f"/api/v1/sessions/{chat_session.pk}/checkpoint/")
    assert response.status_code == 202, response.content
    run_id = response.json()["run"]["id"]

    first = workers(redis_url=on_redis.url, llm_base_url=fake_llm.base_url, env=env)
    wait_for(lambda: fake_llm.requests_to("chat"), seconds=WORK_SECONDS, what="the run's model call", workers=[first])
    first.kill()
    with on_redis.client() as broker:
        [(_, delivered_at)] = broker.zrange("unacked_index", 0, -1, withscores=True)
    time.sleep(max(0.0, delivered_at + VISIBILITY_TIMEOUT_SECONDS + 0.2 - time.time()))
    second = workers(redis_url=on_redis.url, llm_base_url=fake_llm.base_url, env=env)
    wait_for(lambda: "introspect_session_task" in second.log() and "succeeded" in second.log(),
             seconds=WORK_SECONDS, what="the second worker to take the redelivered task", workers=[second])

    run = IntrospectionRun.objects.get(pk=run_id)
    assert run.status == "running"
    assert len(fake_llm.requests_to("chat")) == 1  # the redelivery did not run it
    age(IntrospectionRun.objects.filter(pk=run_id), "started_at", run_stalled_after() + timedelta(seconds=1))
    lock_key = cache_key(introspection.LOCK_KEY.format(session_id=chat_session.pk))
    with on_redis.client() as redis_client:
        assert redis_client.exists(lock_key)
        assert introspection_recover_stalled() == []  # its lock still lives: left alone
        redis_client.delete(lock_key)  # the lock's time limit is over
    assert introspection_recover_stalled() == [run_id]

    run.refresh_from_db()
    assert run.status == "failed" and "worker running it stopped" in run.error
    assert "Nothing was applied" in run.error
    assert not Event.objects.filter(session=chat_session, kind="introspection_end").exists()
    polled = api_client.get(f"/api/v1/sessions/{chat_session.pk}/introspections/").json()["results"][0]
    assert polled["status"] == "failed" and polled["error"] == run.error
    chat_session.refresh_from_db()
    assert chat_session.introspection_pending is True


def test_the_sweeps_survive_redis_being_down_and_queue_what_it_kept_once_it_is_back(
    transactional_db, api_client, chat_session, on_redis, fake_llm, workers, caplog
):
    """With Redis stopped: a checkpoint (503, its run kept pending) and an async post (503,
    its turn kept pending); an async turn left running by a dead worker and a run left
    running by another, both past their leases. Every sweep runs meanwhile.

    The user sees: 503s that say what was kept; the pending turn and run stay pending.
    Stored: as before; no sweep raises or hangs, each logs that Redis is unreachable and
    changes nothing. Runs again: once Redis is back, the next sweeps queue the pending
    turn and run and the stalled turn, and fail the stalled run; a worker runs each once."""
    MessageFactory(session=chat_session, content="Deploys happen on Tuesdays.", sender="Maria")
    stalled_session = SessionFactory(kin=chat_session.kin, title="Stalled")
    stalled_message = MessageFactory(session=stalled_session, content="Stalled question", sender="Maria")
    stalled_turn = TurnFactory(session=stalled_session, user_message=stalled_message, is_async=True,
                               status="running", attempts=1)
    Turn.objects.filter(pk=stalled_turn.pk).update(started_at=F("created_at") - timedelta(hours=1))
    stalled_run = IntrospectionRunFactory(session=stalled_session, trigger="idle", status="running")
    IntrospectionRun.objects.filter(pk=stalled_run.pk).update(started_at=F("created_at") - timedelta(hours=1))

    on_redis.stop()
    checkpoint = api_client.post(f"/api/v1/sessions/{chat_session.pk}/checkpoint/")
    assert checkpoint.status_code == 503, checkpoint.content
    posted = post(api_client, chat_session, "Message while down", is_async=True)
    assert posted.status_code == 503 and posted.json()["error"]["details"]["stored"] is True
    pending_run = IntrospectionRun.objects.get(session=chat_session)
    pending_turn = Turn.objects.get(session=chat_session)
    age(IntrospectionRun.objects.filter(pk=pending_run.pk), "created_at", timedelta(minutes=2))
    age(Turn.objects.filter(pk=pending_turn.pk), "created_at", timedelta(minutes=2))

    caplog.set_level(logging.WARNING)
    caplog.clear()
    for task in (requeue_jobs_task, recover_stalled_jobs_task):
        started = time.monotonic()
        assert task.apply().get() == 0
        assert time.monotonic() - started < HANG_SECONDS
    assert sum("Redis is unreachable" in record.getMessage() for record in caplog.records) == 4
    assert sorted(Turn.objects.values_list("status", flat=True)) == ["pending", "running"]
    assert sorted(IntrospectionRun.objects.values_list("status", flat=True)) == ["pending", "running"]

    on_redis.start()
    assert turns_requeue() == [pending_turn.pk]
    assert turns_recover_stalled().requeued == [stalled_turn.pk]
    assert introspection_requeue() == [pending_run.pk]
    assert introspection_recover_stalled() == [stalled_run.pk]
    with on_redis.client() as broker:
        assert broker.llen("celery") == 3

    worker = workers(redis_url=on_redis.url, llm_base_url=fake_llm.base_url)
    wait_for(lambda: not Turn.objects.exclude(status__in=["done", "failed"]).exists()
             and not IntrospectionRun.objects.filter(status__in=["pending", "running"]).exists(),
             seconds=WORK_SECONDS, what="the worker to run the queued turns and run", workers=[worker])

    for turn in (pending_turn, stalled_turn):
        turn.refresh_from_db()
        assert turn.status == "done", turn.error
    assert Event.objects.filter(role="assistant", kind="message").count() == 2
    pending_run.refresh_from_db()
    stalled_run.refresh_from_db()
    assert pending_run.status == "done", pending_run.error
    assert stalled_run.status == "failed" and "worker running it stopped" in stalled_run.error
    assert len(fake_llm.requests_to("chat")) == 3
