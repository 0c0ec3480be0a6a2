"""What the node-type tests share: a few people as records, and a runner that checks the
config against the schema first."""
from workflows.nodes.base import RunContext, validate_params
from workflows.nodes.registry import NODE_TYPES

PEOPLE = [
    {"id": 1, "name": "Ada", "city": "London", "age": 36, "email": "ada@example.org"},
    {"id": 2, "name": "Bo", "city": "Paris", "age": "17", "email": "bo@example.org"},
    {"id": 3, "name": "Cy", "city": "Paris", "age": 52, "email": "ada@example.org"},
]


def run(node_type, config, *inputs, ctx=None):
    assert validate_params(NODE_TYPES[node_type], config) == []
    return NODE_TYPES[node_type].run(ctx or RunContext(), config, list(inputs))
