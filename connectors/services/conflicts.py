"""Conflict resolution (§11.3): keep_paperclip, keep_external, merge_manual, unlink, dismiss.

Every action advances the link's ``base_snapshot`` for the conflict's field, so the same divergence
is never detected again; the chosen value goes to the losing side (Paperclip through the issues
services, the tracker as an outbound effect drained by the write engine); the resolution is audited
with its actor and idempotency key; the link leaves ``conflict`` when no open conflict remains.

By kind: ``field`` and ``policy`` entries carry a field and its values (a ``policy`` entry is a change by
the side that does not own the field: inbound, a tracker edit of a Paperclip-owned field; outbound, a
Paperclip edit of a tracker-owned one, see policy_entries.py); ``closure`` / ``deletion`` are decided by
``_apply_structural``; ``routing`` entries decide the assignee (routing_conflicts.py: keep_paperclip keeps
the owner, keep_external applies the tracker's routing now, merge_manual names the agent, dismiss keeps
everything)."""
from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from connectors.choices import ConflictAction, ConflictKind, ConflictStatus, LinkStatus, OutboundKind, OutboundStatus
from connectors.models import Conflict, OutboundEffect, TaskLink
from issues.actors import Actor
from issues.choices import IssuePriority, IssueStatus
from issues.exceptions import Conflict as ConflictError
from issues.exceptions import Forbidden, InvalidInput
from issues.services.activity import activity_record
from issues.services.issues import issue_update

from . import links, routing_conflicts
from .agent_tools import require_agent_issue
from .common import link_set_status
from .interventions import require_writer

# Conflict field -> (issue attribute, base_snapshot.paperclip key, base_snapshot.external key)
FIELDS = {
    "title": ("title", "title", "title"),
    "description": ("description", "description", "description"),
    "priority": ("priority", "priority", "priority"),
    "state": ("status", "status", "category"),
}
# The external side's fields without a Paperclip counterpart: a resolution only moves the base.
EXTERNAL_ONLY_FIELDS = ("labels", "dueAt")
PRIORITY_NUMBER = {"critical": 0, "high": 1, "medium": 2, "low": 3}
CATEGORY_STATUS = {"backlog": IssueStatus.BACKLOG, "active": IssueStatus.TODO, "review": IssueStatus.IN_REVIEW,
                   "blocked": IssueStatus.BLOCKED, "terminal": IssueStatus.DONE}


def conflict_resolve(*, actor: Actor, conflict: Conflict, action: str, merged_value=None,
                     expected_status: str = ConflictStatus.OPEN, idempotency_key: str = "") -> Conflict:
    """Resolve one conflict entry. Raises Conflict(409, conflict_not_open) when it is no longer in
    ``expected_status`` (someone resolved it meanwhile) and InvalidInput for a bad action or a
    missing merged value. A repeat with the idempotency key of the recorded resolution returns it.
    Board writers resolve any conflict of their company; agents (the connector agent tools) only
    those on their own issue checked out by their run, and never by unlinking (see agent_tools)."""
    _authorize(actor, conflict, action)
    if action not in ConflictAction.values:
        raise InvalidInput(details={"action": [f"Must be one of: {', '.join(ConflictAction.values)}."]})
    if action == ConflictAction.MERGE_MANUAL:
        if merged_value is None:
            raise InvalidInput(details={"mergedValue": ["Required for merge_manual."]})
        if conflict.kind not in (ConflictKind.FIELD, ConflictKind.POLICY, ConflictKind.ROUTING):
            raise InvalidInput(details={"action": ["merge_manual applies to field, policy and routing conflicts "
                                                   "only."]})
        merged_value = _clean_merged(conflict.field, merged_value)
    key = (idempotency_key or "").strip()[:200]
    with transaction.atomic():
        # Lock order as in the inbound path: the link (with its issue) first, then the entry.
        link = (TaskLink.objects.select_for_update(of=("self", "issue")).select_related("issue", "instance")
                .get(pk=conflict.link_id))
        if actor.is_agent:
            require_agent_issue(actor, link.issue, write=True)  # again, under the issue lock
        row = Conflict.objects.select_for_update().get(pk=conflict.pk)
        if row.status != expected_status or row.status != ConflictStatus.OPEN:
            if key and row.resolution_key == key and row.resolution == action:
                return row  # the same request again
            raise ConflictError("This conflict is no longer open; someone resolved it meanwhile.",
                                code="conflict_not_open",
                                details={"status": row.status, "resolution": row.resolution,
                                         "resolvedAt": row.resolved_at.isoformat() if row.resolved_at else None})
        token = links.RESOLVING.set(links.RESOLVING.get() | {(row.pk, row.link_id, row.field)})
        try:
            result = _apply(actor, link, row, action, merged_value)
        finally:
            links.RESOLVING.reset(token)
        row.status = ConflictStatus.DISMISSED if action == ConflictAction.DISMISS else ConflictStatus.RESOLVED
        row.resolution, row.resolution_key = action, key
        row.resolution_value = result.get("value")
        row.resolved_at = timezone.now()
        row.resolved_by_user = actor.user if actor.is_board else None
        row.save(update_fields=["status", "resolution", "resolution_key", "resolution_value", "resolved_at",
                                "resolved_by_user"])
        link.refresh_from_db(fields=["status", "status_detail"])
        link_status_recompute(link, cause=f"conflict {action}", key=key)
        activity_record(actor=actor, company_id=row.company_id, action="connector.conflict_resolved",
                        entity_type="connector_link", entity_id=link.pk,
                        details={"conflictId": str(row.pk), "kind": row.kind, "field": row.field, "action": action,
                                 "value": result.get("value"), "outboundEffectId": result.get("effectId"),
                                 "idempotencyKey": key, "instanceId": str(link.instance_id)})
    return row


