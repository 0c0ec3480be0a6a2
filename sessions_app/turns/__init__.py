"""The chat turn (SPEC §4): store the user's message, handle commands, assemble the
prompt (sessions_app.prompt), call the model, run its tool calls (the kin's tools are
turns/tools.py), store the reply, schedule background work (compaction, introspection).

Turns of one session run one after the other, in post order (SPEC §4): whoever holds the
session lock (sessions_app.locks), a worker's task or a sync post, runs the session's oldest
unfinished turn, not necessarily the one it came for (see turn_run), and a turn's prompt
ends at its own message. Each step commits on its own: the user's message before the
model is called (so a failing model loses nothing), each tool round as it happens (a
memory the kin stored stays recorded), and the reply with the turn's outcome.

When Redis is down the API answers 503 and says what it kept: a sync post stores
nothing (no turn can run without the session lock); an async post keeps its message
and pending turn, and kinsite.jobs' requeue sweep queues the turn once the broker is back.
A turn left running by a process that stopped (a killed worker or web process, or a task
Redis lost) is taken over by kinsite.jobs' stalled sweep once nobody holds its session
lock, and run again. A turn our own service stopped before its reply (Redis or the broker
unreachable, its session lock lost, or waited out by its task) goes back to pending
(kinsite.jobs.job_release), counted in `auto_retries`, and the requeue sweep sends it again
once the broker answers; after settings.TURN_AUTO_RETRIES it is failed. A failure of the
model fails the turn at once, to be retried by hand (turn_retry). Beat runs both sweeps
every minute over every kind of job (kinsite.tasks' requeue_jobs_task and
recover_stalled_jobs_task); this module declares the turns' kind (TURN_JOBS) and decides
only what a stalled turn needs: its session lock, free, and whether it has starts left."""
from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.db.models.expressions import RawSQL
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerUnreachable

from kinsite.actors import writer_ref
from kinsite.errors import Conflict, ServiceUnavailable, UpstreamError
from kinsite.jobs import (
    REDIS_OUTAGES,
    JobKind,
    Recovered,
    job_claim,
    job_release,
    job_send,
    jobs_recover_stalled,
    jobs_requeue,
)
from kinsite.llm.gateway import llm_chat
from kinsite.llm.types import LLMError, ToolCall
from kinsite.tokencount import count_tokens
from kinsite.tools import Tool, ToolContext
from memories.models import Memory
from memories.services import Actor, memories_mark_retrieved
from sessions_app.compaction import compaction_needed, compaction_needed_after_turn, compaction_request
from sessions_app.introspection import IntrospectionDisabled, introspection_after_turn, introspection_request
from sessions_app.locks import LockUnavailable, SessionBusy, SessionLock, lease_seconds, session_lock, wait_seconds
from sessions_app.models import Event, IntrospectionRun, Session, Turn
from sessions_app.prompt import AssembledPrompt, prompt_assemble
from sessions_app.services import session_check_open
from sessions_app.turns.events import DELTA, END, RESET, TOOL_CALL, TOOL_RESULT, turn_event_publish
from sessions_app.turns.tools import kin_toolset

logger = logging.getLogger(__name__)

COMMANDS = ("checkpoint", "new")
# A tool's answer is cut to this many characters before it goes back to the model.
TOOL_RESULT_MAX_CHARS = 16_000
# A turn whose process stopped this many times (say it runs out of memory) is failed rather
# than started again for ever.
TURN_MAX_ATTEMPTS = 3
UNFINISHED = (Turn.Status.PENDING, Turn.Status.RUNNING)


class TurnFailed(UpstreamError):
    """The model call of a turn failed; the user's message is stored and the turn records the error."""

    code = "llm_error"


class TurnNotRetryable(Conflict):
    """A retry of a turn that did not fail (it got its reply), or whose message is gone: nothing changes (409)."""

    code = "turn_not_failed"


class TurnNotQueued(ServiceUnavailable):
    """An async turn is stored, but the broker (Redis) did not take its task; it stays
    pending and the requeue sweep (kinsite.tasks.requeue_jobs_task) queues it once the
    broker is back."""

    code = "broker_unavailable"


