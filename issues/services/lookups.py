"""Resolve ids that arrive in request bodies, always inside one company (else 404)."""
from django.core.exceptions import ValidationError

from issues.exceptions import InvalidInput, NotFound


def _not_found(model, field: str) -> NotFound:
    name = model._meta.verbose_name
    return NotFound(f"{name.capitalize()} not found.", details={field: [f"No such {name} in this company."]})


def company_object(model, company_id, pk, field: str):
    if pk is None:
        return None
    try:
        return model.objects.get(pk=pk, company_id=company_id)
    except (model.DoesNotExist, ValidationError, ValueError):
        raise _not_found(model, field)


def assignable_agent(company_id, pk, field: str = "assigneeAgentId", *, loaded=None):
    """An agent of the company that can take work: a terminated agent never runs again. ``loaded``:
    the agent as the caller read it in this transaction (checked the same way, not read again)."""
    from issues.choices import AgentStatus
    from issues.models import Agent

    if loaded is not None and str(loaded.company_id) != str(company_id):
        raise _not_found(Agent, field)
    agent = loaded if loaded is not None else company_object(Agent, company_id, pk, field)
    if agent is not None and agent.status == AgentStatus.TERMINATED:
        raise InvalidInput(details={field: [f"Agent '{agent.name}' is terminated and cannot take work."]})
    return agent
