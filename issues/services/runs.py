"""Heartbeat runs: start, liveness, usage and budget, stop, finish (locks released in the same
transaction), liveness continuations, retries with backoff (both for the issue's current
assignee), and stale-run abandonment. Run knobs come from .run_policy."""
from __future__ import annotations

import os
import signal
import socket
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import BigIntegerField, ExpressionWrapper, F, Q, Value
from django.db.models.functions import Coalesce, Least
from django.utils import timezone

from issues import events
from issues.actors import SYSTEM, Actor
from issues.choices import (
    CONTINUABLE_LIVENESS,
    LIVE_RUN_STATUSES,
    TERMINAL_RUN_STATUSES,
    AuthorType,
    IssueStatus,
    RunEventKind,
    RunLiveness,
    RunResultStatus,
    RunStatus,
    WakeSource,
    WakeStatus,
)
from issues.exceptions import Conflict, Forbidden, InvalidInput, NotCheckoutOwner
from issues.models import ActivityLog, Agent, HeartbeatRun, Issue, Project, RunEvent, WakeupRequest
from paperclip.core import rows

from .activity import activity_record, activity_row
from .fences import lock_details
from .run_policy import KNOBS, run_policy_for
from .start_rules import start_refusal

# Runs whose issue is still worth working on (continuations and retries stop otherwise).
ACTIVE_ISSUE_STATUSES = (IssueStatus.TODO, IssueStatus.IN_PROGRESS, IssueStatus.IN_REVIEW, IssueStatus.BACKLOG)
PROGRESS_ACTIONS = ("comment.created", "document.revised", "issue.updated", "issue.created", "interaction.created",
                    "work_product.created")
RETRYABLE = (RunStatus.TIMED_OUT, RunStatus.INTERRUPTED)
# A reported result that ends the chain: no retry, no continuation ("failed" is retried instead).
FINAL_RESULTS = (RunResultStatus.DONE, RunResultStatus.HANDOFF, RunResultStatus.ABORTED)
RETRY_REASON = "process_lost_retry"  # upstream's wake reason for a retry
# Wakes that will still start a run for the issue.
PENDING_WAKE_STATUSES = (WakeStatus.QUEUED, WakeStatus.DEFERRED_ISSUE_EXECUTION)


def this_owner() -> str:
    """Identifies the process that starts agent processes; only it may kill them."""
    return f"{socket.gethostname()}:{os.getpid()}"


def retry_delay(attempt: int) -> timedelta:
    """Backoff before retry ``attempt`` (1-based): min(base × 2^(attempt−1), cap)."""
    base, cap = settings.PAPERCLIP["RUN_RETRY_BASE_SECONDS"], settings.PAPERCLIP["RUN_RETRY_MAX_BACKOFF_SECONDS"]
    return timedelta(seconds=min(base * 2 ** (attempt - 1), cap))


# --- while running ---------------------------------------------------------------------------
def run_append_event(*, run_id, kind: str, message: str = "", data=None, liveness: bool = True,
                     activity: bool | None = None) -> RunEvent:
    """Append to the run's log. Output counts as liveness (last_heartbeat_at, read by the stale
    sweep) and as activity (last_activity_at, read by stall detection). ``activity`` defaults to
    ``liveness`` except for ``heartbeat`` events: the adapter's "pid alive" beats prove the
    process exists, not that it works."""
    if activity is None:
        activity = liveness and kind != RunEventKind.HEARTBEAT
    now = timezone.now()
    with transaction.atomic():
        updates = {"event_seq": F("event_seq") + 1}
        if liveness:
            updates["last_heartbeat_at"] = now
        if activity:
            updates["last_activity_at"] = now
        HeartbeatRun.objects.filter(pk=run_id).update(**updates)
        seq = HeartbeatRun.objects.values_list("event_seq", flat=True).get(pk=run_id)
        return RunEvent.objects.create(run_id=run_id, seq=seq, kind=kind, message=message, data=data or {})


# run id -> when this process last tried to write its activity: a throttled request skips the
# statement entirely (each process still writes at most once per run per throttle window).
_TOUCHED: dict = {}
_TOUCHED_MAX = 10_000


