"""Model faults (SPEC §4, §10, §13) through the real HTTP provider against the fake
OpenAI-compatible server: the endpoint times out, answers 500, answers a body that is
not JSON, sends tool arguments that are not a JSON object, or calls tools for ever; and
the background jobs (introspection, compaction, consolidation) meeting the same failures.

Each test says what the user sees, what is stored, and what runs again."""
import pytest

from consolidation.models import ConsolidationRun
from kinsite.models import LLMCall
from memories.models import Memory
from sessions_app.compaction import compaction_needed, compaction_request
from sessions_app.introspection.services import introspection_request
from sessions_app.models import Event, Session, Summary, Turn
from sessions_app.tasks import compact_session_task, introspect_session_task
from tests.consolidation.conftest import add_fact, answer, state_of
from tests.factories import MessageFactory
from tests.faults.conftest import LLM_MAX_RETRIES, MODEL_FAULTS
from tests.sessions_app.test_api_access import assert_api_error
from tests.sessions_app.test_compaction import BUDGET, FIRST_SUMMARY, chatter

pytestmark = pytest.mark.usefixtures("eager_celery")

FAULT_IDS = [fault.name for fault in MODEL_FAULTS]


def post(api_client, session, content, *, is_async=False):
    return api_client.post(
        f"/api/v1/sessions/{session.pk}/messages/" + ("?async=1" if is_async else ""),
        {"content": content, "sender": "Maria", "platform": "slack"}, format="json",
    )


def chat_turn(api_client, session, content, *, is_async, capture):
    """Post a message and, for ?async=1, let its task run (eagerly, after commit); returns
    the HTTP response and the turn as the client then reads it."""
    with capture(execute=True):
        response = post(api_client, session, content, is_async=is_async)
    if is_async:
        assert response.status_code == 202, response.content
        turn_id = response.json()["turn"]["id"]
    else:
        turn_id = Turn.objects.order_by("-id").values_list("pk", flat=True).first()
    polled = api_client.get(f"/api/v1/turns/{turn_id}/")
    assert polled.status_code == 200
    return response, polled.json()


def chat_requests(fake):
    return fake.requests_to("chat")


def user_texts(request) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "user"]


# --- chat turns ----------------------------------------------------------------------------


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("fault", MODEL_FAULTS, ids=FAULT_IDS)
def test_a_failing_model_keeps_the_message_records_the_error_and_the_next_post_works(
    api_client, chat_session, fake_model, fault, is_async, django_capture_on_commit_callbacks
):
    """The model times out / answers 500 / answers a body that is not JSON on every attempt.

    The user sees: sync, 502 `llm_error` in the §11 shape whose message names the cause
    and whose details name the stored message, the failed turn and the gateway's error
    code; async, 202 and then a turn polled as `failed` with that error.
    Stored: the user's message, the turn (failed, error, no reply), one LLMCall row with
    status error and the attempts made; no assistant message.
    Runs again: nothing by itself; the next post works and its prompt still carries the
    unanswered message, so nothing the user said is lost."""
    fault.inject(fake_model)

    response, turn = chat_turn(api_client, chat_session, "When is the launch?", is_async=is_async,
                               capture=django_capture_on_commit_callbacks)

    message = Event.objects.get(session=chat_session)
    assert (message.role, message.kind, message.content) == ("user", "message", "When is the launch?")
    if not is_async:
        error = assert_api_error(response, 502, code="llm_error")
        assert error["message"].startswith("The language model could not answer:")
        assert f"message {message.pk}" in error["message"]
        assert error["details"]["message"] == message.pk and error["details"]["turn"] == turn["id"]
        assert error["details"]["llm_error"] == fault.error_code
    assert turn["status"] == "failed" and turn["reply"] is None and turn["finished_at"] is not None
    assert turn["message"]["id"] == message.pk
    assert "/chat/completions" in turn["error"]
    [call] = LLMCall.objects.filter(purpose="turn")
    assert (call.status, call.attempts, call.kin_id) == ("error", fault.attempts, chat_session.kin_id)
    assert call.error == turn["error"]
    assert len(chat_requests(fake_model)) == fault.attempts  # bounded: no retry beyond LLM_MAX_RETRIES
    assert not Event.objects.filter(session=chat_session, role="assistant").exists()

    fake_model.reply("The launch is on Friday.")
    response, turn = chat_turn(api_client, chat_session, "Hello again?", is_async=is_async,
                               capture=django_capture_on_commit_callbacks)

    assert turn["status"] == "done" and turn["reply"]["content"] == "The launch is on Friday."
    if not is_async:
        assert response.status_code == 201, response.content
    assert user_texts(chat_requests(fake_model)[-1]) == ["[Maria] When is the launch?", "[Maria] Hello again?"]
    assert list(LLMCall.objects.filter(purpose="turn").order_by("id").values_list("status", flat=True)) == [
        "error", "ok"]


