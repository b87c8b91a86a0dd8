"""Comments, revisioned documents and interactions on an issue."""
from __future__ import annotations

import re

from django.db import IntegrityError, transaction
from django.utils import timezone

from issues import events
from issues.actors import SYSTEM, Actor
from issues.choices import AuthorType, DocumentFormat, InteractionKind, InteractionStatus, WakeSource
from issues.exceptions import Conflict, Forbidden, InvalidInput, NotFound, StaleRevision
from issues.models import Attachment, Comment, Document, DocumentRevision, HeartbeatRun, Interaction, Issue
from paperclip.core import rows

from .activity import activity_record
from .fences import ensure_may_change, ensure_owning_run
from .wake_triggers import ISSUE_COMMENTED, interaction_answered_wake, mentions_wake
from .wakeups import wake_assignee

DOCUMENT_KEY = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


def revision_author(actor: Actor) -> dict:
    """Author columns of a revision (or comment) written by ``actor``."""
    return {
        "author_type": AuthorType.AGENT if actor.is_agent else (AuthorType.USER if actor.is_board else AuthorType.SYSTEM),
        "author_agent": actor.agent,
        "author_user": actor.user if actor.is_board else None,
        "run": actor.run if actor.is_agent else None,
    }


def lock_for_write(actor: Actor, issue: Issue, *, owner_only: bool = True) -> Issue:
    """Lock the issue for an agent or board write. Documents and interactions change the issue
    (its owner's, see .fences); comments (``owner_only=False``) may come from any agent of the
    company, but still from the checkout run while the issue is in progress."""
    actor.ensure_can_write(issue.company_id)
    issue = Issue.objects.select_for_update().get(pk=issue.pk)
    if owner_only:
        ensure_may_change(actor, issue)
    else:
        ensure_owning_run(actor, issue)
    return issue


def comment_create(*, actor: Actor, issue: Issue, body: str, provenance: dict | None = None,
                   author_type: str | None = None, reopen: bool = False, interrupt: bool = False,
                   _locked: bool = False, _audit: dict | None = None, _wake_reason: str | None = None,
                   _after_interrupt: bool = False, _wake: bool = True, attachment_ids=None) -> Comment:
    """A comment; wakes the assignee (and mentioned agents). ``reopen`` / ``interrupt`` (upstream's
    comment flags) go through issue_update, which owns them for PATCH too: the reopen is an audited
    status change, the interrupt (board only) stops the issue's live runs first. ``_wake=False``
    (a connector whose wakeOnExternalComment is off): recorded as written, nobody woken.
    ``attachment_ids`` (upstream's ``attachmentIds``): attachments of this issue that belong to the
    comment; another id is a 404 naming the field and nothing is written.

    ``_locked``: the caller's transaction holds the issue's row lock and rolls back whole on any error
    (no re-read, no savepoint of its own)."""
    if not body or not body.strip():
        raise InvalidInput(details={"body": ["This field may not be blank."]})
    if (reopen or interrupt) and not _locked:
        from .issues import issue_update

        return issue_update(actor=actor, issue=issue, changes={}, comment=body, reopen=reopen,
                            interrupt=interrupt, attachment_ids=attachment_ids)[2]
    with transaction.atomic(savepoint=not _locked):
        if not _locked:
            issue = lock_for_write(actor, issue, owner_only=False)
        fields = revision_author(actor)
        if author_type:
            fields["author_type"] = author_type
        comment = rows.insert(Comment(company_id=issue.company_id, issue=issue, body=body,  # (nobody listens to
                                      provenance=provenance or {}, **fields))  # its save: events.announce)
        if attachment_ids:
            _attach(comment, issue, attachment_ids)
        activity_record(actor=actor, company_id=issue.company_id, action="comment.created", entity_type="issue",
                        entity_id=issue.pk, details={"commentId": str(comment.pk), **(_audit or {})})
        events.announce(events.comment_created, comment=comment, actor=actor)
        events.comment_created_atomic.send(sender=None, comment=comment, actor=actor)
        if _wake and comment.author_type != AuthorType.SYSTEM:
            # A mentioned assignee gets the mention wake only, not a second "commented" one.
            if issue.assignee_agent_id not in mentions_wake(comment, issue):
                _wake_assignee_for(comment, issue, _wake_reason or ISSUE_COMMENTED, _after_interrupt)
    return comment


