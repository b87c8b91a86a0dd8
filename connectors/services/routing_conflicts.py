"""Structural ``routing`` conflicts (§11.1, §11.2, §8.1): a re-route of an already linked task that does
not resolve cleanly is a conflict entry an operator decides, not only a sync error.

Detection (:func:`route_held`, called by ``apply_tasks._reroute`` when the tracker's routing inputs change):

* the decision has problems (its rule targets a missing, paused or terminated agent; the triage fallback
  is unusable) -> a routing conflict, whoever owns the issue;
* nothing matches any more (the decision falls back to triage) while the issue has another owner -> a
  routing conflict; the owner stays (the tracker no longer says who should have it).

The health entries (``routing`` sync errors) are still recorded for each problem. One entry per link
while open: a further unresolvable re-route refreshes it. A later re-route that resolves cleanly
settles it (resolution ``rerouted``). Resolving records the decision's signature on the link
(``routing.acknowledged``), so the same unresolvable outcome is not raised again; a different one is.

Resolution actions (``conflict_resolve`` dispatches here for ``kind=routing``):

* ``keep_paperclip`` — the current assignee stays and is recorded as the link's routing (kind ``paperclip``);
* ``keep_external`` — routing runs again now on the tracker's last known inputs and its outcome becomes the
  assignee (the triage fallback when the target is still unusable); refused while it resolves to nobody;
* ``merge_manual`` — ``mergedValue`` names an agent of the company (name or id), who becomes the assignee;
* ``dismiss`` — nothing changes;
* ``unlink`` — as for every conflict.

Assigning never forces a checked-out issue: it posts a handoff request for the current owner instead
(§8.1), as the re-route itself does."""
from __future__ import annotations

import hashlib
import json
import uuid

from connectors.choices import ConflictAction, ConflictKind, ConflictStatus
from connectors.models import Conflict, TaskLink
from connectors.providers.base import ExternalActor, ExternalState, ExternalTask
from issues.choices import IssueStatus
from issues.exceptions import InvalidInput
from issues.models import Agent
from issues.services.issues import issue_update

from . import links, routing

FIELD = "assignee"  # the conflict entry's field: routing decides the assignee (§4.1.4)
ACK = "acknowledged"  # key of link.routing: the signature of the last unresolvable outcome an operator decided
RESOLVED_BY_ROUTING = "rerouted"

# What each action means for a routing conflict (the console's confirmation text; the README says the same).
ACTION_MEANING = {
    ConflictAction.KEEP_PAPERCLIP: "The current assignee stays; this routing outcome is accepted and not raised again.",
    ConflictAction.KEEP_EXTERNAL: "Routing runs again now on the tracker's inputs and its outcome becomes the "
                                  "assignee (the triage agent when the target is still unusable); a checked-out "
                                  "issue gets a handoff request instead.",
    ConflictAction.MERGE_MANUAL: "The agent you name becomes the assignee (a checked-out issue gets a handoff "
                                 "request instead).",
    ConflictAction.UNLINK: "Sync stops for this task; neither side is deleted.",
    ConflictAction.DISMISS: "Nothing changes; this routing outcome is not raised again.",
}


def signature(decision: routing.RoutingDecision) -> str:
    """A stable digest of an outcome: the same unresolvable route, re-evaluated, has the same one."""
    raw = json.dumps([decision.kind, decision.rule_id, str(decision.agent.pk) if decision.agent else None,
                      sorted(decision.problems)])
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def route_held(*, link: TaskLink, issue, decision: routing.RoutingDecision, previous: dict, task: ExternalTask,
               key: str) -> bool:
    """Record (or settle) the routing conflict of this re-route. Returns True when the issue must keep its
    owner (the decision would move it although it did not resolve). ``link.routing`` already holds the new
    decision; the operator's acknowledgement is carried over while it still describes this outcome."""
    previous = previous or {}
    if not decision.problems and not decision.fell_back:
        links.conflict_settle(link=link, kind=ConflictKind.ROUTING, field=FIELD, resolution=RESOLVED_BY_ROUTING,
                              key=key)
        return False
    has_owner = bool(issue.assignee_agent_id or issue.assignee_user_id)
    moves_owner = has_owner and (decision.agent is None or decision.agent.pk != issue.assignee_agent_id)
    if not decision.problems and not moves_owner:
        # fell back to the agent that owns it already, or to triage for an issue nobody owns: nothing to decide
        links.conflict_settle(link=link, kind=ConflictKind.ROUTING, field=FIELD, resolution=RESOLVED_BY_ROUTING,
                              key=key)
        return False
    sig = signature(decision)
    if previous.get(ACK) == sig:
        link.routing = {**(link.routing or {}), ACK: sig}  # decided already: neither raised nor re-applied
        return moves_owner
    _record(link, issue, decision, previous, task, sig, key, moves_owner)
    return moves_owner


