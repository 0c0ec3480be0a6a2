"""The chat turn: store the user's message, run the turn (converse.py), publish its end, then
schedule background work (compaction, introspection).

Turns of one session run in post order: whoever holds the session lock (a worker's task or a
sync post) runs the session's oldest unfinished turn, not necessarily its own, and a turn's
prompt ends at its own message. Each step commits on its own (message, tool rounds, reply),
so a failing model loses nothing. When Redis is down the API answers 503 and says what it kept."""
from __future__ import annotations

import copy
import logging
from collections.abc import Callable

from django.db import transaction
from django.db.models.expressions import RawSQL
from django.utils import timezone

from kinsite.errors import Conflict, ServiceUnavailable, UpstreamError
from kinsite.jobs import (
    REDIS_OUTAGES,
    job_claim,
)
from kinsite.llm.types import LLMError
from kinsite.tokencount import count_tokens
from sessions_app.compaction import compaction_needed, compaction_needed_after_turn, compaction_request
from sessions_app.introspection.services import introspection_after_turn
from sessions_app.locks import LockUnavailable, SessionBusy, SessionLock, session_lock, wait_seconds
from sessions_app.models import Event, Session, Turn
from sessions_app.prompt.assembly import AssembledPrompt
from sessions_app.services import session_check_open
from sessions_app.turns.converse import command_answer, command_parse, turn_converse
from sessions_app.turns.events import END, RESET, turn_event_publish
from sessions_app.turns.jobs import (
    TURN_JOBS,
    UNFINISHED,
    turn_enqueue,
    turn_give_up,
    turn_requeue_started,
    turn_requeue_unstarted,
    turn_send_again,
)

logger = logging.getLogger(__name__)



class TurnFailed(UpstreamError):
    """The model call of a turn failed; the user's message is stored and the turn records the error."""

    code = "llm_error"



class TurnNotRetryable(Conflict):
    """A retry of a turn that did not fail (it got its reply), or whose message is gone: nothing changes (409)."""

    code = "turn_not_failed"



def turn_post(*, session: Session, content: str, sender: str = "", platform: str = Event.Platform.API,
              is_async: bool = False, opened: Callable[[Turn], None] | None = None) -> Turn:
    """Post a user message to a session and answer it.

    Sync: under the session lock, runs earlier unanswered turns, then this one, and returns it
    done, or raises TurnFailed (502, recorded on the turn) or ServiceUnavailable (503, Redis
    down). `opened` gets the stored turn before it runs (a streamed post answers then).
    Async: stores a pending turn and queues it after commit, or raises TurnNotQueued (503) after
    the commit, the turn kept."""
    session_check_open(session=session)
    if is_async:
        with transaction.atomic():
            turn = _turn_open(session=session, content=content, sender=sender, platform=platform, is_async=True)
            transaction.on_commit(lambda: turn_enqueue(turn))
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
                        turn_requeue_started(turn=turn, reason=oldest.retry_reason)
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
    """The task of a queued turn: run the session's oldest unfinished turn and return it (None
    if there was none).

    If that is an earlier turn, this turn's task is sent again, so every unfinished turn keeps
    a task whichever a worker takes first; a duplicate task is harmless. A model failure is
    recorded on the turn, not raised. A task that cannot take the lock requeues its turn."""
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
        # No turn ran here (the session stayed busy, or Redis did not answer): requeue this one.
        if turn is None:
            turn_requeue_unstarted(turn_id, reason=_lock_wait_reason(exc))
            return None
        raise
    finally:
        # Outside the lock: an eager task runs turn_run here, which takes it. Also after a
        # bug in the turn that ran, so this one does not wait for a sweep.
        if turn is not None and turn.pk != turn_id:
            turn_send_again(turn_id)
    _schedule_background_work(session=turn.session, turn=turn, prompt=prompt)
    return turn



def turn_retry(*, turn: Turn) -> Turn:
    """Run a failed turn again with the message it stored, and return it pending.

    Idempotent: a turn already pending or running is returned as it is (a double click starts
    one run); the conditional UPDATE from failed lets one of two concurrent retries win. A turn
    that got its reply, or whose message was deleted, raises TurnNotRetryable (409); an archived
    session SessionArchived (409); the broker down TurnNotQueued (503), the turn kept pending.
    `attempts` keeps counting; `auto_retries` starts again from 0."""
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
            transaction.on_commit(lambda: turn_enqueue(turn))
    turn = Turn.objects.select_related("session", "user_message", "reply").get(pk=turn.pk)
    if not retried and turn.status == Turn.Status.DONE:
        raise TurnNotRetryable(
            f"Turn {turn.pk} did not fail: it has its reply (message {turn.reply_id}), so there is nothing to "
            f"retry. Post a new message to ask again.",
            details={"turn": turn.pk, "status": turn.status},
        )
    return turn



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
    """Under the session lock, after a sync post stored `opened`: the turn to run next.
    Usually `opened` itself, so one statement reads the session, its kin and team and the id
    of its oldest unfinished turn (cheaper than _turn_oldest_unfinished's five-table read),
    and a copy of `opened` carries them (the original may be in a stream's hands)."""
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
    """Under the session lock: mark the turn running, one more start. A turn found running here
    belonged to a stopped process (a live turn holds the lock), so it starts again unless it
    started TURN_MAX_ATTEMPTS times (say it kills its worker): then it is failed, and False."""
    unfinished = Turn.objects.filter(pk=turn.pk, status__in=UNFINISHED)
    now = timezone.now()
    # A pending turn was checked by the stalled sweep before it was queued again, or is a
    # member's retry, which runs once more whatever its count.
    error = turn_give_up(turn) if turn.status == Turn.Status.RUNNING else None
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
            command_answer(turn=turn, session=session, message=message)
        else:
            prompt = turn_converse(turn=turn, session=session, message=message, lock=lock)
    except REDIS_OUTAGES as exc:
        # Our own service stopped the turn (lock lost, Redis or the broker silent), not the
        # model: unless its reply is stored it goes back to the queue.
        if turn.status == Turn.Status.DONE:
            raise
        error_code = getattr(exc, "code", "service_unavailable")
        turn_requeue_started(turn=turn, reason=_outage_text(exc))
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



def _turn_fail(*, turn: Turn, error: str) -> None:
    turn.status = Turn.Status.FAILED
    turn.error = error
    turn.finished_at = timezone.now()
    Turn.objects.filter(pk=turn.pk).update(
        status=turn.status, error=turn.error, finished_at=turn.finished_at, tool_calls=turn.tool_calls,
        prompt_tokens=turn.prompt_tokens, tokens_in=turn.tokens_in, tokens_out=turn.tokens_out,
    )



def _schedule_background_work(*, session: Session, turn: Turn, prompt: AssembledPrompt | None) -> None:
    """After the turn and outside the session lock (an eager task must not run under it):
    compaction when the un-summarised history outgrew its share of the budget, and
    introspection every `turn_interval` completed turns (commands are not turns)."""
    needed = (compaction_needed(session=session) if prompt is None
              else compaction_needed_after_turn(session=session, summary=prompt.summary))
    if needed:
        # On commit, so the turn's own queries stay as tests/sessions_app/test_turn_queries.py counts them.
        transaction.on_commit(lambda: compaction_request(session=session))
    if turn.status == Turn.Status.DONE and turn.user_message.kind == Event.Kind.MESSAGE:
        introspection_after_turn(session=session)  # the turn was counted when its reply was stored
