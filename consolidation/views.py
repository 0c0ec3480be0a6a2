"""Dashboard pages for a kin's experience document and fact ledger: the document (any
version), its versions and a diff between any two, the consolidation runs with their
audit details, "Consolidate now", and the facts with an "Add fact" form. Reads are
scoped to the user's team through kin_get (other teams' kins answer 404); writes go
through consolidation.services."""
import difflib
from dataclasses import dataclass

from django import forms
from django.core.paginator import Paginator
from django.db.models import Case, IntegerField, Value, When
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from consolidation import selectors, services
from consolidation.models import ConsolidationRun, ExperienceVersion, Fact
from kinsite.selectors import kin_get
from kinsite.views import team_required

RUNS_SHOWN = 20
FACTS_PER_PAGE = 50
DIFF_CONTEXT_LINES = 3


class FactAddForm(forms.Form):
    statement = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), max_length=services.STATEMENT_MAX_CHARS)
    category = forms.ChoiceField(choices=Fact.Category.choices, initial=Fact.Category.FACT)


def _positive_int(value) -> int | None:
    # The dashboard is forgiving: a malformed number (an old or hand-edited link) means "not given".
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


@dataclass(frozen=True)
class DiffLine:
    kind: str  # "file", "hunk", "add", "del" or "same": the line's CSS class
    text: str


def experience_diff(before: ExperienceVersion, after: ExperienceVersion) -> list[DiffLine]:
    """A unified diff of two versions' markdown, one classified line each (the template
    escapes the text). Empty when the two documents are the same."""
    lines = difflib.unified_diff(
        before.markdown.splitlines(),
        after.markdown.splitlines(),
        fromfile=f"version {before.version}",
        tofile=f"version {after.version}",
        lineterm="",
        n=DIFF_CONTEXT_LINES,
    )
    diff = []
    for line in lines:
        if line.startswith(("---", "+++")) and len(diff) < 2:
            kind = "file"
        elif line.startswith("@@"):
            kind = "hunk"
        elif line.startswith("+"):
            kind = "add"
        elif line.startswith("-"):
            kind = "del"
        else:
            kind = "same"
        diff.append(DiffLine(kind=kind, text=line))
    return diff


@team_required
def experience(request, kin_id: int):
    """The document (current, or ?version=N), the versions, a diff (?from=&to=, default:
    the previous version against the current one) and the consolidation runs."""
    kin = kin_get(team=request.team, kin_id=kin_id)
    versions = list(selectors.experience_versions(kin).defer("markdown"))
    numbers = {version.version for version in versions}

    requested = _positive_int(request.GET.get("version"))
    if request.GET.get("version") and requested not in numbers:
        raise Http404("No such experience version.")
    shown = selectors.experience_get(kin, version=requested) if requested else selectors.experience_current(kin)

    diff_from = _positive_int(request.GET.get("from"))
    diff_to = _positive_int(request.GET.get("to"))
    if diff_from is None and diff_to is None and len(versions) >= 2:
        diff_from, diff_to = versions[1].version, versions[0].version
    diff, diff_error = None, ""
    if diff_from is not None or diff_to is not None:
        missing = [str(n) for n in (diff_from, diff_to) if n is None or n not in numbers]
        if missing or diff_from is None or diff_to is None:
            diff_error = "Choose two existing versions to compare."
        else:
            diff = experience_diff(
                selectors.experience_get(kin, version=diff_from), selectors.experience_get(kin, version=diff_to)
            )

    consolidated_run = None
    run_id = _positive_int(request.GET.get("run"))
    if run_id:
        consolidated_run = ConsolidationRun.objects.filter(kin=kin, pk=run_id).first()

    context = {
        "kin": kin,
        "shown": shown,
        "is_current": bool(shown is not None and shown.version == versions[0].version),
        "versions": versions,
        "diff": diff,
        "diff_from": diff_from,
        "diff_to": diff_to,
        "diff_error": diff_error,
        "runs": selectors.consolidation_runs(kin).select_related("experience_version")[:RUNS_SHOWN],
        "pending_count": selectors.facts_pending(kin).count(),
        "consolidated_run": consolidated_run,
        "busy": "busy" in request.GET,
        "nothing": "nothing" in request.GET,
    }
    return render(request, "consolidation/experience.html", context)


@require_POST
@team_required
def experience_consolidate(request, kin_id: int):
    """Consolidate now (synchronously: the page comes back with the run's outcome).
    With "prepare" the prompt is only rendered, for reading; nothing changes. Without
    pending facts nothing runs and the page says so."""
    kin = kin_get(team=request.team, kin_id=kin_id)
    page = reverse("dashboard:experience", args=[kin.pk])
    try:
        run = services.consolidation_run(
            kin=kin, trigger=ConsolidationRun.Trigger.DASHBOARD,
            prepare=request.POST.get("prepare") in ("on", "1", "true"),
        )
    except services.ConsolidationBusy:
        return redirect(page + "?busy=1")
    except services.NothingToConsolidate:
        return redirect(page + "?nothing=1")
    return redirect(page + f"?run={run.pk}#run-{run.pk}")


def _pending_first(facts):
    pending = Case(
        When(status=Fact.Status.ACTIVE, is_consolidated=False, then=Value(0)),
        default=Value(1),
        output_field=IntegerField(),
    )
    return facts.annotate(pending_rank=pending).order_by("pending_rank", "-created_at", "-id")


@team_required
def fact_list(request, kin_id: int):
    """The kin's facts, pending first then newest first; POST adds one (pending until
    the next consolidation)."""
    kin = kin_get(team=request.team, kin_id=kin_id)
    form = FactAddForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        fact = services.fact_record(
            kin=kin,
            statement=form.cleaned_data["statement"],
            category=form.cleaned_data["category"],
            source=Fact.Source.DASHBOARD,
            source_ref=f"user:{request.user.get_username()}",
        )
        return redirect(reverse("dashboard:fact_list", args=[kin.pk]) + f"?added={fact.pk}")
    facts = _pending_first(selectors.fact_list(team=request.team, kin=kin))
    context = {
        "kin": kin,
        "form": form,
        "page": Paginator(facts, FACTS_PER_PAGE).get_page(request.GET.get("page")),
        "pending_count": selectors.facts_pending(kin).count(),
        "added": _positive_int(request.GET.get("added")),
    }
    return render(request, "consolidation/fact_list.html", context, status=400 if request.method == "POST" else 200)
