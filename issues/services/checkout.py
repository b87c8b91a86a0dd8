"""The claim: checkout as one conditional UPDATE, and its release."""
from __future__ import annotations

from datetime import UTC

from django.db import connection, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from issues import events
from issues.actors import Actor
from issues.choices import CHECKOUT_FROM_STATUSES, LIVE_RUN_STATUSES, IssueStatus, RelationKind
from issues.exceptions import CheckoutConflict, Conflict, Forbidden, NotCheckoutOwner, Unprocessable
from issues.models import Agent, HeartbeatRun, Issue, IssueRelation

from .activity import activity_record
from .lookups import company_object


# The claim is one conditional UPDATE: concurrent claimers serialise on the row lock and the
# database re-checks the WHERE clause (subqueries included) against the winner's committed row,
# so exactly one succeeds. Written as SQL because it is the hottest statement of the protocol.
_CLAIM_SQL = """
UPDATE {issue} SET status = %s, assignee_agent_id = %s, assignee_user_id = NULL,
    checkout_run_id = %s, execution_run_id = %s, execution_locked_at = %s,
    started_at = COALESCE(started_at, %s), completed_at = NULL, cancelled_at = NULL, updated_at = %s
WHERE id = %s AND (
    (status IN ({expected}) AND (assignee_agent_id IS NULL OR assignee_agent_id = %s)
     AND assignee_user_id IS NULL)
    OR (status = %s AND assignee_agent_id = %s
        AND (checkout_run_id IS NULL OR checkout_run_id <> %s)
        AND NOT EXISTS (SELECT 1 FROM {run} r WHERE r.id = {issue}.checkout_run_id AND r.status IN ({live}))
        AND NOT EXISTS (SELECT 1 FROM {run} r WHERE r.id = {issue}.execution_run_id AND r.status IN ({live})))
) AND NOT EXISTS (
    SELECT 1 FROM {relation} rel JOIN {issue} b ON b.id = rel.issue_id
    WHERE rel.related_issue_id = {issue}.id AND rel.kind = %s AND b.status <> %s
)
RETURNING started_at
"""


def _claim(*, issue_id, agent_id, run_id, expected, now):
    """Run the claim; the row's started_at if it was claimed, else None."""
    qn = connection.ops.quote_name
    sql = _CLAIM_SQL.format(
        issue=qn(Issue._meta.db_table), run=qn(HeartbeatRun._meta.db_table),
        relation=qn(IssueRelation._meta.db_table),
        expected=", ".join(["%s"] * len(expected)), live=", ".join(["%s"] * len(LIVE_RUN_STATUSES)),
    )
    uid = Issue._meta.pk.get_db_prep_value
    at = Issue._meta.get_field("updated_at").get_db_prep_value
    agent, run, stamp = uid(agent_id, connection), uid(run_id, connection), at(now, connection)
    live = list(LIVE_RUN_STATUSES)
    params = [IssueStatus.IN_PROGRESS, agent, run, run, stamp, stamp, stamp, uid(issue_id, connection),
              *expected, agent, IssueStatus.IN_PROGRESS, agent, run, *live, *live,
              RelationKind.BLOCKS, IssueStatus.DONE]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    started_at = row[0]
    if isinstance(started_at, str):  # SQLite hands back text
        started_at = parse_datetime(started_at)
        if timezone.is_naive(started_at):
            started_at = timezone.make_aware(started_at, UTC)
    return started_at


def _checkout_agent(actor: Actor, issue: Issue, agent_id) -> Agent:
    if actor.is_agent and str(agent_id) == str(actor.agent.pk):
        return actor.agent  # already loaded by authentication
    return company_object(Agent, issue.company_id, agent_id, "agentId")


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
    agent = _checkout_agent(actor, issue, agent_id)
    run = _checkout_run(actor, agent, run_header)
    now = timezone.now()
    with transaction.atomic():
        started_at = _claim(issue_id=issue.pk, agent_id=agent.pk, run_id=run.pk, expected=expected_statuses, now=now)
        if started_at is not None:
            from_status = issue.status
            issue.status, issue.assignee_agent_id, issue.assignee_user_id = IssueStatus.IN_PROGRESS, agent.pk, None
            issue.checkout_run_id = issue.execution_run_id = run.pk
            issue.execution_locked_at = issue.updated_at = now
            issue.started_at, issue.completed_at, issue.cancelled_at = started_at, None, None
            activity_record(actor=actor, company_id=issue.company_id, action="issue.checked_out",
                            entity_type="issue", entity_id=issue.pk, run=run,
                            details={"agentId": str(agent.pk), "runId": str(run.pk), "fromStatus": from_status})
            events.announce(events.issue_checked_out, issue=issue, actor=actor, run=run)
            return issue, True
    current = Issue.objects.get(pk=issue.pk)
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
