"""Background work that can get stuck (kinsite.jobs; SPEC §13: nothing is lost). For each
kind of job (chat turns, introspection, compaction and consolidation runs): a task that
never reached the broker, or that Redis lost, is sent again by beat's requeue sweep and
runs, and a task delivered twice does nothing the second time. Then the runs left
running by a worker that stopped, for the kinds that gained that sweep, and the sweeps
themselves. Tasks run in-process (eager); the clock is moved on by ageing the rows."""
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from consolidation.models import ConsolidationRun, ExperienceVersion, Fact
from consolidation.services import CONSOLIDATION_JOBS, LOCK_KEY as CONSOLIDATION_LOCK_KEY, consolidation_request
from consolidation.tasks import consolidate_kin_task
from kinsite import jobs
from kinsite.celery import app
from kinsite.jobs import JobKind, job_kinds, jobs_recover_stalled, jobs_requeue
from kinsite.llm.types import LLMHTTPError
from kinsite.tasks import recover_stalled_jobs_task, requeue_jobs_task
from sessions_app.compaction import (
    COMPACTION_JOBS,
    COMPACTION_MAX_ATTEMPTS,
    LOCK_KEY as COMPACTION_LOCK_KEY,
    compaction_request,
    compaction_run,
    compaction_stalled_after,
    latest_summary,
)
from sessions_app.introspection.jobs import INTROSPECTION_JOBS
from sessions_app.introspection.services import introspection_request
from sessions_app.models import CompactionRun, Event, IntrospectionRun, Summary, Turn
from sessions_app.tasks import compact_session_task, introspect_session_task, run_turn_task
from sessions_app.turns.jobs import TURN_JOBS
from sessions_app.turns.services import turn_post
from tests.consolidation.conftest import add_fact, answer
from tests.factories import MessageFactory
from tests.sessions_app.test_compaction import BUDGET, FIRST_SUMMARY, chatter
from tests.support.clock import age
from workflows.jobs import WORKFLOW_RUN_JOBS

# empty_cache and model (the scripted fake model introspection, compaction and consolidation
# call) are in tests/conftest.py.
pytestmark = pytest.mark.usefixtures("empty_cache")


def lost(queryset) -> None:
    """The job's task never reached the broker (or Redis lost it) over a minute ago."""
    age(queryset, "created_at", timedelta(minutes=2))


def test_every_kind_of_job_is_swept():
    assert {kind.name for kind in job_kinds()} == {
        "turn", "introspection", "compaction", "consolidation", "embedding-run", "workflow-run",
    }


def test_the_two_sweeps_run_every_minute():
    tasks = {entry["task"]: entry["schedule"] for entry in app.conf.beat_schedule.values()}
    for task in ("kinsite.tasks.requeue_jobs_task", "kinsite.tasks.recover_stalled_jobs_task"):
        assert tasks[task].minute == set(range(60)) and tasks[task].hour == set(range(24))


# --- each kind: a lost task is sent again, a redelivered one does nothing -----------------------


@pytest.mark.usefixtures("fake_llm_gateway")
def test_a_lost_turn_task_is_sent_again_and_a_redelivered_one_does_nothing(
    chat_session, fake_llm, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False):  # the enqueue on commit never happened
        turn = turn_post(session=chat_session, content="Hello?", sender="Maria", is_async=True)
    lost(Turn.objects.filter(pk=turn.pk))

    assert requeue_jobs_task.apply().get() == 1

    turn.refresh_from_db()
    assert turn.status == "done" and turn.reply.content == "echo: [Maria] Hello?" and turn.attempts == 1
    run_turn_task.apply(args=[turn.pk])  # the broker delivers the task again
    turn.refresh_from_db()
    assert turn.status == "done" and turn.attempts == 1
    assert Event.objects.filter(session=chat_session, role="assistant").count() == 1
    assert len(fake_llm.requests_to("chat")) == 1
    assert requeue_jobs_task.apply().get() == 0


def test_a_lost_introspection_task_is_sent_again_and_a_redelivered_one_does_nothing(
    chat_session, model, django_capture_on_commit_callbacks
):
    MessageFactory(session=chat_session, content="Deploys happen on Tuesdays.")
    with django_capture_on_commit_callbacks(execute=False):
        run = introspection_request(session=chat_session, trigger="checkpoint")
    lost(IntrospectionRun.objects.filter(pk=run.pk))
    model.add("Nothing worth storing.")

    assert jobs_requeue(INTROSPECTION_JOBS) == [run.pk]

    run.refresh_from_db()
    assert run.status == "done" and len(model.calls) == 1
    introspect_session_task.apply(args=[run.pk])  # the broker delivers the task again
    run.refresh_from_db()
    assert run.status == "done" and len(model.calls) == 1
    assert Event.objects.filter(session=chat_session, kind="introspection_end").count() == 1
    assert jobs_requeue(INTROSPECTION_JOBS) == []


