"""Writes for teams, memberships and API tokens."""
import hashlib
import secrets

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from kinsite.models import ApiToken, Membership, Team, validate_timezone

TOKEN_PREFIX = "ks_"


def token_digest(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


@transaction.atomic
def team_create(*, name: str, slug: str, timezone_name: str = "UTC", owner=None) -> Team:
    validate_timezone(timezone_name)
    team = Team.objects.create(name=name, slug=slug, timezone=timezone_name)
    if owner is not None:
        Membership.objects.create(team=team, user=owner, role=Membership.Role.OWNER)
    return team


def membership_ensure(*, team: Team, user, role: str = Membership.Role.MEMBER) -> Membership:
    membership, _ = Membership.objects.get_or_create(team=team, user=user, defaults={"role": role})
    return membership


def api_token_issue(*, team: Team, name: str, user=None) -> tuple[ApiToken, str]:
    """Create a token; returns the row and the raw token, which is never stored."""
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(team=team, user=user, name=name, prefix=raw[:10], digest=token_digest(raw))
    return token, raw


def api_token_revoke(*, token: ApiToken) -> ApiToken:
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    return token


def demo_user_ensure(*, username: str, password: str):
    """Used by create_demo: a staff user whose password is reset to the given one."""
    User = get_user_model()
    user, _ = User.objects.get_or_create(username=username)
    user.is_staff = True
    user.is_superuser = True
    user.set_password(password)
    user.save()
    return user
