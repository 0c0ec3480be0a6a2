"""Celery tasks of sessions_app: each loads its row by id and calls one service.

Services send tasks by name (their JobKind, through kinsite.jobs) and tasks import their
service inside the function, so neither imports the other at module level."""
from celery import shared_task

from kinsite.jobs import job_task, job_task_last_try
from kinsite.llm.types import LLMError


# The old module's name is kept as the wire name: turns queued before a deploy still run. No autoretry:
# a model failure is recorded on the turn, and acks_late redelivers a killed worker's turn.
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


# A failed run leaves the cursor, so the idle scan runs it again; the task does not retry it.
# A run that finds another of its session going is retried: it covers what arrives after.
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
