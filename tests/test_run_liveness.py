"""Every agent kind stays alive while it works (issue #13): API calls made from a run are its
liveness (throttled), a `process` run without output or API activity is stopped as stalled and
retried, and a run that only recorded a work product advanced. Real HTTP and real processes."""
import sys
import textwrap
import time

import httpx
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from issues.actors import SYSTEM
from issues.models import HeartbeatRun, RunEvent
from issues.services import dispatch, runs
from issues.services.companies import agent_api_key_create
from issues.services.wakeups import agent_wakeup
from tests.factories import AgentFactory, IssueFactory

PY = sys.executable
STALE = 1  # seconds: the heartbeat-stale threshold these tests run under


@pytest.fixture
def short_stale(settings, tmp_path):
    settings.PAPERCLIP = {**settings.PAPERCLIP, "RUN_HEARTBEAT_STALE_SECONDS": STALE,
                          "RUN_ACTIVITY_THROTTLE_SECONDS": 0, "WORKSPACE_ROOT": str(tmp_path / "workspaces")}


def wake(agent, issue):
    return agent_wakeup(actor=SYSTEM, agent=agent, issue=issue, reason="assigned").run


def external_agent_api(live_server, agent, run):
    """What an agent on the `none` adapter holds: its own key and the run id its wake returned."""
    _, raw = agent_api_key_create(agent=agent)
    return httpx.Client(base_url=f"{live_server.url}/api", timeout=10, headers={
        "Authorization": f"Bearer {raw}", "X-Paperclip-Run-Id": str(run.pk)})


def reaped(run) -> bool:
    swept = [r.pk for r in runs.runs_reap_stale()]
    run.refresh_from_db()
    return run.pk in swept


# --- API activity is liveness ---------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_external_agent_working_through_the_api_outlives_the_stale_threshold_then_silence_reaps_it(
        live_server, short_stale, company):
    agent = AgentFactory(company=company, adapter_type="none")
    issue = IssueFactory(company=company, assignee_agent=agent, title="Long task")
    run = wake(agent, issue)
    assert run.status == "queued"
    with external_agent_api(live_server, agent, run) as api:
        # Reading first (the run stays queued until its first mutation) for longer than the threshold.
        until = time.monotonic() + 2 * STALE
        while time.monotonic() < until:
            assert api.get("/agents/me").status_code == 200
            assert api.get(f"/issues/{issue.pk}").status_code == 200
            assert not reaped(run) and run.status == "queued"
            time.sleep(0.3)  # the agent's own pace between calls
        response = api.post(f"/issues/{issue.pk}/checkout",
                            json={"agentId": str(agent.pk), "expectedStatuses": ["todo"]})
        assert response.status_code == 200, response.text
        run.refresh_from_db()
        assert run.status == "running"
        # Working (reads, comments, PATCHes) three times as long as the stale threshold.
        until, step = time.monotonic() + 3 * STALE, 0
        while time.monotonic() < until:
            step += 1
            assert api.get("/agents/me").status_code == 200
            assert api.post(f"/issues/{issue.pk}/comments", json={"body": f"step {step}"}).status_code == 201
            assert api.patch(f"/issues/{issue.pk}", json={"description": f"after step {step}"}).status_code == 200
            assert not reaped(run), f"reaped after {step} steps"
            assert run.status == "running" and run.last_activity_at is not None
            time.sleep(0.3)
        assert step >= 5

    # Silence: past the threshold the sweep abandons the run and retries it.
    silent_since = time.monotonic()
    while not reaped(run):
        assert time.monotonic() - silent_since < 10 * STALE, "a silent external run was never reaped"
        time.sleep(0.2)
    assert (run.finished_at - run.last_heartbeat_at).total_seconds() >= STALE  # reaped only after going quiet
    assert run.status == "timed_out" and run.error.startswith("heartbeat stale")
    assert HeartbeatRun.objects.filter(agent=agent, status="scheduled_retry", wake_reason="process_lost_retry",
                                       retry_attempt=1).count() == 1