def run_touch_activity(*, run_id, agent_id, now=None) -> bool:
    """An agent's API request made from a run is that run's liveness and activity. One
    conditional UPDATE (no read first), at most one write per run per
    RUN_ACTIVITY_THROTTLE_SECONDS; nothing for another agent's run or an ended one. True when written."""
    now = now or timezone.now()
    throttle = timedelta(seconds=settings.PAPERCLIP["RUN_ACTIVITY_THROTTLE_SECONDS"])
    last = _TOUCHED.get(run_id)
    if last is not None and last <= now < last + throttle:
        return False
    written = bool(HeartbeatRun.objects.filter(pk=run_id, agent_id=agent_id, status__in=LIVE_RUN_STATUSES).filter(
        Q(last_activity_at__isnull=True) | Q(last_activity_at__lt=now - throttle)
    ).update(last_heartbeat_at=now, last_activity_at=now))
    # Remembered whether or not a row changed: an id that is no live host run of this agent (a
    # long-lived key's client run id, an ended run) is not asked about again within the window.
    if len(_TOUCHED) >= _TOUCHED_MAX:
        _TOUCHED.clear()
    _TOUCHED[run_id] = now
    return written


def run_mark_running(*, run: HeartbeatRun, owner: str = "", pid: int | None = None) -> HeartbeatRun:
    """The process started: record who owns it (only the owner may kill it) and its pid."""
    now = timezone.now()
    HeartbeatRun.objects.filter(pk=run.pk, status__in=LIVE_RUN_STATUSES).update(
        status=RunStatus.RUNNING, started_at=Coalesce("started_at", now), last_heartbeat_at=now, owner=owner,
        pid=pid, updated_at=now,
    )
    Agent.objects.filter(pk=run.agent_id).update(last_heartbeat_at=now)  # the agent's lastHeartbeatAt
    run.refresh_from_db()
    return run


def run_heartbeat(*, actor: Actor, run: HeartbeatRun, liveness: str | None = None, reason: str = "",
                  usage: dict | None = None) -> HeartbeatRun:
    """A worker heartbeat: refreshes liveness, records reported liveness and cumulative usage. The
    first heartbeat of an external worker starts its run, under the dispatcher's rules
    (start_rules): a paused, terminated or over-budget agent's run is cancelled instead (409
    ``run_not_live`` naming why), and a scheduled retry does not start before it is due (409
    ``run_not_due``)."""
    if actor.is_agent and actor.agent.pk != run.agent_id:
        raise Forbidden("Agents heartbeat their own runs only.", code="run_mismatch")
    actor.ensure_can_write(run.company_id)
    if liveness and liveness not in RunLiveness.values:
        raise InvalidInput(details={"liveness": [f"Must be one of {', '.join(RunLiveness.values)}."]})
    now = timezone.now()
    refusal = None
    with transaction.atomic():
        # A run not yet running may start: its agent is locked first, the order the dispatcher locks
        # them in (no deadlock with a pass). The caller's row tells; a run never goes back to queued.
        starting = run.status != RunStatus.RUNNING
        agent = Agent.objects.select_for_update(no_key=True).get(pk=run.agent_id) if starting else None
        run = HeartbeatRun.objects.select_for_update().get(pk=run.pk)
        if run.status not in LIVE_RUN_STATUSES:
            raise Conflict("The run has ended.", code="run_not_live", details={"status": run.status})
        if run.status == RunStatus.SCHEDULED_RETRY and run.scheduled_for and run.scheduled_for > now:
            raise Conflict("The run is a retry that is not due yet.", code="run_not_due",
                           details={"status": run.status, "scheduledFor": run.scheduled_for.isoformat()})
        if run.status != RunStatus.RUNNING and agent is not None:
            refusal = start_refusal(agent)
        if refusal is None:
            run.last_heartbeat_at = run.last_activity_at = now
            if run.status != RunStatus.RUNNING:
                run.status, run.started_at = RunStatus.RUNNING, run.started_at or now
                activity_record(actor=SYSTEM, company_id=run.company_id, action="run.started", entity_type="run",
                                entity_id=run.pk, details={"owner": "heartbeat"})
            if liveness:
                run.liveness, run.liveness_reason = liveness, reason[:300]
            run.save()
            stopped = _record_usage(run, usage) if usage else False
    if refusal is not None:  # as the dispatcher cancels it
        run_finish(run=run, status=RunStatus.CANCELLED, error=refusal)
        raise Conflict("The run has ended.", code="run_not_live",
                       details={"status": RunStatus.CANCELLED, "reason": refusal})
    Agent.objects.filter(pk=run.agent_id).update(last_heartbeat_at=now)  # outside the run lock
    if stopped:
        _finish_stopped([run])
        run.refresh_from_db()
    return run


