"""WSGI entry point (gunicorn kinsite.wsgi)."""
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kinsite.settings")
application = get_wsgi_application()
