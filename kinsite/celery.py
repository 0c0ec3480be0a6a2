"""The Celery app. The beat schedule lives here, in one place; later issues add
their entries (idle introspection, nightly consolidation)."""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kinsite.settings")

app = Celery("kinsite")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

app.conf.beat_schedule = {}