def _authorize(actor: Actor, conflict: Conflict, action: str):
    if not actor.is_agent:
        require_writer(actor, conflict.company_id)
        return
    if action == ConflictAction.UNLINK:
        raise Forbidden("Unlinking is reserved to board users.", code="board_only")
    require_agent_issue(actor, conflict.link.issue, write=True)


def link_status_recompute(link: TaskLink, *, cause: str, key: str = ""):
    """conflict -> healthy once no open conflict remains (paused/unlinked/error stay as they are)."""
    if link.status != LinkStatus.CONFLICT:
        return
    if not Conflict.objects.filter(link=link, status=ConflictStatus.OPEN).exists():
        link_set_status(link, LinkStatus.HEALTHY, cause, detail="", key=key)


def _clean_merged(field: str, value):
    if field in ("title", "description"):
        if not isinstance(value, str) or (field == "title" and not value.strip()):
            raise InvalidInput(details={"mergedValue": [f"A non-empty string is required for {field}."]})
        return value[:500] if field == "title" else value
    if field == "priority":
        if value not in IssuePriority.values:
            raise InvalidInput(details={"mergedValue": [f"One of {', '.join(IssuePriority.values)}."]})
        return value
    if field == "state":
        if value not in IssueStatus.values:
            raise InvalidInput(details={"mergedValue": [f"One of {', '.join(IssueStatus.values)}."]})
        return value
    return value


def _advance_base(link: TaskLink, field: str, *, external=..., paperclip=...):
    base = dict(link.base_snapshot or {})
    ext, pc = dict(base.get("external") or {}), dict(base.get("paperclip") or {})
    if field in FIELDS:
        _, pc_key, ext_key = FIELDS[field]
        if external is not ...:
            ext[ext_key] = external
        if paperclip is not ...:
            pc[pc_key] = paperclip
    elif field:
        if external is not ...:
            ext[field] = external
    link.base_snapshot = {**base, "external": ext, "paperclip": pc}
    link.save(update_fields=["base_snapshot", "updated_at"])


def _seen_external(conflict: Conflict):
    """The external value the entry recorded, in the base snapshot's vocabulary."""
    value = conflict.external_value
    if isinstance(value, dict) and conflict.field in value:
        return value[conflict.field]
    return value


def _paperclip_write(actor, link: TaskLink, changes: dict):
    if not changes:
        return link.issue
    issue, _, _ = issue_update(actor=actor, issue=link.issue, changes=changes)
    link.issue = issue
    return issue


def _external_write(link: TaskLink, conflict: Conflict, kind: str, payload: dict) -> OutboundEffect | None:
    from .outbound import write_refusal

    if write_refusal(link, kind, toggle="projectStatus" if kind == OutboundKind.STATE else None):
        return None
    if kind == OutboundKind.STATE:
        from .outbound import STATUS_CATEGORY, state_name_for

        category = STATUS_CATEGORY.get(payload.get("status"))
        name = state_name_for(link, category) if category else None
        if not name:
            return None  # only operator-mapped states are written (§10.3)
        payload = {**payload, "stateName": name, "category": category}
    from .outbound import effect_record

    return effect_record(link=link, kind=kind, source_id=f"conflict:{conflict.pk}",
                         payload={**payload, "reason": f"conflict {conflict.pk} resolved"})


