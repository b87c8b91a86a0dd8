"""The autonomy loop end to end: real agent processes (examples/heartbeat_agent.py) talk to the API
over real HTTP, the host's dispatcher starts them, and waiting work wakes by itself. Between the
first wake and the last assertion no test code writes to the database: the only inputs are the
board's API calls a human would make."""
import sys
import time
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from issues.choices import LIVE_RUN_STATUSES
from issues.models import HeartbeatRun, Issue, RunEvent
from issues.services import dispatch, runs
from tests.factories import AgentFactory, MembershipFactory

AGENT = str(Path(__file__).resolve().parent.parent / "examples" / "heartbeat_agent.py")


@pytest.fixture
def host(live_server, settings):
    settings.PAPERCLIP = {**settings.PAPERCLIP, "API_URL": f"{live_server.url}/api"}
    return live_server


def example_agent(company, mode, permissions=None, **env):
    return AgentFactory(company=company, adapter_type="process", permissions=permissions or {}, adapter_config={
        "command": [sys.executable, AGENT], "env": {"EXAMPLE_AGENT_MODE": mode, **env}})


def board(company):
    client = APIClient()
    client.force_login(MembershipFactory(company=company).user)
    return client


def drive(until, *, deadline_seconds=90):
    """Act as the host's worker: dispatch and execute queued runs (each a real process) until
    ``until()`` holds and nothing is queued, or fail at the deadline."""
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        picked = dispatch.dispatch_runs()
        for run_id in picked:
            dispatch.run_execute(run_id=run_id, owner=runs.this_owner())
        if not picked and until():
            return
        if not picked:
            time.sleep(0.1)  # a scheduled wake may become due; nothing to run yet
    pytest.fail("the loop did not settle before the deadline")


def run_log(run):
    return "\n".join(RunEvent.objects.filter(run=run).order_by("seq").values_list("message", flat=True))


@pytest.mark.django_db(transaction=True)
def test_an_agent_without_tasks_assign_says_so_and_blocks_instead_of_failing(host, company):
    worker = example_agent(company, "done")
    manager = example_agent(company, "delegate", EXAMPLE_AGENT_DELEGATE_TO=str(worker.pk))  # no grant
    created = board(company).post(f"/api/companies/{company.pk}/issues", {
        "title": "Ship the report", "assigneeAgentId": str(manager.pk)}, format="json")
    parent = Issue.objects.get(pk=created.json()["id"])

    drive(lambda: Issue.objects.get(pk=parent.pk).status == "blocked")

    assert not Issue.objects.filter(parent=parent).exists()
    [run] = HeartbeatRun.objects.filter(agent=manager)
    assert (run.status, run.liveness) == ("succeeded", "blocked"), (run.status, run.liveness, run.error)
    comment = parent.comments.order_by("created_at").last()
    assert "tasks:assign" in comment.body and comment.author_agent_id == manager.pk
    assert not HeartbeatRun.objects.filter(agent=worker).exists()


@pytest.mark.django_db(transaction=True)
def test_parent_blocked_on_its_child_is_woken_and_finished_without_a_nudge(host, company):
    worker = example_agent(company, "done")
    # delegating names the child's assignee: tasks:assign (the board's grant)
    manager = example_agent(company, "delegate", permissions={"canAssignTasks": True},
                            EXAMPLE_AGENT_DELEGATE_TO=str(worker.pk))
    created = board(company).post(f"/api/companies/{company.pk}/issues", {
        "title": "Ship the report", "assigneeAgentId": str(manager.pk)}, format="json")
    assert created.status_code == 201, created.content
    parent = Issue.objects.get(pk=created.json()["id"])

    drive(lambda: Issue.objects.get(pk=parent.pk).status == "done")

    parent.refresh_from_db()
    [child] = Issue.objects.filter(parent=parent)
    assert child.status == "done" and child.assignee_agent_id == worker.pk
    manager_runs = list(HeartbeatRun.objects.filter(agent=manager).order_by("created_at"))
    assert len(manager_runs) == 2, [(r.wake_reason, r.status, r.error) for r in manager_runs]
    first, second = manager_runs
    assert first.liveness == "blocked" and "delegated" in run_log(first)
    # The child's finish resolved the parent's blocker and completed its children: one run, both reasons.
    reasons = second.context.get("wakeReasons") or [second.wake_reason]
    assert "issue_blockers_resolved" in reasons, second.context
    assert second.status == "succeeded" and second.liveness == "completed", run_log(second)
    assert HeartbeatRun.objects.filter(agent=worker).count() == 1
    assert not HeartbeatRun.objects.filter(status__in=LIVE_RUN_STATUSES).exists()


