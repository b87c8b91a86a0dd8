"""PRP projections (issues.runner.projections): what a committed event changes, through the real
intake (issues.runner.intake.runner_events, the service the HTTP view calls): usage delta versus
cumulative and the budget stop, the proposed result, the first and a second terminal, session
goals, credential revisions (never a secret), activity counts, runtime requests, the run detail
API, and statements per batch that do not grow with the batch."""
from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from issues.choices import RunStatus
from issues.models import (
    ActivityLog,
    AgentApiKey,
    CostEvent,
    HeartbeatRun,
    Interaction,
    Issue,
    RunEvent,
    RunnerCommand,
    RunnerEvent,
    RunnerSession,
)
from issues.runner import projections
from issues.runner.intake import runner_events
from issues.runner.negotiation import runner_hello
from tests.factories import AgentFactory, IssueFactory, MembershipFactory
from tests.runner_helpers import envelope, hello_body, runner_client, runner_run, session_goals_capability, source_key

MEASURE = {"inputTokens": 0, "outputTokens": 0, "cacheReadTokens": 0, "cacheWriteTokens": 0, "activeSeconds": 0,
           "requests": 0, "providerCostUsd": 0}


def measurement(**values) -> dict:
    return {**MEASURE, **values}


def usage(cumulative: dict, delta: dict | None, available=True, **extra) -> dict:
    doc = {"provider": "openai", "model": "gpt-5", "cumulative": cumulative, "runDelta": delta,
           "runDeltaAvailable": available, "costSource": "provider_reported"}
    doc.update(extra)
    return doc


def result(disposition="done", **extra) -> dict:
    doc = {"schema": "paperclip.run_result.v1", "reportedWorkDisposition": disposition, "summary": "All done.",
           "completionClaim": {"contractRevision": "r1", "objectiveSatisfied": True, "criteria": [],
                               "remainingWork": []},
           "evidence": [], "verification": [], "attentionRequests": [], "artifacts": []}
    doc.update(extra)
    return doc


def terminal(run_state="succeeded", disposition="done", turn_state="completed", **extra) -> dict:
    doc = {"schema": "paperclip.prp.terminal.v1", "turnTerminalState": turn_state, "runTerminalState": run_state,
           "reportedWorkDisposition": disposition}
    doc.update(extra)
    return doc


class Runner:
    """A run a runner said hello on; ``send`` commits a batch through the intake service."""

    def __init__(self, run, issue, version=2):
        self.run, self.issue, self.version, self.seq = run, issue, version, 0
        runner_hello(run=run, body=hello_body(version, version))

    def ev(self, event_type, payload=None, **fields) -> dict:
        self.seq += 1
        return envelope(self.seq, event_type, payload, run=self.run, version=self.version, **fields)

    def send(self, *events) -> dict:
        return runner_events(run=self.run, body={"events": list(events)})

    @property
    def session(self) -> RunnerSession:
        return RunnerSession.objects.get(pk=self.run.pk)

    def refresh(self):
        self.run.refresh_from_db()
        if self.issue is not None:
            self.issue.refresh_from_db()
        return self.run


def make_runner(*, budget=0, version=2, with_issue=True) -> Runner:
    agent = AgentFactory(adapter_type="runner", budget_monthly_cents=budget)
    run, _key = runner_run(agent=agent)
    issue = None
    if with_issue:
        issue = IssueFactory(company=agent.company, assignee_agent=agent, status="in_progress", checkout_run=run)
        HeartbeatRun.objects.filter(pk=run.pk).update(issue=issue)
        run.refresh_from_db()
    return Runner(run, issue, version)


@pytest.fixture
def prp(db):
    return make_runner()


def log_lines(run, needle) -> list[str]:
    return [m for m in RunEvent.objects.filter(run=run, kind="system").values_list("message", flat=True)
            if needle in m]


