"""Chat turns end to end (SPEC §4): the API, the turn service and the real HTTP provider
against the local fake OpenAI-compatible server."""
import pytest

from memories.models import Memory, MemoryChange
from sessions_app.models import Event, Session, Turn
from tests.factories import MemoryFactory, MessageFactory, ToolCallFactory, ToolResultFactory, TurnFactory
from tests.sessions_app.test_api_access import assert_api_error

pytestmark = pytest.mark.usefixtures("fake_llm_gateway")


def post(api_client, session, content, *, sender="Maria", platform="slack", query=""):
    return api_client.post(
        f"/api/v1/sessions/{session.pk}/messages/{query}",
        {"content": content, "sender": sender, "platform": platform},
        format="json",
    )


def chat_requests(fake_llm):
    return fake_llm.requests_to("chat")


def events(session):
    return list(Event.objects.filter(session=session).order_by("created_at", "id"))


def test_plain_reply_is_stored_and_returned(api_client, chat_session, fake_llm):
    fake_llm.reply("Hello Maria, the report is due Friday.")

    response = post(api_client, chat_session, "When is the report due?")

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["message"]["content"] == "When is the report due?"
    assert body["message"]["sender"] == "Maria" and body["message"]["platform"] == "slack"
    assert body["reply"]["content"] == "Hello Maria, the report is due Friday."
    assert body["reply"]["role"] == "assistant"
    assert body["turn"]["status"] == "done" and body["turn"]["tool_calls"] == 0
    stored = events(chat_session)
    assert [(e.role, e.kind) for e in stored] == [("user", "message"), ("assistant", "message")]
    assert stored[1].sender == chat_session.kin.name
    assert all(e.token_count > 0 for e in stored)
    turn = Turn.objects.get()
    assert (turn.user_message_id, turn.reply_id) == (stored[0].pk, stored[1].pk)
    assert turn.prompt_tokens > 0 and turn.tokens_in > 0 and turn.tokens_out > 0
    assert turn.started_at and turn.finished_at

    [request] = chat_requests(fake_llm)
    system, user = request["messages"]
    assert system["role"] == "system" and f"You are {chat_session.kin.name}." in system["content"]
    assert "## Current message" in system["content"] and "Sender: Maria" in system["content"]
    assert user == {"role": "user", "content": "[Maria] When is the report due?"}
    assert {tool["function"]["name"] for tool in request["tools"]} == {
        "memory_recall", "memorize", "memory_update", "memory_forget", "search_history", "record_learning",
    }


def test_next_turn_sees_earlier_messages_and_relevant_memories(api_client, chat_session, fake_llm):
    MemoryFactory(kin=chat_session.kin, content="The quarterly report goes to Lena.", subject="report")
    fake_llm.reply("First answer.")
    post(api_client, chat_session, "Hi there")
    fake_llm.reply("Second answer.")

    post(api_client, chat_session, "Who gets the quarterly report?", sender="Tom", platform="discord")

    request = chat_requests(fake_llm)[-1]
    assert [m["content"] for m in request["messages"][1:]] == [
        "[Maria] Hi there", "First answer.", "[Tom] Who gets the quarterly report?",
    ]
    system = request["messages"][0]["content"]
    assert "The quarterly report goes to Lena." in system
    assert "Group conversation (2 people)" in system
    assert Memory.objects.get().retrieval_count == 1


def test_served_memories_count_as_retrieved_with_the_reply_only(api_client, chat_session, fake_llm):
    served = MemoryFactory(kin=chat_session.kin, content="The quarterly report goes to Lena.")
    other = MemoryFactory(kin=chat_session.kin, content="Parking is free on weekends.")
    fake_llm.error(400, "model 'nope' does not exist")

    assert post(api_client, chat_session, "Who gets the quarterly report?").status_code == 502
    served.refresh_from_db()
    assert served.retrieval_count == 0  # no reply was stored, so nothing was served

    fake_llm.reply("Lena.")
    assert post(api_client, chat_session, "Who gets the quarterly report?").status_code == 201
    served.refresh_from_db()
    other.refresh_from_db()
    turn = Turn.objects.get(status="done")
    assert served.retrieval_count == 1 and served.last_retrieved_at == turn.finished_at
    assert other.retrieval_count == 0 and other.last_retrieved_at is None