# Usage and spend live in 64-bit columns; running totals stop at the top instead of overflowing.
USAGE_MAX = 2**63 - 1


def _saturating_add(column: str, delta: int):
    """``column + delta`` capped at USAGE_MAX, computed so the database never overflows:
    ``LEAST(column, MAX - delta) + delta`` (``0 <= delta <= MAX``)."""
    big = BigIntegerField()
    return ExpressionWrapper(Least(F(column), Value(USAGE_MAX - delta, output_field=big), output_field=big)
                             + Value(delta, output_field=big), output_field=big)


def _record_usage(run: HeartbeatRun, usage: dict) -> bool:
    """Usage is reported as the run's running totals, so a repeated report adds nothing twice.
    The delta is one row of the cost ledger (services.costs, the same ledger as reported cost
    events) and is added once to the spend. True when the run was stopped and must be ended by the caller."""
    totals = {name: min(max(int(usage.get(key) or 0), getattr(run, name)), USAGE_MAX)
              for key, name in (("inputTokens", "input_tokens"), ("outputTokens", "output_tokens"),
                                ("costCents", "cost_cents"))}
    delta = {name: totals[name] - getattr(run, name) for name in totals}
    HeartbeatRun.objects.filter(pk=run.pk).update(**totals)
    for name, value in totals.items():
        setattr(run, name, value)
    if not any(delta.values()):
        return False
    from .costs import RUN_PROVIDER, ledger_record

    _, budget_stop = ledger_record(
        company_id=run.company_id, agent_id=run.agent_id, cost_cents=delta["cost_cents"], provider=RUN_PROVIDER,
        biller=run.adapter_type or RUN_PROVIDER, input_tokens=delta["input_tokens"],
        output_tokens=delta["output_tokens"], run=run, issue_id=run.issue_id)
    # Hard stop: this run is stopped now, not only the next one refused.
    return _request_stop(run, budget_stop) if budget_stop else False


def run_usage_add(run: HeartbeatRun, *, input_tokens: int = 0, output_tokens: int = 0, cost_cents: int = 0):
    """Add a usage *delta* (not running totals, unlike _record_usage) to the run's totals, each
    saturating at USAGE_MAX, in one UPDATE; the in-memory row follows. The caller writes the ledger
    row (costs.ledger_record) and applies the budget stop (the PRP usage projection, issues.runner)."""
    delta = {name: min(max(int(value), 0), USAGE_MAX) for name, value in
             (("input_tokens", input_tokens), ("output_tokens", output_tokens), ("cost_cents", cost_cents))}
    delta = {name: value for name, value in delta.items() if value}
    if not delta:
        return
    HeartbeatRun.objects.filter(pk=run.pk).update(**{name: _saturating_add(name, v) for name, v in delta.items()})
    for name, value in delta.items():
        setattr(run, name, min(getattr(run, name) + value, USAGE_MAX))


# --- stopping ---------------------------------------------------------------------------------
# Adapters that stop a run over a channel of their own, by adapter_type: ``port(run, reason) -> bool``
# is called with the run row locked and returns True when it took the stop over (the run then
# ends when the adapter confirms, not at once). issues.runner registers "runner" in
# IssuesConfig.ready: services never import the layer above them.
STOP_PORTS: dict = {}


def _request_stop(run: HeartbeatRun, reason: str) -> bool:
    """Mark the stop; the process adapter polling this row kills its process group. True when
    there is no process to signal (queued, or an external agent): the caller ends it directly."""
    now = timezone.now()
    HeartbeatRun.objects.filter(pk=run.pk, stop_requested_at__isnull=True).update(
        stop_requested_at=now, stop_reason=reason, updated_at=now)
    run.stop_requested_at, run.stop_reason = run.stop_requested_at or now, run.stop_reason or reason
    port = STOP_PORTS.get(run.adapter_type)
    if port is not None and port(run, reason):
        return False
    return run.status != RunStatus.RUNNING or not run.pid


def _finish_stopped(runs_to_end):
    for run in runs_to_end:
        run_finish(run=run, status=RunStatus.CANCELLED, error=f"stopped: {run.stop_reason}")


