"""The node-type registry (SPEC §9): per node type a runner, a parameter schema checked
when a workflow is saved, and a describer that turns config and counts into one sentence.

Runners are plain functions over lists of records (dicts): `runner(ctx, config, inputs)`
where `inputs` holds one list of records per incoming data edge, in edge order. They raise
NodeError for a failure the user should read (the executor stores it on the node)."""
from __future__ import annotations

import csv
import io
import json
import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import re2
from django.conf import settings

from kinsite import netguard

logger = logging.getLogger(__name__)

Record = dict[str, Any]

CSV_MAX_CHARS = 5 * 1024 * 1024
INLINE_MAX_RECORDS = 10_000
# Each record is one model call; a typo'd upstream filter must not cost 50,000 calls.
LLM_DEFAULT_MAX_RECORDS = 200
LLM_MAX_RECORDS_LIMIT = 5_000
# The range OpenAI-compatible endpoints accept; outside it every call would come back a 400.
LLM_TEMPERATURE_RANGE = (0, 2)
# A prompt template is rendered once per record and sent as one message.
PROMPT_MAX_CHARS = 50_000
SMART_FILTER_SAMPLE_RECORDS = 3
# Numbers in filter conditions: a 64-bit integer's range. Past it a value is a mistake (or a
# probe), and an integer past a float's range (1e308) cannot be compared as a float.
CONDITION_NUMBER_LIMIT = 2**63 - 1
# Characters the CSV reader cannot use as a delimiter: they end rows or quote fields.
CSV_BAD_DELIMITERS = ("\n", "\r", '"')


class NodeError(Exception):
    """A node failed for a reason the user should read (bad input data, unreachable URL, …)."""


# --- the parameter schema ------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    kind: type | tuple[type, ...]
    required: bool = False
    choices: tuple[str, ...] = ()
    doc: str = ""


@dataclass
class RunContext:
    """What a runner may need beyond its config and inputs."""

    team: Any = None
    node: Any = None  # the workflows.models.Node being run
    lineage: Callable[[], str] = lambda: ""  # the node's lineage narrative (computed once, lazily)
    save_config: Callable[[dict], None] = lambda config: None  # smart filter stores its generated conditions


@dataclass(frozen=True)
class NodeType:
    name: str
    title: str
    runner: Callable[[RunContext, dict, list[list[Record]]], list[Record]]
    describer: Callable[[dict], str]  # the step, without counts or a final period
    params: dict[str, Param] = field(default_factory=dict)
    check: Callable[[dict], list[str]] | None = None  # deeper checks than the schema's
    min_inputs: int = 1
    max_inputs: int | None = None  # None: any number (their records are concatenated)


def validate_params(node_type: NodeType, config: Any) -> list[str]:
    """The problems with `config` for `node_type`, as readable messages ([] = valid)."""
    if not isinstance(config, dict):
        return ["config must be a JSON object."]
    errors = []
    for name in sorted(set(config) - set(node_type.params)):
        errors.append(f"unknown parameter '{name}' (allowed: {', '.join(sorted(node_type.params)) or 'none'}).")
    for name, param in node_type.params.items():
        if name not in config or config[name] is None:
            if param.required:
                errors.append(f"parameter '{name}' is required ({param.doc}).")
            continue
        value = config[name]
        kinds = param.kind if isinstance(param.kind, tuple) else (param.kind,)
        # bool is an int in Python; a number parameter given true is still a mistake.
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            expected = " or ".join(_KIND_NAMES.get(k, k.__name__) for k in kinds)
            errors.append(f"parameter '{name}' must be {expected}.")
        elif param.choices and value not in param.choices:
            errors.append(f"parameter '{name}' must be one of {', '.join(param.choices)}.")
    if not errors and node_type.check is not None:
        errors.extend(node_type.check(config))
    return errors


_KIND_NAMES = {str: "a string", int: "an integer", float: "a number", list: "a list", dict: "an object", bool: "a boolean"}


# --- helpers shared by the runners and describers ----------------------------------------------


def get_field(record: Record, path: str) -> Any:
    """record[path], or a dotted path into nested objects; None when absent."""
    if path in record:
        return record[path]
    value: Any = record
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def _has_field(record: Record, path: str) -> bool:
    return get_field(record, path) is not None


def _concat(inputs: list[list[Record]]) -> list[Record]:
    return [record for records in inputs for record in records]


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _quote(value: Any, limit: int = 60) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return f'"{text[: limit - 1]}…"' if len(text) > limit else f'"{text}"'


