"""Reads of memories: lists with filters, one memory, its history. Searching them is
memories.search."""
from django.db.models import Q
from django.shortcuts import get_object_or_404

from kinsite.models import Kin, Team
from memories.models import Memory, MemoryChange

# A word filter is one LIKE per word; a pasted paragraph is cut to its first words.
TEXT_FILTER_MAX_WORDS = 20


def memory_list(*, team: Team, kin: Kin | None = None, include_shared: bool = True, category: str = "",
                status: str = "", subject: str = "", text: str = ""):
    """A kin's memories (plus the team-shared ones unless include_shared is False),
    or with kin=None only the team-shared ones; filters are exact matches, but `text`:
    every word of it in the content or the subject, case-insensitive (the dashboard's
    search over memories that ranked search does not cover: superseded and deleted ones)."""
    qs = Memory.objects.filter(team=team)
    if kin is None:
        qs = qs.filter(kin__isnull=True)
    elif include_shared:
        qs = qs.filter(kin=kin) | qs.filter(kin__isnull=True)
    else:
        qs = qs.filter(kin=kin)
    if category:
        qs = qs.filter(category=category)
    if status:
        qs = qs.filter(status=status)
    if subject:
        qs = qs.filter(subject__iexact=subject)
    for word in text.split()[:TEXT_FILTER_MAX_WORDS]:
        qs = qs.filter(Q(content__icontains=word) | Q(subject__icontains=word))
    return qs


def memory_get(*, team: Team, memory_id: int) -> Memory:
    return get_object_or_404(Memory, team=team, pk=memory_id)


def memory_history(*, memory: Memory):
    return MemoryChange.objects.filter(memory=memory).select_related("actor_user").order_by("created_at", "id")
