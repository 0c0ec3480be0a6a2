"""The sweeps that keep work from waiting for ever (SPEC §13: nothing is lost): chat turns
and introspection runs whose task never reached the broker, or that a process stopped
running. Each sweep is called as beat's task would call it, with the clock moved on by
ageing the rows; tasks run in-process (eager), as on both passes of the suite."""
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.db import connection
from django.utils import timezone

from kinsite import jobs
from kinsite.jobs import job_queued_key
from memories.models import Memory
from sessions_app.introspection import services as introspection
from sessions_app.introspection.jobs import (
    INTROSPECTION_JOBS,
    introspection_recover_stalled,
    introspection_requeue,
    run_stalled_after,
)
from sessions_app.introspection.services import idle_sessions_due, introspection_request
from sessions_app.locks import session_lock
from sessions_app.models import Event, IntrospectionRun, Session, Turn
from sessions_app.tasks import introspect_session_task
from sessions_app.turns import converse
from sessions_app.turns.jobs import TURN_MAX_ATTEMPTS, turn_stalled_after, turns_recover_stalled, turns_requeue
from sessions_app.turns.services import turn_post, turn_run
from tests.factories import IntrospectionRunFactory, MessageFactory, TurnFactory
from tests.support.clock import age

# empty_cache and model (the scripted fake model introspection calls) are in tests/conftest.py.
pytestmark = pytest.mark.usefixtures("empty_cache")


class ProcessKilled(BaseException):
    """The process running a turn dies: nothing in it catches this (it is no Exception)."""


@pytest.fixture
def dies_at_model_call(monkeypatch):
    """`dies_at_model_call(n)`: the turn's process dies when it makes its n-th model call."""

    def arm(n: int):
        real_chat, calls = converse.llm_chat, []

        def chat(**kwargs):
            calls.append(kwargs)
            if len(calls) == n:
                monkeypatch.setattr(converse, "llm_chat", real_chat)  # the next process is healthy
                raise ProcessKilled()
            return real_chat(**kwargs)

        monkeypatch.setattr(converse, "llm_chat", chat)

    return arm


def session_events(session) -> list[tuple[str, str]]:
    return list(Event.objects.filter(session=session).order_by("id").values_list("role", "kind"))


# --- introspection runs: pending without a task ----------------------------------------------


def test_a_pending_run_whose_task_never_reached_the_broker_is_sent_again_and_runs_once(
    chat_session, model, django_capture_on_commit_callbacks
):
    MessageFactory(session=chat_session, content="Deploys happen on Tuesdays.")
    with django_capture_on_commit_callbacks(execute=False):  # the enqueue on commit never happened
        run = introspection_request(session=chat_session, trigger="checkpoint")
    age(IntrospectionRun.objects.filter(pk=run.pk), "created_at", timedelta(minutes=2))
    model.add("Nothing worth storing.")

    assert introspection_requeue() == [run.pk]

    run.refresh_from_db()
    assert run.status == "done" and len(model.calls) == 1
    assert introspection_requeue() == []  # nothing pending any more
    introspect_session_task.apply(args=[run.pk])  # the original task, had it turned up after all
    assert len(model.calls) == 1
    assert Event.objects.filter(session=chat_session, kind="introspection_end").count() == 1


def test_a_pending_run_with_a_fresh_queued_marker_or_younger_than_a_minute_is_left_alone(
    chat_session, model, django_capture_on_commit_callbacks
):
    MessageFactory(session=chat_session)
    with django_capture_on_commit_callbacks(execute=False):
        young = introspection_request(session=chat_session, trigger="checkpoint")
    assert introspection_requeue() == []  # its task may still be on the way

    age(IntrospectionRun.objects.filter(pk=young.pk), "created_at", timedelta(minutes=5))
    cache.set(job_queued_key(INTROSPECTION_JOBS, young.pk), True)  # its task sits in the queue

    assert introspection_requeue() == []
    young.refresh_from_db()
    assert young.status == "pending" and model.calls == []


def test_a_sent_run_is_marked_queued(chat_session, model, django_capture_on_commit_callbacks):
    MessageFactory(session=chat_session)
    model.add("Nothing worth storing.")
    with django_capture_on_commit_callbacks(execute=True):
        run = introspection_request(session=chat_session, trigger="checkpoint")

    assert isinstance(cache.get(job_queued_key(INTROSPECTION_JOBS, run.pk)), float)  # the send's time


