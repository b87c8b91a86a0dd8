"""Issue attachments (upstream's core attachment routes, ref §5 "Attachments").

The bytes go to the ``attachments`` storage (settings.STORAGES) under a key made of ids only; the
row records the name, type, size and SHA-256 the uploader sent. Writers are the issue's commenters:
any agent of the company (from the checkout run while the issue is in progress, as for comments)
and board users with write access; an agent deletes only what it uploaded.

The bytes follow the row: written just before the row's transaction and removed again if it does
not commit; removed once a deletion of the row commits, whatever deleted it (this service, an
issue's deletion), by the ``post_delete`` receiver below, which company assets (services.assets)
share. What a crash or a caller's rollback leaves behind, :func:`attachments_orphan_sweep` removes.
"""
from __future__ import annotations

import logging
import uuid
from contextlib import contextmanager
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models.signals import post_delete
from django.utils import timezone

from issues.actors import Actor
from issues.exceptions import Forbidden, NotFound
from issues.models import Asset, Attachment, Comment, Issue
from issues.models.attachment import attachment_storage
from paperclip.core.uploads import checked_upload, sha256_of

from .activity import activity_record
from .thread import lock_for_write, revision_author

logger = logging.getLogger(__name__)


def type_allowed(content_type: str) -> bool:
    """Exact types, ``type/*`` families and ``*`` from PAPERCLIP_ATTACHMENT_ALLOWED_TYPES."""
    family = content_type.split("/", 1)[0] + "/*"
    allowed = {t.strip().lower() for t in settings.PAPERCLIP["ATTACHMENT_ALLOWED_TYPES"]}
    return bool(allowed & {content_type, family, "*"})


@contextmanager
def bytes_before_row(key: str, upload):
    """Write ``upload``'s bytes under ``key``, then run the block (the row's writes) in a transaction;
    if the block does not commit, the bytes are removed again. Written before any row is locked, so a
    slow write holds no lock (on SQLite, the database's)."""
    storage = attachment_storage()
    saved = storage.save(key, upload)
    try:
        with transaction.atomic():
            yield saved
    except BaseException:
        storage.delete(saved)  # the row did not commit: its bytes go too
        raise


def attachment_create(*, actor: Actor, issue: Issue, upload, comment_id=None) -> Attachment:
    """Store ``upload`` (a Django UploadedFile) on ``issue``; ``comment_id`` ties it to one of the
    issue's comments (upstream's ``issueCommentId``). Audited as ``issue.attachment_added``."""
    filename, content_type = checked_upload(upload, noun="Attachment", accepts=type_allowed,
                                            accepted=settings.PAPERCLIP["ATTACHMENT_ALLOWED_TYPES"])
    digest = sha256_of(upload)
    pk = uuid.uuid4()
    with bytes_before_row(f"{issue.company_id}/issues/{issue.pk}/{pk}", upload) as saved:
        issue = lock_for_write(actor, issue, owner_only=False)
        comment = None
        if comment_id:
            comment = Comment.objects.filter(issue=issue, pk=comment_id).first()
            if comment is None:
                raise NotFound("Comment not found", details={"issueCommentId": ["No such comment on this issue."]})
        attachment = Attachment.objects.create(
            pk=pk, company_id=issue.company_id, issue=issue, comment=comment, original_filename=filename,
            content_type=content_type, byte_size=upload.size, sha256=digest, object_key=saved,
            **revision_author(actor))
        activity_record(actor=actor, company_id=issue.company_id, action="issue.attachment_added",
                        entity_type="issue", entity_id=issue.pk, details=_audit(attachment))
    return attachment


def attachment_delete(*, actor: Actor, attachment: Attachment) -> Attachment:
    """Remove the attachment (its bytes once this commits); audited as ``issue.attachment_removed``."""
    with transaction.atomic():
        lock_for_write(actor, attachment.issue, owner_only=False)
        if actor.is_agent and attachment.author_agent_id != actor.agent.pk:
            raise Forbidden("Agent can only delete its own attachments", code="attachment_not_owned")
        row = Attachment.objects.filter(pk=attachment.pk).first()
        if row is None:  # deleted by a concurrent request while this one waited for the lock
            raise NotFound("Attachment not found")
        activity_record(actor=actor, company_id=row.company_id, action="issue.attachment_removed",
                        entity_type="issue", entity_id=row.issue_id, details=_audit(row))
        row.delete()
    return row


def _audit(attachment: Attachment) -> dict:
    return {"attachmentId": str(attachment.pk), "filename": attachment.original_filename,
            "contentType": attachment.content_type, "byteSize": attachment.byte_size, "sha256": attachment.sha256,
            "commentId": str(attachment.comment_id) if attachment.comment_id else None}


ORPHAN_GRACE = timedelta(hours=1)
_orphans_swept_at = None  # per process: the walk lists the whole storage, so at most once per ORPHAN_GRACE


def attachments_orphan_sweep(*, now=None, force: bool = False) -> int:
    """Remove stored bytes no row names and older than ORPHAN_GRACE: a process that died between the
    write and the commit, a caller's transaction that rolled back, a removal that failed. Newer files
    may belong to an upload still committing. Returns how many were removed."""
    global _orphans_swept_at
    now = now or timezone.now()
    if not force and _orphans_swept_at is not None and now - _orphans_swept_at < ORPHAN_GRACE:
        return 0
    _orphans_swept_at = now
    storage, removed = attachment_storage(), 0
    for keys in _stored_keys_by_company(storage):
        for model in (Attachment, Asset):
            keys -= set(model.objects.filter(object_key__in=keys).values_list("object_key", flat=True))
        for key in sorted(keys):
            if storage.get_modified_time(key) < now - ORPHAN_GRACE:
                _remove_bytes(key)
                removed += 1
    return removed


def _stored_keys_by_company(storage):
    """The stored keys (``<company>/issues/<issue>/<id>`` as attachment_create names them,
    ``<company>/assets/<id>`` as assets.company_logo_upload does), one set per company folder, so
    each company's rows are read in one query per model."""
    try:
        companies = storage.listdir("")[0]
    except FileNotFoundError:  # nothing was ever stored
        return
    for company in companies:
        keys = set()
        if storage.exists(f"{company}/issues"):
            keys |= {f"{company}/issues/{issue}/{name}" for issue in storage.listdir(f"{company}/issues")[0]
                     for name in storage.listdir(f"{company}/issues/{issue}")[1]}
        if storage.exists(f"{company}/assets"):
            keys |= {f"{company}/assets/{name}" for name in storage.listdir(f"{company}/assets")[1]}
        yield keys


def _remove_bytes(key: str):
    try:
        attachment_storage().delete(key)
    except OSError:
        logger.warning("attachment bytes %s could not be removed; they stay orphaned in storage", key, exc_info=True)


def _bytes_follow_row(sender, instance: Attachment | Asset, using=None, **kwargs):
    key = instance.object_key
    transaction.on_commit(lambda: _remove_bytes(key), using=using)


def connect():
    """Called once from IssuesConfig.ready()."""
    post_delete.connect(_bytes_follow_row, sender=Attachment, dispatch_uid="attachment_bytes_follow_row")
    post_delete.connect(_bytes_follow_row, sender=Asset, dispatch_uid="asset_bytes_follow_row")
