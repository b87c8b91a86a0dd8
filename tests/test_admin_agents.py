"""The Agent admin writes through the agent services, as the API does: a status change pauses
(stopping live runs), resumes (not while the company is stopped) or terminates (keys revoked);
a new agent is created by ``agent_create``; the pause reason and the company are not edited here."""
import re

import pytest
from django.urls import reverse

from issues.models import ActivityLog, Agent, AgentApiKey, HeartbeatRun
from issues.services.companies import agent_api_key_create
from tests.factories import AgentFactory, CompanyFactory, RunFactory

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
    assert "Must belong to the agent" in response.content.decode()
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
