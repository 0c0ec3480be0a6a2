"""ASGI entry point of the production web server (Procfile `web`), so an open event stream
waits on the event loop instead of holding a thread; ordinary views still run in threads."""
import gc
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kinsite.settings")
# Under ASGI a connection kept for reuse would stay open in a request thread that is gone
# (Django's advice: no persistent connections). A DB_CONN_MAX_AGE set (not empty) still wins.
if not os.environ.get("DB_CONN_MAX_AGE"):
    os.environ["DB_CONN_MAX_AGE"] = "0"
application = get_asgi_application()

# As in kinsite/wsgi.py: what is loaded by now lives as long as the process.
gc.freeze()
