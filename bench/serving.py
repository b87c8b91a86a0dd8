"""Scaffolding the HTTP benchmarks share: the real app served on loopback in a child process,
Redis clean-up and webhook signing.

Two servers (``--server``), each serving the app and the bench's baseline views from one URLconf,
so a figure and its same-run baseline always share the server and its configuration:

* ``threaded`` (default): this script re-executed with ``--serve``, Django's ``ThreadedWSGIServer``
  in one process (stopped when the parent closes its stdin).
* ``gunicorn``: the production server, ``gunicorn -c gunicorn.conf.py`` (gthread workers, exactly
  the ``make serve`` configuration) with ``--workers``/``--threads`` passed as its
  ``PAPERCLIP_WEB_WORKERS``/``PAPERCLIP_WEB_THREADS``; the app is :func:`gunicorn_app`, which
  applies the bench's URLconf. It dies with the parent (``PR_SET_PDEATHSIG``).
"""
from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVERS = ("threaded", "gunicorn")
URLCONF_ENV = "PAPERCLIP_BENCH_URLCONF"
GUNICORN_CONN_MAX_AGE = 60  # gunicorn.conf.py's DEFAULT_CONN_MAX_AGE


def serve_wsgi(port: int):
    """Child process, after Django is set up: serve the app until stdin closes."""
    import logging

    from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
    from django.core.wsgi import get_wsgi_application

    application = get_wsgi_application()  # (re)configures logging, so quieten loggers after it
    logging.getLogger("django.server").setLevel(logging.ERROR)  # no per-request access log
    logging.getLogger("django.request").setLevel(logging.ERROR)  # no warning line per expected 4xx
    server = ThreadedWSGIServer(("127.0.0.1", port), WSGIRequestHandler, allow_reuse_address=True)
    server.set_app(application)

    def watch_parent():
        sys.stdin.read()  # EOF when the parent exits or closes the pipe
        os._exit(0)

    threading.Thread(target=watch_parent, daemon=True).start()
    print(f"READY {server.server_address[1]}", flush=True)
    server.serve_forever(poll_interval=0.2)


def add_server_arguments(parser):
    parser.add_argument("--server", choices=SERVERS, default="threaded",
                        help="threaded: Django's ThreadedWSGIServer, one process (default); gunicorn: the "
                             "production server (gunicorn.conf.py, gthread workers)")
    parser.add_argument("--workers", type=int, default=None,
                        help="gunicorn worker processes (default: PAPERCLIP_WEB_WORKERS or the CPU count)")
    parser.add_argument("--threads", type=int, default=None,
                        help="gunicorn threads per worker (default: PAPERCLIP_WEB_THREADS or 8)")


def server_config(args) -> dict:
    """The server the figures were measured on: printed and stored next to them."""
    if args.server == "threaded":
        return {"server": "threaded", "workers": 1, "threads": "one per connection",
                "conn_max_age": int(os.environ.get("CONN_MAX_AGE") or 0)}
    workers = args.workers or int(os.environ.get("PAPERCLIP_WEB_WORKERS") or os.cpu_count() or 1)
    threads = args.threads or int(os.environ.get("PAPERCLIP_WEB_THREADS") or 8)
    # gunicorn.conf.py's default unless the environment (or the bench's --conn-max-age) sets it
    conn_max_age = int(os.environ.get("CONN_MAX_AGE") or GUNICORN_CONN_MAX_AGE)
    return {"server": "gunicorn", "workers": workers, "threads": threads, "worker_class": "gthread",
            "conn_max_age": conn_max_age}


def describe(config: dict) -> str:
    if config["server"] == "threaded":
        return f"threaded WSGI server (1 process, a thread per connection), CONN_MAX_AGE={config['conn_max_age']}"
    return (f"gunicorn, {config['workers']} gthread worker(s) x {config['threads']} thread(s), "
            f"CONN_MAX_AGE={config['conn_max_age']}")


def ensure_secret_key():
    """One random SECRET_KEY for the parent and the server (gunicorn.conf.py refuses the development
    key); call before Django is set up."""
    os.environ.setdefault("SECRET_KEY", "bench-" + secrets.token_urlsafe(40))


def configure_worker_env(*, default_db: str, redis_db: int, secret_name: str, secret: str) -> str:
    """The environment the Celery-backed benches share (before Django is set up): their database,
    a real broker on its own Redis database, kicks not eager, the webhook secret they sign with."""
    url = os.environ.get("DATABASE_URL") or default_db
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "paperclip.settings"
    os.environ["DEBUG"] = "False"
    os.environ.setdefault("LOG_LEVEL", "ERROR")
    os.environ["CELERY_BROKER_URL"] = f"redis://127.0.0.1:6379/{redis_db}"
    os.environ["CELERY_TASK_ALWAYS_EAGER"] = "False"
    os.environ[secret_name] = secret
    # The bench server is one operator's: its companies may all name the allow-listed secret (README,
    # "Secret references"; a multi-company server binds each name to a company instead).
    os.environ["PAPERCLIP_SECRET_ENV_SINGLE_TENANT"] = "true"
    return url


