"""Batched dispatcher claims (issue #19): one pass decides many queued runs in one transaction,
with a query count that does not grow with the queue, and keeps every rule of a single claim
(pause, budget, per-agent maxConcurrentRuns, per-project max_concurrent_agents, scheduled retries,
``run.started`` audit rows). Racing passes on their own connections never claim a run twice nor
put an agent or a project over its limit: the evidence is PostgreSQL (SKIP LOCKED, row locks);
SQLite serializes writers (IMMEDIATE transactions) and runs fewer trials."""
import sys
import threading
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from issues.models import ActivityLog, HeartbeatRun
from issues.services import dispatch
from tests.conftest import is_postgres
from tests.factories import AgentFactory, CompanyFactory, IssueFactory, ProjectFactory, RunFactory


def agent_in(company, **kw):
    return AgentFactory(company=company, adapter_type="process", **kw)


def queued(agent, project=None, **kw):
    """A queued run of ``agent`` on a fresh issue (in ``project``)."""
    issue = IssueFactory(company=agent.company, project=project, assignee_agent=agent)
    return RunFactory(agent=agent, issue=issue, adapter_type="process", **{"status": "queued", **kw})


def running_per_agent():
    return Counter(HeartbeatRun.objects.filter(status="running").values_list("agent_id", flat=True))


# --- one pass ---------------------------------------------------------------------------------
@pytest.mark.django_db
def test_a_claim_pass_costs_the_same_queries_for_10_and_100_runs():
    counts = []
    for n in (10, 100):
        company = CompanyFactory()
        run_ids = {queued(agent_in(company)).pk for _ in range(n)}
        connection.queries_log.clear()
        with CaptureQueriesContext(connection) as ctx:
            claimed = dispatch.dispatch_claim(owner="test:1", limit=n)
        assert {run.pk for run in claimed} == run_ids
        assert HeartbeatRun.objects.filter(pk__in=run_ids, status="running", owner="test:1",
                                           started_at__isnull=False).count() == n
        started = ActivityLog.objects.filter(action="run.started", run_id__in=run_ids)
        assert started.count() == n and all(row.details == {"owner": "test:1"} for row in started)
        counts.append(len(ctx.captured_queries))
    assert counts[0] == counts[1], counts


@pytest.mark.django_db
def test_a_pass_cancels_paused_terminated_and_over_budget_agents_runs(company):
    paused, gone = agent_in(company, status="paused"), agent_in(company, status="terminated")
    broke = agent_in(company, budget_monthly_cents=10, spent_monthly_cents=10)
    fine = agent_in(company, budget_monthly_cents=10, spent_monthly_cents=9)
    held = agent_in(company, status="paused", pause_reason="company_archived")  # its company's stop
    runs = {name: queued(agent) for name, agent in
            (("paused", paused), ("gone", gone), ("broke", broke), ("fine", fine), ("held", held))}
    claimed = dispatch.dispatch_claim(owner="test:1")
    assert [run.pk for run in claimed] == [runs["fine"].pk]
    outcome = {name: HeartbeatRun.objects.values_list("status", "error").get(pk=run.pk) for name, run in runs.items()}
    assert outcome == {"paused": ("cancelled", "agent_paused"), "gone": ("cancelled", "agent_terminated"),
                       "broke": ("cancelled", "budget_exceeded"), "fine": ("running", ""),
                       "held": ("cancelled", "company_archived")}
    assert not ActivityLog.objects.filter(action="run.started", run_id__in=[runs["paused"].pk]).exists()


