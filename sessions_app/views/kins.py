"""The kin pages: the team's kins (searched by name), a kin with its sessions, and "New kin"
and "Edit" for team owners and admins. Kins are written through sessions_app.services, with
the API's rules (sessions_app.forms); the list and the kin's page read sessions_app's
selectors (session counts), which is why these pages live here rather than beside the Kin
model in kinsite."""
from django.shortcuts import redirect, render
from django.urls import reverse

from kinsite.selectors import kin_get
from kinsite.views import can_manage, managers_only, render_partial_or_page, team_required
from sessions_app import selectors as sessions, services as session_services
from sessions_app.forms import KinForm

SEARCH_MAX_CHARS = 100


@team_required
def kin_list(request):
    name_query = request.GET.get("q", "").strip()[:SEARCH_MAX_CHARS]
    kins = sessions.kin_list_with_stats(team=request.team, name_query=name_query)
    context = {"kins": kins, "q": name_query, "can_manage": can_manage(request)}
    return render_partial_or_page(request, partial="dashboard/_kin_rows.html", page="dashboard/kins.html",
                                  context=context)


@team_required
def kin_detail(request, kin_id: int):
    """A kin and its sessions, most recent first; archived ones only with ?archived=1."""
    kin = kin_get(team=request.team, kin_id=kin_id)
    show_archived = request.GET.get("archived") == "1"
    context = {
        "kin": kin,
        "chat_sessions": sessions.session_list_with_counts(team=request.team, kin=kin,
                                                           include_archived=show_archived),
        "show_archived": show_archived,
        "archived_count": sessions.session_archived_count(team=request.team, kin=kin),
        "can_manage": can_manage(request),
    }
    return render(request, "dashboard/kin_detail.html", context)


@team_required
def kin_create(request):
    """The "New kin" form; a valid post creates the kin and goes to its page, an invalid one
    shows the form again (400) with its errors, nothing stored."""
    if not can_manage(request):
        return managers_only("create kins")
    form = KinForm(request.POST or None, team=request.team)
    if request.method == "POST" and form.is_valid():
        kin = session_services.kin_create(team=request.team, **form.validated)
        return redirect(reverse("dashboard:kin_detail", args=[kin.pk]) + "?created=1")
    status = 400 if request.method == "POST" else 200
    return render(request, "dashboard/kin_form.html", {"form": form, "kin": None}, status=status)


@team_required
def kin_edit(request, kin_id: int):
    kin = kin_get(team=request.team, kin_id=kin_id)
    if not can_manage(request):
        return managers_only("edit kins")
    form = KinForm(request.POST or None, team=request.team, instance=kin)
    if request.method == "POST" and form.is_valid():
        session_services.kin_update(kin=kin, **form.validated)
        return redirect(reverse("dashboard:kin_detail", args=[kin.pk]) + "?saved=1")
    status = 400 if request.method == "POST" else 200
    return render(request, "dashboard/kin_form.html", {"form": form, "kin": kin}, status=status)
