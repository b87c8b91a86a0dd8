"""Conflict resolution (§11.3) and field conflict detection (§11.1): each action applies the chosen
value to the losing side, advances the base so the same divergence is not detected again, audits
the actor and idempotency key and returns the link to healthy; optimistic concurrency (409)."""
import io
import threading

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, connections
from django.test import Client
from rest_framework.test import APIClient

from connectors.choices import ConflictKind, LinkStatus
from connectors.models import Conflict, OutboundEffect, TaskLink
from connectors.services.conflicts import conflict_resolve
from issues.actors import SYSTEM, Actor
from issues.exceptions import Conflict as ConflictError
from issues.exceptions import Forbidden, InvalidInput
from issues.models import ActivityLog
from issues.services.issues import issue_update
from tests.connector_factories import make_instance
from tests.connector_helpers import post_webhook
from tests.factories import AgentFactory, MembershipFactory


@pytest.fixture
def setup(company):
    triage = AgentFactory(company=company, name="triage-bot", status="idle")
    return make_instance(company, triage_agent_id=triage.pk)


def deliver(instance, store, task_id, capture):
    body, _ = store.delivery("task", task_id)
    return post_webhook(Client(), instance, body, capture=capture)


def diverge(setup, capture, field="title"):
    """A linked task whose title (or priority) changed on both sides since the base."""
    instance, store = setup
    raw = store.add_task(1, title="base title", body="base body")
    deliver(instance, store, raw["id"], capture)
    link = TaskLink.objects.get(instance=instance)
    issue_update(actor=SYSTEM, issue=link.issue, changes={"title": "paperclip title"})
    store.update(raw["id"], title="external title")
    deliver(instance, store, raw["id"], capture)
    conflict = Conflict.objects.get(link=link, status="open")
    return instance, store, raw, TaskLink.objects.get(pk=link.pk), conflict


@pytest.fixture
def operator(company):
    return MembershipFactory(company=company, role="operator").user


def test_both_sides_changed_is_one_conflict_even_on_redelivery(setup, django_capture_on_commit_callbacks):
    instance, store, raw, link, conflict = diverge(setup, django_capture_on_commit_callbacks)
    assert (conflict.kind, conflict.field) == (ConflictKind.FIELD, "title")
    assert (conflict.base_value, conflict.external_value, conflict.paperclip_value) == (
        "base title", "external title", "paperclip title")
    # the same external state delivered again (and a further edit) never duplicates the entry
    deliver(instance, store, raw["id"], django_capture_on_commit_callbacks)
    store.update(raw["id"], body="external body edit")
    deliver(instance, store, raw["id"], django_capture_on_commit_callbacks)
    assert Conflict.objects.filter(link=link).count() == 1
    link.refresh_from_db()
    # open conflicts never block other fields: the description still followed the tracker
    assert "external body edit" in link.issue.description and link.issue.title == "paperclip title"
    assert link.status == LinkStatus.CONFLICT


def test_keep_external_applies_the_tracker_value_and_advances_the_base(
        setup, operator, django_capture_on_commit_callbacks):
    instance, store, raw, link, conflict = diverge(setup, django_capture_on_commit_callbacks)
    row = conflict_resolve(actor=Actor(user=operator), conflict=conflict, action="keep_external",
                           idempotency_key="k-ext")
    assert (row.status, row.resolution, row.resolution_value) == ("resolved", "keep_external", "external title")
    link.refresh_from_db()
    assert link.issue.title == "external title"
    assert link.status == LinkStatus.HEALTHY
    assert link.base_snapshot["paperclip"]["title"] == "external title"
    assert link.base_snapshot["external"]["title"] == "external title"
    entry = ActivityLog.objects.get(action="connector.conflict_resolved")
    assert entry.actor_user == operator and entry.details["idempotencyKey"] == "k-ext"
    assert ActivityLog.objects.filter(action="issue.updated", actor_user=operator).exists()
    deliver(instance, store, raw["id"], django_capture_on_commit_callbacks)  # same divergence: not re-detected
    assert not Conflict.objects.filter(status="open").exists()