def test_tool_round_trip_stores_a_memory(api_client, chat_session, fake_llm):
    fake_llm.tool_call(
        "memorize",
        {"content": "Maria prefers weekly reports.", "category": "preference", "subject": "Maria", "importance": 7},
        call_id="call_1",
    )
    fake_llm.reply("Noted: weekly reports.")

    response = post(api_client, chat_session, "Please remember I like weekly reports.")

    assert response.status_code == 201, response.content
    assert response.json()["reply"]["content"] == "Noted: weekly reports."
    memory = Memory.objects.get()
    user_message = Event.objects.get(kind="message", role="user")
    turn = Turn.objects.get()
    assert (memory.content, memory.category, memory.kin) == (
        "Maria prefers weekly reports.", "preference", chat_session.kin,
    )
    assert (memory.source, memory.source_ref) == (Memory.Source.TURN, f"event:{user_message.pk}")
    assert MemoryChange.objects.get().actor == f"kin:{chat_session.kin.pk} turn:{turn.pk}"
    assert turn.tool_calls == 1

    stored = events(chat_session)
    assert [(e.role, e.kind) for e in stored] == [
        ("user", "message"), ("assistant", "tool_call"), ("tool", "tool_result"), ("assistant", "message"),
    ]
    call, result = stored[1], stored[2]
    assert call.data["tool_calls"][0]["id"] == "call_1" and call.data["tool_calls"][0]["name"] == "memorize"
    assert result.data["tool_call_id"] == "call_1" and result.data["name"] == "memorize"
    assert '"status": "created"' in result.content
    assert call.token_count > 0 and result.token_count > 0

    second = chat_requests(fake_llm)[1]["messages"]
    assert second[-2]["tool_calls"][0]["function"]["name"] == "memorize"
    assert second[-1]["role"] == "tool" and second[-1]["tool_call_id"] == "call_1"

    # The next turn's history carries the tool call with its result.
    fake_llm.reply("ok")
    post(api_client, chat_session, "thanks")
    history = chat_requests(fake_llm)[-1]["messages"][1:]
    assert [m["role"] for m in history] == ["user", "assistant", "tool", "assistant", "user"]


def test_tool_calls_are_capped_and_the_last_call_has_no_tools(api_client, chat_session, fake_llm, settings):
    settings.KIN_MAX_TOOL_CALLS = 2
    fake_llm.tool_call("memory_recall", {"query": "reports"})
    fake_llm.tool_calls([{"name": "memory_recall", "arguments": {"query": "a"}},
                         {"name": "memory_recall", "arguments": {"query": "b"}}])
    fake_llm.reply("Here is what I found.")

    response = post(api_client, chat_session, "What do you know about reports?")

    assert response.status_code == 201, response.content
    turn = response.json()["turn"]
    assert turn["tool_calls"] == 2 and turn["tool_call_limit_reached"] is True
    requests = chat_requests(fake_llm)
    assert len(requests) == 3
    assert "tools" in requests[0] and "tools" in requests[1] and "tools" not in requests[2]
    results = Event.objects.filter(kind="tool_result").order_by("id")
    assert [r.content.startswith("Error: not run") for r in results] == [False, False, True]
    assert response.json()["reply"]["content"] == "Here is what I found."


