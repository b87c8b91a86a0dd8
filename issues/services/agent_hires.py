"""Hiring an agent (``POST /api/companies/{companyId}/agent-hires``, paperclip-api.md §5.1), as
upstream: who may hire is who may create agents (board write roles; an agent with
``canCreateAgents``). When the company requires board approval for new agents the hire waits as
``pending_approval`` (no key authenticates it, no work is assigned to it, nothing wakes it) beside
a ``hire_agent`` approval whose payload is the draft and ``agentId``; the decision settles it
(services.hire_settlement). Otherwise the agent is created as ``POST /agents`` creates one.
"""
from __future__ import annotations

from django.db import transaction

from issues.actors import Actor
from issues.adapters.base import redacted_adapter_config
from issues.choices import ApprovalType
from issues.models import Agent, Approval, Company

from .activity import activity_record
from .approvals import approval_create, linked_issues
from .companies import agent_create


def agent_hire(*, actor: Actor, company: Company, source_issue_ids=(), **fields) -> tuple[Agent, Approval | None]:
    """The hired agent and, when the company requires the board's approval, its pending ``hire_agent``
    approval linked to ``source_issue_ids`` (the issues the hire was asked for in). ``fields``: those
    of ``companies.agent_create``."""
    issues = linked_issues(company, source_issue_ids, "sourceIssueIds")  # every id checked before anything is written
    with transaction.atomic():
        requires = Company.objects.filter(pk=company.pk).values_list(
            "require_board_approval_for_new_agents", flat=True).get()
        agent = agent_create(actor=actor, company=company, pending_approval=requires, **fields)
        approval = None
        if requires:
            approval = approval_create(actor=actor, company=company, type=ApprovalType.HIRE_AGENT,
                                       title=f"Hire {agent.name}", payload=_draft(agent, actor),
                                       issue_ids=[issue.pk for issue in issues])
        activity_record(actor=actor, company_id=company.pk, action="agent.hire_created", entity_type="agent",
                        entity_id=agent.pk,
                        details={"name": agent.name, "role": agent.role, "requiresApproval": requires,
                                 "approvalId": str(approval.pk) if approval else None,
                                 "issueIds": [str(issue.pk) for issue in issues]})
    return agent, approval


def _draft(agent: Agent, actor: Actor) -> dict:
    """The approval's payload (upstream's keys): what the board decides on. Agents read approvals, so
    secret-looking literal values of the configurations are redacted (the agent row keeps them)."""
    config = redacted_adapter_config(agent.adapter_config)
    runtime = redacted_adapter_config(agent.runtime_config)
    return {"name": agent.name, "role": agent.role, "title": agent.title or None, "icon": agent.icon or None,
            "reportsTo": str(agent.reports_to_id) if agent.reports_to_id else None,
            "capabilities": agent.capabilities or None, "adapterType": agent.adapter_type,
            "adapterConfig": config, "runtimeConfig": runtime, "budgetMonthlyCents": agent.budget_monthly_cents,
            "metadata": redacted_adapter_config(agent.metadata), "agentId": str(agent.pk),
            "requestedByAgentId": str(actor.agent.pk) if actor.is_agent else None,
            "requestedConfigurationSnapshot": {"adapterType": agent.adapter_type, "adapterConfig": config,
                                               "runtimeConfig": runtime}}