@dataclass(frozen=True)
class Command:
    name: str  # "checkpoint" or "new"
    argument: str  # the text after the command word


def command_parse(content: str) -> Command | None:
    """`/checkpoint [note]` or `/new [title]` (any case) as the message's first word; else None."""
    words = content.strip().split(maxsplit=1)
    if not words or not words[0].startswith("/"):
        return None
    name = words[0][1:].lower()
    if name not in COMMANDS:
        return None
    return Command(name=name, argument=words[1].strip() if len(words) > 1 else "")


# --- entry points ----------------------------------------------------------------------------


def turn_post(*, session: Session, content: str, sender: str = "", platform: str = Event.Platform.API,
              is_async: bool = False, opened: Callable[[Turn], None] | None = None) -> Turn:
    """Post a user message to a session and answer it.

    Sync: waits for the session lock, runs the turns posted before this one that are still
    unanswered (async posts queued behind a running turn), then this one, and returns it
    done, or raises TurnFailed (502) after recording the error on the turn, or ServiceUnavailable
    (503) when Redis, holding the session lock, is down (before the turn: nothing stored).
    `opened` is called with the turn once its message is stored and committed, before it
    runs (a streamed post answers then, and follows the turn's events: turns/stream.py).
    Async: stores the message and a pending turn and enqueues run_turn_task after commit;
    poll the turn. With the broker down it raises TurnNotQueued (503), the turn kept.
    An archived session raises SessionArchived (409) before anything is stored."""
    session_check_open(session=session)
    if is_async:
        with transaction.atomic():
            turn = _turn_open(session=session, content=content, sender=sender, platform=platform, is_async=True)
            # Raises TurnNotQueued (503) after the commit when the broker is down: the turn is kept.
            transaction.on_commit(lambda: _turn_enqueue(turn))
        return turn
    turn = None
    try:
        with session_lock(session.pk) as lock:
            with transaction.atomic():
                turn = _turn_open(session=session, content=content, sender=sender, platform=platform, is_async=False)
            if opened is not None:
                opened(turn)
            # The oldest unfinished turn first, so posts are answered in order; it is this one
            # unless earlier posts still wait (their tasks, arriving later, find them done).
            while (oldest := _turn_next(opened=turn)).pk != turn.pk:
                if _turn_claim(oldest):
                    _turn_execute(turn=oldest, lock=lock, raise_errors=False)
                    if oldest.status == Turn.Status.PENDING:
                        # Our own service stopped it and it is queued again: this post's turn
                        # waits behind it (running it now would skip the order).
                        _turn_requeue_started(turn=turn, reason=oldest.retry_reason)
                        raise LockUnavailable(oldest.retry_reason, details={"service": "redis"})
            turn = oldest  # its session, kin and team read under the lock
            prompt = _turn_execute(turn=turn, lock=lock, raise_errors=True)
    except LockUnavailable as exc:
        raise _lock_outage(session=session, turn=turn) from exc
    # The session as read under the lock, with its kin: the caller's may hold only its id
    # and archived_at (selectors.session_ref).
    _schedule_background_work(session=turn.session, turn=turn, prompt=prompt)
    return turn


