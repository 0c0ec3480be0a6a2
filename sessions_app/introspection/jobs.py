"""Introspection runs as background jobs (kinsite.jobs): the requeue sweep sends again a
pending run whose task never reached the broker or was lost with it; the stalled sweep
fails a run left running by a worker that stopped, once its session's lock is free (it
applied nothing, so the idle scan introspects the same events again)."""
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
    """Send again the tasks of pending runs that have none in the queue: requested while the
    broker was down (the request answered 503, or the turn that triggered it failed to
    enqueue it), or queued before Redis lost its data in a restart. Returns their ids. A
    run sent twice still runs once (session_introspect claims it). kinsite.jobs.jobs_requeue:
    the oldest 500 pending runs (partial index introspection_run_pending); with Redis down
    it stops until the next minute."""
    return jobs_requeue(INTROSPECTION_JOBS, now=now)


# How long a run must have been running, with its session's introspection lock free,
# before the stalled-run sweep fails it (the lock expires with its task); 7 minutes by default.
# Kept for the tests, which read it.
run_stalled_after = past_task_time_limit



def introspection_recover_stalled(*, now: datetime | None = None) -> list[int]:
    """Fail the runs left running by a worker that stopped (killed, or cut off by the hard
    time limit) and that no delivery of their task took over. Returns their ids.

    A run is left so when its worker dies and the task comes back while the run's lock is
    still live: that delivery takes itself for a duplicate and does nothing. Failing is
    safe, as for any failed run: it applied nothing and left the cursor, and the session
    stays flagged, so the idle scan (or the next trigger) introspects the same events
    again. Runs whose session lock is held are left alone. kinsite.jobs.jobs_recover_stalled:
    the 100 longest running (the partial unique index of introspection_one_running_per_session);
    with Redis down it stops until the next minute."""
    return jobs_recover_stalled(INTROSPECTION_JOBS, now=now).failed



def _stalled_run_error(run: IntrospectionRun) -> str:
    """A stalled run, its lock free, is failed: it applied nothing, so running it again is
    the idle scan's business (it finds the session's events after the cursor)."""
    minutes = round(past_task_time_limit().total_seconds() / 60)
    return (f"{INTERRUPTED} It was still running after {minutes} minutes with nobody working on it. Nothing was "
            f"applied and the cursor did not move: the next run reads the same events.")


INTROSPECTION_JOBS = JobKind(
    name="introspection", label="introspection runs", model="sessions_app.IntrospectionRun",
    task="sessions_app.tasks.introspect_session_task",
    free=lambda run: cache_key_free(LOCK_KEY.format(session_id=run.session_id)), give_up=_stalled_run_error,
    reads=("session_id",),
)
