"""Tools a model can call: a Tool is an OpenAI function schema plus a handler taking the
caller's ToolContext and the raw arguments string. A handler answers text for the model, JSON
or "Error: ..." (never an exception, so the tool loop can hand the error back). The schema is
the one source of validation; the tools live with what they act on (memories.tools, ...)."""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from kinsite.actors import Actor

if TYPE_CHECKING:
    from kinsite.models import Kin, Team


@dataclass(frozen=True)
class ToolContext:
    """Who is calling: the kin (and its team) the tools act for, the change-log actor, and
    the source recorded on memories the tools add (a Memory.Source, e.g. "tool" / "event:345")."""

    team: Team
    kin: Kin
    actor: Actor
    source: str = "tool"  # Memory.Source.TOOL, spelled out: this module imports no app
    source_ref: str = ""


Handler = Callable[[ToolContext, str], str]


class Tool(NamedTuple):
    schema: dict[str, Any]
    handler: Handler


class ToolArgumentError(ValueError):
    pass


def function_schema(name: str, description: str, properties: dict, required: list[str]) -> dict[str, Any]:
    """An OpenAI function schema taking exactly `properties` (JSON Schema, the subset
    check_arguments knows: integer with minimum/maximum, string with enum/minLength/maxLength)."""
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


def check_arguments(schema: dict[str, Any], raw: str) -> dict[str, Any]:
    """The arguments as a dict, checked against the schema's parameters (the subset of
    JSON Schema that function_schema describes), or ToolArgumentError with a message the model can act on."""
    try:
        args = json.loads(raw) if raw and raw.strip() else {}
    except (TypeError, ValueError) as exc:
        raise ToolArgumentError("the arguments are not valid JSON.") from exc
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
            low, high = spec.get("minimum"), spec.get("maximum")
            if (low is not None and value < low) or (high is not None and value > high):
                if high is None:
                    raise ToolArgumentError(f"{name} must be at least {low}.")
                if low is None:
                    raise ToolArgumentError(f"{name} must be at most {high}.")
                raise ToolArgumentError(f"{name} must be between {low} and {high}.")
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


def tool_from(schema: dict[str, Any], run: Callable[[ToolContext, dict[str, Any]], dict[str, Any]]) -> Tool:
    """A Tool whose handler checks the arguments against `schema`, calls `run` with them and
    answers its result as JSON (a ToolArgumentError raised by either as "Error: ...")."""
    def handler(context: ToolContext, raw_arguments: str) -> str:
        try:
            return json.dumps(run(context, check_arguments(schema, raw_arguments)), ensure_ascii=False)
        except ToolArgumentError as exc:
            return f"Error: {exc}"

    handler.__name__ = f"{schema['name']}_handler"
    return Tool(schema=schema, handler=handler)
