"""Introspection (docs/concepts/introspection.md): an agent run that reads a session's raw
events since its last run and maintains the kin's memories, the session's working memory and
description through six tools (tools.py).

The newest introspection_end event is the cursor; a run applies its changes with that event
in one transaction, so one that fails applies nothing and the next reads the same events. One
run per session at a time: a cache lock naming the run, backed by a partial unique constraint."""
from __future__ import annotations

import json
import logging
import time
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, Q, Subquery, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from consolidation.services import fact_record
from kinsite.actors import writer_ref
from kinsite.cachelock import cache_lock
from kinsite.errors import Conflict
from kinsite.jobs import (
    JobBusy,
    job_claim,
    job_send_if_stale,
    job_send_on_commit,
)
from kinsite.llm.providers import chat_model_configured, model_not_configured_message
from kinsite.models import Kin
from kinsite.prompt_templates import template_resolve
from kinsite.tokencount import count_tokens
from memories.models import Memory
from sessions_app.introspection.converse import (
    INTROSPECTED_KINDS,
    events_after,
    events_to_introspect,
    introspection_converse,
    introspection_prompt,
    introspection_settings,
    tool_context_for,
)
from sessions_app.introspection.jobs import INTERRUPTED, INTROSPECTION_JOBS, LOCK_KEY
from sessions_app.introspection.tools import (
    IntrospectionState,
    memory_write_apply,
)
from sessions_app.models import Event, IntrospectionRun, Session

logger = logging.getLogger(__name__)


Trigger = IntrospectionRun.Trigger


Status = IntrospectionRun.Status


SUMMARY_NOTE_MAX_CHARS = 500


NOTHING_WORTH_STORING = "Nothing worth storing."


# A pending run older than this is enqueued again when reused: its task may have been lost.
STALE_PENDING = timedelta(minutes=10)



class IntrospectionBusy(JobBusy):
    """Another run of the session holds it; this one is left pending."""

    code = "introspection_busy"



class IntrospectionDisabled(Conflict):
    code = "introspection_disabled"



def introspection_request(*, session: Session, trigger: str) -> IntrospectionRun:
    """A pending run of `session`, enqueued after commit; the pending one if there is one (it
    covers every event up to when it starts). IntrospectionDisabled when off for the kin."""
    if not introspection_settings(session.kin).enabled:
        raise IntrospectionDisabled(
            f"Introspection is disabled for kin {session.kin.name}.", details={"kin": session.kin_id}
        )
    with transaction.atomic():
        # The session row lock makes two concurrent requests agree on one pending run (PostgreSQL;
        # SQLite serialises writers anyway).
        Session.objects.select_for_update().filter(pk=session.pk).values_list("pk").first()
        run = IntrospectionRun.objects.filter(session=session, status=Status.PENDING).order_by("id").first()
        if run is not None:
            job_send_if_stale(INTROSPECTION_JOBS, run, after=STALE_PENDING)
            return run
        run = IntrospectionRun.objects.create(session=session, trigger=trigger)
        # The broker down: this raises (the API answers 503), the run pending for the requeue sweep.
        job_send_on_commit(INTROSPECTION_JOBS, run.pk)
    return run



def introspection_after_turn(*, session: Session) -> IntrospectionRun | None:
    """After a completed turn (counted in turns_since_introspection when its reply was
    stored): every `turn_interval` turns, request a run."""
    config = introspection_settings(session.kin)
    if not config.enabled or config.turn_interval <= 0:
        return None
    # The conditional reset decides which of two racing callers fires the trigger: only one update matches.
    if not Session.objects.filter(pk=session.pk, turns_since_introspection__gte=config.turn_interval).update(
        turns_since_introspection=0
    ):
        return None
    return introspection_request(session=session, trigger=Trigger.TURNS)



