"""The foundation's wakeup endpoint: it records the request and returns a run id."""
from issues.models import HeartbeatRun, WakeupRequest
from issues.services.wakeups import wakeups_fold
from tests.factories import AgentFactory, IssueFactory


def wake(client, agent, **body):
    return client.post(f"/api/agents/{agent.pk}/wakeup", body, format="json")


def test_wake_creates_a_queued_run_and_first_use_marks_it_running(make_agent_client, company):
    client = make_agent_client(company=company, with_run=False)
    body = wake(client, client.agent, reason="start").json()
    assert body["status"] == "claimed" and body["run"]["status"] == "queued"
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {client.raw_key}", HTTP_X_PAPERCLIP_RUN_ID=body["runId"])
    issue = IssueFactory(company=company)
    assert client.post(f"/api/issues/{issue.pk}/comments", {"body": "hello"}, format="json").status_code == 201
    run = HeartbeatRun.objects.get(pk=body["runId"])
    assert run.status == "running" and run.started_at is not None


def test_wakes_for_same_agent_and_issue_coalesce_into_the_live_run(board_client, company):
    agent = AgentFactory(company=company)
    issue = IssueFactory(company=company)
    first = wake(board_client, agent, issueId=str(issue.pk)).json()
    second = wake(board_client, agent, issueId=str(issue.pk), commentIds=[]).json()
    assert second["coalesced"] is True and second["runId"] == first["runId"]
    assert HeartbeatRun.objects.filter(agent=agent).count() == 1
    wakeups_fold(run_id=first["runId"])  # as the run starts
    assert WakeupRequest.objects.get(pk=first["wakeupRequestId"]).coalesced_count == 1


def test_idempotency_key_dedupes(board_client, company):
    agent = AgentFactory(company=company)
    a = wake(board_client, agent, idempotencyKey="k1").json()
    b = wake(board_client, agent, idempotencyKey="k1").json()
    assert a["wakeupRequestId"] == b["wakeupRequestId"]
    assert WakeupRequest.objects.filter(agent=agent).count() == 1


def test_paused_over_budget_and_terminal_wakes_are_skipped_with_reason(board_client, company):
    paused = AgentFactory(company=company, status="paused")
    broke = AgentFactory(company=company, budget_monthly_cents=100, spent_monthly_cents=100)
    done_issue = IssueFactory(company=company, status="done")
    fine = AgentFactory(company=company)
    assert wake(board_client, paused).json()["skipReason"] == "agent_paused"
    assert wake(board_client, broke).json()["skipReason"] == "budget_exceeded"
    result = wake(board_client, fine, issueId=str(done_issue.pk)).json()
    assert result["status"] == "skipped" and result["skipReason"] == "issue_terminal" and result["runId"] is None
    assert not HeartbeatRun.objects.filter(agent__in=[paused, broke, fine]).exists()


def test_an_agent_wakes_only_itself(agent_client, company):
    # Upstream (ref §5.1): with or without its run, never another agent (403 agent_self_only).
    other = AgentFactory(company=company)
    assert wake(agent_client, other).status_code == 403
    agent_client.use_run(None)
    assert wake(agent_client, other).status_code == 403
