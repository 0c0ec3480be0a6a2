"""Celery tasks of sessions_app: thin wrappers that load rows by id and call one service."""
import logging

from celery import shared_task

from kinsite.llm.types import LLMError
from sessions_app.compaction import compaction_run
from sessions_app.introspection import IntrospectionBusy, introspect_idle_sessions, introspection_skip, session_introspect

logger = logging.getLogger(__name__)


# A failed compaction changes nothing, so retrying is safe; if the retries run out, the run
# is failed and the next turn over the threshold requests a new one.
@shared_task(bind=True, autoretry_for=(LLMError,), max_retries=3, retry_backoff=True)
def compact_session_task(self, run_id: int) -> None:
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
    try:
        session_introspect(run_id=run_id)
    except IntrospectionBusy:
        if not self.request.is_eager and self.request.retries < self.max_retries:
            # Another run of the session is going; this one covers what arrives after it.
            raise self.retry(countdown=30)
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
    return len(introspect_idle_sessions())


# The chat turn's task lives in its own module; importing it here registers it with the
# workers (Celery autodiscovers `tasks` modules only).
from sessions_app.turn_tasks import run_turn_task  # noqa: E402,F401
