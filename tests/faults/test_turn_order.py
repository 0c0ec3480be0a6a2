"""Turns of one session run in post order (SPEC §4): several async posts to one session,
served by two real Celery workers on Redis and a slow fake model, are answered one after
the other in the order they were posted, each seeing the conversation up to its own message."""
from itertools import pairwise

import pytest
from django.db import transaction

from sessions_app.models import Event, Turn
from tests.faults.conftest import wait_for

pytestmark = pytest.mark.postgres

POSTS = 5
MODEL_SECONDS = 0.3  # each answer takes a while, so both workers hold a task of the session at once
WORK_SECONDS = 60


def test_async_posts_to_one_session_are_answered_in_post_order_by_two_workers(
    transactional_db, api_client, chat_session, on_redis, fake_llm, workers
):
    """Both workers are up, then the posts arrive faster than a turn takes: they commit
    together (their tasks are sent on commit), so each worker takes a task of the session at
    once, every message already stored, and they race for the session. The user sees: every
    turn `done`, the replies stored in post order, each answering its own message. The model
    saw: for the n-th turn, the n-1 earlier messages, their replies (stored after every post,
    in order), then the n-th message last; no later message anywhere."""
    fake_llm.delay = MODEL_SECONDS
    texts = [f"Question {n} of {POSTS}?" for n in range(1, POSTS + 1)]
    # Every model request is a turn's: no introspection after the fifth turn.
    env = {"INTROSPECTION_TURN_INTERVAL": "0"}
    started = [workers(redis_url=on_redis.url, llm_base_url=fake_llm.base_url, env=env) for _ in range(2)]
    with on_redis.client() as broker:
        # Both blocked on the queue: the first two tasks go one to each (Redis serves them in turn).
        wait_for(lambda: sum(client["cmd"] == "brpop" for client in broker.client_list()) >= 2,
                 seconds=WORK_SECONDS, what="both workers to wait for tasks", workers=started)
    turn_ids = []
    with transaction.atomic():
        for text in texts:
            response = api_client.post(f"/api/v1/sessions/{chat_session.pk}/messages/?async=1",
                                       {"content": text, "sender": "Maria"}, format="json")
            assert response.status_code == 202, response.content
            turn_ids.append(response.json()["turn"]["id"])

    wait_for(lambda: not Turn.objects.filter(pk__in=turn_ids).exclude(status__in=["done", "failed"]).exists(),
             seconds=WORK_SECONDS, what="the workers to answer every turn", workers=started)

    turns = list(Turn.objects.filter(pk__in=turn_ids).select_related("user_message", "reply").order_by("id"))
    assert [(t.status, t.error) for t in turns] == [("done", "")] * POSTS
    assert [t.reply.content for t in turns] == [f"echo: [Maria] {text}" for text in texts]
    replies = list(Event.objects.filter(session=chat_session, role="assistant").order_by("created_at", "id")
                   .values_list("content", flat=True))
    assert replies == [f"echo: [Maria] {text}" for text in texts]
    assert all(earlier.finished_at <= later.started_at for earlier, later in pairwise(turns))
    requests = fake_llm.requests_to("chat")
    assert len(requests) == POSTS
    for n, request in enumerate(sorted(requests, key=lambda r: len(r["messages"]))):
        conversation = [m["content"] for m in request["messages"][1:]]
        earlier = texts[:n]
        assert conversation == ([f"[Maria] {text}" for text in earlier] + [f"echo: [Maria] {text}" for text in earlier]
                                + [f"[Maria] {texts[n]}"])
    # Each worker ran a turn task to its end. A worker logs a task's success only after the turn
    # it ran is stored and its lock released, and one that waited for the session's lock while
    # the other answered every turn logs its first success after the last turn is done: wait.
    wait_for(lambda: all("run_turn_task" in worker.log() and "succeeded" in worker.log() for worker in started),
             seconds=WORK_SECONDS, what="each worker to log a turn task that succeeded", workers=started)
    assert not any("raised unexpected" in worker.log() for worker in started)
