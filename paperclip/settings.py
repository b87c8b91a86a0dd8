"""Settings, read from the environment (django-environ).

Defaults give a working single-machine install: SQLite in ``var/`` and Celery in eager
mode. Production sets DATABASE_URL (PostgreSQL) and CELERY_BROKER_URL (Redis).
"""
import os
from pathlib import Path

import environ

from paperclip.core.database_options import prepared_statements_options

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"
VAR_DIR.mkdir(exist_ok=True)

env = environ.Env(
    DEBUG=(bool, False),
    ALLOWED_HOSTS=(list, ["127.0.0.1", "localhost", "testserver"]),
    CELERY_BROKER_URL=(str, ""),
)
environ.Env.read_env(BASE_DIR / ".env", overwrite=False) if (BASE_DIR / ".env").exists() else None

DEBUG = env("DEBUG")
# A development key only; production must set SECRET_KEY.
SECRET_KEY = env("SECRET_KEY", default="dev-insecure-paperclip-key-change-me")
ALLOWED_HOSTS = env("ALLOWED_HOSTS")
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "paperclip.core.apps.CoreConfig",
    "issues",
    "cases",
    "connectors",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "paperclip.core.middleware.ApiInputGuardMiddleware",  # NUL in /api/ URLs, oversized bodies: JSON errors
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "paperclip.core.middleware.CurrentCompanyMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "paperclip.core.middleware.ConsoleCspMiddleware",  # console HTML only (not /admin/, /api/)
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "paperclip.urls"
WSGI_APPLICATION = "paperclip.wsgi.application"

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
                "paperclip.core.context_processors.current_company",
            ],
        },
    },
]

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'paperclip.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets readers run beside the writer; IMMEDIATE transactions take the write lock at
    # BEGIN, so concurrent writers queue on busy_timeout instead of failing on upgrade.
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    # A file (not :memory:) so that threads in concurrency tests share one database; one per
    # process so that parallel test runs never share it.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / f"test-{os.getpid()}.sqlite3")}
else:
    # One test database per process, so concurrent test runs on one server never collide.
    DATABASES["default"]["TEST"] = {"NAME": f"test_{DATABASES['default']['NAME']}_{os.getpid()}"}
    DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("CONN_MAX_AGE", default=0))
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    # Server-side binding lets psycopg prepare a statement once it has run DATABASE_PREPARE_THRESHOLD
    # times on one connection; PostgreSQL then skips parsing and planning it (measured: a third to a
    # half of the database CPU of a checkout or a webhook delivery). Statements prepare only on kept
    # connections (CONN_MAX_AGE). "off": Django's client-side binding, for a pooler that cannot
    # carry prepared statements (PgBouncer in transaction mode before 1.21).
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        prepared_statements_options(env.str("DATABASE_PREPARE_THRESHOLD", default="")))

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATIC_ROOT.mkdir(exist_ok=True)
# Finders serve files straight from the app directories (tests, runserver) but bypass the
# compressed copies collectstatic writes; `make serve` turns them off to serve those.
WHITENOISE_USE_FINDERS = env.bool("WHITENOISE_USE_FINDERS", default=True)
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
    # Issue attachments' bytes (issues.services.attachments); never served by URL, only through the
    # API's company-checked content view. Any Django storage backend works here.
    "attachments": {"BACKEND": "django.core.files.storage.FileSystemStorage",
                    "OPTIONS": {"location": env("PAPERCLIP_ATTACHMENTS_ROOT", default=str(VAR_DIR / "attachments")),
                                "base_url": None}},
}

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "console:issue-list"
LOGOUT_REDIRECT_URL = "login"

