"""Lineage of a workflow node: its upstream subgraph and a narrative of how its records
came to be (its exports are workflows.lineage_exports). Pure functions over plain data: a
selector reads the workflow once and hands over a `GraphInfo`.

Staleness is judged from a node's fields (no status value means "results lost"):
- never ran: `results_version == 0` and no `config_fingerprint`;
- lost its results: `results_version == 0` but a `config_fingerprint` (cleared since);
- settings changed: it has results but `current_fingerprint` (its config now) differs from
  `config_fingerprint` (its config at its last run); an empty `current_fingerprint` means
  "not computed" and is never a change.
The node itself is judged too unless `check_self=False` (`{{_lineage}}`: lineage_upstream).
"""
from __future__ import annotations

import heapq
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from kinsite.prompt_safety import one_line

NEVER_RAN = "never_ran"
LOST_RESULTS = "lost_results"
SETTINGS_CHANGED = "settings_changed"

NAME_MAX_CHARS = 200  # a node label's stored length


@dataclass(frozen=True)
class NodeInfo:
    id: str  # the client id
    type: str
    label: str = ""
    config: dict = field(default_factory=dict)
    status: str = "idle"
    records_in: int | None = None
    records_out: int | None = None
    results_version: int = 0
    config_fingerprint: str = ""  # of the config its current results were produced with
    current_fingerprint: str = ""  # of its config now ("" = not computed)


@dataclass(frozen=True)
class EdgeInfo:
    source: str
    target: str
    kind: str = "data"


@dataclass
class GraphInfo:
    nodes: list[NodeInfo]
    edges: list[EdgeInfo]


@dataclass(slots=True)
class LineageEntry:
    id: str
    type: str
    label: str
    summary: str  # the describer's sentence
    params: dict
    records_in: int | None
    records_out: int | None
    results_version: int
    status: str
    stale_cause: str | None = None  # NEVER_RAN, LOST_RESULTS, SETTINGS_CHANGED or None

    @property
    def name(self) -> str:
        return self.label or self.id


@dataclass
class LineageGraph:
    node_id: str  # the node whose lineage this is (the last entry)
    entries: list[LineageEntry]  # topological order
    edges: list[EdgeInfo]  # data edges among the entries, each (source, target) once
    stale: bool = False
    stale_reasons: list[str] = field(default_factory=list)  # one sentence fragment per stale node


def name_text(text: str) -> str:
    """A node's label, id or type as the narrative shows it: one line (a label is stored
    text and the narrative goes into prompts, where a line break could forge a heading)."""
    return one_line(text, NAME_MAX_CHARS)


def default_describer(node: NodeInfo) -> str:
    # The narrative appends counts to every step, so describers (this one and those of
    # workflows.nodes) name the step only.
    kind = name_text(node.type) or "unknown"
    if node.label and node.label != node.type:
        return f'Runs "{name_text(node.label)}", a {kind} step'
    return f"Runs a {kind} step"


def default_params(node: NodeInfo) -> dict:
    return dict(node.config)


def stale_cause(node: NodeInfo) -> str | None:
    if node.results_version <= 0:
        return LOST_RESULTS if node.config_fingerprint else NEVER_RAN
    if node.current_fingerprint and node.current_fingerprint != node.config_fingerprint:
        return SETTINGS_CHANGED
    return None


_CAUSE_TEXT = {
    NEVER_RAN: "{} never ran",
    LOST_RESULTS: "{} lost its results",
    SETTINGS_CHANGED: "{} has changed settings since its last run",
}


