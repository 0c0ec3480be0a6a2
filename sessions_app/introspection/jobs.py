"""Introspection runs as background jobs (kinsite.jobs; docs/deployment.md#stuck-work): a
stalled run is failed, not rerun; it applied nothing, so the idle scan reads its events again."""
from __future__ import annotations

import logging
from datetime import datetime

from kinsite.jobs import (
    JobKind,
    cache_key_free,
    jobs_recover_stalled,
    jobs_requeue,
    past_task_time_limit,
)
from sessions_app.models import IntrospectionRun

logger = logging.getLogger(__name__)


LOCK_KEY = "kinsite:introspection:session:{session_id}"


INTERRUPTED = "Interrupted: the worker running it stopped before it finished."



def introspection_requeue(*, now: datetime | None = None) -> list[int]:
    """Send again the tasks of pending runs that have none in the queue (requested while the
    broker was down, or lost in a Redis restart); their ids. A run sent twice still runs once
    (session_introspect claims it)."""
    return jobs_requeue(INTROSPECTION_JOBS, now=now)


# How long a run may be running, its session's lock free, before the stalled sweep fails it
# (the lock expires with its task); for the tests, which read it.
run_stalled_after = past_task_time_limit



def introspection_recover_stalled(*, now: datetime | None = None) -> list[int]:
    """Fail the runs left running by a stopped worker that no redelivery took over (it came
    back while the lock was live, so it took itself for a duplicate); their ids. Safe: the run
    applied nothing and the session stays flagged. Runs whose lock is held are left alone."""
    return jobs_recover_stalled(INTROSPECTION_JOBS, now=now).failed



def _stalled_run_error(run: IntrospectionRun) -> str:
    """A stalled run is failed: running it again is the idle scan's business."""
    minutes = round(past_task_time_limit().total_seconds() / 60)
    return (f"{INTERRUPTED} It was still running after {minutes} minutes with nobody working on it. Nothing was "
            f"applied and the cursor did not move: the next run reads the same events.")


INTROSPECTION_JOBS = JobKind(
    name="introspection", label="introspection runs", model="sessions_app.IntrospectionRun",
    task="sessions_app.tasks.introspect_session_task",
    free=lambda run: cache_key_free(LOCK_KEY.format(session_id=run.session_id)), give_up=_stalled_run_error,
    reads=("session_id",),
)