def test_unknown_tools_and_bad_arguments_become_tool_errors(api_client, chat_session, fake_llm):
    fake_llm.tool_calls([
        {"name": "launch_rockets", "arguments": {}},
        {"name": "memorize", "arguments": "{not json"},
        {"name": "memorize", "arguments": {"content": "x", "category": "gossip"}},
        {"name": "search_history", "arguments": {"limit": 3}},
    ])
    fake_llm.reply("Sorry, that did not work.")

    response = post(api_client, chat_session, "Do things")

    assert response.status_code == 201, response.content
    outputs = list(Event.objects.filter(kind="tool_result").order_by("id").values_list("content", flat=True))
    assert len(outputs) == 4 and all(output.startswith("Error:") for output in outputs)
    assert "unknown tool 'launch_rockets'" in outputs[0]
    assert Memory.objects.count() == 0


def test_search_history_tool_finds_older_messages_of_the_kin(api_client, chat_session, fake_llm):
    MessageFactory(session=chat_session, content="The zebra migration starts in July.", sender="Lena",
                   external_id="ext-7")
    fake_llm.tool_call("search_history", {"query": "zebra migration"})
    fake_llm.reply("In July.")

    post(api_client, chat_session, "When does it start?")

    result = Event.objects.get(kind="tool_result")
    assert "The zebra migration starts in July." in result.content
    assert '"sender": "Lena"' in result.content and '"external_id": "ext-7"' in result.content


def test_failing_model_keeps_the_message_and_answers_502(api_client, chat_session, fake_llm):
    fake_llm.error(400, "model 'nope' does not exist")

    response = post(api_client, chat_session, "Hello?")

    error = assert_api_error(response, 502, code="llm_error")
    assert "model 'nope' does not exist" in error["message"]
    message = Event.objects.get(session=chat_session)
    assert (message.content, message.role, message.kind) == ("Hello?", "user", "message")
    turn = Turn.objects.get()
    assert turn.status == "failed" and "model 'nope' does not exist" in turn.error
    assert turn.reply is None and turn.finished_at is not None
    assert error["details"]["turn"] == turn.pk and error["details"]["message"] == message.pk

    polled = api_client.get(f"/api/v1/turns/{turn.pk}/")
    assert polled.status_code == 200
    assert polled.json()["status"] == "failed" and "does not exist" in polled.json()["error"]
    assert polled.json()["message"]["id"] == message.pk and polled.json()["reply"] is None


def test_async_post_answers_202_and_the_turn_completes(
    api_client, chat_session, fake_llm, django_capture_on_commit_callbacks
):
    fake_llm.reply("Async hello.")

    with django_capture_on_commit_callbacks(execute=True):
        response = post(api_client, chat_session, "Hello async", query="?async=1")
        assert response.status_code == 202, response.content
        turn = response.json()["turn"]
        assert turn["status"] == "pending" and turn["message"]["content"] == "Hello async"
        assert turn["reply"] is None

    polled = api_client.get(f"/api/v1/turns/{turn['id']}/").json()
    assert polled["status"] == "done" and polled["is_async"] is True
    assert polled["reply"]["content"] == "Async hello."
    assert [(e.role, e.kind) for e in events(chat_session)] == [("user", "message"), ("assistant", "message")]


def test_async_failure_is_recorded_on_the_turn(
    api_client, chat_session, fake_llm, django_capture_on_commit_callbacks
):
    fake_llm.error(401, "bad key")

    with django_capture_on_commit_callbacks(execute=True):
        response = post(api_client, chat_session, "Hello", query="?async=1")
    assert response.status_code == 202

    polled = api_client.get(f"/api/v1/turns/{response.json()['turn']['id']}/").json()
    assert polled["status"] == "failed" and "bad key" in polled["error"]
    assert Event.objects.filter(session=chat_session, role="user").count() == 1


def test_checkpoint_command_is_recorded_without_calling_the_model(api_client, chat_session, fake_llm):
    response = post(api_client, chat_session, "/checkpoint before the launch")

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["turn"]["command"] == "checkpoint" and body["turn"]["status"] == "done"
    assert "Checkpoint recorded" in body["reply"]["content"]
    command, reply = events(chat_session)
    assert (command.kind, command.role, command.data["command"]) == ("command", "user", "checkpoint")
    assert command.data["argument"] == "before the launch"
    assert (reply.kind, reply.role) == ("command", "system")
    assert chat_requests(fake_llm) == []


