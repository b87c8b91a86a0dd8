"""The host's own stops of a PRP run go through the command lane (issues.runner.host_control):
an issue stop sends turn.interrupt, a board cancel or the budget stop run.cancel, each with a
deadline; the runner's run.terminal confirms; a stop not confirmed in time ends the run as lost
(the periodic sweep); a runner that never said hello is stopped at once as before."""
from datetime import timedelta

import pytest
from django.utils import timezone

from issues.actors import Actor
from issues.choices import RunnerCommandStatus, RunStatus
from issues.models import ActivityLog, AgentApiKey, HeartbeatRun, RunEvent, RunnerCommand, RunnerEvent, RunnerSession
from issues.runner import host_control
from issues.runner.commands import iso_now
from issues.services import scheduling
from issues.services.costs import cost_event_create
from issues.services.runs import issue_run_stop, run_cancel, run_finish
from tests.factories import IssueFactory, MembershipFactory
from tests.runner_helpers import capabilities, envelope, runner_run, source_key

CONFIRM = 30


@pytest.fixture(autouse=True)
def confirm_window(settings):
    settings.PAPERCLIP = {**settings.PAPERCLIP, "RUNNER_STOP_CONFIRM_SECONDS": CONFIRM}


def hello(run, version=2) -> RunnerSession:
    """The session as a runner's hello leaves it (rows written directly: the transport has its own tests)."""
    return RunnerSession.objects.create(
        run=run, company=run.company, protocol_min=1, protocol_max=2, protocol_version=version,
        capabilities=capabilities(version), runner_instance_id="runner_test", hello_at=timezone.now())


def store_event(run, seq, event_type, payload=None, **fields) -> RunnerEvent:
    env = envelope(seq, event_type, payload, run=run, **fields)
    return RunnerEvent.objects.create(run=run, position=seq, source_key=source_key(), source_event_id=env["sourceEventId"],
                                      source_seq=seq, event_type=event_type, digest=f"{seq:064d}", envelope=env)


def board_for(company) -> Actor:
    return Actor(user=MembershipFactory(company=company).user)


@pytest.fixture
def prp(db):
    """A live runner run on an issue whose runner said hello (v2)."""
    run, _key = runner_run()
    issue = IssueFactory(company=run.company, assignee_agent=run.agent, status="in_progress")
    HeartbeatRun.objects.filter(pk=run.pk).update(issue=issue)
    run.refresh_from_db()
    return run, hello(run), issue


def stops(run):
    return list(RunnerCommand.objects.filter(run=run, command_type__in=host_control.STOP_COMMANDS))


def test_issue_stop_sends_turn_interrupt_with_a_deadline_and_waits(prp):
    run, session, issue = prp
    store_event(run, 1, "turn.started", turnId="turn_1")
    before = timezone.now()
    [returned] = issue_run_stop(actor=board_for(run.company), issue=issue)
    assert returned.status == RunStatus.RUNNING and returned.stop_reason == "issue_stop"
    [command] = stops(run)
    assert command.command_type == "turn.interrupt" and command.controller_seq == 1
    assert command.envelope["payload"] == {"reason": "issue_stop", "turnId": "turn_1"}
    assert command.envelope["schema"] == "paperclip.prp.command.v2"
    deadline = command.confirm_by
    assert before + timedelta(seconds=CONFIRM) <= deadline <= timezone.now() + timedelta(seconds=CONFIRM)
    assert command.envelope["deadlineAt"] == iso_now(deadline)
    assert RunEvent.objects.filter(run=run, message__contains="turn.interrupt sent to the runner").exists()
    # A second stop of the same kind is the same command.
    issue_run_stop(actor=board_for(run.company), issue=issue)
    assert len(stops(run)) == 1


def test_the_issued_command_validates_against_the_command_schema(prp):
    from issues.runner import contract

    run, session, issue = prp
    issue_run_stop(actor=board_for(run.company), issue=issue)
    run_cancel(actor=board_for(run.company), run=run)
    for command in stops(run):
        contract.validate_command(command.envelope, protocol_version=2)


