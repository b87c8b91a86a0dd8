"""Scaffolding the HTTP benchmarks share: the real app served on loopback in a child process
(stopped when the parent closes its stdin), Redis clean-up and webhook signing."""
from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
    with contextlib.suppress(OSError):
        proc.stdin.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def redis_empty(db: int):
    import redis

    client = redis.Redis(host="127.0.0.1", port=6379, db=db)
    for key in client.scan_iter(count=500):
        client.delete(key)


def github_signature(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
