"""The introspection panel of a session's page: its recent runs, the newest compaction summary,
and whether to poll while a run is queued or running (rendered by sessions.py's views)."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.db.models import Q
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.utils.cache import patch_vary_headers

from sessions_app import selectors
from sessions_app.compaction import latest_summary
from sessions_app.introspection.converse import introspection_settings
from sessions_app.models import IntrospectionRun, Session
from sessions_app.views.entries import ToolStep, pretty_arguments

# The introspection panel lists the newest runs; "Show older runs" adds this many more, up to the maximum.
RUNS_PER_PAGE = 10
RUNS_MAX = 200
# While a run is queued or running the panel refreshes itself (htmx) this often.
RUNS_POLL_SECONDS = 2
# The panel polls only for runs requested this recently: a run left pending (no worker, a lost
# task) is the stalled sweep's to settle, not a reason for every open tab to poll forever.
RUNS_POLL_MAX_AGE = timedelta(minutes=10)

# What each memories_touched action did, in the words of the run's end summary.
MEMORY_ACTION_LABELS = {
    "created": "added",
    "merged_with_existing": "merged into existing",
    "updated": "updated",
    "deleted": "deleted",
}


@dataclass
class RunRow:
    """An introspection run as the panel shows it: its tool calls as steps and the
    memories it touched with what it did to each."""

    run: IntrospectionRun
    tool_steps: list[ToolStep]
    memories: list[dict]

    @property
    def duration(self) -> str:
        ms = self.run.duration_ms
        return f"{ms} ms" if ms < 1000 else f"{ms / 1000:.1f} s"

    @property
    def tokens(self) -> int:
        return self.run.tokens_in + self.run.tokens_out


def run_row(run: IntrospectionRun) -> RunRow:
    steps = []
    for call in run.tool_calls or []:
        if not isinstance(call, dict):
            continue
        result, applied = call.get("result"), call.get("applied")
        steps.append(ToolStep(
            name=str(call.get("name", "")),
            arguments=pretty_arguments(call.get("arguments", "")),
            result=None if result is None else str(result),
            applied=None if applied is None else str(applied),
        ))
    memories = [
        {"id": item["id"], "action": MEMORY_ACTION_LABELS.get(item.get("action"), str(item.get("action", "")))}
        for item in run.memories_touched or []
        if isinstance(item, dict) and isinstance(item.get("id"), int)
    ]
    return RunRow(run=run, tool_steps=steps, memories=memories)


def runs_to_show(request) -> int:
    try:
        shown = int(request.GET.get("runs", RUNS_PER_PAGE))
    except ValueError:
        shown = RUNS_PER_PAGE  # an old or mistyped link: the default, not an error
    return min(max(shown, RUNS_PER_PAGE), RUNS_MAX)


def runs_to_show_for_run(request, chat_session: Session) -> int:
    """runs_to_show, or with ?run= (an activity row's link to a run) and no ?runs=: enough runs
    to include that one, up to RUNS_MAX. One query counting the newer runs."""
    run_id = request.GET.get("run", "")
    if "runs" in request.GET or not run_id.isdigit() or len(run_id) > 18:
        return runs_to_show(request)
    run = IntrospectionRun.objects.filter(session=chat_session, pk=int(run_id)).values("created_at", "pk").first()
    if run is None:
        return runs_to_show(request)
    newer = selectors.introspection_run_list(session=chat_session).filter(
        Q(created_at__gt=run["created_at"]) | Q(created_at=run["created_at"], pk__gt=run["pk"])
    ).count()
    return min(max(newer + 1, RUNS_PER_PAGE), RUNS_MAX)


def introspection_context(chat_session: Session, *, runs_shown: int, checkpoint_error: str = "",
                          checkpoint_run: IntrospectionRun | None = None) -> dict:
    """The panel's context: the runs in one query (one row more than shown tells whether
    there are older ones) and the newest compaction summary in another."""
    runs = list(selectors.introspection_run_list(session=chat_session)[: runs_shown + 1])
    more = len(runs) > runs_shown
    runs = runs[:runs_shown]
    active = (IntrospectionRun.Status.PENDING, IntrospectionRun.Status.RUNNING)
    poll_since = timezone.now() - RUNS_POLL_MAX_AGE
    return {
        "runs": [run_row(run) for run in runs],
        "runs_shown": runs_shown,
        "more_runs": runs_shown + RUNS_PER_PAGE if more else None,
        "runs_poll_seconds": RUNS_POLL_SECONDS if any(
            run.status in active and run.created_at >= poll_since for run in runs) else None,
        # The prompt's conversation state starts from the newest compaction summary.
        "summary": latest_summary(chat_session),
        "introspection_enabled": introspection_settings(chat_session.kin).enabled,
        "checkpoint_error": checkpoint_error,
        "checkpoint_run": checkpoint_run,
    }


def panel_partial(request, chat_session: Session, *, runs_shown: int, checkpoint_error: str = "",
                  checkpoint_run: IntrospectionRun | None = None):
    context = {
        "chat_session": chat_session,
        "kin": chat_session.kin,
        # The partial also refreshes the description under the page title, out of band.
        "oob": True,
        **introspection_context(chat_session, runs_shown=runs_shown, checkpoint_error=checkpoint_error,
                                checkpoint_run=checkpoint_run),
    }
    response = render(request, "dashboard/_introspection_panel.html", context)
    patch_vary_headers(response, ["HX-Request"])
    return response


def panel_url(chat_session: Session, runs_shown: int = RUNS_PER_PAGE) -> str:
    url = reverse("dashboard:session_detail", args=[chat_session.pk])
    if runs_shown != RUNS_PER_PAGE:
        url += f"?runs={runs_shown}"
    return url + "#introspection"
