"""A company's stop (services.company_stop): a paused or archived company, or one whose monthly
budget is spent, runs no agent. Its agents are paused with the company's reason, its live runs are
cancelled, wakes are skipped, and lifting the stop resumes exactly the agents it paused."""
from datetime import timedelta

import pytest
import time_machine
from django.urls import reverse
from django.utils import timezone

from issues.actors import SYSTEM, Actor
from issues.exceptions import Conflict, InvalidInput
from issues.models import ActivityLog, Agent, Company, CostEvent, HeartbeatRun
from issues.services import runs, scheduling
from issues.services.agents import agent_pause
from issues.services.companies import agent_create
from issues.services.company_stop import company_stop_reason
from issues.services.wakeups import agent_wakeup
from tests.factories import AgentFactory, IssueFactory, MembershipFactory, RunFactory
from tests.test_api_org import audit, board_for, event_body, url
from tests.test_errors import assert_error


def company_patch(company, changes, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = board_for(company).patch(url(company), changes, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def state(agent):
    agent.refresh_from_db()
    return agent.status, agent.pause_reason


def test_pausing_the_company_pauses_its_agents_and_cancels_their_runs_until_it_is_active(
        company, django_capture_on_commit_callbacks):
    worker, idle = AgentFactory(company=company, status="running"), AgentFactory(company=company)
    held = AgentFactory(company=company, status="paused", pause_reason="paused by the board")
    issue = IssueFactory(company=company, assignee_agent=worker)
    running = RunFactory(agent=worker, issue=issue)
    queued = agent_wakeup(actor=SYSTEM, agent=idle, issue=IssueFactory(company=company, assignee_agent=idle)).run
    elsewhere = RunFactory(agent=AgentFactory())  # another company's run goes on

    company_patch(company, {"status": "paused"}, django_capture_on_commit_callbacks)

    assert state(worker) == state(idle) == ("paused", "company_paused")
    assert state(held) == ("paused", "paused by the board")
    for run in (running, queued):
        run.refresh_from_db()
        assert (run.status, run.stop_reason) == ("cancelled", "company_paused")
    elsewhere.refresh_from_db()
    assert elsewhere.status == "running"
    wake = agent_wakeup(actor=SYSTEM, agent=Agent.objects.get(pk=worker.pk), issue=issue)
    assert (wake.status, wake.skip_reason) == ("skipped", "company_paused")
    paused = ActivityLog.objects.get(company=company, action="agent.paused", entity_id=str(worker.pk))
    assert paused.details == {"from": "running", "reason": "company_paused"}

    # Archived: the reason follows the company.
    company_patch(company, {"status": "archived"}, django_capture_on_commit_callbacks)
    assert state(worker) == ("paused", "company_archived")

    # Active again: the agents it paused are idle and wake; the board's own pause stays.
    company_patch(company, {"status": "active"}, django_capture_on_commit_callbacks)
    assert state(worker) == state(idle) == ("idle", "")
    assert state(held) == ("paused", "paused by the board")
    assert agent_wakeup(actor=SYSTEM, agent=Agent.objects.get(pk=worker.pk), issue=issue).status == "claimed"
    resumed = ActivityLog.objects.get(company=company, action="agent.resumed", entity_id=str(worker.pk))
    assert resumed.details == {"liftedReason": "company_archived"}


def test_an_agent_of_a_stopped_company_cannot_be_resumed_but_the_board_may_pause_it_for_good(
        company, django_capture_on_commit_callbacks):
    agent = AgentFactory(company=company)
    company_patch(company, {"status": "paused"}, django_capture_on_commit_callbacks)
    board = board_for(company)
    error = assert_error(board.post(f"/api/agents/{agent.pk}/resume", {}, format="json"), 409, "company_stopped")
    assert error["details"] == {"reason": "company_paused", "companyStatus": "paused"}
    assert_error(board.patch(f"/api/agents/{agent.pk}", {"status": "idle"}, format="json"), 409, "company_stopped")
    assert state(agent) == ("paused", "company_paused")

    # The board's own pause outlasts the company's.
    assert board.post(f"/api/agents/{agent.pk}/pause", {}, format="json").status_code == 200
    company_patch(company, {"status": "active"}, django_capture_on_commit_callbacks)
    assert state(agent) == ("paused", "paused by the board")


def test_an_agent_hired_into_an_archived_company_starts_paused_and_resumes_with_the_company(
        company, django_capture_on_commit_callbacks):
    Company.objects.filter(pk=company.pk).update(status="archived")
    company.refresh_from_db()
    agent = agent_create(company=company, name="late hire")
    assert state(agent) == ("paused", "company_archived")
    company_patch(company, {"status": "active"}, django_capture_on_commit_callbacks)
    assert state(agent) == ("idle", "")


def test_spending_the_company_budget_stops_every_agent_and_raising_it_lifts_the_stop(
        company, django_capture_on_commit_callbacks):
    company_patch(company, {"budgetMonthlyCents": 100}, django_capture_on_commit_callbacks)
    spender, other = AgentFactory(company=company), AgentFactory(company=company, budget_monthly_cents=10)
    run = agent_wakeup(actor=SYSTEM, agent=spender, issue=IssueFactory(company=company, assignee_agent=spender)).run
    run.status = "running"
    run.save()
    other_run = RunFactory(agent=other)

    with django_capture_on_commit_callbacks(execute=True):
        runs.run_heartbeat(actor=SYSTEM, run=run, usage={"costCents": 60})
    assert state(spender) == ("idle", "")  # under the budget: nothing stops
    with django_capture_on_commit_callbacks(execute=True):
        runs.run_heartbeat(actor=SYSTEM, run=run, usage={"costCents": 120})

    company.refresh_from_db()
    assert company.spent_monthly_cents == 120
    run.refresh_from_db()
    other_run.refresh_from_db()
    assert (run.status, run.stop_reason) == ("cancelled", "company_budget_exceeded")
    assert (other_run.status, other_run.stop_reason) == ("cancelled", "company_budget_exceeded")
    assert state(spender) == state(other) == ("paused", "company_budget_exceeded")
    assert audit(company, "company.budget_exceeded").details == {
        "spentCents": 120, "budgetCents": 100, "period": timezone.now().strftime("%Y-%m")}
    wake = agent_wakeup(actor=SYSTEM, agent=Agent.objects.get(pk=other.pk), issue=IssueFactory(company=company))
    assert wake.skip_reason == "company_budget_exceeded"

    # Spending on after the crossing: stopped again, the crossing audited once.
    late = RunFactory(agent=spender)
    with django_capture_on_commit_callbacks(execute=True):
        runs.run_heartbeat(actor=SYSTEM, run=late, usage={"costCents": 5})
    late.refresh_from_db()
    assert (late.status, late.stop_reason) == ("cancelled", "company_budget_exceeded")
    assert ActivityLog.objects.filter(company=company, action="company.budget_exceeded").count() == 1

    Agent.objects.filter(pk=other.pk).update(spent_monthly_cents=10, spend_period=timezone.now().strftime("%Y-%m"))
    company_patch(company, {"budgetMonthlyCents": 500}, django_capture_on_commit_callbacks)
    assert state(spender) == ("idle", "")
    # Agent "other" spent its own budget of 10 cents: back under its own budget stop, not paused.
    assert state(other) == ("idle", "budget_exceeded")
    assert audit(company, "company.budget_stop_lifted").details == {
        "period": timezone.now().strftime("%Y-%m"), "spentCents": 125, "budgetCents": 500}


def test_a_cost_event_that_spends_the_company_budget_stops_its_run(make_agent_client, company,
                                                                   django_capture_on_commit_callbacks):
    Company.objects.filter(pk=company.pk).update(budget_monthly_cents=50)
    client = make_agent_client(company=company)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(url(company, "/cost-events"),
                               event_body(client.agent, costCents=50, heartbeatRunId=str(client.run.pk)), format="json")
    assert response.status_code == 201, response.content
    client.run.refresh_from_db()
    assert (client.run.status, client.run.stop_reason) == ("cancelled", "company_budget_exceeded")
    assert state(client.agent) == ("paused", "company_budget_exceeded")


def test_the_month_roll_starts_company_spend_again_and_lifts_its_budget_stop(company,
                                                                             django_capture_on_commit_callbacks):
    Company.objects.filter(pk=company.pk).update(budget_monthly_cents=100)
    agent = AgentFactory(company=company)
    with time_machine.travel("2026-11-30 12:00Z"):
        run = RunFactory(agent=agent)
        with django_capture_on_commit_callbacks(execute=True):
            runs.run_heartbeat(actor=SYSTEM, run=run, usage={"costCents": 150})
        assert state(agent) == ("paused", "company_budget_exceeded")
    with time_machine.travel("2026-12-01 00:05Z"):
        report = scheduling.sweep(owner="test:1")
    assert (report["companyBudgetResets"], report["companyStops"]) == (1, 1)
    company.refresh_from_db()
    assert (company.spent_monthly_cents, company.spend_period) == (0, "2026-12")
    assert state(agent) == ("idle", "")
    assert audit(company, "company.budget_stop_lifted").details == {
        "period": "2026-12", "spentCents": 0, "budgetCents": 100}


def test_a_first_spend_in_a_new_month_counts_from_zero(company, django_capture_on_commit_callbacks):
    Company.objects.filter(pk=company.pk).update(budget_monthly_cents=100, spent_monthly_cents=90,
                                                 spend_period="2026-11")
    agent = AgentFactory(company=company)
    with time_machine.travel("2026-12-02 09:00Z"):
        company.refresh_from_db()
        assert company_stop_reason(company) is None  # last month's spend is no spend this month
        run = RunFactory(agent=agent)
        with django_capture_on_commit_callbacks(execute=True):
            runs.run_heartbeat(actor=SYSTEM, run=run, usage={"costCents": 30})
    company.refresh_from_db()
    assert (company.spent_monthly_cents, company.spend_period) == (30, "2026-12")
    run.refresh_from_db()
    assert (run.status, run.stop_reason) == ("running", "")
    assert state(agent) == ("idle", "")


def test_the_sweep_applies_a_stop_whose_sync_was_lost(company):
    agent = AgentFactory(company=company)
    run = RunFactory(agent=agent)
    Company.objects.filter(pk=company.pk).update(status="paused")  # as if the process died before its sync
    assert scheduling.sweep(owner="test:1")["companyStops"] == 1
    assert state(agent) == ("paused", "company_paused")
    run.refresh_from_db()
    assert run.status == "cancelled"
    assert scheduling.sweep(owner="test:1")["companyStops"] == 0  # in agreement: nothing to do

    # A live run left over (its cancel failed) is found again, and so is a reason that changed.
    leftover = RunFactory(agent=agent)
    assert scheduling.sweep(owner="test:1")["companyStops"] == 1
    leftover.refresh_from_db()
    assert (leftover.status, leftover.stop_reason) == ("cancelled", "company_paused")
    Company.objects.filter(pk=company.pk).update(status="archived")
    assert scheduling.sweep(owner="test:1")["companyStops"] == 1
    assert state(agent) == ("paused", "company_archived")
    assert HeartbeatRun.objects.filter(company=company, status="running").count() == 0


def test_an_external_workers_first_heartbeat_is_refused_for_the_companys_stop(company):
    agent = AgentFactory(company=company, status="paused", pause_reason="company_paused")
    run = RunFactory(agent=agent, status="queued")
    with pytest.raises(Conflict) as refused:
        runs.run_heartbeat(actor=SYSTEM, run=run)
    assert refused.value.details == {"status": "cancelled", "reason": "company_paused"}
    run.refresh_from_db()
    assert (run.status, run.error) == ("cancelled", "company_paused")


def test_the_board_cannot_borrow_a_reason_the_host_sets(company, board_client):
    agent = AgentFactory(company=company)
    for reason in ("company_paused", "budget_exceeded"):
        with pytest.raises(InvalidInput) as refused:
            agent_pause(actor=Actor(user=MembershipFactory(company=company).user), agent=agent, reason=reason)
        assert "reason" in refused.value.details
    assert state(agent) == ("idle", "")
    # The board's pause of a company-paused agent through PATCH becomes its own.
    Agent.objects.filter(pk=agent.pk).update(status="paused", pause_reason="company_paused")
    assert board_client.patch(f"/api/agents/{agent.pk}", {"status": "paused"}, format="json").status_code == 200
    assert state(agent) == ("paused", "paused by the board")


def test_a_board_paused_agent_over_its_budget_keeps_the_boards_reason(company):
    agent = AgentFactory(company=company, status="paused", pause_reason="paused by the board", budget_monthly_cents=5)
    runs.run_heartbeat(actor=SYSTEM, run=RunFactory(agent=agent), usage={"costCents": 9})
    assert state(agent) == ("paused", "paused by the board")


def test_the_migration_counts_this_months_ledger_as_the_companys_spend(company):
    import importlib

    from django.apps import apps

    migration = importlib.import_module("issues.migrations.0020_company_spend_period")
    agent = AgentFactory(company=company)
    now = timezone.now()
    for cents, occurred in ((40, now), (2, now), (500, now - timedelta(days=40))):
        CostEvent.objects.create(company=company, agent=agent, provider="p", model="m", cost_cents=cents,
                                 occurred_at=occurred)
    Company.objects.filter(pk=company.pk).update(spent_monthly_cents=542, spend_period="")  # lifetime, as before
    migration.spend_counts_for_this_month(apps, None)
    company.refresh_from_db()
    assert (company.spent_monthly_cents, company.spend_period) == (42, now.strftime("%Y-%m"))


def test_pausing_the_company_in_the_admin_stops_its_agents_and_runs_too(client, company,
                                                                        django_capture_on_commit_callbacks):
    from django.contrib.auth.models import Permission

    from tests.factories import UserFactory
    from tests.test_admin import admin_url

    staff = UserFactory(is_staff=True)  # may change companies, is no member of this one
    staff.user_permissions.add(*Permission.objects.filter(codename__in=("change_company", "view_company")))
    client.force_login(staff)
    agent = AgentFactory(company=company)
    run = RunFactory(agent=agent)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(admin_url(Company, "change", company.pk), {
            "name": company.name, "description": "", "status": "paused", "budget_monthly_cents": 0,
            "memberships-TOTAL_FORMS": 0, "memberships-INITIAL_FORMS": 0})
    assert response.status_code == 302, response.content.decode()[:2000]
    assert state(agent) == ("paused", "company_paused")
    run.refresh_from_db()
    assert (run.status, run.stop_reason) == ("cancelled", "company_paused")
    paused = ActivityLog.objects.get(action="agent.paused", entity_id=str(agent.pk))
    assert paused.actor_user == staff


def test_a_stopped_company_is_an_alert_on_the_dashboard(company, board_client, django_capture_on_commit_callbacks):
    assert board_client.get(url(company, "/dashboard")).json()["alerts"] == []
    Company.objects.filter(pk=company.pk).update(budget_monthly_cents=10, spent_monthly_cents=7,
                                                 spend_period=timezone.now().strftime("%Y-%m"))
    assert board_client.get(url(company, "/dashboard")).json()["alerts"] == []  # 70 %: no warning yet
    Company.objects.filter(pk=company.pk).update(spent_monthly_cents=8)
    alerts = board_client.get(url(company, "/dashboard")).json()["alerts"]
    assert [(a["kind"], a["severity"]) for a in alerts] == [("company_budget_warning", "warning")]
    assert alerts[0]["message"].startswith("80 % of this month's budget is spent (8 of 10 cents)")
    Company.objects.filter(pk=company.pk).update(budget_monthly_cents=10, spent_monthly_cents=10,
                                                 spend_period=timezone.now().strftime("%Y-%m"))
    AgentFactory(company=company, status="paused", pause_reason="company_budget_exceeded")
    dashboard = board_client.get(url(company, "/dashboard")).json()
    assert [(a["kind"], a["severity"], a["title"]) for a in dashboard["alerts"]] == [
        ("company_budget_exceeded", "error", "Company budget spent")]
    assert (dashboard["budgets"]["pausedAgents"], dashboard["budgets"]["activeIncidents"]) == (1, 1)
    company_patch(company, {"status": "paused"}, django_capture_on_commit_callbacks)
    page = board_client.get(reverse("console:dashboard")).content.decode()
    assert "Company paused" in page and "its agents do not run until it is active again" in page