def collect_lineage(
    graph: GraphInfo,
    node_id: str,
    *,
    describe: Callable[[NodeInfo], str] = default_describer,
    params: Callable[[NodeInfo], dict] = default_params,
    check_self: bool = True,
) -> LineageGraph:
    """The node and everything upstream of it over data edges, in topological order (ties:
    the earlier in `graph.nodes` first). Linear when `graph.nodes` is already topological
    (the usual case: nodes are added after their inputs); otherwise Kahn's with a heap."""
    nodes = graph.nodes
    position = {node.id: i for i, node in enumerate(nodes)}
    target = position.get(node_id)
    if target is None:
        raise ValueError(f"unknown node {node_id!r}")
    parents: list[list[int]] = [[] for _ in nodes]
    data_edges = []
    for edge in graph.edges:
        source, sink = position.get(edge.source), position.get(edge.target)
        if source is None or sink is None:
            raise ValueError(f"edge {edge.source!r} → {edge.target!r} names an unknown node")
        if edge.kind == "data":
            parents[sink].append(source)
            data_edges.append((source, sink))

    upstream = bytearray(len(nodes))
    upstream[target] = 1
    stack = [target]
    while stack:
        for parent in parents[stack.pop()]:
            if not upstream[parent]:
                upstream[parent] = 1
                stack.append(parent)

    pairs, seen, in_input_order = [], set(), True
    for pair in data_edges:  # input order; parallel edges (other handles) once
        if upstream[pair[1]] and pair not in seen:
            seen.add(pair)
            pairs.append(pair)
            in_input_order = in_input_order and pair[0] < pair[1]
    if in_input_order:  # no edge points backwards: the input order is the stable order
        order = [i for i in range(len(nodes)) if upstream[i]]
    else:
        order = _kahn(nodes, [i for i in range(len(nodes)) if upstream[i]], pairs, node_id)

    entries, reasons = [], []
    for i in order:
        node = nodes[i]
        cause = stale_cause(node) if (check_self or i != target) else None
        # Positional: keyword arguments cost twice as much, which shows at 10,000 nodes.
        entries.append(LineageEntry(
            node.id, node.type, node.label, describe(node), params(node),
            node.records_in, node.records_out, node.results_version, node.status, cause,
        ))
        if cause:
            reasons.append(_CAUSE_TEXT[cause].format(name_text(node.label or node.id)))
    edges = [EdgeInfo(nodes[s].id, nodes[t].id) for s, t in pairs]
    return LineageGraph(node_id=node_id, entries=entries, edges=edges, stale=bool(reasons), stale_reasons=reasons)


def _kahn(nodes: list[NodeInfo], members: list[int], pairs: list[tuple[int, int]], node_id: str) -> list[int]:
    children: dict[int, list[int]] = {}
    waiting = dict.fromkeys(members, 0)
    for source, sink in pairs:
        children.setdefault(source, []).append(sink)
        waiting[sink] += 1
    ready = [i for i in members if waiting[i] == 0]  # ascending, so already a heap
    order = []
    while ready:
        current = heapq.heappop(ready)
        order.append(current)
        for child in children.get(current, ()):
            waiting[child] -= 1
            if waiting[child] == 0:
                heapq.heappush(ready, child)
    if len(order) != len(members):
        raise ValueError(f"the upstream of {node_id!r} has a cycle")
    return order


def lineage_upstream(graph: LineageGraph) -> LineageGraph:
    """What fed the node: its lineage without its own entry (the last) and the edges into it.
    `node_id` stays, so the narrative gives each input its own branch. This is `{{_lineage}}`:
    a node about to run has no records of its own yet, only its inputs' history."""
    if not graph.entries:
        return graph
    entries = graph.entries[:-1]
    edges = [edge for edge in graph.edges if edge.target != graph.node_id]
    # The node's own reason, if any, is the last.
    reasons = graph.stale_reasons[:-1] if graph.entries[-1].stale_cause else list(graph.stale_reasons)
    return LineageGraph(node_id=graph.node_id, entries=entries, edges=edges, stale=bool(reasons),
                        stale_reasons=reasons)


# --- Narrative -------------------------------------------------------------------------

STALE_WARNING = "Warning: upstream settings changed since these records were produced"
OMITTED_LINE = "(Earlier steps omitted to fit.)"
_PARAM_VALUE_CHARS = 60


def _count(n: int) -> str:
    return f"{n:,}"


def _counts(records_in: int | None, records_out: int | None) -> str:
    if records_in is None and records_out is None:
        return "no records yet"
    if records_in is None:
        return f"{_count(records_out)} record{'' if records_out == 1 else 's'} out"
    noun = "record" if records_in == 1 else "records"
    if records_out is None:
        return f"{_count(records_in)} {noun} in"
    return f"{_count(records_in)} {noun} in, {_count(records_out)} out"


def _sentence_body(text: str) -> str:
    text = " ".join(text.split())
    return text[:-1] if text.endswith(".") else text


def _param_text(params: dict) -> str:
    if not params:
        return ""
    parts = []
    for key, value in params.items():
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
        shown = " ".join(str(shown).split())
        if len(shown) > _PARAM_VALUE_CHARS:
            shown = shown[: _PARAM_VALUE_CHARS - 1] + "…"
        parts.append(f"{key}={shown}")
    return " Parameters: " + "; ".join(parts) + "."