def turn_run(*, turn_id: int) -> Turn | None:
    """The task of a queued turn (the async path): run one turn of its session, the oldest
    unfinished one, and return it (None if there was none).

    That is this turn unless an earlier one of the session is still unfinished: then the
    earlier one runs here, and this turn's task is sent again, so every unfinished turn keeps
    a task and each task runs one turn (within Celery's time limit). Turns thus run in post
    order whichever task a worker takes first, and no turn waits on another that has no
    task: the lock holder always has work it may do. A duplicate task (a redelivery, or
    the requeue sweep's) is harmless: it runs the next turn early, or finds nothing. A turn
    found running while we hold the session lock belonged to a process that stopped, so
    it is run again (at most TURN_MAX_ATTEMPTS starts). A model failure is recorded on
    the turn, not raised. A task that cannot take the session lock (the session stayed busy
    for TURN_LOCK_WAIT_SECONDS, or Redis did not answer) puts its turn back in the queue
    (_turn_requeue_unstarted), for the requeue sweep to send again."""
    queued = Turn.objects.filter(pk=turn_id).values_list("session_id", "status").first()
    if queued is None:
        return None
    session_id, status = queued
    if status not in UNFINISHED and not Turn.objects.filter(session_id=session_id, status__in=UNFINISHED).exists():
        return None  # the usual duplicate: nothing to do, so no wait for the lock
    turn = None
    try:
        with session_lock(session_id) as lock:
            while (turn := _turn_oldest_unfinished(session_id=session_id)) is not None and not _turn_claim(turn):
                pass  # it was out of attempts and is failed now; the next one
            if turn is None:
                return None
            prompt = _turn_execute(turn=turn, lock=lock, raise_errors=False)
    except (SessionBusy, LockUnavailable) as exc:
        # Before any turn ran here: the session stayed busy for the whole wait, or Redis did
        # not answer. This task's turn goes back to the queue rather than wait for nobody.
        if turn is None:
            _turn_requeue_unstarted(turn_id, reason=_lock_wait_reason(exc))
            return None
        raise
    finally:
        # Outside the lock: an eager task runs turn_run here, which takes it. Also after a
        # bug in the turn that ran, so this one does not wait for a sweep.
        if turn is not None and turn.pk != turn_id:
            _turn_send_again(turn_id)
    _schedule_background_work(session=turn.session, turn=turn, prompt=prompt)
    return turn


def turn_retry(*, turn: Turn) -> Turn:
    """Run a failed turn again, with the user message it stored (no second message), and
    return it, queued (pending) as an async post's turn is.

    Idempotent: a turn already pending or running (retried before, or never failed) is
    returned as it is, so a double click starts one run. A turn that got its reply raises
    TurnNotRetryable (409), as does one whose message was deleted; an archived session
    raises SessionArchived (409). The way back to pending is a conditional UPDATE from
    failed, so of two concurrent retries one wins. The turn then runs in the session's
    order like any unfinished turn: the next lock holder runs the oldest unfinished turn
    first, so a retried turn runs before the turns posted after it that still wait; its
    prompt ends at its own message (with the tool rounds its failed attempt stored), and its
    reply is stored when it comes, after whatever the session got meanwhile. `attempts`
    keeps counting; `auto_retries` starts again from 0, so a turn the automatic retries gave
    up on gets as many again. With the broker down it raises TurnNotQueued (503), the turn
    kept pending for the requeue sweep."""
    session_check_open(session=turn.session)
    if turn.user_message_id is None:
        raise TurnNotRetryable(
            f"Turn {turn.pk} cannot be run again: its message was deleted. Post the message again.",
            details={"turn": turn.pk, "status": turn.status},
        )
    with transaction.atomic():
        retried = Turn.objects.filter(pk=turn.pk, status=Turn.Status.FAILED).update(
            status=Turn.Status.PENDING, error="", started_at=None, finished_at=None, auto_retries=0,
        )
        if retried:
            # Before the commit: a follower that reads the failed attempt's end after this
            # drops it, and waits for the new attempt (turns/events.py).
            turn_event_publish(turn, RESET, {"attempt": turn.attempts + 1, "retry": True})
            transaction.on_commit(lambda: _turn_enqueue(turn))
    turn = Turn.objects.select_related("session", "user_message", "reply").get(pk=turn.pk)
    if not retried and turn.status == Turn.Status.DONE:
        raise TurnNotRetryable(
            f"Turn {turn.pk} did not fail: it has its reply (message {turn.reply_id}), so there is nothing to "
            f"retry. Post a new message to ask again.",
            details={"turn": turn.pk, "status": turn.status},
        )
    return turn


def turns_requeue(*, now: datetime | None = None) -> list[int]:
    """Queue again the turns left pending without a task in the queue: async posts made
    while the broker was down (the post answered 503 and kept the turn), turns queued before
    Redis lost its data in a restart, and stalled turns the broker did not take when
    the stalled sweep made them pending again. Returns their ids. A turn queued twice
    still runs once (turn_run claims it). kinsite.jobs.jobs_requeue: the oldest 500 pending
    turns (partial index turn_pending); with Redis down it stops until the next minute."""
    return jobs_requeue(TURN_JOBS, now=now)


