"""Wakeup requests: when an agent should run, and which run a wake belongs to.

A wake is recorded, then either skipped (with a reason), coalesced into the agent's live run for
the same issue, deferred while another run holds the issue's execution lock, or given a new
queued run that the dispatcher starts.

One live run per agent and issue rests on a database constraint, not a lock: one unstarted run
per agent and issue (run_unstarted_unique_per_agent_issue); a wake that loses the race to create
the run coalesces into the winner's (_place). On PostgreSQL a plain coalescing wake is one
insert-only statement (_coalesce_fast) that wakeups_fold carries into the run later; the others
take the full path.
"""
from __future__ import annotations

from contextlib import nullcontext
from functools import lru_cache

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connections, transaction
from django.db.models import F
from django.utils import timezone

from issues.actors import SYSTEM, Actor
from issues.choices import (
    LIVE_RUN_STATUSES,
    NOT_RUNNABLE_AGENT_STATUSES,
    TERMINAL_ISSUE_STATUSES,
    IssueStatus,
    WakeSource,
    WakeStatus,
)
from issues.exceptions import Forbidden, InvalidInput, NotFound
from issues.models import ActivityLog, Agent, Comment, HeartbeatRun, Issue, WakeupRequest
from issues.run_context import context_merged, pending_wakes_apply
from issues.selectors import unfolded_wakes
from paperclip.core import rows

from .activity import activity_context_current, activity_record
from .kicks import kick_dispatcher
from .start_rules import start_refusal

ACTIONABLE = (IssueStatus.TODO, IssueStatus.IN_PROGRESS, IssueStatus.IN_REVIEW)
# A new run races another wake for the agent's live slot (run_live_unique_*): the loser coalesces.
PLACE_ATTEMPTS = 5


def _skip_reason(agent: Agent, issue: Issue | None, source: str, comment_ids: list[str], reason: str) -> str:
    refusal = start_refusal(agent)  # paused, terminated, over budget, or its company stopped
    if refusal:
        return refusal
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
                 issue_is_current: bool = False, issue_is_new: bool = False,
                 comments_checked: bool = False) -> WakeupRequest:
    """Record a wake and attach it to a run. ``run_fields`` seeds a new run (continuations, retries).
    ``issue_is_current``: the caller wrote the issue row in this transaction (no re-read needed).
    ``issue_is_new``: the caller created the issue in this transaction and read ``agent`` there: no
    other transaction can see the issue yet, so no run can exist for it (no live run to look for or
    join, no insert race to check) and the agent needs no re-read. ``comments_checked``: the caller
    created the ``comment_ids`` comments on ``issue`` in this transaction, none by ``agent`` (no
    re-read to check their company and author)."""
    if source not in WakeSource.values:
        raise InvalidInput(details={"source": [f"'{source}' is not one of {', '.join(WakeSource.values)}."]})
    actor.ensure_can_write(agent.company_id)
    if actor.is_agent and actor.agent.pk != agent.pk:
        # Only as a consequence of the agent's write (assignment, mention, …): the API refuses a
        # direct wake of another agent (ensure_may_invoke); a header given must name a live run.
        actor.named_live_run()
    comment_ids = [str(c) for c in dict.fromkeys(comment_ids)]
    if comment_ids and not comments_checked and Comment.objects.filter(
            pk__in=comment_ids, company_id=agent.company_id).count() != len(comment_ids):
        raise NotFound("Comment not found.", details={"commentIds": ["Every comment must belong to this company."]})
    # The wake of the caller's new issue or new comments needs no savepoint of its own: the caller's
    # atomic block encloses it with nothing in between that recovers from a failure, so a failure
    # rolls back with the issue or comment. Only an idempotency key's insert race is handled here.
    own_savepoint = bool(idempotency_key) or not (issue_is_new or comments_checked)
    # The insert-only fast path, also for the caller's new comments (checked: in this company, none by
    # this agent, so no own_comment skip); comments named otherwise take the full path, which checks.
    if not issue_is_new and not run_fields and (comments_checked or not comment_ids) and not (
            source == WakeSource.TIMER and issue is None and not reason):
        fast = _coalesce_fast(actor, agent, source, reason, issue, idempotency_key, context or {}, comment_ids,
                              own_savepoint=own_savepoint)
        if fast is not None:
            return fast
    try:
        with transaction.atomic(savepoint=own_savepoint):
            # For an issue, no agent lock: the live-slot constraint makes a second new run fail (then
            # it coalesces) and _place locks the run row it merges into. Agent-level wakes (no
            # issue, no constraint) still take one wake at a time per agent.
            if not issue_is_new:
                agent = (Agent.objects.select_for_update() if issue is None else Agent.objects).get(pk=agent.pk)
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
            _place(wake, agent, issue, source, comment_ids, reason, run_fields or {}, new_issue=issue_is_new,
                   comments_checked=comments_checked)
            rows.insert(wake)
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


