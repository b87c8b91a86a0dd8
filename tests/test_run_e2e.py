"""End to end: wake → dispatcher → run in a real git worktree → the example agent works the issue
over real HTTP (checkout, comment, done) → run ends → lock released. Real processes throughout."""
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.db import connection
from rest_framework.test import APIClient

from issues.models import Comment, HeartbeatRun, Issue, RunEvent
from issues.services import dispatch, runs
from tests.factories import AgentFactory, IssueFactory, MembershipFactory, ProjectFactory

AGENT = str(Path(__file__).resolve().parent.parent / "examples" / "heartbeat_agent.py")
GIT = ["git", "-c", "user.name=Test", "-c", "user.email=test@example.invalid", "-c", "init.defaultBranch=main"]


def git(*args, cwd):
    return subprocess.run([*GIT, *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def host(live_server, settings, tmp_path):
    """The API where agents call back, a workspace root, and a project with a real repository."""
    settings.PAPERCLIP = {**settings.PAPERCLIP, "API_URL": f"{live_server.url}/api",
                          "WORKSPACE_ROOT": str(tmp_path / "workspaces")}
    repo = tmp_path / "repo"
    repo.mkdir()
    git("init", cwd=repo)
    (repo / "README.md").write_text("hello\n")
    git("add", ".", cwd=repo)
    git("commit", "-m", "initial", cwd=repo)
    return repo


def make_agent(company, mode="done", **env):
    return AgentFactory(company=company, adapter_type="process", adapter_config={
        "command": [sys.executable, AGENT],
        "env": {"EXAMPLE_AGENT_MODE": mode, "EXAMPLE_AGENT_WRITE_FILE": "1", **env},
    }, runtime_config={"maxConcurrentRuns": 2})


def board(company):
    client = APIClient()
    client.force_login(MembershipFactory(company=company).user)
    return client


def run_dispatched(owner=None):
    """One dispatcher pass, executing each picked run in this thread (as a worker would)."""
    return [dispatch.run_execute(run_id=run_id, owner=owner or runs.this_owner())
            for run_id in dispatch.dispatch_runs()]


@pytest.mark.django_db(transaction=True)
def test_wake_runs_the_example_agent_in_its_own_worktree_to_done(host, company):
    project = ProjectFactory(company=company, repository=str(host), base_ref="main",
                             workspace_strategy="isolated_workspace")
    agent = make_agent(company)
    issue = IssueFactory(company=company, project=project, assignee_agent=agent, title="Write the notes")
    wake = board(company).post(f"/api/agents/{agent.pk}/wakeup", {"issueId": str(issue.pk), "reason": "assigned"},
                               format="json")
    assert wake.status_code == 201 and wake.json()["run"]["status"] == "queued"

    [run] = run_dispatched()
    run.refresh_from_db()
    issue.refresh_from_db()
    assert run.status == "succeeded" and run.liveness == "completed", run.error
    assert issue.status == "done" and issue.completed_at is not None
    assert (issue.checkout_run_id, issue.execution_run_id, issue.execution_locked_at) == (None, None, None)
    assert Comment.objects.filter(issue=issue, author_agent=agent, run=run).exists()
    workspace = run.workspace
    assert workspace.strategy == "isolated_workspace" and workspace.branch == f"paperclip/{issue.identifier}"
    assert (Path(workspace.path) / "NOTES.md").exists() and not (host / "NOTES.md").exists()
    assert git("rev-parse", "--abbrev-ref", "HEAD", cwd=workspace.path) == workspace.branch
    assert RunEvent.objects.filter(run=run, kind="stdout").exists()
    assert not any(k.key_hash in e.message for e in RunEvent.objects.filter(run=run) for k in run.api_keys.all())
    assert run.api_keys.filter(revoked_at__isnull=True).count() == 0  # the run's key died with it


@pytest.mark.django_db(transaction=True)
def test_parent_and_child_runs_get_independent_worktrees(host, company):
    project = ProjectFactory(company=company, repository=str(host), base_ref="main",
                             workspace_strategy="isolated_workspace")
    agent = make_agent(company)
    parent = IssueFactory(company=company, project=project, assignee_agent=agent)
    client = board(company)
    client.post(f"/api/agents/{agent.pk}/wakeup", {"issueId": str(parent.pk)}, format="json")
    [parent_run] = run_dispatched()
    parent_run.refresh_from_db()
    child = client.post(f"/api/companies/{company.pk}/issues", {
        "title": "child", "parentId": str(parent.pk), "assigneeAgentId": str(agent.pk),
        "executionWorkspaceId": str(parent_run.workspace_id)}, format="json").json()
    assert child["executionWorkspaceId"] is None  # an ancestor's workspace id is dropped
    client.post(f"/api/agents/{agent.pk}/wakeup", {"issueId": child["id"]}, format="json")
    [child_run] = run_dispatched()
    child_run.refresh_from_db()
    assert child_run.status == "succeeded", child_run.error
    assert child_run.workspace_id != parent_run.workspace_id
    assert child_run.workspace.path != parent_run.workspace.path
    assert Issue.objects.get(pk=parent.pk).execution_workspace_id == parent_run.workspace_id


@pytest.mark.django_db(transaction=True)
def test_issue_scoped_stop_kills_only_that_run(host, company):
    agent = make_agent(company, mode="sleep", EXAMPLE_AGENT_SLEEP="60")
    one, two = (IssueFactory(company=company, assignee_agent=agent) for _ in range(2))
    client = board(company)
    for issue in (one, two):
        client.post(f"/api/agents/{agent.pk}/wakeup", {"issueId": str(issue.pk)}, format="json")
    picked = dispatch.dispatch_runs()
    assert len(picked) == 2
    owner = runs.this_owner()
    results = {}

    def work(run_id):
        try:
            results[run_id] = dispatch.run_execute(run_id=run_id, owner=owner)
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(run_id,)) for run_id in picked]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while HeartbeatRun.objects.filter(pk__in=picked, pid__isnull=False).count() < 2:
        assert time.monotonic() < deadline, "agents did not start"
        time.sleep(0.1)
    run_one = HeartbeatRun.objects.get(issue=one)
    run_two = HeartbeatRun.objects.get(issue=two)
    assert client.post(f"/api/issues/{one.pk}/run/stop").status_code == 200
    threads[picked.index(run_one.pk)].join(timeout=30)
    assert not threads[picked.index(run_one.pk)].is_alive(), "the stopped run's executor hung"
    run_one.refresh_from_db()
    run_two.refresh_from_db()
    assert run_one.status == "cancelled" and run_one.stop_reason == "issue_stop"
    with pytest.raises(ProcessLookupError):
        os.kill(run_one.pid, 0)
    assert run_two.status == "running" and run_two.stop_requested_at is None
    os.kill(run_two.pid, 0)  # still alive
    agent.refresh_from_db()
    assert agent.status != "paused"
    client.post(f"/api/issues/{two.pk}/run/stop")
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "an executor hung"
    assert HeartbeatRun.objects.get(pk=run_two.pk).status == "cancelled"


