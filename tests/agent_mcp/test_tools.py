"""Each MCP tool over HTTP with the SDK's client (live_server): what it answers, what it
stores (through the same services as the API: change log, duplicate merge, fact ledger, the
chat turn), team scoping (another team's ids answer "not found" and change nothing), bad
arguments (a tool error saying what is wrong) and the chat rate limit shared with the API."""
import pytest

from consolidation.models import Fact
from memories.models import Memory, MemoryChange
from sessions_app.models import Event, Turn
from tests.agent_mcp.conftest import call, error_text, with_client
from tests.factories import (
    ExperienceVersionFactory,
    KinFactory,
    MemoryFactory,
    MessageFactory,
    SessionFactory,
    TeamFactory,
    WorkflowFactory,
)

EXPERIENCE = (
    "# Master AI Experience\n\n"
    "## 1. User Directives & Preferences\n- Ada wants short answers.\n\n"
    "## 2. Defensive Safeguards & Heuristics\n- Back up the database before a migration.\n"
)


def calls(url, token, *steps):
    """Several tool calls over one connection; their results, in order."""

    async def work(client):
        return [await client.call_tool(tool, arguments) for tool, arguments in steps]

    return with_client(url, token, work)


# --- memories ---------------------------------------------------------------------------------


def test_memory_add_records_the_source_and_the_change_and_merges_a_duplicate(mcp_url, mcp_token, mcp_kin):
    first, again = calls(
        mcp_url, mcp_token,
        ("memory_add", {"kin_id": mcp_kin.pk, "content": "Ada's deploys happen on Tuesdays.", "category": "fact",
                        "subject": "Ada", "importance": 6, "reason": "she said so"}),
        ("memory_add", {"kin_id": mcp_kin.pk, "content": "Ada's deploys happen on Tuesdays.", "category": "fact",
                        "importance": 8}),
    )

    assert first.structured_content["created"] is True
    assert again.structured_content["created"] is False  # the same statement again: merged, not added
    memory = Memory.objects.get()
    assert (memory.source, memory.subject, memory.importance) == ("mcp", "Ada", 8)
    assert memory.source_ref.startswith("token:ks_")
    changes = list(MemoryChange.objects.filter(memory=memory).order_by("id"))
    assert [change.action for change in changes] == ["add", "update"]
    assert changes[0].actor.startswith("mcp token:ks_") and changes[0].reason == "she said so"
    assert "Duplicate of an existing memory" in changes[1].reason


def test_memory_search_finds_by_meaning_with_the_local_embedder(settings, mcp_url, mcp_token, mcp_kin):
    from memories import services

    settings.EMBEDDINGS = "local"
    actor = services.Actor(label="user:ada")
    wanted = services.memory_add(team=mcp_kin.team, kin=mcp_kin, actor=actor,
                                 content="The customer prefers e-mail over phone calls.").memory
    services.memory_add(team=mcp_kin.team, kin=mcp_kin, content="The staging server runs in Frankfurt.", actor=actor)

    # No word in common with the memory.
    result = call(mcp_url, mcp_token, "memory_search",
                  {"kin_id": mcp_kin.pk, "query": "How should we reach the client?"})

    assert result.is_error is False, result
    assert result.structured_content["results"][0]["id"] == wanted.pk


def test_memory_add_shared_belongs_to_the_team(mcp_url, mcp_token, mcp_kin):
    result = call(mcp_url, mcp_token, "memory_add",
                  {"kin_id": mcp_kin.pk, "content": "The office closes at six.", "category": "fact", "shared": True})

    assert result.structured_content["memory"]["shared"] is True
    assert Memory.objects.get().kin_id is None


def test_memory_search_finds_the_kins_memories_and_counts_them_retrieved(mcp_url, mcp_token, mcp_kin):
    wanted = MemoryFactory(kin=mcp_kin, content="Ada's favourite editor is Helix.", subject="Ada")
    MemoryFactory(kin=mcp_kin, content="The invoice run is on the first of the month.")
    MemoryFactory(kin=KinFactory(team=mcp_kin.team), content="Another kin's editor is Vim.")

    result = call(mcp_url, mcp_token, "memory_search", {"kin_id": mcp_kin.pk, "query": "editor", "limit": 5})

    assert result.is_error is False, result
    hits = result.structured_content["results"]
    assert [hit["id"] for hit in hits] == [wanted.pk]
    assert hits[0]["content"] == "Ada's favourite editor is Helix." and hits[0]["score"] > 0
    wanted.refresh_from_db()
    assert wanted.retrieval_count == 1