def issue_run_stop(*, actor: Actor, issue: Issue) -> list[HeartbeatRun]:
    """Stop the live runs of this one issue; the agent is never paused. An agent stops only its
    own runs: another agent's live run on the issue is a 409 with the lock details."""
    actor.ensure_can_write(issue.company_id)
    if actor.is_agent:
        actor.require_live_run()
    to_end = []
    with transaction.atomic():
        runs = list(HeartbeatRun.objects.select_for_update().filter(issue=issue, status__in=LIVE_RUN_STATUSES))
        if issue.execution_run_id and all(r.pk != issue.execution_run_id for r in runs):
            runs += list(HeartbeatRun.objects.select_for_update().filter(
                pk=issue.execution_run_id, status__in=LIVE_RUN_STATUSES))
        if actor.is_agent and any(run.agent_id != actor.agent.pk for run in runs):
            # An agent stops its own runs only; another agent's run is stopped by the board.
            raise NotCheckoutOwner("Another agent's run works this issue; a board user can stop it.",
                                   details=lock_details(actor, issue))
        for run in runs:
            if _request_stop(run, "issue_stop"):
                to_end.append(run)
            activity_record(actor=actor, company_id=issue.company_id, action="run.stop_requested",
                            entity_type="run", entity_id=run.pk, run=run, details={"issueId": str(issue.pk)})
    _finish_stopped(to_end)
    return [HeartbeatRun.objects.get(pk=run.pk) for run in runs]


def run_cancel(*, actor: Actor, run: HeartbeatRun, reason: str = "board_cancel") -> HeartbeatRun:
    """The board stops one run (upstream ``POST /heartbeat-runs/{id}/cancel``; also used when an
    agent is paused or terminated). A queued run, or one without a process here, ends cancelled
    now; a running process is killed by its adapter, which polls the stop request, and the run
    then ends cancelled. An ended run is returned as it is."""
    actor.ensure_board()
    actor.ensure_can_write(run.company_id)
    with transaction.atomic():
        run = HeartbeatRun.objects.select_for_update().get(pk=run.pk)
        if run.status not in LIVE_RUN_STATUSES:
            return run
        end_now = _request_stop(run, reason)
        activity_record(actor=actor, company_id=run.company_id, action="heartbeat.cancelled", entity_type="run",
                        entity_id=run.pk, run=run, details={"reason": reason, "agentId": str(run.agent_id)})
    if end_now:
        _finish_stopped([run])
    return HeartbeatRun.objects.get(pk=run.pk)


