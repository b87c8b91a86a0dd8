"""§7.4 close and reopen policies against the GitHub and Linear sandboxes over real HTTP.

Close (per link, blank = the connector's): ``conflict`` (default) never closes; ``auto_close`` closes an
idle issue only (no live run, no pending approval, no open blocker), else a closure conflict saying what
it waits for. Reopen (per connector): ``follow_up`` (default) or ``reopen`` the same issue. Both are
idempotent under redelivery and audited; neither wakes anyone outside the Symphony profile. The API and
console expose both policies."""
from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from connectors.models import Conflict, ConnectorInstance, OutboundEffect, TaskLink
from issues.actors import SYSTEM
from issues.models import ActivityLog, Comment, Issue, WakeupRequest
from issues.services.approvals import approval_create
from issues.services.issues import issue_update, relation_add
from tests.connector_factories import make_instance
from tests.connector_policy_trackers import connect, tracker  # noqa: F401  (fixture import)
from tests.factories import AgentFactory, IssueFactory, MembershipFactory, RunFactory
from tests.test_errors import error_of


@pytest.fixture
def coder(company):
    return AgentFactory(company=company, name="coder", status="idle")


def route_to(agent):
    return [{"kind": "default_route", "agentId": agent.pk}]


def audits(action, link) -> int:
    return ActivityLog.objects.filter(action=action, entity_id=str(link.pk)).count()


def board(company, role="owner"):
    c = APIClient()
    c.force_login(MembershipFactory(company=company, role=role).user)
    return c


def finish(tracker, issue):
    """Paperclip finishes the issue (a board user marks it done)."""
    with tracker.capture(execute=True):
        issue_update(actor=SYSTEM, issue=issue, changes={"status": "done"})


# --- close ------------------------------------------------------------------------------------------
def test_auto_close_closes_an_idle_issue_once(tracker, company, coder, monkeypatch):
    connect(tracker, company, monkeypatch, close_policy="auto_close", rules=route_to(coder))
    handle = tracker.open("Crash on start")
    tracker.forward()
    link = tracker.link(handle)
    tracker.close(handle, actor="carol")
    (closed,) = tracker.forward()
    issue = Issue.objects.get(pk=link.issue_id)
    assert issue.status == "done" and issue.completed_at is not None
    assert not Conflict.objects.exists() and TaskLink.objects.get(pk=link.pk).status == "healthy"
    assert Comment.objects.filter(issue=issue, body__startswith="carol closed",
                                  body__contains="close policy auto_close").count() == 1
    assert audits("connector.issue_auto_closed", link) == 1
    assert ActivityLog.objects.filter(action="issue.updated", entity_id=str(issue.pk),
                                      details__changes__status=["backlog", "done"]).count() == 1
    assert tracker.post(closed).json()["duplicate"] is True  # the provider's redelivery: nothing again
    tracker.retitle(handle, "Crash on start (closed)")  # a fresh event in the same terminal state
    tracker.forward()
    assert audits("connector.issue_auto_closed", link) == 1
    assert Comment.objects.filter(issue=issue, body__contains="close policy auto_close").count() == 1


def _pending_approval(issue, coder):
    approval_create(actor=SYSTEM, company=issue.company, type="generic", payload={}, title="Ship it?",
                    requested_by_agent_id=coder.pk, issue_ids=[issue.pk])


def _open_blocker(issue, coder):
    relation_add(actor=SYSTEM, blocker=IssueFactory(company=issue.company, title="Upstream fix"), blocked=issue)


def _live_run(issue, coder):
    RunFactory(agent=coder, issue=issue, status="queued")


@pytest.mark.parametrize("obstacle,waits", [(_pending_approval, "an approval is pending"),
                                            (_open_blocker, "it has open blockers"),
                                            (_live_run, "a run is live")], ids=["approval", "blocker", "run"])
def test_auto_close_waits_for_approvals_blockers_and_runs(tracker, company, coder, monkeypatch, obstacle, waits):
    connect(tracker, company, monkeypatch, close_policy="auto_close", rules=route_to(coder))
    handle = tracker.open("Crash on start")
    tracker.forward()
    link = tracker.link(handle)
    obstacle(link.issue, coder)
    tracker.close(handle, actor="carol")
    tracker.forward()
    issue = Issue.objects.get(pk=link.issue_id)
    assert issue.status == "backlog"  # not closed
    conflict = Conflict.objects.get(link=link)
    assert conflict.kind == "closure" and conflict.detail.endswith(f"auto-close waits: {waits}")
    assert Comment.objects.filter(issue=issue, body__contains=f"Auto-close waits: {waits}.").count() == 1
    assert audits("connector.issue_auto_closed", link) == 0