def _attach(comment: Comment, issue: Issue, attachment_ids):
    """Tie the issue's attachments to ``comment`` (moving any that belonged to another comment)."""
    wanted = {str(pk) for pk in attachment_ids}
    found = {str(pk) for pk in Attachment.objects.filter(issue=issue, pk__in=wanted).values_list("pk", flat=True)}
    if wanted - found:
        raise NotFound("Attachment not found", details={
            "attachmentIds": [f"{pk} is not an attachment of this issue." for pk in sorted(wanted - found)]})
    Attachment.objects.filter(pk__in=found).update(comment=comment)


def _wake_assignee_for(comment: Comment, issue: Issue, reason: str, after_interrupt: bool):
    """After an interrupt, a run whose process is still being killed stays live for a moment: the
    comment must start the next run, not join the dying one (a new run that follows it)."""
    from issues.choices import LIVE_RUN_STATUSES
    from issues.models import Agent, HeartbeatRun

    from .wakeups import ACTIONABLE, agent_wakeup

    stopping = None
    if after_interrupt and issue.assignee_agent_id and issue.status in ACTIONABLE \
            and comment.author_agent_id != issue.assignee_agent_id:
        stopping = (HeartbeatRun.objects.filter(agent_id=issue.assignee_agent_id, issue=issue,
                                                status__in=LIVE_RUN_STATUSES, stop_requested_at__isnull=False)
                    .order_by("created_at").first())
    if stopping is None:
        wake_assignee(issue=issue, source=WakeSource.AUTOMATION, reason=reason, comment_ids=[comment.pk],
                      author_agent_id=comment.author_agent_id, comments_checked=True)
        return
    agent_wakeup(actor=SYSTEM, agent=Agent(pk=issue.assignee_agent_id, company_id=issue.company_id),
                 source=WakeSource.AUTOMATION, reason=reason, issue=issue, comment_ids=[comment.pk],
                 issue_is_current=True, run_fields={"source_run": stopping})


def _revision_details(document: Document) -> dict:
    rev = document.latest_revision
    return {"key": [document.key], "currentRevisionId": str(rev.pk) if rev else None,
            "currentRevisionNumber": rev.number if rev else 0}


def document_write(*, actor: Actor, issue: Issue, key: str, body: str, title: str | None = None,
                   format: str | None = None, base_revision_id=None, system: bool = False,
                   change_summary: str = "") -> DocumentRevision:
    """Write a new revision. ``base_revision_id`` must name the latest revision (None for a new
    document); anything else is a 409 carrying the current revision so the writer can merge.
    ``system`` (the host only) creates the document as system-written: the host's own material,
    which agents' bounded case reads never serve. ``change_summary``: the writer's note, kept on
    the revision."""
    if system and not actor.system:
        raise Forbidden("Only the host writes system documents.", code="system_document")
    key = (key or "").lower()  # upstream: keys are case-insensitive (PLAN is plan)
    if not DOCUMENT_KEY.match(key):
        raise InvalidInput(details={"key": ["Use 1-64 characters: lowercase letters, digits, '-' and '_'."]})
    if format is not None and format not in DocumentFormat.values:
        raise InvalidInput(details={"format": [f"'{format}' is not one of {', '.join(DocumentFormat.values)}."]})
    try:
        with transaction.atomic():
            issue = lock_for_write(actor, issue)
            document = Document.objects.select_for_update(of=("self",)).select_related("latest_revision").filter(
                issue=issue, key=key).first()
            if document is None:
                if base_revision_id:  # upstream's words
                    raise StaleRevision("Document does not exist yet",
                                        details={"key": [key], "currentRevisionId": None,
                                                 "currentRevisionNumber": 0})
                document = Document.objects.create(company_id=issue.company_id, issue=issue, key=key,
                                                   title=title or "", format=format or DocumentFormat.MARKDOWN,
                                                   system=system)
            elif str(base_revision_id or "") != str(document.latest_revision_id or ""):
                # upstream's two messages: none sent for an existing document, or a stale one
                raise StaleRevision("Document was updated by someone else" if base_revision_id
                                    else "Document update requires baseRevisionId", details=_revision_details(document))
            number = document.revision_count + 1
            revision = DocumentRevision.objects.create(
                document=document, number=number, title=title if title is not None else document.title,
                body=body, change_summary=change_summary, **revision_author(actor),
            )
            document.latest_revision = revision
            document.revision_count = number
            if title is not None:
                document.title = title
            if format is not None:
                document.format = format
            document.save()
            activity_record(actor=actor, company_id=issue.company_id, action="document.revised",
                            entity_type="issue", entity_id=issue.pk,
                            details={"key": key, "revisionId": str(revision.pk), "revisionNumber": number})
            events.document_written_atomic.send(sender=None, document=document, revision=revision, actor=actor)
    except IntegrityError:
        # Two first writes raced on (issue, key): the loser sees a stale base.
        raise StaleRevision("The document was created concurrently.", details={"key": [key]})
    return revision


