"""The node types described once, for the API, MCP and the dashboard's forms: GET
/api/v1/workflow-node-types/ lists every registered plug-in with its config's JSON Schema, a
newly registered type appears with no other change, and the schema never refuses a config
the API's validation accepts (it may accept more: check() also compiles patterns and judges
URLs), while it does refuse missing, mistyped, unknown and out-of-range settings."""
import copy

import jsonschema
import pytest

from workflows.nodes import registry
from workflows.nodes.base import NodeType, Param, validate_params
from workflows.nodes.registry import NODE_TYPES, register

pytestmark = pytest.mark.django_db

URL = "/api/v1/workflow-node-types/"

# A config each type runs with, and every optional setting given.
VALID = {
    "inline_records": {"records": [{"name": "Ada"}]},
    "csv_upload": {"csv": "name,age\nAda,36\n", "delimiter": ";"},
    "http_json": {"url": "https://data.example.com/people.json", "path": "items"},
    "filter": {"conditions": [{"field": "age", "op": "gte", "value": 18}, {"field": "email", "op": "exists"}],
               "combine": "or"},
    "transform": {"rename": {"mail": "email"}, "extract": [{"field": "email", "pattern": "@(.+)$", "into": "domain"}]},
    "deduplicate": {"fields": ["email", "name"]},
    "merge": {"key": "email", "how": "left"},
    "llm_inference": {"prompt": "Summarise {{name}}. {{_lineage}}", "output_field": "summary", "system": "Be brief.",
                      "temperature": 0.2, "max_records": 50},
    "llm_smart_filter": {"instruction": "keep adults"},
    "table_output": {"columns": ["name", "email"]},
}
# Values of the wrong kind for a parameter of each JSON type.
WRONG = {"string": 7, "integer": "7", "number": "0.5", "array": {"a": 1}, "object": [1], "boolean": "yes"}


def schema_of(name: str) -> dict:
    return registry.node_type_described(NODE_TYPES[name])["config_schema"]


def accepts(schema: dict, config) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(config)


def variants(name: str):
    """VALID[name], each setting dropped, each setting mistyped, an unknown key, and settings
    one step outside their enum or range."""
    base = VALID[name]
    schema = schema_of(name)
    yield base
    for key in base:
        yield {k: v for k, v in base.items() if k != key}
    for key, prop in schema["properties"].items():
        types = prop["type"] if isinstance(prop["type"], list) else [prop["type"]]
        for json_type in types:
            wrong = WRONG[json_type]
            if not any(accepts({"type": t}, wrong) for t in types):
                yield {**base, key: wrong}
        if "enum" in prop:
            yield {**base, key: prop["enum"][0] + "x"}
        for bound, step in (("minimum", -1), ("maximum", 1)):
            if bound in prop:
                yield {**base, key: prop[bound] + step}
        if "minItems" in prop:
            yield {**base, key: []}
    yield {**base, "colour": "blue"}
    if name == "filter":
        yield {**base, "conditions": [{"field": "", "op": "eq", "value": 1}]}
        yield {**base, "conditions": [{"field": "age", "op": "near", "value": 1}]}
        yield {**base, "conditions": [{"field": "age", "op": "eq", "value": 1, "unit": "y"}]}
    if name == "transform":
        yield {**base, "extract": {"field": "email", "pattern": "@"}}


def test_the_list_is_every_registered_type_with_its_schema(api_client):
    response = api_client.get(URL)

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["next"] is None and body["previous"] is None
    listed = {item["name"]: item for item in body["results"]}
    assert list(listed) == list(NODE_TYPES)  # registration order: sources first
    assert set(VALID) == set(NODE_TYPES)
    for name, node_type in NODE_TYPES.items():
        item = listed[name]
        assert (item["title"], item["description"]) == (node_type.title, node_type.description)
        assert item["inputs"] == {"min": node_type.min_inputs, "max": node_type.max_inputs}
        assert set(item["config_schema"]["properties"]) == set(node_type.params)
        jsonschema.Draft202012Validator.check_schema(item["config_schema"])
    assert listed["merge"]["inputs"] == {"min": 2, "max": 2}
    assert listed["csv_upload"]["inputs"] == {"min": 0, "max": 0}
    combine = listed["filter"]["config_schema"]["properties"]["combine"]
    assert (combine["enum"], combine["default"]) == (["and", "or"], "and")
    assert listed["filter"]["config_schema"]["required"] == ["conditions"]
    assert listed["llm_inference"]["config_schema"]["properties"]["prompt"]["x-widget"] == "prompt"
    assert listed["llm_smart_filter"]["config_schema"]["properties"]["generated"]["readOnly"] is True


def test_the_list_needs_a_token(client):
    assert client.get(URL).status_code == 401


def test_a_newly_registered_type_is_listed_with_its_schema(api_client):
    class Shout(NodeType):
        name = "shout"
        title = "Shout"
        description = "Upper-cases a field."
        params = {"field": Param(str, required=True, doc="the field to upper-case", widget="field"),
                  "times": Param(int, default=1, schema={"minimum": 1})}

    register(Shout())
    try:
        listed = {item["name"]: item for item in api_client.get(URL).json()["results"]}
    finally:
        del NODE_TYPES["shout"]

    shout = listed["shout"]
    assert (shout["title"], shout["description"], shout["inputs"]) == ("Shout", "Upper-cases a field.",
                                                                      {"min": 1, "max": None})
    assert shout["config_schema"]["properties"] == {
        "field": {"type": "string", "description": "the field to upper-case", "x-widget": "field"},
        "times": {"type": "integer", "default": 1, "minimum": 1},
    }
    assert shout["config_schema"]["required"] == ["field"]
    assert shout["config_schema"]["additionalProperties"] is False


@pytest.mark.parametrize("name", sorted(VALID))
def test_the_schema_refuses_nothing_the_api_accepts_and_what_it_refuses_the_api_refuses(name):
    node_type, schema = NODE_TYPES[name], schema_of(name)
    refused = 0
    for config in variants(name):
        api_accepts = validate_params(node_type, copy.deepcopy(config)) == []
        schema_accepts = accepts(schema, config)
        assert not api_accepts or schema_accepts, (name, config)  # the form never blocks a valid config
        assert schema_accepts or not api_accepts, (name, config)
        refused += not schema_accepts
    assert validate_params(node_type, VALID[name]) == [] and accepts(schema, VALID[name])
    assert refused >= 2, name  # at least the unknown key and a mistyped setting


def test_the_schema_leaves_to_the_api_what_only_it_can_judge():
    pattern = {"extract": {"field": "email", "pattern": "(a)\\1", "into": "x"}}  # a backreference: not RE2
    assert accepts(schema_of("transform"), pattern)
    assert validate_params(NODE_TYPES["transform"], pattern)
    unsafe = {"url": "https://ada:secret@data.example.com/people.json"}  # a password the team could read
    assert accepts(schema_of("http_json"), unsafe)
    assert validate_params(NODE_TYPES["http_json"], unsafe)


def test_the_openapi_schema_has_the_node_types_list(api_client):
    schema = api_client.get("/api/v1/schema/", HTTP_ACCEPT="application/json").json()
    assert "get" in schema["paths"]["/api/v1/workflow-node-types/"]
