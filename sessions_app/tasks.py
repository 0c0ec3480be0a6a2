"""Celery tasks of sessions_app: each loads its row by id and calls one service.

The services import no task: they send theirs by name through kinsite.jobs (job_send,
job_send_on_commit, the names in their JobKind), and the tasks import their service inside
the function, as Styleguide-Example's emails/tasks.py does, so neither side of the
task ↔ service pair imports the other at module level. The sweeps that take over lost or
stalled work of every kind are kinsite.tasks'."""
import logging

from celery import shared_task

from kinsite.llm.types import LLMError

logger = logging.getLogger(__name__)


# The name it had when it lived in sessions_app/turn_tasks.py: the wire name of queued
# messages, so turns queued before a deploy still run after it.
# No autoretry: a model failure is recorded on the turn (the client polls it and may post
# again), and a killed worker's turn is picked up again by acks_late (turn_run is idempotent).
@shared_task(name="sessions_app.turn_tasks.run_turn_task")
def run_turn_task(turn_id: int) -> None:
    from sessions_app.turns.services import turn_run

    turn_run(turn_id=turn_id)


# A failed compaction changes nothing, so retrying is safe; if the retries run out, the run
# is failed and the next turn over the threshold requests a new one.
@shared_task(bind=True, autoretry_for=(LLMError,), max_retries=3, retry_backoff=True)
def compact_session_task(self, run_id: int) -> None:
    from sessions_app.compaction import compaction_run

    last_try = self.request.is_eager or self.request.retries >= self.max_retries
    try:
        compaction_run(run_id=run_id, last_try=last_try)
    except LLMError as exc:
        logger.warning("Compaction run %s failed: %s", run_id, exc)
        if self.request.is_eager:
            # Eager Celery (the embedded default) runs this inside the request that enqueued
            # it, where a retry cannot wait and would surface as an error of a turn that
            # succeeded; the next turn over the threshold tries again instead.
            return
        raise


# Introspection: a failed run is recorded on its row and leaves the cursor, so the idle
# scan (or the next trigger) runs it again; the task itself does not retry a failed run.
@shared_task(bind=True, max_retries=5)
def introspect_session_task(self, run_id: int) -> None:
    from sessions_app.introspection.services import IntrospectionBusy, introspection_skip, session_introspect

    try:
        session_introspect(run_id=run_id)
    except IntrospectionBusy as exc:
        if not self.request.is_eager and self.request.retries < self.max_retries:
            # Another run of the session is going; this one covers what arrives after it.
            raise self.retry(countdown=30) from exc
        introspection_skip(run_id=run_id, reason="Another introspection of this session was in progress.")
    except Exception as exc:
        logger.warning("Introspection run %s failed: %s", run_id, exc)
        if self.request.is_eager:
            # Eager Celery runs this inside the request that asked for it (a /checkpoint
            # turn); the failure is on the run row, and the turn itself succeeded.
            return
        raise


@shared_task
def scan_idle_sessions_task() -> int:
    """Every minute (beat): request an introspection of each idle session that is due."""
    from sessions_app.introspection.services import introspection_idle_scan

    return len(introspection_idle_scan())
