"""Every write to workflows: create/update/delete from the JSON document, export, and
starting a run (the executor that carries it out lives in workflows.executor)."""
from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerUnreachable

from kinsite.errors import Conflict, InvalidInput, ServiceUnavailable
from kinsite.jobs import job_send, past_task_time_limit
from kinsite.models import Team
from workflows.jobs import WORKFLOW_RUN_JOBS, workflow_run_nodes_close, workflow_run_stalled
from workflows.models import Edge, Node, NodeRun, Workflow, WorkflowRun
from workflows.nodes.base import validate_params
from workflows.nodes.registry import NODE_TYPES

logger = logging.getLogger(__name__)

MAX_NODES = 10_000
DESCRIPTION_MAX_CHARS = 10_000
MAX_EDGES = 50_000
NODE_KEYS = {"id", "type", "label", "config", "position"}
EDGE_KEYS = {"source", "target", "source_handle", "target_handle", "kind"}
DOCUMENT_KEYS = {"name", "description", "nodes", "edges"}
# What GET /workflows/{id}/ adds to the document; accepted and ignored on import, so a
# GET body can be posted back as it is.
READ_ONLY_DOCUMENT_KEYS = {"id", "created_at", "updated_at", "archived_at", "last_run"}
READ_ONLY_NODE_KEYS = {
    "status", "records_in", "records_out", "results_version", "config_fingerprint",
    "current_fingerprint", "error", "last_run_at", "description",
}
SUPERSEDED = ("Superseded: nobody was working on this run any more (its task or its worker was lost), "
              "and a new run of the workflow was requested.")


class WorkflowInvalid(InvalidInput):
    code = "invalid_workflow"


# A node id ends the node's dashboard and API addresses (/workflows/<id>/nodes/<node id>/):
# it may hold "/" (those routes take a path), but no line break or other character no route
# matches, and no "." or ".." segment, which a browser folds into the parent path. 100: the column.
NODE_ID_MAX_CHARS = 100


def node_id_problem(node_id: str) -> str | None:
    """Why `node_id` cannot name a node (None: it can). Also used for ids stored before the
    rule, which the dashboard lists without a link."""
    if not node_id.isprintable():
        return "must be one line of printable characters (no line breaks, tabs or control characters)"
    if any(segment in (".", "..") for segment in node_id.split("/")):
        return "must not be '.' or '..' or hold them between slashes"
    return None


# --- the JSON document -----------------------------------------------------------------------


@dataclass(frozen=True)
class NodeSpec:
    id: str
    type: str
    label: str
    config: dict
    position: dict


@dataclass(frozen=True)
class EdgeSpec:
    source: str
    target: str
    source_handle: str
    target_handle: str
    kind: str


@dataclass(frozen=True)
class WorkflowDocument:
    name: str
    description: str
    nodes: list[NodeSpec]
    edges: list[EdgeSpec]


def _str(value: Any, *, where: str, max_length: int, errors: list[str], required: bool = False) -> str:
    if value is None or value == "" or (required and isinstance(value, str) and not value.strip()):
        if required:
            errors.append(f"{where} is required.")
        return ""
    if not isinstance(value, str):
        errors.append(f"{where} must be a string.")
        return ""
    if len(value) > max_length:
        errors.append(f"{where} is longer than {max_length} characters.")
    return value


