"""Introspection (SPEC §7): the four triggers, the six tools, the cursor, failures and
duplicates, with the scripted fake model."""
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from kinsite.llm.providers import provider_override
from kinsite.llm.types import LLMHTTPError
from memories.models import Memory, MemoryChange
from sessions_app.introspection import services as introspection
from sessions_app.introspection.converse import introspection_settings
from sessions_app.introspection.services import (
    IntrospectionBusy,
    idle_sessions_due,
    introspection_request,
    session_introspect,
)
from sessions_app.introspection.tools import TOOL_NAMES
from sessions_app.models import Event, IntrospectionRun, Session
from sessions_app.tasks import introspect_session_task, scan_idle_sessions_task
from tests.factories import (
    IntrospectionRunFactory,
    KinFactory,
    MemoryFactory,
    MessageFactory,
    PromptTemplateFactory,
    SessionFactory,
    SummaryFactory,
    TeamFactory,
)
from tests.support.scripted_model import ScriptedProvider

SIX_TOOLS = {"memory_recall", "memory_add", "memory_update", "memory_delete", "working_memory_update",
             "session_description_update"}


# model (the scripted fake model every gateway call goes to) is in tests/conftest.py.


def say(session, content, sender="Maria"):
    event = MessageFactory(session=session, content=content, sender=sender)
    Session.objects.filter(pk=session.pk).update(introspection_pending=True, last_activity_at=timezone.now())
    return event


def run_now(session, trigger="manual"):
    """Request a run and execute its task (what the worker would do after commit)."""
    run = introspection_request(session=session, trigger=trigger)
    introspect_session_task.apply(args=[run.pk])
    run.refresh_from_db()
    return run


def post(api_client, session, content):
    return api_client.post(f"/api/v1/sessions/{session.pk}/messages/",
                           {"content": content, "sender": "Maria", "platform": "slack"}, format="json")


def end_events(session):
    return list(Event.objects.filter(session=session, kind="introspection_end").order_by("id"))


def introspection_calls(model):
    return [call for call in model.calls if call.messages[0]["content"].startswith("You maintain an AI agent")]


# --- the run ---------------------------------------------------------------------------------


def test_a_run_writes_memories_working_memory_and_description(chat_session, model):
    first = say(chat_session, "Our churn report deduplicates by customer id from now on.")
    last = say(chat_session, "Goal: finish the EMEA section by Friday.", sender="Tom")
    Session.objects.filter(pk=chat_session.pk).update(working_memory="Goal: churn report.")
    model.add(
        {"tool_calls": [{"name": "memory_recall", "arguments": {"query": "churn report"}}]},
        {"tool_calls": [
            {"name": "memory_add", "arguments": {"content": "The churn report deduplicates by customer id.",
                                                 "category": "decision", "subject": "churn report",
                                                 "importance": 7}},
            {"name": "working_memory_update", "arguments": {"content": "Goal: EMEA section by Friday."}},
            {"name": "session_description_update", "arguments": {"description": "Churn report, EMEA section"}},
        ]},
        "Stored the dedup decision and updated the notes.",
    )

    run = run_now(chat_session, trigger="checkpoint")

    assert run.status == "done", run.error
    assert (run.first_event_id, run.last_event_id, run.event_count) == (first.pk, last.pk, 2)
    memory = Memory.objects.get()
    assert (memory.content, memory.category, memory.kin) == (
        "The churn report deduplicates by customer id.", "decision", chat_session.kin)
    assert (memory.source, memory.source_ref) == ("introspection", f"introspection_run:{run.pk}")
    assert MemoryChange.objects.get().actor == f"introspection_run:{run.pk}"
    assert run.memories_touched == [{"id": memory.pk, "action": "created"}]
    chat_session.refresh_from_db()
    assert chat_session.working_memory == "Goal: EMEA section by Friday."
    assert chat_session.description == "Churn report, EMEA section"
    assert chat_session.introspection_pending is False
    [tool_names] = [[c["name"] for c in run.tool_calls]]
    assert tool_names == ["memory_recall", "memory_add", "working_memory_update", "session_description_update"]
    # The prompt: raw events, previous working memory, current description, the template's text.
    prompt = introspection_calls(model)[0].messages[1]["content"]
    assert "Maria: Our churn report deduplicates by customer id" in prompt and "Tom: Goal: finish" in prompt
    assert "Goal: churn report." in prompt and "(none yet)" in prompt
    assert "at most 10 tool calls" in prompt and run.template_source == "default"
    # The cursor: a start and an end event; the end event says what changed.
    start = Event.objects.get(session=chat_session, kind="introspection_start")
    [end] = end_events(chat_session)
    assert (run.start_event, run.end_event) == (start, end)
    assert end.data["last_event_id"] == last.pk
    assert "added 1 memory" in end.content and "working memory" in end.content and "description" in end.content
    assert run.tokens_in > 0 and run.finished_at is not None


