"""The workflow tools over HTTP with the SDK's client: workflow_node_types lists what the API
lists, workflow_save creates and replaces through the API's own checks (the same problems,
all of them, nothing saved), and workflow_run runs it (eager Celery: done when it answers),
within the team and the API's run allowance."""
import copy

from tests.agent_mcp.conftest import call, error_text
from tests.factories import TeamFactory, WorkflowFactory
from workflows.models import Node, Workflow

DOCUMENT = {
    "name": "Adults",
    "nodes": [
        {"id": "people", "type": "inline_records", "label": "People",
         "config": {"records": [{"name": "Ada", "age": 36}, {"name": "Bo", "age": 17}, {"name": "Ada", "age": 36}]}},
        {"id": "adults", "type": "filter", "label": "Adults",
         "config": {"conditions": [{"field": "age", "op": "gte", "value": 18}]}},
        {"id": "unique", "type": "deduplicate", "label": "Unique", "config": {"fields": ["name"]}},
    ],
    "edges": [{"source": "people", "target": "adults"}, {"source": "adults", "target": "unique"}],
}


def test_node_types_are_the_apis(mcp_url, mcp_token, mcp_api_client):
    result = call(mcp_url, mcp_token, "workflow_node_types", {})

    listed = mcp_api_client.get("/api/v1/workflow-node-types/").json()["results"]
    assert result.structured_content["node_types"] == listed


def test_save_creates_then_replaces_and_run_runs(mcp_url, mcp_token, mcp_team, mcp_api_client):
    created = call(mcp_url, mcp_token, "workflow_save", {"document": DOCUMENT}).structured_content
    workflow = Workflow.objects.get(pk=created["id"])
    assert workflow.team == mcp_team and workflow.nodes.count() == 3

    changed = copy.deepcopy(DOCUMENT)
    changed["name"] = "Grown-ups"
    changed["nodes"][1]["config"]["conditions"][0]["value"] = 30
    replaced = call(mcp_url, mcp_token, "workflow_save", {"document": changed, "workflow_id": workflow.pk})
    assert replaced.structured_content["id"] == workflow.pk and replaced.structured_content["name"] == "Grown-ups"
    assert Workflow.objects.count() == 1

    run = call(mcp_url, mcp_token, "workflow_run", {"workflow_id": workflow.pk}).structured_content["run"]
    assert run["id"]
    last_run = mcp_api_client.get(f"/api/v1/workflows/{workflow.pk}/").json()["last_run"]
    assert last_run["id"] == run["id"] and last_run["status"] == "done", last_run
    assert [node_run["records_out"] for node_run in last_run["node_runs"]] == [3, 2, 1]


def test_save_refuses_what_the_api_refuses_naming_every_problem(mcp_url, mcp_token, mcp_api_client):
    bad = copy.deepcopy(DOCUMENT)
    bad["nodes"].append({"id": "feed", "type": "http_json", "label": "Feed",
                         "config": {"url": "https://ada:secret@data.example.com/people.json"}})
    bad["edges"].append({"source": "unique", "target": "people"})  # a cycle

    api = mcp_api_client.post("/api/v1/workflows/", bad, format="json")
    assert api.status_code == 400
    problems = api.json()["error"]["details"]["errors"]
    assert len(problems) == 2 and problems[-1].startswith("cycle:")

    text = error_text(call(mcp_url, mcp_token, "workflow_save", {"document": bad}))
    for problem in problems:
        assert problem in text, text
    assert not Workflow.objects.exists() and not Node.objects.exists()


def test_another_teams_workflow_is_not_found_and_stays_as_it_was(mcp_url, mcp_token):
    other = WorkflowFactory(team=TeamFactory(), name="Theirs")

    saved = call(mcp_url, mcp_token, "workflow_save", {"document": DOCUMENT, "workflow_id": other.pk})
    ran = call(mcp_url, mcp_token, "workflow_run", {"workflow_id": other.pk})

    assert f"Workflow {other.pk} not found" in error_text(saved)
    assert f"Workflow {other.pk} not found" in error_text(ran)
    other.refresh_from_db()
    assert other.name == "Theirs" and not other.runs.exists()


def test_runs_share_the_apis_allowance(mcp_url, mcp_token, mcp_api_client, settings):
    settings.API_THROTTLE_RATES = {**settings.API_THROTTLE_RATES, "workflow_runs": "2/min"}
    workflow_id = mcp_api_client.post("/api/v1/workflows/", DOCUMENT, format="json").json()["id"]

    assert mcp_api_client.post(f"/api/v1/workflows/{workflow_id}/run/").status_code == 202
    assert not call(mcp_url, mcp_token, "workflow_run", {"workflow_id": workflow_id}).is_error
    refused = call(mcp_url, mcp_token, "workflow_run", {"workflow_id": workflow_id})

    assert "workflow_runs" in error_text(refused) and "2/min" in error_text(refused)
