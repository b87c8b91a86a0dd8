"""Wakeups, runs, liveness continuations, retries, abandonment, stop and budget (issue: Runs)."""
import os
import signal
import subprocess
from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from issues.actors import SYSTEM, Actor
from issues.models import ActivityLog, Comment, HeartbeatRun, Issue, WakeupRequest
from issues.services import dispatch, runs, scheduling
from issues.services.checkout import issue_checkout
from issues.services.thread import comment_create
from issues.services.wakeups import agent_wakeup, wakeups_fold
from tests.factories import AgentFactory, IssueFactory, RunFactory

pytestmark = pytest.mark.django_db


def wake(agent, issue=None, **kw):
    return agent_wakeup(actor=SYSTEM, agent=agent, issue=issue, **kw)


def claim(issue, run):
    issue_checkout(actor=Actor(agent=run.agent, run_header=str(run.pk)), issue=issue, agent_id=run.agent_id,
                   expected_statuses=["todo", "backlog", "blocked", "in_review"])
    issue.refresh_from_db()


# --- wakeups -------------------------------------------------------------------------------------
def test_wakes_for_same_agent_and_issue_coalesce_with_count_and_comment_ids(company):
    agent, issue = AgentFactory(company=company), IssueFactory(company=company)
    other = AgentFactory(company=company)
    c1 = comment_create(actor=SYSTEM, issue=issue, body="first")
    c2 = Comment.objects.create(company=company, issue=issue, author_type="agent", author_agent=other, body="x")
    first = wake(agent, issue, comment_ids=[c1.pk])
    second = wake(agent, issue, comment_ids=[c2.pk])
    third = wake(agent, issue)
    assert first.status == "claimed" and second.status == third.status == "coalesced"
    assert second.run_id == third.run_id == first.run_id
    wakeups_fold(run_id=first.run_id)  # as the run starts
    first.refresh_from_db()
    assert first.coalesced_count == 2
    assert first.run.context["commentIds"] == [str(c1.pk), str(c2.pk)]
    assert HeartbeatRun.objects.filter(agent=agent).count() == 1


def test_wake_for_issue_locked_by_another_run_is_deferred_then_promoted(company):
    holder, waiter = AgentFactory(company=company), AgentFactory(company=company)
    issue = IssueFactory(company=company)
    holder_run = wake(holder, issue).run
    claim(issue, holder_run)
    deferred = wake(waiter, issue, reason="review please")
    assert deferred.status == "deferred_issue_execution" and deferred.run_id is None
    assert deferred.deferred_for_run_id == holder_run.pk
    runs.run_finish(run=holder_run, status="succeeded")
    deferred.refresh_from_db()
    assert deferred.status == "claimed" and deferred.run.agent_id == waiter.pk
    assert deferred.run.status == "queued"


def test_an_agents_own_comment_never_wakes_it(company):
    agent, issue = AgentFactory(company=company), IssueFactory(company=company)
    own = Comment.objects.create(company=company, issue=issue, author_type="agent", author_agent=agent, body="me")
    assert wake(agent, issue, comment_ids=[own.pk]).skip_reason == "own_comment"
    theirs = comment_create(actor=SYSTEM, issue=issue, body="please look")
    assert wake(agent, issue, comment_ids=[own.pk, theirs.pk]).status == "claimed"


def test_timer_heartbeat_with_nothing_to_do_is_skipped(company):
    agent = AgentFactory(company=company, runtime_config={"heartbeatIntervalSeconds": 60})
    assert scheduling.timer_heartbeats() == 1
    assert WakeupRequest.objects.get(agent=agent).skip_reason == "idle"
    assert not HeartbeatRun.objects.filter(agent=agent).exists()
    IssueFactory(company=company, assignee_agent=agent)
    assert scheduling.timer_heartbeats() == 0  # interval not yet elapsed
    with time_machine.travel(timezone.now() + timedelta(seconds=61)):
        assert scheduling.timer_heartbeats() == 1
    assert WakeupRequest.objects.filter(agent=agent, status="claimed").count() == 1


