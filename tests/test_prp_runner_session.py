"""The reference runner (``python -m prp_runner``) as a real subprocess against the real host
(pytest-django's live server): hello and resume from the host's cursor, events delivered once and
in order, commands applied once (a repeated delivery answers the stored result), interrupt,
cancel and request.resolve reaching the harness, the derived terminal, the drain and a clean
exit, frames over the negotiated limit split or refused, and bad ACKs from a host rejected.

The harness is tests/prp_runner_test_harness.py, loaded with ``--harness module:…`` (a fake
host-side proxy, :class:`HostProxy`, rewrites answers where a test needs a misbehaving host)."""
import json
import os
import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

import httpx
import pytest

from issues.actors import Actor
from issues.models import HeartbeatRun, RunnerCommand, RunnerEvent, RunnerSession
from issues.runner.commands import command_issue
from issues.services.runs import run_cancel
from tests.factories import MembershipFactory
from tests.prp_runner_test_harness import BIG, REQUEST
from tests.runner_helpers import runner_run
from tests.test_celery_topology import wait_for

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[1]
TEST_HARNESS = "module:tests.prp_runner_test_harness:make"
FAKE_SCRIPTS = ROOT / "tests" / "fixtures" / "prp" / "phase-02" / "scripts"


class RunnerProcess:
    """``python -m prp_runner`` for ``run``, its output in a file (read when the test needs it)."""

    def __init__(self, base_url, run, key, tmp_path, mode="happy", *extra, harness=TEST_HARNESS, name="runner"):
        self.outbox = tmp_path / "outbox.sqlite3"
        self.log_path = tmp_path / f"{name}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PAPERCLIP_")}
        args = [sys.executable, "-m", "prp_runner", "--url", f"{base_url}/api/runner/v1/runs/{run.pk}/",
                "--key", key, "--run-id", str(run.pk), "--outbox", str(self.outbox), "--harness", harness,
                "--poll-wait", "2", "--drain-timeout", "60", *extra]
        if mode:
            args += ["--script", mode]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)

    @property
    def output(self) -> str:
        return self.log_path.read_text()

    def wait(self, timeout=90) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"the runner did not exit within {timeout}s:\n{self.output}")

    def stop(self, signum=signal.SIGTERM) -> int:
        self.proc.send_signal(signum)
        return self.wait(30)


@pytest.fixture
def runners():
    started = []
    yield lambda *args, **kwargs: started.append(RunnerProcess(*args, **kwargs)) or started[-1]
    for runner in started:
        if runner.proc.poll() is None:
            runner.proc.kill()
            runner.proc.wait()


def host_events(run) -> list[dict]:
    return list(RunnerEvent.objects.filter(run=run).order_by("position").values_list("envelope", flat=True))


def assert_delivered_once_in_order(run) -> list[dict]:
    events = host_events(run)
    assert [e["sourceSeq"] for e in events] == list(range(1, len(events) + 1))
    assert len({e["sourceInstanceId"] for e in events}) == 1
    return events


def types(events) -> list[str]:
    return [e["eventType"] for e in events]


def terminal_of(events) -> tuple:
    [terminal] = [e["payload"] for e in events if e["eventType"] == "run.terminal"]
    return terminal["turnTerminalState"], terminal["runTerminalState"], terminal["reportedWorkDisposition"]


def results(run) -> dict:
    return {c.command_type: (c.status, c.result) for c in RunnerCommand.objects.filter(run=run)}


def session_of(run) -> RunnerSession:
    return RunnerSession.objects.get(pk=run.pk)


def wait_for_event(run, event_type, runner, count=1):
    wait_for(lambda: RunnerEvent.objects.filter(run=run, event_type=event_type).count() >= count, timeout=60,
             what=f"{event_type} on the host", logs=lambda: "\n" + runner.output)


