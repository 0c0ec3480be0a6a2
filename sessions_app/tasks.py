"""Celery tasks of sessions_app: each loads its row by id and calls one service.

The services import no task: they send theirs by name through kinsite.jobs (job_send,
job_send_on_commit, the names in their JobKind), and the tasks import their service inside
the function, as Styleguide-Example's emails/tasks.py does, so neither side of the
task ↔ service pair imports the other at module level. The sweeps that take over lost or
stalled work of every kind are kinsite.tasks'."""
from celery import shared_task

from kinsite.jobs import job_task, job_task_last_try
from kinsite.llm.types import LLMError


# The name it had when it lived in sessions_app/turn_tasks.py: the wire name of queued
# messages, so turns queued before a deploy still run after it.
# No autoretry: a model failure is recorded on the turn (the client polls it and may post
# again), and a killed worker's turn is picked up again by acks_late (turn_run is idempotent).
@shared_task(name="sessions_app.turn_tasks.run_turn_task")
def run_turn_task(turn_id: int) -> None:
    from sessions_app.turns.services import turn_run

    turn_run(turn_id=turn_id)


# A failed compaction changes nothing, so retrying is safe; if the retries run out, the run
# is failed and the next turn over the threshold requests a new one (eager: at once).
@shared_task(bind=True, autoretry_for=(LLMError,), max_retries=3, retry_backoff=True)
@job_task(label="Compaction run", recorded=(LLMError,))
def compact_session_task(self, run_id: int) -> None:
    from sessions_app.compaction import compaction_run

    compaction_run(run_id=run_id, last_try=job_task_last_try(self))


def _introspection_skip(run_id: int) -> None:
    from sessions_app.introspection.services import introspection_skip

    introspection_skip(run_id=run_id, reason="Another introspection of this session was in progress.")


# Introspection: a failed run is recorded on its row and leaves the cursor, so the idle
# scan (or the next trigger) runs it again; the task itself does not retry a failed run.
# A run that finds another of its session going is tried again: it covers what arrives after that one.
@shared_task(bind=True, max_retries=5)
@job_task(label="Introspection run", skip=_introspection_skip, busy_retry_seconds=30, recorded=(Exception,))
def introspect_session_task(self, run_id: int) -> None:
    from sessions_app.introspection.services import session_introspect

    session_introspect(run_id=run_id)


@shared_task
def scan_idle_sessions_task() -> int:
    """Every minute (beat): request an introspection of each idle session that is due."""
    from sessions_app.introspection.services import introspection_idle_scan

    return len(introspection_idle_scan())