def test_new_command_starts_a_session_for_the_same_kin(api_client, chat_session, fake_llm):
    response = post(api_client, chat_session, "/NEW Launch planning")

    assert response.status_code == 201, response.content
    new_id = response.json()["new_session_id"]
    new_session = Session.objects.get(pk=new_id)
    assert new_session.kin == chat_session.kin and new_session.title == "Launch planning"
    assert str(new_id) in response.json()["reply"]["content"]
    assert chat_requests(fake_llm) == []

    # Commands are bookkeeping, not conversation: the next prompt does not carry them.
    fake_llm.reply("ok")
    post(api_client, chat_session, "hello")
    assert [m["content"] for m in chat_requests(fake_llm)[0]["messages"][1:]] == ["[Maria] hello"]


@pytest.mark.parametrize("body", [
    {"content": ""},
    {"content": "   \n"},
    {"content": "hi", "platform": "myspace"},
    {"sender": "Maria"},
])
def test_bad_messages_answer_400_and_store_nothing(api_client, chat_session, fake_llm, body):
    response = api_client.post(f"/api/v1/sessions/{chat_session.pk}/messages/", body, format="json")

    assert_api_error(response, 400)
    assert not Event.objects.exists() and not Turn.objects.exists()


def test_oversized_message_answers_400(api_client, chat_session, fake_llm, settings):
    response = post(api_client, chat_session, "x" * (settings.MESSAGE_MAX_CHARS + 1))

    assert_api_error(response, 400)
    assert not Event.objects.exists()


def test_another_teams_turn_answers_404(api_client, other_team, fake_llm):
    from tests.factories import KinFactory, SessionFactory

    session = SessionFactory(kin=KinFactory(team=other_team))
    turn = TurnFactory(session=session)

    assert_api_error(api_client.get(f"/api/v1/turns/{turn.pk}/"), 404, code="not_found")


def test_running_a_queued_turn_twice_answers_once(chat_session, fake_llm, django_capture_on_commit_callbacks):
    from sessions_app.turns.services import turn_post, turn_run

    fake_llm.reply("Once.")
    with django_capture_on_commit_callbacks(execute=False):
        turn = turn_post(session=chat_session, content="Hi", sender="Maria", is_async=True)

    turn_run(turn_id=turn.pk)
    turn_run(turn_id=turn.pk)  # a duplicate delivery of the task

    turn.refresh_from_db()
    assert turn.status == "done" and turn.reply.content == "Once."
    assert len(chat_requests(fake_llm)) == 1
    assert Event.objects.filter(session=chat_session, role="assistant").count() == 1


def test_a_turn_left_running_by_a_dead_worker_is_run_again(chat_session, fake_llm, django_capture_on_commit_callbacks):
    from sessions_app.turns.services import turn_post, turn_run

    with django_capture_on_commit_callbacks(execute=False):
        turn = turn_post(session=chat_session, content="Hi", sender="Maria", is_async=True)
    Turn.objects.filter(pk=turn.pk).update(status=Turn.Status.RUNNING)  # the worker died mid-turn
    fake_llm.reply("Recovered.")

    turn_run(turn_id=turn.pk)

    turn.refresh_from_db()
    assert turn.status == "done" and turn.reply.content == "Recovered."


# --- turns of one session run in post order (SPEC §4) ------------------------------------------


def queue_without_running(session, texts, django_capture_on_commit_callbacks, sender="Maria"):
    """Async posts whose tasks are not sent (the on-commit enqueue is held back)."""
    from sessions_app.turns.services import turn_post

    with django_capture_on_commit_callbacks(execute=False):
        return [turn_post(session=session, content=text, sender=sender, is_async=True) for text in texts]


