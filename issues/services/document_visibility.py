"""Operator quarantine of documents (an issue's, or a case's own ``cases.CaseDocument``, which has
the same visibility fields): a quarantined document stays where it is and its revisions stay
intact, but agents' bounded case page reads (cases.reading) no longer serve it until an operator
releases it."""
from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from issues.actors import Actor
from issues.exceptions import InvalidInput
from issues.models import Document

from .activity import activity_record

MAX_REASON = 500


def _locked_for_operator(actor: Actor, document: Document) -> Document:
    actor.ensure_board()  # agents never decide what other agents may read
    actor.ensure_can_write(document.company_id)
    return type(document).objects.select_for_update().get(pk=document.pk)


def _audit(actor: Actor, document: Document, action: str, **details):
    activity_record(actor=actor, company_id=document.company_id, action=action,
                    entity_type=document.activity_entity_type, entity_id=document.activity_entity_id,
                    details={"key": document.key, "documentId": str(document.pk), **details})


def document_quarantine(*, actor: Actor, document: Document, reason: str = "") -> Document:
    """Withhold the document from agents' page reads (board, write role). Quarantining a
    quarantined document keeps its first quarantine and records nothing."""
    reason = (reason or "").strip()
    if len(reason) > MAX_REASON:
        raise InvalidInput(details={"reason": [f"At most {MAX_REASON} characters."]})
    with transaction.atomic():
        document = _locked_for_operator(actor, document)
        if document.quarantined_at is None:
            document.quarantined_at = timezone.now()
            document.quarantined_by = actor.user
            document.quarantine_reason = reason
            document.save(update_fields=["quarantined_at", "quarantined_by", "quarantine_reason", "updated_at"])
            _audit(actor, document, "document.quarantined", reason=reason)
    return document


def document_release(*, actor: Actor, document: Document) -> Document:
    """Serve the document to page reads again (board, write role); a no-op when not quarantined."""
    with transaction.atomic():
        document = _locked_for_operator(actor, document)
        if document.quarantined_at is not None:
            previous = document.quarantine_reason
            document.quarantined_at, document.quarantined_by, document.quarantine_reason = None, None, ""
            document.save(update_fields=["quarantined_at", "quarantined_by", "quarantine_reason", "updated_at"])
            _audit(actor, document, "document.released", previousReason=previous)
    return document
