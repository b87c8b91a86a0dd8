"""Run bookkeeping the foundation needs: wakeups that yield a run id, and run endings that
release locks. The scheduler and adapters build on these functions."""
from __future__ import annotations

from django.db import IntegrityError, transaction
from django.utils import timezone

from issues import events
from issues.actors import SYSTEM, Actor
from issues.choices import (
    LIVE_RUN_STATUSES,
    TERMINAL_ISSUE_STATUSES,
    TERMINAL_RUN_STATUSES,
    AgentStatus,
    WakeSource,
    WakeStatus,
)
from issues.exceptions import InvalidInput, NotFound
from issues.models import Agent, Comment, HeartbeatRun, Issue, WakeupRequest

from .activity import activity_record


def _skip_reason(agent: Agent, issue: Issue | None) -> str:
    if agent.status in (AgentStatus.PAUSED, AgentStatus.TERMINATED):
        return f"agent_{agent.status}"
    if agent.budget_monthly_cents and agent.spent_monthly_cents >= agent.budget_monthly_cents:
        return "budget_exceeded"
    if issue is not None and issue.status in TERMINAL_ISSUE_STATUSES:
        return "issue_terminal"
    return ""


def agent_wakeup(*, actor: Actor, agent: Agent, source: str = WakeSource.ON_DEMAND, reason: str = "",
                 issue: Issue | None = None, idempotency_key: str | None = None,
                 comment_ids=()) -> WakeupRequest:
    """Record a wake and attach it to a run: a new queued run, or the live run it coalesces into."""
    if source not in WakeSource.values:
        raise InvalidInput(details={"source": [f"'{source}' is not one of {', '.join(WakeSource.values)}."]})
    actor.ensure_can_write(agent.company_id)
    comment_ids = [str(c) for c in dict.fromkeys(comment_ids)]
    if comment_ids and Comment.objects.filter(pk__in=comment_ids, company_id=agent.company_id).count() != len(comment_ids):
        raise NotFound("Comment not found.", details={"commentIds": ["Every comment must belong to this company."]})
    try:
        with transaction.atomic():
            # One wake at a time per agent, so two wakes can never both start a run.
            agent = Agent.objects.select_for_update().get(pk=agent.pk)
            if idempotency_key:
                existing = WakeupRequest.objects.filter(agent=agent, idempotency_key=idempotency_key).first()
                if existing:
                    return existing
            wake = WakeupRequest(
                company_id=agent.company_id, agent=agent, issue=issue, source=source, reason=reason,
                idempotency_key=idempotency_key or None, comment_ids=list(comment_ids),
                requested_by_agent=actor.agent, requested_by_user=actor.user if actor.is_board else None,
            )
            skip = _skip_reason(agent, issue)
            live = None if skip else (
                HeartbeatRun.objects.filter(agent=agent, issue=issue, status__in=LIVE_RUN_STATUSES)
                .order_by("created_at").first()
            )
            if skip:
                wake.status, wake.skip_reason = WakeStatus.SKIPPED, skip
            elif live:
                wake.status, wake.run = WakeStatus.COALESCED, live
                primary = WakeupRequest.objects.filter(run=live).exclude(status=WakeStatus.COALESCED).first()
                if primary:
                    primary.coalesced_count += 1
                    primary.comment_ids = primary.comment_ids + list(comment_ids)
                    primary.save(update_fields=["coalesced_count", "comment_ids", "updated_at"])
            else:
                wake.run = HeartbeatRun.objects.create(
                    company_id=agent.company_id, agent=agent, issue=issue, invocation_source=source,
                    wake_reason=reason,
                )
                wake.status = WakeStatus.CLAIMED
            wake.save()
            activity_record(actor=actor, company_id=agent.company_id, action="agent.wakeup_requested",
                            entity_type="agent", entity_id=agent.pk, run=wake.run,
                            details={"wakeupId": str(wake.pk), "status": wake.status, "source": source,
                                     "issueId": str(issue.pk) if issue else None, "skipReason": wake.skip_reason})
            return wake
    except IntegrityError:
        # A concurrent request with the same idempotency key won the insert.
        return WakeupRequest.objects.get(agent=agent, idempotency_key=idempotency_key)


def run_finish(*, run: HeartbeatRun, status: str, error: str = "", actor: Actor = SYSTEM) -> HeartbeatRun:
    """End a run; every issue lock it held is released in the same transaction."""
    if status not in TERMINAL_RUN_STATUSES:
        raise InvalidInput(details={"status": [f"'{status}' is not a terminal run status."]})
    now = timezone.now()
    with transaction.atomic():
        run = HeartbeatRun.objects.select_for_update().get(pk=run.pk)
        if run.status in TERMINAL_RUN_STATUSES:
            return run
        run.status, run.finished_at, run.error = status, now, error
        run.save(update_fields=["status", "finished_at", "error", "updated_at"])
        WakeupRequest.objects.filter(run=run, status=WakeStatus.CLAIMED).update(
            status=WakeStatus.COMPLETED, updated_at=now
        )
        released = list(Issue.objects.filter(checkout_run=run).values_list("pk", flat=True))
        released += Issue.objects.filter(execution_run=run).exclude(pk__in=released).values_list("pk", flat=True)
        Issue.objects.filter(checkout_run=run).update(checkout_run=None, updated_at=now)
        Issue.objects.filter(execution_run=run).update(execution_run=None, execution_locked_at=None, updated_at=now)
        activity_record(actor=actor, company_id=run.company_id, action="run.finished", entity_type="run",
                        entity_id=run.pk, run=run,
                        details={"status": status, "releasedIssueIds": [str(pk) for pk in released]})
        events.announce(events.run_finished, run=run)
    return run


def run_append_event(*, run_id, kind: str, message: str = "", data=None, liveness: bool = True):
    """Append to the run's log. Output counts as liveness (it refreshes last_heartbeat_at)."""
    from django.db.models import F

    from issues.models import RunEvent

    now = timezone.now()
    with transaction.atomic():
        updates = {"event_seq": F("event_seq") + 1}
        if liveness:
            updates["last_heartbeat_at"] = now
        HeartbeatRun.objects.filter(pk=run_id).update(**updates)
        seq = HeartbeatRun.objects.values_list("event_seq", flat=True).get(pk=run_id)
        return RunEvent.objects.create(run_id=run_id, seq=seq, kind=kind, message=message, data=data or {})


def run_mark_running(*, run: HeartbeatRun, owner: str = "", pid: int | None = None) -> HeartbeatRun:
    """The process started: record who owns it (only the owner may stop it) and its pid."""
    from issues.choices import RunStatus

    now = timezone.now()
    HeartbeatRun.objects.filter(pk=run.pk, status__in=LIVE_RUN_STATUSES).update(
        status=RunStatus.RUNNING, started_at=now, last_heartbeat_at=now, owner=owner, pid=pid, updated_at=now
    )
    run.refresh_from_db()
    return run
