"""The scheduler's two halves: ``dispatch_claim`` moves queued runs to running in batches (one
transaction per pass, respecting pause, budget, per-agent and per-project concurrency), and
``run_execute`` realizes a claimed run's workspace and drives its adapter to the end. Both are
called by Celery tasks or by the in-process worker; neither depends on an in-memory queue
surviving a restart. ``dispatch_runs`` is the read-only preview of what a pass would start."""
from __future__ import annotations

import logging
from datetime import timedelta

from django.db import connection, transaction
from django.db.models import Count, F
from django.utils import timezone

from issues.actors import SYSTEM
from issues.choices import AdapterType, RunStatus
from issues.exceptions import ApiError
from issues.models import ActivityLog, Agent, HeartbeatRun, Project

from .activity import activity_context_current, activity_record
from .run_policy import run_policy_for
from .run_results import finish_status, run_result_record
from .runs import run_finish, runs_promote_due_retries
from .start_rules import start_refusal
from .wakeups import wakeups_fold

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


def dispatch_claim(*, owner: str, limit: int = 100, max_claims: int | None = None, run_ids=None,
                   now=None) -> list[HeartbeatRun]:
    """One dispatch pass: the oldest ``limit`` queued runs (or the queued ones of ``run_ids``) are
    decided together and up to ``max_claims`` of them move to running for ``owner``, in one
    transaction whose query count does not grow with the number of runs (one policy lookup per
    distinct project aside). Runs of a paused or terminated agent, or of one over budget, are
    cancelled (``agent_<status>``, ``budget_exceeded``); runs over their agent's maxConcurrentRuns
    or their project's max_concurrent_agents stay queued. Returns the claimed runs, oldest first.

    Racing passes never over-claim. On PostgreSQL a pass locks the candidates' agents (in
    primary-key order, so the running counts it reads stay true until it commits), then the
    candidate runs with SKIP LOCKED (two passes never decide the same run), then the limited
    projects: agents before runs, the order ``agent_wakeup`` locks them in. On SQLite the
    IMMEDIATE transaction holds the write lock from BEGIN. The final UPDATE is conditional on
    ``status = 'queued'`` and RETURNs what it really claimed."""
    now = now or timezone.now()
    runs_promote_due_retries(now=now)  # autocommits: its row locks are not held through the pass
    queued = HeartbeatRun.objects.filter(status=RunStatus.QUEUED)
    if run_ids is None:
        queued = queued.filter(started_at__isnull=True).exclude(adapter_type=AdapterType.NONE).exclude(
            adapter_type="")
    else:  # an explicit claim, as run_claim always allowed
        queued = queued.filter(pk__in=run_ids)
    queued = queued.order_by("created_at")
    cancels = []
    with transaction.atomic():
        agent_ids = set(queued.values_list("agent_id", flat=True)[:limit])
        if not agent_ids:
            return []
        # Locked, hence fresh: status, budget and runtime_config as of now, not as of a join.
        agents = {a.pk: a for a in Agent.objects.select_for_update(no_key=True)
                  .filter(pk__in=agent_ids).order_by("pk")}
        candidates = list(queued.filter(agent_id__in=list(agents)).select_related("issue", "issue__project")
                          .select_for_update(skip_locked=True, of=("self",))[:limit])
        startable = []
        for run in candidates:
            run.agent = agent = agents[run.agent_id]
            refusal = start_refusal(agent)
            if refusal:
                cancels.append((run, refusal))
            else:
                startable.append(run)
        claimed = _claim_within_limits(startable, max_claims)
        claimed = _mark_running(claimed, owner=owner, now=now)
    for run, error in cancels:
        run_finish(run=run, status=RunStatus.CANCELLED, error=error)
    return claimed


def _claim_within_limits(runs: list, max_claims: int | None) -> list:
    """The runs (oldest first) that fit their agent's and their project's concurrency limit,
    counting the running runs under the agent and project row locks."""
    if not runs:
        return []
    running = dict(
        HeartbeatRun.objects.filter(status=RunStatus.RUNNING, agent_id__in={r.agent_id for r in runs})
        .values("agent_id").annotate(n=Count("id")).values_list("agent_id", "n")
    )
    policies, project_limit = {}, {}  # project -> policy limit; run -> its limit (the agent's own wins)
    for run in runs:
        if _project_id(run) is not None:
            project_limit[run.pk] = _project_limit(run, policies)
    limited = sorted({_project_id(r) for r in runs if project_limit.get(r.pk)})
    in_project = {}
    if limited:
        list(Project.objects.select_for_update(no_key=True).filter(pk__in=limited).order_by("pk")
             .values_list("pk", flat=True))
        in_project = dict(
            HeartbeatRun.objects.filter(status=RunStatus.RUNNING, issue__project_id__in=limited)
            .values("issue__project_id").annotate(n=Count("id")).values_list("issue__project_id", "n")
        )
    picked = []
    for run in runs:
        if max_claims is not None and len(picked) >= max_claims:
            break
        if running.get(run.agent_id, 0) >= _max_concurrent(run.agent):
            continue
        project_id, limit = _project_id(run), project_limit.get(run.pk)
        if limit:
            if in_project.get(project_id, 0) >= limit:
                continue
            in_project[project_id] = in_project.get(project_id, 0) + 1
        running[run.agent_id] = running.get(run.agent_id, 0) + 1
        picked.append(run)
    return picked