def test_a_link_close_policy_overrides_the_connectors(tracker, company, coder, monkeypatch):
    connect(tracker, company, monkeypatch, rules=route_to(coder))  # connector: conflict (the default)
    own, inherits = tracker.open("Own policy"), tracker.open("Connector policy")
    tracker.forward()
    own_link, inherits_link = tracker.link(own), tracker.link(inherits)
    url = f"/api/connector-links/{own_link.pk}"
    assert board(company, "operator").patch(url, {"closePolicy": "auto_close"}, format="json").status_code == 403
    owner = board(company)
    body = owner.patch(url, {"closePolicy": "auto_close"}, format="json").json()
    assert (body["closePolicy"], body["effectiveClosePolicy"], body["reopenPolicy"]) == (
        "auto_close", "auto_close", "follow_up")
    assert owner.patch(url, {"closePolicy": "auto_close"}, format="json").status_code == 200  # a repeat: no change
    assert audits("connector.link_updated", own_link) == 1
    assert error_of(owner.patch(url, {"closePolicy": "always"}, format="json"))["details"].keys() == {"closePolicy"}
    assert owner.get(f"/api/connector-links/{inherits_link.pk}").json()["effectiveClosePolicy"] == "conflict"

    tracker.close(own)
    tracker.close(inherits)
    tracker.forward()
    assert Issue.objects.get(pk=own_link.issue_id).status == "done"
    assert Issue.objects.get(pk=inherits_link.issue_id).status == "backlog"
    assert list(Conflict.objects.values_list("link_id", "kind")) == [(inherits_link.pk, "closure")]
    # '' gives the link back to the connector's policy
    assert owner.patch(f"/api/connector-links/{inherits_link.pk}", {"closePolicy": ""},
                       format="json").json()["effectiveClosePolicy"] == "conflict"


# --- reopen -----------------------------------------------------------------------------------------
def test_reopen_policy_reopens_the_same_issue_once_and_wakes_nobody(tracker, company, coder, monkeypatch):
    connect(tracker, company, monkeypatch, reopen_policy="reopen", rules=route_to(coder))
    handle = tracker.open("Crash on start", active=True)
    tracker.forward()
    link = tracker.link(handle)
    wakes_before = WakeupRequest.objects.count()  # the import's assignment wake (paperclip_controlled)
    finish(tracker, link.issue)
    tracker.close(handle)
    tracker.forward()
    assert not Conflict.objects.exists()  # both sides closed: nothing to decide
    tracker.reopen(handle, actor="dave")
    (reopened,) = tracker.forward()

    link = TaskLink.objects.get(pk=link.pk)
    issue = Issue.objects.get(pk=link.issue_id)
    assert link.issue_id == issue.pk and link.handoff_history == []
    assert issue.status == "todo" and issue.completed_at is None  # active again, through the issue service
    assert not Issue.objects.filter(company=company).exclude(pk=issue.pk).exists()  # no follow-up
    assert audits("connector.issue_reopened", link) == 1
    assert ActivityLog.objects.filter(action="issue.updated", entity_id=str(issue.pk),
                                      details__changes__status=["done", "todo"]).count() == 1
    assert Comment.objects.filter(issue=issue, body__startswith="dave reopened",
                                  body__contains="this issue was reopened (done -> todo").count() == 1
    assert WakeupRequest.objects.count() == wakes_before  # external state informs, Paperclip decides
    assert tracker.post(reopened).json()["duplicate"] is True
    tracker.retitle(handle, "Crash on start again")
    tracker.forward()
    assert audits("connector.issue_reopened", link) == 1
    assert TaskLink.objects.get(pk=link.pk).issue_id == issue.pk


def test_follow_up_is_the_default_and_is_not_woken_under_paperclip_control(tracker, company, coder, monkeypatch):
    connect(tracker, company, monkeypatch, rules=route_to(coder))
    handle = tracker.open("Crash on start", active=True)
    tracker.forward()
    link = tracker.link(handle)
    first = link.issue
    finish(tracker, first)
    tracker.close(handle)
    tracker.forward()
    tracker.reopen(handle)
    tracker.forward()
    link = TaskLink.objects.get(pk=link.pk)
    follow_up = Issue.objects.get(pk=link.issue_id)
    assert follow_up.pk != first.pk and Issue.objects.get(pk=first.pk).status == "done"
    assert [h["issueId"] for h in link.handoff_history] == [str(first.pk)]
    assert follow_up.assignee_agent == coder and follow_up.status == "todo"
    assert not WakeupRequest.objects.filter(issue=follow_up).exists()
    assert audits("connector.link_retargeted", link) == 1


def test_reopen_in_place_under_the_symphony_profile_dispatches_the_issue(tracker, company, coder, monkeypatch):
    connect(tracker, company, monkeypatch, reopen_policy="reopen", default_run_mode="symphony_compatible",
            rules=route_to(coder))
    handle = tracker.open("Crash on start")  # backlog: nothing to dispatch yet
    tracker.forward()
    link = tracker.link(handle)
    finish(tracker, link.issue)
    tracker.close(handle)
    tracker.forward()
    tracker.reopen(handle)  # GitHub: open again (backlog); Linear: In Progress
    tracker.forward()
    tracker.activate(handle)
    tracker.forward()
    link = TaskLink.objects.get(pk=link.pk)
    issue = Issue.objects.get(pk=link.issue_id)
    assert link.handoff_history == [] and issue.status == "todo"
    assert WakeupRequest.objects.filter(issue=issue, source="connector").count() == 1
    assert audits("connector.issue_reopened", link) == 1


