"""Goals (upstream Paperclip §5.4): a company's tree of goals, each with a level and a status.

Board users with a write role and the company's agents may create, change and delete goals
(upstream checks only company access for agents). Input is checked against upstream's enums;
rows written before (e.g. level ``company``, status ``active`` defaults of the console) keep
their values and read back as stored.
"""
from __future__ import annotations

from django.db import transaction

from issues.actors import Actor
from issues.exceptions import InvalidInput, Unprocessable
from issues.models import Agent, Goal

from .activity import activity_record
from .lookups import company_object

GOAL_LEVELS = ("company", "team", "agent", "task")
GOAL_STATUSES = ("planned", "active", "achieved", "cancelled")
TITLE_MAX = 300  # Goal.title
# API field -> model attribute for the plain columns.
FIELDS = {"title": "title", "description": "description", "level": "level", "status": "status"}
API_NAMES = {**{v: k for k, v in FIELDS.items()}, "parent": "parentId", "owner_agent": "ownerAgentId"}


def ensure_org_write(actor: Actor, company_id):
    """The write checks of the org routes (goals, projects, costs): a board user needs a write
    role; an agent needs no run (upstream), but a run header it sends must name one of its runs,
    which the activity row then records."""
    actor.ensure_can_write(company_id)
    if actor.is_agent and actor.run_header:
        actor.run  # noqa: B018 (validates and remembers the run)


def _check_enums(values: dict):
    errors = {}
    for name, allowed in (("level", GOAL_LEVELS), ("status", GOAL_STATUSES)):
        if name in values and values[name] not in allowed:
            errors[name] = [f"'{values[name]}' is not one of {', '.join(allowed)}."]
    if "title" in values and not (values["title"] or "").strip():
        errors["title"] = ["This field may not be blank."]
    if errors:
        raise InvalidInput(details=errors)


def _parent(company_id, parent_id, goal: Goal | None) -> Goal | None:
    """The parent, of the same company; never the goal itself or one of its descendants."""
    parent = company_object(Goal, company_id, parent_id, "parentId")
    if parent is None or goal is None:
        return parent
    node, seen = parent, set()
    while node is not None and node.pk not in seen:
        if node.pk == goal.pk:
            raise Unprocessable("A goal cannot be its own ancestor.", code="goal_cycle",
                                details={"parentId": ["Would make the goal its own ancestor."]})
        seen.add(node.pk)
        node = Goal.objects.filter(pk=node.parent_id).first() if node.parent_id else None
    return parent


def goal_create(*, actor: Actor, company, title: str, description: str = "", level: str = "task",
                status: str = "planned", parent_id=None, owner_agent_id=None) -> Goal:
    ensure_org_write(actor, company.pk)
    _check_enums({"title": title, "level": level, "status": status})
    parent = _parent(company.pk, parent_id, None)
    owner = company_object(Agent, company.pk, owner_agent_id, "ownerAgentId")
    with transaction.atomic():
        goal = Goal.objects.create(company=company, title=title.strip()[:TITLE_MAX], description=description or "",
                                   level=level, status=status, parent=parent, owner_agent=owner)
        activity_record(actor=actor, company_id=company.pk, action="goal.created", entity_type="goal",
                        entity_id=goal.pk, details={"title": goal.title})
    return goal


def goal_update(*, actor: Actor, goal: Goal, changes: dict) -> Goal:
    """``changes`` uses the API names (title, description, level, status, parentId, ownerAgentId)."""
    ensure_org_write(actor, goal.company_id)
    _check_enums(changes)
    values = {FIELDS[k]: (v.strip() if k == "title" else (v or "")) for k, v in changes.items() if k in FIELDS}
    if "parentId" in changes:
        values["parent"] = _parent(goal.company_id, changes["parentId"], goal)
    if "ownerAgentId" in changes:
        values["owner_agent"] = company_object(Agent, goal.company_id, changes["ownerAgentId"], "ownerAgentId")
    with transaction.atomic():
        goal = Goal.objects.select_for_update().get(pk=goal.pk)
        changed = sorted(k for k, v in values.items() if getattr(goal, k) != v)
        if not changed:
            return goal
        for name in changed:
            setattr(goal, name, values[name])
        goal.save()
        activity_record(actor=actor, company_id=goal.company_id, action="goal.updated", entity_type="goal",
                        entity_id=goal.pk, details={"changedKeys": sorted(API_NAMES[k] for k in changed)})
    return goal


def goal_delete(*, actor: Actor, goal: Goal) -> Goal:
    """Children, issues and cost events keep existing; their goal link is cleared (SET_NULL)."""
    ensure_org_write(actor, goal.company_id)
    with transaction.atomic():
        Goal.objects.filter(pk=goal.pk).delete()  # (a queryset delete leaves ``goal`` as it was: the answer)
        activity_record(actor=actor, company_id=goal.company_id, action="goal.deleted", entity_type="goal",
                        entity_id=goal.pk, details={"title": goal.title})
    return goal
