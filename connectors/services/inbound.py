"""The inbound pipeline (§7): store events idempotently, apply them per external task in order,
retry with backoff, park poison events, import tasks and comments."""
from __future__ import annotations

import uuid
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache

from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from connectors.choices import (
    UNFINISHED_EVENT_STATUSES,
    ClosePolicy,
    ConflictKind,
    EventSource,
    EventStatus,
    ErrorCategory,
    InstanceStatus,
    LinkStatus,
    OriginSide,
    OutboundKind,
    RunMode,
    StateCategory,
    SyncMode,
)
from connectors.models import ConnectorInstance, ExternalCommentLink, InboundEvent, TaskLink
from connectors.providers.base import (
    EventKind,
    ExternalComment,
    ExternalTask,
    ExternalTaskRef,
    ProviderError,
    VerifiedEvent,
    normalize_state_name,
)
from issues.actors import SYSTEM
from issues.choices import TERMINAL_ISSUE_STATUSES, AuthorType, IssueStatus, OriginKind
from issues.models import Comment, Company, Issue
from issues.services.activity import activity_batched, activity_record
from issues.services.issues import issue_create, issue_update
from issues.services.thread import comment_create
from paperclip.core import rows

from . import audit, backlinks, codec, commands as command_service, content, field_merge, links, logctx, readback
from . import routing
from . import symphony
from . import routing_conflicts
from . import close_reopen, export_marks, run_modes
from .common import (
    adapter_for,
    conf,
    container_allowed,
    failure_of,
    link_first_sync_ok,
    link_set_status,
    retry_backoff,
    sync_error_record,
)

ACTIVE_ISSUE_STATUSES = (IssueStatus.IN_PROGRESS, IssueStatus.IN_REVIEW, IssueStatus.BLOCKED)


class Outcome:
    """What applying an event did. ``numbered``: it created an issue, taking the company's issue
    counter, a row lock every import of the company waits for until the apply commits."""

    def __init__(self, status: str, text: str, *, numbered: bool = False):
        self.status, self.text, self.numbered = status, text, numbered


def applied(text):
    return Outcome(EventStatus.APPLIED, text)


def dropped(text):
    return Outcome(EventStatus.DROPPED, text)


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


@lru_cache(maxsize=1)
def _unfinished_sql() -> str:
    statuses = ", ".join(["%s"] * len(UNFINISHED_EVENT_STATUSES))
    return (f"SELECT 1 FROM {connection.ops.quote_name(InboundEvent._meta.db_table)} h WHERE h.instance_id = %s "
            f"AND h.external_task_id = %s AND h.status IN ({statuses}) LIMIT 1")


def _has_unfinished(instance_id, external_task_id: str) -> bool:
    """Whether the task's queue has an unfinished event, read after a run that took the whole queue
    it saw (one statement, no transaction, no lock). The holder of a queue looks once more after its
    run: a kick that met the held head left the queue to it. Only when this finds an event (stored
    meanwhile, or held by another worker) does it claim again; a full claim would cost a transaction."""
    params = [rows.pk_value(ConnectorInstance, instance_id), external_task_id, *UNFINISHED_EVENT_STATUSES]
    return rows.fetch_row(_unfinished_sql(), params) is not None


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
    wanted = Q()
    for instance_id, task_id in named:
        if instance_id in ids:
            wanted |= Q(instance_id=ids[instance_id], external_task_id=task_id)
    found = set(InboundEvent.objects.filter(wanted, status__in=UNFINISHED_EVENT_STATUSES).values_list(
        "instance_id", "external_task_id").distinct()) if wanted else set()
    return [(i, t) for i, t in named if i not in ids or (ids[i], t) in found]


def _schedule_retry(instance_id, external_task_id, when):
    from .kicks import task_events_retry

    task_events_retry(instance_id, external_task_id, max((when - timezone.now()).total_seconds(), 0))


_HEAD_DEFERRED = ("raw_body", "raw_headers")  # kept for operators, never read by an apply


def _lock_clause(*aliases, skip_locked=False) -> str:
    """``FOR UPDATE OF …`` where the database has row locks (SQLite serialises writers instead)."""
    if not connection.features.has_select_for_update:
        return ""
    return " " + connection.ops.for_update_sql(skip_locked=skip_locked, of=aliases)


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
            + _lock_clause("e", skip_locked=True))


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


