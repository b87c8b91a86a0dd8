"""Polling backstop (§7.1.2) and reconciliation (§7.1.3, §15.4).

A poll page's effects and its cursor commit in one transaction (§4.1.7): a crash in between
rolls both back, and the next poll re-applies the page idempotently. Reconciliation reads a
rolling window of links per tick (cursor ``reconcile:links``) with batched state calls. Both ticks
end with the comment backstop over their own window of links (services/comment_poll.py)."""
from __future__ import annotations

import logging

from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from connectors.choices import (
    ErrorCategory,
    EventSource,
    EventStatus,
    InstanceStatus,
    LinkStatus,
)
from connectors.models import ConnectorInstance, InboundEvent, TaskLink
from connectors.providers.base import (
    EventKind,
    ExternalTask,
    ExternalTaskRef,
    ProviderError,
    VerifiedEvent,
    normalize_state_name,
)

from .comment_poll import comments_poll, comments_reconcile
from .common import adapter_for, conf, cursor_get, cursor_save, sync_error_record
from .common import provider_degrade as _degrade
from .logctx import engine_log
from .credential_health import credentials_ok
from .outbound_queue import pending_kick
from .inbound import event_store, kick, observed_store_apply

RECONCILE_SCOPE = "reconcile:links"


def _task_key(task: ExternalTask) -> str:
    mark = task.revision or (task.updated_at.isoformat() if task.updated_at else "")
    if not mark:
        import hashlib
        import json

        from . import codec

        mark = hashlib.sha256(json.dumps(codec.dump(task), sort_keys=True).encode()).hexdigest()[:32]
    return f"poll:{task.external_id}:{mark}"


def _task_event(task: ExternalTask, key: str, action: str) -> VerifiedEvent:
    return VerifiedEvent(event_id=key, kind=EventKind.TASK_UPSERTED, action=action, external_task_id=task.external_id,
                         occurred_at=task.updated_at, task=task, container_id=task.container_id)


def poll_page_apply(*, instance: ConnectorInstance, scope: str, page, source: str = EventSource.POLL) -> list[str]:
    """Store and apply one page, then save its cursor — all in the caller's transaction. Tasks with
    earlier unfinished events are left queued behind them (per-task order)."""
    changed = [task.external_id for task in page.items
               if observed_store_apply(instance=instance, event=_task_event(task, _task_key(task), "poll"),
                                       source=source)]
    for record in getattr(page, "skipped", None) or ():
        # §13.1.8: a malformed record is reported and skipped; the rest of the page and the cursor go on.
        sync_error_record(instance=instance, category=ErrorCategory.SCHEMA_DRIFT,
                          message=f"Poll of {scope}: record {record.get('recordKey') or record.get('recordId') or '?'} "
                                  f"skipped: {record.get('reason', '')}",
                          details={"scope": scope, **record})
    if page.cursor:
        cursor_save(instance, f"tasks:{scope}", page.cursor)
    return changed


def instance_poll(*, instance_id, max_pages: int | None = None) -> dict:
    instance = ConnectorInstance.objects.filter(pk=instance_id).first()
    if instance is None or instance.status == InstanceStatus.PAUSED:
        return {"pages": 0, "tasks": 0}
    max_pages = max_pages or int(conf("POLL_MAX_PAGES"))
    pages = tasks = 0
    auth_refused = False
    try:
        adapter = adapter_for(instance)
    except Exception as exc:
        sync_error_record(instance=instance, category=ErrorCategory.PROVIDER_AUTH, message=f"Poll skipped: {exc}")
        return {"pages": 0, "tasks": 0, "error": str(exc)}
    for scope in instance.containers or []:
        cursor = cursor_get(instance, f"tasks:{scope}")
        relisted = False
        while pages < max_pages:
            try:
                page = adapter.list_candidate_tasks(scope, cursor)
            except ProviderError as exc:
                if exc.category == ErrorCategory.CURSOR_INVALID and cursor and not relisted:
                    # §5.4: a bounded full re-list with idempotent re-apply; never wipe and re-import.
                    sync_error_record(instance=instance, category=exc.category,
                                      message=f"Cursor for {scope} rejected; re-listing: {exc}")
                    cursor, relisted = None, True
                    continue
                sync_error_record(instance=instance, category=exc.category, message=f"Poll of {scope} failed: {exc}")
                auth_refused = auth_refused or exc.category == ErrorCategory.PROVIDER_AUTH
                _degrade(instance, exc)
                break
            with transaction.atomic():
                tasks += len(poll_page_apply(instance=instance, scope=scope, page=page))
            pages += 1
            if not page.cursor or page.cursor == cursor:
                break
            cursor = page.cursor
    ConnectorInstance.objects.filter(pk=instance.pk).update(last_poll_at=timezone.now())
    if pages and not auth_refused and instance.auth_error_at and credentials_ok(instance, cause="poll succeeded"):
        pending_kick(instance.pk)  # §13.1.2: the provider took the credentials again
    engine_log(logging.INFO, "connector poll pass", outcome="ok" if pages else "nothing read", instance=instance,
               eventKind="poll", pages=pages, tasks=tasks)
    # §7.1.2 comment backstop over the next window of links (shed while the credentials are refused)
    comments = {"links": 0, "comments": 0} if auth_refused else comments_poll(instance=instance, adapter=adapter)
    return {"pages": pages, "tasks": tasks, "comments": comments}