def test_keep_paperclip_keeps_the_issue_and_is_not_redetected(setup, operator, django_capture_on_commit_callbacks):
    instance, store, raw, link, conflict = diverge(setup, django_capture_on_commit_callbacks)
    conflict_resolve(actor=Actor(user=operator), conflict=conflict, action="keep_paperclip")
    link.refresh_from_db()
    assert link.issue.title == "paperclip title" and link.status == LinkStatus.HEALTHY
    assert link.base_snapshot["external"]["title"] == "external title"
    assert link.base_snapshot["paperclip"]["title"] == "paperclip title"
    # import_only link: the tracker is never written
    assert not OutboundEffect.objects.filter(link=link, source_id__startswith="conflict:").exists()
    deliver(instance, store, raw["id"], django_capture_on_commit_callbacks)
    assert not Conflict.objects.filter(status="open").exists()
    # a later, different external edit is a new one-sided change again (owner: external) -> propagates
    store.update(raw["id"], title="external title 2")
    deliver(instance, store, raw["id"], django_capture_on_commit_callbacks)
    link.refresh_from_db()
    assert link.issue.title == "external title 2" and not Conflict.objects.filter(status="open").exists()


def test_keep_paperclip_on_a_bidirectional_link_queues_the_external_write(
        setup, operator, django_capture_on_commit_callbacks):
    instance, store, raw, link, conflict = diverge(setup, django_capture_on_commit_callbacks)
    TaskLink.objects.filter(pk=link.pk).update(sync_mode="bidirectional")
    from connectors.providers.base import _REGISTRY

    adapter = _REGISTRY[instance.provider_key]
    ops = adapter.capabilities.operations
    object.__setattr__(adapter.capabilities, "operations", ops | {"set_fields"})
    try:
        conflict_resolve(actor=Actor(user=operator), conflict=conflict, action="keep_paperclip")
    finally:
        object.__setattr__(adapter.capabilities, "operations", ops)
    effect = OutboundEffect.objects.get(link=link, source_id=f"conflict:{conflict.pk}")
    assert (effect.kind, effect.payload["fields"]) == ("fields", {"title": "paperclip title"})


def test_merge_manual_needs_a_value_and_writes_it(setup, operator, django_capture_on_commit_callbacks):
    instance, store, raw, link, conflict = diverge(setup, django_capture_on_commit_callbacks)
    with pytest.raises(InvalidInput) as exc:
        conflict_resolve(actor=Actor(user=operator), conflict=conflict, action="merge_manual")
    assert "mergedValue" in exc.value.details
    with pytest.raises(InvalidInput):
        conflict_resolve(actor=Actor(user=operator), conflict=conflict, action="shrug")
    conflict_resolve(actor=Actor(user=operator), conflict=conflict, action="merge_manual",
                     merged_value="merged title")
    link.refresh_from_db()
    assert link.issue.title == "merged title" and link.base_snapshot["paperclip"]["title"] == "merged title"
    assert link.status == LinkStatus.HEALTHY


def test_dismiss_and_unlink(setup, operator, django_capture_on_commit_callbacks):
    instance, store, raw, link, conflict = diverge(setup, django_capture_on_commit_callbacks)
    row = conflict_resolve(actor=Actor(user=operator), conflict=conflict, action="dismiss")
    assert row.status == "dismissed"
    deliver(instance, store, raw["id"], django_capture_on_commit_callbacks)
    assert not Conflict.objects.filter(status="open").exists()
    link.refresh_from_db()
    assert link.issue.title == "paperclip title" and link.status == LinkStatus.HEALTHY
    issue_update(actor=SYSTEM, issue=link.issue, changes={"title": "paperclip again"})
    store.update(raw["id"], title="external again")
    deliver(instance, store, raw["id"], django_capture_on_commit_callbacks)
    second = Conflict.objects.get(status="open")
    conflict_resolve(actor=Actor(user=operator), conflict=second, action="unlink")
    link.refresh_from_db()
    assert link.status == LinkStatus.UNLINKED and link.issue.title == "paperclip again"


def test_a_resolved_conflict_is_409_unless_it_is_the_same_request(setup, operator, django_capture_on_commit_callbacks):
    instance, store, raw, link, conflict = diverge(setup, django_capture_on_commit_callbacks)
    actor = Actor(user=operator)
    conflict_resolve(actor=actor, conflict=conflict, action="keep_external", idempotency_key="once")
    again = conflict_resolve(actor=actor, conflict=conflict, action="keep_external", idempotency_key="once")
    assert again.resolution == "keep_external"
    with pytest.raises(ConflictError) as exc:
        conflict_resolve(actor=actor, conflict=conflict, action="keep_paperclip", idempotency_key="other")
    assert exc.value.code == "conflict_not_open" and exc.value.status_code == 409
    assert ActivityLog.objects.filter(action="connector.conflict_resolved").count() == 1


