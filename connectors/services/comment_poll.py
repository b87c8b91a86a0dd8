"""The comment backstop (§7.1.2, §7.1.3, §13.1.3): a lost comment webhook never loses a comment.

Both passes read a rate-bounded rolling window of the instance's syncing links per tick (like
``reconcile:links``), through the adapter's ``list_comments(ref, cursor)``:

* **poll** (``comments_poll``, the poll tick; window cursor ``poll:comments``): each link's comments
  since its ``comments:<linkId>`` cursor. A page's events are stored and applied, and its cursor saved,
  in one transaction (§4.1.7): a crash in between re-applies the page idempotently.
* **repair** (``comments_reconcile``, the reconcile tick; window cursor ``reconcile:comments``): the
  link's complete listing, for what an incremental listing cannot see: a comment skipped when offset
  or page-number pagination shifted under a pass, an edit that kept its updated time (body digest),
  and a deletion. A deletion is concluded only from complete listings (every page read, none skipped)
  and confirmed by a second one, never from a partial page.

Each comment travels the normal inbound path as a stored ``comment.upserted`` / ``comment.deleted``
event applied in per-task order, so the webhook rules hold unchanged: one host comment per external
comment (ExternalCommentLink), echo suppression, ``/paperclip`` commands executed once under the
command policy (the comment's record commits with the command's effects), ``mirrorExternalComments``.
Comments already imported in their current version are not stored again.

Provider errors: a rate limit, credential or transport failure ends the tick at the link that was not
read (the window does not move past it; ``retry_after`` sheds the instance's polling until then); a
refusal of one link (its task is gone, a malformed page) is recorded and the window moves on."""
from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from connectors.choices import ErrorCategory, EventSource, LinkStatus, SyncMode
from connectors.models import ConnectorInstance, ExternalCommentLink, InboundEvent, TaskLink
from connectors.providers.base import EventKind, ExternalComment, ExternalTaskRef, ProviderError, VerifiedEvent

from . import content
from .common import adapter_for, conf, cursor_get, cursor_save, provider_degrade, sync_error_record
from .apply_comments import comment_changed
from .inbound import observed_store_apply
from .logctx import engine_log

POLL_WINDOW = "poll:comments"
REPAIR_WINDOW = "reconcile:comments"
# The provider's failure, not the link's: the tick stops and the next one resumes at this link.
PROVIDER_WIDE = (ErrorCategory.PROVIDER_RATE_LIMITED, ErrorCategory.PROVIDER_AUTH, ErrorCategory.PROVIDER_REQUEST)
GONE = (404, 410)  # the task itself is gone: task reconciliation opens the deletion conflict


def link_scope(link_id) -> str:
    """The §4.1.7 cursor scope of one link's comment listing."""
    return f"comments:{link_id}"


# ------------------------------------------------------------------------------------------ ticks
def comments_poll(*, instance: ConnectorInstance, adapter=None, batch: int | None = None) -> dict:
    """Incremental comment listing of the next window of links (poll tick)."""
    return _tick(instance, adapter, POLL_WINDOW, batch or int(conf("COMMENT_POLL_BATCH")), _poll_link)


def comments_reconcile(*, instance: ConnectorInstance, adapter=None, batch: int | None = None) -> dict:
    """Complete listings of the next window of links: missed comments, edits and deletions (reconcile tick)."""
    return _tick(instance, adapter, REPAIR_WINDOW, batch or int(conf("COMMENT_RECONCILE_BATCH")), _repair_link)