def test_nothing_worth_storing_is_a_recorded_run_without_changes(chat_session, model):
    say(chat_session, "hi")
    model.add("Nothing worth storing.")

    run = run_now(chat_session)

    assert run.status == "done" and run.summary == "Nothing worth storing."
    assert run.memories_touched == [] and run.tool_calls == [] and run.event_count == 1
    assert [e.content for e in end_events(chat_session)] == ["Nothing worth storing."]
    assert not Memory.objects.exists()
    chat_session.refresh_from_db()
    assert chat_session.working_memory == "" and chat_session.introspection_pending is False


def test_the_next_run_reads_only_events_after_the_cursor(chat_session, model):
    say(chat_session, "first thing")
    model.add("Nothing worth storing.")
    run_now(chat_session)
    later = say(chat_session, "second thing")
    model.add("Nothing worth storing.")

    run = run_now(chat_session)

    assert (run.first_event_id, run.last_event_id, run.event_count) == (later.pk, later.pk, 1)
    prompt = introspection_calls(model)[1].messages[1]["content"]
    assert "second thing" in prompt and "first thing" not in prompt


def test_a_run_without_new_events_is_skipped_without_calling_the_model(chat_session, model):
    run = run_now(chat_session)

    assert run.status == "skipped" and model.calls == []
    assert not Event.objects.filter(session=chat_session).exists()


def test_compaction_summaries_are_never_read(chat_session, model):
    event = say(chat_session, "raw words")
    SummaryFactory(session=chat_session, content="SUMMARY TEXT", first_event=event, last_event=event)
    model.add("Nothing worth storing.")

    run_now(chat_session)

    prompt = introspection_calls(model)[0].messages[1]["content"]
    assert "raw words" in prompt and "SUMMARY TEXT" not in prompt


def test_an_admin_template_of_the_kin_is_used(chat_session, model):
    PromptTemplateFactory(kin=chat_session.kin, kind="introspection", name="short",
                          body="Kin {kin_name}; events:\n{events}")
    say(chat_session, "hello there")
    model.add("Nothing worth storing.")

    run = run_now(chat_session)

    assert run.template_source == "kin"
    assert introspection_calls(model)[0].messages[1]["content"].startswith(f"Kin {chat_session.kin.name}; events:")


# --- the tools -------------------------------------------------------------------------------


def test_the_toolset_is_exactly_the_six_tools(chat_session, model):
    say(chat_session, "hello")
    model.add("Nothing worth storing.")

    run_now(chat_session)

    offered = {tool["name"] for tool in introspection_calls(model)[0].tools}
    assert offered == SIX_TOOLS == set(TOOL_NAMES)


def test_a_seventh_tool_is_refused_as_a_tool_error(chat_session, model):
    say(chat_session, "hello")
    model.add({"tool_calls": [{"name": "memorize", "arguments": {"content": "x", "category": "fact"}},
                              {"name": "search_history", "arguments": {"query": "x"}}]},
              "Nothing worth storing.")

    run = run_now(chat_session)

    assert run.status == "done"
    assert [call["result"].split(":")[0] for call in run.tool_calls] == ["Error", "Error"]
    assert "unknown tool 'memorize'" in run.tool_calls[0]["result"]
    tool_answers = [m for m in introspection_calls(model)[1].messages if m["role"] == "tool"]
    assert all(m["content"].startswith("Error: unknown tool") for m in tool_answers)
    assert not Memory.objects.exists()


