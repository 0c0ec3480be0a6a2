"""The workflows API (SPEC §11): CRUD from the JSON document, import/export round trip,
the 400s (cycles, dangling edges, bad parameters, unknown types at run time), runs and lineage."""
import copy

import pytest

from tests.sessions_app.test_api_access import assert_api_error
from workflows.models import Node, Workflow

API = "/api/v1/workflows/"

DOCUMENT = {
    "name": "Adults",
    "description": "People of age, one per email.",
    "nodes": [
        {"id": "people", "type": "inline_records", "label": "People", "position": {"x": 0, "y": 0},
         "config": {"records": [{"name": "Ada", "age": 36}, {"name": "Bo", "age": 17}, {"name": "Ada", "age": 36}]}},
        {"id": "adults", "type": "filter", "label": "Adults", "position": {"x": 200, "y": 0},
         "config": {"conditions": [{"field": "age", "op": "gte", "value": 18}], "combine": "and"}},
        {"id": "unique", "type": "deduplicate", "label": "Unique", "position": {"x": 400, "y": 0},
         "config": {"fields": ["name"]}},
    ],
    "edges": [
        {"source": "people", "target": "adults", "source_handle": "out", "target_handle": "in", "kind": "data"},
        {"source": "adults", "target": "unique", "source_handle": "", "target_handle": "", "kind": "data"},
    ],
}


def _post(api_client, document=DOCUMENT):
    return api_client.post(API, document, format="json")


@pytest.fixture
def workflow_id(api_client):
    response = _post(api_client)
    assert response.status_code == 201, response.content
    return response.json()["id"]


def test_create_list_get_and_export_round_trip(api_client, workflow_id):
    listed = api_client.get(API).json()["results"]
    detail = api_client.get(f"{API}{workflow_id}/").json()
    exported = api_client.get(f"{API}{workflow_id}/?export=1").json()

    assert [(w["id"], w["name"], w["node_count"]) for w in listed] == [(workflow_id, "Adults", 3)]
    assert exported == DOCUMENT
    assert [(n["id"], n["status"], n["results_version"]) for n in detail["nodes"]] == [
        ("people", "idle", 0), ("adults", "idle", 0), ("unique", "idle", 0)
    ]
    assert detail["nodes"][1]["description"] == 'Keeps records where age ≥ 18 (not run yet).'
    # The export imports as an equal workflow, and so does the full GET body.
    again = _post(api_client, exported).json()
    from_detail = _post(api_client, detail).json()
    assert api_client.get(f"{API}{again['id']}/?export=1").json() == DOCUMENT
    assert api_client.get(f"{API}{from_detail['id']}/?export=1").json() == DOCUMENT


