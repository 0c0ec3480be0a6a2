"""A kin session attached to a workflow (SPEC §4, §9): its prompt carries CURRENT CANVAS
within budget, its kin gets the `workflow_lineage` tool, and the attachment goes through
the session API. Unattached sessions are unchanged."""
import json

import pytest
from django.conf import settings

from sessions_app.models import Session, Turn
from sessions_app.turns.services import turn_post
from tests.sessions_app.test_turn_queries import build_session, preview_of, queries_of, turn_with_a_tool_call
from tests.sessions_app.test_turns import chat_requests
from workflows import services

pytestmark = pytest.mark.usefixtures("fake_llm_gateway")


def document(extra_filters: int = 0) -> dict:
    """inline records → filter (→ more filters) → table output."""
    nodes = [
        {"id": "people", "type": "inline_records", "label": "People",
         "config": {"records": [{"name": "Ada", "age": 36}, {"name": "Bo", "age": 17}, {"name": "Cy", "age": 52}]}},
        {"id": "adults", "type": "filter", "label": "Adults",
         "config": {"conditions": [{"field": "age", "op": "gte", "value": 18}]}},
    ]
    edges, previous = [{"source": "people", "target": "adults"}], "adults"
    for i in range(extra_filters):
        nodes.append({"id": f"f{i}", "type": "filter", "label": f"Filter {i}",
                      "config": {"conditions": [{"field": "age", "op": "gte", "value": i}]}})
        edges.append({"source": previous, "target": f"f{i}"})
        previous = f"f{i}"
    nodes.append({"id": "table", "type": "table_output", "label": "Result", "config": {"columns": ["name"]}})
    edges.append({"source": previous, "target": "table"})
    return {"name": "Adults", "nodes": nodes, "edges": edges}


def ran_workflow(team, capture, *, extra_filters: int = 0):
    workflow = services.workflow_create(team=team, document=services.document_clean(document(extra_filters)))
    with capture(execute=True):
        services.workflow_run_start(workflow=workflow)
    return workflow


@pytest.fixture
def workflow(team, django_capture_on_commit_callbacks):
    return ran_workflow(team, django_capture_on_commit_callbacks)


@pytest.fixture
def attached(chat_session, workflow):
    Session.objects.filter(pk=chat_session.pk).update(workflow=workflow)
    chat_session.refresh_from_db()
    return chat_session


def sections_of(api_client, session, message="Which people are in the result?"):
    response = api_client.get(f"/api/v1/sessions/{session.pk}/prompt/", {"message": message})
    assert response.status_code == 200, response.content
    return {section["id"]: section["text"] for section in response.json()["sections"]}, response.json()


# --- the prompt -------------------------------------------------------------------------------


def test_attached_session_carries_current_canvas_in_its_prompt_preview_within_budget(api_client, attached):
    sections, body = sections_of(api_client, attached)

    canvas = sections["canvas"]
    assert len(canvas) <= settings.CANVAS_MAX_CHARS
    assert canvas.startswith('Workflow "Adults" (3 nodes, 2 edges). Nodes:')
    assert '- adults "Adults" (filter): done, 3 in, 2 out.' in canvas
    # The terminal node's counts and narrative.
    assert 'Terminal node table "Result" (table_output), 2 records in, 2 out:' in canvas
    assert "2. Keeps records where age ≥ 18 (3 records in, 2 out)." in canvas
    assert "CURRENT CANVAS" in body["system_prompt"]
    assert "workflow_lineage" in body["tools"]
    ids = list(sections)
    assert ids.index("platforms") < ids.index("canvas") < ids.index("conversation_state")


def test_unattached_session_has_no_canvas_section_nor_lineage_tool(api_client, chat_session, workflow):
    sections, body = sections_of(api_client, chat_session)

    assert "canvas" not in sections
    assert "workflow_lineage" not in body["tools"]


def test_canvas_is_computed_per_turn(api_client, attached, workflow, django_capture_on_commit_callbacks):
    services.workflow_update(workflow=workflow, document=services.document_clean(
        {**document(), "nodes": [*document()["nodes"][:1],
                                 {**document()["nodes"][1], "config": {"conditions": [
                                     {"field": "age", "op": "gte", "value": 40}]}},
                                 document()["nodes"][2]]}))

    stale = sections_of(api_client, attached)[0]["canvas"]
    assert "Warning: upstream settings changed" in stale
    with django_capture_on_commit_callbacks(execute=True):
        services.workflow_run_start(workflow=workflow)
    fresh = sections_of(api_client, attached)[0]["canvas"]
    assert "Warning" not in fresh and "Keeps records where age ≥ 40 (3 records in, 1 out)." in fresh


# --- the workflow_lineage tool -----------------------------------------------------------------