# --- introspection runs: left running ---------------------------------------------------------


def test_a_run_whose_worker_died_is_failed_once_past_the_time_limit_and_the_idle_scan_runs_it_again(
    chat_session, model, django_capture_on_commit_callbacks
):
    """The worker dies mid-run and its task comes back while the run's lock is still live:
    the delivery takes itself for a duplicate and ends, leaving the run `running` with no
    one on it. Past the hard time limit, with the lock gone, the sweep fails it."""
    first = MessageFactory(session=chat_session, content="Deploys happen on Tuesdays.")
    Session.objects.filter(pk=chat_session.pk).update(introspection_pending=True)
    with django_capture_on_commit_callbacks(execute=False):
        run = introspection_request(session=chat_session, trigger="checkpoint")
    IntrospectionRun.objects.filter(pk=run.pk).update(status="running", started_at=timezone.now())
    with introspection._session_lock(chat_session.pk, run.pk):  # the dead worker's lock, still live
        introspect_session_task.apply(args=[run.pk])  # the redelivery
    run.refresh_from_db()
    assert run.status == "running" and model.calls == []
    assert introspection_recover_stalled() == []  # within the time limit: it might still be going

    age(IntrospectionRun.objects.filter(pk=run.pk), "started_at", run_stalled_after() + timedelta(seconds=1))
    assert introspection_recover_stalled() == [run.pk]

    run.refresh_from_db()
    assert run.status == "failed" and run.finished_at is not None
    assert run.error.startswith("Interrupted: the worker running it stopped before it finished.")
    assert "the next run reads the same events" in run.error
    assert introspection_recover_stalled() == []
    # The session is still flagged: once idle (and past the failure's back-off) it is due again,
    # and the next run reads the same events.
    later = timezone.now() + timedelta(minutes=11)
    Session.objects.filter(pk=chat_session.pk).update(last_activity_at=timezone.now() - timedelta(minutes=11))
    assert [s.pk for s in idle_sessions_due(later)] == [chat_session.pk]
    model.add("Nothing worth storing.")
    retry = introspection_request(session=chat_session, trigger="idle")
    introspect_session_task.apply(args=[retry.pk])
    retry.refresh_from_db()
    assert retry.status == "done" and retry.first_event_id == first.pk


def test_a_running_run_whose_lock_is_held_is_left_alone(chat_session, model):
    MessageFactory(session=chat_session)
    run = IntrospectionRunFactory(session=chat_session, trigger="idle", status="running",
                                  started_at=timezone.now() - run_stalled_after() - timedelta(minutes=1))

    with introspection._session_lock(chat_session.pk, run.pk):
        assert introspection_recover_stalled() == []

    run.refresh_from_db()
    assert run.status == "running" and run.error == ""


# --- chat turns: left running -----------------------------------------------------------------


@pytest.mark.usefixtures("fake_llm_gateway")
def test_an_async_turn_whose_worker_died_is_run_again_with_one_reply_and_no_repeated_work(
    chat_session, fake_llm, dies_at_model_call, django_capture_on_commit_callbacks
):
    """The worker stores a tool round (a memory), then dies in its next model call; its task
    is gone (Redis restarted). Once its lease is over the sweep queues it again: the rerun
    sees the stored round, answers once, and nothing of the first attempt is repeated."""
    with django_capture_on_commit_callbacks(execute=False):
        turn = turn_post(session=chat_session, content="Remember: the launch is on Friday.", sender="Maria",
                         is_async=True)
    fake_llm.tool_call("memorize", {"content": "The launch is on Friday.", "category": "decision"}, call_id="call_1")
    fake_llm.reply("Noted: the launch is on Friday.")
    dies_at_model_call(2)
    with pytest.raises(ProcessKilled):
        turn_run(turn_id=turn.pk)
    turn.refresh_from_db()
    assert turn.status == "running" and turn.tool_calls == 1 and turn.attempts == 1
    assert turns_recover_stalled().requeued == []  # not yet past the lease

    age(Turn.objects.filter(pk=turn.pk), "started_at", turn_stalled_after() + timedelta(seconds=1))
    stalled = turns_recover_stalled()

    assert stalled.requeued == [turn.pk] and stalled.failed == []
    turn.refresh_from_db()
    assert turn.status == "done", turn.error
    assert turn.reply.content == "Noted: the launch is on Friday."
    assert turn.tool_calls == 1 and turn.attempts == 2
    assert session_events(chat_session) == [("user", "message"), ("assistant", "tool_call"), ("tool", "tool_result"),
                                            ("assistant", "message")]
    assert Memory.objects.count() == 1
    rerun = fake_llm.requests_to("chat")[-1]["messages"]
    assert any(m["role"] == "tool" and m["tool_call_id"] == "call_1" for m in rerun)
    # Later sweeps and a late duplicate of the task change nothing.
    assert turns_recover_stalled().requeued == [] and turns_requeue() == []
    turn_run(turn_id=turn.pk)
    assert Event.objects.filter(session=chat_session, role="assistant", kind="message").count() == 1


