"""Redis down (SPEC §12, §13): a real redis-server, the test's cache, session locks,
rate-limit counters and Celery broker, is stopped and started again. Without persistence,
as here, a restart also loses whatever Redis held: queued tasks, locks, counters.

While it is down the API answers 503 in the §11 shape with Retry-After, never a 500 or
a hang, and says whether the message was stored: a sync post stores nothing (no turn
may run without its session lock), an async post keeps its message and pending turn.
When Redis is back, the sweep (beat, every minute) queues the kept turns and a worker
answers each exactly once."""
import threading
import time
from datetime import timedelta

import pytest
from django.db.models import F
from django.urls import reverse

from consolidation.models import ConsolidationRun
from kinsite.jobs import job_queued_key
from kinsite.models import LLMCall
from sessions_app.models import Event, IntrospectionRun, Turn
from sessions_app.turns.jobs import TURN_JOBS, turns_requeue
from tests.factories import MessageFactory
from tests.faults.conftest import wait_for
from tests.sessions_app.test_api_access import assert_api_error

pytestmark = pytest.mark.postgres

TURNS_SECONDS = 30
# Far above what a refused connection costs (the broker's publish retries take about 1 s):
# only a request that waits on a dead Redis takes this long.
HANG_SECONDS = 5


def post(api_client, session, content, *, is_async=False):
    return api_client.post(
        f"/api/v1/sessions/{session.pk}/messages/" + ("?async=1" if is_async else ""),
        {"content": content, "sender": "Maria"}, format="json",
    )


def assert_unavailable(response, code: str) -> dict:
    error = assert_api_error(response, 503, code=code)
    assert int(response["Retry-After"]) > 0
    assert "Redis" in error["message"] and error["details"]["service"] == "redis"
    return error


@pytest.fixture
def chat_rates(settings):
    """Rate limits on, so every post goes through the throttle's counter in Redis first."""
    settings.API_THROTTLE_RATES = {"chat": "100/min", "jobs": "100/min"}


def test_sync_post_while_redis_is_down_answers_503_stores_nothing_and_works_once_it_is_back(
    client, api_client, chat_session, on_redis, chat_rates, fake_model
):
    """Sync chat post with Redis stopped.

    The user sees: 503 `service_unavailable` with Retry-After, a message saying the
    message was not stored and should be posted again (details.stored false), at once
    rather than after a timeout; the rate limit could not be counted and let the
    request through (fail open) instead of answering 500. /healthz answers 503 naming
    the broker, with the database fine. Stored: nothing, no message, no turn, and the
    model is not called. Runs again: nothing; the same post after Redis is back is
    answered (201)."""
    on_redis.stop()

    started = time.monotonic()
    response = post(api_client, chat_session, "Are you there?")

    assert time.monotonic() - started < HANG_SECONDS
    error = assert_unavailable(response, "service_unavailable")
    assert error["details"]["stored"] is False and "not stored" in error["message"]
    assert not Event.objects.exists() and not Turn.objects.exists()
    assert fake_model.requests == [] and not LLMCall.objects.exists()
    health = client.get("/healthz")
    assert health.status_code == 503
    assert health.json()["broker"]["ok"] is False and health.json()["database"]["ok"] is True

    on_redis.start()
    fake_model.reply("I am here.")
    response = post(api_client, chat_session, "Are you there?")

    assert response.status_code == 201, response.content
    assert response.json()["reply"]["content"] == "I am here."
    assert client.get("/healthz").status_code == 200
    assert Event.objects.filter(session=chat_session, role="user").count() == 1


