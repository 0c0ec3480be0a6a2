"""WSGI entry point (gunicorn kinsite.wsgi)."""
import gc
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kinsite.settings")
application = get_wsgi_application()

# What is loaded by now (Django, the apps, their modules and caches) lives as long as
# the process. Frozen out of the garbage collector's generations, it is no longer walked
# by every full collection: without this, one in a few dozen chat turns paid for a
# collection of ~100,000 long-lived objects (bench/prompt_build.py, its p99).
gc.freeze()
