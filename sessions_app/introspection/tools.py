"""The six tools of an introspection run (TOOL_NAMES) and nothing else.

Only memory_recall acts at once. The writes are checked when called (so the model hears of a
bad id straight away) but staged on an IntrospectionState and applied in one transaction when
the run ends: a run failing half-way changes nothing, and no transaction stays open across
model calls."""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kinsite.tools import Tool, ToolArgumentError, ToolContext, check_arguments, function_schema
from memories.tools import _own_active_memory, memory_toolset  # the memory tools' own schemas and checks

WORKING_MEMORY_MAX_CHARS = 8_000
DESCRIPTION_MAX_CHARS = 300

WORKING_MEMORY_SCHEMA = function_schema(
    "working_memory_update",
    "Replace this session's working memory with a new, complete version: goal, status, next steps, "
    "open questions. It replaces the old one entirely; an empty string clears it.",
    {"content": {"type": "string", "maxLength": WORKING_MEMORY_MAX_CHARS,
                 "description": "The complete new working memory (short Markdown), without the "
                                "'> ' quote marks the prompt shows the current one with."}},
    ["content"],
)
DESCRIPTION_SCHEMA = function_schema(
    "session_description_update",
    "Set this session's description: one short line saying what the session is about.",
    {"description": {"type": "string", "minLength": 1, "maxLength": DESCRIPTION_MAX_CHARS,
                     "description": "At most about 15 words."}},
    ["description"],
)

MEMORY_WRITES = ("memory_add", "memory_update", "memory_delete")
TOOL_NAMES = ("memory_recall", *MEMORY_WRITES, "working_memory_update", "session_description_update")


@dataclass
class StagedMemoryWrite:
    name: str  # memory_add, memory_update or memory_delete
    arguments: str  # the raw JSON the model sent (already checked)
    call_index: int  # position in the run's tool_calls list


@dataclass
class IntrospectionState:
    """What a run has decided so far; introspection applies it when the run ends."""

    memory_writes: list[StagedMemoryWrite] = field(default_factory=list)
    working_memory: str | None = None  # None: unchanged
    description: str | None = None
    calls: int = 0

    @property
    def changes_anything(self) -> bool:
        return bool(self.memory_writes) or self.working_memory is not None or self.description is not None


Stage = Callable[[ToolContext, IntrospectionState, str, int], str]


class IntrospectionTool(NamedTuple):
    schema: dict[str, Any]
    stage: Stage  # (tool_context, state, raw arguments, call index) -> text for the model


def _staged(action: str, **extra: Any) -> str:
    return json.dumps({"status": "staged", "action": action,
                       "note": "applied when this introspection finishes", **extra}, ensure_ascii=False)


def _run_now(tool: Tool) -> Stage:
    def stage(tool_context: ToolContext, state: IntrospectionState, raw: str, index: int) -> str:
        return tool.handler(tool_context, raw)

    return stage


def _stage_memory_write(tool: Tool) -> Stage:
    name = tool.schema["name"]

    def stage(tool_context: ToolContext, state: IntrospectionState, raw: str, index: int) -> str:
        try:
            args = check_arguments(tool.schema, raw)
            if name in ("memory_update", "memory_delete"):
                _own_active_memory(tool_context, args["id"])
                if name == "memory_update" and not set(args) - {"id", "reason"}:
                    raise ToolArgumentError("give at least one of content, category, subject, importance to change.")
        except ToolArgumentError as exc:
            return f"Error: {exc}"
        state.memory_writes.append(StagedMemoryWrite(name=name, arguments=raw, call_index=index))
        return _staged(name.removeprefix("memory_"), **({"id": args["id"]} if "id" in args else {}))

    return stage


def _stage_working_memory(tool_context: ToolContext, state: IntrospectionState, raw: str, index: int) -> str:
    try:
        args = check_arguments(WORKING_MEMORY_SCHEMA, raw)
    except ToolArgumentError as exc:
        return f"Error: {exc}"
    state.working_memory = args.get("content", "")
    return _staged("working_memory_update")


def _stage_description(tool_context: ToolContext, state: IntrospectionState, raw: str, index: int) -> str:
    try:
        args = check_arguments(DESCRIPTION_SCHEMA, raw)
    except ToolArgumentError as exc:
        return f"Error: {exc}"
    state.description = args["description"]
    return _staged("session_description_update")


def introspection_toolset() -> dict[str, IntrospectionTool]:
    """Exactly the six introspection tools, by name."""
    memory = memory_toolset("introspection")
    tools = {
        "memory_recall": IntrospectionTool(memory["memory_recall"].schema, _run_now(memory["memory_recall"])),
        **{name: IntrospectionTool(memory[name].schema, _stage_memory_write(memory[name])) for name in MEMORY_WRITES},
        "working_memory_update": IntrospectionTool(WORKING_MEMORY_SCHEMA, _stage_working_memory),
        "session_description_update": IntrospectionTool(DESCRIPTION_SCHEMA, _stage_description),
    }
    assert tuple(tools) == TOOL_NAMES
    return tools


def memory_write_apply(tool_context: ToolContext, write: StagedMemoryWrite) -> str:
    """Run one staged memory write for real (inside the run's final transaction); the
    tool's text answer, "Error: ..." when the memory changed since it was staged."""
    return memory_toolset("introspection")[write.name].handler(tool_context, write.arguments)