@pytest.mark.usefixtures("fake_llm_gateway")
def test_a_sync_turn_whose_web_process_died_is_run_again_and_answered_once(
    api_client, chat_session, fake_llm, dies_at_model_call
):
    """The web process dies in the turn's model call (its client gets a broken connection).
    Once its lease is over the sweep queues the turn again, as an async one: the message gets
    its reply, once, and polling the turn finds it."""
    dies_at_model_call(1)
    with pytest.raises(ProcessKilled):
        turn_post(session=chat_session, content="What is the launch date?", sender="Maria")
    turn = Turn.objects.get()
    assert turn.status == "running" and not turn.is_async and turn.attempts == 1
    assert turns_recover_stalled().requeued == []  # not yet past the lease
    age(Turn.objects.filter(pk=turn.pk), "started_at", turn_stalled_after() + timedelta(seconds=1))
    fake_llm.reply("Friday.")

    stalled = turns_recover_stalled()

    assert stalled.requeued == [turn.pk] and stalled.failed == []
    turn.refresh_from_db()
    assert turn.status == "done", turn.error
    assert turn.reply.content == "Friday." and turn.attempts == 2 and not turn.is_async
    assert session_events(chat_session) == [("user", "message"), ("assistant", "message")]
    polled = api_client.get(f"/api/v1/turns/{turn.pk}/").json()
    assert polled["status"] == "done" and polled["reply"]["content"] == "Friday."
    [rerun] = fake_llm.requests_to("chat")
    assert rerun["messages"][-1] == {"role": "user", "content": "[Maria] What is the launch date?"}
    # Later sweeps and a stray task change nothing.
    assert turns_recover_stalled().requeued == [] and turns_requeue() == []
    turn_run(turn_id=turn.pk)
    assert Event.objects.filter(session=chat_session, role="assistant").count() == 1


@pytest.mark.usefixtures("fake_llm_gateway")
def test_a_recovered_sync_turn_the_broker_did_not_take_is_sent_by_the_requeue_sweep(
    chat_session, fake_llm, dies_at_model_call, monkeypatch
):
    dies_at_model_call(1)
    with pytest.raises(ProcessKilled):
        turn_post(session=chat_session, content="What is the launch date?", sender="Maria")
    turn = Turn.objects.get()
    age(Turn.objects.filter(pk=turn.pk), "started_at", turn_stalled_after() + timedelta(seconds=1))
    age(Turn.objects.filter(pk=turn.pk), "created_at", timedelta(minutes=10))

    def broker_down(kind, job_id):
        raise jobs.BrokerUnreachable("connection refused")

    with monkeypatch.context() as patch:
        patch.setattr(jobs, "job_send", broker_down)
        assert turns_recover_stalled().requeued == [turn.pk]
    assert Turn.objects.get(pk=turn.pk).status == "pending"

    assert turns_requeue() == [turn.pk]

    turn.refresh_from_db()
    assert turn.status == "done" and turn.reply.content == "echo: [Maria] What is the launch date?"