def test_the_cap_on_tool_calls_holds(chat_session, model):
    chat_session.kin.overrides = {"introspection": {"max_tool_calls": 2}}
    chat_session.kin.save()
    say(chat_session, "hello")
    recall = {"name": "memory_recall", "arguments": {"query": "x"}}
    model.add({"tool_calls": [recall]}, {"tool_calls": [recall, recall, recall]}, "Done.")

    run = run_now(chat_session)

    assert run.status == "done"
    assert [call["result"].startswith("Error: not run") for call in run.tool_calls] == [False, False, True, True]
    calls = introspection_calls(model)
    assert len(calls) == 3 and calls[0].tools and calls[1].tools and calls[2].tools is None
    assert "at most 2 tool calls" in calls[0].messages[1]["content"]


def test_update_and_delete_touch_only_the_kins_active_memories(chat_session, model):
    own = MemoryFactory(kin=chat_session.kin, content="Maria likes tea.")
    gone = MemoryFactory(kin=chat_session.kin, content="The office is in Berlin.")
    foreign = MemoryFactory(kin=KinFactory(team=chat_session.kin.team), content="Not yours.")
    say(chat_session, "Maria now prefers coffee; we moved to Hamburg.")
    model.add({"tool_calls": [
        {"name": "memory_update", "arguments": {"id": own.pk, "content": "Maria likes coffee.", "reason": "changed"}},
        {"name": "memory_delete", "arguments": {"id": gone.pk, "reason": "moved"}},
        {"name": "memory_delete", "arguments": {"id": foreign.pk, "reason": "nope"}},
    ]}, "Updated.")

    run = run_now(chat_session)

    assert run.status == "done"
    own.refresh_from_db(), gone.refresh_from_db(), foreign.refresh_from_db()
    assert own.content == "Maria likes coffee." and gone.status == "deleted" and foreign.status == "active"
    assert run.tool_calls[2]["result"].startswith("Error: no active memory")
    assert run.memories_touched == [{"id": own.pk, "action": "updated"}, {"id": gone.pk, "action": "deleted"}]
    assert set(MemoryChange.objects.values_list("actor", flat=True)) == {f"introspection_run:{run.pk}"}


# --- failures and duplicates ---------------------------------------------------------------


def test_an_error_mid_run_leaves_cursor_and_memories_and_the_next_run_sees_the_same_events(chat_session, model):
    first = say(chat_session, "We ship on May 3.")
    last = say(chat_session, "Tom owns the release notes.")
    Session.objects.filter(pk=chat_session.pk).update(working_memory="old notes")
    model.add(
        {"tool_calls": [
            {"name": "memory_add", "arguments": {"content": "The ship date is May 3.", "category": "decision"}},
            {"name": "working_memory_update", "arguments": {"content": "half-written notes"}},
        ]},
        LLMHTTPError("upstream exploded", status_code=500),
    )

    failed = run_now(chat_session)

    assert failed.status == "failed" and "upstream exploded" in failed.error
    assert (failed.first_event_id, failed.last_event_id) == (first.pk, last.pk)
    assert len(failed.tool_calls) == 2  # what it tried is recorded
    assert not Memory.objects.exists() and not MemoryChange.objects.exists()
    chat_session.refresh_from_db()
    assert chat_session.working_memory == "old notes" and chat_session.introspection_pending is True
    assert end_events(chat_session) == []  # the cursor did not move

    model.add({"tool_calls": [{"name": "memory_add", "arguments": {"content": "The ship date is May 3.",
                                                                   "category": "decision"}}]}, "Stored.")
    retry = run_now(chat_session)

    assert retry.status == "done"
    assert (retry.first_event_id, retry.last_event_id, retry.event_count) == (first.pk, last.pk, 2)
    prompts = [call.messages[1]["content"] for call in introspection_calls(model)]
    assert prompts[0] == prompts[-1]  # the same events, working memory and description: the same prompt
    assert Memory.objects.count() == 1 and end_events(chat_session)[0].data["last_event_id"] == last.pk