def _record(link, issue, decision, previous, task, sig, key, moves_owner):
    owner = issue.assignee_agent.name if issue.assignee_agent_id else None
    problems = "; ".join(decision.problems)
    detail = f"routing does not resolve ({decision.reason})" + (f": {problems}" if problems else "")
    external = {"route": decision.as_dict(), "problems": list(decision.problems), "signature": sig,
                "inputs": {"labels": list(task.labels), "state": task.state.name,
                           "assignees": sorted(a.display_name or a.external_user_id for a in task.assignees),
                           "customFields": dict((task.envelope or {}).get("customFields") or {})}}
    paperclip = {"assigneeAgentId": str(issue.assignee_agent_id) if issue.assignee_agent_id else None,
                 "assigneeAgentName": owner,
                 "assigneeUserId": str(issue.assignee_user_id) if issue.assignee_user_id else None}
    base = {k: v for k, v in previous.items() if k != ACK} or None
    conflict, created = links.conflict_open(link=link, kind=ConflictKind.ROUTING, field=FIELD, detail=detail,
                                            base=base, external=external, paperclip=paperclip, key=key)
    if not created:
        if (conflict.external_value, conflict.paperclip_value, conflict.detail) != (external, paperclip, detail[:500]):
            Conflict.objects.filter(pk=conflict.pk, status=ConflictStatus.OPEN).update(
                external_value=external, paperclip_value=paperclip, detail=detail[:500])
        return
    ref = link.external_key or link.external_task_id
    kept = (f"{owner or 'The current assignee'} keeps the issue" if moves_owner
            else f"It went to {decision.agent.name}" if decision.agent and not issue.assignee_agent_id
            else "Nothing was reassigned")
    links.note(issue, f"Routing of {ref} does not resolve: {detail}. {kept}; resolve the routing conflict to "
                      f"decide who should have it.", link=link, key=key, kind="routing")


# ------------------------------------------------------------------------------------------ resolution
def resolve(actor, link: TaskLink, conflict: Conflict, action: str, merged_value) -> dict:
    """Apply one resolution action (see the module docstring); returns ``{"value": agent id or None}``."""
    issue = link.issue
    sig = (conflict.external_value or {}).get("signature") if isinstance(conflict.external_value, dict) else None
    who = actor.user.get_username() if actor.is_board else actor.agent.name if actor.is_agent else "an operator"
    if action == ConflictAction.DISMISS:
        _remember(link, {ACK: sig})
        return {"value": None}
    if action == ConflictAction.KEEP_PAPERCLIP:
        owner = issue.assignee_agent
        _remember(link, {"kind": "paperclip", "ruleId": None, "agentId": str(owner.pk) if owner else None,
                         "agentName": owner.name if owner else None, "fellBack": False,
                         "reason": f"kept by {who} (routing conflict)", ACK: sig})
        return {"value": str(owner.pk) if owner else None}
    if action == ConflictAction.KEEP_EXTERNAL:
        decision = routing.routing_resolve(instance=link.instance, task=task_of(link),
                                           command_agent=(link.routing or {}).get("commandAgent"))
        if decision.agent is None:
            raise InvalidInput("Routing still resolves to nobody.", details={"action": [
                "The tracker's routing still resolves to nobody (" + ("; ".join(decision.problems) or decision.reason)
                + "). Fix the rule or the triage agent, or name an agent with merge_manual."]})
        _remember(link, {**decision.as_dict(), ACK: sig})
        _assign(actor, link, issue, decision.agent, f"routing ({decision.reason})")
        return {"value": str(decision.agent.pk)}
    if action == ConflictAction.MERGE_MANUAL:
        agent = _named_agent(link, merged_value)
        _remember(link, {"kind": "paperclip", "ruleId": None, "agentId": str(agent.pk), "agentName": agent.name,
                         "fellBack": False, "reason": f"chosen by {who} (routing conflict)", ACK: sig})
        _assign(actor, link, issue, agent, f"{who}'s choice")
        return {"value": str(agent.pk)}
    return {"value": None}


def task_of(link: TaskLink) -> ExternalTask:
    """The tracker's routing inputs as last synced (the base snapshot), for routing without a provider call."""
    ext = (link.base_snapshot or {}).get("external") or {}
    return ExternalTask(
        provider_key=link.provider_key, external_id=link.external_task_id, external_key=link.external_key or None,
        title=link.external_title, description=None,
        state=ExternalState(name=ext.get("state") or link.external_state_name,
                            category=ext.get("category") or link.external_state_category),
        labels=tuple(ext.get("labels") or ()),
        assignees=tuple(ExternalActor(link.provider_key, str(uid), str(uid)) for uid in ext.get("assignees") or ()),
        envelope={"customFields": ext.get("customFields") or {}})


def _named_agent(link: TaskLink, value) -> Agent:
    text = str(value or "").strip()
    agent = None
    if text:
        try:
            agent = Agent.objects.filter(company_id=link.company_id, pk=uuid.UUID(text)).first()
        except ValueError:  # not an id: a name
            agent = None
        agent = agent or routing.agent_by_name(link.company_id, text)
    if agent is None:
        raise InvalidInput(details={"mergedValue": [f"No agent '{text}' in this company (give its name or id)."]})
    if agent.status in routing.UNAVAILABLE:
        raise InvalidInput(details={"mergedValue": [f"Agent {agent.name} is {agent.status}."]})
    return agent


def _remember(link: TaskLink, routing_fields: dict):
    link.routing = {**(link.routing or {}), **routing_fields}
    link.save(update_fields=["routing", "updated_at"])


def _assign(actor, link: TaskLink, issue, agent: Agent, why: str):
    if issue.assignee_agent_id == agent.pk:
        return
    if issue.status == IssueStatus.IN_PROGRESS:
        links.note(issue, f"Routing conflict resolved: {agent.name} should take over ({why}). The issue is checked "
                          f"out, so it was not reassigned: handoff requested from the current owner.",
                   link=link, kind="handoff")
        return
    updated, _, _ = issue_update(actor=actor, issue=issue, changes={"assignee_agent_id": agent.pk})
    link.issue = updated
