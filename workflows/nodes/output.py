"""The table_output node: the records as a table (it passes them through)."""
from __future__ import annotations

from workflows.nodes.base import NodeType, Param, Record, RunContext, concat, names, plural


class TableOutput(NodeType):
    name = "table_output"
    title = "Table output"
    description = "Shows its records as a table (and passes them on unchanged)."
    params = {"columns": Param(list, doc="the columns to show, in order; empty for every field", widget="fields")}

    def run(self, ctx: RunContext, config: dict, inputs: list[list[Record]]) -> list[Record]:
        return concat(inputs)

    def describe(self, config: dict) -> str:
        columns = config.get("columns") or []
        with_columns = f" with columns {names(columns)}" if columns else ""
        return f"Shows the records as a table{with_columns}"

    def sentence(self, step: str, *, records_in: int | None, records_out: int) -> str:
        # A table counts rows, not records in and out; a step the describer could not
        # write (the generic sentence) keeps the generic counts.
        if step.startswith("Shows the records"):
            return step.replace("the records", plural(records_out, "row"), 1) + "."
        return super().sentence(step, records_in=records_in, records_out=records_out)
