"""What a decided ``hire_agent`` approval does to its agent (upstream's approval service): approved,
the pending agent starts work (``idle``, or paused with the company's reason while the company is
stopped) or, when the approval names no agent (one filed through ``POST /approvals`` with the draft
alone), the agent is created from the draft; rejected, the pending agent is terminated.

What the board approves is what is hired: the draft's profile (name, role, title, icon,
capabilities, budget, manager), as resubmitted after a revision request, is applied to the pending
agent before it starts. The configurations are not (the draft shows them redacted).

Called by ``approvals.approval_decide`` inside its transaction: a draft that cannot be created fails
the decision as a whole (nothing half-written). Below ``approvals`` and ``agent_hires``, so neither
imports the other's module circle.
"""
from __future__ import annotations

from issues.actors import Actor, uuid_or_none
from issues.choices import AdapterType, AgentStatus, ApprovalStatus, ApprovalType
from issues.exceptions import Conflict, InvalidInput, Unprocessable
from issues.models import Agent, Approval
from issues.selectors import hired_agent

from .activity import activity_record
from .agents import agent_terminate, agent_update
from .companies import agent_create
from .company_stop import company_for_stop, company_stop_reason

# The draft fields an approval without an agent creates one from (upstream's names).
DRAFT_FIELDS = {"name": "name", "role": "role", "title": "title", "capabilities": "capabilities",
                "adapterType": "adapter_type", "adapterConfig": "adapter_config",
                "runtimeConfig": "runtime_config", "budgetMonthlyCents": "budget_monthly_cents",
                "icon": "icon", "metadata": "metadata"}
_text = (lambda v: isinstance(v, str), "a string")
_object = (lambda v: isinstance(v, dict), "a JSON object")
DRAFT_TYPES = {"name": _text, "role": _text, "title": _text, "capabilities": _text, "adapter_type": _text,
               "icon": _text, "adapter_config": _object, "runtime_config": _object, "metadata": _object,
               "budget_monthly_cents": (lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63,
                                        "a non-negative integer")}
# What an approval applies to its pending agent: the profile, not the (redacted) configurations.
PROFILE_FIELDS = ("name", "role", "title", "icon", "capabilities", "budgetMonthlyCents")


def hire_settle(*, actor: Actor, approval: Approval) -> Agent | None:
    """Apply ``approval``'s decision to its agent; the agent it settled, or None (not a hire, not
    decided, or its agent is gone or no longer waiting)."""
    if approval.type != ApprovalType.HIRE_AGENT or approval.status not in (ApprovalStatus.APPROVED,
                                                                           ApprovalStatus.REJECTED):
        return None
    payload = approval.payload if isinstance(approval.payload, dict) else {}
    if payload.get("agentId") is None:
        return _create_from_draft(actor, approval, payload) if approval.status == ApprovalStatus.APPROVED else None
    agent = hired_agent(approval, lock=True)
    if agent is None or agent.status != AgentStatus.PENDING_APPROVAL:
        return None  # deleted, or already settled (terminated by the board): nothing to do
    if approval.status == ApprovalStatus.REJECTED:
        return agent_terminate(actor=actor, agent=agent)
    agent = _apply_profile(actor, approval, agent, payload)
    stop = company_stop_reason(company_for_stop(agent.company_id, lock=True))
    agent.status, agent.pause_reason = (AgentStatus.PAUSED, stop) if stop else (AgentStatus.IDLE, "")
    agent.save(update_fields=["status", "pause_reason", "updated_at"])
    return _hired(actor, approval, agent)


def _hired(actor: Actor, approval: Approval, agent: Agent) -> Agent:
    activity_record(actor=actor, company_id=agent.company_id, action="agent.hire_approved", entity_type="agent",
                    entity_id=agent.pk, details={"approvalId": str(approval.pk), "status": agent.status})
    return agent


def _draft_fields(approval: Approval, payload: dict, names) -> tuple[dict, Agent | None]:
    """The draft's values for ``names`` (upstream's keys) as model columns, type-checked, and its
    manager (``reportsTo``) in the approval's company; a wrong one raises naming ``payload.<key>``."""
    fields = {DRAFT_FIELDS[name]: payload[name] for name in names if payload.get(name) is not None}
    wrong = {f"payload.{name}": [f"Must be {DRAFT_TYPES[DRAFT_FIELDS[name]][1]}."] for name in names
             if DRAFT_FIELDS[name] in fields and not DRAFT_TYPES[DRAFT_FIELDS[name]][0](fields[DRAFT_FIELDS[name]])}
    reports_to = payload.get("reportsTo")
    manager_id = uuid_or_none(reports_to)
    manager = Agent.objects.filter(pk=manager_id, company_id=approval.company_id).first() if manager_id else None
    if reports_to is not None and manager is None:
        wrong["payload.reportsTo"] = ["No such agent in this company."]
    if wrong:
        raise InvalidInput(details=wrong)
    return fields, manager


def _prefixed(exc):
    """A service's refusal of a draft value, naming the payload's field."""
    exc.details = {name if name.startswith("payload.") else f"payload.{name}": reasons
                   for name, reasons in exc.details.items()}
    return exc


def _create_from_draft(actor: Actor, approval: Approval, payload: dict) -> Agent:
    """The draft's agent, checked as any new agent is; an error names the payload's field."""
    fields, manager = _draft_fields(approval, payload, DRAFT_FIELDS)
    if not isinstance(fields.get("name"), str) or not fields["name"].strip():
        raise InvalidInput(details={"payload.name": ["Required to create the agent on approval."]})
    fields.setdefault("adapter_type", AdapterType.NONE)  # no adapter until the board configures one
    try:
        agent = agent_create(actor=actor, company=approval.company, reports_to=manager, **fields)
    except (InvalidInput, Conflict) as exc:
        raise _prefixed(exc)
    return _hired(actor, approval, agent)


def _apply_profile(actor: Actor, approval: Approval, agent: Agent, payload: dict) -> Agent:
    """The approved draft's profile onto the pending agent (through ``agent_update``: its checks and
    its ``agent.updated`` audit); a key the draft leaves out keeps the agent's value."""
    fields, manager = _draft_fields(approval, payload, PROFILE_FIELDS)
    changes = {name: fields[DRAFT_FIELDS[name]] for name in PROFILE_FIELDS if DRAFT_FIELDS[name] in fields}
    for name in ("title", "icon", "capabilities"):  # the draft's null is "none"
        if name in payload and payload[name] is None:
            changes[name] = ""
    if "reportsTo" in payload:
        changes["reportsTo"] = manager
    current = {"reportsTo": agent.reports_to, **{name: getattr(agent, DRAFT_FIELDS[name]) for name in PROFILE_FIELDS}}
    changes = {name: value for name, value in changes.items() if current[name] != value}
    if not changes:
        return agent
    try:
        return agent_update(actor=actor, agent=agent, changes=changes)
    except (InvalidInput, Conflict, Unprocessable) as exc:
        raise _prefixed(exc)