def _names(names: list[str], limit: int = 6) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _fields_of(records: list[Any]) -> list[str]:
    seen: dict[str, None] = {}
    for record in records[:50]:
        if isinstance(record, dict):
            seen.update(dict.fromkeys(record))
    return list(seen)


def _records_only(values: list[Any], what: str) -> list[Record]:
    bad = [i for i, value in enumerate(values) if not isinstance(value, dict)]
    if bad:
        raise NodeError(f"{what}: item {bad[0]} is not a JSON object; every record must be one.")
    return values


# --- sources -------------------------------------------------------------------------------


def _check_inline(config: dict) -> list[str]:
    records = config["records"]
    if len(records) > INLINE_MAX_RECORDS:
        return [f"'records' holds {len(records)} records; the limit is {INLINE_MAX_RECORDS}."]
    if any(not isinstance(record, dict) for record in records):
        return ["every item of 'records' must be a JSON object."]
    return []


def run_inline(ctx: RunContext, config: dict, inputs: list[list[Record]]) -> list[Record]:
    return [dict(record) for record in config["records"]]


def describe_inline(config: dict) -> str:
    records = config.get("records") or []
    fields = _fields_of(records)
    with_fields = f" with fields {_names(fields)}" if fields else ""
    return f"Provides {_plural(len(records), 'inline record')}{with_fields}"


def _parse_csv(config: dict) -> list[Record]:
    reader = csv.DictReader(io.StringIO(config["csv"]), delimiter=config.get("delimiter") or ",")
    try:
        return [{key: value for key, value in row.items() if key is not None} for row in reader]
    except csv.Error as exc:
        raise NodeError(f"The CSV could not be parsed: {exc}.")


def _check_csv(config: dict) -> list[str]:
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


def run_csv(ctx: RunContext, config: dict, inputs: list[list[Record]]) -> list[Record]:
    return _parse_csv(config)


def describe_csv(config: dict) -> str:
    text = config.get("csv") or ""
    header = next(csv.reader(io.StringIO(text), delimiter=config.get("delimiter") or ","), []) if text else []
    rows = max(len([line for line in text.splitlines() if line.strip()]) - 1, 0)
    columns = f" with columns {_names(header)}" if header else ""
    return f"Reads an uploaded CSV of {rows} rows{columns}"


def _check_http(config: dict) -> list[str]:
    problem = netguard.url_problem(config["url"])
    return [f"'url' {problem}."] if problem else []


def _fetch_json(url: str, *, ctx: RunContext) -> Any:
    """The JSON at `url`, fetched under the SSRF policy of the WORKFLOW_HTTP_* settings (read
    per call, so tests and operators may change them) and its time and size limits."""
    timeout, max_bytes = settings.WORKFLOW_HTTP_TIMEOUT_SECONDS, settings.WORKFLOW_HTTP_MAX_BYTES
    policy = netguard.Policy.build(settings.WORKFLOW_HTTP_ALLOWED_HOSTS,
                                   allow_private=settings.WORKFLOW_HTTP_ALLOW_PRIVATE)
    try:
        body = netguard.fetch(url, policy=policy, timeout=timeout, max_bytes=max_bytes,
                              headers={"Accept": "application/json"})
        return json.loads(body)
    # RecursionError: deeply nested JSON ("[[[[…") is an invalid body like any other.
    except (netguard.FetchError, ValueError, RecursionError) as exc:
        reason = exc if isinstance(exc, netguard.FetchError) else f"the body is not usable JSON: {exc!r:.200}"
        logger.warning("http_json fetch of %s refused or failed (team %s, node %s): %s", url,
                       getattr(ctx.team, "pk", None), getattr(ctx.node, "pk", None), reason)
        # One sentence for every refusal and failure: if a refused address, a closed port, a
        # timeout and a wrong answer read differently, the node becomes a port scanner (SPEC §13).
        raise NodeError(
            f"Could not fetch JSON from {url}: the address is not allowed or not reachable, or the answer was "
            f"an error, too slow, too large or not JSON (limits: {timeout:g} s, {max_bytes} bytes). "
            "The server log has the reason."
        ) from None


def run_http(ctx: RunContext, config: dict, inputs: list[list[Record]]) -> list[Record]:
    data = _fetch_json(config["url"], ctx=ctx)
    path = config.get("path") or ""
    if path:
        data = get_field(data, path) if isinstance(data, dict) else None
        if data is None:
            raise NodeError(f"The JSON from {config['url']} has nothing at path '{path}'.")
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise NodeError(f"The JSON from {config['url']} at path '{path or '(root)'}' is not a list of records.")
    # A list of plain values becomes one record per value.
    return [item if isinstance(item, dict) else {"value": item} for item in data]


