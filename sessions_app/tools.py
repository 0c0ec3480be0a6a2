"""The kin's tools in a chat turn (SPEC §4): the memory tools, `search_history` and
`record_learning` (a pending fact for the nightly consolidation, SPEC §8).

Every handler takes a memories.tools.ToolContext and the raw arguments string, and
returns text for the model ("Error: ..." for unusable arguments, never an exception)."""
from __future__ import annotations

import json
from typing import Any

from django.conf import settings

from consolidation.models import Fact
from consolidation.services import STATEMENT_MAX_CHARS, fact_record
from memories.tools import MemoryTool, ToolContext, memory_toolset
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


def _search_history_arguments(raw: str) -> tuple[str, int]:
    try:
        args = json.loads(raw) if raw and raw.strip() else {}
    except ValueError:
        raise ValueError("the arguments are not valid JSON.")
    if not isinstance(args, dict):
        raise ValueError("the arguments must be a JSON object.")
    extra = sorted(set(args) - {"query", "limit"})
    if extra:
        raise ValueError(f"unknown argument(s): {', '.join(extra)}; allowed: query, limit.")
    query = args.get("query")
    if not isinstance(query, str) or not query.strip():
        raise ValueError("query must be a non-empty string.")
    if len(query) > settings.SEARCH_MAX_QUERY_CHARS:
        raise ValueError(f"query is longer than {settings.SEARCH_MAX_QUERY_CHARS} characters.")
    limit = args.get("limit", SEARCH_HISTORY_DEFAULT_LIMIT)
    if limit is None:
        limit = SEARCH_HISTORY_DEFAULT_LIMIT
    if isinstance(limit, float) and limit.is_integer():
        limit = int(limit)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= SEARCH_HISTORY_MAX_LIMIT:
        raise ValueError(f"limit must be an integer between 1 and {SEARCH_HISTORY_MAX_LIMIT}.")
    return query, limit


def search_history_handler(context: ToolContext, raw_arguments: str) -> str:
    try:
        query, limit = _search_history_arguments(raw_arguments)
    except ValueError as exc:
        return f"Error: {exc}"
    hits = history_search(query=query, limit=limit, kin=context.kin)
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
    return json.dumps({"results": results}, ensure_ascii=False)


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


def _record_learning_arguments(raw: str) -> tuple[str, str]:
    try:
        args = json.loads(raw) if raw and raw.strip() else {}
    except ValueError:
        raise ValueError("the arguments are not valid JSON.")
    if not isinstance(args, dict):
        raise ValueError("the arguments must be a JSON object.")
    extra = sorted(set(args) - {"statement", "category"})
    if extra:
        raise ValueError(f"unknown argument(s): {', '.join(extra)}; allowed: statement, category.")
    statement = args.get("statement")
    if not isinstance(statement, str) or not statement.strip():
        raise ValueError("statement must be a non-empty string.")
    statement = statement.strip()
    if "\x00" in statement:
        raise ValueError("statement must not contain NUL characters.")
    if len(statement) > STATEMENT_MAX_CHARS:
        raise ValueError(f"statement is longer than {STATEMENT_MAX_CHARS} characters.")
    category = args.get("category") or Fact.Category.FACT
    if category not in Fact.Category.values:
        raise ValueError(f"category must be one of: {', '.join(Fact.Category.values)}.")
    return statement, category


def record_learning_handler(context: ToolContext, raw_arguments: str) -> str:
    try:
        statement, category = _record_learning_arguments(raw_arguments)
    except ValueError as exc:
        return f"Error: {exc}"
    fact = fact_record(kin=context.kin, statement=statement, category=category,
                       source=Fact.Source.TOOL, source_ref=context.source_ref)
    return json.dumps({"status": "recorded", "fact": {"id": fact.pk, "category": fact.category,
                                                      "statement": fact.statement}}, ensure_ascii=False)


def kin_toolset() -> dict[str, MemoryTool]:
    """The tools a kin may call in a chat turn, by name. workflow_lineage joins with workflows."""
    tools = dict(memory_toolset("kin"))
    tools["search_history"] = MemoryTool(schema=SEARCH_HISTORY_SCHEMA, handler=search_history_handler)
    tools["record_learning"] = MemoryTool(schema=RECORD_LEARNING_SCHEMA, handler=record_learning_handler)
    return tools