@pytest.mark.usefixtures("fake_llm_gateway")
@pytest.mark.parametrize("is_async", [True, False], ids=["async", "sync"])
def test_a_running_turn_whose_session_lock_is_held_is_left_alone(chat_session, fake_llm, is_async):
    message = MessageFactory(session=chat_session)
    turn = TurnFactory(session=chat_session, user_message=message, is_async=is_async, status="running",
                       attempts=1, started_at=timezone.now() - turn_stalled_after() - timedelta(minutes=1))

    with session_lock(chat_session.pk):  # someone is working on the session
        stalled = turns_recover_stalled()

    assert stalled.requeued == [] and stalled.failed == []
    turn.refresh_from_db()
    assert turn.status == "running" and turn.error == ""
    assert fake_llm.requests_to("chat") == []


@pytest.mark.usefixtures("fake_llm_gateway")
@pytest.mark.parametrize("is_async", [True, False], ids=["async", "sync"])
def test_a_turn_out_of_attempts_is_failed_instead_of_run_again(chat_session, fake_llm, is_async):
    message = MessageFactory(session=chat_session)
    turn = TurnFactory(session=chat_session, user_message=message, is_async=is_async, status="running",
                       attempts=TURN_MAX_ATTEMPTS,
                       started_at=timezone.now() - turn_stalled_after() - timedelta(minutes=1))

    stalled = turns_recover_stalled()

    assert stalled.failed == [turn.pk] and stalled.requeued == []
    turn.refresh_from_db()
    assert turn.status == "failed" and f"{TURN_MAX_ATTEMPTS} times" in turn.error
    assert f"Your message is stored (message {message.pk})" in turn.error
    assert fake_llm.requests_to("chat") == []


@pytest.mark.usefixtures("fake_llm_gateway")
def test_a_turn_found_running_out_of_attempts_by_the_next_task_is_failed_and_the_next_turn_runs(
    chat_session, fake_llm, django_capture_on_commit_callbacks
):
    """A turn that killed its worker three times (its task delivered again each time) is not
    started a fourth time by whoever holds the session lock next; the turn queued behind it runs."""
    with django_capture_on_commit_callbacks(execute=False):
        poison = turn_post(session=chat_session, content="Crash the worker.", is_async=True)
        behind = turn_post(session=chat_session, content="Hello?", sender="Tom", is_async=True)
    Turn.objects.filter(pk=poison.pk).update(status="running", attempts=TURN_MAX_ATTEMPTS,
                                             started_at=timezone.now())

    turn_run(turn_id=poison.pk)  # its task, delivered once more

    poison.refresh_from_db()
    behind.refresh_from_db()
    assert poison.status == "failed" and f"{TURN_MAX_ATTEMPTS} times" in poison.error
    assert behind.status == "done" and behind.reply.content == "echo: [Tom] Hello?"
    [request] = fake_llm.requests_to("chat")
    assert request["messages"][-1]["content"] == "[Tom] Hello?"


def test_the_stalled_turn_lease_is_one_session_lock_lease(settings):
    settings.LLM_TIMEOUT_SECONDS, settings.LLM_MAX_RETRIES, settings.LLM_RETRY_BACKOFF_SECONDS = 60, 3, 1.0

    # Four attempts of 60 s, 1 + 2 + 4 + 8 s of backoff, and the lock's minute of margin.
    assert turn_stalled_after() == timedelta(seconds=315)
    settings.CELERY_TASK_TIME_LIMIT = 360
    assert run_stalled_after() == timedelta(minutes=7)


# --- the sweeps read indexes ------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.parametrize("sweep", ["turns_pending", "turns_running", "runs_pending", "runs_running"])
def test_each_sweep_reads_a_partial_index(db, sweep):
    now = timezone.now()
    querysets = {
        "turns_pending": (Turn.objects.filter(status="pending", created_at__lte=now)
                          .order_by("id").values_list("pk", flat=True)[:500], "turn_pending"),
        "turns_running": (Turn.objects.filter(status="running", started_at__lte=now)
                          .order_by("started_at", "id")[:100], "turn_running"),
        "runs_pending": (IntrospectionRun.objects.filter(status="pending", created_at__lte=now)
                         .order_by("id").values_list("pk", flat=True)[:500], "introspection_run_pending"),
        "runs_running": (IntrospectionRun.objects.filter(status="running", started_at__lte=now)
                         .order_by("started_at", "id").values_list("pk", "session_id")[:100],
                         "introspection_one_running_per_session"),
    }
    queryset, index = querysets[sweep]
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        # The tables are empty here: forbid the sequential scan an empty table would get.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert index in plan, plan