@pytest.mark.django_db
def test_a_pass_keeps_agent_and_project_limits_counting_runs_already_running(company):
    two = agent_in(company, runtime_config={"maxConcurrentRuns": 2})
    one = agent_in(company)  # maxConcurrentRuns defaults to 1
    RunFactory(agent=two, status="running")
    two_runs = [queued(two) for _ in range(3)]
    one_runs = [queued(one) for _ in range(2)]
    project = ProjectFactory(company=company, run_settings={"maxConcurrentAgents": 2})
    in_project = [queued(agent_in(company), project) for _ in range(4)]
    own_limit = agent_in(company, runtime_config={"maxConcurrentAgents": 5})  # the agent's setting wins
    own_runs = [queued(agent_in(company, runtime_config={"maxConcurrentAgents": 5}), project) for _ in range(2)]
    own_runs.append(queued(own_limit, project))

    claimed = {run.pk for run in dispatch.dispatch_claim(owner="test:1")}
    assert claimed & {r.pk for r in two_runs} == {two_runs[0].pk}  # one was running already
    assert claimed & {r.pk for r in one_runs} == {one_runs[0].pk}
    assert claimed & {r.pk for r in in_project} == {in_project[0].pk, in_project[1].pk}
    assert {r.pk for r in own_runs} <= claimed  # 2 + 3 = 5 running in the project, within their own limit
    assert dispatch.dispatch_claim(owner="test:1") == []  # nothing else fits until a run ends
    assert dispatch.dispatch_runs() == []  # the read-only preview agrees


@pytest.mark.django_db
def test_max_claims_bounds_the_pass_and_full_agents_do_not_block_later_runs(company):
    full = agent_in(company)
    RunFactory(agent=full, status="running")
    blocked = [queued(full) for _ in range(3)]  # the oldest queued runs cannot start
    later = [queued(agent_in(company)) for _ in range(4)]
    claimed = dispatch.dispatch_claim(owner="test:1", max_claims=2)
    assert [run.pk for run in claimed] == [later[0].pk, later[1].pk]
    assert HeartbeatRun.objects.filter(pk__in=[r.pk for r in blocked], status="queued").count() == 3
    assert [run.pk for run in dispatch.dispatch_claim(owner="test:1")] == [later[2].pk, later[3].pk]


@pytest.mark.django_db
def test_due_scheduled_retries_are_promoted_and_claimed_in_the_same_pass(company):
    now = timezone.now()
    due = queued(agent_in(company), status="scheduled_retry", scheduled_for=now - timedelta(seconds=1))
    later = queued(agent_in(company), status="scheduled_retry", scheduled_for=now + timedelta(minutes=5))
    assert [run.pk for run in dispatch.dispatch_claim(owner="test:1", now=now)] == [due.pk]
    later.refresh_from_db()
    assert later.status == "scheduled_retry"


@pytest.mark.django_db
def test_run_claim_is_a_pass_over_one_run(company):
    agent = agent_in(company)
    first, second = queued(agent), queued(agent)
    assert dispatch.run_claim(run_id=second.pk, owner="test:1").status == "running"
    assert dispatch.run_claim(run_id=first.pk, owner="test:1") is None  # the agent is at its limit
    assert dispatch.run_claim(run_id=second.pk, owner="test:1") is None  # not queued any more


# --- executing a claimed run -------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_a_claimed_run_is_taken_over_and_executed_once():
    company = CompanyFactory()
    agent = AgentFactory(company=company, adapter_type="process",
                         adapter_config={"command": [sys.executable, "-c", "pass"]})
    run = RunFactory(agent=agent, status="queued", adapter_type="process")
    [claimed] = dispatch.dispatch_claim(owner="dispatcher:1")
    assert dispatch.run_execute(run_id=run.pk, owner="worker:2", claimed_by="someone-else:3") is None
    assert HeartbeatRun.objects.get(pk=run.pk).status == "running"  # untouched by the wrong claimant
    done = dispatch.run_execute(run_id=claimed.pk, owner="worker:2", claimed_by="dispatcher:1")
    assert done.status == "succeeded" and done.owner == "worker:2" and done.exit_code == 0
    # A redelivered task finds the run taken over (here: ended) and does nothing.
    assert dispatch.run_execute(run_id=run.pk, owner="worker:4", claimed_by="dispatcher:1") is None
    assert HeartbeatRun.objects.get(pk=run.pk).owner == "worker:2"


