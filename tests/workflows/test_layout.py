"""The dashboard's graph layout (workflows.layout): columns by topological wave, rows
ordered within a wave, no overlapping boxes, lines from box to box, always the same."""
from itertools import combinations

from workflows.layout import BOX_HEIGHT, BOX_WIDTH, MARGIN, layout_graph


def _by_id(layout):
    return {box.id: box for box in layout.boxes}


def _overlap(a, b) -> bool:
    return a.x < b.x + b.width and b.x < a.x + a.width and a.y < b.y + b.height and b.y < a.y + a.height


def _assert_no_overlaps(layout):
    for a, b in combinations(layout.boxes, 2):
        assert not _overlap(a, b), (a, b)
    for box in layout.boxes:
        assert box.x >= 0 and box.y >= 0
        assert box.x + box.width <= layout.width and box.y + box.height <= layout.height


def test_a_chain_runs_left_to_right_on_one_row():
    layout = layout_graph(["a", "b", "c"], [("a", "b"), ("b", "c")])
    boxes = _by_id(layout)

    assert [boxes[n].column for n in "abc"] == [0, 1, 2]
    assert boxes["a"].x < boxes["b"].x < boxes["c"].x
    assert boxes["a"].y == boxes["b"].y == boxes["c"].y == MARGIN
    assert layout.height == 2 * MARGIN + BOX_HEIGHT
    _assert_no_overlaps(layout)


def test_a_fan_out_stacks_the_children_and_centres_the_parent():
    layout = layout_graph(["src", "x", "y", "z"], [("src", "x"), ("src", "y"), ("src", "z")])
    boxes = _by_id(layout)

    assert {boxes[n].column for n in "xyz"} == {1}
    assert [boxes[n].row for n in "xyz"] == [0, 1, 2]  # ties keep the given order
    assert boxes["x"].y < boxes["y"].y < boxes["z"].y
    assert boxes["src"].center_y == boxes["y"].center_y
    _assert_no_overlaps(layout)


def test_a_join_sits_between_its_parents_in_the_next_column():
    layout = layout_graph(["left", "right", "join"], [("left", "join"), ("right", "join")])
    boxes = _by_id(layout)

    assert (boxes["left"].column, boxes["right"].column, boxes["join"].column) == (0, 0, 1)
    assert boxes["join"].center_y == (boxes["left"].center_y + boxes["right"].center_y) / 2
    _assert_no_overlaps(layout)


def test_a_node_waits_for_its_latest_parent():
    # a → b → c and a → c: c is in wave 2, after b, not beside it.
    boxes = _by_id(layout_graph(["a", "b", "c"], [("a", "b"), ("b", "c"), ("a", "c")]))
    assert [boxes[n].column for n in "abc"] == [0, 1, 2]


def test_rows_follow_the_parents_to_avoid_crossings():
    # Children listed against their parents' order still end up beside their own parent.
    layout = layout_graph(["p1", "p2", "c2", "c1"], [("p1", "c1"), ("p2", "c2")])
    boxes = _by_id(layout)
    assert boxes["c1"].row == 0 and boxes["c2"].row == 1


def test_lines_run_from_the_source_right_side_to_the_target_left_side():
    layout = layout_graph(["a", "b"], [("a", "b"), ("a", "b")])  # two handles, one line
    boxes = _by_id(layout)

    assert len(layout.lines) == 1
    line = layout.lines[0]
    assert (line.x1, line.y1) == (boxes["a"].x + BOX_WIDTH, boxes["a"].center_y)
    assert (line.x2, line.y2) == (boxes["b"].x, boxes["b"].center_y)
    assert line.path.startswith(f"M {line.x1:g} {line.y1:g} C ")


def test_a_larger_dag_has_no_overlaps_and_is_deterministic():
    nodes = [f"n{i}" for i in range(30)]
    edges = [(f"n{i}", f"n{j}") for i in range(30) for j in range(i + 1, 30) if (i * 7 + j * 3) % 11 == 0]

    first, second = layout_graph(nodes, edges), layout_graph(nodes, edges)

    assert first == second
    _assert_no_overlaps(first)
    boxes = _by_id(first)
    for source, target in edges:
        assert boxes[source].column < boxes[target].column


def test_empty_graphs_and_cycles_do_not_fail():
    assert layout_graph([], []).boxes == []
    layout = layout_graph(["a", "b", "c"], [("b", "c"), ("c", "b")])
    _assert_no_overlaps(layout)
    assert _by_id(layout)["a"].column == 0
