"""Coalescing wakes without the agent lock (issue #19): one live run per agent and issue is a
database constraint, a coalesced wake is one statement on PostgreSQL, and concurrent wakes still
make exactly one run, also while two dispatcher processes claim it."""
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from issues.actors import SYSTEM
from issues.models import ActivityLog, Comment, HeartbeatRun, WakeupRequest
from issues.run_context import WAKE_REASONS_KEPT
from issues.selectors import runs_with_pending_wakes
from issues.services.runs import run_finish
from issues.services.wakeups import agent_wakeup, wakeups_fold, wakeups_fold_sweep
from tests.factories import AgentFactory, IssueFactory, RunFactory

ROOT = Path(__file__).resolve().parent.parent
postgres_only = pytest.mark.skipif(connection.vendor != "postgresql",
                                   reason="concurrent writers need PostgreSQL row locks")


def wake(agent, issue=None, **kw):
    return agent_wakeup(actor=SYSTEM, agent=agent, issue=issue, **kw)


def run_threads(threads: int, op):
    """``op(i)`` in ``threads`` threads started together, each on its own database connection."""
    barrier, errors = threading.Barrier(threads), []

    def worker(i):
        try:
            barrier.wait(timeout=60)
            op(i)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            connection.close()

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=300)
    assert not errors, errors[:3]
    assert not any(t.is_alive() for t in pool)


def assert_one_run(agent, issue, wakes: int) -> HeartbeatRun:
    [run] = HeartbeatRun.objects.filter(agent=agent, issue=issue)
    # the sweep carries the wakes into their live run (a queued one is also folded as it starts)
    assert wakeups_fold_sweep()["latePlacedWakes"] == 0
    run.refresh_from_db()
    rows = WakeupRequest.objects.filter(agent=agent, issue=issue)
    assert not rows.filter(folded=False).exists()
    assert rows.count() == wakes and not rows.exclude(run=run).exists()
    [primary] = rows.filter(status="claimed")
    assert rows.filter(status="coalesced").count() == wakes - 1
    assert primary.coalesced_count == wakes - 1
    assert ActivityLog.objects.filter(action="agent.wakeup_requested", entity_id=str(agent.pk),
                                      details__issueId=str(issue.pk)).count() == wakes
    return run


# --- the constraint ------------------------------------------------------------------------------
@pytest.mark.django_db
def test_the_database_refuses_a_second_unstarted_run_for_one_agent_and_issue(company):
    agent, issue = AgentFactory(company=company), IssueFactory(company=company)
    queued = RunFactory(agent=agent, issue=issue, status="queued")
    for status in ("queued", "scheduled_retry"):
        with pytest.raises(IntegrityError), transaction.atomic():
            RunFactory(agent=agent, issue=issue, status=status)
    # a started, finished or stopping run, another issue or an agent-level run do not hold the slot
    RunFactory(agent=agent, issue=issue, status="running")
    RunFactory(agent=agent, issue=issue, status="succeeded", finished_at=timezone.now())
    RunFactory(agent=agent, issue=IssueFactory(company=company), status="queued")
    RunFactory(agent=agent, status="queued")
    RunFactory(agent=agent, status="queued")
    HeartbeatRun.objects.filter(pk=queued.pk).update(stop_requested_at=timezone.now())
    RunFactory(agent=agent, issue=issue, status="queued")


# --- what a coalesced wake does (the insert-only path on PostgreSQL, the full path on SQLite) --
def read_run(pk) -> HeartbeatRun:
    """The run as the API reads it (GET /api/runs/{id}, /agents/me/wake): with unfolded wakes."""
    return runs_with_pending_wakes([HeartbeatRun.objects.get(pk=pk)])[0]