@pytest.mark.parametrize("arguments, tool_error, is_async", [
    ("{not json", "Error: the arguments are not valid JSON.", False),
    ("[1, 2]", "Error: the arguments must be a JSON object.", True),
    ('"remember this"', "Error: the arguments must be a JSON object.", False),
], ids=["broken-sync", "list-async", "string-sync"])
def test_tool_arguments_that_are_not_a_json_object_become_a_tool_error_the_model_reads(
    api_client, chat_session, fake_model, arguments, tool_error, is_async, django_capture_on_commit_callbacks
):
    """The model calls `memorize` with arguments that are broken JSON or not an object.

    The user sees: the kin's answer (201, or the async turn done); the turn never fails
    over it. Stored: the tool call with the raw arguments, its result (an `Error: …` text
    saying what is wrong with them), and no memory. Runs again: the model is called once more
    with that error as the tool result, and answers; the next turn's history carries the call
    and its error as a pair."""
    fake_model.tool_call("memorize", arguments, call_id="call_bad")
    fake_model.reply("Sorry, I could not store that.")

    response, turn = chat_turn(api_client, chat_session, "Remember the launch date.", is_async=is_async,
                               capture=django_capture_on_commit_callbacks)

    if not is_async:
        assert response.status_code == 201, response.content
    # Two model calls, neither retried (a retry would have taken the next scripted answer).
    assert list(LLMCall.objects.filter(purpose="turn").values_list("attempts", flat=True)) == [1, 1]
    assert turn["status"] == "done" and turn["tool_calls"] == 1
    assert turn["reply"]["content"] == "Sorry, I could not store that."
    assert not Memory.objects.exists()
    result = Event.objects.get(session=chat_session, kind="tool_result")
    assert (result.content, result.data["tool_call_id"]) == (tool_error, "call_bad")
    call = Event.objects.get(session=chat_session, kind="tool_call")
    assert call.data["tool_calls"][0]["arguments"] == arguments
    second = chat_requests(fake_model)[1]["messages"]
    assert second[-2]["tool_calls"][0]["function"]["arguments"] == arguments
    assert second[-1] == {"role": "tool", "tool_call_id": "call_bad", "content": result.content}

    fake_model.reply("Anything else?")
    chat_turn(api_client, chat_session, "Thanks.", is_async=is_async, capture=django_capture_on_commit_callbacks)
    history = chat_requests(fake_model)[-1]["messages"][1:]
    assert [m["role"] for m in history] == ["user", "assistant", "tool", "assistant", "user"]


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_model_that_calls_tools_for_ever_is_cut_off_at_the_cap(
    api_client, chat_session, fake_model, settings, is_async, django_capture_on_commit_callbacks
):
    """The model answers every request with another tool call, even when no tools are offered.

    The user sees: a reply saying the tool-call limit was reached (201 / async done), with
    `tool_call_limit_reached`. Stored: KIN_MAX_TOOL_CALLS tool calls with their results,
    then that reply. Runs again: nothing; the loop is bounded at KIN_MAX_TOOL_CALLS + 1
    model calls, the last one without tools."""
    settings.KIN_MAX_TOOL_CALLS = 3
    for n in range(20):
        fake_model.tool_call("memory_recall", {"query": f"launch {n}"})

    response, turn = chat_turn(api_client, chat_session, "What do you know about the launch?", is_async=is_async,
                               capture=django_capture_on_commit_callbacks)

    if not is_async:
        assert response.status_code == 201, response.content
    assert turn["status"] == "done" and turn["tool_calls"] == 3 and turn["tool_call_limit_reached"] is True
    assert turn["reply"]["content"] == "I reached the limit of 3 tool calls for this turn before I could finish."
    requests = chat_requests(fake_model)
    assert len(requests) == 4
    assert ["tools" in request for request in requests] == [True, True, True, False]
    assert Event.objects.filter(session=chat_session, kind="tool_call").count() == 3
    assert Event.objects.filter(session=chat_session, kind="tool_result").count() == 3
    assert fake_model.pending() == 16  # the rest of the loop was never asked for


# --- background jobs -----------------------------------------------------------------------