def ensure_may_invoke(actor: Actor, agent: Agent) -> None:
    """The rule of ``/wakeup`` and ``/heartbeat/invoke`` (ref §5.1): an agent wakes only itself;
    board users any agent of their companies."""
    if actor.is_agent and actor.agent.pk != agent.pk:
        raise Forbidden("Agent can only invoke itself", code="agent_self_only")


def agent_wakeup_request(*, actor: Actor, agent: Agent, source: str = WakeSource.ON_DEMAND, reason: str = "",
                         issue: Issue | None = None, idempotency_key: str | None = None, comment_ids=(),
                         trigger_detail: str | None = None, payload: dict | None = None,
                         force_fresh_session: bool = False) -> WakeupRequest:
    """``POST /agents/{id}/wakeup``: a wake the caller asks for. Upstream's ``payload``,
    ``triggerDetail`` and ``forceFreshSession`` have no column here, so they go into the wake's
    context (carried into its run's); ``payload`` under its own key, so it never overrides the
    host's context keys (comment ids, approval, task packet)."""
    ensure_may_invoke(actor, agent)
    context = {}
    if payload is not None:
        context["payload"] = payload
    if trigger_detail:
        context["triggerDetail"] = trigger_detail
    if force_fresh_session:
        context["forceFreshSession"] = True
    return agent_wakeup(actor=actor, agent=agent, source=source, reason=reason, issue=issue,
                        idempotency_key=idempotency_key, comment_ids=comment_ids, context=context)


