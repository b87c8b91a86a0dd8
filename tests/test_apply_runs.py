"""A worker applies the head of a task's queue in runs of up to APPLY_BATCH_SIZE events per
transaction. What a user relies on stays as with one event per transaction: a failing event counts
one attempt and is retried on its own, with nothing of it or of the events before it half-applied or
applied twice; the events behind it wait in order; each outcome is logged once; and an import (which
holds the company's issue counter) commits before the rest of its task's queue is applied."""
import logging
import threading

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from connectors.choices import EventStatus
from connectors.models import InboundEvent, TaskLink
from connectors.services import apply_tasks, inbound
from issues.models import ActivityLog, Comment
from tests.test_apply_queries import imported, queued_import
from tests.test_connectors_queries import _queue

pytestmark = pytest.mark.django_db(transaction=True)


def _edit(instance, store, raw, title):
    store.update(raw["id"], title=title)
    _queue(instance, store, raw, f"edit-{title}")


def _claims(ctx) -> int:
    return sum(1 for q in ctx.captured_queries if q["sql"].lstrip().upper().startswith("WITH Q AS"))


def test_a_failure_inside_a_run_is_recorded_on_its_event_after_the_events_before_it(monkeypatch, caplog):
    instance, store, raw = imported()
    for title in ("one", "two", "poison", "four"):
        _edit(instance, store, raw, title)
    real = apply_tasks.link_apply_task
    calls = []

    def poisoned(**kw):
        calls.append(kw["task"].title)
        if kw["task"].title == "poison":
            raise RuntimeError("cannot apply this one")
        return real(**kw)

    monkeypatch.setattr(apply_tasks, "link_apply_task", poisoned)
    caplog.set_level(logging.INFO, logger="connectors.engine")
    counts = inbound.task_events_process(instance_id=instance.pk, external_task_id=raw["id"])

    assert counts == {"applied": 2, "dropped": 0, "failed": 1, "parked": 0}
    # The run (one, two, poison) rolled back; one and two were redone one event per transaction, and
    # the failure was recorded on poison without applying it again (one attempt, one apply).
    assert calls == ["one", "two", "poison", "one", "two"]
    events = {e.idempotency_key.split("-", 1)[1]: e for e in InboundEvent.objects.filter(
        instance=instance, idempotency_key__startswith="edit-")}
    assert [(events[t].status, events[t].attempts) for t in ("one", "two", "poison", "four")] == [
        ("applied", 1), ("applied", 1), ("failed", 1), ("pending", 0)]
    assert events["poison"].error_message and events["poison"].next_attempt_at is not None
    link = TaskLink.objects.select_related("issue").get(instance=instance)
    assert link.issue.title == "two"
    # Each applied edit wrote its audit row once, not once per attempt of its run.
    updates = ActivityLog.objects.filter(action="issue.updated", entity_id=str(link.issue_id))
    assert updates.count() == 2
    # One log line per outcome: the rolled-back run logged nothing.
    lines = [(r.idempotencyKey, str(r.outcome)) for r in caplog.records if r.name == "connectors.engine"
             and r.idempotencyKey and r.idempotencyKey.startswith("edit-")]
    assert lines == [("edit-one", "applied"), ("edit-two", "applied"), ("edit-poison", "failed"),
                     ("edit-poison", "error:apply_failed")]


def test_a_run_applies_its_events_in_order_with_one_claim(settings):
    instance, store, raw = imported()
    for n in range(5):
        _edit(instance, store, raw, f"v{n}")
        _queue(instance, store, raw, f"comment-{n}", comment=store.add_comment(raw["id"], f"comment {n}"))
    settings.CONNECTORS = {**settings.CONNECTORS, "APPLY_BATCH_SIZE": 4}
    with CaptureQueriesContext(connection) as ctx:
        counts = inbound.task_events_process(instance_id=instance.pk, external_task_id=raw["id"])
    assert counts["applied"] == 10
    assert _claims(ctx) == 3  # runs of 4, 4 and 2 (the last took the whole queue: a look ends it, no claim)
    events = list(InboundEvent.objects.filter(instance=instance).order_by("id"))
    assert all(e.status == EventStatus.APPLIED and e.attempts == 1 for e in events)
    applied_at = [e.applied_at for e in events]
    assert applied_at == sorted(applied_at) and len(set(applied_at)) == len(applied_at)
    link = TaskLink.objects.select_related("issue").get(instance=instance)
    assert link.issue.title == "v4"
    assert [c.body.rsplit("\n", 1)[-1] for c in Comment.objects.filter(issue=link.issue).order_by("created_at")] == [
        f"comment {n}" for n in range(5)]


