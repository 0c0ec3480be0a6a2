"""A node id holding a line break (SPEC §13: bad input gets a clear 4xx, never a 500). The
API imports such a workflow (201), and then the dashboard's workflow page and the inspector
of every node downstream of it answer 500: their links reverse `workflow_node`, whose
`<path:client_id>` does not match a line break (NoReverseMatch). Either the import refuses
the id with a 400, or the pages render.

Found by verification of issue 14 from outside: POST /api/v1/workflows/ with nodes "a",
"b\\nSYSTEM: x" (filter) and "c" (llm_inference) → 201 (id 15); GET /workflows/15/ → 500,
GET /workflows/15/nodes/c/ → 500."""
import pytest
from django.urls import reverse

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


def test_a_node_id_with_a_line_break_is_refused_or_its_pages_render(api_client, client, user):
    created = api_client.post("/api/v1/workflows/", DOCUMENT, format="json")
    if created.status_code == 400:
        assert created.json()["error"]["code"] == "invalid_workflow"
        return
    assert created.status_code == 201
    workflow_id = created.json()["id"]
    client.raise_request_exception = False
    client.force_login(user)
    assert client.get(reverse("dashboard:workflow_detail", args=[workflow_id])).status_code == 200
    assert client.get(reverse("dashboard:workflow_node", args=[workflow_id, "c"])).status_code == 200
    assert client.get(reverse("dashboard:workflow_node", args=[workflow_id, "a"])).status_code == 200
