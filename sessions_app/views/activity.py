"""The activity pages of a kin and of the team (sessions_app.activity), which read every
app's rows: filtered by kind and status, paged by cursor."""
from django.http import QueryDict
from django.shortcuts import render
from django.views.decorators.http import require_safe

from kinsite.selectors import kin_get
from kinsite.views import team_required
from sessions_app import activity


def _activity_page(request, scope: activity.Scope, *, template_context: dict):
    """A scope's activity (sessions_app.activity) as filtered by ?kind= (repeatable), ?status=
    (repeatable) and paged by ?cursor=. An unknown value answers 400 with the page saying
    which and what the choices are; nothing is read then."""
    sources = activity.kinds_for(scope)
    known_kinds = [source.kind for source in sources]
    # A value given twice counts once (a kind read twice would list its rows twice).
    kinds = list(dict.fromkeys(kind for kind in request.GET.getlist("kind") if kind))
    statuses = list(dict.fromkeys(status for status in request.GET.getlist("status") if status))
    problems = []
    unknown = [kind for kind in kinds if kind not in known_kinds]
    if unknown:
        problems.append(f"Unknown kind {unknown[0]!r}: this page lists {', '.join(known_kinds)}.")
    unknown = [status for status in statuses if status not in activity.STATUSES]
    if unknown:
        problems.append(f"Unknown status {unknown[0]!r}: choose among {', '.join(activity.STATUSES)}.")
    cursor = None
    if request.GET.get("cursor"):
        try:
            cursor = activity.cursor_decode(request.GET["cursor"])
        except activity.FilterInvalid as exc:
            problems.append(str(exc))
    rows, next_url = [], None
    if not problems:
        page = activity.activity_page(scope=scope, kinds=kinds or known_kinds, statuses=statuses, cursor=cursor,
                                      size=activity.PAGE_SIZE)
        rows = page.rows
        if page.next_cursor:
            params = request.GET.copy()
            params["cursor"] = page.next_cursor
            next_url = "?" + params.urlencode()
    failures = QueryDict(mutable=True)
    failures.setlist("kind", [kind for kind in kinds if kind in known_kinds])
    failures["status"] = activity.FAILED
    context = {
        **template_context,
        "scope": scope,
        "rows": rows,
        "kind_choices": [(source.kind, source.label, source.kind in kinds) for source in sources],
        "status_choices": activity.STATUSES,
        "statuses": statuses,
        "filtered": bool(kinds or statuses),
        "failures_only": statuses == [activity.FAILED],
        "failures_url": "?" + failures.urlencode(),
        "next_url": next_url,
        "paged": cursor is not None,
        "problems": problems,
    }
    return render(request, "dashboard/activity.html", context, status=400 if problems else 200)


@require_safe
@team_required
def kin_activity(request, kin_id: int):
    kin = kin_get(team=request.team, kin_id=kin_id)
    return _activity_page(request, activity.Scope(team=request.team, kin=kin), template_context={"kin": kin})


@require_safe
@team_required
def team_activity(request):
    return _activity_page(request, activity.Scope(team=request.team), template_context={"kin": None})
