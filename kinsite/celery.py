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
    # Every minute, for every kind of job (kinsite.jobs: chat turns, introspection, compaction,
    # consolidation, re-embedding and workflow runs): send again the pending jobs without a queued task, those
    # requested while Redis was down (the API answered 503 and kept them) or whose task was
    # lost with Redis's data in a restart, so they run once the broker is back (docs/deployment.md:
    # nothing is lost).
    "requeue-pending-jobs": {
        "task": "kinsite.tasks.requeue_jobs_task",
        "schedule": crontab(),
    },
    # Every minute, for every kind of job: take over the jobs left running by a process that
    # stopped (a web process during a sync turn, a worker, or a task lost with Redis), once
    # nobody holds their lock; each domain decides. A turn or a compaction is queued again
    # (after three starts it is failed, a turn's message kept); an introspection or
    # consolidation run is failed (it applied nothing; the idle scan, the next night or
    # request runs it again); a workflow run resumes, or is failed if cut off in a node.
    "recover-stalled-jobs": {
        "task": "kinsite.tasks.recover_stalled_jobs_task",
        "schedule": crontab(),
    },
    # Every 15 minutes: the nightly consolidation. Teams live in different time zones, so
    # the task decides per team whether its CONSOLIDATION_HOUR:MINUTE (default 02:00) has
    # come, and consolidates each kin with pending facts once per night.
    "consolidate-nightly": {
        "task": "consolidation.tasks.consolidate_nightly_task",
        "schedule": crontab(minute="*/15"),
    },
    # Every 5 minutes: when the embedding model changed (LLM_EMBEDDING_MODEL), or active
    # memories lack a vector, start one re-embedding run for the current model (memories.reembed);
    # the run works in slices and resumes from its cursor.
    "reembed-memories": {
        "task": "memories.tasks.reembed_check_task",
        "schedule": crontab(minute="*/5"),
    },
    # Every 15 minutes, PostgreSQL with pgvector only: build the HNSW index of the current
    # embedding model's vectors (memories.vectorindex) when it is missing and no re-embedding
    # run is going; a build holds an advisory lock, so a second one never starts meanwhile.
    "vector-index": {
        "task": "memories.tasks.vector_index_check_task",
        "schedule": crontab(minute="*/15"),
    },
}


@worker_process_init.connect
def _freeze_startup_objects(**kwargs):
    """A pool process starts with the app loaded: as in kinsite/wsgi.py, what it holds
    by now is frozen out of the garbage collector, so full collections in the middle of
    a turn walk only what tasks allocate."""
    gc.freeze()
