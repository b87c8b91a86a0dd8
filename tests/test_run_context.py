"""The agent receives its context (issue #13): the same wake facts reach a real process (env vars
and the task packet file), an http agent (the signed wake payload) and the API
(``GET /api/runs/{id}``, ``GET /api/agents/me/wake``); coalesced wakes keep the newest; the
board's run lists; Symphony's branch_name / blocked_by / created_at from a real tracker import."""
import json
import re
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from connectors.providers.jira import _utc as jira_time
from connectors.sandbox import jira as jira_sb
from connectors.services.instances import instance_create
from issues import run_context
from issues.actors import SYSTEM, Actor
from issues.adapters import issue_run_key, prepare_context
from issues.adapters.http import SIGNATURE_HEADER, verify
from issues.adapters.registry import get_adapter
from issues.models import Comment, HeartbeatRun, Issue, RunEvent, WakeupRequest
from issues.services import dispatch, runs
from issues.services.approvals import approval_create
from issues.services.companies import agent_api_key_create
from issues.services.wakeups import agent_wakeup, wakeups_fold
from tests.factories import AgentFactory, CompanyFactory, IssueFactory, MembershipFactory, ProjectFactory, RunFactory
from tests.jira_sandbox import SANDBOX_EMAIL, SANDBOX_PROJECT, SANDBOX_TOKEN, SANDBOX_WEBHOOK_SECRET
from tests.test_adapters import Receiver
from tests.connector_helpers import delivery_headers

GIT = ["git", "-c", "user.name=Test", "-c", "user.email=test@example.invalid", "-c", "init.defaultBranch=main"]

# The agent: prints what it was given (every PAPERCLIP_* variable but the key, the packet file, its
# cwd) as one JSON line. DUMP_PLAN_FIRST=1 makes a first (non-continuation) run report plan_only.
DUMP = textwrap.dedent("""
    import json, os, pathlib
    env = {k: v for k, v in os.environ.items() if k.startswith("PAPERCLIP_") and k != "PAPERCLIP_API_KEY"}
    path = env.get("PAPERCLIP_TASK_PACKET_PATH")
    packet = pathlib.Path(path).read_text() if path and os.path.exists(path) else None
    print("CONTEXT " + json.dumps({"env": env, "packet": packet, "cwd": os.getcwd()}), flush=True)
    plan = os.environ.get("DUMP_PLAN_FIRST") and not env.get("PAPERCLIP_CONTINUATION_ATTEMPT")
    print("PAPERCLIP_RESULT " + json.dumps({"liveness": "plan_only" if plan else "completed", "reason": "dumped"}))
""")


def dump_agent(company, **env):
    return AgentFactory(company=company, adapter_type="process",
                        adapter_config={"command": [sys.executable, "-c", DUMP], "env": env},
                        runtime_config={"maxConcurrentRuns": 2})


def run_dispatched():
    return [dispatch.run_execute(run_id=run_id, owner=runs.this_owner()) for run_id in dispatch.dispatch_runs()]


def seen(run) -> dict:
    """What the agent process printed about its context."""
    for message in RunEvent.objects.filter(run=run, kind="stdout").order_by("seq").values_list("message", flat=True):
        if message.startswith("CONTEXT "):
            return json.loads(message[len("CONTEXT "):])
    raise AssertionError("\n".join(RunEvent.objects.filter(run=run).values_list("message", flat=True)))


def board(company):
    client = APIClient()
    client.force_login(MembershipFactory(company=company).user)
    return client


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


# --- a real process agent ------------------------------------------------------------------------