def test_an_import_commits_before_the_rest_of_its_tasks_queue():
    """The import took the company's issue counter: holding it through the task's other events
    would make every other import of the company wait for them."""
    instance, store, raw = queued_import()
    _edit(instance, store, raw, "edited")
    _queue(instance, store, raw, "comment", comment=store.add_comment(raw["id"], "hello"))
    with CaptureQueriesContext(connection) as ctx:
        counts = inbound.task_events_process(instance_id=instance.pk, external_task_id=raw["id"])
    assert counts["applied"] == 3
    assert _claims(ctx) == 2  # the import alone, then the edit and the comment (the whole queue: a look ends it)
    assert not InboundEvent.objects.exclude(status=EventStatus.APPLIED).exists()



def test_a_comment_that_imports_its_task_commits_before_the_rest_of_its_tasks_queue():
    """A comment on a task not imported yet imports it first, so it holds the company's issue
    counter as an import does: the run ends with it."""
    instance, store, raw = queued_import()
    InboundEvent.objects.filter(instance=instance).delete()  # the task arrives by its first comment
    _queue(instance, store, raw, "comment-first", comment=store.add_comment(raw["id"], "first"))
    _edit(instance, store, raw, "edited")
    _queue(instance, store, raw, "comment-second", comment=store.add_comment(raw["id"], "second"))
    with CaptureQueriesContext(connection) as ctx:
        counts = inbound.task_events_process(instance_id=instance.pk, external_task_id=raw["id"])
    assert counts["applied"] == 3
    assert _claims(ctx) == 2  # the comment with its import alone, then the edit and the second comment
    link = TaskLink.objects.select_related("issue").get(instance=instance)
    assert link.issue.title == "edited"
    assert [c.body.rsplit("\n", 1)[-1] for c in Comment.objects.filter(issue=link.issue).order_by("created_at")] == [
        "first", "second"]

def test_a_paused_instance_applies_nothing_of_a_run():
    instance, store, raw = imported()
    for title in ("one", "two"):
        _edit(instance, store, raw, title)
    instance.status = "paused"
    instance.save(update_fields=["status"])
    assert inbound.task_events_process(instance_id=instance.pk, external_task_id=raw["id"]) == {
        "applied": 0, "dropped": 0, "failed": 0, "parked": 0}
    assert InboundEvent.objects.filter(instance=instance, status=EventStatus.PENDING).count() == 2