def test_memory_update_and_delete_leave_change_rows(mcp_url, mcp_token, mcp_kin):
    memory = MemoryFactory(kin=mcp_kin, content="Ada drinks coffee.", category="preference")

    updated, deleted, deleted_again, edit_deleted = calls(
        mcp_url, mcp_token,
        ("memory_update", {"memory_id": memory.pk, "content": "Ada drinks tea.", "reason": "she switched"}),
        ("memory_delete", {"memory_id": memory.pk, "reason": "no longer true"}),
        ("memory_delete", {"memory_id": memory.pk}),
        ("memory_update", {"memory_id": memory.pk, "importance": 9}),
    )

    assert updated.structured_content["memory"]["content"] == "Ada drinks tea."
    assert deleted.structured_content["memory"]["status"] == "deleted"
    assert deleted_again.is_error is False  # as the API's DELETE: nothing more to do
    assert "only active memories can be edited" in error_text(edit_deleted)
    memory.refresh_from_db()
    assert (memory.content, memory.status, memory.importance) == ("Ada drinks tea.", "deleted", 5)
    changes = list(MemoryChange.objects.filter(memory=memory).order_by("id"))
    assert [(c.action, c.reason) for c in changes] == [("update", "she switched"), ("delete", "no longer true")]
    assert changes[0].before["content"] == "Ada drinks coffee."


# --- history, facts, experience ---------------------------------------------------------------


def test_history_search_by_session_or_by_kin(mcp_url, mcp_token, mcp_kin, mcp_session):
    here = MessageFactory(session=mcp_session, content="The rollout of the billing service slipped a week.")
    elsewhere = MessageFactory(session=SessionFactory(kin=mcp_kin), content="Billing rollout notes are in the wiki.")
    MessageFactory(session=mcp_session, content="Lunch is at noon.")

    in_session, in_kin, both, neither = calls(
        mcp_url, mcp_token,
        ("history_search", {"query": "billing rollout", "session_id": mcp_session.pk}),
        ("history_search", {"query": "billing rollout", "kin_id": mcp_kin.pk}),
        ("history_search", {"query": "billing", "session_id": mcp_session.pk, "kin_id": mcp_kin.pk}),
        ("history_search", {"query": "billing"}),
    )

    assert [hit["id"] for hit in in_session.structured_content["results"]] == [here.pk]
    assert {hit["id"] for hit in in_kin.structured_content["results"]} == {here.pk, elsewhere.pk}
    assert in_session.structured_content["results"][0]["sender"] == "Maria"
    assert "exactly one of session_id" in error_text(both)
    assert "exactly one of session_id" in error_text(neither)


def test_fact_log_appends_a_pending_fact_from_mcp(mcp_url, mcp_token, mcp_kin):
    result = call(mcp_url, mcp_token, "fact_log",
                  {"kin_id": mcp_kin.pk, "statement": "  Staging is read-only on Fridays.  ", "category": "knowledge"})

    fact = Fact.objects.get()
    assert (fact.statement, fact.category, fact.source) == ("Staging is read-only on Fridays.", "knowledge", "mcp")
    assert fact.status == "active" and fact.is_consolidated is False
    assert result.structured_content["fact"]["pending"] is True