# --- dispatcher ----------------------------------------------------------------------------------
def test_dispatcher_respects_concurrency_pause_and_budget(company):
    busy = AgentFactory(company=company, adapter_type="process", runtime_config={"maxConcurrentRuns": 1})
    paused = AgentFactory(company=company, adapter_type="process")
    broke = AgentFactory(company=company, adapter_type="process", budget_monthly_cents=10)
    external = AgentFactory(company=company, adapter_type="none")
    r1 = wake(busy, IssueFactory(company=company)).run
    r2 = wake(busy, IssueFactory(company=company)).run
    rp = wake(paused, IssueFactory(company=company)).run
    rb = wake(broke, IssueFactory(company=company)).run
    wake(external, IssueFactory(company=company))
    paused.status = "paused"
    paused.save()
    broke.spent_monthly_cents = 10
    broke.save()
    picked = dispatch.dispatch_runs()
    assert r1.pk in picked and r2.pk not in picked  # one at a time for this agent
    assert not any(HeartbeatRun.objects.get(pk=p).agent_id == external.pk for p in picked)
    assert dispatch.run_claim(run_id=r1.pk, owner="test:1").status == "running"
    assert dispatch.run_claim(run_id=r2.pk, owner="test:1") is None  # still over the limit
    assert dispatch.run_claim(run_id=rp.pk, owner="test:1") is None
    assert dispatch.run_claim(run_id=rb.pk, owner="test:1") is None
    rp.refresh_from_db()
    rb.refresh_from_db()
    assert (rp.status, rp.error) == ("cancelled", "agent_paused")
    assert (rb.status, rb.error) == ("cancelled", "budget_exceeded")


def test_dispatch_query_count_is_constant(company, django_assert_max_num_queries):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    counts = []
    for n in (5, 50):
        HeartbeatRun.objects.all().delete()
        for _ in range(n):
            wake(AgentFactory(company=company, adapter_type="process"), IssueFactory(company=company))
        with CaptureQueriesContext(connection) as ctx:
            picked = dispatch.dispatch_runs()
        assert len(picked) == n
        counts.append(len(ctx.captured_queries))
    assert counts[0] == counts[1]


# --- liveness and continuations ---------------------------------------------------------------
def test_plan_only_enqueues_bounded_continuations_then_an_audit_comment(company, settings):
    settings.PAPERCLIP = {**settings.PAPERCLIP, "RUN_MAX_CONTINUATIONS": 2}
    agent = AgentFactory(company=company)
    issue = IssueFactory(company=company, assignee_agent=agent)
    run = wake(agent, issue).run
    attempts = []
    for _ in range(3):
        claim(issue, run)
        runs.run_finish(run=run, status="succeeded", liveness="plan_only", liveness_reason="wrote a plan")
        nxt = HeartbeatRun.objects.filter(agent=agent, status="queued").first()
        if nxt is None:
            break
        attempts.append(nxt.continuation_attempt)
        assert nxt.context["liveness"] == "plan_only" and nxt.context["sourceRunId"] == str(run.pk)
        assert nxt.source_run_id == (run.source_run_id or run.pk)
        run = nxt
    assert attempts == [1, 2]
    audit = Comment.objects.get(issue=issue, author_type="system")
    assert "exhausted" in audit.body
    issue.refresh_from_db()
    assert issue.status == "in_progress"  # never changed by the host


@pytest.mark.parametrize("liveness,continues", [("empty_response", True), ("advanced", False),
                                                ("completed", False), ("blocked", False), ("needs_followup", False)])
def test_only_plan_only_and_empty_response_continue(company, liveness, continues):
    agent = AgentFactory(company=company)
    issue = IssueFactory(company=company, assignee_agent=agent)
    run = wake(agent, issue).run
    runs.run_finish(run=run, status="succeeded", liveness=liveness)
    assert HeartbeatRun.objects.filter(agent=agent, continuation_attempt=1).exists() is continues


def test_no_continuation_for_terminal_issue_or_paused_agent(company):
    agent = AgentFactory(company=company)
    issue = IssueFactory(company=company, assignee_agent=agent)
    run = wake(agent, issue).run
    Issue.objects.filter(pk=issue.pk).update(status="done")
    runs.run_finish(run=run, status="succeeded", liveness="plan_only")
    assert HeartbeatRun.objects.filter(agent=agent).count() == 1
    issue2 = IssueFactory(company=company, assignee_agent=agent)
    run2 = wake(agent, issue2).run
    agent.status = "paused"
    agent.save()
    runs.run_finish(run=run2, status="succeeded", liveness="empty_response")
    assert not HeartbeatRun.objects.filter(agent=agent, status="queued").exists()


