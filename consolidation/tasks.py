"""Celery tasks of consolidation: thin wrappers that load rows by id and call one service."""
import logging

from celery import shared_task

from consolidation.services import consolidation_nightly, consolidation_run_requested, consolidation_skip
from kinsite.jobs import job_task

logger = logging.getLogger(__name__)

BUSY_RETRY_SECONDS = 60


def _skip(run_id: int) -> int | None:
    logger.info("Consolidation run %s skipped: another consolidation of its kin was in progress.", run_id)
    run = consolidation_skip(run_id=run_id, reason="Another consolidation of the kin was in progress.")
    return run.pk if run else None


# A run records its own failure (status failed or rejected) and changes nothing, so the
# task does not retry on those: the facts stay pending for the next night or request.
# Another run of the kin going (or this very run, delivered twice): look again later.
@shared_task(bind=True, max_retries=3)
@job_task(label="Consolidation run", skip=_skip, busy_retry_seconds=BUSY_RETRY_SECONDS)
def consolidate_kin_task(self, run_id: int) -> int | None:
    """Consolidate the kin of a requested run (consolidation_request); the run's id (None:
    the run is gone). A second delivery finds the run claimed or done and does nothing."""
    run = consolidation_run_requested(run_id=run_id)
    return run.pk if run else None


@shared_task
def consolidate_nightly_task() -> int:
    """Every 15 minutes (beat): consolidate each kin with pending facts whose night is due
    in its team's time zone; how many runs it made."""
    return len(consolidation_nightly())