@pytest.mark.django_db
def test_a_coalesced_wake_records_itself_and_its_run_reads_and_folds_it_in_order(company):
    agent, issue = AgentFactory(company=company), IssueFactory(company=company)
    first = wake(agent, issue, reason="issue_assigned", context={"taskPacket": "old", "keep": "me"})
    second = wake(agent, issue, reason="issue_commented", context={"taskPacket": "new", "commentIds": ["x"]})
    silent = wake(agent, issue)  # no reason: the run's newest reason stays
    assert first.status == "claimed" and second.status == silent.status == "coalesced"
    assert second.run_id == silent.run_id == first.run_id
    stored = WakeupRequest.objects.get(pk=second.pk)
    assert (stored.status, stored.run_id, stored.reason, stored.context) == (
        "coalesced", first.run_id, "issue_commented", {"taskPacket": "new", "commentIds": ["x"]})

    def assert_merged(run):
        assert run.wake_reason == "issue_commented"
        assert run.context["wakeReasons"] == ["issue_assigned", "issue_commented"]
        assert (run.context["taskPacket"], run.context["keep"], run.context["commentIds"]) == ("new", "me", [])

    assert_merged(read_run(first.run_id))  # readers see the wakes before any fold
    wakeups_fold(run_id=first.run_id)  # as the run starts
    assert not WakeupRequest.objects.filter(run_id=first.run_id, folded=False).exists()
    assert WakeupRequest.objects.get(pk=first.pk).coalesced_count == 2
    run = HeartbeatRun.objects.get(pk=first.run_id)
    assert_merged(run)
    assert_merged(read_run(first.run_id))  # and nothing is applied twice
    audit = ActivityLog.objects.get(action="agent.wakeup_requested", details__wakeupId=str(second.pk))
    assert audit.run_id == first.run_id and audit.actor_type == "system"
    assert audit.details == {"wakeupId": str(second.pk), "status": "coalesced", "source": "on_demand",
                             "issueId": str(issue.pk), "skipReason": ""}
    for n in range(WAKE_REASONS_KEPT + 3):
        wake(agent, issue, reason=f"ping {n}")
    kept = [f"ping {n}" for n in range(3, WAKE_REASONS_KEPT + 3)]
    assert read_run(first.run_id).context["wakeReasons"] == kept
    # a wake of the full path (comment ids) folds the earlier ones first: arrival order is kept
    comment = Comment.objects.create(company=company, issue=issue, author_type="user", body="more")
    wake(agent, issue, reason="last", comment_ids=[comment.pk])
    run.refresh_from_db()
    assert run.context["wakeReasons"] == kept[1:] + ["last"] and run.wake_reason == "last"
    assert WakeupRequest.objects.get(pk=first.pk).coalesced_count == 2 + WAKE_REASONS_KEPT + 3 + 1


@pytest.mark.django_db
def test_the_run_ends_with_every_wake_that_joined_it(company):
    agent, issue = AgentFactory(company=company), IssueFactory(company=company)
    first = wake(agent, issue, reason="go")
    HeartbeatRun.objects.filter(pk=first.run_id).update(status="running", started_at=timezone.now())
    joined = [wake(agent, issue, reason=f"while running {n}") for n in range(3)]
    run = run_finish(run=HeartbeatRun.objects.get(pk=first.run_id), status="succeeded")
    assert run.context["wakeReasons"] == ["go"] + [f"while running {n}" for n in range(3)]
    assert HeartbeatRun.objects.get(pk=run.pk).context == run.context
    rows = WakeupRequest.objects.filter(pk__in=[first.pk] + [w.pk for w in joined])
    assert set(rows.values_list("status", "folded")) == {("completed", True)}
    assert WakeupRequest.objects.get(pk=first.pk).coalesced_count == 3
    assert wakeups_fold_sweep() == {"foldedWakes": 0, "latePlacedWakes": 0}


@pytest.mark.django_db
def test_a_wake_with_a_skip_reason_never_joins_the_live_run(company):
    agent, issue = AgentFactory(company=company), IssueFactory(company=company)
    first = wake(agent, issue, reason="go")
    agent.status = "paused"
    agent.save()
    assert wake(agent, issue, reason="more").skip_reason == "agent_paused"
    agent.status, agent.budget_monthly_cents, agent.spent_monthly_cents = "idle", 100, 100
    agent.save()
    assert wake(agent, issue).skip_reason == "budget_exceeded"
    agent.budget_monthly_cents = 0
    agent.save()
    issue.status = "done"
    issue.save()
    assert wake(agent, issue).skip_reason == "issue_terminal"
    wakeups_fold(run_id=first.run_id)
    primary = WakeupRequest.objects.get(pk=first.pk)
    assert primary.coalesced_count == 0 and primary.run.wake_reason == "go"


