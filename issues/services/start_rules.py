"""Whether an agent's queued run may start now: one rule for the dispatcher's claims, an external
worker's first heartbeat (which starts its run itself) and a wake (skipped for the same reason)."""
from __future__ import annotations

from issues.choices import NOT_RUNNABLE_AGENT_STATUSES, AgentStatus

AGENT_BUDGET_STOP = "budget_exceeded"  # Agent.pause_reason while its own monthly budget is spent
COMPANY_REASONS = ("company_archived", "company_paused", "company_budget_exceeded")  # company_stop's


def own_budget_spent(agent) -> bool:
    """The agent's own monthly budget (0: none) is spent."""
    return bool(agent.budget_monthly_cents) and agent.spent_monthly_cents >= agent.budget_monthly_cents


def stopped_by_company(agent) -> str | None:
    """The company reason an agent row is paused for (no read), or None."""
    if agent.status == AgentStatus.PAUSED and agent.pause_reason in COMPANY_REASONS:
        return agent.pause_reason
    return None


def start_refusal(agent) -> str | None:
    """Why a run of ``agent`` (a row read under its lock) must not start: ``agent_paused``,
    ``agent_terminated``, ``agent_pending_approval``, ``budget_exceeded`` or the company's stop
    (``company_paused``, ``company_archived``, ``company_budget_exceeded``: services.company_stop) —
    the run is cancelled with that reason; None when it may."""
    company_reason = stopped_by_company(agent)
    if company_reason:
        return company_reason
    if agent.status in NOT_RUNNABLE_AGENT_STATUSES:
        return f"agent_{agent.status}"
    if own_budget_spent(agent):
        return AGENT_BUDGET_STOP
    return None