def _locked_document(actor: Actor, issue: Issue, key: str) -> tuple[Issue, Document]:
    """The issue locked for the actor's write, then its document ``key`` (a 404 if there is none)."""
    issue = lock_for_write(actor, issue)  # the issue first, as every document write (lock order)
    document = Document.objects.select_for_update(of=("self",)).filter(issue=issue, key=key).first()
    if document is None:
        raise NotFound("Document not found.")
    return issue, document


def document_restore(*, actor: Actor, issue: Issue, key: str, revision_id) -> DocumentRevision:
    """Upstream's ``POST …/documents/{key}/revisions/{revisionId}/restore``: a new latest revision
    with that revision's title and body (history is never rewritten), written as any revision is
    (same writers, same fences) and audited as ``issue.document_restored``."""
    key = (key or "").lower()
    with transaction.atomic():
        issue, document = _locked_document(actor, issue, key)
        source = DocumentRevision.objects.filter(document=document, pk=revision_id).first()
        if source is None:
            raise NotFound("Revision not found.", details={"revisionId": ["No such revision of this document."]})
        revision = document_write(actor=actor, issue=issue, key=key, body=source.body, title=source.title,
                                  base_revision_id=document.latest_revision_id,
                                  change_summary=f"Restored revision {source.number}")
        activity_record(actor=actor, company_id=issue.company_id, action="issue.document_restored",
                        entity_type="issue", entity_id=issue.pk,
                        details={"key": key, "documentId": str(document.pk), "revisionNumber": revision.number,
                                 "restoredFromRevisionId": str(source.pk),
                                 "restoredFromRevisionNumber": source.number})
    return revision


def document_delete(*, actor: Actor, issue: Issue, key: str) -> None:
    """Upstream's ``DELETE /issues/{id}/documents/{key}`` (board only): the document and all its
    revisions, audited as ``issue.document_deleted``. Refused (409, nothing deleted) while a board
    interaction is bound to one of its revisions (they protect what was asked about); a case
    handoff's captured revision link is cleared, as when the whole issue is deleted."""
    from .deletion import unless_held

    actor.ensure_board()
    key = (key or "").lower()
    with transaction.atomic():
        issue, document = _locked_document(actor, issue, key)
        activity_record(actor=actor, company_id=issue.company_id, action="issue.document_deleted",
                        entity_type="issue", entity_id=issue.pk,
                        details={"key": key, "documentId": str(document.pk), "title": document.title,
                                 "revisionCount": document.revision_count})
        # Named by id: the interactions holding it are what the board resolves or deletes first.
        with unless_held("Interactions are bound to this document's revisions; resolve or delete them first.",
                         "document_delete_restricted", detail="interactionIds", name=lambda obj: str(obj.pk),
                         key=[key]):
            document.delete()