def turn_stalled_after() -> timedelta:
    """How long a turn must have been running, with its session lock free, before the
    stalled-turn sweep takes it over: one lease of the session lock (sessions_app.locks:
    the model's slowest call plus a minute; 315 s by default). A live turn holds that lock
    from before it starts running until it ends, renewing it before every model call, and
    a renewal after the lease ran out fails (the lock is no longer its own); so a turn that
    started more than a lease ago and whose lock nobody holds has no process left that can
    store its reply."""
    return timedelta(seconds=lease_seconds())


def turns_recover_stalled(*, now: datetime | None = None) -> Recovered:
    """Take over the turns left running by a process that stopped: a web process that died
    during a sync turn (its client got a broken connection), a worker killed during an async
    one, or an async turn whose unacknowledged task Redis lost in a restart.

    A turn running for longer than turn_stalled_after() is taken over only if its session
    lock can be taken at once (else someone is working on the session, maybe on this very
    turn); holding the lock, it is checked again, made pending and queued again: turn_run
    claims it and runs it with the tool rounds already stored in its history, so nothing
    done is done twice and it gets one reply. A sync turn too: its client got a broken
    connection, but the message is stored and gets its reply (the client finds it by
    polling the turn, or in the session). After TURN_MAX_ATTEMPTS starts a turn is failed
    instead. kinsite.jobs.jobs_recover_stalled: the 100 longest running (partial index
    turn_running); with Redis down it stops until the next minute."""
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


def _turn_give_up(turn: Turn) -> str | None:
    """A stalled turn runs again (None) unless it has started TURN_MAX_ATTEMPTS times."""
    return _out_of_attempts_error(turn) if turn.attempts >= TURN_MAX_ATTEMPTS else None


TURN_JOBS = JobKind(
    name="turn", label="turns", model="sessions_app.Turn", task="sessions_app.tasks.run_turn_task",
    stalled_after=turn_stalled_after, free=_turn_free, give_up=_turn_give_up,
    reads=("session_id", "attempts", "user_message_id"), counts_attempts=True, released_at_field="retried_at",
)


# --- steps -----------------------------------------------------------------------------------


def _turn_enqueue(turn: Turn) -> None:
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


def _turn_send_again(turn_id: int) -> None:
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


def _turn_oldest_unfinished(*, session_id: int) -> Turn | None:
    """Under the session lock: the turn of the session to run next, with what running it
    reads (its session, kin, team and message), read now so they are current."""
    return (
        Turn.objects.filter(session_id=session_id, status__in=UNFINISHED)
        .select_related("session__kin__team", "user_message").order_by("id").first()
    )


# The session's oldest unfinished turn (the turn_session_status index), beside the session row.
_OLDEST_UNFINISHED_SQL = (
    f"SELECT t.id FROM {Turn._meta.db_table} t WHERE t.session_id = {Session._meta.db_table}.id"
    f" AND t.status IN (%s, %s) ORDER BY t.id LIMIT 1"
)


def _turn_next(*, opened: Turn) -> Turn:
    """Under the session lock, after a sync post stored `opened`: the turn to run next, as
    _turn_oldest_unfinished gives it. Usually that is `opened` itself, whose row and message
    this process wrote under this very lock: then one statement reads the session with its
    kin and team (current, as they are read under the lock) and the id of the session's
    oldest unfinished turn, and a copy of `opened` carries them (the original may be in a
    stream's hands: turns/stream.py). Written as SQL, the subquery costs little to compile;
    the five-table read of _turn_oldest_unfinished was a tenth of a turn's CPU."""
    session = (
        Session.objects.select_related("kin__team")
        .annotate(next_turn_id=RawSQL(_OLDEST_UNFINISHED_SQL, UNFINISHED))
        .get(pk=opened.session_id)
    )
    if session.next_turn_id != opened.pk:
        return _turn_oldest_unfinished(session_id=opened.session_id)  # earlier posts wait: rare
    turn = copy.copy(opened)  # Django copies the related-object cache too
    turn.session = session
    return turn


