"""The claim: checkout as one conditional UPDATE, and its release.

A claim is made under a host run (the lock's ``checkout_run``/``execution_run``) or, for a
long-lived agent key whose run header names none of its host runs, under the client's own run id
(``checkout_client_run_id``; the run FKs stay null). A client id is never a live host run, so the
same agent adopts that lock under any other id, as upstream adopts a lock whose run is not live.
"""
from __future__ import annotations

import uuid
from dataclasses import replace
from functools import lru_cache

from django.db import connection, transaction
from django.db.models import prefetch_related_objects
from django.utils import timezone

from issues import events, selectors
from issues.actors import Actor
from issues.choices import (
    CHECKOUT_FROM_STATUSES,
    LIVE_RUN_STATUSES,
    TERMINAL_ISSUE_STATUSES,
    IssueStatus,
    RelationKind,
    RunStatus,
)
from issues.exceptions import (
    AssignedElsewhere,
    BlockedByOpenIssues,
    CheckoutConflict,
    Forbidden,
    InvalidInput,
    StatusNotExpected,
    Unprocessable,
)
from issues.models import Agent, HeartbeatRun, Issue, IssueRelation, Label
from paperclip.core import rows

from . import fences
from .activity import activity_deferred, activity_record, activity_row
from .lookups import company_object


# The claim is one conditional UPDATE: concurrent claimers serialise on the row lock and the
# database re-checks the WHERE clause (subqueries included) against the winner's committed row,
# so exactly one succeeds. It is scoped to the caller's companies and returns the claimed row,
# so the happy path reads nothing else. Written as SQL because it is the protocol's hottest path.
# First branch: a claim from an expected status other than in_progress (no lock can exist there).
# Second branch: the agent's own in_progress issue that no live host run holds is adopted, under
# any run id but the one already holding it ({own_lock}: the host run column, or the client id's),
# whatever expectedStatuses says (upstream); the same run again is the idempotent re-read.
_CLAIM_SQL = """
UPDATE {issue} SET status = %s, assignee_agent_id = %s, assignee_user_id = NULL,
    checkout_run_id = %s, execution_run_id = %s, checkout_client_run_id = %s, execution_locked_at = %s,
    started_at = COALESCE(started_at, %s), completed_at = NULL, cancelled_at = NULL, updated_at = %s
WHERE {key} = %s AND company_id IN ({companies}) AND (
    ({open_statuses} AND (assignee_agent_id IS NULL OR assignee_agent_id = %s)
     AND assignee_user_id IS NULL)
    OR (status = %s AND assignee_agent_id = %s
        AND ({own_lock} IS NULL OR {own_lock} <> %s)
        AND NOT EXISTS (SELECT 1 FROM {run} r WHERE r.id = {issue}.checkout_run_id AND r.status IN ({live}))
        AND NOT EXISTS (SELECT 1 FROM {run} r WHERE r.id = {issue}.execution_run_id AND r.status IN ({live})))
) AND NOT EXISTS (
    SELECT 1 FROM {relation} rel JOIN {issue} b ON b.id = rel.issue_id
    WHERE rel.related_issue_id = {issue}.id AND rel.kind = %s AND b.status NOT IN (%s, %s)
){run_check}{unless}
RETURNING {columns}, EXISTS (SELECT 1 FROM {labels} l WHERE l.{labels_issue} = {issue}.id){facts}
"""
# An agent's run must be its own and running; anything else takes the slow path, which explains.
_RUN_CHECK = "\nAND EXISTS (SELECT 1 FROM {run} r0 WHERE r0.id = %s AND r0.agent_id = %s AND r0.status = %s)"
# PostgreSQL, an agent's claim under its running run: the claim and its audit row in one statement
# that commits on its own (no BEGIN, no second INSERT, no COMMIT: half the round trips of the
# transactional claim). It claims only an issue for which no claim fact holds, i.e. one where no
# receiver of issue_checked_out_atomic has work that must commit with the claim; the transactional
# claim takes the others.
_CLAIM_RECORDED_SQL = "WITH claimed AS ({claim}), recorded AS ({record}) SELECT * FROM claimed"
# The audit row's columns the claimed row decides (the ref may be an identifier; agents have one company).
_RECORDED_FROM_CLAIM = {"company_id": "claimed.company_id", "entity_id": "claimed.id::text"}