def interaction_create(*, actor: Actor, issue: Issue, kind: str, title: str, body: str = "",
                       payload: dict | None = None, document_key: str | None = None,
                       document_revision_id=None) -> Interaction:
    if kind not in InteractionKind.values:
        raise InvalidInput(details={"kind": [f"'{kind}' is not one of {', '.join(InteractionKind.values)}."]})
    if kind == InteractionKind.RUNTIME_REQUEST:
        raise InvalidInput(details={"kind": ["Runtime requests come from a PRP runner's events only."]})
    if not title or not title.strip():
        raise InvalidInput(details={"title": ["This field may not be blank."]})
    with transaction.atomic():
        issue = lock_for_write(actor, issue)
        revision = None
        if document_revision_id:
            revision = DocumentRevision.objects.filter(pk=document_revision_id, document__issue=issue).first()
            if revision is None:
                raise NotFound("Document revision not found on this issue.",
                               details={"documentRevisionId": ["No such revision on this issue."]})
        elif document_key:
            document = Document.objects.filter(issue=issue, key=document_key).select_related("latest_revision").first()
            if document is None or document.latest_revision is None:
                raise NotFound("Document not found on this issue.", details={"documentKey": ["No such document."]})
            revision = document.latest_revision
        interaction = Interaction.objects.create(
            company_id=issue.company_id, issue=issue, kind=kind, title=title, body=body, payload=payload or {},
            document_revision=revision, created_by_agent=actor.agent,
            created_by_user=actor.user if actor.is_board else None, run=actor.run if actor.is_agent else None,
        )
        activity_record(actor=actor, company_id=issue.company_id, action="interaction.created",
                        entity_type="issue", entity_id=issue.pk,
                        details={"interactionId": str(interaction.pk), "kind": kind,
                                 "documentRevisionId": str(revision.pk) if revision else None})
    return interaction


RESPONSES = {
    InteractionKind.REQUEST_CONFIRMATION: (InteractionStatus.ACCEPTED, InteractionStatus.REJECTED),
    InteractionKind.ASK_QUESTION: (InteractionStatus.ANSWERED, InteractionStatus.REJECTED),
    InteractionKind.CHOOSE_TASKS: (InteractionStatus.ANSWERED, InteractionStatus.REJECTED),
    # A runner's permission request is accepted (allow) or rejected (deny), a question answered or
    # rejected; issues.runner.requests checks which fits the request (interaction_responded_atomic).
    InteractionKind.RUNTIME_REQUEST: (InteractionStatus.ACCEPTED, InteractionStatus.REJECTED,
                                      InteractionStatus.ANSWERED),
}


def interaction_respond(*, actor: Actor, interaction: Interaction, status: str, response: dict | None = None,
                        ) -> Interaction:
    """The board answers. A confirmation whose document moved on meanwhile expires instead."""
    actor.ensure_board("Only board users answer interactions.")
    actor.ensure_can_write(interaction.company_id)
    allowed = RESPONSES[interaction.kind] + (InteractionStatus.CANCELLED,)
    if status not in allowed:
        raise InvalidInput(details={"status": [f"Must be one of {', '.join(allowed)}."]})
    with transaction.atomic():
        if interaction.kind == InteractionKind.RUNTIME_REQUEST and interaction.run_id:
            # Its answer becomes a command of the run: lock order run -> interaction, as the intake's.
            list(HeartbeatRun.objects.select_for_update().filter(pk=interaction.run_id).values_list("pk"))
        interaction = Interaction.objects.select_for_update(of=("self",)).select_related("document_revision__document").get(
            pk=interaction.pk)
        if interaction.status != InteractionStatus.PENDING:
            raise Conflict("This interaction was already answered.", code="interaction_closed",
                           details={"status": interaction.status})
        now = timezone.now()
        revision = interaction.document_revision
        if revision is not None and revision.document.latest_revision_id != revision.pk and \
                status == InteractionStatus.ACCEPTED:
            interaction.status = InteractionStatus.EXPIRED
            interaction.responded_at = now
            interaction.save()
            activity_record(actor=actor, company_id=interaction.company_id, action="interaction.expired",
                            entity_type="issue", entity_id=interaction.issue_id,
                            details={"interactionId": str(interaction.pk)})
            stale = revision
        else:
            stale = None
            interaction.status = status
            interaction.response = response or {}
            interaction.responded_by = actor.user
            interaction.responded_at = now
            interaction.save()
            activity_record(actor=actor, company_id=interaction.company_id, action="interaction.responded",
                            entity_type="issue", entity_id=interaction.issue_id,
                            details={"interactionId": str(interaction.pk), "status": status})
            events.interaction_responded_atomic.send(sender=None, interaction=interaction, actor=actor)
    # After the commit, and before an expiry is raised: the asking agent learns either outcome (a
    # runner's request is answered to the runner by its command instead, not by a new wake).
    if interaction.kind != InteractionKind.RUNTIME_REQUEST:
        interaction_answered_wake(interaction)
    if stale is not None:
        # Raised after commit: the expiry is kept, the acceptance is refused.
        raise StaleRevision("The document changed after this confirmation was requested.",
                            details={"documentRevisionId": str(stale.pk)})
    return interaction
