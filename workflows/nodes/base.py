"""What every node type shares: the NodeType base a plug-in subclasses, its
parameter schema (Param, validate_params), what a run hands it (RunContext, NodeError),
the helpers runners and describers have in common, and the config fingerprint.

A node type runs over lists of records (dicts): `run(ctx, config, inputs)` where `inputs`
holds one list of records per incoming data edge, in edge order. It raises NodeError for a
failure the user should read (the executor stores it on the node)."""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

Record = dict[str, Any]

# Config keys a node writes for itself (the smart filter's generated conditions): not
# settings, so they do not change the fingerprint.
DERIVED_CONFIG_KEYS = {"generated"}


class NodeError(Exception):
    """A node failed for a reason the user should read (bad input data, unreachable URL, …)."""


@dataclass(frozen=True)
class Param:
    """One setting of a node type. `kind`, `required` and `choices` are checked by
    validate_params; `default` is what the runner uses when it is absent; `schema` adds JSON
    Schema keywords (the shape of a list's items, lengths) that check() enforces; `widget`
    tells the dashboard's form which editor fits ("field" picks a field of the upstream
    records, "fields" several, "prompt", "csv", "conditions", "url"). A key of
    DERIVED_CONFIG_KEYS is written by the node itself: its schema says readOnly."""

    kind: type | tuple[type, ...]
    required: bool = False
    choices: tuple[str, ...] = ()
    doc: str = ""
    default: Any = None
    schema: dict[str, Any] = field(default_factory=dict)
    widget: str = ""


@dataclass
class RunContext:
    """What a runner may need beyond its config and inputs."""

    team: Any = None
    node: Any = None  # the workflows.models.Node being run
    lineage: Callable[[], str] = lambda: ""  # the node's lineage narrative (computed once, lazily)
    save_config: Callable[[dict], None] = lambda config: None  # smart filter stores its generated conditions


class NodeType:
    """One kind of node. A plug-in subclasses this in its own module, sets the class
    attributes, implements run() and describe(), and is registered in workflows.nodes."""

    name: ClassVar[str]
    title: ClassVar[str]
    description: ClassVar[str]  # one sentence for the palette and the node-types list
    params: ClassVar[dict[str, Param]] = {}
    min_inputs: ClassVar[int] = 1
    max_inputs: ClassVar[int | None] = None  # None: any number (their records are concatenated)

    def check(self, config: dict) -> list[str]:
        """Problems beyond the schema's, once the schema holds ([] = none)."""
        return []

    def run(self, ctx: RunContext, config: dict, inputs: list[list[Record]]) -> list[Record]:
        raise NotImplementedError

    def describe(self, config: dict) -> str:
        """The step, without counts or a final period."""
        raise NotImplementedError

    def sentence(self, step: str, *, records_in: int | None, records_out: int) -> str:
        """The step with the record counts of the node's last run."""
        return counts_sentence(step, records_in=records_in, records_out=records_out)


def counts_sentence(step: str, *, records_in: int | None, records_out: int) -> str:
    if records_in is None:
        return f"{step} ({plural(records_out, 'record')} out)."
    return f"{step} ({records_in} in, {records_out} out)."


def validate_params(node_type: NodeType, config: Any) -> list[str]:
    """The problems with `config` for `node_type`, as readable messages ([] = valid)."""
    if not isinstance(config, dict):
        return ["config must be a JSON object."]
    errors = []
    for name in sorted(set(config) - set(node_type.params)):
        errors.append(f"unknown parameter '{name}' (allowed: {', '.join(sorted(node_type.params)) or 'none'}).")
    for name, param in node_type.params.items():
        if name not in config or config[name] is None:
            if param.required:
                errors.append(f"parameter '{name}' is required ({param.doc}).")
            continue
        value = config[name]
        kinds = param.kind if isinstance(param.kind, tuple) else (param.kind,)
        # bool is an int in Python; a number parameter given true is still a mistake.
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            expected = " or ".join(_KIND_NAMES.get(k, k.__name__) for k in kinds)
            errors.append(f"parameter '{name}' must be {expected}.")
        elif param.choices and value not in param.choices:
            errors.append(f"parameter '{name}' must be one of {', '.join(param.choices)}.")
    if not errors:
        errors.extend(node_type.check(config))
    return errors


_KIND_NAMES = {
    str: "a string", int: "an integer", float: "a number", list: "a list", dict: "an object", bool: "a boolean",
}


# JSON Schema's name of each parameter kind (bool is not an "integer" there either).
_JSON_TYPES = {str: "string", int: "integer", float: "number", list: "array", dict: "object", bool: "boolean"}


def param_schema(name: str, param: Param) -> dict[str, Any]:
    """The JSON Schema of parameter `name`."""
    kinds = param.kind if isinstance(param.kind, tuple) else (param.kind,)
    types = [_JSON_TYPES[kind] for kind in kinds]
    if "integer" in types and "number" in types:
        types.remove("integer")  # a JSON Schema number includes the integers
    schema: dict[str, Any] = {"type": types[0] if len(types) == 1 else types}
    if param.doc:
        schema["description"] = param.doc
    if param.choices:
        schema["enum"] = list(param.choices)
    if param.default is not None:
        schema["default"] = param.default
    if param.widget:
        schema["x-widget"] = param.widget
    if name in DERIVED_CONFIG_KEYS:
        schema["readOnly"] = True
    return {**schema, **param.schema}


def config_schema(node_type: NodeType) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a node type's config, from its parameters. What it
    accepts validate_params may still refuse: check() also tests what no schema can say (a
    regular expression compiles, a URL is safe to fetch)."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {name: param_schema(name, param) for name, param in node_type.params.items()},
        "required": [name for name, param in node_type.params.items() if param.required],
        "additionalProperties": False,
    }


def config_fingerprint(node_type: str, config: dict) -> str:
    """sha256 of the canonical JSON of the node's type and settings."""
    settings_only = {k: v for k, v in (config or {}).items() if k not in DERIVED_CONFIG_KEYS}
    canonical = json.dumps({"type": node_type, "config": settings_only}, sort_keys=True, separators=(",", ":"),
                           ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


# --- helpers shared by the runners and describers ----------------------------------------------


def get_field(record: Record, path: str) -> Any:
    """record[path], or a dotted path into nested objects; None when absent."""
    if path in record:
        return record[path]
    value: Any = record
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def concat(inputs: list[list[Record]]) -> list[Record]:
    return [record for records in inputs for record in records]


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def quote(value: Any, limit: int = 60) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return f'"{text[: limit - 1]}…"' if len(text) > limit else f'"{text}"'


def names(items: list[str], limit: int = 6) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def fields_of(records: list[Any]) -> list[str]:
    seen: dict[str, None] = {}
    for record in records[:50]:
        if isinstance(record, dict):
            seen.update(dict.fromkeys(record))
    return list(seen)


def shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 2] + "…"


def json_key(value: Any) -> str:
    # JSON text, so that unhashable values (lists, objects) still compare.
    return json.dumps(value, sort_keys=True, default=str)