# --- usage -------------------------------------------------------------------------------------
def test_usage_counts_the_run_delta_and_keeps_cumulative_as_the_session_figure(prp):
    prp.send(prp.ev("usage.reported", usage(measurement(inputTokens=1000, outputTokens=50, providerCostUsd=2.0),
                                            measurement(inputTokens=100, outputTokens=10, cacheReadTokens=7,
                                                        providerCostUsd=0.25))))
    prp.send(prp.ev("usage.reported", usage(measurement(inputTokens=1200, outputTokens=70, providerCostUsd=2.5),
                                            measurement(inputTokens=200, outputTokens=20, providerCostUsd=0.5))))
    run = prp.refresh()
    assert (run.input_tokens, run.output_tokens, run.cost_cents) == (300, 30, 75)
    session = prp.session
    # The cumulative figure is the latest report's, never summed.
    assert session.usage["cumulative"]["inputTokens"] == 1200
    assert session.usage["cumulative"]["providerCostUsd"] == 2.5
    assert session.usage["reports"] == 2 and session.usage["runDeltaReports"] == 2
    rows = list(CostEvent.objects.filter(run=run).order_by("occurred_at", "pk"))
    assert [(r.provider, r.model, r.input_tokens, r.cached_input_tokens, r.output_tokens, r.cost_cents)
            for r in rows] == [("openai", "gpt-5", 100, 7, 10, 25), ("openai", "gpt-5", 200, 0, 20, 50)]
    run.agent.refresh_from_db()
    assert run.agent.spent_monthly_cents == 75


def test_a_delta_counts_only_when_run_delta_available_is_true(prp):
    prp.send(prp.ev("usage.reported", usage(measurement(inputTokens=500, providerCostUsd=3.0),
                                            measurement(inputTokens=500, providerCostUsd=3.0), available=False)))
    payload = usage(measurement(inputTokens=600, providerCostUsd=4.0), measurement(inputTokens=100, providerCostUsd=1))
    del payload["runDeltaAvailable"]  # absent is not true
    prp.send(prp.ev("usage.reported", payload))
    prp.send(prp.ev("usage.reported", usage(measurement(inputTokens=700), None, available=True)))
    run = prp.refresh()
    assert (run.input_tokens, run.cost_cents) == (0, 0)
    assert not CostEvent.objects.filter(run=run).exists()
    assert prp.session.usage["cumulative"]["inputTokens"] == 700


def test_sub_cent_deltas_add_up_to_cents(prp):
    """Three $0.004 deltas are 1.2 cents: one cent charged once the exact total reaches half a cent."""
    charged = []
    for _ in range(3):
        prp.send(prp.ev("usage.reported", usage(measurement(), measurement(outputTokens=1, providerCostUsd=0.004))))
        charged.append(prp.refresh().cost_cents)
    assert charged == [0, 1, 1]
    assert Decimal(prp.session.usage["charged"]["openai/gpt-5"]["costUsd"]) == Decimal("0.012")
    assert sum(CostEvent.objects.filter(run=prp.run).values_list("cost_cents", flat=True)) == 1


def test_a_batch_of_usage_is_one_ledger_row_per_provider_and_model(prp):
    events = [prp.ev("usage.reported", usage(measurement(), measurement(inputTokens=10, providerCostUsd=0.1)))
              for _ in range(5)]
    events.append(prp.ev("usage.reported", usage(measurement(), measurement(inputTokens=1, providerCostUsd=0.01),
                                                 provider="anthropic", model="claude")))
    prp.send(*events)
    rows = sorted(CostEvent.objects.filter(run=prp.run).values_list("provider", "input_tokens", "cost_cents"))
    assert rows == [("anthropic", 1, 1), ("openai", 50, 50)]
    assert prp.refresh().cost_cents == 51


def test_absurd_usage_saturates_instead_of_wedging_the_run(prp):
    """The schema sets no maximum; a count past the ledger's 64-bit columns must not turn every
    redelivery of the batch into a 500 (it would never be acknowledged)."""
    huge = measurement(inputTokens=10**20, outputTokens=10**20, providerCostUsd=1e17)
    ack = prp.send(prp.ev("usage.reported", usage(huge, huge)), prp.ev("usage.reported", usage(huge, huge)))
    assert ack["accepted"] == 2
    run = prp.refresh()
    assert run.input_tokens == run.output_tokens == run.cost_cents == 2**63 - 1
    assert max(CostEvent.objects.filter(run=run).values_list("input_tokens", flat=True)) == 2**63 - 1


