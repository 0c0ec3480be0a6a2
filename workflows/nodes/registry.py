"""The node-type registry: every node type the executor can run, by name, and the
one-sentence description of any node. A node type is a plug-in: a NodeType subclass in its
own module of this package (see base.py), registered below.

Adding a node type: write `workflows/nodes/<family>.py` with a NodeType subclass (name,
title, params, check/run/describe) and add one `register(...)` line here."""
from __future__ import annotations

from typing import Any

from workflows.lineage import name_text
from workflows.nodes import filtering, http, llm, merge, output, sources, transform
from workflows.nodes.base import NodeType, counts_sentence

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
