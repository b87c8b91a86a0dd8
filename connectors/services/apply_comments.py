"""Applying a tracker comment (§7.3 / §15.2: commands first, then the attributed, sanitized, untrusted
comment; edits and deletions) inside the apply's transaction (services/inbound.py)."""
from __future__ import annotations

from django.utils import timezone

from connectors.choices import EventStatus, LinkStatus, SyncMode
from connectors.models import ExternalCommentLink, TaskLink
from connectors.providers.base import ExternalComment, VerifiedEvent
from issues.actors import SYSTEM
from issues.choices import TERMINAL_ISSUE_STATUSES, AuthorType
from issues.models import Comment
from issues.services.thread import comment_create
from paperclip.core import rows

from . import commands as command_service, content, links, run_modes
from .apply_base import (
    Outcome,
    active_link_and_record,
    applied,
    dropped,
    inbound_touch,
    link_audit,
    own_actor,
)
from .apply_tasks import task_import_unless_unlinked
from .common import link_first_sync_ok


def comment_upserted(instance, verified: VerifiedEvent, key: str) -> Outcome:
    comment = verified.comment
    if comment is None:
        return dropped("no comment in payload")
    if _own_comment(instance, comment):
        return dropped("the connector's own comment (echo)")
    if content.has_marker(comment.body):
        return dropped("mirrored comment marker (loop prevention)")
    link, record = active_link_and_record(instance, comment.external_task_id, comment.external_comment_id)
    if link is not None and link.last_outbound_at is not None:
        from .outbound import recent_outbound_ref

        # only a link that was ever written to can echo one of our writes back (no query otherwise)
        if recent_outbound_ref(instance, comment.external_comment_id):
            return dropped("matches a recently issued outbound write (echo)")
    if link is None:
        if verified.task is None:
            return dropped("comment on a task that is not linked")
        imported = task_import_unless_unlinked(instance=instance, task=verified.task, key=key, actor=verified.actor)
        if imported.status != EventStatus.APPLIED:  # nothing was linked: no need to look again
            return dropped(f"comment on a task that is not linked ({imported.text})")
        link, record = active_link_and_record(instance, comment.external_task_id, comment.external_comment_id)
        outcome = (comment_import(instance=instance, link=link, comment=comment, key=key, record=record)
                   if link is not None else dropped(f"comment on a task that is not linked ({imported.text})"))
        # An import that created the issue took the company's issue counter: the run ends with it.
        outcome.numbered = imported.numbered
        return outcome
    return comment_import(instance=instance, link=link, comment=comment, key=key, record=record)


def _own_comment(instance, comment: ExternalComment) -> bool:
    return own_actor(instance, comment.author)


MIRROR_OFF_TEXT = "mirrorExternalComments is off: tracker comments are not imported"


def mirror_external_comments(instance, link: TaskLink) -> bool:
    """§10.2 ``mirrorExternalComments`` (default on; commands are not comments and always run)."""
    from .outbound import write_policy

    return bool(write_policy(link, instance).get("mirrorExternalComments", True))


def comment_changed(record: ExternalCommentLink, comment: ExternalComment) -> bool:
    """Whether ``comment`` is a newer version than the one ``record`` imported: a later updated time
    with another body (the same body again is no edit, e.g. a reaction that bumped the time), or,
    when either side has no updated time, another body."""
    if record.content_digest and record.content_digest == content.body_digest(comment.body):
        return False
    if comment.updated_at and record.external_updated_at:
        return comment.updated_at > record.external_updated_at
    return True


