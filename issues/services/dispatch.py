"""The scheduler's two halves: ``dispatch_runs`` finds queued runs worth starting, and
``run_execute`` claims one (respecting pause, budget, per-agent and per-project concurrency), realizes its
workspace, and drives its adapter to the end. Both are called by Celery tasks or by the
in-process worker; neither depends on an in-memory queue surviving a restart."""
from __future__ import annotations

import logging
from datetime import timedelta

from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from issues.actors import SYSTEM
from issues.choices import AdapterType, AgentStatus, RunStatus
from issues.exceptions import ApiError
from issues.models import Agent, HeartbeatRun, Issue, Project

from .activity import activity_record
from .run_policy import run_policy_for
from .run_results import finish_status, run_result_record
from .runs import run_finish, runs_promote_due_retries

log = logging.getLogger(__name__)
WORKSPACE_BUSY_RETRY_SECONDS = 5


def _max_concurrent(agent: Agent) -> int:
    value = (agent.runtime_config or {}).get("maxConcurrentRuns")
    return value if isinstance(value, int) and value > 0 else 1


def _project_id(run: HeartbeatRun):
    return run.issue.project_id if run.issue_id else None


def dispatch_runs(*, limit: int = 100, now=None) -> list:
    """Queued runs that may start now (oldest first), pre-filtered by per-agent concurrency and
    the project's max_concurrent_agents (run policy). A constant number of queries however many
    runs are queued (the workflow-document layer adds one lookup per distinct project)."""
    runs_promote_due_retries(now=now)
    queued = list(
        HeartbeatRun.objects.filter(status=RunStatus.QUEUED, started_at__isnull=True)
        .exclude(adapter_type=AdapterType.NONE).exclude(adapter_type="")
        .select_related("agent", "issue", "issue__project").order_by("created_at")[:limit]
    )
    running = dict(
        HeartbeatRun.objects.filter(status=RunStatus.RUNNING, agent_id__in={r.agent_id for r in queued})
        .values("agent_id").annotate(n=Count("id")).values_list("agent_id", "n")
    )
    project_ids = {_project_id(r) for r in queued} - {None}
    in_project = dict(
        HeartbeatRun.objects.filter(status=RunStatus.RUNNING, issue__project_id__in=project_ids)
        .values("issue__project_id").annotate(n=Count("id")).values_list("issue__project_id", "n")
    ) if project_ids else {}
    limits = {}  # project -> its policy's limit (one lookup per project, not per run)
    picked = []
    for run in queued:
        if running.get(run.agent_id, 0) >= _max_concurrent(run.agent):
            continue
        project_id = _project_id(run)
        if project_id is not None:
            limit = _project_limit(run, limits)
            if limit and in_project.get(project_id, 0) >= limit:
                continue
            in_project[project_id] = in_project.get(project_id, 0) + 1
        running[run.agent_id] = running.get(run.agent_id, 0) + 1
        picked.append(run.pk)
    return picked


def _project_limit(run: HeartbeatRun, limits: dict) -> int:
    """The dispatcher's view of the run's project limit: the agent's own setting (read without a
    query), else the project's policy, looked up once per project (run_claim decides exactly)."""
    own = run_policy_for(agent=run.agent)
    if own.sources.get("max_concurrent_agents") == "agent":
        return own.max_concurrent_agents
    project_id = run.issue.project_id
    if project_id not in limits:
        limits[project_id] = run_policy_for(agent=None, issue=run.issue).max_concurrent_agents
    return limits[project_id]


def _project_full(run: HeartbeatRun, agent: Agent) -> bool:
    """The run's project already runs max_concurrent_agents runs. Locks the project row, so two
    claims in one project are decided one after the other."""
    if run.issue_id is None:
        return False
    issue = Issue.objects.select_related("project").get(pk=run.issue_id)
    if issue.project_id is None:
        return False
    limit = run_policy_for(agent=agent, issue=issue).max_concurrent_agents
    if not limit:
        return False
    Project.objects.select_for_update().filter(pk=issue.project_id).first()
    return HeartbeatRun.objects.filter(status=RunStatus.RUNNING, issue__project_id=issue.project_id).count() >= limit


