"""The registry and the shared parameter schema, across node types: each problem named,
null optional parameters meaning their default, the generic sentence of an unknown type."""
import pytest

from workflows.nodes.base import NodeType, Param, RunContext, validate_params
from workflows.nodes.registry import NODE_TYPES, describe, register


@pytest.mark.parametrize(
    "node_type, config, message",
    [
        ("filter", {"conditions": [{"field": "a", "op": "like", "value": 1}]}, "op 'like'"),
        ("filter", {"conditions": []}, "non-empty list"),
        ("filter", {"conditions": [{"field": "a", "op": "eq", "value": 1}], "combine": "xor"}, "one of and, or"),
        ("transform", {"extract": {"field": "a", "pattern": "(", "into": "b"}}, "not a valid regular expression"),
        ("deduplicate", {}, "parameter 'fields' is required"),
        ("merge", {"key": "id", "how": "outer"}, "must be one of inner, left"),
        ("inline_records", {"records": [1, 2]}, "must be a JSON object"),
        ("csv_upload", {"csv": 3}, "must be a string"),
        ("table_output", {"colums": ["a"]}, "unknown parameter 'colums'"),
    ],
)
def test_bad_params_are_named(node_type, config, message):
    errors = validate_params(NODE_TYPES[node_type], config)
    assert any(message in error for error in errors), errors


@pytest.mark.parametrize(
    "node_type, config, message",
    [
        ("filter", {"conditions": [{"field": "n", "op": "gt", "value": 10**400}]},
         "condition 1: the number 1000000000000000000000…"),
        ("filter", {"conditions": [{"field": "n", "op": "in", "value": [1, -(10**30)]}]},
         "condition 1: the number -100000000000000000000…"),
        ("filter", {"conditions": [{"field": "n", "op": "lt", "value": 1e300}]}, "condition 1: the number 1e+300"),
        ("llm_inference", {"prompt": "x", "temperature": 1e300}, "'temperature' must be between 0 and 2"),
        ("llm_inference", {"prompt": "x", "temperature": -1}, "'temperature' must be between 0 and 2"),
        ("llm_inference", {"prompt": "x", "max_records": 10**400}, "'max_records' must be between 1 and 5000"),
        ("csv_upload", {"csv": "a,b\n1,2", "delimiter": "\n"}, "'delimiter' cannot be a line break or a quote"),
        ("csv_upload", {"csv": "a,b\n1,2", "delimiter": '"'}, "'delimiter' cannot be a line break or a quote"),
    ],
)
def test_absurd_numbers_and_delimiters_are_named(node_type, config, message):
    errors = validate_params(NODE_TYPES[node_type], config)
    assert any(message in error for error in errors), errors


@pytest.mark.parametrize(
    "node_type, config",
    [
        ("llm_inference", {"prompt": "x", "max_records": None, "temperature": None}),
        ("csv_upload", {"csv": "a,b\n1,2", "delimiter": None}),
        ("filter", {"conditions": [{"field": "n", "op": "eq", "value": 1}], "combine": None}),
        ("filter", {"conditions": [{"field": "n", "op": "lt", "value": 9_007_199_254_740_993}]}),
    ],
)
def test_null_optional_params_mean_their_default(node_type, config):
    assert validate_params(NODE_TYPES[node_type], config) == []


def test_unknown_type_gets_the_generic_sentence():
    assert describe("pivot", {"x": 1}, label="Pivot by city", records_in=3, records_out=2) == (
        '"Pivot by city" of unknown type pivot (3 in, 2 out).'
    )
    assert describe("pivot", {}, label="") == "A node of unknown type pivot (not run yet)."


def test_a_node_type_is_one_class_and_one_register_call():
    class Upper(NodeType):
        name = "upper_names"
        title = "Upper-case names"
        params = {"field": Param(str, required=True, doc="the field to upper-case")}

        def run(self, ctx, config, inputs):
            return [{**r, config["field"]: str(r.get(config["field"], "")).upper()} for rs in inputs for r in rs]

        def describe(self, config):
            return f"Upper-cases {config.get('field')}"

    register(Upper())
    try:
        assert validate_params(NODE_TYPES["upper_names"], {}) == [
            "parameter 'field' is required (the field to upper-case)."
        ]
        assert NODE_TYPES["upper_names"].run(RunContext(), {"field": "name"}, [[{"name": "Ada"}]]) == [{"name": "ADA"}]
        assert describe("upper_names", {"field": "name"}, records_in=1, records_out=1) == (
            "Upper-cases name (1 in, 1 out)."
        )
        with pytest.raises(ValueError, match="registered twice"):
            register(Upper())
    finally:
        del NODE_TYPES["upper_names"]
