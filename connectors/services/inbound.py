"""The inbound pipeline (§7): store events idempotently, apply them per external task in order,
retry with backoff, park poison events. What an event does is apply_tasks.py's (tasks) and
apply_comments.py's (comments), on apply_base.py's shared parts."""
from __future__ import annotations

import uuid
from functools import lru_cache

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from connectors.choices import (
    UNFINISHED_EVENT_STATUSES,
    EventSource,
    EventStatus,
    ErrorCategory,
    InstanceStatus,
    LinkStatus,
)
from connectors.models import ConnectorInstance, InboundEvent, TaskLink
from connectors.providers.base import EventKind, ProviderError, VerifiedEvent
from issues.models import Company
from issues.services.activity import activity_batched
from paperclip.core import rows

from . import audit, codec, logctx, readback
from .apply_base import Outcome, dropped, lock_clause, run_touches
from .apply_comments import comment_deleted, comment_upserted
from .apply_tasks import task_deleted, task_upserted
from .common import (
    adapter_for,
    conf,
    container_allowed,
    failure_of,
    link_set_status,
    retry_backoff,
    sync_error_record,
)


# --------------------------------------------------------------------------------------- storing
def event_store(*, instance: ConnectorInstance, event: VerifiedEvent, source: str = EventSource.WEBHOOK,
                headers: dict | None = None, body: bytes = b"", verified: bool = True,
                verification: str = "") -> tuple[InboundEvent, bool]:
    """Insert the event once per (instance, idempotency key); a re-delivery returns the stored row.
    One ``INSERT … ON CONFLICT DO NOTHING RETURNING id``: the constraint dedupes, with no savepoint
    and, outside a transaction, no BEGIN/COMMIT; only a redelivery reads the stored row."""
    key = (event.event_id or "")[:300]
    # A delivery with nothing to apply (a ping, an Asana heartbeat, an event of no task) is finished as
    # it is stored: no task queue would ever pick it up, and it must not count as queue depth.
    idle = event.kind == EventKind.IGNORED or not event.external_task_id
    finished = ({"status": EventStatus.DROPPED, "applied_at": timezone.now(),
                 "outcome": f"nothing to do for {event.action or 'this event'}"[:300]} if idle else {})
    row = InboundEvent(
        instance=instance, company_id=instance.company_id, idempotency_key=key, source=source,
        kind=event.kind, action=(event.action or "")[:100], external_task_id=event.external_task_id or "",
        raw_headers=headers or {}, raw_body=body, payload=codec.dump(event), verified=verified,
        verification=verification, occurred_at=event.occurred_at, **finished,
    )
    if rows.insert(row, skip_conflicts=True) is None:
        stored = InboundEvent.objects.filter(instance=instance, idempotency_key=key).first()
        if stored is None:  # (SQLite's OR IGNORE also skips a row that breaks a CHECK: never silently)
            raise IntegrityError(f"inbound event {key} was not stored")
        return stored, False
    return row, True


def kick(instance_id, external_task_id: str):
    """Process the task's queue after commit (Celery, when kicks are on: services/kicks.py; else the
    in-process worker drains it); the sweep is the safety net."""
    from .kicks import task_events

    task_events(instance_id, external_task_id)


def observed_store_apply(*, instance: ConnectorInstance, event: VerifiedEvent, source: str) -> bool:
    """Something the connector read itself (a poll page's task, a listed or vanished comment): stored once
    and applied at once, unless earlier events of its task are unfinished (they go first: the worker
    applies the queue in order). A failed apply stays pending for the worker's retry accounting. Returns
    whether the event was new."""
    row, created = event_store(instance=instance, event=event, source=source, verification="api-read")
    if not created:
        return False
    earlier = InboundEvent.objects.filter(instance=instance, external_task_id=row.external_task_id,
                                          status__in=UNFINISHED_EVENT_STATUSES, id__lt=row.pk).exists()
    if earlier:
        kick(instance.pk, row.external_task_id)
        return True
    try:
        with transaction.atomic():
            outcome = event_apply(instance=instance, event=row)
            now = timezone.now()
            InboundEvent.objects.filter(pk=row.pk).update(status=outcome.status, outcome=outcome.text[:300],
                                                          attempts=1, applied_at=now, last_attempt_at=now)
    except Exception:  # noqa: BLE001 — left pending: the worker applies it with retry accounting
        kick(instance.pk, row.external_task_id)
    return True


