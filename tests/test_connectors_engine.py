"""Connector engine (External Task Protocol layers 1-2) against a fake tracker adapter: webhook
intake, idempotent per-task apply, retries and parking, import, routing, comments, commands,
deletion/closure conflicts, polling with transactional cursors and windowed reconciliation."""
import pytest
from django.test import Client

from connectors.choices import ConflictKind, EventStatus, LinkStatus, OutboundKind, RoutingRuleKind, SyncMode
from connectors.models import (
    Conflict,
    ConnectorInstance,
    InboundEvent,
    LinkTransition,
    OutboundEffect,
    SyncCursor,
    SyncError,
    TaskLink,
)
from connectors.selectors import instance_health
from connectors.services import apply_tasks, inbound, interventions, polling
from issues.actors import SYSTEM
from issues.models import ActivityLog, Comment, Issue, WakeupRequest
from tests.connector_factories import make_instance
from tests.connector_helpers import post_webhook
from tests.factories import AgentFactory
from tests.test_errors import error_of


@pytest.fixture
def web():
    return Client()


@pytest.fixture
def triage(company):
    return AgentFactory(company=company, name="triage-bot", status="idle")


@pytest.fixture
def setup(company, triage):
    instance, store = make_instance(company, triage_agent_id=triage.pk)
    return instance, store


def deliver(web, instance, store, kind, task_id, capture, **kw):
    body, _ = store.delivery(kind, task_id, **kw)
    return post_webhook(web, instance, body, capture=capture)


# --- intake ------------------------------------------------------------------------------------


def test_opened_task_becomes_one_issue_with_attribution_link_and_triage(
        web, setup, triage, django_capture_on_commit_callbacks):
    instance, store = setup
    task = store.add_task(7, title="Fix the <b>login</b>", body="Steps: ping @bob\n<script>alert(1)</script>")
    response = deliver(web, instance, store, "task", task["id"], django_capture_on_commit_callbacks)
    assert response.status_code == 202
    assert response.json()["duplicate"] is False
    link = TaskLink.objects.get(instance=instance, external_task_id=task["id"])
    issue = link.issue
    assert issue.origin_kind == "connector"
    assert issue.title == "Fix the <b>login</b>"
    assert "acme/tracker#7" in issue.description and "https://tracker.example/acme/tracker/7" in issue.description
    assert "untrusted" in issue.description
    assert "<script>" not in issue.description and "@\u200bbob" in issue.description
    assert issue.assignee_agent == triage  # no rule: triage fallback
    assert issue.status == "backlog"  # "todo" maps to backlog
    assert link.status == LinkStatus.HEALTHY and link.origin_side == "external"
    # Import and first sync commit together: the link is born healthy, with one transition.
    assert [(t.from_status, t.to_status) for t in LinkTransition.objects.filter(link=link)] == [("", "healthy")]
    assert Comment.objects.filter(issue=issue, body__startswith="Unresolved routing").exists()
    event = InboundEvent.objects.get(instance=instance)
    assert event.status == EventStatus.APPLIED and event.verified
    assert ActivityLog.objects.filter(action="connector.task_imported", entity_id=str(link.pk)).exists()


def test_same_delivery_five_times_has_one_effect(web, setup, django_capture_on_commit_callbacks):
    instance, store = setup
    task = store.add_task(1)
    body, delivery_id = store.delivery("task", task["id"])
    answers = [post_webhook(web, instance, body, capture=django_capture_on_commit_callbacks) for _ in range(5)]
    assert [a.status_code for a in answers] == [202] * 5
    assert [a.json()["duplicate"] for a in answers] == [False, True, True, True, True]
    assert InboundEvent.objects.filter(instance=instance).count() == 1
    assert Issue.objects.filter(company=instance.company).count() == 1
    assert TaskLink.objects.filter(instance=instance).count() == 1
    comment = store.add_comment(task["id"], "hello there")
    body, _ = store.delivery("comment", task["id"], comment=comment)
    for _ in range(5):
        assert post_webhook(web, instance, body, capture=django_capture_on_commit_callbacks).status_code == 202
    issue = TaskLink.objects.get(instance=instance).issue
    assert Comment.objects.filter(issue=issue, provenance__externalCommentId=comment["id"]).count() == 1


def test_task_and_comment_events_of_a_task_an_operator_unlinked_import_nothing(
        web, setup, django_capture_on_commit_callbacks):
    """§6.4: after an unlink, neither the task's edits nor comments on it bring it back (either
    would otherwise import it as a task with no live link). A manual import does:
    tests/test_connectors_dedupe_backlinks.py."""
    instance, store = setup
    task = store.add_task(1)
    deliver(web, instance, store, "task", task["id"], django_capture_on_commit_callbacks)
    link = TaskLink.objects.get(instance=instance)
    interventions.link_unlink(actor=SYSTEM, link=link, idempotency_key="unlink-1")
    store.update(task["id"], title="edited after the unlink")
    deliver(web, instance, store, "task", task["id"], django_capture_on_commit_callbacks)
    comment = store.add_comment(task["id"], "a comment after the unlink")
    deliver(web, instance, store, "comment", task["id"], django_capture_on_commit_callbacks, comment=comment)
    later = list(InboundEvent.objects.filter(instance=instance).order_by("id")[1:])
    assert [(e.kind, e.status) for e in later] == [("task.upserted", EventStatus.DROPPED),
                                                  ("comment.upserted", EventStatus.DROPPED)]
    assert all("unlinked by an operator" in e.outcome for e in later)
    assert list(TaskLink.objects.filter(instance=instance).values_list("status", flat=True)) == [LinkStatus.UNLINKED]
    assert Issue.objects.filter(company=instance.company).count() == 1
    assert Issue.objects.get().title != "edited after the unlink"
    assert not Comment.objects.filter(provenance__externalCommentId=comment["id"]).exists()