@pytest.mark.django_db
def test_idempotency_key_and_rollback_with_the_callers_transaction(company):
    agent, issue = AgentFactory(company=company), IssueFactory(company=company)
    first = wake(agent, issue)
    keyed = wake(agent, issue, idempotency_key="k")
    assert keyed.status == "coalesced"
    assert wake(agent, issue, idempotency_key="k").pk == keyed.pk
    with pytest.raises(RuntimeError), transaction.atomic():  # a caller's transaction that fails
        wake(agent, issue, reason="rolled back")
        raise RuntimeError
    assert WakeupRequest.objects.filter(agent=agent).count() == 2
    wakeups_fold(run_id=first.run_id)
    primary = WakeupRequest.objects.get(pk=first.pk)
    assert primary.coalesced_count == 1 and primary.run.wake_reason == ""


@pytest.mark.django_db
def test_the_run_after_a_stopping_one_is_queued_beside_it_and_later_comments_join_it(company):
    agent, issue = AgentFactory(company=company), IssueFactory(company=company)
    stopping = wake(agent, issue, reason="go").run
    HeartbeatRun.objects.filter(pk=stopping.pk).update(status="running", stop_requested_at=timezone.now())
    after = wake(agent, issue, reason="comment 1", run_fields={"source_run": stopping})
    again = wake(agent, issue, reason="comment 2", run_fields={"source_run": stopping})
    assert after.status == "claimed" and after.run_id != stopping.pk
    assert again.status == "coalesced" and again.run_id == after.run_id
    assert HeartbeatRun.objects.filter(agent=agent, issue=issue, status__in=("queued", "running")).count() == 2


# --- real concurrent clients ------------------------------------------------------------------------
@postgres_only
@pytest.mark.django_db(transaction=True)
def test_opt_in_asynchronous_commit_coalesces_the_same_way(company, settings):
    """PAPERCLIP_WAKE_COALESCE_ASYNC_COMMIT (off by default) changes durability only."""
    settings.PAPERCLIP = {**settings.PAPERCLIP, "WAKE_COALESCE_ASYNC_COMMIT": True}
    agent, issue = AgentFactory(company=company), IssueFactory(company=company)
    run_threads(4, lambda i: [wake(agent, issue, reason=f"t{i} #{j}") for j in range(10)])
    assert_one_run(agent, issue, 40)
    with connection.cursor() as cursor:  # the setting was local to each wake's statement
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "on"


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_1000_concurrent_wakes_for_a_fresh_issue_make_exactly_one_run(company):
    agent, issue = AgentFactory(company=company), IssueFactory(company=company)

    def wakes(i):
        for j in range(125):
            wake(agent, issue, reason=f"t{i} #{j}")

    run_threads(8, wakes)
    run = assert_one_run(agent, issue, 1000)
    assert len(run.context["wakeReasons"]) == WAKE_REASONS_KEPT
    assert run.wake_reason == run.context["wakeReasons"][-1]


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_racing_first_wakes_for_many_issues_each_make_exactly_one_run(company):
    """The first wakes of an issue race to create its run: the constraint lets one win."""
    agent = AgentFactory(company=company)
    issues = [IssueFactory(company=company) for _ in range(30)]
    run_threads(8, lambda i: [wake(agent, issue, reason=f"t{i}") for issue in issues])
    for issue in issues:
        assert_one_run(agent, issue, 8)