REST_FRAMEWORK = {
    # Board keys first (recognised by their pcp_board_ prefix), then agent keys, then the session
    # (the only one DRF enforces CSRF for).
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "issues.api.auth.BoardKeyAuthentication",
        "issues.api.auth.AgentKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    # DRF's JSON parser plus a nesting limit, finite numbers only and no NUL (paperclip.core.parsers).
    "DEFAULT_PARSER_CLASSES": ["paperclip.core.parsers.JSONParser"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "paperclip.core.errors.exception_handler",
    "UNAUTHENTICATED_USER": None,
}
if DEBUG:
    REST_FRAMEWORK["DEFAULT_RENDERER_CLASSES"].append("rest_framework.renderers.BrowsableAPIRenderer")

SPECTACULAR_SETTINGS = {
    "TITLE": "Paperclip API",
    "DESCRIPTION": "The agent Heartbeat Protocol and the board API of Paperclip.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # Issue and case statuses share values but are different enums.
    "ENUM_NAME_OVERRIDES": {
        "IssueStatusEnum": "issues.choices.IssueStatus",
        "CaseStatusEnum": "cases.choices.CaseStatus",
    },
    # Each operation lists its security once, from its authentication classes (agentKey: the
    # bearer key extension in issues.api.auth; cookieAuth: the session); the webhook lists none.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "paperclip.core.schema.add_plain_views",
        "paperclip.core.schema.add_body_errors",
    ],
}

# Celery: eager (in-process) unless a broker is configured; jobs are real either way.
CELERY_BROKER_URL = env("CELERY_BROKER_URL") or "memory://"
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=not env("CELERY_BROKER_URL"))
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Celery's Django fixup closes a worker's database connections after every task unless this is set,
# whatever CONN_MAX_AGE says; the workers apply Django's own policy instead (paperclip.celery,
# PAPERCLIP_WORKER_CONN_MAX_AGE), and the fixup recycles a connection after this many tasks at most.
CELERY_DB_REUSE_MAX = 1000
CELERY_BEAT_SCHEDULE = {
    "paperclip-sweep": {"task": "issues.tasks.sweep", "schedule": env.float("PAPERCLIP_SWEEP_SECONDS", default=15.0)},
}