class HostProxy:
    """A host that misbehaves on purpose, in front of the live server: it can answer a chosen
    events request with another ``ackedSourceSeq`` and offer commands again from ``afterSeq=0``."""

    def __init__(self, target: str):
        self.target, self.events_answers, self.replayed_polls = target, 0, 0
        self.ack_rewrites: dict = {}  # nth events answer (from 1) -> ackedSourceSeq to answer instead
        self.replay_polls = 0  # how many command polls to answer from afterSeq=0
        self.lock = threading.Lock()
        self.client = httpx.Client(timeout=60)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.client.close()

    def forward(self, method: str, path: str, headers, body: bytes) -> tuple[int, bytes]:
        parts = urlsplit(path)
        query = dict(parse_qsl(parts.query))
        with self.lock:
            if parts.path.endswith("/commands") and self.replayed_polls < self.replay_polls:
                self.replayed_polls += 1
                query.update(afterSeq="0", wait="0")
        try:
            upstream = self.client.request(method, f"{self.target}{parts.path}?{urlencode(query)}", content=body,
                                           headers={k: v for k, v in headers.items()
                                                    if k.lower() in ("authorization", "content-type")})
        except httpx.HTTPError:  # the proxy is closing under a pending long-poll
            return 502, b"{}"
        content = upstream.content
        if parts.path.endswith("/events") and upstream.status_code == 200:
            with self.lock:
                self.events_answers += 1
                rewrite = self.ack_rewrites.get(self.events_answers)
            if rewrite is not None:
                content = json.dumps({**upstream.json(), "ackedSourceSeq": rewrite}).encode()
        return upstream.status_code, content

    def _handler(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _relay(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, content = proxy.forward(self.command, self.path, self.headers, body)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(content)))
                    self.end_headers()
                    self.wfile.write(content)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the runner exited during a long-poll

            do_GET = do_POST = _relay

            def log_message(self, *args):
                pass

        return Handler


@pytest.fixture
def proxy(live_server):
    host = HostProxy(live_server.url)
    yield host
    host.close()


# --- tests -------------------------------------------------------------------------------------------
def test_a_run_is_delivered_in_order_once_and_the_runner_exits_clean(live_server, tmp_path, runners):
    run, key = runner_run()
    runner = runners(live_server.url, run, key, tmp_path, "happy")
    assert runner.wait() == 0, runner.output
    out = runner.output
    assert "hello: PRP v2" in out and "host cursor 0" in out and "exit 0" in out
    assert key not in out
    assert not runner.outbox.exists()  # drained in full: the outbox is deleted
    events = assert_delivered_once_in_order(run)
    assert types(events) == ["session.started", "turn.started", "item.started", "item.delta", "item.delta",
                             "item.completed", "run.result.proposed", "turn.completed", "run.terminal"]
    logs = [(e["itemId"], e["payload"]["text"]) for e in events if e["eventType"] == "item.delta"]
    assert logs == [("log-stdout", "first line\n"), ("log-stderr", "second line\n")]
    assert {e["turnId"] for e in events[1:]} == {"turn-3"}  # turn.start was controllerSeq 3
    assert [e["priority"] for e in events[:4]] == [0, 0, 1, 2]
    assert terminal_of(events) == ("completed", "succeeded", "done")  # derived: exit 0 and a done result
    run.refresh_from_db()
    assert run.status == "succeeded"
    assert results(run) == {"run.prepare": ("succeeded", {"status": "succeeded", "result": {
                                "observeCredentials": False, "workspace": str(ROOT)}}),
                            "session.open": ("succeeded", {"status": "succeeded", "result": {}}),
                            "turn.start": ("succeeded", {"status": "succeeded", "result": {"turnId": "turn-3"}})}
    assert session_of(run).runner_instance_id == events[0]["sourceInstanceId"]


def test_an_error_exit_fails_the_run_whatever_result_was_proposed(live_server, tmp_path, runners):
    run, key = runner_run()
    runner = runners(live_server.url, run, key, tmp_path, "error", "--keep-outbox")
    assert runner.wait() == 0, runner.output
    assert runner.outbox.exists()  # --keep-outbox
    events = assert_delivered_once_in_order(run)
    assert types(events)[-2:] == ["run.result.proposed", "run.terminal"]
    assert terminal_of(events) == ("failed", "failed", "yielded")
    run.refresh_from_db()
    assert run.status == "failed"
    # Started again on its outbox after the run ended (as after a crash that lost the last ACK),
    # the runner redelivers up to its terminal only, adds nothing and exits clean.
    again = runners(live_server.url, run, key, tmp_path, "error", name="again")
    assert again.wait() == 0, again.output
    assert "the run has ended; redelivering up to the terminal" in again.output
    assert host_events(run) == events and not again.outbox.exists()