def _coalesce_fast(actor, agent, source, reason, issue, idempotency_key, context, comment_ids=(),
                   own_savepoint: bool = True) -> WakeupRequest | None:
    """A wake joining the agent's live run in ONE insert-only statement (PostgreSQL): the wake row
    (unfolded) and its activity row, provided there is a live run and the agent and issue would not
    skip it. It locks nothing: a burst of wakes for one run never queues on the run's row, and
    their reasons, context and count are carried into the run later, in order (wakeups_fold: when
    the run starts and ends, by a later wake of the full path, and on the sweep; reads in between
    see them through selectors.runs_with_pending_wakes). None (nothing written) when the wake needs the full
    path: no live run, a skip reason, an idempotency key already used, or not PostgreSQL.
    ``comment_ids``: the caller's new comments (agent_wakeup's ``comments_checked``), carried into the
    run's ``commentIds`` by the fold like the reasons. ``own_savepoint=False``: inside the caller's
    transaction, a failure needs no savepoint of its own (nothing in between recovers from one).

    Outside a transaction the statement may commit asynchronously (opt-in
    ``WAKE_COALESCE_ASYNC_COMMIT``, off by default): a crash can then lose the newest ~0.6 s of
    acknowledged coalesced wakes (never a run, never a wake that started one)."""
    conn = connections[DEFAULT_DB_ALIAS]
    if conn.vendor != "postgresql":
        return None  # SQLite serialises writers anyway; the full path is just as fast there
    now = timezone.now()
    wake = WakeupRequest(
        company_id=agent.company_id, agent_id=agent.pk, issue=issue, source=source, reason=reason,
        idempotency_key=idempotency_key or None, comment_ids=list(comment_ids), context=context,
        status=WakeStatus.COALESCED,
        requested_by_agent=actor.agent, requested_by_user=actor.user if actor.is_board else None,
        folded=False, created_at=now, updated_at=now,
    )
    details = {"wakeupId": str(wake.pk), "status": wake.status, "source": source,
               "issueId": str(issue.pk) if issue else None, "skipReason": ""}
    fields = actor.activity_fields()
    fields.pop("run", None)  # the run is the one the statement joins
    audit = ActivityLog(company_id=agent.company_id, action="agent.wakeup_requested", entity_type="agent",
                        entity_id=str(agent.pk), details={**activity_context_current(), **details},
                        created_at=now, **fields)
    nested = conn.in_atomic_block
    # Inside the caller's transaction, a savepoint keeps a failed insert (idempotency key) local.
    asynchronous = not nested and settings.PAPERCLIP.get("WAKE_COALESCE_ASYNC_COMMIT", False)
    params = {"agent": agent.pk, "issue": issue.pk if issue is not None else None,
              **_row_params("w", wake, conn), **_row_params("a", audit, conn)}
    sql = _coalesce_sql(issue is not None, asynchronous)
    try:
        with transaction.atomic(using=conn.alias) if nested and own_savepoint else nullcontext(), \
                conn.cursor() as cursor:
            if conn.queries_logged:  # debug/CaptureQueriesContext: through Django's cursor, so it is seen
                cursor.execute(sql, params)
                row = cursor.fetchone()
            else:  # server-side binding, prepared once per connection: no client-side quoting, no re-plan
                import psycopg

                with conn.wrap_database_errors, psycopg.Cursor(conn.connection) as raw:
                    row = raw.execute(sql, params, prepare=True).fetchone()
    except IntegrityError:
        if not idempotency_key:
            raise
        return None  # the key is taken: the full path returns the wake that has it
    if row is None or row[0] is None:
        return None  # no live run to join, or a skip reason: nothing was written
    wake.run_id = row[0]
    wake._state.adding, wake._state.db = False, conn.alias
    return wake


_CONTEXT_FIELD = WakeupRequest._meta.get_field("context")


def _row_params(prefix: str, obj, conn) -> dict:
    return {f"{prefix}_{f.column}": f.get_db_prep_save(getattr(obj, f.attname), conn)
            for f in rows.insert_fields(type(obj)) if f.column != "run_id"}


def _sql_literal(value: str) -> str:
    assert value.replace("_", "").isalnum(), value  # code constants (choices) only
    return f"'{value}'"