@lru_cache(maxsize=64)
def _claim_sql(*, identifier: bool, companies: int, open_statuses: int, host_run: bool, check_run: bool,
               facts: tuple = (), unless: tuple = ()) -> str:
    """The claim statement for one shape of request (built once per shape and process); ``facts``:
    the registered claim facts (events.CLAIM_FACTS) as (name, SQL) pairs, returned after the labels;
    ``unless``: facts' SQL that must all be false for the claim to match."""
    qn = connection.ops.quote_name
    labels = Issue._meta.get_field("labels")
    tables = {"issue": qn(Issue._meta.db_table), "run": qn(HeartbeatRun._meta.db_table),
              "relation": qn(IssueRelation._meta.db_table), "labels": qn(labels.m2m_db_table()),
              "labels_issue": qn(labels.m2m_column_name())}
    return _CLAIM_SQL.format(
        **tables, key="identifier" if identifier else "id", columns=rows.select_list(Issue, tables["issue"]),
        companies=", ".join(["%s"] * companies),
        open_statuses=f"status IN ({', '.join(['%s'] * open_statuses)})" if open_statuses else "1 = 0",
        own_lock="checkout_run_id" if host_run else "checkout_client_run_id",
        live=", ".join(["%s"] * len(LIVE_RUN_STATUSES)),
        run_check=_RUN_CHECK.format(**tables) if check_run else "",
        facts="".join(f", ({sql.format(issue=tables['issue'])})" for _, sql in facts),
        unless="".join(f"\nAND NOT ({sql.format(issue=tables['issue'])})" for sql in unless),
    )


def _claim(*, ref, company_ids, agent_id, run_id, client_run_id=None, expected, now,
           check_run: bool, record=None) -> Issue | None:
    """Run the claim under ``run_id`` (a host run) or ``client_run_id`` (exactly one is given);
    the claimed issue, or None when nothing matched. With ``record`` (an unsaved audit row;
    PostgreSQL) the same statement writes it, and only an issue no claim fact holds for is claimed."""
    uid = Issue._meta.pk.get_db_prep_value
    identifier = selectors.is_identifier(ref)
    open_statuses = [s for s in expected if s != IssueStatus.IN_PROGRESS]
    facts = tuple(events.CLAIM_FACTS.items())
    sql = _claim_sql(identifier=identifier, companies=len(company_ids), open_statuses=len(open_statuses),
                     host_run=run_id is not None, check_run=check_run, facts=() if record else facts,
                     unless=tuple(fact for _, fact in facts) if record else ())
    try:
        key = str(ref).upper() if identifier else uid(uuid.UUID(str(ref)), connection)
    except ValueError:
        return None
    stamp = Issue._meta.get_field("updated_at").get_db_prep_value(now, connection)
    agent, run, live = uid(agent_id, connection), uid(run_id, connection), list(LIVE_RUN_STATUSES)
    client = uid(client_run_id, connection)
    params = [IssueStatus.IN_PROGRESS, agent, run, run, client, stamp, stamp, stamp, key,
              *[uid(c, connection) for c in company_ids], *open_statuses, agent, IssueStatus.IN_PROGRESS, agent,
              run if run is not None else client, *live, *live, RelationKind.BLOCKS, *TERMINAL_ISSUE_STATUSES]
    if check_run:
        params += [run, agent, RunStatus.RUNNING]
    if record is not None:
        record_sql, record_params = rows.insert_select(record, "claimed", _RECORDED_FROM_CLAIM)
        sql, params = _CLAIM_RECORDED_SQL.format(claim=sql, record=record_sql), params + record_params
    claimed, extras = rows.fetch_one(Issue, sql, params)
    if claimed is None:
        return None
    claimed.claim_facts = ({name: False for name, _ in facts} if record is not None
                           else {name: bool(value) for (name, _), value in zip(facts, extras[1:])})
    return _with_labels(claimed, known_empty=not extras[0])


def _with_labels(issue: Issue, known_empty: bool = False) -> Issue:
    """The issue with its labels loaded, which the response lists twice (labels, labelIds): one query,
    none when the claim found there are none."""
    if known_empty:  # an evaluated empty result, as a prefetch leaves it: iterating it compiles nothing
        labels = Label.objects.none()
        labels._result_cache, labels._prefetch_done = [], True
        issue._prefetched_objects_cache = {"labels": labels}
    else:
        prefetch_related_objects([issue], "labels")
    return issue