def idle_sessions_due(now: datetime) -> list[Session]:
    """The idle scan's decision: sessions idle for their kin's idle_timeout_minutes that have
    events after their cursor and no run queued or running. One query over the flagged
    sessions idle past the shortest timeout in force (idle_sessions_flagged), never all; a
    flagged session with nothing after its cursor gets its flag cleared."""
    timeouts = _idle_timeouts()
    if not timeouts:
        return []
    due, stale = [], []
    for session in idle_sessions_flagged(cutoff=now - timedelta(minutes=min(timeouts))):
        config = introspection_settings(session.kin)
        if not config.enabled or config.idle_timeout_minutes <= 0:
            continue
        idle_since = now - timedelta(minutes=config.idle_timeout_minutes)
        if session.last_activity_at > idle_since:
            continue
        if not session.has_new_events:
            stale.append(session)
        elif session.last_failed_at is None or session.last_failed_at <= idle_since:
            due.append(session)  # a recent failure backs off until the timeout has passed again
    if stale:
        # Conditional on last_activity_at, so a session that got a new event meanwhile stays flagged.
        stale_filter = Q()
        for session in stale:
            stale_filter |= Q(pk=session.pk, last_activity_at=session.last_activity_at)
        Session.objects.filter(stale_filter).update(introspection_pending=False)
    return due



def idle_sessions_flagged(*, cutoff: datetime):
    """The idle scan's query: sessions flagged introspection_pending, last active by `cutoff`,
    without a queued or running run (a range scan of session_introspection_due), each with
    `cursor_event_id`, `has_new_events` and `last_failed_at`. The cursor is read from the done
    runs' last_event_id (written with the end event, so equal to it): unlike a value inside
    the event's JSON, every database can order and compare it."""
    active_runs = IntrospectionRun.objects.filter(session=OuterRef("pk"), status__in=[Status.PENDING, Status.RUNNING])
    done_runs = IntrospectionRun.objects.filter(session=OuterRef("pk"), status=Status.DONE).order_by("-last_event_id")
    failed_runs = IntrospectionRun.objects.filter(session=OuterRef("pk"), status=Status.FAILED).order_by("-finished_at")
    new_events = (
        Event.objects.filter(session_id=OuterRef("pk"), pk__gt=OuterRef("cursor_event_id"), kind__in=INTROSPECTED_KINDS)
        .exclude(kind=Event.Kind.COMMAND, role=Event.Role.SYSTEM)
    )
    return (
        Session.objects.filter(introspection_pending=True, last_activity_at__lte=cutoff)
        .exclude(Exists(active_runs))
        .annotate(cursor_event_id=Coalesce(Subquery(done_runs.values("last_event_id")[:1]), Value(0)))
        .annotate(has_new_events=Exists(new_events), last_failed_at=Subquery(failed_runs.values("finished_at")[:1]))
        .select_related("kin")
        .order_by("last_activity_at")
    )



def _idle_timeouts() -> list[int]:
    """Every idle timeout in force: the default and each kin override (kins are few)."""
    timeouts = set()
    base = settings.INTROSPECTION
    if base.get("enabled", True) and int(base.get("idle_timeout_minutes", 10)) > 0:
        timeouts.add(int(base["idle_timeout_minutes"]))
    for kin in Kin.objects.exclude(overrides={}).only("pk", "overrides"):
        config = introspection_settings(kin)
        if config.enabled and config.idle_timeout_minutes > 0:
            timeouts.add(config.idle_timeout_minutes)
    return sorted(timeouts)



def introspection_idle_scan(*, now: datetime | None = None) -> list[IntrospectionRun]:
    """The idle scan (beat's scan_idle_sessions_task): request a run for every session due."""
    runs = []
    for session in idle_sessions_due(now or timezone.now()):
        try:
            runs.append(introspection_request(session=session, trigger=Trigger.IDLE))
        except IntrospectionDisabled:
            continue
    return runs



def _session_lock(session_id: int, run_id: int):
    """The session's introspection lock for `run_id`: yields None when taken, else the
    holder's value ("<run id>:<token>")."""
    return cache_lock(LOCK_KEY.format(session_id=session_id), owner=str(run_id))



def session_introspect(*, run_id: int) -> IntrospectionRun | None:
    """Run a requested introspection. Idempotent: a finished run is returned untouched, and a
    second delivery while it is in progress does nothing. IntrospectionBusy when another run
    has the session (this one stays pending); a failure is recorded on the run and re-raised."""
    run = IntrospectionRun.objects.filter(pk=run_id).select_related("session__kin__team").first()
    if run is None or run.status not in (Status.PENDING, Status.RUNNING):
        return run
    with _session_lock(run.session_id, run.pk) as holder:
        if holder is not None:
            if holder.split(":", 1)[0] == str(run.pk):
                return run  # a duplicate delivery while this very run is in progress
            raise IntrospectionBusy(
                f"Session {run.session_id} is being introspected by another run.",
                details={"session": run.session_id, "run": run.pk},
            )
        if not _claim(run):
            return IntrospectionRun.objects.get(pk=run.pk)
        return _run(run)