_TOUCHED: ContextVar[set | None] = ContextVar("inbound_run_touched", default=None)


@contextmanager
def _run_touches():
    """The links whose ``last_inbound_at`` this transaction's events wrote (one scope per run)."""
    token = _TOUCHED.set(set())
    try:
        yield
    finally:
        _TOUCHED.reset(token)


def _touched(link: TaskLink):
    touched = _TOUCHED.get()
    if touched is not None:
        touched.add(link.pk)


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
        with activity_batched(), _run_touches():  # the run's audit rows: one INSERT
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
        return _task_upserted(instance, verified, key)
    if verified.kind == EventKind.TASK_DELETED:
        return _task_deleted(instance, verified, key)
    if verified.kind == EventKind.COMMENT_UPSERTED:
        return _comment_upserted(instance, verified, key)
    if verified.kind == EventKind.COMMENT_DELETED:
        return _comment_deleted(instance, verified, key)
    return dropped(f"unknown event kind {verified.kind}")


@lru_cache(maxsize=2)
def _active_link_sql(with_comment: bool = False) -> str:
    qn = connection.ops.quote_name
    record = ""
    if with_comment:  # the comment's record, if seen before (not locked, as it never was)
        record = (f"LEFT JOIN {qn(ExternalCommentLink._meta.db_table)} r "
                  f"ON r.instance_id = l.instance_id AND r.external_comment_id = %s ")
    return (f"SELECT {rows.select_list(TaskLink, 'l')}, {rows.select_list(Issue, 's')}"
            + (f", {rows.select_list(ExternalCommentLink, 'r')} " if with_comment else " ")
            + f"FROM {qn(TaskLink._meta.db_table)} l JOIN {qn(Issue._meta.db_table)} s ON s.id = l.issue_id {record}"
            f"WHERE l.instance_id = %s AND l.external_task_id = %s AND l.status <> %s"  # (one: a constraint)
            + _lock_clause("l", "s"))


def active_link(instance, external_task_id: str) -> TaskLink | None:
    """The task's live link with its issue, both locked: every effect on the issue goes through this
    row. Built once (every applied event reads it)."""
    return _active_link(instance, external_task_id)[0]


def _active_link(instance, external_task_id: str, external_comment_id: str | None = None):
    """(link, the tracker comment's record or None), the record read with the link when
    ``external_comment_id`` is given (one round trip for a comment event)."""
    with_comment = external_comment_id is not None
    params = [rows.pk_value(ConnectorInstance, instance.pk), external_task_id, LinkStatus.UNLINKED]
    row = rows.fetch_row(_active_link_sql(with_comment), [external_comment_id, *params] if with_comment else params)
    if row is None:
        return None, None
    if with_comment:
        link, issue, record = rows.split(row, TaskLink, Issue, ExternalCommentLink)
        record = record if record.pk is not None else None
    else:
        (link, issue), record = rows.split(row, TaskLink, Issue), None
    TaskLink.issue.field.set_cached_value(link, issue)
    audit.link_bound(link)
    return link, record


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


def _task_upserted(instance, verified: VerifiedEvent, key: str) -> Outcome:
    task = verified.task
    if task is None:  # a sparse (signed) payload names the task only: its container comes from the read-back
        try:
            task = adapter_for(instance).get_task(ExternalTaskRef(external_id=verified.external_task_id))
        except ProviderError as exc:
            if exc.status != 404:
                raise  # retried like every failed apply
            return dropped("read-back: the task no longer exists (its deletion arrives as its own event)")
        if not container_allowed(instance, task.container_id):
            return dropped(f"read-back: task in another container ({task.container_id})")
    link = active_link(instance, task.external_id)
    if link is None:
        pairings = backlinks.task_pairings(instance, task.external_id)
        if pairings.unlinked_here:
            return dropped(UNLINKED_TEXT)
        return task_import(instance=instance, task=task, key=key, actor=verified.actor, pairings=pairings)
    if verified.actor is not None and _own_actor(instance, verified.actor):
        return dropped("the connector's own change (echo)")
    return link_apply_task(instance=instance, link=link, task=task, key=key, actor=verified.actor)


UNLINKED_TEXT = "the task was unlinked by an operator (§6.4); import or link it by hand to sync it again"


