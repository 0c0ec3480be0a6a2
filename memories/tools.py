"""The memory tools as a model sees them: OpenAI function schemas plus handlers.

A handler takes a ToolContext and the raw arguments string the model sent, and returns
a short text for the model: JSON on success, "Error: ..." when the arguments are
unusable (never an exception, so the tool loop can hand the error back to the model).
The schemas are the single source of truth for validation (check_arguments reads them).
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from django.conf import settings
from django.utils import timezone

from kinsite.models import Kin, Team
from memories import selectors, services
from memories.models import Memory

CONTENT_MAX_CHARS = 4_000
RECALL_MAX_LIMIT = 50


@dataclass(frozen=True)
class ToolContext:
    """Who is calling: the kin whose memories these are, the change-log actor, and the
    source recorded on memories it adds (e.g. Memory.Source.TOOL / "event:345")."""

    team: Team
    kin: Kin
    actor: services.Actor
    source: str = Memory.Source.TOOL
    source_ref: str = ""


Handler = Callable[[ToolContext, str], str]


class MemoryTool(NamedTuple):
    schema: dict[str, Any]
    handler: Handler


class ToolArgumentError(ValueError):
    pass


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


def _schema(name: str, description: str, properties: dict, required: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        "description": description,
        "parameters": {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        },
    }


RECALL_SCHEMA = _schema(
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
    return _schema(
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
UPDATE_SCHEMA = _schema(
    "memory_update",
    "Change one of your memories (give its id and only the fields that change).",
    {"id": _ID, "content": _CONTENT, "category": _CATEGORY, "subject": _SUBJECT, "importance": _IMPORTANCE,
     "reason": _REASON},
    ["id"],
)


def _remove_schema(name: str, description: str) -> dict[str, Any]:
    return _schema(name, description, {"id": _ID, "reason": {**_REASON, "minLength": 1}}, ["id", "reason"])


FORGET_SCHEMA = _remove_schema(
    "memory_forget", "Forget one of your memories that is wrong or no longer true (it stays in the audit history)."
)
DELETE_SCHEMA = _remove_schema(
    "memory_delete", "Delete a memory that is wrong or no longer true (it stays in the audit history)."
)


# --- argument checking ----------------------------------------------------------------------


def check_arguments(schema: dict[str, Any], raw: str) -> dict[str, Any]:
    """The arguments as a dict, checked against the schema's parameters (the subset of
    JSON Schema used above), or ToolArgumentError with a message the model can act on."""
    try:
        args = json.loads(raw) if raw and raw.strip() else {}
    except (TypeError, ValueError):
        raise ToolArgumentError("the arguments are not valid JSON.")
    if not isinstance(args, dict):
        raise ToolArgumentError("the arguments must be a JSON object.")
    parameters = schema["parameters"]
    properties = parameters["properties"]
    extra = sorted(set(args) - set(properties))
    if extra:
        raise ToolArgumentError(f"unknown argument(s): {', '.join(extra)}; allowed: {', '.join(properties)}.")
    missing = [name for name in parameters["required"] if name not in args or args[name] is None]
    if missing:
        raise ToolArgumentError(f"missing required argument(s): {', '.join(missing)}.")
    checked = {}
    for name, value in args.items():
        if value is None:
            continue  # an optional argument sent as null means "not given"
        spec = properties[name]
        if spec["type"] == "integer":
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ToolArgumentError(f"{name} must be an integer.")
            if value < spec.get("minimum", value) or value > spec.get("maximum", value):
                raise ToolArgumentError(f"{name} must be between {spec['minimum']} and {spec['maximum']}.")
        elif spec["type"] == "string":
            if not isinstance(value, str):
                raise ToolArgumentError(f"{name} must be a string.")
            value = value.strip()
            if "\x00" in value:
                raise ToolArgumentError(f"{name} must not contain NUL characters.")
            if "enum" in spec and value not in spec["enum"]:
                raise ToolArgumentError(f"{name} must be one of: {', '.join(spec['enum'])}.")
            if len(value) < spec.get("minLength", 0):
                raise ToolArgumentError(f"{name} must not be empty.")
            if len(value) > spec.get("maxLength", len(value)):
                raise ToolArgumentError(f"{name} is longer than {spec['maxLength']} characters.")
        checked[name] = value
    return checked


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


def tool_from(schema: dict[str, Any], run: Callable[[ToolContext, dict[str, Any]], dict[str, Any]]) -> MemoryTool:
    def handler(context: ToolContext, raw_arguments: str) -> str:
        try:
            return json.dumps(run(context, check_arguments(schema, raw_arguments)), ensure_ascii=False)
        except ToolArgumentError as exc:
            return f"Error: {exc}"

    handler.__name__ = f"{schema['name']}_handler"
    return MemoryTool(schema=schema, handler=handler)


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
        hits = selectors.memory_search(
            team=context.team, kin=context.kin, query=args["query"],
            limit=args.get("limit", settings.MEMORY_TOP_K), category=args.get("category", ""),
            count_retrieval=count_retrieval,
        )
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


def memory_toolset(kind: str) -> dict[str, MemoryTool]:
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
