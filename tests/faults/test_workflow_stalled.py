"""Workflow runs as jobs, against a real redis-server and real workers: a run whose task Redis
lost in a restart is sent again by the requeue sweep and runs; a run whose worker is
SIGKILLed in a node is failed by the stalled sweep, naming what was done."""
from datetime import timedelta

import pytest

from kinsite.jobs import past_task_time_limit
from kinsite.tasks import recover_stalled_jobs_task, requeue_jobs_task
from tests.faults.conftest import wait_for
from tests.support.clock import age
from workflows.models import Node, NodeRun, WorkflowRun

pytestmark = pytest.mark.postgres

RUN_SECONDS = 30
MODEL_STALL_SECONDS = 60  # longer than the test: the worker dies inside this call
PEOPLE = {"id": "people", "type": "inline_records", "config": {"records": [{"name": "Ada"}]}}
NOTES = {"id": "notes", "type": "llm_inference", "config": {"prompt": "A note on {{name}}.", "output_field": "note"}}
TABLE = {"id": "table", "type": "table_output", "config": {}}


def _start(api_client, nodes) -> int:
    edges = [{"source": a["id"], "target": b["id"]} for a, b in zip(nodes, nodes[1:], strict=False)]
    created = api_client.post("/api/v1/workflows/", {"name": "Notes", "nodes": nodes, "edges": edges}, format="json")
    assert created.status_code == 201, created.content
    accepted = api_client.post(f"/api/v1/workflows/{created.json()['id']}/run/")
    assert accepted.status_code == 202, accepted.content
    return accepted.json()["run"]["id"]


def test_a_workflow_run_whose_task_redis_lost_is_sent_again_and_runs(
    transactional_db, api_client, on_redis, fake_llm, workers
):
    """The run is requested with no worker up; Redis restarts without persistence, losing the
    task (and its queued marker). The run stays `pending`; a minute on, the requeue sweep
    sends it again, and a worker runs it to the end, once."""
    run_id = _start(api_client, [PEOPLE, TABLE])
    on_redis.kill()
    on_redis.start()
    with on_redis.client() as broker:
        assert broker.llen("celery") == 0  # the task is gone
    assert WorkflowRun.objects.get(pk=run_id).status == "pending"
    age(WorkflowRun.objects.filter(pk=run_id), "created_at", timedelta(minutes=2))

    assert requeue_jobs_task.apply().get() == 1

    worker = workers(redis_url=on_redis.url, llm_base_url=fake_llm.base_url)
    wait_for(lambda: WorkflowRun.objects.filter(pk=run_id, status__in=["done", "failed"]).exists(),
             seconds=RUN_SECONDS, what="the worker to run the workflow", workers=[worker])
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == "done", run.error
    assert dict(Node.objects.values_list("client_id", "results_version")) == {"people": 1, "table": 1}
    assert requeue_jobs_task.apply().get() == 0


def test_a_workflow_run_whose_worker_is_killed_in_a_node_is_failed_naming_what_was_done(
    transactional_db, api_client, on_redis, fake_llm, workers
):
    """The worker runs the model node and is SIGKILLed in its model call. The run stays
    `running` while it could still be alive; past the task time limit the stalled sweep
    fails it: the error names the node it was cut off in, the nodes done and those not run;
    that node is failed, the one after it skipped, and the first keeps its results."""
    fake_llm.stall(MODEL_STALL_SECONDS)
    run_id = _start(api_client, [PEOPLE, NOTES, TABLE])
    worker = workers(redis_url=on_redis.url, llm_base_url=fake_llm.base_url)
    wait_for(lambda: fake_llm.requests_to("chat"), seconds=RUN_SECONDS, what="the node's model call", workers=[worker])
    worker.kill()

    assert recover_stalled_jobs_task.apply().get() == 0  # not yet past the time limit
    past = past_task_time_limit() + timedelta(seconds=1)
    age(WorkflowRun.objects.filter(pk=run_id), "started_at", past)
    for field in ("started_at", "finished_at"):
        age(NodeRun.objects.filter(run_id=run_id).exclude(**{field: None}), field, past)
    assert recover_stalled_jobs_task.apply().get() == 1

    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == "failed"
    assert "stopped in node 'notes'" in run.error
    assert "Nodes done, with their results stored: 'people'; not run: 'table'." in run.error
    assert dict(NodeRun.objects.filter(run_id=run_id).values_list("node__client_id", "status")) == {
        "people": "done", "notes": "failed", "table": "skipped",
    }
    assert dict(Node.objects.values_list("client_id", "results_version")) == {"people": 1, "notes": 0, "table": 0}
    assert len(fake_llm.requests_to("chat")) == 1