def document_clean(data: Any) -> WorkflowDocument:
    """The validated document, or WorkflowInvalid (400) listing every problem: the shape,
    unique node ids, edges between known nodes, no cycles, parameters of known types."""
    if not isinstance(data, dict):
        raise WorkflowInvalid("The workflow document must be a JSON object {name, description, nodes, edges}.")
    errors: list[str] = []
    unknown = sorted(set(data) - DOCUMENT_KEYS - READ_ONLY_DOCUMENT_KEYS)
    if unknown:
        errors.append(f"unknown keys: {', '.join(unknown)} (allowed: {', '.join(sorted(DOCUMENT_KEYS))}).")
    name = _str(data.get("name"), where="name", max_length=200, errors=errors, required=True)
    description = _str(data.get("description"), where="description", max_length=DESCRIPTION_MAX_CHARS, errors=errors)
    raw_nodes, raw_edges = data.get("nodes", []), data.get("edges", [])
    if not isinstance(raw_nodes, list) or not isinstance(raw_edges, list):
        raise WorkflowInvalid("'nodes' and 'edges' must be lists.", details={"errors": errors})
    if len(raw_nodes) > MAX_NODES or len(raw_edges) > MAX_EDGES:
        raise WorkflowInvalid(f"A workflow holds at most {MAX_NODES} nodes and {MAX_EDGES} edges.")

    nodes: list[NodeSpec] = []
    seen: set[str] = set()
    for index, raw in enumerate(raw_nodes):
        where = f"nodes[{index}]"
        if not isinstance(raw, dict):
            errors.append(f"{where} must be an object {{id, type, label, config, position}}.")
            continue
        extra = sorted(set(raw) - NODE_KEYS - READ_ONLY_NODE_KEYS)
        if extra:
            errors.append(f"{where} has unknown keys: {', '.join(extra)}.")
        node_id = _str(raw.get("id"), where=f"{where}.id", max_length=NODE_ID_MAX_CHARS, errors=errors,
                       required=True)
        problem = node_id_problem(node_id) if node_id else None
        if problem:
            # repr: the message itself stays one line, whatever the id holds.
            errors.append(f"{where}.id {node_id!r} {problem}.")
        node_type = _str(raw.get("type"), where=f"{where}.type", max_length=50, errors=errors, required=True)
        label = _str(raw.get("label"), where=f"{where}.label", max_length=200, errors=errors)
        config = raw.get("config") if raw.get("config") is not None else {}
        position = raw.get("position") if raw.get("position") is not None else {}
        if not isinstance(position, dict):
            errors.append(f"{where}.position must be an object {{x, y}}.")
            position = {}
        if node_id in seen:
            errors.append(f"node id '{node_id}' is used by more than one node.")
        seen.add(node_id)
        if not isinstance(config, dict):
            errors.append(f"node '{node_id}': config must be a JSON object.")
            config = {}
        elif node_type in NODE_TYPES:
            errors.extend(
                f"node '{node_id}' ({node_type}): {problem}"
                for problem in validate_params(NODE_TYPES[node_type], config)
            )
        if node_id:
            nodes.append(NodeSpec(node_id, node_type, label, config, position))

    edges: list[EdgeSpec] = []
    connections: set[tuple] = set()
    for index, raw in enumerate(raw_edges):
        where = f"edges[{index}]"
        if not isinstance(raw, dict):
            errors.append(f"{where} must be an object {{source, target, source_handle, target_handle, kind}}.")
            continue
        extra = sorted(set(raw) - EDGE_KEYS - {"id"})
        if extra:
            errors.append(f"{where} has unknown keys: {', '.join(extra)}.")
        source = _str(raw.get("source"), where=f"{where}.source", max_length=100, errors=errors, required=True)
        target = _str(raw.get("target"), where=f"{where}.target", max_length=100, errors=errors, required=True)
        source_handle = _str(raw.get("source_handle"), where=f"{where}.source_handle", max_length=50, errors=errors)
        target_handle = _str(raw.get("target_handle"), where=f"{where}.target_handle", max_length=50, errors=errors)
        kind = raw.get("kind") or Edge.Kind.DATA
        if kind not in Edge.Kind.values:
            errors.append(f"{where}.kind must be one of {', '.join(Edge.Kind.values)}.")
        for end, node_id in (("source", source), ("target", target)):
            if node_id and node_id not in seen:
                errors.append(f"{where} {end} '{node_id}' is not a node of this workflow.")
        connection = (source, target, source_handle, target_handle)
        if connection in connections:
            errors.append(f"{where} repeats the edge {source} → {target}.")
        connections.add(connection)
        if source and target:
            edges.append(EdgeSpec(source, target, source_handle, target_handle, kind))

    # The cycle is looked for even when there are other problems, so that one answer lists
    # them all; edges naming a missing node are reported above and left out here.
    node_ids = {node.id for node in nodes}
    cycle = find_cycle([n.id for n in nodes],
                       [(e.source, e.target) for e in edges if e.source in node_ids and e.target in node_ids])
    if cycle:
        errors.append(f"cycle: {' → '.join(cycle)}")
    if errors:
        if cycle and len(errors) == 1:
            message = f"The workflow has a cycle: {' → '.join(cycle)}."
        else:
            message = errors[0] if len(errors) == 1 else f"{errors[0]} (and {len(errors) - 1} more problems)"
        raise WorkflowInvalid(message, details={"errors": errors, **({"cycle": cycle} if cycle else {})})
    return WorkflowDocument(name=name, description=description, nodes=nodes, edges=edges)


