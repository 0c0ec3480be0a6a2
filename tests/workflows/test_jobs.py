"""Workflow runs as jobs of kinsite.jobs: a run whose task never reached the broker (or that
Redis lost) is sent again by beat's requeue sweep and runs once; a run left running by a
worker that stopped resumes when it was lost between nodes and is failed, naming its nodes,
when it was cut off in one. Tasks run in-process (eager); the clock is moved on by ageing
the rows."""
from datetime import timedelta

import pytest

from kinsite.errors import Conflict
from kinsite.tasks import recover_stalled_jobs_task, requeue_jobs_task
from tests.support.clock import age
from workflows import services
from workflows.executor import workflow_run_wave
from workflows.models import Node, NodeRun, WorkflowRun
from workflows.tasks import run_workflow_task

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("empty_cache")]

DOCUMENT = {
    "name": "Adults",
    "nodes": [
        {"id": "people", "type": "inline_records",
         "config": {"records": [{"name": "Ada", "age": 36}, {"name": "Bo", "age": 17}]}},
        {"id": "adults", "type": "filter", "config": {"conditions": [{"field": "age", "op": "gte", "value": 18}]}},
        {"id": "table", "type": "table_output", "config": {}},
    ],
    "edges": [{"source": "people", "target": "adults"}, {"source": "adults", "target": "table"}],
}
PAST_THE_TIME_LIMIT = timedelta(minutes=10)


@pytest.fixture
def workflow(team):
    return services.workflow_create(team=team, document=services.document_clean(DOCUMENT))


def _unsent_run(workflow, capture) -> WorkflowRun:
    with capture(execute=False):  # the send on commit never happened
        return services.workflow_run_start(workflow=workflow)


def _versions(workflow) -> dict[str, int]:
    return dict(Node.objects.filter(workflow=workflow).values_list("client_id", "results_version"))


def _stall(run: WorkflowRun) -> None:
    """Everything the run's worker did happened longer ago than a task may live."""
    age(WorkflowRun.objects.filter(pk=run.pk), "started_at", PAST_THE_TIME_LIMIT)
    for field in ("started_at", "finished_at"):
        age(NodeRun.objects.filter(run=run).exclude(**{field: None}), field, PAST_THE_TIME_LIMIT)


def test_a_lost_workflow_run_task_is_sent_again_and_a_redelivered_one_does_nothing(
    workflow, django_capture_on_commit_callbacks
):
    run = _unsent_run(workflow, django_capture_on_commit_callbacks)
    age(WorkflowRun.objects.filter(pk=run.pk), "created_at", timedelta(minutes=2))

    assert requeue_jobs_task.apply().get() == 1

    run.refresh_from_db()
    assert run.status == "done" and run.started_at is not None
    assert _versions(workflow) == {"people": 1, "adults": 1, "table": 1}
    run_workflow_task.apply(args=[run.pk])  # the broker delivers the task again
    assert _versions(workflow) == {"people": 1, "adults": 1, "table": 1}
    assert requeue_jobs_task.apply().get() == 0


def test_a_young_pending_run_is_not_sent_again(workflow, django_capture_on_commit_callbacks):
    run = _unsent_run(workflow, django_capture_on_commit_callbacks)  # its send may be on the way

    assert requeue_jobs_task.apply().get() == 0
    run.refresh_from_db()
    assert run.status == "pending"


def test_a_run_lost_between_waves_resumes_where_it_stopped(workflow, django_capture_on_commit_callbacks):
    run = _unsent_run(workflow, django_capture_on_commit_callbacks)
    assert workflow_run_wave(run_id=run.pk, wave=0) == 1  # the next wave's task is lost
    _stall(run)

    assert recover_stalled_jobs_task.apply().get() == 1

    run.refresh_from_db()
    assert run.status == "done", run.error
    # The first node ran once; the others ran when the run resumed.
    assert _versions(workflow) == {"people": 1, "adults": 1, "table": 1}
    assert dict(Node.objects.filter(workflow=workflow).values_list("client_id", "records_out")) == {
        "people": 2, "adults": 1, "table": 1,
    }


