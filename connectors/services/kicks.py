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

from django.conf import settings
from django.db import transaction

from paperclip.core.kicker import Kicker

from .common import conf

log = logging.getLogger("connectors.kicks")


def _send_task_events(keys):
    from connectors import tasks

    tasks.process_task_events_many.delay([list(key) for key in keys])


kicker = Kicker(_send_task_events, batch=int(conf("KICK_BATCH_SIZE")), linger=float(conf("KICK_LINGER_MS")) / 1000,
                name="connector-kicks")
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