@pytest.fixture
def long_session(chat_session):
    """A session past the compaction threshold."""
    chat_session.kin.history_token_budget = BUDGET
    chat_session.kin.save()
    chatter(chat_session, 0, 20)
    return chat_session


def test_a_lost_compaction_task_is_sent_again_and_a_redelivered_one_does_nothing(long_session, model):
    run = compaction_request(session=long_session)  # in the test's transaction: the on-commit send never happens
    assert run.status == "pending"
    assert compaction_request(session=long_session) == run  # one pending run per session
    lost(CompactionRun.objects.filter(pk=run.pk))
    model.add(FIRST_SUMMARY)  # a second model call would exhaust the script and fail

    assert jobs_requeue(COMPACTION_JOBS) == [run.pk]

    run.refresh_from_db()
    assert run.status == "done" and run.summary == latest_summary(long_session) and run.attempts == 1
    compact_session_task.apply(args=[run.pk])  # the broker delivers the task again
    run.refresh_from_db()
    assert run.status == "done" and run.attempts == 1
    assert Summary.objects.filter(session=long_session).count() == 1 and len(model.calls) == 1
    assert jobs_requeue(COMPACTION_JOBS) == []


def test_a_request_that_finds_a_stale_pending_compaction_sends_it_again(long_session, model,
                                                                       django_capture_on_commit_callbacks):
    """Without beat (the embedded mode) nothing else would: later requests return the pending run."""
    run = compaction_request(session=long_session)  # its send never happened
    age(CompactionRun.objects.filter(pk=run.pk), "created_at", timedelta(minutes=11))
    model.add(FIRST_SUMMARY)
    with django_capture_on_commit_callbacks(execute=True):
        assert compaction_request(session=long_session) == run

    run.refresh_from_db()
    assert run.status == "done" and run.summary.content == FIRST_SUMMARY


def test_a_turn_past_the_threshold_requests_a_compaction_run_after_commit(long_session, model,
                                                                         django_capture_on_commit_callbacks):
    model.add("Noted.", FIRST_SUMMARY)
    with django_capture_on_commit_callbacks(execute=True):
        turn_post(session=long_session, content="One more thing.", sender="Maria")

    [run] = CompactionRun.objects.filter(session=long_session)
    assert run.status == "done" and run.summary == latest_summary(long_session)


def test_a_lost_consolidation_task_is_sent_again_and_a_redelivered_one_does_nothing(
    kin, model, django_capture_on_commit_callbacks
):
    fact = add_fact(kin, "Maria wants bullet points.")
    with django_capture_on_commit_callbacks(execute=False):
        run = consolidation_request(kin=kin, trigger="api")
    lost(ConsolidationRun.objects.filter(pk=run.pk))
    model.add(answer(processed=[fact.pk]))

    assert jobs_requeue(CONSOLIDATION_JOBS) == [run.pk]

    run.refresh_from_db()
    assert run.status == "applied" and run.started_at is not None
    late = add_fact(kin, "Arrived after the run.")
    model.add(answer(processed=[late.pk]))  # what a second run would apply
    assert consolidate_kin_task.apply(args=[run.pk]).get() == run.pk  # the broker delivers the task again
    assert list(ExperienceVersion.objects.filter(kin=kin).values_list("version", flat=True)) == [1]
    assert Fact.objects.get(pk=late.pk).is_consolidated is False and len(model.script) == 1
    assert jobs_requeue(CONSOLIDATION_JOBS) == []


# --- runs left running by a worker that stopped ------------------------------------------------


def test_a_consolidation_run_left_running_is_failed_by_the_sweep_once_past_the_time_limit(
    kin, model, django_capture_on_commit_callbacks
):
    fact = add_fact(kin, "Maria wants bullet points.")
    run = ConsolidationRun.objects.create(kin=kin, trigger="api", status="running", started_at=timezone.now())
    assert jobs_recover_stalled(CONSOLIDATION_JOBS).failed == []  # within the time limit: it might be going

    age(ConsolidationRun.objects.filter(pk=run.pk), "started_at", CONSOLIDATION_JOBS.stalled_after())
    cache.add(CONSOLIDATION_LOCK_KEY.format(kin_id=kin.pk), "live-worker")
    assert jobs_recover_stalled(CONSOLIDATION_JOBS).failed == []  # its kin's lock is held: left alone
    cache.clear()
    assert recover_stalled_jobs_task.apply().get() == 1

    run.refresh_from_db()
    assert run.status == "failed" and run.finished_at is not None
    assert run.error.startswith("Interrupted: the worker running it stopped before it finished.")
    assert Fact.objects.get(pk=fact.pk).is_consolidated is False
    model.add(answer(processed=[fact.pk]))  # the facts stay pending for the next run
    with django_capture_on_commit_callbacks(execute=True):
        again = consolidation_request(kin=kin, trigger="api")
    assert ConsolidationRun.objects.get(pk=again.pk).status == "applied"


