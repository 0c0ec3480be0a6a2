"""Compaction (SPEC §5): past the threshold a summary is made with the structured prompt,
covering all but the newest keep window; the newest summary is the boundary the next
prompt reads; a second compaction merges the first. Token counts are real tiktoken."""
import json
import re
import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.core.cache import cache
from django.db import connection, transaction

from kinsite.llm.providers import provider_override
from kinsite.llm.types import LLMError, LLMHTTPError
from kinsite.models import LLMCall
from kinsite.tokencount import count_tokens
from sessions_app.compaction import (
    LOCK_KEY,
    compaction_cut,
    compaction_needed,
    compaction_request,
    late_events,
    latest_summary,
    session_compact,
    unsummarised_events,
)
from sessions_app.models import Event, Summary
from sessions_app.prompt.assembly import prompt_assemble
from sessions_app.prompt.history import HistoryItem
from sessions_app.selectors import history_search
from sessions_app.services import ImportItem, messages_import
from sessions_app.tasks import compact_session_task
from tests.factories import MessageFactory, PromptTemplateFactory
from tests.support.scripted_model import ScriptedProvider

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
BUDGET = 300  # trigger above 225 tokens, keep the newest 75

FIRST_SUMMARY = (
    "## Key facts & decisions\n- Maria: the churn report is due Friday.\n"
    "## Completed work\n- Region figures collected.\n"
    "## Open threads\n- Maria asked for the revised churn numbers.\n"
    "## Conversation dynamics\nNothing notable."
)
SECOND_SUMMARY = (
    "## Key facts & decisions\n- Maria: churn report due Friday; Tom: budget approved.\n"
    "## Completed work\n- Churn numbers revised.\n"
    "## Open threads\n- Tom's budget slides.\n"
    "## Conversation dynamics\nNothing notable."
)


def at(minute: int) -> datetime:
    return T0 + timedelta(minutes=minute)


def say(session, minute: int, content: str, *, sender: str = "Maria", role: str = Event.Role.USER) -> Event:
    return MessageFactory(session=session, created_at=at(minute), content=content, sender=sender, role=role)


def chatter(session, first_minute: int, count: int) -> list[Event]:
    """`count` messages, a minute apart, alternating Maria and the kin (14 tokens each)."""
    events = []
    for i in range(count):
        minute = first_minute + i
        if i % 2:
            events.append(say(session, minute, f"Noted: region {minute} gets the revised churn numbers by Friday.",
                              sender="", role=Event.Role.ASSISTANT))
        else:
            text = f"Please add region {minute} to the quarterly churn report for the board."
            events.append(say(session, minute, text))
    return events


def tool_call(session, minute: int, call_id: str, name: str, arguments: dict) -> Event:
    raw = json.dumps(arguments)
    return MessageFactory(
        session=session, created_at=at(minute), kind=Event.Kind.TOOL_CALL, role=Event.Role.ASSISTANT,
        sender="", content="", token_count=count_tokens(name + raw),
        data={"tool_calls": [{"id": call_id, "name": name, "arguments": raw}]},
    )


def tool_result(session, minute: int, call_id: str, name: str, content: str) -> Event:
    return MessageFactory(
        session=session, created_at=at(minute), kind=Event.Kind.TOOL_RESULT, role=Event.Role.TOOL,
        sender="", content=content, data={"tool_call_id": call_id, "name": name},
    )


def expected_kept(events: list[Event], keep_tokens: int) -> list[Event]:
    """The newest plain messages whose tokens fit the keep window."""
    kept, total = [], 0
    for event in reversed(events):
        if total + event.token_count > keep_tokens:
            break
        kept.insert(0, event)
        total += event.token_count
    return kept


def sent_prompt(provider: ScriptedProvider, call: int = -1) -> str:
    return "\n".join(message["content"] for message in provider.calls[call].messages)


