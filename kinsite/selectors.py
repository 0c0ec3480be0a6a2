"""Reads for teams, tokens and kins, scoped to a team."""
from django.db import connection
from django.db.models import F
from django.http import Http404
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


# The largest id a row can have (BigAutoField); a larger one in a URL names no row.
MAX_ROW_ID = 2**63 - 1


def kin_ref(*, team: Team, kin_id: int) -> Kin:
    """The kin of the team (404 otherwise) with only its id and team read, for requests that
    need to know which kin, not what it says (the searches); other fields load on first read.
    Written as SQL: through the ORM, compiling the check cost more CPU than running it."""
    if not 0 < kin_id <= MAX_ROW_ID:
        raise Http404
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT 1 FROM {Kin._meta.db_table} WHERE id = %s AND team_id = %s", [kin_id, team.pk])
        if cursor.fetchone() is None:
            raise Http404
    return Kin.from_db(connection.alias, ["id", "team_id"], [kin_id, team.pk])


def llm_call_get(*, team: Team, call_id: int) -> LLMCall:
    """One model call of the team (404 otherwise, also for calls logged without a team)."""
    return get_object_or_404(LLMCall.objects.select_related("kin"), team=team, pk=call_id)
