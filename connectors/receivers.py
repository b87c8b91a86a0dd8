"""Subscriptions to the issues app's domain events (connected in ConnectorsConfig.ready()).

The ``*_atomic`` signals are sent inside the transaction of the change, so the outbox rows commit
(or roll back) with it (§10.1). A failure here never breaks the host change: it is logged and kept
in a savepoint, and the link's health shows it."""
from __future__ import annotations

import logging
from functools import lru_cache

from django.db import connection, transaction
from django.dispatch import receiver

from issues import events
from paperclip.core import rows

log = logging.getLogger("connectors.receivers")


@lru_cache(maxsize=1)
def _linked_sql() -> str:
    from connectors.models import TaskLink

    return f"SELECT 1 FROM {connection.ops.quote_name(TaskLink._meta.db_table)} WHERE issue_id = %s LIMIT 1"


LINKED_FACT = "connectors.linked"


def linked_fact_sql() -> str:
    """The claim fact ``connectors.linked`` (issues.events.CLAIM_FACTS): is the claimed issue linked?"""
    from connectors.models import TaskLink

    table = connection.ops.quote_name(TaskLink._meta.db_table)
    return f"EXISTS (SELECT 1 FROM {table} WHERE {table}.issue_id = {{issue}}.id)"


def _linked(issue_id) -> bool:
    """Is the issue linked to a tracker? One indexed read, its statement built once: every checkout,
    status change and agent comment asks."""
    from issues.models import Issue

    return rows.fetch_row(_linked_sql(), [rows.pk_value(Issue, issue_id)]) is not None


def _guarded(fn, **kwargs):
    issue_id = kwargs.pop("_issue_id", None)
    if issue_id is not None and not _linked(issue_id):
        return  # not a linked issue: nothing to do
    try:
        with transaction.atomic():
            fn(**kwargs)
    except Exception:
        log.exception("connector outbound receiver %s failed", getattr(fn, "__name__", fn))


@receiver(events.issue_updated_atomic, dispatch_uid="connectors.outbound.issue_updated")
def on_issue_updated(sender, issue, actor=None, changes=None, **kwargs):
    from connectors.services import outbound, policy_entries

    change = (changes or {}).get("status")
    # The connector's own edits (inbound applies run as SYSTEM) never bounce back to the tracker;
    # conflict resolutions by people are held by the open conflict they resolve (pushable_fields).
    fields = [name for name in outbound.PUSHED_FIELDS if name in (changes or {})]
    if fields and (actor is None or actor.system):
        fields = []
    if not change and not fields:
        return

    def project():  # one linked-issue check and one savepoint for the whole update
        if change:
            outbound.status_changed(issue=issue, old=change[0], new=change[1], actor=actor,
                                    previous_agent_id=((changes or {}).get("assignee_agent") or [None])[0])
        if fields:
            outbound.fields_changed(issue=issue, fields=fields, actor=actor)
            # §4.1.4: an edit the field policy keeps from the tracker is a policy entry, never silently dropped
            policy_entries.paperclip_edits_recorded(issue=issue, fields=fields, actor=actor)

    _guarded(project, _issue_id=issue.pk)


@receiver(events.comment_created_atomic, dispatch_uid="connectors.outbound.comment_created")
def on_comment_created(sender, comment, actor=None, **kwargs):
    from connectors.services import outbound

    if not comment.author_agent_id:
        return
    _guarded(outbound.agent_comment, _issue_id=comment.issue_id, comment=comment)


@receiver(events.issue_checked_out_atomic, dispatch_uid="connectors.outbound.issue_checked_out")
def on_checked_out(sender, issue, actor=None, run_id=None, **kwargs):
    from connectors.services import outbound

    linked = getattr(issue, "claim_facts", {}).get(LINKED_FACT)  # the claim answered it (None: ask)
    if linked is False:
        return
    _guarded(outbound.claimed, _issue_id=None if linked else issue.pk, issue=issue, run_id=run_id)


@receiver(events.run_finished_atomic, dispatch_uid="connectors.outbound.run_finished")
def on_run_finished(sender, run, **kwargs):
    from connectors.services import outbound

    if run.issue_id is None:
        return
    _guarded(outbound.run_finished, _issue_id=run.issue_id, run=run)


@receiver(events.run_finished_atomic, dispatch_uid="connectors.outbound.run_transcript")
def on_run_finished_transcript(sender, run, **kwargs):
    """postTranscripts (§10.2, off by default): the finished run's bounded, redacted summary."""
    from connectors.services import transcripts

    if run.issue_id is None:
        return
    _guarded(transcripts.run_transcript_posted, _issue_id=run.issue_id, run=run)


@receiver(events.work_product_created_atomic, dispatch_uid="connectors.outbound.work_product_created")
def on_work_product_created(sender, work_product, actor=None, **kwargs):
    from connectors.services import outbound

    _guarded(outbound.artifact_posted, _issue_id=work_product.issue_id, work_product=work_product, actor=actor)


@receiver(events.document_written_atomic, dispatch_uid="connectors.outbound.document_written")
def on_document_written(sender, document, revision=None, actor=None, **kwargs):
    from connectors.services import outbound

    if document.key != outbound.PLAN_KEY:
        return
    _guarded(outbound.plan_written, _issue_id=document.issue_id, document=document, revision=revision,
             actor=actor)


@receiver(events.sweep_ticked, dispatch_uid="connectors.sweep")
def on_sweep(sender, now=None, **kwargs):
    """Embedded mode (no broker, ``manage.py paperclip_worker``): the connector sweep rides on the
    worker's periodic sweep. With a broker, celery beat schedules ``connectors.tasks.sweep`` itself."""
    from django.conf import settings

    if not settings.CELERY_TASK_ALWAYS_EAGER:
        return None
    from connectors import tasks

    try:
        tasks.sweep()
    except Exception:  # one failing connector must not stop the host's sweep
        log.exception("connector sweep failed")
        return {"connectorSweep": "failed"}
    return {"connectorSweep": "done"}