def _letter(index: int) -> str:
    letters = ""
    index += 1
    while index:
        index, rest = divmod(index - 1, 26)
        letters = chr(65 + rest) + letters
    return letters


def _and_list(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


class _Layout:
    """The graph cut into segments (maximal chains), each with its header and numbering.

    A node continues its parent's segment when it is the parent's only child and has no
    other parent. At a fan-out (a diamond's shared ancestor) the first child continues
    the segment and the others start branches that "continue from Branch X step k" —
    unless the ancestor also feeds a join directly, in which case the segment ends there,
    so that every join names whole branches ("Branch A and Branch B are combined")."""

    def __init__(self, graph: LineageGraph):
        entries = graph.entries
        index = {entry.id: i for i, entry in enumerate(entries)}
        count = len(entries)
        self.parents: list[list[int]] = [[] for _ in range(count)]
        children: list[list[int]] = [[] for _ in range(count)]
        for edge in graph.edges:
            source, target = index[edge.source], index[edge.target]
            self.parents[target].append(source)
            children[source].append(target)
        continuer = [-1] * count  # the child that carries on a node's segment
        for i in range(count):
            kids = children[i]
            if len(kids) == 1 and len(self.parents[kids[0]]) == 1:
                continuer[i] = kids[0]
            elif len(kids) > 1 and all(len(self.parents[k]) == 1 for k in kids):
                continuer[i] = min(kids)
        self.segment_of = [-1] * count
        self.step_of = [0] * count
        self.segments: list[list[int]] = []
        for i in range(count):  # topological order, so a segment's start comes first
            if self.segment_of[i] != -1:
                continue
            segment, current = [], i
            while current != -1:
                self.segment_of[current] = len(self.segments)
                self.step_of[current] = len(segment) + 1
                segment.append(current)
                current = continuer[current]
            self.segments.append(segment)
        self.height = [0] * count
        for i in range(count):
            for p in self.parents[i]:
                self.height[i] = max(self.height[i], self.height[p] + 1)
        # False for the lineage of what fed a node (lineage_upstream): the node is no entry,
        # so no segment is its "Then:" and every input's chain is a branch.
        self.ends_at_node = bool(entries) and entries[-1].id == graph.node_id
        # The steps that always show when folding: the node's own (the one sink of a node's
        # lineage), or each input's last step (the sinks of lineage_upstream's graph).
        self.sinks = [i for i in range(count) if not children[i]]

    def header(self, s: int) -> str | None:
        if len(self.segments) == 1:
            return None  # a plain chain: just the numbered list
        final = self.ends_at_node and s == len(self.segments) - 1
        name = "Then" if final else f"Branch {_letter(s)}"
        parents = self.parents[self.segments[s][0]]
        if not parents:
            return f"{name}:"
        if len(parents) == 1:
            p = parents[0]
            return f"{name}: continues from Branch {_letter(self.segment_of[p])} step {self.step_of[p]}."
        joined = sorted({self.segment_of[p] for p in parents})
        if len(joined) > 3 and joined[-1] - joined[0] == len(joined) - 1:  # a wide join stays short
            return (f"{name}: Branch {_letter(joined[0])} to Branch {_letter(joined[-1])} "
                    f"({len(joined)} branches) are combined.")
        return f"{name}: {_and_list([f'Branch {_letter(x)}' for x in joined])} are combined."

    def segment_lines(self, s: int, hidden: int, entries: list[LineageEntry]) -> list[str]:
        """The segment without parameters, its first `hidden` steps folded into one line."""
        header = self.header(s)
        lines = [header] if header is not None else []
        if hidden:
            lines.append(_folded_line(hidden))
        segment = self.segments[s]
        lines.extend(_step_line(self.step_of[i], entries[i], False) for i in segment[hidden:])
        return lines


def _step_line(number: int, entry: LineageEntry, with_params: bool) -> str:
    line = f"{number}. {_sentence_body(entry.summary)} ({_counts(entry.records_in, entry.records_out)})."
    return line + _param_text(entry.params) if with_params else line


def _folded_line(hidden: int) -> str:
    # No counts: the next visible step says how many records came in.
    return "1. 1 further step." if hidden == 1 else f"1–{hidden}. {_count(hidden)} further steps."


def _folded_len(hidden: int) -> int:
    return len(_folded_line(hidden)) + 1 if hidden else 0


def _warning(graph: LineageGraph, max_chars: int) -> str:
    if not graph.stale:
        return ""
    # As many causes as fit in half the budget, so a wholly stale graph leaves room for steps.
    text, shown = STALE_WARNING + ": " + graph.stale_reasons[0], 1
    for reason in graph.stale_reasons[1:]:
        rest = len(graph.stale_reasons) - shown - 1
        tail = f" and {_count(rest)} more" if rest else ""
        if len(text) + 2 + len(reason) + len(tail) + 1 > max_chars // 2:
            break
        text += "; " + reason
        shown += 1
    more = len(graph.stale_reasons) - shown
    return text + (f"; and {_count(more)} more" if more else "") + "."


def lineage_to_narrative(graph: LineageGraph, max_chars: int = 2000) -> str:
    """How the node's records came to be, in at most `max_chars` characters.

    One step per line: "2. <describer's sentence> (120 records in, 87 out)." plus
    " Parameters: k=v; k=v." at full detail. A chain is one numbered list; otherwise each
    segment (`_Layout`) is a list under a header: "Branch A:", "Branch B: continues from
    Branch A step 2.", "Branch C: Branch A and Branch B are combined.", and last "Then: ..."
    for the join leading to the node (none in a lineage_upstream graph). A stale graph
    starts with STALE_WARNING and the causes.

    Over budget, in order: parameters are dropped; then steps fold into "1–3. 3 further
    steps." from the sources down (at the smallest level c that fits, every step fewer than
    c edges from a source; the sinks always show); if even the most folded form is over, the
    warning and the last whole lines that fit are kept after OMITTED_LINE (the steps nearest
    the node matter most). Linear in the entries; only lines that can fit are formatted."""
    entries = graph.entries
    if not entries:
        return ""
    layout = _Layout(graph)
    segments = layout.segments
    warning = _warning(graph, max_chars)
    head = [warning] if warning else []
    room = max_chars - sum(len(line) + 1 for line in head) + 1  # for the lines after the head

    def unfolded(with_params: bool) -> list[str] | None:
        lines, used = [], 0
        for s, segment in enumerate(segments):
            header = layout.header(s)
            candidates = ([header] if header is not None else []) + [
                _step_line(layout.step_of[i], entries[i], with_params) for i in segment]
            for line in candidates:
                used += len(line) + 1
                if used > room:
                    return None  # stops early: at 10,000 nodes only the first lines get built
                lines.append(line)
        return lines

    for with_params in (True, False):
        lines = unfolded(with_params)
        if lines is not None:
            return "\n".join(head + lines)

    # The most folded form (only the sinks shown), built from the end: once over budget,
    # the tail built so far is the answer.
    hidden = [len(segment) for segment in segments]
    for sink in layout.sinks:  # a sink ends its segment
        hidden[layout.segment_of[sink]] -= 1
    tail: list[str] = []  # reversed
    used = 0
    for s in range(len(segments) - 1, -1, -1):
        for line in reversed(layout.segment_lines(s, hidden[s], entries)):
            used += len(line) + 1
            if used > room:
                return _keep_tail(head, tail, max_chars)
            tail.append(line)

    # It fits: unfold from the most folded level down while the text still fits. A step
    # at height c shows once the level is c or less; a segment's folded steps stay a
    # prefix because heights grow along a segment.
    always_shown = set(layout.sinks)
    by_height: dict[int, list[int]] = {}
    for i in range(len(entries)):
        if i not in always_shown:
            by_height.setdefault(layout.height[i], []).append(i)
    for level in range(max(by_height, default=0), 0, -1):
        growth = 0
        for i in by_height.get(level, ()):
            s = layout.segment_of[i]
            growth += (len(_step_line(layout.step_of[i], entries[i], False)) + 1
                       + _folded_len(hidden[s] - 1) - _folded_len(hidden[s]))
        if used + growth > room:
            break
        used += growth
        for i in by_height.get(level, ()):
            hidden[layout.segment_of[i]] -= 1
    lines = [line for s in range(len(segments)) for line in layout.segment_lines(s, hidden[s], entries)]
    return "\n".join(head + lines)


def _keep_tail(head: list[str], tail_reversed: list[str], max_chars: int) -> str:
    room = max_chars - sum(len(line) + 1 for line in head) - len(OMITTED_LINE)
    kept = []
    for line in tail_reversed:
        if len(line) + 1 > room:
            break
        room -= len(line) + 1
        kept.append(line)
    result = head + ([OMITTED_LINE] + kept[::-1] if kept else [])
    while result and len("\n".join(result)) > max_chars:
        result.pop()  # a budget smaller than the warning itself: whole lines only
    return "\n".join(result)
