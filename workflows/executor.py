"""The executor: runs one topological wave of a workflow run, node by node, and closes the
run after its last wave. Each node's work is claimed with a conditional update, so a
duplicate or redelivered task (acks_late) never runs a node twice."""
from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from kinsite.errors import KinsiteError
from kinsite.jobs import job_claim
from workflows.jobs import WORKFLOW_RUN_JOBS
from workflows.models import Edge, Node, NodeResult, NodeRun, WorkflowRun
from workflows.nodes.base import NodeError, RunContext, config_fingerprint, validate_params
from workflows.nodes.registry import get_node_type
from workflows.selectors import node_lineage_narrative

logger = logging.getLogger(__name__)

# Results versions kept per node; older ones are deleted when a run stores a new one.
RESULTS_KEEP_VERSIONS = 3
# Inputs of a two-input node: handles named left/right come in that order, then by edge id.
HANDLE_ORDER = {"left": 0, "a": 0, "right": 1, "b": 1}
TERMINAL = {NodeRun.Status.DONE, NodeRun.Status.FAILED, NodeRun.Status.SKIPPED}


def workflow_run_claim(*, run_id: int) -> int | None:
    """Claims a pending run (kinsite.jobs.job_claim): the first wave with nodes left to run, or
    None when it is not pending (a redelivered task: another one has it, or it ended). A run
    the stalled sweep made pending again resumes there; its finished nodes are not run again."""
    if not job_claim(WORKFLOW_RUN_JOBS, run_id):
        return None
    return NodeRun.objects.filter(run_id=run_id).exclude(status__in=TERMINAL).order_by("wave").values_list(
        "wave", flat=True).first() or 0


def workflow_run_wave(*, run_id: int, wave: int) -> int | None:
    """Runs the wave's nodes; returns the next wave to enqueue, or None (the run is finished,
    gone, or another worker still holds a node of this wave and will move on)."""
    run = WorkflowRun.objects.select_related("workflow__team").filter(pk=run_id).first()
    if run is None or run.status in (WorkflowRun.Status.DONE, WorkflowRun.Status.FAILED):
        return None
    job_claim(WORKFLOW_RUN_JOBS, run.pk)  # a wave sent by hand (or before the run's task) starts it too
    for node_run_id in NodeRun.objects.filter(run=run, wave=wave).order_by("id").values_list("id", flat=True):
        node_run_execute(run=run, node_run_id=node_run_id)
    statuses = set(NodeRun.objects.filter(run=run, wave=wave).values_list("status", flat=True))
    if not statuses <= TERMINAL:
        return None
    next_wave = NodeRun.objects.filter(run=run, wave__gt=wave).order_by("wave").values_list("wave", flat=True).first()
    if next_wave is None:
        workflow_run_finish(run=run)
    return next_wave


def _claim(node_run_id: int) -> bool:
    now = timezone.now()
    # A node left running longer than a task may live belongs to a dead worker: take it over.
    abandoned = now - timedelta(seconds=settings.CELERY_TASK_TIME_LIMIT)
    claimed = NodeRun.objects.filter(
        Q(status=NodeRun.Status.PENDING) | Q(status=NodeRun.Status.RUNNING, started_at__lt=abandoned), pk=node_run_id
    ).update(status=NodeRun.Status.RUNNING, started_at=now)
    return claimed == 1