def task_import(*, instance, task: ExternalTask, key: str, actor=None, manual: bool = False,
                pairings: backlinks.TaskPairings | None = None) -> Outcome:
    """§6.2 import / §15.1, after the §6.3 dedupe (``pairings``: the task's past links, if the
    caller read them to see whether an operator unlinked it)."""
    if not manual and not instance.auto_import:
        return dropped("auto-import is off for this connector")
    if not manual and task.state.category == StateCategory.TERMINAL:
        return dropped("terminal external task is not imported")
    export = None if manual else export_marks.unlinked_export_of(instance, task)
    if export is not None:  # its creation webhook beat the export's answer (or the answer was lost)
        return dropped(f"created by the export of {export.issue.identifier} (export {export.pk}), which links it")
    label = links.provider_label(instance)
    existing, how = links.dedupe_issue(instance, task, pairings)
    if existing is not None:  # §6.3: paired as a manual link (§6.2.3), divergence as conflicts
        link, diverged = links.link_existing(instance=instance, issue=existing, task=task, key=key, how=how)
        _audit(link, "connector.task_linked", key, {"dedupe": how, "actor": content.actor_dict(actor),
                                                    "issueId": str(existing.pk), "divergedFields": diverged})
        return applied(f"linked existing issue {existing.identifier} ({how})"
                       + (f"; conflicts: {', '.join(diverged)}" if diverged else ""))
    link_id = uuid.uuid4()
    audit.link_reserved(link_id)  # the issue is created on behalf of this link: its rows say so
    decision = routing.routing_resolve(instance=instance, task=task)
    status = links.initial_status(task.state.category)
    issue, _ = issue_create(
        actor=SYSTEM, company=instance.company, title=content.render_title(task),
        description=content.render_description(task, label), status=status,
        priority=links.issue_priority(task) or "medium", project_id=instance.project_id, goal_id=instance.goal_id,
        assignee_agent=decision.agent, origin_kind=OriginKind.CONNECTOR,  # routing read it in this transaction
        origin_id=content.attribution_key(instance.pk, task.external_id),
        assignment_wake=run_modes.import_may_wake(instance),  # assigned for visibility, never started (§4.2.2)
        _savepoint=False,  # (any error rolls the apply back whole)
    )
    link = links.link_create(instance=instance, issue=issue, task=task, key=key, origin_side=OriginSide.EXTERNAL,
                             routing=decision.as_dict(), cause="imported", status=LinkStatus.HEALTHY,
                             link_id=link_id)
    _routing_problems(instance, link, decision, issue, key)
    _state_mapping_check(instance, link, task, previous_name=None)
    links.backlink_record(link=link, instance=instance, issue=issue)
    _audit(link, "connector.task_imported", key, {"issueId": str(issue.pk), "identifier": issue.identifier,
                                                  "routing": decision.as_dict(), "actor": content.actor_dict(actor)})
    link_first_sync_ok(link, key)
    if run_modes.connector_may_wake(link) and task.state.category == StateCategory.ACTIVE:
        # Imported already active (§15.3): a tracker-driven cycle like any task that becomes active; its
        # wake coalesces into the assignment run issue_create queued, which then carries the packet.
        symphony.connector_wake(link=link, issue=issue, key=key, task=task)
    return Outcome(EventStatus.APPLIED, f"imported as {issue.identifier}", numbered=True)


def _audit(link: TaskLink, action: str, key: str, details: dict):
    activity_record(actor=SYSTEM, company_id=link.company_id, action=action, entity_type="connector_link",
                    entity_id=link.pk, details={"instanceId": str(link.instance_id), "providerKey": link.provider_key,
                                                "externalTaskId": link.external_task_id,
                                                "externalKey": link.external_key, "idempotencyKey": key, **details})


