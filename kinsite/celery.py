"""The Celery app and its beat schedule (docs/deployment.md#the-beat-schedule)."""
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
    # Every minute: introspect sessions idle for idle_timeout_minutes with events after their cursor.
    "introspect-idle-sessions": {
        "task": "sessions_app.tasks.scan_idle_sessions_task",
        "schedule": crontab(),
    },
    # Every minute, for every kind of job (kinsite.jobs): send again the pending jobs without a
    # queued task (sent while Redis was down, or lost with its data).
    "requeue-pending-jobs": {
        "task": "kinsite.tasks.requeue_jobs_task",
        "schedule": crontab(),
    },
    # Every minute, for every kind of job: take over the jobs left running by a process that
    # stopped, once nobody holds their lock; each domain decides whether to rerun or fail them.
    "recover-stalled-jobs": {
        "task": "kinsite.tasks.recover_stalled_jobs_task",
        "schedule": crontab(),
    },
    # Every 15 minutes, since teams live in different time zones: the task decides per team
    # whether its CONSOLIDATION_HOUR:MINUTE has come, and consolidates each kin once a night.
    "consolidate-nightly": {
        "task": "consolidation.tasks.consolidate_nightly_task",
        "schedule": crontab(minute="*/15"),
    },
    # Every 5 minutes: start a re-embedding run (memories.reembed) when the embedding model
    # changed or active memories lack a vector.
    "reembed-memories": {
        "task": "memories.tasks.reembed_check_task",
        "schedule": crontab(minute="*/5"),
    },
    # Every 15 minutes, pgvector only: build the current model's HNSW index (memories.vectorindex)
    # when it is missing and no re-embedding runs; an advisory lock keeps builds single.
    "vector-index": {
        "task": "memories.tasks.vector_index_check_task",
        "schedule": crontab(minute="*/15"),
    },
}


@worker_process_init.connect
def _freeze_startup_objects(**kwargs):
    """As in kinsite/wsgi.py: a pool process starts with the app loaded, frozen out of the
    garbage collector so full collections walk only what tasks allocate."""
    gc.freeze()