def topological_waves(node_ids: list[str], edges: list[tuple[str, str]]) -> tuple[dict[str, int], list[str]]:
    """Kahn's algorithm by levels: each node's wave (1 + the latest wave among its parents),
    and the nodes left over, which lie on or behind a cycle."""
    indegree = dict.fromkeys(node_ids, 0)
    children: dict[str, list[str]] = defaultdict(list)
    for source, target in edges:
        children[source].append(target)
        indegree[target] += 1
    wave = {node_id: 0 for node_id, degree in indegree.items() if degree == 0}
    ready = list(wave)
    while ready:
        node_id = ready.pop()
        for child in children[node_id]:
            wave[child] = max(wave.get(child, 0), wave[node_id] + 1)
            indegree[child] -= 1
            if indegree[child] == 0:
                ready.append(child)
    return wave, [node_id for node_id, degree in indegree.items() if degree > 0]


def find_cycle(node_ids: list[str], edges: list[tuple[str, str]]) -> list[str]:
    """One cycle as a path that ends where it starts ([] when the graph is a DAG)."""
    _, left = topological_waves(node_ids, edges)
    if not left:
        return []
    remaining = set(left)
    parents: dict[str, list[str]] = defaultdict(list)
    for source, target in edges:
        if source in remaining and target in remaining:
            parents[target].append(source)
    # Every leftover node still has a leftover parent (that is why it is left over), so
    # walking up parents must come back to a node already on the path: that loop is a cycle.
    path: list[str] = []
    index: dict[str, int] = {}
    node_id = left[0]
    while node_id not in index:
        index[node_id] = len(path)
        path.append(node_id)
        node_id = parents[node_id][0]
    loop = path[index[node_id]:]
    loop.reverse()  # walked against the edges; show it along them
    order = {node_id: i for i, node_id in enumerate(node_ids)}
    start = min(range(len(loop)), key=lambda i: order[loop[i]])  # from the node listed first
    loop = loop[start:] + loop[:start]
    return loop + [loop[0]]


# --- create / update / delete / export --------------------------------------------------------


@transaction.atomic
def workflow_create(*, team: Team, document: WorkflowDocument) -> Workflow:
    workflow = Workflow.objects.create(team=team, name=document.name, description=document.description)
    _write_graph(workflow=workflow, document=document)
    return workflow


@transaction.atomic
def workflow_update(*, workflow: Workflow, document: WorkflowDocument) -> Workflow:
    """Replaces the graph. Nodes keep their identity (and results) by client id, so a
    changed config shows as stale lineage rather than as a node that never ran. Refused (409)
    while a run is going: its nodes would run settings nobody saved them with."""
    workflow = Workflow.objects.select_for_update().get(pk=workflow.pk)
    active = _run_active(workflow)
    if active is not None:
        raise Conflict(f"Run {active.pk} of this workflow is still {active.status}; edit it once the run has "
                       "finished.", details={"run_id": active.pk})
    workflow.name, workflow.description = document.name, document.description
    workflow.save(update_fields=["name", "description", "updated_at"])
    _write_graph(workflow=workflow, document=document)
    return workflow


COPY_PREFIX = "Copy of "


@transaction.atomic
def workflow_duplicate(*, workflow: Workflow) -> Workflow:
    """A new workflow of the same team with the same nodes, settings, positions and edges,
    named "Copy of …"; nothing of its runs or results (its nodes have never run)."""
    document = workflow_export(workflow=workflow)
    document["name"] = (COPY_PREFIX + workflow.name)[:200]
    return workflow_create(team=workflow.team, document=document_clean(document))


def workflow_archive(*, workflow: Workflow, archived: bool) -> Workflow:
    """Archives (archived_at = now) or brings back a workflow; again changes nothing."""
    if archived != (workflow.archived_at is not None):
        workflow.archived_at = timezone.now() if archived else None
        workflow.save(update_fields=["archived_at", "updated_at"])
    return workflow


@transaction.atomic
def workflow_delete(*, workflow: Workflow) -> None:
    workflow.delete()


