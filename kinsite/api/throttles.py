"""Per-token rate limits for the endpoints that call a model or start a job, and the one read
that holds a connection open (a turn's events). A view opts in with `throttle_scope` (and
`throttle_reads = True` to count reads); the bucket is the API token, not the IP or user.

With the cache unreachable the limit fails open: refusing every chat post would turn a cache
outage into a full one, and endpoints that need Redis answer 503 themselves.
"""
import logging
from types import SimpleNamespace

from django.conf import settings
from redis.exceptions import RedisError
from rest_framework import exceptions
from rest_framework.permissions import SAFE_METHODS
from rest_framework.throttling import SimpleRateThrottle

logger = logging.getLogger(__name__)


def is_throttled(view, method: str) -> bool:
    """Whether `method` on `view` counts against a rate: writes of a view with a scope, and its
    reads where it says so (a read often shares its view with a limited write)."""
    if not getattr(view, "throttle_scope", None):
        return False
    return method not in SAFE_METHODS or getattr(view, "throttle_reads", False)


class TokenRateThrottle(SimpleRateThrottle):
    """DRF's sliding-window throttle keyed by the token, in Django's cache. Its read-modify-write
    is not atomic, so a concurrent burst may overshoot by a few: acceptable for a guard against
    runaway clients, and it keeps DRF's semantics."""

    cache_format = "throttle:%(scope)s:token:%(ident)s"

    def __init__(self):
        # The scope comes from the view, so the rate is resolved in allow_request.
        pass

    def get_rate(self):
        # Per request (not at import, as DRF's), so settings overrides apply; empty: no limit.
        return settings.API_THROTTLE_RATES.get(self.scope) or None

    def allow_request(self, request, view):
        if not is_throttled(view, request.method):
            return True
        self.scope = view.throttle_scope
        self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)
        try:
            return super().allow_request(request, view)
        except RedisError as exc:
            logger.warning("Rate limit for %s not checked, the cache is unreachable: %s", self.scope, exc)
            return True

    def get_cache_key(self, request, view):
        token = getattr(request.user, "token", None)
        if token is None:
            return None  # not a token request: authentication has answered 401 already
        # The digest's head too: ids repeat when a database is recreated while the cache lives on.
        return self.cache_format % {"scope": self.scope, "ident": f"{token.pk}-{token.digest[:12]}"}

    def throttle_failure(self):
        # Raised here rather than returning False, so the message can name the scope and
        # its limit; DRF's handler adds Retry-After and ours the API's error shape.
        raise exceptions.Throttled(
            wait=self.wait(),
            detail=f"Rate limit exceeded for {self.scope} requests with this token ({self.rate}).",
        )


def token_throttle_check(*, principal, scope: str) -> None:
    """Count one request of `scope` against `principal`'s token as a view would, raising
    Throttled over the rate: for callers that are not DRF views (MCP tools), so one window per
    token holds whichever door a client uses."""
    throttle = TokenRateThrottle()
    # The throttle reads only these; a POST, which every scope counts.
    request = SimpleNamespace(method="POST", user=principal)
    throttle.allow_request(request, SimpleNamespace(throttle_scope=scope))