def test_workflow_lineage_tool_round_trip_in_a_turn(attached, fake_llm):
    fake_llm.tool_call("workflow_lineage", {"node": "table", "max_chars": 500}, call_id="call_1")
    fake_llm.tool_call("workflow_lineage", {"node": "adults", "format": "json"}, call_id="call_2")
    fake_llm.reply("Ada and Cy: the adults.")

    turn = turn_post(session=attached, content="Where do the result's records come from?", sender="Maria")

    assert turn.status == Turn.Status.DONE and turn.tool_calls == 2
    first, second, third = chat_requests(fake_llm)
    assert "workflow_lineage" in {tool["function"]["name"] for tool in first["tools"]}
    narrative = json.loads(second["messages"][-1]["content"])
    assert narrative["node"] == "table" and narrative["stale"] is False
    assert len(narrative["narrative"]) <= 500
    assert "Keeps records where age ≥ 18 (3 records in, 2 out)." in narrative["narrative"]
    graph = json.loads(third["messages"][-1]["content"])["lineage"]
    assert [entry["id"] for entry in graph["entries"]] == ["people", "adults"]


def test_workflow_lineage_tool_answers_errors_as_text(attached, fake_llm):
    fake_llm.tool_call("workflow_lineage", {"node": "nope"}, call_id="call_1")
    fake_llm.tool_call("workflow_lineage", {"node": "table", "format": "prov"}, call_id="call_2")
    fake_llm.reply("Sorry.")

    turn = turn_post(session=attached, content="Lineage of nope?", sender="Maria")

    assert turn.status == Turn.Status.DONE
    _, second, third = chat_requests(fake_llm)
    assert second["messages"][-1]["content"] == (
        "Error: no node 'nope' in workflow 'Adults'; its nodes: people, adults, table."
    )
    assert third["messages"][-1]["content"] == "Error: format must be one of: narrative, json."


def test_unattached_session_has_no_workflow_lineage_tool(chat_session, fake_llm):
    fake_llm.tool_call("workflow_lineage", {"node": "table"}, call_id="call_1")
    fake_llm.reply("OK.")

    turn_post(session=chat_session, content="Lineage?", sender="Maria")

    first, second = chat_requests(fake_llm)
    assert "workflow_lineage" not in {tool["function"]["name"] for tool in first["tools"]}
    assert second["messages"][-1]["content"].startswith("Error: unknown tool 'workflow_lineage'")


# --- attaching through the API ---------------------------------------------------------------


def test_session_created_attached_to_a_workflow_of_the_team(api_client, kin, workflow):
    response = api_client.post(f"/api/v1/kins/{kin.pk}/sessions/", {"title": "Canvas", "workflow": workflow.pk},
                               format="json")

    assert response.status_code == 201, response.content
    assert response.json()["workflow"] == workflow.pk
    detail = api_client.get(f"/api/v1/sessions/{response.json()['id']}/").json()
    assert detail["workflow"] == workflow.pk
    plain = api_client.post(f"/api/v1/kins/{kin.pk}/sessions/", {"title": "Plain"}, format="json")
    assert plain.status_code == 201 and plain.json()["workflow"] is None


def test_session_cannot_attach_another_teams_or_an_unknown_workflow(
    api_client, kin, other_team, django_capture_on_commit_callbacks
):
    foreign = ran_workflow(other_team, django_capture_on_commit_callbacks)
    for workflow_id in (foreign.pk, foreign.pk + 1000):
        response = api_client.post(f"/api/v1/kins/{kin.pk}/sessions/", {"workflow": workflow_id}, format="json")
        assert response.status_code == 400, response.content
        assert "workflow" in json.dumps(response.json())
    assert not Session.objects.filter(kin=kin).exists()


# --- a fixed number of queries --------------------------------------------------------------


def test_attached_session_reads_a_fixed_number_of_queries_whatever_the_workflow_size(
    team, fake_llm, django_capture_on_commit_callbacks
):
    small_workflow = ran_workflow(team, django_capture_on_commit_callbacks)
    large_workflow = ran_workflow(team, django_capture_on_commit_callbacks, extra_filters=27)
    assert large_workflow.nodes.count() == 30
    unattached = build_session(team, messages=10, memories=10)
    small = build_session(team, messages=10, memories=10)
    large = build_session(team, messages=10, memories=10)
    Session.objects.filter(pk=small.pk).update(workflow=small_workflow)
    Session.objects.filter(pk=large.pk).update(workflow=large_workflow)
    for session in (small, large):
        session.refresh_from_db()

    previews = [queries_of(preview_of(s), s) for s in (unattached, small, large)]
    turns = [queries_of(turn_with_a_tool_call(s, fake_llm), s) for s in (small, large)]

    # The canvas reads the graph in three queries (nodes, stored result versions, edges).
    assert previews[1] == previews[2] == previews[0] + 3, previews
    assert turns[0] == turns[1], turns


def test_new_session_from_an_attached_one_stays_attached(api_client, attached, workflow, fake_llm,
                                                          django_capture_on_commit_callbacks):
    fake_llm.reply("Nothing worth storing.")  # the old session's introspection

    with django_capture_on_commit_callbacks(execute=True):
        response = api_client.post(f"/api/v1/sessions/{attached.pk}/messages/", {"content": "/new Next step"},
                                   format="json")

    assert response.status_code == 201, response.content
    new_session = Session.objects.get(pk=response.json()["new_session_id"])
    assert new_session.workflow == workflow
    sections, _ = sections_of(api_client, new_session)
    assert "canvas" in sections
