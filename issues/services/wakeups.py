"""Wakeup requests: when an agent should run, and which run a wake belongs to.

A wake is recorded, then either skipped (with a reason), coalesced into the agent's live run for
the same issue, deferred while another run holds the issue's execution lock, or given a new
queued run that the dispatcher starts.
"""
from __future__ import annotations

from django.db import IntegrityError, transaction
from django.db.models import F

from issues.actors import SYSTEM, Actor
from issues.choices import (
    LIVE_RUN_STATUSES,
    TERMINAL_ISSUE_STATUSES,
    AgentStatus,
    IssueStatus,
    WakeSource,
    WakeStatus,
)
from issues.exceptions import InvalidInput, NotFound
from issues.models import Agent, Comment, HeartbeatRun, Issue, WakeupRequest
from issues.run_context import WAKE_REASONS_KEPT

from .activity import activity_record
from .kicks import kick_dispatcher

ACTIONABLE = (IssueStatus.TODO, IssueStatus.IN_PROGRESS, IssueStatus.IN_REVIEW)


def _skip_reason(agent: Agent, issue: Issue | None, source: str, comment_ids: list[str], reason: str) -> str:
    if agent.status in (AgentStatus.PAUSED, AgentStatus.TERMINATED):
        return f"agent_{agent.status}"
    if agent.budget_monthly_cents and agent.spent_monthly_cents >= agent.budget_monthly_cents:
        return "budget_exceeded"
    if issue is not None and issue.status in TERMINAL_ISSUE_STATUSES:
        return "issue_terminal"
    if comment_ids and not Comment.objects.filter(pk__in=comment_ids).exclude(author_agent=agent).exists():
        return "own_comment"  # an agent's own comment never wakes that same agent
    if source == WakeSource.TIMER and issue is None and not reason and not Issue.objects.filter(
        assignee_agent=agent, status__in=ACTIONABLE
    ).exists():
        return "idle"  # a heartbeat with nothing to do does not start the agent
    return ""


def _lock_holder(agent: Agent, issue: Issue | None) -> HeartbeatRun | None:
    """Another agent's live run holding the issue's execution lock (a reason to defer)."""
    if issue is None or issue.execution_run_id is None:
        return None
    holder = HeartbeatRun.objects.filter(pk=issue.execution_run_id, status__in=LIVE_RUN_STATUSES).first()
    return holder if holder is not None and holder.agent_id != agent.pk else None


def agent_wakeup(*, actor: Actor, agent: Agent, source: str = WakeSource.ON_DEMAND, reason: str = "",
                 issue: Issue | None = None, idempotency_key: str | None = None, comment_ids=(),
                 context: dict | None = None, run_fields: dict | None = None,
                 issue_is_current: bool = False) -> WakeupRequest:
    """Record a wake and attach it to a run. ``run_fields`` seeds a new run (continuations, retries).
    ``issue_is_current``: the caller wrote the issue row in this transaction (no re-read needed)."""
    if source not in WakeSource.values:
        raise InvalidInput(details={"source": [f"'{source}' is not one of {', '.join(WakeSource.values)}."]})
    actor.ensure_can_write(agent.company_id)
    if actor.is_agent and actor.agent.pk != agent.pk:
        actor.require_live_run()  # waking another agent is a mutation made from a run
    comment_ids = [str(c) for c in dict.fromkeys(comment_ids)]
    if comment_ids and Comment.objects.filter(pk__in=comment_ids, company_id=agent.company_id).count() != len(
        comment_ids
    ):
        raise NotFound("Comment not found.", details={"commentIds": ["Every comment must belong to this company."]})
    try:
        with transaction.atomic():
            # One wake at a time per agent, so two wakes can never both start a run.
            agent = Agent.objects.select_for_update().get(pk=agent.pk)
            if idempotency_key:
                existing = WakeupRequest.objects.filter(agent=agent, idempotency_key=idempotency_key).first()
                if existing:
                    return existing
            if issue is not None and not issue_is_current:
                issue = Issue.objects.get(pk=issue.pk)
            wake = WakeupRequest(
                company_id=agent.company_id, agent=agent, issue=issue, source=source, reason=reason,
                idempotency_key=idempotency_key or None, comment_ids=comment_ids, context=context or {},
                requested_by_agent=actor.agent, requested_by_user=actor.user if actor.is_board else None,
            )
            _place(wake, agent, issue, source, comment_ids, reason, run_fields or {})
            wake.save()
            activity_record(actor=actor, company_id=agent.company_id, action="agent.wakeup_requested",
                            entity_type="agent", entity_id=agent.pk, run=wake.run,
                            details={"wakeupId": str(wake.pk), "status": wake.status, "source": source,
                                     "issueId": str(issue.pk) if issue else None, "skipReason": wake.skip_reason})
            if wake.status == WakeStatus.CLAIMED:
                kick_dispatcher()
            return wake
    except IntegrityError:
        if not idempotency_key:
            raise
        # A concurrent request with the same idempotency key won the insert.
        return WakeupRequest.objects.get(agent=agent, idempotency_key=idempotency_key)


