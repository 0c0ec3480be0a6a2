"""The kin's tools in a chat turn: the memory tools, `search_history`,
`record_learning` (a pending fact for the nightly consolidation, docs/concepts/consolidation.md) and, in a
session attached to a workflow, `workflow_lineage`.

Every handler takes a kinsite.tools.ToolContext and the raw arguments string, and
returns text for the model ("Error: ..." for unusable arguments, never an exception);
arguments are checked against the schemas by kinsite.tools.check_arguments."""
from __future__ import annotations

from typing import Any

from django.conf import settings

from consolidation.models import Fact
from consolidation.services import STATEMENT_MAX_CHARS, fact_record
from kinsite.tools import Tool, ToolArgumentError, ToolContext, tool_from
from memories.tools import memory_toolset
from sessions_app.selectors import history_search

SEARCH_HISTORY_MAX_LIMIT = 20
SEARCH_HISTORY_DEFAULT_LIMIT = 5
# A hit's content is cut to this many characters: the model gets the gist and can search again.
HIT_MAX_CHARS = 1_000

SEARCH_HISTORY_SCHEMA: dict[str, Any] = {
    "name": "search_history",
    "description": "Full-text search over all your past conversations, including messages folded into "
                   "summaries. Returns the best-matching messages with sender, time and external id.",
    "parameters": {
        "type": "object",
        "properties": {
            "query": {"type": "string", "minLength": 1, "maxLength": settings.SEARCH_MAX_QUERY_CHARS,
                      "description": "Words to look for."},
            "limit": {"type": "integer", "minimum": 1, "maximum": SEARCH_HISTORY_MAX_LIMIT,
                      "description": f"How many messages at most (default {SEARCH_HISTORY_DEFAULT_LIMIT})."},
        },
        "required": ["query"],
        "additionalProperties": False,
    },
}


def _search_history(tool_context: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    limit = args.get("limit", SEARCH_HISTORY_DEFAULT_LIMIT)
    hits = history_search(query=args["query"], limit=limit, kin=tool_context.kin)
    results = [
        {
            "id": hit.pk,
            "session": hit.session_id,
            "external_id": hit.external_id,
            "sender": hit.sender,
            "role": hit.role,
            "platform": hit.platform,
            "time": hit.created_at.isoformat(timespec="seconds"),
            "content": hit.content if len(hit.content) <= HIT_MAX_CHARS else hit.content[:HIT_MAX_CHARS] + "…",
        }
        for hit in hits
    ]
    return {"results": results}


RECORD_LEARNING_SCHEMA: dict[str, Any] = {
    "name": "record_learning",
    "description": "Record a lesson worth keeping for all your future work: a user directive, a safeguard, "
                   "a project constraint, a pitfall, or a mistake and its fix. It is folded into your "
                   "experience document at the next consolidation. One self-contained statement.",
    "parameters": {
        "type": "object",
        "properties": {
            "statement": {"type": "string", "minLength": 1, "maxLength": STATEMENT_MAX_CHARS,
                          "description": "The learning, e.g. \"Always dedupe the churn report by customer id.\""},
            "category": {"type": "string", "enum": list(Fact.Category.values),
                         "description": "fact, preference, decision or knowledge (default fact)."},
        },
        "required": ["statement"],
        "additionalProperties": False,
    },
}


def _record_learning(tool_context: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    fact = fact_record(kin=tool_context.kin, statement=args["statement"],
                       category=args.get("category", Fact.Category.FACT),
                       source=Fact.Source.TOOL, source_ref=tool_context.source_ref)
    return {"status": "recorded", "fact": {"id": fact.pk, "category": fact.category, "statement": fact.statement}}


LINEAGE_MAX_CHARS = 8_000
LINEAGE_DEFAULT_CHARS = 2_000

WORKFLOW_LINEAGE_SCHEMA: dict[str, Any] = {
    "name": "workflow_lineage",
    "description": "How the records of a node of the workflow this session is attached to came to be: "
                   "its upstream steps in order, with their parameters and record counts, and a warning "
                   "when upstream settings changed since the records were produced.",
    "parameters": {
        "type": "object",
        "properties": {
            "node": {"type": "string", "minLength": 1, "maxLength": 100,
                     "description": "The node's id, as listed in CURRENT CANVAS."},
            "format": {"type": "string", "enum": ["narrative", "json"],
                       "description": "narrative (numbered steps, the default) or json (the lineage graph)."},
            "max_chars": {"type": "integer", "minimum": 200, "maximum": LINEAGE_MAX_CHARS,
                          "description": f"Length limit of the narrative (default {LINEAGE_DEFAULT_CHARS})."},
        },
        "required": ["node"],
        "additionalProperties": False,
    },
}


def _workflow_lineage_tool(workflow_id: int) -> Tool:
    # Bound to the session's workflow here, so ToolContext stays the same for every tool.
    def run(tool_context: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
        from workflows.models import Node, Workflow
        from workflows.selectors import node_lineage, node_lineage_export

        workflow = Workflow.objects.filter(pk=workflow_id, team=tool_context.team).first()
        if workflow is None:
            raise ToolArgumentError("this session's workflow no longer exists.")
        try:
            graph = node_lineage(workflow=workflow, client_id=args["node"])
        except ValueError as exc:
            ids = list(Node.objects.filter(workflow=workflow).order_by("id").values_list("client_id", flat=True)[:31])
            listed = ", ".join(ids[:30]) + (", …" if len(ids) > 30 else "")
            raise ToolArgumentError(
                f"no node {args['node']!r} in workflow {workflow.name!r}; its nodes: {listed}."
            ) from exc
        fmt = args.get("format", "narrative")
        lineage = node_lineage_export(workflow=workflow, graph=graph, fmt=fmt, namespace="",
                                      max_chars=args.get("max_chars", LINEAGE_DEFAULT_CHARS))
        key = "narrative" if fmt == "narrative" else "lineage"
        return {"workflow": workflow.pk, "node": args["node"], "stale": graph.stale, key: lineage}

    return tool_from(WORKFLOW_LINEAGE_SCHEMA, run)


SEARCH_HISTORY_TOOL = tool_from(SEARCH_HISTORY_SCHEMA, _search_history)
RECORD_LEARNING_TOOL = tool_from(RECORD_LEARNING_SCHEMA, _record_learning)


def kin_toolset(*, workflow_id: int | None = None) -> dict[str, Tool]:
    """The tools a kin may call in a chat turn, by name; `workflow_lineage` only in a session
    attached to a workflow (pass its `workflow_id`)."""
    tools = dict(memory_toolset("kin"))
    tools["search_history"] = SEARCH_HISTORY_TOOL
    tools["record_learning"] = RECORD_LEARNING_TOOL
    if workflow_id is not None:
        tools["workflow_lineage"] = _workflow_lineage_tool(workflow_id)
    return tools