def test_the_budget_hard_stop_is_run_cancel_over_the_command_lane(db):
    prp = make_runner(budget=100)
    prp.send(prp.ev("usage.reported", usage(measurement(), measurement(inputTokens=1, providerCostUsd=1.5))))
    run = prp.refresh()
    assert run.status == RunStatus.RUNNING and run.stop_reason == "budget_exceeded"  # waits for the terminal
    [stop] = RunnerCommand.objects.filter(run=run, command_type="run.cancel")
    assert stop.envelope["payload"]["reason"] == "budget_exceeded" and stop.confirm_by is not None
    # More spend: still the one stop command.
    prp.send(prp.ev("usage.reported", usage(measurement(), measurement(inputTokens=1, providerCostUsd=0.5))))
    assert RunnerCommand.objects.filter(run=run, command_type="run.cancel").count() == 1
    # The runner confirms with its terminal: the run ends cancelled, the stop is settled.
    prp.send(prp.ev("run.terminal", terminal("cancelled", "blocked", "cancelled")))
    run = prp.refresh()
    assert run.status == RunStatus.CANCELLED
    stop.refresh_from_db()
    assert stop.status == "succeeded" and stop.confirm_by is None


def test_no_budget_stop_when_the_run_ends_in_the_same_batch(db):
    prp = make_runner(budget=100)
    prp.send(prp.ev("usage.reported", usage(measurement(), measurement(providerCostUsd=2.0))),
             prp.ev("run.result.proposed", result()), prp.ev("run.terminal", terminal()))
    run = prp.refresh()
    assert run.status == RunStatus.SUCCEEDED and run.cost_cents == 200
    assert not RunnerCommand.objects.filter(run=run, command_type="run.cancel").exists()


# --- result and terminal ------------------------------------------------------------------------------
def test_the_latest_proposed_result_before_the_terminal_is_the_one(prp):
    prp.send(prp.ev("run.result.proposed", result(summary="First draft.")))
    prp.send(prp.ev("run.result.proposed", result(summary="Final.")))
    assert prp.session.proposed_result["summary"] == "Final."


def test_the_first_terminal_ends_the_run_with_the_host_decision(prp):
    first = prp.ev("run.result.proposed", result(summary="Shipped the fix."))
    end = prp.ev("run.terminal", terminal())
    prp.send(first, end)
    run = prp.refresh()
    assert run.status == RunStatus.SUCCEEDED and run.finished_at is not None
    assert (run.result_status, run.result_summary, run.result_final_state) == ("done", "Shipped the fix.", "done")
    assert run.liveness == "completed"
    assert prp.issue.status == "done" and prp.issue.checkout_run_id is None  # changed, lock released
    session = prp.session
    assert session.terminal == end["payload"] and session.terminal_event_id == end["sourceEventId"]
    assert session.decision["outcome"] == "done" and session.decision["applied"] is True
    assert session.decision["terminalEventId"] == end["sourceEventId"]
    assert log_lines(run, "Host decision on run.terminal")
    assert not AgentApiKey.objects.filter(run=run, revoked_at__isnull=True).exists()
    # The issue change is the run's own, audited.
    change = ActivityLog.objects.get(action="issue.updated", entity_id=str(prp.issue.pk))
    assert change.run_id == run.pk and change.details["changes"]["status"] == ["in_progress", "done"]