def test_host_derives_liveness_when_the_agent_did_not_report(company):
    agent = AgentFactory(company=company)
    issue = IssueFactory(company=company, assignee_agent=agent)
    run = wake(agent, issue).run
    claim(issue, run)
    comment_create(actor=Actor(agent=agent, run_header=str(run.pk)), issue=issue, body="progress")
    assert runs.run_finish(run=run, status="succeeded").liveness == "advanced"
    run2 = wake(agent, issue).run
    assert runs.run_finish(run=run2, status="succeeded").liveness == "empty_response"


# --- abandonment, retries, reconcile -----------------------------------------------------------
def test_stale_heartbeat_abandons_releases_and_retries_with_backoff(company, settings):
    settings.PAPERCLIP = {**settings.PAPERCLIP, "RUN_HEARTBEAT_STALE_SECONDS": 60, "RUN_MAX_RETRIES": 3}
    agent = AgentFactory(company=company, adapter_type="process")
    issue = IssueFactory(company=company, assignee_agent=agent)
    start = timezone.now()
    delays = []
    with time_machine.travel(start, tick=False) as clock:
        run = wake(agent, issue).run
        for attempt in range(1, 5):
            assert dispatch.run_claim(run_id=run.pk, owner="elsewhere:1") is not None
            claim(issue, run)
            clock.shift(timedelta(seconds=61))
            reaped = runs.runs_reap_stale(owner="here:2")
            assert [r.pk for r in reaped] == [run.pk]
            run.refresh_from_db()
            issue.refresh_from_db()
            assert run.status == "timed_out" and issue.execution_run_id is None and issue.checkout_run_id is None
            retry = HeartbeatRun.objects.filter(agent=agent, status="scheduled_retry").first()
            if retry is None:
                break
            assert retry.retry_attempt == attempt
            delays.append((retry.scheduled_for - timezone.now()).total_seconds())
            assert runs.runs_promote_due_retries() == 0  # not due yet
            clock.shift(timedelta(seconds=delays[-1]))
            assert runs.runs_promote_due_retries() == 1
            assert runs.runs_promote_due_retries() == 0  # promoted once
            run = HeartbeatRun.objects.get(pk=retry.pk)
            assert run.status == "queued"
            due = ActivityLog.objects.get(action="run.retry_due", entity_id=str(run.pk))
            assert (due.run_id, due.actor_type, due.details) == (
                run.pk, "system", {"retryAttempt": attempt, "scheduledFor": retry.scheduled_for.isoformat()})
    assert delays == [10, 20, 40]  # min(10 s × 2^(n−1), 5 min), bounded by RUN_MAX_RETRIES


def test_backoff_is_capped_at_five_minutes():
    assert [runs.retry_delay(n).total_seconds() for n in (1, 2, 3, 5, 6, 9)] == [10, 20, 40, 160, 300, 300]


def test_reaper_never_kills_a_process_it_does_not_own(company, settings):
    settings.PAPERCLIP = {**settings.PAPERCLIP, "RUN_HEARTBEAT_STALE_SECONDS": 1}
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        agent = AgentFactory(company=company)
        run = RunFactory(agent=agent, status="running", owner="another-host:1", pid=proc.pid,
                         last_heartbeat_at=timezone.now() - timedelta(seconds=5))
        runs.runs_reap_stale(owner="this-host:2")
        run.refresh_from_db()
        assert run.status == "timed_out"
        assert proc.poll() is None  # still alive: not ours to kill
        mine = RunFactory(agent=agent, status="running", owner="this-host:2", pid=proc.pid,
                          last_heartbeat_at=timezone.now() - timedelta(seconds=5))
        runs.runs_reap_stale(owner="this-host:2")
        assert proc.wait(timeout=5) == -signal.SIGKILL
        mine.refresh_from_db()
        assert mine.status == "timed_out"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_restart_reconciles_runs_of_a_dead_owner_on_this_host(company):
    import socket

    agent = AgentFactory(company=company)
    dead = subprocess.Popen(["true"])
    dead.wait()
    orphan = RunFactory(agent=agent, status="running", owner=f"{socket.gethostname()}:{dead.pid}")
    alive = RunFactory(agent=agent, status="running", owner=f"{socket.gethostname()}:{os.getpid()}")
    foreign = RunFactory(agent=agent, status="running", owner="other-host:1")
    interrupted = runs.runs_reconcile_on_start()
    assert [r.pk for r in interrupted] == [orphan.pk]
    for run, status in ((orphan, "interrupted"), (alive, "running"), (foreign, "running")):
        run.refresh_from_db()
        assert run.status == status