def test_a_duplicate_delivery_of_the_same_task_is_a_no_op(chat_session, model):
    say(chat_session, "hello")
    model.add("Nothing worth storing.")
    run = introspection_request(session=chat_session, trigger="manual")

    introspect_session_task.apply(args=[run.pk])
    introspect_session_task.apply(args=[run.pk])  # delivered again

    run.refresh_from_db()
    assert run.status == "done" and len(model.calls) == 1
    assert len(end_events(chat_session)) == 1
    assert Event.objects.filter(kind="introspection_start").count() == 1


def test_a_delivery_while_the_same_run_is_in_progress_does_nothing(chat_session, model):
    say(chat_session, "hello")
    run = introspection_request(session=chat_session, trigger="manual")
    with introspection._session_lock(chat_session.pk, run.pk) as holder:
        assert holder is None  # we hold it, as the first delivery would
        assert session_introspect(run_id=run.pk) == run

    run.refresh_from_db()
    assert run.status == "pending" and model.calls == []


def test_a_second_run_while_one_is_in_progress_is_busy_and_then_skipped(chat_session, model):
    say(chat_session, "hello")
    running = IntrospectionRunFactory(session=chat_session, trigger="manual")
    queued = IntrospectionRunFactory(session=chat_session, trigger="checkpoint")
    with introspection._session_lock(chat_session.pk, running.pk):
        with pytest.raises(IntrospectionBusy):
            session_introspect(run_id=queued.pk)
        introspect_session_task.apply(args=[queued.pk])  # eager: no retry, skipped

    queued.refresh_from_db()
    assert queued.status == "skipped" and model.calls == []


def test_a_run_left_running_by_a_dead_worker_is_run_again(chat_session, model):
    say(chat_session, "hello")
    run = introspection_request(session=chat_session, trigger="manual")
    IntrospectionRun.objects.filter(pk=run.pk).update(status="running")  # the worker died mid-run
    model.add("Nothing worth storing.")

    introspect_session_task.apply(args=[run.pk])  # acks_late: delivered again

    run.refresh_from_db()
    assert run.status == "done"


def test_a_requested_run_is_reused_while_pending(chat_session):
    first = introspection_request(session=chat_session, trigger="checkpoint")
    second = introspection_request(session=chat_session, trigger="idle")

    assert first == second and IntrospectionRun.objects.count() == 1


@pytest.mark.postgres
def test_two_concurrent_runs_for_one_session_end_in_one_run(transactional_db):
    session = SessionFactory(kin=KinFactory(team=TeamFactory()))
    say(session, "hello")
    runs = [IntrospectionRunFactory(session=session, trigger=t) for t in ("checkpoint", "idle")]
    # The same run delivered twice as well: four deliveries racing for one session.
    deliveries = [runs[0].pk, runs[1].pk, runs[0].pk, runs[1].pk]
    model = ScriptedProvider(["Nothing worth storing."] * 4)
    slow_chat = model.chat

    def chat(*args, **kwargs):
        time.sleep(0.3)  # long enough for every delivery to arrive while the first runs
        return slow_chat(*args, **kwargs)

    model.chat = chat
    barrier = threading.Barrier(len(deliveries))

    def deliver(run_id):
        try:
            barrier.wait()
            introspect_session_task.apply(args=[run_id])
        finally:
            connection.close()

    with provider_override(model):
        threads = [threading.Thread(target=deliver, args=(run_id,)) for run_id in deliveries]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)

    statuses = sorted(IntrospectionRun.objects.filter(session=session).values_list("status", flat=True))
    assert statuses == ["done", "skipped"]
    assert len(model.calls) == 1
    assert Event.objects.filter(session=session, kind="introspection_end").count() == 1


# --- triggers --------------------------------------------------------------------------------