@lru_cache(maxsize=None)
def _coalesce_sql(has_issue: bool, asynchronous: bool) -> str:
    """The coalescing statement for one shape of wake (pyformat parameters; see _coalesce_fast)."""
    q = connections[DEFAULT_DB_ALIAS].ops.quote_name
    run_t = q(HeartbeatRun._meta.db_table)
    live = ", ".join(map(_sql_literal, LIVE_RUN_STATUSES))
    # the skip reasons a wake without comment ids can have (as _skip_reason): none, or no row
    skip = (f"EXISTS (SELECT 1 FROM {q(Agent._meta.db_table)} a WHERE a.id = CAST(%(agent)s AS uuid) "
            f"AND a.status NOT IN ({', '.join(map(_sql_literal, NOT_RUNNABLE_AGENT_STATUSES))}) "
            "AND NOT (a.budget_monthly_cents > 0 AND a.spent_monthly_cents >= a.budget_monthly_cents))")
    if has_issue:
        skip += (f" AND EXISTS (SELECT 1 FROM {q(Issue._meta.db_table)} i WHERE i.id = CAST(%(issue)s AS uuid) "
                 f"AND i.status NOT IN ({', '.join(map(_sql_literal, TERMINAL_ISSUE_STATUSES))}))")

    conn = connections[DEFAULT_DB_ALIAS]

    def insert(model, prefix):
        fields = rows.insert_fields(model)
        # typed parameters: the statement is also prepared with server-side binding
        values = ", ".join("target.id" if f.column == "run_id" else
                           f"CAST(%({prefix}_{f.column})s AS {f.db_type(conn)})" for f in fields)
        return f"INSERT INTO {q(model._meta.db_table)} ({', '.join(q(f.column) for f in fields)}) " \
               f"SELECT {values} FROM target"

    # No row lock: the run is read as of the statement's start. A run that ends before the wake
    # commits leaves it unfolded on an ended run; the sweep places it again (wakeups_fold_sweep).
    return f"""
        WITH target AS (
            SELECT r.id FROM {run_t} r
            WHERE r.agent_id = CAST(%(agent)s AS uuid)
              AND {"r.issue_id = CAST(%(issue)s AS uuid)" if has_issue else "r.issue_id IS NULL"}
              AND r.status IN ({live}) AND r.stop_requested_at IS NULL AND {skip}
            ORDER BY r.created_at LIMIT 1
        ), wake AS ({insert(WakeupRequest, "w")}
        ), audit AS ({insert(ActivityLog, "a")}
        ){", setting AS (SELECT set_config('synchronous_commit', 'off', true) AS v)" if asynchronous else ""}
        SELECT (SELECT id FROM target){", (SELECT v FROM setting)" if asynchronous else ""}"""


def _place(wake, agent, issue, source, comment_ids, reason, run_fields, new_issue: bool = False,
           comments_checked: bool = False):
    skip = _skip_reason(agent, issue, source, [] if comments_checked else comment_ids, reason)
    if skip:
        wake.status, wake.skip_reason = WakeStatus.SKIPPED, skip
        return
    follows = bool(run_fields.get("source_run"))  # the run after a stopping one: never joins it
    for attempt in range(PLACE_ATTEMPTS):
        live = None
        if not new_issue:  # (a new issue has no run: nothing outside this transaction can see it)
            # A stopping run has left the live slot: a wake joining it would end with it, unheard.
            live = HeartbeatRun.objects.filter(agent=agent, issue=issue, status__in=LIVE_RUN_STATUSES,
                                               stop_requested_at__isnull=True)
            if follows and not attempt:  # only the run that took the live slot first
                live = live.none()
            # Locked: the merge below reads and writes the run row (the fast path writes it in SQL).
            live = live.select_for_update().order_by("created_at").first()
        if live is not None:
            wake.status, wake.run = WakeStatus.COALESCED, live
            _carry_into(live, comment_ids, reason, wake.context or {})
            return
        holder = _lock_holder(agent, issue)
        if holder is not None:
            wake.status, wake.deferred_for_run = WakeStatus.DEFERRED_ISSUE_EXECUTION, holder
            return
        fields = dict(company_id=agent.company_id, agent=agent, issue=issue, invocation_source=source,
                      wake_reason=reason, adapter_type=agent.adapter_type,
                      context={**wake.context, "commentIds": comment_ids, "wakeReasons": [reason] if reason else []},
                      **run_fields)
        if new_issue:  # no other run can hold the new issue's live slot: no savepoint to fall back to
            run = rows.insert(HeartbeatRun(**fields))
        else:
            try:
                with transaction.atomic():
                    run = rows.insert(HeartbeatRun(**fields))
                    # The constraint covers runs until they start: one that was created and claimed
                    # since the read above is visible now (it committed before this insert).
                    if issue is not None and HeartbeatRun.objects.filter(
                        agent=agent, issue=issue, status__in=LIVE_RUN_STATUSES, stop_requested_at__isnull=True,
                    ).exclude(pk=run.pk).exists():
                        raise _SlotTaken
            except (IntegrityError, _SlotTaken) as exc:
                lost = exc  # a concurrent wake took the live slot first: coalesce into its run
                continue
        wake.run, wake.status = run, WakeStatus.CLAIMED
        return
    raise IntegrityError(f"no live run to join and none could be created ({lost!r})")


