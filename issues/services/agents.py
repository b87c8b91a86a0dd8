"""Agent lifecycle writes used by the operator console: pause, resume, adapter configuration."""
from __future__ import annotations

from django.db import transaction

from issues.actors import Actor
from issues.adapters import AdapterConfigError, get_adapter
from issues.choices import AdapterType, AgentStatus
from issues.exceptions import Conflict, InvalidInput
from issues.models import Agent

from .activity import activity_record

MANUAL_PAUSE = "paused by the board"


def _locked(agent: Agent) -> Agent:
    return Agent.objects.select_for_update().get(pk=agent.pk)


def agent_pause(*, actor: Actor, agent: Agent, reason: str = "") -> Agent:
    """Stop new runs of the agent (wakes are skipped, queued runs are cancelled when claimed)."""
    actor.ensure_can_write(agent.company_id)
    with transaction.atomic():
        agent = _locked(agent)
        if agent.status == AgentStatus.TERMINATED:
            raise Conflict("A terminated agent cannot be paused.", code="agent_terminated")
        if agent.status == AgentStatus.PAUSED:
            return agent
        previous = agent.status
        agent.status = AgentStatus.PAUSED
        agent.pause_reason = (reason or MANUAL_PAUSE)[:200]
        agent.save(update_fields=["status", "pause_reason", "updated_at"])
        activity_record(actor=actor, company_id=agent.company_id, action="agent.paused", entity_type="agent",
                        entity_id=agent.pk, details={"from": previous, "reason": agent.pause_reason})
    return agent


def agent_resume(*, actor: Actor, agent: Agent) -> Agent:
    actor.ensure_can_write(agent.company_id)
    with transaction.atomic():
        agent = _locked(agent)
        if agent.status != AgentStatus.PAUSED:
            raise Conflict("The agent is not paused.", code="agent_not_paused", details={"status": agent.status})
        agent.status = AgentStatus.IDLE
        agent.pause_reason = ""
        agent.save(update_fields=["status", "pause_reason", "updated_at"])
        activity_record(actor=actor, company_id=agent.company_id, action="agent.resumed", entity_type="agent",
                        entity_id=agent.pk, details={})
    return agent


def adapter_config_validate(adapter_type: str, adapter_config) -> None:
    """The adapter's own rules for its configuration, at write time: secret references inside the
    server's allow-list, an http wake URL that the outbound guard accepts, a usable command."""
    if adapter_type not in AdapterType.values:
        raise InvalidInput(details={"adapterType": [f"'{adapter_type}' is not one of {', '.join(AdapterType.values)}."]})
    if not isinstance(adapter_config, dict):
        raise InvalidInput(details={"adapterConfig": ["Must be a JSON object."]})
    try:
        get_adapter(adapter_type).validate_config(adapter_config)
    except AdapterConfigError as exc:
        raise InvalidInput(details={"adapterConfig": [str(exc)]}) from None


def agent_adapter_update(*, actor: Actor, agent: Agent, adapter_type: str, adapter_config: dict) -> Agent:
    """Replace the adapter type and its configuration (a JSON object)."""
    actor.ensure_can_write(agent.company_id)
    adapter_config_validate(adapter_type, adapter_config)
    with transaction.atomic():
        agent = _locked(agent)
        changes = sorted(name for name, value in (("adapter_type", adapter_type), ("adapter_config", adapter_config))
                         if getattr(agent, name) != value)
        if not changes:
            return agent
        agent.adapter_type, agent.adapter_config = adapter_type, adapter_config
        agent.save(update_fields=["adapter_type", "adapter_config", "updated_at"])
        activity_record(actor=actor, company_id=agent.company_id, action="agent.adapter_updated",
                        entity_type="agent", entity_id=agent.pk,
                        details={"changes": changes, "adapterType": adapter_type})
    return agent