@pytest.mark.django_db(transaction=True)
def test_budget_hard_stop_kills_the_running_process(host, company):
    agent = make_agent(company, mode="sleep", EXAMPLE_AGENT_SLEEP="60")
    agent.budget_monthly_cents = 50
    agent.save()
    issue = IssueFactory(company=company, assignee_agent=agent)
    board(company).post(f"/api/agents/{agent.pk}/wakeup", {"issueId": str(issue.pk)}, format="json")
    [run_id] = dispatch.dispatch_runs()
    done = {}
    worker = threading.Thread(target=lambda: (done.setdefault("run", dispatch.run_execute(
        run_id=run_id, owner=runs.this_owner())), connection.close()))
    worker.start()
    deadline = time.monotonic() + 30
    while not HeartbeatRun.objects.filter(pk=run_id, pid__isnull=False).exists():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    run = HeartbeatRun.objects.get(pk=run_id)
    # Usage arrives while the process works (as the agent's own heartbeat would report it).
    runs.run_heartbeat(actor=runs.SYSTEM, run=run, usage={"costCents": 80})
    worker.join(timeout=30)
    assert not worker.is_alive(), "the executor hung"
    run.refresh_from_db()
    assert run.status == "cancelled" and run.stop_reason == "budget_exceeded"
    with pytest.raises(ProcessLookupError):
        os.kill(run.pid, 0)