class _SlotTaken(Exception):
    """Rolls back a new run that found another live run for its agent and issue."""


def _carry_into(run: HeartbeatRun, comment_ids: list[str], reason: str, context: dict):
    """A coalesced wake adds its count and comment ids to the run's primary wake, and its reason
    and context to the run, newest first in line: the run starts with (or reads next) the newest
    reason, packet, approval, ... At most one UPDATE of the run row, only when something changed."""
    wakeups_fold_locked(run)  # the fast path's earlier wakes first: reasons stay in arrival order
    _primary_joined(run, 1, comment_ids)
    merged = context_merged(run.context, run.wake_reason, comment_ids, reason, context)
    changed = ["context"] if merged != run.context else []
    if reason and reason != run.wake_reason:
        run.wake_reason = reason
        changed.append("wake_reason")
    if changed:
        run.context = merged
        run.save(update_fields=[*changed, "updated_at"])


def _primary_joined(run: HeartbeatRun, count: int, comment_ids: list[str]):
    """``count`` more wakes joined ``run``: its primary wake counts them and takes their comment ids
    (arrival order, once each). One UPDATE; without comment ids, no read either (the hot path)."""
    primaries = WakeupRequest.objects.filter(run=run).exclude(status=WakeStatus.COALESCED)
    if not comment_ids:
        primaries.update(coalesced_count=F("coalesced_count") + count)
        return
    primary = primaries.order_by("created_at").first()
    if primary:
        primary.coalesced_count += count
        primary.comment_ids = primary.comment_ids + [c for c in dict.fromkeys(comment_ids)
                                                     if c not in primary.comment_ids]
        primary.save(update_fields=["coalesced_count", "comment_ids", "updated_at"])


def wakeups_fold_locked(run: HeartbeatRun) -> int:
    """Carry the fast path's unfolded wakes into ``run`` (whose row the caller holds locked and may
    save whole afterwards): reasons and context in arrival order, the count onto the primary wake.
    One read when there is nothing to fold."""
    pending = unfolded_wakes([run.pk]).get(run.pk)
    if not pending:
        return 0
    pending_wakes_apply(run, [wake[1:] for wake in pending])
    now = timezone.now()
    HeartbeatRun.objects.filter(pk=run.pk).update(context=run.context, wake_reason=run.wake_reason, updated_at=now)
    _primary_joined(run, len(pending), [str(c) for *_rest, ids in pending for c in ids or ()])
    WakeupRequest.objects.filter(pk__in=[wake[0] for wake in pending]).update(folded=True)
    return len(pending)


def wakeups_fold(*, run_id) -> int:
    """Fold a run's unfolded wakes (before it starts, and on the sweep). The run row is locked
    FOR NO KEY UPDATE: folds of one run take turns, and the fast path's inserts never wait on it."""
    if not WakeupRequest.objects.filter(run_id=run_id, folded=False).exists():
        return 0
    with transaction.atomic():
        run = HeartbeatRun.objects.select_for_update(no_key=True).filter(pk=run_id).first()
        if run is None or run.status not in LIVE_RUN_STATUSES:
            return 0  # ended meanwhile: run_finish folded what it saw; the rest are late (below)
        return wakeups_fold_locked(run)


