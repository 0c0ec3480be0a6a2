"""GET /healthz: database and broker status, no auth. 200 when both answer, else 503.
Apps add sections of their own (health_sections_register in their AppConfig.ready(), so
this module imports no app): informational, they never make the answer a 503."""
import logging
import time
from collections.abc import Callable

from django.conf import settings
from django.db import connection
from django.http import JsonResponse
from django.views.decorators.http import require_GET

logger = logging.getLogger(__name__)

_sections: dict[str, Callable[[], dict]] = {}


def health_sections_register(name: str, report: Callable[[], dict]) -> None:
    """Called by an app's ready(): /healthz shows `report()` under `name`."""
    _sections[name] = report


def _section(report: Callable[[], dict]) -> dict:
    try:
        return report()
    except Exception as exc:  # the database down: its own check says so; the section says why it is empty
        logger.warning("A /healthz section failed", exc_info=True)
        return {"error": str(exc)[:300]}


def _check_database() -> dict:
    started = time.monotonic()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:  # any failure means "down"; the message says why
        return {"ok": False, "vendor": connection.vendor, "error": str(exc)[:300]}
    return {"ok": True, "vendor": connection.vendor, "latency_ms": round((time.monotonic() - started) * 1000, 1)}


def _check_broker() -> dict:
    if not settings.REDIS_URL:
        return {"ok": True, "kind": "eager", "detail": "no REDIS_URL: Celery tasks run in-process"}
    import redis

    started = time.monotonic()
    # A PING answers at once when Redis is up, so the connect timeout bounds the whole check.
    timeout = settings.REDIS_CONNECT_TIMEOUT_SECONDS
    client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=timeout, socket_timeout=timeout)
    try:
        client.ping()
    except Exception as exc:
        return {"ok": False, "kind": "redis", "error": str(exc)[:300]}
    finally:
        client.close()
    return {"ok": True, "kind": "redis", "latency_ms": round((time.monotonic() - started) * 1000, 1)}


@require_GET
def healthz(request):
    database = _check_database()
    broker = _check_broker()
    healthy = database["ok"] and broker["ok"]
    body = {"status": "ok" if healthy else "unavailable", "database": database, "broker": broker}
    for name, report in _sections.items():
        body[name] = _section(report)
    return JsonResponse(body, status=200 if healthy else 503)
