"""Writes of case-owned documents (seed 001: "historical case-owned documents").

A case document belongs to the case, not to a task: it is what ``read_case`` serves for
``section=document`` with ``documentKey`` alone (a task's document needs ``documentIssueId``).
Revisions follow the issue documents' rule: ``baseRevisionId`` must name the latest revision
(none for a new document), anything else is a 409 ``stale_revision`` carrying the current one.
The write rules are the case's own (:func:`cases.services.authorize_write`): board writers, or an
agent from a live run, and from the primary task's checkout run while that task is in progress.
"""
from __future__ import annotations

from django.db import IntegrityError, transaction

from issues.actors import Actor
from issues.choices import DocumentFormat
from issues.exceptions import Forbidden, InvalidInput, StaleRevision
from issues.services.activity import activity_record
from issues.services.thread import DOCUMENT_KEY, revision_author

from .choices import CaseEventKind
from .models import Case, CaseDocument, CaseDocumentRevision
from .services import authorize_write, case_event_record, ensure_primary_task_run


def _current(document: CaseDocument | None, key: str) -> dict:
    return {"key": [key], "currentRevisionId": str(document.latest_revision_id) if document and
            document.latest_revision_id else None,
            "currentRevisionNumber": document.revision_count if document else 0}


def case_document_write(*, actor: Actor, case: Case, key: str, body: str, title: str | None = None,
                        format: str | None = None, base_revision_id=None,
                        system: bool = False) -> CaseDocumentRevision:
    """Write a new revision of the case's document ``key`` (creating it on the first write).
    ``system`` (the host only) marks the document as the host's own material, never served to
    agents' page reads."""
    if system and not actor.system:
        raise Forbidden("Only the host writes system documents.", code="system_document")
    if not DOCUMENT_KEY.match(key or ""):
        raise InvalidInput(details={"key": ["Use 1-64 characters: lowercase letters, digits, '-' and '_'."]})
    if format is not None and format not in DocumentFormat.values:
        raise InvalidInput(details={"format": [f"'{format}' is not one of {', '.join(DocumentFormat.values)}."]})
    run = authorize_write(actor, case.company_id)
    try:
        with transaction.atomic():
            case = Case.objects.select_for_update().get(pk=case.pk)
            ensure_primary_task_run(actor, case)
            document = CaseDocument.objects.select_for_update().filter(case=case, key=key).first()
            if document is None:
                if base_revision_id:
                    raise StaleRevision("The document does not exist yet; write it without a base revision.",
                                        details=_current(None, key))
                document = CaseDocument.objects.create(company_id=case.company_id, case=case, key=key,
                                                       title=title or "", format=format or DocumentFormat.MARKDOWN,
                                                       system=system)
            elif str(base_revision_id or "") != str(document.latest_revision_id or ""):
                raise StaleRevision(details=_current(document, key))
            number = document.revision_count + 1
            revision = CaseDocumentRevision.objects.create(
                document=document, number=number, title=title if title is not None else document.title,
                body=body, **revision_author(actor))
            document.latest_revision, document.revision_count = revision, number
            if title is not None:
                document.title = title
            if format is not None:
                document.format = format
            document.save()
            case.save(update_fields=["updated_at"])  # the case changed: browse order, read snapshots
            details = {"key": key, "documentId": str(document.pk), "revisionId": str(revision.pk),
                       "revisionNumber": number}
            case_event_record(actor=actor, case=case, kind=CaseEventKind.DOCUMENT_REVISED, details=details, run=run)
            activity_record(actor=actor, company_id=case.company_id, action="case.document_revised",
                            entity_type="case", entity_id=case.pk, details=details, run=run)
    except IntegrityError:
        # Two first writes raced on (case, key): the loser sees a stale base.
        raise StaleRevision("The document was created concurrently.", details={"key": [key]})
    return revision