def test_experience_read_whole_a_version_or_a_section(mcp_url, mcp_token, mcp_kin):
    ExperienceVersionFactory(kin=mcp_kin, version=1, markdown="# Master AI Experience\n- first draft\n")
    ExperienceVersionFactory(kin=mcp_kin, version=2, markdown=EXPERIENCE)

    current, first, section, numbered, no_section, no_version, negative = calls(
        mcp_url, mcp_token,
        ("experience_read", {"kin_id": mcp_kin.pk}),
        ("experience_read", {"kin_id": mcp_kin.pk, "version": 1}),
        ("experience_read", {"kin_id": mcp_kin.pk, "section": "2"}),
        ("experience_read", {"kin_id": mcp_kin.pk, "section": 2}),  # a number, as an agent sends it
        ("experience_read", {"kin_id": mcp_kin.pk, "section": "Anti-Patterns"}),
        ("experience_read", {"kin_id": mcp_kin.pk, "version": 7}),
        ("experience_read", {"kin_id": mcp_kin.pk, "section": -1}),
    )

    assert current.structured_content["version"] == 2 and current.structured_content["markdown"] == EXPERIENCE
    assert first.structured_content["markdown"] == "# Master AI Experience\n- first draft\n"
    assert "Back up the database" in section.structured_content["markdown"]
    assert "short answers" not in section.structured_content["markdown"]
    assert numbered.structured_content == section.structured_content
    assert "section" in error_text(negative)
    assert "has no section 'Anti-Patterns'" in error_text(no_section)
    assert f"Kin {mcp_kin.pk} has no experience version 7" in error_text(no_version)


def test_experience_read_without_a_document_says_so(mcp_url, mcp_token, mcp_kin):
    result = call(mcp_url, mcp_token, "experience_read", {"kin_id": mcp_kin.pk})

    assert "has no experience document yet" in error_text(result)


# --- sessions and workflows -------------------------------------------------------------------


def test_prompt_preview_shows_what_a_turn_would_send_and_stores_nothing(mcp_url, mcp_token, mcp_session):
    MessageFactory(session=mcp_session, content="Earlier we chose PostgreSQL.")
    before = Event.objects.count()

    result = call(mcp_url, mcp_token, "prompt_preview",
                  {"session_id": mcp_session.pk, "message": "Which database did we choose?", "sender": "Maria"})

    body = result.structured_content
    assert body["sections"][0]["id"] == "identity" and "You are Ada." in body["system_prompt"]
    assert [item["content"] for item in body["history"]] == ["Earlier we chose PostgreSQL.",
                                                            "Which database did we choose?"]
    assert body["history"][-1]["id"] is None
    assert "memory_recall" in body["tools"] and body["totals"]["total_tokens"] > 0
    assert Event.objects.count() == before


def test_lineage_read_narrates_a_nodes_upstream_steps(mcp_url, mcp_token, mcp_api_client):
    document = {
        "name": "Adults",
        "nodes": [
            {"id": "people", "type": "inline_records", "label": "People",
             "config": {"records": [{"name": "Ada", "age": 36}, {"name": "Bo", "age": 17}]}},
            {"id": "adults", "type": "filter", "label": "Adults",
             "config": {"conditions": [{"field": "age", "op": "gte", "value": 18}], "combine": "and"}},
        ],
        "edges": [{"source": "people", "target": "adults", "kind": "data"}],
    }
    workflow_id = mcp_api_client.post("/api/v1/workflows/", document, format="json").json()["id"]
    assert mcp_api_client.post(f"/api/v1/workflows/{workflow_id}/run/").status_code == 202

    result, missing_node = calls(
        mcp_url, mcp_token,
        ("lineage_read", {"workflow_id": workflow_id, "node_id": "adults", "max_chars": 500}),
        ("lineage_read", {"workflow_id": workflow_id, "node_id": "nobody"}),
    )

    body = result.structured_content
    assert (body["node_id"], body["stale"]) == ("adults", False)
    assert "Keeps records where age ≥ 18" in body["narrative"] and len(body["narrative"]) <= 500
    assert f"Workflow {workflow_id} has no node 'nobody'" in error_text(missing_node)


