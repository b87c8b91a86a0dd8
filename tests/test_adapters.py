"""Adapters: real subprocesses, a real HTTP receiver, and the example agent against a live server."""
import http.server
import json
import os
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from issues.adapters import (
    AdapterConfigError,
    AdapterResult,
    build_run_env,
    get_adapter,
    issue_run_key,
    prepare_context,
)
from issues.adapters.base import REDACTED, redact, run_keys_revoke
from issues.adapters.http import SIGNATURE_HEADER, HttpAdapter, verify
from issues.adapters.none import NoneAdapter
from issues.adapters.process import ProcessAdapter, parse_result_line
from issues.models import AgentApiKey, Comment, Document, ExecutionWorkspace, HeartbeatRun, Issue, RunEvent
from issues.models.agent import hash_key
from issues.services.runs import run_finish
from tests.factories import AgentFactory, CompanyFactory, IssueFactory, RunFactory

EXAMPLE_AGENT = str(Path(__file__).resolve().parent.parent / "examples" / "heartbeat_agent.py")
PY = sys.executable

# A child that starts a grandchild (same process group), prints both pids, then keeps printing.
SPAWNER = textwrap.dedent("""
    import signal, subprocess, sys, time
    ignore = len(sys.argv) > 1 and sys.argv[1] == "ignore-term"
    grand = subprocess.Popen([sys.executable, "-c",
        "import signal, time\\n"
        + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n" if ignore else "")
        + "time.sleep(120)"])
    if ignore:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("pids", __import__("os").getpid(), grand.pid, flush=True)
    for n in range(600):
        print("tick", n, flush=True)
        time.sleep(0.2)
""")