def test_a_second_terminal_and_a_late_result_are_ignored_and_diagnosed(prp):
    proposed = prp.ev("run.result.proposed", result())
    end = prp.ev("run.terminal", terminal())
    late = prp.ev("run.result.proposed", result("blocked", blocker={
        "reasonCode": "x", "owner": {}, "unblockAction": "y", "scope": "task_wide"}))
    again = prp.ev("run.terminal", terminal("failed", "blocked", "failed"))
    prp.send(proposed, end, late, again)
    run = prp.refresh()
    assert run.status == RunStatus.SUCCEEDED and prp.issue.status == "done"
    session = prp.session
    assert session.terminal == end["payload"] and session.terminal_event_id == end["sourceEventId"]
    assert session.proposed_result["reportedWorkDisposition"] == "done"
    assert session.decision["ignoredTerminals"] == [again["sourceEventId"]]
    assert session.decision["ignoredResults"] == [late["sourceEventId"]]
    assert log_lines(run, f"Second run.terminal {again['sourceEventId']} ignored")
    assert log_lines(run, f"run.result.proposed {late['sourceEventId']} after the run's terminal")
    # A redelivery of the ended run's batch is acknowledged again, with no second effect.
    before = (RunEvent.objects.filter(run=run).count(), prp.session.decision)
    ack = runner_events(run=run, body={"events": [end, again]})
    assert ack["duplicates"] == [end["sourceEventId"], again["sourceEventId"]] and ack["accepted"] == 0
    assert (RunEvent.objects.filter(run=run).count(), prp.session.decision) == before


def test_a_second_terminal_in_a_later_batch_is_ignored_too(prp):
    """The intake refuses new events on an ended run; a session that has a terminal (e.g. a run
    revived by hand) still ignores another one."""
    prp.send(prp.ev("run.terminal", terminal()))
    HeartbeatRun.objects.filter(pk=prp.run.pk).update(status=RunStatus.RUNNING, finished_at=None)
    again = prp.ev("run.terminal", terminal("failed", "blocked", "failed"))
    prp.send(again)
    run = prp.refresh()
    assert run.status == RunStatus.RUNNING  # nothing ended it a second time
    assert prp.session.decision["ignoredTerminals"] == [again["sourceEventId"]]


@pytest.mark.parametrize("run_state,turn_state,status,result_status", [
    ("failed", "failed", RunStatus.FAILED, "failed"),
    ("cancelled", "cancelled", RunStatus.CANCELLED, ""),
])
def test_a_failed_or_cancelled_terminal_ends_the_run_so_and_keeps_the_issue(prp, run_state, turn_state, status,
                                                                            result_status):
    stop = {"schema": "paperclip.prp.stop_reason.v1", "schemaVersion": 1, "receiptId": "r1", "kind": "cost",
            "code": "provider_error", "retryable": True, "decisionId": "d1", "limitClass": "provider_quota",
            "aggregate": {"unit": "tokens", "observed": 10, "limit": 10, "window": "provider_window"},
            "relatedReceiptIds": []}
    prp.send(prp.ev("run.result.proposed", result(summary="It broke.")),
             prp.ev("run.terminal", terminal(run_state, "done", turn_state, stopReason=stop)))
    run = prp.refresh()
    assert run.status == status and run.result_status == result_status and run.result_summary == "It broke."
    assert run.error.startswith(f"runner reported run {run_state}") and "provider_error" in run.error
    assert prp.issue.status == "in_progress" and prp.issue.checkout_run_id is None
    assert prp.session.decision["reasons"][0]["code"] == ("run_failed" if run_state == "failed" else "run_cancelled")


def test_a_run_without_issue_ends_with_its_terminal(db):
    prp = make_runner(with_issue=False)
    prp.send(prp.ev("run.terminal", terminal(disposition="needs_review")))
    run = prp.refresh()
    assert run.status == RunStatus.SUCCEEDED and prp.session.decision["reasons"][0]["code"] == "no_issue"


# --- goals, credentials, activity -------------------------------------------------------------------
GOAL = {"objective": "Ship it", "status": "active", "tokenBudget": None, "tokensUsed": 10, "elapsedSeconds": 1.5,
        "iterations": 1, "lastReason": None, "createdAt": None, "updatedAt": None, "completedAt": None,
        "workingNow": True}


