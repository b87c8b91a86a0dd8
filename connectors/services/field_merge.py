"""The three-way field merge of an inbound snapshot (§11.1): base snapshot, tracker and issue, per
synced field. Used by :func:`connectors.services.apply_tasks.link_apply_task`."""
from __future__ import annotations

from connectors.choices import ConflictKind, ConflictStatus
from connectors.models import Conflict

from . import links


# §11.1 synced fields: (external snapshot key, issue attribute or None when Paperclip has no such field).
# state goes through the §7.4 category rules (apply_tasks.py); assignee through routing.
SYNCED_FIELDS = (("title", "title"), ("description", "description"), ("priority", "priority"),
                 ("labels", None), ("dueAt", None))


def fields_three_way(link, issue, task, ext, base_ext, base_pc, changes, key, actor_text) -> set:
    """Three-way per field between the base, the tracker and the issue. Changed on the tracker only
    -> applied when the tracker may change it (owner external/shared), a policy conflict otherwise;
    changed on both sides to different values -> one field conflict (re-deliveries find the open
    entry and refresh its values). Returns the fields whose base must not advance."""
    held = set()
    policy = link.field_policy or {}
    for field, attr in SYNCED_FIELDS:
        if ext.get(field) == base_ext.get(field):
            continue  # unchanged on the tracker (Paperclip-side changes leave through the outbound engine)
        owner = policy.get(field, "external")
        incoming = links.issue_priority(task) if field == "priority" else ext.get(field)
        current = getattr(issue, attr) if attr else None
        paperclip_changed = attr is not None and current != base_pc.get(attr, current)
        if owner == "paperclip":
            kind, detail = ConflictKind.POLICY, f"external change to paperclip-owned {field}"
        elif paperclip_changed and current != incoming:
            kind, detail = ConflictKind.FIELD, f"{field} changed on both sides"
            if _policy_entry_open(link, field):  # the Paperclip edit already waits as a policy entry: one entry
                kind = ConflictKind.POLICY
        else:
            if attr and incoming is not None and incoming != current:
                changes[attr] = incoming
            elif paperclip_changed:  # the tracker now says what Paperclip said: a policy entry is moot
                links.conflict_settle(link=link, kind=ConflictKind.POLICY, field=field, resolution="matches_tracker",
                                      key=key)
            continue
        held.add(field)
        conflict, created = links.conflict_open(link=link, kind=kind, field=field, key=key, detail=detail,
                                                base=base_ext.get(field), external=ext.get(field), paperclip=current,
                                                actors={"external": actor_text})
        if not created and (conflict.external_value != ext.get(field) or conflict.paperclip_value != current):
            Conflict.objects.filter(pk=conflict.pk, status=ConflictStatus.OPEN).update(
                external_value=ext.get(field), paperclip_value=current)
    return held


def _policy_entry_open(link, field: str) -> bool:
    """A Paperclip-side edit of this tracker-owned field is queued as a policy entry (policy_entries.py)."""
    return Conflict.objects.filter(link=link, kind=ConflictKind.POLICY, field=field,
                                   status=ConflictStatus.OPEN).exists()


def paperclip_pending(issue, task, ext: dict, base_pc: dict, changes: dict) -> set:
    """Fields edited in Paperclip since the base that the tracker has not caught up with (not applied
    from the tracker now, not equal to its value): their Paperclip base must not move, or an unrelated
    tracker event would absorb the edit and a later tracker change would overwrite it silently."""
    pending = set()
    for field, attr in SYNCED_FIELDS:
        if attr is None or attr in changes:
            continue
        current = getattr(issue, attr)
        incoming = links.issue_priority(task) if field == "priority" else ext.get(field)
        if current != base_pc.get(attr, current) and current != incoming:
            pending.add(field)
    return pending


def base_advance(ext: dict, pc: dict, base_ext: dict, base_pc: dict, held: set, pending: set = frozenset()) -> dict:
    """The new base: both sides' current values, except the fields held by an open conflict and the
    Paperclip side of edits still waiting to reach the tracker."""
    ext, pc = dict(ext), dict(pc)
    for field, attr in SYNCED_FIELDS:
        if field in held:
            ext[field] = base_ext.get(field)
        if attr and (field in held or field in pending):
            pc[attr] = base_pc.get(attr, pc.get(attr))
    return {"external": ext, "paperclip": pc}