@pytest.mark.django_db(transaction=True)
def test_agent_waits_for_its_approval_and_finishes_when_the_board_approves(host, company):
    agent = example_agent(company, "approval")
    client = board(company)
    created = client.post(f"/api/companies/{company.pk}/issues", {
        "title": "Buy the domain", "assigneeAgentId": str(agent.pk)}, format="json")
    issue_id = created.json()["id"]

    drive(lambda: client.get(f"/api/companies/{company.pk}/approvals", {"status": "pending"}).json() != [])
    [approval] = client.get(f"/api/companies/{company.pk}/approvals", {"status": "pending"}).json()
    assert approval["requestedByAgentId"] == str(agent.pk) and approval["issueIds"] == [issue_id]
    assert client.get(f"/api/issues/{issue_id}").json()["status"] == "in_progress"

    decided = client.post(f"/api/approvals/{approval['id']}/approve", {"decisionNote": "Go"}, format="json")
    assert decided.status_code == 200 and decided.json()["status"] == "approved", decided.content
    drive(lambda: client.get(f"/api/issues/{issue_id}").json()["status"] == "done")

    last = HeartbeatRun.objects.filter(agent=agent).order_by("-created_at").first()
    assert last.wake_reason == "approval_approved"
    assert last.context["approvalId"] == approval["id"] and last.context["approvalStatus"] == "approved"
    assert f"approval {approval['id']} is approved" in run_log(last)
    assert HeartbeatRun.objects.filter(agent=agent).count() == 2


@pytest.mark.django_db(transaction=True)
def test_a_comment_asking_for_review_wakes_the_agent_which_reviews_the_in_review_issue(host, company):
    agent = example_agent(company, "done")
    client = board(company)
    created = client.post(f"/api/companies/{company.pk}/issues", {
        "title": "Check the changelog", "status": "in_review"}, format="json")
    issue_id = created.json()["id"]
    assigned = client.patch(f"/api/issues/{issue_id}", {"assigneeAgentId": str(agent.pk)}, format="json")
    assert assigned.status_code == 200
    drive(lambda: not HeartbeatRun.objects.filter(status__in=LIVE_RUN_STATUSES).exists())
    # The assignment alone does not make review work: in_review is picked only when a comment asks.
    assert client.get(f"/api/issues/{issue_id}").json()["status"] == "in_review"

    comment = client.post(f"/api/issues/{issue_id}/comments", {"body": "Please review the wording."}, format="json")
    assert comment.status_code == 201
    drive(lambda: client.get(f"/api/issues/{issue_id}").json()["status"] == "done")

    last = HeartbeatRun.objects.filter(agent=agent).order_by("-created_at").first()
    log = run_log(last)
    assert last.wake_reason == "issue_commented" and last.context["commentIds"] == [comment.json()["id"]]
    assert "task packet:" in log and "woken by comment: Please review the wording." in log
    assert last.result_status == "done" and "Reviewed it as asked" in last.result_summary


@pytest.mark.django_db(transaction=True)
def test_a_reported_failure_is_retried_with_backoff(host, company):
    agent = example_agent(company, "report_failure")
    client = board(company)
    client.post(f"/api/companies/{company.pk}/issues", {"title": "Flaky", "assigneeAgentId": str(agent.pk)},
                format="json")
    drive(lambda: HeartbeatRun.objects.filter(agent=agent, status="scheduled_retry").exists())
    failed = HeartbeatRun.objects.get(agent=agent, status="failed")
    assert failed.result_status == "failed" and failed.exit_code == 1
    retry = HeartbeatRun.objects.get(agent=agent, status="scheduled_retry")
    assert retry.wake_reason == "process_lost_retry" and retry.retry_attempt == 1
    assert retry.scheduled_for > failed.finished_at