def _routing_problems(instance, link, decision: routing.RoutingDecision, issue: Issue, key: str):
    for problem in decision.problems:
        sync_error_record(instance=instance, category=ErrorCategory.ROUTING, message=problem, link=link)
    if decision.fell_back:
        who = decision.agent.name if decision.agent else "nobody (no usable triage agent)"
        body = (f"Unresolved routing for {link.external_key or link.external_task_id}: {decision.reason}. "
                f"Assigned to the triage fallback: {who}.")
        if run_modes.is_observer(link):  # mutates neither side: the fallback is a health entry only
            sync_error_record(instance=instance, category=ErrorCategory.ROUTING, message=body, link=link)
            return
        links.note(issue, body, link=link, key=key, kind="routing_unresolved")
        from .outbound import effect_record, write_refusal

        if not write_refusal(link, OutboundKind.COMMENT):
            effect_record(link=link, kind=OutboundKind.COMMENT, source_id=f"routing-unresolved:{issue.pk}",
                          payload={"body": body})


def _state_mapping_check(instance, link, task: ExternalTask, previous_name: str | None):
    """§7.2: an unmapped state is inert backlog and reported in health (once per state change)."""
    if previous_name is not None and normalize_state_name(previous_name) == normalize_state_name(task.state.name):
        return
    if not _state_mapped(instance, task):
        sync_error_record(instance=instance, category=ErrorCategory.STATE_UNMAPPED, link=link,
                          message=f"State '{task.state.name}' of {task.external_key or task.external_id} is not in "
                                  f"the state mapping; treated as backlog.")


def _state_mapped(instance, task: ExternalTask) -> bool:
    envelope = task.envelope or {}
    if envelope.get("unmappedState"):
        return False  # the adapter says it found no mapping for this state
    if isinstance(envelope.get("stateMapped"), bool):
        return envelope["stateMapped"]
    name = normalize_state_name(task.state.name)
    mapping = instance.state_mapping or {}
    if not mapping:
        return True  # the provider's built-in mapping applies

    def contains(value) -> bool:
        if isinstance(value, str):
            return normalize_state_name(value) == name
        if isinstance(value, dict):
            return any(normalize_state_name(k) == name or contains(v) for k, v in value.items())
        if isinstance(value, (list, tuple)):
            return any(contains(v) for v in value)
        return False

    return contains(mapping)


def link_apply_task(*, instance, link: TaskLink, task: ExternalTask, key: str, actor=None) -> Outcome:
    """Apply a fresh external snapshot to a linked issue (fields, state category, routing)."""
    if link.status == LinkStatus.PAUSED:
        return dropped("link paused (resume resyncs it)")
    if link.sync_mode in (SyncMode.DISABLED, SyncMode.EXPORT_ONLY):
        return dropped(f"link sync mode {link.sync_mode}")
    if link.external_updated_at and task.updated_at and task.updated_at < link.external_updated_at:
        return dropped("older than the state already applied")
    label = links.provider_label(instance)
    base = link.base_snapshot or {}
    base_ext, base_pc = base.get("external") or {}, base.get("paperclip") or {}
    ext = links.external_snapshot(task, label)
    ext["dueAt"] = task.due_at.isoformat() if task.due_at else None
    issue = link.issue
    observer = link.sync_mode == SyncMode.OBSERVER
    changes, notes = {}, []
    actor_text = content.actor_label(actor)

    held = set()  # fields in conflict: their base stays where it was until the conflict is resolved
    if not observer:
        held = field_merge.fields_three_way(link, issue, task, ext, base_ext, base_pc, changes, key, actor_text)
    pending = field_merge.paperclip_pending(issue, task, ext, base_pc, changes)
    issue_before = issue.pk

    previous_category = link.external_state_category or base_ext.get("category")
    category_changed = previous_category != task.state.category
    if category_changed and not observer:
        notes += _category_transition(instance, link, issue, previous_category, task, key, actor_text, changes)
        issue = link.issue  # a reopen may have retargeted the link

    route_inputs = ("labels", "assignees", "state", "customFields")
    if not observer and any(ext[k] != base_ext.get(k) for k in route_inputs) and issue.status not in \
            TERMINAL_ISSUE_STATUSES:
        _reroute(instance, link, issue, task, key, changes, notes)

    if changes:
        issue, _, _ = issue_update(actor=SYSTEM, issue=issue, changes=changes,
                                   assignment_wake=run_modes.connector_may_wake(link),
                                   _locked=issue.pk == issue_before)  # (read and locked with the link)
        link.issue = issue
    for body in notes:
        links.note(issue, body, link=link, key=key, kind="state")
    _state_mapping_check(instance, link, task, previous_name=link.external_state_name)

    link.external_title = task.title[:500]
    link.external_key = task.external_key or link.external_key
    link.external_url = task.url or link.external_url
    link.external_state_name = task.state.name[:200]
    link.external_state_category = task.state.category
    link.external_updated_at = task.updated_at or link.external_updated_at
    link.last_external_revision = task.revision
    link.envelope = dict(task.envelope or {})
    link.last_inbound_at = timezone.now()
    if issue.pk != issue_before:
        pending = set()  # retargeted to a follow-up: its base starts from its own values
    link.base_snapshot = field_merge.base_advance(ext, links.paperclip_snapshot(issue), base_ext, base_pc, held,
                                                  pending)
    rows.update_fields(link, ["external_title", "external_key", "external_url", "external_state_name",
                              "external_state_category", "external_updated_at", "last_external_revision",
                              "envelope", "last_inbound_at", "base_snapshot", "issue", "routing", "handoff_history",
                              "updated_at"])
    _touched(link)
    if not observer and symphony.is_symphony(link):
        became_todo = changes.get("status") == IssueStatus.TODO
        if task.state.category == StateCategory.ACTIVE and (category_changed or became_todo):
            symphony.connector_wake(link=link, issue=issue, key=key, task=task)
        elif category_changed and previous_category == StateCategory.ACTIVE:
            symphony.left_active(link=link, issue=issue, new_category=task.state.category, actor_text=actor_text,
                                 key=key)
    link_first_sync_ok(link, key)
    what = ", ".join(sorted(changes)) or "no field change"
    return applied(f"{issue.identifier}: {what}" + (" (observer)" if observer else ""))