def test_session_goal_events_keep_the_goal_and_the_capability(prp):
    prp.send(prp.ev("session.capabilities.updated", {"sessionGoals": session_goals_capability(actions=["set"])}),
             prp.ev("session.goal.snapshot", {"goal": GOAL}))
    session = prp.session
    assert session.goal == GOAL and session.goal_capability["actions"] == ["set"]
    prp.send(prp.ev("session.goal.updated", {"goal": {**GOAL, "status": "paused", "workingNow": False}}))
    assert prp.session.goal["status"] == "paused"
    prp.send(prp.ev("session.goal.updated", {"goal": None}))
    assert prp.session.goal is None
    prp.send(prp.ev("session.goal.snapshot", {"goal": GOAL}), prp.ev("session.goal.cleared", {}))
    assert prp.session.goal is None


def creds(revision, provider="codex", binding="harness-auth", detection="credential_store") -> dict:
    return {"schema": "paperclip.auth.credentials.updated.v1", "provider": provider, "bindingId": binding,
            "revision": revision, "detection": detection}


def test_credential_revisions_never_move_back_and_each_advance_is_audited(prp):
    two = prp.ev("auth.credentials.updated", creds(2))
    prp.send(two, prp.ev("auth.credentials.updated", creds(1)), prp.ev("auth.credentials.updated", creds(2)))
    entry = prp.session.credentials["codex/harness-auth"]
    assert {k: v for k, v in entry.items() if k != "recordedAt"} == {
        "provider": "codex", "bindingId": "harness-auth", "revision": 2, "detection": "credential_store",
        "sourceEventId": two["sourceEventId"]}
    three = prp.ev("auth.credentials.updated", creds(3, detection="native_hook"))
    prp.send(three, prp.ev("auth.credentials.updated", creds(1, binding="other")))
    credentials = prp.session.credentials
    assert credentials["codex/harness-auth"]["revision"] == 3
    assert credentials["codex/harness-auth"]["detection"] == "native_hook"
    assert credentials["codex/other"]["revision"] == 1
    audits = list(ActivityLog.objects.filter(action="run.credentials_updated", run=prp.run).order_by("created_at", "pk")
                  .values_list("details", flat=True))
    assert [(a["bindingId"], a["revision"], a["previousRevision"]) for a in audits] == [
        ("harness-auth", 2, None), ("harness-auth", 3, 2), ("other", 1, None)]


def test_no_secret_from_a_credentials_payload_is_ever_stored(prp):
    """The contract refuses extra members (closed payload); the projection on its own stores only
    the four fields even if an envelope carried more."""
    from issues.runner import contract

    forged = envelope(99, "auth.credentials.updated", {**creds(5), "accessToken": "sk-SECRET-123"}, run=prp.run,
                      version=2)
    with pytest.raises(contract.ContractError):
        contract.validate_event(forged, protocol_version=2)
    row = RunnerEvent.objects.create(run=prp.run, position=99, source_key=source_key(), source_seq=99,
                                     source_event_id=forged["sourceEventId"], event_type=forged["eventType"],
                                     digest="0" * 64, envelope=forged)
    with transaction.atomic():
        session = RunnerSession.objects.select_for_update().get(pk=prp.run.pk)
        projections.project_events(session=session, events=[row])
    session = prp.session
    assert session.credentials["codex/harness-auth"]["revision"] == 5
    assert "sk-SECRET-123" not in str(session.credentials)
    details = ActivityLog.objects.filter(run=prp.run, action="run.credentials_updated").values_list("details", flat=True)
    assert details and all("sk-SECRET-123" not in str(d) and "accessToken" not in d for d in details)


def test_activity_is_counted_by_namespace_and_key(prp):
    events = [prp.ev("runtime.activity.recorded", {"namespace": "git", "activityKey": "push"}) for _ in range(3)]
    events.append(prp.ev("runtime.activity.recorded", {"namespace": "git", "activityKey": "commit"}))
    events.append(prp.ev("runtime.activity.recorded", {"namespace": "ci", "activityKey": "push"}))
    prp.send(*events)
    activity = prp.session.activity
    assert activity["git"]["push"]["count"] == 3 and activity["git"]["push"]["lastSourceEventId"] == \
        events[2]["sourceEventId"]
    assert activity["git"]["push"]["lastEmittedAt"] == events[2]["emittedAt"]
    assert activity["git"]["commit"]["count"] == 1 and activity["ci"]["push"]["count"] == 1
    prp.send(prp.ev("runtime.activity.recorded", {"namespace": "git", "activityKey": "push"}))
    assert prp.session.activity["git"]["push"]["count"] == 4


