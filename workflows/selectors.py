"""Reads for workflows, scoped to a team: lists, one workflow, its graph as plain data for
lineage, node results and runs."""
from __future__ import annotations

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404

from kinsite.models import Team
from workflows.models import Node, NodeResult, NodeRun, Workflow, WorkflowRun
from workflows.services import config_fingerprint


def workflow_list(*, team: Team) -> QuerySet[Workflow]:
    return Workflow.objects.filter(team=team)


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


def workflow_graph_info(*, workflow: Workflow):
    """The workflow as lineage's plain data (one query for nodes, one for edges, one for
    which result versions still exist)."""
    from workflows.lineage import EdgeInfo, GraphInfo, NodeInfo

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


def workflow_canvas(*, workflow: Workflow, max_chars: int | None = None) -> str:
    """CURRENT CANVAS for a session attached to `workflow` (SPEC §9): the graph is read once
    (the three queries of workflow_graph_info, whatever its size); computed per turn, never stored."""
    from django.conf import settings

    from workflows.canvas import canvas_text
    from workflows.executor import describe_node_info

    return canvas_text(
        workflow_name=workflow.name, graph=workflow_graph_info(workflow=workflow), describe=describe_node_info,
        max_chars=settings.CANVAS_MAX_CHARS if max_chars is None else max_chars,
    )
