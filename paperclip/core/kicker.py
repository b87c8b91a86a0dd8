"""Kicks published off the caller's thread, coalesced and batched (the connector engine's task
kicks, the dispatcher's kick)."""
from __future__ import annotations

import logging
import os
import threading
import time

from django.conf import settings

log = logging.getLogger("paperclip.kicks")


class Kicker:
    """Publishes kicks from a daemon thread, so a request never waits on the broker (a Celery
    publish is a Redis round trip or two and about half a millisecond of CPU). A key queued again
    before it went out is sent once; the keys waiting together go out in messages of up to
    ``batch`` keys (``send_many(keys)``, in the order they were first queued).

    Under load it lingers: a round of messages goes out at most every ``linger`` seconds, so the
    kicks of a burst share messages instead of each paying for its own publish; a kick after a quiet
    spell goes out at once. A kick must only ever save latency: one lost with the process, dropped
    when over ``limit`` or refused by the broker is found by its owner's safety net (the connectors'
    sweep of stale pending events, the dispatcher's periodic pass). With ``CELERY_TASK_ALWAYS_EAGER``
    (the test suite) it sends at once, in the caller's thread. ``name`` names its thread."""

    def __init__(self, send_many, *, batch: int = 8, linger: float = 0.01, limit: int = 10_000,
                 name: str = "kicks"):
        self.send_many, self.batch, self.linger, self.limit = send_many, max(1, batch), max(0.0, linger), limit
        self.name = name
        self._lock = threading.Lock()
        self._pending: dict = {}  # an ordered set: insertion order is send order
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._pid = None

    def put(self, key):
        if getattr(settings, "CELERY_TASK_ALWAYS_EAGER", False):
            self.send_many([key])
            return
        with self._lock:
            if self._pid != os.getpid():  # first use in this process (or after a fork): own thread
                self._pid, self._pending = os.getpid(), {}
                threading.Thread(target=self._run, name=self.name, daemon=True).start()
            if key not in self._pending and len(self._pending) >= self.limit:
                log.warning("%s: kick %s dropped (%d waiting); the sweep will pick it up", self.name, key, self.limit)
                return
            self._pending[key] = None
            self._idle.clear()
        self._wake.set()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every kick queued so far was sent (tests, process exit); False on timeout."""
        return self._pid != os.getpid() or self._idle.wait(timeout)

    def _run(self):
        last_round = float("-inf")
        while True:
            self._wake.wait()
            self._wake.clear()
            pause = last_round + self.linger - time.monotonic()
            if pause > 0:  # the previous round was moments ago: let this one gather company
                time.sleep(pause)
            last_round = time.monotonic()
            with self._lock:
                keys, self._pending = list(self._pending), {}
            for start in range(0, len(keys), self.batch):
                chunk = keys[start:start + self.batch]
                try:
                    self.send_many(chunk)
                except Exception:  # broker down: the sweep picks the work up
                    log.warning("%s: kicks %s not sent; the sweep will pick them up", self.name, chunk)
            with self._lock:
                if not self._pending:
                    self._idle.set()