def describe_http(config: dict) -> str:
    at_path = f" at path {config['path']}" if config.get("path") else ""
    return f"Fetches JSON from {config.get('url', '(no URL)')}{at_path}"


# --- filter --------------------------------------------------------------------------------

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
            errors.append(f"{where}: the number {_shorten(repr(out_of_range), 24)} is out of range; numbers must lie "
                          f"between -{CONDITION_NUMBER_LIMIT} and {CONDITION_NUMBER_LIMIT}.")
    if combine not in ("and", "or"):
        errors.append("'combine' must be 'and' or 'or'.")
    return errors


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 2] + "…"


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
            parts.append(f"{condition.get('field')} {OP_WORDS.get(op, op)} {_quote(condition.get('value'), 40)}")
    return f" {combine} ".join(parts) or "(no conditions)"


def _check_filter(config: dict) -> list[str]:
    return check_conditions(config["conditions"], config.get("combine") or "and")


def run_filter(ctx: RunContext, config: dict, inputs: list[list[Record]]) -> list[Record]:
    return apply_conditions(_concat(inputs), config["conditions"], config.get("combine") or "and")


def describe_filter(config: dict) -> str:
    where = describe_conditions(config.get("conditions") or [], config.get("combine") or "and")
    return f"Keeps records where {where}"


# --- transform -----------------------------------------------------------------------------


# Patterns come from users and run over other people's data, so they run on RE2: matching
# takes time linear in the text, whatever the pattern (Python's re backtracks, and a pattern
# like (a+)+$ holds a worker for hours). RE2 has no backreferences or lookaround.
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a refused pattern is the user's 400, not a line in the server log
# RE2's errors for what it leaves out on purpose, worded for the user (RE2 names the syntax
# it refused, not the feature): (error prefix, feature).
_RE2_UNSUPPORTED = (
    (re.compile(r"invalid escape sequence: \\[1-9]"), "a backreference"),
    (re.compile(r"invalid perl operator: \(\?(=|!|<=|<!)"), "lookaround"),
    (re.compile(r"invalid perl operator: \(\?>|bad repetition operator: [*+?]\+"),
     "an atomic group or a possessive quantifier"),
)


def compile_pattern(pattern: str):
    """The pattern compiled for linear-time matching (RE2); re2.error if it cannot be."""
    return re2.compile(pattern, options=_RE2_OPTIONS)


def pattern_problem(pattern: str) -> str:
    """Why `pattern` cannot be used (a sentence after the pattern), or "" when it can."""
    try:
        compile_pattern(pattern)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        for refused, feature in _RE2_UNSUPPORTED:
            if refused.match(reason):
                return (f"is not supported: it uses {feature} ({reason}); patterns run on RE2, which matches in "
                        "linear time and so has no backreferences, lookaround or atomic groups.")
        return f"is not a valid regular expression ({reason})."
    return ""


def _extractions(config: dict) -> list[dict]:
    extract = config.get("extract") or []
    return [extract] if isinstance(extract, dict) else extract


def _check_transform(config: dict) -> list[str]:
    errors = []
    rename = config.get("rename") or {}
    if any(not isinstance(k, str) or not isinstance(v, str) or not v for k, v in rename.items()):
        errors.append("'rename' must map field names to new field names (strings).")
    for index, item in enumerate(_extractions(config)):
        where = f"extract {index + 1}"
        if not isinstance(item, dict) or not all(isinstance(item.get(k), str) and item.get(k) for k in ("field", "pattern", "into")):
            errors.append(f"{where} must be an object {{field, pattern, into}} of non-empty strings.")
            continue
        problem = pattern_problem(item["pattern"])
        if problem:
            errors.append(f"{where}: pattern {item['pattern']!r} {problem}")
    if not rename and not _extractions(config):
        errors.append("give 'rename' and/or 'extract'.")
    return errors


def run_transform(ctx: RunContext, config: dict, inputs: list[list[Record]]) -> list[Record]:
    rename = config.get("rename") or {}
    extractions = [(item, compile_pattern(item["pattern"])) for item in _extractions(config)]
    out = []
    for record in _concat(inputs):
        record = {rename.get(key, key): value for key, value in record.items()}
        for item, pattern in extractions:
            value = get_field(record, item["field"])
            match = pattern.search(value if isinstance(value, str) else "" if value is None else str(value))
            # The first group when the pattern has one (the part the user marked), else the whole match.
            record[item["into"]] = (match.group(1) if pattern.groups else match.group(0)) if match else None
        out.append(record)
    return out


