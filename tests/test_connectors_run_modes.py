"""Run modes (§4.2.2) and the observer sync mode (§4.2.1) do what they say, against the GitHub and Linear
sandboxes over real HTTP (every tracker change arrives as a signed webhook at the real endpoint):

- ``external_observer``: no execution coupling. The import routes and assigns for visibility but wakes
  nobody; no comment, command or transition of the tracker wakes anyone afterwards.
- sync mode ``observer``: neither side changes: no field or status change, no note, no conflict, no
  command effect or reply, no provider write; the link record shows the external state.
- ``paperclip_controlled``: an external state change informs and never commands execution."""
from __future__ import annotations

import pytest

from connectors.models import Conflict, InboundEvent, SyncError, TaskLink
from issues.actors import SYSTEM
from issues.models import ActivityLog, Comment, HeartbeatRun, Issue, WakeupRequest
from issues.services.issues import issue_update
from tests.connector_policy_trackers import connect, tracker  # noqa: F401  (fixture import)
from tests.factories import AgentFactory

ALL_VERBS = "/paperclip assign reviewer\n/paperclip status\n/paperclip pause\n/paperclip resume\n/paperclip frobnicate"


@pytest.fixture
def coder(company):
    return AgentFactory(company=company, name="coder", status="idle")


@pytest.fixture
def reviewer(company):
    return AgentFactory(company=company, name="reviewer", status="idle")


def route_to(agent):
    return [{"kind": "default_route", "agentId": agent.pk}]


def wakes(agent=None):
    rows = WakeupRequest.objects.all()
    return rows.filter(agent=agent) if agent is not None else rows


def issue_state(issue: Issue) -> dict:
    issue = Issue.objects.get(pk=issue.pk)
    return {"title": issue.title, "description": issue.description, "status": issue.status,
            "priority": issue.priority, "assignee": issue.assignee_agent_id}


# --- external_observer: assigned for visibility, never started ------------------------------------------
@pytest.mark.parametrize("run_mode,assignment_wakes", [("paperclip_controlled", 1), ("external_observer", 0)])
def test_an_imported_active_task_is_assigned_but_only_woken_when_execution_is_coupled(
        tracker, company, coder, monkeypatch, run_mode, assignment_wakes):
    connect(tracker, company, monkeypatch, default_run_mode=run_mode, rules=route_to(coder))
    handle = tracker.open("Crash on start", active=True)
    tracker.forward()
    link = tracker.link(handle)
    assert link.run_mode == run_mode
    assert link.issue.assignee_agent == coder and link.issue.status == "todo"  # routed, visible in the inbox
    assert wakes(coder).count() == assignment_wakes
    assert HeartbeatRun.objects.filter(issue=link.issue).count() == assignment_wakes


def test_external_observer_links_wake_nobody_afterwards(tracker, company, coder, reviewer, monkeypatch):
    # wakeOnExternalComment on at the instance: the run mode still wins (no execution coupling)
    connect(tracker, company, monkeypatch, default_run_mode="external_observer", default_sync_mode="bidirectional",
            wake_on_external_comment=True, rules=route_to(coder))
    handle = tracker.open("Crash on start", active=True)
    tracker.forward()
    link = tracker.link(handle)
    assert link.issue.status == "todo"  # actionable: any wake the connector asked for would be placed
    tracker.comment(handle, "Any news? @coder")
    tracker.forward()
    tracker.close(handle)  # a closure conflict (the issue is todo); the reopen puts the task back to work
    tracker.forward()
    tracker.reopen(handle)
    tracker.forward()
    tracker.comment(handle, "/paperclip assign reviewer")
    tracker.forward()

    issue = Issue.objects.get(pk=link.issue_id)
    assert Comment.objects.filter(issue=issue, provenance__kind="external_comment", author_type="external").count() == 1
    assert issue.assignee_agent == reviewer  # the command still routes (sync is bidirectional) ...
    assert not wakes().exists() and not HeartbeatRun.objects.exists()  # ... but nothing ever starts
    # the command was answered on the tracker, where writes are allowed
    assert any("assigned to reviewer" in body for body in tracker.comments(handle))