def test_redis_lost_in_the_middle_of_a_sync_turn_answers_503_and_queues_the_turn_again_with_what_it_stored(
    api_client, chat_session, on_redis, fake_model, settings
):
    """Redis stops while the kin's first model call is in flight; the model asks for a tool.

    The user sees: 503 `service_unavailable` saying Redis became unreachable while the kin
    was answering, that the message is stored (details.stored true, with message and
    turn) and queued again, not to be posted again; the turn polled as `pending`, with
    `auto_retries` 1 and the Redis error as `retry_reason`. Stored: the message, the tool
    call and its result (each tool round commits as it happens), the pending turn; no
    reply, and no second model call: without the session lock's renewal the turn stops
    rather than risk interleaving with another. Runs again: the next post once Redis is
    back answers the kept turn first, from its stored round, then its own."""
    settings.LLM_TIMEOUT_SECONDS = 10  # the model's answer is slow, not failed
    fake_model.tool_call("unknown_tool", {}, call_id="call_1", delay=1.0)

    def stop_redis_during_the_model_call():
        wait_for(lambda: fake_model.requests, seconds=10, what="the first model call")
        on_redis.stop()

    stopper = threading.Thread(target=stop_redis_during_the_model_call)
    stopper.start()
    try:
        response = post(api_client, chat_session, "Look it up, please.")
    finally:
        stopper.join()

    error = assert_unavailable(response, "service_unavailable")
    turn = Turn.objects.get()
    message = Event.objects.get(session=chat_session, role="user")
    assert error["details"] == {"service": "redis", "stored": True, "turn": turn.pk, "message": message.pk,
                                "status": "pending"}
    assert "became unreachable while the kin was answering" in error["message"]
    assert "do not post it again" in error["message"]
    assert turn.status == "pending" and turn.reply is None and "Redis" in turn.retry_reason
    polled = api_client.get(f"/api/v1/turns/{turn.pk}/").json()
    assert polled["status"] == "pending" and polled["auto_retries"] == 1 and polled["error"] == ""
    assert list(Event.objects.filter(session=chat_session).order_by("id").values_list("kind", flat=True)) == [
        "message", "tool_call", "tool_result"]
    assert len(fake_model.requests) == 1

    on_redis.start()
    fake_model.reply("Found nothing.")
    response = post(api_client, chat_session, "Try again?")

    assert response.status_code == 201, response.content
    turn.refresh_from_db()
    assert turn.status == "done" and turn.reply.content == "Found nothing."
    resumed = fake_model.requests_to("chat")[-2]["messages"][1:]
    assert [m["role"] for m in resumed] == ["user", "assistant", "tool"]
    history = fake_model.requests_to("chat")[-1]["messages"][1:]
    assert [m["role"] for m in history] == ["user", "assistant", "tool", "assistant", "user"]


def test_async_posts_while_redis_is_down_are_kept_and_answered_once_when_it_is_back(
    transactional_db, client, api_client, chat_session, on_redis, chat_rates, fake_llm, workers
):
    """Async chat posts around a Redis restart that loses its data; no worker runs until
    Redis is back.

    The user sees: before the outage, 202 (turn A queued). During it, 503
    `broker_unavailable` with Retry-After, saying the message is stored, naming message and
    turn B (details.stored true) and asking not to post it again; polling turn B answers
    200 `pending`. After it, 202 again (turn C), and in the end all three turns `done`.
    Stored: each message and its pending turn as posted; A's queued task is lost with
    Redis's data. Runs again: the sweep (beat's requeue-pending-jobs) queues A and B, whose
    queued-marker went with Redis or was never set, and leaves C, queued normally; a worker
    answers each turn exactly once."""
    first = post(api_client, chat_session, "Message A", is_async=True)
    assert first.status_code == 202, first.content
    turn_a = first.json()["turn"]["id"]

    on_redis.stop()
    started = time.monotonic()
    outage = post(api_client, chat_session, "Message B", is_async=True)

    assert time.monotonic() - started < HANG_SECONDS  # the publish gives up after its short retries
    error = assert_unavailable(outage, "broker_unavailable")
    turn_b = error["details"]["turn"]
    assert error["details"]["stored"] is True and "do not post the message again" in error["message"]
    message_b = Event.objects.get(pk=error["details"]["message"])
    assert (message_b.content, message_b.role) == ("Message B", "user")
    polled = api_client.get(f"/api/v1/turns/{turn_b}/")
    assert polled.status_code == 200 and polled.json()["status"] == "pending"
    assert polled.json()["message"]["id"] == message_b.pk
    assert client.get("/healthz").status_code == 503

    on_redis.start()
    with on_redis.client() as broker:
        assert broker.llen("celery") == 0  # turn A's task went with the restart
    third = post(api_client, chat_session, "Message C", is_async=True)
    assert third.status_code == 202, third.content
    turn_c = third.json()["turn"]["id"]

    # A minute on: the sweep finds the turns still pending without a task in the queue.
    Turn.objects.update(created_at=F("created_at") - timedelta(minutes=2))
    assert turns_requeue() == [turn_a, turn_b]
    with on_redis.client() as broker:
        assert broker.llen("celery") == 3  # C's own task, then A's and B's
        assert all(broker.exists(f":1:{job_queued_key(TURN_JOBS, t)}") for t in (turn_a, turn_b, turn_c))

    worker = workers(redis_url=on_redis.url, llm_base_url=fake_llm.base_url)
    wait_for(lambda: not Turn.objects.exclude(status__in=["done", "failed"]).exists(), seconds=TURNS_SECONDS,
             what="the worker to answer the three turns", workers=[worker])

    for turn_id, content in ((turn_a, "Message A"), (turn_b, "Message B"), (turn_c, "Message C")):
        turn = Turn.objects.select_related("reply", "user_message").get(pk=turn_id)
        assert turn.status == "done", turn.error
        assert turn.user_message.content == content
        assert turn.reply.content == f"echo: [Maria] {content}"
    assert Event.objects.filter(session=chat_session, role="assistant").count() == 3
    assert len(fake_llm.requests_to("chat")) == 3
    assert turns_requeue() == []  # nothing left pending