@pytest.mark.django_db
def test_comment_wake_reaches_the_process_with_its_comments_workspace_and_packet_file(company, repo):
    project = ProjectFactory(company=company, repository=str(repo), base_ref="main",
                             workspace_strategy="isolated_workspace")
    agent = dump_agent(company)
    issue = IssueFactory(company=company, project=project, assignee_agent=agent, title="Fix the login page",
                         description="Users cannot log in with SSO.")
    client = board(company)
    first = client.post(f"/api/issues/{issue.pk}/comments", {"body": "It fails on Safari."}, format="json").json()
    second = client.post(f"/api/issues/{issue.pk}/comments", {"body": "And on Firefox."}, format="json").json()
    [run] = HeartbeatRun.objects.filter(issue=issue)  # the second comment coalesced into the first's run

    [run] = run_dispatched()
    run.refresh_from_db()
    assert run.status == "succeeded", run.error
    got, workspace = seen(run), run.workspace
    env = got["env"]
    assert env["PAPERCLIP_WAKE_REASON"] == run.wake_reason == "issue_commented"
    assert env["PAPERCLIP_WAKE_COMMENT_ID"] == second["id"]  # the newest comment of the wake
    assert env["PAPERCLIP_WAKE_COMMENT_IDS"] == f"{first['id']},{second['id']}"
    assert env["PAPERCLIP_TASK_ID"] == str(issue.pk)
    payload = json.loads(env["PAPERCLIP_WAKE_PAYLOAD_JSON"])
    assert payload["issue"] == {"id": str(issue.pk), "identifier": issue.identifier, "title": "Fix the login page",
                                "status": "todo", "priority": "medium", "parentId": None}
    assert payload["reason"] == "issue_commented" and "fallbackFetchNeeded" not in payload
    assert [(c["id"], c["body"], c["authorType"]) for c in payload["comments"]] == [
        (first["id"], "It fails on Safari.", "user"), (second["id"], "And on Firefox.", "user")]
    # the workspace facts, and the packet in the workspace, invisible to git
    assert got["cwd"] == env["PAPERCLIP_WORKSPACE_CWD"] == workspace.path
    assert env["PAPERCLIP_WORKSPACE_ID"] == str(workspace.pk)
    assert env["PAPERCLIP_WORKSPACE_BRANCH"] == workspace.branch == f"paperclip/{issue.identifier}"
    assert env["PAPERCLIP_WORKSPACE_STRATEGY"] == "isolated_workspace"
    packet_path = Path(workspace.path) / ".paperclip" / "task-packet.md"
    assert env["PAPERCLIP_TASK_PACKET_PATH"] == str(packet_path)
    packet = got["packet"]
    assert packet.startswith(f"# {issue.identifier}: Fix the login page\n")
    assert "Reason: issue_commented" in packet and "> It fails on Safari." in packet and "> And on Firefox." in packet
    assert "Users cannot log in with SSO." in packet and f"POST /issues/{issue.pk}/checkout" in packet
    assert packet_path.read_text() == packet  # kept in the workspace after the run
    assert git("status", "--porcelain", cwd=workspace.path) == ""
    for name in ("PAPERCLIP_APPROVAL_ID", "PAPERCLIP_CONTINUATION_ATTEMPT", "PAPERCLIP_RETRY_ATTEMPT",
                 "PAPERCLIP_LINKED_ISSUE_IDS"):
        assert name not in env  # optional variables only when they have a value


@pytest.mark.django_db
def test_continuation_gets_attempt_and_instruction_and_a_temporary_packet_removed_after_the_run(company):
    agent = dump_agent(company, DUMP_PLAN_FIRST="1")
    issue = IssueFactory(company=company, assignee_agent=agent, status="in_progress", title="Write the changelog")
    assert board(company).post(f"/api/agents/{agent.pk}/wakeup", {"issueId": str(issue.pk), "reason": "issue_assigned"},
                               format="json").status_code == 201
    [first] = run_dispatched()
    first.refresh_from_db()
    assert first.liveness == "plan_only", first.error
    assert seen(first)["env"]["PAPERCLIP_WAKE_REASON"] == "issue_assigned"

    [second] = run_dispatched()  # the host's liveness continuation
    second.refresh_from_db()
    env, packet = seen(second)["env"], seen(second)["packet"]
    assert env["PAPERCLIP_WAKE_REASON"] == "liveness_continuation"
    assert env["PAPERCLIP_CONTINUATION_ATTEMPT"] == "1" == str(second.continuation_attempt)
    assert env["PAPERCLIP_CONTINUATION_INSTRUCTION"] == second.context["instruction"] != ""
    assert f"Continuation attempt 1: {second.context['instruction']}" in packet
    assert packet.startswith(f"# {issue.identifier}: Write the changelog\n")
    # no workspace: a private temp file, gone once the run is over
    assert "PAPERCLIP_WORKSPACE_CWD" not in env and "PAPERCLIP_WORKSPACE_ID" not in env
    path = Path(env["PAPERCLIP_TASK_PACKET_PATH"])
    assert path.name.startswith(f"paperclip-packet-{second.pk}-") and not path.exists()
    assert not Path(seen(first)["env"]["PAPERCLIP_TASK_PACKET_PATH"]).exists()


