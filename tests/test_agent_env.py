"""What an agent process is given (paperclip-api.md §3), as upstream gives it: ``PAPERCLIP_API_URL``
is the server origin without ``/api`` (clients append ``/api/...``), whatever form the host's
setting takes (an old value ending in ``/api`` still works); the example agent, which appends
``/api`` when it is missing, still works its issue to done. Real processes through the dispatcher,
real HTTP back to a live server."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from issues.actors import SYSTEM, Actor
from issues.adapters.base import api_origin
from issues.models import Comment, RunEvent
from issues.run_context import _public_repo_url
from issues.services import dispatch, runs
from issues.services.approvals import approval_create, approval_decide
from issues.services.wakeups import agent_wakeup
from tests.factories import AgentFactory, IssueFactory, MembershipFactory, ProjectFactory

EXAMPLE_AGENT = str(Path(__file__).resolve().parent.parent / "examples" / "heartbeat_agent.py")
GIT = ["git", "-c", "user.name=Test", "-c", "user.email=test@example.invalid", "-c", "init.defaultBranch=main"]

# An upstream-style client: base = $PAPERCLIP_API_URL + "/api". It asks who it is, then prints
# every PAPERCLIP_* variable (and AGENT_HOME) but the key, and the task packet's text.
PROBE = textwrap.dedent("""
    import json, os, pathlib, urllib.request
    base = os.environ["PAPERCLIP_API_URL"] + "/api"
    request = urllib.request.Request(base + "/agents/me",
                                     headers={"Authorization": "Bearer " + os.environ["PAPERCLIP_API_KEY"]})
    with urllib.request.urlopen(request, timeout=10) as response:
        me = json.load(response)
    env = {k: v for k, v in os.environ.items()
           if (k.startswith("PAPERCLIP_") or k == "AGENT_HOME") and k != "PAPERCLIP_API_KEY"}
    packet = env.get("PAPERCLIP_TASK_PACKET_PATH")
    print("ENV " + json.dumps({"env": env, "me": me["id"], "cwd": os.getcwd(),
                               "packet": pathlib.Path(packet).read_text() if packet else None}), flush=True)
    print("PAPERCLIP_RESULT " + json.dumps({"liveness": "completed", "reason": "probed"}), flush=True)