# --- stop and budget ---------------------------------------------------------------------------
def test_issue_scoped_stop_stops_only_that_issues_run(board_client, company):
    agent = AgentFactory(company=company, runtime_config={"maxConcurrentRuns": 2})
    one, two = IssueFactory(company=company), IssueFactory(company=company)
    run_one, run_two = wake(agent, one).run, wake(agent, two).run
    claim(one, run_one)
    claim(two, run_two)
    response = board_client.post(f"/api/issues/{one.pk}/run/stop")
    assert response.status_code == 200 and [r["id"] for r in response.json()] == [str(run_one.pk)]
    run_one.refresh_from_db()
    run_two.refresh_from_db()
    agent.refresh_from_db()
    assert run_one.status == "cancelled" and run_one.stop_reason == "issue_stop"
    assert run_two.status == "running" and run_two.stop_requested_at is None
    assert agent.status != "paused"
    one.refresh_from_db()
    assert one.execution_run_id is None
    assert not HeartbeatRun.objects.filter(issue=one, status__in=["queued", "scheduled_retry"]).exists()


def test_usage_over_the_hard_limit_stops_the_running_run(make_agent_client, company):
    client = make_agent_client(company=company, budget_monthly_cents=100)
    agent = client.agent
    issue = IssueFactory(company=company, assignee_agent=agent)
    run = wake(agent, issue).run
    client.use_run(run)
    claim(issue, run)
    ok = client.post(f"/api/runs/{run.pk}/heartbeat", {"usage": {"costCents": 60, "inputTokens": 1000}},
                     format="json")
    assert ok.status_code == 200 and ok.json()["stopRequested"] is False
    again = client.post(f"/api/runs/{run.pk}/heartbeat", {"usage": {"costCents": 60}}, format="json")
    agent.refresh_from_db()
    assert agent.spent_monthly_cents == 60  # cumulative totals: a repeat adds nothing
    over = client.post(f"/api/runs/{run.pk}/heartbeat", {"usage": {"costCents": 130}}, format="json")
    assert over.status_code == 200 and over.json()["stopRequested"] is True and again.status_code == 200
    run.refresh_from_db()
    agent.refresh_from_db()
    issue.refresh_from_db()
    assert agent.spent_monthly_cents == 130 and agent.pause_reason == "budget_exceeded"
    assert run.status == "cancelled" and run.stop_reason == "budget_exceeded"
    assert issue.execution_run_id is None
    assert wake(agent, issue).skip_reason == "budget_exceeded"


# --- API ---------------------------------------------------------------------------------------
def test_run_scoped_key_implies_its_run_and_dies_with_it(company):
    from rest_framework.test import APIClient

    from issues.models import AgentApiKey
    from issues.models.agent import hash_key

    agent = AgentFactory(company=company)
    issue = IssueFactory(company=company)
    run = wake(agent, issue).run
    raw = AgentApiKey.generate()
    AgentApiKey.objects.create(agent=agent, run=run, name="run", prefix=raw[:12], key_hash=hash_key(raw))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert client.post(f"/api/issues/{issue.pk}/comments", {"body": "hi"}, format="json").status_code == 201
    other_run = RunFactory(agent=agent)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}", HTTP_X_PAPERCLIP_RUN_ID=str(other_run.pk))
    assert client.post(f"/api/issues/{issue.pk}/comments", {"body": "hi"}, format="json").status_code == 403
    runs.run_finish(run=run, status="succeeded")
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert client.get("/api/agents/me").status_code == 401


def test_heartbeat_reports_liveness_and_events_page_by_cursor(make_agent_client, company):
    client = make_agent_client(company=company)
    run = client.run
    for n in range(5):
        runs.run_append_event(run_id=run.pk, kind="stdout", message=f"line {n}")
    page = client.get(f"/api/runs/{run.pk}/events", {"after": 2, "limit": 2}).json()
    assert [e["message"] for e in page] == ["line 2", "line 3"] and [e["seq"] for e in page] == [3, 4]
    beat = client.post(f"/api/runs/{run.pk}/heartbeat", {"liveness": "plan_only", "livenessReason": "planned"},
                       format="json")
    assert beat.status_code == 200 and beat.json()["lastHeartbeatAt"]
    assert runs.run_finish(run=run, status="succeeded").liveness == "plan_only"
    assert client.post(f"/api/runs/{run.pk}/heartbeat", {}, format="json").status_code == 409