def test_checkpoint_command_introspects_the_session(api_client, chat_session, model,
                                                    django_capture_on_commit_callbacks):
    say(chat_session, "Remember: invoices go to Lena.")
    model.add({"tool_calls": [{"name": "memory_add", "arguments": {
        "content": "Invoices go to Lena.", "category": "fact", "subject": "invoices"}}]}, "Stored one fact.")

    with django_capture_on_commit_callbacks(execute=True):
        response = post(api_client, chat_session, "/checkpoint end of sprint")

    assert response.status_code == 201, response.content
    run = IntrospectionRun.objects.get()
    assert run.trigger == "checkpoint" and run.status == "done", run.error
    assert f"Introspection run {run.pk}" in response.json()["reply"]["content"]
    command = Event.objects.get(session=chat_session, kind="command", role="user")
    assert run.last_event_id == command.pk  # the command itself is read, its system reply is not
    assert Memory.objects.get().source_ref == f"introspection_run:{run.pk}"


def test_checkpoint_api_queues_a_run_and_lists_it(api_client, chat_session, model,
                                                  django_capture_on_commit_callbacks):
    say(chat_session, "hello")
    model.add("Nothing worth storing.")

    with django_capture_on_commit_callbacks(execute=True):
        response = api_client.post(f"/api/v1/sessions/{chat_session.pk}/checkpoint/")

    assert response.status_code == 202, response.content
    run = response.json()["run"]
    assert run["trigger"] == "checkpoint" and run["session"] == chat_session.pk
    listed = api_client.get(f"/api/v1/sessions/{chat_session.pk}/introspections/")
    assert listed.status_code == 200
    [item] = listed.json()["results"]
    assert item["id"] == run["id"] and item["status"] == "done" and item["summary"] == "Nothing worth storing."
    assert item["end_event"] is not None and item["event_count"] == 1


def test_checkpoint_api_answers_409_when_introspection_is_disabled(api_client, chat_session, model):
    chat_session.kin.overrides = {"introspection": {"enabled": False}}
    chat_session.kin.save()

    response = api_client.post(f"/api/v1/sessions/{chat_session.pk}/checkpoint/")

    assert response.status_code == 409 and response.json()["error"]["code"] == "introspection_disabled"
    assert not IntrospectionRun.objects.exists()


def test_new_command_introspects_the_old_session_and_answers_with_the_new_one(
    api_client, chat_session, model, django_capture_on_commit_callbacks
):
    say(chat_session, "I am Maria.")
    say(chat_session, "I am Tom.", sender="Tom")
    model.add("Nothing worth storing.")

    with django_capture_on_commit_callbacks(execute=True):
        response = post(api_client, chat_session, "/new Launch planning")

    assert response.status_code == 201, response.content
    body = response.json()
    new = body["new_session"]
    assert new["id"] == body["new_session_id"] and new["kin"] == chat_session.kin.pk
    assert new["title"] == "Launch planning"
    run = IntrospectionRun.objects.get()
    assert (run.session, run.trigger, run.status) == (chat_session, "new", "done")
    opening = Event.objects.get(session_id=new["id"])
    assert opening.data["previous_session_id"] == chat_session.pk
    assert {p["name"] for p in opening.data["participants"]} == {"Maria", "Tom"}


def test_every_turn_interval_completed_turns_trigger_a_run(api_client, chat_session, model,
                                                           django_capture_on_commit_callbacks):
    chat_session.kin.overrides = {"introspection": {"turn_interval": 2}}
    chat_session.kin.save()
    model.add("reply one", "reply two", "Nothing worth storing.", "reply three")

    with django_capture_on_commit_callbacks(execute=True):
        post(api_client, chat_session, "one")
    assert not IntrospectionRun.objects.exists()
    chat_session.refresh_from_db()
    assert chat_session.turns_since_introspection == 1 and chat_session.introspection_pending

    with django_capture_on_commit_callbacks(execute=True):
        post(api_client, chat_session, "two")
    run = IntrospectionRun.objects.get()
    assert (run.trigger, run.status, run.event_count) == ("turns", "done", 4)

    with django_capture_on_commit_callbacks(execute=True):
        post(api_client, chat_session, "three")
    assert IntrospectionRun.objects.count() == 1
    chat_session.refresh_from_db()
    assert chat_session.turns_since_introspection == 1


