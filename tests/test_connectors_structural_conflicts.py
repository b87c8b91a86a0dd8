"""Structural conflicts of issue #16 (§11.1, §11.2, §4.1.4), against the GitHub sandbox over real HTTP
(signed deliveries posted to the real webhook endpoint, writes through the outbound engine):

* ``routing`` — a re-route of an already linked task that does not resolve (its rule targets a missing or
  paused agent, or nothing matches any more while the issue has an owner) is a conflict entry, not only a
  health entry; the owner stays; keep_paperclip / keep_external / merge_manual / dismiss decide who owns it;
  a later clean route settles it;
* ``policy`` — a person's edit of a field the tracker owns is never a silent non-push: a policy entry visible
  in the instance health (API and console) and on the link; keep_paperclip writes it once, keep_external
  reverts it, dismiss leaves it in Paperclip until the tracker's next change."""
from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from connectors.choices import ConflictKind, LinkStatus, OutboundKind
from connectors.models import Conflict, OutboundEffect, SyncError, TaskLink
from connectors.services.conflicts import conflict_resolve
from connectors.services.instances import instance_create
from issues.actors import SYSTEM, Actor
from issues.exceptions import InvalidInput
from issues.models import Comment, Issue
from issues.services.issues import issue_update
from tests.connector_helpers import delivery_headers
from tests.factories import AgentFactory, MembershipFactory
from tests.github_sandbox import (
    DEFAULT_STATE_MAPPING,
    SANDBOX_REPO,
    SANDBOX_TOKEN,
    SANDBOX_WEBHOOK_SECRET,
    SERVICE_LOGIN,
)


class World:
    """A GitHub repository in the sandbox, a bidirectional connector routing by ``pc:agent/<name>`` labels,
    and the webhook hop to Paperclip."""

    def __init__(self, company, sandbox, capture, **fields):
        self.company, self.sb, self.capture = company, sandbox, capture
        self.triage = AgentFactory(company=company, name="triage")
        self.coder = AgentFactory(company=company, name="coder")
        self.reviewer = AgentFactory(company=company, name="reviewer")
        self.sleepy = AgentFactory(company=company, name="sleepy", status="paused")
        fields.setdefault("default_sync_mode", "bidirectional")
        self.instance = instance_create(
            actor=SYSTEM, company=company, name="gh", provider_key="github_issues", base_url=sandbox.base_url,
            containers=[SANDBOX_REPO], state_mapping=DEFAULT_STATE_MAPPING, service_account_id=SERVICE_LOGIN,
            credentials="env:PAPERCLIP_SECRET_SC_TOKEN", webhook_secret="env:PAPERCLIP_SECRET_SC_HOOK",
            triage_agent_id=self.triage.pk, routing_rules=[{"kind": "label", "match": {"label": "pc:agent/*"}}],
            **fields)
        self.operator = MembershipFactory(company=company, role="operator").user
        self._seen = 0

    def forward(self):
        """Post every delivery the sandbox made since the last call, exactly as sent."""
        deliveries = self.sb.deliveries[self._seen:]
        self._seen += len(deliveries)
        for delivery in deliveries:
            headers = delivery_headers(delivery)
            with self.capture(execute=True):
                response = APIClient().post(f"/api/connectors/{self.instance.pk}/webhook", data=delivery.body,
                                            content_type="application/json", **headers)
            assert response.status_code == 202, response.content

    def import_issue(self, title="Crash on start", labels=("pc:agent/coder",)) -> tuple[int, TaskLink]:
        number = self.sb.open_issue(title, "It crashes.", labels=list(labels))["number"]
        self.forward()
        self.forward()  # whatever our backlink write produced on the tracker (its echo is dropped)
        return number, TaskLink.objects.get(instance=self.instance)

    def link(self) -> TaskLink:
        return TaskLink.objects.select_related("issue").get(instance=self.instance)

    def resolve(self, conflict, action, **kwargs):
        with self.capture(execute=True):
            return conflict_resolve(actor=Actor(user=self.operator), conflict=conflict, action=action,
                                    idempotency_key=f"k-{action}-{conflict.pk}", **kwargs)

    def edit(self, issue, **changes):
        """A person edits the issue in Paperclip (not the connector: the SYSTEM actor never counts)."""
        with self.capture(execute=True):
            return issue_update(actor=Actor(user=self.operator), issue=Issue.objects.get(pk=issue.pk),
                                changes=changes)[0]

    def title_writes(self, number) -> list:
        return [r for r in self.sb.requests_to(rf"/repos/{SANDBOX_REPO}/issues/{number}$", "PATCH")
                if "title" in (r.body or {})]