@pytest.mark.django_db
def test_approval_decision_reaches_the_process_with_the_approval_and_linked_issues(company):
    agent = dump_agent(company)
    issue = IssueFactory(company=company, assignee_agent=agent, title="Ship the pricing page")
    client = board(company)
    approval = approval_create(actor=Actor(user=MembershipFactory(company=company).user), company=company,
                               type="request_board_approval", payload={"question": "Ship it?"},
                               requested_by_agent_id=agent.pk, issue_ids=[issue.pk])
    response = client.post(f"/api/approvals/{approval.pk}/approve", {"decisionNote": "Go ahead"}, format="json")
    assert response.status_code == 200, response.content

    [run] = run_dispatched()
    got = seen(run)
    env = got["env"]
    assert env["PAPERCLIP_WAKE_REASON"] == "approval_approved"
    assert env["PAPERCLIP_APPROVAL_ID"] == str(approval.pk) and env["PAPERCLIP_APPROVAL_STATUS"] == "approved"
    assert env["PAPERCLIP_LINKED_ISSUE_IDS"] == str(issue.pk)
    assert f"Approval {approval.pk}: approved" in got["packet"]
    assert f"{issue.identifier} (todo): Ship the pricing page" in got["packet"]  # linked issues named


# --- the http adapter: the same fields in the signed payload --------------------------------------