def instance_reconcile(*, instance_id, batch: int | None = None) -> dict:
    """One rate-bounded reconciliation tick over the next window of links."""
    instance = ConnectorInstance.objects.filter(pk=instance_id).first()
    if instance is None or instance.status == InstanceStatus.PAUSED:
        return {"links": 0}
    batch = batch or instance.reconcile_batch_size
    state_batch = int(conf("STATE_BATCH"))
    after = cursor_get(instance, RECONCILE_SCOPE)
    qs = (TaskLink.objects.filter(instance=instance).exclude(status__in=(LinkStatus.UNLINKED, LinkStatus.PAUSED))
          .order_by("id").values("id", "external_task_id", "external_key", "external_state_name",
                                 "external_state_category"))
    window = list((qs.filter(id__gt=after) if after else qs)[:batch])
    if not window and after:
        window = list(qs[:batch])  # wrapped around
    if not window:
        _reconciled(instance, [], "")
        return {"links": 0}
    adapter = adapter_for(instance)
    states, read = {}, []
    for start in range(0, len(window), state_batch):
        chunk = window[start:start + state_batch]
        refs = [ExternalTaskRef(external_id=w["external_task_id"], external_key=w["external_key"] or None)
                for w in chunk]
        try:
            states.update(adapter.get_task_states(refs))
        except ProviderError as exc:
            # §5.4: keep link state; do not advance past what was not read.
            sync_error_record(instance=instance, category=exc.category, message=f"Reconcile state refresh failed: {exc}")
            _degrade(instance, exc)
            break
        read += chunk
    deleted = diverged = 0
    for row in read:
        if row["external_task_id"] not in states:
            continue
        state = states[row["external_task_id"]]
        ref = ExternalTaskRef(external_id=row["external_task_id"], external_key=row["external_key"] or None)
        if state is None:
            with transaction.atomic():
                _, created = event_store(instance=instance, source=EventSource.RECONCILE, event=VerifiedEvent(
                    event_id=f"reconcile:{row['id']}:missing", kind=EventKind.TASK_DELETED, action="reconcile.missing",
                    external_task_id=row["external_task_id"]))
                if created:
                    kick(instance.pk, row["external_task_id"])
            deleted += created
            continue
        if normalize_state_name(state.name) != normalize_state_name(row["external_state_name"]) or \
                state.category != row["external_state_category"]:
            try:
                task = adapter.get_task(ref)
            except ProviderError as exc:
                sync_error_record(instance=instance, category=exc.category, message=f"Reconcile read failed: {exc}")
                continue
            with transaction.atomic():
                _, created = event_store(instance=instance, source=EventSource.RECONCILE,
                                         event=_task_event(task, "reconcile:" + _task_key(task)[5:], "reconcile"))
                if created:
                    kick(instance.pk, task.external_id)
            diverged += created
    last = str(read[-1]["id"]) if read else (after or "")
    if read and len(window) < batch and read[-1] is window[-1]:
        last = ""  # the end of the links: the next tick starts over
    _reconciled(instance, [r["id"] for r in read], last)
    engine_log(logging.INFO, "connector reconcile tick", outcome="ok" if read else "nothing read", instance=instance,
               eventKind="reconcile", links=len(read), deleted=deleted, diverged=diverged)
    # §7.1.3 / §13.1.3: missed, edited and deleted comments, over their own window (shed after a refusal)
    comments = comments_reconcile(instance=instance, adapter=adapter) if len(read) == len(window) else {
        "links": 0, "comments": 0, "deleted": 0}
    return {"links": len(read), "deleted": deleted, "diverged": diverged, "cursor": last, "comments": comments}