def _apply(actor, link: TaskLink, conflict: Conflict, action: str, merged_value) -> dict:
    field = conflict.field
    issue = link.issue
    if action == ConflictAction.UNLINK:
        link_set_status(link, LinkStatus.UNLINKED, "conflict resolution: unlink",
                        detail=f"unlinked while resolving conflict {conflict.pk}")
        OutboundEffect.objects.filter(link=link, status=OutboundStatus.PENDING).update(status=OutboundStatus.CANCELLED)
        Conflict.objects.filter(link=link, status=ConflictStatus.OPEN).exclude(pk=conflict.pk).update(
            status=ConflictStatus.DISMISSED, resolution="unlink", resolved_at=timezone.now())
        return {"value": None}
    if conflict.kind in (ConflictKind.CLOSURE, ConflictKind.DELETION):
        return _apply_structural(actor, link, conflict, action)
    if conflict.kind == ConflictKind.ROUTING:  # who should own the issue (routing_conflicts.py explains each action)
        return routing_conflicts.resolve(actor, link, conflict, action, merged_value)
    seen = _seen_external(conflict)
    if field in FIELDS:
        attr = FIELDS[field][0]
        if action == ConflictAction.DISMISS:
            _advance_base(link, field, external=seen, paperclip=getattr(issue, attr))
            return {"value": None}
        if action == ConflictAction.KEEP_PAPERCLIP:
            value = getattr(issue, attr)
        elif action == ConflictAction.KEEP_EXTERNAL:
            value = _to_paperclip(field, seen)
        else:
            value = merged_value
        if action in (ConflictAction.KEEP_EXTERNAL, ConflictAction.MERGE_MANUAL) and value is not None:
            issue = _paperclip_write(actor, link, {attr: value})
        effect = None
        if action in (ConflictAction.KEEP_PAPERCLIP, ConflictAction.MERGE_MANUAL):
            if field == "state":
                effect = _external_write(link, conflict, OutboundKind.STATE, {"status": value})
            else:
                external = PRIORITY_NUMBER.get(value) if field == "priority" else value
                effect = _external_write(link, conflict, OutboundKind.FIELDS, {"fields": {field: external}})
        _advance_base(link, field, external=seen, paperclip=getattr(issue, attr))
        return {"value": value, "effectId": effect.pk if effect else None}
    # labels / dueAt (no Paperclip counterpart) and routing/policy entries without a field
    value = {ConflictAction.KEEP_PAPERCLIP: conflict.paperclip_value, ConflictAction.KEEP_EXTERNAL: seen,
             ConflictAction.MERGE_MANUAL: merged_value}.get(action)
    effect = None
    if field in EXTERNAL_ONLY_FIELDS and action in (ConflictAction.KEEP_PAPERCLIP, ConflictAction.MERGE_MANUAL):
        effect = _external_write(link, conflict, OutboundKind.FIELDS, {"fields": {field: value}})
    if field:
        _advance_base(link, field, external=seen)
    return {"value": value, "effectId": effect.pk if effect else None}


def _to_paperclip(field: str, value):
    if field == "priority" and isinstance(value, int):
        return links.PRIORITY.get(value)
    if field == "state":
        return CATEGORY_STATUS.get(value, value) if value not in IssueStatus.values else value
    return value


def _apply_structural(actor, link: TaskLink, conflict: Conflict, action: str) -> dict:
    """closure: keep_external closes the issue; keep_paperclip projects the Paperclip state back.
    deletion: keep_external cancels the issue; keep_paperclip keeps it (the task is gone).
    The base's state category advances to what the tracker showed, so the entry is not re-opened."""
    issue = link.issue
    effect, value = None, None
    if conflict.kind == ConflictKind.CLOSURE:
        if action == ConflictAction.KEEP_EXTERNAL:
            value = IssueStatus.DONE
            if issue.status not in (IssueStatus.DONE, IssueStatus.CANCELLED):
                issue = _paperclip_write(actor, link, {"status": IssueStatus.DONE})
        elif action == ConflictAction.KEEP_PAPERCLIP:
            value = issue.status
            effect = _external_write(link, conflict, OutboundKind.STATE, {"status": issue.status, "reopen": True})
        _advance_base(link, "state", external="terminal", paperclip=issue.status)
    else:
        if action == ConflictAction.KEEP_EXTERNAL:
            value = IssueStatus.CANCELLED
            if issue.status not in (IssueStatus.DONE, IssueStatus.CANCELLED):
                _paperclip_write(actor, link, {"status": IssueStatus.CANCELLED})
        elif action == ConflictAction.KEEP_PAPERCLIP:
            value = issue.status
    return {"value": value, "effectId": effect.pk if effect else None}


def conflict_get(*, actor: Actor, pk) -> Conflict:
    """One conflict entry of a company the actor belongs to (anything else is a 404)."""
    from issues.selectors import scoped_get

    return scoped_get(Conflict.objects.select_related("link", "instance"), actor, pk, "Conflict")