# ------------------------------------------------------------------------------------ processing

def task_events_process(*, instance_id, external_task_id: str, limit: int = 200) -> dict:
    """Apply the task's unfinished events in order until the queue is empty, blocked by a retry
    that is not yet due, or held by another worker. Returns counts by outcome.

    Workers take disjoint tasks: the head of a task's queue is claimed with SKIP LOCKED, so a worker
    that finds it held leaves the task to its holder (at once, one statement) and its message is done;
    nothing else is locked across tasks (on SQLite writes are serialised instead, which keeps the same
    order). A message for a task whose queue is empty or held costs that one statement.

    Up to ``APPLY_BATCH_SIZE`` events at the head are applied in one transaction (see
    :func:`_process_run`)."""
    counts = {"applied": 0, "dropped": 0, "failed": 0, "parked": 0}
    size = max(int(conf("APPLY_BATCH_SIZE")), 1)
    done = 0
    while done < limit:
        results, drained = _process_run(instance_id, external_task_id, min(size, limit - done))
        if not results:
            break
        done += len(results)
        for result in results:
            counts[result] += 1
        if results[-1] == "failed":
            head = (InboundEvent.objects.filter(instance_id=instance_id, external_task_id=external_task_id,
                                                status__in=UNFINISHED_EVENT_STATUSES)
                    .order_by("id").values_list("next_attempt_at", flat=True).first())
            if head is not None and head > timezone.now():
                _schedule_retry(instance_id, external_task_id, head)
                break
            if not ConnectorInstance.objects.filter(pk=instance_id, status=InstanceStatus.ACTIVE).exists():
                break  # paused meanwhile
        elif drained and not _has_unfinished(instance_id, external_task_id):
            break
    return counts


@lru_cache(maxsize=32)
def _unfinished_sql(pairs: int) -> str:
    match = " OR ".join(["(h.instance_id = %s AND h.external_task_id = %s)"] * pairs)
    statuses = ", ".join(["%s"] * len(UNFINISHED_EVENT_STATUSES))
    return (f"SELECT DISTINCT h.instance_id, h.external_task_id "
            f"FROM {connection.ops.quote_name(InboundEvent._meta.db_table)} h "
            f"WHERE ({match}) AND h.status IN ({statuses})")


def _unfinished(pairs) -> set[tuple[uuid.UUID, str]]:
    """The ``(instance UUID, task id)`` pairs whose task has an unfinished event: one statement built
    once per number of pairs (``event_task_queue_idx``), no lock, read committed."""
    if not pairs:
        return set()
    params = [value for instance_id, task_id in pairs
              for value in (rows.pk_value(ConnectorInstance, instance_id), task_id)]
    found = rows.fetch_rows(_unfinished_sql(len(pairs)), [*params, *UNFINISHED_EVENT_STATUSES])
    return {(uuid.UUID(str(instance_id)), task_id) for instance_id, task_id in found}  # (ids as any driver gives them)


def _has_unfinished(instance_id, external_task_id: str) -> bool:
    """Whether the task's queue has an unfinished event, read after a run that took the whole queue
    it saw (outside any transaction). The holder of a queue looks once more after its run: a kick
    that met the held head left the queue to it. Only when this finds an event (stored meanwhile,
    or held by another worker) does it claim again; a full claim would cost a transaction."""
    return bool(_unfinished([(instance_id, external_task_id)]))


def task_queues_process(keys) -> None:
    """Several tasks' queues, one after another (a burst's kicks share one message; ``keys`` are
    ``(instance_id, external_task_id)`` pairs). One statement first finds which of them have
    unfinished events: in a burst a task is named again for events its first message already applied,
    and such a name then costs nothing more. Skipping it is safe: an event stored after that
    statement is kicked by its own commit. One task's failure does not keep the others waiting: it is
    raised after they ran, and the sweep retries what it left pending."""
    failure = None
    for instance_id, external_task_id in _with_unfinished_events(keys):
        try:
            task_events_process(instance_id=instance_id, external_task_id=external_task_id)
        except Exception as exc:  # noqa: BLE001 — raised below, after the other tasks ran
            failure = failure or exc
    if failure is not None:
        raise failure


