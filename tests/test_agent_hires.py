"""Hiring (``POST /api/companies/{id}/agent-hires``, paperclip-api.md §5.1, §5.3): who may create
agents may hire; when the company requires board approval for new agents the hire waits as
``pending_approval`` beside a ``hire_agent`` approval, and the board's decision settles it."""
import pytest
from rest_framework.test import APIClient

from issues.models import ActivityLog, Agent, Approval, WakeupRequest
from issues.services.companies import agent_api_key_create
from tests.factories import AgentFactory, CompanyFactory, IssueFactory, MembershipFactory

pytestmark = pytest.mark.django_db

SECRET = "sk-live-very-secret-value"


def hires_url(company):
    return f"/api/companies/{company.pk}/agent-hires"


def draft(**extra):
    return {"name": "Analyst", "role": "researcher", "title": "Market analyst", "adapterType": "none",
            "adapterConfig": {"model": "large", "env": {"OPENAI_API_KEY": SECRET}},
            "budgetMonthlyCents": 5000, **extra}


@pytest.fixture
def requires_approval(company, board_client):
    response = board_client.patch(f"/api/companies/{company.pk}", {"requireBoardApprovalForNewAgents": True},
                                  format="json")
    assert response.status_code == 200, response.content
    assert response.json()["requireBoardApprovalForNewAgents"] is True
    return company


@pytest.fixture
def hirer(make_agent_client, company):
    """A manager agent allowed to create agents."""
    return make_agent_client(company=company, role="cto", name="Hiring manager", permissions={"canCreateAgents": True})


