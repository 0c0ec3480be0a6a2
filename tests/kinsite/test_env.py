"""The environment readers refuse a mistyped value, naming the variable, instead of
reading it as the default."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from kinsite.env import env_bool, env_float, env_int

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("raw", "expected"), [("1", True), (" TRUE ", True), ("yes", True), ("on", True),
                                               ("0", False), ("False", False), ("no", False), ("off", False)])
def test_yes_no_words_are_read(monkeypatch, raw, expected):
    monkeypatch.setenv("KINSITE_TEST_FLAG", raw)
    assert env_bool("KINSITE_TEST_FLAG", default=not expected) is expected


def test_an_unset_or_empty_flag_is_its_default(monkeypatch):
    monkeypatch.delenv("KINSITE_TEST_FLAG", raising=False)
    assert env_bool("KINSITE_TEST_FLAG", default=True) is True
    monkeypatch.setenv("KINSITE_TEST_FLAG", " ")
    assert env_bool("KINSITE_TEST_FLAG", default=True) is True


@pytest.mark.parametrize("raw", ["ture", "enabled", "2"])
def test_a_mistyped_flag_stops_with_its_name(monkeypatch, raw):
    monkeypatch.setenv("KINSITE_TEST_FLAG", raw)
    with pytest.raises(ImproperlyConfigured, match=r"KINSITE_TEST_FLAG=.* is not a yes/no value"):
        env_bool("KINSITE_TEST_FLAG")


def test_a_mistyped_number_stops_with_its_name(monkeypatch):
    monkeypatch.setenv("KINSITE_TEST_N", "12s")
    with pytest.raises(ImproperlyConfigured, match="KINSITE_TEST_N='12s' is not a whole number"):
        env_int("KINSITE_TEST_N", 5)
    with pytest.raises(ImproperlyConfigured, match="KINSITE_TEST_N='12s' is not a number"):
        env_float("KINSITE_TEST_N", 5.0)
    monkeypatch.setenv("KINSITE_TEST_N", " 7 ")
    assert env_int("KINSITE_TEST_N", 5) == 7


@pytest.mark.parametrize(("variable", "raw", "says"), [
    ("SESSION_COOKIE_SECURE", "ture", "is not a yes/no value"),
    ("TURN_AUTO_RETRIES", "five", "is not a whole number"),
    ("EMBEDDINGS", "locale", "is not one of: local, endpoint, off"),
])
def test_a_service_with_a_mistyped_setting_does_not_start(tmp_path, variable, raw, says):
    """At start (manage.py check, as the Procfile's processes load the same settings), not
    later: the process exits and its error names the variable."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    environment.update(DJANGO_SETTINGS_MODULE="kinsite.settings", KINSITE_DATA_DIR=str(tmp_path), DEBUG="true",
                       **{variable: raw})
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=REPO, env=environment, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and f"{variable}={raw!r} {says}" in result.stderr, \
        result.stderr[-2000:]