def test_a_compaction_run_left_running_runs_again_and_is_failed_after_its_attempts(long_session, model):
    run = compaction_request(session=long_session)
    CompactionRun.objects.filter(pk=run.pk).update(status="running", attempts=1, started_at=timezone.now())
    assert jobs_recover_stalled(COMPACTION_JOBS).requeued == []  # within the time limit

    age(CompactionRun.objects.filter(pk=run.pk), "started_at", compaction_stalled_after())
    cache.add(COMPACTION_LOCK_KEY.format(session_id=long_session.pk), "live-worker")
    assert jobs_recover_stalled(COMPACTION_JOBS).requeued == []  # its session's lock is held
    cache.clear()
    model.add(FIRST_SUMMARY)
    assert jobs_recover_stalled(COMPACTION_JOBS).requeued == [run.pk]

    run.refresh_from_db()
    assert run.status == "done" and run.attempts == 2 and run.summary.content == FIRST_SUMMARY

    worn = compaction_request(session=long_session)
    CompactionRun.objects.filter(pk=worn.pk).update(status="running", attempts=COMPACTION_MAX_ATTEMPTS,
                                                    started_at=timezone.now() - compaction_stalled_after())
    assert jobs_recover_stalled(COMPACTION_JOBS).failed == [worn.pk]
    worn.refresh_from_db()
    assert worn.status == "failed" and f"{COMPACTION_MAX_ATTEMPTS} times" in worn.error
    assert len(model.calls) == 1


def test_a_compaction_whose_model_fails_waits_pending_for_its_retry_and_fails_on_the_last(long_session, model):
    run = compaction_request(session=long_session)
    model.add(LLMHTTPError("HTTP 503", status_code=503), LLMHTTPError("HTTP 503", status_code=503))
    with pytest.raises(LLMHTTPError):
        compaction_run(run_id=run.pk, last_try=False)
    run.refresh_from_db()
    assert run.status == "pending" and run.started_at is None and "503" in run.error

    with pytest.raises(LLMHTTPError):
        compaction_run(run_id=run.pk, last_try=True)
    run.refresh_from_db()
    assert run.status == "failed" and run.attempts == 2 and run.finished_at is not None


# --- the sweeps ------------------------------------------------------------------------------


def test_a_kind_whose_sweep_fails_does_not_hold_up_the_others(chat_session, model, monkeypatch,
                                                             django_capture_on_commit_callbacks):
    MessageFactory(session=chat_session)
    with django_capture_on_commit_callbacks(execute=False):
        run = introspection_request(session=chat_session, trigger="checkpoint")
    lost(IntrospectionRun.objects.filter(pk=run.pk))
    model.add("Nothing worth storing.")
    broken = JobKind(name="broken", label="broken jobs", model="sessions_app.NoSuchModel", task="no.such.task",
                     stalled_after=lambda: timedelta(0), free=None, give_up=None)
    monkeypatch.setattr(jobs, "_kinds", {"broken": broken, **jobs._kinds})

    assert requeue_jobs_task.apply().get() == 1
    assert recover_stalled_jobs_task.apply().get() == 0

    run.refresh_from_db()
    assert run.status == "done"


@pytest.mark.postgres
@pytest.mark.parametrize(("kind", "pending_index", "running_index"), [
    (TURN_JOBS, "turn_pending", "turn_running"),
    (INTROSPECTION_JOBS, "introspection_run_pending", "introspection_one_running_per_session"),
    (COMPACTION_JOBS, "compaction_run_pending", "compaction_run_running"),
    (CONSOLIDATION_JOBS, "consolidation_run_pending", "consolidation_run_running"),
    (WORKFLOW_RUN_JOBS, "workflow_run_pending", "workflow_run_running"),
], ids=lambda value: value.name if isinstance(value, JobKind) else None)
def test_each_sweep_reads_a_partial_index(db, kind, pending_index, running_index):
    for sweep, index in ((jobs_requeue, pending_index), (jobs_recover_stalled, running_index)):
        with CaptureQueriesContext(connection) as captured:
            sweep(kind)
        [query] = captured.captured_queries
        with connection.cursor() as cursor:
            # The tables are empty here: forbid the sequential scan an empty table would get.
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute("EXPLAIN " + query["sql"])
            plan = "\n".join(row[0] for row in cursor.fetchall())
        assert index in plan, plan