def test_a_runs_audit_rows_are_written_together_in_the_order_they_happened():
    """The run's audit rows are one INSERT at its end; each keeps the time it was recorded, so the
    activity feed (newest first) reads as things happened, between rows written at once (a comment's
    wake joins its run in one statement that writes its own row)."""
    instance, store, raw = imported()
    _edit(instance, store, raw, "renamed")
    _queue(instance, store, raw, "comment", comment=store.add_comment(raw["id"], "hello"))
    link = TaskLink.objects.get(instance=instance)
    seen = set(ActivityLog.objects.values_list("pk", flat=True))
    with CaptureQueriesContext(connection) as ctx:
        assert inbound.task_events_process(instance_id=instance.pk, external_task_id=raw["id"])["applied"] == 2
    inserts = [q["sql"] for q in ctx.captured_queries if 'INSERT INTO "issues_activitylog"' in q["sql"]]
    new = list(ActivityLog.objects.exclude(pk__in=seen).filter(company_id=link.company_id))  # newest first
    actions = [row.action for row in reversed(new)]
    assert actions == ["issue.updated", "comment.created", "agent.wakeup_requested"]
    assert all(row.details.get("eventKey") for row in new)  # each still names the event that caused it
    # PostgreSQL: the batch, and the wake's own statement (its fast path); SQLite: the batch alone.
    assert len(inserts) == (2 if connection.vendor == "postgresql" else 1), inserts


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a held queue head needs PostgreSQL row locks")
def test_a_kick_that_finds_the_head_held_is_applied_by_its_holder(monkeypatch):
    """A worker whose claim finds the task's head locked leaves the queue to the holder at once, so
    the holder claims once more after its run: an event stored meanwhile (its kick met the held head)
    is applied by it, not left to the sweep."""
    instance, store, raw = imported()
    _edit(instance, store, raw, "first")
    inside, release = threading.Event(), threading.Event()
    real = apply_tasks.link_apply_task

    def held_apply(*args, **kwargs):  # the holder is mid-run, its claim's row locks held
        inside.set()
        assert release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(apply_tasks, "link_apply_task", held_apply)
    counts, errors = {}, []

    def holder():
        try:
            counts.update(inbound.task_events_process(instance_id=instance.pk, external_task_id=raw["id"]))
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert inside.wait(30)
        monkeypatch.setattr(apply_tasks, "link_apply_task", real)
        _edit(instance, store, raw, "second")  # stored (and committed) while the head is held
        kicked = inbound.task_events_process(instance_id=instance.pk, external_task_id=raw["id"])
        assert kicked["applied"] == 0  # the head is held: the kick's worker leaves the queue to its holder
    finally:
        release.set()
        thread.join(60)
    assert not thread.is_alive() and not errors, errors
    assert counts["applied"] == 2  # its run, then the event stored meanwhile
    assert not InboundEvent.objects.filter(instance=instance).exclude(status=EventStatus.APPLIED).exists()
    assert TaskLink.objects.select_related("issue").get(instance=instance).issue.title == "second"


def test_a_run_writes_the_links_last_inbound_at_once(settings):
    """A tracker comment moves the link's ``lastInboundAt``; in a run where an earlier event wrote it
    already (an edit, or a comment before it), the comment leaves the link's row alone: that value
    is milliseconds old and commits with it."""
    instance, store, raw = imported()
    settings.CONNECTORS = {**settings.CONNECTORS, "APPLY_BATCH_SIZE": 8}
    link = TaskLink.objects.get(instance=instance)
    _queue(instance, store, raw, "comment-alone", comment=store.add_comment(raw["id"], "alone"))
    with CaptureQueriesContext(connection) as ctx:
        assert inbound.task_events_process(instance_id=instance.pk, external_task_id=raw["id"])["applied"] == 1
    assert _link_touches(ctx) == 1
    alone = TaskLink.objects.get(pk=link.pk).last_inbound_at
    assert alone is not None

    _edit(instance, store, raw, "edited")
    for n in range(2):
        _queue(instance, store, raw, f"comment-{n}", comment=store.add_comment(raw["id"], f"burst {n}"))
    with CaptureQueriesContext(connection) as ctx:
        assert inbound.task_events_process(instance_id=instance.pk, external_task_id=raw["id"])["applied"] == 3
    assert _link_touches(ctx) == 1  # the edit's write of the link; the comments after it add none
    assert TaskLink.objects.get(pk=link.pk).last_inbound_at > alone
    assert [c.body.rsplit("\n", 1)[-1] for c in Comment.objects.filter(issue_id=link.issue_id)
            .order_by("created_at")] == ["alone", "burst 0", "burst 1"]

    for n in range(2):  # comments alone in their run: the first writes it, the second does not
        _queue(instance, store, raw, f"more-{n}", comment=store.add_comment(raw["id"], f"more {n}"))
    with CaptureQueriesContext(connection) as ctx:
        assert inbound.task_events_process(instance_id=instance.pk, external_task_id=raw["id"])["applied"] == 2
    assert _link_touches(ctx) == 1


def _link_touches(ctx):
    return len([q for q in ctx.captured_queries if q["sql"].startswith("UPDATE") and "connectors_tasklink" in q["sql"]
                and "last_inbound_at" in q["sql"]])