def test_run_finish_records_activity_and_releases_in_one_step(company):
    agent = AgentFactory(company=company)
    issue = IssueFactory(company=company)
    run = wake(agent, issue).run
    claim(issue, run)
    runs.run_finish(run=run, status="failed", error="boom")
    row = ActivityLog.objects.get(action="run.finished", entity_id=str(run.pk))
    assert row.details["releasedIssueIds"] == [str(issue.pk)] and row.details["liveness"] == "failed"




def test_assignment_and_comments_wake_the_assignee_but_its_own_comments_do_not(board_client, company):
    agent = AgentFactory(company=company)
    created = board_client.post(f"/api/companies/{company.pk}/issues",
                                {"title": "t", "assigneeAgentId": str(agent.pk)}, format="json").json()
    assigned = WakeupRequest.objects.get(agent=agent)
    assert (assigned.source, assigned.status, str(assigned.issue_id)) == ("assignment", "claimed", created["id"])
    issue = Issue.objects.get(pk=created["id"])
    board_comment = board_client.post(f"/api/issues/{issue.pk}/comments", {"body": "one more thing"},
                                      format="json").json()
    run = assigned.run
    # coalesced into the queued run: shown at once (on PostgreSQL the wake is still unfolded then)
    shown = board_client.get(f"/api/runs/{run.pk}").json()
    assert shown["context"]["commentIds"] == [board_comment["id"]]
    comment_create(actor=Actor(agent=agent, run_header=str(run.pk)), issue=issue, body="on it")
    assert WakeupRequest.objects.filter(agent=agent).count() == 2  # the agent's own comment woke nobody
    backlog = board_client.post(f"/api/companies/{company.pk}/issues",
                                {"title": "later", "status": "backlog", "assigneeAgentId": str(agent.pk)},
                                format="json").json()
    assert not WakeupRequest.objects.filter(issue_id=backlog["id"]).exists()  # not actionable yet


def test_host_health_reports_runs_and_workspace_disk_for_staff_only(company, board_client, board_user, settings,
                                                                   tmp_path):
    settings.PAPERCLIP = {**settings.PAPERCLIP, "WORKSPACE_ROOT": str(tmp_path), "WORKSPACE_DISK_CAP_BYTES": 10}
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "big.txt").write_text("x" * 100)
    wake(AgentFactory(company=company), IssueFactory(company=company))
    assert board_client.get("/api/health").status_code == 403
    board_user.is_staff = True
    board_user.save()
    body = board_client.get("/api/health").json()
    assert body["runs"]["queued"] == 1
    assert body["workspaces"]["disk_bytes"] >= 100 and body["workspaces"]["over_cap"] is True


def test_monthly_budget_resets_when_the_month_turns(company):
    agent = AgentFactory(company=company, budget_monthly_cents=100)
    issue = IssueFactory(company=company, assignee_agent=agent)
    with time_machine.travel("2026-11-30 12:00Z"):
        run = wake(agent, issue).run
        runs.run_heartbeat(actor=SYSTEM, run=run, usage={"costCents": 150})
        agent.refresh_from_db()
        assert agent.spent_monthly_cents == 150 and wake(agent, issue).skip_reason == "budget_exceeded"
    with time_machine.travel("2026-12-01 00:05Z"):
        scheduling.sweep(owner="test:1")
        agent.refresh_from_db()
        assert (agent.spent_monthly_cents, agent.spend_period, agent.pause_reason) == (0, "2026-12", "")
        assert wake(agent, issue).status == "claimed"
    lifted = ActivityLog.objects.get(action="agent.budget_stop_lifted", entity_id=str(agent.pk))
    assert lifted.details == {"period": "2026-12", "previousSpentCents": 150}


def test_an_orphaned_agent_on_this_host_is_killed_when_its_run_is_abandoned(company, settings):
    import socket

    settings.PAPERCLIP = {**settings.PAPERCLIP, "RUN_HEARTBEAT_STALE_SECONDS": 1}
    dead_owner = subprocess.Popen(["true"])
    dead_owner.wait()
    orphan = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        run = RunFactory(agent=AgentFactory(company=company), status="running", pid=orphan.pid,
                         owner=f"{socket.gethostname()}:{dead_owner.pid}",
                         last_heartbeat_at=timezone.now() - timedelta(seconds=5))
        runs.runs_reap_stale(owner="this-host:2")
        assert orphan.wait(timeout=5) == -signal.SIGKILL
        run.refresh_from_db()
        assert run.status == "timed_out"
    finally:
        if orphan.poll() is None:
            os.killpg(orphan.pid, signal.SIGKILL)