def _claim(run: IntrospectionRun) -> bool:
    """Mark the run running. Under the lock, any other running run of the session belongs to a
    dead worker and is failed; our own found running is a redelivery after a death, run again."""
    now = timezone.now()
    try:
        with transaction.atomic():
            IntrospectionRun.objects.filter(session_id=run.session_id, status=Status.RUNNING).exclude(
                pk=run.pk
            ).update(status=Status.FAILED, finished_at=now, error=INTERRUPTED)
            claimed = job_claim(INTROSPECTION_JOBS, run.pk, rerun=True, now=now, error="")
            if claimed:
                Session.objects.filter(pk=run.session_id).update(turns_since_introspection=0)
    except IntegrityError as exc:
        # One running run per session: our lock expired under a run still going. Leave this pending.
        raise IntrospectionBusy(
            f"Session {run.session_id} is being introspected by another run.",
            details={"session": run.session_id, "run": run.pk},
        ) from exc
    if claimed:
        run.status, run.started_at = Status.RUNNING, now
    return claimed



def _run(run: IntrospectionRun) -> IntrospectionRun:
    session = Session.objects.select_related("kin__team").get(pk=run.session_id)
    kin = session.kin
    config = introspection_settings(kin)
    started = time.monotonic()
    if not config.enabled:
        return _finish_without_run(run, started, "Introspection is disabled for this kin.")
    events = events_to_introspect(session=session, token_budget=kin.effective_history_budget)
    if not events:
        Session.objects.filter(pk=session.pk).update(introspection_pending=False)
        return _finish_without_run(run, started, "No new events since the last introspection.")
    if not chat_model_configured():
        # The events stay after the cursor, so the first run with a model covers them; the
        # flag is cleared so the idle scan does not record a skipped run every few minutes.
        Session.objects.filter(pk=session.pk).update(introspection_pending=False)
        return _finish_without_run(run, started, model_not_configured_message("Introspection"))

    run.first_event_id, run.last_event_id, run.event_count = events[0].pk, events[-1].pk, len(events)
    template = template_resolve(kind="introspection", kin=kin)
    with transaction.atomic():
        run.start_event = Event.objects.create(
            session=session, kind=Event.Kind.INTROSPECTION_START, role=Event.Role.SYSTEM,
            content=f"Introspection run {run.pk} ({run.trigger}) started: {len(events)} events.",
            data={"run": run.pk, "trigger": run.trigger, "first_event_id": run.first_event_id,
                  "last_event_id": run.last_event_id, "event_count": run.event_count},
        )
        run.template_source = template.source
        run.save(update_fields=["start_event", "first_event_id", "last_event_id", "event_count", "template_source"])

    state = IntrospectionState()
    try:
        prompt = introspection_prompt(template, kin=kin, session=session, events=events, config=config, run=run)
        note = introspection_converse(run=run, session=session, prompt=prompt, state=state, config=config)
        _apply(run=run, session=session, state=state, note=note, started=started)
    except Exception as exc:
        for call in run.tool_calls:
            call.pop("applied", None)  # rolled back with the rest of the changes
        run.status = Status.FAILED
        run.error = _error_text(exc)
        run.finished_at = timezone.now()
        run.duration_ms = _elapsed_ms(started)
        run.save(update_fields=["status", "error", "finished_at", "duration_ms", "tool_calls", "tokens_in",
                                "tokens_out", "template_source"])
        logger.warning("Introspection run %s of session %s failed: %s", run.pk, session.pk, run.error)
        raise
    return run



def _finish_without_run(run: IntrospectionRun, started: float, summary: str) -> IntrospectionRun:
    run.status = Status.SKIPPED
    run.summary = summary
    run.finished_at = timezone.now()
    run.duration_ms = _elapsed_ms(started)
    run.save(update_fields=["status", "summary", "finished_at", "duration_ms"])
    return run



def _elapsed_ms(started: float) -> int:
    return round((time.monotonic() - started) * 1000)



