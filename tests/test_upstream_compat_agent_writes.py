"""Agent writes as upstream Paperclip answers them (reference §2.3, §5.1, §7).

* The run header: only run-scoped writes (checkout, release, writes to the agent's own
  in_progress issue) need ``X-Paperclip-Run-Id``; a long-lived key creates issues, requests
  approvals, comments, labels and changes issues outside its own claim without it. A header
  given is still checked (an ended run is 409 ``run_not_live``); run-scoped keys stay strict.
* Release: the assignee (or anyone, for an unassigned issue) gives the issue back whatever its
  status; another agent gets 409 ``Only assignee can release issue``, another run while the
  holder lives 409 ``Only checkout run can release issue``.
* Wakeup: upstream's body fields are accepted and kept in the wake's context; an agent wakes
  only itself (403 ``Agent can only invoke itself``).
"""
import pytest
from django.utils import timezone

from issues.adapters import issue_run_key
from issues.models import ActivityLog, Approval, ApprovalComment, HeartbeatRun, Issue, Label, WakeupRequest
from tests.conftest import AgentClient
from tests.factories import AgentFactory, IssueFactory, RunFactory
from tests.test_errors import assert_error, error_of


@pytest.fixture
def me(make_agent_client, company):
    """A long-lived key with no run header (``me.use_run(run)`` adds one)."""
    return make_agent_client(company=company, with_run=False)


def rows(action, entity_id=None):
    qs = ActivityLog.objects.filter(action=action)
    return list(qs.filter(entity_id=str(entity_id)) if entity_id else qs)


def checkout(client, issue):
    response = client.post(f"/api/issues/{issue.pk}/checkout",
                           {"agentId": str(client.agent.pk), "expectedStatuses": ["todo"]}, format="json")
    assert response.status_code == 200, response.content
    return response


# --- 1. the run header ---------------------------------------------------------------------------------


def test_non_run_scoped_writes_need_no_run_header(me, company):
    created = me.post(f"/api/companies/{company.pk}/issues", {"title": "Delegated"}, format="json")
    assert created.status_code == 201, created.content
    [row] = rows("issue.created", created.json()["id"])
    assert row.run_id is None and row.client_run_id is None  # the row names no run
    issue = IssueFactory(company=company, assignee_agent=me.agent)  # its own todo issue
    patched = me.patch(f"/api/issues/{issue.pk}", {"title": "Renamed"}, format="json")
    assert patched.status_code == 200, patched.content
    assert me.post(f"/api/issues/{issue.pk}/comments", {"body": "note"}, format="json").status_code == 201
    assert me.put(f"/api/issues/{issue.pk}/documents/plan", {"body": "1. do it"}, format="json").status_code == 201
    blocker = IssueFactory(company=company)
    assert me.post(f"/api/issues/{issue.pk}/blockers", {"blockerId": str(blocker.pk)},
                   format="json").status_code == 201
    label = me.post(f"/api/companies/{company.pk}/labels", {"name": "infra", "color": "#112233"}, format="json")
    assert label.status_code == 201, label.content
    approval = me.post(f"/api/companies/{company.pk}/approvals",
                       {"type": "request_board_approval", "payload": {"title": "Buy"}, "issueIds": [str(issue.pk)]},
                       format="json")
    assert approval.status_code == 201, approval.content
    comment = me.post(f"/api/approvals/{approval.json()['id']}/comments", {"body": "why"}, format="json")
    assert comment.status_code == 201, comment.content
    assert Approval.objects.count() == ApprovalComment.objects.count() == Label.objects.count() == 1


