"""What feeds the fact ledger and what reads the experience document (SPEC §4, §7, §8):
introspection's memory writes and the record_learning tool add pending facts; the prompt
carries the current experience document as its experience section."""
import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from consolidation.models import Fact
from consolidation.services import consolidation_run
from kinsite.llm.types import LLMHTTPError
from kinsite.tools import ToolContext
from memories.models import Memory
from memories.services import Actor
from sessions_app.introspection.services import introspection_request
from sessions_app.models import Session
from sessions_app.prompt.assembly import prompt_assemble
from sessions_app.tasks import introspect_session_task
from sessions_app.turns.services import turn_post
from sessions_app.turns.tools import RECORD_LEARNING_TOOL, kin_toolset
from tests.consolidation.conftest import add_fact, answer, document
from tests.factories import ExperienceVersionFactory, MemoryFactory, MessageFactory

# --- introspection ---------------------------------------------------------------------------


def introspect(session):
    MessageFactory(session=session, content="We dedupe the churn report by customer id now.")
    Session.objects.filter(pk=session.pk).update(introspection_pending=True, last_activity_at=timezone.now())
    run = introspection_request(session=session, trigger="manual")
    introspect_session_task.apply(args=[run.pk])
    run.refresh_from_db()
    return run


def test_memories_introspection_adds_or_changes_land_as_pending_facts(chat_session, model):
    kin = chat_session.kin
    changed = MemoryFactory(kin=kin, content="Standup is at 9:00.", category="fact")
    doomed = MemoryFactory(kin=kin, content="The office is in Lisbon.")
    model.add(
        {"tool_calls": [
            {"name": "memory_add", "arguments": {"content": "The churn report deduplicates by customer id.",
                                                 "category": "decision", "importance": 7}},
            {"name": "memory_update", "arguments": {"id": changed.pk, "content": "Standup is at 9:30.",
                                                    "category": "decision"}},
            {"name": "memory_delete", "arguments": {"id": doomed.pk, "reason": "moved"}},
        ]},
        "Stored the dedup decision.",
    )

    run = introspect(chat_session)

    assert run.status == "done", run.error
    added = Memory.objects.get(content="The churn report deduplicates by customer id.")
    facts = list(Fact.objects.order_by("pk"))
    assert [(f.statement, f.category, f.memory) for f in facts] == [
        ("The churn report deduplicates by customer id.", "decision", added),
        ("Standup is at 9:30.", "decision", changed),
    ]
    for fact in facts:
        assert (fact.kin, fact.source, fact.source_ref) == (kin, "introspection", f"introspection_run:{run.pk}")
        assert (fact.status, fact.is_consolidated) == ("active", False)


def test_a_failed_introspection_records_no_facts(chat_session, model):
    model.add(
        {"tool_calls": [{"name": "memory_add", "arguments": {"content": "Something.", "category": "fact"}}]},
        LLMHTTPError("The endpoint answered 503.", status_code=503),
    )
    assert introspect(chat_session).status == "failed"
    assert not Fact.objects.exists() and not Memory.objects.exists()


# --- the record_learning tool ----------------------------------------------------------------


def test_record_learning_is_a_kin_tool_with_a_schema():
    tool = kin_toolset()["record_learning"]
    assert tool.schema["name"] == "record_learning"
    assert tool.schema["parameters"]["required"] == ["statement"]
    assert set(tool.schema["parameters"]["properties"]) == {"statement", "category"}


def test_a_kin_records_a_learning_in_a_turn(chat_session, model):
    model.add({"tool_calls": [{"name": "record_learning",
                               "arguments": {"statement": "Always dedupe by customer id.", "category": "decision"}}]},
              "Noted for the future.")

    turn = turn_post(session=chat_session, content="Remember: dedupe by customer id, always.", sender="Maria")

    assert turn.status == "done" and turn.tool_calls == 1
    fact = Fact.objects.get()
    assert (fact.kin, fact.statement, fact.category, fact.source) == (
        chat_session.kin, "Always dedupe by customer id.", "decision", "tool")
    assert fact.source_ref == f"event:{turn.user_message_id}"
    assert (fact.status, fact.is_consolidated, fact.memory) == ("active", False, None)
    result = json.loads(model.calls[1].messages[-1]["content"])
    assert result == {"status": "recorded", "fact": {"id": fact.pk, "category": "decision",
                                                     "statement": "Always dedupe by customer id."}}