def test_activity_pairs_are_bounded(prp, monkeypatch):
    monkeypatch.setattr(projections, "MAX_ACTIVITY_KEYS", 2)
    prp.send(*[prp.ev("runtime.activity.recorded", {"namespace": "n", "activityKey": f"k{i}"}) for i in range(3)])
    assert set(prp.session.activity["n"]) == {"k0", "k1"}
    assert log_lines(prp.run, "runtime.activity.recorded n/k2 not counted")


def test_a_runtime_request_becomes_an_interaction(prp):
    """requests.project_request_event (helper D2) is called for runtime_request.* events."""
    request = {"schema": "paperclip.runtime_request.v1", "requestKind": "runtime", "requestId": "req_1",
               "type": "permission", "status": "pending", "prompt": "May I run the migrations?",
               "choices": [{"key": "allow", "label": "Allow"}, {"key": "deny", "label": "Deny"}]}
    response = prp.send(prp.ev("runtime_request.created", {"request": request}))
    assert response["accepted"] == 1
    assert Interaction.objects.filter(run=prp.run, issue=prp.issue, kind="runtime_request").count() == 1


# --- the run detail API, cost per batch -------------------------------------------------------------------
def test_the_run_detail_api_shows_the_runner_projections(prp, client):
    prp.send(prp.ev("auth.credentials.updated", creds(1)),
             prp.ev("runtime.activity.recorded", {"namespace": "git", "activityKey": "push"}),
             prp.ev("session.goal.snapshot", {"goal": GOAL}),
             prp.ev("run.result.proposed", result()), prp.ev("run.terminal", terminal()))
    user = MembershipFactory(company=prp.run.company).user
    client.force_login(user)
    body = client.get(f"/api/runs/{prp.run.pk}").json()
    assert body["status"] == "succeeded" and body["result"]["status"] == "done"  # existing fields unchanged
    runner = body["runner"]
    assert runner["terminal"]["runTerminalState"] == "succeeded" and runner["decision"]["outcome"] == "done"
    assert runner["proposedResult"]["summary"] == "All done." and runner["goal"] == GOAL
    assert runner["credentials"]["codex/harness-auth"]["revision"] == 1
    assert runner["activity"]["git"]["push"]["count"] == 1 and runner["protocolVersion"] == 2
    other, _ = runner_run(company=prp.run.company)
    assert client.get(f"/api/runs/{other.pk}").json()["runner"] is None


def test_statements_per_batch_do_not_grow_with_the_batch(prp):
    def batch(size):
        events = []
        for i in range(size):
            events += [prp.ev("usage.reported", usage(measurement(), measurement(inputTokens=1, providerCostUsd=0.01))),
                       prp.ev("runtime.activity.recorded", {"namespace": "n", "activityKey": f"k{i % 3}"}),
                       prp.ev("session.goal.updated", {"goal": GOAL}),
                       prp.ev("run.result.proposed", result())]
        return events

    prp.send(*batch(1))  # warm: source cursor row, first ledger month roll
    counts = {}
    for size in (1, 5, 25):
        events = batch(size)
        with CaptureQueriesContext(connection) as queries:
            prp.send(*events)
        counts[size] = len(queries)
    assert counts[1] == counts[5] == counts[25], counts


def test_the_http_transport_runs_the_projections(prp, client):
    """The same through POST /api/runner/v1/runs/{id}/events with the run's key."""
    from issues.adapters.base import issue_run_key

    http = runner_client(issue_run_key(prp.run))
    response = http.post(f"/api/runner/v1/runs/{prp.run.pk}/events",
                         {"events": [prp.ev("run.result.proposed", result()), prp.ev("run.terminal", terminal())]},
                         format="json")
    assert response.status_code == 200, response.content
    assert prp.refresh().status == RunStatus.SUCCEEDED and Issue.objects.get(pk=prp.issue.pk).status == "done"
    assert timezone.now() >= prp.run.finished_at
