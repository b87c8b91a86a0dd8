"""The Symphony profile (§9, §15.3) for links with ``runMode=symphony_compatible``.

The connector never spawns processes: an active external task makes the linked issue actionable
(backlog -> todo happens in the inbound apply through the normal issue service) and wakes its
assignee through the host's wakeup service, at most once per link per 60 s. Checkout is the claim.
When the external task leaves ``active`` the issue is no longer eligible for tracker-driven dispatch
(no connector wake is issued while the task is not active) and the host's issue-scoped run stop ends
a live run of that one issue; the agent itself is never paused."""
from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from connectors.choices import ErrorCategory, RunMode, StateCategory
from connectors.models import TaskLink
from issues.actors import SYSTEM
from issues.choices import LIVE_RUN_STATUSES, IssueStatus, RunStatus, WakeSource
from issues.models import HeartbeatRun, WakeupRequest

from . import links, run_modes
from .common import sync_error_record
from .task_packet import PacketError, packet_build

WAKE_DEBOUNCE = timedelta(seconds=60)


def is_symphony(link: TaskLink) -> bool:
    return link.run_mode == RunMode.SYMPHONY_COMPATIBLE


def dispatchable(link: TaskLink, issue) -> bool:
    """§15.3 issue_dispatchable: tracker says active, the issue is todo, assigned and unclaimed;
    §9.1.3: not blocked (no open blocker) and not awaiting approval (no pending or
    revision-requested approval linked to it). The cheap column checks go first."""
    from issues.selectors import issue_awaiting_approval, open_blockers

    return (link.external_state_category == StateCategory.ACTIVE and issue.status == IssueStatus.TODO
            and issue.assignee_agent_id is not None and issue.checkout_run_id is None
            and not open_blockers(issue) and not issue_awaiting_approval(issue))


def connector_wake(*, link: TaskLink, issue, key: str, task=None) -> WakeupRequest | None:
    """Wake the assignee for a tracker-driven cycle (debounced per link); the rendered task packet
    travels in the wake's context (a wake coalesced into a live run replaces that run's packet).
    ``task``: the ExternalTask just applied (Symphony's ``blocked_by``/``created_at`` come from
    it). A strict-template failure fails this dispatch with a health entry."""
    if not is_symphony(link) or not run_modes.connector_may_wake(link) or not dispatchable(link, issue):
        return None  # (an observer-sync link never starts work either: services/run_modes.py)
    now = timezone.now()
    row = TaskLink.objects.only("pk", "last_wake_at").get(pk=link.pk)
    if row.last_wake_at and row.last_wake_at + WAKE_DEBOUNCE > now:
        return None  # debounced: at most one connector wake per link per 60 s
    # Runs that started before this one; a queued run (e.g. the import's assignment wake) is the
    # one this wake coalesces into, not an earlier attempt.
    attempt = HeartbeatRun.objects.filter(issue=issue).exclude(status=RunStatus.QUEUED).count() + 1
    try:
        packet = packet_build(link=link, issue=issue, attempt=attempt, task=task)
    except PacketError as exc:
        sync_error_record(instance=link.instance, category=ErrorCategory.CONFIG, link=link,
                          message=f"Task packet for {link.external_key or link.external_task_id} could not be "
                                  f"rendered; dispatch skipped: {exc}", details={"eventKey": key})
        return None
    from issues.services.wakeups import agent_wakeup

    wake = agent_wakeup(actor=SYSTEM, agent=issue.assignee_agent, source=WakeSource.CONNECTOR,
                        reason=f"tracker: {link.external_key or link.external_task_id} is active", issue=issue,
                        idempotency_key=f"connector:{link.pk}:{key}"[:200],
                        context={"connectorLinkId": str(link.pk), "externalKey": link.external_key,
                                 "externalUrl": link.external_url, "taskPacket": packet.text,
                                 # §9.5: which workflow policy source/version produced this packet
                                 "workflowSource": packet.policy.source, "workflowVersion": packet.policy.version})
    TaskLink.objects.filter(pk=link.pk).update(last_wake_at=now)
    link.last_wake_at = now
    return wake


def tracker_run_active(issue) -> bool:
    return HeartbeatRun.objects.filter(issue=issue, status__in=LIVE_RUN_STATUSES).exists() or bool(
        issue.execution_run_id or issue.checkout_run_id)


def left_active(*, link: TaskLink, issue, new_category: str, actor_text: str, key: str) -> list:
    """§9.3: the external task left active -> released; stop this issue's live run (issue-scoped)."""
    if not is_symphony(link) or not tracker_run_active(issue):
        return []
    from issues.services.runs import issue_run_stop

    stopped = issue_run_stop(actor=SYSTEM, issue=issue)
    if stopped:
        links.note(issue, f"{actor_text} moved {link.external_key or link.external_task_id} out of active "
                          f"({new_category}). The run of this issue was stopped; no new tracker-driven work starts "
                          f"until the task is active again.", link=link, key=key, kind="symphony_release")
    return stopped


def dispatch_state(link: TaskLink) -> dict:
    """§9.3 / §12.3: claim / running / retry queued / released, observable per link."""
    issue = link.issue
    runs = HeartbeatRun.objects.filter(issue=issue, status__in=LIVE_RUN_STATUSES)
    running = runs.filter(status=RunStatus.RUNNING).exists()
    retry = runs.filter(status=RunStatus.SCHEDULED_RETRY).exists()
    if link.external_state_category != StateCategory.ACTIVE or issue.status in (
            IssueStatus.DONE, IssueStatus.CANCELLED, IssueStatus.IN_REVIEW, IssueStatus.BLOCKED):
        state = "released"
    elif running:
        state = "running"
    elif retry:
        state = "retry_queued"
    elif issue.checkout_run_id:
        state = "claimed"
    elif runs.exists():
        state = "queued"
    else:
        state = "eligible" if dispatchable(link, issue) else "idle"
    return {"state": state, "runMode": link.run_mode, "lastWakeAt": link.last_wake_at,
            "eligible": is_symphony(link) and dispatchable(link, issue)}
