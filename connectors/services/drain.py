"""Worker duties of the connector engine that no web request performs.

- :func:`connectors_drain`: the embedded default (no broker, kicks off: services/kicks.py) has nobody
  applying what a webhook request stored; the in-process worker (``manage.py paperclip_worker``) calls
  this on its loop: due inbound events (pending ones at once, failed ones when their retry is due), due
  outbound writes, due polls and reconciliation ticks.
- :func:`restart_recover` (§13.2): at every worker start (the in-process worker and Celery's
  ``worker_ready``), per active instance: the queued events a dead worker left (in-memory kicks are
  lost), one poll that resumes the stored cursors, and one reconciliation pass. Several workers starting
  together run it once per instance: the first claims the instance with a conditional update of
  ``last_reconcile_at``; a pass that started less than ``RESTART_RECOVERY_GRACE_SECONDS`` ago (or the
  regular tick that just ran) is not repeated.

Both call services directly (no Celery in between) and never raise: one failing instance or effect is
logged and the rest go on; the services record their own health entries."""
from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from connectors.choices import EventStatus, InstanceStatus
from connectors.models import ConnectorInstance, InboundEvent

from .common import conf

log = logging.getLogger("connectors.drain")

DEFAULT_RECOVERY_GRACE_SECONDS = 60


def inbox_due(*, now=None, limit: int | None = None, instance_id=None) -> list[tuple]:
    """(instance id, external task id) whose queue has work now: a pending event (any age: nobody
    kicked it) or a failed one whose retry is due."""
    now = now or timezone.now()
    qs = InboundEvent.objects.filter(instance__status=InstanceStatus.ACTIVE).filter(
        Q(status=EventStatus.PENDING) | Q(status=EventStatus.FAILED, next_attempt_at__lte=now))
    if instance_id is not None:
        qs = qs.filter(instance_id=instance_id)
    qs = qs.exclude(external_task_id="").values_list("instance_id", "external_task_id").distinct()
    return list(qs[: limit or int(conf("SWEEP_BATCH"))])


def _guarded(what: str, fn, **kwargs):
    try:
        return fn(**kwargs)
    except Exception:  # noqa: BLE001 — the worker's loop must go on
        log.exception("connector %s failed (%s)", what, kwargs)
        return None


def _webhooks_reverify(*, instance_id):
    from .webhook_setup import webhooks_reverify

    instance = ConnectorInstance.objects.get(pk=instance_id)
    return webhooks_reverify(instance=instance) if instance.webhook_registrations else []


def _task_queues(pairs) -> int:
    from .inbound import task_events_process

    for instance_id, task_id in pairs:
        _guarded("inbound queue", task_events_process, instance_id=instance_id, external_task_id=task_id)
    return len(pairs)


def connectors_drain(*, now=None) -> dict:
    """One pass of the embedded worker over the connector inbox, outbox and schedule."""
    from .outbound import effect_deliver, effects_due
    from .polling import due_instances, instance_poll, instance_reconcile

    now = now or timezone.now()
    report = {"taskQueues": _task_queues(inbox_due(now=now)), "outbound": 0, "polls": 0, "reconciles": 0}
    for effect_id in effects_due():
        _guarded("outbound delivery", effect_deliver, effect_id=effect_id)
        report["outbound"] += 1
    for instance_id, poll, reconcile in due_instances(now):
        if poll:
            _guarded("poll", instance_poll, instance_id=instance_id)
            report["polls"] += 1
        if reconcile:
            _guarded("reconcile", instance_reconcile, instance_id=instance_id)
            report["reconciles"] += 1
    return report


def _grace() -> float:
    connectors = getattr(settings, "CONNECTORS", None) or {}
    return float(connectors.get("RESTART_RECOVERY_GRACE_SECONDS", DEFAULT_RECOVERY_GRACE_SECONDS))


def _claim(instance_id, now) -> bool:
    """One statement: true for exactly one of several workers starting together."""
    recent = now - timedelta(seconds=_grace())
    return bool(ConnectorInstance.objects.filter(pk=instance_id, status=InstanceStatus.ACTIVE).filter(
        Q(last_reconcile_at__isnull=True) | Q(last_reconcile_at__lt=recent)).update(last_reconcile_at=now))


def restart_recover(*, now=None) -> dict:
    """§13.2 at worker start: per active instance not rate-limited right now, once across workers."""
    from .polling import instance_poll, instance_reconcile

    now = now or timezone.now()
    report = {"instances": 0, "skipped": 0}
    instances = ConnectorInstance.objects.filter(status=InstanceStatus.ACTIVE).filter(
        Q(provider_degraded_until__isnull=True) | Q(provider_degraded_until__lte=now)).values_list("pk", flat=True)
    for instance_id in list(instances):
        if not _claim(instance_id, now):
            report["skipped"] += 1
            continue
        _task_queues(inbox_due(now=now, instance_id=instance_id))
        _guarded("restart webhook check", _webhooks_reverify, instance_id=instance_id)  # §13.2 re-verify first
        _guarded("restart poll", instance_poll, instance_id=instance_id)  # resumes the stored cursors
        _guarded("restart reconcile", instance_reconcile, instance_id=instance_id)
        report["instances"] += 1
        log.info("connector %s: restart recovery pass done", instance_id)
    return report