def _error_text(exc: Exception) -> str:
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {message}"[:2000]



def _apply(*, run: IntrospectionRun, session: Session, state: IntrospectionState, note: str,
           started: float) -> None:
    """Apply the staged changes, write the end event (the new cursor) and close the run, atomically."""
    kin = session.kin
    tool_context = tool_context_for(run=run, kin=kin)
    with transaction.atomic():
        touched: list[dict[str, Any]] = []
        for write in state.memory_writes:
            output = memory_write_apply(tool_context, write)
            run.tool_calls[write.call_index]["applied"] = output
            if not output.startswith("Error:"):
                answer = json.loads(output)
                memory_id = answer["memory"]["id"] if "memory" in answer else answer["id"]
                touched.append({"id": memory_id, "action": answer["status"]})
        _record_facts(kin=kin, run=run, touched=touched)
        fields = {}
        if state.working_memory is not None and state.working_memory != session.working_memory:
            fields["working_memory"] = state.working_memory
        if state.description is not None and state.description != session.description:
            fields["description"] = state.description
        if fields:
            Session.objects.filter(pk=session.pk).update(**fields, updated_at=timezone.now())

        summary = _summary(touched, fields, note)
        run.end_event = Event.objects.create(
            session=session, kind=Event.Kind.INTROSPECTION_END, role=Event.Role.SYSTEM, content=summary,
            token_count=count_tokens(summary),
            data={"run": run.pk, "first_event_id": run.first_event_id, "last_event_id": run.last_event_id,
                  "event_count": run.event_count, "memories": touched,
                  "working_memory_updated": "working_memory" in fields,
                  "description_updated": "description" in fields},
        )
        # Still pending if events arrived after the ones this run read.
        Session.objects.filter(pk=session.pk).update(
            introspection_pending=Exists(events_after(session.pk, run.last_event_id).filter(session_id=OuterRef("pk")))
        )
        run.memories_touched = touched
        run.summary = summary
        run.status = Status.DONE
        run.finished_at = timezone.now()
        run.duration_ms = _elapsed_ms(started)
        run.save(update_fields=["end_event", "memories_touched", "summary", "status", "finished_at", "duration_ms",
                                "tool_calls", "tokens_in", "tokens_out", "template_source"])



def _record_facts(*, kin: Kin, run: IntrospectionRun, touched: list[dict[str, Any]]) -> None:
    """Every memory the run added or changed also lands in the fact ledger as a pending
    fact, in the run's final transaction: the memory's text as it now stands."""
    changed = [item["id"] for item in touched if item["action"] in ("created", "merged_with_existing", "updated")]
    memories = Memory.objects.in_bulk(changed)
    for memory_id in changed:
        memory = memories[memory_id]
        fact_record(kin=kin, statement=memory.content, category=memory.category,
                    source="introspection", source_ref=writer_ref("introspection_run", run.pk), memory=memory)



def _summary(touched: list[dict[str, Any]], fields: dict[str, str], note: str) -> str:
    """The end event's text: what changed, counted, then the model's own note."""
    parts = []
    for action, label in (("created", "added"), ("merged_with_existing", "merged into existing"),
                          ("updated", "updated"), ("deleted", "deleted")):
        ids = [item["id"] for item in touched if item["action"] == action]
        if ids:
            noun = "memory" if len(ids) == 1 else "memories"
            parts.append(f"{label} {len(ids)} {noun} ({', '.join(f'#{i}' for i in ids)})")
    if "working_memory" in fields:
        parts.append("updated the working memory")
    if "description" in fields:
        parts.append("updated the description")
    if not parts:
        return NOTHING_WORTH_STORING
    text = "Introspection " + "; ".join(parts) + "."
    note = " ".join(note.split())
    if note and note.rstrip(".") != NOTHING_WORTH_STORING.rstrip("."):
        text += " " + (note if len(note) <= SUMMARY_NOTE_MAX_CHARS else note[: SUMMARY_NOTE_MAX_CHARS - 1] + "…")
    return text



def introspection_skip(*, run_id: int, reason: str) -> None:
    """Close a run that is still pending without running it (another run had the session)."""
    IntrospectionRun.objects.filter(pk=run_id, status=Status.PENDING).update(
        status=Status.SKIPPED, summary=reason, finished_at=timezone.now()
    )