def describe_transform(config: dict) -> str:
    parts = []
    rename = config.get("rename") or {}
    if rename:
        parts.append("renames " + ", ".join(f"{old} → {new}" for old, new in list(rename.items())[:6]))
    for item in _extractions(config)[:4]:
        if isinstance(item, dict):
            parts.append(
                f"extracts {item.get('into')} from {item.get('field')} with pattern {_quote(item.get('pattern', ''), 40)}"
            )
    what = " and ".join(parts) or "changes nothing"
    return what[0].upper() + what[1:]


# --- deduplicate ---------------------------------------------------------------------------


def _dedupe_fields(config: dict) -> list[str]:
    fields = config.get("fields")
    return [fields] if isinstance(fields, str) else list(fields or [])


def _check_dedupe(config: dict) -> list[str]:
    fields = _dedupe_fields(config)
    if not fields or any(not isinstance(f, str) or not f for f in fields):
        return ["'fields' must name at least one field (a string or a list of strings)."]
    return []


def _key(value: Any) -> str:
    # JSON text, so that unhashable values (lists, objects) still compare.
    return json.dumps(value, sort_keys=True, default=str)


def run_dedupe(ctx: RunContext, config: dict, inputs: list[list[Record]]) -> list[Record]:
    fields = _dedupe_fields(config)
    seen, out = set(), []
    for record in _concat(inputs):
        key = tuple(_key(get_field(record, f)) for f in fields)
        if key not in seen:
            seen.add(key)
            out.append(record)
    return out


def describe_dedupe(config: dict) -> str:
    return f"Removes duplicates by {_names(_dedupe_fields(config))}, keeping the first of each"


# --- merge / join --------------------------------------------------------------------------


def run_merge(ctx: RunContext, config: dict, inputs: list[list[Record]]) -> list[Record]:
    left, right = inputs
    key, how = config["key"], config.get("how") or "inner"
    by_key: dict[str, list[Record]] = {}
    for record in right:
        value = get_field(record, key)
        if value is not None:
            by_key.setdefault(_key(value), []).append(record)
    out = []
    for record in left:
        value = get_field(record, key)
        matches = by_key.get(_key(value), []) if value is not None else []
        # The left side's values win on a name clash: it is the stream being enriched.
        out.extend({**match, **record} for match in matches)
        if not matches and how == "left":
            out.append(dict(record))
    return out


def describe_merge(config: dict) -> str:
    how = config.get("how") or "inner"
    article = "an" if how[:1] in "aeiou" else "a"
    return f"Joins its two inputs on {config.get('key')} with {article} {how} join"


# --- LLM inference per record --------------------------------------------------------------

TOKEN = re.compile(r"\{\{\s*([A-Za-z_][\w.]*)\s*\}\}")
LINEAGE_TOKEN = "_lineage"


def template_errors(template: str) -> list[str]:
    leftover = TOKEN.sub("", template)
    # The first stray "{{" or "}}", shown up to its closing braces: found with str.find, since
    # a lazy regex retried from every "{{" is quadratic in a long line of them.
    starts = [at for at in (leftover.find("{{"), leftover.find("}}")) if at != -1]
    if not starts:
        return []
    start = min(starts)
    end = leftover.find("}}", start + 2) if leftover.startswith("{{", start) else -1
    newline = leftover.find("\n", start)
    bad = leftover[start: end + 2] if end != -1 and (newline == -1 or end < newline) else leftover[start: start + 2]
    bad = _shorten(bad, 24)
    return [f"'prompt' has a malformed placeholder {bad!r}; use {{{{field}}}} or {{{{_lineage}}}}."]


def render_template(template: str, record: Record, lineage: Callable[[], str]) -> str:
    def value(match: re.Match) -> str:
        name = match.group(1)
        if name == LINEAGE_TOKEN:
            return lineage()
        found = get_field(record, name)
        if found is None:
            return ""
        return found if isinstance(found, str) else json.dumps(found, ensure_ascii=False)

    return TOKEN.sub(value, template)