def test_viewers_and_agents_cannot_resolve(setup, company, django_capture_on_commit_callbacks):
    *_, conflict = diverge(setup, django_capture_on_commit_callbacks)
    viewer = MembershipFactory(company=company, role="viewer").user
    with pytest.raises(Forbidden):
        conflict_resolve(actor=Actor(user=viewer), conflict=conflict, action="dismiss")
    with pytest.raises(Forbidden):
        conflict_resolve(actor=Actor(agent=AgentFactory(company=company)), conflict=conflict, action="dismiss")
    conflict.refresh_from_db()
    assert conflict.status == "open"


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif("sqlite" in connection.vendor, reason="row locks need PostgreSQL")
def test_two_operators_resolving_at_once_one_wins_one_gets_409(setup, operator):

    instance, store = setup
    raw = store.add_task(1, title="base title")
    body, _ = store.delivery("task", raw["id"])
    from connectors.services import inbound

    def apply_all():
        inbound.task_events_process(instance_id=instance.pk, external_task_id=raw["id"])

    post_webhook(Client(), instance, body)
    apply_all()
    link = TaskLink.objects.get(instance=instance)
    issue_update(actor=SYSTEM, issue=link.issue, changes={"title": "paperclip title"})
    store.update(raw["id"], title="external title")
    body, _ = store.delivery("task", raw["id"])
    post_webhook(Client(), instance, body)
    apply_all()
    conflict = Conflict.objects.get(status="open")
    barrier, results = threading.Barrier(2), []

    def resolve(action):
        try:
            barrier.wait()
            conflict_resolve(actor=Actor(user=operator), conflict=conflict, action=action)
            results.append("ok")
        except ConflictError as exc:
            results.append(exc.code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=resolve, args=(a,)) for a in ("keep_external", "keep_paperclip")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["conflict_not_open", "ok"]
    assert ActivityLog.objects.filter(action="connector.conflict_resolved").count() == 1


# --- API -------------------------------------------------------------------------------------------


def test_api_get_and_resolve(setup, operator, django_capture_on_commit_callbacks):
    *_, link, conflict = diverge(setup, django_capture_on_commit_callbacks)
    c = APIClient()
    c.force_login(operator)
    got = c.get(f"/api/connector-conflicts/{conflict.pk}")
    assert got.status_code == 200 and got.json()["externalValue"] == "external title"
    bad = c.post(f"/api/connector-conflicts/{conflict.pk}/resolve", {"action": "merge_manual"}, format="json")
    assert bad.status_code == 400 and "mergedValue" in bad.json()["details"]
    bad = c.post(f"/api/connector-conflicts/{conflict.pk}/resolve", {"action": "nope"}, format="json")
    assert bad.status_code == 400 and "action" in bad.json()["details"]
    bad = c.post(f"/api/connector-conflicts/{conflict.pk}/resolve", {"action": "dismiss", "x": 1}, format="json")
    assert bad.status_code == 400
    ok = c.post(f"/api/connector-conflicts/{conflict.pk}/resolve",
                {"action": "merge_manual", "mergedValue": "both", "idempotencyKey": "api-1"}, format="json")
    assert ok.status_code == 200, ok.content
    assert ok.json()["status"] == "resolved" and ok.json()["linkStatus"] == "healthy"
    assert ok.json()["resolutionValue"] == "both"
    repeat = c.post(f"/api/connector-conflicts/{conflict.pk}/resolve",
                    {"action": "merge_manual", "mergedValue": "both", "idempotencyKey": "api-1"}, format="json")
    assert repeat.status_code == 200
    late = c.post(f"/api/connector-conflicts/{conflict.pk}/resolve", {"action": "dismiss"}, format="json")
    assert late.status_code == 409 and late.json()["code"] == "conflict_not_open"


# --- management command ----------------------------------------------------------------------------