@pytest.mark.parametrize("signature", ["missing", "forged", "wrong-secret"])
def test_bad_signatures_are_401_and_store_nothing_but_the_counter(web, setup, signature):
    instance, store = setup
    task = store.add_task(1)
    body, _ = store.delivery("task", task["id"])
    if signature == "missing":
        response = post_webhook(web, instance, body, secret=None)
    elif signature == "forged":
        response = post_webhook(web, instance, body, signature="0" * 64)
    else:
        response = post_webhook(web, instance, body, secret="not-the-secret")
    assert response.status_code == 401
    error_of(response)  # the one error shape
    assert not InboundEvent.objects.exists() and not Issue.objects.exists()
    instance.refresh_from_db()
    assert instance.webhook_rejected_count == 1 and instance.last_webhook_rejected_at is not None
    assert instance_health(instance)["webhookRejectedCount"] == 1


def test_payload_for_another_container_is_rejected(web, setup):
    instance, store = setup
    task = store.add_task(1)
    body, _ = store.delivery("task", task["id"], container="someone/else")
    assert post_webhook(web, instance, body).status_code == 401
    assert not InboundEvent.objects.exists()


def test_oversized_body_is_413_and_unparseable_is_parked(web, setup, settings):
    instance, store = setup
    settings.CONNECTORS = {**settings.CONNECTORS, "WEBHOOK_MAX_BODY_BYTES": 1000}
    big = b'{"type": "task", "pad": "' + b"x" * 2000 + b'"}'
    assert post_webhook(web, instance, big).status_code == 413
    assert not InboundEvent.objects.exists()
    # Verified but not a payload of this provider (§13.1.8): kept raw and parked, never applied
    # (tests/test_connectors_robustness.py covers the replay).
    response = post_webhook(web, instance, b"not json at all")
    assert response.status_code == 202 and response.json()["status"] == "parked"
    event = InboundEvent.objects.get()
    assert event.kind == "unparsed" and bytes(event.raw_body) == b"not json at all"


def test_unknown_instance_is_404_and_get_is_not_allowed(web, setup):
    import uuid

    assert web.post(f"/api/connectors/{uuid.uuid4()}/webhook", data=b"{}",
                    content_type="application/json").status_code == 404
    assert web.get(f"/api/connectors/{setup[0].pk}/webhook").status_code == 405


def test_paused_instance_stores_but_does_not_apply_until_resumed(web, setup, django_capture_on_commit_callbacks):
    from issues.actors import SYSTEM
    from connectors.services.interventions import instance_pause, instance_resume

    instance, store = setup
    instance_pause(actor=SYSTEM, instance=instance, idempotency_key="p1")
    task = store.add_task(1)
    assert deliver(web, instance, store, "task", task["id"], django_capture_on_commit_callbacks).status_code == 202
    assert InboundEvent.objects.get().status == EventStatus.PENDING
    assert not Issue.objects.exists()
    instance.refresh_from_db()
    assert instance_health(instance)["queueDepth"] == 1
    with django_capture_on_commit_callbacks(execute=True):
        instance_resume(actor=SYSTEM, instance=instance, idempotency_key="r1")
    assert InboundEvent.objects.get().status == EventStatus.APPLIED
    assert Issue.objects.count() == 1


# --- retries, parking, replay --------------------------------------------------------------------


