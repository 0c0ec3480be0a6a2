"""The Celery app. The beat schedule lives here, in one place (beat runs once per
deployment)."""
import gc
import os

from celery import Celery
from celery.schedules import crontab
from celery.signals import worker_process_init

from kinsite.broker import mend_redis_channel_close

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kinsite.settings")

# Without it a worker holding a task when Redis drops exits instead of reconnecting (see there).
mend_redis_channel_close()

app = Celery("kinsite")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

app.conf.beat_schedule = {
    # Every minute: introspect sessions idle for idle_timeout_minutes with events after
    # their introspection cursor (an indexed query over flagged sessions only).
    "introspect-idle-sessions": {
        "task": "sessions_app.tasks.scan_idle_sessions_task",
        "schedule": crontab(),
    },
    # Every minute: queue again the async chat turns left pending without a task, those
    # posted while Redis was down (the API answered 503 and kept them) or lost with Redis's
    # data in a restart, so they run once the broker is back (SPEC §13: nothing is lost).
    "requeue-pending-turns": {
        "task": "sessions_app.turn_tasks.requeue_pending_turns_task",
        "schedule": crontab(),
    },
    # Every minute: take over the chat turns left running by a process that stopped (a web
    # process during a sync turn, a worker during an async one, or an async turn's task lost
    # with Redis), once their session lock's lease has run out: the turn, sync or async, is
    # queued again and answered once; after three starts it is failed, its message kept.
    "recover-stalled-turns": {
        "task": "sessions_app.turn_tasks.recover_stalled_turns_task",
        "schedule": crontab(),
    },
    # Every minute: the same two sweeps for introspection runs. Send again the pending runs
    # whose task never reached the broker or was lost with it...
    "requeue-pending-introspections": {
        "task": "sessions_app.tasks.requeue_pending_introspections_task",
        "schedule": crontab(),
    },
    # ...and fail the runs left running past Celery's hard time limit by a worker that
    # stopped; they applied nothing, so the idle scan introspects the same events again.
    "recover-stalled-introspections": {
        "task": "sessions_app.tasks.recover_stalled_introspections_task",
        "schedule": crontab(),
    },
    # Every 15 minutes: the nightly consolidation. Teams live in different time zones, so
    # the task decides per team whether its CONSOLIDATION_HOUR:MINUTE (default 02:00) has
    # come, and consolidates each kin with pending facts once per night.
    "consolidate-nightly": {
        "task": "consolidation.tasks.consolidate_nightly_task",
        "schedule": crontab(minute="*/15"),
    },
}


@worker_process_init.connect
def _freeze_startup_objects(**kwargs):
    """A pool process starts with the app loaded: as in kinsite/wsgi.py, what it holds
    by now is frozen out of the garbage collector, so full collections in the middle of
    a turn walk only what tasks allocate."""
    gc.freeze()
