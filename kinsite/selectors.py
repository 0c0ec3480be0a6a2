"""Reads for teams and tokens."""
from kinsite.models import ApiToken, Membership, Team
from kinsite.services import token_digest


def api_token_lookup(*, raw: str) -> ApiToken | None:
    token = ApiToken.objects.select_related("team", "user").filter(digest=token_digest(raw)).first()
    if token is None or not token.is_active:
        return None
    return token


def team_for_user(*, user) -> Team | None:
    """The dashboard's current team: the user's first membership."""
    if not user.is_authenticated:
        return None
    return Team.objects.filter(memberships__user=user).order_by("memberships__created_at").first()


def membership_role(*, team: Team, user) -> str | None:
    return Membership.objects.filter(team=team, user=user).values_list("role", flat=True).first()


def api_token_list(*, team: Team):
    return ApiToken.objects.filter(team=team).select_related("user")