def _check_inference(config: dict) -> list[str]:
    if len(config["prompt"]) > PROMPT_MAX_CHARS:
        return [f"'prompt' is {len(config['prompt'])} characters; the limit is {PROMPT_MAX_CHARS}."]
    errors = template_errors(config["prompt"])
    if not config["prompt"].strip():
        errors.append("'prompt' is empty.")
    limit = _max_records(config)
    if not 1 <= limit <= LLM_MAX_RECORDS_LIMIT:
        errors.append(f"'max_records' must be between 1 and {LLM_MAX_RECORDS_LIMIT}.")
    temperature = config.get("temperature")
    low, high = LLM_TEMPERATURE_RANGE
    if temperature is not None and not low <= temperature <= high:
        errors.append(f"'temperature' must be between {low} and {high}.")
    return errors


def _max_records(config: dict) -> int:
    limit = config.get("max_records")
    return LLM_DEFAULT_MAX_RECORDS if limit is None else limit


def run_inference(ctx: RunContext, config: dict, inputs: list[list[Record]]) -> list[Record]:
    from kinsite.llm.gateway import llm_chat

    records = _concat(inputs)
    limit = _max_records(config)
    if len(records) > limit:
        raise NodeError(
            f"{len(records)} records would mean {len(records)} model calls; this node allows {limit} "
            "(raise its max_records or filter upstream)."
        )
    output_field = config.get("output_field") or "llm_output"
    messages_prefix = [{"role": "system", "content": config["system"]}] if config.get("system") else []
    out = []
    for record in records:
        prompt = render_template(config["prompt"], record, ctx.lineage)
        result = llm_chat(
            purpose="workflow_inference",
            messages=[*messages_prefix, {"role": "user", "content": prompt}],
            team=ctx.team,
            temperature=config.get("temperature"),
        )
        out.append({**record, output_field: (result.content or "").strip()})
    return out


def describe_inference(config: dict) -> str:
    return (
        f"Asks the model once per record with the prompt {_quote(config.get('prompt', ''), 100)} "
        f"and writes the answer to {config.get('output_field') or 'llm_output'}"
    )


# --- LLM smart filter ----------------------------------------------------------------------

SMART_FILTER_SYSTEM = (
    "You turn a plain-language instruction into filter conditions over JSON records. "
    "Answer with one JSON object: {\"conditions\": [{\"field\": str, \"op\": one of "
    + ", ".join(OPS)
    + ", \"value\": any}], \"combine\": \"and\" or \"or\", \"explanation\": one sentence}. "
    "Use only field names that occur in the records. 'in' takes a list; 'exists' takes true or false."
)


def _check_smart_filter(config: dict) -> list[str]:
    if not config["instruction"].strip():
        return ["'instruction' is empty."]
    return []


def _generated_conditions(ctx: RunContext, config: dict, records: list[Record]) -> dict:
    """The conditions for the instruction: reused while the instruction is unchanged, else asked for."""
    from kinsite.llm.gateway import llm_chat

    generated = config.get("generated")
    if (
        isinstance(generated, dict)
        and generated.get("instruction") == config["instruction"]
        and not check_conditions(generated.get("conditions"), generated.get("combine", "and"))
    ):
        return generated
    sample = json.dumps(records[:SMART_FILTER_SAMPLE_RECORDS], ensure_ascii=False, default=str)[:3000]
    user = (
        f"Instruction: {config['instruction']}\n"
        f"Fields: {', '.join(_fields_of(records)) or '(no records yet)'}\n"
        f"Sample records: {sample}"
    )
    result = llm_chat(
        purpose="workflow_smart_filter",
        messages=[{"role": "system", "content": SMART_FILTER_SYSTEM}, {"role": "user", "content": user}],
        team=ctx.team,
        json_mode=True,
    )
    try:
        answer = result.json()
    except ValueError:
        raise NodeError("The model's answer was not JSON.")
    if not isinstance(answer, dict):
        raise NodeError("The model's answer was not a JSON object of conditions.")
    combine = answer.get("combine") or "and"
    problems = check_conditions(answer.get("conditions"), combine)
    if problems:
        raise NodeError(f"The model's conditions are unusable: {' '.join(problems)}")
    generated = {
        "instruction": config["instruction"],
        "conditions": answer["conditions"],
        "combine": combine,
        "explanation": str(answer.get("explanation") or "")[:1000],
    }
    ctx.save_config({**config, "generated": generated})
    return generated


def run_smart_filter(ctx: RunContext, config: dict, inputs: list[list[Record]]) -> list[Record]:
    records = _concat(inputs)
    generated = _generated_conditions(ctx, config, records)
    return apply_conditions(records, generated["conditions"], generated["combine"])