def _category_transition(instance, link, issue, previous, task, key, actor_text, changes) -> list[str]:
    """§7.4: external transitions become host-level requests or conflicts, never silent status sets."""
    new = task.state.category
    ref = link.external_key or link.external_task_id
    notes = []
    if new == StateCategory.TERMINAL:
        if issue.status in TERMINAL_ISSUE_STATUSES:
            return notes
        # §7.4 close policy (services/close_reopen.py): auto-close only an idle issue, else a conflict
        auto = close_reopen.close_policy_of(link, instance) == ClosePolicy.AUTO_CLOSE
        waits = close_reopen.auto_close_waits(issue) if auto else []
        if auto and not waits:
            changes["status"] = IssueStatus.DONE
            notes.append(f"{actor_text} closed {ref} ({task.state.name}); the idle issue was closed with it "
                         f"(close policy auto_close).")
            _audit(link, "connector.issue_auto_closed", key, {"issueId": str(issue.pk), "fromStatus": issue.status,
                                                              "externalState": task.state.name, "actor": actor_text})
        else:
            why = f"; auto-close waits: {', '.join(waits)}" if waits else ""
            created = links.conflict_open(link=link, kind=ConflictKind.CLOSURE, key=key,
                                          detail=f"external task closed ({task.state.name}) while the issue is "
                                                 f"{issue.status}{why}", external={"state": task.state.name},
                                          paperclip={"status": issue.status}, actors={"external": actor_text})[1]
            if created:
                notes.append(f"{actor_text} moved {ref} to '{task.state.name}' (terminal) while this issue is "
                             f"{issue.status}. Nothing was closed here: finish, cancel or resolve the conflict."
                             + (f" Auto-close waits: {', '.join(waits)}." if waits else ""))
        return notes
    if previous == StateCategory.TERMINAL and issue.status in TERMINAL_ISSUE_STATUSES:
        if close_reopen.reopens_in_place(instance):  # §7.4 reopen policy "reopen": the same issue
            changes["status"] = links.initial_status(new)
            _audit(link, "connector.issue_reopened", key, {"issueId": str(issue.pk), "fromStatus": issue.status,
                                                           "toStatus": changes["status"],
                                                           "externalState": task.state.name, "actor": actor_text})
            notes.append(f"{actor_text} reopened {ref} ({task.state.name}); this issue was reopened "
                         f"({issue.status} -> {changes['status']}, reopen policy).")
            return notes
        follow_up = _follow_up(instance, link, issue, task, key)
        notes.append(f"{actor_text} reopened {ref}; follow-up issue {follow_up.identifier} now carries the link.")
        return notes
    if new == StateCategory.ACTIVE and issue.status == IssueStatus.BACKLOG:
        if link.run_mode == RunMode.SYMPHONY_COMPATIBLE:
            changes["status"] = IssueStatus.TODO
        else:
            notes.append(f"{actor_text} moved {ref} to '{task.state.name}' (active). This issue stays in backlog "
                         f"until someone here schedules it.")
    elif previous == StateCategory.ACTIVE and new in (StateCategory.BACKLOG, StateCategory.BLOCKED):
        notes.append(f"{actor_text} moved {ref} to '{task.state.name}' ({new}).")
    return notes