def _write_graph(*, workflow: Workflow, document: WorkflowDocument) -> None:
    existing = {node.client_id: node for node in workflow.nodes.all()}
    wanted = {spec.id for spec in document.nodes}
    Edge.objects.filter(workflow=workflow).delete()
    Node.objects.filter(workflow=workflow).exclude(client_id__in=wanted).delete()
    to_create, to_update = [], []
    for spec in document.nodes:
        node = existing.get(spec.id)
        if node is None:
            to_create.append(Node(workflow=workflow, client_id=spec.id, type=spec.type, label=spec.label,
                                  config=spec.config, position=spec.position))
        else:
            node.type, node.label, node.config, node.position = spec.type, spec.label, spec.config, spec.position
            to_update.append(node)
    Node.objects.bulk_create(to_create, batch_size=500)
    Node.objects.bulk_update(to_update, ["type", "label", "config", "position"], batch_size=500)
    ids = dict(Node.objects.filter(workflow=workflow).values_list("client_id", "id"))
    Edge.objects.bulk_create(
        [
            Edge(workflow=workflow, source_id=ids[e.source], target_id=ids[e.target], source_handle=e.source_handle,
                 target_handle=e.target_handle, kind=e.kind)
            for e in document.edges
        ],
        batch_size=1000,
    )


def workflow_export(*, workflow: Workflow) -> dict:
    """The workflow as the JSON document workflow_create takes."""
    nodes = list(workflow.nodes.order_by("id"))
    client_ids = {node.pk: node.client_id for node in nodes}
    return {
        "name": workflow.name,
        "description": workflow.description,
        "nodes": [
            {"id": n.client_id, "type": n.type, "label": n.label, "config": n.config, "position": n.position}
            for n in nodes
        ],
        "edges": [
            {
                "source": client_ids[e.source_id],
                "target": client_ids[e.target_id],
                "source_handle": e.source_handle,
                "target_handle": e.target_handle,
                "kind": e.kind,
            }
            for e in workflow.edges.order_by("id")
        ],
    }


# --- runs ---------------------------------------------------------------------------------------


def workflow_run_problems(*, nodes: list[Node], data_inputs: dict[int, int]) -> list[str]:
    """Why these nodes cannot run, every reason at once ([] when they can): unknown node
    types, and nodes with the wrong number of data inputs (`data_inputs`: node pk → count).
    Pure, so the dashboard disables its Run button for the same reasons the API refuses."""
    if not nodes:
        return ["The workflow has no nodes to run."]
    problems = []
    unknown = sorted({node.type for node in nodes if node.type not in NODE_TYPES})
    if unknown:
        names = ", ".join(f"'{n.client_id}' ({n.type})" for n in nodes if n.type in unknown)
        problems.append(f"Unknown node types cannot run: {', '.join(unknown)} (nodes {names}). "
                        f"Known types: {', '.join(sorted(NODE_TYPES))}.")
    for node in nodes:
        node_type, count = NODE_TYPES.get(node.type), data_inputs.get(node.pk, 0)
        if node_type is None:
            continue
        if node_type.max_inputs == 0 and count:
            problems.append(f"node '{node.client_id}' ({node.type}) is a source and takes no inputs, but has {count}.")
        elif count < node_type.min_inputs or (node_type.max_inputs is not None and count > node_type.max_inputs):
            wanted = (f"exactly {node_type.min_inputs}" if node_type.min_inputs == node_type.max_inputs
                      else f"at least {node_type.min_inputs}")
            problems.append(f"node '{node.client_id}' ({node.type}) needs {wanted} data inputs, has {count}.")
    return problems


def workflow_run_check(*, workflow: Workflow) -> list[Node]:
    """The workflow's nodes if it can run; WorkflowInvalid (400) naming unknown node types
    and nodes with the wrong number of inputs."""
    nodes = list(workflow.nodes.all())
    data_inputs: dict[int, int] = defaultdict(int)
    for target_id in workflow.edges.filter(kind=Edge.Kind.DATA).values_list("target_id", flat=True):
        data_inputs[target_id] += 1
    problems = workflow_run_problems(nodes=nodes, data_inputs=data_inputs)
    if problems:
        unknown = sorted({node.type for node in nodes if node.type not in NODE_TYPES})
        raise WorkflowInvalid(" ".join(problems),
                              details={"errors": problems, **({"unknown_types": unknown} if unknown else {})})
    return nodes


