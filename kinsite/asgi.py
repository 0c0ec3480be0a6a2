"""ASGI entry point, the production web server's (Procfile `web`: gunicorn with uvicorn
workers), so an open event stream (a streamed chat turn) waits on the event loop instead of
holding a thread; ordinary views still run in a thread each (asgiref), as under WSGI."""
import gc
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kinsite.settings")
# Under ASGI each request's synchronous code runs in a thread of its own, so a connection
# kept for reuse (CONN_MAX_AGE) would stay open in a thread that is gone: Django's advice for
# ASGI is no persistent connections. A DB_CONN_MAX_AGE set (not empty) in the environment
# still wins; empty, as .env.example leaves it, means 0 here.
if not os.environ.get("DB_CONN_MAX_AGE"):
    os.environ["DB_CONN_MAX_AGE"] = "0"
application = get_asgi_application()

# As in kinsite/wsgi.py: what is loaded by now lives as long as the process.
gc.freeze()
