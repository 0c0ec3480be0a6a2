"""A turn that our own service failed before its reply (Redis gone at the session lock's
renewal, the session lock waited out) goes back to the queue, and kinsite.jobs' requeue
sweep runs it again; a failure of the model itself stays failed. The real-Redis version of
the first case is tests/faults/test_turn_redis_drops_before_its_model_call.py; here the
lock's renewal meets what it raises when its Redis client gets a ConnectionError."""
from datetime import timedelta

import pytest
import redis
from django.core.cache import cache

from kinsite.jobs import job_queued_key
from sessions_app.locks import LockUnavailable, SessionLock, session_lock
from sessions_app.models import Event, Turn
from sessions_app.turns.jobs import TURN_JOBS, turns_requeue
from sessions_app.turns.services import turn_retry
from tests.support.clock import age

pytestmark = pytest.mark.usefixtures("fake_llm_gateway", "empty_cache")


@pytest.fixture
def redis_drops_at_refresh(monkeypatch):
    """`redis_drops_at_refresh(n)`: the next n renewals of a session lock before a model call
    find Redis unreachable, as SessionLock.refresh reports it."""
    left = [0]
    real_refresh = SessionLock.refresh

    def refresh(self):
        if left[0] > 0:
            left[0] -= 1
            exc = redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:6390. Connection refused.")
            raise LockUnavailable(f"The session lock service (Redis) is unreachable: {exc}",
                                  details={"service": "redis"}) from exc
        real_refresh(self)

    monkeypatch.setattr(SessionLock, "refresh", refresh)

    def arm(times: int = 1):
        left[0] = times

    return arm


def post_async(api_client, session, content, capture):
    with capture(execute=True):  # eager Celery: the task runs on commit
        response = api_client.post(f"/api/v1/sessions/{session.pk}/messages/?async=1",
                                   {"content": content, "sender": "Maria"}, format="json")
    assert response.status_code == 202, response.content
    return Turn.objects.get(pk=response.json()["turn"]["id"])


def a_minute_on(turn):
    age(Turn.objects.filter(pk=turn.pk), "created_at", timedelta(minutes=2))


def conversation(session):
    return list(Event.objects.filter(session=session).order_by("id").values_list("role", "content"))


def test_an_async_turn_whose_redis_drops_before_its_model_call_waits_and_the_sweep_answers_it_once(
    api_client, chat_session, fake_llm, redis_drops_at_refresh, django_capture_on_commit_callbacks
):
    redis_drops_at_refresh(1)
    turn = post_async(api_client, chat_session, "When is the report due?", django_capture_on_commit_callbacks)

    turn.refresh_from_db()
    assert turn.status == "pending" and turn.reply is None and turn.error == ""
    assert turn.attempts == 1 and turn.auto_retries == 1 and turn.retried_at is not None
    assert "Redis" in turn.retry_reason and "unreachable" in turn.retry_reason
    polled = api_client.get(f"/api/v1/turns/{turn.pk}/").json()
    assert polled["status"] == "pending" and polled["auto_retries"] == 1
    assert polled["retry_reason"] == turn.retry_reason and polled["retried_at"]
    assert fake_llm.requests_to("chat") == []

    fake_llm.reply("On Friday.")
    a_minute_on(turn)
    assert turns_requeue() == [turn.pk]  # beat's requeue-pending-jobs; eager: it runs here

    turn.refresh_from_db()
    assert turn.status == "done" and turn.reply.content == "On Friday."
    assert turn.attempts == 2 and turn.auto_retries == 1  # the record of what happened stays
    assert conversation(chat_session) == [("user", "When is the report due?"), ("assistant", "On Friday.")]
    assert turns_requeue() == []


def test_a_model_failure_still_fails_the_turn_and_is_not_retried_by_itself(
    api_client, chat_session, fake_llm, django_capture_on_commit_callbacks
):
    fake_llm.error(401, "bad key")
    turn = post_async(api_client, chat_session, "Hello?", django_capture_on_commit_callbacks)

    turn.refresh_from_db()
    assert turn.status == "failed" and "bad key" in turn.error
    assert turn.auto_retries == 0 and turn.retry_reason == ""
    a_minute_on(turn)
    assert turns_requeue() == []


