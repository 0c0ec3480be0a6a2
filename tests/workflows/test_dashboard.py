"""The workflow dashboard pages through Django's test client: the list, the graph page
(SVG, statuses, counts, the Run button and its 400), the lineage inspector, its JSON
downloads (equal to the API's), team scoping, escaping and bounded query counts."""
import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from workflows import services
from workflows.models import Node

pytestmark = pytest.mark.django_db

PEOPLE = [{"name": f"Person {i}", "age": 10 + i * 3} for i in range(25)]
DOCUMENT = {
    "name": "Adults",
    "description": "People of age.",
    "nodes": [
        {"id": "people", "type": "inline_records", "label": "People", "config": {"records": PEOPLE}},
        {"id": "adults", "type": "filter", "label": "Adults",
         "config": {"conditions": [{"field": "age", "op": "gte", "value": 18}]}},
        {"id": "table", "type": "table_output", "label": "Result", "config": {"columns": ["name", "age"]}},
    ],
    "edges": [{"source": "people", "target": "adults"}, {"source": "adults", "target": "table"}],
}


def _create(team, document=DOCUMENT):
    return services.workflow_create(team=team, document=services.document_clean(document))


def _run(workflow, capture):
    with capture(execute=True):
        services.workflow_run_start(workflow=workflow)


def _chain(n: int) -> dict:
    nodes = [{"id": "n0", "type": "inline_records", "config": {"records": [{"a": 1}]}}]
    nodes += [{"id": f"n{i}", "type": "deduplicate", "config": {"fields": ["a"]}} for i in range(1, n)]
    edges = [{"source": f"n{i - 1}", "target": f"n{i}"} for i in range(1, n)]
    return {"name": f"Chain of {n}", "nodes": nodes, "edges": edges}


@pytest.fixture
def logged_in(client, user, team):
    client.force_login(user)
    return client


def test_pages_need_a_login(client, team):
    workflow = _create(team)
    for url in [reverse("dashboard:workflows"), reverse("dashboard:workflow_detail", args=[workflow.pk]),
                reverse("dashboard:workflow_node", args=[workflow.pk, "people"])]:
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


def test_list_shows_the_teams_workflows_with_nodes_and_last_run(logged_in, team, other_team,
                                                                  django_capture_on_commit_callbacks):
    ran = _create(team)
    _run(ran, django_capture_on_commit_callbacks)
    _create(team, _chain(2))
    _create(other_team, {**DOCUMENT, "name": "Not ours"})

    response = logged_in.get(reverse("dashboard:workflows"))

    body = response.content.decode()
    assert response.status_code == 200
    assert "Adults" in body and "Chain of 2" in body and "Not ours" not in body
    assert [(w.name, w.node_count, w.last_run_status) for w in response.context["workflows"]] == [
        ("Adults", 3, "done"), ("Chain of 2", 2, None)
    ]
    assert 'href="/workflows/"' in body  # the nav link


def test_detail_draws_the_graph_and_lists_the_nodes(logged_in, team):
    workflow = _create(team)

    response = logged_in.get(reverse("dashboard:workflow_detail", args=[workflow.pk]))

    body = response.content.decode()
    assert response.status_code == 200
    assert body.count(f'<a href="/workflows/{workflow.pk}/nodes/') == 6  # 3 in the SVG, 3 in the table
    assert body.count("<rect ") == 3
    assert body.count('class="wf-edge kind-data"') == 2
    assert 'marker-end="url(#wf-arrow)"' in body
    assert "Keeps records where age ≥ 18 (not run yet)." in body
    assert "Never ran." in body


def test_run_button_runs_and_redirects_back_with_counts(logged_in, team, django_capture_on_commit_callbacks):
    workflow = _create(team)

    with django_capture_on_commit_callbacks(execute=True):
        response = logged_in.post(reverse("dashboard:workflow_run", args=[workflow.pk]))

    assert response.status_code == 302
    assert response["Location"].startswith(reverse("dashboard:workflow_detail", args=[workflow.pk]))
    page = logged_in.get(response["Location"])
    body = page.content.decode()
    adults = sum(1 for p in PEOPLE if p["age"] >= 18)
    assert [(n.client_id, n.status, n.records_out) for n in Node.objects.filter(workflow=workflow)] == [
        ("people", "done", 25), ("adults", "done", adults), ("table", "done", adults)
    ]
    assert f"25 in · {adults} out" in body
    assert body.count('class="wf-node status-done"') == 3
    assert f"Keeps records where age ≥ 18 (25 in, {adults} out)." in body


