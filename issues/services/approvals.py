"""Approvals: an agent (or a board user) asks, a board user decides, the requesting agent is woken.

Lifecycle and messages follow upstream Paperclip (``paperclip-api.md`` §5.3): ``pending ->
approved | rejected``; ``pending -> revision_requested -> (resubmit) -> pending``; approve and
reject are also allowed from ``revision_requested``. Approving what is already approved (or
rejecting what is already rejected) answers the approval unchanged, without a second wake.
A ``hire_agent`` decision settles the hired agent (services.hire_settlement). Every decision wakes the
requesting agent through the one wakeup service, with the approval's
id, status and linked issues in the run context (the run environment's ``PAPERCLIP_APPROVAL_*``).
"""
from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from issues.actors import Actor
from issues.choices import TERMINAL_ISSUE_STATUSES, AgentRole, ApprovalStatus, ApprovalType, WakeSource
from issues.exceptions import Forbidden, InvalidInput, NotFound, Unprocessable
from issues.models import Agent, Approval, ApprovalIssue, Issue, WakeupRequest
from issues.selectors import approval_issues

from .activity import activity_record
from .agent_grants import agent_permissions
from .hire_settlement import hire_settle
from .lookups import company_object
from .wakeups import agent_wakeup

TITLE_MAX = 300  # Approval.title
NOTE_MAX = 20_000
RESOLVABLE = (ApprovalStatus.PENDING, ApprovalStatus.REVISION_REQUESTED)

# target status -> (statuses it may come from, 422 message, wake reason, activity action)
DECISIONS = {
    ApprovalStatus.APPROVED: (RESOLVABLE, "Only pending or revision requested approvals can be approved",
                              "approval_approved", "approval.approved"),
    ApprovalStatus.REJECTED: (RESOLVABLE, "Only pending or revision requested approvals can be rejected",
                              "approval_rejected", "approval.rejected"),
    ApprovalStatus.REVISION_REQUESTED: ((ApprovalStatus.PENDING,), "Only pending approvals can request revision",
                                        "approval_revision_requested", "approval.revision_requested"),
}


def default_title(type: str, payload: dict) -> str:
    """The model needs a title; upstream has none: the payload's title, else the type in words."""
    title = payload.get("title")
    if isinstance(title, str) and title.strip():
        return title.strip()[:TITLE_MAX]
    return type.replace("_", " ").capitalize()


def linked_issues(company, issue_ids, field: str = "issueIds") -> list[Issue]:
    """Every id must name an issue of the company; checked before anything is written."""
    requested = [str(i) for i in issue_ids]
    found = {str(i.pk): i for i in Issue.objects.filter(company=company, pk__in=set(requested))}
    # Per position, DRF style; the ids are not echoed (another company's id reads like an unknown one).
    missing = {str(n): ["No such issue in this company."] for n, i in enumerate(requested) if i not in found}
    if missing:
        raise NotFound("Issue not found.", details={field: missing})
    return [found[i] for i in dict.fromkeys(requested)]


def approval_create(*, actor: Actor, company, type: str, payload: dict, title: str | None = None,
                    requested_by_agent_id=None, issue_ids=()) -> Approval:
    """A new pending approval linked to ``issue_ids``. The requester defaults to the calling agent."""
    actor.ensure_can_write(company.pk)
    if actor.is_agent:
        actor.named_live_run()  # approvals are not run-scoped (ref §2.3)
    if type not in ApprovalType.values:
        raise InvalidInput(details={"type": [f"'{type}' is not one of {', '.join(ApprovalType.values)}."]})
    if not isinstance(payload, dict):
        raise InvalidInput(details={"payload": ["Must be a JSON object."]})
    if title is not None and not title.strip():
        raise InvalidInput(details={"title": ["This field may not be blank."]})
    requester = company_object(Agent, company.pk, requested_by_agent_id, "requestedByAgentId") or actor.agent
    issues = linked_issues(company, issue_ids)
    with transaction.atomic():
        approval = Approval.objects.create(
            company=company, type=type, payload=payload, title=(title or default_title(type, payload))[:TITLE_MAX],
            status=ApprovalStatus.PENDING, requested_by_agent=requester,
            requested_by_user=actor.user if actor.is_board else None,
        )
        ApprovalIssue.objects.bulk_create([ApprovalIssue(approval=approval, issue=issue) for issue in issues])
        activity_record(actor=actor, company_id=company.pk, action="approval.created", entity_type="approval",
                        entity_id=approval.pk,
                        details={"type": type, "issueIds": [str(i.pk) for i in issues],
                                 "requestedByAgentId": str(requester.pk) if requester else None})
    return approval


def approval_decide(*, actor: Actor, approval: Approval, status: str, note: str | None = "") -> Approval:
    """A board user approves, rejects or asks for a revision; the requesting agent is woken."""
    if status not in DECISIONS:
        raise InvalidInput(details={"status": [f"Must be one of {', '.join(DECISIONS)}."]})
    actor.ensure_board()
    actor.ensure_can_write(approval.company_id)
    note = note or ""
    if len(note) > NOTE_MAX:
        raise InvalidInput(details={"decisionNote": [f"At most {NOTE_MAX} characters."]})
    allowed, message, reason, action = DECISIONS[status]
    with transaction.atomic():
        approval = Approval.objects.select_for_update().get(pk=approval.pk)
        if approval.status == status and status != ApprovalStatus.REVISION_REQUESTED:
            return approval  # already decided this way: unchanged (upstream)
        if approval.status not in allowed:
            raise Unprocessable(message, code="approval_status_invalid", details={"status": [approval.status]})
        approval.status, approval.decision_note = status, note
        approval.decided_by_user, approval.decided_at = actor.user, timezone.now()
        approval.save(update_fields=["status", "decision_note", "decided_by_user", "decided_at", "updated_at"])
        hire_settle(actor=actor, approval=approval)  # a hire's agent starts work or is terminated
        linked = approval_issues(approval)
        activity_record(actor=actor, company_id=approval.company_id, action=action, entity_type="approval",
                        entity_id=approval.pk,
                        details={"type": approval.type, "status": status, "decisionNote": note,
                                 "issueIds": [str(i.pk) for i in linked]})
        _wake_requester(actor, approval, linked, reason)
    return approval


