"""Board-written activity rows (upstream ``POST /companies/{id}/activity``, §5.8).

The audit log stays truthful: the row is recorded as written by the board user who sent it (with
the board key and run header the request carried); an actor the client claims (``actorType``,
``actorId``, ``agentId``) is kept in ``details.reportedActor``, never taken as the row's actor.
"""
from __future__ import annotations

from django.db import transaction

from issues.actors import Actor
from issues.models import Agent

from .activity import activity_record
from .lookups import company_object


def activity_report(*, actor: Actor, company, action: str, entity_type: str, entity_id: str, details: dict,
                    actor_type: str = "system", actor_id: str = "", agent_id=None):
    actor.ensure_board()
    actor.ensure_can_write(company.pk)
    agent = company_object(Agent, company.pk, agent_id, "agentId")
    details = dict(details or {})
    details["reportedActor"] = {"actorType": actor_type, "actorId": actor_id,
                                "agentId": str(agent.pk) if agent else None}
    with transaction.atomic():
        return activity_record(actor=actor, company_id=company.pk, action=action, entity_type=entity_type,
                               entity_id=entity_id, details=details)
