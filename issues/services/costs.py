"""Spend, budgets and the company settings they sit on (upstream Paperclip §5.6 and §5.9).

One ledger: every cent an agent spends is one ``CostEvent`` row, whether a client reported it
(``POST /companies/{id}/cost-events``) or a run heartbeat reported usage (``runs._record_usage``
writes the delta of the run's running totals, provider ``paperclip-run``). Each row's cents are
added once to the agent's and the company's monthly spend, with the same saturating arithmetic,
month roll-over and budget stop as the run heartbeats. Reports summarize the ledger, so every cent
is counted exactly once. A reported event dated in another month is in the ledger (and its
reports) but not in this month's spend counters.
"""
from __future__ import annotations

import re

from django.db import transaction
from django.db.models import BigIntegerField, Case, Value, When
from django.utils import timezone

from issues.actors import SYSTEM, Actor
from issues.choices import LIVE_RUN_STATUSES, AgentStatus, CompanyStatus
from issues.exceptions import Forbidden, InvalidInput, Unprocessable
from issues.models import Agent, Asset, Company, CostEvent, Goal, HeartbeatRun, Issue, Project

from .activity import activity_record
from .assets import BRANDING_FORBIDDEN, ensure_may_brand
from .company_stop import COMPANY_BUDGET, company_agents_sync_on_commit, company_stop_reason
from .goals import ensure_org_write
from .lookups import company_object
from .periods import month_period
from .runs import USAGE_MAX, _finish_stopped, _request_stop, _saturating_add
from .scheduling import budgets_roll_month
from .start_rules import AGENT_BUDGET_STOP, own_budget_spent

RUN_PROVIDER = "paperclip-run"  # the provider of the ledger rows run heartbeats write
BUDGET_STOP = AGENT_BUDGET_STOP  # Agent.pause_reason while the monthly budget is spent (runs, wakeups, dispatch)
BILLING_TYPES = ("metered_api", "subscription_included", "subscription_overage", "credits", "fixed", "unknown")
SUBSCRIPTION_BILLING = ("subscription_included", "subscription_overage")
COMPANY_STATUSES = ("active", "paused", "archived")


# --- the ledger -----------------------------------------------------------------------------------
def spend_add(*, company_id, agent_id, cents: int, run=None) -> str | None:
    """Add ``cents`` to the agent's and the company's monthly spend (saturating at the column's
    top; the company's counter starts again when its month has turned). Returns why the caller must
    stop what it is doing: ``budget_exceeded`` when the agent's budget is reached (the budget stop is
    recorded, as a run heartbeat does), ``company_budget_exceeded`` when the company's is (crossing it
    stops every agent of the company once this transaction commits: services.company_stop); else None."""
    if cents <= 0:
        return None
    cents = min(cents, USAGE_MAX)
    budgets_roll_month(agent_id=agent_id)  # spend belongs to the current month
    Agent.objects.filter(pk=agent_id).update(spent_monthly_cents=_saturating_add("spent_monthly_cents", cents))
    period = month_period()
    Company.objects.filter(pk=company_id).update(
        spent_monthly_cents=Case(When(spend_period=period, then=_saturating_add("spent_monthly_cents", cents)),
                                 default=Value(cents, output_field=BigIntegerField()),
                                 output_field=BigIntegerField()), spend_period=period)
    agent = Agent.objects.select_related("company").only(
        "budget_monthly_cents", "spent_monthly_cents", "company__status", "company__budget_monthly_cents",
        "company__spent_monthly_cents", "company__spend_period").get(pk=agent_id)
    stop = None
    if own_budget_spent(agent):
        # (a paused agent keeps the reason it was paused for: lifting that pause finds it)
        Agent.objects.filter(pk=agent_id).exclude(status=AgentStatus.PAUSED).update(pause_reason=BUDGET_STOP)
        activity_record(actor=SYSTEM, company_id=company_id, action="agent.budget_exceeded", entity_type="agent",
                        entity_id=agent_id, run=run,
                        details={"spentCents": agent.spent_monthly_cents, "budgetCents": agent.budget_monthly_cents})
        stop = BUDGET_STOP
    company = agent.company
    if company_stop_reason(company) == COMPANY_BUDGET:
        if company.spent_monthly_cents - cents < company.budget_monthly_cents:  # this spend crossed it
            activity_record(actor=SYSTEM, company_id=company_id, action="company.budget_exceeded",
                            entity_type="company", entity_id=company_id, run=run,
                            details={"spentCents": company.spent_monthly_cents,
                                     "budgetCents": company.budget_monthly_cents, "period": period})
            company_agents_sync_on_commit(company_id)
        stop = COMPANY_BUDGET
    return stop


