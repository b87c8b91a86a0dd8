"""A company's stop: while it is paused or archived, or its monthly budget is spent, none of its
agents runs.

The stop is mirrored onto the agents' rows (status ``paused``, ``pause_reason`` naming the company's
reason), so every check that already refuses a paused agent (a wake, the coalescing statement, the
dispatcher, an external worker's first heartbeat, the timer) refuses them without another read.
Lifting the stop resumes exactly the agents it paused (to ``idle``, whatever they were before); an
agent the board paused itself stays paused.

:func:`company_agents_sync` runs after the write that changed the company (status, budget, spend)
has committed, in two steps that never hold an agent's lock and a run's together (paths that lock
an agent and then one of its runs, or a run and then its agent, both exist): the agents first, in
one transaction (from then on nothing of the company starts), then each live run is cancelled in
its own. The sweep (:func:`company_stops_reconcile`) finds a company whose agents disagree with
it, should a sync fail or be lost with its process."""
from __future__ import annotations

import logging
import operator
from functools import reduce

from django.db import transaction
from django.db.models import Case, Exists, F, OuterRef, Q, Value, When
from django.urls import reverse

from issues.actors import SYSTEM, Actor
from issues.choices import (LIVE_RUN_STATUSES, NO_WORK_AGENT_STATUSES, NOT_RUNNABLE_AGENT_STATUSES, AgentStatus,
                            CompanyStatus)
from issues.exceptions import Conflict
from issues.models import Agent, Company, HeartbeatRun

from .activity import activity_record
from .periods import month_period
from .runs import run_cancel
from .start_rules import AGENT_BUDGET_STOP, COMPANY_REASONS, own_budget_spent, stopped_by_company

log = logging.getLogger("issues.company_stop")

COMPANY_ARCHIVED, COMPANY_PAUSED, COMPANY_BUDGET = COMPANY_REASONS  # (start_rules sits below runs and this module)
RESERVED_PAUSE_REASONS = (*COMPANY_REASONS, AGENT_BUDGET_STOP)  # set by the host, never typed by the board

_MESSAGES = {COMPANY_ARCHIVED: "The company is archived: its agents do not run.",
             COMPANY_PAUSED: "The company is paused: its agents do not run until it is active again.",
             COMPANY_BUDGET: "The company's monthly budget is spent: its agents do not run until the month "
                             "turns or the budget is raised."}


def _month_spend(company: Company, now=None) -> int:
    """The company's spend this month: a count kept for an earlier month is none (the roll may not
    have run yet)."""
    return company.spent_monthly_cents if company.spend_period == month_period(now) else 0


def _stop_rules(now=None):
    """The stop's rules, first match wins: (reason, the test of one company's row, the same test as a
    filter on companies for the sweep). Each rule's two forms sit side by side so they cannot drift."""
    period = month_period(now)
    return (
        (COMPANY_ARCHIVED, lambda c: c.status == CompanyStatus.ARCHIVED, Q(status=CompanyStatus.ARCHIVED)),
        (COMPANY_PAUSED, lambda c: c.status == CompanyStatus.PAUSED, Q(status=CompanyStatus.PAUSED)),
        (COMPANY_BUDGET,
         lambda c: bool(c.budget_monthly_cents) and _month_spend(c, now) >= c.budget_monthly_cents,
         Q(budget_monthly_cents__gt=0, spent_monthly_cents__gte=F("budget_monthly_cents"), spend_period=period)),
    )


def company_stop_reason(company: Company, now=None) -> str | None:
    """Why the company's agents must not run now, or None (archived, then paused, then budget)."""
    return next((reason for reason, applies, _ in _stop_rules(now) if applies(company)), None)


def company_for_stop(company_id, *, lock: bool = False) -> Company:
    """The fields the stop is decided on; ``lock``: held until the caller commits (a new agent's
    creation waits for a status change being committed, so the sync that follows sees the agent)."""
    query = Company.objects.only("status", "budget_monthly_cents", "spent_monthly_cents", "spend_period",
                                 "updated_at")
    return (query.select_for_update(no_key=True) if lock else query).get(pk=company_id)


def ensure_company_running(company_id) -> None:
    """Refuse (409 ``company_stopped``) to resume an agent of a stopped company."""
    company = company_for_stop(company_id)
    reason = company_stop_reason(company)
    if reason:
        raise Conflict(_MESSAGES[reason], code="company_stopped",
                       details={"reason": reason, "companyStatus": company.status})


def company_agents_sync(*, company_id, actor: Actor = SYSTEM) -> dict:
    """Make the company's agents agree with its stop. Stopping pauses every agent that is neither
    paused (by the board), terminated nor waiting for its hire's approval, ``pause_reason`` = the
    company's reason, then cancels every live run of the company; lifting resumes the agents paused
    for a company reason (one whose own budget is spent keeps its own budget stop). Audited per
    agent (``agent.paused`` / ``agent.resumed``, by ``actor``) and, for the budget, per company
    (``company.budget_stop_lifted``); the runs are cancelled by the system (``heartbeat.cancelled``
    with the reason). Returns what it changed."""
    with transaction.atomic():
        # (a hire waiting for approval runs nothing and is not the stop's to pause or resume)
        agents = list(Agent.objects.select_for_update().filter(company_id=company_id)
                      .exclude(status__in=NO_WORK_AGENT_STATUSES).order_by("pk"))
        company = company_for_stop(company_id)  # read after the agents' locks: the latest committed state
        reason = company_stop_reason(company)
        if reason is None:
            return _lift(actor, company, agents)
        paused = _pause(actor, company, agents, reason)
    # Committed: nothing of the company starts now. Each run ends on its own (run, then agent).
    live = list(HeartbeatRun.objects.filter(company_id=company_id, status__in=LIVE_RUN_STATUSES)
                .order_by("created_at", "pk"))
    cancelled = 0
    for run in live:
        try:
            run_cancel(actor=SYSTEM, run=run, reason=reason)
            cancelled += 1
        except Exception:  # noqa: BLE001 - the others still end; the sweep finds this one again
            log.exception("cancelling run %s for the company's stop failed", run.pk)
    return {"reason": reason, "paused": paused, "cancelledRuns": cancelled}


