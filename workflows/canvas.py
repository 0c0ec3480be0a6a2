"""CURRENT CANVAS: what a session attached to a workflow sees of it in every
turn's prompt — the node inventory, then each terminal node's record counts and lineage
narrative, within a character budget. Pure: a selector reads the graph once and hands it
over; the text is computed per turn and never stored."""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from workflows.lineage import GraphInfo, NodeInfo, collect_lineage, lineage_to_narrative, name_text
from workflows.nodes.base import plural

# Below this many characters a narrative says too little to be worth its header, so the
# inventory is shortened first, and then fewer terminal nodes are narrated.
MIN_NARRATIVE_CHARS = 200
# The most the inventory takes once it has to be shortened, as a share of the budget.
SHORT_INVENTORY_SHARE = 0.35


def _name(node: NodeInfo) -> str:
    # Ids, labels and types are stored text: one line each, so no canvas line can begin
    # with them (the prompt builder relies on it: sessions_app.prompt guards the canvas).
    node_id = name_text(node.id)
    return f'{node_id} "{name_text(node.label)}"' if node.label and node.label != node.id else node_id


def _counts(node: NodeInfo) -> str:
    if node.records_out is None:
        return "not run yet"
    if node.records_in is None:
        return f"{node.records_out} out"
    return f"{node.records_in} in, {node.records_out} out"


def _node_line(node: NodeInfo) -> str:
    return f"- {_name(node)} ({name_text(node.type)}): {node.status}, {_counts(node)}."


def _terminal_header(node: NodeInfo) -> str:
    if node.records_out is None:
        counts = "not run yet"
    elif node.records_in is None:
        counts = f"{plural(node.records_out, 'record')} out"
    else:
        counts = f"{node.records_in} records in, {node.records_out} out"
    return f"Terminal node {_name(node)} ({name_text(node.type)}), {counts}:"


def _length(lines: list[str]) -> int:
    return sum(len(line) + 1 for line in lines)


def _short_inventory(nodes: list[NodeInfo], room: int) -> list[str]:
    """The first node lines that fit in `room`, then one line counting the rest by status."""
    # The line about all nodes is at least as long as the one about any tail of them.
    reserve = len(_rest_line(nodes)) + 1
    lines: list[str] = []
    used = 0
    for index, node in enumerate(nodes):
        line = _node_line(node)
        last = index == len(nodes) - 1
        if used + len(line) + 1 + (0 if last else reserve) > room:
            return lines + [_rest_line(nodes[index:])]
        lines.append(line)
        used += len(line) + 1
    return lines


def _rest_line(nodes: list[NodeInfo]) -> str:
    by_status = Counter(n.status for n in nodes)
    return (f"- …and {plural(len(nodes), 'more node')}: "
            + ", ".join(f"{count} {status}" for status, count in sorted(by_status.items())) + ".")


def canvas_text(*, workflow_name: str, graph: GraphInfo, describe: Callable[[NodeInfo], str],
                max_chars: int = 1500) -> str:
    """The canvas in at most `max_chars` characters, whole lines only:

        Workflow "Adults" (3 nodes, 2 edges). Nodes:
        - people "People" (inline_records): done, 3 out.
        - adults "Adults" (filter): done, 3 in, 2 out.
        - table "Result" (table_output): done, 2 in, 2 out.
        Terminal node table "Result" (table_output), 2 records in, 2 out:
        1. Provides 3 inline records … (3 out).
        ...

    A terminal node has no outgoing data edge. Over budget: the narratives shrink first
    (each gets an equal share of what is left, a short one leaves its rest to the next),
    then the inventory is cut to its first lines plus a count of the rest by status, then
    fewer terminal nodes are narrated (the others are counted in one line)."""
    nodes = graph.nodes
    title = (
        f'Workflow "{name_text(workflow_name)}" ({plural(len(nodes), "node")}, {plural(len(graph.edges), "edge")}).'
    )
    if not nodes:
        return _fit([title + " It has no nodes yet."], max_chars)
    title += " Nodes:"
    feeds = {edge.source for edge in graph.edges if edge.kind == "data"}
    terminals = [node for node in nodes if node.id not in feeds]

    inventory = [_node_line(node) for node in nodes]
    shown = terminals
    if _room_per_narrative(max_chars, title, inventory, shown, len(terminals)) < MIN_NARRATIVE_CHARS:
        inventory = _short_inventory(nodes, int(max_chars * SHORT_INVENTORY_SHARE))
        # No more than this many narratives can each get their minimum, whatever the rest.
        shown = terminals[:max_chars // MIN_NARRATIVE_CHARS]
        while shown and _room_per_narrative(max_chars, title, inventory, shown, len(terminals)) < MIN_NARRATIVE_CHARS:
            shown = shown[:-1]

    lines = [title, *inventory]
    left_out = len(terminals) - len(shown)
    tail = [f"{plural(left_out, 'more terminal node')} not narrated here (use workflow_lineage)."] if left_out else []
    headers = [_terminal_header(node) for node in shown]
    room = max_chars - _length(lines) - _length(tail) - _length(headers) + 1
    for index, (node, header) in enumerate(zip(shown, headers, strict=True)):
        share = room // (len(shown) - index) - 1
        lines.append(header)
        if share > 0:
            narrative = lineage_to_narrative(collect_lineage(graph, node.id, describe=describe), max_chars=share)
            if narrative:
                lines.append(narrative)
                room -= len(narrative) + 1
    return _fit(lines + tail, max_chars)


def _room_per_narrative(max_chars: int, title: str, inventory: list[str], shown: list[NodeInfo],
                        terminals: int) -> int:
    if not shown:
        return max_chars
    fixed = _length([title, *inventory]) + _length([_terminal_header(node) for node in shown])
    if len(shown) < terminals:
        fixed += len("999 more terminal nodes not narrated here (use workflow_lineage).") + 1
    return (max_chars - fixed) // len(shown) - 1


def _fit(lines: list[str], max_chars: int) -> str:
    """Whole lines only: a last guard for budgets too small for even the headers."""
    lines = [line for chunk in lines for line in chunk.split("\n")]
    while lines and _length(lines) - 1 > max_chars:
        lines.pop()
    return "\n".join(lines)