PAPERCLIP = {
    # Agent-created task trees are at most parent + child (seed 004).
    "MAX_AGENT_TASK_DEPTH": 2,
    "API_LIST_DEFAULT_LIMIT": env.int("PAPERCLIP_API_LIST_DEFAULT_LIMIT", default=500),
    "API_LIST_MAX_LIMIT": 1000,
    # Opt-in: a coalescing wake made outside a transaction commits with synchronous_commit off
    # (PostgreSQL). Faster under a burst, but a database crash can lose the newest acknowledged
    # coalesced wakes (never a run): off by default, so every acknowledged wake is durable.
    "WAKE_COALESCE_ASYNC_COMMIT": env.bool("PAPERCLIP_WAKE_COALESCE_ASYNC_COMMIT", default=False),
    # Seconds a Celery worker keeps a database connection across tasks (CONN_MAX_AGE for workers;
    # 0: a connection per task). Kept connections keep PostgreSQL's prepared statements and caches.
    "WORKER_CONN_MAX_AGE": env.int("PAPERCLIP_WORKER_CONN_MAX_AGE", default=60),
    # Bounded paged reads (agent case reads, workflow prompt pages): UTF-8 bytes per page.
    "CASE_READ_DEFAULT_BYTES": env.int("PAPERCLIP_CASE_READ_DEFAULT_BYTES", default=64 * 1024),
    "CASE_READ_MAX_BYTES": env.int("PAPERCLIP_CASE_READ_MAX_BYTES", default=256 * 1024),
    # Where agent processes call back: the server origin, handed to them as PAPERCLIP_API_URL
    # (upstream: clients append /api/...). A value ending in /api (the old default) still works:
    # the trailing /api is dropped before it reaches an agent (issues.adapters.base.api_origin).
    "API_URL": env("PAPERCLIP_API_URL", default="http://127.0.0.1:8000"),
    # With a broker, commits kick the dispatcher through Celery; without one the in-process
    # worker (manage.py paperclip_worker) polls, so nothing blocks a web request.
    "KICK_ON_COMMIT": bool(env("CELERY_BROKER_URL")) and not env.bool("CELERY_TASK_ALWAYS_EAGER", default=False),
    # Dispatcher kicks of a burst share one message: at most one per DISPATCH_KICK_LINGER_MS in each
    # process (one dispatch pass starts every queued run; a kick after a quiet spell goes out at once).
    "DISPATCH_KICK_LINGER_MS": env.float("PAPERCLIP_DISPATCH_KICK_LINGER_MS", default=10.0),
    # Runs (seed 003): heartbeat cadence and staleness, retry backoff, continuations.
    "RUN_HEARTBEAT_INTERVAL_SECONDS": env.int("PAPERCLIP_RUN_HEARTBEAT_INTERVAL_SECONDS", default=60),
    "RUN_HEARTBEAT_STALE_SECONDS": env.int("PAPERCLIP_RUN_HEARTBEAT_STALE_SECONDS", default=300),
    "RUN_RETRY_BASE_SECONDS": 10,
    "RUN_RETRY_MAX_BACKOFF_SECONDS": 300,
    "RUN_MAX_RETRIES": env.int("PAPERCLIP_RUN_MAX_RETRIES", default=3),
    "RUN_MAX_CONTINUATIONS": env.int("PAPERCLIP_RUN_MAX_CONTINUATIONS", default=2),
    "RUN_TIMEOUT_SECONDS": env.int("PAPERCLIP_RUN_TIMEOUT_SECONDS", default=3600),
    # A process run with no output and no API activity this long is stopped and retried (0 = off).
    "RUN_STALL_TIMEOUT_SECONDS": env.int("PAPERCLIP_RUN_STALL_TIMEOUT_SECONDS", default=300),
    # Running runs per project at once (Symphony agent.max_concurrent_agents; 0 = no project limit).
    "RUN_MAX_CONCURRENT_AGENTS": env.int("PAPERCLIP_RUN_MAX_CONCURRENT_AGENTS", default=0),
    # API calls made with a run's key (or naming the run) count as its liveness, one write per this.
    "RUN_ACTIVITY_THROTTLE_SECONDS": env.int("PAPERCLIP_RUN_ACTIVITY_THROTTLE_SECONDS", default=15),
    # A PRP runner must confirm a host stop (turn.interrupt / run.cancel) with its run.terminal
    # within this; otherwise the sweep ends the run as lost (issues.runner.host_control).
    "RUNNER_STOP_CONFIRM_SECONDS": env.int("PAPERCLIP_RUNNER_STOP_CONFIRM_SECONDS", default=60),
    # Execution workspaces.
    "WORKSPACE_ROOT": env("PAPERCLIP_WORKSPACE_ROOT", default=str(VAR_DIR / "workspaces")),
    "WORKSPACE_RETENTION_SECONDS": env.int("PAPERCLIP_WORKSPACE_RETENTION_SECONDS", default=24 * 3600),
    "WORKSPACE_DISK_CAP_BYTES": env.int("PAPERCLIP_WORKSPACE_DISK_CAP_BYTES", default=20 * 1024**3),
    # Hooks in the WORKFLOW.md of an https repository (any board user may set one) run only on a
    # single-tenant server that says so; a folder, file:// or ssh repository is staff-set anyway.
    "TRUST_REPOSITORY_HOOKS": env.bool("PAPERCLIP_TRUST_REPOSITORY_HOOKS", default=False),
    # Cases: the workflow text and initialDocuments of a new case share one byte budget.
    "CASE_SEED_BUDGET_BYTES": env.int("PAPERCLIP_CASE_SEED_BUDGET_BYTES", default=1024 * 1024),
    # Issue attachments (upstream's limit and its answer: 422 "Attachment exceeds <N> bytes"), and the
    # content types accepted: exact types or "type/*"; anything else is 422 "Unsupported attachment type".
    "ATTACHMENT_MAX_BYTES": env.int("PAPERCLIP_ATTACHMENT_MAX_BYTES", default=10 * 1024 * 1024),
    "ATTACHMENT_ALLOWED_TYPES": env.list("PAPERCLIP_ATTACHMENT_ALLOWED_TYPES", default=[
        "image/png", "image/jpeg", "image/gif", "image/webp", "application/pdf", "text/plain", "text/markdown",
        "text/csv", "application/json", "text/x-diff", "text/x-patch", "application/zip", "application/gzip"]),
    # Hostile input: API request bodies over this size are a 413 (DATA_UPLOAD_MAX_MEMORY_SIZE below;
    # the connector webhook has its own limit), JSON nested deeper is a 400 (request bodies and
    # signed webhook payloads alike).
    "MAX_REQUEST_BYTES": env.int("PAPERCLIP_MAX_REQUEST_BYTES", default=2_621_440),
    "JSON_MAX_DEPTH": env.int("PAPERCLIP_JSON_MAX_DEPTH", default=64),
    # Which env:NAME secret references tenants may use (exact names, or prefixes ending in *), each
    # bound to the company it is for ("ACME:PAPERCLIP_SECRET_ACME_*", issue prefix or company id); the
    # server's own configuration variables are refused whatever this says (paperclip.core.secret_refs).
    "SECRET_ENV_ALLOWLIST": env.list("PAPERCLIP_SECRET_ENV_ALLOWLIST", default=["PAPERCLIP_SECRET_*"]),
    # Entries without a company apply to every company only on a server that serves one tenant.
    "SECRET_ENV_SINGLE_TENANT": env.bool("PAPERCLIP_SECRET_ENV_SINGLE_TENANT", default=False),
    # Outbound requests to tenant-configured URLs (paperclip.core.outbound_http): non-public
    # addresses are refused unless listed here (host, host:port or CIDR); plain http only to loopback.
    "OUTBOUND_ALLOWED_HOSTS": env.list("PAPERCLIP_OUTBOUND_ALLOWED_HOSTS", default=[]),
    "OUTBOUND_ALLOW_HTTP": env.bool("PAPERCLIP_OUTBOUND_ALLOW_HTTP", default=False),
    # Runner protocol transport (issues.runner): event batches, the command long-poll (a WSGI worker
    # is held while it waits), and how long a run's revoked key may still re-deliver after its end.
    "RUNNER_MAX_BATCH": env.int("PAPERCLIP_RUNNER_MAX_BATCH", default=100),
    "RUNNER_MAX_BATCH_BYTES": env.int("PAPERCLIP_RUNNER_MAX_BATCH_BYTES", default=1024 * 1024),
    "RUNNER_COMMAND_WAIT_SECONDS": env.int("PAPERCLIP_RUNNER_COMMAND_WAIT_SECONDS", default=25),
    "RUNNER_COMMAND_POLL_SECONDS": 0.5,
    "RUNNER_ACK_GRACE_SECONDS": env.int("PAPERCLIP_RUNNER_ACK_GRACE_SECONDS", default=600),
    # The reference runner's durable outboxes (one SQLite file per run) for agents of adapter "prp".
    "RUNNER_OUTBOX_DIR": env("PAPERCLIP_RUNNER_OUTBOX_DIR", default=str(VAR_DIR / "runner-outbox")),
}