def _with_unfinished_events(keys) -> list[tuple[str, str]]:
    """The pairs of ``keys`` (each once, in order) whose task has an unfinished event, found in one
    statement (no lock taken). A pair naming no well-formed instance id is kept: ``task_events_process``
    refuses it, so it is raised and logged."""
    named = list(dict.fromkeys((str(instance_id), task_id) for instance_id, task_id in keys))
    ids = {}
    for instance_id, _ in named:
        try:
            ids[instance_id] = uuid.UUID(instance_id)
        except ValueError:
            pass
    found = _unfinished([(ids[i], t) for i, t in named if i in ids])
    return [(i, t) for i, t in named if i not in ids or (ids[i], t) in found]


def _schedule_retry(instance_id, external_task_id, when):
    from .kicks import task_events_retry

    task_events_retry(instance_id, external_task_id, max((when - timezone.now()).total_seconds(), 0))


_HEAD_DEFERRED = ("raw_body", "raw_headers")  # kept for operators, never read by an apply


@lru_cache(maxsize=1)
def _claim_sql() -> str:
    qn = connection.ops.quote_name
    events, instances = qn(InboundEvent._meta.db_table), qn(ConnectorInstance._meta.db_table)
    unfinished = ", ".join(["%s"] * len(UNFINISHED_EVENT_STATUSES))
    return (f"WITH q AS (SELECT h.id, ROW_NUMBER() OVER (ORDER BY h.id) AS n FROM {events} h "
            f"WHERE h.instance_id = %s AND h.external_task_id = %s AND h.status IN ({unfinished}) "
            f"ORDER BY h.id LIMIT %s) "
            f"SELECT q.n, {rows.select_list(InboundEvent, 'e', _HEAD_DEFERRED)}, "
            f"{rows.select_list(ConnectorInstance, 'i')}, {rows.select_list(Company, 'c')} FROM {events} e "
            f"JOIN q ON q.id = e.id JOIN {instances} i ON i.id = e.instance_id "
            f"JOIN {qn(Company._meta.db_table)} c ON c.id = i.company_id ORDER BY e.id"
            + lock_clause("e", skip_locked=True))


def _claim(instance_id, external_task_id: str, size: int) -> list[InboundEvent]:
    """One statement finds and locks the first ``size`` events of the task's queue, and reads their
    instance and company with them (fresh for every claim: a pause is seen before the next one). Only
    event rows are locked (``OF e``): locking the instance would serialise every worker of the
    instance. Built once (every run of events starts here).

    Whoever holds the head owns the queue. A claim keeps the unbroken run of unfinished events from
    the head (``n`` = 1, 2, …): a row another claim locked first is skipped, and the events after it
    are not this claim's; a head that another worker finished meanwhile is re-read finished and
    ends the run at once. Only the head may be a failed event awaiting its retry."""
    params = [rows.pk_value(ConnectorInstance, instance_id), external_task_id, *UNFINISHED_EVENT_STATUSES, size]
    events, instance = [], None
    for row in rows.fetch_rows(_claim_sql(), params):
        if row[0] != len(events) + 1:
            break
        if instance is None:  # (the same instance on every row: read once)
            event, instance, company = rows.split(row[1:], (InboundEvent, _HEAD_DEFERRED), ConnectorInstance,
                                                  Company)
            ConnectorInstance.company.field.set_cached_value(instance, company)
        else:
            event, = rows.split(row[1:], (InboundEvent, _HEAD_DEFERRED))
        if event.status not in UNFINISHED_EVENT_STATUSES or (events and event.status != EventStatus.PENDING):
            break
        InboundEvent.instance.field.set_cached_value(event, instance)
        events.append(event)
    return events


_MARKED = ["status", "outcome", "attempts", "last_attempt_at", "applied_at", "next_attempt_at", "error_category",
           "error_message"]


def _mark(event: InboundEvent, outcome: Outcome) -> str:
    event.status = outcome.status
    event.outcome = outcome.text[:300]
    event.attempts += 1
    event.last_attempt_at = event.applied_at = timezone.now()
    event.next_attempt_at = None
    event.error_category, event.error_message = "", ""
    return "applied" if outcome.status == EventStatus.APPLIED else "dropped"


