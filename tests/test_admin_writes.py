"""The admin writes through the services, as the API does. Agents: a status change pauses (stopping
live runs), resumes (not while the company is stopped) or terminates (keys revoked); a new agent is
created by ``agent_create``; the pause reason and the company are not edited here. Approvals are
decided by actions that are ``approval_decide``; blockers and approval links are not edited here.
Goals are written by ``goal_create`` / ``goal_update``; no row moves to another company."""
import re

import pytest
from django.urls import reverse

from issues.models import ActivityLog, Agent, AgentApiKey, Approval, ApprovalIssue, HeartbeatRun, IssueRelation
from issues.models import Goal, WakeupRequest, WorkProduct
from issues.services.companies import agent_api_key_create
from issues.actors import SYSTEM
from issues.services.issues import relation_add
from tests.factories import AgentFactory, CompanyFactory, GoalFactory, IssueFactory, ProjectFactory, RunFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def change_url(agent):
    return reverse("admin:issues_agent_change", args=[agent.pk])


def post_agent_change(client, agent, **fields):
    url = change_url(agent)
    page = client.get(url).content.decode()
    data = dict(re.findall(r'<input type="hidden" name="([\w-]+-(?:TOTAL|INITIAL|MIN_NUM|MAX_NUM)_FORMS)"'
                           r'[^>]*value="(\d*)"', page))
    data.update({"name": agent.name, "title": agent.title, "role": agent.role, "status": agent.status,
                 "reports_to": "", "capabilities": agent.capabilities, "adapter_type": agent.adapter_type,
                 "adapter_config": "{}", "runtime_config": "{}",
                 "budget_monthly_cents": str(agent.budget_monthly_cents)})
    data.update(fields)
    return client.post(url, data, follow=True)


@pytest.fixture
def agent(db):
    return AgentFactory(company=CompanyFactory(name="Acme"), name="Linus")


def test_pausing_in_the_admin_stops_the_live_run_and_is_audited(admin_client, admin_user, agent):
    run = RunFactory(agent=agent, status="running")
    response = post_agent_change(admin_client, agent, status="paused")
    assert "was changed successfully" in response.content.decode()
    agent.refresh_from_db()
    run.refresh_from_db()
    assert (agent.status, agent.pause_reason) == ("paused", "paused by the board")
    assert run.status == "cancelled"
    entry = ActivityLog.objects.get(action="agent.paused", entity_id=str(agent.pk))
    assert entry.actor_user == admin_user


def test_terminating_in_the_admin_revokes_every_key(admin_client, agent):
    key, _ = agent_api_key_create(agent=agent)
    post_agent_change(admin_client, agent, status="terminated")
    agent.refresh_from_db()
    key.refresh_from_db()
    assert agent.status == "terminated" and key.revoked_at is not None
    assert ActivityLog.objects.filter(action="agent.terminated", entity_id=str(agent.pk)).exists()


def test_resuming_in_a_stopped_company_is_refused_and_nothing_is_saved(admin_client, agent):
    agent.company.status = "paused"
    agent.company.save()
    Agent.objects.filter(pk=agent.pk).update(status="paused", pause_reason="company_paused")
    agent.refresh_from_db()
    response = post_agent_change(admin_client, agent, status="idle", title="Renamed too")
    assert "Not saved" in response.content.decode()
    agent.refresh_from_db()
    assert (agent.status, agent.pause_reason, agent.title) == ("paused", "company_paused", "")


def test_the_hosts_statuses_are_refused(admin_client, agent):
    response = post_agent_change(admin_client, agent, status="running")
    assert "Not saved" in response.content.decode() and "cannot be set here" in response.content.decode()
    agent.refresh_from_db()
    assert agent.status == "idle"


def test_field_changes_go_through_the_service(admin_client, admin_user, agent):
    response = post_agent_change(admin_client, agent, title="Staff engineer", budget_monthly_cents="5000")
    assert "was changed successfully" in response.content.decode()
    agent.refresh_from_db()
    assert (agent.title, agent.budget_monthly_cents) == ("Staff engineer", 5000)
    entry = ActivityLog.objects.get(action="agent.updated", entity_id=str(agent.pk))
    assert sorted(entry.details["changes"]) == ["budgetMonthlyCents", "title"] and entry.actor_user == admin_user
    assert ActivityLog.objects.filter(action="agent.budget_updated", entity_id=str(agent.pk)).exists()


def test_pause_reason_and_company_are_not_editable(admin_client, agent):
    page = admin_client.get(change_url(agent)).content.decode()
    assert not re.search(r'name="(pause_reason|company)"', page)
    other = CompanyFactory()
    post_agent_change(admin_client, agent, pause_reason="company_budget_exceeded", company=str(other.pk))
    agent.refresh_from_db()
    assert agent.company_id != other.pk and agent.pause_reason == ""


