"""What every apply of a tracker event shares (services/inbound.py runs them, apply_tasks.py and
apply_comments.py are the event kinds): its outcome, the task's live link read and locked with
its issue, the connector's own actor, the link's audit rows and the run's touches of a link."""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache

from django.db import connection
from django.utils import timezone

from connectors.choices import EventStatus, LinkStatus
from connectors.models import ConnectorInstance, ExternalCommentLink, TaskLink
from issues.actors import SYSTEM
from issues.models import Issue
from issues.services.activity import activity_record
from paperclip.core import rows

from . import audit


class Outcome:
    """What applying an event did. ``numbered``: it created an issue, taking the company's issue
    counter, a row lock every import of the company waits for until the apply commits."""

    def __init__(self, status: str, text: str, *, numbered: bool = False):
        self.status, self.text, self.numbered = status, text, numbered


def applied(text):
    return Outcome(EventStatus.APPLIED, text)


def dropped(text):
    return Outcome(EventStatus.DROPPED, text)


UNLINKED_TEXT = "the task was unlinked by an operator (§6.4); import or link it by hand to sync it again"


def lock_clause(*aliases, skip_locked=False) -> str:
    """``FOR UPDATE OF …`` where the database has row locks (SQLite serialises writers instead)."""
    if not connection.features.has_select_for_update:
        return ""
    return " " + connection.ops.for_update_sql(skip_locked=skip_locked, of=aliases)


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
            f"WHERE l.instance_id = %s AND l.external_task_id = %s "  # (one: link_one_active_per_external_task)
            f"AND l.status <> {rows.constant(LinkStatus.UNLINKED)}"
            + lock_clause("l", "s"))


def active_link(instance, external_task_id: str) -> TaskLink | None:
    """The task's live link with its issue, both locked: every effect on the issue goes through this
    row. Built once (every applied event reads it)."""
    return active_link_and_record(instance, external_task_id)[0]


def active_link_and_record(instance, external_task_id: str, external_comment_id: str | None = None):
    """(link, the tracker comment's record or None), the record read with the link when
    ``external_comment_id`` is given (one round trip for a comment event)."""
    with_comment = external_comment_id is not None
    params = [rows.pk_value(ConnectorInstance, instance.pk), external_task_id]
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


def own_actor(instance, author) -> bool:
    """Whether ``author`` is the connector itself (its service account): what it wrote comes back as an echo."""
    if author is None:
        return False
    return author.is_connector_service_account or (
        bool(instance.service_account_id) and author.external_user_id == instance.service_account_id)


def link_audit(link: TaskLink, action: str, key: str, details: dict):
    """An audit row on the link, naming its task and the event's idempotency key."""
    activity_record(actor=SYSTEM, company_id=link.company_id, action=action, entity_type="connector_link",
                    entity_id=link.pk, details={"instanceId": str(link.instance_id), "providerKey": link.provider_key,
                                                "externalTaskId": link.external_task_id,
                                                "externalKey": link.external_key, "idempotencyKey": key, **details})


_TOUCHED: ContextVar[set | None] = ContextVar("inbound_run_touched", default=None)


@contextmanager
def run_touches():
    """The links whose ``last_inbound_at`` this transaction's events wrote (one scope per run)."""
    token = _TOUCHED.set(set())
    try:
        yield
    finally:
        _TOUCHED.reset(token)


def touched(link: TaskLink):
    """An event of the run wrote ``link``'s ``last_inbound_at`` (outside a run: nothing to record)."""
    seen = _TOUCHED.get()
    if seen is not None:
        seen.add(link.pk)


def inbound_touch(link: TaskLink):
    """A tracker comment moves the link's ``last_inbound_at`` (its health), unless an earlier event
    of the same run wrote it (:func:`run_touches`): that value is milliseconds old and commits with
    this comment, so the link's wide row is not rewritten for it."""
    seen = _TOUCHED.get()
    if seen is not None and link.pk in seen:
        return
    link.last_inbound_at = timezone.now()
    rows.update_fields(link, ["last_inbound_at"])
    touched(link)