def _process_run(instance_id, external_task_id: str, size: int) -> tuple[list[str], bool]:
    """Apply up to ``size`` events from the head of the task's queue in one transaction: one claim,
    one commit and one update of the events' rows for the run instead of one of each per event. A
    run ends after an event that created an issue (it holds the company's issue counter, which
    every import of the company waits for). Log lines of the run are emitted once it has committed.

    If an event of the run fails, the run rolls back; the events before it are applied again one per
    transaction (:func:`_process_head`), and the failure is recorded on the event that failed, as if
    it had been applied alone (it is not applied a second time).

    Returns the outcome of each event processed, in order (empty: nothing to do), and whether the
    run applied every event its claim found, fewer than ``size`` (the queue looked drained)."""
    if size == 1:
        result = _process_head(instance_id, external_task_id)
        return ([result] if result else []), False
    run = _Run()
    try:
        with logctx.held() as lines:
            results = _apply_run(instance_id, external_task_id, size, run, lines)
    except Exception as exc:  # noqa: BLE001 — redone below: the failure is recorded where it happened
        if not run.claimed:
            raise
        return _redo(instance_id, external_task_id, run, exc, lines), False
    if results is None:  # the head is a retry: it goes alone, with its failure accounting
        return _process_run(instance_id, external_task_id, 1)
    return results, len(run.claimed) < size and len(results) == len(run.claimed)


class _Run:
    def __init__(self):
        self.claimed: list[InboundEvent] = []
        self.failed_at: int | None = None  # the index of the event whose apply raised


def _apply_run(instance_id, external_task_id: str, size: int, run: _Run, lines: logctx.Held) -> list[str] | None:
    """:func:`_process_run`'s transaction; None when the head is a failed event (retried alone)."""
    with transaction.atomic():
        events = _claim(instance_id, external_task_id, size)
        if not events or events[0].instance.status == InstanceStatus.PAUSED:
            return []
        if events[0].status == EventStatus.FAILED:
            return None
        run.claimed = events
        instance, results = events[0].instance, []
        with activity_batched(), run_touches():  # the run's audit rows: one INSERT; a link's touch: one write
            for index, event in enumerate(events):
                run.failed_at = index
                lines.mark()  # a failing event's lines stand (it is not applied again); the others' are redone
                outcome = event_apply(instance=instance, event=event)
                run.failed_at = None
                results.append(_mark(event, outcome))
                if outcome.numbered:
                    break
        rows.update_many(events[:len(results)], _MARKED)  # one round trip
    return results


def _redo(instance_id, external_task_id: str, run: _Run, exc: Exception, lines: logctx.Held) -> list[str]:
    """After a run rolled back: its events before the one that failed, one per transaction, then the
    failure recorded on that one (with its log lines). Stops where another worker took the queue over
    meanwhile."""
    before = len(run.claimed) if run.failed_at is None else run.failed_at
    results = []
    for _ in range(before):
        result = _process_head(instance_id, external_task_id)
        if result is None:
            return results
        results.append(result)
        if result == "failed":
            return results
    if run.failed_at is not None:
        failing = run.claimed[run.failed_at]
        lines.emit(lines.kept)
        results.append(_record_failure(failing.instance, failing.pk, exc))
    return results


def _process_head(instance_id, external_task_id: str) -> str | None:
    """One event (the head) in its own transaction; a failure is recorded on it."""
    now = timezone.now()
    event_id = instance = None
    try:
        with transaction.atomic():
            # If another worker holds the head, that worker owns this task's queue now (SKIP LOCKED
            # returns nothing); a head it finished meanwhile is re-read finished.
            claimed = _claim(instance_id, external_task_id, 1)
            if not claimed:
                return None
            event = claimed[0]
            instance = event.instance
            if instance.status == InstanceStatus.PAUSED:
                return None
            if event.status == EventStatus.FAILED and event.next_attempt_at and event.next_attempt_at > now:
                return None  # the head waits for its retry; later events keep their order behind it
            event_id = event.pk
            with activity_batched():
                outcome = event_apply(instance=instance, event=event)
            result = _mark(event, outcome)
            rows.update_fields(event, _MARKED)
        return result
    except Exception as exc:  # any failure: retry with backoff, park after the bounded count
        if event_id is None:
            raise
        return _record_failure(instance, event_id, exc)