def _checkout_agent(actor: Actor, issue: Issue, agent_id) -> Agent:
    if actor.is_agent and str(agent_id) == str(actor.agent.pk):
        return actor.agent  # already loaded by authentication
    return company_object(Agent, issue.company_id, agent_id, "agentId")


def _conflict_details(issue: Issue) -> dict:
    """Upstream's lock details; ``checkoutRunId`` is what the lock holds (a host run, or a
    client's own run id)."""
    def sid(value):
        return str(value) if value else None

    return {
        "issueId": str(issue.pk),
        "status": issue.status,
        "assigneeAgentId": sid(issue.assignee_agent_id),
        "checkoutRunId": sid(issue.checkout_run_id or issue.checkout_client_run_id),
        "executionRunId": sid(issue.execution_run_id),
    }


def _checkout_run(actor: Actor, agent: Agent, run_header: str | None) -> HeartbeatRun | None:
    """The host run the claim is made under; None for an agent's client run id."""
    if actor.is_agent:
        if agent.pk != actor.agent.pk:
            raise Forbidden("Agent can only checkout as itself", code="agent_mismatch",
                            details={"agentId": ["Must be your own agent id."]})
        return actor.require_live_run()
    # A board user checks out on an agent's behalf with one of that agent's live runs.
    run = HeartbeatRun.objects.filter(pk=run_header, agent=agent, status__in=LIVE_RUN_STATUSES).first() if run_header else None
    if run is None:
        raise Unprocessable("Checkout needs a live run of the agent (X-Paperclip-Run-Id).", code="run_required",
                            details={"X-Paperclip-Run-Id": ["A live run of agentId is required."]})
    return run


def _expected_statuses(statuses) -> list:
    """Any statuses of the enum (in_progress re-claims the agent's own issue after a crash); None:
    the default CHECKOUT_FROM_STATUSES. Repeats are dropped (the claim's IN list stays short)."""
    if statuses is None:
        return list(CHECKOUT_FROM_STATUSES)
    invalid = [s for s in statuses if s not in IssueStatus.values]
    if invalid or not statuses:
        raise InvalidInput(details={"expectedStatuses": [f"'{s}' is not an issue status." for s in invalid]
                                    or ["At least one status is required."]})
    return list(dict.fromkeys(statuses))


def issue_checkout(*, actor: Actor, agent_id=None, expected_statuses=None, issue: Issue | None = None,
                   issue_ref=None, run_header: str | None = None):
    """Claim an issue (by instance or by id/identifier) for ``agent_id``'s run (an agent: itself
    when omitted; a board user must name the agent). Returns (issue, claimed: bool); claimed is
    False for the idempotent same-run repeat."""
    expected_statuses = _expected_statuses(expected_statuses)
    if agent_id is None:
        if not actor.is_agent:
            raise InvalidInput("agentId is required.", details={"agentId": ["Name the agent to check the issue out "
                                                                           "for (required for board users)."]})
        agent_id = actor.agent.pk
    ref = issue.pk if issue is not None else issue_ref
    company_ids = actor.company_ids if actor.company_ids is not None else [issue.company_id]
    fast_run = _header_run_id(actor) if actor.is_agent and str(agent_id) == str(actor.agent.pk) else None
    if fast_run is not None:
        # Happy path for an agent with its running run: one statement claims and returns the row.
        claimed = _claim_and_record(actor=actor, ref=ref, company_ids=company_ids, agent_id=actor.agent.pk,
                                    run_id=fast_run, expected=expected_statuses, check_run=True)
        if claimed is not None:
            return claimed, True
    current = issue if issue is not None else selectors.issue_row(actor=actor, pk=ref)  # 404 first
    actor.ensure_can_write(current.company_id)
    agent = _checkout_agent(actor, current, agent_id)
    run = _checkout_run(actor, agent, run_header)
    client_run_id = actor.client_run_id if run is None else None
    claimed = _claim_and_record(actor=actor, ref=current.pk, company_ids=[current.company_id], agent_id=agent.pk,
                                run_id=run.pk if run else None, client_run_id=client_run_id,
                                expected=expected_statuses, check_run=False)
    if claimed is not None:
        return claimed, True
    current = Issue.objects.get(pk=current.pk)
    if (current.status == IssueStatus.IN_PROGRESS and current.assignee_agent_id == agent.pk
            and (current.checkout_run_id == run.pk if run else current.checkout_client_run_id == client_run_id)):
        return _with_labels(current), False  # same run again: idempotent, no side effects
    raise _refusal(current, agent, run, expected_statuses)


