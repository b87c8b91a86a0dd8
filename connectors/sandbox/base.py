"""What every provider sandbox shares (stdlib only, no Django): the threaded HTTP server and its
handler, the request log, ``fail_next`` failure queue, ``outage``/``recover`` (optionally with stalled
write responses), webhook delivery recording/flush/quiet, the deterministic clock,
``/_sandbox/<control>`` dispatch and the standalone CLI loop.

A sandbox subclasses :class:`SandboxServer`, sets the class attributes (``provider``, ``server_version``,
``control_methods``...) and implements ``handle(method, raw_path, headers, raw_body) -> (status,
headers, body bytes)`` plus its provider's shapes."""
from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import hashlib
import hmac
import json
import os
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

START_TIME = datetime(2026, 1, 1, tzinfo=timezone.utc)


def hmac_sha256_hex(secret: str, body: bytes) -> str:
    return hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


def iso_ms(value: datetime | None, zone: str = "Z") -> str | None:
    """Millisecond ISO-8601 in UTC; ``zone`` is how the provider spells UTC (``Z``, Jira's ``+0000``)."""
    if value is None:
        return None
    value = value.astimezone(timezone.utc)
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}{zone}"


def parse_ts(value: str) -> datetime:
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)


def deep_merge(target: dict, overrides: dict) -> dict:
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            deep_merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
    return target