def _reconciled(instance, link_ids, cursor: str):
    now = timezone.now()
    with transaction.atomic():
        if link_ids:
            TaskLink.objects.filter(pk__in=link_ids).update(last_reconcile_at=now)
        cursor_save(instance, RECONCILE_SCOPE, cursor)
        ConnectorInstance.objects.filter(pk=instance.pk).update(last_reconcile_at=now)


def due_instances(now=None):
    """Instances whose poll or reconcile interval has elapsed (used by the beat sweep)."""
    now = now or timezone.now()
    out = []
    for inst in ConnectorInstance.objects.filter(status=InstanceStatus.ACTIVE).only(
            "id", "poll_interval_seconds", "reconcile_interval_seconds", "last_poll_at", "last_reconcile_at",
            "provider_degraded_until"):
        if inst.provider_degraded_until and inst.provider_degraded_until > now:
            continue
        poll = inst.last_poll_at is None or (now - inst.last_poll_at).total_seconds() >= inst.poll_interval_seconds
        rec = inst.last_reconcile_at is None or \
            (now - inst.last_reconcile_at).total_seconds() >= inst.reconcile_interval_seconds
        out.append((inst.pk, poll, rec))
    return out


def events_due(now=None, limit: int | None = None) -> list[tuple]:
    """(instance id, external task id) with a due retry or a stale pending event (lost kick)."""
    from datetime import timedelta

    from django.db.models import Q

    now = now or timezone.now()
    stale = now - timedelta(seconds=int(conf("STALE_PENDING_SECONDS")))
    qs = (InboundEvent.objects.filter(instance__status=InstanceStatus.ACTIVE)
          .filter(Q(status=EventStatus.FAILED, next_attempt_at__lte=now) | Q(status=EventStatus.PENDING,
                                                                              received_at__lte=stale))
          .exclude(external_task_id="").values_list("instance_id", "external_task_id").distinct())
    return list(qs[: limit or int(conf("SWEEP_BATCH"))])


KEPT_ERRORS = 1000  # health entries kept per instance


def retention_prune(now=None) -> dict:
    """Keep the inbox and the error log bounded on a busy installation: finished events older than
    the retention window lose their row (their effects and the audit log remain; a very late
    re-delivery is still harmless: stale snapshots are dropped and comments are deduplicated by
    their external id), and each instance keeps its newest 1,000 health entries."""
    from datetime import timedelta

    from connectors.models import SyncError

    now = now or timezone.now()
    cutoff = now - timedelta(days=int(conf("EVENT_RETENTION_DAYS")))
    events, _ = InboundEvent.objects.filter(status__in=(EventStatus.APPLIED, EventStatus.DROPPED),
                                            received_at__lt=cutoff).delete()
    errors = 0
    # One grouped read finds the few instances over the cap; the rest cost nothing per tick.
    over = (SyncError.objects.values("instance_id").annotate(n=Count("id")).filter(n__gt=KEPT_ERRORS)
            .values_list("instance_id", flat=True))
    for instance_id in over:
        # Newest by id, the same order the delete uses (timestamps can tie or step back with the clock).
        keep_from = (SyncError.objects.filter(instance_id=instance_id).order_by("-id")
                     .values_list("id", flat=True)[KEPT_ERRORS - 1:KEPT_ERRORS])
        keep_from = list(keep_from)
        if keep_from:
            errors += SyncError.objects.filter(instance_id=instance_id, id__lt=keep_from[0]).delete()[0]
    return {"events": events, "errors": errors}
