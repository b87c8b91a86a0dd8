"""Reopen of a closed task (§9 / §6.4): a follow-up issue with a stable idempotency key and the same
link retargeted in one update with ``handoffHistory``. A worker that dies anywhere along the way
leaves a consistent link: before the retarget (nothing half-done is kept), after the retarget but
before commit (all rolled back), or after commit (the redelivery and the re-run change nothing)."""
from datetime import timedelta

import pytest
import time_machine
from django.test import Client

from connectors import tasks
from connectors.choices import EventStatus
from connectors.models import InboundEvent, TaskLink
from connectors.services import apply_tasks
from issues.models import ActivityLog, Issue
from tests.connector_factories import make_instance
from tests.connector_helpers import post_webhook
from tests.factories import AgentFactory


class WorkerDied(Exception):
    """Stands in for the process dying mid-transaction: the transaction never commits."""


@pytest.fixture
def closed(company, django_capture_on_commit_callbacks):
    """A linked task that was closed on both sides: the next 'reopen' event makes a follow-up."""
    triage = AgentFactory(company=company, name="triage-bot", status="idle")
    instance, store = make_instance(company, triage_agent_id=triage.pk)
    web = Client()
    raw = store.add_task(1, state="doing")
    deliver(web, instance, store, raw["id"], django_capture_on_commit_callbacks)
    first = TaskLink.objects.get().issue
    Issue.objects.filter(pk=first.pk).update(status="done")
    store.update(raw["id"], state="done")
    deliver(web, instance, store, raw["id"], django_capture_on_commit_callbacks)
    store.update(raw["id"], state="doing")
    return web, instance, store, raw, first


def deliver(web, instance, store, task_id, capture, delivery_id=None):
    body, _ = store.delivery("task", task_id, delivery_id=delivery_id)
    return post_webhook(web, instance, body, capture=capture)


def follow_ups(first):
    return Issue.objects.filter(company_id=first.company_id, origin_kind="connector").exclude(pk=first.pk)


def assert_retargeted_once(first):
    link = TaskLink.objects.get()
    assert follow_ups(first).count() == 1
    follow_up = follow_ups(first).get()
    assert link.issue_id == follow_up.pk
    assert [h["issueId"] for h in link.handoff_history] == [str(first.pk)]
    assert link.handoff_history[0]["cause"] == "external reopen"
    assert Issue.objects.get(pk=first.pk).status == "done"  # the closed issue is never reopened
    assert ActivityLog.objects.filter(action="connector.link_retargeted", entity_id=str(link.pk)).count() == 1
    return link, follow_up


def assert_untouched(first):
    link = TaskLink.objects.get()
    assert link.issue_id == first.pk and link.handoff_history == []
    assert not follow_ups(first).exists()
    assert not ActivityLog.objects.filter(action="connector.link_retargeted").exists()


def crash_once(monkeypatch, name, *, after: bool):
    """Make ``apply_tasks.<name>`` die once, before or after doing its work."""
    real = getattr(apply_tasks, name)
    state = {"armed": True}

    def dying(*args, **kwargs):
        if state["armed"] and not after:
            state["armed"] = False
            raise WorkerDied(f"died before {name}")
        result = real(*args, **kwargs)
        if state["armed"] and after:
            state["armed"] = False
            raise WorkerDied(f"died after {name}")
        return result

    monkeypatch.setattr(apply_tasks, name, dying)


def retry_failed_head():
    event = InboundEvent.objects.filter(status=EventStatus.FAILED).get()
    with time_machine.travel(event.next_attempt_at + timedelta(seconds=1), tick=False):  # its backoff has passed
        tasks.sweep()
    event.refresh_from_db()
    return event


def test_crash_after_the_follow_up_is_created_but_before_the_retarget(
        closed, monkeypatch, django_capture_on_commit_callbacks):
    web, instance, store, raw, first = closed
    crash_once(monkeypatch, "issue_create", after=True)  # the follow-up row exists, the link not yet moved
    deliver(web, instance, store, raw["id"], django_capture_on_commit_callbacks)
    assert InboundEvent.objects.filter(status=EventStatus.FAILED).count() == 1
    assert_untouched(first)  # the half-made follow-up died with the transaction
    assert retry_failed_head().status == EventStatus.APPLIED
    assert_retargeted_once(first)


def test_crash_after_the_retarget_before_commit(closed, monkeypatch, django_capture_on_commit_callbacks):
    web, instance, store, raw, first = closed
    real = apply_tasks.link_audit
    state = {"armed": True}

    def dies_after_retarget(link, action, key, details):
        real(link, action, key, details)
        if action == "connector.link_retargeted" and state["armed"]:
            state["armed"] = False  # the link row now points at the follow-up: die before commit
            assert TaskLink.objects.get().issue_id != first.pk
            raise WorkerDied("died after the retarget")

    monkeypatch.setattr(apply_tasks, "link_audit", dies_after_retarget)
    deliver(web, instance, store, raw["id"], django_capture_on_commit_callbacks)
    assert InboundEvent.objects.filter(status=EventStatus.FAILED).count() == 1
    assert_untouched(first)
    assert retry_failed_head().status == EventStatus.APPLIED
    assert_retargeted_once(first)


def test_crash_after_commit_redelivery_and_rerun_change_nothing(closed, django_capture_on_commit_callbacks):
    web, instance, store, raw, first = closed
    body, delivery_id = store.delivery("task", raw["id"])
    post_webhook(web, instance, body, capture=django_capture_on_commit_callbacks)
    link, follow_up = assert_retargeted_once(first)
    # the worker died before acknowledging: the same delivery comes again, the task is run again,
    # and the tracker sends the same state in a fresh delivery
    assert post_webhook(web, instance, body, capture=django_capture_on_commit_callbacks).json()["duplicate"] is True
    tasks.process_task_events(str(instance.pk), raw["id"])
    deliver(web, instance, store, raw["id"], django_capture_on_commit_callbacks)
    tasks.sweep()
    assert_retargeted_once(first)
    assert TaskLink.objects.get().issue_id == follow_up.pk


def test_a_follow_up_left_by_an_interrupted_older_path_is_reused_not_duplicated(
        closed, django_capture_on_commit_callbacks):
    """The follow-up's origin id is its idempotency key: if one exists without the retarget, it is adopted."""
    from connectors.services import content
    from issues.actors import SYSTEM
    from issues.services.issues import issue_create

    web, instance, store, raw, first = closed
    orphan, _ = issue_create(actor=SYSTEM, company=instance.company, title="orphan follow-up",
                             origin_kind="connector",
                             origin_id=f"{content.attribution_key(instance.pk, raw['id'])}:reopen:1")
    deliver(web, instance, store, raw["id"], django_capture_on_commit_callbacks)
    link, follow_up = assert_retargeted_once(first)
    assert follow_up.pk == orphan.pk
