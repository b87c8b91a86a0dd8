"""The runner adapter (issues.adapters.runner) with a real runner process talking PRP over real
HTTP to the live server: the run ends with the runner's run.terminal, a runner that exits without
one fails the run, one that lingers after its run ended is terminated."""
import sys
import threading
import time
from pathlib import Path

import pytest

from issues.adapters import get_adapter
from issues.adapters.base import AdapterConfigError, prepare_context
from issues.choices import RunStatus
from issues.models import CostEvent, HeartbeatRun, RunnerCommand, RunnerEvent, RunnerSession
from issues.services.runs import run_finish
from tests.factories import AgentFactory, IssueFactory, RunFactory

SCRIPT = str(Path(__file__).with_name("prp_script_runner.py"))


def runner_agent_run(tmp_path, mode="complete", **config):
    agent = AgentFactory(adapter_type="runner")
    agent.adapter_config = {"command": [sys.executable, SCRIPT], "cwd": str(tmp_path),
                            "env": {"PRP_SCRIPT_MODE": mode}, **config}
    agent.save()
    issue = IssueFactory(company=agent.company, assignee_agent=agent, title="Summarise the notes")
    return RunFactory(agent=agent, issue=issue, company=agent.company, status="queued", adapter_type="runner")


def execute(run, live_server):
    ctx = prepare_context(run, owner="test-worker:1", api_url=f"{live_server.url}/api", timeout_seconds=60)
    return get_adapter("runner").execute(ctx), ctx


@pytest.mark.django_db
def test_config_is_validated_like_the_process_adapters():
    adapter = get_adapter("runner")
    adapter.validate_config({"command": ["runner"], "cwd": "/srv"})
    for bad in ({"command": "runner --x"}, {"command": ["runner"], "cwd": "relative/dir"},
                {"command": ["runner"], "cwd": ""}):
        with pytest.raises(AdapterConfigError):
            adapter.validate_config(bad)


@pytest.mark.django_db(transaction=True)
def test_the_run_ends_with_the_runners_terminal(live_server, tmp_path):
    run = runner_agent_run(tmp_path)
    result, ctx = execute(run, live_server)
    run.refresh_from_db()
    # The terminal ended the run (through the intake); the adapter reports that, not the exit.
    assert run.status == RunStatus.SUCCEEDED and result.status == RunStatus.SUCCEEDED and result.exit_code == 0
    assert run_finish(run=run, status=result.status).status == RunStatus.SUCCEEDED  # the caller's finish is a no-op
    session = RunnerSession.objects.get(pk=run.pk)
    assert session.protocol_version == 1 and session.terminal["runTerminalState"] == "succeeded"
    assert session.decision["outcome"] == "unchanged"  # the issue was not checked out by this run
    assert RunnerEvent.objects.filter(run=run).count() == 6
    assert list(RunnerCommand.objects.filter(run=run).values_list("command_type", flat=True)) == [
        "run.prepare", "session.open", "turn.start"]
    prepare = RunnerCommand.objects.get(run=run, command_type="run.prepare")
    assert prepare.envelope["payload"]["workspace"] == str(tmp_path)
    assert prepare.envelope["payload"]["observeCredentials"] is True
    assert "Summarise the notes" in RunnerCommand.objects.get(run=run, command_type="turn.start").envelope[
        "payload"]["text"]
    assert run.input_tokens == 100 and run.output_tokens == 20 and run.cost_cents == 2
    assert CostEvent.objects.filter(run=run).count() == 1
    assert run.result_summary.startswith("Read ") and run.result_status == "handoff"
    # The run's key never reached the log.
    key = ctx.env["PAPERCLIP_API_KEY"]
    assert not run.events.filter(message__contains=key).exists()


@pytest.mark.django_db(transaction=True)
def test_a_runner_that_exits_without_a_terminal_fails_the_run(live_server, tmp_path):
    run = runner_agent_run(tmp_path, mode="no_terminal")
    result, _ = execute(run, live_server)
    assert result.status == RunStatus.FAILED and result.error == "runner exited without run.terminal"
    assert HeartbeatRun.objects.get(pk=run.pk).status == RunStatus.RUNNING  # the caller ends it with the result
    assert RunnerEvent.objects.filter(run=run).count() == 5


@pytest.mark.django_db(transaction=True)
def test_a_runner_lingering_after_its_run_ended_is_terminated(live_server, tmp_path):
    run = runner_agent_run(tmp_path, mode="linger", grace_seconds=1)
    started = time.monotonic()
    result, _ = execute(run, live_server)
    assert result.status == RunStatus.SUCCEEDED  # the run's own end, from its terminal
    assert time.monotonic() - started < 60  # not the script's 600 s sleep
    assert HeartbeatRun.objects.get(pk=run.pk).status == RunStatus.SUCCEEDED


