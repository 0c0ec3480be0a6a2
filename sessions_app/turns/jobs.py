"""Turns as background jobs (kinsite.jobs; docs/deployment.md#stuck-work): sending a turn's
task, the sweeps' view of turns, and putting back a turn our own service stopped, counted in
`auto_retries`. A model failure is not retried here (services.turn_retry is by hand)."""
from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import F
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerUnreachable

from kinsite.errors import ServiceUnavailable
from kinsite.jobs import (
    REDIS_OUTAGES,
    JobKind,
    Recovered,
    job_release,
    job_send,
    jobs_recover_stalled,
    jobs_requeue,
)
from sessions_app.locks import SessionBusy, lease_seconds, session_lock
from sessions_app.models import Turn
from sessions_app.turns.events import END, turn_event_publish

logger = logging.getLogger(__name__)


# A turn whose process stopped this many times (say it runs out of memory) is failed rather
# than started again for ever.
TURN_MAX_ATTEMPTS = 3


UNFINISHED = (Turn.Status.PENDING, Turn.Status.RUNNING)



class TurnNotQueued(ServiceUnavailable):
    """An async turn is stored, but the broker (Redis) did not take its task; it stays
    pending for the requeue sweep."""

    code = "broker_unavailable"



def turns_requeue(*, now: datetime | None = None) -> list[int]:
    """Queue again the turns left pending without a queued task (posted while the broker was
    down, lost in a Redis restart, made pending by the stalled sweep); their ids. A turn queued
    twice still runs once (turn_run claims it)."""
    return jobs_requeue(TURN_JOBS, now=now)



def turn_stalled_after() -> timedelta:
    """How long a turn must have been running, its session lock free, before the stalled sweep
    takes it over: one lease of the session lock. A live turn holds the lock until it ends,
    renewing it before every model call, and a late renewal fails; so a turn older than a lease
    whose lock nobody holds has no process left that can store its reply."""
    return timedelta(seconds=lease_seconds())



def turns_recover_stalled(*, now: datetime | None = None) -> Recovered:
    """Take over the turns left running by a process that stopped (a dead web process or
    worker, an unacknowledged task Redis lost), sync turns included.

    A turn running past turn_stalled_after() is taken over only if its session lock can be
    taken at once (else someone works on the session, maybe on this very turn); under the
    lock it is checked again and queued again, and runs with the tool rounds already stored,
    so nothing is done twice. After TURN_MAX_ATTEMPTS starts it is failed instead."""
    return jobs_recover_stalled(TURN_JOBS, now=now)



@contextmanager
def _turn_free(turn: Turn) -> Iterator[bool]:
    """For the stalled sweep: hold the turn's session lock while its fate is written, if it
    can be taken at once. No wait: a held lock means the session is busy."""
    with ExitStack() as stack:
        try:
            stack.enter_context(session_lock(turn.session_id, timeout=0))
        except SessionBusy:
            yield False
            return
        yield True



def turn_give_up(turn: Turn) -> str | None:
    """A stalled turn runs again (None) unless it has started TURN_MAX_ATTEMPTS times."""
    return _out_of_attempts_error(turn) if turn.attempts >= TURN_MAX_ATTEMPTS else None


TURN_JOBS = JobKind(
    name="turn", label="turns", model="sessions_app.Turn", task="sessions_app.tasks.run_turn_task",
    stalled_after=turn_stalled_after, free=_turn_free, give_up=turn_give_up,
    reads=("session_id", "attempts", "user_message_id"), counts_attempts=True, released_at_field="retried_at",
)



def turn_enqueue(turn: Turn) -> None:
    """Send the async turn's task; the broker not answering raises TurnNotQueued (503),
    leaving the stored turn pending for the requeue sweep."""
    try:
        job_send(TURN_JOBS, turn.pk)
    except BrokerUnreachable as exc:
        logger.warning("Turn %s is stored but not queued, the broker is unreachable: %s", turn.pk, exc)
        raise TurnNotQueued(
            f"The task queue (Redis) is unreachable, so turn {turn.pk} could not be queued yet. Your message "
            f"is stored (message {turn.user_message_id}) and the turn stays pending: it runs once the queue "
            f"is back. Poll GET /api/v1/turns/{turn.pk}/ and do not post the message again.",
            details={"service": "redis", "stored": True, "turn": turn.pk, "message": turn.user_message_id},
        ) from exc