@pytest.fixture
def world(company, github_sandbox, monkeypatch, django_capture_on_commit_callbacks, settings):
    settings.CONNECTORS = {**settings.CONNECTORS, "RETRY_BASE_SECONDS": 0.0}
    monkeypatch.setenv("PAPERCLIP_SECRET_SC_TOKEN", SANDBOX_TOKEN)
    monkeypatch.setenv("PAPERCLIP_SECRET_SC_HOOK", SANDBOX_WEBHOOK_SECRET)
    return World(company, github_sandbox, django_capture_on_commit_callbacks)


def open_routing(link):
    return Conflict.objects.get(link=link, kind=ConflictKind.ROUTING, status="open")


# --- routing conflicts -------------------------------------------------------------------------------
def test_an_unresolvable_reroute_of_a_linked_task_is_a_routing_conflict_and_the_owner_stays(world):
    number, link = world.import_issue()
    assert link.issue.assignee_agent == world.coder
    # nothing routes any more: the tracker no longer says who should have it
    world.sb.unlabel(number, "pc:agent/coder")
    world.forward()
    conflict = open_routing(link)
    assert conflict.field == "assignee" and conflict.paperclip_value["assigneeAgentName"] == "coder"
    assert conflict.external_value["route"]["fellBack"] is True
    link = world.link()
    assert link.issue.assignee_agent == world.coder and link.status == LinkStatus.CONFLICT
    # then a route to an agent that does not exist: the same entry, refreshed (one per link while open)
    world.sb.label(number, "pc:agent/ghost")
    world.forward()
    conflict = open_routing(link)
    assert "agent 'ghost', which is missing" in conflict.external_value["problems"][0]
    assert "pc:agent/ghost" in conflict.external_value["inputs"]["labels"]
    assert SyncError.objects.filter(instance=world.instance, category="routing", link=link,
                                    message__contains="ghost").exists()  # the health entry stays too
    world.sb.label(number, "bug")  # another route-input change, the same outcome
    world.forward()
    assert Conflict.objects.filter(link=link, kind=ConflictKind.ROUTING).count() == 1
    assert Comment.objects.filter(issue=link.issue, provenance__kind="routing").count() == 1  # one notice
    link = world.link()
    assert link.issue.assignee_agent == world.coder
    health = _health(world)
    assert health["conflictCount"] == 1 and health["conflictsByKind"]["routing"] == 1


def test_a_later_clean_route_settles_the_routing_conflict(world):
    number, link = world.import_issue()
    world.sb.unlabel(number, "pc:agent/coder")
    world.sb.label(number, "pc:agent/sleepy")  # a paused agent
    world.forward()
    assert "which is paused" in open_routing(link).detail
    world.sb.unlabel(number, "pc:agent/sleepy")
    world.sb.label(number, "pc:agent/reviewer")
    world.forward()
    link = world.link()
    settled = Conflict.objects.get(link=link, kind=ConflictKind.ROUTING)
    assert (settled.status, settled.resolution) == ("resolved", "rerouted")
    assert link.issue.assignee_agent == world.reviewer and link.status == LinkStatus.HEALTHY


def routing_conflict(world):
    number, link = world.import_issue()
    world.sb.unlabel(number, "pc:agent/coder")
    world.sb.label(number, "pc:agent/ghost")
    world.forward()
    return number, world.link(), open_routing(link)


def test_keep_external_applies_the_trackers_routing_now(world):
    number, link, conflict = routing_conflict(world)
    row = world.resolve(conflict, "keep_external")
    link = world.link()
    # ghost is still missing: the route falls through to triage, as §8.1 says for a fresh import
    assert (row.status, row.resolution, row.resolution_value) == ("resolved", "keep_external", str(world.triage.pk))
    assert link.issue.assignee_agent == world.triage and link.status == LinkStatus.HEALTHY
    world.sb.label(number, "bug")  # the same unresolvable outcome again: decided already, not raised again
    world.forward()
    assert not Conflict.objects.filter(link=link, status="open").exists()
    assert world.link().issue.assignee_agent == world.triage