@pytest.mark.parametrize("arguments, error", [
    ("not json", "not valid JSON"),
    ("[]", "must be a JSON object"),
    ("{}", "missing required argument(s): statement"),
    ('{"statement": "   "}', "statement must not be empty"),
    ('{"statement": 42}', "statement must be a string"),
    ('{"statement": "x", "category": "rumour"}', "category must be one of"),
    ('{"statement": "x", "importance": 3}', "unknown argument(s): importance"),
    (json.dumps({"statement": "x" * 4001}), "longer than 4000"),
])
def test_record_learning_with_bad_arguments_is_a_tool_error_and_records_nothing(kin, arguments, error):
    context = ToolContext(team=kin.team, kin=kin, actor=Actor("event:1"), source="turn", source_ref="event:1")
    output = RECORD_LEARNING_TOOL.handler(context, arguments)
    assert output.startswith("Error: ") and error in output
    assert not Fact.objects.exists()


def test_record_learning_defaults_to_the_fact_category(kin):
    context = ToolContext(team=kin.team, kin=kin, actor=Actor("event:7"), source="turn", source_ref="event:7")
    RECORD_LEARNING_TOOL.handler(context, '{"statement": "The API is versioned."}')
    assert Fact.objects.values_list("category", "source_ref").get() == ("fact", "event:7")


# --- the experience section of the prompt ----------------------------------------------------


def experience_of(prompt):
    return {section.id: section for section in prompt.sections}.get("experience")


def test_a_kin_without_an_experience_document_has_no_experience_section(chat_session):
    prompt = prompt_assemble(session=chat_session, message_text="Hello")
    assert experience_of(prompt) is None


def test_the_prompt_carries_the_current_experience_document(chat_session, model, api_client):
    kin = chat_session.kin
    fact = add_fact(kin, "Never deploy on Fridays.")
    model.add(answer(document([], ["Never deploy on Fridays."]), processed=[fact.pk]))
    consolidation_run(kin=kin, trigger="api")
    fact2 = add_fact(kin, "Maria wants bullet points.")
    current = document(["Maria wants bullet points."], ["Never deploy on Fridays."])
    model.add(answer(current, processed=[fact2.pk]))
    consolidation_run(kin=kin, trigger="api")

    prompt = prompt_assemble(session=chat_session, message_text="Can we deploy today?")

    # The current version, its headings nested under the prompt's "## Experience" section,
    # quoted line by line (stored text: kinsite.prompt_safety).
    nested = current.replace("\n## ", "\n#### ").replace("# Master", "### Master").strip()
    nested = "\n".join(f"> {line}" for line in nested.splitlines())
    section = experience_of(prompt)
    assert section.text == nested and section.tokens > 0
    assert "> #### 1. User Directives & Preferences\n> - Maria wants bullet points." in section.text
    assert f"## Experience\n\n{nested}" in prompt.messages[0]["content"]
    # The preview endpoint shows the same section.
    response = api_client.get(f"/api/v1/sessions/{chat_session.pk}/prompt/", {"message": "Can we deploy today?"})
    assert response.status_code == 200
    sections = {s["id"]: s for s in response.json()["sections"]}
    assert sections["experience"]["text"] == nested


def test_reading_the_experience_costs_no_extra_query(chat_session):
    def queries():
        with CaptureQueriesContext(connection) as captured:
            prompt_assemble(session=chat_session, message_text="")
        return len(captured.captured_queries)

    without = queries()
    for version in (1, 2, 3):
        ExperienceVersionFactory(kin=chat_session.kin, version=version, markdown=f"# Doc v{version}")
    assert queries() == without
    prompt = prompt_assemble(session=chat_session, message_text="")
    assert experience_of(prompt).text == "> ### Doc v3"