@pytest.fixture
def session(chat_session):
    chat_session.kin.history_token_budget = BUDGET
    chat_session.kin.save()
    return chat_session


@pytest.fixture
def llm():
    with provider_override(ScriptedProvider()) as provider:
        yield provider


# --- the trigger ---------------------------------------------------------------------------


def test_below_threshold_no_summary_and_no_model_call(session, llm):
    chatter(session, 0, 6)  # 84 tokens of 225

    assert compaction_needed(session=session) is False
    assert session_compact(session=session) is None
    assert not Summary.objects.exists()
    assert llm.calls == []


def test_trigger_counts_history_kinds_only_in_two_queries(session, llm, django_assert_num_queries):
    chatter(session, 0, 6)
    MessageFactory(session=session, kind=Event.Kind.COMMAND, content="/checkpoint", token_count=10_000,
                   created_at=at(10))
    with django_assert_num_queries(2):
        assert compaction_needed(session=session) is False

    chatter(session, 20, 12)  # now 252 tokens of history

    assert compaction_needed(session=session) is True


# --- the first compaction ------------------------------------------------------------------


def test_summary_covers_everything_but_the_keep_window(session, llm):
    events = chatter(session, 0, 20)
    llm.add(FIRST_SUMMARY)
    kept = expected_kept(events, BUDGET // 4)
    covered = events[: len(events) - len(kept)]
    assert kept and sum(e.token_count for e in events) > 0.75 * BUDGET

    summary = session_compact(session=session)

    assert summary is not None
    assert summary.content == FIRST_SUMMARY
    assert summary.first_event == events[0]
    assert summary.last_event == covered[-1]
    assert (summary.first_at, summary.last_at) == (events[0].created_at, covered[-1].created_at)
    assert summary.message_count == len(covered)
    assert summary.token_count == count_tokens(FIRST_SUMMARY)
    assert summary.previous is None
    # What the next prompt's selector reads: this summary, then exactly the kept messages.
    assert latest_summary(session) == summary
    assert list(unsummarised_events(session=session, summary=summary)) == kept
    assert compaction_needed(session=session) is False
    [call] = LLMCall.objects.filter(purpose="compaction")
    assert (call.status, call.kin_id, call.team_id) == (LLMCall.Status.OK, session.kin_id, session.kin.team_id)


def test_keep_tokens_setting_overrides_the_quarter_budget(session, llm, settings):
    events = chatter(session, 0, 20)
    settings.COMPACTION_KEEP_TOKENS = BUDGET // 2
    kept = expected_kept(events, BUDGET // 2)
    assert len(kept) > len(expected_kept(events, BUDGET // 4))
    llm.add(FIRST_SUMMARY)

    summary = session_compact(session=session)

    assert list(unsummarised_events(session=session, summary=summary)) == kept


def test_prompt_has_header_four_sections_and_never_drop_open_threads(session, llm):
    events = chatter(session, 0, 20)
    llm.add(FIRST_SUMMARY)

    summary = session_compact(session=session)

    covered = [e for e in events if e.created_at <= summary.last_at]
    prompt = sent_prompt(llm)
    assert f"Transcript: 2026-03-02T09:00:00+00:00 to {summary.last_at.isoformat()}, {len(covered)} messages." in prompt
    for section in ("## Key facts & decisions", "## Completed work", "## Open threads", "## Conversation dynamics"):
        assert section in prompt
    assert "never drop an unresolved thread" in prompt
    assert "attributed to who said" in prompt
    assert "Only if relevant" in prompt
    # The transcript: sender, time and content of every covered message, none of the kept ones.
    assert "[2026-03-02T09:00:00+00:00] Maria: Please add region 0 to the quarterly churn report" in prompt
    assert f"[2026-03-02T09:01:00+00:00] {session.kin.name}: Noted: region 1" in prompt
    assert events[-1].content not in prompt
    assert "previous summary" not in prompt


@pytest.mark.parametrize("pair_fits", [True, False])
def test_tool_call_and_its_result_are_never_split(session, llm, pair_fits):
    older = chatter(session, 0, 14)
    tool_call(session, 20, "call_early", "memory_recall", {"query": "churn deadline"})
    tool_result(session, 21, "call_early", "memory_recall", "Churn report due Friday.")
    last_old = say(session, 22, "Thanks, that matches what I remembered about the deadline.")
    call = tool_call(session, 30, "call_late", "memory_recall", {"query": "board meeting date and agenda"})
    result = tool_result(session, 31, "call_late", "memory_recall", "Board meeting on the 12th: churn, budget.")
    newest = [say(session, 32, "Great, put churn first on the agenda."),
              say(session, 33, "Done.", sender="", role=Event.Role.ASSISTANT)]
    # A keep window that always fits the result and the newest messages, so a naive cut
    # would fall between the call and its result; with the call it fits or not.
    keep = result.token_count + sum(e.token_count for e in newest) + call.token_count - (0 if pair_fits else 1)
    session.kin.history_token_budget = 4 * keep + 3  # int(0.25 * budget) == keep
    session.kin.save()
    assert sum(e.token_count for e in older) > 0.75 * session.kin.history_token_budget
    llm.add(FIRST_SUMMARY)

    summary = session_compact(session=session)

    kept = list(unsummarised_events(session=session, summary=summary))
    prompt = sent_prompt(llm)
    if pair_fits:
        assert summary.last_event == last_old
        assert kept == [call, result, *newest]
        assert "board meeting date" not in prompt
    else:
        assert summary.last_event == result
        assert kept == newest
        assert "board meeting date" in prompt and "Board meeting on the 12th" in prompt
    # Summarised tool traffic is shown compactly, the call with its arguments, the result clipped.
    assert '] Kin' in prompt and 'called memory_recall({"query": "churn deadline"})' in prompt
    assert "memory_recall returned: Churn report due Friday." in prompt
    assert summary.message_count == len(older) + 1  # tool events are not messages


# --- the second compaction merges the first ------------------------------------------------


def test_second_compaction_merges_the_first(session, llm):
    first_events = chatter(session, 0, 20)
    llm.add(FIRST_SUMMARY, SECOND_SUMMARY)
    first = session_compact(session=session)
    second_events = chatter(session, 100, 16)
    assert compaction_needed(session=session) is True

    second = session_compact(session=session)

    assert second.previous == first
    assert second.first_event == first_events[0]
    assert second.first_at == first_events[0].created_at
    assert second.last_at > first.last_at
    prompt = sent_prompt(llm)
    # The previous summary is stored text: quoted, line by line (kinsite.prompt_safety).
    assert "\n".join(f"> {line}" for line in FIRST_SUMMARY.splitlines()) in prompt
    assert "Merge it with the new transcript" in prompt
    assert "close resolved threads, add new ones, keep the rest" in prompt
    assert f"covers 2026-03-02T09:00:00+00:00 to {first.last_at.isoformat()} ({first.message_count} messages)" in prompt
    # The new transcript starts right after the first boundary: the first keep window.
    assert first_events[-1].content in prompt
    assert first_events[0].content not in prompt
    newly_covered = Event.objects.filter(session=session, created_at__gt=first.last_at,
                                         created_at__lte=second.last_at).count()
    assert second.message_count == first.message_count + newly_covered
    assert "Covered by the summary you write: 2026-03-02T09:00:00+00:00" in prompt
    # The next prompt reads the newest summary and only what follows it.
    assert latest_summary(session) == second
    kept = list(unsummarised_events(session=session, summary=second))
    assert kept == expected_kept(first_events + second_events, BUDGET // 4)


# --- a message imported into summarised time ----------------------------------------------

LATE_TEXT = "The board moved the churn review to Monday."


def import_late(session, minute: float, external_id: str = "slack-late-1") -> Event:
    result = messages_import(session=session, items=[ImportItem(
        content=LATE_TEXT, sender="Tom", platform="slack", created_at=T0 + timedelta(minutes=minute),
        external_id=external_id,
    )])
    assert result.created == 1
    return Event.objects.get(session=session, external_id=external_id)


def conversation_counts(session) -> dict[str, int]:
    """The conversation_state section's counts, as the next prompt would carry them."""
    prompt = prompt_assemble(session=session, message_text="")
    [state] = [section.text for section in prompt.sections if section.id == "conversation_state"]
    visible, total = re.search(r"Visible messages: (\d+) of (\d+)", state).groups()
    summarised = re.search(r"Summarised messages: (\d+)", state).group(1)
    unfolded = re.search(r"Messages neither visible nor summarised: (\d+)", state)
    return {"visible": int(visible), "total": int(total), "summarised": int(summarised),
            "unfolded": int(unfolded.group(1)) if unfolded else 0}


def test_message_imported_into_summarised_time_is_counted_then_folded_by_the_next_compaction(session, llm):
    chatter(session, 0, 20)
    llm.add(FIRST_SUMMARY, SECOND_SUMMARY)
    first = session_compact(session=session)
    late = import_late(session, 3.5)
    assert first.first_at < late.created_at < first.last_at

    # Meanwhile: neither in the summary nor in the history, but counted, and searchable.
    counts = conversation_counts(session)
    assert counts["unfolded"] == 1
    assert counts["visible"] + counts["summarised"] + counts["unfolded"] == counts["total"]
    assert late in history_search(query="churn review Monday", limit=5, session=session)
    assert list(late_events(session=session, summary=first)) == [late]

    chatter(session, 100, 16)
    second = session_compact(session=session)

    prompt = sent_prompt(llm)
    assert f"[2026-03-02T09:03:30+00:00] Tom: {LATE_TEXT}" in prompt
    assert "imported after the previous summary was written" in prompt
    newly_covered = Event.objects.filter(session=session, created_at__gt=first.last_at,
                                         created_at__lte=second.last_at).count()
    assert second.message_count == first.message_count + newly_covered + 1
    assert list(late_events(session=session, summary=second)) == []
    counts = conversation_counts(session)
    assert counts["unfolded"] == 0
    assert counts["visible"] + counts["summarised"] == counts["total"]


def test_import_into_summarised_time_schedules_a_fold_that_keeps_the_boundary(
    session, llm, django_capture_on_commit_callbacks
):
    chatter(session, 0, 20)
    llm.add(FIRST_SUMMARY, SECOND_SUMMARY)
    first = session_compact(session=session)
    kept = list(unsummarised_events(session=session, summary=first))

    with django_capture_on_commit_callbacks(execute=True):
        late = import_late(session, -5)  # even before the session's first message

    second = latest_summary(session)
    assert second.previous == first
    assert second.last_event == first.last_event  # the visible history is unchanged
    assert list(unsummarised_events(session=session, summary=second)) == kept
    assert (second.first_event, second.first_at) == (late, late.created_at)
    assert second.message_count == first.message_count + 1
    prompt = sent_prompt(llm)
    assert f"[2026-03-02T08:55:00+00:00] Tom: {LATE_TEXT}" in prompt
    assert "\n".join(f"> {line}" for line in FIRST_SUMMARY.splitlines()) in prompt  # merged, quoted as stored text
    assert f"Covered by the summary you write: 2026-03-02T08:55:00+00:00 to {first.last_at.isoformat()}" in prompt
    counts = conversation_counts(session)
    assert counts["visible"] + counts["summarised"] == counts["total"] and counts["unfolded"] == 0

    # A message imported after the boundary is simply history: nothing to fold.
    with django_capture_on_commit_callbacks(execute=True):
        messages_import(session=session, items=[ImportItem(content="Later note.", created_at=at(200))])
    assert latest_summary(session) == second and len(llm.calls) == 2


@pytest.mark.postgres
def test_compaction_running_during_an_import_never_takes_its_messages_as_summarised(transactional_db, chat_session,
                                                                                       llm):
    # The race: an import has written (ids taken) but not committed when a newer message
    # commits and compaction reads. Without waiting for the import, compaction would record
    # the newer message's id as read, and the import's older ids would pass for summarised.
    session = chat_session
    session.kin.history_token_budget = BUDGET
    session.kin.save()
    chatter(session, 0, 20)
    llm.add(FIRST_SUMMARY, SECOND_SUMMARY)
    first = session_compact(session=session)
    written, finish = threading.Event(), threading.Event()

    def import_slowly():
        try:
            with transaction.atomic():
                import_late(session, 3.5)
                written.set()
                finish.wait(10)
        finally:
            connection.close()

    importer = threading.Thread(target=import_slowly)
    importer.start()
    assert written.wait(10)
    chatter(session, 100, 16)  # committed, with ids newer than the import's; over the trigger
    result = {}

    def compact():
        try:
            result["summary"] = session_compact(session=session)
        finally:
            connection.close()

    compactor = threading.Thread(target=compact)
    compactor.start()
    compactor.join(0.5)
    assert compactor.is_alive()  # waiting for the import to commit
    finish.set()
    importer.join(10)
    compactor.join(10)

    second = result["summary"]
    assert second.previous == first
    assert f"Tom: {LATE_TEXT}" in sent_prompt(llm)
    assert list(late_events(session=session, summary=second)) == []
    counts = conversation_counts(session)
    assert counts["visible"] + counts["summarised"] == counts["total"] and counts["unfolded"] == 0


def test_kin_template_override_is_the_prompt_the_model_receives(session, llm, other_team):
    team = session.kin.team
    PromptTemplateFactory(team=team, kind="compaction", name="team", body="TEAM {transcript}")
    PromptTemplateFactory(
        team=team, kin=session.kin, kind="compaction", name="terse",
        body="Terse summary for {kin_name} of {message_count} messages ({{no prose}}):\n{transcript}",
    )
    PromptTemplateFactory(team=other_team, kind="compaction", name="other", body="OTHER {transcript}")
    events = chatter(session, 0, 20)
    llm.add(FIRST_SUMMARY)

    summary = session_compact(session=session)

    user_prompt = llm.calls[-1].messages[-1]["content"]
    assert user_prompt.startswith(
        f"Terse summary for {session.kin.name} of {summary.message_count} messages ({{no prose}}):\n"
        "[2026-03-02T09:00:00+00:00] Maria: Please add region 0"
    )
    assert events[-1].content not in user_prompt
    assert "TEAM" not in user_prompt and "OTHER" not in user_prompt and "## Open threads" not in user_prompt


def test_broken_stored_template_falls_back_to_the_built_in_prompt(session, llm):
    # Admin refuses this body; a row written around admin must not stop compaction.
    PromptTemplateFactory(kin=session.kin, kind="compaction", name="broken", body="{transcript.__class__}")
    chatter(session, 0, 20)
    llm.add(FIRST_SUMMARY)

    assert session_compact(session=session) is not None
    assert "## Open threads" in sent_prompt(llm)


# --- failures and duplicates ---------------------------------------------------------------


def test_failing_model_leaves_no_summary_and_messages_unchanged(session, llm):
    chatter(session, 0, 20)
    before = list(Event.objects.order_by("id").values())
    llm.add(LLMHTTPError("The model endpoint answered HTTP 503: overloaded", status_code=503))

    with pytest.raises(LLMError):
        session_compact(session=session)

    assert not Summary.objects.exists()
    assert list(Event.objects.order_by("id").values()) == before
    [call] = LLMCall.objects.filter(purpose="compaction")
    assert call.status == LLMCall.Status.ERROR
    assert compaction_needed(session=session) is True  # the next run tries again
    assert cache.get(LOCK_KEY.format(session_id=session.pk)) is None


def test_empty_answer_is_an_error_and_writes_nothing(session, llm):
    chatter(session, 0, 20)
    llm.add("   ")

    with pytest.raises(LLMError):
        session_compact(session=session)

    assert not Summary.objects.exists()


def test_duplicate_task_run_makes_one_summary(session, llm):
    chatter(session, 0, 20)
    llm.add(FIRST_SUMMARY)  # a second model call would exhaust the script and fail

    run = compaction_request(session=session)
    compact_session_task(run.pk)
    compact_session_task(run.pk)

    assert Summary.objects.filter(session=session).count() == 1
    assert len(llm.calls) == 1


def test_run_skips_while_another_holds_the_session(session, llm):
    chatter(session, 0, 20)
    key = LOCK_KEY.format(session_id=session.pk)
    assert cache.add(key, "other-worker", timeout=60)
    try:
        assert session_compact(session=session) is None
    finally:
        cache.delete(key)

    assert not Summary.objects.exists()
    assert llm.calls == []


def test_task_via_delay_compacts(session, llm):
    chatter(session, 0, 20)
    llm.add(FIRST_SUMMARY)

    compact_session_task.delay(compaction_request(session=session).pk)

    assert latest_summary(session).content == FIRST_SUMMARY


def test_worker_run_hands_a_model_failure_to_celery_retries(session, llm):
    # Called directly the task runs as on a worker (not eager), where autoretry turns the
    # LLM error into a retry with backoff; Celery re-raises it when called directly.
    chatter(session, 0, 20)
    llm.add(LLMHTTPError("HTTP 503", status_code=503))

    with pytest.raises(LLMHTTPError):
        compact_session_task(compaction_request(session=session).pk)

    assert not Summary.objects.exists()
    assert compact_session_task.autoretry_for == (LLMError,)
    assert (compact_session_task.max_retries, compact_session_task.retry_backoff) == (3, True)


def test_eager_run_logs_a_model_failure_without_raising(session, llm):
    # Eagerly the task runs inside the request that enqueued it: the failure must not
    # become that request's error. The next turn over the threshold enqueues it again.
    chatter(session, 0, 20)
    llm.add(LLMHTTPError("HTTP 503", status_code=503))

    compact_session_task.delay(compaction_request(session=session).pk)

    assert not Summary.objects.exists()
    assert LLMCall.objects.get(purpose="compaction").status == LLMCall.Status.ERROR
    assert compaction_needed(session=session) is True


def test_task_for_a_missing_run_is_a_no_op(db, llm):
    compact_session_task.delay(987654)

    assert llm.calls == []


# --- the cut (pure) ------------------------------------------------------------------------


def _item(id_, tokens, *, call_ids=(), answers=None):
    return HistoryItem(id=id_, role="user", kind="message", tokens=tokens, tool_call_ids=tuple(call_ids),
                       tool_call_id=answers)


def test_cut_keeps_the_newest_unit_even_over_the_keep_window():
    items = [_item(1, 10), _item(2, 10), _item(3, 500)]

    assert compaction_cut(items, keep_tokens=100) == 2


def test_cut_moves_before_interleaved_tool_calls():
    # Call a (2) answered at 5, call b (3) answered at 4: no clean cut between 2 and 5.
    items = [_item(1, 10), _item(2, 10, call_ids=["a"]), _item(3, 10, call_ids=["b"]),
             _item(4, 10, answers="b"), _item(5, 10, answers="a"), _item(6, 10)]

    assert compaction_cut(items, keep_tokens=50) == 1
    assert compaction_cut(items, keep_tokens=40) == 5


def test_cut_of_a_single_unit_is_nothing():
    items = [_item(1, 10, call_ids=["a"]), _item(2, 900, answers="a")]

    assert compaction_cut(items, keep_tokens=10) == 0
