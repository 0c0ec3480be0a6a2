"""The merge node: inner and left joins of two inputs on a key."""
from tests.workflows.nodes.support import PEOPLE, run
from workflows.nodes.registry import describe


def test_merge_inner_and_left_join_on_key():
    orders = [{"id": 1, "total": 10}, {"id": 1, "total": 5}, {"id": 9, "total": 1}]

    inner = run("merge", {"key": "id", "how": "inner"}, PEOPLE, orders)
    left = run("merge", {"key": "id", "how": "left"}, PEOPLE, orders)

    assert [(r["name"], r["total"]) for r in inner] == [("Ada", 10), ("Ada", 5)]
    assert [(r["name"], r.get("total")) for r in left] == [("Ada", 10), ("Ada", 5), ("Bo", None), ("Cy", None)]
    assert describe("merge", {"key": "id", "how": "left"}, records_in=6, records_out=4) == (
        "Joins its two inputs on id with a left join (6 in, 4 out)."
    )