def test_poison_event_is_parked_and_the_next_event_of_the_task_applies(
        web, setup, fast_retries, monkeypatch, django_capture_on_commit_callbacks):
    instance, store = setup
    task = store.add_task(1, title="first")
    deliver(web, instance, store, "task", task["id"], django_capture_on_commit_callbacks)
    link = TaskLink.objects.get()

    real = apply_tasks.link_apply_task
    calls = {"n": 0}

    def poisoned(**kw):
        if kw["task"].title == "poison":
            calls["n"] += 1
            raise RuntimeError("cannot apply this one")
        return real(**kw)

    monkeypatch.setattr(apply_tasks, "link_apply_task", poisoned)
    store.update(task["id"], title="poison")
    deliver(web, instance, store, "task", task["id"], django_capture_on_commit_callbacks)
    poison = InboundEvent.objects.order_by("-id").first()
    assert poison.status == EventStatus.PARKED and poison.attempts == 5 and calls["n"] == 5
    assert poison.error_category == "apply_failed"
    link.refresh_from_db()
    assert link.status == LinkStatus.ERROR
    health = instance_health(instance)
    assert health["parkedCount"] == 1 and health["errors"][0]["category"] == "event_parked"

    store.update(task["id"], title="after the poison")
    deliver(web, instance, store, "task", task["id"], django_capture_on_commit_callbacks)
    later = InboundEvent.objects.order_by("-id").first()
    assert later.status == EventStatus.APPLIED
    link.refresh_from_db()
    assert link.issue.title == "after the poison" and link.status == LinkStatus.HEALTHY

    # Replay of the parked event: it applies now, but an older snapshot never overwrites a newer one.
    monkeypatch.setattr(apply_tasks, "link_apply_task", real)
    from connectors.services.interventions import event_replay
    from issues.actors import SYSTEM

    with django_capture_on_commit_callbacks(execute=True):
        result = event_replay(actor=SYSTEM, event=poison, idempotency_key="replay-1")
    assert result["replayed"] is False
    poison.refresh_from_db()
    assert poison.status == EventStatus.DROPPED and "older" in poison.outcome
    assert Issue.objects.get(pk=link.issue_id).title == "after the poison"


def test_failure_is_retried_with_backoff_then_the_sweep_applies_it(web, setup, monkeypatch, settings,
                                                                   django_capture_on_commit_callbacks):
    import time_machine
    from datetime import timedelta

    from django.utils import timezone

    from connectors import tasks

    settings.CONNECTORS = {**settings.CONNECTORS, "RETRY_BASE_SECONDS": 30.0}
    instance, store = setup
    task = store.add_task(1)
    real = apply_tasks.task_import
    failures = {"n": 1}

    def flaky(**kw):
        if failures["n"]:
            failures["n"] -= 1
            raise ConnectionError("database hiccup")
        return real(**kw)

    monkeypatch.setattr(apply_tasks, "task_import", flaky)
    deliver(web, instance, store, "task", task["id"], django_capture_on_commit_callbacks)
    event = InboundEvent.objects.get()
    assert event.status == EventStatus.FAILED and event.attempts == 1 and event.next_attempt_at > timezone.now()
    health = instance_health(instance)
    assert health["retryCount"] == 1 and health["retries"][0]["nextAttemptAt"] == event.next_attempt_at
    tasks.sweep()  # not due yet (the sweep's poll queues its own observation behind the failed head)
    assert InboundEvent.objects.get(source="webhook").status == EventStatus.FAILED
    with time_machine.travel(timezone.now() + timedelta(seconds=60), tick=False):
        tasks.sweep()
    event.refresh_from_db()
    assert event.status == EventStatus.APPLIED and event.attempts == 2
    assert Issue.objects.count() == 1


def test_sweep_applies_pending_events_whose_kick_was_lost(setup, settings):
    """Restart recovery: a stored event with no kick (worker died) is applied by the sweep."""
    import time_machine
    from datetime import timedelta

    from django.utils import timezone

    from connectors import tasks
    from connectors.providers.base import EventKind, VerifiedEvent
    from tests.connector_fakes import FakeTrackerAdapter

    instance, store = setup
    raw = store.add_task(3)
    adapter = FakeTrackerAdapter(type("C", (), {"state_mapping": instance.state_mapping, "base_url": store.base_url,
                                                "service_account_id": None, "containers": (store.container,)})())
    inbound.event_store(instance=instance, event=VerifiedEvent(
        event_id="lost-kick", kind=EventKind.TASK_UPSERTED, action="task", external_task_id=raw["id"],
        task=adapter.normalize(raw)))
    ConnectorInstance.objects.filter(pk=instance.pk).update(last_poll_at=timezone.now() + timedelta(days=1),
                                                            last_reconcile_at=timezone.now() + timedelta(days=1))
    tasks.sweep()
    assert InboundEvent.objects.get().status == EventStatus.PENDING  # young: its kick may still come
    with time_machine.travel(timezone.now() + timedelta(seconds=120), tick=False):
        tasks.sweep()
    assert InboundEvent.objects.get().status == EventStatus.APPLIED
    assert Issue.objects.count() == 1


# --- import details: dedupe, state mapping, routing ---------------------------------------------


def test_unmapped_state_is_inert_backlog_and_reported(web, setup, django_capture_on_commit_callbacks):
    instance, store = setup
    task = store.add_task(1, state="weird-lane")
    deliver(web, instance, store, "task", task["id"], django_capture_on_commit_callbacks)
    assert TaskLink.objects.get().issue.status == "backlog"
    assert SyncError.objects.filter(category="state_unmapped", message__contains="weird-lane").count() == 1


def test_active_task_is_imported_as_todo_and_terminal_task_is_not_imported(
        web, setup, django_capture_on_commit_callbacks):
    instance, store = setup
    active = store.add_task(1, state="doing")
    done = store.add_task(2, state="done")
    deliver(web, instance, store, "task", active["id"], django_capture_on_commit_callbacks)
    deliver(web, instance, store, "task", done["id"], django_capture_on_commit_callbacks)
    assert TaskLink.objects.get().issue.status == "todo"
    assert InboundEvent.objects.get(external_task_id=done["id"]).status == EventStatus.DROPPED


