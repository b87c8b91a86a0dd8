"""Writes of case <-> task links (seed 001, capability ``cases/task-links``).

* ``origin`` is the link to the primary task made when the case is created; it can be neither
  created nor removed here.
* Linking is idempotent for an existing (case, issue) pair with the same role: the existing
  link is returned unchanged. The same pair with another role is a 409 (remove and re-link to
  change the role), so a retried request never silently rewrites a link.
* The issue must belong to the case's company (else the same 404 as a missing issue).
* Every change records a ``CaseEvent`` and an activity entry, and bumps the case's
  ``updated_at`` (links are part of the case's read projection, so paged reads restart).
* Agents need a live run, like every other case write, and while the case's primary task is in
  progress the run that holds its checkout (409 ``not_checkout_owner`` otherwise).
"""
from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from issues.actors import Actor
from issues.exceptions import Conflict, InvalidInput, NotFound
from issues.models import Issue
from issues.services.activity import activity_record
from issues.services.lookups import company_object

from .choices import CaseEventKind, CaseLinkRole
from .models import Case, CaseIssueLink
from .services import authorize_write, case_event_record, ensure_primary_task_run

LINKABLE_ROLES = (CaseLinkRole.WORK, CaseLinkRole.REFERENCE)


def case_link_issue(*, actor: Actor, case: Case, issue_id, role: str) -> tuple[CaseIssueLink, bool]:
    """Link ``issue_id`` to ``case`` with ``role`` (work or reference). Returns ``(link, created)``."""
    if role not in LINKABLE_ROLES:
        raise InvalidInput(details={"role": [f"Must be one of {', '.join(LINKABLE_ROLES)}; the origin link is set "
                                             "when the case is created."]})
    issue = company_object(Issue, case.company_id, issue_id, "issueId")
    run = authorize_write(actor, case.company_id)
    try:
        with transaction.atomic():
            locked = Case.objects.select_for_update().defer("fields").get(pk=case.pk)
            ensure_primary_task_run(actor, locked)
            existing = CaseIssueLink.objects.filter(case=locked, issue=issue).first()
            if existing is not None:
                return _existing(existing, role), False
            link = CaseIssueLink.objects.create(company_id=locked.company_id, case=locked, issue=issue, role=role)
            locked.save(update_fields=["updated_at"])
            details = {"issueId": str(issue.pk), "identifier": issue.identifier, "role": role}
            case_event_record(actor=actor, case=locked, kind=CaseEventKind.ISSUE_LINKED, details=details, run=run)
            activity_record(actor=actor, company_id=locked.company_id, action="case.issue_linked",
                            entity_type="case", entity_id=locked.pk, details=details, run=run)
    except IntegrityError:  # a concurrent identical link won the unique constraint
        existing = CaseIssueLink.objects.filter(case_id=case.pk, issue=issue).first()
        if existing is None:
            raise
        return _existing(existing, role), False
    return link, True


def _existing(link: CaseIssueLink, role: str) -> CaseIssueLink:
    if link.role != role:
        raise Conflict("This issue is already linked to the case with another role; remove the link first to "
                       "change it.", code="case_link_exists",
                       details={"role": [f"Already linked as '{link.role}'."], "existingRole": link.role})
    return link


def case_unlink_issue(*, actor: Actor, case: Case, issue_id) -> None:
    """Remove a work/reference link. The origin link (the primary task) cannot be removed."""
    run = authorize_write(actor, case.company_id)
    with transaction.atomic():
        locked = Case.objects.select_for_update().defer("fields").get(pk=case.pk)
        ensure_primary_task_run(actor, locked)
        try:
            link = CaseIssueLink.objects.select_related("issue").get(case=locked, issue_id=issue_id)
        except (CaseIssueLink.DoesNotExist, ValidationError, ValueError, TypeError):
            raise NotFound("Link not found.")
        if link.role == CaseLinkRole.ORIGIN:
            raise Conflict("The origin link to the primary task cannot be removed.", code="case_origin_link")
        details = {"change": "issue_unlinked", "removed": True, "issueId": str(link.issue_id),
                   "identifier": link.issue.identifier, "role": link.role}
        link.delete()
        locked.save(update_fields=["updated_at"])
        case_event_record(actor=actor, case=locked, kind=CaseEventKind.ISSUE_UNLINKED, details=details, run=run)
        activity_record(actor=actor, company_id=locked.company_id, action="case.issue_unlinked",
                        entity_type="case", entity_id=locked.pk, details=details, run=run)
