"""On-commit kicks of the connector engine's background work (the counterpart of issues.services.kicks).

``CONNECTORS["KICK_ON_COMMIT"]`` (default ``PAPERCLIP["KICK_ON_COMMIT"]``: on when a broker is configured)
decides who applies stored inbound events:

- on: a commit queues ``connectors.tasks.process_task_events`` through Celery (a worker applies it; with
  ``CELERY_TASK_ALWAYS_EAGER`` — the test suite — it runs right after the commit, in process);
- off, the embedded default: nothing is kicked. A webhook request only verifies and stores, so no provider
  round-trip (read-back, backlink) ever runs inside it and past the provider's delivery deadline; the
  in-process worker (``manage.py paperclip_worker``) drains the inbox on its loop
  (:func:`connectors.services.drain.connectors_drain`), and the periodic sweep is the safety net either way.
"""
from __future__ import annotations

import atexit
import logging
import os
import threading
import time

from django.conf import settings
from django.db import transaction

from .common import conf

log = logging.getLogger("connectors.kicks")


class Kicker:
    """Publishes kicks from a daemon thread, so a request never waits on the broker (a Celery
    publish is a Redis round trip or two and about half a millisecond of CPU). A key queued again
    before it went out is sent once; the keys waiting together go out in messages of up to
    ``batch`` keys (``send_many(keys)``, in the order they were first queued).

    Under load it lingers: a round of messages goes out at most every ``linger`` seconds, so the
    kicks of a burst share messages instead of each paying for its own publish; a kick after a quiet
    spell goes out at once. Losing one costs only latency: a kick lost with the process, dropped
    when over ``limit`` or refused by the broker is found by the sweep (``connectors.tasks.sweep``:
    pending events older than ``STALE_PENDING_SECONDS``). With ``CELERY_TASK_ALWAYS_EAGER`` (the
    test suite) it sends at once, in the caller's thread."""

    def __init__(self, send_many, *, batch: int = 8, linger: float = 0.01, limit: int = 10_000):
        self.send_many, self.batch, self.linger, self.limit = send_many, max(1, batch), max(0.0, linger), limit
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
                threading.Thread(target=self._run, name="connector-kicks", daemon=True).start()
            if key not in self._pending and len(self._pending) >= self.limit:
                log.warning("kick %s dropped (%d waiting); the sweep will pick it up", key, self.limit)
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
                    log.warning("kicks %s not sent; the sweep will pick them up", chunk)
            with self._lock:
                if not self._pending:
                    self._idle.set()


def _send_task_events(keys):
    from connectors import tasks

    tasks.process_task_events_many.delay([list(key) for key in keys])


kicker = Kicker(_send_task_events, batch=int(conf("KICK_BATCH_SIZE")), linger=float(conf("KICK_LINGER_MS")) / 1000)
atexit.register(kicker.flush, 2.0)  # best effort: what is still waiting at exit is the sweep's


def enabled() -> bool:
    connectors = getattr(settings, "CONNECTORS", None) or {}
    if "KICK_ON_COMMIT" in connectors:
        return bool(connectors["KICK_ON_COMMIT"])
    return bool((getattr(settings, "PAPERCLIP", None) or {}).get("KICK_ON_COMMIT"))


def task_events(instance_id, external_task_id: str):
    """Process the task's queue after commit (when kicks are on)."""
    if not enabled():
        return
    key = (str(instance_id), external_task_id)
    transaction.on_commit(lambda: kicker.put(key))


def task_events_retry(instance_id, external_task_id: str, countdown: float):
    """Process the task's queue again in ``countdown`` seconds (when kicks are on; else the worker's
    drain picks the retry up when it is due)."""
    if not enabled():
        return
    from connectors import tasks

    try:
        tasks.process_task_events.apply_async((str(instance_id), external_task_id), countdown=countdown)
    except Exception:  # broker down: the sweep picks the retry up when it is due
        log.warning("retry of %s/%s not kicked; the sweep will pick it up", instance_id, external_task_id)


def outbound_delivery(effect_id, countdown: float = 0.0, *, on_commit: bool = False):
    """Deliver an outbound effect (now, or in ``countdown`` seconds) when kicks are on; else the
    worker's drain delivers it when it is due, so no provider write runs inside a web request."""
    if not enabled():
        return
    from connectors import tasks

    def send():
        try:
            if countdown > 0:
                tasks.deliver_outbound.apply_async((effect_id,), countdown=countdown)
            else:
                tasks.deliver_outbound.delay(effect_id)
        except Exception:  # broker down: the sweep delivers it
            log.warning("outbound effect %s not kicked; the sweep will deliver it", effect_id)

    if on_commit:
        transaction.on_commit(send)
    else:
        send()
