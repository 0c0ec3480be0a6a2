"""Where the dashboard draws a workflow's nodes and edges: a pure, deterministic layout
over plain ids (no database, no randomness), so the same graph always looks the same.

Columns are topological waves (the same waves the executor runs); within a column, nodes
are ordered by the mean height of their parents (fewer crossings at joins and fan-outs),
ties by the order the nodes were given; each column is centred on the tallest one."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from workflows.services import topological_waves

BOX_WIDTH = 200
BOX_HEIGHT = 78
COLUMN_GAP = 70
ROW_GAP = 26
MARGIN = 16


@dataclass(frozen=True)
class Box:
    id: str
    column: int
    row: int
    x: int
    y: int
    width: int
    height: int

    @property
    def center_y(self) -> int:
        return self.y + self.height // 2


@dataclass(frozen=True)
class Line:
    """An edge from the middle of the source's right side to the middle of the target's
    left side; `path` is an SVG path (a gentle S-curve) between them."""

    source: str
    target: str
    x1: int
    y1: int
    x2: int
    y2: int

    @property
    def path(self) -> str:
        bend = max((self.x2 - self.x1) // 2, COLUMN_GAP // 2)
        return (f"M {self.x1:g} {self.y1:g} C {self.x1 + bend:g} {self.y1:g}, "
                f"{self.x2 - bend:g} {self.y2:g}, {self.x2:g} {self.y2:g}")


@dataclass(frozen=True)
class Layout:
    boxes: list[Box]  # in the order the node ids were given
    lines: list[Line]  # one per distinct (source, target), in the order first given
    width: int
    height: int


def layout_graph(node_ids: list[str], edges: list[tuple[str, str]]) -> Layout:
    """Positions for every node and a line per distinct edge. Nodes on a cycle (which a
    saved workflow cannot have) go in one last column rather than failing."""
    if not node_ids:
        return Layout(boxes=[], lines=[], width=2 * MARGIN, height=2 * MARGIN)
    known = set(node_ids)
    pairs = list(dict.fromkeys((s, t) for s, t in edges if s in known and t in known and s != t))
    waves, leftover = topological_waves(node_ids, pairs)
    last = max(waves.values(), default=-1) + 1
    for node_id in leftover:
        waves[node_id] = last

    order = {node_id: i for i, node_id in enumerate(node_ids)}
    columns: dict[int, list[str]] = defaultdict(list)
    for node_id in node_ids:
        columns[waves[node_id]].append(node_id)
    parents: dict[str, list[str]] = defaultdict(list)
    for source, target in pairs:
        parents[target].append(source)

    step = BOX_HEIGHT + ROW_GAP
    tallest = max(len(members) for members in columns.values())
    center_y: dict[str, int] = {}
    boxes: dict[str, Box] = {}
    for column_index, column in enumerate(sorted(columns)):
        members = columns[column]

        def weight(node_id: str) -> tuple[float, int]:
            placed = [center_y[p] for p in parents[node_id] if p in center_y]
            return (sum(placed) / len(placed) if placed else 0.0, order[node_id])

        if column_index:
            members = sorted(members, key=weight)
        # Whole pixels: the step is even, so half a step is too.
        offset = (tallest - len(members)) * step // 2
        x = MARGIN + column_index * (BOX_WIDTH + COLUMN_GAP)
        for row, node_id in enumerate(members):
            y = MARGIN + offset + row * step
            boxes[node_id] = Box(node_id, column_index, row, x, y, BOX_WIDTH, BOX_HEIGHT)
            center_y[node_id] = y + BOX_HEIGHT // 2

    lines = [
        Line(source, target, boxes[source].x + BOX_WIDTH, boxes[source].center_y, boxes[target].x,
             boxes[target].center_y)
        for source, target in pairs
    ]
    width = 2 * MARGIN + len(columns) * BOX_WIDTH + (len(columns) - 1) * COLUMN_GAP
    height = 2 * MARGIN + tallest * step - ROW_GAP
    return Layout(boxes=[boxes[node_id] for node_id in node_ids], lines=lines, width=width, height=height)