@pytest.mark.django_db(transaction=True)
def test_a_stop_request_goes_through_the_command_lane_and_does_not_kill_the_runner(live_server, tmp_path):
    """A board cancel of a runner run that said hello is run.cancel, not a kill: the runner keeps
    running, confirms with its terminal and exits by itself (exit code 0)."""
    from django.db import connection

    from issues.actors import Actor
    from issues.services.runs import run_cancel
    from tests.factories import MembershipFactory

    run = runner_agent_run(tmp_path, mode="await_cancel")
    outcome = {}

    def work():
        try:
            outcome["result"], _ = execute(run, live_server)
        finally:
            connection.close()

    worker = threading.Thread(target=work)
    worker.start()
    try:
        deadline = time.monotonic() + 60  # wait for the runner's events, not for a fixed time
        while RunnerEvent.objects.filter(run=run).count() < 5 and time.monotonic() < deadline and worker.is_alive():
            time.sleep(0.05)
        assert RunnerEvent.objects.filter(run=run).count() == 5
        board = Actor(user=MembershipFactory(company=run.company).user)
        assert run_cancel(actor=board, run=run).status == RunStatus.RUNNING  # waits for the confirmation
    finally:
        worker.join(90)
    result = outcome["result"]
    assert result.status == RunStatus.CANCELLED and result.exit_code == 0
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and run.stop_reason == "board_cancel"
    stop = RunnerCommand.objects.get(run=run, command_type="run.cancel")
    assert stop.status == "succeeded" and stop.confirm_by is None
    assert not run.events.filter(message__contains="terminating process group").exists()


# --- the first commands (issues.runner.launch) ------------------------------------------------------------
@pytest.mark.django_db
def test_the_first_commands_are_issued_once_and_validate():
    from issues.runner import contract, launch
    from issues.runner.negotiation import runner_hello
    from tests.runner_helpers import capabilities, hello_body, runner_run

    agent = AgentFactory(adapter_type="runner", adapter_config={"command": ["r"], "cwd": "/srv/work"})
    issue = IssueFactory(company=agent.company, assignee_agent=agent, title="Write the changelog")
    run, _key = runner_run(agent=agent, issue=issue)
    runner_hello(run=run, body=hello_body(2, 2, caps=capabilities(2, sessionReusePolicy="reuse_per_issue")))
    commands = list(RunnerCommand.objects.filter(run=run))
    assert [(c.controller_seq, c.command_type) for c in commands] == [
        (1, "run.prepare"), (2, "session.open"), (3, "turn.start")]
    for command in commands:
        contract.validate_command(command.envelope, protocol_version=2)
    assert commands[0].envelope["payload"] == {"workspace": "/srv/work", "observeCredentials": True,
                                               "issueId": str(issue.pk)}
    assert commands[1].envelope["payload"] == {"reuse": "reuse_per_issue"}
    assert "Write the changelog" in commands[2].envelope["payload"]["text"]
    # Idempotent: a re-hello (runner restart) or a second call issues nothing.
    runner_hello(run=run, body=hello_body(2, 2))
    assert launch.issue_initial_commands(RunnerSession.objects.get(pk=run.pk)) == []
    assert RunnerCommand.objects.filter(run=run).count() == 3


@pytest.mark.django_db
def test_no_first_commands_before_hello_or_for_an_ended_run():
    from issues.runner import launch
    from tests.runner_helpers import runner_run

    run, _key = runner_run()
    session = RunnerSession.objects.create(run=run, company=run.company)
    assert launch.issue_initial_commands(session) == []  # no hello yet
    HeartbeatRun.objects.filter(pk=run.pk).update(status="succeeded", finished_at=run.created_at)
    RunnerSession.objects.filter(pk=run.pk).update(protocol_version=1, hello_at=run.created_at)
    assert launch.issue_initial_commands(RunnerSession.objects.get(pk=run.pk)) == []
    assert not RunnerCommand.objects.filter(run=run).exists()
    # Without an issue or a workspace: an empty workspace, no issueId, the default reuse policy.
    run2, _ = runner_run()
    RunnerSession.objects.create(run=run2, company=run2.company, protocol_version=1, hello_at=run2.created_at)
    [prepare, opened, _turn] = launch.issue_initial_commands(RunnerSession.objects.get(pk=run2.pk))
    assert prepare.envelope["payload"] == {"workspace": "", "observeCredentials": True}
    assert opened.envelope["payload"] == {"reuse": "new_per_run"}


@pytest.mark.django_db
def test_the_first_turn_holds_the_comment_that_woke_the_run():
    """A comment written while the run waits for its runner wakes it (on PostgreSQL through the
    insert-only fast path, unfolded); the first turn is built after the fold, so it carries it."""
    from issues.actors import Actor
    from issues.models import WakeupRequest
    from issues.runner.negotiation import runner_hello
    from issues.services.thread import comment_create
    from tests.factories import MembershipFactory
    from tests.runner_helpers import hello_body, runner_run

    agent = AgentFactory(adapter_type="runner", adapter_config={"command": ["r"], "cwd": "/srv/work"})
    issue = IssueFactory(company=agent.company, assignee_agent=agent, title="Write the changelog", status="todo")
    run, _key = runner_run(agent=agent, issue=issue)
    operator = MembershipFactory(company=agent.company, role="operator").user
    comment = comment_create(actor=Actor(user=operator), issue=issue, body="Mention the new export endpoint, please.")
    wake = WakeupRequest.objects.get(issue=issue)
    assert wake.run_id == run.pk and wake.comment_ids == [str(comment.pk)]
    runner_hello(run=run, body=hello_body(2, 2))
    turn = RunnerCommand.objects.get(run=run, command_type="turn.start")
    assert "Mention the new export endpoint" in turn.envelope["payload"]["text"]
    run.refresh_from_db()
    assert run.context["commentIds"] == [str(comment.pk)]
    assert not WakeupRequest.objects.filter(run=run, folded=False).exists()