def test_dedupe_links_an_issue_that_already_references_the_task(web, setup, django_capture_on_commit_callbacks):
    from tests.factories import IssueFactory

    instance, store = setup
    task = store.add_task(4)
    existing = IssueFactory(company=instance.company, description="see https://tracker.example/acme/tracker/4")
    deliver(web, instance, store, "task", task["id"], django_capture_on_commit_callbacks)
    assert Issue.objects.count() == 1
    assert TaskLink.objects.get().issue == existing


def test_dedupe_does_not_take_a_longer_address_for_the_tasks(web, setup, django_capture_on_commit_callbacks):
    """An issue that mentions task 41 (…/tracker/41) does not reference task 4 (…/tracker/4), though
    one address starts with the other; a mention followed by punctuation or a fragment still does."""
    from tests.factories import IssueFactory

    instance, store = setup

    def imported_issue(number):
        raw = store.add_task(number)
        deliver(web, instance, store, "task", raw["id"], django_capture_on_commit_callbacks)
        return TaskLink.objects.get(external_task_id=raw["id"]).issue

    elsewhere = IssueFactory(company=instance.company, description="follow-up of https://tracker.example/acme/tracker/41")
    four = imported_issue(4)
    assert four != elsewhere and four.origin_kind == "connector"
    mentioned = IssueFactory(company=instance.company,
                             description="Tracked in (https://tracker.example/acme/tracker/5#comment-2).")
    assert imported_issue(5) == mentioned
    assert imported_issue(41) == elsewhere


def test_routing_pipeline_order_and_validation(web, company, triage, django_capture_on_commit_callbacks):
    qa = AgentFactory(company=company, name="qa-bot")
    coder = AgentFactory(company=company, name="codexcoder")
    lead = AgentFactory(company=company, name="lead")
    sleepy = AgentFactory(company=company, name="sleepy", status="paused")
    rules = [
        {"kind": RoutingRuleKind.DEFAULT_ROUTE, "agentId": lead.pk},
        {"kind": RoutingRuleKind.USER_MAPPING, "match": {"login": "carol"}, "agentId": qa.pk},
        {"kind": RoutingRuleKind.STATE_LANE, "match": {"state": "review"}, "routingAlias": "qa"},
        {"kind": RoutingRuleKind.LABEL, "match": {"label": "pc:agent/*"}},
        {"kind": RoutingRuleKind.CUSTOM_FIELD, "match": {"field": "Paperclip Agent", "value": "sleep*"},
         "agentId": sleepy.pk},
    ]
    instance, store = make_instance(company, triage_agent_id=triage.pk, rules=rules,
                                    routing_aliases={"qa": str(qa.pk)})
    cases = [
        (store.add_task(1), lead),  # only default_route matches
        (store.add_task(2, assignees=["carol"]), qa),  # user_mapping beats default
        (store.add_task(3, state="review", assignees=["carol"]), qa),  # state_lane via alias
        (store.add_task(4, state="review", labels=["PC:Agent/CodexCoder"]), coder),  # label beats state_lane
        (store.add_task(5, labels=["pc:agent/codexcoder"], custom={"Paperclip Agent": "sleepy"}), triage),
        (store.add_task(6, labels=["pc:agent/nobody"]), triage),  # label names a missing agent
    ]
    for raw, _ in cases:
        deliver(web, instance, store, "task", raw["id"], django_capture_on_commit_callbacks)
    for raw, expected in cases:
        link = TaskLink.objects.get(external_task_id=raw["id"])
        assert link.issue.assignee_agent == expected, (raw["number"], link.routing)
    problems = list(SyncError.objects.filter(category="routing").values_list("message", flat=True))
    assert any("paused" in p for p in problems) and any("missing" in p for p in problems)


def test_relabel_reroutes_but_a_checked_out_issue_only_gets_a_handoff_request(
        web, company, triage, django_capture_on_commit_callbacks):
    from django.utils import timezone

    from tests.factories import RunFactory

    coder = AgentFactory(company=company, name="coder")
    qa = AgentFactory(company=company, name="qa")
    instance, store = make_instance(company, triage_agent_id=triage.pk,
                                    rules=[{"kind": "label", "match": {"label": "pc:agent/*"}}])
    raw = store.add_task(1, labels=["pc:agent/coder"])
    deliver(web, instance, store, "task", raw["id"], django_capture_on_commit_callbacks)
    issue = TaskLink.objects.get().issue
    assert issue.assignee_agent == coder
    store.update(raw["id"], labels=["pc:agent/qa"])
    deliver(web, instance, store, "task", raw["id"], django_capture_on_commit_callbacks)
    issue.refresh_from_db()
    assert issue.assignee_agent == qa
    run = RunFactory(agent=qa)
    Issue.objects.filter(pk=issue.pk).update(status="in_progress", checkout_run=run, execution_run=run,
                                             execution_locked_at=timezone.now())
    store.update(raw["id"], labels=["pc:agent/coder"])
    deliver(web, instance, store, "task", raw["id"], django_capture_on_commit_callbacks)
    issue.refresh_from_db()
    assert issue.assignee_agent == qa and issue.status == "in_progress"
    assert Comment.objects.filter(issue=issue, body__contains="handoff requested").exists()


