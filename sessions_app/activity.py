"""The activity feed of a kin or of a team: every kind of job run and model call in one list,
newest first, filtered by kind and status, paged by a keyset cursor. It reads every app's rows,
so it lives in the top layer (see pyproject's import-linter contract).

Paging merges sources without OFFSET: each selected source reads its newest PAGE_SIZE + 1 rows
before the cursor (an index on (created_at, id)), merged by the key (created_at, kind, id); the
last kept row's key is the next cursor. So a page costs one query per source whatever the
number of rows, and rows with equal times are neither skipped nor repeated."""
from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db.models import Model, Q, QuerySet, prefetch_related_objects
from django.urls import reverse

from consolidation.models import ConsolidationRun
from kinsite.models import Kin, LLMCall, Team
from sessions_app.models import CompactionRun, IntrospectionRun, Turn
from workflows.models import WorkflowRun

PAGE_SIZE = 50
ERROR_LINE_MAX_CHARS = 200
CURSOR_MAX_CHARS = 200

# The statuses every kind is shown with (and filtered by); a kind's own status is shown
# beside it where it says more (an introspection "skipped", a consolidation "rejected").
PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"
STATUSES = (PENDING, RUNNING, DONE, FAILED)


class FilterInvalid(ValueError):
    """A filter value or a cursor the page does not know: the view answers 400 with the message."""


@dataclass(frozen=True)
class Scope:
    """Whose activity: a kin's (kin set) or its whole team's (kin None)."""

    team: Team
    kin: Kin | None = None


@dataclass(frozen=True)
class ActivityRow:
    kind: str
    kind_label: str
    pk: int
    created_at: datetime
    status: str  # one of STATUSES
    own_status: str  # the kind's own word for it
    what: str  # one line: the session, the trigger, the workflow, the model
    # With id, name and created_at read (and, on the team's page, its imports): what tells it
    # from a kin of the same name. None for team-level work (workflow runs, a model call of no kin).
    kin: Kin | None
    duration: timedelta | None
    error: str  # the error's first line (failures), else ""
    url: str

    @property
    def key(self) -> tuple[datetime, str, int]:
        return (self.created_at, self.kind, self.pk)

    @property
    def kin_name(self) -> str:
        return self.kin.name if self.kin else ""

    @property
    def shows_own_status(self) -> bool:
        return self.own_status != self.status

    @property
    def duration_text(self) -> str:
        return duration_text(self.duration)


@dataclass(frozen=True)
class Source:
    """One kind of row: how to read a scope's rows (newest first) and show one."""

    kind: str  # in URLs, cursors and CSS classes; the tie-break order of equal times
    label: str
    statuses: dict[str, str]  # the model's status → one of STATUSES
    rows: Callable[[Scope], QuerySet]
    row: Callable[[Model], ActivityRow]
    team_level: bool = False  # not a kin's work: only on the team's page

    def own_statuses(self, wanted: set[str]) -> list[str]:
        return [own for own, status in self.statuses.items() if status in wanted]


# --- showing a row ---------------------------------------------------------------------------


