"""Redis lost under a busy worker (SPEC §13: a worker survives a broker outage and resumes by
itself; nothing waits for a person). A real Celery worker, prefork like the Procfile's, runs
async chat turns whose model calls the test holds open, while the real redis-server under
it is SIGKILLed and started again on the same port, without persistence: the queue, the
unacknowledged-task records, the session locks and the queued-markers are gone with it."""
from datetime import timedelta

import pytest
from django.db.models import F

from sessions_app.models import Event, Turn
from sessions_app.turns.jobs import turn_stalled_after, turns_recover_stalled, turns_requeue
from tests.factories import SessionFactory
from tests.faults.conftest import wait_for

pytestmark = pytest.mark.postgres

WORK_SECONDS = 30


def post(api_client, session, content):
    return api_client.post(f"/api/v1/sessions/{session.pk}/messages/?async=1",
                           {"content": content, "sender": "Maria"}, format="json")


def reconnections(worker) -> int:
    return worker.log().count("Connected to redis://") - 1


def critical_lines(worker) -> str:
    return "\n".join(line for line in worker.log().splitlines() if "CRITICAL" in line or "Error:" in line)


def brpop_waiting(redis_server) -> bool:
    """Whether a client of this Redis is blocked in BRPOP, as a worker with a free process is."""
    with redis_server.client() as client:
        return any(entry.get("cmd") == "brpop" for entry in client.client_list())


def test_a_worker_running_turns_when_redis_is_killed_reconnects_and_answers_every_turn_once(
    transactional_db, api_client, kin, on_redis, fake_llm, workers
):
    """A worker of three processes runs two async turns, each held in its model call, and
    waits on Redis (BRPOP) for a task for its third. Redis is SIGKILLed; the worker sees the
    broker go, Redis starts again empty on the same port, the worker reconnects; a turn
    posted then is answered at once, and only after that do the two held model calls answer.

    The user sees: 202 for each post; the turn posted after the outage `done` first, then
    the two held turns `done` with their replies, as if nothing had happened. Stored: one
    reply per turn, nothing twice. Runs again: nothing. The held turns finish in the worker
    process that took them (a connection loss does not cancel running tasks), and Redis,
    having lost its data, no longer holds their tasks to deliver again; beat's sweeps,
    called here as beat calls them a minute on (the clock moved by ageing the turns), find
    no turn pending without a task (requeue-pending-jobs) and none stalled
    (recover-stalled-jobs). The same worker process, never restarted, answers all three."""
    sessions = [SessionFactory(kin=kin) for _ in range(3)]
    held = [fake_llm.hold(), fake_llm.hold()]  # the model calls of the first two turns
    try:
        turn_ids = []
        for number, session in enumerate(sessions[:2], start=1):
            response = post(api_client, session, f"Message {number}")
            assert response.status_code == 202, response.content
            turn_ids.append(response.json()["turn"]["id"])

        worker = workers(redis_url=on_redis.url, llm_base_url=fake_llm.base_url, pool="prefork", concurrency=3)
        wait_for(lambda: len(fake_llm.requests_to("chat")) == 2, seconds=WORK_SECONDS,
                 what="the worker to run two turns", workers=[worker])
        # Two tasks taken and unacknowledged (acks_late), and a BRPOP in flight for the third process.
        wait_for(lambda: brpop_waiting(on_redis), seconds=WORK_SECONDS,
                 what="the worker to wait on the queue", workers=[worker])
        with on_redis.client() as broker:
            assert broker.zcard("unacked_index") == 2

        on_redis.kill()
        wait_for(lambda: "Connection to broker lost" in worker.log(), seconds=WORK_SECONDS,
                 what="the worker to notice Redis is gone", workers=[worker])
        on_redis.start()
        # A worker that gave up logs it at once, then waits for its running tasks before it exits.
        wait_for(lambda: reconnections(worker) >= 1 or "Unrecoverable error" in worker.log(), seconds=WORK_SECONDS,
                 what="the worker to reconnect to Redis", workers=[worker])
        assert "Unrecoverable error" not in worker.log(), critical_lines(worker)

        response = post(api_client, sessions[2], "Message 3")
        assert response.status_code == 202, response.content
        turn_ids.append(response.json()["turn"]["id"])
        wait_for(lambda: Turn.objects.filter(pk=turn_ids[2], status__in=["done", "failed"]).exists(),
                 seconds=WORK_SECONDS, what="the worker to answer a turn posted after the outage",
                 workers=[worker])
        assert list(Turn.objects.filter(pk__in=turn_ids[:2]).values_list("status", flat=True)) == ["running"] * 2
    finally:
        for gate in held:
            gate.set()

    wait_for(lambda: Turn.objects.filter(pk__in=turn_ids, status__in=["done", "failed"]).count() == 3,
             seconds=WORK_SECONDS, what="the two held turns to end", workers=[worker])

    later = turn_stalled_after() + timedelta(minutes=1)
    Turn.objects.update(created_at=F("created_at") - later, started_at=F("started_at") - later)
    assert turns_requeue() == []
    stalled = turns_recover_stalled()
    assert stalled.requeued == [] and stalled.failed == []

    assert worker.process.poll() is None  # the same worker process, never restarted
    assert "Unrecoverable error" not in worker.log()
    for number, (session, turn_id) in enumerate(zip(sessions, turn_ids, strict=True), start=1):
        turn = Turn.objects.select_related("reply").get(pk=turn_id)
        assert turn.status == "done", turn.error
        assert turn.attempts == 1
        assert turn.reply.content == f"echo: [Maria] Message {number}"
        replies = Event.objects.filter(session=session, role="assistant").values_list("content", flat=True)
        assert list(replies) == [turn.reply.content]
    assert len(fake_llm.requests_to("chat")) == 3
    with on_redis.client() as broker:
        assert broker.llen("celery") == 0 and broker.zcard("unacked_index") == 0  # nothing to deliver again


def test_a_worker_started_while_redis_is_down_waits_for_it_and_then_runs_the_kept_turns(
    transactional_db, api_client, chat_session, on_redis, fake_llm, workers
):
    """Redis is down when the worker starts (a machine booting before Redis, say).

    The user sees: the async post answers 503 with its turn kept pending, and that turn
    `done` once Redis is back. Stored: the message, then one reply. Runs again: the
    worker retries its connection for as long as it takes (it does not exit), connects
    once Redis is up, and runs the turn that beat's requeue-pending-jobs (called here as
    beat calls it) queued again."""
    on_redis.stop()
    response = post(api_client, chat_session, "Are you there?")
    assert response.status_code == 503, response.content
    turn_id = response.json()["error"]["details"]["turn"]

    worker = workers(redis_url=on_redis.url, llm_base_url=fake_llm.base_url, pool="prefork", concurrency=2)
    wait_for(lambda: worker.log().count("Cannot connect to redis://") >= 2, seconds=WORK_SECONDS,
             what="the worker to retry its connection", workers=[worker])
    on_redis.start()
    wait_for(lambda: "Connected to redis://" in worker.log(), seconds=WORK_SECONDS,
             what="the worker to connect once Redis is up", workers=[worker])

    Turn.objects.filter(pk=turn_id).update(created_at=F("created_at") - timedelta(minutes=2))
    assert turns_requeue() == [turn_id]
    turn = wait_for(lambda: Turn.objects.filter(pk=turn_id, status__in=["done", "failed"]).first(),
                    seconds=WORK_SECONDS, what="the worker to run the kept turn", workers=[worker])

    assert turn.status == "done", turn.error
    assert turn.reply.content == "echo: [Maria] Are you there?"
    assert worker.process.poll() is None
