"""The claim: one atomic conditional update, proven with real concurrent clients."""
import threading

import pytest
from django.db import connection
from django.test import Client

from issues.choices import RunStatus
from issues.models import ActivityLog, Issue, IssueRelation
from issues.services.companies import agent_api_key_create
from issues.services.runs import run_finish
from tests.factories import AgentFactory, IssueFactory, RunFactory

EXPECTED = ["todo", "backlog", "blocked", "in_review"]


def checkout(client, issue, agent, expected=EXPECTED):
    return client.post(f"/api/issues/{issue.pk}/checkout", {"agentId": str(agent.pk), "expectedStatuses": expected},
                       format="json")


def checkout_rows(issue):
    return ActivityLog.objects.filter(action="issue.checked_out", entity_id=str(issue.pk)).count()


@pytest.mark.django_db(transaction=True)
def test_checkout_race_twenty_contenders_fifty_trials(company):
    """20 agents race for each of 50 todo issues: exactly one 200, nineteen 409s, one activity row."""
    contenders = []
    for _ in range(20):
        agent = AgentFactory(company=company)
        _, raw = agent_api_key_create(agent=agent)
        contenders.append((agent, raw, RunFactory(agent=agent)))

    # The evidence is on PostgreSQL; SQLite serialises writers anyway, so fewer trials suffice there.
    trials = 50 if connection.vendor == "postgresql" else 10
    for trial in range(trials):
        issue = IssueFactory(company=company)
        barrier = threading.Barrier(len(contenders))
        results = [None] * len(contenders)

        def contend(index, agent, raw, run):
            try:
                client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}", HTTP_X_PAPERCLIP_RUN_ID=str(run.pk))
                barrier.wait(timeout=30)
                response = client.post(f"/api/issues/{issue.pk}/checkout",
                                       {"agentId": str(agent.pk), "expectedStatuses": ["todo"]},
                                       content_type="application/json")
                results[index] = (response.status_code, response.json(), agent.pk)
            finally:
                connection.close()

        threads = [threading.Thread(target=contend, args=(i, *c)) for i, c in enumerate(contenders)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

        codes = sorted(code for code, _, _ in results)
        assert codes == [200] + [409] * 19, f"trial {trial}: {codes}"
        winner = next(agent_id for code, _, agent_id in results if code == 200)
        issue.refresh_from_db()
        assert issue.assignee_agent_id == winner and issue.status == "in_progress"
        for code, body, _ in results:
            if code == 409:
                assert body["code"] == "checkout_conflict"
                assert body["details"]["assigneeAgentId"] == str(winner)
                assert body["details"]["checkoutRunId"] == str(issue.checkout_run_id)
        assert checkout_rows(issue) == 1


def test_checkout_sets_claim_fields_and_one_activity_row(agent_client, issue):
    response = checkout(agent_client, issue, agent_client.agent)
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "in_progress"
    assert body["assigneeAgentId"] == str(agent_client.agent.pk)
    assert body["checkoutRunId"] == body["executionRunId"] == str(agent_client.run.pk)
    assert body["startedAt"] and body["executionLockedAt"]
    assert checkout_rows(issue) == 1


def test_same_run_again_is_idempotent(agent_client, issue):
    first = checkout(agent_client, issue, agent_client.agent).json()
    again = checkout(agent_client, issue, agent_client.agent)
    assert again.status_code == 200
    assert again.json()["updatedAt"] == first["updatedAt"]
    assert again.json()["executionLockedAt"] == first["executionLockedAt"]
    assert checkout_rows(issue) == 1


def test_other_live_run_of_same_agent_gets_409(agent_client, issue):
    checkout(agent_client, issue, agent_client.agent)
    other_run = RunFactory(agent=agent_client.agent)
    response = checkout(agent_client.use_run(other_run), issue, agent_client.agent)
    assert response.status_code == 409
    details = response.json()["details"]
    assert set(details) == {"issueId", "status", "assigneeAgentId", "checkoutRunId", "executionRunId"}
    assert details["status"] == "in_progress"


@pytest.mark.parametrize("ending", ["terminal", "missing"])
def test_stale_run_of_same_agent_is_adopted(agent_client, issue, ending):
    first_run = agent_client.run
    checkout(agent_client, issue, agent_client.agent)
    if ending == "terminal":
        # Simulate a crash that left the lock behind: the run ended without the release path.
        type(first_run).objects.filter(pk=first_run.pk).update(status=RunStatus.FAILED, finished_at=first_run.created_at)
    else:
        first_run.delete()  # FK set null: the claim's run is gone
    issue.refresh_from_db()
    assert issue.status == "in_progress"
    new_run = RunFactory(agent=agent_client.agent)
    response = checkout(agent_client.use_run(new_run), issue, agent_client.agent)
    assert response.status_code == 200
    assert response.json()["checkoutRunId"] == str(new_run.pk)
    assert checkout_rows(issue) == 2


def test_stale_run_of_another_agent_is_not_adopted(make_agent_client, company, issue):
    owner = make_agent_client(company=company)
    checkout(owner, issue, owner.agent)
    run_finish(run=owner.run, status=RunStatus.FAILED)
    other = make_agent_client(company=company)
    response = checkout(other, issue, other.agent)
    assert response.status_code == 409
    assert response.json()["details"]["assigneeAgentId"] == str(owner.agent.pk)


def test_open_blocker_is_422_and_done_blocker_is_not(agent_client, company, issue):
    blocker = IssueFactory(company=company, status="in_progress", assignee_agent=agent_client.agent)
    IssueRelation.objects.create(company=company, issue=blocker, related_issue=issue)
    response = checkout(agent_client, issue, agent_client.agent)
    assert response.status_code == 422
    assert response.json()["details"]["blockers"] == [blocker.identifier]
    issue.refresh_from_db()
    assert issue.status == "todo" and issue.checkout_run_id is None
    Issue.objects.filter(pk=blocker.pk).update(status="done")
    assert checkout(agent_client, issue, agent_client.agent).status_code == 200


@pytest.mark.parametrize("statuses", [["nonsense"], ["todo", "nonsense"], [], "todo"])
def test_expected_statuses_outside_the_status_enum_are_400(agent_client, issue, statuses):
    # Every status of the enum is accepted (tests/test_agent_key_run_ids.py: in_progress re-claims).
    response = checkout(agent_client, issue, agent_client.agent, expected=statuses)
    assert response.status_code == 400
    assert "expectedStatuses" in response.json()["details"]


def test_status_not_expected_is_409(agent_client, company):
    issue = IssueFactory(company=company, status="backlog")
    response = checkout(agent_client, issue, agent_client.agent, expected=["todo"])
    assert response.status_code == 409
    assert response.json()["details"]["status"] == "backlog"


def test_agent_cannot_check_out_for_another_agent(agent_client, company, issue):
    other = AgentFactory(company=company)
    response = checkout(agent_client, issue, other)
    assert response.status_code == 403
    assert Issue.objects.get(pk=issue.pk).status == "todo"


def test_issue_assigned_to_someone_else_is_409(agent_client, company):
    issue = IssueFactory(company=company, assignee_agent=AgentFactory(company=company))
    assert checkout(agent_client, issue, agent_client.agent).status_code == 409


def test_writes_to_in_progress_issue_need_the_owning_run(agent_client, company, issue, board_client):
    checkout(agent_client, issue, agent_client.agent)
    intruder_run = RunFactory(agent=agent_client.agent)
    agent_client.use_run(intruder_run)
    for response in (
        agent_client.patch(f"/api/issues/{issue.pk}", {"title": "hijack"}, format="json"),
        agent_client.post(f"/api/issues/{issue.pk}/comments", {"body": "hi"}, format="json"),
        agent_client.put(f"/api/issues/{issue.pk}/documents/plan", {"body": "x"}, format="json"),
    ):
        assert response.status_code == 409
        assert response.json()["code"] == "not_checkout_owner"
    assert Issue.objects.get(pk=issue.pk).title == issue.title
    # Board users bypass the run check.
    assert board_client.post(f"/api/issues/{issue.pk}/comments", {"body": "board note"}, format="json").status_code == 201


def test_release_by_owning_run_clears_locks(agent_client, issue):
    checkout(agent_client, issue, agent_client.agent)
    response = agent_client.post(f"/api/issues/{issue.pk}/release")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "todo"
    assert body["checkoutRunId"] is None and body["executionRunId"] is None and body["executionLockedAt"] is None
    assert ActivityLog.objects.filter(action="issue.released", entity_id=str(issue.pk)).count() == 1


def test_release_by_other_run_refused_unless_holder_is_stale(make_agent_client, company, issue):
    owner = make_agent_client(company=company)
    checkout(owner, issue, owner.agent)
    holder = owner.run
    # Another run of the assignee (release is the assignee's: another agent gets 409, see test_fences).
    other = make_agent_client(owner.agent, company=company)
    refused = other.post(f"/api/issues/{issue.pk}/release")
    assert refused.status_code == 409 and refused.json()["error"] == "Only checkout run can release issue"
    type(holder).objects.filter(pk=holder.pk).update(status=RunStatus.TIMED_OUT, finished_at=holder.created_at)
    assert other.post(f"/api/issues/{issue.pk}/release").status_code == 200


def test_run_ending_in_any_terminal_state_releases_the_lock(make_agent_client, company):
    for status in ("succeeded", "failed", "cancelled", "timed_out", "interrupted"):
        client = make_agent_client(company=company)
        issue = IssueFactory(company=company)
        checkout(client, issue, client.agent)
        run_finish(run=client.run, status=status)
        issue.refresh_from_db()
        assert (issue.checkout_run_id, issue.execution_run_id, issue.execution_locked_at) == (None, None, None), status
        # The same agent's next run picks it up again without any manual repair.
        next_run = RunFactory(agent=client.agent)
        assert checkout(client.use_run(next_run), issue, client.agent).status_code == 200


def test_board_checkout_needs_a_live_run_of_that_agent(board_client, company, issue):
    agent = AgentFactory(company=company)
    response = board_client.post(f"/api/issues/{issue.pk}/checkout",
                                 {"agentId": str(agent.pk), "expectedStatuses": ["todo"]}, format="json")
    assert response.status_code == 422
    run = RunFactory(agent=agent)
    response = board_client.post(f"/api/issues/{issue.pk}/checkout",
                                 {"agentId": str(agent.pk), "expectedStatuses": ["todo"]}, format="json",
                                 HTTP_X_PAPERCLIP_RUN_ID=str(run.pk))
    assert response.status_code == 200
    assert response.json()["checkoutRunId"] == str(run.pk)