def test_run_with_unknown_types_shows_the_400_message(logged_in, team):
    document = {**DOCUMENT, "nodes": [*DOCUMENT["nodes"][:2], {"id": "table", "type": "mystery"}]}
    workflow = _create(team, document)

    response = logged_in.post(reverse("dashboard:workflow_run", args=[workflow.pk]))

    assert response.status_code == 400
    assert "Unknown node types cannot run: mystery" in response.content.decode()
    assert logged_in.get(reverse("dashboard:workflow_run", args=[workflow.pk])).status_code == 405


def test_a_workflow_that_cannot_run_shows_a_disabled_run_button_and_why(logged_in, team):
    document = {
        **DOCUMENT,
        "nodes": [*DOCUMENT["nodes"][:2], {"id": "table", "type": "mystery"}, {"id": "lonely", "type": "filter",
                  "config": {"conditions": [{"field": "age", "op": "gt", "value": 1}]}}],
    }
    workflow = _create(team, document)

    body = logged_in.get(reverse("dashboard:workflow_detail", args=[workflow.pk])).content.decode()

    assert '<button type="submit" id="run-workflow" disabled aria-describedby="run-blocked">Run</button>' in body
    assert "Unknown node types cannot run: mystery (nodes &#x27;table&#x27; (mystery))." in body
    assert "node &#x27;lonely&#x27; (filter) needs at least 1 data inputs, has 0." in body
    # A workflow that can run keeps an active button and no such notice.
    runnable = logged_in.get(reverse("dashboard:workflow_detail", args=[_create(team).pk])).content.decode()
    assert '<button type="submit" id="run-workflow">Run</button>' in runnable
    assert 'id="run-blocked"' not in runnable


def test_other_teams_workflows_and_nodes_are_404(logged_in, team, other_team):
    theirs = _create(other_team)
    ours = _create(team)
    for url in [
        reverse("dashboard:workflow_detail", args=[theirs.pk]),
        reverse("dashboard:workflow_node", args=[theirs.pk, "people"]),
        reverse("dashboard:workflow_node_export", args=[theirs.pk, "json", "people"]),
        reverse("dashboard:workflow_node", args=[ours.pk, "nobody"]),
        reverse("dashboard:workflow_node_export", args=[ours.pk, "yaml", "people"]),
    ]:
        assert logged_in.get(url).status_code == 404, url
    assert logged_in.post(reverse("dashboard:workflow_run", args=[theirs.pk])).status_code == 404


def test_user_text_is_escaped_in_the_svg_table_and_inspector(logged_in, team, django_capture_on_commit_callbacks):
    evil = '<script>alert("x")</script>'
    document = {
        "name": evil,
        "nodes": [
            {"id": 'a/"><b>', "type": "inline_records", "label": evil,
             "config": {"records": [{"<img src=x onerror=alert(1)>": evil}]}},
            {"id": "t", "type": "table_output", "label": "T", "config": {}},
        ],
        "edges": [{"source": 'a/"><b>', "target": "t"}],
    }
    workflow = _create(team, document)
    _run(workflow, django_capture_on_commit_callbacks)

    pages = [
        logged_in.get(reverse("dashboard:workflows")),
        logged_in.get(reverse("dashboard:workflow_detail", args=[workflow.pk])),
        logged_in.get(reverse("dashboard:workflow_node", args=[workflow.pk, 'a/"><b>'])),
        logged_in.get(reverse("dashboard:workflow_node", args=[workflow.pk, "t"])),
    ]
    for response in pages:
        body = response.content.decode()
        assert response.status_code == 200
        assert "<script>alert" not in body and "<img src=x" not in body and '"><b>' not in body
        assert "&lt;script&gt;" in body