def describe_smart_filter(config: dict) -> str:
    generated = config.get("generated") or {}
    conditions = ""
    if isinstance(generated, dict) and generated.get("conditions"):
        conditions = f", which the model read as {describe_conditions(generated['conditions'], generated.get('combine') or 'and')}"
    return (
        f"Filters by the instruction {_quote(config.get('instruction', ''))}{conditions}"
    )


# --- table output --------------------------------------------------------------------------


def run_table(ctx: RunContext, config: dict, inputs: list[list[Record]]) -> list[Record]:
    return _concat(inputs)


def describe_table(config: dict) -> str:
    columns = config.get("columns") or []
    with_columns = f" with columns {_names(columns)}" if columns else ""
    return f"Shows the records as a table{with_columns}"


# --- the registry --------------------------------------------------------------------------

NODE_TYPES: dict[str, NodeType] = {
    t.name: t
    for t in [
        NodeType(
            "inline_records", "Inline records", run_inline, describe_inline,
            {"records": Param(list, required=True, doc="a list of JSON objects")},
            _check_inline, min_inputs=0, max_inputs=0,
        ),
        NodeType(
            "csv_upload", "CSV upload", run_csv, describe_csv,
            {"csv": Param(str, required=True, doc="the CSV text, header row first"), "delimiter": Param(str)},
            _check_csv, min_inputs=0, max_inputs=0,
        ),
        NodeType(
            "http_json", "JSON over HTTP", run_http, describe_http,
            {"url": Param(str, required=True, doc="an http(s) URL answering JSON"), "path": Param(str)},
            _check_http, min_inputs=0, max_inputs=0,
        ),
        NodeType(
            "filter", "Filter", run_filter, describe_filter,
            {
                "conditions": Param(list, required=True, doc="a list of {field, op, value}"),
                "combine": Param(str, choices=("and", "or")),
            },
            _check_filter,
        ),
        NodeType(
            "transform", "Transform", run_transform, describe_transform,
            {"rename": Param(dict), "extract": Param((dict, list))},
            _check_transform,
        ),
        NodeType(
            "deduplicate", "Deduplicate", run_dedupe, describe_dedupe,
            {"fields": Param((str, list), required=True, doc="the field or fields that identify a duplicate")},
            _check_dedupe,
        ),
        NodeType(
            "merge", "Merge / join", run_merge, describe_merge,
            {"key": Param(str, required=True, doc="the field both inputs share"), "how": Param(str, choices=("inner", "left"))},
            min_inputs=2, max_inputs=2,
        ),
        NodeType(
            "llm_inference", "LLM inference", run_inference, describe_inference,
            {
                "prompt": Param(str, required=True, doc="a template with {{field}} and {{_lineage}} tokens"),
                "output_field": Param(str),
                "system": Param(str),
                "temperature": Param((int, float)),
                "max_records": Param(int),
            },
            _check_inference,
        ),
        NodeType(
            "llm_smart_filter", "LLM smart filter", run_smart_filter, describe_smart_filter,
            {"instruction": Param(str, required=True, doc="what to keep, in plain language"), "generated": Param(dict)},
            _check_smart_filter,
        ),
        NodeType(
            "table_output", "Table output", run_table, describe_table,
            {"columns": Param(list)},
        ),
    ]
}


def get_node_type(name: str) -> NodeType | None:
    return NODE_TYPES.get(name)


def describe_step(node_type: str, config: Any, *, label: str = "") -> str:
    """What the node does, without counts (lineage appends its own): its type's describer,
    or the generic one for unknown types and for a stored config the describer cannot read."""
    known = NODE_TYPES.get(node_type)
    if known is not None and isinstance(config, dict):
        try:
            return known.describer(config)
        except Exception:  # a config saved before a schema change must not break lineage
            pass
    name = f'"{label}"' if label else "A node"
    known_word = "" if known is not None else "unknown "
    return f"{name} of {known_word}type {node_type}"


def describe(node_type: str, config: Any, *, label: str = "", records_in: int | None = None,
             records_out: int | None = None) -> str:
    """One sentence about a node: what it does, with its parameters, and its record counts."""
    step = describe_step(node_type, config, label=label)
    if records_out is None:
        return f"{step} (not run yet)."
    if node_type == "table_output" and step.startswith("Shows the records"):
        return step.replace("the records", _plural(records_out, "row"), 1) + "."
    if records_in is None:
        return f"{step} ({_plural(records_out, 'record')} out)."
    return f"{step} ({records_in} in, {records_out} out)."
