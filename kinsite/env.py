"""Typed readers for environment variables; settings.py is their only caller. A value that
is not of its type stops the start with ImproperlyConfigured naming the variable, rather
than being read as the default ("ture" is not false)."""
import os

from django.core.exceptions import ImproperlyConfigured

TRUE_WORDS = {"1", "true", "yes", "on"}
FALSE_WORDS = {"0", "false", "no", "off"}


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ImproperlyConfigured(
        f"{name}={raw!r} is not a yes/no value: use one of {', '.join(sorted(TRUE_WORDS | FALSE_WORDS))}."
    )


def env_int(name: str, default: int) -> int:
    return _number(name, default, int, "a whole number")


def env_float(name: str, default: float) -> float:
    return _number(name, default, float, "a number")


def _number(name, default, kind, what):
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return kind(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not {what}.") from None


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    word = raw.strip().lower()
    if word not in choices:
        raise ImproperlyConfigured(f"{name}={raw!r} is not one of: {', '.join(choices)}.")
    return word


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]