def run_claim(*, run_id, owner: str, now=None) -> HeartbeatRun | None:
    """Move one queued run to running for ``owner``; None when it must not start (yet)."""
    now = now or timezone.now()
    cancel = None
    with transaction.atomic():
        run = HeartbeatRun.objects.select_for_update().filter(pk=run_id, status=RunStatus.QUEUED).first()
        if run is None:
            return None
        agent = Agent.objects.select_for_update().get(pk=run.agent_id)
        if agent.status in (AgentStatus.PAUSED, AgentStatus.TERMINATED):
            cancel = f"agent_{agent.status}"
        elif agent.budget_monthly_cents and agent.spent_monthly_cents >= agent.budget_monthly_cents:
            cancel = "budget_exceeded"
        elif HeartbeatRun.objects.filter(agent=agent, status=RunStatus.RUNNING).count() >= _max_concurrent(agent):
            return None
        elif _project_full(run, agent):
            return None
        else:
            run.status, run.owner, run.started_at = RunStatus.RUNNING, owner, now
            run.last_heartbeat_at = run.last_activity_at = now
            run.save(update_fields=["status", "owner", "started_at", "last_heartbeat_at", "last_activity_at",
                                    "updated_at"])
            activity_record(actor=SYSTEM, company_id=run.company_id, action="run.started", entity_type="run",
                            entity_id=run.pk, run=run, details={"owner": owner})
            return run
    run_finish(run=run, status=RunStatus.CANCELLED, error=cancel)
    return None


def run_execute(*, run_id, owner: str) -> HeartbeatRun | None:
    """Claim, prepare and run one agent process to its end."""
    from issues.adapters.base import prepare_context
    from issues.adapters.registry import get_adapter
    from issues.workspaces.errors import WorkspaceBusy
    from issues.workspaces.service import workspace_admit, workspace_after_run

    run = run_claim(run_id=run_id, owner=owner)
    if run is None:
        return None
    run = HeartbeatRun.objects.select_related("agent", "issue", "issue__project").get(pk=run.pk)
    workspace = None
    if run.issue is not None:
        try:
            workspace = workspace_admit(issue=run.issue, run=run)
        except WorkspaceBusy as exc:
            _requeue_busy(run, exc)
            return run
        except ApiError as exc:  # before_run hook failure, bad configuration, git or path errors
            return run_finish(run=run, status=RunStatus.FAILED, error=f"{exc.code}: {exc.message}",
                              liveness="failed", liveness_reason=exc.code)
    ctx = None
    try:
        adapter = get_adapter(run.agent.adapter_type)
        ctx = prepare_context(run, owner=owner, workspace_path=workspace.path if workspace else None,
                              adapter=adapter)
        result = adapter.execute(ctx)
        if result is not None:
            # The output contract first (result fields, PR, handoff), while the run still holds its checkout.
            if result.report is not None:
                run = run_result_record(run=run, report=result.report)
            else:  # the agent may have reported over the API instead (a final heartbeat)
                run.refresh_from_db(fields=["result_status"])
            status, error = finish_status(run.result_status, result.status, result.error or "")
            run = run_finish(run=run, status=status, error=error, exit_code=result.exit_code,
                             liveness=result.liveness or "", liveness_reason=result.liveness_reason or "")
    except Exception as exc:  # the run must end even when the host side breaks
        log.exception("run %s failed on the host side", run.pk)
        run = run_finish(run=run, status=RunStatus.FAILED, error=f"host error: {exc}")
    finally:
        if ctx is not None:
            ctx.release()
        if workspace is not None:
            workspace_after_run(run=run)
    return run


def _requeue_busy(run: HeartbeatRun, exc):
    """A shared workspace has another writer: wait instead of writing beside it."""
    due = timezone.now() + timedelta(seconds=WORKSPACE_BUSY_RETRY_SECONDS)
    with transaction.atomic():
        HeartbeatRun.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(
            status=RunStatus.SCHEDULED_RETRY, scheduled_for=due, started_at=None, owner="", updated_at=timezone.now())
        activity_record(actor=SYSTEM, company_id=run.company_id, action="run.workspace_busy", entity_type="run",
                        entity_id=run.pk, run=run, details={"retryAt": due.isoformat(), "detail": str(exc)})