def _pause(actor: Actor, company: Company, agents: list[Agent], reason: str) -> int:
    paused = 0
    for agent in agents:
        if agent.status == AgentStatus.PAUSED and not stopped_by_company(agent):
            continue  # paused by the board: stays as it is
        if agent.pause_reason == reason:
            continue
        previous = agent.status
        agent.status, agent.pause_reason = AgentStatus.PAUSED, reason
        agent.save(update_fields=["status", "pause_reason", "updated_at"])
        if previous != AgentStatus.PAUSED:
            paused += 1
            activity_record(actor=actor, company_id=company.pk, action="agent.paused", entity_type="agent",
                            entity_id=agent.pk, details={"from": previous, "reason": reason})
    return paused


def _lift(actor: Actor, company: Company, agents: list[Agent]) -> dict:
    resumed, budget_lifted = 0, False
    for agent in agents:
        reason = stopped_by_company(agent)
        if reason is None:
            continue
        budget_lifted = budget_lifted or reason == COMPANY_BUDGET
        agent.status, agent.pause_reason = AgentStatus.IDLE, AGENT_BUDGET_STOP if own_budget_spent(agent) else ""
        agent.save(update_fields=["status", "pause_reason", "updated_at"])
        resumed += 1
        activity_record(actor=actor, company_id=company.pk, action="agent.resumed", entity_type="agent",
                        entity_id=agent.pk, details={"liftedReason": reason})
    if budget_lifted:
        activity_record(actor=actor, company_id=company.pk, action="company.budget_stop_lifted",
                        entity_type="company", entity_id=company.pk,
                        details={"period": month_period(), "spentCents": company.spent_monthly_cents,
                                 "budgetCents": company.budget_monthly_cents})
    return {"reason": None, "resumed": resumed}


def company_agents_sync_on_commit(company_id, actor: Actor = SYSTEM) -> None:
    """Sync once the caller's transaction commits (it may hold the company's row: see the module). A
    failure is logged, never the caller's: the caller's change is committed, the sweep repairs."""
    transaction.on_commit(lambda: company_agents_sync(company_id=company_id, actor=actor), robust=True)


def company_stops_reconcile(now=None) -> int:
    """The sweep's safety net: sync every company whose agents or live runs disagree with its stop
    (a sync that failed or was lost with its process, a month roll that lifted a budget stop, a
    stop whose reason changed). Two reads when all agree; a company that fails is logged and left to the next
    sweep, the others go on."""
    rules = _stop_rules(now)
    stopped = reduce(operator.or_, (q for _, _, q in rules))
    reason = Case(*(When(q, then=Value(name)) for name, _, q in rules))
    unstopped = Agent.objects.filter(company_id=OuterRef("pk")).exclude(status__in=NOT_RUNNABLE_AGENT_STATUSES)
    held = Agent.objects.filter(company_id=OuterRef("pk"), status=AgentStatus.PAUSED, pause_reason__in=COMPANY_REASONS)
    running = HeartbeatRun.objects.filter(company_id=OuterRef("pk"), status__in=LIVE_RUN_STATUSES,
                                          stop_requested_at__isnull=True)
    ids = list(Company.objects.filter(stopped).annotate(reason=reason).filter(
        Exists(unstopped) | Exists(held.exclude(pause_reason=OuterRef("reason"))) | Exists(running))
        .values_list("pk", flat=True))
    ids += list(Company.objects.exclude(stopped).filter(Exists(held)).values_list("pk", flat=True))
    for company_id in ids:
        try:
            company_agents_sync(company_id=company_id)
        except Exception:  # noqa: BLE001 - one company must not hold up the sweep's other duties
            log.exception("company stop sync failed for company %s; the next sweep tries again", company_id)
    return len(ids)


BUDGET_WARNING_PERCENT = 80  # upstream's soft warning: focus on critical work


def dashboard_alerts(company: Company) -> list[dict]:
    """The company's stop as an operator alert (issues.operator_alerts), or the budget's soft warning
    at 80 % of this month's budget: no read beyond its row."""
    reason = company_stop_reason(company)
    if reason is None:
        budget, spent = company.budget_monthly_cents, _month_spend(company)
        if budget and spent * 100 >= budget * BUDGET_WARNING_PERCENT:
            return [{"kind": "company_budget_warning", "severity": "warning", "title": "Company budget nearly spent",
                     "message": f"{spent * 100 // budget} % of this month's budget is spent ({spent} of {budget} "
                                "cents): at 100 % every agent of the company stops until the month turns or the "
                                "budget is raised.", "at": None, "entityType": "company", "entityId": str(company.pk),
                     "url": reverse("console:agent-list")}]
        return []
    title = {COMPANY_ARCHIVED: "Company archived", COMPANY_PAUSED: "Company paused",
             COMPANY_BUDGET: "Company budget spent"}[reason]
    return [{"kind": reason, "severity": "error" if reason == COMPANY_BUDGET else "warning", "title": title,
             "message": _MESSAGES[reason], "at": None if reason == COMPANY_BUDGET else company.updated_at,
             "entityType": "company", "entityId": str(company.pk), "url": reverse("console:agent-list")}]
