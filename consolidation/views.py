"""Dashboard pages for a kin's experience document (any version, a diff between any two,
the runs, "Consolidate now") and its fact ledger. Reads are scoped to the user's team
through kin_get (other teams' kins answer 404); writes go through consolidation.services."""
import difflib
import re
from dataclasses import dataclass
from urllib.parse import urlencode

from django import forms
from django.core.paginator import Paginator
from django.db.models import Case, IntegerField, Value, When
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from consolidation import selectors, services
from consolidation.models import ConsolidationRun, ExperienceVersion, Fact
from kinsite.actors import user_ref
from kinsite.errors import ModelNotConfigured
from kinsite.markdown import markdown_render
from kinsite.selectors import kin_get
from kinsite.views import team_required

RUNS_SHOWN = 20
FACTS_PER_PAGE = 50
DIFF_CONTEXT_LINES = 3
SIDE_BY_SIDE = "side-by-side"  # ?layout= value of the two-column diff; anything else is unified


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


Pieces = tuple[tuple[str, bool], ...]  # a line as (text, changed) pieces


@dataclass(frozen=True)
class DiffCell:
    """One side of a side-by-side row: its line number (None where the other side has a
    line this one has not) and its text as (text, changed) pieces, so the words a changed
    line changed can be marked."""

    kind: str  # "add", "del", "same" or "empty": the cell's CSS class
    number: int | None = None
    pieces: Pieces = ()


@dataclass(frozen=True)
class DiffRow:
    before: DiffCell
    after: DiffCell
    gap: bool = False  # a row that stands for lines left out between two hunks

    @property
    def cells(self) -> tuple[DiffCell, DiffCell]:
        return self.before, self.after


def _changed_words(before: str, after: str) -> tuple[Pieces, Pieces]:
    """Each line as (text, changed) pieces, word by word (whitespace kept), against the other."""
    old, new = re.split(r"(\s+)", before), re.split(r"(\s+)", after)
    old_pieces, new_pieces = [], []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if i2 > i1:
            old_pieces.append(("".join(old[i1:i2]), tag != "equal"))
        if j2 > j1:
            new_pieces.append(("".join(new[j1:j2]), tag != "equal"))
    return tuple(old_pieces), tuple(new_pieces)


def experience_side_by_side(before: ExperienceVersion, after: ExperienceVersion) -> list[DiffRow]:
    """The same diff as experience_diff in two columns: unchanged lines aligned, a changed
    line beside the one it replaced (changed words marked), an added or removed line beside
    an empty cell, DIFF_CONTEXT_LINES of context and a gap row wherever lines are left out."""
    old, new = before.markdown.splitlines(), after.markdown.splitlines()
    rows = []
    gap = DiffRow(before=DiffCell("empty"), after=DiffCell("empty"), gap=True)
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    hunks = list(matcher.get_grouped_opcodes(DIFF_CONTEXT_LINES))
    for hunk in hunks:
        _, first_old, _, first_new, _ = hunk[0]
        if rows or first_old > 0 or first_new > 0:
            rows.append(gap)
        for tag, i1, i2, j1, j2 in hunk:
            for offset in range(max(i2 - i1, j2 - j1)):
                i, j = i1 + offset, j1 + offset
                has_old, has_new = i < i2, j < j2
                if tag == "equal":
                    pieces = ((old[i], False),)
                    rows.append(DiffRow(before=DiffCell("same", i + 1, pieces), after=DiffCell("same", j + 1, pieces)))
                    continue
                if has_old and has_new:
                    old_pieces, new_pieces = _changed_words(old[i], new[j])
                else:
                    # A line with nothing beside it is changed as a whole: its cell's colour says so.
                    old_pieces = ((old[i], False),) if has_old else ()
                    new_pieces = ((new[j], False),) if has_new else ()
                rows.append(DiffRow(
                    before=DiffCell("del", i + 1, old_pieces) if has_old else DiffCell("empty"),
                    after=DiffCell("add", j + 1, new_pieces) if has_new else DiffCell("empty"),
                ))
    if hunks:
        _, _, last_old, _, last_new = hunks[-1][-1]
        if last_old < len(old) or last_new < len(new):
            rows.append(gap)
    return rows


def _experience_query(params: dict) -> str:
    """A query string for the experience page with the given parameters (None left out)."""
    return "?" + urlencode({name: value for name, value in params.items() if value is not None})


@team_required
def experience(request, kin_id: int):
    """The document (current, or ?version=N) rendered from its Markdown, the versions, a diff
    (?from=&to=, default: the previous version against the current one; unified, or two
    columns with ?layout=side-by-side) and the consolidation runs."""
    kin = kin_get(team=request.team, kin_id=kin_id)
    versions = list(selectors.experience_versions(kin).defer("markdown"))
    numbers = {version.version for version in versions}

    requested = _positive_int(request.GET.get("version"))
    if request.GET.get("version") and requested not in numbers:
        raise Http404("No such experience version.")
    shown = selectors.experience_get(kin, version=requested) if requested else selectors.experience_current(kin)

    diff_from = _positive_int(request.GET.get("from"))
    diff_to = _positive_int(request.GET.get("to"))
    side_by_side = request.GET.get("layout") == SIDE_BY_SIDE
    if diff_from is None and diff_to is None and len(versions) >= 2:
        diff_from, diff_to = versions[1].version, versions[0].version
    diff, diff_error = None, ""
    if diff_from is not None or diff_to is not None:
        missing = [str(n) for n in (diff_from, diff_to) if n is None or n not in numbers]
        if missing or diff_from is None or diff_to is None:
            diff_error = "Choose two existing versions to compare."
        else:
            before = selectors.experience_get(kin, version=diff_from)
            after = selectors.experience_get(kin, version=diff_to)
            diff = experience_side_by_side(before, after) if side_by_side else experience_diff(before, after)

    consolidated_run = None
    run_id = _positive_int(request.GET.get("run"))
    if run_id:
        consolidated_run = ConsolidationRun.objects.filter(kin=kin, pk=run_id).first()

    compared = {"version": requested, "from": diff_from, "to": diff_to}
    context = {
        "kin": kin,
        "shown": shown,
        "is_current": bool(shown is not None and shown.version == versions[0].version),
        "versions": versions,
        "diff": diff,
        "diff_from": diff_from,
        "diff_to": diff_to,
        "diff_error": diff_error,
        "side_by_side": side_by_side,
        # The layout switch keeps the compared versions (and the version shown).
        "unified_query": _experience_query(compared),
        "side_by_side_query": _experience_query({**compared, "layout": SIDE_BY_SIDE}),
        "document_html": markdown_render(shown.markdown) if shown is not None else "",
        "runs": selectors.consolidation_runs(kin).select_related("experience_version")[:RUNS_SHOWN],
        "pending_count": selectors.facts_pending(kin).count(),
        "consolidated_run": consolidated_run,
        "busy": "busy" in request.GET,
        "nothing": "nothing" in request.GET,
        "no_model": "no_model" in request.GET,
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
    except ModelNotConfigured:
        # The button is disabled then; a form posted anyway (an old page) says the same.
        return redirect(page + "?no_model=1")
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
            source_ref=user_ref(request.user),
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
