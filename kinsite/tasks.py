"""The sweeps of kinsite.jobs as beat's tasks: one task per sweep, over every registered
kind of job, so a new kind needs no beat entry of its own."""
import logging

from celery import shared_task

from kinsite.jobs import job_kinds, jobs_recover_stalled, jobs_requeue

logger = logging.getLogger(__name__)


@shared_task
def requeue_jobs_task() -> int:
    """Every minute (beat): send again the pending jobs whose task never reached the broker
    or was lost with it; how many."""
    sent = 0
    for kind in job_kinds():
        try:
            sent += len(jobs_requeue(kind))
        except Exception:
            # A bug in one kind must not keep the others waiting.
            logger.exception("Requeueing pending %s failed", kind.label)
    return sent


@shared_task
def recover_stalled_jobs_task() -> int:
    """Every minute (beat): take over the jobs left running by a process that stopped;
    how many were queued again or failed."""
    taken_over = 0
    for kind in job_kinds():
        try:
            recovered = jobs_recover_stalled(kind)
        except Exception:
            logger.exception("Recovering stalled %s failed", kind.label)
            continue
        taken_over += len(recovered.requeued) + len(recovered.failed)
    return taken_over