def duration_text(duration: timedelta | None) -> str:
    if duration is None:
        return ""
    ms = max(0, int(duration.total_seconds() * 1000))
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    minutes, seconds = divmod(ms // 1000, 60)
    return f"{minutes} min {seconds} s"


def first_line(error: str) -> str:
    for line in error.splitlines():
        if line.strip():
            line = line.strip()
            return line if len(line) <= ERROR_LINE_MAX_CHARS else line[: ERROR_LINE_MAX_CHARS - 1] + "…"
    return ""


def _duration(job, duration_ms: int = 0) -> timedelta | None:
    if job.started_at and job.finished_at:
        return job.finished_at - job.started_at
    return timedelta(milliseconds=duration_ms) if duration_ms else None


def _row(source_kind: str, job, *, what: str, kin: Kin | None, url: str, duration: timedelta | None,
         error: str = "") -> ActivityRow:
    source = SOURCES[source_kind]
    status = source.statuses.get(job.status, job.status)
    return ActivityRow(
        kind=source.kind, kind_label=source.label, pk=job.pk, created_at=job.created_at, status=status,
        own_status=job.status, what=what, kin=kin, duration=duration,
        error=first_line(error) if status == FAILED else "", url=url,
    )


def _session_url(session_id: int, *, anchor: str = "", query: str = "") -> str:
    url = reverse("dashboard:session_detail", args=[session_id])
    return url + (f"?{query}" if query else "") + (f"#{anchor}" if anchor else "")


def _turn_row(turn: Turn) -> ActivityRow:
    tokens = turn.tokens_in + turn.tokens_out
    what = f"{turn.session} · {turn.tool_calls} tool call{'s' if turn.tool_calls != 1 else ''} · {tokens} tokens"
    if turn.user_message_id:
        # The session page opens the page of its conversation that holds the message.
        url = _session_url(turn.session_id, query=f"event={turn.user_message_id}",
                           anchor=f"event-{turn.user_message_id}")
    else:
        url = _session_url(turn.session_id)
    return _row("turn", turn, what=what, kin=turn.session.kin, url=url, duration=_duration(turn),
                error=turn.error)


def _introspection_row(run: IntrospectionRun) -> ActivityRow:
    what = f"{run.get_trigger_display()} · {run.session} · {run.event_count} event{'s' if run.event_count != 1 else ''}"
    # ?run= makes the session page's panel list runs down to this one.
    return _row("introspection", run, what=what, kin=run.session.kin,
                url=_session_url(run.session_id, query=f"run={run.pk}", anchor=f"introspection-run-{run.pk}"),
                duration=_duration(run, run.duration_ms), error=run.error)


def _compaction_row(run: CompactionRun) -> ActivityRow:
    what = f"{run.session}" + (f" · summary #{run.summary_id}" if run.summary_id else "")
    return _row("compaction", run, what=what, kin=run.session.kin, url=_session_url(run.session_id),
                duration=_duration(run), error=run.error)


def _consolidation_row(run: ConsolidationRun) -> ActivityRow:
    what = run.get_trigger_display() + (f" for {run.night:%Y-%m-%d}" if run.night else "")
    if run.word_count:
        what += f" · {run.word_count} words"
    url = reverse("dashboard:experience", args=[run.kin_id]) + f"?run={run.pk}#run-{run.pk}"
    return _row("consolidation", run, what=what, kin=run.kin, url=url,
                duration=_duration(run, run.duration_ms), error=run.error)


def _workflow_run_row(run: WorkflowRun) -> ActivityRow:
    return _row("workflow_run", run, what=run.workflow.name, kin=None,
                url=reverse("dashboard:workflow_detail", args=[run.workflow_id]), duration=_duration(run),
                error=run.error)


def _model_call_row(call: LLMCall) -> ActivityRow:
    what = f"{call.purpose} · {call.provider}/{call.model} · {call.tokens_in} in / {call.tokens_out} out tokens"
    duration = timedelta(milliseconds=call.latency_ms) if call.latency_ms else None
    return _row("model_call", call, what=what, kin=call.kin if call.kin_id else None,
                url=reverse("dashboard:model_call_detail", args=[call.pk]), duration=duration, error=call.error)


# --- reading a scope's rows ------------------------------------------------------------------
# Each reads only what its row shows (the audit rows hold prompts and answers), scoped to the
# team through the row's owner; indexes on (created_at, id), or (owner, created_at, id),
# serve the newest-first reads (sessions_app 0016, consolidation 0005, workflows 0002, kinsite 0006).

JOB_FIELDS = ("id", "status", "error", "created_at", "started_at", "finished_at")
SESSION_FIELDS = ("session__id", "session__title", "session__kin__id", "session__kin__name", "session__kin__created_at")


def _by_session(model, scope: Scope) -> QuerySet:
    rows = model.objects.select_related("session__kin")
    return rows.filter(session__kin=scope.kin) if scope.kin else rows.filter(session__kin__team=scope.team)


def _turns(scope: Scope) -> QuerySet:
    return _by_session(Turn, scope).only(
        *JOB_FIELDS, *SESSION_FIELDS, "user_message_id", "tool_calls", "tokens_in", "tokens_out"
    )


def _introspection_runs(scope: Scope) -> QuerySet:
    return _by_session(IntrospectionRun, scope).only(*JOB_FIELDS, *SESSION_FIELDS, "trigger", "event_count",
                                                     "duration_ms")


def _compaction_runs(scope: Scope) -> QuerySet:
    return _by_session(CompactionRun, scope).only(*JOB_FIELDS, *SESSION_FIELDS, "summary_id")


def _consolidation_runs(scope: Scope) -> QuerySet:
    rows = ConsolidationRun.objects.select_related("kin").only(
        *JOB_FIELDS, "kin__id", "kin__name", "kin__created_at", "trigger", "night", "word_count", "duration_ms"
    )
    return rows.filter(kin=scope.kin) if scope.kin else rows.filter(kin__team=scope.team)


def _workflow_runs(scope: Scope) -> QuerySet:
    return WorkflowRun.objects.select_related("workflow").only(*JOB_FIELDS, "workflow__id", "workflow__name").filter(
        workflow__team=scope.team
    )


def _model_calls(scope: Scope) -> QuerySet:
    rows = LLMCall.objects.select_related("kin").only(
        "id", "status", "error", "created_at", "purpose", "provider", "model", "tokens_in", "tokens_out",
        "latency_ms", "kin__id", "kin__name", "kin__created_at",
    )
    return rows.filter(kin=scope.kin) if scope.kin else rows.filter(team=scope.team)


JOB_STATUSES = {PENDING: PENDING, RUNNING: RUNNING, DONE: DONE, FAILED: FAILED}

SOURCES: dict[str, Source] = {
    source.kind: source
    for source in [
        Source("turn", "Turn", JOB_STATUSES, _turns, _turn_row),
        Source("introspection", "Introspection", {**JOB_STATUSES, IntrospectionRun.Status.SKIPPED: DONE},
               _introspection_runs, _introspection_row),
        Source("compaction", "Compaction", JOB_STATUSES, _compaction_runs, _compaction_row),
        Source("consolidation", "Consolidation", {
            ConsolidationRun.Status.PENDING: PENDING,
            ConsolidationRun.Status.RUNNING: RUNNING,
            ConsolidationRun.Status.APPLIED: DONE,
            ConsolidationRun.Status.PREPARED: DONE,
            ConsolidationRun.Status.SKIPPED: DONE,
            # The model's answers did not validate: nothing changed, someone should look.
            ConsolidationRun.Status.REJECTED: FAILED,
            ConsolidationRun.Status.FAILED: FAILED,
        }, _consolidation_runs, _consolidation_row),
        Source("workflow_run", "Workflow run", JOB_STATUSES, _workflow_runs, _workflow_run_row, team_level=True),
        Source("model_call", "Model call", {LLMCall.Status.OK: DONE, LLMCall.Status.ERROR: FAILED},
               _model_calls, _model_call_row),
    ]
}


def kinds_for(scope: Scope) -> list[Source]:
    """The kinds a scope's page lists: a kin's page has no team-level work."""
    return [source for source in SOURCES.values() if not (scope.kin and source.team_level)]


# --- the cursor ------------------------------------------------------------------------------

Key = tuple[datetime, str, int]


def cursor_encode(key: Key) -> str:
    created_at, kind, pk = key
    raw = f"{created_at.isoformat()}|{kind}|{pk}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


CURSOR_INVALID = (
    "This page link is broken or out of date (its cursor is not one Kinsite made). Start again from the newest."
)


def cursor_decode(text: str) -> Key:
    """The key a cursor names; FilterInvalid for anything cursor_encode could not have made."""
    if len(text) > CURSOR_MAX_CHARS:
        raise FilterInvalid(CURSOR_INVALID)
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
        stamp, kind, pk_text = raw.split("|")
        created_at = datetime.fromisoformat(stamp)
        pk = int(pk_text)
        if created_at.tzinfo is None:
            raise ValueError("a cursor's time must have a time zone")
        # In UTC, as the database compares it (year 1 at +05:00 would overflow there).
        created_at = created_at.astimezone(UTC)
    except (ValueError, OverflowError, binascii.Error, UnicodeDecodeError) as exc:
        raise FilterInvalid(CURSOR_INVALID) from exc
    if kind not in SOURCES or not pk_text.isdigit() or not 0 < pk < 2**63:
        raise FilterInvalid(CURSOR_INVALID)
    return (created_at, kind, pk)


def _before(rows: QuerySet, kind: str, cursor: Key | None) -> QuerySet:
    """The rows of `kind` whose key (created_at, kind, id) is below the cursor's. The
    created_at bound comes alone first, as a range the index serves."""
    if cursor is None:
        return rows
    created_at, cursor_kind, pk = cursor
    if kind < cursor_kind:
        return rows.filter(created_at__lte=created_at)
    if kind > cursor_kind:
        return rows.filter(created_at__lt=created_at)
    return rows.filter(created_at__lte=created_at).filter(Q(created_at__lt=created_at) | Q(pk__lt=pk))


# --- the page --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ActivityPage:
    rows: list[ActivityRow]
    next_cursor: str | None


def activity_page(*, scope: Scope, kinds: list[str], statuses: list[str], cursor: Key | None = None,
                  size: int = PAGE_SIZE) -> ActivityPage:
    """One page of the scope's activity, newest first: at most one query per kind, and on the
    team's page one more for the imports of the rows' kins (a kin's page names its kin once,
    above the rows)."""
    wanted = set(statuses)
    rows: list[ActivityRow] = []
    for kind in kinds:
        source = SOURCES[kind]
        queryset = source.rows(scope)
        if wanted:
            own = source.own_statuses(wanted)
            if not own:
                continue
            queryset = queryset.filter(status__in=own)
        queryset = _before(queryset, kind, cursor).order_by("-created_at", "-id")
        rows.extend(source.row(item) for item in queryset[: size + 1])
    rows.sort(key=lambda row: row.key, reverse=True)
    page = rows[:size]
    if scope.kin is None:
        prefetch_related_objects([row.kin for row in page if row.kin], "imports")
    return ActivityPage(rows=page, next_cursor=cursor_encode(page[-1].key) if len(rows) > size else None)