def _refusal(issue: Issue, agent: Agent, run: HeartbeatRun | None, expected: list) -> Exception:
    """Why the claim matched nothing, re-read after it, so the answer names what refused it:
    a live run holding the lock (409 ``checkout_conflict``, the upstream contract), another
    assignee (409 ``assigned_elsewhere``), a status outside ``expectedStatuses`` (409
    ``status_not_expected``), or open blockers (422). All 409s carry the lock details and
    upstream's one message (ref §7); the code and details say which refusal it was."""
    details = _conflict_details(issue)
    holders = [pk for pk in (issue.checkout_run_id, issue.execution_run_id) if pk and (run is None or pk != run.pk)]
    if holders and HeartbeatRun.objects.filter(pk__in=holders, status__in=LIVE_RUN_STATUSES).exists():
        return CheckoutConflict(details=details)
    other_assignee = issue.assignee_user_id is not None or issue.assignee_agent_id not in (None, agent.pk)
    if other_assignee and (issue.status == IssueStatus.IN_PROGRESS or issue.status in expected):
        # (In progress without a live run: the claim of another agent, never adopted across agents.)
        return AssignedElsewhere(details={**details, "assigneeUserId": issue.assignee_user_id})
    if issue.status not in expected:
        return StatusNotExpected(details={**details, "expectedStatuses": list(expected)})
    blockers = selectors.open_blockers(issue)
    if blockers:
        return BlockedByOpenIssues(blockers)
    # Claimable now: what refused the claim changed before the re-read (a concurrent writer).
    return CheckoutConflict(details=details)


def _header_run_id(actor: Actor):
    try:
        return uuid.UUID(actor.run_header) if actor.run_header else None
    except ValueError:
        return None


def _claim_and_record(*, actor, ref, company_ids, agent_id, run_id, client_run_id=None, expected,
                      check_run) -> Issue | None:
    now = timezone.now()
    if check_run and connection.vendor == "postgresql" and not activity_deferred():
        claimed = _claim_in_one_statement(actor=actor, ref=ref, company_ids=company_ids, run_id=run_id,
                                          expected=expected, now=now)
        if claimed is not None:
            return claimed
        # Nothing claimed: the issue is not claimable, or a claim fact holds (the claim below decides).
    with transaction.atomic():
        claimed = _claim(ref=ref, company_ids=company_ids, agent_id=agent_id, run_id=run_id,
                         client_run_id=client_run_id, expected=expected, now=now, check_run=check_run)
        if claimed is None:
            return None
        if check_run:  # the claim proved the header names the agent's running run: no second read
            actor.note_host_run(HeartbeatRun(pk=run_id, agent=actor.agent, company_id=actor.agent.company_id,
                                             status=RunStatus.RUNNING))
        claim_run = run_id or client_run_id  # the run the claim speaks for (client ids: see activity_fields)
        activity_record(actor=actor, company_id=claimed.company_id, action="issue.checked_out",
                        entity_type="issue", entity_id=claimed.pk, run=HeartbeatRun(pk=run_id) if run_id else None,
                        details={"agentId": str(agent_id), "runId": str(claim_run)})
        events.announce(events.issue_checked_out, issue=claimed, actor=actor, run_id=claim_run)
        events.issue_checked_out_atomic.send(sender=None, issue=claimed, actor=actor, run_id=claim_run)
    return claimed


def _claim_in_one_statement(*, actor, ref, company_ids, run_id, expected, now) -> Issue | None:
    """An agent's claim under the run its header names (_CLAIM_RECORDED_SQL): claimed, recorded and
    committed by one statement. No receiver of issue_checked_out_atomic has work (no fact held), so
    that signal is not sent; issue_checked_out is, once the statement has committed."""
    agent = actor.agent
    run = HeartbeatRun(pk=run_id, agent=agent, company_id=agent.company_id, status=RunStatus.RUNNING)
    record = activity_row(actor=replace(actor, _run=run), company_id=None, action="issue.checked_out",
                          entity_type="issue", entity_id="",  # company and entity: the claimed row's
                          details={"agentId": str(agent.pk), "runId": str(run_id)})
    claimed = _claim(ref=ref, company_ids=company_ids, agent_id=agent.pk, run_id=run_id, expected=expected,
                     now=now, check_run=True, record=record)
    if claimed is None:
        return None
    actor.note_host_run(run)  # the statement proved the header names the agent's running run
    events.announce(events.issue_checked_out, issue=claimed, actor=actor, run_id=run_id)
    return claimed


