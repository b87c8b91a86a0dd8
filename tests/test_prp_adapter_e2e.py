"""Agents of adapter ``prp`` end to end: the dispatcher starts the reference runner
(``python -m prp_runner``) as a real process, which drives the run over real HTTP against the live
server. Each phase-02 fake-harness script ends in the state its name says; a board stop reaches the
runner as a command and ends the run cancelled with the lock released; a permission request
round-trips through the issue interaction; the example agent runs under the process harness."""
import os
import sys
import threading
from pathlib import Path

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from issues.actors import Actor
from issues.choices import InteractionKind, RunStatus
from issues.models import HeartbeatRun, Interaction, Issue, RunnerCommand, RunnerEvent, RunnerSession
from issues.services import dispatch, runs
from issues.services.checkout import issue_checkout
from tests.factories import AgentFactory, IssueFactory, MembershipFactory
from tests.test_celery_topology import wait_for

pytestmark = pytest.mark.django_db(transaction=True)
AGENT = str(Path(__file__).resolve().parent.parent / "examples" / "heartbeat_agent.py")


@pytest.fixture
def host(live_server, settings, tmp_path):
    settings.PAPERCLIP = {**settings.PAPERCLIP, "API_URL": f"{live_server.url}/api",
                          "WORKSPACE_ROOT": str(tmp_path / "workspaces"),
                          "RUNNER_OUTBOX_DIR": str(tmp_path / "outbox")}
    return live_server


def prp_issue(config: dict, *, title="Summarise the notes"):
    agent = AgentFactory(adapter_type="prp", adapter_config={**config, "grace_seconds": 2})
    issue = IssueFactory(company=agent.company, assignee_agent=agent, title=title, status="todo")
    run = HeartbeatRun.objects.create(company=agent.company, agent=agent, issue=issue, status=RunStatus.QUEUED,
                                      adapter_type="prp", wake_reason="test")
    return agent, issue, run


def execute(run) -> HeartbeatRun:
    return dispatch.run_execute(run_id=run.pk, owner=runs.this_owner())


def in_background(run) -> tuple[threading.Thread, dict]:
    done = {}
    thread = threading.Thread(target=lambda: done.setdefault("run", execute(run)), daemon=True)
    thread.start()
    return thread, done


def events(run) -> list[str]:
    return list(RunnerEvent.objects.filter(run=run).order_by("position").values_list("event_type", flat=True))


def host_log(run) -> str:
    return "\n".join(run.events.order_by("seq").values_list("message", flat=True))


def checked_out_by(run, agent, issue):
    """The agent's run holds the issue's checkout, as an agent's first API call would make it."""
    wait_for(lambda: RunnerSession.objects.filter(pk=run.pk, hello_at__isnull=False).exists(), timeout=60,
             what="the runner's hello")
    issue_checkout(actor=Actor(agent=agent, run_header=str(run.pk)), issue=issue, agent_id=agent.pk,
                   expected_statuses=["todo"])
    assert Issue.objects.get(pk=issue.pk).checkout_run_id == run.pk


def processes_of(run) -> list[int]:
    """Live processes (any session) started for this run: they carry its PAPERCLIP_RUN_ID."""
    marker = f"PAPERCLIP_RUN_ID={run.pk}".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as env, open(f"/proc/{pid}/stat", "rb") as stat:
                if marker in env.read().split(b"\0") and b") Z " not in stat.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


def test_happy_path_succeeds(host):
    agent, issue, run = prp_issue({"harness": "fake", "script": "happy-path"})
    run = execute(run)
    assert run.status == RunStatus.SUCCEEDED, host_log(run)
    session = RunnerSession.objects.get(pk=run.pk)
    assert session.terminal["runTerminalState"] == "succeeded"
    assert session.proposed_result["summary"] == "The live fake-harness run completed successfully."
    assert events(run).count("run.terminal") == 1 and "item.completed" in events(run)
    assert list(RunnerCommand.objects.filter(run=run).values_list("command_type", flat=True))[:3] == [
        "run.prepare", "session.open", "turn.start"]
    assert not list(Path(settings.PAPERCLIP["RUNNER_OUTBOX_DIR"]).glob("*"))  # delivered, then removed
    assert processes_of(run) == []


def test_error_fails_the_run_and_keeps_the_yielded_result_apart(host):
    _, _, run = prp_issue({"harness": "fake", "script": "error"})
    run = execute(run)
    assert run.status == RunStatus.FAILED, host_log(run)
    session = RunnerSession.objects.get(pk=run.pk)
    assert session.proposed_result["reportedWorkDisposition"] == "yielded"
    assert session.terminal["runTerminalState"] == "failed"
    assert "scripted harness failure" in host_log(run)


def test_duplicate_terminal_keeps_the_first(host):
    _, _, run = prp_issue({"harness": "fake", "script": "duplicate-terminal"})
    run = execute(run)
    assert run.status == RunStatus.SUCCEEDED, host_log(run)
    assert events(run).count("run.terminal") == 1  # the runner never sent the second one
    assert RunnerSession.objects.get(pk=run.pk).terminal["runTerminalState"] == "succeeded"
    assert "duplicate_terminal: a second terminal was ignored" in host_log(run)  # the runner's own log line