# --- external edits, deletion, closure, reopen ---------------------------------------------------


def test_external_edit_updates_owned_fields_and_both_sides_changed_is_a_conflict(
        web, setup, django_capture_on_commit_callbacks):
    from issues.actors import SYSTEM
    from issues.services.issues import issue_update

    instance, store = setup
    raw = store.add_task(1, title="old title", body="old body")
    deliver(web, instance, store, "task", raw["id"], django_capture_on_commit_callbacks)
    store.update(raw["id"], title="new title")
    deliver(web, instance, store, "task", raw["id"], django_capture_on_commit_callbacks)
    link = TaskLink.objects.get()
    assert link.issue.title == "new title"
    issue_update(actor=SYSTEM, issue=link.issue, changes={"title": "paperclip title"})
    store.update(raw["id"], title="external title")
    deliver(web, instance, store, "task", raw["id"], django_capture_on_commit_callbacks)
    link.refresh_from_db()
    assert link.issue.title == "paperclip title"
    conflict = Conflict.objects.get(link=link)
    assert (conflict.kind, conflict.field, conflict.status) == ("field", "title", "open")
    assert conflict.external_value == "external title" and conflict.paperclip_value == "paperclip title"
    assert link.status == LinkStatus.CONFLICT


def test_external_deletion_makes_a_conflict_not_a_deleted_issue(web, setup, django_capture_on_commit_callbacks):
    instance, store = setup
    raw = store.add_task(1)
    deliver(web, instance, store, "task", raw["id"], django_capture_on_commit_callbacks)
    issue = TaskLink.objects.get().issue
    deliver(web, instance, store, "task_deleted", raw["id"], django_capture_on_commit_callbacks)
    deliver(web, instance, store, "task_deleted", raw["id"], django_capture_on_commit_callbacks)  # new delivery id
    issue.refresh_from_db()
    assert issue.status == "backlog" and issue.cancelled_at is None
    link = TaskLink.objects.get()
    assert link.status == LinkStatus.CONFLICT and link.status_detail == "external task deleted"
    assert Conflict.objects.filter(link=link, kind=ConflictKind.DELETION, status="open").count() == 1
    assert Comment.objects.filter(issue=issue, body__contains="was deleted").count() == 1
    assert instance_health(instance)["conflictCount"] == 1


def test_closure_while_work_is_active_is_a_conflict(web, setup, django_capture_on_commit_callbacks):
    instance, store = setup
    raw = store.add_task(1, state="doing")
    deliver(web, instance, store, "task", raw["id"], django_capture_on_commit_callbacks)
    issue = TaskLink.objects.get().issue
    Issue.objects.filter(pk=issue.pk).update(status="in_review")
    store.update(raw["id"], state="done")
    deliver(web, instance, store, "task", raw["id"], django_capture_on_commit_callbacks)
    issue.refresh_from_db()
    assert issue.status == "in_review"
    assert Conflict.objects.filter(kind=ConflictKind.CLOSURE, status="open").count() == 1
    assert TaskLink.objects.get().status == LinkStatus.CONFLICT


def test_reopen_of_a_done_issue_creates_a_follow_up_and_retargets_the_link(
        web, setup, django_capture_on_commit_callbacks):
    instance, store = setup
    raw = store.add_task(1, state="doing")
    deliver(web, instance, store, "task", raw["id"], django_capture_on_commit_callbacks)
    first = TaskLink.objects.get().issue
    store.update(raw["id"], state="done")
    deliver(web, instance, store, "task", raw["id"], django_capture_on_commit_callbacks)
    Issue.objects.filter(pk=first.pk).update(status="done")
    Conflict.objects.update(status="resolved")
    store.update(raw["id"], state="doing")
    deliver(web, instance, store, "task", raw["id"], django_capture_on_commit_callbacks)
    link = TaskLink.objects.get()
    assert link.issue_id != first.pk
    assert [h["issueId"] for h in link.handoff_history] == [str(first.pk)]
    assert Issue.objects.get(pk=first.pk).status == "done"


# --- comments and commands -----------------------------------------------------------------------


def test_comment_import_provenance_sanitizing_and_wake(web, company, django_capture_on_commit_callbacks):
    agent = AgentFactory(company=company, name="worker")
    instance, store = make_instance(company, rules=[{"kind": "default_route", "agentId": agent.pk}])
    raw = store.add_task(1, state="doing")
    deliver(web, instance, store, "task", raw["id"], django_capture_on_commit_callbacks)
    issue = TaskLink.objects.get().issue
    wakes_before = WakeupRequest.objects.filter(agent=agent).count()
    comment = store.add_comment(raw["id"], 'ping @worker <img src=x onerror="alert(1)"> ok', author="dave")
    deliver(web, instance, store, "comment", raw["id"], django_capture_on_commit_callbacks, comment=comment)
    imported = Comment.objects.get(issue=issue, provenance__externalCommentId=comment["id"])
    assert imported.author_type == "external"
    assert imported.provenance["untrusted"] is True and imported.provenance["actor"]["displayName"] == "dave"
    assert imported.provenance["url"] == f"https://tracker.example/c/{comment['id']}"
    assert "onerror" not in imported.body and "@\u200bworker" in imported.body and "dave" in imported.body
    assert WakeupRequest.objects.filter(agent=agent).count() == wakes_before + 1