def _turn_claim(turn: Turn) -> bool:
    """Under the session lock: mark the turn running, one more start. A turn found running
    here belonged to a process that stopped (a live turn holds the lock until it ends), so
    it starts again, unless it already started TURN_MAX_ATTEMPTS times (say it makes its
    worker run out of memory): then it is failed, and False says so."""
    unfinished = Turn.objects.filter(pk=turn.pk, status__in=UNFINISHED)
    now = timezone.now()
    # Only a turn found running is a stopped process's: a pending one was checked by the
    # stalled sweep before it was queued again, or is a member's retry, which runs once more
    # whatever its count (turn_retry).
    error = _turn_give_up(turn) if turn.status == Turn.Status.RUNNING else None
    if error is not None:
        turn.status, turn.error, turn.finished_at = Turn.Status.FAILED, error, now
        unfinished.update(status=turn.status, error=turn.error, finished_at=now)
        logger.warning("Turn %s failed: its process stopped %d times", turn.pk, turn.attempts)
        turn_event_publish(turn, END, {"status": turn.status, "code": "turn_abandoned"})
        return False
    # Conditional, as a claim: if our lease ran out, whoever holds the lock now may have run it.
    if not job_claim(TURN_JOBS, turn.pk, rerun=True, now=now):
        return False
    turn.status, turn.started_at, turn.attempts = Turn.Status.RUNNING, now, turn.attempts + 1
    if turn.attempts > 1:
        # Run again: its followers drop what the stopped attempt streamed (turns/events.py).
        turn_event_publish(turn, RESET, {"attempt": turn.attempts})
    return True


def _lock_outage(*, session: Session, turn: Turn | None) -> ServiceUnavailable:
    """What a sync post answers when Redis, which holds the session lock, is down."""
    if turn is None:
        return ServiceUnavailable(
            "Your message was not stored: the session lock service (Redis) is unreachable, so no turn can "
            "run. Post it again shortly.",
            details={"service": "redis", "stored": False, "session": session.pk},
        )
    if turn.status == Turn.Status.PENDING:
        return ServiceUnavailable(
            f"The session lock service (Redis) became unreachable while the kin was answering. Your message is "
            f"stored (message {turn.user_message_id}) and turn {turn.pk} is queued again: it is answered once "
            f"the service is back. Poll GET /api/v1/turns/{turn.pk}/ and do not post it again.",
            details={"service": "redis", "stored": True, "turn": turn.pk, "message": turn.user_message_id,
                     "status": turn.status},
        )
    return ServiceUnavailable(
        f"The session lock service (Redis) became unreachable while the kin was answering. Your message is "
        f"stored (message {turn.user_message_id}) and turn {turn.pk} records the error: {turn.error}",
        details={"service": "redis", "stored": True, "turn": turn.pk, "message": turn.user_message_id,
                 "status": turn.status},
    )


def _turn_open(*, session: Session, content: str, sender: str, platform: str, is_async: bool) -> Turn:
    """Store the user's message (a command event for /checkpoint and /new) and its turn."""
    now = timezone.now()
    command = command_parse(content)
    message = Event.objects.create(
        session=session,
        kind=Event.Kind.COMMAND if command else Event.Kind.MESSAGE,
        role=Event.Role.USER,
        content=content,
        sender=sender,
        platform=platform,
        token_count=count_tokens(content),
        data={"command": command.name, "argument": command.argument} if command else {},
        created_at=now,
    )
    # New events: introspection has something to read (the idle scan's flag).
    Session.objects.filter(pk=session.pk).update(last_activity_at=now, introspection_pending=True)
    return Turn.objects.create(
        session=session,
        user_message=message,
        is_async=is_async,
        status=Turn.Status.PENDING if is_async else Turn.Status.RUNNING,
        started_at=None if is_async else now,
        attempts=0 if is_async else 1,
    )