def _follow_up(instance, link: TaskLink, issue: Issue, task: ExternalTask, key: str) -> Issue:
    """Reopen of a terminal issue: an idempotent follow-up issue, then one retarget of the link."""
    origin = f"{content.attribution_key(instance.pk, task.external_id)}:reopen:{len(link.handoff_history) + 1}"[:200]
    follow_up = Issue.objects.filter(company_id=link.company_id, origin_kind=OriginKind.CONNECTOR,
                                     origin_id=origin).first()
    if follow_up is None:
        follow_up, _ = issue_create(
            actor=SYSTEM, company=instance.company, title=content.render_title(task),
            description=content.render_description(task, links.provider_label(instance)),
            status=links.initial_status(task.state.category), priority=issue.priority, project_id=issue.project_id,
            goal_id=issue.goal_id, assignee_agent_id=issue.assignee_agent_id, origin_kind=OriginKind.CONNECTOR,
            origin_id=origin, parent_id=None,
            # an external reopen informs; only the Symphony profile lets it start work (§4.2.2)
            assignment_wake=symphony.is_symphony(link) and run_modes.connector_may_wake(link))
    link.handoff_history = [*link.handoff_history, {"issueId": str(issue.pk), "endedAt": timezone.now().isoformat(),
                                                    "cause": "external reopen"}]
    link.issue = follow_up
    link.save(update_fields=["issue", "handoff_history", "updated_at"])
    _audit(link, "connector.link_retargeted", key, {"fromIssueId": str(issue.pk), "toIssueId": str(follow_up.pk)})
    return follow_up


def _reroute(instance, link, issue, task, key, changes, notes):
    decision = routing.routing_resolve(instance=instance, task=task,
                                       command_agent=(link.routing or {}).get("commandAgent"))
    for problem in decision.problems:
        sync_error_record(instance=instance, category=ErrorCategory.ROUTING, message=problem, link=link)
    previous = link.routing or {}
    link.routing = decision.as_dict() | {"commandAgent": previous.get("commandAgent")}
    # §11.1: a route that does not resolve on a linked task is a routing conflict; its owner stays
    if routing_conflicts.route_held(link=link, issue=issue, decision=decision, previous=previous, task=task, key=key):
        return
    if decision.agent is None or decision.agent.pk == issue.assignee_agent_id:
        return
    if issue.status == IssueStatus.IN_PROGRESS:
        notes.append(f"Routing now points at {decision.agent.name} ({decision.reason}). The issue is checked out, "
                     f"so it was not reassigned: handoff requested from the current owner.")
        return
    changes["assignee_agent_id"] = decision.agent.pk


def _task_deleted(instance, verified: VerifiedEvent, key: str) -> Outcome:
    link = active_link(instance, verified.external_task_id or "")
    if link is None:
        return dropped("deleted task was not linked")
    transfer = "transfer" in (verified.action or "")
    what = "moved out of the connector's container" if transfer else "deleted"
    if transfer:
        task = _still_here(instance, link)
        if task is not None:  # left one container for another of ours (Asana multi-project): an update
            return link_apply_task(instance=instance, link=link, task=task, key=key, actor=verified.actor)
    if run_modes.is_observer(link):
        return applied(run_modes.observer_deletion(link, what=what, actor_text=content.actor_label(verified.actor),
                                                   key=key))
    created = links.deletion_handle(link=link, issue=link.issue, actor_text=content.actor_label(verified.actor),
                                    key=key, what=what)
    return applied("deletion conflict opened" if created else "deletion conflict already open")


