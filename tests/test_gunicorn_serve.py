"""The production server configuration (gunicorn.conf.py, ``make serve``): real gunicorn processes on
a loopback port against this test's own database (committed rows, so another process sees them).

The app answers an authenticated API request, whitenoise serves static files with cache headers
(Django itself serves none with DEBUG off), the worker and thread counts come from the environment,
and an unsafe start (the development SECRET_KEY, DEBUG on) is refused with a message saying what to set.
"""
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from django.db import connection

from issues.services.companies import agent_api_key_create
from tests.factories import AgentFactory

BASE_DIR = Path(__file__).resolve().parent.parent
GUNICORN = str(Path(sys.executable).with_name("gunicorn"))
CONFIG = str(BASE_DIR / "gunicorn.conf.py")
STATIC_FILE = BASE_DIR / "static" / "css" / "app.css"


def database_url() -> str:
    """The URL of the database this test uses (the test database, not the configured one)."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{os.path.abspath(s['NAME'])}"  # a file per test process (paperclip.settings)
    auth = quote(s["USER"] or "", safe="")
    if s.get("PASSWORD"):
        auth += ":" + quote(s["PASSWORD"], safe="")
    port = f":{s['PORT']}" if s.get("PORT") else ""
    return f"postgres://{auth}@{s.get('HOST') or '127.0.0.1'}{port}/{quote(s['NAME'], safe='')}"


def free_port() -> int:
    with socket.socket() as sock:  # gunicorn cannot bind port 0 and report it
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_env(port: int, **overrides) -> dict:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "paperclip.settings", "DATABASE_URL": database_url(),
           "SECRET_KEY": secrets.token_urlsafe(40), "DEBUG": "false", "PAPERCLIP_BIND": f"127.0.0.1:{port}",
           "PAPERCLIP_WEB_WORKERS": "2", "PAPERCLIP_WEB_THREADS": "2", "LOG_LEVEL": "WARNING"}
    env.pop("ALLOWED_HOSTS", None)
    env.update(overrides)
    return env


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                pass
    return found


@pytest.fixture
def gunicorn(tmp_path):
    """Starts ``gunicorn -c gunicorn.conf.py`` (in its own session, stopped after the test); returns a
    function (env) -> (process, base URL, log path) that waits until every worker answers."""
    started = []

    def start(env):
        log = tmp_path / f"gunicorn-{len(started)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen([GUNICORN, "-c", CONFIG], cwd=BASE_DIR, env=env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        started.append(proc)
        return proc, log

    yield start
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # its own session: the master and its workers
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def wait_answering(proc, base_url: str, log: Path, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"gunicorn exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            httpx.get(f"{base_url}/api/health", timeout=5, trust_env=False)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    pytest.fail(f"gunicorn did not answer within {timeout}s:\n{log.read_text()[-3000:]}")


@pytest.mark.django_db(transaction=True)
def test_gunicorn_serves_the_api_and_static_files_with_env_workers(gunicorn):
    agent = AgentFactory()
    _, raw_key = agent_api_key_create(agent=agent)
    port = free_port()
    proc, log = gunicorn(server_env(port))
    base_url = f"http://127.0.0.1:{port}"
    wait_answering(proc, base_url, log)

    with httpx.Client(base_url=base_url, timeout=10, trust_env=False) as client:
        me = client.get("/api/agents/me", headers={"Authorization": f"Bearer {raw_key}"})
        assert me.status_code == 200, me.text
        assert me.json()["id"] == str(agent.pk)  # read from this test's database by another process
        assert me.headers["server"].startswith("gunicorn")

        anonymous = client.get("/api/agents/me")
        assert anonymous.status_code == 401
        assert anonymous.json()["code"] == "unauthorized"

        static = client.get("/static/css/app.css")
        assert static.status_code == 200
        assert static.content == STATIC_FILE.read_bytes()
        cache = static.headers["cache-control"]
        assert "public" in cache and "max-age=" in cache, cache  # whitenoise's headers
        assert static.headers["content-type"].startswith("text/css")

    workers = children(proc.pid)
    assert len(workers) == 2, workers  # PAPERCLIP_WEB_WORKERS
    assert "2 worker(s) x 2 thread(s) (gthread)" in log.read_text()


@pytest.mark.parametrize("overrides, message", [
    ({"SECRET_KEY": "dev-insecure-paperclip-key-change-me"}, "SECRET_KEY is the development key"),
    ({"DEBUG": "true"}, "DEBUG is on"),
    ({"PAPERCLIP_BIND": "0.0.0.0:{port}"}, "without ALLOWED_HOSTS"),
])
def test_gunicorn_refuses_an_unsafe_production_start(gunicorn, overrides, message):
    port = free_port()
    overrides = {k: v.format(port=port) for k, v in overrides.items()}
    proc, log = gunicorn(server_env(port, **overrides))
    assert proc.wait(timeout=30) != 0  # before any worker forks: nothing binds workers to the port
    text = log.read_text()
    assert "Paperclip will not start" in text and message in text, text
    assert "Booting worker" not in text


def database_backends() -> set[int]:
    """The PostgreSQL backends connected to this test's database, other than this test's own."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                       "AND pid <> pg_backend_pid()")
        return {row[0] for row in cursor.fetchall()}


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL backends (SQLite has no server)")
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("overrides, kept", [({}, True), ({"CONN_MAX_AGE": "0"}, False)])
def test_gunicorn_keeps_database_connections_unless_told_not_to(gunicorn, overrides, kept):
    """The production default (CONN_MAX_AGE 60 in gunicorn.conf.py): one worker thread answers two
    requests from the same PostgreSQL backend; with CONN_MAX_AGE=0 every request has a backend of its own."""
    agent = AgentFactory()
    _, raw_key = agent_api_key_create(agent=agent)
    port = free_port()
    env = server_env(port, PAPERCLIP_WEB_WORKERS="1", PAPERCLIP_WEB_THREADS="1", **overrides)
    if not overrides:
        env.pop("CONN_MAX_AGE", None)  # the configuration's own default
    proc, log = gunicorn(env)
    base_url = f"http://127.0.0.1:{port}"
    wait_answering(proc, base_url, log)
    seen = []
    with httpx.Client(base_url=base_url, timeout=10, trust_env=False,
                      headers={"Authorization": f"Bearer {raw_key}"}) as client:
        for _ in range(2):
            assert client.get("/api/agents/me").status_code == 200
            seen.append(database_backends())
    if kept:
        assert len(seen[0]) == 1 and seen[0] == seen[1], seen
        return
    deadline = time.monotonic() + 10  # closed at each request's end; PostgreSQL lists a backend until it exits
    while database_backends() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert database_backends() == set()
