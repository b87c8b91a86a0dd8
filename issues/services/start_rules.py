"""Whether an agent's queued run may start now: one rule for the dispatcher's claims, an external
worker's first heartbeat (which starts its run itself) and a wake (skipped for the same reason)."""
from __future__ import annotations

from issues.choices import AgentStatus

COMPANY_REASONS = ("company_archived", "company_paused", "company_budget_exceeded")  # company_stop's


def start_refusal(agent) -> str | None:
    """Why a run of ``agent`` (a row read under its lock) must not start: ``agent_paused``,
    ``agent_terminated``, ``budget_exceeded`` or the company's stop (``company_paused``,
    ``company_archived``, ``company_budget_exceeded``: services.company_stop) — the run is cancelled
    with that reason; None when it may."""
    if agent.status == AgentStatus.PAUSED and agent.pause_reason in COMPANY_REASONS:
        return agent.pause_reason
    if agent.status in (AgentStatus.PAUSED, AgentStatus.TERMINATED):
        return f"agent_{agent.status}"
    if agent.budget_monthly_cents and agent.spent_monthly_cents >= agent.budget_monthly_cents:
        return "budget_exceeded"
    return None
