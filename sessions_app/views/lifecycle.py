"""Starting a session ("New session" on a kin's page, any team member) and managing one:
renaming, archiving and unarchiving (team owners and admins)."""
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from kinsite.selectors import kin_get
from kinsite.views import can_manage, managers_only, team_required
from sessions_app import selectors, services
from sessions_app.forms import SessionCreateForm, SessionRenameForm
from sessions_app.views.entries import CONVERSATION_KINDS
from sessions_app.views.sessions import session_page


@team_required
def session_create(request, kin_id: int):
    """The "New session" form of a kin: any member of the team may start one (members chat). A
    valid post creates it and goes to its page; an invalid one shows the form again (400)."""
    kin = kin_get(team=request.team, kin_id=kin_id)
    form = SessionCreateForm(request.POST or None, team=request.team)
    if request.method == "POST" and form.is_valid():
        chat_session = services.session_create(kin=kin, **form.validated)
        return redirect("dashboard:session_detail", chat_session.pk)
    status = 400 if request.method == "POST" else 200
    return render(request, "dashboard/session_new.html", {"kin": kin, "form": form}, status=status)


@require_POST
@team_required
def session_rename(request, session_id: int):
    chat_session = selectors.session_get(team=request.team, session_id=session_id)
    if not can_manage(request):
        return managers_only("rename sessions")
    form = SessionRenameForm(request.POST, session=chat_session)
    if not form.is_valid():
        chat_session = selectors.session_get_with_event_count(team=request.team, session_id=session_id,
                                                              kinds=CONVERSATION_KINDS)
        return session_page(request, chat_session, rename_form=form, status=400)
    services.session_rename(session=chat_session, **form.validated)
    return redirect("dashboard:session_detail", chat_session.pk)


@require_POST
@team_required
def session_archive(request, session_id: int):
    """Archive: hidden from the kin's session list, its page read-only (with "Unarchive")."""
    chat_session = selectors.session_get(team=request.team, session_id=session_id)
    if not can_manage(request):
        return managers_only("archive sessions")
    services.session_archive(session=chat_session)
    return redirect("dashboard:session_detail", chat_session.pk)


@require_POST
@team_required
def session_unarchive(request, session_id: int):
    chat_session = selectors.session_get(team=request.team, session_id=session_id)
    if not can_manage(request):
        return managers_only("unarchive sessions")
    services.session_unarchive(session=chat_session)
    return redirect("dashboard:session_detail", chat_session.pk)