def _turn_execute(*, turn: Turn, lock: SessionLock, raise_errors: bool) -> AssembledPrompt | None:
    """Run a claimed turn read by _turn_oldest_unfinished under the lock this holds, and
    publish its end (turns/events.py) once its outcome is stored. Returns the prompt of a
    conversation turn that got its reply (None for a command or a failure)."""
    session = turn.session
    message = turn.user_message
    error_code = ""
    prompt = None
    try:
        if message.kind == Event.Kind.COMMAND:
            _command_answer(turn=turn, session=session, message=message)
        else:
            prompt = _turn_converse(turn=turn, session=session, message=message, lock=lock)
    except REDIS_OUTAGES as exc:
        # Our own service stopped the turn (the session lock could not be renewed, Redis or the
        # broker did not answer): not the model's failure, so unless its reply is stored it goes
        # back to the queue, to run again once the service is back.
        if turn.status == Turn.Status.DONE:
            raise
        error_code = getattr(exc, "code", "service_unavailable")
        _turn_requeue_started(turn=turn, reason=_outage_text(exc))
        if raise_errors:
            raise
    except LLMError as exc:
        error_code = TurnFailed.code
        _turn_fail(turn=turn, error=exc.message)
        if raise_errors:
            raise TurnFailed(
                f"The language model could not answer: {exc.message} Your message is stored "
                f"(message {message.pk}); see turn {turn.pk}.",
                details={"turn": turn.pk, "message": message.pk, "llm_error": exc.code, **exc.details},
            ) from exc
    except Exception as exc:
        # A bug, not the model: still leave the turn saying what happened, then let it surface.
        error_code = "server_error"
        _turn_fail(turn=turn, error=f"Internal error: {type(exc).__name__}: {exc}")
        raise
    finally:
        if turn.status not in UNFINISHED:
            # A turn back in the queue publishes no end: its followers wait for its next attempt.
            turn_event_publish(turn, END, {"status": turn.status, "code": error_code})
    return prompt


def _outage_text(exc: Exception) -> str:
    if isinstance(exc, ServiceUnavailable):
        return exc.message
    return f"Redis or the task queue did not answer: {type(exc).__name__}: {exc}"


def _lock_wait_reason(exc: Exception) -> str:
    if isinstance(exc, SessionBusy):
        return f"The task waited {wait_seconds():g} s for the session's earlier turn to finish, in vain."
    return _outage_text(exc)


def _out_of_auto_retries_error(*, turn_id: int, message_id: int | None, retries: int, reason: str) -> str:
    return (f"Our own service stopped this turn before its reply {retries + 1} times, and after "
            f"{retries} automatic retries it is not run again. The last time: {reason} Your message is stored "
            f"(message {message_id}); retry the turn (POST /api/v1/turns/{turn_id}/retry/, or Retry in the "
            f"chat) once the service is fixed.")


def _turn_requeue_started(*, turn: Turn, reason: str) -> None:
    """A claimed turn our own service stopped: back to pending for the requeue sweep, one
    more automatic retry, or failed once it had settings.TURN_AUTO_RETRIES of them. Written
    only if the turn is still this claim's (its started_at): a turn whose lock was lost may be
    another process's now. What its attempt stored (tool rounds, tokens) stays."""
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


def _turn_requeue_unstarted(turn_id: int, *, reason: str) -> None:
    """A pending turn whose task could not take the session lock: still pending, one more
    automatic retry, its queued marker dropped so the requeue sweep sends it again; or failed
    once it had settings.TURN_AUTO_RETRIES of them. A turn another task took meanwhile (it
    is not pending any more) is left alone."""
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


def _turn_fail(*, turn: Turn, error: str) -> None:
    turn.status = Turn.Status.FAILED
    turn.error = error
    turn.finished_at = timezone.now()
    Turn.objects.filter(pk=turn.pk).update(
        status=turn.status, error=turn.error, finished_at=turn.finished_at, tool_calls=turn.tool_calls,
        prompt_tokens=turn.prompt_tokens, tokens_in=turn.tokens_in, tokens_out=turn.tokens_out,
    )