def _still_here(instance, link: TaskLink) -> ExternalTask | None:
    """A task said to have moved out, as the provider has it now, when it is still in one of the instance's
    containers; None when it is gone or elsewhere, or the provider cannot say (a deletion conflict is the
    safe answer: it never deletes anything)."""
    try:
        task = adapter_for(instance).get_task(ExternalTaskRef(external_id=link.external_task_id,
                                                              external_key=link.external_key or None))
    except ProviderError:
        return None
    return task if task.container_id and container_allowed(instance, task.container_id) else None


# ---------------------------------------------------------------------------------------- comments
def _comment_upserted(instance, verified: VerifiedEvent, key: str) -> Outcome:
    comment = verified.comment
    if comment is None:
        return dropped("no comment in payload")
    if _own_comment(instance, comment):
        return dropped("the connector's own comment (echo)")
    if content.has_marker(comment.body):
        return dropped("mirrored comment marker (loop prevention)")
    link, record = _active_link(instance, comment.external_task_id, comment.external_comment_id)
    if link is not None and link.last_outbound_at is not None:
        from .outbound import recent_outbound_ref

        # only a link that was ever written to can echo one of our writes back (no query otherwise)
        if recent_outbound_ref(instance, comment.external_comment_id):
            return dropped("matches a recently issued outbound write (echo)")
    if link is None:
        if verified.task is None:
            return dropped("comment on a task that is not linked")
        pairings = backlinks.task_pairings(instance, comment.external_task_id)
        if pairings.unlinked_here:
            return dropped(UNLINKED_TEXT)
        outcome = task_import(instance=instance, task=verified.task, key=key, actor=verified.actor,
                              pairings=pairings)
        link, record = _active_link(instance, comment.external_task_id, comment.external_comment_id)
        if link is None:
            return dropped(f"comment on a task that is not linked ({outcome.text})")
    return comment_import(instance=instance, link=link, comment=comment, key=key, record=record)


def _own_comment(instance, comment: ExternalComment) -> bool:
    return _own_actor(instance, comment.author)


def _own_actor(instance, author) -> bool:
    if author is None:
        return False
    return author.is_connector_service_account or (
        bool(instance.service_account_id) and author.external_user_id == instance.service_account_id)


MIRROR_OFF_TEXT = "mirrorExternalComments is off: tracker comments are not imported"


def mirror_external_comments(instance, link: TaskLink) -> bool:
    """§10.2 ``mirrorExternalComments`` (default on; commands are not comments and always run)."""
    from .outbound import write_policy

    return bool(write_policy(link, instance).get("mirrorExternalComments", True))


def comment_changed(record: ExternalCommentLink, comment: ExternalComment) -> bool:
    """Whether ``comment`` is a newer version than the one ``record`` imported: a later updated time
    with another body (the same body again is no edit, e.g. a reaction that bumped the time), or,
    when either side has no updated time, another body."""
    if record.content_digest and record.content_digest == content.body_digest(comment.body):
        return False
    if comment.updated_at and record.external_updated_at:
        return comment.updated_at > record.external_updated_at
    return True


def comment_import(*, instance, link: TaskLink, comment: ExternalComment, key: str,
                   record: ExternalCommentLink | None) -> Outcome:
    """§7.3 / §15.2: commands first, then the attributed, sanitized, untrusted comment. ``record``:
    the comment's ExternalCommentLink if it was seen before (read with the link: ``_active_link``)."""
    if link.sync_mode in (SyncMode.DISABLED, SyncMode.EXPORT_ONLY):
        return dropped(f"link sync mode {link.sync_mode}")
    cmds = command_service.parse_commands(comment.body)
    if run_modes.is_observer(link) and (record is not None or not cmds):
        return dropped("observer link: comments are not imported or edited")  # commands: command_exec
    if record is not None:
        if cmds or record.comment_id is None or record.deleted:
            return dropped("comment already handled")
        if not comment_changed(record, comment):
            return dropped("comment already imported")
        if not mirror_external_comments(instance, link):
            return dropped(MIRROR_OFF_TEXT)
        _comment_edit(link, record, comment, key)
        return applied("comment updated")
    if cmds:
        from .command_exec import commands_execute

        replies = commands_execute(instance=instance, link=link, comment=comment, commands=cmds, key=key)
        _comment_recorded(instance, link, comment, None)
        return applied(f"{len(cmds)} command(s): " + "; ".join(replies))
    if link.status == LinkStatus.PAUSED:
        return dropped("link paused (resume resyncs it)")
    if not mirror_external_comments(instance, link):
        # handled, not imported: turning the toggle on later does not import what was said meanwhile
        _comment_recorded(instance, link, comment, None)
        return dropped(MIRROR_OFF_TEXT)
    issue = link.issue  # locked with the link
    body = _comment_body(link, comment)
    provenance = _provenance(link, comment, key)
    wake = links.wake_on_comment(link, instance) and issue.status not in TERMINAL_ISSUE_STATUSES
    # (inside the event's transaction: the comment and its mapping commit together). Recorded as
    # external either way; with wakeOnExternalComment off only the wake is withheld.
    created = comment_create(actor=SYSTEM, issue=issue, body=body, provenance=provenance,
                             author_type=AuthorType.EXTERNAL, _locked=True, _wake=wake)
    _comment_recorded(instance, link, comment, created)
    _inbound_touch(link)
    link_first_sync_ok(link, key)
    return applied(f"comment imported on {issue.identifier}" + ("" if wake else " (no wake)"))


