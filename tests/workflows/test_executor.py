"""The executor end to end: waves as (eager) Celery tasks, counts, stored results,
fingerprints, failures that stop their downstream only, and {{_lineage}} in the prompt
that reaches the (fake, local) model server."""
import pytest

from kinsite.models import LLMCall
from workflows import services
from workflows.executor import workflow_run_wave
from workflows.models import Node, NodeResult, NodeRun, WorkflowRun
from workflows.nodes.base import config_fingerprint

pytestmark = pytest.mark.django_db

PEOPLE = [
    {"id": 1, "name": "Ada", "age": 36, "email": "ada@example.org"},
    {"id": 2, "name": "Bo", "age": 17, "email": "bo@example.org"},
    {"id": 3, "name": "Cy", "age": 52, "email": "cy@example.org"},
    {"id": 4, "name": "Ada again", "age": 36, "email": "ada@example.org"},
    {"id": 5, "name": "Di", "age": 44, "email": "di@example.org"},
]
ORDERS = [{"id": 1, "total": 120}, {"id": 3, "total": 40}, {"id": 9, "total": 7}]

ACCEPTANCE_DOCUMENT = {
    "name": "Customer notes",
    "nodes": [
        {"id": "people", "type": "inline_records", "label": "People", "config": {"records": PEOPLE}},
        {"id": "adults", "type": "filter", "label": "Adults",
         "config": {"conditions": [{"field": "age", "op": "gte", "value": 18}]}},
        {"id": "unique", "type": "deduplicate", "label": "One per email", "config": {"fields": ["email"]}},
        {"id": "orders", "type": "inline_records", "label": "Orders", "config": {"records": ORDERS}},
        {"id": "joined", "type": "merge", "label": "People with orders", "config": {"key": "id", "how": "inner"}},
        {"id": "notes", "type": "llm_inference", "label": "Notes",
         "config": {"prompt": "Write a note about {{name}}, who spent {{total}}.\nWhere this record comes from:\n"
                              "{{_lineage}}", "output_field": "note"}},
        {"id": "table", "type": "table_output", "label": "Result", "config": {"columns": ["name", "total", "note"]}},
    ],
    "edges": [
        {"source": "people", "target": "adults"},
        {"source": "adults", "target": "unique"},
        {"source": "orders", "target": "joined", "target_handle": "right"},
        {"source": "unique", "target": "joined", "target_handle": "left"},
        {"source": "joined", "target": "notes"},
        {"source": "notes", "target": "table"},
    ],
}


def _create(team, document):
    return services.workflow_create(team=team, document=services.document_clean(document))


def _run(workflow, capture):
    with capture(execute=True):
        run = services.workflow_run_start(workflow=workflow)
    run.refresh_from_db()
    return run


def _nodes(workflow):
    return {node.client_id: node for node in Node.objects.filter(workflow=workflow)}


def _records(node):
    return NodeResult.objects.get(node=node, version=node.results_version).records


def test_acceptance_run_counts_results_and_lineage_in_the_prompt(
    team, fake_llm, fake_llm_gateway, django_capture_on_commit_callbacks
):
    fake_llm.reply("Ada is a loyal customer.")
    fake_llm.reply("Cy buys now and then.")
    workflow = _create(team, ACCEPTANCE_DOCUMENT)

    run = _run(workflow, django_capture_on_commit_callbacks)

    assert run.status == WorkflowRun.Status.DONE, run.error
    nodes = _nodes(workflow)
    counts = {key: (node.status, node.records_in, node.records_out) for key, node in nodes.items()}
    assert counts == {
        "people": ("done", None, 5),
        "adults": ("done", 5, 4),
        "unique": ("done", 4, 3),
        "orders": ("done", None, 3),
        "joined": ("done", 6, 2),
        "notes": ("done", 2, 2),
        "table": ("done", 2, 2),
    }
    assert [r["email"] for r in _records(nodes["unique"])] == ["ada@example.org", "cy@example.org", "di@example.org"]
    assert _records(nodes["table"]) == [
        {"id": 1, "name": "Ada", "age": 36, "email": "ada@example.org", "total": 120,
         "note": "Ada is a loyal customer."},
        {"id": 3, "name": "Cy", "age": 52, "email": "cy@example.org", "total": 40, "note": "Cy buys now and then."},
    ]
    waves = dict(NodeRun.objects.filter(run=run).values_list("node__client_id", "wave"))
    assert waves == {"people": 0, "orders": 0, "adults": 1, "unique": 2, "joined": 3, "notes": 4, "table": 5}

    # The narrative was computed once for the node run, and each prompt carried it.
    narrative = NodeRun.objects.get(run=run, node=nodes["notes"]).lineage_narrative
    assert "Keeps records where age ≥ 18" in narrative
    assert "Removes duplicates by email" in narrative
    assert "Joins its two inputs on id with an inner join" in narrative
    prompts = [body["messages"][-1]["content"] for body in fake_llm.requests_to("chat")]
    assert prompts == [
        f"Write a note about Ada, who spent 120.\nWhere this record comes from:\n{narrative}",
        f"Write a note about Cy, who spent 40.\nWhere this record comes from:\n{narrative}",
    ]
    assert LLMCall.objects.filter(team=team, purpose="workflow_inference", status="ok").count() == 2