def test_keep_external_is_refused_while_the_route_resolves_to_nobody(world):
    number, link, conflict = routing_conflict(world)
    world.instance.triage_agent = None
    world.instance.save(update_fields=["triage_agent"])
    with pytest.raises(InvalidInput) as refused:
        world.resolve(conflict, "keep_external")
    assert "resolves to nobody" in refused.value.details["action"][0]
    conflict.refresh_from_db()
    assert conflict.status == "open" and world.link().issue.assignee_agent == world.coder


def test_keep_paperclip_keeps_the_owner_and_a_new_failure_is_raised_again(world):
    number, link, conflict = routing_conflict(world)
    row = world.resolve(conflict, "keep_paperclip")
    assert row.resolution_value == str(world.coder.pk)
    link = world.link()
    assert link.issue.assignee_agent == world.coder and link.status == LinkStatus.HEALTHY
    assert link.routing["kind"] == "paperclip" and link.routing["agentName"] == "coder"
    world.sb.label(number, "bug")  # same outcome: accepted
    world.forward()
    assert not Conflict.objects.filter(link=link, status="open").exists()
    world.sb.unlabel(number, "pc:agent/ghost")
    world.sb.label(number, "pc:agent/sleepy")  # a different unresolvable outcome: a new entry
    world.forward()
    assert "sleepy" in open_routing(link).detail


def test_dismiss_changes_nothing_and_merge_manual_assigns_the_named_agent(world):
    number, link, conflict = routing_conflict(world)
    with pytest.raises(InvalidInput) as refused:
        world.resolve(conflict, "merge_manual", merged_value="nobody-here")
    assert "mergedValue" in refused.value.details
    with pytest.raises(InvalidInput):
        world.resolve(conflict, "merge_manual", merged_value="sleepy")  # paused
    row = world.resolve(conflict, "merge_manual", merged_value="Reviewer")
    assert row.resolution_value == str(world.reviewer.pk)
    link = world.link()
    assert link.issue.assignee_agent == world.reviewer and link.routing["reason"].startswith("chosen by")
    world.sb.unlabel(number, "pc:agent/ghost")
    world.sb.label(number, "pc:agent/phantom")
    world.forward()
    dismissed = world.resolve(open_routing(link), "dismiss")
    assert dismissed.status == "dismissed" and world.link().issue.assignee_agent == world.reviewer


def test_a_checked_out_issue_gets_a_handoff_request_not_a_reassignment(world):
    number, link, conflict = routing_conflict(world)
    Issue.objects.filter(pk=link.issue_id).update(status="in_progress")
    world.resolve(conflict, "merge_manual", merged_value="reviewer")
    issue = Issue.objects.get(pk=link.issue_id)
    assert issue.assignee_agent == world.coder and issue.status == "in_progress"
    assert Comment.objects.filter(issue=issue, provenance__kind="handoff", body__contains="reviewer").exists()


def test_the_console_explains_what_each_action_does_to_a_routing_conflict(world):
    number, link, conflict = routing_conflict(world)
    client = Client()
    client.force_login(world.operator)
    queue = client.get(reverse("connectors_console:conflict-list")).content.decode()
    card = queue[queue.index(f'id="conflict-{conflict.pk}"'):]
    assert "Routing" in card and "Assign an agent" in card and "which is missing" in card
    confirm = client.post(reverse("connectors_console:conflict-resolve", args=[conflict.pk]),
                          {"action": "keep_external", "idempotency_key": "c1"}).content.decode()
    assert "Routing runs again now" in confirm
    page = client.get(reverse("console:issue-detail", args=[link.issue.identifier])).content.decode()
    assert "routing · assignee" in page


# --- policy entries: Paperclip edits of tracker-owned fields -----------------------------------------------
def policy_entry(link, field="title"):
    return Conflict.objects.get(link=link, kind=ConflictKind.POLICY, field=field, status="open")


def _health(world):
    client = APIClient()
    client.force_login(MembershipFactory(company=world.company, role="viewer").user)
    return client.get(f"/api/connectors/{world.instance.pk}/health").json()


