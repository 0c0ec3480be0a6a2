"""Bearer-token authentication for the API. The request's team is the token's team."""
from datetime import timedelta

from django.utils import timezone
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.permissions import BasePermission

from kinsite import tokencache
from kinsite.models import ApiToken
from kinsite.selectors import api_token_lookup
from kinsite.services import token_digest

# last_used_at is informative; writing it on every request would cost a write per call.
LAST_USED_RESOLUTION = timedelta(minutes=1)


class TokenPrincipal:
    """What request.user is for a token: the token's user if any, always its team."""

    is_authenticated = True
    is_anonymous = False

    def __init__(self, token: ApiToken):
        self.token = token
        self.team = token.team
        self.user = token.user
        self.pk = token.user_id

    def __str__(self):
        return f"token {self.token.prefix}…"


class BearerTokenAuthentication(BaseAuthentication):
    keyword = b"bearer"

    def authenticate(self, request):
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != self.keyword:
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Authorization header must be 'Bearer <token>'.")
        try:
            raw = parts[1].decode()
        except UnicodeDecodeError as exc:
            raise exceptions.AuthenticationFailed("Token contains invalid characters.") from exc
        digest = token_digest(raw)
        token = tokencache.cached_token(digest)
        if token is None:
            generation = tokencache.current_generation()  # before the read: see remember_token
            token = api_token_lookup(raw=raw)
            if token is None:
                raise exceptions.AuthenticationFailed("Invalid or revoked token.")
            tokencache.remember_token(digest, token, generation=generation)
        now = timezone.now()
        if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
            tokencache.token_used(digest, now)
        return TokenPrincipal(token), token

    def authenticate_header(self, request):
        return 'Bearer realm="api"'


class IsTeamMember(BasePermission):
    def has_permission(self, request, view):
        return isinstance(request.user, TokenPrincipal)


def request_team(request):
    return request.user.team
