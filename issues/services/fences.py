"""Fences inside a company: which agent writes an issue may take (board users keep their role rules).

Two rules, checked in this order on a row the caller has locked (``select_for_update``):

1. **The checkout run** (:func:`ensure_owning_run`): an issue in progress is written only by the
   run that holds its checkout (or execution lock). Any other run — of another agent, or an
   earlier/later run of the same agent — gets 409 ``not_checkout_owner`` with the lock details
   (:func:`lock_details`). This is also the rule for case writes on a case's primary task.
   Writes to the agent's own in-progress issue are run-scoped (the header is required, ref
   §2.3); other agent writes need no header, and a header given is checked the same way.
   A client's own run id (a long-lived key's header naming no host run) is never a live host
   run, so, as upstream adopts a lock whose run is not live, the assignee writing under a client
   id passes while no live host run holds the issue (its own client-id lock, or a crashed run's),
   and under one of its host runs passes a client-id lock (:func:`_adoptable`).
2. **Ownership** (:func:`ensure_issue_owner`): an agent changes an issue (fields, status,
   assignee, documents, interactions, work products, blockers) only when no agent is assigned
   (upstream: unassigned work is anyone's), or the issue is assigned to it, was created by it, or
   is assigned to an agent below it in the chain of command (upstream's manager override).
   Another agent's issue is 403 ``not_your_issue`` (upstream's message). Commenting is not fenced
   by ownership: any agent of the company may comment (rule 1 still applies).

Creating an issue is not a change of an existing one: managers delegate by creating children
assigned to their reports.
"""
from __future__ import annotations

from issues.actors import Actor
from issues.choices import LIVE_RUN_STATUSES, IssueStatus
from issues.exceptions import Conflict, NotCheckoutOwner, NotYourIssue
from issues.models import Agent, HeartbeatRun, Issue
from issues.selectors import chain_of_command

def _sid(value):
    return str(value) if value else None


def lock_details(actor: Actor, issue: Issue) -> dict:
    """What a refused writer needs to know about the lock: who holds the issue, with which run.
    ``checkoutRunId`` is what the lock holds, a host run or a client's own run id (as upstream)."""
    holder_run_id = issue.checkout_run_id or issue.execution_run_id
    if holder_run_id:
        holder_agent_id = HeartbeatRun.objects.filter(pk=holder_run_id).values_list("agent_id", flat=True).first()
    else:  # a client-id lock is its assignee's
        holder_agent_id = issue.assignee_agent_id if issue.checkout_client_run_id else None
    return {
        "issueId": str(issue.pk),
        "status": issue.status,
        "assigneeAgentId": _sid(issue.assignee_agent_id),
        "checkoutRunId": _sid(issue.checkout_run_id or issue.checkout_client_run_id),
        "executionRunId": _sid(issue.execution_run_id),
        "holderAgentId": _sid(holder_agent_id),
        "actorAgentId": _sid(actor.agent.pk) if actor.is_agent else None,
        "actorRunId": _sid(actor.run_ref) if actor.is_agent else None,
    }


def held_by_live_run(issue: Issue) -> bool:
    """True while a live host run holds the issue's checkout or execution lock."""
    held = [pk for pk in (issue.checkout_run_id, issue.execution_run_id) if pk]
    return bool(held) and HeartbeatRun.objects.filter(pk__in=held, status__in=LIVE_RUN_STATUSES).exists()


def _adoptable(actor: Actor, run: HeartbeatRun | None, issue: Issue) -> bool:
    """The agent's own in-progress issue whose lock no live host run holds, written under a run id
    that is not the holder's: a client run id adopts it (any lock but a live one); a host run
    adopts a client-id lock (the client's id is never live). Host-run locks between host runs
    keep the strict rule above."""
    if issue.assignee_agent_id != actor.agent.pk:
        return False
    if run is None:
        return not held_by_live_run(issue)
    return issue.checkout_client_run_id is not None and not (issue.checkout_run_id or issue.execution_run_id)


def ensure_owning_run(actor: Actor, issue: Issue):
    """Agent writes to an in-progress issue need the run that checked it out; board users bypass."""
    if not actor.is_agent:
        return
    # Only a write to the agent's own in_progress issue is run-scoped (401 without the header,
    # ref §2.3); elsewhere a header is optional. None: no header, or the client's own run id.
    own_claim = issue.status == IssueStatus.IN_PROGRESS and issue.assignee_agent_id == actor.agent.pk
    run = actor.require_live_run() if own_claim else actor.named_live_run()
    if issue.status != IssueStatus.IN_PROGRESS:
        return
    if run is not None and run.pk in (issue.checkout_run_id, issue.execution_run_id):
        return
    if _adoptable(actor, run, issue):
        return
    details = lock_details(actor, issue)
    holder = details["holderAgentId"] or details["assigneeAgentId"]
    # Upstream's messages (ref §7): its own issue under another run, or another agent's checkout.
    message = ("Issue is checked out by another agent" if holder and holder != str(actor.agent.pk)
               else "Issue run ownership conflict")
    raise NotCheckoutOwner(message, details=details)


def manages(agent: Agent, other_agent_id) -> bool:
    """True when ``agent`` is above ``other_agent_id`` in its chain of command."""
    other = Agent.objects.filter(pk=other_agent_id).first() if other_agent_id else None
    return other is not None and any(boss.pk == agent.pk for boss in chain_of_command(other))


def agent_may_change(agent: Agent, issue: Issue) -> bool:
    return (issue.assignee_agent_id is None or issue.assignee_agent_id == agent.pk
            or issue.created_by_agent_id == agent.pk or manages(agent, issue.assignee_agent_id))


def ensure_issue_owner(actor: Actor, issue: Issue):
    """Agents change unassigned issues and their own (assigned, created, or their reports'); board
    users bypass."""
    if not actor.is_agent or agent_may_change(actor.agent, issue):
        return
    raise NotYourIssue(details={
        "issueId": str(issue.pk),
        "status": issue.status,
        "assigneeAgentId": _sid(issue.assignee_agent_id),
        "createdByAgentId": _sid(issue.created_by_agent_id),
        "actorAgentId": str(actor.agent.pk),
    })


def ensure_may_change(actor: Actor, issue: Issue):
    """Both fences for an agent change of ``issue`` (a locked row): the checkout run, then ownership."""
    ensure_owning_run(actor, issue)
    ensure_issue_owner(actor, issue)


def ensure_may_release(actor: Actor, issue: Issue):
    """Release gives back an issue, whatever its status (ref §7): an agent releases its own or an
    unassigned issue (else 409 "Only assignee can release issue"), and a lock only from the run
    holding it, unless no live run does (else 409 "Only checkout run can release issue"; a client
    run id is never live, as upstream adopts a stale lock). Both 409s carry the lock details."""
    if not actor.is_agent:
        return
    run = actor.require_live_run()
    if issue.assignee_user_id is not None or issue.assignee_agent_id not in (None, actor.agent.pk):
        raise Conflict("Only assignee can release issue", code="not_assignee", details=lock_details(actor, issue))
    held = [pk for pk in (issue.checkout_run_id, issue.execution_run_id) if pk and (run is None or pk != run.pk)]
    if held and HeartbeatRun.objects.filter(pk__in=held, status__in=LIVE_RUN_STATUSES).exists():
        raise NotCheckoutOwner("Only checkout run can release issue", details=lock_details(actor, issue))