def test_no_wake_when_wake_on_external_comment_is_off(web, company, django_capture_on_commit_callbacks):
    agent = AgentFactory(company=company, name="worker")
    instance, store = make_instance(company, rules=[{"kind": "default_route", "agentId": agent.pk}],
                                    wake_on_external_comment=False)
    raw = store.add_task(1, state="doing")
    deliver(web, instance, store, "task", raw["id"], django_capture_on_commit_callbacks)
    before = WakeupRequest.objects.filter(agent=agent).count()
    comment = store.add_comment(raw["id"], "fyi")
    deliver(web, instance, store, "comment", raw["id"], django_capture_on_commit_callbacks, comment=comment)
    assert Comment.objects.get(provenance__externalCommentId=comment["id"]).author_type == "external"
    assert WakeupRequest.objects.filter(agent=agent).count() == before


def test_own_and_marked_comments_are_dropped(web, setup, django_capture_on_commit_callbacks):
    instance, store = setup
    raw = store.add_task(1)
    deliver(web, instance, store, "task", raw["id"], django_capture_on_commit_callbacks)
    own = store.add_comment(raw["id"], "Progress: plan ready", author="paperclip-bot")
    marked = store.add_comment(raw["id"], "<!-- paperclip:mirror id=1 -->\nmirrored text", author="eve")
    for comment in (own, marked):
        deliver(web, instance, store, "comment", raw["id"], django_capture_on_commit_callbacks, comment=comment)
    events = InboundEvent.objects.filter(kind="comment.upserted").order_by("id")
    assert [e.status for e in events] == ["dropped", "dropped"]
    assert "echo" in events[0].outcome and "marker" in events[1].outcome
    assert not Comment.objects.filter(provenance__kind="external_comment").exists()


def test_comment_commands_reply_for_every_outcome(web, company, triage, django_capture_on_commit_callbacks):
    AgentFactory(company=company, name="qa")
    AgentFactory(company=company, name="napping", status="paused")
    instance, store = make_instance(company, triage_agent_id=triage.pk)
    raw = store.add_task(1, state="doing")
    deliver(web, instance, store, "task", raw["id"], django_capture_on_commit_callbacks)
    link = TaskLink.objects.get()
    body = ("please route\n/paperclip assign qa\n/paperclip assign ghost\n/paperclip assign napping\n"
            "/paperclip status\n/paperclip dance\n```\n/paperclip pause\n```\nnot /paperclip pause")
    comment = store.add_comment(raw["id"], body, author="frank")
    deliver(web, instance, store, "comment", raw["id"], django_capture_on_commit_callbacks, comment=comment)
    link.refresh_from_db()
    assert link.issue.assignee_agent.name == "qa"
    replies = list(Comment.objects.filter(issue=link.issue, provenance__kind="command_reply")
                   .order_by("created_at", "id").values_list("body", flat=True))
    assert len(replies) == 5
    assert "assigned to qa" in replies[0]
    assert "unknown agent 'ghost'" in replies[1]
    assert "is paused" in replies[2]
    assert "is todo, assigned to qa" in replies[3] or "assigned to qa" in replies[3]
    assert "unknown command 'dance'" in replies[4]
    assert link.status != LinkStatus.PAUSED  # fenced and mid-line commands are not commands
    audit = ActivityLog.objects.filter(action="connector.command", entity_id=str(link.pk))
    assert audit.count() == 5 and {a.details["externalActor"]["displayName"] for a in audit} == {"frank"}
    # A re-delivery of the same comment never runs the commands twice.
    body2, _ = store.delivery("comment", raw["id"], comment=comment)
    post_webhook(web, instance, body2, capture=django_capture_on_commit_callbacks)
    assert Comment.objects.filter(issue=link.issue, provenance__kind="command_reply").count() == 5