def ledger_record(*, company_id, agent_id, cost_cents: int, provider: str, model: str = "", biller: str = "",
                  billing_type: str = "unknown", input_tokens: int = 0, cached_input_tokens: int = 0,
                  output_tokens: int = 0, occurred_at=None, run=None, issue_id=None, project_id=None, goal_id=None,
                  billing_code: str = "") -> tuple[CostEvent, str | None]:
    """One ledger row, its cents added to this month's spend when it falls in this month. Returns
    the row and the budget stop the spend reached (``spend_add``), or None. Call inside a transaction."""
    occurred_at = occurred_at or timezone.now()
    event = CostEvent.objects.create(
        company_id=company_id, agent_id=agent_id, run=run, issue_id=issue_id, project_id=project_id,
        goal_id=goal_id, billing_code=billing_code, provider=provider, biller=biller or provider,
        billing_type=billing_type, model=model, input_tokens=input_tokens, cached_input_tokens=cached_input_tokens,
        output_tokens=output_tokens, cost_cents=cost_cents, occurred_at=occurred_at)
    stop = spend_add(company_id=company_id, agent_id=agent_id, cents=cost_cents, run=run) \
        if month_period(occurred_at) == month_period() else None
    return event, stop


def cost_event_create(*, actor: Actor, company, data: dict) -> CostEvent:
    """``POST /companies/{id}/cost-events``: the board for any agent of the company, an agent for
    itself only. Reaching the agent's (or the company's) budget stops it as a heartbeat would,
    including the named run when it is still live."""
    ensure_org_write(actor, company.pk)
    agent = company_object(Agent, company.pk, data["agentId"], "agentId")
    if actor.is_agent and agent.pk != actor.agent.pk:
        raise Forbidden("Agent can only report its own costs", code="not_own_agent",
                        details={"agentId": ["Agents report their own costs only."]})
    issue = company_object(Issue, company.pk, data.get("issueId"), "issueId")
    project = company_object(Project, company.pk, data.get("projectId"), "projectId")
    goal = company_object(Goal, company.pk, data.get("goalId"), "goalId")
    run = company_object(HeartbeatRun, company.pk, data.get("heartbeatRunId"), "heartbeatRunId")
    if run is not None and run.agent_id != agent.pk:
        raise Unprocessable("The run is not one of this agent's runs.", code="run_agent_mismatch",
                            details={"heartbeatRunId": ["Not a run of agentId."]})
    if data.get("billingType", "unknown") not in BILLING_TYPES:
        raise InvalidInput(details={"billingType": [f"Must be one of {', '.join(BILLING_TYPES)}."]})
    stop_now = False
    with transaction.atomic():
        if run is not None:  # the lock order is the run's row, then the agent's (the runner intake's order)
            run = HeartbeatRun.objects.select_for_update().get(pk=run.pk)
        event, budget_stop = ledger_record(
            company_id=company.pk, agent_id=agent.pk, cost_cents=data["costCents"], provider=data["provider"],
            model=data["model"], biller=data.get("biller") or "", billing_type=data.get("billingType", "unknown"),
            input_tokens=data.get("inputTokens", 0), cached_input_tokens=data.get("cachedInputTokens", 0),
            output_tokens=data.get("outputTokens", 0), occurred_at=data["occurredAt"], run=run,
            issue_id=getattr(issue, "pk", None), project_id=getattr(project, "pk", None),
            goal_id=getattr(goal, "pk", None), billing_code=data.get("billingCode") or "")
        activity_record(actor=actor, company_id=company.pk, action="cost.reported", entity_type="cost_event",
                        entity_id=event.pk,
                        details={"agentId": str(agent.pk), "costCents": event.cost_cents, "provider": event.provider,
                                 "model": event.model, "heartbeatRunId": str(run.pk) if run else None})
        if budget_stop and run is not None:
            stop_now = run.status in LIVE_RUN_STATUSES and _request_stop(run, budget_stop)
    if stop_now:
        _finish_stopped([run])
    return event