def turn_send_again(turn_id: int) -> None:
    """Queue again a turn whose task ran an earlier turn of its session instead."""
    if not Turn.objects.filter(pk=turn_id, status__in=UNFINISHED).exists():
        return
    try:
        job_send(TURN_JOBS, turn_id)
    except REDIS_OUTAGES as exc:
        # The turn stays pending; the requeue sweep sends it once its queued marker is gone.
        logger.warning("Turn %s waits for the sweeps, the broker is unreachable: %s", turn_id, exc)



def _out_of_attempts_error(turn: Turn) -> str:
    return (f"The process running this turn stopped before it finished, {turn.attempts} times, so it is not "
            f"run again. Your message is stored (message {turn.user_message_id}), with whatever the kin did so "
            f"far; retry the turn (POST /api/v1/turns/{turn.pk}/retry/, or Retry in the chat) once the cause is "
            f"fixed.")



def _out_of_auto_retries_error(*, turn_id: int, message_id: int | None, retries: int, reason: str) -> str:
    return (f"Our own service stopped this turn before its reply {retries + 1} times, and after "
            f"{retries} automatic retries it is not run again. The last time: {reason} Your message is stored "
            f"(message {message_id}); retry the turn (POST /api/v1/turns/{turn_id}/retry/, or Retry in the "
            f"chat) once the service is fixed.")



def turn_requeue_started(*, turn: Turn, reason: str) -> None:
    """A claimed turn our own service stopped: back to pending, one more automatic retry, or
    failed past settings.TURN_AUTO_RETRIES. Written only if the turn is still this claim's (its
    started_at): a turn whose lock was lost may be another process's now."""
    now = timezone.now()
    this_claim = {"started_at": turn.started_at}
    counters = {"tool_calls": turn.tool_calls, "prompt_tokens": turn.prompt_tokens, "tokens_in": turn.tokens_in,
                "tokens_out": turn.tokens_out}
    if turn.auto_retries >= settings.TURN_AUTO_RETRIES:
        error = _out_of_auto_retries_error(turn_id=turn.pk, message_id=turn.user_message_id,
                                           retries=turn.auto_retries, reason=reason)
        if Turn.objects.filter(pk=turn.pk, status=Turn.Status.RUNNING, **this_claim).update(
            status=Turn.Status.FAILED, error=error, finished_at=now, **counters,
        ):
            turn.status, turn.error, turn.finished_at = Turn.Status.FAILED, error, now
            logger.warning("Turn %s failed: out of automatic retries (%s)", turn.pk, reason)
        return
    if job_release(TURN_JOBS, turn.pk, match=this_claim, now=now, auto_retries=F("auto_retries") + 1,
                   retry_reason=reason, error="", **counters):
        turn.status, turn.started_at, turn.retry_reason, turn.retried_at = Turn.Status.PENDING, None, reason, now
        turn.auto_retries += 1
        logger.warning("Turn %s is queued again (automatic retry %d): %s", turn.pk, turn.auto_retries, reason)



def turn_requeue_unstarted(turn_id: int, *, reason: str) -> None:
    """A pending turn whose task could not take the session lock: one more automatic retry, its
    queued marker dropped so the requeue sweep sends it again, or failed past
    settings.TURN_AUTO_RETRIES. A turn no longer pending (another task took it) is left alone."""
    turn = Turn.objects.filter(pk=turn_id, status=Turn.Status.PENDING).only("auto_retries", "user_message_id").first()
    if turn is None:
        return
    now = timezone.now()
    if turn.auto_retries >= settings.TURN_AUTO_RETRIES:
        error = _out_of_auto_retries_error(turn_id=turn.pk, message_id=turn.user_message_id,
                                           retries=turn.auto_retries, reason=reason)
        if Turn.objects.filter(pk=turn.pk, status=Turn.Status.PENDING).update(
            status=Turn.Status.FAILED, error=error, finished_at=now,
        ):
            turn.status = Turn.Status.FAILED
            turn_event_publish(turn, END, {"status": turn.status, "code": "turn_abandoned"})
            logger.warning("Turn %s failed: out of automatic retries (%s)", turn.pk, reason)
        return
    if job_release(TURN_JOBS, turn.pk, statuses=(Turn.Status.PENDING,), now=now,
                   auto_retries=F("auto_retries") + 1, retry_reason=reason):
        logger.warning("Turn %s is queued again (automatic retry %d): %s", turn.pk, turn.auto_retries + 1, reason)