def test_a_run_cut_off_in_a_node_is_failed_naming_what_was_done(workflow, django_capture_on_commit_callbacks):
    run = _unsent_run(workflow, django_capture_on_commit_callbacks)
    assert workflow_run_wave(run_id=run.pk, wave=0) == 1
    # The worker claims the next node and dies in it.
    NodeRun.objects.filter(run=run, node__client_id="adults").update(status="running", started_at=run.created_at)
    Node.objects.filter(workflow=workflow, client_id="adults").update(status="running")
    _stall(run)

    assert recover_stalled_jobs_task.apply().get() == 1

    run.refresh_from_db()
    assert run.status == "failed" and run.finished_at is not None
    assert "stopped in node 'adults'" in run.error
    assert "Nodes done, with their results stored: 'people'; not run: 'table'." in run.error
    assert dict(NodeRun.objects.filter(run=run).values_list("node__client_id", "status")) == {
        "people": "done", "adults": "failed", "table": "skipped",
    }
    assert dict(Node.objects.filter(workflow=workflow).values_list("client_id", "status")) == {
        "people": "done", "adults": "failed", "table": "skipped",
    }
    assert _versions(workflow) == {"people": 1, "adults": 0, "table": 0}
    run_workflow_task.apply(args=[run.pk])  # a late delivery of its task changes nothing
    run.refresh_from_db()
    assert run.status == "failed" and _versions(workflow) == {"people": 1, "adults": 0, "table": 0}


def test_a_running_run_whose_nodes_move_is_left_alone(workflow, django_capture_on_commit_callbacks):
    run = _unsent_run(workflow, django_capture_on_commit_callbacks)
    assert workflow_run_wave(run_id=run.pk, wave=0) == 1
    age(WorkflowRun.objects.filter(pk=run.pk), "started_at", PAST_THE_TIME_LIMIT)  # a long run, its last node just done

    assert recover_stalled_jobs_task.apply().get() == 0
    run.refresh_from_db()
    assert run.status == "running"


def test_an_active_run_blocks_a_new_one_until_nobody_works_on_it(workflow, django_capture_on_commit_callbacks):
    run = _unsent_run(workflow, django_capture_on_commit_callbacks)
    assert workflow_run_wave(run_id=run.pk, wave=0) == 1

    with pytest.raises(Conflict, match=f"Run {run.pk} of this workflow is still running"):
        services.workflow_run_start(workflow=workflow)

    # Without beat (eager Celery) no sweep takes the stalled run over: the next request does.
    _stall(run)
    with django_capture_on_commit_callbacks(execute=True):
        second = services.workflow_run_start(workflow=workflow)
    run.refresh_from_db()
    second.refresh_from_db()
    assert run.status == "failed" and run.error.startswith("Superseded:")
    assert second.status == "done"


def test_editing_a_workflow_while_it_runs_is_refused_and_changes_nothing(workflow, api_client,
                                                                          django_capture_on_commit_callbacks):
    run = _unsent_run(workflow, django_capture_on_commit_callbacks)
    assert workflow_run_wave(run_id=run.pk, wave=0) == 1
    edited = {**DOCUMENT, "name": "Edited mid-run"}

    response = api_client.put(f"/api/v1/workflows/{workflow.pk}/", edited, format="json")

    assert response.status_code == 409, response.content
    error = response.json()["error"]
    assert error["message"] == f"Run {run.pk} of this workflow is still running; edit it once the run has finished."
    assert error["details"] == {"run_id": run.pk}
    workflow.refresh_from_db()
    assert workflow.name == DOCUMENT["name"]

    # A run nobody works on any more does not hold the workflow: it is failed, and the edit lands.
    _stall(run)
    assert api_client.put(f"/api/v1/workflows/{workflow.pk}/", edited, format="json").status_code == 200
    run.refresh_from_db()
    workflow.refresh_from_db()
    assert run.status == "failed" and workflow.name == "Edited mid-run"