@pytest.mark.parametrize("fault", MODEL_FAULTS, ids=FAULT_IDS)
def test_introspection_on_a_failing_model_fails_whole_and_the_next_run_covers_the_same_events(
    chat_session, fake_model, fault
):
    """Introspection's model adds a memory and rewrites the working memory, then fails.

    The user sees: the run listed as `failed` with the error (GET /sessions/{id}/introspections/).
    Stored: the run row (failed, error, the event range it tried, the tool calls it
    attempted) and LLMCall rows; not the memory, not the new working memory, no end event,
    so the cursor stays. Runs again: the next run reads the same events and applies them."""
    first = MessageFactory(session=chat_session, content="We ship on May 3.", sender="Maria")
    last = MessageFactory(session=chat_session, content="Tom owns the release notes.", sender="Tom")
    Session.objects.filter(pk=chat_session.pk).update(working_memory="old notes", introspection_pending=True)
    fake_model.tool_calls([
        {"name": "memory_add", "arguments": {"content": "The ship date is May 3.", "category": "decision"}},
        {"name": "working_memory_update", "arguments": {"content": "half-written notes"}},
    ])
    fault.inject(fake_model)

    run = introspection_request(session=chat_session, trigger="checkpoint")
    introspect_session_task.apply(args=[run.pk])

    run.refresh_from_db()
    assert run.status == "failed" and "/chat/completions" in run.error and run.finished_at is not None
    assert (run.first_event_id, run.last_event_id) == (first.pk, last.pk)
    assert [call["name"] for call in run.tool_calls] == ["memory_add", "working_memory_update"]
    assert not Memory.objects.exists()
    chat_session.refresh_from_db()
    assert chat_session.working_memory == "old notes"
    assert not Event.objects.filter(session=chat_session, kind="introspection_end").exists()
    assert list(LLMCall.objects.filter(purpose="introspection").order_by("id").values_list("status", flat=True)) == [
        "ok", "error"]

    fake_model.tool_call("memory_add", {"content": "The ship date is May 3.", "category": "decision"})
    fake_model.reply("Stored the ship date.")
    retry = introspection_request(session=chat_session, trigger="checkpoint")
    introspect_session_task.apply(args=[retry.pk])

    retry.refresh_from_db()
    assert retry.pk != run.pk and retry.status == "done", retry.error
    assert (retry.first_event_id, retry.last_event_id) == (first.pk, last.pk)
    assert Memory.objects.get().content == "The ship date is May 3."


@pytest.mark.parametrize("fault", MODEL_FAULTS, ids=FAULT_IDS)
def test_compaction_on_a_failing_model_writes_nothing_and_runs_again(chat_session, fake_model, fault):
    """The compaction task's model call fails (the task as a worker would run it eagerly).

    The user sees: nothing changes in the chat; the prompt keeps the raw messages.
    Stored: an LLMCall row with status error; no summary; the messages untouched.
    Runs again: compaction is still needed, and the next task makes the summary."""
    chat_session.kin.history_token_budget = BUDGET
    chat_session.kin.save()
    chatter(chat_session, 0, 20)
    before = list(Event.objects.order_by("id").values())
    fault.inject(fake_model)

    compact_session_task.apply(args=[compaction_request(session=chat_session).pk])

    assert not Summary.objects.exists()
    assert list(Event.objects.order_by("id").values()) == before
    [call] = LLMCall.objects.filter(purpose="compaction")
    assert (call.status, call.attempts) == ("error", fault.attempts)
    assert compaction_needed(session=chat_session) is True

    fake_model.reply(FIRST_SUMMARY)
    compact_session_task.apply(args=[compaction_request(session=chat_session).pk])

    assert Summary.objects.get(session=chat_session).content == FIRST_SUMMARY


@pytest.mark.parametrize("fault", MODEL_FAULTS, ids=FAULT_IDS)
def test_consolidation_on_a_failing_model_changes_nothing_and_runs_again(api_client, kin, fake_model, fault):
    """POST /kins/{id}/consolidate/ while the model fails.

    The user sees: a timeout or a 500 answers 502 `upstream_error` with the failed run in
    details; a body that is not JSON counts as an invalid answer, gets its one corrective
    retry, and the run answers 200 with status `rejected`. Stored: the run row (failed with
    its error, or rejected with its validation errors); facts, memories and the experience
    document as they were. Runs again: the next consolidation applies the same facts."""
    fact = add_fact(kin, "Maria wants bullet points.", "preference")
    before = state_of(kin)
    # A rejected answer is asked for again once; a failed call ends the run at once.
    fault.inject(fake_model, calls=2 if fault.name == "malformed_json" else 1)

    response = api_client.post(f"/api/v1/kins/{kin.pk}/consolidate/", {}, format="json")

    [run] = ConsolidationRun.objects.filter(kin=kin)
    if fault.name == "malformed_json":
        assert response.status_code == 200, response.content
        assert response.json()["status"] == "rejected" == run.status
        assert run.validation_errors and len(run.raw_answers) == 2
    else:
        error = assert_api_error(response, 502, code="upstream_error")
        assert error["details"]["run"]["id"] == run.pk and error["details"]["run"]["status"] == "failed"
        assert run.status == "failed" and "/chat/completions" in run.error
        assert LLMCall.objects.get(purpose="consolidation").attempts == LLM_MAX_RETRIES + 1
    assert state_of(kin) == before
    assert fake_model.pending() == 0

    fake_model.reply(answer(processed=[fact.pk]))
    response = api_client.post(f"/api/v1/kins/{kin.pk}/consolidate/", {}, format="json")

    assert response.status_code == 200 and response.json()["status"] == "applied", response.content
    assert list(ConsolidationRun.objects.filter(kin=kin).order_by("id").values_list("status", flat=True)) == [
        run.status, "applied"]
