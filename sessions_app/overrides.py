"""What a kin may set for itself, and the allowed range of each: checked wherever a kin is
saved (KinSerializer, which the dashboard and kin import use, and the admin's form), so no
value read later runs away (10**12 tool calls) and a kin's row stays small."""
import json
from dataclasses import dataclass


@dataclass(frozen=True)
class IntegerRange:
    low: int
    high: int

    def error(self, value) -> str | None:
        if isinstance(value, int) and not isinstance(value, bool) and self.low <= value <= self.high:
            return None
        return f"must be a whole number from {self.low} to {self.high}"


@dataclass(frozen=True)
class Boolean:
    def error(self, value) -> str | None:
        return None if isinstance(value, bool) else "must be true or false"


@dataclass(frozen=True)
class OptionalText:
    max_chars: int

    def error(self, value) -> str | None:
        if value is None or (isinstance(value, str) and len(value) <= self.max_chars):
            return None
        return f"must be a text of at most {self.max_chars} characters, or null"


# The history budget of a kin (Kin.history_token_budget; empty: HISTORY_TOKEN_BUDGET).
HISTORY_TOKEN_BUDGET_RANGE = IntegerRange(1_000, 2_000_000)

# Kin.overrides as compact JSON (UTF-8), at most: every setting at its largest is a few
# hundred bytes, and the field is part of every kin in GET /kins/.
OVERRIDES_MAX_BYTES = 4_096

# The sections of Kin.overrides, each key with its rule. Unknown sections and keys are
# refused: a misspelt setting would otherwise be silently ignored.
OVERRIDE_RULES = {
    "introspection": {
        "enabled": Boolean(),
        "turn_interval": IntegerRange(0, 1_000),  # completed turns; 0: no turn trigger
        "idle_timeout_minutes": IntegerRange(0, 7 * 24 * 60),  # 0: no idle trigger
        "max_tool_calls": IntegerRange(0, 100),  # per introspection run
        "model": OptionalText(200),  # null or empty: the kin's own model
    },
}


def overrides_errors(overrides, *, stored=None) -> list[str]:
    """What is wrong with a kin's overrides, one message per problem naming its path
    ("introspection.max_tool_calls: must be ..."); empty when they are fine.

    `stored` is what the kin holds now (None for a new kin): an unknown top-level key stored
    before sections were checked may stay with exactly its value, so saving an old kin (the
    dashboard's form keeps keys it does not show) neither fails nor drops it; adding or
    changing one is refused. The size cap holds whatever the keys."""
    if not isinstance(overrides, dict):
        return ["must be a JSON object"]
    size = _compact_size(overrides)
    if size is None or size > OVERRIDES_MAX_BYTES:
        # Checked first and alone: 50,000 unknown keys make one message, not 50,000.
        found = "nested too deeply" if size is None else f"not {size:,}"
        return [f"must be at most {OVERRIDES_MAX_BYTES:,} bytes as compact JSON (OVERRIDES_MAX_BYTES), {found}"]
    stored = stored if isinstance(stored, dict) else {}
    errors = []
    for section, values in overrides.items():
        if section not in OVERRIDE_RULES and not _same_json(values, stored.get(section, _MISSING)):
            errors.append(f"{section}: unknown section; the sections are {', '.join(OVERRIDE_RULES)}")
    for section, rules in OVERRIDE_RULES.items():
        if section not in overrides:
            continue
        values = overrides[section]
        if not isinstance(values, dict):
            errors.append(f"{section}: must be a JSON object with any of {', '.join(rules)}")
            continue
        for key, value in values.items():
            rule = rules.get(key)
            if rule is None:
                errors.append(f"{section}.{key}: unknown setting; the settings are {', '.join(rules)}")
            elif (problem := rule.error(value)) is not None:
                errors.append(f"{section}.{key}: {problem}")
    return errors


_MISSING = object()


def _compact_size(value) -> int | None:
    """Bytes of `value` as compact UTF-8 JSON; None when it is nested too deeply to write
    (then it is far past the cap anyway)."""
    try:
        return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
    except RecursionError:
        return None


def _same_json(value, stored) -> bool:
    # As JSON, not as Python values: 1 == 1.0 == True in Python, but a client that turned
    # a stored 1 into true has changed it.
    if stored is _MISSING:
        return False
    return json.dumps(value, sort_keys=True) == json.dumps(stored, sort_keys=True)