def test_imported_messages_flag_the_session_for_introspection(api_client, chat_session):
    response = api_client.post(f"/api/v1/sessions/{chat_session.pk}/messages/import/",
                               {"messages": [{"content": "old", "created_at": "2020-01-01T00:00:00Z"}]},
                               format="json")

    assert response.status_code == 201
    chat_session.refresh_from_db()
    assert chat_session.introspection_pending is True


# --- the idle scan ---------------------------------------------------------------------------


def _idle_session(kin, *, minutes_idle, pending=True, with_events=True):
    session = SessionFactory(kin=kin)
    if with_events:
        MessageFactory(session=session)
    Session.objects.filter(pk=session.pk).update(
        introspection_pending=pending, last_activity_at=timezone.now() - timedelta(minutes=minutes_idle)
    )
    return Session.objects.get(pk=session.pk)


def test_idle_scan_finds_sessions_just_over_the_timeout_only(kin):
    now = timezone.now()
    over = _idle_session(kin, minutes_idle=10.05)
    under = _idle_session(kin, minutes_idle=9.95)
    _idle_session(kin, minutes_idle=60, pending=False)  # nothing new

    due = idle_sessions_due(now)

    assert [s.pk for s in due] == [over.pk]
    assert under.pk not in [s.pk for s in due]


def test_idle_scan_skips_sessions_whose_events_are_all_before_their_cursor(kin, model):
    session = _idle_session(kin, minutes_idle=0)
    model.add("Nothing worth storing.")
    run_now(session)
    # Flagged again (e.g. a bookkeeping write) but with nothing after the cursor, and idle.
    Session.objects.filter(pk=session.pk).update(
        introspection_pending=True, last_activity_at=timezone.now() - timedelta(minutes=30)
    )

    assert idle_sessions_due(timezone.now()) == []
    session.refresh_from_db()
    assert session.introspection_pending is False  # the stale flag is cleared


def test_idle_scan_honours_per_kin_timeouts_and_disabled_kins(team):
    quick = KinFactory(team=team, overrides={"introspection": {"idle_timeout_minutes": 2}})
    off = KinFactory(team=team, overrides={"introspection": {"enabled": False}})
    normal = KinFactory(team=team)
    quick_due = _idle_session(quick, minutes_idle=3)
    _idle_session(off, minutes_idle=60)
    _idle_session(normal, minutes_idle=3)

    assert [s.pk for s in idle_sessions_due(timezone.now())] == [quick_due.pk]


def test_idle_scan_skips_sessions_with_a_queued_run(kin):
    session = _idle_session(kin, minutes_idle=30)
    IntrospectionRunFactory(session=session, trigger="checkpoint")

    assert idle_sessions_due(timezone.now()) == []


def test_idle_scan_task_introspects_due_sessions(kin, model, django_capture_on_commit_callbacks):
    due = _idle_session(kin, minutes_idle=11)
    _idle_session(kin, minutes_idle=1)
    model.add("Nothing worth storing.")

    with django_capture_on_commit_callbacks(execute=True):
        assert scan_idle_sessions_task.apply().get() == 1

    run = IntrospectionRun.objects.get()
    assert (run.session_id, run.trigger, run.status) == (due.pk, "idle", "done")
    due.refresh_from_db()
    assert due.introspection_pending is False


def test_idle_scan_queries_do_not_grow_with_the_number_of_sessions(kin, django_assert_max_num_queries):
    for _ in range(30):
        _idle_session(kin, minutes_idle=1)  # flagged, not idle long enough
        _idle_session(kin, minutes_idle=600, pending=False)  # idle, nothing new
    _idle_session(kin, minutes_idle=30)

    with django_assert_max_num_queries(6):
        assert len(idle_sessions_due(timezone.now())) == 1


def test_introspection_settings_merge_kin_overrides_and_ignore_bad_values(kin, settings):
    settings.INTROSPECTION = {**settings.INTROSPECTION, "turn_interval": 7, "model": None}
    kin.overrides = {"introspection": {"max_tool_calls": 3, "turn_interval": "often", "model": "small-model"}}

    config = introspection_settings(kin)

    assert (config.enabled, config.turn_interval, config.max_tool_calls, config.model) == (True, 7, 3, "small-model")
    assert config.idle_timeout_minutes == 10