def node_run_execute(*, run: WorkflowRun, node_run_id: int) -> None:
    if not _claim(node_run_id):
        return
    node_run = NodeRun.objects.select_related("node").get(pk=node_run_id)
    node = node_run.node
    Node.objects.filter(pk=node.pk).update(status=Node.Status.RUNNING)

    in_edges = list(Edge.objects.filter(target=node).select_related("source"))
    upstream = NodeRun.objects.filter(run=run, node_id__in=[e.source_id for e in in_edges])
    blocked = [nr.node.client_id for nr in upstream.select_related("node")
               if nr.status in (NodeRun.Status.FAILED, NodeRun.Status.SKIPPED)]
    if blocked:
        _finish(node_run, node, status=NodeRun.Status.SKIPPED,
                error=f"Skipped: upstream node {', '.join(repr(b) for b in blocked)} did not complete.")
        return

    fingerprint = config_fingerprint(node.type, node.config)
    node_run.config_fingerprint = fingerprint
    node_type = get_node_type(node.type)
    if node_type is None:
        _finish(node_run, node, status=NodeRun.Status.FAILED, error=f"Unknown node type '{node.type}' cannot run.")
        return
    problems = validate_params(node_type, node.config)
    if problems:  # the config was edited outside the API (admin) since it was saved
        _finish(node_run, node, status=NodeRun.Status.FAILED, error="Invalid parameters: " + " ".join(problems))
        return

    data_edges = sorted(
        (e for e in in_edges if e.kind == Edge.Kind.DATA),
        key=lambda e: (HANDLE_ORDER.get(e.target_handle.lower(), 2), e.pk),
    )
    inputs = []
    for edge in data_edges:
        result = NodeResult.objects.filter(node_id=edge.source_id, version=edge.source.results_version).first()
        inputs.append(result.records if result is not None else [])
    records_in = sum(len(records) for records in inputs) if node_type.max_inputs != 0 else None
    node_run.records_in = records_in

    def lineage() -> str:
        # {{_lineage}}: computed on first use, once per node run, and kept on the NodeRun.
        if not node_run.lineage_narrative:
            node_run.lineage_narrative = node_lineage_narrative(workflow=run.workflow, client_id=node.client_id)
            NodeRun.objects.filter(pk=node_run.pk).update(lineage_narrative=node_run.lineage_narrative)
        return node_run.lineage_narrative

    def save_config(config: dict) -> None:
        node.config = config
        Node.objects.filter(pk=node.pk).update(config=config)

    context = RunContext(team=run.workflow.team, node=node, lineage=lineage, save_config=save_config)
    try:
        records = node_type.run(context, dict(node.config), inputs)
    except (NodeError, KinsiteError) as exc:
        _finish(node_run, node, status=NodeRun.Status.FAILED, error=getattr(exc, "message", None) or str(exc))
        return
    except Exception as exc:  # a bug or a time limit: fail this node, keep the run going
        logger.exception("Node %s of run %s failed", node.client_id, run.pk)
        _finish(node_run, node, status=NodeRun.Status.FAILED, error=f"Internal error: {type(exc).__name__}: {exc}")
        return
    _store_results(node_run, node, records=records, records_in=records_in, fingerprint=fingerprint)


@transaction.atomic
def _store_results(node_run: NodeRun, node: Node, *, records: list, records_in: int | None, fingerprint: str) -> None:
    now = timezone.now()
    Node.objects.filter(pk=node.pk).update(results_version=F("results_version") + 1)
    version = Node.objects.values_list("results_version", flat=True).get(pk=node.pk)
    NodeResult.objects.create(node=node, version=version, records=records, config_fingerprint=fingerprint)
    NodeResult.objects.filter(node=node, version__lte=version - RESULTS_KEEP_VERSIONS).delete()
    Node.objects.filter(pk=node.pk).update(
        status=Node.Status.DONE, records_in=records_in, records_out=len(records), config_fingerprint=fingerprint,
        error="", last_run_at=now,
    )
    NodeRun.objects.filter(pk=node_run.pk).update(
        status=NodeRun.Status.DONE, records_in=records_in, records_out=len(records), config_fingerprint=fingerprint,
        finished_at=now,
    )


def _finish(node_run: NodeRun, node: Node, *, status: str, error: str) -> None:
    """A node that failed or was skipped keeps its earlier results; the run row says why."""
    now = timezone.now()
    with transaction.atomic():
        Node.objects.filter(pk=node.pk).update(status=status, error=error[:5000], last_run_at=now)
        NodeRun.objects.filter(pk=node_run.pk).update(
            status=status, error=error[:5000], records_in=node_run.records_in,
            config_fingerprint=node_run.config_fingerprint, finished_at=now,
        )


def workflow_run_finish(*, run: WorkflowRun) -> None:
    failed = list(
        NodeRun.objects.filter(run=run, status=NodeRun.Status.FAILED).values_list("node__client_id", "error")
    )
    status = WorkflowRun.Status.FAILED if failed else WorkflowRun.Status.DONE
    error = "; ".join(f"{client_id}: {error}" for client_id, error in failed)
    WorkflowRun.objects.filter(
        pk=run.pk, status__in=[WorkflowRun.Status.PENDING, WorkflowRun.Status.RUNNING]
    ).update(status=status, error=error[:5000], finished_at=timezone.now())