def test_command_replies_go_outbound_when_writes_are_allowed(web, company, triage,
                                                             django_capture_on_commit_callbacks):
    instance, store = make_instance(company, triage_agent_id=triage.pk, default_sync_mode=SyncMode.BIDIRECTIONAL)
    raw = store.add_task(1)
    deliver(web, instance, store, "task", raw["id"], django_capture_on_commit_callbacks)
    comment = store.add_comment(raw["id"], "/paperclip pause")
    deliver(web, instance, store, "comment", raw["id"], django_capture_on_commit_callbacks, comment=comment)
    link = TaskLink.objects.get()
    assert link.status == LinkStatus.PAUSED
    effects = OutboundEffect.objects.filter(link=link, kind=OutboundKind.COMMENT)
    assert {e.source_id.split(":")[0] for e in effects} == {"routing-unresolved", "command"}
    reply = effects.get(source_id__startswith="command:")
    assert reply.status == "pending" and reply.payload["body"].startswith("<!-- paperclip:")
    assert OutboundEffect.objects.filter(link=link, kind=OutboundKind.BACKLINK).count() == 1
    # While paused, task edits are not applied; /paperclip resume still works and resyncs.
    store.update(raw["id"], title="edited while paused")
    deliver(web, instance, store, "task", raw["id"], django_capture_on_commit_callbacks)
    assert TaskLink.objects.get().issue.title != "edited while paused"
    comment = store.add_comment(raw["id"], "/paperclip resume")
    deliver(web, instance, store, "comment", raw["id"], django_capture_on_commit_callbacks, comment=comment)
    link.refresh_from_db()
    assert link.status == LinkStatus.HEALTHY and link.issue.title == "edited while paused"


# --- polling and reconciliation ------------------------------------------------------------------


def test_poll_imports_pages_and_saves_the_cursor_with_the_page(setup, django_capture_on_commit_callbacks):
    instance, store = setup
    for n in range(5):
        store.add_task(n + 1)
    with django_capture_on_commit_callbacks(execute=True):
        result = polling.instance_poll(instance_id=instance.pk)
    assert result["tasks"] == 5 and result["pages"] >= 3
    assert TaskLink.objects.count() == 5
    cursor = SyncCursor.objects.get(instance=instance, scope=f"tasks:{store.container}")
    assert cursor.cursor
    with django_capture_on_commit_callbacks(execute=True):
        assert polling.instance_poll(instance_id=instance.pk)["tasks"] == 0  # nothing new after the cursor
    instance.refresh_from_db()
    assert instance.last_poll_at is not None


def test_crash_between_applying_a_page_and_saving_its_cursor_reapplies_idempotently(
        setup, monkeypatch, django_capture_on_commit_callbacks):
    instance, store = setup
    for n in range(4):
        store.add_task(n + 1)
    real = polling.cursor_save
    crashes = {"n": 1}

    def crash_once(*args, **kwargs):
        if crashes["n"]:
            crashes["n"] -= 1
            assert Issue.objects.count() == 2  # the page's effects exist inside the transaction
            raise RuntimeError("process killed before the cursor was saved")
        return real(*args, **kwargs)

    monkeypatch.setattr(polling, "cursor_save", crash_once)
    with pytest.raises(RuntimeError):
        polling.instance_poll(instance_id=instance.pk)
    assert Issue.objects.count() == 0 and not SyncCursor.objects.exists()  # rolled back together
    with django_capture_on_commit_callbacks(execute=True):
        polling.instance_poll(instance_id=instance.pk)
    assert Issue.objects.count() == 4 and TaskLink.objects.count() == 4
    # A cursor that lags behind (saved, then lost) re-lists and re-applies without duplicates.
    SyncCursor.objects.all().delete()
    with django_capture_on_commit_callbacks(execute=True):
        polling.instance_poll(instance_id=instance.pk)
    assert Issue.objects.count() == 4


def test_reconcile_detects_deletion_and_state_drift(setup, django_capture_on_commit_callbacks):
    instance, store = setup
    a, b, _ = store.add_task(1), store.add_task(2), store.add_task(3)
    with django_capture_on_commit_callbacks(execute=True):
        polling.instance_poll(instance_id=instance.pk)
    del store.tasks[a["id"]]  # deleted without a webhook
    store.update(b["id"], state="doing")  # moved without a webhook
    with django_capture_on_commit_callbacks(execute=True):
        result = polling.instance_reconcile(instance_id=instance.pk)
    assert result["links"] == 3 and result["deleted"] == 1 and result["diverged"] == 1
    assert Conflict.objects.filter(kind="deletion", link__external_task_id=a["id"]).exists()
    assert TaskLink.objects.get(external_task_id=b["id"]).external_state_category == "active"
    assert TaskLink.objects.filter(last_reconcile_at__isnull=False).count() == 3


@pytest.mark.django_db
def test_reconcile_of_10000_links_reads_only_its_window_with_batched_state_calls(setup):
    from django.utils import timezone

    from issues.models import Company

    instance, store = setup
    company = instance.company
    issues = [Issue(company=company, number=n, identifier=f"{company.issue_prefix}-{n}", title=f"t{n}")
              for n in range(1, 10_001)]
    Issue.objects.bulk_create(issues, batch_size=2000)
    Company.objects.filter(pk=company.pk).update(issue_counter=10_000)
    now = timezone.now()
    links = []
    for n, issue in enumerate(issues, start=1):
        task_id = str(100_000 + n)
        store.tasks[task_id] = {"id": task_id, "number": n, "title": "t", "body": "", "state": "todo",
                                "labels": [], "assignees": [], "custom": {}, "updated": "2026-01-01T00:00:00+00:00",
                                "container": store.container}
        links.append(TaskLink(company=company, instance=instance, provider_key=instance.provider_key, issue=issue,
                              external_task_id=task_id, external_key=f"{store.container}#{n}",
                              external_state_name="todo", external_state_category="backlog", status="healthy"))
    TaskLink.objects.bulk_create(links, batch_size=2000)
    ConnectorInstance.objects.filter(pk=instance.pk).update(reconcile_batch_size=250)
    seen = set()
    for tick in range(3):
        store.calls.clear()
        store.state_batches.clear()
        before = set(TaskLink.objects.filter(last_reconcile_at__gt=now).values_list("pk", flat=True))
        result = polling.instance_reconcile(instance_id=instance.pk)
        after = set(TaskLink.objects.filter(last_reconcile_at__gt=now).values_list("pk", flat=True))
        assert result["links"] == 250
        assert store.calls["get_task_states"] == 3 and store.state_batches == [100, 100, 50]
        assert store.calls["get_task"] == 0  # nothing diverged: no per-task reads
        touched = after - before
        assert len(touched) == 250 and not (touched & seen)  # a new window each tick
        seen |= touched