def test_board_cancel_sends_run_cancel(prp):
    run, session, _ = prp
    returned = run_cancel(actor=board_for(run.company), run=run)
    assert returned.status == RunStatus.RUNNING and returned.stop_reason == "board_cancel"
    [command] = stops(run)
    assert command.command_type == "run.cancel" and command.envelope["payload"] == {"reason": "board_cancel"}
    assert ActivityLog.objects.filter(action="heartbeat.cancelled", entity_id=str(run.pk)).exists()


def test_issue_stop_then_board_cancel_is_one_command_of_each_type(prp):
    run, session, issue = prp
    board = board_for(run.company)
    issue_run_stop(actor=board, issue=issue)
    run_cancel(actor=board, run=run)
    run_cancel(actor=board, run=run)
    assert sorted(c.command_type for c in stops(run)) == ["run.cancel", "turn.interrupt"]
    assert list(RunnerCommand.objects.filter(run=run).values_list("controller_seq", flat=True)) == [1, 2]


def test_budget_stop_sends_run_cancel(prp):
    run, session, _ = prp
    run.agent.budget_monthly_cents = 100
    run.agent.save()
    cost_event_create(actor=board_for(run.company), company=run.company,
                      data={"agentId": str(run.agent_id), "costCents": 150, "provider": "openai", "model": "m",
                            "occurredAt": timezone.now(), "heartbeatRunId": str(run.pk)})
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and run.stop_reason == "budget_exceeded"
    [command] = stops(run)
    assert command.command_type == "run.cancel" and command.envelope["payload"]["reason"] == "budget_exceeded"


def test_budget_stop_from_the_projection_is_the_same_single_command(prp):
    """D1's usage projection calls request_stop directly (run locked): repeated, still one command."""
    run, session, _ = prp
    first = host_control.request_stop(run=run, session=session, reason="budget_exceeded", command_type="run.cancel")
    again = host_control.request_stop(run=run, session=session, reason="budget_exceeded", command_type="run.cancel")
    assert first.pk == again.pk and len(stops(run)) == 1
    run.refresh_from_db()
    assert run.stop_requested_at is not None and run.stop_reason == "budget_exceeded"


def test_the_terminal_confirms_the_stop(prp):
    run, session, issue = prp
    issue_run_stop(actor=board_for(run.company), issue=issue)
    # What the terminal projection does: the terminal is stored and the run ends with it.
    store_event(run, 1, "run.terminal", {"schema": "paperclip.prp.terminal.v1", "turnTerminalState": "interrupted",
                                         "runTerminalState": "cancelled", "reportedWorkDisposition": "yielded"})
    RunnerSession.objects.filter(pk=run.pk).update(terminal={"runTerminalState": "cancelled"})
    run_finish(run=run, status=RunStatus.CANCELLED, error="runner: cancelled")
    [command] = stops(run)
    assert command.status == RunnerCommandStatus.SUCCEEDED and command.confirm_by is None
    assert RunEvent.objects.filter(run=run, message__contains="Stop confirmed by the runner's run.terminal").exists()
    # Past the deadline nothing is left to expire, and the run keeps the terminal's ending.
    assert host_control.runner_stops_expire(now=timezone.now() + timedelta(seconds=CONFIRM + 5)) == 0
    run.refresh_from_db()
    assert run.error == "runner: cancelled"


def test_a_stop_not_confirmed_in_time_ends_the_run_as_lost(prp):
    run, session, issue = prp
    issue_run_stop(actor=board_for(run.company), issue=issue)
    [command] = stops(run)
    assert host_control.runner_stops_expire(now=command.confirm_by - timedelta(seconds=1)) == 0
    later = command.created_at + timedelta(seconds=CONFIRM + 1)
    assert host_control.runner_stops_expire(now=later) == 1
    run.refresh_from_db()
    command.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and run.liveness == "failed"
    assert run.error == f"runner lost: turn.interrupt not confirmed in {CONFIRM + 1}s"
    assert run.liveness_reason == run.error
    assert command.status == RunnerCommandStatus.EXPIRED and command.confirm_by is None
    audit = ActivityLog.objects.get(action="run.runner_lost", entity_id=str(run.pk))
    assert audit.details["commandId"] == command.command_id and audit.details["waitedSeconds"] == CONFIRM + 1
    assert not AgentApiKey.objects.filter(run=run, revoked_at__isnull=True).exists()  # nothing it sends is taken
    assert host_control.runner_stops_expire(now=later) == 0