def test_usage_in_a_new_month_resets_only_that_agents_spend_first(company):
    agent = AgentFactory(company=company, spent_monthly_cents=90, spend_period="2026-10")
    other = AgentFactory(company=company, spent_monthly_cents=40, spend_period="2026-10")
    with time_machine.travel("2026-11-03 09:00Z"):
        run = wake(agent, IssueFactory(company=company)).run
        runs.run_heartbeat(actor=SYSTEM, run=run, usage={"costCents": 5})
    agent.refresh_from_db()
    other.refresh_from_db()
    assert (agent.spent_monthly_cents, agent.spend_period) == (5, "2026-11")
    assert (other.spent_monthly_cents, other.spend_period) == (40, "2026-10")  # left to the sweep


def test_an_external_workers_first_heartbeat_starts_its_run_under_the_dispatchers_rules(company):
    """An external worker (adapter none) starts its run with its first heartbeat: the run starts
    (with its run.started row) only as the dispatcher would start it. A paused or over-budget
    agent's queued run is cancelled with that reason, and a retry does not start before it is due."""
    from issues.exceptions import Conflict

    def external_run(**agent_fields):
        agent = AgentFactory(company=company, adapter_type="none", **agent_fields)
        return RunFactory(agent=agent, status="queued", adapter_type="none")

    run = runs.run_heartbeat(actor=SYSTEM, run=external_run())
    assert run.status == "running" and run.started_at is not None
    assert ActivityLog.objects.filter(action="run.started", entity_id=str(run.pk)).count() == 1
    assert runs.run_heartbeat(actor=SYSTEM, run=run).status == "running"  # later heartbeats: no second row
    assert ActivityLog.objects.filter(action="run.started", entity_id=str(run.pk)).count() == 1

    for fields, reason in (({"status": "paused"}, "agent_paused"),
                           ({"budget_monthly_cents": 100, "spent_monthly_cents": 150}, "budget_exceeded")):
        refused = external_run(**fields)
        with pytest.raises(Conflict) as ended:
            runs.run_heartbeat(actor=SYSTEM, run=refused)
        assert ended.value.code == "run_not_live" and ended.value.details["reason"] == reason
        refused.refresh_from_db()
        assert (refused.status, refused.error) == ("cancelled", reason)

    retry = external_run()
    HeartbeatRun.objects.filter(pk=retry.pk).update(status="scheduled_retry",
                                                     scheduled_for=timezone.now() + timedelta(seconds=30))
    with pytest.raises(Conflict) as early:
        runs.run_heartbeat(actor=SYSTEM, run=retry)
    assert early.value.code == "run_not_due"
    assert HeartbeatRun.objects.get(pk=retry.pk).status == "scheduled_retry"
    with time_machine.travel(timezone.now() + timedelta(seconds=31)):
        assert runs.run_heartbeat(actor=SYSTEM, run=retry).status == "running"


@pytest.mark.parametrize("holds_the_issue", [False, True], ids=["unlocked", "checked-out"])
def test_a_wake_while_the_run_is_stopping_is_not_lost_with_it(company, holds_the_issue):
    """A stopping run has left the live slot: a wake that arrives then (a board comment after a stop)
    does not join it, where it would end with the run unheard; it starts the next run, or waits for
    the stopping run to let go of the issue and then starts it."""
    agent = AgentFactory(company=company)
    issue = IssueFactory(company=company, assignee_agent=agent, status="todo")
    stopping = wake(agent, issue, reason="issue_assigned").run
    if holds_the_issue:
        claim(issue, stopping)
    HeartbeatRun.objects.filter(pk=stopping.pk).update(stop_requested_at=timezone.now(), stop_reason="board_stop")
    comment = wake(agent, issue, reason="issue_commented")
    assert comment.status != "coalesced" and comment.run_id != stopping.pk
    runs.run_finish(run=HeartbeatRun.objects.get(pk=stopping.pk), status="cancelled", error="stopped")
    comment.refresh_from_db()
    assert comment.run_id not in (None, stopping.pk), comment.status  # the wake's own next run
    assert comment.run.status in ("queued", "running")