def test_management_command(setup, operator, django_capture_on_commit_callbacks):
    *_, link, conflict = diverge(setup, django_capture_on_commit_callbacks)
    with pytest.raises(CommandError, match="merged-value is required"):
        call_command("connector_resolve_conflict", str(conflict.pk), "--action", "merge_manual")
    with pytest.raises(CommandError, match="not valid JSON"):
        call_command("connector_resolve_conflict", str(conflict.pk), "--action", "merge_manual",
                     "--merged-value", "{oops")
    with pytest.raises(CommandError, match="No conflict"):
        call_command("connector_resolve_conflict", "not-an-id", "--action", "dismiss")
    with pytest.raises(CommandError, match="No user"):
        call_command("connector_resolve_conflict", str(conflict.pk), "--action", "dismiss", "--user", "ghost")
    with pytest.raises(CommandError):
        call_command("connector_resolve_conflict", str(conflict.pk), "--action", "explode")
    out = io.StringIO()
    call_command("connector_resolve_conflict", str(conflict.pk), "--action", "merge_manual",
                 "--merged-value", '"cli title"', "--user", operator.username, stdout=out)
    assert "resolved (merge_manual); link healthy" in out.getvalue()
    link.refresh_from_db()
    assert link.issue.title == "cli title"
    with pytest.raises(CommandError, match="no longer open"):
        call_command("connector_resolve_conflict", str(conflict.pk), "--action", "dismiss")


def test_external_change_to_a_paperclip_owned_field_is_a_policy_conflict(
        setup, operator, django_capture_on_commit_callbacks):
    instance, store = setup
    raw = store.add_task(1, title="base title", labels=["a"])
    deliver(instance, store, raw["id"], django_capture_on_commit_callbacks)
    link = TaskLink.objects.get(instance=instance)
    TaskLink.objects.filter(pk=link.pk).update(field_policy={**link.field_policy, "title": "paperclip"})
    store.update(raw["id"], title="tracker rename", labels=["a", "b"])
    deliver(instance, store, raw["id"], django_capture_on_commit_callbacks)
    deliver(instance, store, raw["id"], django_capture_on_commit_callbacks)
    link.refresh_from_db()
    conflict = Conflict.objects.get(link=link)
    assert (conflict.kind, conflict.field, conflict.external_value) == ("policy", "title", "tracker rename")
    assert link.issue.title == "base title"
    # labels (owner external) moved on; the held title base did not
    assert link.base_snapshot["external"]["labels"] == ["a", "b"]
    assert link.base_snapshot["external"]["title"] == "base title"
    # a further tracker edit refreshes the one open entry instead of adding one
    store.update(raw["id"], title="tracker rename 2")
    deliver(instance, store, raw["id"], django_capture_on_commit_callbacks)
    conflict.refresh_from_db()
    assert Conflict.objects.filter(link=link).count() == 1 and conflict.external_value == "tracker rename 2"
    conflict_resolve(actor=Actor(user=operator), conflict=conflict, action="keep_external")
    link.refresh_from_db()
    assert link.issue.title == "tracker rename 2" and link.status == LinkStatus.HEALTHY
    deliver(instance, store, raw["id"], django_capture_on_commit_callbacks)
    assert not Conflict.objects.filter(status="open").exists()


def test_priority_three_way(setup, operator, django_capture_on_commit_callbacks):
    """Priority: tracker-only change propagates; both sides -> one conflict; keep_external maps 0-4."""
    import dataclasses

    from connectors.providers.base import EventKind, VerifiedEvent
    from connectors.services.common import adapter_for
    from connectors.services.inbound import event_store, task_events_process

    instance, store = setup
    raw = store.add_task(1, title="t")
    deliver(instance, store, raw["id"], django_capture_on_commit_callbacks)
    link = TaskLink.objects.get(instance=instance)
    adapter = adapter_for(instance)

    def send(priority, n):
        store.update(raw["id"])
        task = dataclasses.replace(adapter.normalize(store.tasks[raw["id"]]), priority=priority)
        event_store(instance=instance, event=VerifiedEvent(event_id=f"prio-{n}", kind=EventKind.TASK_UPSERTED,
                                                           action="edited", external_task_id=raw["id"], task=task))
        task_events_process(instance_id=instance.pk, external_task_id=raw["id"])
        link.refresh_from_db()

    send(1, 1)
    assert link.issue.priority == "high" and not Conflict.objects.exists()
    issue_update(actor=SYSTEM, issue=link.issue, changes={"priority": "low"})
    send(0, 2)
    send(0, 3)
    conflict = Conflict.objects.get(link=link)
    assert (conflict.field, conflict.base_value, conflict.external_value, conflict.paperclip_value) == (
        "priority", 1, 0, "low")
    assert link.issue.priority == "low"
    conflict_resolve(actor=Actor(user=operator), conflict=conflict, action="keep_external")
    link.refresh_from_db()
    assert link.issue.priority == "critical" and link.base_snapshot["external"]["priority"] == 0
    send(0, 4)
    assert not Conflict.objects.filter(status="open").exists()