def test_inspector_shows_the_narrative_entries_and_first_results(logged_in, team, django_capture_on_commit_callbacks):
    workflow = _create(team)
    _run(workflow, django_capture_on_commit_callbacks)

    response = logged_in.get(reverse("dashboard:workflow_node", args=[workflow.pk, "table"]))

    body = response.content.decode()
    context = response.context
    assert response.status_code == 200
    assert context["narrative"].startswith("1. ")
    assert "2. Keeps records where age ≥ 18" in context["narrative"]
    assert [entry.id for entry in context["graph"].entries] == ["people", "adults", "table"]
    assert "stale-warning" not in body
    adults = [p for p in PEOPLE if p["age"] >= 18]
    assert context["record_count"] == len(adults)
    assert context["columns"] == ["name", "age"]
    assert context["cells"] == [[p["name"], str(p["age"])] for p in adults[:20]]
    assert f"{len(adults)} records, the first 20 shown" in body
    # Without configured columns, keys are alphabetical (jsonb keeps no key order).
    filtered = logged_in.get(reverse("dashboard:workflow_node", args=[workflow.pk, "adults"])).context
    assert filtered["columns"] == ["age", "name"]
    for fmt in ["json", "prov", "openlineage"]:
        assert reverse("dashboard:workflow_node_export", args=[workflow.pk, fmt, "table"]) in body


def test_inspector_max_chars_selector_shortens_the_narrative(logged_in, team):
    workflow = _create(team, _chain(12))
    url = reverse("dashboard:workflow_node", args=[workflow.pk, "n11"])

    short = logged_in.get(url, {"max_chars": 500}).context
    full = logged_in.get(url, {"max_chars": 8000}).context
    forgiving = logged_in.get(url, {"max_chars": "lots"}).context

    assert len(short["narrative"]) <= 500 < len(full["narrative"])
    assert forgiving["max_chars"] == 2000


def test_inspector_flags_stale_lineage(logged_in, team, django_capture_on_commit_callbacks):
    workflow = _create(team)
    _run(workflow, django_capture_on_commit_callbacks)
    changed = json.loads(json.dumps(DOCUMENT))
    changed["nodes"][1]["config"]["conditions"][0]["value"] = 30
    services.workflow_update(workflow=workflow, document=services.document_clean(changed))

    response = logged_in.get(reverse("dashboard:workflow_node", args=[workflow.pk, "table"]))

    body = response.content.decode()
    assert 'id="stale-warning"' in body
    assert "Adults has changed settings since its last run" in body
    assert response.context["narrative"].startswith("Warning")


@pytest.mark.parametrize("fmt", ["json", "prov", "openlineage"])
def test_exports_download_what_the_api_returns(logged_in, api_client, team, django_capture_on_commit_callbacks, fmt):
    workflow = _create(team)
    _run(workflow, django_capture_on_commit_callbacks)

    response = logged_in.get(reverse("dashboard:workflow_node_export", args=[workflow.pk, fmt, "table"]))
    api = api_client.get(f"/api/v1/workflows/{workflow.pk}/nodes/table/lineage/", {"format": fmt}).json()

    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response["Content-Disposition"] == (
        f'attachment; filename="workflow-{workflow.pk}-table-lineage-{fmt}.json"'
    )
    assert json.loads(response.content) == api["lineage"]


def _queries(client, url) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(url).status_code == 200
    return len(captured)


def test_query_counts_do_not_grow_with_the_nodes(logged_in, team, django_capture_on_commit_callbacks):
    small, large = _create(team, _chain(3)), _create(team, _chain(30))
    _run(small, django_capture_on_commit_callbacks)
    _run(large, django_capture_on_commit_callbacks)

    assert _queries(logged_in, reverse("dashboard:workflows")) <= 6
    detail = [_queries(logged_in, reverse("dashboard:workflow_detail", args=[w.pk])) for w in (small, large)]
    inspector = [_queries(logged_in, reverse("dashboard:workflow_node", args=[w.pk, f"n{n - 1}"]))
                 for w, n in ((small, 3), (large, 30))]
    assert detail[0] == detail[1] <= 10
    assert inspector[0] == inspector[1] <= 12
