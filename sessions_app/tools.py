"""The kin's tools in a chat turn (SPEC §4): the memory tools, `search_history` and
`record_learning` (a pending fact for the nightly consolidation, SPEC §8).

Every handler takes a memories.tools.ToolContext and the raw arguments string, and
returns text for the model ("Error: ..." for unusable arguments, never an exception);
arguments are checked against the schemas by memories.tools.check_arguments."""
from __future__ import annotations

from typing import Any

from django.conf import settings

from consolidation.models import Fact
from consolidation.services import STATEMENT_MAX_CHARS, fact_record
from memories.tools import MemoryTool, ToolContext, memory_toolset, tool_from
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


def _search_history(context: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    limit = args.get("limit", SEARCH_HISTORY_DEFAULT_LIMIT)
    hits = history_search(query=args["query"], limit=limit, kin=context.kin)
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


def _record_learning(context: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    fact = fact_record(kin=context.kin, statement=args["statement"], category=args.get("category", Fact.Category.FACT),
                       source=Fact.Source.TOOL, source_ref=context.source_ref)
    return {"status": "recorded", "fact": {"id": fact.pk, "category": fact.category, "statement": fact.statement}}


SEARCH_HISTORY_TOOL = tool_from(SEARCH_HISTORY_SCHEMA, _search_history)
RECORD_LEARNING_TOOL = tool_from(RECORD_LEARNING_SCHEMA, _record_learning)


def kin_toolset() -> dict[str, MemoryTool]:
    """The tools a kin may call in a chat turn, by name. workflow_lineage joins with workflows."""
    tools = dict(memory_toolset("kin"))
    tools["search_history"] = SEARCH_HISTORY_TOOL
    tools["record_learning"] = RECORD_LEARNING_TOOL
    return tools
