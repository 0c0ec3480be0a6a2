"""Celery tasks of sessions_app: thin wrappers that load rows by id and call one service."""
import logging

from celery import shared_task

from kinsite.llm.types import LLMError
from sessions_app.compaction import session_compact
from sessions_app.models import Session

logger = logging.getLogger(__name__)


# A failed compaction changes nothing, so retrying is safe; if the retries run out, the
# next turn over the threshold enqueues it again.
@shared_task(bind=True, autoretry_for=(LLMError,), max_retries=3, retry_backoff=True)
def compact_session_task(self, session_id: int) -> None:
    session = Session.objects.select_related("kin__team").filter(pk=session_id).first()
    if session is None:
        return  # deleted since the task was enqueued
    try:
        session_compact(session=session)
    except LLMError as exc:
        logger.warning("Compaction of session %s failed: %s", session_id, exc)
        if self.request.is_eager:
            # Eager Celery (the embedded default) runs this inside the request that enqueued
            # it, where a retry cannot wait and would surface as an error of a turn that
            # succeeded; the next turn over the threshold tries again instead.
            return
        raise


# The chat turn's task lives in its own module; importing it here registers it with the
# workers (Celery autodiscovers `tasks` modules only).
from sessions_app.turn_tasks import run_turn_task  # noqa: E402,F401
