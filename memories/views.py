"""Dashboard pages for a kin's memories: browse and search (htmx partial), add, edit, delete
and each memory's history. Reads go through memories.selectors and memories.search scoped to
the user's team (other teams' ids answer 404); writes through memories.services."""
from dataclasses import dataclass

from django import forms
from django.conf import settings
from django.core.paginator import Paginator
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse

from kinsite.actors import user_ref
from kinsite.selectors import kin_get
from kinsite.views import render_partial_or_page, team_required, wants_partial
from memories import selectors, services
from memories.api.serializers import MEMORY_CONTENT_MAX_CHARS
from memories.models import Memory
from memories.reembed import reembed_kin_progress
from memories.search.selectors import memory_search

MEMORIES_PER_PAGE = 50
STATUS_ALL = "all"


class MemoryForm(forms.Form):
    content = forms.CharField(widget=forms.Textarea(attrs={"rows": 4}), max_length=MEMORY_CONTENT_MAX_CHARS)
    category = forms.ChoiceField(choices=Memory.Category.choices)
    subject = forms.CharField(max_length=200, required=False)
    importance = forms.IntegerField(min_value=1, max_value=10, initial=5)


class MemoryAddForm(MemoryForm):
    shared = forms.BooleanField(required=False, label="Shared with every kin of the team")


def _actor(request) -> services.Actor:
    return services.Actor(label=user_ref(request.user), user=request.user)


def _kin_and_memory(request, kin_id: int, memory_id: int):
    """The kin, and one of the memories it sees (its own or team-shared, any status)."""
    kin = kin_get(team=request.team, kin_id=kin_id)
    memory = get_object_or_404(selectors.memory_list(team=request.team, kin=kin), pk=memory_id)
    return kin, memory


def _choice(value: str, allowed) -> str:
    # The dashboard is forgiving: an unknown filter value (an old bookmark) means "no filter".
    return value if value in allowed else ""


@team_required
def memory_list(request, kin_id: int):
    kin = kin_get(team=request.team, kin_id=kin_id)
    q = request.GET.get("q", "").strip()[: settings.SEARCH_MAX_QUERY_CHARS]
    category = _choice(request.GET.get("category", ""), Memory.Category.values)
    memory_status = _choice(request.GET.get("status", Memory.Status.ACTIVE), [*Memory.Status.values, STATUS_ALL])
    context = {
        "kin": kin,
        "q": q,
        "category": category,
        "status": memory_status,
        "categories": Memory.Category.choices,
        "statuses": [*Memory.Status.choices, (STATUS_ALL, "All")],
        "hits": None,
        "page": None,
        "add_form": MemoryAddForm(),
        # Only the full page shows it: the partial swapped in as the user types leaves it out.
        "reembedding": None if wants_partial(request) else reembed_kin_progress(team=request.team, kin=kin),
    }
    if q and memory_status == Memory.Status.ACTIVE:
        context["hits"] = memory_search(
            team=request.team, kin=kin, query=q, limit=settings.SEARCH_MAX_LIMIT, category=category
        )
    else:
        # Ranked search covers active memories only; with another status (or all) a query
        # filters the list by its words instead, so the status filter always holds.
        memories = selectors.memory_list(
            team=request.team,
            kin=kin,
            category=category,
            status="" if memory_status == STATUS_ALL else memory_status,
            text=q,
        ).order_by("-updated_at", "-id")
        context["page"] = Paginator(memories, MEMORIES_PER_PAGE).get_page(request.GET.get("page"))
        if not context["page"].object_list:
            # An empty page says why: no memory at all, or none that passes the filters.
            context["kin_has_memories"] = selectors.memory_list(team=request.team, kin=kin).exists()
    return render_partial_or_page(request, partial="memories/_memory_results.html",
                                  page="memories/memory_list.html", context=context)


@team_required
def memory_add(request, kin_id: int):
    kin = kin_get(team=request.team, kin_id=kin_id)
    form = MemoryAddForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        result = services.memory_add(
            team=request.team,
            kin=None if data["shared"] else kin,
            content=data["content"],
            category=data["category"],
            subject=data["subject"],
            importance=data["importance"],
            source=Memory.Source.DASHBOARD,
            source_ref=user_ref(request.user),
            actor=_actor(request),
        )
        outcome = "added" if result.created else "merged"
        return redirect(reverse("dashboard:memory_detail", args=[kin.pk, result.memory.pk]) + f"?{outcome}=1")
    status = 400 if request.method == "POST" else 200
    return render(request, "memories/memory_add.html", {"kin": kin, "form": form}, status=status)


@dataclass(frozen=True)
class FieldChange:
    field: str
    before: object
    after: object


# The order fields are shown in; snapshot keys come back from JSON columns in any order.
FIELD_ORDER = ["content", "category", "subject", "importance", "status", "kin", "superseded_by"]


def change_fields(before: dict, after: dict) -> list[FieldChange]:
    """The fields a change row altered; for an add (empty `before`), the fields it set."""
    names = [name for name in FIELD_ORDER if name in after] + sorted(set(after) - set(FIELD_ORDER))
    if not before:
        return [
            FieldChange(field=name, before=None, after=after[name]) for name in names if after[name] not in (None, "")
        ]
    return [
        FieldChange(field=name, before=before.get(name), after=after.get(name))
        for name in names
        if before.get(name) != after.get(name)
    ]


@team_required
def memory_detail(request, kin_id: int, memory_id: int):
    """One memory and its change log, oldest first."""
    kin, memory = _kin_and_memory(request, kin_id, memory_id)
    changes = [
        {"row": change, "fields": change_fields(change.before, change.after)}
        for change in selectors.memory_history(memory=memory)
    ]
    context = {
        "kin": kin,
        "memory": memory,
        "changes": changes,
        "added": "added" in request.GET,
        "merged": "merged" in request.GET,
    }
    return render(request, "memories/memory_detail.html", context)


@team_required
def memory_edit(request, kin_id: int, memory_id: int):
    kin, memory = _kin_and_memory(request, kin_id, memory_id)
    if memory.status != Memory.Status.ACTIVE:
        return render(request, "memories/memory_edit.html", {"kin": kin, "memory": memory, "form": None}, status=409)
    initial = {name: getattr(memory, name) for name in services.EDITABLE_FIELDS}
    form = MemoryForm(request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        changed = {name: form.cleaned_data[name] for name in form.changed_data}
        if changed:
            services.memory_update(memory=memory, actor=_actor(request), reason="Edited in the dashboard.", **changed)
        return redirect("dashboard:memory_detail", kin.pk, memory.pk)
    status = 400 if request.method == "POST" else 200
    return render(request, "memories/memory_edit.html", {"kin": kin, "memory": memory, "form": form}, status=status)


@team_required
def memory_delete(request, kin_id: int, memory_id: int):
    """GET asks for confirmation; POST deletes (a status change: the memory and its history stay)."""
    kin, memory = _kin_and_memory(request, kin_id, memory_id)
    if request.method == "POST":
        if memory.status != Memory.Status.DELETED:
            services.memory_delete(memory=memory, actor=_actor(request), reason="Deleted in the dashboard.")
        return redirect("dashboard:memory_list", kin.pk)
    return render(request, "memories/memory_delete.html", {"kin": kin, "memory": memory})
