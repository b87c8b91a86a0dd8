"""Linking approvals to an issue after the fact (paperclip-api.md §5.2 "Other issue routes"):
``GET|POST /api/issues/{id}/approvals`` and ``DELETE /api/issues/{id}/approvals/{approvalId}``. Board
users with a write role, agents with the CEO role or ``canCreateAgents``; another company's approval
or issue is a 404."""
import pytest

from issues.models import ActivityLog, Approval, ApprovalIssue, WakeupRequest
from tests.factories import AgentFactory, CompanyFactory, IssueFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def approval(company):
    requester = AgentFactory(company=company, name="Requester")
    return Approval.objects.create(company=company, type="request_board_approval", title="Ship it",
                                   requested_by_agent=requester)


def url(issue, approval=None):
    return f"/api/issues/{issue.pk}/approvals" + (f"/{approval.pk}" if approval else "")


def test_the_board_links_lists_and_unlinks(board_client, issue, approval):
    for _ in range(2):  # linking a linked approval changes nothing
        response = board_client.post(url(issue), {"approvalId": str(approval.pk)}, format="json")
        assert response.status_code == 201, response.content
        assert [a["id"] for a in response.json()] == [str(approval.pk)]
    assert ApprovalIssue.objects.filter(issue=issue, approval=approval).count() == 1
    assert ActivityLog.objects.filter(action="issue.approval_linked", entity_id=str(issue.pk)).count() == 1
    listed = board_client.get(url(issue)).json()
    assert [(a["id"], a["issueIds"]) for a in listed] == [(str(approval.pk), [str(issue.pk)])]

    for _ in range(2):
        response = board_client.delete(url(issue, approval))
        assert response.status_code == 200 and response.json() == {"ok": True}, response.content
    assert board_client.get(url(issue)).json() == []
    assert ActivityLog.objects.filter(action="issue.approval_unlinked", entity_id=str(issue.pk)).count() == 1


def test_a_linked_issue_is_what_the_decision_wakes_the_requester_on(board_client, issue, approval):
    assert board_client.post(url(issue), {"approvalId": str(approval.pk)}, format="json").status_code == 201
    assert board_client.post(f"/api/approvals/{approval.pk}/approve", {}, format="json").status_code == 200
    wake = WakeupRequest.objects.get(agent=approval.requested_by_agent)
    assert wake.context["issueId"] == str(issue.pk) and wake.issue_id == issue.pk


@pytest.mark.parametrize("grant", [{"role": "ceo"}, {"permissions": {"canCreateAgents": True}}])
def test_a_ceo_or_an_agent_that_creates_agents_links(make_agent_client, company, issue, approval, grant):
    agent = make_agent_client(company=company, **grant)
    response = agent.post(url(issue), {"approvalId": str(approval.pk)}, format="json")
    assert response.status_code == 201, response.content
    assert agent.delete(url(issue, approval)).status_code == 200


def test_other_agents_may_not_link_or_unlink(make_agent_client, company, issue, approval):
    worker = make_agent_client(company=company, role="engineer", permissions={"canAssignTasks": True})
    response = worker.post(url(issue), {"approvalId": str(approval.pk)}, format="json")
    assert response.status_code == 403, response.content
    assert response.json()["error"] == "Missing permission to link approvals"
    ApprovalIssue.objects.create(approval=approval, issue=issue)
    assert worker.delete(url(issue, approval)).status_code == 403
    assert ApprovalIssue.objects.filter(approval=approval, issue=issue).exists()
    assert worker.get(url(issue)).status_code == 200  # reading stays open to the company's agents


def test_another_companys_approval_or_issue_is_a_404(board_client, company, issue, approval):
    foreign_approval = Approval.objects.create(company=CompanyFactory(), title="Theirs")
    response = board_client.post(url(issue), {"approvalId": str(foreign_approval.pk)}, format="json")
    assert response.status_code == 404, response.content
    assert "approvalId" in response.json()["details"]
    foreign_issue = IssueFactory(company=foreign_approval.company)
    response = board_client.post(url(foreign_issue), {"approvalId": str(approval.pk)}, format="json")
    assert response.status_code == 404, response.content
    ApprovalIssue.objects.create(approval=foreign_approval, issue=foreign_issue)
    assert board_client.delete(url(foreign_issue, foreign_approval)).status_code == 404
    assert not ApprovalIssue.objects.filter(issue=issue).exists()
    assert ApprovalIssue.objects.filter(issue=foreign_issue).exists()


@pytest.mark.parametrize("body", [{}, {"approvalId": "nope"}, {"approvalId": 7}, {"approvalId": None}])
def test_a_bad_body_names_approval_id(board_client, issue, body):
    response = board_client.post(url(issue), body, format="json")
    assert response.status_code == 400, response.content
    assert "approvalId" in response.json()["details"]