def alive(pid: int) -> bool:
    """A zombie counts as dead (in a container nobody may reap re-parented grandchildren)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def make_run(*, adapter_type="process", adapter_config=None, issue=None, agent=None, **run_kwargs):
    agent = agent or AgentFactory(adapter_type=adapter_type, adapter_config=adapter_config or {})
    return RunFactory(agent=agent, status="queued", issue=issue, **run_kwargs)


def context(run, **kwargs):
    kwargs.setdefault("owner", "test-worker:1")
    kwargs.setdefault("api_url", "http://127.0.0.1:9/api")
    return prepare_context(run, **kwargs)


def messages(run, kind=None):
    events = RunEvent.objects.filter(run=run).order_by("seq")
    if kind:
        events = events.filter(kind=kind)
    return [e.message for e in events]


# --- contract pieces ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_build_run_env_sets_the_paperclip_variables():
    issue = IssueFactory()
    agent = AgentFactory(company=issue.company)
    run = RunFactory(agent=agent, issue=issue)
    env = build_run_env(run=run, agent=agent, issue=issue, api_url="http://h/api/", api_key="pcp_x",
                        wake_reason="assigned", comment_ids=["a", "b"], approval_id="ap-1")
    assert env == {
        "PAPERCLIP_API_URL": "http://h", "PAPERCLIP_API_KEY": "pcp_x", "PAPERCLIP_RUN_ID": str(run.pk),
        "PAPERCLIP_TASK_ID": str(issue.pk), "PAPERCLIP_AGENT_ID": str(agent.pk),
        "PAPERCLIP_COMPANY_ID": str(agent.company_id), "PAPERCLIP_WAKE_REASON": "assigned",
        "PAPERCLIP_WAKE_COMMENT_IDS": "a,b", "PAPERCLIP_APPROVAL_ID": "ap-1",
    }
    bare = build_run_env(run=run, agent=agent, issue=None, api_url="u", api_key="k", wake_reason="",
                         comment_ids=[], approval_id=None)
    assert "PAPERCLIP_TASK_ID" not in bare and "PAPERCLIP_APPROVAL_ID" not in bare
    assert bare["PAPERCLIP_WAKE_COMMENT_IDS"] == ""


@pytest.mark.django_db
def test_run_scoped_key_is_bound_to_its_run_and_authenticates(client):
    run = make_run()
    raw = issue_run_key(run)
    key = AgentApiKey.objects.get(key_hash=hash_key(raw))
    assert key.run_id == run.pk and key.name == "run" and key.agent_id == run.agent_id
    response = client.get("/api/agents/me", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert response.status_code == 200 and response.json()["id"] == str(run.agent_id)
    assert run_keys_revoke(run) == 1
    assert client.get("/api/agents/me", HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 401


@pytest.mark.django_db
def test_prepare_context_collects_env_secrets_and_timeout(monkeypatch):
    monkeypatch.setenv("PAPERCLIP_SECRET_TEST_ADAPTER_REF", "ref-secret-value")
    issue = IssueFactory()
    agent = AgentFactory(company=issue.company, adapter_type="process", runtime_config={"timeoutSeconds": 42},
                         adapter_config={
        "command": [PY, "-V"],
        "env": {"SERVICE_TOKEN": "literal-token", "PLAIN": "x", "REF": {"secret_ref": "env:PAPERCLIP_SECRET_TEST_ADAPTER_REF"}},
    })
    run = RunFactory(agent=agent, issue=issue, status="queued", wake_reason="assigned",
                     context={"commentIds": ["c1", "c2"], "approvalId": "ap"})
    ctx = context(run)
    key = ctx.env["PAPERCLIP_API_KEY"]
    assert AgentApiKey.objects.get(key_hash=hash_key(key)).run_id == run.pk
    assert set(ctx.secrets) == {key, "literal-token", "ref-secret-value"}
    assert ctx.timeout_seconds == 42 and ctx.owner == "test-worker:1" and ctx.workspace_path is None
    assert ctx.env["PAPERCLIP_WAKE_COMMENT_IDS"] == "c1,c2" and ctx.env["PAPERCLIP_APPROVAL_ID"] == "ap"
    assert ctx.env["PAPERCLIP_TASK_ID"] == str(issue.pk) and ctx.env["PAPERCLIP_WAKE_REASON"] == "assigned"

    polling = make_run(adapter_type="none")
    assert "PAPERCLIP_API_KEY" not in context(polling).env
    assert not AgentApiKey.objects.filter(run=polling).exists()


def test_registry_and_result_contract():
    assert isinstance(get_adapter("process"), ProcessAdapter)
    assert isinstance(get_adapter("http"), HttpAdapter)
    assert isinstance(get_adapter("none"), NoneAdapter)
    with pytest.raises(AdapterConfigError):
        get_adapter("telepathy")
    with pytest.raises(ValueError):
        AdapterResult(status="running")
    assert redact("key pcp_abc and pcp_abcdef", ["pcp_abc", "pcp_abcdef", ""]) == f"key {REDACTED} and {REDACTED}"
    assert parse_result_line('PAPERCLIP_RESULT {"liveness": "plan_only", "reason": "r"}') == ("plan_only", "r")
    assert parse_result_line('PAPERCLIP_RESULT {"liveness": "bogus"}') is None
    assert parse_result_line("PAPERCLIP_RESULT not json") is None


# --- process adapter ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_process_exit_codes_and_stderr():
    run = make_run(adapter_config={"command": [PY, EXAMPLE_AGENT], "env": {"EXAMPLE_AGENT_MODE": "fail"}})
    result = get_adapter("process").execute(context(run))
    assert result.status == "failed" and result.exit_code == 2 and result.error == "exit code 2"
    assert any("simulated failure" in m for m in messages(run, "stderr"))
    run.refresh_from_db()
    assert run.status == "running" and run.owner == "test-worker:1" and run.pid  # run_finish is the caller's
    run = run_finish(run=run, status=result.status, error=result.error)
    assert run.status == "failed" and run.error == "exit code 2"

    ok = make_run(adapter_config={"command": [PY, "-c", "print('hi')"]})
    result = get_adapter("process").execute(context(ok))
    assert (result.status, result.exit_code, result.error, result.liveness) == ("succeeded", 0, "", "")
    assert messages(ok, "stdout") == ["hi"]


@pytest.mark.django_db
def test_quiet_process_keeps_its_heartbeat_and_odd_output_is_stored():
    script = "import sys, time; time.sleep(1.3); sys.stdout.buffer.write(b'nul\\x00 and \\xff bytes\\n')"
    run = make_run(adapter_config={"command": [PY, "-c", script]})
    adapter = get_adapter("process")
    adapter.heartbeat_interval = 0.4
    result = adapter.execute(context(run))
    assert result.status == "succeeded"
    assert len(messages(run, "heartbeat")) >= 2
    assert messages(run, "stdout") == ["nul\ufffd and \ufffd bytes"]
    run.refresh_from_db()
    assert run.last_heartbeat_at > run.started_at


@pytest.mark.django_db
def test_process_killed_by_a_signal_without_stop_is_interrupted():
    run = make_run(adapter_config={"command": [PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]})
    result = get_adapter("process").execute(context(run))
    assert result.status == "interrupted" and result.exit_code == -9 and "SIGKILL" in result.error


@pytest.mark.django_db
def test_process_secrets_are_redacted_from_every_event(monkeypatch):
    monkeypatch.setenv("PAPERCLIP_SECRET_TEST_ADAPTER_REF", "ref-secret-value")
    script = ("import os, sys\n"
              "for name in ('PAPERCLIP_API_KEY', 'SERVICE_TOKEN', 'REF', 'PLAIN'):\n"
              "    print(name, os.environ[name], flush=True)\n"
              "    print('err', name, os.environ[name], file=sys.stderr, flush=True)\n"
              "sys.exit(3)\n")
    run = make_run(adapter_config={"command": [PY, "-c", script], "env": {
        "SERVICE_TOKEN": "literal-token", "PLAIN": "visible-value", "REF": {"secret_ref": "env:PAPERCLIP_SECRET_TEST_ADAPTER_REF"}}})
    ctx = context(run)
    key = ctx.env["PAPERCLIP_API_KEY"]
    result = get_adapter("process").execute(ctx)
    assert result.status == "failed"
    everything = "\n".join(messages(run))
    for secret in (key, "literal-token", "ref-secret-value"):
        assert secret not in everything
    assert f"PAPERCLIP_API_KEY {REDACTED}" in messages(run, "stdout")
    assert f"err SERVICE_TOKEN {REDACTED}" in messages(run, "stderr")
    assert "PLAIN visible-value" in messages(run, "stdout")


@pytest.mark.django_db
def test_process_env_is_minimal_and_cwd_is_the_workspace(tmp_path, monkeypatch):
    monkeypatch.setenv("HOST_ONLY_SECRET", "do-not-inherit")
    script = "import json, os; print(json.dumps({'env': dict(os.environ), 'cwd': os.getcwd()}))"
    workspace = ExecutionWorkspace.objects.create(
        company=CompanyFactory(), strategy="isolated_workspace", key="ws-1", path=str(tmp_path))
    run = make_run(adapter_config={"command": [PY, "-c", script], "env": {"MODEL": "small", "RETRIES": 3}},
                   workspace=workspace)
    ctx = context(run)
    assert ctx.workspace_path == str(tmp_path)
    assert get_adapter("process").execute(ctx).status == "succeeded"
    seen = json.loads(messages(run, "stdout")[0])
    allowed = {"PATH", "HOME", "LANG", "PYTHONPATH", "MODEL", "RETRIES", "LC_CTYPE"}  # LC_CTYPE: set by CPython
    assert set(seen["env"]) - allowed == {k for k in ctx.env}
    assert seen["env"]["MODEL"] == "small" and seen["env"]["RETRIES"] == "3"
    assert "HOST_ONLY_SECRET" not in seen["env"]
    assert Path(seen["cwd"]).resolve() == tmp_path.resolve()

    temp = make_run(adapter_config={"command": [PY, "-c", "import os; print(os.getcwd())"]})
    assert get_adapter("process").execute(context(temp)).status == "succeeded"
    cwd = messages(temp, "stdout")[0]
    assert f"paperclip-run-{temp.pk}" in cwd and not os.path.exists(cwd)  # per-run temp dir, removed after


@pytest.mark.django_db
def test_process_config_errors_fail_clearly():
    adapter = get_adapter("process")
    with pytest.raises(AdapterConfigError, match="list of argv strings"):
        adapter.validate_config({"command": "python agent.py"})
    for bad in ({}, {"command": []}, {"command": ["x"], "env": {"PAPERCLIP_API_KEY": "x"}},
                {"command": ["x"], "env": {"A": {"secret": "inline"}}}):
        with pytest.raises(AdapterConfigError):
            adapter.validate_config(bad)

    run = make_run(adapter_config={"command": "python agent.py"})
    result = adapter.execute(context(run))
    assert result.status == "failed" and "list of argv strings" in result.error
    run.refresh_from_db()
    assert run.pid is None and run.status == "queued"

    missing = make_run(adapter_config={"command": ["/nonexistent/agent-binary"]})
    result = adapter.execute(context(missing))
    assert result.status == "failed" and result.error.startswith("could not start /nonexistent/agent-binary")


@pytest.mark.django_db
def test_process_not_started_when_stop_was_requested_first():
    run = make_run(adapter_config={"command": [PY, "-c", "print('never')"]},
                   stop_requested_at=timezone.now(), stop_reason="operator")
    result = get_adapter("process").execute(context(run))
    assert result.status == "cancelled" and "operator" in result.error
    run.refresh_from_db()
    assert run.pid is None and not messages(run, "stdout")


@pytest.mark.django_db
def test_process_result_line_reports_liveness():
    script = "print('working'); print('PAPERCLIP_RESULT ' + '{\"liveness\": \"needs_followup\", \"reason\": \"ci red\"}')"
    run = make_run(adapter_config={"command": [PY, "-c", script]})
    result = get_adapter("process").execute(context(run))
    assert (result.status, result.liveness, result.liveness_reason) == ("succeeded", "needs_followup", "ci red")


@pytest.mark.django_db
@pytest.mark.parametrize("mode", ["", "ignore-term"])
def test_process_timeout_kills_the_whole_group(mode):
    run = make_run(adapter_config={"command": [PY, "-c", SPAWNER, mode], "grace_seconds": 1})
    started = time.monotonic()
    result = get_adapter("process").execute(context(run, timeout_seconds=1.5))
    assert time.monotonic() - started < 10
    assert result.status == "timed_out" and result.error == "timed out after 1.5s"
    pids = [int(p) for p in messages(run, "stdout")[0].split()[1:]]
    assert len(pids) == 2 and not any(alive(p) for p in pids)
    if mode:
        assert any("killed after 1s grace" in m for m in messages(run, "system"))


@pytest.mark.django_db
def test_process_that_escapes_its_group_does_not_hang_the_supervisor():
    # The grandchild leaves the group (its own session) but keeps stdout open.
    script = ("import subprocess, sys\n"
              "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'], start_new_session=True)\n"
              "print('escaped', g.pid, flush=True)\n")
    run = make_run(adapter_config={"command": [PY, "-c", script], "grace_seconds": 1})
    started = time.monotonic()
    result = get_adapter("process").execute(context(run))
    escaped = int(messages(run, "stdout")[0].split()[1])
    try:
        assert result.status == "succeeded" and time.monotonic() - started < 6
    finally:
        os.kill(escaped, 9)


@pytest.mark.django_db
def test_process_timeout_of_the_example_agent_in_sleep_mode():
    run = make_run(adapter_config={"command": [PY, EXAMPLE_AGENT], "grace_seconds": 1,
                                   "env": {"EXAMPLE_AGENT_MODE": "sleep", "EXAMPLE_AGENT_SLEEP": "30"}})
    result = get_adapter("process").execute(context(run, timeout_seconds=1.2))
    assert result.status == "timed_out" and result.exit_code == -15
    assert messages(run, "stdout")[0] == "working... 1/30"
    run.refresh_from_db()
    assert not alive(run.pid)


@pytest.mark.django_db(transaction=True)
def test_stop_request_cancels_and_kills_the_group():
    run = make_run(adapter_config={"command": [PY, "-c", SPAWNER], "grace_seconds": 1})

    def operator():
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                if RunEvent.objects.filter(run=run, kind="stdout").exists():
                    HeartbeatRun.objects.filter(pk=run.pk).update(stop_requested_at=timezone.now(),
                                                                  stop_reason="operator pressed stop")
                    return
                time.sleep(0.05)
        finally:
            connection.close()

    stopper = threading.Thread(target=operator)
    stopper.start()
    started = time.monotonic()
    result = get_adapter("process").execute(context(run, timeout_seconds=60))
    stopper.join()
    assert time.monotonic() - started < 15
    assert result.status == "cancelled" and result.error == "stop requested: operator pressed stop"
    pids = [int(p) for p in messages(run, "stdout")[0].split()[1:]]
    assert not any(alive(p) for p in pids)
    run = run_finish(run=run, status=result.status, error=result.error)
    assert run.status == "cancelled"


# --- the example agent against the real API ------------------------------------------------------


def example_run(company, *, mode="done", issue=None, extra_env=None, **kwargs):
    agent = kwargs.pop("agent", None) or AgentFactory(company=company, adapter_type="process")
    agent.adapter_type = "process"
    agent.adapter_config = {"command": [PY, EXAMPLE_AGENT], "grace_seconds": 1,
                            "env": {"EXAMPLE_AGENT_MODE": mode, **(extra_env or {})}}
    agent.save()
    return RunFactory(agent=agent, issue=issue, status="queued", wake_reason="assigned", **kwargs)


@pytest.mark.django_db(transaction=True)
def test_example_agent_finishes_its_issue_over_http(live_server, tmp_path):
    company = CompanyFactory()
    agent = AgentFactory(company=company, adapter_type="process")
    issue = IssueFactory(company=company, title="Write the release notes", assignee_agent=agent)
    other = IssueFactory(company=company, title="Lower priority", priority="low", assignee_agent=agent)
    workspace = ExecutionWorkspace.objects.create(company=company, strategy="isolated_workspace", key="ws",
                                                  path=str(tmp_path))
    run = example_run(company, agent=agent, issue=issue, workspace=workspace,
                      extra_env={"EXAMPLE_AGENT_WRITE_FILE": "1", "EXAMPLE_AGENT_ECHO_KEY": "1"})
    ctx = context(run, api_url=f"{live_server.url}/api", timeout_seconds=60)
    key = ctx.env["PAPERCLIP_API_KEY"]

    result = get_adapter("process").execute(ctx)

    out = messages(run, "stdout")
    assert result.status == "succeeded", "\n".join(messages(run))
    assert (result.liveness, result.exit_code) == ("completed", 0)
    assert result.liveness_reason == f"finished {issue.identifier}"
    issue.refresh_from_db()
    assert issue.status == "done" and issue.completed_at is not None
    bodies = list(Comment.objects.filter(issue=issue, author_agent=agent).values_list("body", flat=True))
    assert any(b.startswith("Example agent: Read") and "NOTES.md" in b for b in bodies)
    assert any(f"run {run.pk}" in b for b in bodies)
    assert Comment.objects.filter(issue=issue, run=run).exists()
    assert (tmp_path / "NOTES.md").read_text().startswith(f"# {issue.identifier}")
    assert f"picked {issue.identifier} (todo): Write the release notes" in out
    assert out[-1].startswith("PAPERCLIP_RESULT ")
    other.refresh_from_db()
    assert other.status == "todo"
    # The key was printed to stdout and stderr on purpose; the log holds neither.
    assert f"debug: my api key is {REDACTED}" in out
    assert not RunEvent.objects.filter(run=run, message__contains=key).exists()
    assert not RunEvent.objects.filter(message__contains=key[4:20]).exists()

    run.refresh_from_db()
    assert run.status == "running" and run.owner == "test-worker:1" and run.pid is not None
    run = run_finish(run=run, status=result.status, error=result.error)
    assert run.status == "succeeded"
    assert not Issue.objects.filter(checkout_run=run).exists() and not Issue.objects.filter(execution_run=run).exists()


@pytest.mark.django_db(transaction=True)
def test_example_agent_plan_only_leaves_the_issue_in_progress(live_server):
    company = CompanyFactory()
    agent = AgentFactory(company=company)
    IssueFactory(company=company, title="Other", priority="critical", assignee_agent=agent)
    issue = IssueFactory(company=company, title="Plan the migration", priority="low", assignee_agent=agent)
    run = example_run(company, agent=agent, issue=issue, mode="plan_only")  # PAPERCLIP_TASK_ID wins
    result = get_adapter("process").execute(context(run, api_url=f"{live_server.url}/api", timeout_seconds=60))
    assert result.status == "succeeded", "\n".join(messages(run))
    assert result.liveness == "plan_only"
    issue.refresh_from_db()
    assert issue.status == "in_progress" and issue.checkout_run_id == run.pk
    assert Document.objects.get(issue=issue, key="plan").latest_revision.body.startswith("# Plan for")
    run_finish(run=run, status=result.status)
    issue.refresh_from_db()
    assert issue.checkout_run_id is None


@pytest.mark.django_db(transaction=True)
def test_example_agent_with_nothing_to_do_reports_empty_response(live_server):
    company = CompanyFactory()
    run = example_run(company)
    result = get_adapter("process").execute(context(run, api_url=f"{live_server.url}/api", timeout_seconds=60))
    assert (result.status, result.liveness) == ("succeeded", "empty_response"), "\n".join(messages(run))
    assert "inbox: 0 issue(s)" in messages(run, "stdout")


@pytest.mark.django_db(transaction=True)
def test_example_agent_moves_on_to_the_next_task_after_a_checkout_conflict(live_server):
    company = CompanyFactory()
    agent = AgentFactory(company=company)
    holder = RunFactory(agent=agent, status="running")
    held = IssueFactory(company=company, title="Held", status="in_progress", assignee_agent=agent,
                        checkout_run=holder, execution_run=holder)
    free = IssueFactory(company=company, title="Free", priority="low", assignee_agent=agent)
    run = example_run(company, agent=agent, issue=held)
    result = get_adapter("process").execute(context(run, api_url=f"{live_server.url}/api", timeout_seconds=60))
    assert (result.status, result.liveness) == ("succeeded", "completed"), "\n".join(messages(run))
    out = messages(run, "stdout")
    # The 409 on the held task is never retried: the agent takes the next one instead.
    assert sum(f"picked {held.identifier}" in line for line in out) == 1
    assert any(f"checkout of {held.identifier} refused (409" in line for line in out)
    assert any(f"checked out {free.identifier}" in line for line in out)
    held.refresh_from_db()
    free.refresh_from_db()
    assert held.checkout_run_id == holder.pk and held.status == "in_progress"
    assert free.status == "done"


# --- http and none adapters ----------------------------------------------------------------------


class Receiver:
    """A local wake endpoint on 127.0.0.1 that records raw requests."""

    def __init__(self, status=202):
        self.status, self.requests = status, []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.requests.append((self.path, dict(self.headers), body))
                self.send_response(receiver.status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/wake"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    servers = []

    def make(status=202):
        servers.append(Receiver(status))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


@pytest.mark.django_db
def test_http_wake_is_signed_and_accepted(receiver, monkeypatch):
    monkeypatch.setenv("PAPERCLIP_SECRET_TEST_WAKE_SECRET", "s3cret-wake-key")
    endpoint = receiver(202)
    issue = IssueFactory()
    agent = AgentFactory(company=issue.company, adapter_type="http",
                         adapter_config={"url": endpoint.url, "secret_ref": "env:PAPERCLIP_SECRET_TEST_WAKE_SECRET"})
    run = RunFactory(agent=agent, issue=issue, status="queued", wake_reason="mentioned",
                     context={"commentIds": ["c-1"]})
    ctx = context(run)
    assert "s3cret-wake-key" in ctx.secrets

    assert get_adapter("http").execute(ctx) is None  # accepted: the agent reports through the API

    [(path, headers, body)] = endpoint.requests
    assert path == "/wake"
    assert verify(body, headers[SIGNATURE_HEADER], "s3cret-wake-key")
    assert not verify(body + b" ", headers[SIGNATURE_HEADER], "s3cret-wake-key")
    assert headers["X-Paperclip-Run-Id"] == str(run.pk)
    payload = json.loads(body)
    assert payload["runId"] == str(run.pk) and payload["agentId"] == str(agent.pk)
    assert payload["companyId"] == str(agent.company_id) and payload["issueId"] == str(issue.pk)
    assert payload["wakeReason"] == "mentioned" and payload["commentIds"] == ["c-1"]
    assert payload["apiUrl"] == "http://127.0.0.1:9"  # the origin, as PAPERCLIP_API_URL (upstream)
    assert AgentApiKey.objects.get(key_hash=hash_key(payload["apiKey"])).run_id == run.pk
    run.refresh_from_db()
    assert run.status == "running" and run.owner == "test-worker:1"
    assert any("HTTP 202" in m for m in messages(run, "system"))


@pytest.mark.django_db
def test_http_non_2xx_and_unreachable_fail(receiver, monkeypatch):
    monkeypatch.setenv("PAPERCLIP_SECRET_TEST_WAKE_SECRET", "s3cret-wake-key")
    endpoint = receiver(503)
    run = make_run(adapter_type="http", adapter_config={"url": endpoint.url, "secret_ref": "env:PAPERCLIP_SECRET_TEST_WAKE_SECRET"})
    result = get_adapter("http").execute(context(run))
    assert result.status == "failed" and result.error == "wake rejected: HTTP 503"

    closed = Receiver()
    url = closed.url
    closed.close()
    run = make_run(adapter_type="http",
                   adapter_config={"url": url, "secret_ref": "env:PAPERCLIP_SECRET_TEST_WAKE_SECRET", "timeout_seconds": 2})
    result = get_adapter("http").execute(context(run))
    assert result.status == "failed" and "ConnectError" in result.error


@pytest.mark.django_db
def test_http_rejects_inline_secrets_and_unset_refs(receiver, monkeypatch):
    endpoint = receiver(202)
    adapter = get_adapter("http")
    with pytest.raises(AdapterConfigError, match="inline secrets"):
        adapter.validate_config({"url": endpoint.url, "secret": "inline", "secret_ref": "env:X"})
    with pytest.raises(AdapterConfigError, match="env:NAME"):
        adapter.validate_config({"url": endpoint.url, "secret_ref": "vault:x"})

    run = make_run(adapter_type="http", adapter_config={"url": endpoint.url, "secret": "inline"})
    result = adapter.execute(context(run))
    assert result.status == "failed" and "inline secrets" in result.error

    monkeypatch.delenv("PAPERCLIP_SECRET_TEST_WAKE_UNSET", raising=False)
    run = make_run(adapter_type="http", adapter_config={"url": endpoint.url, "secret_ref": "env:PAPERCLIP_SECRET_TEST_WAKE_UNSET"})
    result = adapter.execute(context(run))
    assert result.status == "failed" and "PAPERCLIP_SECRET_TEST_WAKE_UNSET is not set" in result.error
    assert endpoint.requests == []


@pytest.mark.django_db
def test_none_adapter_starts_nothing():
    run = make_run(adapter_type="none")
    assert get_adapter("none").execute(context(run)) is None
    run.refresh_from_db()
    assert run.status == "queued" and run.pid is None