def test_queued_turns_run_in_post_order_whichever_task_comes_first(
    chat_session, fake_llm, django_capture_on_commit_callbacks
):
    """Three async posts; their tasks arrive newest first. Each run takes the session's oldest
    unfinished turn, so the replies follow the posts, and each model request ends at its own
    message: the earlier posts and their replies (stored after it, in that order) before it,
    the later posts nowhere."""
    from sessions_app.turns.services import turn_run

    texts = ["one?", "two?", "three?"]
    queued = queue_without_running(chat_session, texts, django_capture_on_commit_callbacks)

    for turn in reversed(queued):
        turn_run(turn_id=turn.pk)

    stored = events(chat_session)
    assert [(e.role, e.content) for e in stored] == (
        [("user", text) for text in texts] + [("assistant", f"echo: [Maria] {text}") for text in texts]
    )
    for turn in queued:
        turn.refresh_from_db()
        assert turn.status == "done" and turn.reply.content == f"echo: [Maria] {turn.user_message.content}"
    requests = [[m["content"] for m in request["messages"][1:]] for request in chat_requests(fake_llm)]
    assert requests == [
        ["[Maria] one?"],
        ["[Maria] one?", "echo: [Maria] one?", "[Maria] two?"],
        ["[Maria] one?", "[Maria] two?", "echo: [Maria] one?", "echo: [Maria] two?", "[Maria] three?"],
    ]


def test_a_sync_post_answers_the_earlier_queued_turns_first(
    api_client, chat_session, fake_llm, django_capture_on_commit_callbacks
):
    """An async post still queued when a sync post arrives: the sync post runs it first (it
    holds the session lock), then its own; the queued turn's task later finds nothing to do."""
    from sessions_app.turns.services import turn_run

    [queued] = queue_without_running(chat_session, ["first?"], django_capture_on_commit_callbacks)

    response = post(api_client, chat_session, "second?")

    assert response.status_code == 201, response.content
    assert response.json()["reply"]["content"] == "echo: [Maria] second?"
    queued.refresh_from_db()
    assert queued.status == "done" and queued.reply.content == "echo: [Maria] first?"
    assert [m["content"] for m in chat_requests(fake_llm)[0]["messages"][1:]] == ["[Maria] first?"]
    turn_run(turn_id=queued.pk)  # its task, late
    assert [e.content for e in events(chat_session)] == [
        "first?", "second?", "echo: [Maria] first?", "echo: [Maria] second?",
    ]
    assert len(chat_requests(fake_llm)) == 2


def test_a_turn_prompt_ends_at_its_own_message_and_the_tool_rounds_it_already_stored(
    chat_session, fake_llm, django_capture_on_commit_callbacks
):
    """The history cut, without running the turn: messages posted after the turn's own (stored
    meanwhile, queued behind it) are left out; the tool round its earlier attempt stored comes
    after its message, as in the attempt itself."""
    from sessions_app.prompt.assembly import prompt_assemble

    MessageFactory(session=chat_session, content="Earlier question", role="user", sender="Tom")
    first, later = queue_without_running(chat_session, ["Remember Friday.", "And Monday?"],
                                         django_capture_on_commit_callbacks)
    tool_call = ToolCallFactory(
        session=chat_session, token_count=5,
        data={"turn": first.pk, "tool_calls": [{"id": "call_1", "name": "memorize", "arguments": "{}"}]},
    )
    ToolResultFactory(session=chat_session, content='{"status": "created"}', token_count=5,
                      data={"turn": first.pk, "tool_call_id": "call_1", "name": "memorize"})

    prompt = prompt_assemble(session=chat_session, message_text=first.user_message.content, sender="Maria",
                             current_event=first.user_message, turn_id=first.pk)

    assert [entry.event.pk for entry in prompt.history][-3:-1] == [first.user_message_id, tool_call.pk]
    assert [(m["role"], m.get("content")) for m in prompt.messages[1:]] == [
        ("user", "[Tom] Earlier question"), ("user", "[Maria] Remember Friday."), ("assistant", None),
        ("tool", '{"status": "created"}'),
    ]
    assert later.user_message_id not in [entry.event.pk for entry in prompt.history]
