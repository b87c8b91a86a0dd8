"""Whether an agent's queued run may start now: one rule for the dispatcher's claims and for an
external worker's first heartbeat (which starts its run itself)."""
from __future__ import annotations

from issues.choices import AgentStatus


def start_refusal(agent) -> str | None:
    """Why a run of ``agent`` (a row read under its lock) must not start: ``agent_paused``,
    ``agent_terminated`` or ``budget_exceeded`` (the run is cancelled with that reason); None when
    it may."""
    if agent.status in (AgentStatus.PAUSED, AgentStatus.TERMINATED):
        return f"agent_{agent.status}"
    if agent.budget_monthly_cents and agent.spent_monthly_cents >= agent.budget_monthly_cents:
        return "budget_exceeded"
    return None