def test_message_post_answers_the_reply_of_a_chat_turn(mcp_url, mcp_token, mcp_session, model):
    model.add("Hello Maria, the report is due Friday.")

    result = call(mcp_url, mcp_token, "message_post",
                  {"session_id": mcp_session.pk, "content": "When is the report due?", "sender": "Maria",
                   "platform": "slack"})

    assert result.is_error is False, result
    body = result.structured_content
    assert body["reply"]["content"] == "Hello Maria, the report is due Friday."
    assert body["message"]["sender"] == "Maria" and body["message"]["platform"] == "slack"
    assert body["turn"]["status"] == "done"
    stored = list(Event.objects.filter(session=mcp_session).order_by("id").values_list("role", "content"))
    assert stored == [("user", "When is the report due?"), ("assistant", "Hello Maria, the report is due Friday.")]
    assert "[Maria] When is the report due?" in model.calls[0].messages[-1]["content"]


def test_message_post_shares_the_tokens_chat_rate_limit_with_the_api(mcp_url, mcp_token, mcp_session, mcp_api_client,
                                                                      model, settings):
    settings.API_THROTTLE_RATES = {**settings.API_THROTTLE_RATES, "chat": "2/min"}
    model.add("First.", "Second.", "Never sent.")
    assert mcp_api_client.post(f"/api/v1/sessions/{mcp_session.pk}/messages/", {"content": "one"},
                               format="json").status_code == 201

    second, third = calls(
        mcp_url, mcp_token,
        ("message_post", {"session_id": mcp_session.pk, "content": "two"}),
        ("message_post", {"session_id": mcp_session.pk, "content": "three"}),
    )

    assert second.structured_content["reply"]["content"] == "Second."
    assert "Rate limit exceeded for chat requests with this token (2/min)" in error_text(third)
    assert "Try again in" in error_text(third)
    assert Turn.objects.count() == 2
    assert not Event.objects.filter(content="three").exists()


# --- team scoping and bad arguments -----------------------------------------------------------


def test_another_teams_ids_answer_not_found_and_change_nothing(mcp_url, mcp_token, mcp_kin, model):
    other_team = TeamFactory()
    their_kin = KinFactory(team=other_team)
    their_session = SessionFactory(kin=their_kin)
    their_memory = MemoryFactory(kin=their_kin, content="Their secret plan.")
    their_workflow = WorkflowFactory(team=other_team)
    ExperienceVersionFactory(kin=their_kin, version=1, markdown=EXPERIENCE)
    MessageFactory(session=their_session, content="their secret plan message")
    counts = (Memory.objects.count(), MemoryChange.objects.count(), Fact.objects.count(), Event.objects.count())

    results = calls(
        mcp_url, mcp_token,
        ("memory_search", {"kin_id": their_kin.pk, "query": "secret plan"}),
        ("memory_add", {"kin_id": their_kin.pk, "content": "planted", "category": "fact"}),
        ("memory_update", {"memory_id": their_memory.pk, "content": "overwritten"}),
        ("memory_delete", {"memory_id": their_memory.pk}),
        ("history_search", {"query": "secret plan", "session_id": their_session.pk}),
        ("history_search", {"query": "secret plan", "kin_id": their_kin.pk}),
        ("fact_log", {"kin_id": their_kin.pk, "statement": "planted"}),
        ("experience_read", {"kin_id": their_kin.pk}),
        ("prompt_preview", {"session_id": their_session.pk, "message": "hi"}),
        ("lineage_read", {"workflow_id": their_workflow.pk, "node_id": "n"}),
        ("message_post", {"session_id": their_session.pk, "content": "hi"}),
    )

    texts = [error_text(result) for result in results]
    assert texts == [
        f"Error executing tool memory_search: Kin {their_kin.pk} not found.",
        f"Error executing tool memory_add: Kin {their_kin.pk} not found.",
        f"Error executing tool memory_update: Memory {their_memory.pk} not found.",
        f"Error executing tool memory_delete: Memory {their_memory.pk} not found.",
        f"Error executing tool history_search: Session {their_session.pk} not found.",
        f"Error executing tool history_search: Kin {their_kin.pk} not found.",
        f"Error executing tool fact_log: Kin {their_kin.pk} not found.",
        f"Error executing tool experience_read: Kin {their_kin.pk} not found.",
        f"Error executing tool prompt_preview: Session {their_session.pk} not found.",
        f"Error executing tool lineage_read: Workflow {their_workflow.pk} not found.",
        f"Error executing tool message_post: Session {their_session.pk} not found.",
    ]
    assert not any("secret" in text for text in texts)
    assert (Memory.objects.count(), MemoryChange.objects.count(), Fact.objects.count(),
            Event.objects.count()) == counts
    their_memory.refresh_from_db()
    assert (their_memory.content, their_memory.status) == ("Their secret plan.", "active")
    assert model.calls == []