def agent_key_client(agent):
    _, raw = agent_api_key_create(agent=agent)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def hire(client, company, **extra):
    response = client.post(hires_url(company), draft(**extra), format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    return Agent.objects.get(pk=body["agent"]["id"]), body


def test_without_the_rule_a_hire_starts_idle_with_no_approval(board_client, company):
    agent, body = hire(board_client, company)
    assert body["approval"] is None
    assert body["agent"]["status"] == agent.status == "idle"
    assert body["agent"]["adapterConfig"]["env"]["OPENAI_API_KEY"] == SECRET  # the board reads its config whole
    entry = ActivityLog.objects.get(action="agent.hire_created", entity_id=str(agent.pk))
    assert entry.details["requiresApproval"] is False and entry.details["approvalId"] is None


def test_with_the_rule_a_hire_waits_beside_a_hire_approval(requires_approval, hirer, company):
    asked_in = IssueFactory(company=company)
    agent, body = hire(hirer, company, reportsTo=str(hirer.agent.pk), sourceIssueId=str(asked_in.pk))
    assert body["agent"]["status"] == agent.status == "pending_approval"
    approval = body["approval"]
    assert (approval["type"], approval["status"]) == ("hire_agent", "pending")
    assert approval["requestedByAgentId"] == str(hirer.agent.pk)
    assert approval["issueIds"] == [str(asked_in.pk)]
    payload = approval["payload"]
    assert payload["agentId"] == str(agent.pk) and payload["requestedByAgentId"] == str(hirer.agent.pk)
    assert (payload["name"], payload["role"], payload["reportsTo"], payload["budgetMonthlyCents"]) == (
        "Analyst", "researcher", str(hirer.agent.pk), 5000)
    # approvals are read by agents: the draft's secret-looking literals are redacted, the agent keeps them
    assert payload["adapterConfig"]["env"]["OPENAI_API_KEY"] == "[redacted]"
    assert SECRET not in str(Approval.objects.get(pk=approval["id"]).payload)
    assert agent.adapter_config["env"]["OPENAI_API_KEY"] == SECRET
    assert ActivityLog.objects.filter(action="approval.created", entity_id=approval["id"]).exists()


def test_a_pending_agent_neither_authenticates_nor_takes_work_nor_wakes(requires_approval, board_client, company):
    agent, _ = hire(board_client, company)
    response = agent_key_client(agent).get("/api/agents/me")
    assert response.status_code == 401, response.content

    issue = IssueFactory(company=company)
    response = board_client.patch(f"/api/issues/{issue.pk}", {"assigneeAgentId": str(agent.pk)}, format="json")
    assert response.status_code == 409, response.content
    assert response.json()["error"] == "Cannot assign work to pending approval agents"
    issue.refresh_from_db()
    assert issue.assignee_agent_id is None

    response = board_client.post(f"/api/agents/{agent.pk}/heartbeat/invoke", format="json")
    assert response.status_code == 202, response.content
    assert (response.json()["status"], response.json()["reason"]) == ("skipped", "agent_pending_approval")

    # only the approval settles it: no resume, pause or status change sneaks it past the board
    for method, url, data in (("post", f"/api/agents/{agent.pk}/resume", None),
                              ("post", f"/api/agents/{agent.pk}/pause", None),
                              ("patch", f"/api/agents/{agent.pk}", {"status": "idle"})):
        response = getattr(board_client, method)(url, data, format="json")
        assert response.status_code == 409, (url, response.content)
        assert response.json()["code"] == "agent_pending_approval"
    agent.refresh_from_db()
    assert agent.status == "pending_approval"


def set_company_status(board_client, company, status, capture):
    with capture(execute=True) as callbacks:  # the stop's sync runs once the change commits
        response = board_client.patch(f"/api/companies/{company.pk}", {"status": status}, format="json")
    assert response.status_code == 200, response.content
    assert callbacks, "the company's agents were not synced"


def test_a_company_stop_and_its_lift_leave_a_pending_hire_pending(requires_approval, board_client, company,
                                                                  django_capture_on_commit_callbacks):
    agent, _ = hire(board_client, company)
    working = AgentFactory(company=company, name="Working")
    for status, working_status in (("paused", "paused"), ("active", "idle")):
        set_company_status(board_client, company, status, django_capture_on_commit_callbacks)
        agent.refresh_from_db()
        working.refresh_from_db()
        assert (agent.status, working.status) == ("pending_approval", working_status), status


def test_approving_the_hire_starts_the_agent_and_wakes_the_hirer(requires_approval, hirer, board_client, company):
    agent, body = hire(hirer, company)
    response = board_client.post(f"/api/approvals/{body['approval']['id']}/approve", {"decisionNote": "Welcome"},
                                 format="json")
    assert response.status_code == 200, response.content
    agent.refresh_from_db()
    assert agent.status == "idle"
    assert agent_key_client(agent).get("/api/agents/me").status_code == 200
    assert WakeupRequest.objects.filter(agent=hirer.agent, reason="approval_approved").exists()
    assert ActivityLog.objects.filter(action="agent.hire_approved", entity_id=str(agent.pk)).exists()
    # assignable now
    issue = IssueFactory(company=company)
    response = board_client.patch(f"/api/issues/{issue.pk}", {"assigneeAgentId": str(agent.pk)}, format="json")
    assert response.status_code == 200, response.content


def test_rejecting_the_hire_terminates_the_agent(requires_approval, board_client, company):
    agent, body = hire(board_client, company)
    response = board_client.post(f"/api/approvals/{body['approval']['id']}/reject", {"decisionNote": "No budget"},
                                 format="json")
    assert response.status_code == 200, response.content
    agent.refresh_from_db()
    assert agent.status == "terminated"


def test_a_hire_approved_in_a_paused_company_starts_when_it_resumes(requires_approval, board_client, company,
                                                                    django_capture_on_commit_callbacks):
    agent, body = hire(board_client, company)
    set_company_status(board_client, company, "paused", django_capture_on_commit_callbacks)
    assert board_client.post(f"/api/approvals/{body['approval']['id']}/approve", {},
                             format="json").status_code == 200
    agent.refresh_from_db()
    assert (agent.status, agent.pause_reason) == ("paused", "company_paused")
    set_company_status(board_client, company, "active", django_capture_on_commit_callbacks)
    agent.refresh_from_db()
    assert agent.status == "idle"


def test_an_agent_without_the_create_grant_cannot_hire(make_agent_client, company):
    worker = make_agent_client(company=company, role="engineer", permissions={})
    before = Agent.objects.count()
    response = worker.post(hires_url(company), draft(), format="json")
    assert response.status_code == 403, response.content
    assert response.json()["error"] == "Missing permission: agents:create"
    assert Agent.objects.count() == before


@pytest.mark.parametrize("body,field,code", [
    ({"adapterType": "none"}, "name", 400),
    ({**draft(), "role": "wizard"}, "role", 400),
    ({**draft(), "sourceIssueIds": ["not-a-uuid"]}, "sourceIssueIds", 400),
    ({**draft(), "hiredBy": "me"}, "hiredBy", 400),
])
def test_bad_input_names_the_field_and_writes_nothing(requires_approval, board_client, company, body, field, code):
    before = (Agent.objects.count(), Approval.objects.count())
    response = board_client.post(hires_url(company), body, format="json")
    assert response.status_code == code, response.content
    assert field in response.json()["details"], response.json()
    assert (Agent.objects.count(), Approval.objects.count()) == before


def test_another_companys_issue_is_a_404_and_nothing_is_written(requires_approval, board_client, company):
    foreign = IssueFactory(company=CompanyFactory())
    before = (Agent.objects.count(), Approval.objects.count())
    response = board_client.post(hires_url(company), draft(sourceIssueIds=[str(foreign.pk)]), format="json")
    assert response.status_code == 404, response.content
    assert "sourceIssueIds" in response.json()["details"]
    assert (Agent.objects.count(), Approval.objects.count()) == before


def test_another_companys_hires_are_a_404(board_client):
    other = CompanyFactory()
    response = board_client.post(hires_url(other), draft(), format="json")
    assert response.status_code == 404, response.content
    assert not Agent.objects.filter(company=other).exists()


def test_only_the_board_sets_the_rule(make_agent_client, company):
    ceo = make_agent_client(company=company, role="ceo")
    response = ceo.patch(f"/api/companies/{company.pk}", {"requireBoardApprovalForNewAgents": True}, format="json")
    assert response.status_code == 403, response.content
    company.refresh_from_db()
    assert company.require_board_approval_for_new_agents is False


def test_a_hire_approval_filed_with_a_draft_alone_creates_the_agent_on_approval(board_client, company):
    response = board_client.post(f"/api/companies/{company.pk}/approvals",
                                 {"type": "hire_agent", "payload": {"name": "Drafted", "role": "qa"}}, format="json")
    assert response.status_code == 201, response.content
    approval_id = response.json()["id"]
    assert not Agent.objects.filter(company=company, name="Drafted").exists()
    assert board_client.post(f"/api/approvals/{approval_id}/approve", {}, format="json").status_code == 200
    agent = Agent.objects.get(company=company, name="Drafted")
    assert (agent.role, agent.status, agent.adapter_type) == ("qa", "idle", "none")


def test_a_draft_that_cannot_be_created_fails_the_approval_as_a_whole(board_client, company):
    AgentFactory(company=company, name="Taken")
    for payload, field in (({"role": "qa"}, "payload.name"), ({"name": "Taken"}, "payload.name"),
                           ({"name": "Someone", "budgetMonthlyCents": "lots"}, "payload.budgetMonthlyCents")):
        response = board_client.post(f"/api/companies/{company.pk}/approvals",
                                     {"type": "hire_agent", "payload": payload}, format="json")
        approval_id = response.json()["id"]
        response = board_client.post(f"/api/approvals/{approval_id}/approve", {}, format="json")
        assert response.status_code in (400, 409), response.content
        assert field in response.json()["details"], response.json()
        assert Approval.objects.get(pk=approval_id).status == "pending"


def test_a_board_user_without_a_write_role_cannot_hire(company):
    viewer = MembershipFactory(company=company, role="viewer").user
    client = APIClient()
    client.force_login(viewer)
    response = client.post(hires_url(company), draft(), format="json")
    assert response.status_code == 403, response.content
    assert not Agent.objects.filter(company=company, name="Analyst").exists()


def test_the_console_shows_a_pending_hire_with_its_approval_and_no_pause(requires_approval, board_client, company):
    from django.urls import reverse

    agent, body = hire(board_client, company)
    page = board_client.get(reverse("console:agent-detail", args=[agent.pk])).content.decode()
    assert 'id="hire-pending"' in page
    assert reverse("console:approval-detail", args=[body["approval"]["id"]]) in page
    assert reverse("console:agent-pause", args=[agent.pk]) not in page
    approval_page = board_client.get(reverse("console:approval-detail", args=[body["approval"]["id"]])).content.decode()
    assert 'id="hired-agent"' in approval_page and reverse("console:agent-detail", args=[agent.pk]) in approval_page
    # approving from the console settles it the same way
    response = board_client.post(reverse("console:approval-decide", args=[body["approval"]["id"]]),
                                 {"decision": "approve", "note": ""})
    assert response.status_code in (200, 302), response.content
    agent.refresh_from_db()
    assert agent.status == "idle"
    page = board_client.get(reverse("console:agent-detail", args=[agent.pk])).content.decode()
    assert 'id="hire-pending"' not in page and reverse("console:agent-pause", args=[agent.pk]) in page


def test_deciding_the_hire_of_a_deleted_agent_decides_the_approval_alone(requires_approval, board_client, company):
    agent, body = hire(board_client, company)
    assert board_client.delete(f"/api/agents/{agent.pk}").status_code == 200
    response = board_client.post(f"/api/approvals/{body['approval']['id']}/approve", {}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "approved"
    assert not Agent.objects.filter(pk=agent.pk).exists()


def test_a_ceo_creates_agents_by_default_unless_the_board_said_no(make_agent_client, board_client, company):
    """Upstream's normalizeAgentPermissions: canCreateAgents not set is the role's default (CEO: yes)."""
    ceo = make_agent_client(company=company, role="ceo", permissions={})
    assert ceo.get("/api/agents/me").json()["permissions"]["canCreateAgents"] is True
    agent, _ = hire(ceo, company)
    assert agent.status == "idle"
    response = board_client.patch(f"/api/agents/{ceo.agent.pk}/permissions", {"canCreateAgents": False},
                                  format="json")
    assert response.status_code == 200 and response.json()["permissions"]["canCreateAgents"] is False
    response = ceo.post(hires_url(company), draft(name="Second"), format="json")
    assert response.status_code == 403, response.content
    engineer = make_agent_client(company=company, role="engineer", permissions={})
    assert engineer.get("/api/agents/me").json()["permissions"]["canCreateAgents"] is False


def test_what_the_board_approves_is_what_is_hired(requires_approval, hirer, board_client, company):
    """A revision request, a resubmitted draft: the approved profile is applied before the agent starts."""
    agent, body = hire(hirer, company)
    approval_id = body["approval"]["id"]
    response = board_client.post(f"/api/approvals/{approval_id}/request-revision",
                                 {"decisionNote": "Lower the budget"}, format="json")
    assert response.status_code == 200, response.content
    payload = {**body["approval"]["payload"], "budgetMonthlyCents": 2000, "title": "Junior analyst"}
    response = hirer.post(f"/api/approvals/{approval_id}/resubmit", {"payload": payload}, format="json")
    assert response.status_code == 200, response.content

    bad = {**payload, "role": "wizard"}
    board_client.post(f"/api/approvals/{approval_id}/request-revision", {}, format="json")
    hirer.post(f"/api/approvals/{approval_id}/resubmit", {"payload": bad}, format="json")
    response = board_client.post(f"/api/approvals/{approval_id}/approve", {}, format="json")
    assert response.status_code == 400 and "payload.role" in response.json()["details"], response.content
    agent.refresh_from_db()
    assert (agent.status, agent.budget_monthly_cents) == ("pending_approval", 5000)
    assert Approval.objects.get(pk=approval_id).status == "pending"

    board_client.post(f"/api/approvals/{approval_id}/request-revision", {}, format="json")
    hirer.post(f"/api/approvals/{approval_id}/resubmit", {"payload": payload}, format="json")
    response = board_client.post(f"/api/approvals/{approval_id}/approve", {}, format="json")
    assert response.status_code == 200, response.content
    agent.refresh_from_db()
    assert (agent.status, agent.budget_monthly_cents, agent.title) == ("idle", 2000, "Junior analyst")
    # the configuration is not taken from the (redacted) draft
    assert agent.adapter_config["env"]["OPENAI_API_KEY"] == SECRET
    assert ActivityLog.objects.filter(action="agent.updated", entity_id=str(agent.pk)).exists()