@pytest.mark.django_db
def test_api_activity_is_written_once_per_throttle_window_with_one_update(settings, company):
    settings.PAPERCLIP = {**settings.PAPERCLIP, "RUN_ACTIVITY_THROTTLE_SECONDS": 60}
    agent = AgentFactory(company=company, adapter_type="none")
    run = wake(agent, IssueFactory(company=company, assignee_agent=agent))
    _, raw = agent_api_key_create(agent=agent)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}", HTTP_X_PAPERCLIP_RUN_ID=str(run.pk))
    assert run.last_activity_at is None

    with CaptureQueriesContext(connection) as first:
        assert client.get("/api/agents/me").status_code == 200
    run.refresh_from_db()
    written = run.last_activity_at
    assert written is not None and run.last_heartbeat_at == written

    with CaptureQueriesContext(connection) as second:
        assert client.get("/api/agents/me").status_code == 200
    run.refresh_from_db()
    assert run.last_activity_at == written and run.last_heartbeat_at == written  # throttled: no second write
    touching = [q["sql"] for q in first.captured_queries if "last_activity_at" in q["sql"]]
    assert len(touching) == 1 and touching[0].lstrip().upper().startswith("UPDATE")  # no read first
    # Within the window this process does not even ask the database again.
    assert not [q["sql"] for q in second.captured_queries if "last_activity_at" in q["sql"]]

    # Another agent naming this run in its header refreshes nothing.
    settings.PAPERCLIP = {**settings.PAPERCLIP, "RUN_ACTIVITY_THROTTLE_SECONDS": 0}
    other = AgentFactory(company=company)
    _, other_raw = agent_api_key_create(agent=other)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {other_raw}", HTTP_X_PAPERCLIP_RUN_ID=str(run.pk))
    client.get("/api/agents/me")
    run.refresh_from_db()
    assert run.last_activity_at == written


# --- stall detection --------------------------------------------------------------------------------
def process_agent(company, script, stall=1, **runtime):
    return AgentFactory(company=company, adapter_type="process",
                        adapter_config={"command": [PY, "-c", textwrap.dedent(script)], "grace_seconds": 2},
                        runtime_config={"stallTimeoutSeconds": stall, **runtime})


def execute(run):
    started = time.monotonic()
    dispatch.run_execute(run_id=run.pk, owner=runs.this_owner())
    run.refresh_from_db()
    return time.monotonic() - started


@pytest.mark.django_db
def test_hung_process_is_stopped_as_stalled_and_retried_with_backoff(short_stale, company):
    agent = process_agent(company, "import time; time.sleep(60)")
    issue = IssueFactory(company=company, assignee_agent=agent)
    run = wake(agent, issue)
    took = execute(run)
    assert run.status == "timed_out", run.error
    assert run.error == "stalled: no output or API activity for 1s"
    assert took < 20  # not the 60 s the agent wanted to sleep, nor the run timeout
    events = [e.message for e in RunEvent.objects.filter(run=run).order_by("seq")]
    assert any(m.startswith("stalled: no output or API activity for 1s; terminating process group") for m in events)
    retry = HeartbeatRun.objects.get(agent=agent, status="scheduled_retry")
    assert (retry.retry_attempt, retry.wake_reason, retry.issue_id) == (1, "process_lost_retry", issue.pk)
    assert retry.scheduled_for is not None and retry.source_run_id == run.pk
    assert retry.context["previousStatus"] == "timed_out"


@pytest.mark.django_db
def test_chatty_process_is_not_stalled(short_stale, company):
    agent = process_agent(company, """
        import time
        for n in range(15):
            print("working", n, flush=True)
            time.sleep(0.2)
    """)
    run = wake(agent, IssueFactory(company=company, assignee_agent=agent))
    took = execute(run)
    assert run.status == "succeeded", run.error
    assert took >= 2.5  # it ran well past the 1 s stall timeout
    assert not HeartbeatRun.objects.filter(agent=agent, status="scheduled_retry").exists()


@pytest.mark.django_db(transaction=True)
def test_quiet_process_that_calls_the_api_is_not_stalled(live_server, short_stale, settings, company):
    settings.PAPERCLIP = {**settings.PAPERCLIP, "API_URL": f"{live_server.url}/api"}
    agent = process_agent(company, """
        import os, time, urllib.request
        me = urllib.request.Request(os.environ["PAPERCLIP_API_URL"] + "/api/agents/me",
                                    headers={"Authorization": "Bearer " + os.environ["PAPERCLIP_API_KEY"]})
        end = time.monotonic() + 3
        while time.monotonic() < end:
            urllib.request.urlopen(me, timeout=10).read()  # nothing printed: only API calls
            time.sleep(0.3)
    """)
    run = wake(agent, IssueFactory(company=company, assignee_agent=agent))
    took = execute(run)
    assert run.status == "succeeded", run.error
    assert took >= 3
    assert not RunEvent.objects.filter(run=run, kind__in=("stdout", "stderr")).exists()


