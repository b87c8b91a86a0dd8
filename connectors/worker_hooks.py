"""The connector engine's part in a worker's life (connected in ConnectorsConfig.ready()).

- Restart recovery (§13.2) when a worker starts: the in-process worker sends ``issues.events.worker_started``;
  a Celery worker's ``worker_ready`` queues ``connectors.tasks.restart_recovery`` (so the pass runs as a job,
  not inside the worker's start-up). Either way ``drain.restart_recover`` runs it once per instance.
- The embedded default (kicks off, services/kicks.py): the in-process worker's ``worker_ticked`` drains the
  connector inbox, outbox and schedule. With kicks on, Celery applies what commits kick and beat runs the sweep.
"""
from __future__ import annotations

import logging

from celery.signals import worker_ready

from issues import events

log = logging.getLogger("connectors.worker")


def on_worker_started(sender=None, **kwargs):
    from .services.drain import restart_recover

    return {"connectorRecovery": restart_recover()}


def on_worker_ticked(sender=None, now=None, **kwargs):
    from .services import kicks

    if kicks.enabled():
        return None
    from .services.drain import connectors_drain

    return {"connectorDrain": connectors_drain(now=now)}


def on_celery_worker_ready(sender=None, **kwargs):
    from . import tasks

    try:
        tasks.restart_recovery.delay()
    except Exception:  # noqa: BLE001 — broker trouble at start: the sweep still repairs, just later
        log.exception("connector restart recovery not queued")


def connect():
    events.worker_started.connect(on_worker_started, dispatch_uid="connectors.restart_recovery")
    events.worker_ticked.connect(on_worker_ticked, dispatch_uid="connectors.inbox_drain")
    worker_ready.connect(on_celery_worker_ready, dispatch_uid="connectors.restart_recovery", weak=False)
