"""A worker dies mid-task (SPEC §12, §13): a real Celery worker on Redis is SIGKILLed while
its async chat turn waits on the model; the task, never acknowledged (acks_late), goes
back to the queue once the broker's visibility timeout has passed, and a second worker
runs it to the end."""
import time

import pytest

from memories.models import Memory
from sessions_app.locks import LOCK_KEY
from sessions_app.models import Event, Turn
from tests.faults.conftest import wait_for

pytestmark = pytest.mark.postgres

# Short enough for a test; in production CELERY_BROKER_VISIBILITY_TIMEOUT defaults to 1800 s.
VISIBILITY_TIMEOUT_SECONDS = 2
MODEL_STALL_SECONDS = 60  # longer than the test: the first worker dies inside this call
TURN_SECONDS = 30


def test_a_turn_whose_worker_is_killed_mid_model_call_is_run_again_and_answered_once(
    transactional_db, api_client, chat_session, on_redis, fake_llm, workers
):
    """The worker runs an async turn: the model asks to memorize a fact (the tool round is
    stored), then the next model call hangs and the worker is SIGKILLed in it.

    The user sees: 202, then the turn polled as `running` while nobody runs it, then `done`
    with one reply once a worker has picked it up again. Stored: the user's message, the
    tool call, its result and the memory from the dead worker's round stay as they were
    (one of each); the rerun adds the reply, and only one. Runs again: the whole task, on
    the second worker, after the visibility timeout (and once the dead worker's session
    lock lease has run out); its model call sees the stored tool round, so nothing is done
    twice."""
    fake_llm.tool_call("memorize", {"content": "The launch is on Friday.", "category": "decision",
                                    "subject": "launch"}, call_id="call_1")
    fake_llm.stall(MODEL_STALL_SECONDS)
    fake_llm.reply("Noted: the launch is on Friday.")
    env = {"CELERY_BROKER_VISIBILITY_TIMEOUT": str(VISIBILITY_TIMEOUT_SECONDS)}

    response = api_client.post(f"/api/v1/sessions/{chat_session.pk}/messages/?async=1",
                               {"content": "Remember: the launch is on Friday.", "sender": "Maria"}, format="json")
    assert response.status_code == 202, response.content
    turn_id = response.json()["turn"]["id"]

    first = workers(redis_url=on_redis.url, llm_base_url=fake_llm.base_url, env=env)
    wait_for(lambda: len(fake_llm.requests_to("chat")) == 2, seconds=TURN_SECONDS,
             what="the first worker to reach its second model call", workers=[first])
    first.kill()

    turn = Turn.objects.get(pk=turn_id)
    assert turn.status == "running" and turn.reply is None and turn.tool_calls == 1
    assert Memory.objects.get().content == "The launch is on Friday."
    polled = api_client.get(f"/api/v1/turns/{turn_id}/").json()
    assert polled["status"] == "running" and polled["reply"] is None
    with on_redis.client() as broker:
        [(_, delivered_at)] = broker.zrange("unacked_index", 0, -1, withscores=True)  # taken, never acked
        assert broker.llen("celery") == 0
        # The dead worker's session lock would block the rerun for its lease (the model's
        # worst case plus a minute); let it run out now rather than wait for it.
        assert broker.pexpire(LOCK_KEY.format(session_id=chat_session.pk), 1)
    # A worker restores unacknowledged tasks older than the visibility timeout when it starts.
    time.sleep(max(0.0, delivered_at + VISIBILITY_TIMEOUT_SECONDS + 0.2 - time.time()))

    second = workers(redis_url=on_redis.url, llm_base_url=fake_llm.base_url, env=env)
    turn = wait_for(lambda: Turn.objects.filter(pk=turn_id, status__in=["done", "failed"]).first(),
                    seconds=TURN_SECONDS, what="the second worker to run the turn again", workers=[second])

    assert turn.status == "done", turn.error
    assert turn.reply.content == "Noted: the launch is on Friday."
    assert turn.tool_calls == 1
    kinds = list(Event.objects.filter(session=chat_session).order_by("id").values_list("role", "kind"))
    assert kinds == [("user", "message"), ("assistant", "tool_call"), ("tool", "tool_result"),
                     ("assistant", "message")]
    assert Memory.objects.count() == 1
    requests = fake_llm.requests_to("chat")
    assert len(requests) == 3
    rerun = requests[2]["messages"]
    assert any(m["role"] == "tool" and m["tool_call_id"] == "call_1" for m in rerun)
    assert "Task sessions_app.turn_tasks.run_turn_task" in second.log()
