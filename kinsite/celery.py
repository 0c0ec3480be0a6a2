"""The Celery app. The beat schedule lives here, in one place (beat runs once per
deployment)."""
import os

from celery import Celery
from celery.schedules import crontab

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kinsite.settings")

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
    # Every 15 minutes: the nightly consolidation. Teams live in different time zones, so
    # the task decides per team whether its CONSOLIDATION_HOUR:MINUTE (default 02:00) has
    # come, and consolidates each kin with pending facts once per night.
    "consolidate-nightly": {
        "task": "consolidation.tasks.consolidate_nightly_task",
        "schedule": crontab(minute="*/15"),
    },
}
