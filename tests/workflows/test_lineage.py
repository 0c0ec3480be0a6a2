"""collect_lineage on hand-built graphs: which nodes and edges a node's lineage holds,
their order, and when it is stale. Plain data, no database."""
import pytest

from workflows.lineage import (
    LOST_RESULTS,
    NEVER_RAN,
    SETTINGS_CHANGED,
    EdgeInfo,
    GraphInfo,
    NodeInfo,
    collect_lineage,
    default_describer,
)


def node(node_id, type="filter", **fields):
    """A node that ran and is up to date unless told otherwise."""
    values = {"label": node_id.upper(), "status": "done", "records_in": 10, "records_out": 8,
              "results_version": 1, "config_fingerprint": "fp", "current_fingerprint": "fp"}
    values.update(fields)
    return NodeInfo(id=node_id, type=type, **values)


def graph(node_ids, edges, **overrides):
    """`edges` as "a>b" strings; `overrides` maps a node id to its changed fields."""
    nodes = [node(n, **overrides.get(n, {})) for n in node_ids]
    return GraphInfo(nodes=nodes, edges=[EdgeInfo(*e.split(">")) for e in edges])


def ids(lineage):
    return [entry.id for entry in lineage.entries]


def edge_pairs(lineage):
    return [(edge.source, edge.target) for edge in lineage.edges]


def ancestors(g, node_id):
    """Reference answer: the node and everything reaching it over data edges (fixpoint)."""
    found = {node_id}
    while True:
        more = {e.source for e in g.edges if e.kind == "data" and e.target in found} - found
        if not more:
            return found
        found |= more