def _inbound_touch(link: TaskLink):
    """A tracker comment moves the link's ``last_inbound_at`` (its health), unless an earlier event
    of the same run wrote it (:func:`_run_touches`): that value is milliseconds old and commits with
    this comment, so the link's wide row is not rewritten for it."""
    touched = _TOUCHED.get()
    if touched is not None and link.pk in touched:
        return
    link.last_inbound_at = timezone.now()
    rows.update_fields(link, ["last_inbound_at"])
    _touched(link)


def _comment_recorded(instance, link: TaskLink, comment: ExternalComment, created: Comment | None):
    """The tracker comment is handled: imported as ``created``, or (None) taken as commands or
    withheld, so a redelivery or an edit of it is recognised."""
    rows.insert(ExternalCommentLink(instance=instance, link=link, external_comment_id=comment.external_comment_id,
                                    comment=created, external_updated_at=comment.updated_at,
                                    content_digest=content.body_digest(comment.body)))


def _comment_body(link: TaskLink, comment: ExternalComment) -> str:
    who = content.actor_label(comment.author)
    where = f" · [view]({comment.url})" if comment.url else ""
    return f"**{who}** via {link.provider_key} (external, untrusted){where}\n\n{content.sanitize(comment.body)}"


def _provenance(link: TaskLink, comment: ExternalComment, key: str) -> dict:
    return {"source": "connector", "kind": "external_comment", "untrusted": True,
            "connectorInstanceId": str(link.instance_id), "linkId": str(link.pk), "providerKey": link.provider_key,
            "externalTaskId": link.external_task_id, "externalKey": link.external_key,
            "externalCommentId": comment.external_comment_id, "url": comment.url,
            "actor": content.actor_dict(comment.author), "eventKey": key,
            "createdAt": comment.created_at.isoformat() if comment.created_at else None}


def _comment_edit(link, record: ExternalCommentLink, comment: ExternalComment, key: str):
    provenance = _provenance(link, comment, key) | {"edited": True}
    Comment.objects.filter(pk=record.comment_id).update(body=_comment_body(link, comment), provenance=provenance,
                                                        updated_at=timezone.now())
    record.external_updated_at = comment.updated_at
    record.content_digest = content.body_digest(comment.body)
    record.save(update_fields=["external_updated_at", "content_digest"])
    _audit(link, "connector.comment_edited", key, {"commentId": str(record.comment_id)})


def _comment_deleted(instance, verified: VerifiedEvent, key: str) -> Outcome:
    comment = verified.comment
    comment_id = comment.external_comment_id if comment else None
    record = ExternalCommentLink.objects.filter(instance=instance, external_comment_id=comment_id).first() \
        if comment_id else None
    if record is None or record.deleted:
        return dropped("deleted comment was not imported")
    if run_modes.is_observer(record.link):
        return dropped("observer link: the imported comment is left as it is")
    record.deleted = True
    record.save(update_fields=["deleted"])
    if record.comment_id:
        row = Comment.objects.filter(pk=record.comment_id).values_list("provenance", flat=True).first() or {}
        Comment.objects.filter(pk=record.comment_id).update(provenance={**row, "externalDeleted": True})
    return applied("external comment deletion recorded (the host comment is kept)")