def test_writes_to_the_agents_own_in_progress_issue_stay_run_scoped(me, company):
    issue = IssueFactory(company=company, assignee_agent=me.agent)
    assert me.post(f"/api/issues/{issue.pk}/comments", {"body": "before"}, format="json").status_code == 201
    run = RunFactory(agent=me.agent)
    checkout(me.use_run(run), issue)
    me.use_run(None)
    for method, path, body in [("patch", f"/api/issues/{issue.pk}", {"title": "x"}),
                               ("post", f"/api/issues/{issue.pk}/comments", {"body": "after"}),
                               ("put", f"/api/issues/{issue.pk}/documents/plan", {"body": "x"}),
                               ("post", f"/api/issues/{issue.pk}/release", None)]:
        assert_error(getattr(me, method)(path, body, format="json"), 401, "run_id_required")
    assert Issue.objects.get(pk=issue.pk).checkout_run_id == run.pk
    assert me.use_run(run).post(f"/api/issues/{issue.pk}/comments", {"body": "ok"}, format="json").status_code == 201


def test_another_agents_claim_is_the_409_without_a_header_too(me, make_agent_client, company):
    holder = make_agent_client(company=company)
    issue = IssueFactory(company=company, assignee_agent=holder.agent)
    checkout(holder, issue)
    assert_error(me.post(f"/api/issues/{issue.pk}/comments", {"body": "hi"}, format="json"), 409, "not_checkout_owner")


def test_a_header_given_is_still_checked(me, company):
    assert me.post(f"/api/companies/{company.pk}/issues", {"title": "no header"}, format="json").status_code == 201
    ended = RunFactory(agent=me.agent, status="succeeded", started_at=timezone.now(), finished_at=timezone.now())
    me.use_run(ended)
    error = assert_error(me.post(f"/api/companies/{company.pk}/issues", {"title": "late"}, format="json"),
                         409, "run_not_live")
    assert error["details"]["runId"] == str(ended.pk)
    live = RunFactory(agent=me.agent)
    created = me.use_run(live).post(f"/api/companies/{company.pk}/issues", {"title": "now"}, format="json")
    assert created.status_code == 201
    assert rows("issue.created", created.json()["id"])[0].run_id == live.pk  # recorded as before
    # A run-scoped key (host-injected) speaks only for its run; without a header it implies it.
    scoped = AgentClient(me.agent, issue_run_key(live), run=RunFactory(agent=me.agent))
    assert_error(scoped.post(f"/api/companies/{company.pk}/issues", {"title": "x"}, format="json"), 403, "run_mismatch")
    created = scoped.use_run(None).post(f"/api/companies/{company.pk}/issues", {"title": "y"}, format="json")
    assert created.status_code == 201 and rows("issue.created", created.json()["id"])[0].run_id == live.pk


def test_creating_an_issue_for_another_agent_wakes_it_without_a_header(me, company):
    me.agent.permissions = {"canAssignTasks": True}  # naming an assignee needs tasks:assign
    me.agent.save(update_fields=["permissions"])
    report = AgentFactory(company=company)
    created = me.post(f"/api/companies/{company.pk}/issues", {"title": "For you", "assigneeAgentId": str(report.pk)},
                      format="json")
    assert created.status_code == 201, created.content
    assert WakeupRequest.objects.filter(agent=report, issue_id=created.json()["id"]).exists()


# --- 2. release ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", ["todo", "backlog", "blocked", "done"])
def test_an_agent_releases_its_own_or_an_unassigned_issue_whatever_its_status(make_agent_client, company, status):
    me = make_agent_client(company=company)
    for assignee in (me.agent, None):
        issue = IssueFactory(company=company, status=status, assignee_agent=assignee,
                             completed_at=timezone.now() if status == "done" else None)
        response = me.post(f"/api/issues/{issue.pk}/release")
        assert response.status_code == 200, response.content
        body = response.json()
        assert (body["status"], body["assigneeAgentId"], body["checkoutRunId"]) == ("todo", None, None)
        assert Issue.objects.get(pk=issue.pk).completed_at is None
        assert len(rows("issue.released", issue.pk)) == 1