@pytest.mark.django_db
def test_http_wake_payload_carries_the_same_context_as_the_process_env(company, monkeypatch):
    monkeypatch.setenv("PAPERCLIP_SECRET_TEST_WAKE_SECRET", "s3cret-wake-key")
    endpoint = Receiver(202)
    try:
        agent = AgentFactory(company=company, adapter_type="http", adapter_config={
            "url": endpoint.url, "secret_ref": "env:PAPERCLIP_SECRET_TEST_WAKE_SECRET"})
        issue = IssueFactory(company=company, assignee_agent=agent, title="Review the API", description="Spec v2")
        other = IssueFactory(company=company, title="The spec")
        comment = Comment.objects.create(company=company, issue=issue, author_type="user", body="x" * 5000)
        wake = agent_wakeup(actor=SYSTEM, agent=agent, issue=issue, reason="approval_approved",
                            comment_ids=[comment.pk],
                            context={"approvalId": "ap-1", "approvalStatus": "approved",
                                     "issueIds": [str(issue.pk), str(other.pk)], "continuationAttempt": 2,
                                     "instruction": "Keep going", "retryAttempt": 1})
        run = dispatch.run_execute(run_id=wake.run_id, owner=runs.this_owner())
        assert run.status == "running"  # accepted: the agent reports through the API
        [(_, headers, body)] = endpoint.requests
    finally:
        endpoint.close()
    assert verify(body, headers[SIGNATURE_HEADER], "s3cret-wake-key")
    payload = json.loads(body)
    assert payload["wakeReason"] == "approval_approved" and payload["wakeReasons"] == ["approval_approved"]
    assert payload["commentIds"] == [str(comment.pk)] and payload["wakeCommentId"] == str(comment.pk)
    assert (payload["approvalId"], payload["approvalStatus"]) == ("ap-1", "approved")
    assert payload["linkedIssueIds"] == [str(issue.pk), str(other.pk)]
    assert payload["continuation"] == {"attempt": 2, "instruction": "Keep going"} and payload["retryAttempt"] == 1
    assert payload["wakePayload"]["issue"]["identifier"] == issue.identifier
    assert payload["wakePayload"]["fallbackFetchNeeded"] is True  # the 5000-character body was capped
    assert len(payload["wakePayload"]["comments"][0]["body"]) == run_context.COMMENT_BODY_MAX_CHARS
    assert payload["taskPacket"].startswith(f"# {issue.identifier}: Review the API\n")
    assert f"{other.identifier} (todo): The spec" in payload["taskPacket"]

    # a process agent woken by the same run gets the same facts
    ctx = prepare_context(HeartbeatRun.objects.get(pk=run.pk), adapter=get_adapter("process"))
    env = ctx.env  # (the temp packet file lives as long as ctx)
    assert json.loads(env["PAPERCLIP_WAKE_PAYLOAD_JSON"]) == payload["wakePayload"]
    assert Path(env["PAPERCLIP_TASK_PACKET_PATH"]).read_text() == payload["taskPacket"]
    assert env["PAPERCLIP_WAKE_COMMENT_ID"] == payload["wakeCommentId"]
    assert env["PAPERCLIP_APPROVAL_STATUS"] == payload["approvalStatus"]
    assert env["PAPERCLIP_LINKED_ISSUE_IDS"].split(",") == payload["linkedIssueIds"]
    assert (env["PAPERCLIP_CONTINUATION_ATTEMPT"], env["PAPERCLIP_CONTINUATION_INSTRUCTION"]) == ("2", "Keep going")
    assert env["PAPERCLIP_RETRY_ATTEMPT"] == "1"


# --- observable wakes ------------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_agents_me_wake_shows_pending_wakes_and_the_queued_runs_reasons(live_server):
    company = CompanyFactory()
    agent = AgentFactory(company=company)
    _, key = agent_api_key_create(agent=agent)
    other = AgentFactory(company=company)
    held = IssueFactory(company=company, title="Held", status="in_progress", assignee_agent=other)
    free = IssueFactory(company=company, title="Free one")
    holder = RunFactory(agent=other, issue=held, status="running")
    Issue.objects.filter(pk=held.pk).update(execution_run=holder)
    deferred = agent_wakeup(actor=SYSTEM, agent=agent, issue=held, reason="issue_assigned")
    claimed = agent_wakeup(actor=SYSTEM, agent=agent, issue=free, reason="issue_assigned")
    comment = Comment.objects.create(company=company, issue=free, author_type="user", body="Please hurry")
    agent_wakeup(actor=SYSTEM, agent=agent, issue=free, reason="issue_commented", comment_ids=[comment.pk])
    assert deferred.status == "deferred_issue_execution" and claimed.status == "claimed"

    url = f"{live_server.url}/api/agents/me/wake"
    auth = {"Authorization": f"Bearer {key}"}
    body = httpx.get(url, headers=auth).json()
    assert body["agentId"] == str(agent.pk) and body["currentRun"] is None
    pending = {w["id"]: w for w in body["pendingWakes"]}
    assert set(pending) == {str(deferred.pk), str(claimed.pk)}  # the coalesced one rides on the run
    assert pending[str(deferred.pk)]["status"] == "deferred_issue_execution"
    assert pending[str(deferred.pk)]["issueId"] == str(held.pk)
    assert pending[str(claimed.pk)] | {"createdAt": None} == {
        "id": str(claimed.pk), "reason": "issue_assigned", "source": "on_demand", "issueId": str(free.pk),
        "status": "claimed", "runId": str(claimed.run_id), "createdAt": None}
    [live] = body["runs"]
    assert live["id"] == str(claimed.run_id) and live["status"] == "queued"
    assert live["wakeReason"] == "issue_commented"  # the newest reason is what the run starts with
    assert live["wakeReasons"] == ["issue_assigned", "issue_commented"]

    # naming the run (header or run-scoped key): that run's context
    current = httpx.get(url, headers={**auth, "X-Paperclip-Run-Id": str(claimed.run_id)}).json()["currentRun"]
    assert current["runId"] == str(claimed.run_id) and current["wakeReason"] == "issue_commented"
    assert current["commentIds"] == [str(comment.pk)] and current["wakeCommentId"] == str(comment.pk)
    assert current["continuation"] is None and current["approvalId"] is None
    assert current["taskPacket"].startswith(f"# {free.identifier}: Free one\n")
    assert "> Please hurry" in current["taskPacket"]
    run_key = issue_run_key(HeartbeatRun.objects.get(pk=claimed.run_id))
    by_key = httpx.get(url, headers={"Authorization": f"Bearer {run_key}"}).json()["currentRun"]
    assert by_key["runId"] == str(claimed.run_id)
    # another agent's run id names none of this agent's runs: only the client's own id, no context
    foreign = httpx.get(url, headers={**auth, "X-Paperclip-Run-Id": str(holder.pk)})
    assert foreign.status_code == 200 and foreign.json()["currentRun"] is None
    # GET /api/runs/{id} carries the same newest reasons
    run = httpx.get(f"{live_server.url}/api/runs/{claimed.run_id}", headers=auth).json()
    assert run["wakeReason"] == "issue_commented"
    assert run["context"]["wakeReasons"] == ["issue_assigned", "issue_commented"]

    refused = board(company).get("/api/agents/me/wake")  # a board credential is not an agent (as /agents/me)
    assert refused.status_code == 401 and refused.json()["code"] == "agent_auth_required"