# --- observer sync mode: mutate neither side -----------------------------------------------------------
def test_an_observer_link_changes_neither_side_and_shows_the_external_state(tracker, company, coder, monkeypatch):
    connect(tracker, company, monkeypatch, default_sync_mode="observer", triage_agent_id=coder.pk)  # no rules
    handle = tracker.open("Crash on start", active=True)
    tracker.forward()
    link = tracker.link(handle)
    issue = link.issue
    assert link.sync_mode == "observer" and issue.assignee_agent == coder
    # the import created the issue to display on, and nothing else: no wake, no routing note, no backlink
    assert not wakes().exists()
    assert not Comment.objects.filter(issue=issue).exists()
    assert SyncError.objects.filter(instance=tracker.instance, category="routing",
                                    message__startswith="Unresolved routing").exists()
    before = issue_state(issue)

    tracker.retitle(handle, "Crash on start (urgent)")
    tracker.forward()
    tracker.close(handle)  # terminal while the issue is todo: normally a closure conflict
    tracker.forward()
    tracker.reopen(handle)
    tracker.forward()
    tracker.comment(handle, "Looking into it")
    tracker.forward()
    with tracker.capture(execute=True):  # a Paperclip-side edit is not written to the tracker either
        issue_update(actor=SYSTEM, issue=issue, changes={"priority": "high"})
    before["priority"] = "high"
    assert tracker.comments(handle) == ["Looking into it"]  # no mirrored note, no backlink comment
    tracker.delete(handle)
    tracker.forward()

    assert issue_state(issue) == before
    assert not Comment.objects.filter(issue=issue).exists()
    assert not Conflict.objects.exists()
    assert tracker.writes() == []
    assert not wakes().exists()
    link = TaskLink.objects.get(pk=link.pk)
    assert link.external_title == "Crash on start (urgent)" and link.external_state_category == "active"
    assert link.envelope["externalDeleted"]["what"] == "deleted"
    assert link.status == "healthy"
    statuses = set(InboundEvent.objects.filter(instance=tracker.instance).values_list("status", flat=True))
    assert statuses <= {"applied", "dropped"}  # nothing failed or parked on the way


def test_every_command_verb_is_inert_and_unanswered_on_an_observer_link(tracker, company, coder, reviewer,
                                                                        monkeypatch):
    connect(tracker, company, monkeypatch, default_sync_mode="observer", rules=route_to(coder))
    handle = tracker.open("Crash on start", active=True)
    tracker.forward()
    link = tracker.link(handle)
    comment_id = tracker.comment(handle, ALL_VERBS)
    tracker.forward()

    link = TaskLink.objects.get(pk=link.pk)
    issue = Issue.objects.get(pk=link.issue_id)
    assert issue.assignee_agent == coder  # not assign
    assert link.status == "healthy" and link.paused_from_status == ""  # not pause/resume
    assert tracker.comments(handle) == [ALL_VERBS]  # no reply on the tracker ...
    assert not Comment.objects.filter(issue=issue).exists()  # ... nor on the issue
    assert tracker.writes() == [] and not wakes().exists()
    audit = ActivityLog.objects.filter(action="connector.command", entity_id=str(link.pk))
    assert sorted(a.details["verb"] for a in audit) == ["assign", "frobnicate", "pause", "resume", "status"]
    assert all(a.details["outcome"].startswith("ignored: observer link") for a in audit)

    # The command was seen: if the link later syncs both ways, an edit (or a backstop re-read) of that
    # comment never runs it after the fact.
    TaskLink.objects.filter(pk=link.pk).update(sync_mode="bidirectional")
    tracker.edit_comment(comment_id, ALL_VERBS + "\n(edited)")
    tracker.forward()
    assert Issue.objects.get(pk=link.issue_id).assignee_agent == coder
    assert TaskLink.objects.get(pk=link.pk).status == "healthy"
    assert InboundEvent.objects.filter(instance=tracker.instance).order_by("-id").first().outcome == \
        "comment already handled"


# --- paperclip_controlled: external state informs, never commands ---------------------------------------
def test_paperclip_controlled_state_changes_inform_and_a_closure_is_a_conflict(tracker, company, coder, monkeypatch):
    connect(tracker, company, monkeypatch, rules=route_to(coder))  # the instance defaults
    handle = tracker.open("Crash on start")
    tracker.forward()
    link = tracker.link(handle)
    assert link.run_mode == "paperclip_controlled" and link.issue.status == "backlog"

    tracker.activate(handle, actor="bob")
    tracker.forward()
    issue = Issue.objects.get(pk=link.issue_id)
    assert issue.status == "backlog"  # never moved to todo by the tracker
    note = Comment.objects.get(issue=issue, provenance__kind="state")
    assert note.body.startswith("bob moved") and "stays in backlog until someone here schedules it" in note.body
    assert not wakes().exists()

    tracker.close(handle, actor="carol")
    tracker.forward()
    issue.refresh_from_db()
    assert issue.status == "backlog"  # never closed silently (close policy: conflict)
    conflict = Conflict.objects.get(link=link)
    assert (conflict.kind, conflict.status, conflict.actors["external"]) == ("closure", "open", "carol")
    assert TaskLink.objects.get(pk=link.pk).status == "conflict"
    assert Comment.objects.filter(issue=issue, body__startswith="carol moved",
                                  body__contains="Nothing was closed").exists()
    assert not wakes().exists()
