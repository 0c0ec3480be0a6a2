"""Reads for teams, tokens and kins, scoped to a team."""
from django.db.models import F
from django.shortcuts import get_object_or_404

from kinsite.models import ApiToken, Kin, LLMCall, Team
from kinsite.services import token_digest


def api_token_lookup(*, raw: str) -> ApiToken | None:
    token = ApiToken.objects.select_related("team", "user").filter(digest=token_digest(raw)).first()
    if token is None or not token.is_active:
        return None
    return token


def team_for_user(*, user) -> Team | None:
    """The dashboard's current team: the user's first membership, with the user's role in
    it as `member_role` (read in the same query: every dashboard page needs both)."""
    if not user.is_authenticated:
        return None
    return (
        Team.objects.filter(memberships__user=user)
        .annotate(member_role=F("memberships__role"))
        .order_by("memberships__created_at")
        .first()
    )


def api_token_list(*, team: Team):
    return ApiToken.objects.filter(team=team).select_related("user")


def kin_list(*, team: Team):
    return Kin.objects.filter(team=team)


def kin_get(*, team: Team, kin_id: int) -> Kin:
    return get_object_or_404(Kin, team=team, pk=kin_id)


def kin_ref(*, team: Team, kin_id: int) -> Kin:
    """The kin of the team (404 otherwise) with only its id and team read: for requests that
    need to know which kin, not what it says (the searches). Another field, if one is ever
    read, is loaded then (one query more), so nothing reads a wrong value."""
    return get_object_or_404(Kin.objects.only("id", "team_id"), team=team, pk=kin_id)


def llm_call_get(*, team: Team, call_id: int) -> LLMCall:
    """One model call of the team (404 otherwise, also for calls logged without a team)."""
    return get_object_or_404(LLMCall.objects.select_related("kin"), team=team, pk=call_id)