def test_commands_are_applied_once_and_an_interrupt_ends_the_turn(live_server, tmp_path, runners, proxy):
    """The proxy offers the first commands again from afterSeq=0 on three polls: the runner answers
    their stored results and applies nothing twice (one session, one turn, one harness)."""
    proxy.replay_polls = 3
    run, key = runner_run()
    runner = runners(proxy.url, run, key, tmp_path, "await_interrupt")
    wait_for_event(run, "item.started", runner)
    wait_for(lambda: proxy.replayed_polls == 3, timeout=60, what="three replayed polls")
    session = session_of(run)
    goal = command_issue(session=session, command_type="session.goal.get")
    steer = command_issue(session=session, command_type="turn.steer", payload={"text": "faster"})
    command_issue(session=session, command_type="turn.interrupt")
    assert runner.wait() == 0, runner.output
    # The first poll delivered the three first commands; the two replayed polls offered them again.
    assert runner.output.count("offered again: its stored result is reported") == 6
    events = assert_delivered_once_in_order(run)
    assert types(events) == ["session.started", "turn.started", "item.started", "run.terminal"]
    assert terminal_of(events) == ("interrupted", "cancelled", "yielded")
    run.refresh_from_db()
    assert run.status == "cancelled"
    statuses = {c.command_id: (c.status, c.result) for c in RunnerCommand.objects.filter(run=run)}
    assert statuses[goal.command_id] == ("rejected", {"status": "rejected", "error": {
        "code": "unsupported", "message": "The harness does not support session.goal.get."}})
    assert statuses[steer.command_id][0] == "rejected"
    assert statuses[steer.command_id][1]["error"]["code"] == "unsupported"
    assert results(run)["turn.interrupt"] == ("succeeded", {"status": "succeeded", "result": {"interrupted": True}})


def test_a_board_cancel_reaches_the_harness_and_ends_the_run_cancelled(live_server, tmp_path, runners):
    run, key = runner_run()
    runner = runners(live_server.url, run, key, tmp_path, "await_interrupt")
    wait_for_event(run, "item.started", runner)
    board = Actor(user=MembershipFactory(company=run.company).user)
    assert run_cancel(actor=board, run=run).status == "running"  # waits for the runner's terminal
    assert runner.wait() == 0, runner.output
    events = assert_delivered_once_in_order(run)
    assert terminal_of(events) == ("cancelled", "cancelled", "yielded")
    run.refresh_from_db()
    assert run.status == "cancelled" and run.stop_reason == "board_cancel"
    stop = RunnerCommand.objects.get(run=run, command_type="run.cancel")
    assert stop.status == "succeeded" and stop.result == {"status": "succeeded", "result": {"cancelled": True}}


def test_request_resolve_reaches_the_waiting_harness(live_server, tmp_path, runners):
    run, key = runner_run()
    runner = runners(live_server.url, run, key, tmp_path, "request")
    wait_for_event(run, "runtime_request.created", runner)
    session = session_of(run)
    unknown = command_issue(session=session, command_type="request.resolve",
                            payload={"requestId": "req_never_asked", "response": {"decision": "allow"}})
    command_issue(session=session, command_type="request.resolve",
                  payload={"requestId": REQUEST["requestId"], "response": {"decision": "allow"}})
    assert runner.wait() == 0, runner.output
    events = assert_delivered_once_in_order(run)
    assert types(events)[2:] == ["runtime_request.created", "runtime_request.resolved", "item.completed",
                                 "run.terminal"]
    assert events[2]["payload"] == {"request": REQUEST}
    assert events[3]["payload"] == {"requestId": REQUEST["requestId"], "response": {"decision": "allow"}}
    assert events[4]["payload"]["text"] == '{"decision": "allow"}'  # what the harness was woken with
    assert terminal_of(events) == ("completed", "succeeded", "yielded")  # exit 0, no result proposed
    unknown.refresh_from_db()
    assert unknown.status == "rejected" and unknown.result["error"]["code"] == "unknown_request"