def _place(wake, agent, issue, source, comment_ids, reason, run_fields):
    skip = _skip_reason(agent, issue, source, comment_ids, reason)
    if skip:
        wake.status, wake.skip_reason = WakeStatus.SKIPPED, skip
        return
    live = (
        HeartbeatRun.objects.filter(agent=agent, issue=issue, status__in=LIVE_RUN_STATUSES)
        .order_by("created_at").first()
    )
    if live is not None and not run_fields.get("source_run"):
        wake.status, wake.run = WakeStatus.COALESCED, live
        _carry_into(live, comment_ids, reason, wake.context or {})
        return
    holder = _lock_holder(agent, issue)
    if holder is not None:
        wake.status, wake.deferred_for_run = WakeStatus.DEFERRED_ISSUE_EXECUTION, holder
        return
    wake.run = HeartbeatRun.objects.create(
        company_id=agent.company_id, agent=agent, issue=issue, invocation_source=source, wake_reason=reason,
        adapter_type=agent.adapter_type,
        context={**wake.context, "commentIds": comment_ids, "wakeReasons": [reason] if reason else []},
        **run_fields,
    )
    wake.status = WakeStatus.CLAIMED


def _carry_into(run: HeartbeatRun, comment_ids: list[str], reason: str, context: dict):
    """A coalesced wake adds its count and comment ids to the run's primary wake, and its reason
    and context to the run, newest first in line: the run starts with (or reads next) the newest
    reason, packet, approval, ... At most one UPDATE of the run row, only when something changed."""
    primaries = WakeupRequest.objects.filter(run=run).exclude(status=WakeStatus.COALESCED)
    if not comment_ids:
        primaries.update(coalesced_count=F("coalesced_count") + 1)  # one statement on the hot path
    else:
        primary = primaries.order_by("created_at").first()
        if primary:
            primary.coalesced_count += 1
            primary.comment_ids = primary.comment_ids + [c for c in comment_ids if c not in primary.comment_ids]
            primary.save(update_fields=["coalesced_count", "comment_ids", "updated_at"])
    merged = _merged_context(run, comment_ids, reason, context)
    changed = ["context"] if merged != run.context else []
    if reason and reason != run.wake_reason:
        run.wake_reason = reason
        changed.append("wake_reason")
    if changed:
        run.context = merged
        run.save(update_fields=[*changed, "updated_at"])


def _merged_context(run: HeartbeatRun, comment_ids: list[str], reason: str, context: dict) -> dict:
    """The run's context after a coalesced wake: the wake's keys win; comment ids are a union in
    arrival order; ``wakeReasons`` lists reasons oldest first (the newest WAKE_REASONS_KEPT)."""
    current = run.context or {}
    merged = {**current, **{k: v for k, v in context.items() if k not in ("commentIds", "wakeReasons")}}
    if comment_ids:
        known = current.get("commentIds", [])
        merged["commentIds"] = known + [c for c in comment_ids if c not in known]
        if "wakeCommentId" not in context and "wakeCommentId" in current:
            merged["wakeCommentId"] = comment_ids[-1]  # the newest wake's comment, not an older one
    if reason:
        reasons = list(current.get("wakeReasons") or ([run.wake_reason] if run.wake_reason else []))
        merged["wakeReasons"] = (reasons + [reason])[-WAKE_REASONS_KEPT:]
    return merged


def wakeups_promote_deferred(*, run: HeartbeatRun) -> int:
    """The run holding an issue's lock ended: its deferred wakes are placed again, in order."""
    promoted = 0
    for wake_id in WakeupRequest.objects.filter(
        deferred_for_run=run, status=WakeStatus.DEFERRED_ISSUE_EXECUTION
    ).order_by("created_at").values_list("pk", flat=True):
        with transaction.atomic():
            wake = WakeupRequest.objects.select_for_update().get(pk=wake_id)
            if wake.status != WakeStatus.DEFERRED_ISSUE_EXECUTION:
                continue
            agent = Agent.objects.select_for_update().get(pk=wake.agent_id)
            issue = Issue.objects.get(pk=wake.issue_id) if wake.issue_id else None
            wake.deferred_for_run = None
            _place(wake, agent, issue, wake.source, wake.comment_ids, wake.reason, {})
            wake.save()
            activity_record(actor=SYSTEM, company_id=wake.company_id, action="agent.wakeup_promoted",
                            entity_type="agent", entity_id=agent.pk, run=wake.run,
                            details={"wakeupId": str(wake.pk), "status": wake.status, "afterRunId": str(run.pk)})
            if wake.status == WakeStatus.CLAIMED:
                kick_dispatcher()
            promoted += 1
    return promoted


def wake_assignee(*, issue: Issue, source: str, reason: str, comment_ids=(), author_agent_id=None,
                  idempotency_key: str | None = None, context: dict | None = None) -> WakeupRequest | None:
    """Wake the assigned agent of an actionable issue (assignment, comments, resolved blockers,
    finished children); an agent's own comments never wake it."""
    if issue.assignee_agent_id is None or issue.status not in ACTIONABLE or author_agent_id == issue.assignee_agent_id:
        return None
    # agent_wakeup locks and re-reads the agent row itself; this only names it.
    agent = Agent(pk=issue.assignee_agent_id, company_id=issue.company_id)
    return agent_wakeup(actor=SYSTEM, agent=agent, source=source, reason=reason, issue=issue,
                        comment_ids=comment_ids, idempotency_key=idempotency_key, context=context,
                        issue_is_current=True)
