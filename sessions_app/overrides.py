"""What a kin may set for itself, and the allowed range of each: checked where a kin is
saved (the API's KinSerializer, the admin's kin form), so a value the code reads later
(introspection_settings) is never one that would run away (10**12 tool calls)."""
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

# The sections of Kin.overrides the code reads, each key with its rule. Other top-level keys
# are kept as given (free-form notes); unknown keys inside a known section are refused,
# since a misspelt setting would otherwise be silently ignored.
OVERRIDE_RULES = {
    "introspection": {
        "enabled": Boolean(),
        "turn_interval": IntegerRange(0, 1_000),  # completed turns; 0: no turn trigger
        "idle_timeout_minutes": IntegerRange(0, 7 * 24 * 60),  # 0: no idle trigger
        "max_tool_calls": IntegerRange(0, 100),  # per introspection run
        "model": OptionalText(200),  # null or empty: the kin's own model
    },
}


def overrides_errors(overrides) -> list[str]:
    """What is wrong with a kin's overrides, one message per problem naming its path
    ("introspection.max_tool_calls: must be ..."); empty when they are fine."""
    if not isinstance(overrides, dict):
        return ["must be a JSON object"]
    errors = []
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
