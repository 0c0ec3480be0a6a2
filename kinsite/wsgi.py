"""WSGI entry point (gunicorn kinsite.wsgi)."""
import gc
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kinsite.settings")
application = get_wsgi_application()

# What is loaded by now lives as long as the process: frozen out of the garbage collector,
# it is not walked by every full collection, which otherwise stalls an occasional request.
gc.freeze()
