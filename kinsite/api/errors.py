"""The API's error shape (docs/api.md): {"error": {"code", "message", "details"}}."""
import logging

from django.core.exceptions import PermissionDenied
from django.http import Http404, JsonResponse
from kombu.exceptions import OperationalError as BrokerUnreachable
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler, set_rollback

from kinsite.errors import REDIS_UNREACHABLE, KinsiteError, ServiceUnavailable

logger = logging.getLogger(__name__)

# Redis unreachable: the task queue (kombu) or the cache and locks (redis-py). Paths that
# know what they stored raise ServiceUnavailable themselves; any other gets a generic 503
# rather than a 500, since the request was fine and will work once Redis is back.
OUTAGE_ERRORS = (BrokerUnreachable, *REDIS_UNREACHABLE)


def error_body(code: str, message: str, details=None) -> dict:
    return {"error": {"code": code, "message": message, "details": details or {}}}


def _message_and_details(exc: exceptions.APIException):
    detail = exc.detail
    if isinstance(detail, (list, dict)):
        if exc.status_code == 400:
            return "The request is invalid; see details.", detail
        return str(detail), detail
    return str(detail), {}


def api_exception_handler(exc, context):
    if isinstance(exc, OUTAGE_ERRORS):
        logger.warning("Redis is unreachable during %s: %s", getattr(context.get("request"), "path", "?"), exc)
        exc = ServiceUnavailable(
            "A backing service (Redis: the task queue, locks and cache) is unreachable, so this request "
            "could not be completed. Try again shortly.",
            details={"service": "redis"},
        )
    if isinstance(exc, KinsiteError):
        set_rollback()
        response = Response(error_body(exc.code, exc.message, exc.details), status=exc.status)
        if isinstance(exc, ServiceUnavailable):
            response["Retry-After"] = str(exc.retry_after)
        return response
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    response = exception_handler(exc, context)
    if response is None:
        return None  # a real bug: Django's 500 handler answers (JSON under /api/, below)
    message, details = _message_and_details(exc)
    code = exc.get_codes() if isinstance(exc.get_codes(), str) else getattr(exc, "default_code", "error")
    if exc.status_code == status.HTTP_404_NOT_FOUND:
        message = "Not found."
    response.data = error_body(code, message, details)
    return response


def json_404(request, exception=None):
    if request.path.startswith("/api/"):
        return JsonResponse(error_body("not_found", "Not found."), status=404)
    from django.views.defaults import page_not_found

    return page_not_found(request, exception)


def json_500(request):
    if request.path.startswith("/api/"):
        return JsonResponse(error_body("server_error", "Internal server error."), status=500)
    from django.views.defaults import server_error

    return server_error(request)