def test_an_id_that_does_not_exist_reads_the_same_as_another_teams(mcp_url, mcp_token):
    result = call(mcp_url, mcp_token, "memory_search", {"kin_id": 987654, "query": "anything"})

    assert error_text(result) == "Error executing tool memory_search: Kin 987654 not found."


@pytest.mark.parametrize(
    ("tool", "arguments", "expected"),
    [
        ("memory_add", {"content": "x", "category": "fact"}, "kin_id\n  Field required"),
        ("memory_add", {"kin_id": 1, "content": "x", "category": "rumour"}, "Input should be 'fact'"),
        ("memory_add", {"kin_id": 1, "content": "x", "category": "fact", "importance": 11},
         "less than or equal to 10"),
        ("memory_search", {"kin_id": "one", "query": "x"}, "kin_id\n  Input should be a valid integer"),
        ("memory_search", {"kin_id": 1, "query": ""}, "at least 1 character"),
        ("message_post", {"session_id": 1, "content": "hi", "platform": "fax"}, "Input should be 'web'"),
        ("lineage_read", {"workflow_id": 1, "node_id": "n", "max_chars": 5}, "greater than or equal to 100"),
    ],
)
def test_bad_arguments_answer_a_tool_error_that_names_the_problem(mcp_url, mcp_token, tool, arguments, expected):
    result = call(mcp_url, mcp_token, tool, arguments)

    assert expected in error_text(result)
    assert not Memory.objects.exists() and not Event.objects.exists()


def test_arguments_the_api_refuses_are_refused_with_the_apis_message(mcp_url, mcp_token, mcp_kin, mcp_session):
    memory = MemoryFactory(kin=mcp_kin, content="Ada drinks coffee.")

    no_fields, blank_message, two_lines = calls(
        mcp_url, mcp_token,
        ("memory_update", {"memory_id": memory.pk, "reason": "nothing to change"}),
        ("message_post", {"session_id": mcp_session.pk, "content": "   "}),
        ("message_post", {"session_id": mcp_session.pk, "content": "hi", "sender": "Maria\n## Instructions"}),
    )

    assert "Invalid arguments: Give at least one of content, category, subject, importance." in error_text(no_fields)
    assert "Invalid arguments: content: Message content must not be blank." in error_text(blank_message)
    assert "Invalid arguments: sender:" in error_text(two_lines)
    assert MemoryChange.objects.count() == 0 and not Event.objects.exists()


def test_an_unknown_argument_answers_a_tool_error_naming_it_and_the_allowed_ones(mcp_url, mcp_token, mcp_kin,
                                                                                    mcp_session):
    # An agent's typo ("importnce") must not be dropped silently, nor the call made without it.
    typo, extra, session_extra = calls(
        mcp_url, mcp_token,
        ("memory_add", {"kin_id": mcp_kin.pk, "content": "Ada prefers tea.", "category": "preference",
                        "importnce": 9}),
        ("memory_search", {"kin_id": mcp_kin.pk, "query": "tea", "team_id": 1, "kinid": 2}),
        ("session_read", {"session_id": mcp_session.pk, "with_messages": True}),
    )

    assert error_text(typo) == ("Error executing tool memory_add: unknown argument(s): importnce; allowed: kin_id, "
                                "content, category, subject, importance, shared, reason.")
    assert "unknown argument(s): kinid, team_id; allowed: kin_id, query, limit, category." in error_text(extra)
    assert "unknown argument(s): with_messages; allowed: session_id." in error_text(session_extra)
    assert not Memory.objects.exists()


def test_an_unknown_tool_answers_an_error(mcp_url, mcp_token):
    result = call(mcp_url, mcp_token, "memory_forget_everything", {})

    assert "memory_forget_everything" in error_text(result)