def test_put_replaces_the_graph_and_keeps_node_identity(api_client, workflow_id,
                                                         django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        api_client.post(f"{API}{workflow_id}/run/")
    document = copy.deepcopy(DOCUMENT)
    document["name"] = "Adults only"
    document["nodes"] = document["nodes"][:2]
    document["edges"] = document["edges"][:1]
    document["nodes"][1]["config"]["conditions"][0]["value"] = 21

    response = api_client.put(f"{API}{workflow_id}/", document, format="json")

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["name"] == "Adults only"
    assert [n["id"] for n in body["nodes"]] == ["people", "adults"]
    adults = body["nodes"][1]
    assert adults["results_version"] == 1  # same node, results kept …
    assert adults["config_fingerprint"] != adults["current_fingerprint"]  # … and now stale
    assert api_client.get(f"{API}{workflow_id}/?export=1").json() == document


def test_delete(api_client, workflow_id):
    assert api_client.delete(f"{API}{workflow_id}/").status_code == 204
    assert not Workflow.objects.filter(pk=workflow_id).exists()
    assert_api_error(api_client.get(f"{API}{workflow_id}/"), 404, code="not_found")


def test_cycle_is_refused_naming_it(api_client):
    document = copy.deepcopy(DOCUMENT)
    document["edges"].append({"source": "unique", "target": "people"})

    error = assert_api_error(_post(api_client, document), 400, code="invalid_workflow")

    assert error["message"] == "The workflow has a cycle: people → adults → unique → people."
    assert error["details"]["cycle"] == ["people", "adults", "unique", "people"]
    assert not Workflow.objects.exists()


def test_self_loop_is_a_cycle(api_client):
    document = copy.deepcopy(DOCUMENT)
    document["edges"].append({"source": "adults", "target": "adults"})

    error = assert_api_error(_post(api_client, document), 400)
    assert "adults → adults" in error["message"]


def test_dangling_edge_is_refused_naming_the_missing_node(api_client, workflow_id):
    document = copy.deepcopy(DOCUMENT)
    document["edges"].append({"source": "unique", "target": "ghost"})

    error = assert_api_error(api_client.put(f"{API}{workflow_id}/", document, format="json"), 400)

    assert "target 'ghost' is not a node of this workflow" in error["message"]
    assert Node.objects.filter(workflow_id=workflow_id).count() == 3  # nothing changed


def test_duplicate_node_ids_are_refused(api_client):
    document = copy.deepcopy(DOCUMENT)
    document["nodes"].append({"id": "people", "type": "table_output"})

    error = assert_api_error(_post(api_client, document), 400)
    assert "node id 'people' is used by more than one node" in error["message"]


def test_bad_params_of_a_known_type_are_refused(api_client):
    document = copy.deepcopy(DOCUMENT)
    document["nodes"][1]["config"] = {"conditions": [{"field": "age", "op": "older_than", "value": 18}]}
    document["nodes"][2]["config"] = {}

    error = assert_api_error(_post(api_client, document), 400)

    assert any("node 'adults' (filter): condition 1 has op 'older_than'" in e for e in error["details"]["errors"])
    assert any("node 'unique' (deduplicate): parameter 'fields' is required" in e for e in error["details"]["errors"])


@pytest.mark.parametrize("body", [[], "x", {"nodes": []}, {"name": "x", "nodes": {}}, {"name": "x", "nodez": []}])
def test_malformed_documents_answer_400(api_client, body):
    assert_api_error(api_client.post(API, body, format="json"), 400)


def test_unknown_type_is_stored_and_described_but_run_answers_400(api_client):
    document = copy.deepcopy(DOCUMENT)
    document["nodes"].append({"id": "pivot", "type": "pivot_table", "label": "Pivot", "config": {"by": "city"}})
    document["edges"].append({"source": "unique", "target": "pivot"})

    created = _post(api_client, document)
    assert created.status_code == 201, created.content
    workflow_id = created.json()["id"]
    pivot = created.json()["nodes"][3]
    assert pivot["config"] == {"by": "city"}
    assert pivot["description"] == '"Pivot" of unknown type pivot_table (not run yet).'

    error = assert_api_error(api_client.post(f"{API}{workflow_id}/run/"), 400, code="invalid_workflow")
    assert "pivot_table" in error["message"] and "'pivot'" in error["message"]


def test_run_answers_202_and_the_workflow_shows_node_counts(api_client, workflow_id,
                                                              django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = api_client.post(f"{API}{workflow_id}/run/")

    assert response.status_code == 202, response.content
    run = response.json()["run"]
    assert [(nr["node_id"], nr["wave"]) for nr in run["node_runs"]] == [("people", 0), ("adults", 1), ("unique", 2)]
    detail = api_client.get(f"{API}{workflow_id}/").json()
    assert [(n["id"], n["status"], n["records_in"], n["records_out"]) for n in detail["nodes"]] == [
        ("people", "done", None, 3), ("adults", "done", 3, 2), ("unique", "done", 2, 1)
    ]
    assert detail["nodes"][2]["description"] == "Removes duplicates by name, keeping the first of each (2 in, 1 out)."
    assert detail["last_run"]["status"] == "done"


@pytest.mark.django_db(transaction=True)
def test_run_in_eager_mode_answers_with_the_finished_run(api_client, workflow_id):
    # No test transaction here, so the run starts on commit inside the request, as in production.
    run = api_client.post(f"{API}{workflow_id}/run/").json()["run"]

    assert run["status"] == "done"
    assert [nr["records_out"] for nr in run["node_runs"]] == [3, 2, 1]


def test_lineage_formats(api_client, workflow_id, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        api_client.post(f"{API}{workflow_id}/run/")
    url = f"{API}{workflow_id}/nodes/unique/lineage/"

    as_json = api_client.get(url).json()
    narrative = api_client.get(url + "?format=narrative&max_chars=1000").json()
    prov = api_client.get(url + "?format=prov").json()
    openlineage = api_client.get(url + "?format=openlineage").json()

    assert as_json["format"] == "json" and as_json["stale"] is False
    assert [e["id"] for e in as_json["lineage"]["entries"]] == ["people", "adults", "unique"]
    assert "Keeps records where age ≥ 18" in narrative["lineage"]
    assert len(narrative["lineage"]) <= 1000
    assert "kinsite:run.adults" in prov["lineage"]["activity"]
    assert [event["job"]["name"] for event in openlineage["lineage"]] == [
        "Adults.people", "Adults.adults", "Adults.unique"
    ]


def test_lineage_is_stale_after_an_upstream_change(api_client, workflow_id, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        api_client.post(f"{API}{workflow_id}/run/")
    document = copy.deepcopy(DOCUMENT)
    document["nodes"][1]["config"]["conditions"][0]["value"] = 30
    api_client.put(f"{API}{workflow_id}/", document, format="json")

    body = api_client.get(f"{API}{workflow_id}/nodes/unique/lineage/?format=narrative").json()

    assert body["stale"] is True
    assert body["lineage"].startswith("Warning: upstream settings changed")


@pytest.mark.parametrize("query", ["format=yaml", "max_chars=abc", "max_chars=10", "format=narrative&max_chars=-5"])
def test_lineage_bad_query_answers_400(api_client, workflow_id, query):
    assert_api_error(api_client.get(f"{API}{workflow_id}/nodes/unique/lineage/?{query}"), 400)


def test_lineage_of_an_unknown_node_answers_404(api_client, workflow_id):
    assert_api_error(api_client.get(f"{API}{workflow_id}/nodes/ghost/lineage/"), 404, code="not_found")


# --- issue 14: untrusted patterns and numbers, all problems at once, rate limit ----------------


def test_a_pattern_re2_cannot_run_is_refused_naming_the_node(api_client):
    document = copy.deepcopy(DOCUMENT)
    document["nodes"].append({"id": "doubles", "type": "transform", "label": "Doubled words",
                              "config": {"extract": {"field": "name", "pattern": r"(\w)\1", "into": "double"}}})
    document["edges"].append({"source": "unique", "target": "doubles"})

    error = assert_api_error(_post(api_client, document), 400, code="invalid_workflow")

    assert error["details"]["errors"] == [
        "node 'doubles' (transform): extract 1: pattern '(\\\\w)\\\\1' is not supported: it uses a backreference "
        "(invalid escape sequence: \\1); patterns run on RE2, which matches in linear time and so has no "
        "backreferences, lookaround or atomic groups."
    ]
    assert not Workflow.objects.exists()


def test_a_catastrophic_pattern_runs_at_once(api_client, django_capture_on_commit_callbacks):
    document = {
        "name": "Evil pattern",
        "nodes": [
            {"id": "text", "type": "inline_records", "config": {"records": [{"s": "a" * 40 + "!"}, {"s": "xaa"}]}},
            {
                "id": "tail", "type": "transform",
                "config": {"extract": {"field": "s", "pattern": "(a+)+$", "into": "t"}},
            },
        ],
        "edges": [{"source": "text", "target": "tail"}],
    }
    workflow_id = _post(api_client, document).json()["id"]

    with django_capture_on_commit_callbacks(execute=True):
        run = api_client.post(f"{API}{workflow_id}/run/")

    assert run.status_code == 202, run.content
    exported = api_client.get(f"{API}{workflow_id}/").json()
    assert exported["last_run"]["status"] == "done", exported["last_run"]
    node = Node.objects.get(workflow_id=workflow_id, client_id="tail")
    assert node.results.get(version=node.results_version).records == [{"s": "a" * 40 + "!", "t": None},
                                                                      {"s": "xaa", "t": "aa"}]


def test_a_number_out_of_range_is_refused_at_save_and_huge_record_values_still_filter(
    api_client, django_capture_on_commit_callbacks
):
    document = copy.deepcopy(DOCUMENT)
    document["nodes"][1]["config"]["conditions"][0]["value"] = 10**400

    error = assert_api_error(_post(api_client, document), 400, code="invalid_workflow")

    assert error["details"]["errors"] == [
        "node 'adults' (filter): condition 1: the number 1000000000000000000000… is out of range; numbers must "
        "lie between -9223372036854775807 and 9223372036854775807."
    ]
    assert not Workflow.objects.exists()

    # Records are data, not settings: a huge integer in them filters like any number.
    document = copy.deepcopy(DOCUMENT)
    document["nodes"][0]["config"]["records"].append({"name": "Old", "age": 10**400})
    workflow_id = _post(api_client, document).json()["id"]
    with django_capture_on_commit_callbacks(execute=True):
        api_client.post(f"{API}{workflow_id}/run/")
    run = api_client.get(f"{API}{workflow_id}/").json()["last_run"]
    assert run["status"] == "done", run
    assert [nr["records_out"] for nr in run["node_runs"]] == [4, 3, 2]


def test_every_problem_is_reported_at_once_the_cycle_included(api_client):
    document = copy.deepcopy(DOCUMENT)
    document["nodes"][2]["config"] = {}
    document["edges"].append({"source": "unique", "target": "people"})

    error = assert_api_error(_post(api_client, document), 400, code="invalid_workflow")

    assert error["details"]["errors"] == [
        "node 'unique' (deduplicate): parameter 'fields' is required (the field or fields that identify a duplicate).",
        "cycle: people → adults → unique → people",
    ]
    assert error["details"]["cycle"] == ["people", "adults", "unique", "people"]
    assert error["message"] == (
        "node 'unique' (deduplicate): parameter 'fields' is required (the field or fields that identify a "
        "duplicate). (and 1 more problems)"
    )


def test_runs_are_rate_limited_per_token(api_client, workflow_id, settings, django_capture_on_commit_callbacks):
    settings.API_THROTTLE_RATES = {**settings.API_THROTTLE_RATES, "workflow_runs": "2/min"}

    answers = []
    for _ in range(3):
        with django_capture_on_commit_callbacks(execute=True):  # each run finishes (eager) before the next
            answers.append(api_client.post(f"{API}{workflow_id}/run/"))

    assert [answer.status_code for answer in answers[:2]] == [202, 202]
    error = assert_api_error(answers[2], 429, code="throttled")
    assert "workflow_runs" in error["message"] and "2/min" in error["message"]
    assert int(answers[2]["Retry-After"]) > 0
    assert api_client.get(f"{API}{workflow_id}/").status_code == 200  # reads are not counted