def test_a_failed_node_skips_its_downstream_only(team, settings, django_capture_on_commit_callbacks):
    settings.WORKFLOW_HTTP_ALLOWED_HOSTS = ["127.0.0.1"]  # allowed, and nothing listens on port 9
    workflow = _create(team, {
        "name": "Two branches",
        "nodes": [
            {"id": "remote", "type": "http_json", "config": {"url": "http://127.0.0.1:9/nothing-listens-here"}},
            {"id": "remote_filter", "type": "filter", "config": {"conditions": [{"field": "a", "op": "exists"}]}},
            {"id": "remote_table", "type": "table_output"},
            {"id": "local", "type": "inline_records", "config": {"records": [{"a": 1}, {"a": 2}]}},
            {"id": "local_table", "type": "table_output"},
        ],
        "edges": [
            {"source": "remote", "target": "remote_filter"},
            {"source": "remote_filter", "target": "remote_table"},
            {"source": "local", "target": "local_table"},
        ],
    })

    run = _run(workflow, django_capture_on_commit_callbacks)

    nodes = _nodes(workflow)
    assert {key: node.status for key, node in nodes.items()} == {
        "remote": "failed", "remote_filter": "skipped", "remote_table": "skipped",
        "local": "done", "local_table": "done",
    }
    assert "Could not fetch JSON from http://127.0.0.1:9/nothing-listens-here" in nodes["remote"].error
    assert "upstream node 'remote' did not complete" in nodes["remote_filter"].error
    assert nodes["local_table"].records_out == 2
    assert run.status == WorkflowRun.Status.FAILED
    assert run.error.startswith("remote: Could not fetch")


def test_rerun_bumps_results_versions_and_records_fingerprints(team, django_capture_on_commit_callbacks):
    document = {
        "name": "Small",
        "nodes": [
            {"id": "src", "type": "inline_records", "config": {"records": [{"a": 1}, {"a": 2}]}},
            {"id": "keep", "type": "filter", "config": {"conditions": [{"field": "a", "op": "gt", "value": 1}]}},
        ],
        "edges": [{"source": "src", "target": "keep"}],
    }
    workflow = _create(team, document)

    first = _run(workflow, django_capture_on_commit_callbacks)
    second = _run(workflow, django_capture_on_commit_callbacks)

    keep = _nodes(workflow)["keep"]
    fingerprint = config_fingerprint("filter", document["nodes"][1]["config"])
    assert keep.results_version == 2
    assert keep.config_fingerprint == fingerprint
    assert sorted(NodeResult.objects.filter(node=keep).values_list("version", "config_fingerprint")) == [
        (1, fingerprint), (2, fingerprint)
    ]
    assert [nr.config_fingerprint for nr in NodeRun.objects.filter(node=keep)] == [fingerprint, fingerprint]
    assert first.status == second.status == WorkflowRun.Status.DONE


def test_a_duplicate_wave_task_runs_nothing_twice(team, django_capture_on_commit_callbacks):
    workflow = _create(team, {
        "name": "One node",
        "nodes": [{"id": "src", "type": "inline_records", "config": {"records": [{"a": 1}]}}],
        "edges": [],
    })
    with django_capture_on_commit_callbacks(execute=False):
        run = services.workflow_run_start(workflow=workflow)

    assert workflow_run_wave(run_id=run.pk, wave=0) is None
    assert workflow_run_wave(run_id=run.pk, wave=0) is None

    node = _nodes(workflow)["src"]
    assert node.results_version == 1
    assert NodeResult.objects.filter(node=node).count() == 1
    run.refresh_from_db()
    assert run.status == WorkflowRun.Status.DONE


