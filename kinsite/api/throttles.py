"""Per-token rate limits for the endpoints that call a model or start a job, and
for the one read that holds a connection open (following a turn's events).

A view opts in with `throttle_classes = [TokenRateThrottle]` and `throttle_scope = "chat"`
(or "jobs", "workflow_runs", "events"); the scope's rate is `settings.API_THROTTLE_RATES[scope]`
(API_RATE_CHAT, API_RATE_JOBS, API_RATE_WORKFLOW_RUNS, API_RATE_EVENTS). Only writes are
counted unless the view sets `throttle_reads = True`. The bucket is the API token, not the IP
or the user: one script with one token gets its own allowance, and two tokens of a team do not
share one.

When the cache (Redis) is unreachable the limit fails open: the request goes on, since
refusing every chat post would turn a cache outage into a full one, and the endpoints
behind the throttle answer for themselves (503) if they need Redis too.
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
    """Whether `method` on `view` counts against a rate: writes of a view with a scope, and
    its reads too where it says so. Reads are not limited by default because a read shares
    its view with a limited write (GET /sessions/{id}/messages/ with the chat post)."""
    if not getattr(view, "throttle_scope", None):
        return False
    return method not in SAFE_METHODS or getattr(view, "throttle_reads", False)


class TokenRateThrottle(SimpleRateThrottle):
    """DRF's sliding-window throttle, keyed by the token id, in Django's cache (Redis with
    REDIS_URL, so every web process counts against the same window; the local-memory
    cache otherwise). The window's read-modify-write is not atomic, so a burst of
    concurrent requests across processes may overshoot the limit by a few: acceptable for
    a guard against runaway clients, and it keeps DRF's well-known semantics."""

    cache_format = "throttle:%(scope)s:token:%(ident)s"

    def __init__(self):
        # The scope comes from the view, so the rate is resolved in allow_request.
        pass

    def get_rate(self):
        # Read per request (not at import, as DRF's THROTTLE_RATES is), so settings
        # overrides apply. An empty rate means: no limit for the scope.
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
        # The id names the token; the digest's head makes the key unique for good, since
        # ids repeat where rows are rolled back or a database is recreated (tests) while
        # the cache lives on.
        return self.cache_format % {"scope": self.scope, "ident": f"{token.pk}-{token.digest[:12]}"}

    def throttle_failure(self):
        # Raised here rather than returning False, so the message can name the scope and
        # its limit; DRF's handler adds Retry-After and ours the API's error shape.
        raise exceptions.Throttled(
            wait=self.wait(),
            detail=f"Rate limit exceeded for {self.scope} requests with this token ({self.rate}).",
        )


def token_throttle_check(*, principal, scope: str) -> None:
    """Count one request of `scope` against the token of `principal` (a TokenPrincipal), as a
    view with `throttle_scope = scope` would; raises Throttled once over the rate. For callers
    that are not DRF views (the MCP server's tools), so a client is limited the same whichever
    door it uses: the same rates, the same cache key, one window per token."""
    throttle = TokenRateThrottle()
    # The throttle reads only the method and the principal from the request, and only the
    # scope from the view; a POST, which every scope counts.
    request = SimpleNamespace(method="POST", user=principal)
    throttle.allow_request(request, SimpleNamespace(throttle_scope=scope))
