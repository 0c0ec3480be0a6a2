"""The transform node: renames, and extractions with patterns run on RE2."""
import pytest

from tests.workflows.nodes.support import PEOPLE, run
from workflows.nodes.base import validate_params
from workflows.nodes.registry import NODE_TYPES, describe


def test_transform_renames_and_extracts():
    config = {"rename": {"name": "full_name"}, "extract": {"field": "email", "pattern": r"@(.+)$", "into": "domain"}}

    records = run("transform", config, PEOPLE[:1])

    assert records == [
        {**{k: v for k, v in PEOPLE[0].items() if k != "name"}, "full_name": "Ada", "domain": "example.org"}
    ]
    assert describe("transform", config, records_in=1, records_out=1) == (
        'Renames name → full_name and extracts domain from email with pattern "@(.+)$" (1 in, 1 out).'
    )


def test_transform_extract_runs_a_catastrophic_pattern_in_linear_time():
    # With a backtracking engine (Python's re) this search tries about 2**40 ways to split the
    # a's before giving up: hours of one worker. A linear-time engine answers at once.
    config = {"extract": {"field": "text", "pattern": r"(a+)+$", "into": "tail"}}

    records = run("transform", config, [{"text": "a" * 40 + "!"}, {"text": "baaa"}])

    assert [record["tail"] for record in records] == [None, "aaa"]


@pytest.mark.parametrize(
    "pattern, problem",
    [
        (r"(\w+) \1", "backreference"),
        (r"price(?= EUR)", "lookaround"),
        (r"(?<!not )sure", "lookaround"),
    ],
)
def test_transform_refuses_patterns_a_linear_time_engine_cannot_run(pattern, problem):
    errors = validate_params(NODE_TYPES["transform"], {"extract": {"field": "a", "pattern": pattern, "into": "b"}})

    assert len(errors) == 1, errors
    assert errors[0].startswith(f"extract 1: pattern {pattern!r} is not supported"), errors
    assert problem in errors[0]