def test_the_periodic_sweep_expires_stops(prp):
    run, session, _ = prp
    run_cancel(actor=board_for(run.company), run=run)
    RunnerCommand.objects.filter(run=run).update(confirm_by=timezone.now() - timedelta(seconds=1))
    report = scheduling.sweep(owner="test:1")
    assert report["runnerStopsExpired"] == 1
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and run.error.startswith("runner lost: run.cancel not confirmed in")


def test_the_sweep_is_one_query_when_nothing_is_due(prp, django_assert_num_queries):
    run, session, issue = prp
    issue_run_stop(actor=board_for(run.company), issue=issue)  # waiting, not yet due
    with django_assert_num_queries(1):
        assert host_control.runner_stops_expire() == 0


def test_an_accepted_stop_still_waits_for_the_terminal(prp):
    run, session, issue = prp
    issue_run_stop(actor=board_for(run.company), issue=issue)
    [command] = stops(run)
    command.status, command.result = RunnerCommandStatus.SUCCEEDED, {"status": "succeeded"}
    command.save()
    host_control.on_command_result(session=session, command=command)
    command.refresh_from_db()
    assert command.confirm_by is not None
    assert RunEvent.objects.filter(run=run, message__contains="waiting for its run.terminal").exists()
    assert host_control.runner_stops_expire(now=command.confirm_by + timedelta(seconds=1)) == 1
    run.refresh_from_db()
    command.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and command.status == RunnerCommandStatus.EXPIRED


def test_a_refused_stop_ends_the_run_after_the_commit(prp, django_capture_on_commit_callbacks):
    run, session, issue = prp
    run_cancel(actor=board_for(run.company), run=run)
    [command] = stops(run)
    command.status = RunnerCommandStatus.REJECTED
    command.result = {"status": "rejected", "error": {"code": "no_active_turn", "message": "nothing to cancel"}}
    command.save()
    with django_capture_on_commit_callbacks(execute=True):
        host_control.on_command_result(session=session, command=command)
    run.refresh_from_db()
    command.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert "runner lost: run.cancel not confirmed in" in run.error and "rejected: no_active_turn" in run.error
    assert command.status == RunnerCommandStatus.REJECTED and command.confirm_by is None  # its result is kept
    assert RunEvent.objects.filter(run=run, message__contains="The runner refused run.cancel").exists()


def test_a_runner_that_never_said_hello_is_stopped_at_once(db):
    run, _key = runner_run()
    RunnerSession.objects.create(run=run, company=run.company)  # registered, no hello
    returned = run_cancel(actor=board_for(run.company), run=run)
    assert returned.status == RunStatus.CANCELLED and returned.error == "stopped: board_cancel"
    assert not RunnerCommand.objects.filter(run=run).exists()


def test_a_runner_run_without_a_session_is_stopped_at_once(db):
    run, _key = runner_run()
    issue = IssueFactory(company=run.company)
    HeartbeatRun.objects.filter(pk=run.pk).update(issue=issue)
    [returned] = issue_run_stop(actor=board_for(run.company), issue=issue)
    assert returned.status == RunStatus.CANCELLED and not RunnerCommand.objects.exists()


def test_a_run_that_ends_otherwise_expires_its_open_stop(prp):
    run, session, issue = prp
    issue_run_stop(actor=board_for(run.company), issue=issue)
    run_finish(run=run, status=RunStatus.TIMED_OUT, error="heartbeat stale")
    [command] = stops(run)
    assert command.status == RunnerCommandStatus.EXPIRED and command.confirm_by is None


def test_other_adapters_are_not_touched(db):
    from tests.factories import RunFactory

    run = RunFactory(status="running", adapter_type="process")
    returned = run_cancel(actor=board_for(run.company), run=run)
    assert returned.status == RunStatus.CANCELLED and not RunnerCommand.objects.exists()
