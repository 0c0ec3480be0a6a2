"""Nodes that keep some records and drop others: filter (conditions over fields) and
deduplicate. The conditions are shared with the LLM smart filter, which generates them."""
from __future__ import annotations

import math
from typing import Any

from workflows.nodes.base import (
    NodeType,
    Param,
    Record,
    RunContext,
    concat,
    get_field,
    json_key,
    names,
    quote,
    shorten,
)

# Numbers in filter conditions: a 64-bit integer's range. Past it a value is a mistake (or a
# probe), and an integer past a float's range (1e308) cannot be compared as a float.
CONDITION_NUMBER_LIMIT = 2**63 - 1

OPS = ("eq", "ne", "gt", "gte", "lt", "lte", "contains", "in", "exists")
OP_WORDS = {
    "eq": "=", "ne": "≠", "gt": ">", "gte": "≥", "lt": "<", "lte": "≤",
    "contains": "contains", "in": "in", "exists": "exists",
}


def check_conditions(conditions: Any, combine: Any = "and") -> list[str]:
    if not isinstance(conditions, list) or not conditions:
        return ["'conditions' must be a non-empty list of {field, op, value}."]
    errors = []
    for index, condition in enumerate(conditions):
        where = f"condition {index + 1}"
        if not isinstance(condition, dict):
            errors.append(f"{where} must be an object {{field, op, value}}.")
            continue
        unknown = set(condition) - {"field", "op", "value"}
        if unknown:
            errors.append(f"{where} has unknown keys: {', '.join(sorted(unknown))}.")
        if not isinstance(condition.get("field"), str) or not condition.get("field"):
            errors.append(f"{where} needs a 'field' (a string).")
        op = condition.get("op")
        if op not in OPS:
            errors.append(f"{where} has op {op!r}; allowed: {', '.join(OPS)}.")
        elif op == "in" and not isinstance(condition.get("value"), list):
            errors.append(f"{where}: op 'in' needs a list as 'value'.")
        elif op != "exists" and "value" not in condition:
            errors.append(f"{where}: op '{op}' needs a 'value'.")
        out_of_range = _out_of_range_number(condition.get("value"))
        if out_of_range is not None:
            errors.append(f"{where}: the number {shorten(repr(out_of_range), 24)} is out of range; numbers must lie "
                          f"between -{CONDITION_NUMBER_LIMIT} and {CONDITION_NUMBER_LIMIT}.")
    if combine not in ("and", "or"):
        errors.append("'combine' must be 'and' or 'or'.")
    return errors


def _out_of_range_number(value: Any) -> int | float | None:
    """The first number in a condition's value (or its 'in' list) outside ±CONDITION_NUMBER_LIMIT."""
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, (int, float)) and not isinstance(item, bool) and abs(item) > CONDITION_NUMBER_LIMIT:
            return item
    return None


def _number(value: Any) -> int | float | None:
    """The value as a number, or None. Integers stay integers: Python compares int and float
    exactly, whereas float() rounds past 2**53 and overflows past 1e308. NaN is no number
    (it is neither less, equal nor greater, so it would compare "equal" to everything)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text)
        except ValueError:  # not an integer, or more digits than int() reads
            pass
        try:
            value = float(text)
        except ValueError:
            return None
    if isinstance(value, float):
        return None if math.isnan(value) else value
    return None


def _compare(actual: Any, expected: Any) -> int | None:
    """-1/0/1 comparing numbers as numbers (CSV values are strings), else strings; None if incomparable."""
    a, b = _number(actual), _number(expected)
    if a is None or b is None:
        if actual is None or expected is None:
            return None
        a, b = str(actual), str(expected)
    return (a > b) - (a < b)


def condition_matches(record: Record, condition: dict) -> bool:
    op, path, expected = condition["op"], condition["field"], condition.get("value")
    actual = get_field(record, path)
    if op == "exists":
        return (actual is not None) == (expected is not False)
    if op in ("eq", "ne"):
        equal = actual == expected or (_compare(actual, expected) == 0 and actual is not None)
        return equal if op == "eq" else not equal
    if op == "contains":
        if isinstance(actual, str):
            return str(expected).lower() in actual.lower()
        return isinstance(actual, list) and expected in actual
    if op == "in":
        return actual in expected or any(_compare(actual, option) == 0 for option in expected)
    order = _compare(actual, expected)
    if order is None:
        return False
    return {"gt": order > 0, "gte": order >= 0, "lt": order < 0, "lte": order <= 0}[op]


def apply_conditions(records: list[Record], conditions: list[dict], combine: str) -> list[Record]:
    test = all if combine == "and" else any
    return [record for record in records if test(condition_matches(record, c) for c in conditions)]


def describe_conditions(conditions: list[dict], combine: str) -> str:
    parts = []
    for condition in conditions or []:
        if not isinstance(condition, dict):
            continue
        op = condition.get("op")
        if op == "exists":
            negated = condition.get("value") is False
            parts.append(f"{condition.get('field')} {'is missing' if negated else 'exists'}")
        else:
            parts.append(f"{condition.get('field')} {OP_WORDS.get(op, op)} {quote(condition.get('value'), 40)}")
    return f" {combine} ".join(parts) or "(no conditions)"


class Filter(NodeType):
    name = "filter"
    title = "Filter"
    description = "Keeps the records that meet its conditions (all of them, or any)."
    params = {
        "conditions": Param(list, required=True, doc="a list of {field, op, value}", widget="conditions", schema={
            "minItems": 1,
            "items": {"type": "object", "required": ["field", "op"], "additionalProperties": False, "properties": {
                "field": {"type": "string", "minLength": 1, "x-widget": "field"},
                "op": {"enum": list(OPS)},
                "value": {"description": "what the field is compared with; a list for 'in', none for 'exists'"},
            }},
        }),
        "combine": Param(str, choices=("and", "or"), doc="whether all conditions must hold or any", default="and"),
    }

    def check(self, config: dict) -> list[str]:
        return check_conditions(config["conditions"], config.get("combine") or "and")

    def run(self, ctx: RunContext, config: dict, inputs: list[list[Record]]) -> list[Record]:
        return apply_conditions(concat(inputs), config["conditions"], config.get("combine") or "and")

    def describe(self, config: dict) -> str:
        where = describe_conditions(config.get("conditions") or [], config.get("combine") or "and")
        return f"Keeps records where {where}"


def _dedupe_fields(config: dict) -> list[str]:
    fields = config.get("fields")
    return [fields] if isinstance(fields, str) else list(fields or [])


class Deduplicate(NodeType):
    name = "deduplicate"
    title = "Deduplicate"
    description = "Keeps the first record of each group with the same values in the given fields."
    params = {"fields": Param((str, list), required=True, doc="the field or fields that identify a duplicate",
                              widget="fields",
                              schema={"minLength": 1, "minItems": 1, "items": {"type": "string", "minLength": 1}})}

    def check(self, config: dict) -> list[str]:
        fields = _dedupe_fields(config)
        if not fields or any(not isinstance(f, str) or not f for f in fields):
            return ["'fields' must name at least one field (a string or a list of strings)."]
        return []

    def run(self, ctx: RunContext, config: dict, inputs: list[list[Record]]) -> list[Record]:
        fields = _dedupe_fields(config)
        seen, out = set(), []
        for record in concat(inputs):
            key = tuple(json_key(get_field(record, f)) for f in fields)
            if key not in seen:
                seen.add(key)
                out.append(record)
        return out

    def describe(self, config: dict) -> str:
        return f"Removes duplicates by {names(_dedupe_fields(config))}, keeping the first of each"