# Each shape, and every node of it, sees exactly its own upstream.
SHAPES = {
    "chain": graph(["a", "b", "c"], ["a>b", "b>c"]),
    "fan_out": graph(["a", "b", "c"], ["a>b", "a>c"]),
    "join": graph(["a", "b", "c"], ["a>c", "b>c"]),
    "diamond": graph(["s", "l", "r", "j"], ["s>l", "s>r", "l>j", "r>j"]),
    "two_parts": graph(["a", "b", "x", "y"], ["a>b", "x>y"]),
    "lonely": graph(["solo", "a", "b"], ["a>b"]),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_every_node_sees_only_its_own_upstream(shape):
    g = SHAPES[shape]
    for n in g.nodes:
        lineage = collect_lineage(g, n.id)
        assert set(ids(lineage)) == ancestors(g, n.id)
        assert ids(lineage)[-1] == n.id
        assert len(ids(lineage)) == len(set(ids(lineage)))
        expected_edges = [(e.source, e.target) for e in g.edges if e.target in ancestors(g, n.id)]
        assert edge_pairs(lineage) == expected_edges


def test_chain_lists_its_nodes_in_order():
    lineage = collect_lineage(SHAPES["chain"], "c")
    assert ids(lineage) == ["a", "b", "c"]
    assert edge_pairs(lineage) == [("a", "b"), ("b", "c")]
    assert ids(collect_lineage(SHAPES["chain"], "b")) == ["a", "b"]


def test_fan_out_siblings_do_not_see_each_other():
    assert ids(collect_lineage(SHAPES["fan_out"], "b")) == ["a", "b"]
    assert ids(collect_lineage(SHAPES["fan_out"], "c")) == ["a", "c"]


def test_join_holds_both_parents_in_input_order():
    lineage = collect_lineage(SHAPES["join"], "c")
    assert ids(lineage) == ["a", "b", "c"]
    assert edge_pairs(lineage) == [("a", "c"), ("b", "c")]


def test_diamond_holds_the_shared_ancestor_once():
    lineage = collect_lineage(SHAPES["diamond"], "j")
    assert ids(lineage) == ["s", "l", "r", "j"]
    assert len(lineage.edges) == 4


def test_disconnected_part_is_left_out():
    assert ids(collect_lineage(SHAPES["two_parts"], "b")) == ["a", "b"]
    assert ids(collect_lineage(SHAPES["two_parts"], "y")) == ["x", "y"]


def test_node_without_upstream_is_its_own_lineage():
    lineage = collect_lineage(SHAPES["lonely"], "solo")
    assert ids(lineage) == ["solo"]
    assert lineage.edges == []
    assert not lineage.stale


def test_order_is_topological_and_stable_when_the_input_order_is_not():
    # Listed sink first; ties among ready nodes go by input position (z before a).
    g = graph(["out", "m", "z", "a", "b"], ["a>m", "z>m", "b>a", "m>out"])
    assert ids(collect_lineage(g, "out")) == ["z", "b", "a", "m", "out"]


def test_control_edges_are_not_lineage():
    g = GraphInfo(nodes=[node("a"), node("b"), node("c")],
                  edges=[EdgeInfo("a", "c", kind="control"), EdgeInfo("b", "c")])
    lineage = collect_lineage(g, "c")
    assert ids(lineage) == ["b", "c"]
    assert edge_pairs(lineage) == [("b", "c")]


def test_parallel_edges_count_once():
    g = graph(["a", "b"], ["a>b", "a>b"])
    assert edge_pairs(collect_lineage(g, "b")) == [("a", "b")]


def test_entries_carry_summary_params_counts_and_version():
    g = GraphInfo(nodes=[
        node("src", type="inline_records", label="People", config={"records": [1, 2]}, records_in=None,
             records_out=2, results_version=3),
        node("f", label="Adults", config={"field": "age"}, records_in=2, records_out=1, results_version=5),
    ], edges=[EdgeInfo("src", "f")])
    lineage = collect_lineage(g, "f", describe=lambda n: f"{n.type}:{n.label}")
    first, second = lineage.entries
    assert (first.id, first.type, first.label, first.summary) == ("src", "inline_records", "People",
                                                                 "inline_records:People")
    assert first.params == {"records": [1, 2]}
    assert (first.records_in, first.records_out, first.results_version) == (None, 2, 3)
    assert (second.params, second.records_in, second.records_out, second.results_version) == (
        {"field": "age"}, 2, 1, 5)


def test_params_extractor_chooses_the_detail():
    g = graph(["a"], [], a={"config": {"keep": 1, "secret": "x"}})
    lineage = collect_lineage(g, "a", params=lambda n: {"keep": n.config["keep"]})
    assert lineage.entries[0].params == {"keep": 1}


def test_default_describer_names_label_and_type():
    assert default_describer(node("f", label="Adults only")) == 'Runs "Adults only", a filter step'
    assert default_describer(NodeInfo(id="x", type="mystery")) == "Runs a mystery step"


def test_unknown_node_and_cycles_are_refused():
    with pytest.raises(ValueError, match="unknown node"):
        collect_lineage(SHAPES["chain"], "nope")
    with pytest.raises(ValueError, match="unknown node"):
        collect_lineage(graph(["a"], ["a>ghost"]), "a")
    with pytest.raises(ValueError, match="cycle"):
        collect_lineage(graph(["a", "b", "c"], ["a>b", "b>a", "b>c"]), "c")


def test_ten_thousand_deep_chain_needs_no_recursion():
    size = 10_000
    g = graph([f"n{i}" for i in range(size)], [f"n{i}>n{i + 1}" for i in range(size - 1)])
    lineage = collect_lineage(g, f"n{size - 1}")
    assert len(lineage.entries) == size
    assert lineage.entries[0].id == "n0"


# --- Staleness --------------------------------------------------------------------------

def test_up_to_date_lineage_is_not_stale():
    lineage = collect_lineage(SHAPES["diamond"], "j")
    assert not lineage.stale
    assert lineage.stale_reasons == []
    assert all(entry.stale_cause is None for entry in lineage.entries)


@pytest.mark.parametrize(("fields", "cause", "reason"), [
    ({"results_version": 0, "config_fingerprint": "", "status": "idle"}, NEVER_RAN, "A never ran"),
    ({"results_version": 0, "config_fingerprint": "fp"}, LOST_RESULTS, "A lost its results"),
    ({"current_fingerprint": "fp2"}, SETTINGS_CHANGED, "A has changed settings since its last run"),
])
def test_each_cause_makes_the_downstream_lineage_stale(fields, cause, reason):
    lineage = collect_lineage(graph(["a", "b", "c"], ["a>b", "b>c"], a=fields), "c")
    assert lineage.stale
    assert lineage.entries[0].stale_cause == cause
    assert lineage.stale_reasons == [reason]


def test_unknown_current_fingerprint_is_not_a_change():
    lineage = collect_lineage(graph(["a", "b"], ["a>b"], a={"current_fingerprint": ""}), "b")
    assert not lineage.stale


def test_a_failed_rerun_keeps_earlier_results_current():
    # The last run failed, but the stored results are still those of the current settings.
    lineage = collect_lineage(graph(["a", "b"], ["a>b"], a={"status": "failed"}), "b")
    assert not lineage.stale


def test_staleness_outside_the_upstream_does_not_count():
    g = graph(["a", "b", "x"], ["a>b", "x>b"], x={"current_fingerprint": "new"})
    assert collect_lineage(g, "a").stale is False
    assert collect_lineage(g, "b").stale is True


def test_the_node_itself_counts_unless_it_is_about_to_run():
    g = graph(["a", "b"], ["a>b"], b={"results_version": 0, "config_fingerprint": ""})
    assert collect_lineage(g, "b").stale_reasons == ["B never ran"]
    assert not collect_lineage(g, "b", check_self=False).stale


def test_several_causes_are_listed_in_order():
    g = graph(["a", "b", "c"], ["a>b", "b>c"], a={"current_fingerprint": "x"},
              c={"results_version": 0, "config_fingerprint": "fp"})
    assert collect_lineage(g, "c").stale_reasons == ["A has changed settings since its last run",
                                                     "C lost its results"]