# --- racing dispatchers ------------------------------------------------------------------------
def race(passes):
    """Run each ``passes[i]()`` on its own thread and database connection, released together;
    returns what each returned."""
    barrier = threading.Barrier(len(passes))
    results, errors = [None] * len(passes), []

    def go(index, claim_pass):
        try:
            barrier.wait(timeout=30)
            results[index] = claim_pass()
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(repr(exc))
        finally:
            connection.close()

    threads = [threading.Thread(target=go, args=(i, p)) for i, p in enumerate(passes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and not any(t.is_alive() for t in threads), errors
    return results


def claiming(owner, **kw):
    """Passes until one claims nothing: what a dispatcher loop does."""
    def loop():
        claimed = []
        while batch := dispatch.dispatch_claim(owner=owner, **kw):
            claimed += [run.pk for run in batch]
        return claimed
    return loop


@pytest.mark.django_db(transaction=True)
def test_racing_dispatchers_never_claim_a_run_twice_nor_exceed_a_limit():
    trials = 8 if is_postgres() else 2
    for trial in range(trials):
        company = CompanyFactory()
        project = ProjectFactory(company=company, run_settings={"maxConcurrentAgents": 3})
        agents = [agent_in(company, runtime_config={"maxConcurrentRuns": 1 + i % 3}) for i in range(8)]
        limit = {a.pk: 1 + i % 3 for i, a in enumerate(agents)}
        # Six queued runs per agent, interleaved in age; the last two agents work in the project.
        run_ids = [queued(a, project if i >= 6 else None).pk for _ in range(6) for i, a in enumerate(agents)]
        odd, even = run_ids[1::2], run_ids[0::2]  # each agent has runs in both halves
        # Two passes over the whole queue (SKIP LOCKED keeps their candidates apart), then two over
        # disjoint halves that share every agent (only the agent and project locks keep them apart).
        first = race([claiming("a:1", limit=5), claiming("b:2", limit=5)])
        assert len(first[0] + first[1]) == len(set(first[0] + first[1])), (trial, "a run was claimed twice")
        live = running_per_agent()
        assert all(live[pk] <= limit[pk] for pk in live), (trial, live)
        assert sum(live[a.pk] for a in agents[6:]) <= 3, (trial, live)  # the project's limit
        HeartbeatRun.objects.filter(status="running").update(status="succeeded", finished_at=timezone.now())

        second = race([claiming("a:1", run_ids=odd, limit=4), claiming("b:2", run_ids=even, limit=4)])
        claimed = second[0] + second[1]
        assert len(claimed) == len(set(claimed)), (trial, "a run was claimed twice")
        live = running_per_agent()
        assert all(live[pk] <= limit[pk] for pk in live), (trial, live)
        assert sum(live[a.pk] for a in agents[6:]) <= 3, (trial, live)
        # A last pass fills what the racers left (a small window can be full of agents at their
        # limit): then every agent outside the project is at its limit, and the project is full.
        claimed += [run.pk for run in dispatch.dispatch_claim(owner="c:3", limit=len(run_ids))]
        live = running_per_agent()
        assert all(live[a.pk] == limit[a.pk] for a in agents[:6]), (trial, live)
        assert sum(live[a.pk] for a in agents[6:]) == 3, (trial, live)
        assert sorted(claimed) == sorted(HeartbeatRun.objects.filter(status="running").values_list("pk", flat=True))
        started = Counter(ActivityLog.objects.filter(action="run.started", run_id__in=run_ids)
                          .values_list("run_id", flat=True))
        assert set(started.values()) == {1} and len(started) == len(first[0] + first[1] + claimed), trial
        HeartbeatRun.objects.filter(company=company, status__in=("running", "queued")).update(
            status="cancelled", finished_at=timezone.now())
