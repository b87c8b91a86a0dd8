"""The HTTP transport to the host (``POST hello``, ``POST events``, ``GET commands``, ``POST
commands/<id>/result`` under the run's runner URL, with ``Authorization: Bearer <run key>``).

Answers are sorted into two kinds: :class:`Transient` (no connection, a timeout, 5xx, 429, an
unreadable answer) is retried by the caller with :class:`Backoff`, forever — the network may be
down for a while and the outbox holds everything meanwhile; :class:`HostRefused` (any other 4xx)
carries the host's error ``code`` and is for the caller to judge.
"""
from __future__ import annotations

import random
import threading

import httpx

from . import RUNNER_VERSION


class Transient(Exception):
    """Worth retrying: the host was not reached, or could not answer now."""


class HostRefused(Exception):
    """A 4xx with the host's error body (``{"error", "code", "details"}``)."""

    def __init__(self, status: int, code: str, message: str, details=None):
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.details = status, code, message, details or {}


class Backoff:
    """Capped exponential delays (0.1 s doubling to 2 s) with a little jitter, reset on success."""

    def __init__(self, first: float = 0.1, cap: float = 2.0):
        self.first, self.cap, self.current = first, cap, first

    def wait(self, stop: threading.Event) -> None:
        """Sleep the next delay, or less if ``stop`` is set meanwhile."""
        stop.wait(self.current * random.uniform(0.8, 1.0))
        self.current = min(self.current * 2, self.cap)

    def reset(self):
        self.current = self.first


class HostClient:
    def __init__(self, url: str, key: str, *, timeout: float = 30.0):
        self.url = url if url.endswith("/") else url + "/"
        self.timeout = timeout
        self._http = httpx.Client(base_url=self.url, timeout=timeout, headers={
            "Authorization": f"Bearer {key}", "User-Agent": f"paperclip-prp-runner/{RUNNER_VERSION}"})

    def close(self):
        self._http.close()

    def hello(self, body: dict) -> dict:
        return self._call("POST", "hello", json=body)

    def post_events(self, body: bytes) -> dict:
        """POST an events request body made of stored envelope bytes (sent as they are)."""
        return self._call("POST", "events", content=body, headers={"Content-Type": "application/json"})

    def commands(self, after_seq: int, wait: float) -> dict:
        # The read timeout outlasts the long-poll, so a quiet lane is not taken for a dead host.
        return self._call("GET", "commands", params={"afterSeq": after_seq, "wait": wait},
                          timeout=httpx.Timeout(self.timeout, read=wait + self.timeout))

    def post_result(self, command_id: str, body: dict) -> dict:
        return self._call("POST", f"commands/{command_id}/result", json=body)

    def _call(self, method: str, path: str, **kwargs) -> dict:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:  # connection refused or reset, timeouts, protocol errors
            raise Transient(f"{method} {path}: {exc.__class__.__name__}: {exc}") from exc
        status = response.status_code
        if status >= 500 or status == 429:
            raise Transient(f"{method} {path}: HTTP {status}")
        try:
            body = response.json()
        except ValueError:
            if status < 400:
                raise Transient(f"{method} {path}: HTTP {status} with an unreadable body")
            body = {}
        if status >= 400:
            body = body if isinstance(body, dict) else {}
            raise HostRefused(status, str(body.get("code") or f"http_{status}"),
                              str(body.get("error") or response.reason_phrase), body.get("details"))
        if not isinstance(body, dict):
            raise Transient(f"{method} {path}: HTTP {status} with a non-object body")
        return body
