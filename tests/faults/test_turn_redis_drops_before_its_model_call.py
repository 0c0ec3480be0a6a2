"""Redis drops while an async turn waits for its embedding call, so the renewal of the
session lock before the model call finds it gone: a real Celery worker runs the turn, a
throwaway redis-server (its own port, not the shared one) is stopped and started again,
and the fake OpenAI-compatible server holds the embedding answer."""
from datetime import timedelta

import pytest
from django.db.models import F

from sessions_app.models import Event, Turn
from sessions_app.turns.jobs import turns_requeue
from tests.faults.conftest import wait_for

pytestmark = pytest.mark.postgres

WORK_SECONDS = 30
EMBEDDING_SECONDS = 2.0  # more than the lock's renew-after, so the renewal goes to Redis


def test_an_async_turn_whose_redis_drops_before_its_model_call_is_answered_once_when_redis_is_back(
    transactional_db, api_client, chat_session, on_redis, fake_llm, workers
):
    """The user sees: 202; while Redis is away the turn polls `pending`, with
    `auto_retries` 1 and the Redis error as `retry_reason` (not `failed`); once Redis is
    back, `done` with its reply. Stored: one user message and one reply. Runs again: beat's
    requeue-pending-jobs (called here as beat calls it, a minute on) sends the turn, and the
    worker, reconnected by itself, answers it."""
    fake_llm.embeddings([[0.1] * 16], delay=EMBEDDING_SECONDS)
    worker = workers(redis_url=on_redis.url, llm_base_url=fake_llm.base_url,
                     env={"EMBEDDINGS": "endpoint", "LLM_EMBEDDING_MODEL": "fake-embedding"})
    response = api_client.post(f"/api/v1/sessions/{chat_session.pk}/messages/?async=1",
                               {"content": "When is the report due?", "sender": "Maria"}, format="json")
    assert response.status_code == 202, response.content
    turn_id = response.json()["turn"]["id"]

    wait_for(lambda: fake_llm.requests_to("embeddings"), seconds=WORK_SECONDS,
             what="the turn's embedding call", workers=[worker])
    on_redis.stop()
    turn = wait_for(lambda: Turn.objects.filter(pk=turn_id, auto_retries=1).first()
                    or Turn.objects.filter(pk=turn_id, status="failed").first(),
                    seconds=WORK_SECONDS, what="the turn to give up its attempt", workers=[worker])

    assert turn.status == "pending", turn.error
    assert turn.reply is None and turn.attempts == 1 and "Redis" in turn.retry_reason
    polled = api_client.get(f"/api/v1/turns/{turn_id}/").json()
    assert polled["status"] == "pending" and polled["auto_retries"] == 1
    assert fake_llm.requests_to("chat") == []  # no model call without the session lock

    on_redis.start()
    wait_for(lambda: worker.log().count("Connected to redis://") >= 2, seconds=WORK_SECONDS,
             what="the worker to reconnect to Redis", workers=[worker])
    fake_llm.reply("On Friday.")
    Turn.objects.filter(pk=turn_id).update(created_at=F("created_at") - timedelta(minutes=2))
    assert turns_requeue() == [turn_id]
    turn = wait_for(lambda: Turn.objects.filter(pk=turn_id, status__in=["done", "failed"]).first(),
                    seconds=WORK_SECONDS, what="the worker to answer the requeued turn", workers=[worker])

    assert turn.status == "done", turn.error
    assert turn.reply.content == "On Friday." and turn.attempts == 2
    assert list(Event.objects.filter(session=chat_session).order_by("id").values_list("role", "content")) == [
        ("user", "When is the report due?"), ("assistant", "On Friday.")]
    assert len(fake_llm.requests_to("chat")) == 1
    assert turns_requeue() == []