def launch(args, script: str, extra: list[str], name: str, urlconf: str) -> tuple[subprocess.Popen, str]:
    """Start the server ``args.server`` names; returns (process, base URL)."""
    if getattr(args, "server", "threaded") == "gunicorn":
        return start_gunicorn(server_config(args), urlconf, name)
    return start_server(script, extra, name)


def gunicorn_app():
    """The WSGI app a gunicorn worker serves: the bench's URLconf over the real settings."""
    import logging

    from django.conf import settings
    from django.core.wsgi import get_wsgi_application

    settings.ROOT_URLCONF = os.environ[URLCONF_ENV]  # before setup, as the benches' django_setup
    application = get_wsgi_application()  # (re)configures logging, so quieten loggers after it
    logging.getLogger("django.request").setLevel(logging.ERROR)  # as serve_wsgi: no line per expected 4xx
    return application


def free_port() -> int:
    """A free loopback port (gunicorn cannot bind port 0 and report it); the bind follows at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _die_with_parent():  # runs in the child between fork and exec (Linux; elsewhere a no-op)
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def start_gunicorn(config: dict, urlconf: str, name: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, URLCONF_ENV: urlconf, "PAPERCLIP_BIND": f"127.0.0.1:{port}",
           "PAPERCLIP_WEB_WORKERS": str(config["workers"]), "PAPERCLIP_WEB_THREADS": str(config["threads"]),
           "PAPERCLIP_WEB_ACCESS_LOG": ""}  # no access log line per request
    cmd = [str(Path(sys.executable).with_name("gunicorn")), "-c", str(ROOT / "gunicorn.conf.py"),
           "--log-level", "warning", "bench.serving:gunicorn_app()"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
    base_url = f"http://127.0.0.1:{port}"
    wait_until_answering(proc, base_url, name)
    return proc, base_url


def wait_until_answering(proc: subprocess.Popen, base_url: str, name: str, timeout: float = 90):
    """Gunicorn binds before its workers boot: wait for a few answers (the benches' warm-up takes
    up any worker still importing)."""
    import httpx

    deadline = time.monotonic() + timeout
    answered = 0
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            httpx.get(f"{base_url}/api/health", timeout=5, trust_env=False)
            answered += 1
            if answered >= 3:
                return
        except httpx.HTTPError:
            time.sleep(0.2)
    stop_server(proc)
    sys.exit(f"{name}: the gunicorn server did not start (exit code {proc.returncode})")


def start_server(script: str, extra: list[str], name: str) -> tuple[subprocess.Popen, str]:
    """Run ``script --serve --port 0 *extra`` and wait for its READY line; returns (process, base URL)."""
    cmd = [sys.executable, str(Path(script).resolve()), "--serve", "--port", "0", *extra]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT, text=True)
    deadline = time.monotonic() + 60
    line = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("READY ") or not line:
            break
    if not line.startswith("READY "):
        stop_server(proc)
        sys.exit(f"{name}: the server did not start")
    return proc, f"http://127.0.0.1:{int(line.split()[1])}"


def stop_server(proc: subprocess.Popen):
    """Threaded: close its stdin; gunicorn: SIGTERM, a graceful stop of the master and its workers."""
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    else:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _processes() -> dict:
    """pid -> (command name, parent pid, [utime, stime, cutime, cstime] in clock ticks), from Linux
    /proc; empty where there is none."""
    procs = {}
    with contextlib.suppress(OSError):
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    head, tail = (entry / "stat").read_text().rsplit(")", 1)
                    fields = tail.split()
                    procs[int(entry.name)] = (head.split("(", 1)[1], int(fields[1]),
                                              [int(x) for x in fields[11:15]])
    return procs


def tree_cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process and its live children (gunicorn's workers), from Linux /proc;
    None where that is unavailable."""
    procs = _processes()
    if pid not in procs:
        return None
    ticks = sum(times[0] + times[1] for p, (_, ppid, times) in procs.items() if p == pid or ppid == pid)
    return ticks / os.sysconf("SC_CLK_TCK")


def database_cpu_seconds() -> float | None:
    """CPU time of the local PostgreSQL server: the postmaster, its live backends and every backend
    it has reaped (a connection per request ends in a short-lived backend); Linux /proc, None where
    the server is not visible from here."""
    procs = _processes()
    masters = [pid for pid, (comm, ppid, _) in procs.items()
               if comm.startswith("postgres") and procs.get(ppid, ("",))[0][:8] != "postgres"]
    if not masters:
        return None
    ticks = 0
    for master in masters:
        ticks += sum(procs[master][2])  # own and reaped children's utime + stime
        ticks += sum(sum(t[:2]) for _, ppid, t in procs.values() if ppid == master)  # live backends
    return ticks / os.sysconf("SC_CLK_TCK")


def redis_empty(db: int):
    import redis

    client = redis.Redis(host="127.0.0.1", port=6379, db=db)
    for key in client.scan_iter(count=500):
        client.delete(key)


def github_signature(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
