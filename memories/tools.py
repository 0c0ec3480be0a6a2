"""The memory tools as a model sees them: OpenAI function schemas plus handlers, built
on the generic tool machinery of kinsite.tools (ToolContext, check_arguments: a handler
answers "Error: ..." for unusable arguments, never an exception).
"""
from __future__ import annotations

from typing import Any

from django.conf import settings
from django.utils import timezone

from kinsite.tools import Tool, ToolArgumentError, ToolContext, function_schema, tool_from
from memories import services
from memories.models import Memory
from memories.search.selectors import memory_search

CONTENT_MAX_CHARS = 4_000
RECALL_MAX_LIMIT = 50


# --- schemas --------------------------------------------------------------------------------

_CATEGORY = {
    "type": "string",
    "enum": list(Memory.Category.values),
    "description": "fact (about people or the world), preference (how someone likes things), "
                   "decision (what was agreed), knowledge (how to do something).",
}
_IMPORTANCE = {"type": "integer", "minimum": 1, "maximum": 10,
               "description": "1 = trivia, 5 = useful, 10 = must never be forgotten."}
_SUBJECT = {"type": "string", "maxLength": 200,
            "description": "Who or what it is about, e.g. a person's name or a project."}
_CONTENT = {"type": "string", "minLength": 1, "maxLength": CONTENT_MAX_CHARS,
            "description": "One self-contained statement, e.g. \"Maria prefers short answers.\""}
_ID = {"type": "integer", "minimum": 1, "description": "The memory's id, as returned by memory_recall."}
_REASON = {"type": "string", "maxLength": 500, "description": "Why, in a few words (kept in the memory's history)."}


RECALL_SCHEMA = function_schema(
    "memory_recall",
    "Search long-term memories (yours and your team's shared ones) by meaning and words. "
    "Use it before answering from memory.",
    {
        "query": {"type": "string", "minLength": 1, "maxLength": settings.SEARCH_MAX_QUERY_CHARS,
                  "description": "What to look for, in plain words."},
        "limit": {"type": "integer", "minimum": 1, "maximum": RECALL_MAX_LIMIT,
                  "description": "How many memories at most (default 10)."},
        "category": _CATEGORY,
    },
    ["query"],
)


def _add_schema(name: str, description: str) -> dict[str, Any]:
    return function_schema(
        name, description,
        {"content": _CONTENT, "category": _CATEGORY, "subject": _SUBJECT, "importance": _IMPORTANCE},
        ["content", "category"],
    )


MEMORIZE_SCHEMA = _add_schema(
    "memorize",
    "Store a durable memory: a fact, preference, decision or piece of knowledge worth keeping "
    "beyond this conversation. If it repeats a memory you already have, that one is updated.",
)
ADD_SCHEMA = _add_schema(
    "memory_add",
    "Add a long-term memory for this kin. If it repeats an existing memory, that one is updated.",
)
UPDATE_SCHEMA = function_schema(
    "memory_update",
    "Change one of your memories (give its id and only the fields that change).",
    {"id": _ID, "content": _CONTENT, "category": _CATEGORY, "subject": _SUBJECT, "importance": _IMPORTANCE,
     "reason": _REASON},
    ["id"],
)


def _remove_schema(name: str, description: str) -> dict[str, Any]:
    return function_schema(name, description, {"id": _ID, "reason": {**_REASON, "minLength": 1}}, ["id", "reason"])


FORGET_SCHEMA = _remove_schema(
    "memory_forget", "Forget one of your memories that is wrong or no longer true (it stays in the audit history)."
)
DELETE_SCHEMA = _remove_schema(
    "memory_delete", "Delete a memory that is wrong or no longer true (it stays in the audit history)."
)


def _own_active_memory(context: ToolContext, memory_id: int) -> Memory:
    # One message for every id the caller may not change, so ids of other kins or teams
    # reveal nothing about whether they exist.
    memory = Memory.objects.filter(
        pk=memory_id, team=context.team, kin=context.kin, status=Memory.Status.ACTIVE
    ).first()
    if memory is None:
        raise ToolArgumentError(
            f"no active memory {memory_id} of yours; use memory_recall to find ids "
            "(team-shared memories are changed by the team in the dashboard)."
        )
    return memory


# --- handlers -------------------------------------------------------------------------------


def _age(memory: Memory) -> str:
    seconds = max((timezone.now() - memory.updated_at).total_seconds(), 0)
    for unit, size in (("y", 365 * 86400), ("mo", 30 * 86400), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return "just now"


def _describe(memory: Memory) -> dict[str, Any]:
    return {
        "id": memory.pk,
        "content": memory.content,
        "category": memory.category,
        "subject": memory.subject,
        "importance": memory.importance,
        "updated": _age(memory),
        "shared": memory.kin_id is None,
    }


def _recall(count_retrieval: bool):
    def run(context: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
        hits = memory_search(
            team=context.team, kin=context.kin, query=args["query"],
            limit=args.get("limit", settings.MEMORY_TOP_K), category=args.get("category", ""),
        )
        if count_retrieval:
            # The recall tool counts what it serves. The prompt's memories are counted by
            # their turn, when it stores the reply.
            services.memory_hits_mark_retrieved(hits=hits)
        return {"memories": [_describe(hit.memory) for hit in hits]}

    return run


def _add(context: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    result = services.memory_add(
        team=context.team, kin=context.kin, content=args["content"], actor=context.actor,
        category=args["category"], subject=args.get("subject", ""), importance=args.get("importance", 5),
        source=context.source, source_ref=context.source_ref,
    )
    return {"status": "created" if result.created else "merged_with_existing", "memory": _describe(result.memory)}


def _update(context: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    memory = _own_active_memory(context, args.pop("id"))
    reason = args.pop("reason", "")
    if not args:
        raise ToolArgumentError("give at least one of content, category, subject, importance to change.")
    memory = services.memory_update(memory=memory, actor=context.actor, reason=reason, **args)
    return {"status": "updated", "memory": _describe(memory)}


def _delete(context: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    memory = _own_active_memory(context, args["id"])
    services.memory_delete(memory=memory, actor=context.actor, reason=args["reason"])
    return {"status": "deleted", "id": memory.pk}


# --- registry -------------------------------------------------------------------------------


def memory_toolset(kind: str) -> dict[str, Tool]:
    """The memory tools by name for "kin" (a chat turn: memory_recall, memorize,
    memory_update, memory_forget) or "introspection" (memory_recall, memory_add,
    memory_update, memory_delete)."""
    if kind == "kin":
        tools = [
            tool_from(RECALL_SCHEMA, _recall(count_retrieval=True)),
            tool_from(MEMORIZE_SCHEMA, _add),
            tool_from(UPDATE_SCHEMA, _update),
            tool_from(FORGET_SCHEMA, _delete),
        ]
    elif kind == "introspection":
        # Introspection reads memories to maintain them, not to use them: no retrieval counted.
        tools = [
            tool_from(RECALL_SCHEMA, _recall(count_retrieval=False)),
            tool_from(ADD_SCHEMA, _add),
            tool_from(UPDATE_SCHEMA, _update),
            tool_from(DELETE_SCHEMA, _delete),
        ]
    else:
        raise ValueError(f"unknown memory toolset {kind!r}; expected 'kin' or 'introspection'")
    return {tool.schema["name"]: tool for tool in tools}
