from django.shortcuts import get_object_or_404

from erasure.models import Erasure
from kinsite.models import Membership, Team

# Who may erase: the team's owners and admins (an API token counts as its user).
ERASER_ROLES = (Membership.Role.OWNER, Membership.Role.ADMIN)


def erasure_list(*, team: Team):
    return Erasure.objects.filter(team=team).select_related("kin")


def erasure_get(*, team: Team, erasure_id: int) -> Erasure:
    return get_object_or_404(Erasure, team=team, pk=erasure_id)


def can_erase(*, team: Team, user) -> bool:
    return user is not None and Membership.objects.filter(team=team, user=user, role__in=ERASER_ROLES).exists()