""")


def git(*args, cwd):
    return subprocess.run([*GIT, *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(settings, tmp_path):
    settings.PAPERCLIP = {**settings.PAPERCLIP, "WORKSPACE_ROOT": str(tmp_path / "workspaces")}
    path = tmp_path / "repo"
    path.mkdir()
    git("init", cwd=path)
    (path / "README.md").write_text("hello\n")
    git("add", ".", cwd=path)
    git("commit", "-m", "initial", cwd=path)
    return path


def probe_agent(company):
    return AgentFactory(company=company, adapter_type="process",
                        adapter_config={"command": [sys.executable, "-c", PROBE], "grace_seconds": 1})


def run_one(agent=None, issue=None, reason="issue_assigned"):
    """Wake (when an agent is given) and run the one queued run to its end, as a worker does."""
    if agent is not None:
        agent_wakeup(actor=SYSTEM, agent=agent, reason=reason, issue=issue)
    [run_id] = dispatch.dispatch_runs()
    run = dispatch.run_execute(run_id=run_id, owner=runs.this_owner())
    run.refresh_from_db()
    return run


def probed(run) -> dict:
    for message in RunEvent.objects.filter(run=run, kind="stdout").order_by("seq").values_list("message", flat=True):
        if message.startswith("ENV "):
            return json.loads(message[len("ENV "):])
    raise AssertionError("\n".join(RunEvent.objects.filter(run=run).values_list("message", flat=True)))


# --- the origin ------------------------------------------------------------------------------------


@pytest.mark.parametrize("configured", ["{origin}", "{origin}/", "{origin}/api", "{origin}/api/"])
@pytest.mark.django_db(transaction=True)
def test_the_agent_gets_the_origin_and_reaches_the_api_by_appending_api(live_server, settings, company, configured):
    settings.PAPERCLIP = {**settings.PAPERCLIP, "API_URL": configured.format(origin=live_server.url)}
    agent = probe_agent(company)
    issue = IssueFactory(company=company, assignee_agent=agent)
    run = run_one(agent, issue)
    assert run.status == "succeeded", run.error
    got = probed(run)
    assert got["env"]["PAPERCLIP_API_URL"] == live_server.url  # no /api, no trailing slash
    assert got["me"] == str(agent.pk)  # $PAPERCLIP_API_URL/api/agents/me answered
    # The packet tells the agent the same.
    assert "Base URL: $PAPERCLIP_API_URL/api" in got["packet"]


@pytest.mark.django_db(transaction=True)
def test_the_example_agent_still_completes_its_issue_with_the_origin(live_server, settings, company):
    settings.PAPERCLIP = {**settings.PAPERCLIP, "API_URL": live_server.url}
    agent = AgentFactory(company=company, adapter_type="process",
                         adapter_config={"command": [sys.executable, EXAMPLE_AGENT],
                                         "env": {"EXAMPLE_AGENT_MODE": "done"}})
    issue = IssueFactory(company=company, assignee_agent=agent, title="Write the notes")
    run = run_one(agent, issue)
    issue.refresh_from_db()
    assert run.status == "succeeded" and run.liveness == "completed", run.error
    assert issue.status == "done" and issue.checkout_run_id is None
    assert Comment.objects.filter(issue=issue, author_agent=agent, run=run).exists()


@pytest.mark.parametrize("configured,origin", [
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
    ("http://127.0.0.1:8000/", "http://127.0.0.1:8000"),
    ("http://127.0.0.1:8000/api", "http://127.0.0.1:8000"),
    ("http://127.0.0.1:8000/api/", "http://127.0.0.1:8000"),
    ("http://127.0.0.1:8000/API", "http://127.0.0.1:8000"),
    (" http://host.internal/paperclip/api ", "http://host.internal/paperclip"),  # a proxy path prefix stays
    ("http://host.internal/apiary", "http://host.internal/apiary"),  # only a whole /api segment goes
])
def test_api_origin_drops_only_a_trailing_api_segment(configured, origin):
    assert api_origin(configured) == origin


def test_the_default_setting_is_an_origin():
    from django.conf import settings

    if "PAPERCLIP_API_URL" not in os.environ:
        assert settings.PAPERCLIP["API_URL"] == "http://127.0.0.1:8000"
    assert not api_origin(settings.PAPERCLIP["API_URL"]).endswith("/api")


# --- the other §3 variables ------------------------------------------------------------------------


@pytest.mark.parametrize("strategy,source", [("isolated_workspace", "task_session"),
                                             ("shared_workspace", "project_primary")])
@pytest.mark.django_db(transaction=True)
def test_the_run_gets_the_identity_wake_and_workspace_variables(live_server, settings, company, repo, strategy,
                                                                 source):
    settings.PAPERCLIP = {**settings.PAPERCLIP, "API_URL": live_server.url}
    # A URL repository (cloned by the host) so the workspace has a repo URL to report.
    project = ProjectFactory(company=company, repository=f"file://{repo}", base_ref="main",
                             workspace_strategy=strategy)
    agent = probe_agent(company)
    issue = IssueFactory(company=company, project=project, assignee_agent=agent)
    run = run_one(agent, issue, reason="issue_assigned")
    assert run.status == "succeeded", run.error
    got, workspace = probed(run), run.workspace
    env = got["env"]
    assert {k: env[k] for k in ("PAPERCLIP_AGENT_ID", "PAPERCLIP_COMPANY_ID", "PAPERCLIP_RUN_ID",
                                "PAPERCLIP_TASK_ID", "PAPERCLIP_WAKE_REASON")} == {
        "PAPERCLIP_AGENT_ID": str(agent.pk), "PAPERCLIP_COMPANY_ID": str(company.pk),
        "PAPERCLIP_RUN_ID": str(run.pk), "PAPERCLIP_TASK_ID": str(issue.pk), "PAPERCLIP_WAKE_REASON": "issue_assigned"}
    assert json.loads(env["PAPERCLIP_WAKE_PAYLOAD_JSON"])["issue"]["id"] == str(issue.pk)
    assert got["cwd"] == env["PAPERCLIP_WORKSPACE_CWD"] == workspace.path
    assert env["PAPERCLIP_WORKSPACE_ID"] == str(workspace.pk)
    assert env["PAPERCLIP_WORKSPACE_STRATEGY"] == strategy
    assert env["PAPERCLIP_WORKSPACE_SOURCE"] == source
    assert env["PAPERCLIP_WORKSPACE_REPO_URL"] == f"file://{repo}"
    # The ref the workspace was made from (a worktree of a clone starts at origin/main).
    assert env["PAPERCLIP_WORKSPACE_REPO_REF"] == workspace.base_ref
    assert workspace.base_ref in ("main", "origin/main")
    if strategy == "isolated_workspace":
        assert env["PAPERCLIP_WORKSPACE_WORKTREE_PATH"] == workspace.path
        assert env["PAPERCLIP_WORKSPACE_BRANCH"] == workspace.branch == f"paperclip/{issue.identifier}"
    else:
        assert "PAPERCLIP_WORKSPACE_WORKTREE_PATH" not in env
    for absent in ("AGENT_HOME", "PAPERCLIP_APPROVAL_ID", "PAPERCLIP_LINKED_ISSUE_IDS", "PAPERCLIP_WAKE_COMMENT_ID"):
        assert absent not in env  # optional variables only when the run has them


@pytest.mark.django_db(transaction=True)
def test_an_approval_wake_without_an_open_issue_still_names_the_task(live_server, settings, company):
    settings.PAPERCLIP = {**settings.PAPERCLIP, "API_URL": live_server.url}
    agent = probe_agent(company)
    done = IssueFactory(company=company, assignee_agent=agent, status="done")
    owner = Actor(user=MembershipFactory(company=company, role="owner").user)
    approval = approval_create(actor=owner, company=company, type="request_board_approval", payload={},
                               requested_by_agent_id=agent.pk, issue_ids=[done.pk])
    approval_decide(actor=owner, approval=approval, status="approved", note="ok")
    run = run_one()
    assert run.status == "succeeded" and run.issue_id is None, run.error
    env = probed(run)["env"]
    assert env["PAPERCLIP_TASK_ID"] == str(done.pk)  # upstream: the context's taskId
    assert env["PAPERCLIP_WAKE_REASON"] == "approval_approved"
    assert env["PAPERCLIP_APPROVAL_ID"] == str(approval.pk) and env["PAPERCLIP_APPROVAL_STATUS"] == "approved"
    assert env["PAPERCLIP_LINKED_ISSUE_IDS"] == str(done.pk)
    assert not any(name.startswith("PAPERCLIP_WORKSPACE_") and name != "PAPERCLIP_WORKSPACE_CWD" for name in env)


@pytest.mark.parametrize("repository,shown", [
    ("https://bot:s3cret-token@github.com/acme/app.git", "https://github.com/acme/app.git"),
    ("https://github.com/acme/app.git", "https://github.com/acme/app.git"),
    ("ssh://git@github.com/acme/app.git", "ssh://git@github.com/acme/app.git"),
    ("ssh://git:hunter2@github.com/acme/app.git", "ssh://git@github.com/acme/app.git"),
    ("git@github.com:acme/app.git", "git@github.com:acme/app.git"),
    ("/srv/repos/app", ""),  # a local path is not a remote URL
    ("", ""),
])
def test_the_repo_url_never_carries_credentials(repository, shown):
    assert _public_repo_url(repository) == shown