def test_reconcile_state_refresh_failure_keeps_links_and_backs_off(setup, django_capture_on_commit_callbacks):
    instance, store = setup
    for n in range(3):
        store.add_task(n + 1)
    with django_capture_on_commit_callbacks(execute=True):
        polling.instance_poll(instance_id=instance.pk)
    before = list(TaskLink.objects.order_by("pk").values("status", "external_state_name", "last_reconcile_at"))
    store.fail_states = 1
    del store.tasks[next(iter(store.tasks))]  # would be a deletion, but the state read fails
    result = polling.instance_reconcile(instance_id=instance.pk)
    assert result["links"] == 0
    assert list(TaskLink.objects.order_by("pk").values("status", "external_state_name", "last_reconcile_at")) == before
    assert not Conflict.objects.exists()
    instance.refresh_from_db()
    assert instance.provider_degraded_until is not None  # reconciliation load is shed for retry-after
    assert SyncError.objects.filter(category="provider_rate_limited").exists()
    assert instance_health(instance)["status"] == "degraded"
    assert not polling.cursor_get(instance, polling.RECONCILE_SCOPE)  # the window did not advance


def test_poll_falls_back_to_a_bounded_relist_when_the_cursor_is_rejected(setup,
                                                                         django_capture_on_commit_callbacks):
    instance, store = setup
    for n in range(3):
        store.add_task(n + 1)
    with django_capture_on_commit_callbacks(execute=True):
        polling.instance_poll(instance_id=instance.pk)
    store.add_task(4)
    store.reject_cursor = 1
    with django_capture_on_commit_callbacks(execute=True):
        result = polling.instance_poll(instance_id=instance.pk)
    assert result["tasks"] == 1  # re-listed everything, re-applied idempotently, imported only the new one
    assert Issue.objects.count() == 4 and TaskLink.objects.count() == 4
    assert SyncError.objects.filter(category="cursor_invalid").count() == 1


def test_retention_prunes_old_finished_events_and_keeps_effects(web, setup, django_capture_on_commit_callbacks):
    from datetime import timedelta

    from django.utils import timezone

    instance, store = setup
    raw = store.add_task(1)
    deliver(web, instance, store, "task", raw["id"], django_capture_on_commit_callbacks)
    InboundEvent.objects.update(received_at=timezone.now() - timedelta(days=31))
    pending = InboundEvent.objects.create(instance=instance, company_id=instance.company_id, idempotency_key="p",
                                          kind="task.upserted", external_task_id="zzz")
    InboundEvent.objects.filter(pk=pending.pk).update(received_at=timezone.now() - timedelta(days=31))
    assert polling.retention_prune()["events"] == 1
    assert list(InboundEvent.objects.values_list("pk", flat=True)) == [pending.pk]  # unfinished work is kept
    assert TaskLink.objects.count() == 1 and Issue.objects.count() == 1


def test_retention_keeps_the_newest_health_entries_of_each_instance(setup):
    instance, _ = setup
    rows = [SyncError(instance=instance, company_id=instance.company_id, category="provider_status", message=f"e{n}")
            for n in range(polling.KEPT_ERRORS + 3)]
    SyncError.objects.bulk_create(rows)
    assert polling.retention_prune()["errors"] == 3
    kept = SyncError.objects.filter(instance=instance)
    assert kept.count() == polling.KEPT_ERRORS and not kept.filter(message__in=["e0", "e1", "e2"]).exists()
    assert polling.retention_prune()["errors"] == 0  # under the cap: nothing more to do


def test_embedded_worker_sweep_also_runs_the_connector_sweep(db, settings, monkeypatch):
    """Without a broker (make run), the worker's periodic sweep drives connector retries and polls."""
    from connectors import tasks
    from issues.services.scheduling import sweep

    calls = []
    monkeypatch.setattr(tasks, "sweep", lambda: calls.append("connectors"))
    settings.CELERY_TASK_ALWAYS_EAGER = True
    assert sweep(owner="test")["connectorSweep"] == "done" and calls == ["connectors"]
    settings.CELERY_TASK_ALWAYS_EAGER = False  # with a broker, beat schedules it instead
    assert "connectorSweep" not in sweep(owner="test") and calls == ["connectors"]
