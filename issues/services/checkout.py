"""The claim: checkout as one conditional UPDATE, and its release."""
from __future__ import annotations

from django.db import transaction
from django.db.models import Exists, OuterRef, Q, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from issues import events
from issues.actors import Actor
from issues.choices import CHECKOUT_FROM_STATUSES, LIVE_RUN_STATUSES, IssueStatus, RelationKind
from issues.exceptions import CheckoutConflict, Conflict, Forbidden, NotCheckoutOwner, Unprocessable
from issues.models import Agent, HeartbeatRun, Issue, IssueRelation

from .activity import activity_record
from .lookups import company_object


def _live_run(field):
    return Exists(HeartbeatRun.objects.filter(pk=OuterRef(field), status__in=LIVE_RUN_STATUSES))


def _open_blockers():
    return IssueRelation.objects.filter(related_issue=OuterRef("pk"), kind=RelationKind.BLOCKS).exclude(
        issue__status=IssueStatus.DONE
    )


def _conflict_details(issue: Issue) -> dict:
    def sid(value):
        return str(value) if value else None

    return {
        "issueId": str(issue.pk),
        "status": issue.status,
        "assigneeAgentId": sid(issue.assignee_agent_id),
        "checkoutRunId": sid(issue.checkout_run_id),
        "executionRunId": sid(issue.execution_run_id),
    }


def _checkout_run(actor: Actor, agent: Agent, run_header: str | None) -> HeartbeatRun:
    if actor.is_agent:
        if agent.pk != actor.agent.pk:
            raise Forbidden("Agents check out work for themselves only.", code="agent_mismatch",
                            details={"agentId": ["Must be your own agent id."]})
        return actor.require_live_run()
    # A board user checks out on an agent's behalf with one of that agent's live runs.
    run = HeartbeatRun.objects.filter(pk=run_header, agent=agent, status__in=LIVE_RUN_STATUSES).first() if run_header else None
    if run is None:
        raise Unprocessable("Checkout needs a live run of the agent (X-Paperclip-Run-Id).", code="run_required",
                            details={"X-Paperclip-Run-Id": ["A live run of agentId is required."]})
    return run


def issue_checkout(*, actor: Actor, issue: Issue, agent_id, expected_statuses, run_header: str | None = None):
    """Claim ``issue`` for ``agent_id``'s run. Returns (issue, claimed: bool)."""
    invalid = [s for s in expected_statuses if s not in CHECKOUT_FROM_STATUSES]
    if invalid or not expected_statuses:
        raise Unprocessable(
            "expectedStatuses may only contain " + ", ".join(CHECKOUT_FROM_STATUSES) + ".",
            code="invalid_expected_statuses",
            details={"expectedStatuses": [f"'{s}' cannot be checked out from." for s in invalid] or ["Required."]},
        )
    actor.ensure_can_write(issue.company_id)
    agent = company_object(Agent, issue.company_id, agent_id, "agentId")
    run = _checkout_run(actor, agent, run_header)
    now = timezone.now()

    fresh_claim = (
        Q(status__in=expected_statuses)
        & (Q(assignee_agent__isnull=True) | Q(assignee_agent=agent))
        & Q(assignee_user__isnull=True)
    )
    # Adoption: the agent's earlier run ended (or vanished) while holding the claim.
    adoption = (
        Q(status=IssueStatus.IN_PROGRESS)
        & Q(assignee_agent=agent)
        & ~Q(checkout_run=run)
        & ~_live_run("checkout_run_id")
        & ~_live_run("execution_run_id")
    )
    with transaction.atomic():
        claimed = (
            Issue.objects.filter(pk=issue.pk)
            .filter(fresh_claim | adoption)
            .filter(~Exists(_open_blockers()))
            .update(
                status=IssueStatus.IN_PROGRESS,
                assignee_agent=agent,
                checkout_run=run,
                execution_run=run,
                execution_locked_at=now,
                started_at=Coalesce("started_at", Value(now)),
                completed_at=None,
                cancelled_at=None,
                updated_at=now,
            )
        )
        current = Issue.objects.get(pk=issue.pk)
        if claimed:
            activity_record(actor=actor, company_id=issue.company_id, action="issue.checked_out",
                            entity_type="issue", entity_id=issue.pk, run=run,
                            details={"agentId": str(agent.pk), "runId": str(run.pk),
                                     "fromStatus": issue.status})
            events.announce(events.issue_checked_out, issue=current, actor=actor, run=run)
            return current, True

    if (current.status == IssueStatus.IN_PROGRESS and current.assignee_agent_id == agent.pk
            and current.checkout_run_id == run.pk):
        return current, False  # same run again: idempotent, no side effects
    claimable_now = current.status in expected_statuses and current.assignee_agent_id in (None, agent.pk) \
        and current.assignee_user_id is None
    if claimable_now:
        blockers = list(
            IssueRelation.objects.filter(related_issue=current, kind=RelationKind.BLOCKS)
            .exclude(issue__status=IssueStatus.DONE)
            .values_list("issue__identifier", flat=True)
        )
        if blockers:
            raise Unprocessable("The issue has blockers that are not done.", code="blocked_by_open_issues",
                                details={"blockers": blockers})
    raise CheckoutConflict(details=_conflict_details(current))


def issue_release(*, actor: Actor, issue: Issue) -> Issue:
    """Give an in-progress issue back: status todo, all lock fields cleared."""
    actor.ensure_can_write(issue.company_id)
    run = actor.require_live_run() if actor.is_agent else None
    with transaction.atomic():
        issue = Issue.objects.select_for_update().get(pk=issue.pk)
        if issue.status != IssueStatus.IN_PROGRESS:
            raise Conflict("Only an issue in progress can be released.", code="not_checked_out",
                           details=_conflict_details(issue))
        if actor.is_agent and run.pk != issue.checkout_run_id:
            holder_live = HeartbeatRun.objects.filter(
                pk=issue.checkout_run_id, status__in=LIVE_RUN_STATUSES
            ).exists()
            if holder_live:
                raise NotCheckoutOwner(details=_conflict_details(issue))
        previous = _conflict_details(issue)
        issue.status = IssueStatus.TODO
        issue.checkout_run = issue.execution_run = issue.execution_locked_at = None
        issue.save(update_fields=["status", "checkout_run", "execution_run", "execution_locked_at", "updated_at"])
        activity_record(actor=actor, company_id=issue.company_id, action="issue.released", entity_type="issue",
                        entity_id=issue.pk, details={"previous": previous})
        events.announce(events.issue_updated, issue=issue, actor=actor,
                        changes={"status": [IssueStatus.IN_PROGRESS, IssueStatus.TODO]})
    return issue