@pytest.mark.django_db
def test_a_coalesced_wake_keeps_the_newest_reason_packet_and_context_in_one_update(company):
    agent = AgentFactory(company=company)
    issue = IssueFactory(company=company, assignee_agent=agent)
    first = agent_wakeup(actor=SYSTEM, agent=agent, issue=issue, reason="issue_assigned",
                         context={"taskPacket": "old packet", "approvalId": "ap-old", "keep": "me"})
    run = HeartbeatRun.objects.get(pk=first.run_id)
    assert run.context["wakeReasons"] == ["issue_assigned"]

    with CaptureQueriesContext(connection) as queries:
        agent_wakeup(actor=SYSTEM, agent=agent, issue=issue, reason="approval_approved",
                     context={"taskPacket": "new packet", "approvalId": "ap-new", "approvalStatus": "approved"})
    # PostgreSQL: the coalescing wake is one insert-only statement (the run row is written when the
    # wakes are folded, as the run starts); SQLite: the full path's one write of the run row
    run_updates = [q["sql"] for q in queries.captured_queries
                   for _ in re.finditer(r'UPDATE "?\w*heartbeatrun"? ', q["sql"], re.IGNORECASE)]
    assert len(run_updates) == (0 if connection.vendor == "postgresql" else 1)
    wakeups_fold(run_id=run.pk)
    run.refresh_from_db()
    assert run.wake_reason == "approval_approved"
    assert run.context["wakeReasons"] == ["issue_assigned", "approval_approved"]
    assert (run.context["taskPacket"], run.context["approvalId"], run.context["approvalStatus"]) == (
        "new packet", "ap-new", "approved")
    assert run.context["keep"] == "me"  # keys the newer wake does not name stay
    assert WakeupRequest.objects.get(pk=first.pk).coalesced_count == 1

    # comments: union in arrival order, the newest is the wake comment
    c1, c2 = (Comment.objects.create(company=company, issue=issue, author_type="user", body=b) for b in "ab")
    agent_wakeup(actor=SYSTEM, agent=agent, issue=issue, reason="issue_comment_mentioned", comment_ids=[c1.pk],
                 context={"wakeCommentId": str(c1.pk)})
    agent_wakeup(actor=SYSTEM, agent=agent, issue=issue, reason="issue_commented", comment_ids=[c2.pk])
    for n in range(25):
        agent_wakeup(actor=SYSTEM, agent=agent, issue=issue, reason=f"ping {n}")
    detail = board(company).get(f"/api/runs/{run.pk}").json()  # the API reads the wakes before a fold
    wakeups_fold(run_id=run.pk)
    run.refresh_from_db()
    assert run.context["commentIds"] == [str(c1.pk), str(c2.pk)]
    assert run_context.wake_facts(run).wake_comment_id == str(c2.pk)
    reasons = run.context["wakeReasons"]
    assert len(reasons) == run_context.WAKE_REASONS_KEPT and reasons[-1] == "ping 24" == run.wake_reason
    assert detail["wakeReason"] == "ping 24" and detail["context"]["wakeReasons"] == reasons


