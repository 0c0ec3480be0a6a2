"""The sweeps of kinsite.jobs as beat's tasks: one task per sweep, over every registered
kind of job, so a new kind needs no beat entry of its own."""
import logging
from collections.abc import Callable

from celery import shared_task

from kinsite.jobs import JobKind, job_kinds, jobs_recover_stalled, jobs_requeue

logger = logging.getLogger(__name__)


def _each_kind(sweep: Callable[[JobKind], int], failure: str) -> int:
    """Run `sweep` over every registered kind; the sum of what it counts. A kind whose sweep
    raises is logged (`failure` % its label) and skipped: a bug in one kind must not keep
    the others waiting."""
    total = 0
    for kind in job_kinds():
        try:
            total += sweep(kind)
        except Exception:
            logger.exception(failure, kind.label)
    return total


@shared_task
def requeue_jobs_task() -> int:
    """Every minute (beat): send again the pending jobs whose task never reached the broker
    or was lost with it; how many."""
    return _each_kind(lambda kind: len(jobs_requeue(kind)), "Requeueing pending %s failed")


def _taken_over(kind: JobKind) -> int:
    recovered = jobs_recover_stalled(kind)
    return len(recovered.requeued) + len(recovered.failed)


@shared_task
def recover_stalled_jobs_task() -> int:
    """Every minute (beat): take over the jobs left running by a process that stopped;
    how many were queued again or failed."""
    return _each_kind(_taken_over, "Recovering stalled %s failed")