def _record_failure(instance: ConnectorInstance, event_id, exc: Exception) -> str:
    category, message = failure_of(exc)
    with transaction.atomic():
        event = InboundEvent.objects.select_for_update().filter(pk=event_id).first()
        if event is None or event.status not in UNFINISHED_EVENT_STATUSES:
            return "failed"
        event.attempts += 1
        event.last_attempt_at = timezone.now()
        event.error_category, event.error_message = category, message
        link = TaskLink.objects.filter(instance=instance, external_task_id=event.external_task_id).exclude(
            status=LinkStatus.UNLINKED).first() if event.external_task_id else None
        if event.attempts >= int(conf("MAX_ATTEMPTS")):
            event.status, event.next_attempt_at = EventStatus.PARKED, None
            event.outcome = f"parked after {event.attempts} attempts"
            sync_error_record(instance=instance, category=ErrorCategory.EVENT_PARKED, link=link, event=event,
                              message=f"Event {event.idempotency_key} ({event.kind}) parked after "
                                      f"{event.attempts} attempts: {message}",
                              details={"lastCategory": category})
            # §13.1.2: a credential failure is the instance's health error, never a link's
            if link is not None and link.status != LinkStatus.PAUSED and category != ErrorCategory.PROVIDER_AUTH:
                link_set_status(link, LinkStatus.ERROR, f"event {event.idempotency_key} parked",
                                detail=f"Event parked: {message[:400]}", key=event.idempotency_key)
            result = "parked"
        else:
            retry_after = exc.retry_after if isinstance(exc, ProviderError) else None
            event.status = EventStatus.FAILED
            event.next_attempt_at = timezone.now() + retry_backoff(event.attempts, retry_after)
            event.outcome = f"attempt {event.attempts} failed"
            sync_error_record(instance=instance, category=category, link=link, event=event,
                              message=f"Applying {event.idempotency_key} failed (attempt {event.attempts}): {message}")
            result = "failed"
        event.save(update_fields=["status", "attempts", "last_attempt_at", "error_category", "error_message",
                                  "next_attempt_at", "outcome"])
    return result


# --------------------------------------------------------------------------------------- applying
@audit.attributed  # §14.5: the rows it writes name the link, event and actor; one log line per outcome
def event_apply(*, instance: ConnectorInstance, event: InboundEvent) -> Outcome:
    """Apply one stored event inside the caller's transaction (raises to roll everything back)."""
    verified = codec.event_load(event.payload)
    key = event.idempotency_key
    if verified.kind == EventKind.IGNORED:
        return dropped(f"nothing to do for {verified.action or 'this event'}")
    if not container_allowed(instance, verified.container_id):
        return dropped(f"payload for another container ({verified.container_id})")
    if not verified.trusted_content or verified.sparse:
        # §5.1.5 / §14.2: an unverifiable delivery is a hint; its effects come from the API only. A signed
        # sparse one (a comment named without its text) is read back the same way.
        result = _read_back(instance, event, verified)
        if result.event is None:
            return dropped(f"unverified delivery not confirmed by read-back: {result.note}")
        verified = result.event
        if not container_allowed(instance, verified.container_id):
            return dropped(f"read-back: task in another container ({verified.container_id})")
    if verified.kind == EventKind.TASK_UPSERTED:
        return task_upserted(instance, verified, key)
    if verified.kind == EventKind.TASK_DELETED:
        return task_deleted(instance, verified, key)
    if verified.kind == EventKind.COMMENT_UPSERTED:
        return comment_upserted(instance, verified, key)
    if verified.kind == EventKind.COMMENT_DELETED:
        return comment_deleted(instance, verified, key)
    return dropped(f"unknown event kind {verified.kind}")


def _read_back(instance, event: InboundEvent, verified: VerifiedEvent) -> readback.ReadBack:
    """The event as the provider's API confirms it (or none), recorded on the event row (rolled back
    with the apply when it fails). Provider errors propagate: the event is retried, then parked."""
    known_key = (TaskLink.objects.filter(instance=instance, external_task_id=verified.external_task_id or "")
                 .exclude(status=LinkStatus.UNLINKED).values_list("external_key", flat=True).first())
    result = readback.confirm(adapter_for(instance), verified, external_key=known_key or None)
    event.payload = {**event.payload, "readBack": {"at": timezone.now().isoformat(), "confirmed": result.confirmed,
                                                   "note": result.note[:300]}}
    if result.confirmed and not verified.trusted_content:
        event.verified, event.verification = True, "read-back"
    InboundEvent.objects.filter(pk=event.pk).update(payload=event.payload, verified=event.verified,
                                                    verification=event.verification)
    return result