def test_other_endpoints_while_redis_is_down_answer_503_or_work_without_it(
    transactional_db, api_client, chat_session, on_redis, chat_rates
):
    """Job endpoints with Redis stopped; the rate limit of their "jobs" scope is counted in Redis.

    The user sees: a consolidation that only prepares its prompt needs no Redis past the
    rate limit, which fails open, so it answers 200; a real consolidation (which takes the
    kin's lock in Redis) and a checkpoint (whose task cannot be queued) answer 503
    `service_unavailable`, not 500; reading the history works (200).
    Stored: the prepared run; no consolidation run for the refused one; the checkpoint's
    introspection run, pending. Runs again: a checkpoint request, once its pending run is
    older than introspection's STALE_PENDING, sends it again; a refused consolidation runs
    when asked again (or at night)."""
    kin = chat_session.kin
    MessageFactory(session=chat_session, content="Hello", sender="Maria")
    on_redis.stop()

    prepared = api_client.post(f"/api/v1/kins/{kin.pk}/consolidate/", {"prepare": True}, format="json")
    assert prepared.status_code == 200, prepared.content
    assert prepared.json()["status"] == "prepared"

    refused = api_client.post(f"/api/v1/kins/{kin.pk}/consolidate/", {}, format="json")
    assert_unavailable(refused, "service_unavailable")
    assert list(ConsolidationRun.objects.values_list("status", flat=True)) == ["prepared"]

    checkpoint = api_client.post(f"/api/v1/sessions/{chat_session.pk}/checkpoint/")
    assert_unavailable(checkpoint, "service_unavailable")
    assert list(IntrospectionRun.objects.values_list("status", flat=True)) == ["pending"]

    history = api_client.get(f"/api/v1/sessions/{chat_session.pk}/messages/")
    assert history.status_code == 200 and len(history.json()["results"]) == 1


def test_memory_search_and_the_prompt_preview_work_while_redis_is_down(
    transactional_db, api_client, chat_session, on_redis
):
    """Memory search and the prompt preview with Redis stopped (search reads its BM25
    statistics from the database's counters; the prompt's history search caches its
    common terms there).

    The user sees: the same answers as with Redis (200, the memory found). Stored:
    nothing (a preview counts no retrieval). Runs again: nothing."""
    kin = chat_session.kin
    added = api_client.post(f"/api/v1/kins/{kin.pk}/memories/",
                            {"content": "Maria's favourite tea is sencha.", "category": "preference"}, format="json")
    assert added.status_code == 201, added.content
    on_redis.stop()

    search = api_client.get(f"/api/v1/kins/{kin.pk}/memories/search/", {"q": "favourite tea"})
    assert search.status_code == 200, search.content
    assert [hit["content"] for hit in search.json()["results"]] == ["Maria's favourite tea is sencha."]

    preview = api_client.get(f"/api/v1/sessions/{chat_session.pk}/prompt/", {"message": "Which tea for Maria?"})
    assert preview.status_code == 200, preview.content
    assert "sencha" in preview.content.decode()


def test_dashboard_chat_post_while_redis_is_down_says_so_and_stores_nothing(client, user, chat_session, on_redis):
    """The dashboard's chat form with Redis stopped.

    The user sees: the chat page again (503; with htmx, the form's partial) with the
    error saying the message was not stored and to send it again, instead of a server
    error page. Stored: nothing. Runs again: nothing; sending again after Redis is back
    works as usual."""
    client.force_login(user)
    on_redis.stop()
    url = reverse("dashboard:session_post", args=[chat_session.pk])

    page = client.post(url, {"content": "Hello from the dashboard"})
    assert page.status_code == 503
    assert "was not stored" in page.content.decode()
    partial = client.post(url, {"content": "Hello from the dashboard"}, HTTP_HX_REQUEST="true")
    assert partial.status_code == 200 and "was not stored" in partial.content.decode()
    assert not Event.objects.exists() and not Turn.objects.exists()