@pytest.mark.django_db
def test_heartbeat_events_keep_the_lock_but_are_not_activity(company):
    agent = AgentFactory(company=company)
    run = wake(agent, IssueFactory(company=company, assignee_agent=agent))
    runs.run_append_event(run_id=run.pk, kind="heartbeat", message="pid 1 alive")
    run.refresh_from_db()
    assert run.last_heartbeat_at is not None and run.last_activity_at is None
    runs.run_append_event(run_id=run.pk, kind="stdout", message="real output")
    run.refresh_from_db()
    assert run.last_activity_at == run.last_heartbeat_at


@pytest.mark.django_db
def test_stale_threshold_is_each_runs_own_policy(settings, company):
    from datetime import timedelta

    from django.utils import timezone

    settings.PAPERCLIP = {**settings.PAPERCLIP, "RUN_HEARTBEAT_STALE_SECONDS": 300}
    patient = AgentFactory(company=company)
    strict = AgentFactory(company=company, runtime_config={"heartbeatStaleSeconds": 30})
    seen = timezone.now() - timedelta(seconds=60)
    patient_run = wake(patient, IssueFactory(company=company, assignee_agent=patient))
    strict_run = wake(strict, IssueFactory(company=company, assignee_agent=strict))
    HeartbeatRun.objects.filter(pk__in=[patient_run.pk, strict_run.pk]).update(status="running",
                                                                               last_heartbeat_at=seen)
    assert [r.pk for r in runs.runs_reap_stale()] == [strict_run.pk]
    patient_run.refresh_from_db()
    assert patient_run.status == "running"


# --- work products are progress -------------------------------------------------------------------------
@pytest.mark.django_db
def test_a_run_that_only_records_a_work_product_advanced(make_agent_client, company):
    client = make_agent_client(company=company, with_run=False)
    issue = IssueFactory(company=company, assignee_agent=client.agent)
    run = wake(client.agent, issue)
    client.use_run(run)
    assert client.post(f"/api/issues/{issue.pk}/checkout", {"agentId": str(client.agent.pk),
                                                             "expectedStatuses": ["todo"]},
                       format="json").status_code == 200
    response = client.post(f"/api/issues/{issue.pk}/work-products",
                           {"kind": "pull_request", "url": "https://example.invalid/pr/1", "title": "PR"},
                           format="json")
    assert response.status_code == 201, response.content
    finished = runs.run_finish(run=HeartbeatRun.objects.get(pk=run.pk), status="succeeded")
    assert (finished.liveness, finished.liveness_reason) == ("advanced", "durable progress recorded")
    assert not HeartbeatRun.objects.filter(agent=client.agent, continuation_attempt=1).exists()


# --- project concurrency (run policy max_concurrent_agents) -----------------------------------------------
@pytest.mark.django_db
def test_dispatch_and_claim_respect_the_projects_concurrency_limit(company):
    from tests.factories import ProjectFactory

    project = ProjectFactory(company=company, run_settings={"maxConcurrentAgents": 1})
    first, second, elsewhere = (AgentFactory(company=company, adapter_type="process") for _ in range(3))
    r1 = wake(first, IssueFactory(company=company, project=project, assignee_agent=first))
    r2 = wake(second, IssueFactory(company=company, project=project, assignee_agent=second))
    r3 = wake(elsewhere, IssueFactory(company=company, assignee_agent=elsewhere))
    assert dispatch.dispatch_runs() == [r1.pk, r3.pk]  # one at a time in the project
    assert dispatch.run_claim(run_id=r1.pk, owner="test:1").status == "running"
    assert dispatch.run_claim(run_id=r2.pk, owner="test:1") is None  # the project is full
    assert dispatch.dispatch_runs() == [r3.pk]
    runs.run_finish(run=HeartbeatRun.objects.get(pk=r1.pk), status="succeeded", liveness="completed")
    assert dispatch.dispatch_runs() == [r2.pk, r3.pk]
    assert dispatch.run_claim(run_id=r2.pk, owner="test:1").status == "running"


@pytest.mark.django_db
def test_dispatch_queries_do_not_grow_with_queued_runs_in_limited_projects(company):
    from tests.factories import ProjectFactory

    projects = [ProjectFactory(company=company, run_settings={"maxConcurrentAgents": 100}) for _ in range(2)]
    counts = []
    for n in (4, 40):
        HeartbeatRun.objects.all().delete()
        for i in range(n):
            agent = AgentFactory(company=company, adapter_type="process")
            wake(agent, IssueFactory(company=company, project=projects[i % 2], assignee_agent=agent))
        with CaptureQueriesContext(connection) as ctx:
            assert len(dispatch.dispatch_runs()) == n
        counts.append(len(ctx.captured_queries))
    assert counts[0] == counts[1]
