"""Gunicorn settings for the production web server (``make serve``), read from the environment.

    gunicorn -c gunicorn.conf.py paperclip.wsgi

* ``PAPERCLIP_BIND`` (default ``127.0.0.1:8000``): gunicorn bind address(es), comma list
  (``0.0.0.0:8000``, ``unix:/run/paperclip.sock``). Put a reverse proxy (TLS) in front.
* ``PAPERCLIP_WEB_WORKERS`` (default: the CPU count): worker processes. Threaded workers
  (``gthread``) wait for the database and the runner long-poll on threads, so one process per
  CPU already keeps every core busy; the sync-worker rule 2 x CPU + 1 would only add memory and
  database connections (each thread holds one).
* ``PAPERCLIP_WEB_THREADS`` (default 8): threads per worker, i.e. concurrent requests per
  process. A runner's command long-poll holds one thread for up to
  ``PAPERCLIP_RUNNER_COMMAND_WAIT_SECONDS``; size workers x threads above the number of runners
  polling at once plus the request concurrency you want (and below PostgreSQL's max_connections).
* ``PAPERCLIP_WEB_TIMEOUT`` (default: the long-poll wait + 30 s): seconds before a silent worker
  is restarted, above the longest request the app holds on purpose.
* ``PAPERCLIP_WEB_KEEPALIVE`` (default 5): seconds an idle keep-alive connection is kept.
* ``PAPERCLIP_WEB_ACCESS_LOG`` (default ``-``, stdout): access log file; empty for none.
* ``CONN_MAX_AGE`` (default here 60): seconds a worker thread keeps its PostgreSQL connection.
  A connection per request costs PostgreSQL a new backend (a fork and a cold catalog cache for
  every table the request touches): measured, more CPU than the request itself (README,
  Benchmarks). With PgBouncer (session mode) in front, 0 is fine: it keeps the server connections.
  Each thread holds one connection: keep workers x threads + Celery processes below
  ``max_connections``.

The app refuses to start under this config with DEBUG on or the development SECRET_KEY, and on a
non-loopback bind without ALLOWED_HOSTS (``production_problems``); ``python gunicorn.conf.py``
runs the same check alone.
"""
import ipaddress
import os
import sys


def _int(name: str, default: int, minimum: int = 1) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        sys.exit(f"gunicorn.conf.py: {name} must be an integer, got {raw!r}")
    if value < minimum:
        sys.exit(f"gunicorn.conf.py: {name} must be >= {minimum}, got {value}")
    return value


LONG_POLL_SECONDS = _int("PAPERCLIP_RUNNER_COMMAND_WAIT_SECONDS", 25, minimum=0)  # as in paperclip.settings

# Before the app's settings are read (the master's check below, then each worker): persistent
# connections unless the environment says otherwise (bench/serving.py reports the same default).
DEFAULT_CONN_MAX_AGE = "60"
os.environ.setdefault("CONN_MAX_AGE", DEFAULT_CONN_MAX_AGE)

wsgi_app = "paperclip.wsgi:application"
bind = [b.strip() for b in os.environ.get("PAPERCLIP_BIND", "127.0.0.1:8000").split(",") if b.strip()]
worker_class = "gthread"
workers = _int("PAPERCLIP_WEB_WORKERS", os.cpu_count() or 1)
threads = _int("PAPERCLIP_WEB_THREADS", 8)
timeout = _int("PAPERCLIP_WEB_TIMEOUT", LONG_POLL_SECONDS + 30)
graceful_timeout = timeout  # a restart lets in-flight long-polls finish
keepalive = _int("PAPERCLIP_WEB_KEEPALIVE", 5)
accesslog = os.environ.get("PAPERCLIP_WEB_ACCESS_LOG", "-") or None
errorlog = "-"
# Gunicorn's control socket defaults to one path per user (~/.gunicorn), which two servers on one
# machine (tests, benchmarks, a second instance) would fight over; nothing here uses it.
control_socket_disable = True


def _loopback(address: str) -> bool:
    if address.startswith(("unix:", "fd://")):
        return True
    host = address.rsplit(":", 1)[0].strip("[]") if ":" in address else address
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def production_problems(binds) -> list[str]:
    """What keeps this host from serving in production: DEBUG on, the development SECRET_KEY, or a
    non-loopback bind without ALLOWED_HOSTS (settings, and .env, read as the app reads them)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "paperclip.settings")
    from django.conf import settings

    problems = []
    if settings.DEBUG:
        problems.append("DEBUG is on: set DEBUG=false")
    if settings.SECRET_KEY == "dev-insecure-paperclip-key-change-me":  # paperclip.settings' development key
        problems.append("SECRET_KEY is the development key: set SECRET_KEY (e.g. "
                        "python -c 'import secrets; print(secrets.token_urlsafe(50))')")
    # After settings are loaded: they copy .env into os.environ.
    if "ALLOWED_HOSTS" not in os.environ and not all(_loopback(b) for b in binds):
        problems.append(f"binding {', '.join(binds)} without ALLOWED_HOSTS: set ALLOWED_HOSTS "
                        "to the host names clients use (comma list)")
    return problems


def on_starting(server):
    """Refuse an unsafe start before any worker forks, saying what to set."""
    problems = production_problems(server.cfg.bind)
    if problems:
        server.log.error("Paperclip will not start:\n  - " + "\n  - ".join(problems))
        sys.exit(1)
    server.log.info("Paperclip: %s worker(s) x %s thread(s) (gthread), timeout %ss, on %s",
                    server.cfg.workers, server.cfg.threads, server.cfg.timeout, ", ".join(server.cfg.bind))


def post_worker_init(worker):
    """The worker has loaded the app: settings, models, URL patterns and the libraries live as long as
    the worker does, so the cyclic garbage collector stops walking them (``gc.freeze``). Its full
    collections then walk only what requests leave behind, not the ~130,000 objects of a loaded
    worker (measured in process over checkouts: 0.17 ms of collection per request fell to 0.06)."""
    import gc

    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018 - import the URLconf now, so that it is frozen too
    gc.collect()
    gc.freeze()


if __name__ == "__main__":  # make serve runs this first, so it fails before migrating
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    found = production_problems(bind)
    if found:
        sys.exit("Paperclip will not start:\n  - " + "\n  - ".join(found))