def test_only_the_assignee_releases(make_agent_client, company, board_client):
    me, other = make_agent_client(company=company), make_agent_client(company=company)
    theirs = IssueFactory(company=company, assignee_agent=other.agent)
    refused = me.post(f"/api/issues/{theirs.pk}/release")
    error = assert_error(refused, 409, "not_assignee")
    assert error["message"] == "Only assignee can release issue"
    assert error["details"]["assigneeAgentId"] == str(other.agent.pk)
    # Another agent's live claim: the same 409, naming the holder.
    checkout(other, theirs)
    error = assert_error(me.post(f"/api/issues/{theirs.pk}/release"), 409, "not_assignee")
    assert error["details"]["holderAgentId"] == str(other.agent.pk)
    row = Issue.objects.get(pk=theirs.pk)
    assert (row.status, row.assignee_agent_id, row.checkout_run_id) == ("in_progress", other.agent.pk, other.run.pk)
    assert not rows("issue.released")
    # The board releases any issue, claimed or not.
    todo = IssueFactory(company=company, assignee_agent=other.agent)
    assert board_client.post(f"/api/issues/{todo.pk}/release").json()["assigneeAgentId"] is None


def test_another_run_of_the_assignee_releases_only_a_lock_no_live_run_holds(make_agent_client, company):
    me = make_agent_client(company=company)
    issue = IssueFactory(company=company)
    checkout(me, issue)
    holder = me.run
    me.use_run(RunFactory(agent=me.agent))
    refused = me.post(f"/api/issues/{issue.pk}/release")
    error = assert_error(refused, 409, "not_checkout_owner")
    assert error["message"] == "Only checkout run can release issue"
    assert error["details"]["checkoutRunId"] == str(holder.pk) and error["details"]["actorRunId"] == str(me.run.pk)
    HeartbeatRun.objects.filter(pk=holder.pk).update(status="failed", finished_at=timezone.now())
    assert me.post(f"/api/issues/{issue.pk}/release").json()["status"] == "todo"
    assert len(rows("issue.released", issue.pk)) == 1


# --- 3. wakeup -------------------------------------------------------------------------------------------


def test_wakeup_accepts_upstreams_body_and_keeps_it_in_the_context(board_client, company):
    agent = AgentFactory(company=company)
    response = board_client.post(f"/api/agents/{agent.pk}/wakeup", {
        "source": "on_demand", "triggerDetail": "ping", "reason": "look", "payload": {"issueId": "PAP-1", "n": 2},
        "idempotencyKey": "k-1", "forceFreshSession": True}, format="json")
    assert response.status_code == 201, response.content
    wake = WakeupRequest.objects.get(agent=agent)
    expected = {"payload": {"issueId": "PAP-1", "n": 2}, "triggerDetail": "ping", "forceFreshSession": True}
    assert {k: wake.context.get(k) for k in expected} == expected
    run = HeartbeatRun.objects.get(pk=wake.run_id)
    assert {k: run.context.get(k) for k in expected} == expected  # the run is told too
    assert_error(board_client.post(f"/api/agents/{agent.pk}/wakeup", {"triggerDetail": "later"}, format="json"),
                 400, fields=["triggerDetail"])


def test_an_agent_wakes_only_itself(make_agent_client, company):
    me = make_agent_client(company=company)
    other = AgentFactory(company=company)
    for run in (me.run, None):
        error = assert_error(me.use_run(run).post(f"/api/agents/{other.pk}/wakeup", {"reason": "help"},
                                                  format="json"), 403, "agent_self_only")
        assert error["message"] == "Agent can only invoke itself"
    assert not WakeupRequest.objects.filter(agent=other).exists()
    own = me.post(f"/api/agents/{me.agent.pk}/wakeup", {"reason": "self", "payload": {"a": 1}}, format="json")
    assert own.status_code == 201, own.content
    assert error_of(me.post(f"/api/agents/{other.pk}/heartbeat/invoke"))["code"] == "agent_self_only"  # one rule