def comment_import(*, instance, link: TaskLink, comment: ExternalComment, key: str,
                   record: ExternalCommentLink | None) -> Outcome:
    """§7.3 / §15.2: commands first, then the attributed, sanitized, untrusted comment. ``record``:
    the comment's ExternalCommentLink if it was seen before (read with the link: ``active_link_and_record``)."""
    if link.sync_mode in (SyncMode.DISABLED, SyncMode.EXPORT_ONLY):
        return dropped(f"link sync mode {link.sync_mode}")
    cmds = command_service.parse_commands(comment.body)
    if run_modes.is_observer(link) and (record is not None or not cmds):
        return dropped("observer link: comments are not imported or edited")  # commands: command_exec
    if record is not None:
        if cmds or record.comment_id is None or record.deleted:
            return dropped("comment already handled")
        if not comment_changed(record, comment):
            return dropped("comment already imported")
        if not mirror_external_comments(instance, link):
            return dropped(MIRROR_OFF_TEXT)
        _comment_edit(link, record, comment, key)
        return applied("comment updated")
    if cmds:
        from .command_exec import commands_execute

        replies = commands_execute(instance=instance, link=link, comment=comment, commands=cmds, key=key)
        _comment_recorded(instance, link, comment, None)
        return applied(f"{len(cmds)} command(s): " + "; ".join(replies))
    if link.status == LinkStatus.PAUSED:
        return dropped("link paused (resume resyncs it)")
    if not mirror_external_comments(instance, link):
        # handled, not imported: turning the toggle on later does not import what was said meanwhile
        _comment_recorded(instance, link, comment, None)
        return dropped(MIRROR_OFF_TEXT)
    issue = link.issue  # locked with the link
    body = _comment_body(link, comment)
    provenance = _provenance(link, comment, key)
    wake = links.wake_on_comment(link, instance) and issue.status not in TERMINAL_ISSUE_STATUSES
    # (inside the event's transaction: the comment and its mapping commit together). Recorded as
    # external either way; with wakeOnExternalComment off only the wake is withheld.
    created = comment_create(actor=SYSTEM, issue=issue, body=body, provenance=provenance,
                             author_type=AuthorType.EXTERNAL, _locked=True, _wake=wake)
    _comment_recorded(instance, link, comment, created)
    inbound_touch(link)
    link_first_sync_ok(link, key)
    return applied(f"comment imported on {issue.identifier}" + ("" if wake else " (no wake)"))


def _comment_recorded(instance, link: TaskLink, comment: ExternalComment, created: Comment | None):
    """The tracker comment is handled: imported as ``created``, or (None) taken as commands or
    withheld, so a redelivery or an edit of it is recognised."""
    rows.insert(ExternalCommentLink(instance=instance, link=link, external_comment_id=comment.external_comment_id,
                                    comment=created, external_updated_at=comment.updated_at,
                                    content_digest=content.body_digest(comment.body)))


def _comment_body(link: TaskLink, comment: ExternalComment) -> str:
    who = content.actor_label(comment.author)
    where = f" · [view]({comment.url})" if comment.url else ""
    return f"**{who}** via {link.provider_key} (external, untrusted){where}\n\n{content.sanitize(comment.body)}"


def _provenance(link: TaskLink, comment: ExternalComment, key: str) -> dict:
    return {"source": "connector", "kind": "external_comment", "untrusted": True,
            "connectorInstanceId": str(link.instance_id), "linkId": str(link.pk), "providerKey": link.provider_key,
            "externalTaskId": link.external_task_id, "externalKey": link.external_key,
            "externalCommentId": comment.external_comment_id, "url": comment.url,
            "actor": content.actor_dict(comment.author), "eventKey": key,
            "createdAt": comment.created_at.isoformat() if comment.created_at else None}


def _comment_edit(link, record: ExternalCommentLink, comment: ExternalComment, key: str):
    provenance = _provenance(link, comment, key) | {"edited": True}
    Comment.objects.filter(pk=record.comment_id).update(body=_comment_body(link, comment), provenance=provenance,
                                                        updated_at=timezone.now())
    record.external_updated_at = comment.updated_at
    record.content_digest = content.body_digest(comment.body)
    record.save(update_fields=["external_updated_at", "content_digest"])
    link_audit(link, "connector.comment_edited", key, {"commentId": str(record.comment_id)})


def comment_deleted(instance, verified: VerifiedEvent, key: str) -> Outcome:
    comment = verified.comment
    comment_id = comment.external_comment_id if comment else None
    record = ExternalCommentLink.objects.filter(instance=instance, external_comment_id=comment_id).first() \
        if comment_id else None
    if record is None or record.deleted:
        return dropped("deleted comment was not imported")
    if run_modes.is_observer(record.link):
        return dropped("observer link: the imported comment is left as it is")
    record.deleted = True
    record.save(update_fields=["deleted"])
    if record.comment_id:
        row = Comment.objects.filter(pk=record.comment_id).values_list("provenance", flat=True).first() or {}
        Comment.objects.filter(pk=record.comment_id).update(provenance={**row, "externalDeleted": True})
    return applied("external comment deletion recorded (the host comment is kept)")