def test_a_manager_of_another_company_is_refused(admin_client, agent):
    foreign = AgentFactory(company=CompanyFactory())
    response = post_agent_change(admin_client, agent, reports_to=str(foreign.pk))
    assert "Must belong to the same company" in response.content.decode()
    agent.refresh_from_db()
    assert agent.reports_to_id is None


def test_an_agent_added_in_the_admin_is_born_paused_in_a_stopped_company(admin_client, admin_user):
    company = CompanyFactory(status="paused")
    url = reverse("admin:issues_agent_add")
    page = admin_client.get(url).content.decode()
    assert not re.search(r'name="status"', page)
    data = dict(re.findall(r'<input type="hidden" name="([\w-]+-(?:TOTAL|INITIAL|MIN_NUM|MAX_NUM)_FORMS)"'
                           r'[^>]*value="(\d*)"', page))
    data.update({"company": str(company.pk), "name": "Newcomer", "title": "", "role": "engineer", "reports_to": "",
                 "capabilities": "", "adapter_type": "none", "adapter_config": "{}", "runtime_config": "{}",
                 "budget_monthly_cents": "0"})
    response = admin_client.post(url, data, follow=True)
    assert "was added successfully" in response.content.decode(), response.content.decode()[:3000]
    created = Agent.objects.get(company=company, name="Newcomer")
    assert (created.status, created.pause_reason) == ("paused", "company_paused")
    entry = ActivityLog.objects.get(action="agent.created", entity_id=str(created.pk))
    assert entry.actor_user == admin_user
    assert not AgentApiKey.objects.filter(agent=created).exists()
    assert not HeartbeatRun.objects.filter(agent=created).exists()


# --- approvals, blockers, approval links -------------------------------------------------------------


@pytest.fixture
def approval(agent):
    issue = IssueFactory(company=agent.company, assignee_agent=agent)
    approval = Approval.objects.create(company=agent.company, title="Hire a designer", requested_by_agent=agent)
    ApprovalIssue.objects.create(approval=approval, issue=issue)
    return approval


def decide(client, action, *approvals):
    return client.post(reverse("admin:issues_approval_changelist"),
                       {"action": action, "_selected_action": [str(a.pk) for a in approvals]}, follow=True)


def test_approving_in_the_admin_wakes_the_requester_and_is_audited(admin_client, admin_user, approval, agent):
    response = decide(admin_client, "approve", approval)
    assert "Approved: 1 approval(s)." in response.content.decode()
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by_user) == ("approved", admin_user)
    assert ActivityLog.objects.get(action="approval.approved", entity_id=str(approval.pk)).actor_user == admin_user
    wake = WakeupRequest.objects.get(agent=agent)
    assert wake.reason == "approval_approved" and wake.context["approvalId"] == str(approval.pk)


def test_a_decision_the_service_refuses_is_reported_and_changes_nothing(admin_client, approval):
    decide(admin_client, "reject", approval)
    response = decide(admin_client, "approve", approval)
    assert "Not decided: Hire a designer: Only pending or revision requested approvals can be approved" in \
        response.content.decode()
    approval.refresh_from_db()
    assert approval.status == "rejected"


def test_approvals_are_not_added_and_their_status_is_not_edited_in_place(admin_client, approval):
    assert admin_client.get(reverse("admin:issues_approval_add")).status_code == 403
    page = admin_client.get(reverse("admin:issues_approval_change", args=[approval.pk])).content.decode()
    assert 'name="title"' in page
    assert not re.search(r'name="(status|company|decided_by_user|issues-0-issue)"', page)


def test_blockers_and_approval_links_are_not_written_in_the_admin(admin_client, approval):
    blocked = approval.issues.get()
    relation = relation_add(actor=SYSTEM, blocker=IssueFactory(company=blocked.company), blocked=blocked)
    link = ApprovalIssue.objects.get(approval=approval)
    for model, row in (("issuerelation", relation), ("approvalissue", link)):
        assert admin_client.get(reverse(f"admin:issues_{model}_add")).status_code == 403
        assert admin_client.post(reverse(f"admin:issues_{model}_delete", args=[row.pk]),
                                 {"post": "yes"}).status_code == 403
    assert IssueRelation.objects.filter(pk=relation.pk).exists() and ApprovalIssue.objects.filter(pk=link.pk).exists()


# --- goals, and rows that never change company -------------------------------------------------------