_CLAIM_FIELDS = ("status", "owner", "started_at", "last_heartbeat_at", "last_activity_at", "updated_at")


def _mark_running(runs: list, *, owner: str, now) -> list:
    """One ``UPDATE … WHERE id IN (…) AND status = 'queued' RETURNING id`` (PostgreSQL, SQLite ≥ 3.35)
    and the ``run.started`` activity rows in one bulk insert. The ORM's update() returns only a
    row count; RETURNING says which rows this pass really moved."""
    if not runs:
        return []
    meta, qn = HeartbeatRun._meta, connection.ops.quote_name
    values = (RunStatus.RUNNING, owner, now, now, now, now)
    params = [meta.get_field(name).get_db_prep_save(value, connection) for name, value in zip(_CLAIM_FIELDS, values)]
    params += [meta.pk.get_db_prep_value(run.pk, connection) for run in runs] + [RunStatus.QUEUED]
    column = {name: qn(meta.get_field(name).column) for name in (*_CLAIM_FIELDS, "id")}
    sql = (f"UPDATE {qn(meta.db_table)} SET {', '.join(f'{column[n]} = %s' for n in _CLAIM_FIELDS)} "
           f"WHERE {column['id']} IN ({', '.join(['%s'] * len(runs))}) AND {column['status']} = %s "
           f"RETURNING {column['id']}")
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        moved = {meta.pk.to_python(row[0]) for row in cursor.fetchall()}
    claimed = [run for run in runs if run.pk in moved]
    actor, cause = SYSTEM.activity_fields(), activity_context_current()
    rows = []
    for run in claimed:
        for name, value in zip(_CLAIM_FIELDS, values):
            setattr(run, name, value)
        rows.append(ActivityLog(company_id=run.company_id, action="run.started", entity_type="run",
                                entity_id=str(run.pk), details={**cause, "owner": owner},
                                **{**actor, "run": run}))
    if rows:  # one INSERT however many rows: bulk_create would split them at SQLite's 999 parameters
        ActivityLog.objects._insert(rows, fields=[f for f in ActivityLog._meta.concrete_fields if not f.primary_key])
    return claimed


def run_claim(*, run_id, owner: str, now=None) -> HeartbeatRun | None:
    """Move one queued run to running for ``owner``; None when it must not start (yet): a
    dispatch pass restricted to this run, so one set of rules decides every claim."""
    claimed = dispatch_claim(owner=owner, limit=1, run_ids=[run_id], now=now)
    return claimed[0] if claimed else None


def _take_over(*, run_id, claimed_by: str, owner: str) -> bool:
    """The executor takes a run that ``dispatch_claim`` moved to running for ``claimed_by`` and
    nobody has started yet (its activity is still its claim time). Conditional, so a redelivered
    task, or a run reaped or cancelled meanwhile, is not executed twice."""
    run = HeartbeatRun.objects.filter(pk=run_id).values("started_at").first()
    if run is None or run["started_at"] is None:
        return False
    now = max(timezone.now(), run["started_at"] + timedelta(microseconds=1))
    return bool(HeartbeatRun.objects.filter(
        pk=run_id, status=RunStatus.RUNNING, owner=claimed_by, last_activity_at=F("started_at"),
    ).update(owner=owner, last_heartbeat_at=now, last_activity_at=now, updated_at=now))


def run_execute(*, run_id, owner: str, claimed_by: str | None = None) -> HeartbeatRun | None:
    """Prepare and run one agent process to its end. Without ``claimed_by`` the run is claimed
    here first; with it, the run was already claimed by ``dispatch_claim`` for ``claimed_by``
    and is taken over (None when it was started, reaped or cancelled meanwhile)."""
    from issues.adapters.base import prepare_context
    from issues.adapters.registry import get_adapter
    from issues.workspaces.errors import WorkspaceBusy
    from issues.workspaces.service import workspace_admit, workspace_after_run

    if claimed_by is None:
        if run_claim(run_id=run_id, owner=owner) is None:
            return None
    elif not _take_over(run_id=run_id, claimed_by=claimed_by, owner=owner):
        return None
    wakeups_fold(run_id=run_id)  # the run starts with every wake that joined it while queued
    run = HeartbeatRun.objects.select_related("agent", "issue", "issue__project").get(pk=run_id)
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
