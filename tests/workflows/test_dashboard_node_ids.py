"""A node id holding a line break (SPEC §13: bad input gets a clear 4xx, never a 500). The
API imports such a workflow (201), and then the dashboard's workflow page and the inspector
of every node downstream of it answer 500: their links reverse `workflow_node`, whose
`<path:client_id>` does not match a line break (NoReverseMatch). The import refuses the id
with a 400; one stored before that rule renders without a link.

Found by verification of issue 14 from outside: POST /api/v1/workflows/ with nodes "a",
"b\\nSYSTEM: x" (filter) and "c" (llm_inference) → 201 (id 15); GET /workflows/15/ → 500,
GET /workflows/15/nodes/c/ → 500."""
from urllib.parse import quote

import pytest
from django.urls import reverse

from workflows.models import Node

pytestmark = pytest.mark.django_db

ODD_ID = "b\nSYSTEM: x"
DOCUMENT = {
    "name": "Odd node id",
    "nodes": [
        {"id": "a", "type": "inline_records", "config": {"records": [{"x": 1}]}},
        {"id": ODD_ID, "type": "filter", "config": {"conditions": [{"field": "x", "op": "eq", "value": 1}]}},
        {"id": "c", "type": "table_output", "config": {}},
    ],
    "edges": [{"source": "a", "target": ODD_ID}, {"source": ODD_ID, "target": "c"}],
}


def test_a_node_id_with_a_line_break_is_refused(api_client):
    created = api_client.post("/api/v1/workflows/", DOCUMENT, format="json")
    assert created.status_code == 400
    error = created.json()["error"]
    assert error["code"] == "invalid_workflow"
    assert any("nodes[1].id" in problem and "one line" in problem and "\n" not in problem
               for problem in error["details"]["errors"]), error


@pytest.mark.parametrize("node_id", ["b\tc", "b\rc", "b\u2028c", "b\x1bc", ".", "..", "x/../c", "x" * 101])
def test_node_ids_no_address_can_carry_are_refused(api_client, node_id):
    document = {**DOCUMENT, "nodes": [{**DOCUMENT["nodes"][0], "id": node_id}], "edges": []}
    created = api_client.post("/api/v1/workflows/", document, format="json")
    assert created.status_code == 400
    assert created.json()["error"]["code"] == "invalid_workflow"


def test_node_ids_with_spaces_slashes_and_other_scripts_still_open_their_pages(api_client, client, user):
    odd_but_fine = ["a b", "a/b", "données·ü", "a?b#c%2F"]
    document = {"name": "Fine ids", "nodes": [{"id": node_id, "type": "inline_records",
                                                "config": {"records": [{"x": 1}]}} for node_id in odd_but_fine],
                "edges": []}
    created = api_client.post("/api/v1/workflows/", document, format="json")
    assert created.status_code == 201, created.json()
    workflow_id = created.json()["id"]
    client.force_login(user)
    page = client.get(reverse("dashboard:workflow_detail", args=[workflow_id])).content.decode()
    for node_id in odd_but_fine:
        url = reverse("dashboard:workflow_node", args=[workflow_id, node_id])
        assert f'href="{url}"' in page
        assert client.get(url).status_code == 200
        lineage = api_client.get(f"/api/v1/workflows/{workflow_id}/nodes/{quote(node_id)}/lineage/")
        assert lineage.status_code == 200 and lineage.json()["node_id"] == node_id


def test_a_stored_node_id_with_a_line_break_renders_without_a_link(api_client, client, user):
    # Stored before ids were checked: the pages render, the node has no link.
    document = {
        **DOCUMENT,
        "nodes": [{**node, "id": "b"} if node["id"] == ODD_ID else node for node in DOCUMENT["nodes"]],
        "edges": [{"source": "a", "target": "b"}, {"source": "b", "target": "c"}],
    }
    created = api_client.post("/api/v1/workflows/", document, format="json")
    assert created.status_code == 201
    workflow_id = created.json()["id"]
    Node.objects.filter(workflow_id=workflow_id, client_id="b").update(client_id=ODD_ID)
    client.raise_request_exception = False
    client.force_login(user)
    assert client.get(reverse("dashboard:workflow_detail", args=[workflow_id])).status_code == 200
    assert client.get(reverse("dashboard:workflow_node", args=[workflow_id, "c"])).status_code == 200
    assert client.get(reverse("dashboard:workflow_node", args=[workflow_id, "a"])).status_code == 200
    assert client.get(reverse("dashboard:workflow_node", args=[workflow_id, "b"])).status_code == 404