def test_interrupted_by_an_issue_stop_ends_cancelled(host):
    agent, issue, run = prp_issue({"harness": "fake", "script": "interrupted"})
    thread, done = in_background(run)
    checked_out_by(run, agent, issue)
    wait_for(lambda: "item.started" in events(run), timeout=60, what="the long command to start")
    runs.issue_run_stop(actor=Actor(user=MembershipFactory(company=agent.company).user), issue=issue)
    thread.join(90)
    run = HeartbeatRun.objects.get(pk=run.pk)
    assert run.status == RunStatus.CANCELLED, host_log(run)
    assert RunnerCommand.objects.filter(run=run, command_type="turn.interrupt", status="succeeded").exists()
    session = RunnerSession.objects.get(pk=run.pk)
    assert (session.terminal["turnTerminalState"], session.terminal["runTerminalState"]) == ("interrupted",
                                                                                             "cancelled")
    assert session.proposed_result["continuation"]["kind"] == "same_agent"
    assert Issue.objects.get(pk=issue.pk).checkout_run_id is None  # the lock is released


def test_a_board_stop_reaches_the_runner_and_the_lingering_worker_is_killed(host):
    agent, issue, run = prp_issue({"harness": "fake", "script": "linger"})
    thread, done = in_background(run)
    checked_out_by(run, agent, issue)
    wait_for(lambda: "item.started" in events(run), timeout=60, what="the linger step")
    wait_for(lambda: len(processes_of(run)) >= 2, timeout=30, what="the runner and its spawned worker")
    board = APIClient()
    board.force_login(MembershipFactory(company=agent.company, role="owner").user)
    assert board.post(f"/api/heartbeat-runs/{run.pk}/cancel").status_code == 200
    thread.join(90)
    run = HeartbeatRun.objects.get(pk=run.pk)
    assert run.status == RunStatus.CANCELLED, host_log(run)
    assert RunnerCommand.objects.filter(run=run, command_type="run.cancel", status="succeeded").exists()
    assert RunnerSession.objects.get(pk=run.pk).terminal["runTerminalState"] == "cancelled"  # derived from the exit
    assert Issue.objects.get(pk=issue.pk).checkout_run_id is None
    assert processes_of(run) == []  # the worker's process group is gone too


def test_permission_and_input_round_trip_through_the_issue(host):
    agent, issue, run = prp_issue({"harness": "fake", "script": "permission-input"})
    thread, done = in_background(run)
    checked_out_by(run, agent, issue)
    board = APIClient()
    board.force_login(MembershipFactory(company=agent.company, role="owner").user)

    def pending():
        return Interaction.objects.filter(issue=issue, kind=InteractionKind.RUNTIME_REQUEST,
                                          status="pending").first()

    permission = wait_for(pending, timeout=60, what="the permission request")
    assert permission.payload["request"]["requestId"] == "request_phase2_permission"
    assert board.post(f"/api/interactions/{permission.pk}/respond", {"status": "accepted"},
                      format="json").status_code == 200
    question = wait_for(lambda: (i := pending()) and i.pk != permission.pk and i, timeout=60,
                        what="the input request")
    assert board.post(f"/api/interactions/{question.pk}/respond",
                      {"status": "answered", "response": {"answer": "trace-7"}}, format="json").status_code == 200
    thread.join(90)
    run = HeartbeatRun.objects.get(pk=run.pk)
    assert run.status == RunStatus.SUCCEEDED, host_log(run)
    resolves = RunnerCommand.objects.filter(run=run, command_type="request.resolve").order_by("controller_seq")
    assert [c.envelope["payload"]["response"] for c in resolves] == [{"decision": "allow"}, {"text": "trace-7"}]
    assert all(c.status == "succeeded" for c in resolves)
    assert Issue.objects.get(pk=issue.pk).status == "done"  # the host's decision on a done claim


def test_the_example_agent_works_its_issue_through_the_process_harness(host):
    agent, issue, run = prp_issue({"harness": "process", "command": [sys.executable, AGENT],
                                   "env": {"EXAMPLE_AGENT_MODE": "review", "EXAMPLE_AGENT_ECHO_KEY": "1"}},
                                  title="Tidy the changelog")
    run = execute(run)
    assert run.status == RunStatus.SUCCEEDED, host_log(run)
    issue.refresh_from_db()
    assert issue.status == "in_review" and issue.checkout_run_id is None
    assert issue.comments.exists()
    kinds = events(run)
    assert kinds.count("run.result.proposed") == 1 and kinds.count("run.terminal") == 1
    assert RunnerSession.objects.get(pk=run.pk).terminal["runTerminalState"] == "succeeded"
    # The agent printed its run key (EXAMPLE_AGENT_ECHO_KEY): the runner redacted it before sending.
    texts = [e.envelope["payload"].get("text", "") for e in RunnerEvent.objects.filter(run=run, event_type="item.delta")]
    echoed = [t for t in texts if "debug (stderr): key=" in t]
    assert echoed and all("key=[redacted]" in t for t in echoed), echoed


def test_an_external_runner_attaches_with_the_agents_key_and_drives_the_run(host, tmp_path):
    import subprocess

    from issues.services.companies import agent_api_key_create

    agent, issue, run = prp_issue({"launch": "external"})
    agent.adapter_config = {"launch": "external"}  # (prp_issue adds grace_seconds, a local setting)
    agent.save()
    assert execute(run).status == RunStatus.RUNNING  # the host started nothing: the run waits
    _key, agent_key = agent_api_key_create(agent=agent, name="runner box")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAPERCLIP_")}
    env["PAPERCLIP_AGENT_KEY"] = agent_key
    done = subprocess.run([sys.executable, "-m", "prp_runner", "--attach", host.url, "--once", "--outbox-dir",
                           str(tmp_path), "--harness", "fake", "--script", "happy-path"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert agent_key not in done.stderr + done.stdout
    run = HeartbeatRun.objects.get(pk=run.pk)
    assert run.status == RunStatus.SUCCEEDED, host_log(run)
    assert "an external runner attached" in host_log(run)
    assert events(run).count("run.terminal") == 1