def test_run_of_unknown_node_types_is_refused(team):
    workflow = _create(team, {
        "name": "Future",
        "nodes": [{"id": "p", "type": "pivot_table", "label": "Pivot"}, {"id": "q", "type": "inline_records",
                                                                          "config": {"records": []}}],
        "edges": [{"source": "q", "target": "p"}],
    })

    with pytest.raises(services.WorkflowInvalid, match="pivot_table"):
        services.workflow_run_start(workflow=workflow)
    assert not WorkflowRun.objects.exists()


# PostgreSQL's jsonb keeps an object's keys shorter first, then in byte order; written in that
# order, a config reads back the same on both databases (the narrative shows its parameters).
JSONB_PEOPLE = [{"id": p["id"], "age": p["age"], "name": p["name"], "email": p["email"]} for p in PEOPLE[:3]]


def test_lineage_in_the_prompt_is_what_fed_the_node_not_the_node_itself(
    team, fake_llm, fake_llm_gateway, django_capture_on_commit_callbacks
):
    fake_llm.reply("noted")
    fake_llm.reply("noted")
    workflow = _create(team, {
        "name": "Notes",
        "nodes": [
            {"id": "people", "type": "inline_records", "label": "People", "config": {"records": JSONB_PEOPLE}},
            {"id": "adults", "type": "filter", "label": "Adults",
             "config": {"conditions": [{"op": "gte", "field": "age", "value": 18}]}},
            {"id": "notes", "type": "llm_inference", "label": "Notes",
             "config": {"prompt": "Note on {{name}}. Lineage:\n{{_lineage}}"}},
        ],
        "edges": [{"source": "people", "target": "adults"}, {"source": "adults", "target": "notes"}],
    })

    run = _run(workflow, django_capture_on_commit_callbacks)

    assert run.status == WorkflowRun.Status.DONE, run.error
    prompts = [body["messages"][-1]["content"] for body in fake_llm.requests_to("chat")]
    records = '[{"id": 1, "age": 36, "name": "Ada", "email": "ada@example.…'
    assert prompts == [
        f"Note on {name}. Lineage:\n"
        "1. Provides 3 inline records with fields id, age, name, email (3 records out). "
        f"Parameters: records={records}.\n"
        '2. Keeps records where age ≥ 18 (3 records in, 2 out). Parameters: conditions=[{"op": "gte", "field": '
        '"age", "value": 18}].'
        for name in ("Ada", "Cy")
    ]


def test_lineage_in_the_prompt_of_a_node_fed_by_two_inputs_shows_both_branches_only(
    team, fake_llm, fake_llm_gateway, django_capture_on_commit_callbacks
):
    for _ in range(4):
        fake_llm.reply("noted")
    workflow = _create(team, {
        "name": "Two feeds",
        "nodes": [
            {"id": "people", "type": "inline_records", "label": "People", "config": {"records": JSONB_PEOPLE[:2]}},
            {"id": "orders", "type": "inline_records", "label": "Orders", "config": {"records": ORDERS[:2]}},
            {"id": "notes", "type": "llm_inference", "label": "Notes", "config": {"prompt": "{{_lineage}}"}},
        ],
        "edges": [{"source": "people", "target": "notes"}, {"source": "orders", "target": "notes"}],
    })

    run = _run(workflow, django_capture_on_commit_callbacks)

    assert run.status == WorkflowRun.Status.DONE, run.error
    narrative = NodeRun.objects.get(run=run, node__client_id="notes").lineage_narrative
    assert narrative == (
        "Branch A:\n"
        "1. Provides 2 inline records with fields id, age, name, email (2 records out). Parameters: "
        'records=[{"id": 1, "age": 36, "name": "Ada", "email": "ada@example.….\n'
        "Branch B:\n"
        '1. Provides 2 inline records with fields id, total (2 records out). Parameters: records=[{"id": 1, '
        '"total": 120}, {"id": 3, "total": 40}].'
    )
    assert {body["messages"][-1]["content"] for body in fake_llm.requests_to("chat")} == {narrative}