LOCK_FIELDS = ("checkout_run", "execution_run", "execution_locked_at", "checkout_client_run_id")


def _clear_lock(issue: Issue) -> tuple[str, ...]:
    """Clear the issue's checkout and execution lock (a host run or a client's own run id); the
    fields to save."""
    for field in LOCK_FIELDS:
        setattr(issue, field, None)
    return LOCK_FIELDS


def issue_force_release(*, actor: Actor, issue: Issue, clear_assignee: bool = False) -> tuple[Issue, dict]:
    """Board only (upstream's ``POST /issues/{id}/admin/force-release``): clear a stranded checkout
    and execution lock, whatever holds it; the status stays, and the assignee too unless
    ``clear_assignee`` (an in-progress issue then goes back to ``todo``: in progress needs an
    owner). Returns the issue and the lock it held ({checkoutRunId, executionRunId}); always
    audited (``issue.admin_force_release``)."""
    actor.ensure_board()
    actor.ensure_can_write(issue.company_id)
    with transaction.atomic():
        issue = Issue.objects.select_for_update().get(pk=issue.pk)
        held = _conflict_details(issue)
        previous = {"checkoutRunId": held["checkoutRunId"], "executionRunId": held["executionRunId"]}
        fields = [*_clear_lock(issue), "updated_at"]
        changes = {}
        if clear_assignee and issue.assignee_agent_id:
            changes["assignee_agent"] = [held["assigneeAgentId"], None]
            issue.assignee_agent = None
            fields.append("assignee_agent")
            if issue.status == IssueStatus.IN_PROGRESS:  # work in progress has an owner: queued for the next
                changes["status"] = [issue.status, IssueStatus.TODO]
                issue.status = IssueStatus.TODO
                fields.append("status")
        issue.save(update_fields=fields)
        activity_record(actor=actor, company_id=issue.company_id, action="issue.admin_force_release",
                        entity_type="issue", entity_id=issue.pk,
                        details={"issueId": str(issue.pk), "actorUserId": str(actor.user.pk) if actor.user else None,
                                 "prevCheckoutRunId": previous["checkoutRunId"],
                                 "prevExecutionRunId": previous["executionRunId"], "clearAssignee": clear_assignee})
        if changes:  # as release: the tracker's note names who let go
            events.issue_updated_atomic.send(sender=None, issue=issue, actor=actor, changes=changes)
            events.announce(events.issue_updated, issue=issue, actor=actor, changes=changes)
    return issue, previous


def issue_release(*, actor: Actor, issue: Issue) -> Issue:
    """Give an issue back, whatever its status (upstream, ref §7): status todo, no agent assignee,
    all lock fields cleared. Agents: see fences.ensure_may_release."""
    actor.ensure_can_write(issue.company_id)
    if actor.is_agent:
        actor.require_live_run()  # release is always run-scoped (ref §2.3)
    with transaction.atomic():
        issue = Issue.objects.select_for_update().get(pk=issue.pk)
        fences.ensure_may_release(actor, issue)  # under the row lock
        previous = _conflict_details(issue)
        issue.status = IssueStatus.TODO
        # Upstream (reference §7): a released issue has no agent assignee, so anyone may claim it next.
        issue.assignee_agent = None
        issue.completed_at = issue.cancelled_at = None  # leaving done/cancelled clears its stamp (ref §6)
        issue.save(update_fields=["status", "assignee_agent", *_clear_lock(issue), "completed_at", "cancelled_at",
                                  "updated_at"])
        activity_record(actor=actor, company_id=issue.company_id, action="issue.released", entity_type="issue",
                        entity_id=issue.pk, details={"previous": previous})
        changes = {"status": [previous["status"], IssueStatus.TODO]} if previous["status"] != IssueStatus.TODO else {}
        if previous["assigneeAgentId"]:  # as issue_update names it: the tracker's note names who let go
            changes["assignee_agent"] = [previous["assigneeAgentId"], None]
        events.issue_updated_atomic.send(sender=None, issue=issue, actor=actor, changes=changes)
        events.announce(events.issue_updated, issue=issue, actor=actor, changes=changes)
    return issue
