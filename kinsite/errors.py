"""Domain errors raised by services for states the caller could not have known.
The API's exception handler maps each to an HTTP status and the error shape (docs/api.md#errors)."""
from redis.exceptions import ConnectionError as RedisConnectionError, TimeoutError as RedisTimeoutError

# Redis not answering (refused, reset, timed out): what the session locks and the API's
# exception handler treat as an outage (503) rather than a bug.
REDIS_UNREACHABLE = (RedisConnectionError, RedisTimeoutError)


class KinsiteError(Exception):
    code = "error"
    status = 400

    def __init__(self, message: str, *, details: dict | None = None):
        super().__init__(message)
        self.message = message
        self.details = details or {}


class NotFound(KinsiteError):
    code = "not_found"
    status = 404


class Conflict(KinsiteError):
    code = "conflict"
    status = 409


class InvalidInput(KinsiteError):
    code = "invalid"
    status = 400


class UpstreamError(KinsiteError):
    """The LLM endpoint (or another upstream) failed; the API answers 502."""

    code = "upstream_error"
    status = 502


class ServiceUnavailable(KinsiteError):
    """A backing service (Redis: the task queue, the session locks, the cache) did not
    answer. The API answers 503 with Retry-After; the message says what was stored."""

    code = "service_unavailable"
    status = 503
    retry_after = 30  # seconds: Redis restarts or fails over in about that time


class ModelNotConfigured(KinsiteError):
    """The work needs a language model and none is configured (LLM_BASE_URL is empty).
    503 without Retry-After: it stays so until an operator sets the endpoint."""

    code = "model_not_configured"
    status = 503
