"""Reads for workflows, scoped to a team: lists, one workflow, its graph as plain data for
lineage, a node's lineage in every format, the canvas, node results and runs."""
from __future__ import annotations

import uuid

from django.conf import settings
from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from django.utils import timezone

from kinsite.models import Team
from workflows import lineage, lineage_exports
from workflows.canvas import canvas_text
from workflows.lineage import EdgeInfo, GraphInfo, NodeInfo
from workflows.models import Node, NodeResult, NodeRun, Workflow, WorkflowRun
from workflows.nodes.base import config_fingerprint
from workflows.nodes.registry import describe_step


def workflow_list(*, team: Team, archived: bool | None = None) -> QuerySet[Workflow]:
    """The team's workflows: all, or only the archived (True) or the other ones (False)."""
    workflows = Workflow.objects.filter(team=team)
    if archived is not None:
        workflows = workflows.filter(archived_at__isnull=not archived)
    return workflows


def workflow_get(*, team: Team, workflow_id: int) -> Workflow:
    return get_object_or_404(Workflow, team=team, pk=workflow_id)


def node_get(*, workflow: Workflow, client_id: str) -> Node:
    return get_object_or_404(Node, workflow=workflow, client_id=client_id)


def workflow_nodes(*, workflow: Workflow) -> list[Node]:
    return list(workflow.nodes.order_by("id"))


def workflow_last_run(*, workflow: Workflow) -> WorkflowRun | None:
    return workflow.runs.order_by("-created_at", "-id").first()


def run_node_runs(*, run: WorkflowRun) -> QuerySet[NodeRun]:
    return run.node_runs.select_related("node").order_by("wave", "id")


def node_result(*, node: Node, version: int | None = None) -> NodeResult | None:
    """The node's stored records of `version` (default: its current results version)."""
    version = node.results_version if version is None else version
    if not version:
        return None
    return NodeResult.objects.filter(node=node, version=version).first()


def workflow_graph_info(*, workflow: Workflow) -> GraphInfo:
    """The workflow as lineage's plain data (one query for nodes, one for edges, one for
    which result versions still exist)."""
    nodes = list(workflow.nodes.order_by("id"))
    client_ids = {node.pk: node.client_id for node in nodes}
    stored = set(NodeResult.objects.filter(node__workflow=workflow).values_list("node_id", "version"))
    infos = []
    for node in nodes:
        has_results = (node.pk, node.results_version) in stored
        infos.append(
            NodeInfo(
                id=node.client_id,
                type=node.type,
                label=node.label,
                config=node.config,
                status=node.status,
                records_in=node.records_in,
                records_out=node.records_out,
                # 0 = no results: never ran, or its results were lost since.
                results_version=node.results_version if has_results else 0,
                config_fingerprint=node.config_fingerprint,
                current_fingerprint=config_fingerprint(node.type, node.config),
            )
        )
    edges = [
        EdgeInfo(source=client_ids[source], target=client_ids[target], kind=kind)
        for source, target, kind in workflow.edges.order_by("id").values_list("source_id", "target_id", "kind")
    ]
    return GraphInfo(nodes=infos, edges=edges)


def describe_node_info(node: NodeInfo) -> str:
    """lineage's describer: a NodeInfo → what its step does (lineage adds the counts)."""
    return describe_step(node.type, node.config, label=node.label)


def node_lineage(*, workflow: Workflow, client_id: str) -> lineage.LineageGraph:
    return lineage.collect_lineage(workflow_graph_info(workflow=workflow), client_id, describe=describe_node_info)


def node_lineage_export(*, workflow: Workflow, graph: lineage.LineageGraph, fmt: str, namespace: str,
                        max_chars: int = 2000):
    """A node's lineage in one of the export formats, as the API and the dashboard serve
    it. `namespace` (the workflow's API address) names the workflow in PROV and
    OpenLineage; the OpenLineage run id is derived from the workflow's last run."""
    if fmt == "narrative":
        return lineage.lineage_to_narrative(graph, max_chars=max_chars)
    if fmt == "prov":
        return lineage_exports.lineage_to_prov(graph, workflow_name=workflow.name, namespace=namespace)
    if fmt == "openlineage":
        run = workflow_last_run(workflow=workflow)
        run_key = f"{namespace}runs/{run.pk}" if run is not None else f"{namespace}never-ran"
        event_time = (run.finished_at or run.started_at or run.created_at) if run is not None else timezone.now()
        return lineage_exports.lineage_to_openlineage(graph, workflow_name=workflow.name, namespace=namespace,
                                              run_id=uuid.uuid5(uuid.NAMESPACE_URL, run_key), event_time=event_time)
    return lineage_exports.lineage_to_json(graph)


def node_lineage_narrative(*, workflow: Workflow, client_id: str, max_chars: int = 2000) -> str:
    """The narrative a node about to run sees as {{_lineage}}: the lineage of what fed it, its
    upstream steps without itself (it has no records yet, and its prompt already says what
    it does); only those upstream nodes can make it stale (lineage_upstream drops its own entry)."""
    graph = node_lineage(workflow=workflow, client_id=client_id)
    return lineage.lineage_to_narrative(lineage.lineage_upstream(graph), max_chars=max_chars)


def workflow_canvas(*, workflow: Workflow, max_chars: int | None = None) -> str:
    """CURRENT CANVAS for a session attached to `workflow`: the graph is read once
    (the three queries of workflow_graph_info, whatever its size); computed per turn, never stored."""
    return canvas_text(
        workflow_name=workflow.name, graph=workflow_graph_info(workflow=workflow), describe=describe_node_info,
        max_chars=settings.CANVAS_MAX_CHARS if max_chars is None else max_chars,
    )