@transaction.atomic
def workflow_run_start(*, workflow: Workflow) -> WorkflowRun:
    """Checks the workflow can run, creates the run and one NodeRun per node (by wave), and
    enqueues wave 0 after commit (eager Celery: the whole run happens then). With the broker
    down it undoes the run and raises ServiceUnavailable (503), so nothing stored blocks the next request."""
    workflow = Workflow.objects.select_for_update().get(pk=workflow.pk)
    nodes = workflow_run_check(workflow=workflow)
    active = _run_active(workflow)
    if active is not None:
        raise Conflict(f"Run {active.pk} of this workflow is still {active.status}.", details={"run_id": active.pk})
    by_pk = {node.pk: node.client_id for node in nodes}
    edges = [(by_pk[s], by_pk[t]) for s, t in workflow.edges.values_list("source_id", "target_id")]
    waves, _ = topological_waves(list(by_pk.values()), edges)
    run = WorkflowRun.objects.create(workflow=workflow)
    NodeRun.objects.bulk_create(
        [NodeRun(run=run, node=node, wave=waves[node.client_id]) for node in nodes], batch_size=500
    )
    Node.objects.filter(workflow=workflow).update(status=Node.Status.PENDING)
    statuses_before = {node.pk: node.status for node in nodes}
    transaction.on_commit(lambda: _run_enqueue(run, statuses_before))
    return run


def _run_active(workflow: Workflow) -> WorkflowRun | None:
    """The workflow's pending or running run, unless nobody works on it any more (then it is
    failed here, _run_supersede); the caller holds the workflow's row lock."""
    active = WorkflowRun.objects.filter(
        workflow=workflow, status__in=[WorkflowRun.Status.PENDING, WorkflowRun.Status.RUNNING]
    ).first()
    if active is None or _run_supersede(active):
        return None
    return active


def _run_supersede(run: WorkflowRun) -> bool:
    """Fail an active run nobody works on any more, so a new one may start: pending longer
    than a task may live, or running with none of its nodes moving (workflows.jobs). Without
    beat (eager Celery) no sweep takes such a run over; a request for a new one does."""
    now = timezone.now()
    cutoff = now - past_task_time_limit()
    if run.status == WorkflowRun.Status.PENDING:
        abandoned = run.created_at < cutoff
    else:
        abandoned = run.started_at is not None and run.started_at < cutoff and workflow_run_stalled(run, now=now)
    if not abandoned:
        return False
    superseded = WorkflowRun.objects.filter(pk=run.pk, status=run.status, started_at=run.started_at).update(
        status=WorkflowRun.Status.FAILED, error=SUPERSEDED, finished_at=now)
    if superseded:
        workflow_run_nodes_close(run)
    return bool(superseded)


def _run_enqueue(run: WorkflowRun, statuses_before: dict[int, str]) -> None:
    """Send the run's task. When the broker does not take it, the run is removed rather than
    kept pending for the requeue sweep: the caller is told at once that nothing was stored,
    and a run, unlike a chat message, is cheap to request again."""
    try:
        job_send(WORKFLOW_RUN_JOBS, run.pk)
    except BrokerUnreachable as exc:
        logger.warning("Run %s of workflow %s is not started, the broker is unreachable: %s",
                       run.pk, run.workflow_id, exc)
        _run_discard(run=run, statuses_before=statuses_before)
        raise ServiceUnavailable(
            "The task queue (Redis) is unreachable, so the run was not started and nothing was stored. "
            "Request the run again shortly.",
            details={"service": "redis", "stored": False, "workflow": run.workflow_id},
        ) from exc


@transaction.atomic
def _run_discard(*, run: WorkflowRun, statuses_before: dict[int, str]) -> None:
    """Undo a run whose first wave never reached the broker: delete it (and its NodeRuns) and
    give its nodes back their statuses. Only while pending: should the broker have taken the
    task after all, a worker that started it keeps it, and a later one finds no run."""
    deleted, _ = WorkflowRun.objects.filter(pk=run.pk, status=WorkflowRun.Status.PENDING).delete()
    if not deleted:
        return
    by_status: dict[str, list[int]] = defaultdict(list)
    for node_pk, status in statuses_before.items():
        by_status[status].append(node_pk)
    for status, node_pks in by_status.items():
        Node.objects.filter(pk__in=node_pks, status=Node.Status.PENDING).update(status=status)