def _wake_requester(actor: Actor, approval: Approval, linked: list[Issue], reason: str) -> WakeupRequest | None:
    """The requester's wake: on the first linked issue still open (a wake on a finished issue would
    be skipped), carrying what the agent needs to follow up. Idempotent per decision."""
    if approval.requested_by_agent_id is None:
        return None
    issue_ids = [str(i.pk) for i in linked]
    first = issue_ids[0] if issue_ids else None
    open_issue = next((i for i in linked if i.status not in TERMINAL_ISSUE_STATUSES), None)
    context = {"approvalId": str(approval.pk), "approvalStatus": approval.status, "issueIds": issue_ids,
               "issueId": first, "taskId": first, "wakeReason": reason}
    # agent_wakeup locks and re-reads the agent row itself; this only names it.
    agent = Agent(pk=approval.requested_by_agent_id, company_id=approval.company_id)
    return agent_wakeup(actor=actor, agent=agent, source=WakeSource.AUTOMATION, reason=reason, issue=open_issue,
                        idempotency_key=f"approval:{approval.pk}:{approval.status}:{approval.decided_at.isoformat()}",
                        context=context)


def approval_resubmit(*, actor: Actor, approval: Approval, payload: dict | None = None) -> Approval:
    """After a revision request: back to pending (with a new payload if given); the decision is cleared
    (it stays in the approval's activity history)."""
    actor.ensure_can_write(approval.company_id)
    if actor.is_agent:
        if approval.requested_by_agent_id != actor.agent.pk:
            raise Forbidden("Only requesting agent can resubmit this approval", code="not_requesting_agent")
        actor.named_live_run()  # approvals are not run-scoped (ref §2.3)
    if payload is not None and not isinstance(payload, dict):
        raise InvalidInput(details={"payload": ["Must be a JSON object."]})
    with transaction.atomic():
        approval = Approval.objects.select_for_update().get(pk=approval.pk)
        if approval.status != ApprovalStatus.REVISION_REQUESTED:
            raise Unprocessable("Only revision requested approvals can be resubmitted",
                                code="approval_status_invalid", details={"status": [approval.status]})
        approval.status = ApprovalStatus.PENDING
        if payload is not None:
            approval.payload = payload
        approval.decision_note, approval.decided_by_user, approval.decided_at = "", None, None
        approval.save(update_fields=["status", "payload", "decision_note", "decided_by_user", "decided_at",
                                     "updated_at"])
        activity_record(actor=actor, company_id=approval.company_id, action="approval.resubmitted",
                        entity_type="approval", entity_id=approval.pk,
                        details={"type": approval.type, "payloadChanged": payload is not None})
    return approval


def ensure_may_link_approvals(actor: Actor, company_id) -> None:
    """Upstream's rule for linking approvals to issues after the fact: board users with a write role;
    agents with the CEO role or ``canCreateAgents``."""
    actor.ensure_can_write(company_id)
    if actor.is_agent:
        if actor.agent.role != AgentRole.CEO and not agent_permissions(actor.agent)["canCreateAgents"]:
            raise Forbidden("Missing permission to link approvals", code="missing_permission")
        actor.named_live_run()  # approvals are not run-scoped (ref §2.3)


def issue_approval_link(*, actor: Actor, issue: Issue, approval_id) -> bool:
    """Link an approval of the issue's company to the issue (``POST /issues/{id}/approvals``); linking
    a linked one changes nothing. True when a link was made."""
    # (the id first: another company's approval is a 404 for every caller, as everywhere)
    approval = company_object(Approval, issue.company_id, approval_id, "approvalId")
    ensure_may_link_approvals(actor, issue.company_id)
    with transaction.atomic():
        _, created = ApprovalIssue.objects.get_or_create(approval=approval, issue=issue)
        if created:
            activity_record(actor=actor, company_id=issue.company_id, action="issue.approval_linked",
                            entity_type="issue", entity_id=issue.pk, details={"approvalId": str(approval.pk)})
    return created


def issue_approval_unlink(*, actor: Actor, issue: Issue, approval_id) -> bool:
    """Remove the link (``DELETE /issues/{id}/approvals/{approvalId}``); an approval that is not linked
    (or another company's) changes nothing, as upstream. True when a link was removed."""
    ensure_may_link_approvals(actor, issue.company_id)
    with transaction.atomic():
        removed, _ = ApprovalIssue.objects.filter(issue=issue, approval_id=approval_id,
                                                  approval__company_id=issue.company_id).delete()
        if removed:
            activity_record(actor=actor, company_id=issue.company_id, action="issue.approval_unlinked",
                            entity_type="issue", entity_id=issue.pk, details={"approvalId": str(approval_id)})
    return bool(removed)