@postgres_only
@pytest.mark.django_db
def test_the_sweep_folds_every_run_however_many_wakes_the_newest_one_has(company):
    """Its bound counts runs, not wakes: a busy run's newer wakes never crowd an older one out."""
    agent, quiet, busy = AgentFactory(company=company), IssueFactory(company=company), IssueFactory(company=company)
    wake(agent, quiet, reason="go")
    wake(agent, quiet, reason="quiet")
    wake(agent, busy, reason="go")
    for n in range(6):
        wake(agent, busy, reason=f"busy {n}")
    assert WakeupRequest.objects.filter(folded=False).count() == 7
    assert wakeups_fold_sweep(limit=2) == {"foldedWakes": 7, "latePlacedWakes": 0}
    assert HeartbeatRun.objects.get(issue=quiet).wake_reason == "quiet"


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_wake_that_joins_a_run_in_the_instant_it_ends_is_placed_again_by_the_sweep(company):
    """The fast path reads the run live and locks nothing; the run ends before the wake commits.
    The wake is not lost: the sweep gives it the run a wake after the end would get."""
    agent, issue = AgentFactory(company=company), IssueFactory(company=company)
    first = wake(agent, issue, reason="go")
    HeartbeatRun.objects.filter(pk=first.run_id).update(status="running", started_at=timezone.now())
    inserted, ended, result = threading.Event(), threading.Event(), {}

    def late():
        try:
            with transaction.atomic():
                result["wake"] = wake(agent, issue, reason="late")
                inserted.set()
                assert ended.wait(30)  # commits only after the run has ended
        finally:
            connection.close()

    thread = threading.Thread(target=late)
    thread.start()
    assert inserted.wait(30)
    run = run_finish(run=HeartbeatRun.objects.get(pk=first.run_id), status="succeeded")
    ended.set()
    thread.join(30)
    late_wake = result["wake"]
    assert (late_wake.status, late_wake.run_id) == ("coalesced", run.pk)
    assert "late" not in run.context["wakeReasons"]  # the finish could not see it
    assert wakeups_fold_sweep()["latePlacedWakes"] == 1
    stored = WakeupRequest.objects.select_related("run").get(pk=late_wake.pk)
    assert stored.folded and stored.run_id != run.pk and stored.run.status in ("queued", "running")
    assert read_run(stored.run_id).context["wakeReasons"][-1] == "late"
    assert ActivityLog.objects.filter(action="agent.wakeup_promoted", details__wakeupId=str(stored.pk),
                                      details__afterRunId=str(run.pk)).exists()
    assert wakeups_fold_sweep()["latePlacedWakes"] == 0  # once


DISPATCHER = """
import json, os, sys, time
import django
django.setup()
from issues.services.dispatch import dispatch_claim
owner, stop = sys.argv[1], sys.argv[2]
claimed = []
print("ready", flush=True)
while not os.path.exists(stop):  # the worker's and the Celery task's pass: one batched claim
    claimed += [str(run.pk) for run in dispatch_claim(owner=owner, limit=100)]
    time.sleep(0.01)  # pacing of the poll loop on a shared CPU
print(json.dumps(claimed), flush=True)
"""


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_exactly_one_run_per_issue_for_1000_wakes_while_two_dispatcher_processes_claim(company, tmp_path):
    agent = AgentFactory(company=company, adapter_type="process", runtime_config={"maxConcurrentRuns": 100})
    issues = [IssueFactory(company=company) for _ in range(25)]
    db = connection.settings_dict
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "paperclip.settings", "CELERY_BROKER_URL": "",
           "DATABASE_URL": f"postgres://{db['USER']}:{db['PASSWORD'] or ''}@{db['HOST']}:{db['PORT']}/{db['NAME']}"}
    stop = tmp_path / "stop"
    procs = [subprocess.Popen([sys.executable, "-c", DISPATCHER, f"proc{n}", str(stop)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, text=True) for n in range(2)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        run_threads(8, lambda i: [wake(agent, issues[(i + j) % 25], reason=f"t{i} #{j}") for j in range(125)])
        # every run gets claimed by one of the two processes (they poll until told to stop)
        deadline = timezone.now() + timezone.timedelta(seconds=120)
        while HeartbeatRun.objects.filter(agent=agent, status="queued").exists() and timezone.now() < deadline:
            threading.Event().wait(0.1)
        stop.touch()
        claims = [json.loads(p.communicate(timeout=60)[0].strip()) for p in procs]
    finally:
        stop.touch()
        for p in procs:
            if p.poll() is None:
                p.kill()
    claimed = [run_id for c in claims for run_id in c]
    assert len(claimed) == len(set(claimed)) == 25  # each run claimed once, by one process
    for issue in issues:
        run = assert_one_run(agent, issue, 40)
        assert run.status == "running" and run.owner in ("proc0", "proc1") and str(run.pk) in claimed