def kill_process_group(pid: int):
    try:
        os.killpg(os.getpgid(pid), signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# --- finishing ----------------------------------------------------------------------------------
def _derive_liveness(run: HeartbeatRun, status: str) -> tuple[str, str]:
    if status != RunStatus.SUCCEEDED:
        return RunLiveness.FAILED, f"run {status}"
    issue = Issue.objects.filter(pk=run.issue_id).only("status").first() if run.issue_id else None
    if issue is not None and issue.status in (IssueStatus.DONE, IssueStatus.IN_REVIEW, IssueStatus.CANCELLED):
        return RunLiveness.COMPLETED, f"issue {issue.status}"
    if issue is not None and issue.status == IssueStatus.BLOCKED:
        return RunLiveness.BLOCKED, "issue blocked"
    if ActivityLog.objects.filter(run=run, action__in=PROGRESS_ACTIONS).exists():
        return RunLiveness.ADVANCED, "durable progress recorded"
    return RunLiveness.EMPTY_RESPONSE, "no durable progress"


def run_finish(*, run: HeartbeatRun, status: str, error: str = "", exit_code: int | None = None,
               liveness: str = "", liveness_reason: str = "", actor: Actor = SYSTEM) -> HeartbeatRun:
    """End a run. Every issue lock it held is released in the same transaction; then deferred
    wakes are promoted, and a continuation or a retry is scheduled when the rules allow."""
    if status not in TERMINAL_RUN_STATUSES:
        raise InvalidInput(details={"status": [f"'{status}' is not a terminal run status."]})
    now = timezone.now()
    with transaction.atomic():
        run = HeartbeatRun.objects.select_for_update().get(pk=run.pk)
        if run.status in TERMINAL_RUN_STATUSES:
            return run
        from .wakeups import wakeups_fold_locked

        wakeups_fold_locked(run)  # the run's history holds every wake that joined it
        if not liveness:
            liveness, liveness_reason = (run.liveness, run.liveness_reason) if (
                run.liveness and status == RunStatus.SUCCEEDED) else _derive_liveness(run, status)
        run.status, run.finished_at, run.error, run.exit_code = status, now, error[:4000], exit_code
        run.liveness, run.liveness_reason = liveness, (liveness_reason or "")[:300]
        run.save()
        WakeupRequest.objects.filter(run=run, status__in=(WakeStatus.CLAIMED, WakeStatus.COALESCED)).update(
            status=WakeStatus.COMPLETED if status == RunStatus.SUCCEEDED else WakeStatus.FAILED, updated_at=now
        )
        released = list(Issue.objects.filter(checkout_run=run).values_list("pk", flat=True))
        released += Issue.objects.filter(execution_run=run).exclude(pk__in=released).values_list("pk", flat=True)
        Issue.objects.filter(checkout_run=run).update(checkout_run=None, updated_at=now)
        Issue.objects.filter(execution_run=run).update(execution_run=None, execution_locked_at=None, updated_at=now)
        run.api_keys.filter(revoked_at__isnull=True).update(revoked_at=now)  # an earlier revocation keeps its time
        activity_record(actor=actor, company_id=run.company_id, action="run.finished", entity_type="run",
                        entity_id=run.pk, run=run,
                        details={"status": status, "liveness": liveness, "error": error[:500],
                                 "releasedIssueIds": [str(pk) for pk in released]})
        events.announce(events.run_finished, run=run)
        events.run_finished_atomic.send(sender=None, run=run)
    Agent.objects.filter(pk=run.agent_id).update(last_heartbeat_at=now)  # outside the run lock
    from .wakeups import wakeups_promote_deferred

    wakeups_promote_deferred(run=run)
    _follow_up(run)
    return run


def _chain_root(run: HeartbeatRun):
    return run.source_run_id or run.pk


def _follow_up(run: HeartbeatRun):
    """At most one follow-up: a retry (process loss, or the agent reported ``failed``), else a
    liveness continuation, for the issue's current assignee (``_follow_up_agent``). A reported
    ``done``, ``handoff`` or ``aborted`` ends the chain."""
    retry = _retry_warranted(run)
    if run.issue_id is None or not (retry or _continuation_warranted(run)):
        return
    issue = Issue.objects.select_related("project").get(pk=run.issue_id)
    if issue.status not in ACTIVE_ISSUE_STATUSES:
        return
    agent = _follow_up_agent(run, issue, "retry" if retry else "continuation")
    if agent is None:
        return
    policy = run_policy_for(agent=agent, issue=issue)
    if retry:
        _schedule_retry(run, agent, issue, _retry_attempt(run, policy.max_retries))
    else:
        _continue(run, agent, issue, policy.max_turns)


def _retry_warranted(run: HeartbeatRun) -> bool:
    """Process loss (timed out, stalled, interrupted) or a reported ``failed``; never after a stop
    or a final report. A non-zero exit the agent did not report as failed is not retried."""
    if run.stop_reason or run.result_status in FINAL_RESULTS:
        return False
    return run.status in RETRYABLE or (run.result_status == RunResultStatus.FAILED
                                       and run.status != RunStatus.CANCELLED)


def _continuation_warranted(run: HeartbeatRun) -> bool:
    return not run.stop_reason and not run.result_status and run.liveness in CONTINUABLE_LIVENESS


def _retry_attempt(run: HeartbeatRun, max_retries: int) -> int | None:
    attempt = run.retry_attempt + 1
    return attempt if attempt <= max_retries else None


def next_retry_attempt(run: HeartbeatRun, agent: Agent) -> int | None:
    """The attempt number a retry of this ended run gets, or None when it is not retried
    (``_retry_warranted``, within the policy's max_retries)."""
    if not _retry_warranted(run):
        return None
    return _retry_attempt(run, run_policy_for(agent=agent, issue=run.issue if run.issue_id else None).max_retries)


def _assignment_lost(run: HeartbeatRun, issue: Issue) -> bool:
    """Did the run's agent stop being the issue's assignee after the run was created? The issue's
    audit trail has every assignee change: an update's ``changes.assignee_agent = [old, new]``, a
    release's ``previous.assigneeAgentId`` (a release leaves no agent assignee)."""
    mine = str(run.agent_id)
    for action, details in ActivityLog.objects.filter(
            entity_type="issue", entity_id=str(issue.pk), action__in=("issue.updated", "issue.released"),
            created_at__gte=run.created_at).values_list("action", "details"):
        details = details or {}
        if action == "issue.released":
            before = (details.get("previous") or {}).get("assigneeAgentId")
        else:
            change = (details.get("changes") or {}).get("assignee_agent")
            before = change[0] if isinstance(change, list) and change else None
        if before == mine:
            return True
    return False


def _follow_up_agent(run: HeartbeatRun, issue: Issue, kind: str) -> Agent | None:
    """Who a follow-up wakes. The run's agent while it holds the assignment, or when it never did
    (a mentioned reviewer's run follows itself up). When the assignment moved away during the run
    (the board, a case handoff) the old agent is never woken: the new assignee gets the follow-up
    unless it already has the issue in hand (a live run or a pending wake); an issue without an
    agent assignee gets none. A dropped follow-up is recorded with its reason."""
    if issue.assignee_agent_id == run.agent_id or not _assignment_lost(run, issue):
        return Agent.objects.get(pk=run.agent_id)
    assignee_id = issue.assignee_agent_id
    if assignee_id is None:
        reason = "assigned_to_user" if issue.assignee_user_id else "unassigned"
    elif (HeartbeatRun.objects.filter(agent_id=assignee_id, issue=issue, status__in=LIVE_RUN_STATUSES).exists()
          or WakeupRequest.objects.filter(agent_id=assignee_id, issue=issue,
                                          status__in=PENDING_WAKE_STATUSES).exists()):
        reason = "reassigned"
    else:
        reason = ""
    details = {"followUp": kind, "previousAgentId": str(run.agent_id),
               "assigneeAgentId": str(assignee_id) if assignee_id else None}
    activity_record(actor=SYSTEM, company_id=run.company_id,
                    action="run.followup_dropped" if reason else "run.followup_rerouted", entity_type="run",
                    entity_id=run.pk, run=run, details={"reason": reason, **details} if reason else details)
    return None if reason else Agent.objects.get(pk=assignee_id)


def _schedule_retry(run, agent, issue, attempt: int | None):
    from .wakeups import agent_wakeup

    if attempt is None:
        return
    due = timezone.now() + retry_delay(attempt)
    agent_wakeup(actor=SYSTEM, agent=agent, source=WakeSource.AUTOMATION, reason=RETRY_REASON, issue=issue,
                 context={"retryAttempt": attempt, "sourceRunId": str(run.pk), "previousStatus": run.status,
                          "resultStatus": run.result_status},
                 run_fields={"status": RunStatus.SCHEDULED_RETRY, "scheduled_for": due,
                             "source_run_id": _chain_root(run), "retry_attempt": attempt,
                             "continuation_attempt": run.continuation_attempt})


def _continue(run, agent, issue, limit: int):
    from .thread import comment_create
    from .wakeups import agent_wakeup

    attempt = run.continuation_attempt + 1
    if attempt > limit:
        comment_create(
            actor=SYSTEM, issue=issue, author_type=AuthorType.SYSTEM,
            body=(f"Automatic continuations are exhausted ({limit} of {limit}). The last run ended with liveness "
                  f"`{run.liveness}` ({run.liveness_reason or 'no reason given'}). A human or manager should "
                  "clarify the task, mark it blocked, or assign follow-up work."),
            provenance={"kind": "liveness_continuations_exhausted", "runId": str(run.pk)},
        )
        return
    agent_wakeup(
        actor=SYSTEM, agent=agent, source=WakeSource.AUTOMATION, reason="liveness_continuation", issue=issue,
        context={"continuationAttempt": attempt, "sourceRunId": str(run.pk), "liveness": run.liveness,
                 "livenessReason": run.liveness_reason,
                 "instruction": "Continue the task with a concrete action; do not stop at a plan."},
        run_fields={"source_run_id": _chain_root(run), "continuation_attempt": attempt},
    )


# --- abandonment --------------------------------------------------------------------------------
def runs_reap_stale(*, now=None, owner: str | None = None) -> list[HeartbeatRun]:
    """Runs whose heartbeat went stale (each by its own policy's heartbeat_stale_seconds) are
    abandoned: timed out, lock released, retried with backoff. A process is killed only when
    ``owner`` (this process) started it. Queued runs are never swept (they have not started)."""
    now = now or timezone.now()
    running = HeartbeatRun.objects.filter(status=RunStatus.RUNNING)
    cutoff = now - timedelta(seconds=_smallest_stale_seconds(running))
    candidates = (running.annotate(seen=Coalesce("last_heartbeat_at", "started_at", "created_at"))
                  .filter(seen__lt=cutoff).select_related("agent", "issue", "issue__project"))
    reaped = []
    for run in candidates:
        stale_after = run_policy_for(agent=run.agent, issue=run.issue).heartbeat_stale_seconds
        if run.seen >= now - timedelta(seconds=stale_after):
            continue
        if run.pid and ((owner and run.owner == owner) or _orphaned_here(run)):
            kill_process_group(run.pid)
        reaped.append(run_finish(run=run, status=RunStatus.TIMED_OUT,
                                 error=f"heartbeat stale since {(run.last_heartbeat_at or run.started_at)}"))
    return reaped


def _smallest_stale_seconds(running) -> int:
    """The shortest stale threshold a running run may have, so one SQL filter finds every
    candidate (each is then checked by its own policy): the default, an agent's setting, and each
    project's policy (its setting or its workflow document) among the running runs."""
    key = KNOBS["heartbeat_stale_seconds"][0]
    values, project_ids = [settings.PAPERCLIP["RUN_HEARTBEAT_STALE_SECONDS"]], set()
    for agent_cfg, project_id in running.values_list("agent__runtime_config", "issue__project_id"):
        value = agent_cfg.get(key) if isinstance(agent_cfg, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            values.append(value)
        if project_id:
            project_ids.add(project_id)
    values += [run_policy_for(agent=None, project=project).heartbeat_stale_seconds
               for project in Project.objects.filter(pk__in=project_ids)]
    return min(values)


def runs_reconcile_on_start(*, hostname: str | None = None) -> list[HeartbeatRun]:
    """After a restart: running rows started on this host by a process that is gone are interrupted."""
    hostname = hostname or socket.gethostname()
    interrupted = []
    for run in HeartbeatRun.objects.filter(status=RunStatus.RUNNING, owner__startswith=f"{hostname}:"):
        owner_pid = _owner_pid(run.owner)
        if owner_pid and _pid_alive(owner_pid):
            continue
        if run.pid and _orphaned_here(run):
            kill_process_group(run.pid)
        interrupted.append(run_finish(run=run, status=RunStatus.INTERRUPTED, error="owner process is gone"))
    return interrupted


def _owner_pid(owner: str) -> int | None:
    tail = owner.rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else None


def _orphaned_here(run: HeartbeatRun) -> bool:
    """The run's agent process lives on this host but the process that owned it is gone: an
    orphan nobody else can stop. Agents lead their own process group, which guards against a
    reused pid."""
    owner_pid = _owner_pid(run.owner)
    if not run.owner.startswith(f"{socket.gethostname()}:") or owner_pid is None or _pid_alive(owner_pid):
        return False
    try:
        return os.getpgid(run.pid) == run.pid
    except ProcessLookupError:
        return False


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def runs_promote_due_retries(*, now=None) -> int:
    """Scheduled retries whose time has come join the dispatcher's queue, each with a
    ``run.retry_due`` audit row. One read outside a transaction when none is due (every dispatch pass
    starts here); racing callers skip each other's rows, so a retry is promoted and audited once."""
    now = now or timezone.now()
    pending = HeartbeatRun.objects.filter(status=RunStatus.SCHEDULED_RETRY, scheduled_for__lte=now)
    if not pending.exists():  # the usual pass: one statement, no transaction
        return 0
    with transaction.atomic():
        due = list(pending.select_for_update(skip_locked=True).only("pk", "company_id", "retry_attempt",
                                                                    "scheduled_for"))
        if not due:
            return 0
        HeartbeatRun.objects.filter(pk__in=[run.pk for run in due]).update(status=RunStatus.QUEUED, updated_at=now)
        rows.insert_many([
            activity_row(actor=SYSTEM, company_id=run.company_id, action="run.retry_due", entity_type="run",
                         entity_id=run.pk, run=run,
                         details={"retryAttempt": run.retry_attempt, "scheduledFor": run.scheduled_for.isoformat()})
            for run in due])
    return len(due)