# --- API and console ----------------------------------------------------------------------------------
def test_the_connector_api_exposes_and_validates_both_policies(company):
    owner = board(company)
    created = owner.post(f"/api/companies/{company.pk}/connectors",
                         {"name": "tracker", "provider": "fake_tracker", "containers": ["acme/tracker"]},
                         format="json").json()
    assert (created["closePolicy"], created["reopenPolicy"]) == ("conflict", "follow_up")  # the defaults
    url = f"/api/connectors/{created['id']}"
    body = owner.patch(url, {"closePolicy": "auto_close", "reopenPolicy": "reopen"}, format="json").json()
    assert (body["closePolicy"], body["reopenPolicy"]) == ("auto_close", "reopen")
    assert error_of(owner.patch(url, {"reopenPolicy": "resurrect"}, format="json"))["details"].keys() == {
        "reopenPolicy"}
    # the flag migration 0005 moved into closePolicy is refused, not silently ignored
    refused = error_of(owner.patch(url, {"config": {"autoCloseWhenIdle": True}}, format="json"))
    assert "config.autoCloseWhenIdle" in refused["details"]
    assert board(company, "operator").patch(url, {"closePolicy": "conflict"}, format="json").status_code == 403
    instance = ConnectorInstance.objects.get(pk=created["id"])
    assert (instance.close_policy, instance.reopen_policy) == ("auto_close", "reopen")


def test_console_forms_set_the_connector_and_link_policies(company, coder, django_capture_on_commit_callbacks):
    from tests.connector_helpers import post_webhook

    instance, store = make_instance(company, triage_agent_id=coder.pk)
    raw = store.add_task(1)
    post_webhook(Client(), instance, store.delivery("task", raw["id"])[0], capture=django_capture_on_commit_callbacks)
    link = TaskLink.objects.get(instance=instance)
    owner, viewer = Client(), Client()
    owner.force_login(MembershipFactory(company=company, role="owner").user)
    viewer.force_login(MembershipFactory(company=company, role="viewer").user)

    page = owner.get(f"/connectors/{instance.pk}/").content.decode()
    assert 'name="close_policy"' in page and 'name="reopen_policy"' in page
    assert 'name="close_policy"' not in viewer.get(f"/connectors/{instance.pk}/").content.decode()
    policies = f"/connectors/{instance.pk}/policies/"
    assert viewer.post(policies, {"close_policy": "auto_close", "reopen_policy": "reopen"}).status_code == 403
    assert owner.post(policies, {"close_policy": "auto_close", "reopen_policy": "reopen"}).status_code == 302
    instance.refresh_from_db()
    assert (instance.close_policy, instance.reopen_policy) == ("auto_close", "reopen")
    assert ActivityLog.objects.filter(action="connector.updated", entity_id=str(instance.pk)).exists()
    owner.post(policies, {"close_policy": "sometimes", "reopen_policy": "reopen"})  # refused with a message
    instance.refresh_from_db()
    assert instance.close_policy == "auto_close"

    issue_page = owner.get(reverse("console:issue-detail", args=[link.issue.identifier])).content.decode()
    assert f'id="close-policy-{link.pk}"' in issue_page and "(connector default)" in issue_page
    assert owner.post(f"/connectors/link-close-policy/{link.pk}/", {"close_policy": "conflict"}).status_code == 302
    assert TaskLink.objects.get(pk=link.pk).close_policy == "conflict"
    assert audits("connector.link_updated", link) == 1


@pytest.mark.parametrize("field_policy", [{"state": "paperclip"}, {}], ids=["closure-paperclip", "closure-external"])
def test_a_close_from_the_tracker_is_not_echoed_back_to_it(tracker, company, coder, monkeypatch, field_policy):
    """The tracker closed the task: the issue follows, and the tracker gets neither a transition to the
    state it is in nor a "marked done in Paperclip" comment attributed to the assignee."""
    connect(tracker, company, monkeypatch, close_policy="auto_close", rules=route_to(coder),
            default_sync_mode="bidirectional", field_policy=field_policy)
    handle = tracker.open("Crash on start")
    tracker.forward()
    link = tracker.link(handle)
    before = set(OutboundEffect.objects.filter(link=link).values_list("pk", flat=True))
    tracker.close(handle, actor="carol")
    tracker.forward()
    assert Issue.objects.get(pk=link.issue_id).status == "done"
    assert list(OutboundEffect.objects.filter(link=link).exclude(pk__in=before).values_list("source_id")) == []
    issue = Issue.objects.get(pk=link.issue_id)
    issue_update(actor=SYSTEM, issue=issue, changes={"status": "backlog"})  # reopened in Paperclip: projected
    assert OutboundEffect.objects.filter(link=link, source_id__startswith="status:backlog:").exists()
