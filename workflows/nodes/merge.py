"""The merge node: joins two inputs on a shared key field."""
from __future__ import annotations

from workflows.nodes.base import NodeType, Param, Record, RunContext, get_field, json_key


class Merge(NodeType):
    name = "merge"
    title = "Merge / join"
    description = "Joins its two inputs on a field they share; the first input's values win on a clash."
    params = {
        "key": Param(str, required=True, doc="the field both inputs share", widget="field"),
        "how": Param(str, choices=("inner", "left"), default="inner",
                     doc="inner keeps matched records only; left also keeps the first input's unmatched ones"),
    }
    min_inputs, max_inputs = 2, 2

    def run(self, ctx: RunContext, config: dict, inputs: list[list[Record]]) -> list[Record]:
        left, right = inputs
        key, how = config["key"], config.get("how") or "inner"
        by_key: dict[str, list[Record]] = {}
        for record in right:
            value = get_field(record, key)
            if value is not None:
                by_key.setdefault(json_key(value), []).append(record)
        out = []
        for record in left:
            value = get_field(record, key)
            matches = by_key.get(json_key(value), []) if value is not None else []
            # The left side's values win on a name clash: it is the stream being enriched.
            out.extend({**match, **record} for match in matches)
            if not matches and how == "left":
                out.append(dict(record))
        return out

    def describe(self, config: dict) -> str:
        how = config.get("how") or "inner"
        article = "an" if how[:1] in "aeiou" else "a"
        return f"Joins its two inputs on {config.get('key')} with {article} {how} join"
