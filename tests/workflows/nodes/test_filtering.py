"""The filter (conditions over fields, numbers compared as numbers) and deduplicate nodes."""
import pytest

from tests.workflows.nodes.support import PEOPLE, run
from workflows.nodes.registry import describe


def test_filter_with_and_compares_numbers_as_numbers():
    config = {"conditions": [
        {"field": "city", "op": "eq", "value": "Paris"},
        {"field": "age", "op": "gte", "value": 18},
    ]}

    assert [r["id"] for r in run("filter", config, PEOPLE)] == [3]
    assert describe("filter", config, records_in=3, records_out=1) == (
        'Keeps records where city = "Paris" and age ≥ 18 (3 in, 1 out).'
    )


@pytest.mark.parametrize(
    "condition, ids",
    [
        ({"field": "city", "op": "ne", "value": "Paris"}, [1]),
        ({"field": "age", "op": "lt", "value": 20}, [2]),
        ({"field": "name", "op": "contains", "value": "d"}, [1]),
        ({"field": "name", "op": "in", "value": ["Bo", "Cy"]}, [2, 3]),
        ({"field": "missing", "op": "exists"}, []),
        ({"field": "missing", "op": "exists", "value": False}, [1, 2, 3]),
        ({"field": "age", "op": "gt", "value": 40}, [3]),
        ({"field": "age", "op": "lte", "value": 36}, [1, 2]),
    ],
)
def test_filter_operators(condition, ids):
    assert [r["id"] for r in run("filter", {"conditions": [condition]}, PEOPLE)] == ids


def test_filter_with_or():
    config = {
        "conditions": [{"field": "city", "op": "eq", "value": "London"}, {"field": "age", "op": "gt", "value": 50}],
        "combine": "or",
    }
    assert [r["id"] for r in run("filter", config, PEOPLE)] == [1, 3]


def test_filter_compares_huge_integers_and_odd_number_text_without_overflow():
    records = [
        {"id": 1, "n": 10**400},  # inline records may hold any JSON integer
        {"id": 2, "n": "9007199254740993"},  # 2**53 + 1: exact, not rounded through a float
        {"id": 3, "n": "nan"},  # not a number: compared as text, never "equal" to everything
        {"id": 4, "n": "5"},
        {"id": 5, "n": "1" + "0" * 5000},  # past int()'s digit limit: read as a float (inf)
    ]

    def ids(op, value):
        return [r["id"] for r in run("filter", {"conditions": [{"field": "n", "op": op, "value": value}]}, records)]

    assert ids("gt", 10) == [1, 2, 3, 5]
    assert ids("eq", 9007199254740992) == []
    assert ids("eq", 9007199254740993) == [2]
    assert ids("lte", 5) == [4]
    assert ids("ne", 5) == [1, 2, 3, 5]


def test_deduplicate_keeps_the_first_by_field():
    config = {"fields": ["email"]}

    assert [r["id"] for r in run("deduplicate", config, PEOPLE)] == [1, 2]
    assert describe("deduplicate", config, records_in=3, records_out=2) == (
        "Removes duplicates by email, keeping the first of each (3 in, 2 out)."
    )