# --- the board's run lists --------------------------------------------------------------------------

@pytest.mark.django_db
def test_heartbeat_runs_and_live_runs_lists(company, make_agent_client):
    one, two = AgentFactory(company=company, name="One"), AgentFactory(company=company, name="Two")
    done = RunFactory(agent=one, status="succeeded", finished_at="2024-01-01T00:00:00Z")
    queued = agent_wakeup(actor=SYSTEM, agent=two, issue=IssueFactory(company=company), reason="issue_assigned").run
    running = RunFactory(agent=one, status="running", adapter_type="process")
    for age, run in enumerate((running, queued, done)):  # distinct creation times, newest first
        HeartbeatRun.objects.filter(pk=run.pk).update(created_at=timezone.now() - timedelta(minutes=age))
    stranger = CompanyFactory()
    RunFactory(agent=AgentFactory(company=stranger), status="running")
    client = board(company)

    listed = client.get(f"/api/companies/{company.pk}/heartbeat-runs").json()
    assert [r["id"] for r in listed] == [str(running.pk), str(queued.pk), str(done.pk)]  # newest first
    assert "context" not in listed[0] and listed[1]["wakeReasons"] == ["issue_assigned"]
    assert [r["id"] for r in client.get(f"/api/companies/{company.pk}/heartbeat-runs",
                                        {"agentId": str(one.pk), "limit": 1}).json()] == [str(running.pk)]
    for bad in ({"limit": 0}, {"limit": 1001}, {"limit": "x"}, {"agentId": "nope"}):
        response = client.get(f"/api/companies/{company.pk}/heartbeat-runs", bad)
        assert response.status_code == 400, bad
    live = client.get(f"/api/companies/{company.pk}/live-runs").json()
    assert [r["id"] for r in live] == [str(running.pk), str(queued.pk)]
    assert live[0] == {"id": str(running.pk), "status": "running", "invocationSource": "on_demand",
                       "triggerDetail": "manual",
                       "startedAt": None, "finishedAt": None, "createdAt": live[0]["createdAt"],
                       "agentId": str(one.pk), "agentName": "One", "adapterType": "process", "issueId": None}

    # a same-company agent reads them; another company's id is a 404 for everyone
    agent_client = make_agent_client(one)
    assert agent_client.get(f"/api/companies/{company.pk}/live-runs").status_code == 200
    assert agent_client.get(f"/api/companies/{company.pk}/heartbeat-runs").status_code == 200
    for path in ("heartbeat-runs", "live-runs"):
        assert client.get(f"/api/companies/{stranger.pk}/{path}").status_code == 404
        assert agent_client.get(f"/api/companies/{stranger.pk}/{path}").status_code == 404

    # bounded: the same number of queries whatever the number of runs
    def queries(path):
        with CaptureQueriesContext(connection) as captured:
            assert client.get(f"/api/companies/{company.pk}/{path}").status_code == 200
        return len(captured)

    before = {path: queries(path) for path in ("heartbeat-runs", "live-runs")}
    for _ in range(4):
        RunFactory(agent=AgentFactory(company=company), status="running")
    assert {path: queries(path) for path in ("heartbeat-runs", "live-runs")} == before


