"""Paperclip-side edits of tracker-owned fields (§4.1.4, §11.1): never a silent non-push.

When a person or an agent edits a synced field of a linked issue (title, description, priority) whose
field policy is ``external``, the outbound engine does not write it to the tracker. Instead of dropping
the edit quietly, it becomes a conflict entry of kind ``policy`` ("queue conflict if the changed side is
not the owner", §11.1): counted in the instance health (``conflictCount``, ``conflictsByKind``), listed in
the conflict queue and on the issue's link panel, and decided by an operator:

* ``keep_paperclip`` — the Paperclip value is written to the tracker once (the field stays tracker-owned);
* ``keep_external`` — the Paperclip edit is reverted to the tracker's value;
* ``merge_manual`` — the given value goes to both sides;
* ``dismiss`` — the edit stays in Paperclip only; the tracker keeps its value, and its next change of the
  field overwrites the Paperclip one (owner wins);
* ``unlink`` — as for every conflict.

An entry is opened only when the field policy is the one thing in the way: the link's sync mode writes
(``bidirectional`` / ``export_only``), the provider can write the field (``Capabilities.settable_fields``)
and the field is owned by ``external``. One entry per link and field while open: further edits refresh
its Paperclip value; an edit back to the tracker's value settles it (resolution ``matches_tracker``), as
does a tracker change to the same value (``field_merge``). The connector's own edits (SYSTEM) never count.
"""
from __future__ import annotations

from connectors.choices import ConflictKind, ConflictStatus, LinkStatus, OutboundKind
from connectors.models import Conflict, TaskLink

from . import links
from .common import adapter_class
from .outbound import write_refusal

FIELDS = ("title", "description", "priority")  # outbound.PUSHED_FIELDS: the synced fields Paperclip can edit
SETTLED = "matches_tracker"
_MISSING = object()


def held_by_policy(link: TaskLink, field: str) -> bool:
    """Whether only ``fieldPolicy.<field> = external`` keeps a Paperclip edit of ``field`` from the tracker."""
    try:
        settable = adapter_class(link.provider_key).capabilities.settable_fields
    except LookupError:
        return False
    return (field in settable and not write_refusal(link, OutboundKind.FIELDS)
            and bool(write_refusal(link, OutboundKind.FIELDS, field=field)))


def tracker_value(link: TaskLink, field: str):
    """The tracker's value of ``field`` as last synced, in the issue's vocabulary (``_MISSING`` if unknown)."""
    ext = (link.base_snapshot or {}).get("external") or {}
    if field not in ext:
        return _MISSING
    if field == "priority":
        return links.PRIORITY.get(ext[field]) if isinstance(ext[field], int) else None
    return ext[field]


def paperclip_edits_recorded(*, issue, fields, actor=None):
    """Called for every non-connector edit of a linked issue's synced fields (connectors.receivers)."""
    who = _actor_text(actor)
    for link in TaskLink.objects.filter(issue_id=issue.pk).exclude(status=LinkStatus.UNLINKED).select_related(
            "instance"):
        for field in fields:
            if field not in FIELDS or links.resolving(link.pk, field) or not held_by_policy(link, field):
                continue  # a conflict resolution writing its chosen value is not a new edit
            theirs = tracker_value(link, field)
            if theirs is _MISSING:
                continue
            ours = getattr(issue, field)
            if ours == theirs:
                links.conflict_settle(link=link, kind=ConflictKind.POLICY, field=field, resolution=SETTLED)
                continue
            _record(link, field, ours, who)


def _record(link: TaskLink, field: str, ours, who: str):
    ext = (link.base_snapshot or {}).get("external") or {}
    detail = (f"Paperclip edit of {field}, which the tracker owns (fieldPolicy.{field} = external): "
              f"not written to the tracker")
    conflict, created = links.conflict_open(link=link, kind=ConflictKind.POLICY, field=field, detail=detail,
                                            base=ext.get(field), external=ext.get(field), paperclip=ours,
                                            actors={"paperclip": who})
    if not created and (conflict.paperclip_value != ours or (conflict.actors or {}).get("paperclip") != who):
        Conflict.objects.filter(pk=conflict.pk, status=ConflictStatus.OPEN).update(
            paperclip_value=ours, actors={**(conflict.actors or {}), "paperclip": who})


def _actor_text(actor) -> str:
    if actor is None:
        return "someone in Paperclip"
    if getattr(actor, "agent", None) is not None:
        return actor.agent.name
    user = getattr(actor, "user", None)
    return user.get_username() if user is not None else "someone in Paperclip"