def _tick(instance, adapter, scope: str, size: int, visit) -> dict:
    totals = {"links": 0, "comments": 0, "deleted": 0}
    degraded = ConnectorInstance.objects.filter(pk=instance.pk).values_list("provider_degraded_until", flat=True).first()
    if degraded and degraded > timezone.now():
        return {**totals, "shed": True}  # §13.1.5: the provider asked us to wait
    window = _window(instance, scope, size)
    if not window:
        return totals
    adapter = adapter or adapter_for(instance)
    done = []
    for link in window:
        try:
            stored, deleted = visit(instance, adapter, link)
        except ProviderError as exc:
            if exc.status not in GONE:
                sync_error_record(instance=instance, category=exc.category, link=link,
                                  message=f"Comment listing of {_label(link)} failed: {exc}")
            if exc.category in PROVIDER_WIDE or (exc.category == ErrorCategory.PROVIDER_STATUS
                                                 and (exc.status or 0) >= 500):
                provider_degrade(instance, exc)
                break
            stored = deleted = 0
        done.append(link)
        totals["comments"] += stored
        totals["deleted"] += deleted
    totals["links"] = len(done)
    if done:
        # the end of the links: the next tick starts over; otherwise resume after the last link read
        end = len(done) == len(window) and len(window) < size
        cursor_save(instance, scope, "" if end else str(done[-1].pk))
    engine_log(logging.INFO, f"connector comment {scope.split(':')[0]} tick", instance=instance,
               outcome="ok" if len(done) == len(window) else "stopped early", eventKind=scope, **totals)
    return totals


def _window(instance, scope: str, size: int) -> list[TaskLink]:
    """The next ``size`` links after the window cursor. Paused links are read too: their comments are
    not imported, but a lost ``/paperclip resume`` must still reach them (resume resyncs the rest)."""
    after = cursor_get(instance, scope)
    qs = (TaskLink.objects.filter(instance=instance).exclude(status=LinkStatus.UNLINKED)
          .exclude(sync_mode__in=(SyncMode.DISABLED, SyncMode.EXPORT_ONLY)).order_by("id"))
    window = list((qs.filter(id__gt=after) if after else qs)[:size])
    if not window and after:
        window = list(qs[:size])  # wrapped around
    return window


# ------------------------------------------------------------------------------------ one link
def _poll_link(instance, adapter, link: TaskLink) -> tuple[int, int]:
    ref, scope = _ref(link), link_scope(link.pk)
    cursor = cursor_get(instance, scope)
    relisted, stored = False, 0
    for _ in range(int(conf("COMMENT_POLL_MAX_PAGES"))):
        try:
            page = adapter.list_comments(ref, cursor)
        except ProviderError as exc:
            if exc.category == ErrorCategory.CURSOR_INVALID and cursor and not relisted:
                # §5.4 / §13.1.4: a bounded re-list, re-applied idempotently
                sync_error_record(instance=instance, category=exc.category, link=link,
                                  message=f"Comment cursor of {_label(link)} rejected; re-listing: {exc}")
                cursor, relisted = None, True
                continue
            raise
        with transaction.atomic():  # the page's effects and its cursor commit together (§4.1.7)
            stored += _comments_apply(instance, link, page.items, EventSource.POLL)
            _report_skipped(instance, link, page)
            if page.cursor:
                cursor_save(instance, scope, page.cursor)
        if not page.cursor or page.cursor == cursor:
            break  # nothing further now
        cursor = page.cursor
    return stored, 0


def _repair_link(instance, adapter, link: TaskLink) -> tuple[int, int]:
    ref = _ref(link)
    started = timezone.now()
    listed, complete = _complete_listing(adapter, ref)
    with transaction.atomic():
        stored = _comments_apply(instance, link, listed, EventSource.RECONCILE)
    if not complete:
        return stored, 0
    seen = {c.external_comment_id for c in listed}
    # imported before the listing began (one imported meanwhile may simply not be listed yet)
    candidates = set(ExternalCommentLink.objects.filter(link=link, deleted=False, comment__isnull=False,
                                                        created_at__lt=started)
                     .exclude(external_comment_id__in=seen).values_list("external_comment_id", flat=True))
    if candidates:
        # confirmed by a second complete listing: a pagination shift can hide a comment from one pass
        again, complete = _complete_listing(adapter, ref)
        if not complete:
            return stored, 0
        candidates -= {c.external_comment_id for c in again}
    deleted = 0
    with transaction.atomic():
        for comment_id in sorted(candidates):
            deleted += observed_store_apply(instance=instance, source=EventSource.RECONCILE, event=VerifiedEvent(
                event_id=f"comment-gone:{comment_id}", kind=EventKind.COMMENT_DELETED, action="reconcile.comment_missing",
                external_task_id=link.external_task_id,
                comment=ExternalComment(external_comment_id=comment_id, external_task_id=link.external_task_id,
                                        author=None, body="")))
    return stored, deleted