def test_a_paperclip_edit_of_a_tracker_owned_field_is_a_policy_entry_never_a_silent_non_push(world):
    number, link = world.import_issue()
    assert link.field_policy["title"] == "external"
    world.edit(link.issue, title="Our better title")
    assert not world.title_writes(number) and world.sb.issue(number)["title"] == "Crash on start"
    assert not OutboundEffect.objects.filter(link=link, kind=OutboundKind.FIELDS).exists()
    entry = policy_entry(link)
    assert (entry.paperclip_value, entry.external_value) == ("Our better title", "Crash on start")
    assert "fieldPolicy.title = external" in entry.detail and entry.actors["paperclip"] == world.operator.username
    assert world.link().status == LinkStatus.CONFLICT
    world.edit(link.issue, title="Our best title")  # idempotent per field while open: refreshed
    assert Conflict.objects.filter(link=link, kind=ConflictKind.POLICY).count() == 1
    assert policy_entry(link).paperclip_value == "Our best title"
    world.edit(link.issue, priority="high")  # GitHub has no priority field: nothing to push, no entry
    assert not Conflict.objects.filter(link=link, field="priority").exists()
    # visible in the health (API and console) and on the link
    health = _health(world)
    assert health["conflictsByKind"]["policy"] == 1 and health["conflictCount"] == 1
    client = Client()
    client.force_login(world.operator)
    page = client.get(reverse("connectors_console:instance-detail", args=[world.instance.pk])).content.decode()
    assert "open conflicts · 1 policy" in page
    issue_page = client.get(reverse("console:issue-detail", args=[link.issue.identifier])).content.decode()
    assert "policy · title" in issue_page


def test_keep_paperclip_writes_the_edit_to_the_tracker_once(world):
    number, link = world.import_issue()
    world.edit(link.issue, title="Our better title")
    world.resolve(policy_entry(link), "keep_paperclip")
    assert world.sb.issue(number)["title"] == "Our better title" and len(world.title_writes(number)) == 1
    world.forward()  # the tracker's echo of our write
    world.sb.edit_issue(number, body="More detail.")  # an unrelated tracker edit
    world.forward()
    link = world.link()
    assert link.issue.title == "Our better title" and link.status == LinkStatus.HEALTHY
    assert not Conflict.objects.filter(status="open").exists() and len(world.title_writes(number)) == 1


def test_keep_external_reverts_the_edit_and_dismiss_leaves_it_until_the_tracker_changes(world):
    number, link = world.import_issue()
    world.edit(link.issue, title="Our better title")
    world.resolve(policy_entry(link), "keep_external")
    link = world.link()
    assert link.issue.title == "Crash on start" and not world.title_writes(number)
    assert not Conflict.objects.filter(status="open").exists() and link.status == LinkStatus.HEALTHY
    world.edit(link.issue, title="Our title again")
    world.resolve(policy_entry(link), "dismiss")
    assert world.link().issue.title == "Our title again" and not world.title_writes(number)
    world.sb.edit_issue(number, title="Crash on start (v2)")  # the owner changes it: the owner wins
    world.forward()
    link = world.link()
    assert link.issue.title == "Crash on start (v2)" and not Conflict.objects.filter(status="open").exists()


def test_an_edit_back_to_the_trackers_value_settles_the_entry(world):
    number, link = world.import_issue()
    world.edit(link.issue, title="Our better title")
    world.edit(link.issue, title="Crash on start")
    entry = Conflict.objects.get(link=link, kind=ConflictKind.POLICY)
    assert (entry.status, entry.resolution) == ("resolved", "matches_tracker")
    assert world.link().status == LinkStatus.HEALTHY


def test_a_tracker_edit_of_the_same_field_refreshes_the_one_entry(world):
    number, link = world.import_issue()
    world.edit(link.issue, title="Our better title")
    world.sb.edit_issue(number, title="Their better title")
    world.forward()
    [entry] = Conflict.objects.filter(link=link)  # one entry for one divergence, not a second field conflict
    assert (entry.kind, entry.status, entry.external_value) == ("policy", "open", "Their better title")
    assert world.link().issue.title == "Our better title"
    world.resolve(entry, "keep_external")
    assert world.link().issue.title == "Their better title" and not Conflict.objects.filter(status="open").exists()


def test_no_entry_when_the_field_policy_is_not_what_holds_the_edit(world, company):
    number, link = world.import_issue()
    TaskLink.objects.filter(pk=link.pk).update(field_policy={**link.field_policy, "title": "paperclip"})
    world.edit(link.issue, title="Pushed title")  # Paperclip owns it: written, no entry
    assert world.sb.issue(number)["title"] == "Pushed title"
    TaskLink.objects.filter(pk=link.pk).update(field_policy={**link.field_policy, "title": "external"},
                                               sync_mode="import_only")
    world.edit(link.issue, title="Kept here")  # the sync mode writes nothing at all: no policy entry
    with world.capture(execute=True):
        issue_update(actor=SYSTEM, issue=world.link().issue, changes={"title": "Connector's own"})
    assert not Conflict.objects.filter(link=link).exists()
