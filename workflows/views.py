"""Dashboard pages for workflows: the team's workflows, one workflow's graph (server-drawn
SVG, statuses, counts, a Run button) and a node's lineage inspector. Reads, lineage and runs
go through the same selectors and services as the API (other teams' ids answer 404)."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from django.db.models import Count, OuterRef, Subquery
from django.http import Http404, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from kinsite.errors import KinsiteError
from kinsite.views import can_manage, managers_only, team_required
from workflows import lineage, selectors, services
from workflows.api.serializers import LINEAGE_MAX_CHARS_LIMIT
from workflows.layout import layout_graph
from workflows.models import Edge, Node, Workflow, WorkflowRun
from workflows.nodes.registry import describe
from workflows.selectors import node_lineage

# Past this many nodes the drawing is unreadable and heavy; the table still lists them all.
MAX_DRAWN_NODES = 400
NARRATIVE_MAX_CHARS_CHOICES = [500, 1000, 2000, 4000, 8000]
NARRATIVE_DEFAULT_MAX_CHARS = 2000
RESULT_PREVIEW_RECORDS = 20
RESULT_PREVIEW_COLUMNS = 12
EXPORT_FORMATS = ("json", "prov", "openlineage")
ACTIVE_RUN_STATUSES = {WorkflowRun.Status.PENDING, WorkflowRun.Status.RUNNING}


@team_required
def workflow_list(request):
    """The open workflows, or with ?archived=1 the archived ones."""
    archived = request.GET.get("archived") == "1"
    last_run = WorkflowRun.objects.filter(workflow=OuterRef("pk")).order_by("-created_at", "-id")
    # One query for the rows, however many workflows (counts and last run as subqueries), and one
    # for the count of the other list.
    workflows = selectors.workflow_list(team=request.team, archived=archived).annotate(
        node_count=Count("nodes", distinct=True),
        last_run_status=Subquery(last_run.values("status")[:1]),
        last_run_at=Subquery(last_run.values("created_at")[:1]),
    )
    other_count = selectors.workflow_list(team=request.team, archived=not archived).count()
    return render(request, "workflows/workflow_list.html",
                  {"workflows": workflows, "archived": archived, "other_count": other_count})


@dataclass(frozen=True)
class NodeRow:
    node: Node
    description: str  # workflows.nodes.registry.describe: the same sentence the API shows


def _detail_context(workflow: Workflow) -> dict:
    """The graph, its drawing and the node table: three queries whatever the size."""
    nodes = selectors.workflow_nodes(workflow=workflow)
    client_ids = {node.pk: node.client_id for node in nodes}
    edge_rows = list(workflow.edges.order_by("id").values_list("source_id", "target_id", "kind"))
    pairs = [(client_ids[s], client_ids[t]) for s, t, _ in edge_rows]
    kinds: dict[tuple[str, str], str] = {}
    for (source, target), (_, _, kind) in zip(pairs, edge_rows, strict=True):
        # Two nodes joined by a data and a control edge draw one line: the data one.
        if kinds.get((source, target)) != "data":
            kinds[(source, target)] = kind
    data_inputs: dict[int, int] = {}
    for _, target, kind in edge_rows:
        if kind == Edge.Kind.DATA:
            data_inputs[target] = data_inputs.get(target, 0) + 1
    drawn = len(nodes) <= MAX_DRAWN_NODES
    layout = layout_graph([node.client_id for node in nodes], pairs) if drawn and nodes else None
    by_id = {node.client_id: node for node in nodes}
    return {
        "workflow": workflow,
        "rows": [
            NodeRow(node, describe(node.type, node.config, label=node.label,
                                            records_in=node.records_in, records_out=node.records_out))
            for node in nodes
        ],
        "layout": layout,
        "boxes": [(box, by_id[box.id]) for box in layout.boxes] if layout else [],
        "lines": [(line, kinds[(line.source, line.target)]) for line in layout.lines] if layout else [],
        "too_many_to_draw": not drawn,
        "max_drawn_nodes": MAX_DRAWN_NODES,
        "last_run": selectors.workflow_last_run(workflow=workflow),
        "active_statuses": ACTIVE_RUN_STATUSES,
        # The reasons the run service would refuse (400): the Run button is disabled and says why.
        "run_blockers": services.workflow_run_problems(nodes=nodes, data_inputs=data_inputs),
    }


@team_required
def workflow_detail(request, workflow_id: int):
    workflow = selectors.workflow_get(team=request.team, workflow_id=workflow_id)
    context = _detail_context(workflow)
    context["started"] = request.GET.get("started", "")
    context["can_manage"] = can_manage(request)
    return render(request, "workflows/workflow_detail.html", context)


@require_POST
@team_required
def workflow_duplicate(request, workflow_id: int):
    """A copy of the workflow (owners and admins), opened at once."""
    if not can_manage(request):
        return managers_only("duplicate workflows")
    workflow = selectors.workflow_get(team=request.team, workflow_id=workflow_id)
    try:
        copy = services.workflow_duplicate(workflow=workflow)
    except KinsiteError as exc:  # a graph saved before a check it now fails: the reason, on the page
        context = {**_detail_context(workflow), "can_manage": True, "run_error": exc.message}
        return render(request, "workflows/workflow_detail.html", context, status=exc.status)
    return redirect("dashboard:workflow_detail", copy.pk)


@require_POST
@team_required
def workflow_archive(request, workflow_id: int):
    """Archives the workflow, or with archived=0 brings it back (owners and admins)."""
    if not can_manage(request):
        return managers_only("archive workflows")
    workflow = selectors.workflow_get(team=request.team, workflow_id=workflow_id)
    services.workflow_archive(workflow=workflow, archived=request.POST.get("archived") != "0")
    return redirect("dashboard:workflow_detail", workflow.pk)


@require_POST
@team_required
def workflow_run(request, workflow_id: int):
    """Starts a run and goes back to the graph; a workflow that cannot run (unknown node
    types, wrong inputs: 400) or is already running (409) shows the reason on the page."""
    workflow = selectors.workflow_get(team=request.team, workflow_id=workflow_id)
    try:
        run = services.workflow_run_start(workflow=workflow)
    except KinsiteError as exc:
        context = _detail_context(workflow)
        context["run_error"] = exc.message
        return render(request, "workflows/workflow_detail.html", context, status=exc.status)
    return redirect(reverse("dashboard:workflow_detail", args=[workflow.pk]) + f"?started={run.pk}")


def _max_chars(value: str) -> int:
    # Forgiving like the other pages: a value out of range (an old link) means the default.
    try:
        number = int(value)
    except (TypeError, ValueError):
        return NARRATIVE_DEFAULT_MAX_CHARS
    return number if 100 <= number <= LINEAGE_MAX_CHARS_LIMIT else NARRATIVE_DEFAULT_MAX_CHARS


def _cell(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _results_preview(records: list, preferred: object = None) -> tuple[list[str], list[list[str]]]:
    """Columns and cells of the first records: the node's configured columns (a table
    output's) first, then the other keys alphabetically, since PostgreSQL's jsonb does not
    keep key order. A record that is not an object shows as one "value" cell."""
    shown = records[:RESULT_PREVIEW_RECORDS]
    keys: set[str] = set()
    for record in shown:
        keys.update(record if isinstance(record, dict) else ["value"])
    first = [c for c in preferred if isinstance(c, str) and c in keys] if isinstance(preferred, list) else []
    columns = list(dict.fromkeys(first + sorted(keys)))[:RESULT_PREVIEW_COLUMNS]
    rows = [
        [_cell(record.get(column, "")) if isinstance(record, dict) else
         (_cell(record) if column == "value" else "") for column in columns]
        for record in shown
    ]
    return columns, rows


@team_required
def node_inspector(request, workflow_id: int, client_id: str):
    workflow = selectors.workflow_get(team=request.team, workflow_id=workflow_id)
    node = selectors.node_get(workflow=workflow, client_id=client_id)
    max_chars = _max_chars(request.GET.get("max_chars", ""))
    graph = node_lineage(workflow=workflow, client_id=node.client_id)
    result = selectors.node_result(node=node)
    records = result.records if result is not None and isinstance(result.records, list) else []
    configured = node.config.get("columns") if isinstance(node.config, dict) else None
    columns, cells = _results_preview(records, configured)
    choices = sorted({*NARRATIVE_MAX_CHARS_CHOICES, max_chars})
    context = {
        "workflow": workflow,
        "node": node,
        "description": describe(node.type, node.config, label=node.label,
                                         records_in=node.records_in, records_out=node.records_out),
        "graph": graph,
        "narrative": lineage.lineage_to_narrative(graph, max_chars=max_chars),
        "max_chars": max_chars,
        "max_chars_choices": choices,
        "result": result,
        "record_count": len(records),
        "columns": columns,
        "cells": cells,
        "export_formats": EXPORT_FORMATS,
    }
    return render(request, "workflows/node_inspector.html", context)


@team_required
def node_lineage_download(request, workflow_id: int, client_id: str, fmt: str):
    """The lineage as a JSON download (the API needs a token; the dashboard has a session)."""
    if fmt not in EXPORT_FORMATS:
        raise Http404("Unknown export format.")
    workflow = selectors.workflow_get(team=request.team, workflow_id=workflow_id)
    node = selectors.node_get(workflow=workflow, client_id=client_id)
    graph = node_lineage(workflow=workflow, client_id=node.client_id)
    # PROV and OpenLineage name the workflow by its API address, as the API's exports do.
    namespace = request.build_absolute_uri(reverse("workflow-detail", args=[workflow.pk]))
    payload = selectors.node_lineage_export(workflow=workflow, graph=graph, fmt=fmt, namespace=namespace)
    safe_id = re.sub(r"[^A-Za-z0-9_.-]+", "_", node.client_id).strip("._") or "node"
    response = JsonResponse(payload, safe=False, json_dumps_params={"ensure_ascii": False, "indent": 2})
    response["Content-Disposition"] = f'attachment; filename="workflow-{workflow.pk}-{safe_id}-lineage-{fmt}.json"'
    return response