# Django refuses a larger body when it is read (RequestDataTooBig); the API answers 413 payload_too_large.
DATA_UPLOAD_MAX_MEMORY_SIZE = PAPERCLIP["MAX_REQUEST_BYTES"]
# Uploaded files: past the attachment limit a file is dropped as it streams in (paperclip.core.uploads).
FILE_UPLOAD_HANDLERS = [
    "paperclip.core.uploads.SizeLimitedUploadHandler",
    "django.core.files.uploadhandler.MemoryFileUploadHandler",
    "django.core.files.uploadhandler.TemporaryFileUploadHandler",
]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env("LOG_LEVEL", default="WARNING")},
}

# Connector engine (External Task Protocol layers 1-2).
CONNECTORS = {
    "WEBHOOK_MAX_BODY_BYTES": env.int("PAPERCLIP_CONNECTOR_WEBHOOK_MAX_BYTES", default=5 * 1024 * 1024),
    # A Fernet key for stored connector secrets; without one it is derived from SECRET_KEY.
    "SECRETS_KEY": env("PAPERCLIP_SECRETS_KEY", default=""),
    "MAX_ATTEMPTS": 5,  # an event failing this often is parked
    "RETRY_BASE_SECONDS": env.float("PAPERCLIP_CONNECTOR_RETRY_BASE_SECONDS", default=5.0),
    "RETRY_MAX_SECONDS": 600.0,
    # Outbound writes (§13.1.1): exponential backoff with jitter capped at OUTBOUND_RETRY_MAX_SECONDS,
    # retried until the backoff schedule spans the horizon, then parked for an operator replay.
    "OUTBOUND_RETRY_HORIZON_SECONDS": env.float("PAPERCLIP_CONNECTOR_OUTBOUND_RETRY_HORIZON_SECONDS",
                                                default=24 * 3600.0),
    "OUTBOUND_RETRY_MAX_SECONDS": env.float("PAPERCLIP_CONNECTOR_OUTBOUND_RETRY_MAX_SECONDS", default=1800.0),
    # A claimed delivery whose worker died is retried after this (keep it above the adapters' timeout).
    "OUTBOUND_DELIVERY_LEASE_SECONDS": env.float("PAPERCLIP_CONNECTOR_OUTBOUND_LEASE_SECONDS", default=120.0),
    # A pending event older than this was not kicked (or its worker died): the sweep applies it.
    "STALE_PENDING_SECONDS": env.int("PAPERCLIP_CONNECTOR_STALE_PENDING_SECONDS", default=60),
    # With a broker, a stored webhook event is kicked through Celery on commit; without one (the embedded
    # default) the request only verifies and stores and manage.py paperclip_worker drains the inbox.
    "KICK_ON_COMMIT": env.bool("PAPERCLIP_CONNECTOR_KICK_ON_COMMIT", default=PAPERCLIP["KICK_ON_COMMIT"]),
    # Kicks of a burst share Celery messages: at most one round of publishes per KICK_LINGER_MS in each
    # web process, up to KICK_BATCH_SIZE tasks a message (a kick after a quiet spell goes out at once).
    "KICK_BATCH_SIZE": env.int("PAPERCLIP_CONNECTOR_KICK_BATCH_SIZE", default=8),
    "KICK_LINGER_MS": env.float("PAPERCLIP_CONNECTOR_KICK_LINGER_MS", default=10.0),
    # A worker applies up to this many events of a task's queue in one transaction (1: one event each).
    "APPLY_BATCH_SIZE": env.int("PAPERCLIP_CONNECTOR_APPLY_BATCH_SIZE", default=8),
    # Workers starting within this many seconds of each other run one restart recovery pass (§13.2).
    "RESTART_RECOVERY_GRACE_SECONDS": env.int("PAPERCLIP_CONNECTOR_RESTART_RECOVERY_GRACE_SECONDS", default=60),
    "SWEEP_BATCH": 500,
    "POLL_MAX_PAGES": 20,
    "STATE_BATCH": 100,  # external ids per batched state call during reconciliation
    # Comment backstop (§7.1.2, §7.1.3): links whose comments each poll tick lists incrementally (and the
    # pages per link), links whose complete listing each reconcile tick reads to repair edits/deletions.
    "COMMENT_POLL_BATCH": env.int("PAPERCLIP_CONNECTOR_COMMENT_POLL_BATCH", default=50),
    "COMMENT_POLL_MAX_PAGES": 5,
    "COMMENT_RECONCILE_BATCH": env.int("PAPERCLIP_CONNECTOR_COMMENT_RECONCILE_BATCH", default=25),
    "COMMENT_FULL_MAX_PAGES": 20,  # a longer thread is not complete: no deletion is concluded from it
    "TRANSCRIPT_MAX_CHARS": env.int("PAPERCLIP_CONNECTOR_TRANSCRIPT_MAX_CHARS", default=4000),  # postTranscripts
    "PUBLIC_BASE_URL": env("PAPERCLIP_PUBLIC_URL", default="http://127.0.0.1:8000"),
    "EVENT_RETENTION_DAYS": env.int("PAPERCLIP_CONNECTOR_EVENT_RETENTION_DAYS", default=30),
}
CELERY_BEAT_SCHEDULE["connectors-sweep"] = {
    "task": "connectors.tasks.sweep", "schedule": env.float("PAPERCLIP_CONNECTOR_SWEEP_SECONDS", default=30.0),
}
