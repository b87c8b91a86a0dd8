"""``tasks:assign`` (paperclip-api.md §2.4, §5.2): an agent names or changes an assignee only with
the ``canAssignTasks`` grant, ``canCreateAgents`` or the CEO role; board users with a write role
assign freely; an agent may hand its own issue back to the person who created it."""
import pytest
from rest_framework.test import APIClient

from issues.models import ActivityLog, Issue, WakeupRequest
from tests.factories import AgentFactory, IssueFactory, MembershipFactory

pytestmark = pytest.mark.django_db

MISSING = "Missing permission: tasks:assign"


def issues_url(company):
    return f"/api/companies/{company.pk}/issues"


def _refused(response, field):
    assert response.status_code == 403, response.content
    body = response.json()
    assert body["error"] == MISSING and body["code"] == "missing_permission", body
    assert field in body["details"], body


@pytest.fixture
def worker(make_agent_client, company):
    """An engineer agent with no grant."""
    return make_agent_client(company=company, role="engineer", permissions={})


@pytest.fixture
def colleague(company):
    return AgentFactory(company=company, name="Colleague")


def test_an_agent_without_the_grant_cannot_create_an_assigned_issue(worker, colleague, company):
    before = Issue.objects.count()
    _refused(worker.post(issues_url(company), {"title": "For you", "assigneeAgentId": str(colleague.pk)},
                         format="json"), "assigneeAgentId")
    _refused(worker.post(issues_url(company), {"title": "For me", "assigneeAgentId": str(worker.agent.pk)},
                         format="json"), "assigneeAgentId")  # upstream: naming any assignee, itself too
    assert Issue.objects.count() == before
    assert not WakeupRequest.objects.filter(agent=colleague).exists()


def test_an_agent_without_the_grant_cannot_assign_a_person(worker, company):
    member = MembershipFactory(company=company, role="operator").user
    _refused(worker.post(issues_url(company), {"title": "For a person", "assigneeUserId": str(member.pk)},
                         format="json"), "assigneeUserId")


def test_an_agent_without_the_grant_still_creates_unassigned_work(worker, company):
    response = worker.post(issues_url(company), {"title": "Someone should"}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["assigneeAgentId"] is None


@pytest.mark.parametrize("grant", [{"role": "ceo"}, {"permissions": {"canAssignTasks": True}},
                                   {"permissions": {"canCreateAgents": True}}],
                         ids=["ceo", "canAssignTasks", "canCreateAgents"])
def test_the_grant_the_ceo_role_or_create_agents_allow_assigning(make_agent_client, company, colleague, grant):
    client = make_agent_client(company=company, **{"role": "engineer", **grant})
    response = client.post(issues_url(company), {"title": "Delegated", "assigneeAgentId": str(colleague.pk)},
                           format="json")
    assert response.status_code == 201, response.content
    issue = Issue.objects.get(pk=response.json()["id"])
    assert issue.assignee_agent_id == colleague.pk and issue.status == "todo"
    assert WakeupRequest.objects.filter(agent=colleague).exists()


def test_children_follow_the_same_rule(worker, colleague, company):
    parent = IssueFactory(company=company, assignee_agent=worker.agent)
    url = f"/api/issues/{parent.pk}/children"
    _refused(worker.post(url, {"title": "Sub", "assigneeAgentId": str(colleague.pk)}, format="json"),
             "assigneeAgentId")
    assert not parent.children.exists()
    assert worker.post(url, {"title": "Sub"}, format="json").status_code == 201


def test_an_agent_without_the_grant_cannot_reassign_its_issue(worker, colleague, company):
    issue = IssueFactory(company=company, assignee_agent=worker.agent, status="todo", title="Original")
    _refused(worker.patch(f"/api/issues/{issue.pk}", {"assigneeAgentId": str(colleague.pk), "title": "Renamed"},
                          format="json"), "assigneeAgentId")
    issue.refresh_from_db()
    assert (issue.assignee_agent_id, issue.title) == (worker.agent.pk, "Original")  # nothing half-written
    assert not ActivityLog.objects.filter(entity_id=str(issue.pk), action="issue.updated").exists()
    _refused(worker.patch(f"/api/issues/{issue.pk}", {"assigneeAgentId": None}, format="json"), "assigneeAgentId")
    # other fields stay the agent's to change
    assert worker.patch(f"/api/issues/{issue.pk}", {"priority": "high"}, format="json").status_code == 200


def test_a_granted_agent_reassigns(make_agent_client, colleague, company):
    client = make_agent_client(company=company, role="engineer", permissions={"canAssignTasks": True})
    issue = IssueFactory(company=company, assignee_agent=client.agent, status="todo")
    response = client.patch(f"/api/issues/{issue.pk}", {"assigneeAgentId": str(colleague.pk)}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["assigneeAgentId"] == str(colleague.pk)


def test_an_agent_hands_its_issue_back_to_its_creator_without_the_grant(worker, company):
    creator = MembershipFactory(company=company, role="operator").user
    other = MembershipFactory(company=company, role="operator").user
    issue = IssueFactory(company=company, assignee_agent=worker.agent, status="todo", created_by_user=creator)
    _refused(worker.patch(f"/api/issues/{issue.pk}", {"assigneeUserId": str(other.pk)}, format="json"),
             "assigneeUserId")
    response = worker.patch(f"/api/issues/{issue.pk}", {"assigneeAgentId": None, "assigneeUserId": str(creator.pk),
                                                        "status": "in_review"}, format="json")
    assert response.status_code == 200, response.content
    issue.refresh_from_db()
    assert (issue.assignee_agent_id, issue.assignee_user_id, issue.status) == (None, creator.pk, "in_review")


def test_the_board_grant_takes_effect_at_once(worker, colleague, company, board_client):
    url = f"/api/agents/{worker.agent.pk}/permissions"
    assert board_client.patch(url, {"canAssignTasks": True}, format="json").status_code == 200
    assert worker.post(issues_url(company), {"title": "Now I may", "assigneeAgentId": str(colleague.pk)},
                       format="json").status_code == 201
    assert board_client.patch(url, {"canAssignTasks": False}, format="json").status_code == 200
    _refused(worker.post(issues_url(company), {"title": "Not any more", "assigneeAgentId": str(colleague.pk)},
                         format="json"), "assigneeAgentId")


def test_board_operators_assign_without_a_grant(colleague, company):
    operator = MembershipFactory(company=company, role="operator").user
    client = APIClient()
    client.force_login(operator)
    response = client.post(issues_url(company), {"title": "From the board", "assigneeAgentId": str(colleague.pk)},
                           format="json")
    assert response.status_code == 201, response.content
