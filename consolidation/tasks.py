"""Celery tasks of consolidation: thin wrappers that load rows by id and call one service."""
import logging

from celery import shared_task

from consolidation.services import ConsolidationBusy, NightAlreadyConsolidated, consolidation_nightly, consolidation_run
from sessions_app.models import Kin

logger = logging.getLogger(__name__)


# A run records its own failure (status failed or rejected) and changes nothing, so the
# task does not retry: the facts stay pending for the next night or the next request.
@shared_task
def consolidate_kin_task(kin_id: int, trigger: str = "api", template_body: str | None = None,
                         max_words: int | None = None) -> int | None:
    """Consolidate one kin on demand; the run's id (None: the kin is gone or busy)."""
    kin = Kin.objects.select_related("team").filter(pk=kin_id).first()
    if kin is None:
        return None  # deleted since the task was enqueued
    try:
        run = consolidation_run(kin=kin, trigger=trigger, template_body=template_body, max_words=max_words)
    except (ConsolidationBusy, NightAlreadyConsolidated) as exc:
        logger.info("Consolidation of kin %s not run: %s", kin_id, exc)
        return None
    return run.pk


@shared_task
def consolidate_nightly_task() -> int:
    """Every 15 minutes (beat): consolidate each kin with pending facts whose night is due
    in its team's time zone; how many runs it made."""
    return len(consolidation_nightly())