def test_a_restart_resumes_from_the_outbox_and_the_host_cursor(live_server, tmp_path, runners):
    run, key = runner_run()
    first = runners(live_server.url, run, key, tmp_path, "await_interrupt", "--keep-outbox")
    wait_for_event(run, "item.started", first)
    assert first.stop(signal.SIGTERM) == 128 + signal.SIGTERM
    assert first.outbox.exists() and "outbox kept" in first.output
    source = host_events(run)[0]["sourceInstanceId"]
    second = runners(live_server.url, run, key, tmp_path, "await_interrupt", name="second")
    wait_for(lambda: "harness runner-test: resuming turn turn-3" in second.output, timeout=60,
             what="the harness resumed", logs=lambda: second.output)
    assert "host cursor 3" in second.output and f"source {source}" in second.output
    command_issue(session=session_of(run), command_type="turn.interrupt")
    assert second.wait() == 0, second.output
    events = assert_delivered_once_in_order(run)
    # The resumed harness continued after its checkpoint: no second item, session or turn.
    assert types(events) == ["session.started", "turn.started", "item.started", "run.terminal"]
    assert terminal_of(events) == ("interrupted", "cancelled", "yielded")
    assert not second.outbox.exists()


def test_frames_over_the_negotiated_limit_are_split_or_refused(live_server, tmp_path, runners, settings):
    limit = 2048
    settings.PAPERCLIP = {**settings.PAPERCLIP, "RUNNER_MAX_BATCH_BYTES": limit}
    run, key = runner_run()
    runner = runners(live_server.url, run, key, tmp_path, "big")
    assert runner.wait() == 0, runner.output
    assert f"'maxBatchBytes': {limit}" in runner.output
    events = assert_delivered_once_in_order(run)
    pieces = [e for e in events if e["eventType"] == "item.delta"]
    assert len(pieces) >= 3 and {e["itemId"] for e in pieces} == {"log-stdout"}
    assert "".join(e["payload"]["text"] for e in pieces) == "x" * BIG + "\n"
    assert all(len(json.dumps({"events": [e]}, separators=(",", ":"))) <= limit for e in events)
    [diagnostic] = [e["payload"] for e in events if e["eventType"] == "runner.diagnostic"]
    assert diagnostic["code"] == "frame_too_large" and diagnostic["eventType"] == "item.started"
    assert diagnostic["maxBytes"] == limit - 13 and diagnostic["bytes"] > limit
    assert "item.started" not in types(events)
    run.refresh_from_db()
    assert run.status == "succeeded"


def test_acks_that_go_backwards_or_past_what_was_produced_are_rejected(live_server, tmp_path, runners, proxy,
                                                                       settings):
    settings.PAPERCLIP = {**settings.PAPERCLIP, "RUNNER_MAX_BATCH": 5}  # many batches, so many answers
    proxy.ack_rewrites = {2: 0, 3: 10**6}
    run, key = runner_run()
    runner = runners(proxy.url, run, key, tmp_path, "many")
    assert runner.wait() == 0, runner.output
    out = runner.output
    assert "ACK 0 rejected: it goes backwards" in out
    assert "ACK 1000000 rejected: it is past the last event produced" in out
    events = assert_delivered_once_in_order(run)
    assert types(events).count("item.started") == 40 and types(events)[-1] == "run.terminal"
    assert HeartbeatRun.objects.get(pk=run.pk).status == "succeeded"


@pytest.mark.skipif(not (ROOT / "prp_runner" / "harness" / "fake.py").exists(), reason="the fake harness is not there")
def test_the_fake_harness_plays_the_happy_path_end_to_end(live_server, tmp_path, runners):
    run, key = runner_run()
    runner = runners(live_server.url, run, key, tmp_path, str(FAKE_SCRIPTS / "happy-path.json"), harness="fake")
    assert runner.wait() == 0, runner.output
    events = assert_delivered_once_in_order(run)
    assert terminal_of(events) == ("completed", "succeeded", "done")
    assert types(events).count("run.terminal") == 1
    run.refresh_from_db()
    assert run.status == "succeeded"