def _command_answer(*, turn: Turn, session: Session, message: Event) -> None:
    """A command is recorded (the command event), handed to introspection, and answered
    with a short system reply. /checkpoint introspects the session; /new introspects it
    and starts a new session for the same kin and participants."""
    command = command_parse(message.content)
    with transaction.atomic():
        data = {"command": command.name, "reply_to": message.pk}
        # The run starts after this transaction commits (its task is enqueued on commit).
        run = _introspection_request(session=session, trigger=command.name)
        data["introspection_run_id"] = run.pk if run is not None else None
        queued = (
            f"Introspection run {run.pk} will distil it into memories, working memory and a description."
            if run is not None else "Introspection is disabled for this kin, so nothing is distilled."
        )
        if command.name == "new":
            from sessions_app.services import session_continue

            new_session = session_continue(session=session, title=command.argument[:200], command=message)
            data["new_session_id"] = new_session.pk
            Event.objects.filter(pk=message.pk).update(data={**message.data, "new_session_id": new_session.pk})
            text = (
                f"Started a new session (id {new_session.pk}) with {session.kin.name}. "
                f"This session stays as it is; post to the new one to continue there. {queued}"
            )
        else:
            text = f"Checkpoint recorded (event {message.pk}). {queued}"
        reply = Event.objects.create(
            session=session, kind=Event.Kind.COMMAND, role=Event.Role.SYSTEM, content=text,
            platform=message.platform, token_count=count_tokens(text), data=data,
        )
        turn.reply = reply
        turn.status = Turn.Status.DONE
        turn.started_at = turn.started_at or timezone.now()
        turn.finished_at = timezone.now()
        turn.save(update_fields=["reply", "status", "started_at", "finished_at"])


def _introspection_request(*, session: Session, trigger: str) -> IntrospectionRun | None:
    try:
        return introspection_request(session=session, trigger=trigger)
    except IntrospectionDisabled:
        return None


def _turn_converse(*, turn: Turn, session: Session, message: Event, lock: SessionLock) -> AssembledPrompt:
    """The model/tool loop. At most KIN_MAX_TOOL_CALLS tool calls run; once they are
    used up the model is called without tools, so it has to answer. Returns the prompt."""
    kin = session.kin
    prompt = prompt_assemble(
        session=session, message_text=message.content, sender=message.sender, platform=message.platform,
        current_event=message, turn_id=turn.pk,
    )
    # Stored with the turn's next write (a tool round, the reply, or the failure), not on its own.
    turn.prompt_tokens = prompt.total_tokens
    messages = list(prompt.messages)
    tools = kin_toolset(workflow_id=session.workflow_id)
    schemas = [tool.schema for tool in tools.values()]
    tool_context = ToolContext(
        team=kin.team, kin=kin, actor=Actor(label=f"kin:{kin.pk} turn:{turn.pk}"),
        source=Memory.Source.TURN, source_ref=writer_ref("event", message.pk),
    )
    max_calls = settings.KIN_MAX_TOOL_CALLS
    capped = max_calls <= 0
    while True:
        lock.refresh()
        offer_tools = not capped
        result = llm_chat(purpose="turn", messages=messages, team=kin.team, kin=kin,
                          tools=schemas if offer_tools else None,
                          on_delta=lambda text: turn_event_publish(turn, DELTA, {"text": text}))
        turn.tokens_in += result.tokens_in
        turn.tokens_out += result.tokens_out
        if not offer_tools or not result.tool_calls:
            break
        outputs = []
        for call in result.tool_calls:
            turn_event_publish(turn, TOOL_CALL, {"id": call.id, "name": call.name, "arguments": call.arguments})
            if turn.tool_calls >= max_calls:
                # Every call in the assistant message needs a result, or the next request is invalid.
                output = (f"Error: not run: the limit of {max_calls} tool calls for this turn is reached. "
                          "Answer with what you have.")
            else:
                turn.tool_calls += 1
                output = _tool_run(tools, call, tool_context)
            outputs.append(output)
            turn_event_publish(turn, TOOL_RESULT, {"id": call.id, "name": call.name, "content": output})
        capped = turn.tool_calls >= max_calls
        _tool_round_store(session=session, turn=turn, content=result.content, calls=result.tool_calls,
                          outputs=outputs, platform=message.platform)
        messages.append(result.as_assistant_message())
        messages.extend(
            {"role": "tool", "tool_call_id": call.id, "content": output}
            for call, output in zip(result.tool_calls, outputs, strict=True)  # one output per call
        )

    text = result.content or ""
    if not text.strip() and capped:
        text = f"I reached the limit of {max_calls} tool calls for this turn before I could finish."
    now = timezone.now()
    with transaction.atomic():
        reply = Event.objects.create(
            session=session, kind=Event.Kind.MESSAGE, role=Event.Role.ASSISTANT, content=text, sender=kin.name,
            platform=message.platform, token_count=count_tokens(text), created_at=now,
            data={"turn": turn.pk, "tool_calls": turn.tool_calls, "tool_call_limit_reached": capped},
        )
        turn.reply = reply
        turn.status = Turn.Status.DONE
        turn.finished_at = now
        turn.error = ""
        turn.save(update_fields=[
            "reply", "status", "finished_at", "error", "tool_calls", "prompt_tokens", "tokens_in", "tokens_out",
        ])
        # Assembling the prompt only reads; the memories it carried count as retrieved with
        # the reply they served, in its transaction (no commit of their own).
        memories_mark_retrieved(memory_ids=prompt.memory_ids, now=now)
        # A completed turn: counted towards introspection's turn_interval trigger.
        Session.objects.filter(pk=session.pk).update(
            last_activity_at=now, introspection_pending=True,
            turns_since_introspection=F("turns_since_introspection") + 1,
        )
    return prompt