@dataclass(kw_only=True)
class DeliveryRecord:
    """What every sandbox's ``Delivery`` dataclass has besides its provider fields (which include
    ``headers`` and ``body``, the exact signed bytes): where it went and how that went."""

    url: str | None = None
    status: int | None = None
    response_body: bytes = b""
    error: str | None = None
    delivered: bool = False

    @property
    def payload(self) -> dict:
        return json.loads(self.body)

    @property
    def lower_headers(self) -> dict:
        return {k.lower(): v for k, v in self.headers.items()}

    def send(self, timeout: float) -> None:
        req = urllib.request.Request(self.url, data=self.body, headers=self.headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                self.status, self.response_body = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            self.status, self.response_body = exc.code, exc.read()
        except (urllib.error.URLError, OSError) as exc:
            self.error = str(exc)
        self.delivered = self.status is not None


@dataclass
class RequestRecord:
    """One REST request as the sandbox saw it."""

    method: str
    path: str  # without the API prefix (/api/v3, /rest/api/3)
    query: dict  # name -> list of values
    headers: dict  # lower-cased
    body: object = None  # parsed JSON or None
    status: int | None = None

    def summary(self) -> dict:
        return {"method": self.method, "path": self.path, "query": self.query, "status": self.status}


def mutation(method):
    """A control method: runs under the state lock, then sends its webhooks (in ``sync`` mode)."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        return self._mutate(lambda: method(self, *args, **kwargs))
    return wrapper


class SandboxHandler(BaseHTTPRequestHandler):
    """Hands every request to ``sandbox.handle``; the ``do_<METHOD>`` names are added per sandbox so
    a method a provider does not serve still gets the stdlib's 501."""

    sandbox: "SandboxServer"
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet unless asked
        if os.environ.get(f"{self.sandbox.provider.upper()}_SANDBOX_VERBOSE"):
            super().log_message(fmt, *args)

    def setup(self):
        super().setup()
        with contextlib.suppress(OSError):  # no 40 ms delayed-ACK stalls between header and body writes
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _serve(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        status, out_headers, body = self.sandbox.handle(self.command, self.path, headers, raw)
        status, out_headers, body = self.sandbox._maybe_lose(self.command, self.path, raw, (status, out_headers, body))
        self.sandbox._stall(self.command, self.path)
        self.send_response(status)
        for k, v in out_headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class SandboxServer:
    """Server lifecycle and the provider-neutral test controls. Subclasses call :meth:`_init_sandbox`
    from ``__init__`` and hold their state under ``self._lock``."""

    provider: str = ""  # "github": thread name, <PROVIDER>_SANDBOX_VERBOSE
    server_version: str = "Sandbox/1.0"
    http_methods: tuple[str, ...] = ("GET", "POST", "PUT", "DELETE")
    control_methods: tuple[str, ...] = ()
    failure_modes: tuple[str, ...] = ()
    fixtures_dir: str
    control_errors: tuple[type[BaseException], ...] = (TypeError, ValueError, KeyError, OSError)

    def _init_sandbox(self, *, host: str, port: int, token: str | None, delivery_mode: str, real_clock: bool,
                      tick: float, fixtures_dir: str | None, default_fixtures_dir: str, delivery_timeout: float) -> None:
        self.host, self._port = host, port
        self.token = token
        self.delivery_mode = delivery_mode
        self.real_clock, self.tick = real_clock, tick
        self.fixtures_dir = fixtures_dir or default_fixtures_dir
        self.delivery_timeout = delivery_timeout
        self._lock = threading.RLock()
        self._send_lock = threading.Lock()
        self._clock = datetime.now(timezone.utc).replace(microsecond=0) if real_clock else START_TIME
        self._deliveries: list = []
        self._pending: list = []
        self._requests: list = []
        self._failures: list[dict] = []
        self._stall_seconds = 0.0
        self._stall_release = threading.Event()
        self._lost_answers: list[dict] = []
        self._muted = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle -----------------------------------------------------------------------------
    def start(self):
        if self._server is None:
            serve = {f"do_{m}": SandboxHandler._serve for m in self.http_methods}
            handler = type("Handler", (SandboxHandler,), {"sandbox": self, "server_version": self.server_version, **serve})
            self._server = ThreadingHTTPServer((self.host, self._port), handler)
            self._server.daemon_threads = True
            self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                            name=f"{self.provider}-sandbox", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def port(self) -> int:
        return self._server.server_address[1] if self._server else self._port

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def handle(self, method: str, raw_path: str, headers: dict, raw_body: bytes):
        raise NotImplementedError

    @staticmethod
    def _parse_request(raw_path: str, raw_body: bytes):
        """-> (urlsplit parts, unquoted path, query {name: [values]}, JSON body or None, body parsed?)."""
        parts = urlsplit(raw_path)
        body, ok = None, True
        if raw_body:
            try:
                body = json.loads(raw_body)
            except ValueError:
                ok = False
        return parts, unquote(parts.path), parse_qs(parts.query, keep_blank_values=True), body, ok

    # --- clock ---------------------------------------------------------------------------------
    @staticmethod
    def _format_ts(value: datetime) -> str:
        raise NotImplementedError

    def _stamp(self) -> datetime:
        if self.real_clock:  # wall clock, ms precision, strictly increasing (stable listing order)
            now = datetime.now(timezone.utc)
            now = now.replace(microsecond=(now.microsecond // 1000) * 1000)
            self._clock = max(now, self._clock + timedelta(milliseconds=1))
            return self._clock
        self._clock += timedelta(seconds=self.tick)
        return self._clock

    def advance(self, seconds: float = 60) -> str:
        """Move the deterministic clock forward; returns the new time in the provider's format."""
        with self._lock:
            self._clock += timedelta(seconds=seconds)
            return self._format_ts(self._clock)

    # --- webhooks ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def quiet(self):
        """Mutations inside this block send no webhooks (bulk seeding)."""
        with self._lock:
            self._muted += 1
        try:
            yield self
        finally:
            with self._lock:
                self._muted -= 1

    def _record(self, delivery):
        """Keep a delivery; queue it for sending when it has a target URL."""
        self._deliveries.append(delivery)
        if delivery.url:
            self._pending.append(delivery)
        return delivery

    def flush(self) -> list:
        """Send every queued delivery (in order); returns them with their status recorded."""
        sent = []
        with self._send_lock:
            with self._lock:
                batch, self._pending = self._pending, []
            for delivery in batch:
                delivery.send(self.delivery_timeout)
                sent.append(delivery)
        return sent

    def _after_mutation(self) -> None:
        if self.delivery_mode == "sync":
            self.flush()

    def _mutate(self, fn):
        with self._lock:
            result = fn()
        self._after_mutation()
        return result

    @property
    def deliveries(self) -> list:
        with self._lock:
            return list(self._deliveries)

    def clear_deliveries(self) -> None:
        with self._lock:
            self._deliveries.clear()

    def _fixture_path(self, name: str, suffix: str = ".json") -> str:
        if os.path.sep in name:
            return name
        return os.path.join(self.fixtures_dir, name if name.endswith(".json") else f"{name}{suffix}")

    def _load_fixture(self, name: str, overrides: dict | None) -> dict:
        with open(self._fixture_path(name), encoding="utf-8") as fh:
            payload = json.load(fh)
        if overrides:
            deep_merge(payload, overrides)
        return payload

    # --- failure injection ---------------------------------------------------------------------
    def _queue_failure(self, count: int, mode: str, **details) -> None:
        if mode not in self.failure_modes:
            raise ValueError(f"unknown failure mode {mode!r}")
        with self._lock:
            self._failures.append({"count": int(count), "mode": mode, **details})

    def _take_failure(self) -> dict | None:
        with self._lock:
            while self._failures and self._failures[0]["count"] <= 0:
                self._failures.pop(0)
            if not self._failures:
                return None
            self._failures[0]["count"] -= 1
            return dict(self._failures[0])

    def outage(self, status: int = 503) -> None:
        """Every API request fails with ``status`` (mode ``error``) until :meth:`recover`; the
        ``/_sandbox`` controls keep working."""
        with self._lock:
            self._failures = [{"count": 10**9, "mode": "error", "status": status, "retry_after": None,
                               "reset_in": 60}]

    def recover(self, *, stall_writes: float = 0.0) -> None:
        """End an outage, drop queued failures and release stalled responses. With ``stall_writes``,
        API writes (POST/PUT/PATCH/DELETE) are then applied but their responses held up to that many
        seconds (until the next ``recover``): a client that dies meanwhile never learns that its
        write landed. Every Linear request is a POST, so its reads stall too."""
        with self._lock:
            self._failures.clear()
            self._stall_seconds = float(stall_writes)
            release, self._stall_release = self._stall_release, threading.Event()
        release.set()

    def _stall(self, method: str, path: str) -> None:
        with self._lock:
            seconds, release = self._stall_seconds, self._stall_release
        if seconds and method in ("POST", "PUT", "PATCH", "DELETE") and "/_sandbox/" not in path:
            release.wait(seconds)

    def lose_answer(self, pattern: str, *, status: int = 502, count: int = 1) -> None:
        """The next ``count`` API requests matching ``pattern`` (a regex searched in ``"METHOD path\nbody"``)
        are applied, but the client gets ``status`` instead of the answer: a gateway or connection that lost
        the response, so the client does not know that its write landed."""
        with self._lock:
            self._lost_answers.append({"rx": re.compile(pattern), "status": int(status), "count": int(count)})

    def _maybe_lose(self, method: str, path: str, raw_body: bytes, answer: tuple) -> tuple:
        if "/_sandbox/" in path:
            return answer
        seen = f"{method} {path}\n{raw_body.decode('utf-8', 'replace')}"
        with self._lock:
            rule = next((r for r in self._lost_answers if r["count"] > 0 and r["rx"].search(seen)), None)
            if rule is None:
                return answer
            rule["count"] -= 1
        return rule["status"], {"Content-Type": "application/json"}, b'{"message": "Bad gateway (answer lost)"}'

    # --- request log ---------------------------------------------------------------------------
    def _log_request(self, record) -> None:
        with self._lock:
            self._requests.append(record)

    @property
    def requests(self) -> list:
        with self._lock:
            return list(self._requests)

    def requests_to(self, path_regex: str, method: str | None = None) -> list:
        rx = re.compile(path_regex)
        return [r for r in self.requests if rx.search(r.path) and (method is None or r.method == method.upper())]

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()

    # --- /_sandbox/<control> -------------------------------------------------------------------
    def _invoke_control(self, control: str, body):
        """Call a control method with the JSON object as keyword arguments (``"args": [...]`` for
        positional ones); deliveries in the result become their summaries."""
        kwargs = dict(body) if isinstance(body, dict) else {}
        args = kwargs.pop("args", [])
        result = getattr(self, control)(*args, **kwargs)
        if isinstance(result, DeliveryRecord):
            return result.summary()
        if isinstance(result, list):
            return [d.summary() if isinstance(d, DeliveryRecord) else d for d in result]
        return result

    def _error_body(self, message: str):
        return {"message": message}

    def _control(self, record, method: str, path: str, body):
        """``GET /_sandbox/deliveries|requests`` and ``POST /_sandbox/<control method>``."""
        try:
            if method == "GET" and path == "/_sandbox/deliveries":
                return self._finish(record, 200, [d.summary() for d in self.deliveries])
            if method == "GET" and path == "/_sandbox/requests":
                return self._finish(record, 200, [r.summary() for r in self.requests])
            control = path[len("/_sandbox/"):]
            if method != "POST" or control not in self.control_methods:
                return self._finish(record, 404, self._error_body(f"unknown control {control!r}"))
            return self._finish(record, 200, self._invoke_control(control, body))
        except self.control_errors as exc:
            return self._finish(record, 400, self._error_body(str(exc)))

    def _finish(self, record, status, payload, headers=None):
        raise NotImplementedError


# --- standalone CLI ------------------------------------------------------------------------------
def cli_parser(provider: str, description: str, port: int, token_help: str, seed_help: str, *,
               after_port=None, after_secret=None) -> argparse.ArgumentParser:
    """The arguments every sandbox takes (secrets from arguments or ``<PROVIDER>_SANDBOX_*`` only);
    ``after_port``/``after_secret`` add the provider's own in their place in ``--help``."""
    env = f"{provider.upper()}_SANDBOX"
    parser = argparse.ArgumentParser(prog=f"python -m connectors.sandbox.{provider}", description=description)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=port)
    if after_port:
        after_port(parser)
    parser.add_argument("--token", default=os.environ.get(f"{env}_TOKEN"), help=token_help)
    parser.add_argument("--webhook-url", default=os.environ.get(f"{env}_WEBHOOK_URL"))
    parser.add_argument("--webhook-secret", default=os.environ.get(f"{env}_WEBHOOK_SECRET"),
                        help=f"env {env}_WEBHOOK_SECRET")
    if after_secret:
        after_secret(parser)
    parser.add_argument("--seed", type=int, default=0, help=seed_help)
    parser.add_argument("--queued", action="store_true", help="queue deliveries until POST /_sandbox/flush")
    return parser


def serve_until_interrupted(sandbox: SandboxServer, banner) -> int:
    """Start, print ``banner(sandbox)`` (it names the bound port), serve until Ctrl-C."""
    sandbox.start()
    print(banner(sandbox), flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        sandbox.stop()
    return 0
