"""Source nodes that hold their records in their config: inline records and a CSV upload."""
from __future__ import annotations

import csv
import io

from workflows.nodes.base import NodeError, NodeType, Param, Record, RunContext, fields_of, names, plural

INLINE_MAX_RECORDS = 10_000
CSV_MAX_CHARS = 5 * 1024 * 1024
# Characters the CSV reader cannot use as a delimiter: they end rows or quote fields.
CSV_BAD_DELIMITERS = ("\n", "\r", '"')


class InlineRecords(NodeType):
    name = "inline_records"
    title = "Inline records"
    description = "Provides records written into the node itself, as a list of JSON objects."
    params = {"records": Param(list, required=True, doc="a list of JSON objects",
                               schema={"items": {"type": "object"}, "maxItems": INLINE_MAX_RECORDS})}
    min_inputs, max_inputs = 0, 0

    def check(self, config: dict) -> list[str]:
        records = config["records"]
        if len(records) > INLINE_MAX_RECORDS:
            return [f"'records' holds {len(records)} records; the limit is {INLINE_MAX_RECORDS}."]
        if any(not isinstance(record, dict) for record in records):
            return ["every item of 'records' must be a JSON object."]
        return []

    def run(self, ctx: RunContext, config: dict, inputs: list[list[Record]]) -> list[Record]:
        return [dict(record) for record in config["records"]]

    def describe(self, config: dict) -> str:
        records = config.get("records") or []
        fields = fields_of(records)
        with_fields = f" with fields {names(fields)}" if fields else ""
        return f"Provides {plural(len(records), 'inline record')}{with_fields}"


class CsvUpload(NodeType):
    name = "csv_upload"
    title = "CSV upload"
    description = "Provides the rows of a CSV text (header row first) as records."
    params = {
        "csv": Param(str, required=True, doc="the CSV text, header row first", widget="csv",
                     schema={"maxLength": CSV_MAX_CHARS}),
        "delimiter": Param(str, doc="the character between fields", default=",",
                           schema={"minLength": 1, "maxLength": 1}),
    }
    min_inputs, max_inputs = 0, 0

    def check(self, config: dict) -> list[str]:
        errors = []
        if len(config["csv"]) > CSV_MAX_CHARS:
            errors.append(f"'csv' is {len(config['csv'])} characters; the limit is {CSV_MAX_CHARS}.")
        delimiter = config.get("delimiter")
        if delimiter is not None and len(delimiter) != 1:
            errors.append("'delimiter' must be one character.")
        elif delimiter in CSV_BAD_DELIMITERS:
            errors.append("'delimiter' cannot be a line break or a quote; use , ; | or a tab.")
        if not config["csv"].strip():
            errors.append("'csv' is empty; it needs a header row.")
        return errors

    def run(self, ctx: RunContext, config: dict, inputs: list[list[Record]]) -> list[Record]:
        reader = csv.DictReader(io.StringIO(config["csv"]), delimiter=config.get("delimiter") or ",")
        try:
            return [{key: value for key, value in row.items() if key is not None} for row in reader]
        except csv.Error as exc:
            raise NodeError(f"The CSV could not be parsed: {exc}.") from exc

    def describe(self, config: dict) -> str:
        text = config.get("csv") or ""
        header = next(csv.reader(io.StringIO(text), delimiter=config.get("delimiter") or ","), []) if text else []
        rows = max(len([line for line in text.splitlines() if line.strip()]) - 1, 0)
        columns = f" with columns {names(header)}" if header else ""
        return f"Reads an uploaded CSV of {rows} rows{columns}"