def _tool_run(tools: dict[str, Tool], call: ToolCall, tool_context: ToolContext) -> str:
    """The text answer of one tool call; unknown tools and failures become error text."""
    tool = tools.get(call.name)
    if tool is None:
        return f"Error: unknown tool {call.name!r}; available tools: {', '.join(tools)}."
    try:
        # A savepoint, so a tool that fails half-way leaves no partial writes behind.
        with transaction.atomic():
            output = tool.handler(tool_context, call.arguments)
    except Exception as exc:
        logger.exception("Tool %s failed in a turn of kin %s", call.name, tool_context.kin.pk)
        return f"Error: {call.name} failed ({type(exc).__name__}). Try other arguments or answer without it."
    if len(output) > TOOL_RESULT_MAX_CHARS:
        output = output[:TOOL_RESULT_MAX_CHARS] + "… (cut)"
    return output


def _tool_round_store(*, session: Session, turn: Turn, content: str | None, calls: list[ToolCall],
                      outputs: list[str], platform: str) -> None:
    """One assistant tool-call event and its results, committed together."""
    kin = session.kin
    stored_calls = [{"id": call.id, "name": call.name, "arguments": call.arguments} for call in calls]
    with transaction.atomic():
        Event.objects.create(
            session=session, kind=Event.Kind.TOOL_CALL, role=Event.Role.ASSISTANT, content=content or "",
            sender=kin.name, platform=platform,
            token_count=count_tokens(content or "") + sum(count_tokens(json.dumps(call)) for call in stored_calls),
            data={"tool_calls": stored_calls, "turn": turn.pk},
        )
        for call, output in zip(calls, outputs, strict=True):
            Event.objects.create(
                session=session, kind=Event.Kind.TOOL_RESULT, role=Event.Role.TOOL, content=output,
                platform=platform, token_count=count_tokens(output),
                data={"tool_call_id": call.id, "name": call.name, "turn": turn.pk},
            )
        Turn.objects.filter(pk=turn.pk).update(
            tool_calls=turn.tool_calls, prompt_tokens=turn.prompt_tokens, tokens_in=turn.tokens_in,
            tokens_out=turn.tokens_out,
        )


def _schedule_background_work(*, session: Session, turn: Turn, prompt: AssembledPrompt | None) -> None:
    """After the turn and outside the session lock (an eager task must not run under it):
    compaction when the un-summarised history has outgrown its share of the budget (from the
    boundary the turn's `prompt` read, if it has one), and introspection every
    `turn_interval` completed turns (commands are not turns)."""
    needed = (compaction_needed(session=session) if prompt is None
              else compaction_needed_after_turn(session=session, summary=prompt.summary))
    if needed:
        # Once the turn's writes are committed, as the compaction task was sent before the
        # run had a row: the turn's own work stays what it was (tests/sessions_app/test_turn_queries.py).
        transaction.on_commit(lambda: compaction_request(session=session))
    if turn.status == Turn.Status.DONE and turn.user_message.kind == Event.Kind.MESSAGE:
        introspection_after_turn(session=session)  # the turn was counted when its reply was stored
