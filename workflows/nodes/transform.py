"""The transform node: renames fields and extracts parts of values with patterns that run
on RE2 (linear time, whatever the pattern)."""
from __future__ import annotations

import re

import re2

from workflows.nodes.base import NodeType, Param, Record, RunContext, concat, get_field, quote

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


# The JSON Schema of one extraction's keys.
_EXTRACTION = {
    "field": {"type": "string", "minLength": 1, "x-widget": "field"},
    "pattern": {"type": "string", "minLength": 1, "description": "a regular expression (RE2 syntax)"},
    "into": {"type": "string", "minLength": 1},
}


def _extractions(config: dict) -> list[dict]:
    extract = config.get("extract") or []
    return [extract] if isinstance(extract, dict) else extract


class Transform(NodeType):
    name = "transform"
    title = "Transform"
    description = "Renames fields and extracts parts of values into new fields with regular expressions (RE2)."
    params = {
        "rename": Param(dict, doc="old field name → new field name",
                        schema={"additionalProperties": {"type": "string", "minLength": 1}}),
        "extract": Param((dict, list), doc="one or a list of {field, pattern, into}: the pattern's first group "
                         "(or whole match) of the field's value goes into the field `into`", schema={
                             "required": ["field", "pattern", "into"], "properties": _EXTRACTION,
                             "items": {"type": "object", "required": ["field", "pattern", "into"],
                                       "properties": _EXTRACTION}}),
    }

    def check(self, config: dict) -> list[str]:
        errors = []
        rename = config.get("rename") or {}
        if any(not isinstance(k, str) or not isinstance(v, str) or not v for k, v in rename.items()):
            errors.append("'rename' must map field names to new field names (strings).")
        keys = ("field", "pattern", "into")
        for index, item in enumerate(_extractions(config)):
            where = f"extract {index + 1}"
            if not isinstance(item, dict) or not all(isinstance(item.get(k), str) and item.get(k) for k in keys):
                errors.append(f"{where} must be an object {{field, pattern, into}} of non-empty strings.")
                continue
            problem = pattern_problem(item["pattern"])
            if problem:
                errors.append(f"{where}: pattern {item['pattern']!r} {problem}")
        if not rename and not _extractions(config):
            errors.append("give 'rename' and/or 'extract'.")
        return errors

    def run(self, ctx: RunContext, config: dict, inputs: list[list[Record]]) -> list[Record]:
        rename = config.get("rename") or {}
        extractions = [(item, compile_pattern(item["pattern"])) for item in _extractions(config)]
        out = []
        for record in concat(inputs):
            record = {rename.get(key, key): value for key, value in record.items()}
            for item, pattern in extractions:
                value = get_field(record, item["field"])
                match = pattern.search(value if isinstance(value, str) else "" if value is None else str(value))
                # The first group when the pattern has one (the part the user marked), else the whole match.
                record[item["into"]] = (match.group(1) if pattern.groups else match.group(0)) if match else None
            out.append(record)
        return out

    def describe(self, config: dict) -> str:
        parts = []
        rename = config.get("rename") or {}
        if rename:
            parts.append("renames " + ", ".join(f"{old} → {new}" for old, new in list(rename.items())[:6]))
        for item in _extractions(config)[:4]:
            if isinstance(item, dict):
                pattern = quote(item.get("pattern", ""), 40)
                parts.append(f"extracts {item.get('into')} from {item.get('field')} with pattern {pattern}")
        what = " and ".join(parts) or "changes nothing"
        return what[0].upper() + what[1:]