def post_goal(client, goal=None, **fields):
    url = reverse("admin:issues_goal_change", args=[goal.pk]) if goal else reverse("admin:issues_goal_add")
    data = {"title": goal.title if goal else "", "description": "", "level": goal.level if goal else "team",
            "status": goal.status if goal else "active", "parent": str(goal.parent_id or "") if goal else "",
            "owner_agent": ""}
    data.update(fields)
    return client.post(url, data, follow=True)


def test_goal_changes_go_through_the_service(admin_client, admin_user, agent):
    goal = GoalFactory(company=agent.company, title="Ship v1")
    response = post_goal(admin_client, goal, status="achieved", owner_agent=str(agent.pk))
    assert "was changed successfully" in response.content.decode()
    goal.refresh_from_db()
    assert (goal.status, goal.owner_agent_id) == ("achieved", agent.pk)
    entry = ActivityLog.objects.get(action="goal.updated", entity_id=str(goal.pk))
    assert entry.details["changedKeys"] == ["ownerAgentId", "status"] and entry.actor_user == admin_user


def test_a_goal_cycle_or_a_parent_of_another_company_is_refused(admin_client, agent):
    top = GoalFactory(company=agent.company, title="Top")
    child = GoalFactory(company=agent.company, title="Child", parent=top)
    response = post_goal(admin_client, top, parent=str(child.pk))
    assert "Not saved: A goal cannot be its own ancestor." in response.content.decode()
    foreign = GoalFactory(company=CompanyFactory())
    assert "Must belong to the same company" in post_goal(admin_client, child, parent=str(foreign.pk)).content.decode()
    top.refresh_from_db()
    child.refresh_from_db()
    assert (top.parent_id, child.parent_id) == (None, top.pk)


def test_a_goal_added_in_the_admin_is_audited(admin_client, admin_user, agent):
    response = post_goal(admin_client, company=str(agent.company.pk), title="Grow", level="company")
    assert "was added successfully" in response.content.decode()
    goal = Goal.objects.get(company=agent.company, title="Grow")
    assert ActivityLog.objects.get(action="goal.created", entity_id=str(goal.pk)).actor_user == admin_user


@pytest.mark.parametrize("model", ["agent", "goal", "project"])
def test_no_row_moves_to_another_company(admin_client, agent, model):
    row = {"agent": agent, "goal": GoalFactory(company=agent.company),
           "project": ProjectFactory(company=agent.company)}[model]
    page = admin_client.get(reverse(f"admin:issues_{model}_change", args=[row.pk])).content.decode()
    assert 'name="title"' in page or 'name="name"' in page
    assert not re.search(r'name="company"', page)


def test_work_products_keep_their_issue_and_company(admin_client, agent):
    issue = IssueFactory(company=agent.company)
    product = WorkProduct.objects.create(company=agent.company, issue=issue, kind="pull_request", title="PR #1",
                                         url="https://example.com/pr/1")
    assert admin_client.get(reverse("admin:issues_workproduct_add")).status_code == 403
    page = admin_client.get(reverse("admin:issues_workproduct_change", args=[product.pk])).content.decode()
    assert 'name="title"' in page and not re.search(r'name="(company|issue|run)"', page)


def revoke_keys(client, *keys):
    return client.post(reverse("admin:issues_agentapikey_changelist"),
                       {"action": "revoke_keys", "_selected_action": [str(k.pk) for k in keys]}, follow=True)


def test_revoking_keys_in_the_admin_goes_through_the_service(admin_client, admin_user, agent):
    key, _ = agent_api_key_create(agent=agent, name="laptop")
    response = revoke_keys(admin_client, key)
    assert "Revoked 1 key(s)." in response.content.decode()
    key.refresh_from_db()
    assert key.revoked_at is not None
    assert ActivityLog.objects.get(action="agent_key.revoked", entity_id=str(key.pk)).actor_user == admin_user


def test_a_staff_user_who_only_views_the_company_cannot_revoke_its_keys(client, agent):
    from django.contrib.auth.models import Permission

    from tests.factories import MembershipFactory

    staff = MembershipFactory(company=agent.company, role="viewer").user
    staff.is_staff = True
    staff.save()
    staff.user_permissions.add(*Permission.objects.filter(codename__in=("change_agentapikey", "view_agentapikey")))
    client.force_login(staff)
    key, _ = agent_api_key_create(agent=agent, name="laptop")
    response = revoke_keys(client, key)
    assert f"Not revoked: {key}: Your role in this company is read-only." in response.content.decode()
    key.refresh_from_db()
    assert key.revoked_at is None
    assert not ActivityLog.objects.filter(action="agent_key.revoked").exists()