def _complete_listing(adapter, ref: ExternalTaskRef) -> tuple[list[ExternalComment], bool]:
    """Every comment of the task -> (comments, complete). Incomplete: the page bound was reached, or a
    record could not be read (a skipped comment is not an absent one)."""
    items, cursor, complete = [], None, True
    for _ in range(int(conf("COMMENT_FULL_MAX_PAGES"))):
        page = adapter.list_comments(ref, cursor)
        items += page.items
        complete = complete and not page.skipped
        if not page.cursor or page.cursor == cursor:
            return items, complete
        cursor = page.cursor
    return items, False


# ------------------------------------------------------------------------------------ applying
def _comments_apply(instance, link: TaskLink, comments: list[ExternalComment], source: str) -> int:
    """Store (and apply, in per-task order) each comment whose current version is not imported yet."""
    if not comments:
        return 0
    records = {r.external_comment_id: r for r in ExternalCommentLink.objects.filter(
        instance=instance, external_comment_id__in=[c.external_comment_id for c in comments])}
    due = {_version_key(c): c for c in comments
           if not _ours(instance, c) and _needs_event(records.get(c.external_comment_id), c)}
    # a version stored before (e.g. dropped on an observer link) is not stored again by every pass
    seen = set(InboundEvent.objects.filter(instance=instance, idempotency_key__in=list(due))
               .values_list("idempotency_key", flat=True))
    stored = 0
    for key, comment in due.items():
        if key in seen:
            continue
        stored += observed_store_apply(instance=instance, source=source, event=VerifiedEvent(
            event_id=key, kind=EventKind.COMMENT_UPSERTED, action=f"{source}.comment",
            external_task_id=link.external_task_id, occurred_at=comment.updated_at or comment.created_at,
            comment=comment, actor=comment.author))
    return stored


def _version_key(comment: ExternalComment) -> str:
    """One inbox key per comment version, whichever pass lists it: a re-listed page stores nothing new."""
    stamp = comment.updated_at or comment.created_at
    return (f"comment-poll:{comment.external_comment_id}:{stamp.isoformat() if stamp else ''}:"
            f"{content.body_digest(comment.body)[:16]}")[:300]


def _needs_event(record: ExternalCommentLink | None, comment: ExternalComment) -> bool:
    if record is None:
        return True
    if record.deleted or record.comment_id is None:
        return False  # handled: a command, a comment not mirrored, or deleted
    return comment_changed(record, comment)


def _ours(instance, comment: ExternalComment) -> bool:
    """Our own writes (§10.4), dropped on apply anyway: not worth an inbox row on every listing."""
    author = comment.author
    return content.has_marker(comment.body) or (author is not None and (
        author.is_connector_service_account
        or (bool(instance.service_account_id) and author.external_user_id == instance.service_account_id)))


def _report_skipped(instance, link: TaskLink, page):
    for record in getattr(page, "skipped", None) or ():
        # §13.1.8: one malformed comment is reported and skipped; the listing and its cursor go on
        sync_error_record(instance=instance, category=ErrorCategory.SCHEMA_DRIFT, link=link,
                          message=f"Comment listing of {_label(link)}: record {record.get('recordId') or '?'} "
                                  f"skipped: {record.get('reason', '')}", details={"linkId": str(link.pk), **record})


def _ref(link: TaskLink) -> ExternalTaskRef:
    return ExternalTaskRef(external_id=link.external_task_id, external_key=link.external_key or None)


def _label(link: TaskLink) -> str:
    return link.external_key or link.external_task_id