# --- budgets ------------------------------------------------------------------------------------------
def _budget_value(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= USAGE_MAX:
        raise InvalidInput(details={"budgetMonthlyCents": [f"Must be an integer from 0 to {USAGE_MAX}."]})
    return value


def agent_budget_set(*, actor: Actor, agent: Agent, budget_monthly_cents: int) -> Agent:
    """The board, or the agent itself (upstream). The budget stop follows the new budget: lifted
    when this month's spend is below it, set when it is not (0 means no limit)."""
    ensure_org_write(actor, agent.company_id)
    if actor.is_agent and actor.agent.pk != agent.pk:
        raise Forbidden("Agent can only change its own budget", code="not_own_agent")
    budget = _budget_value(budget_monthly_cents)
    with transaction.atomic():
        budgets_roll_month(agent_id=agent.pk)
        agent = Agent.objects.select_for_update().get(pk=agent.pk)
        previous = agent.budget_monthly_cents
        agent.budget_monthly_cents = budget
        over = bool(budget) and agent.spent_monthly_cents >= budget
        if over and not agent.pause_reason:
            agent.pause_reason = BUDGET_STOP
        elif not over and agent.pause_reason == BUDGET_STOP:
            agent.pause_reason = ""
        agent.save(update_fields=["budget_monthly_cents", "pause_reason", "updated_at"])
        activity_record(actor=actor, company_id=agent.company_id, action="agent.budget_updated", entity_type="agent",
                        entity_id=agent.pk, details={"budgetMonthlyCents": budget, "previous": previous})
    return agent


def company_budget_set(*, actor: Actor, company: Company, budget_monthly_cents: int) -> Company:
    actor.ensure_board()
    actor.ensure_can_write(company.pk)
    return company_update(actor=actor, company=company, changes={"budgetMonthlyCents": budget_monthly_cents})


# --- company settings -------------------------------------------------------------------------------------
COMPANY_FIELDS = {"name": "name", "description": "description", "status": "status",
                  "budgetMonthlyCents": "budget_monthly_cents",
                  "requireBoardApprovalForNewAgents": "require_board_approval_for_new_agents",
                  "brandColor": "brand_color", "logoAssetId": "logo_asset_id"}
# upstream: a CEO agent may change the company's branding only
CEO_FIELDS = ("name", "description", "brandColor", "logoAssetId")
BRAND_COLOR = re.compile(r"#[0-9a-fA-F]{6}", re.ASCII)


def company_update(*, actor: Actor, company: Company, changes: dict) -> Company:
    """Board users (write roles) change name, description, status, budget, whether hires wait for
    the board's approval and the branding (``brandColor``, ``logoAssetId``: one of the company's
    assets); a CEO agent the name, description and branding; the issue prefix never changes
    (identifiers are built from it)."""
    # Another company's (or no) asset is a 404 before any other answer, as every foreign id is.
    logo = company_object(Asset, company.pk, changes["logoAssetId"], "logoAssetId") if changes.get(
        "logoAssetId") else None
    if actor.is_agent and set(changes) - set(CEO_FIELDS):
        raise Forbidden(BRANDING_FORBIDDEN, code="board_only")
    ensure_may_brand(actor, company.pk)
    values = {}
    for name, value in changes.items():
        if name == "name":
            value = (value or "").strip()
            if not value:
                raise InvalidInput(details={"name": ["This field may not be blank."]})
        elif name == "description":
            value = value or ""
        elif name == "status" and value not in COMPANY_STATUSES:
            raise InvalidInput(details={"status": [f"Must be one of {', '.join(COMPANY_STATUSES)}."]})
        elif name == "budgetMonthlyCents":
            value = _budget_value(value)
        elif name == "requireBoardApprovalForNewAgents" and not isinstance(value, bool):
            raise InvalidInput(details={name: ["Must be true or false."]})
        elif name == "brandColor":
            if value and not (isinstance(value, str) and BRAND_COLOR.fullmatch(value)):
                raise InvalidInput(details={name: ["Must be a color as #RRGGBB, or null."]})
            value = (value or "").lower()
        elif name == "logoAssetId":
            value = logo.pk if logo else None
        values[COMPANY_FIELDS[name]] = value
    with transaction.atomic():
        company = Company.objects.select_for_update().get(pk=company.pk)
        changed = sorted(k for k, v in values.items() if getattr(company, k) != v)
        if not changed:
            return company
        previous_budget, previous_logo = company.budget_monthly_cents, company.logo_asset_id
        for column in changed:
            setattr(company, column, values[column])
        company.save(update_fields=[*changed, "updated_at"])
        if "logo_asset_id" in changed and previous_logo:  # the logo it replaced goes (bytes on commit), as upstream
            Asset.objects.filter(pk=previous_logo).delete()
        api_names = {v: k for k, v in COMPANY_FIELDS.items()}
        if changed != ["budget_monthly_cents"]:
            activity_record(actor=actor, company_id=company.pk, action="company.updated", entity_type="company",
                            entity_id=company.pk, details={"changedKeys": [api_names[k] for k in changed]})
        if "budget_monthly_cents" in changed:
            activity_record(actor=actor, company_id=company.pk, action="company.budget_updated",
                            entity_type="company", entity_id=company.pk,
                            details={"budgetMonthlyCents": company.budget_monthly_cents, "previous": previous_budget})
        if {"status", "budget_monthly_cents"} & set(changed):  # the company's stop may have begun or ended
            company_agents_sync_on_commit(company.pk, actor)
    return company


def company_archive(*, actor: Actor, company: Company) -> Company:
    """Board only (upstream's ``POST /companies/{id}/archive``): the status becomes archived, which
    stops the company's agents as any status change does."""
    actor.ensure_board()
    return company_update(actor=actor, company=company, changes={"status": CompanyStatus.ARCHIVED})
