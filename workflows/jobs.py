"""Workflow runs as background jobs (kinsite.jobs): the requeue sweep sends again a pending
run whose task never reached the broker or was lost with it; the stalled sweep takes over a
run left running by a worker that stopped, once none of its nodes has moved for longer than
a task may live."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from kinsite.jobs import JobKind, past_task_time_limit
from workflows.models import Node, NodeRun, WorkflowRun

INTERRUPTED = "Interrupted: the worker running it stopped"


def workflow_run_stalled(run: WorkflowRun, *, now: datetime | None = None) -> bool:
    """Whether no task is working on the running `run`: none of its nodes started or ended
    within the task time limit (any task still going would have been ended by it). Runs have
    no lock; their node runs' times are the sign of life."""
    cutoff = (now or timezone.now()) - past_task_time_limit()
    recent = Q(started_at__gt=cutoff) | Q(finished_at__gt=cutoff)
    return not NodeRun.objects.filter(recent, run_id=run.pk).exists()


@contextmanager
def _free(run: WorkflowRun) -> Iterator[bool]:
    # A peek, like kinsite.jobs.cache_key_free: a run claimed again meanwhile has a newer
    # started_at, which the sweep's conditional write does not match.
    yield workflow_run_stalled(run)


def _client_ids(run: WorkflowRun, *statuses: str) -> list[str]:
    return list(NodeRun.objects.filter(run_id=run.pk, status__in=statuses)
                .order_by("wave", "id").values_list("node__client_id", flat=True))


def _quoted(client_ids: list[str]) -> str:
    return ", ".join(repr(c) for c in client_ids) or "none"


def _stalled_run_error(run: WorkflowRun) -> str | None:
    """A run lost between two nodes (its next wave's task lost, or its worker stopped between
    nodes) runs again from its first unfinished wave; finished nodes are not repeated (node
    runs are claimed, results stored in one transaction). A run whose worker stopped inside a
    node is failed instead: that node may be what stopped it (time limit, memory), so running
    it again could loop."""
    interrupted = _client_ids(run, NodeRun.Status.RUNNING)
    if not interrupted:
        return None
    done = _client_ids(run, NodeRun.Status.DONE)
    not_run = _client_ids(run, NodeRun.Status.PENDING)
    return (f"{INTERRUPTED} in node {_quoted(interrupted)}, which was not run again (it may be what stopped it). "
            f"Nodes done, with their results stored: {_quoted(done)}; not run: {_quoted(not_run)}. "
            "Run the workflow again to finish.")


@transaction.atomic
def workflow_run_nodes_close(run: WorkflowRun) -> None:
    """The nodes of a failed stalled run stop showing as running or pending: the one cut off
    failed, the ones never reached skipped. A node keeps its earlier results."""
    now = timezone.now()
    cut_off = NodeRun.objects.filter(run_id=run.pk, status=NodeRun.Status.RUNNING)
    never_run = NodeRun.objects.filter(run_id=run.pk, status=NodeRun.Status.PENDING)
    for node_runs, status, error in (
        (cut_off, NodeRun.Status.FAILED, f"{INTERRUPTED} in this node."),
        (never_run, NodeRun.Status.SKIPPED, "Skipped: the run was stopped before this node."),
    ):
        Node.objects.filter(pk__in=node_runs.values("node_id"), status__in=[Node.Status.PENDING, Node.Status.RUNNING]
                            ).update(status=status, error=error, last_run_at=now)
        node_runs.update(status=status, error=error, finished_at=now)


WORKFLOW_RUN_JOBS = JobKind(
    name="workflow-run", label="workflow runs", model="workflows.WorkflowRun",
    task="workflows.tasks.run_workflow_task",
    free=_free, give_up=_stalled_run_error, failed=workflow_run_nodes_close,
)
