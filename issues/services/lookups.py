"""Resolve ids that arrive in request bodies, always inside one company (else 404)."""
import uuid

from django.core.exceptions import ValidationError

from issues.exceptions import Conflict, NotFound


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


def agent_ref_id(company_id, ref, field: str = "assigneeAgentId"):
    """``ref`` as an agent id: a UUID as given, else the id of the company's agent whose URL key
    (upstream's shortname, the slug of its name) it names. Unknown is a 404 as for an id; two
    agents with that key a 409, as upstream."""
    from issues.mentions import url_key
    from issues.models import Agent

    if ref is None or isinstance(ref, uuid.UUID):
        return ref
    try:
        return uuid.UUID(str(ref))
    except ValueError:
        pass
    key = url_key(str(ref))
    ids = [pk for pk, name in Agent.objects.filter(company_id=company_id).values_list("pk", "name")
           if key and url_key(name) == key]
    if not ids:
        raise _not_found(Agent, field)
    if len(ids) > 1:
        raise Conflict("Agent shortname is ambiguous in this company. Use the agent ID.",
                       code="agent_shortname_ambiguous", details={field: ["Several agents have this URL key."]})
    return ids[0]


def assignable_user(company_id, pk, field: str = "assigneeUserId"):
    """An active board user who is a member of the company (upstream: "must be an active member");
    anyone else is a 404 naming ``field``, as another company's object is."""
    from django.contrib.auth import get_user_model

    if pk in (None, ""):
        return None
    user = None
    if str(pk).isdigit():
        user = get_user_model().objects.filter(pk=int(pk), is_active=True, memberships__company_id=company_id).first()
    if user is None:
        raise NotFound("Assignee user not found.", details={field: ["No such member of this company."]})
    return user


def assignable_agent(company_id, pk, field: str = "assigneeAgentId", *, loaded=None):
    """An agent of the company that can take work: a terminated agent never runs again, a pending
    one only once its hire is approved. ``loaded``: the agent as the caller read it in this
    transaction (checked the same way, not read again)."""
    from issues.choices import AgentStatus
    from issues.models import Agent

    if loaded is not None and str(loaded.company_id) != str(company_id):
        raise _not_found(Agent, field)
    agent = loaded if loaded is not None else company_object(Agent, company_id, pk, field)
    if agent is not None and agent.status == AgentStatus.TERMINATED:  # upstream's 409s and messages
        raise Conflict("Cannot assign work to terminated agents", code="agent_terminated",
                       details={field: [f"Agent '{agent.name}' is terminated and cannot take work."]})
    if agent is not None and agent.status == AgentStatus.PENDING_APPROVAL:
        raise Conflict("Cannot assign work to pending approval agents", code="agent_pending_approval",
                       details={field: [f"Agent '{agent.name}' takes work once the board approves its hire."]})
    return agent