def test_a_task_that_waits_out_the_session_lock_requeues_its_turn(
    api_client, chat_session, fake_llm, settings, django_capture_on_commit_callbacks
):
    settings.TURN_LOCK_WAIT_SECONDS = 0.1
    with session_lock(chat_session.pk):  # another turn of the session runs for longer than the wait
        turn = post_async(api_client, chat_session, "Still there?", django_capture_on_commit_callbacks)

    turn.refresh_from_db()
    assert turn.status == "pending" and turn.attempts == 0 and turn.auto_retries == 1
    assert "waited" in turn.retry_reason
    fake_llm.reply("Yes.")
    a_minute_on(turn)
    assert turns_requeue() == [turn.pk]
    turn.refresh_from_db()
    assert turn.status == "done" and turn.reply.content == "Yes."
    assert conversation(chat_session) == [("user", "Still there?"), ("assistant", "Yes.")]


def test_a_turn_out_of_automatic_retries_is_failed_with_the_error_and_can_be_retried_by_hand(
    api_client, chat_session, fake_llm, settings, redis_drops_at_refresh, django_capture_on_commit_callbacks
):
    settings.TURN_AUTO_RETRIES = 2
    redis_drops_at_refresh(3)
    turn = post_async(api_client, chat_session, "Anyone?", django_capture_on_commit_callbacks)
    for _ in range(2):
        a_minute_on(turn)
        assert turns_requeue() == [turn.pk]

    turn.refresh_from_db()
    assert turn.status == "failed" and turn.auto_retries == 2 and turn.attempts == 3
    assert "2 automatic retries" in turn.error and "Redis" in turn.error and "unreachable" in turn.error
    assert f"/api/v1/turns/{turn.pk}/retry/" in turn.error
    a_minute_on(turn)
    assert turns_requeue() == []

    fake_llm.reply("Here.")
    with django_capture_on_commit_callbacks(execute=True):
        turn_retry(turn=turn)
    turn.refresh_from_db()
    assert turn.status == "done" and turn.reply.content == "Here." and turn.auto_retries == 0
    assert conversation(chat_session) == [("user", "Anyone?"), ("assistant", "Here.")]


def test_a_sync_turn_whose_redis_drops_answers_503_keeps_the_turn_queued_and_is_answered_once(
    api_client, chat_session, fake_llm, redis_drops_at_refresh
):
    redis_drops_at_refresh(1)
    response = api_client.post(f"/api/v1/sessions/{chat_session.pk}/messages/",
                               {"content": "Hi", "sender": "Maria"}, format="json")

    assert response.status_code == 503, response.content
    error = response.json()["error"]
    turn = Turn.objects.get()
    assert error["details"] == {"service": "redis", "stored": True, "turn": turn.pk,
                                "message": turn.user_message_id, "status": "pending"}
    assert "do not post it again" in error["message"]
    assert turn.status == "pending" and turn.auto_retries == 1

    fake_llm.reply("Hello.")
    a_minute_on(turn)
    assert turns_requeue() == [turn.pk]
    turn.refresh_from_db()
    assert turn.status == "done" and conversation(chat_session) == [("user", "Hi"), ("assistant", "Hello.")]


def test_a_marker_from_before_the_requeue_does_not_hold_the_turn_back(
    api_client, chat_session, fake_llm, redis_drops_at_refresh, django_capture_on_commit_callbacks
):
    """Redis that keeps its data across the outage still holds the marker of the turn's first
    send; the sweep sends the turn anyway, since the marker is older than its requeue."""
    redis_drops_at_refresh(1)
    turn = post_async(api_client, chat_session, "Hi", django_capture_on_commit_callbacks)
    turn.refresh_from_db()
    cache.set(job_queued_key(TURN_JOBS, turn.pk), turn.retried_at.timestamp() - 5)  # the first send's
    a_minute_on(turn)
    assert turns_requeue() == [turn.pk]
    turn.refresh_from_db()
    assert turn.status == "done"
