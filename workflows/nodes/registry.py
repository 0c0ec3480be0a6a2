"""The node-type registry: every node type the executor can run, by name, and the
one-sentence description of any node. A node type is a plug-in: a NodeType subclass in its
own module of this package (see base.py), registered below.

Adding a node type: write `workflows/nodes/<family>.py` with a NodeType subclass (name,
title, description, params, check/run/describe) and add one `register(...)` line here; the
API, MCP and the dashboard list it from node_types_described()."""
from __future__ import annotations

from typing import Any

from workflows.lineage import name_text
from workflows.nodes import filtering, http, llm, merge, output, sources, transform
from workflows.nodes.base import NodeType, config_schema, counts_sentence

NODE_TYPES: dict[str, NodeType] = {}


def register(node_type: NodeType) -> NodeType:
    if node_type.name in NODE_TYPES:
        raise ValueError(f"Node type '{node_type.name}' is registered twice.")
    NODE_TYPES[node_type.name] = node_type
    return node_type


register(sources.InlineRecords())
register(sources.CsvUpload())
register(http.HttpJson())
register(filtering.Filter())
register(transform.Transform())
register(filtering.Deduplicate())
register(merge.Merge())
register(llm.LlmInference())
register(llm.LlmSmartFilter())
register(output.TableOutput())


def node_type_described(node_type: NodeType) -> dict[str, Any]:
    """A node type as the API, MCP and the dashboard's canvas show it: what it is, how many
    inputs it takes (max None: any number), and its config's JSON Schema."""
    return {
        "name": node_type.name,
        "title": node_type.title,
        "description": node_type.description,
        "inputs": {"min": node_type.min_inputs, "max": node_type.max_inputs},
        "outputs": 1,  # every node hands one list of records on
        "config_schema": config_schema(node_type),
    }


def node_types_described() -> list[dict[str, Any]]:
    """Every registered node type, in registration order (sources first)."""
    return [node_type_described(node_type) for node_type in NODE_TYPES.values()]


def get_node_type(name: str) -> NodeType | None:
    return NODE_TYPES.get(name)


def describe_step(node_type: str, config: Any, *, label: str = "") -> str:
    """What the node does, without counts (lineage appends its own): its type's describer,
    or the generic one for unknown types and for a stored config the describer cannot read."""
    known = NODE_TYPES.get(node_type)
    if known is not None and isinstance(config, dict):
        try:
            return known.describe(config)
        except Exception:  # a config saved before a schema change must not break lineage
            pass
    # Stored text: one line, as every name the canvas and the narrative show (prompt_safety).
    name = f'"{name_text(label)}"' if label else "A node"
    known_word = "" if known is not None else "unknown "
    return f"{name} of {known_word}type {name_text(node_type)}"


def describe(node_type: str, config: Any, *, label: str = "", records_in: int | None = None,
             records_out: int | None = None) -> str:
    """One sentence about a node: what it does, with its parameters, and its record counts."""
    step = describe_step(node_type, config, label=label)
    if records_out is None:
        return f"{step} (not run yet)."
    known = NODE_TYPES.get(node_type)
    if known is None:
        return counts_sentence(step, records_in=records_in, records_out=records_out)
    return known.sentence(step, records_in=records_in, records_out=records_out)