# --- Symphony variables from a real tracker import ---------------------------------------------------

def post_delivery(delivery, instance, capture):
    headers = delivery_headers(delivery)
    with capture(execute=True):
        return APIClient().post(f"/api/connectors/{instance.pk}/webhook", data=delivery.body,
                                content_type="application/json", **headers)


@pytest.mark.django_db
def test_a_task_imported_already_active_gets_its_packet_with_branch_blockers_and_creation_time(
        company, monkeypatch, django_capture_on_commit_callbacks):
    coder = dump_agent(company)
    project = ProjectFactory(company=company, branch_template="feature/{identifier}")
    monkeypatch.setenv("PAPERCLIP_SECRET_RC_JIRA_HOOK", SANDBOX_WEBHOOK_SECRET)
    with jira_sb.JiraSandbox(projects=(SANDBOX_PROJECT,), email=SANDBOX_EMAIL, token=SANDBOX_TOKEN,
                             webhook_secret=SANDBOX_WEBHOOK_SECRET) as sandbox:
        monkeypatch.setenv("PAPERCLIP_SECRET_RC_JIRA_CREDENTIALS", sandbox.credentials)
        instance = instance_create(
            actor=SYSTEM, company=company, name="jira-symphony", provider_key="jira", base_url=sandbox.base_url,
            containers=[SANDBOX_PROJECT], triage_agent_id=coder.pk, project_id=project.pk,
            state_mapping={"statuses": {"In Progress": "active"},
                           "categories": {"new": "backlog", "indeterminate": "active", "done": "terminal"}},
            credentials="env:PAPERCLIP_SECRET_RC_JIRA_CREDENTIALS", webhook_secret="env:PAPERCLIP_SECRET_RC_JIRA_HOOK",
            service_account_id=sandbox.service_user["accountId"], default_run_mode="symphony_compatible",
            routing_rules=[{"kind": "default_route", "agentId": coder.pk}],
            config={"taskPacketTemplate": "branch={{ issue.branch_name }} created={{ issue.created_at }}\n"
                                          "{% for b in issue.blocked_by %}blocker={{ b.identifier }} {{ b.state }}\n"
                                          "{% endfor %}{{ issue.title }}"})
        task = sandbox.create_issue("Migrate billing", project=SANDBOX_PROJECT)
        blocker = sandbox.create_issue("Upgrade the database", project=SANDBOX_PROJECT)
        sandbox.update_issue(blocker["id"], blocks=[task["id"]])
        sandbox.update_issue(task["id"], status="In Progress")
        # Paperclip first hears of the task when it is already active (earlier deliveries were lost).
        assert post_delivery(sandbox.deliveries[-1], instance, django_capture_on_commit_callbacks).status_code == 202
        created = jira_time(sandbox.issue(task["id"])["fields"]["created"])

    issue = Issue.objects.get(company=company, title__contains="Migrate billing")
    assert issue.status == "todo" and issue.assignee_agent_id == coder.pk
    wake = WakeupRequest.objects.get(source="connector", issue=issue)
    [run] = HeartbeatRun.objects.filter(issue=issue)  # the connector wake rode on the assignment run
    wakeups_fold(run_id=run.pk)  # as the run starts
    run.refresh_from_db()
    packet = run.context["taskPacket"]
    assert packet == wake.context["taskPacket"]
    assert packet.startswith(f"branch=feature/{issue.identifier} created={created.isoformat()}\n"
                             f"blocker={blocker['key']} ```untrusted-external state\nTo Do\n```\n")

    [run] = run_dispatched()  # the agent finds exactly that packet in its file
    assert seen(run)["packet"] == packet
    assert seen(run)["env"]["PAPERCLIP_WAKE_REASON"] == run.wake_reason == wake.reason
