"""Production settings (docs/deployment.md, "The settings that matter"): the built-in SECRET_KEY is refused when DEBUG
is off, `manage.py check --deploy` is clean with the documented production environment, and
the security and upload settings come from the environment. Each case starts a fresh
Python process, since settings are read once, at start."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# docs/deployment.md, "Checking the settings": the environment of a production machine behind a TLS proxy that sets
# X-Forwarded-Proto (DATABASE_URL and REDIS_URL left out: check --deploy does not need them).
PRODUCTION_ENV = {
    "SECRET_KEY": "q7Vd-2nKx9LwR4tY8zPb3Hm6JcF1sGe5UaXo0iNk7QyTrWvZlEjD",
    "DEBUG": "false",
    "ALLOWED_HOSTS": "kinsite.example.com",
    "CSRF_TRUSTED_ORIGINS": "https://kinsite.example.com",
    "SECURE_PROXY_SSL_HEADER": "HTTP_X_FORWARDED_PROTO,https",
    "SECURE_SSL_REDIRECT": "true",
    "SESSION_COOKIE_SECURE": "true",
    "CSRF_COOKIE_SECURE": "true",
    "SECURE_HSTS_SECONDS": "31536000",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": "true",
    "SECURE_HSTS_PRELOAD": "true",
}
# DJANGO_ALLOW_ASYNC_UNSAFE: the browser tests set it in this process (Playwright's event loop);
# a deployment never has it, and check --deploy rightly refuses it.
SETTINGS_VARIABLES = {*PRODUCTION_ENV, "DATABASE_URL", "REDIS_URL", "DATA_UPLOAD_MAX_MEMORY_SIZE",
                      "DJANGO_ALLOW_ASYNC_UNSAFE"}


def run(argv: list[str], tmp_path, **env) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in SETTINGS_VARIABLES and not k.startswith("PYTEST_")}
    environment.update(DJANGO_SETTINGS_MODULE="kinsite.settings", KINSITE_DATA_DIR=str(tmp_path), **env)
    return subprocess.run([sys.executable, *argv], cwd=REPO, env=environment, capture_output=True, text=True,
                          timeout=60)


def setting(name: str, tmp_path, **env) -> str:
    result = run(["-c", f"import django; django.setup(); from django.conf import settings; "
                        f"print(repr(settings.{name}))"], tmp_path, **env)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip()


def test_the_built_in_secret_key_is_refused_when_debug_is_off(tmp_path):
    for env in ({}, {"DEBUG": "false"}, {"DEBUG": "false", "SECRET_KEY": ""}):
        result = run(["manage.py", "check"], tmp_path, **env)
        assert result.returncode != 0, env
        assert "ImproperlyConfigured" in result.stderr and "SECRET_KEY" in result.stderr, result.stderr[-2000:]
    # The WSGI application (gunicorn) and the Celery app refuse as well.
    refused = run(["-c", "import kinsite.wsgi"], tmp_path, DEBUG="false")
    assert refused.returncode != 0 and "SECRET_KEY" in refused.stderr


@pytest.mark.parametrize("env", [{"DEBUG": "true"}, {"SECRET_KEY": "a-key-of-this-deployment"}], ids=str)
def test_debug_or_an_own_secret_key_starts(env, tmp_path):
    result = run(["manage.py", "check"], tmp_path, **env)
    assert result.returncode == 0, result.stderr[-2000:]


def test_check_deploy_is_clean_with_the_documented_production_environment(tmp_path):
    result = run(["manage.py", "check", "--deploy", "--fail-level", "WARNING"], tmp_path, **PRODUCTION_ENV)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "System check identified no issues" in result.stdout, result.stdout + result.stderr


def test_security_settings_come_from_the_environment(tmp_path):
    assert setting("SECURE_PROXY_SSL_HEADER", tmp_path, **PRODUCTION_ENV) == "('HTTP_X_FORWARDED_PROTO', 'https')"
    assert setting("SECURE_HSTS_SECONDS", tmp_path, **PRODUCTION_ENV) == "31536000"
    # Off by default: a plain-HTTP run (scripts/serve, the deployment test) keeps working.
    assert setting("SECURE_SSL_REDIRECT", tmp_path, DEBUG="true") == "False"
    assert setting("SECURE_PROXY_SSL_HEADER", tmp_path, DEBUG="true") == "None"


def test_a_malformed_proxy_header_setting_is_refused(tmp_path):
    result = run(["manage.py", "check"], tmp_path, DEBUG="true", SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto")
    assert result.returncode != 0
    assert "SECURE_PROXY_SSL_HEADER" in result.stderr


def test_the_upload_limit_comes_from_the_environment(tmp_path):
    assert setting("DATA_UPLOAD_MAX_MEMORY_SIZE", tmp_path, DEBUG="true") == str(10 * 1024 * 1024)
    assert setting("DATA_UPLOAD_MAX_MEMORY_SIZE", tmp_path, DEBUG="true", DATA_UPLOAD_MAX_MEMORY_SIZE="2000") == "2000"


@pytest.mark.django_db
def test_the_ssl_redirect_spares_the_health_check(client, settings):
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

    assert client.get("/api/v1/kins/").status_code == 301
    assert client.get("/api/v1/kins/", HTTP_X_FORWARDED_PROTO="https").status_code == 401
    # Load balancers probe over plain HTTP: a redirect would read as "down".
    assert client.get("/healthz").status_code in (200, 503)


@pytest.mark.parametrize("entry", ["https://files.example", "files.example:8080", "10.0.0.0/33"])
def test_a_malformed_workflow_allow_list_is_refused_at_start(tmp_path, entry):
    # Refused when the settings load (web, worker, manage.py), not at the first fetch.
    result = run(["manage.py", "check"], tmp_path, DEBUG="true", WORKFLOW_HTTP_ALLOWED_HOSTS=f"127.0.0.1,{entry}")
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and "WORKFLOW_HTTP_ALLOWED_HOSTS" in result.stderr
    assert repr(entry) in result.stderr, result.stderr[-2000:]
    started = run(["manage.py", "check"], tmp_path, DEBUG="true", WORKFLOW_HTTP_ALLOWED_HOSTS="127.0.0.1,files.example")
    assert started.returncode == 0, started.stderr[-2000:]