def wakeups_fold_sweep(*, limit: int = 200) -> dict:
    """The sweep's share: fold live runs' wakes (so lists and the console catch up within a tick),
    and place again the wakes that joined a run in the instant it ended (the fast path read the
    run live, the run finished before the wake committed): they get the run a later wake would."""
    unfolded = WakeupRequest.objects.filter(folded=False)
    # .order_by(): the model's default ordering would add created_at to the DISTINCT (a run per wake)
    live = list(unfolded.filter(run__status__in=LIVE_RUN_STATUSES).order_by().values_list("run_id", flat=True)
                .distinct()[:limit])
    folded = sum(wakeups_fold(run_id=run_id) for run_id in live)
    late = list(unfolded.exclude(run__status__in=LIVE_RUN_STATUSES).order_by("created_at")
                .values_list("pk", "run_id")[:limit])
    placed = sum(_place_again(pk, after_run_id, late=True) for pk, after_run_id in late)
    return {"foldedWakes": folded, "latePlacedWakes": placed}


def wakeups_promote_deferred(*, run: HeartbeatRun) -> int:
    """The run holding an issue's lock ended: its deferred wakes are placed again, in order."""
    return sum(_place_again(wake_id, run.pk) for wake_id in WakeupRequest.objects.filter(
        deferred_for_run=run, status=WakeStatus.DEFERRED_ISSUE_EXECUTION
    ).order_by("created_at").values_list("pk", flat=True))


def _place_again(wake_id, after_run_id, late: bool = False) -> bool:
    """Place a waiting wake as if it arrived now: a deferred one whose lock holder ended, or (late)
    an unfolded one whose run ended before it could be carried into it."""
    with transaction.atomic():
        wake = WakeupRequest.objects.select_for_update().filter(pk=wake_id).first()
        waiting = wake is not None and (
            (not wake.folded and not HeartbeatRun.objects.filter(pk=wake.run_id, status__in=LIVE_RUN_STATUSES)
             .exists()) if late else wake.status == WakeStatus.DEFERRED_ISSUE_EXECUTION)
        if not waiting:
            return False
        agent = Agent.objects.select_for_update().get(pk=wake.agent_id)
        issue = Issue.objects.filter(pk=wake.issue_id).first() if wake.issue_id else None
        wake.deferred_for_run, wake.run, wake.folded = None, None, True
        _place(wake, agent, issue, wake.source, wake.comment_ids, wake.reason, {})
        wake.save()
        activity_record(actor=SYSTEM, company_id=wake.company_id, action="agent.wakeup_promoted",
                        entity_type="agent", entity_id=agent.pk, run=wake.run,
                        details={"wakeupId": str(wake.pk), "status": wake.status, "afterRunId": str(after_run_id)})
        if wake.status == WakeStatus.CLAIMED:
            kick_dispatcher()
        return True


def wake_assignee(*, issue: Issue, source: str, reason: str, comment_ids=(), author_agent_id=None,
                  idempotency_key: str | None = None, context: dict | None = None,
                  new_issue: bool = False, comments_checked: bool = False) -> WakeupRequest | None:
    """Wake the assigned agent of an actionable issue (assignment, comments, resolved blockers,
    finished children); an agent's own comments never wake it. ``new_issue``: the caller created
    the issue in its transaction with ``issue.assignee_agent`` read there (agent_wakeup's
    ``issue_is_new``); ``comments_checked``: as agent_wakeup's, the comments are the caller's new ones
    (by ``author_agent_id``, which is not the assignee: otherwise nothing wakes)."""
    if issue.assignee_agent_id is None or issue.status not in ACTIONABLE or author_agent_id == issue.assignee_agent_id:
        return None
    # agent_wakeup re-reads the agent row itself; this only names it (a new issue's caller read it).
    agent = issue.assignee_agent if new_issue else Agent(pk=issue.assignee_agent_id, company_id=issue.company_id)
    return agent_wakeup(actor=SYSTEM, agent=agent, source=source, reason=reason, issue=issue,
                        comment_ids=comment_ids, idempotency_key=idempotency_key, context=context,
                        issue_is_current=True, issue_is_new=new_issue, comments_checked=comments_checked)
