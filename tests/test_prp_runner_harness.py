"""The reference runner's harnesses (``prp_runner.harness``), driven through a recording
``HarnessSession``: the fake harness plays each phase-02 script (events in order, checkpoints,
resume, interrupt, resolutions, the duplicate terminal, the lingering worker) and the process
harness supervises real child processes (output → events, the result line → ``run_result.v1``,
usage, exit codes, the 64 KiB line limit, SIGINT → SIGTERM → SIGKILL). Every event a harness
emits, wrapped in an envelope, is validated against the host's contract for PRP v1 and v2.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from issues.runner import contract
from prp_runner.envelope import LOG_EVENT, log_event, priority_of
from prp_runner.harness import get_harness
from prp_runner.harness.fake import FakeHarness, load_script
from prp_runner.harness.output_lines import LineError, parse_result_line, run_result
from prp_runner.harness.process import ProcessHarness
from prp_runner.outcome import derive_terminal
from tests.runner_helpers import envelope
from tests.test_celery_topology import wait_for

REPO = Path(__file__).resolve().parent.parent
FIXTURE_SCRIPTS = REPO / "tests" / "fixtures" / "prp" / "phase-02" / "scripts"
BUNDLED_SCRIPTS = REPO / "prp_runner" / "scripts"
SCRIPT_NAMES = ("happy-path", "error", "interrupted", "linger", "duplicate-terminal", "permission-input")
RUN_ID, TURN_ID = "run-harness-test", "turn-1"
ANSWERS = {"request_phase2_permission": {"choice": "allow"}, "request_phase2_input": {"text": "local trace"}}


class RecordingSession:
    """The ``HarnessSession`` API (prp_runner.session) in memory: it records what the harness emits
    and lets the test interrupt, answer runtime requests and see registered processes."""

    def __init__(self, *, workspace: str, env: dict | None = None, task_packet: str = "",
                 restored_checkpoint: dict | None = None, answers: dict | None = None, auto_interrupt=False):
        self.run_id, self.turn_id, self.protocol_version = RUN_ID, TURN_ID, 2
        self.task_packet, self.workspace = task_packet, workspace
        self.env = {k: v for k, v in os.environ.items() if k != "PAPERCLIP_RUNNER_URL"}
        self.env.update(env or {})
        self.restored_checkpoint = restored_checkpoint
        self.interrupt_requested, self.cancel_requested = threading.Event(), threading.Event()
        self.events: list[tuple] = []  # (event type, payload, item id, checkpoint)
        self.refused_terminals: list[dict] = []
        self.processes: list = []
        self._answers = dict(answers or {})
        self._auto_interrupt = auto_interrupt  # the interrupt arrives as soon as the harness waits for it
        self._changed = threading.Condition()

    # --- the HarnessSession API
    def emit(self, event_type, payload, *, item_id=None, checkpoint=None) -> bool:
        with self._changed:
            self.events.append((event_type, payload, item_id, checkpoint))
        return True

    def log(self, stream, text, *, checkpoint=None):
        item_id, payload = log_event(stream, text)
        self.emit(LOG_EVENT, payload, item_id=item_id, checkpoint=checkpoint)

    def request(self, request, *, checkpoint=None):
        self.emit("runtime_request.created", {"request": request}, checkpoint=checkpoint)

    def wait_resolution(self, request_id, timeout=None):
        with self._changed:
            self._changed.wait_for(lambda: request_id in self._answers or self.interrupt_requested.is_set(), timeout)
            return self._answers.get(request_id)

    def wait_interrupt(self, timeout=None) -> bool:
        if self._auto_interrupt:
            self.interrupt()
        return self.interrupt_requested.wait(timeout)

    def propose_result(self, result, *, checkpoint=None):
        self.emit("run.result.proposed", result, checkpoint=checkpoint)

    def terminal(self, terminal, *, checkpoint=None) -> bool:
        if any(event[0] == "run.terminal" for event in self.events):
            self.refused_terminals.append(terminal)
            return False
        return self.emit("run.terminal", terminal, checkpoint=checkpoint)

    def diagnostic(self, code, message, **details):
        self.emit("runner.diagnostic", {"code": code, "message": message, **details})

    def register_process(self, popen):
        self.processes.append(popen)

    # --- the test's side
    def interrupt(self):
        with self._changed:
            self.interrupt_requested.set()
            self._changed.notify_all()

    def resolve(self, request_id, response):
        with self._changed:
            self._answers[request_id] = response
            self._changed.notify_all()

    def of_type(self, event_type) -> list:
        return [e for e in self.events if e[0] == event_type]

    def lines(self, stream) -> list[str]:
        return [p["text"].removesuffix("\n") for t, p, item, _ in self.events if item == f"log-{stream}"]

    def diagnostics(self, code) -> list[dict]:
        return [p for t, p, _, _ in self.of_type("runner.diagnostic") if p["code"] == code]


@pytest.fixture
def new_session(tmp_path):
    """Sessions for one test; every process group a harness registered is killed afterwards."""
    sessions = []

    def make(**kwargs) -> RecordingSession:
        session = RecordingSession(workspace=str(tmp_path), **kwargs)
        sessions.append(session)
        return session

    yield make
    for session in sessions:
        for popen in session.processes:
            if popen.poll() is None:
                os.killpg(popen.pid, signal.SIGKILL)
            popen.wait(timeout=10)
            if popen.stdin:
                popen.stdin.close()


def assert_valid_envelopes(events):
    """Each event, as the runner would send it, passes the host's contract on PRP v1 and v2."""
    for version in (1, 2):
        for seq, (event_type, payload, item_id, _) in enumerate(events, 1):
            fields = {"priority": priority_of(event_type), "turnId": TURN_ID}
            if item_id:
                fields["itemId"] = item_id
            doc = envelope(seq, event_type, payload, run=RUN_ID, version=version, **fields)
            contract.validate_event(doc, protocol_version=version)


def script_events(script: dict, start: int = 0) -> list[tuple]:
    """The events the steps say, from step ``start`` to the first ``exit``, each with its checkpoint."""
    expected, terminal_seen = [], False
    for i, step in enumerate(script["steps"][start:], start):
        checkpoint, kind = {"step": i + 1}, step["kind"]
        if kind == "exit":
            break
        if kind == "event":
            expected.append((step["event_type"], step["payload"], step.get("item_id"), checkpoint))
        elif kind == "log":
            item_id, payload = log_event(step["stream"], step["text"])
            expected.append((LOG_EVENT, payload, item_id, checkpoint))
        elif kind == "request":
            expected.append(("runtime_request.created", {"request": step["request"]}, None, checkpoint))
        elif kind == "result":
            expected.append(("run.result.proposed", step["payload"], None, checkpoint))
        elif kind == "terminal" and not terminal_seen:
            terminal_seen = True
            expected.append(("run.terminal", step["payload"], None, checkpoint))
    return expected


def play(name, session, **options) -> tuple[FakeHarness, int]:
    harness = get_harness("fake", {"script": name, **options})
    return harness, harness.run(session)


def in_thread(target, *args) -> tuple[threading.Thread, dict]:
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("code", target(*args)), daemon=True)
    thread.start()
    return thread, out


def agent(tmp_path, source: str, name: str = "agent.py") -> list[str]:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return [sys.executable, str(path)]


def gone(pid: int) -> bool:
    """Ended: no such process, or a zombie nobody reaped yet."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat[stat.rfind(")") + 2] in "ZX"


# --- scripts and registry ------------------------------------------------------------------------
def test_bundled_scripts_are_byte_identical_copies_of_the_phase_02_fixtures():
    assert sorted(p.name for p in BUNDLED_SCRIPTS.glob("*.json")) == sorted(f"{n}.json" for n in SCRIPT_NAMES)
    for name in SCRIPT_NAMES:
        assert (BUNDLED_SCRIPTS / f"{name}.json").read_bytes() == (FIXTURE_SCRIPTS / f"{name}.json").read_bytes()


def test_script_option_names_a_bundled_script_or_a_path(tmp_path):
    assert get_harness("fake", {"script": "happy-path"}).script["name"] == "happy-path"
    own = tmp_path / "mine.json"
    own.write_text(json.dumps({"schema": "paperclip.fake_harness.script.v1", "name": "mine",
                               "steps": [{"kind": "exit", "code": 3}]}))
    assert get_harness("fake", {"script": str(own)}).script["name"] == "mine"


@pytest.mark.parametrize("options, error", [
    ({}, "needs a script"),
    ({"script": "no-such-script"}, "no bundled script"),
    ({"script": "BAD"}, "no bundled script"),
])
def test_fake_harness_refuses_a_missing_script(options, error):
    with pytest.raises(ValueError, match=error):
        get_harness("fake", options)


@pytest.mark.parametrize("steps, error", [
    ([{"kind": "dance"}], "unknown kind 'dance'"),
    ([{"kind": "log", "stream": "stdlog", "text": "x"}], "stream must be stdout or stderr"),
    ([{"kind": "delay", "milliseconds": "5"}], "milliseconds must be a JSON integer"),
    ([{"kind": "exit", "code": True}], "code must be a JSON integer"),
    ([{"kind": "event", "payload": {}}], "event_type must be a JSON string"),
])
def test_an_invalid_script_is_refused_at_load_naming_the_step(tmp_path, steps, error):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"schema": "paperclip.fake_harness.script.v1", "steps": steps}))
    with pytest.raises(ValueError, match=rf"step 0\b.*: {error}"):
        load_script(str(path))


def test_unknown_harness_and_a_process_harness_without_command_are_refused():
    with pytest.raises(LookupError, match="unknown harness 'shell'"):
        get_harness("shell", {})
    with pytest.raises(ValueError, match="needs a command"):
        get_harness("process", {})


@pytest.mark.parametrize("name, options", [("fake", {"script": "happy-path"}), ("process", {"command": ["true"]})])
@pytest.mark.parametrize("version", [1, 2])
def test_capabilities_pass_the_contract_and_advertise_only_what_is_supported(name, options, version):
    caps = get_harness(name, options).capabilities(version)
    contract.validate_capabilities(caps, protocol_version=version)
    fake = name == "fake"
    assert {k: caps[k] for k in ("steer", "interrupt", "resume", "runtimeRequests", "structuredResult")} == {
        "steer": False, "interrupt": True, "resume": fake, "runtimeRequests": fake, "structuredResult": True}
    assert "steer" in caps["unsupported"]
    if version == 2:
        assert caps["sessionGoals"]["availability"] == "unsupported" and caps["sessionGoals"]["actions"] == []


# --- the fake harness ----------------------------------------------------------------------------
EXIT_CODES = {"happy-path": 0, "error": 7, "interrupted": 130, "linger": 130, "duplicate-terminal": 0,
              "permission-input": 0}


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_each_script_emits_what_its_steps_say_in_order_with_checkpoints(name, new_session):
    session = new_session(answers=ANSWERS, auto_interrupt=True)
    harness, code = play(name, session)
    assert code == EXIT_CODES[name]
    assert session.events == script_events(harness.script)
    assert_valid_envelopes(session.events)


# name -> (runTerminalState, reportedWorkDisposition of the terminal, of the proposed result or None)
ENDS_AS = {"happy-path": ("succeeded", "done", "done"), "error": ("failed", "yielded", "yielded"),
           "interrupted": ("cancelled", "yielded", "yielded"), "linger": ("cancelled", "yielded", None),
           "duplicate-terminal": ("succeeded", "done", "done"), "permission-input": ("succeeded", "done", "done")}


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_each_script_ends_as_its_name_says(name, new_session):
    """The script's own terminal, or (none: linger) the one the runner derives from its exit."""
    session = new_session(answers=ANSWERS, auto_interrupt=True)
    _, code = play(name, session)
    results = [p for _, p, _, _ in session.of_type("run.result.proposed")]
    terminals = [p for _, p, _, _ in session.of_type("run.terminal")]
    if not terminals:
        terminals = [derive_terminal(exit_code=code, result=results[-1] if results else None,
                                     interrupted=session.interrupt_requested.is_set(), cancelled=False)]
    run_state, disposition, result_disposition = ENDS_AS[name]
    assert (terminals[0]["runTerminalState"], terminals[0]["reportedWorkDisposition"]) == (run_state, disposition)
    assert (results[-1]["reportedWorkDisposition"] if results else None) == result_disposition
    if name == "error":  # the error exit stays apart from the yielded result: a failed run, exit 7
        assert code == 7 and terminals[0]["turnTerminalState"] == "failed"


def test_a_restored_checkpoint_resumes_at_its_step_without_emitting_earlier_events(new_session):
    session = new_session(restored_checkpoint={"step": 8})
    harness, code = play("happy-path", session)
    assert code == 0
    assert session.events == script_events(harness.script, start=8)
    assert session.events[0][:3] == ("item.completed", {"kind": "command", "text": "Fake driver check passed."},
                                     "item_phase2_command")
    assert session.lines("stdout") == []  # the five log steps were before the checkpoint


def test_resuming_after_await_interrupt_plays_the_scripted_ending(new_session):
    """The interrupt that await_interrupt consumed before the restart is set again (restored from
    the applied command); the script goes on instead of stopping at once."""
    session = new_session(restored_checkpoint={"step": 3})
    session.interrupt()
    harness, code = play("interrupted", session)
    assert code == 130
    assert [e[0] for e in session.events] == ["item.failed", "run.result.proposed", "session.closed", "run.terminal"]
    assert session.events == script_events(harness.script, start=3)


def test_an_unusable_checkpoint_fails_without_replaying(new_session):
    session = new_session(restored_checkpoint={"step": 99})
    _, code = play("happy-path", session)
    assert code == 1
    assert [e[0] for e in session.events] == ["runner.diagnostic"]
    assert session.diagnostics("checkpoint_invalid")[0]["checkpoint"] == {"step": 99}


def test_await_interrupt_blocks_until_the_interrupt(new_session):
    session = new_session()
    thread, out = in_thread(get_harness("fake", {"script": "interrupted"}).run, session)
    wait_for(lambda: len(session.events) == 2, timeout=10, what="the events before await_interrupt", interval=0.02)
    assert thread.is_alive() and len(session.events) == 2  # waiting, nothing more emitted
    session.interrupt()
    thread.join(10)
    assert out["code"] == 130
    assert session.events[-1][0] == "run.terminal" and session.events[-1][1]["turnTerminalState"] == "interrupted"


def test_await_resolution_waits_for_each_answer_and_gets_it(new_session):
    session = new_session()
    harness = get_harness("fake", {"script": "permission-input"})
    thread, out = in_thread(harness.run, session)
    wait_for(lambda: session.events, timeout=10, what="the permission request", interval=0.02)
    assert thread.is_alive() and [e[0] for e in session.events] == ["runtime_request.created"]
    session.resolve("request_phase2_permission", {"choice": "deny"})
    wait_for(lambda: len(session.events) == 2, timeout=10, what="the input request", interval=0.02)
    assert session.events[1][1]["request"]["requestId"] == "request_phase2_input"
    session.resolve("request_phase2_input", {"text": "trace-7"})
    thread.join(10)
    assert out["code"] == 0
    assert harness.resolutions == {"request_phase2_permission": {"choice": "deny"},
                                   "request_phase2_input": {"text": "trace-7"}}


def test_an_interrupt_while_awaiting_a_resolution_ends_the_script(new_session):
    session = new_session()
    thread, out = in_thread(get_harness("fake", {"script": "permission-input"}).run, session)
    wait_for(lambda: session.events, timeout=10, what="the permission request", interval=0.02)
    session.interrupt()
    thread.join(10)
    assert out["code"] == 130 and len(session.events) == 1


def test_an_interrupt_stops_an_unscripted_turn_before_its_next_step_and_during_a_delay(tmp_path, new_session):
    stopped = new_session()
    stopped.interrupt()
    assert play("happy-path", stopped)[1] == 130 and stopped.events == []
    path = tmp_path / "slow.json"
    path.write_text(json.dumps({"schema": "paperclip.fake_harness.script.v1", "steps": [
        {"kind": "log", "stream": "stdout", "text": "before"}, {"kind": "delay", "milliseconds": 600000},
        {"kind": "log", "stream": "stdout", "text": "after"}]}))
    session = new_session()
    thread, out = in_thread(get_harness("fake", {"script": str(path)}).run, session)
    wait_for(lambda: session.events, timeout=10, what="the first log line", interval=0.02)
    session.interrupt()
    thread.join(10)
    assert out["code"] == 130 and session.lines("stdout") == ["before"]


def test_a_duplicate_terminal_is_refused_by_the_session_and_nothing_follows(new_session):
    session = new_session()
    harness, code = play("duplicate-terminal", session)
    assert code == 0
    assert len(session.of_type("run.terminal")) == 1 and session.events[-1][0] == "run.terminal"
    assert session.events[-1][1]["runTerminalState"] == "succeeded"
    assert session.refused_terminals == [harness.steps[4]["payload"]]  # the second one was offered, and refused


def test_spawn_worker_leaves_a_registered_live_process_group(new_session):
    session = new_session(auto_interrupt=True)
    _, code = play("linger", session)
    assert code == 130  # the harness has returned; its worker lingers until the runner's cleanup
    [worker] = session.processes
    assert worker.poll() is None and not gone(worker.pid)
    assert os.getpgid(worker.pid) == worker.pid != os.getpgid(0)  # its own group
    os.killpg(worker.pid, 0)


def test_a_worker_ends_with_the_runner_that_holds_its_pipe(new_session):
    """A SIGKILLed runner closes the worker's stdin: no orphan is left behind."""
    session = new_session(auto_interrupt=True)
    play("linger", session)
    [worker] = session.processes
    worker.stdin.close()
    assert worker.wait(timeout=10) == 0


def test_resuming_linger_starts_its_worker_again_without_re_emitting(new_session):
    session = new_session(restored_checkpoint={"step": 2}, auto_interrupt=True)
    _, code = play("linger", session)
    assert code == 130 and session.events == []
    [worker] = session.processes
    assert worker.poll() is None


# --- PAPERCLIP_RESULT → paperclip.run_result.v1 -------------------------------------------------------
@pytest.mark.parametrize("line, disposition, satisfied, continuation", [
    ({"status": "done", "summary": "Did it."}, "done", True, None),
    ({"status": "handoff", "summary": "Ready for review."}, "needs_review", False, None),
    ({"status": "failed", "reason": "tests failed"}, "yielded", False, "retry"),
    ({"status": "aborted"}, "yielded", False, "same_agent"),
    ({"liveness": "plan_only", "reason": "plan written"}, "yielded", False, "same_agent"),
])
def test_result_line_maps_to_a_valid_run_result(line, disposition, satisfied, continuation):
    report = parse_result_line("PAPERCLIP_RESULT " + json.dumps(line))
    result = run_result(report, run_id=RUN_ID, turn_id=TURN_ID)
    contract.validate_result(result)
    assert result["reportedWorkDisposition"] == disposition
    assert result["completionClaim"]["objectiveSatisfied"] is satisfied
    assert (result.get("continuation") or {}).get("kind") == continuation
    said = line.get("status") or f"liveness {line.get('liveness')}"
    assert result["summary"] == line.get("summary", line.get("reason", f"The agent reported {said}."))
    assert result["resultLine"] == line


def test_result_line_keeps_the_pull_request_and_the_agents_words():
    report = parse_result_line('PAPERCLIP_RESULT {"status": "done", "summary": "Merged.", "final_state": "done", '
                               '"pr_url": "http://127.0.0.1:8000/pull/7", "liveness": "completed", "x": 1}')
    result = run_result(report, run_id=RUN_ID, turn_id=TURN_ID)
    assert result["artifacts"] == [{"kind": "pull_request", "ref": "http://127.0.0.1:8000/pull/7",
                                    "title": "Pull request"}]
    assert result["resultLine"] == {"status": "done", "summary": "Merged.", "final_state": "done",
                                    "pr_url": "http://127.0.0.1:8000/pull/7", "liveness": "completed"}
    assert result["completionClaim"]["remainingWork"] == []


@pytest.mark.parametrize("line, error", [
    ("PAPERCLIP_RESULT {not json", "not valid JSON"),
    ("PAPERCLIP_RESULT [1]", "expected a JSON object"),
    ('PAPERCLIP_RESULT {"summary": "no status"}', "neither status nor liveness"),
    ('PAPERCLIP_RESULT {"status": "finished"}', "status 'finished' is not one of"),
    ('PAPERCLIP_RESULT {"liveness": "asleep"}', "liveness 'asleep' is not one of"),
    ('PAPERCLIP_RESULT {"status": 1}', "status must be a string"),
    ('PAPERCLIP_RESULT {"status": "done", "pr_url": "ftp://127.0.0.1/x"}', "pr_url must be an http"),
    ('PAPERCLIP_RESULT {"status": "done", "final_state": "' + "x" * 101 + '"}', "final_state is longer"),
])
def test_an_invalid_result_line_says_why(line, error):
    with pytest.raises(LineError, match=error):
        parse_result_line(line)
    assert parse_result_line("just output") is None


# --- the process harness -----------------------------------------------------------------------------
OUTPUT_AGENT = """
    import json, os, sys
    print("hello from stdout", flush=True)
    print("warning on stderr", file=sys.stderr, flush=True)
    usage = {"provider": "openai", "model": "gpt-test", "inputTokens": 100, "outputTokens": 20,
             "providerCostUsd": 0.25}
    print("PAPERCLIP_USAGE " + json.dumps(usage), flush=True)
    usage = {"provider": "openai", "model": "gpt-test", "inputTokens": 50, "outputTokens": 5, "requests": 1}
    print("PAPERCLIP_USAGE " + json.dumps(usage), flush=True)
    print('PAPERCLIP_USAGE {"inputTokens": -1}', flush=True)
    print("PAPERCLIP_RESULT " + json.dumps({"status": "failed", "summary": "first try"}), flush=True)
    print('PAPERCLIP_RESULT {"status": "bogus"}', flush=True)
    with open(os.environ["PAPERCLIP_TASK_PACKET_PATH"]) as fh:
        print("packet: " + fh.read(), flush=True)
    print("packet file " + os.environ["PAPERCLIP_TASK_PACKET_PATH"], flush=True)
    print("run " + os.environ["PAPERCLIP_RUN_ID"] + " in " + os.getcwd(), flush=True)
    print("PAPERCLIP_RESULT " + json.dumps({"status": "done", "summary": "All done.",
                                            "pr_url": "http://127.0.0.1:8000/pull/7"}), flush=True)
"""


def test_process_output_becomes_logs_usage_and_one_result(tmp_path, new_session):
    session = new_session(env={"PAPERCLIP_RUN_ID": RUN_ID}, task_packet="Fix the flaky test.")
    code = ProcessHarness(agent(tmp_path, OUTPUT_AGENT)).run(session)
    assert code == 0
    assert session.lines("stderr") == ["warning on stderr"]
    stdout = session.lines("stdout")
    assert stdout[0] == "hello from stdout" and stdout[-1].startswith("PAPERCLIP_RESULT ")  # every line, verbatim
    assert "packet: Fix the flaky test." in stdout and f"run {RUN_ID} in {tmp_path}" in stdout
    usage = [p for _, p, _, _ in session.of_type("usage.reported")]
    assert [u["runDelta"]["inputTokens"] for u in usage] == [100, 50]
    assert usage[1]["cumulative"] == {"inputTokens": 150, "outputTokens": 25, "cacheReadTokens": 0,
                                      "cacheWriteTokens": 0, "activeSeconds": 0, "requests": 1,
                                      "providerCostUsd": 0.25}
    assert [u["costSource"] for u in usage] == ["provider_reported", "unknown"]
    assert [d["code"] for d in (p for _, p, _, _ in session.of_type("runner.diagnostic"))] == [
        "usage_line_invalid", "result_line_invalid"]
    [(_, result, _, _)] = session.of_type("run.result.proposed")  # once, at exit: the last valid line
    assert result == run_result(parse_result_line(stdout[-1]), run_id=RUN_ID, turn_id=TURN_ID)
    assert result["reportedWorkDisposition"] == "done" and result["summary"] == "All done."
    assert [e[0] for e in session.events if e[2] == "agent-process"] == ["item.started", "item.completed"]
    assert session.events[0][3] == {"process": "started"}  # checkpoint stored before the command starts
    [packet_file] = [line.removeprefix("packet file ") for line in stdout if line.startswith("packet file ")]
    assert not Path(packet_file).exists()  # removed when the command has ended
    assert_valid_envelopes(session.events)


def test_the_exit_code_is_returned_and_the_item_fails(tmp_path, new_session):
    session = new_session()
    code = ProcessHarness(agent(tmp_path, "import sys; print('bye'); sys.exit(3)")).run(session)
    assert code == 3
    assert session.events[-1][:3] == ("item.failed", {"kind": "command", "message": "exited with code 3",
                                                      "exitCode": 3}, "agent-process")
    assert session.of_type("run.result.proposed") == []
    assert_valid_envelopes(session.events)


def test_a_command_that_cannot_start_fails_with_a_diagnostic(tmp_path, new_session):
    session = new_session()
    assert ProcessHarness([str(tmp_path / "missing-agent")]).run(session) == 127
    assert "could not start" in session.diagnostics("command_not_started")[0]["message"]
    assert_valid_envelopes(session.events)


def test_a_line_over_the_limit_fails_the_run_and_terminates_the_group(tmp_path, new_session):
    session = new_session()
    command = agent(tmp_path, """
        import subprocess, sys, time
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(f"helper {helper.pid}", flush=True)
        sys.stdout.write("x" * (70 * 1024) + "\\n")
        sys.stdout.flush()
        time.sleep(600)
    """)
    code = ProcessHarness(command, sigkill_after=1.0).run(session)
    assert code == 128 + signal.SIGTERM
    [diagnostic] = session.diagnostics("line_too_large")
    assert diagnostic["stream"] == "stdout" and diagnostic["maxLineBytes"] == 65536
    [helper] = [int(line.split()[1]) for line in session.lines("stdout") if line.startswith("helper ")]
    wait_for(lambda: gone(helper), timeout=10, what="the agent's helper (same group) to end", interval=0.02)
    assert not any(len(line) > 65536 for line in session.lines("stdout"))
    assert session.events[-1][0] == "item.failed"
    assert_valid_envelopes(session.events)


def test_the_line_limit_counts_bytes_without_the_newline(tmp_path, new_session):
    session = new_session()
    command = agent(tmp_path, "print('a' * 100, flush=True); print('b' * 101, flush=True)")
    code = ProcessHarness(command, max_line_bytes=100).run(session)
    assert session.lines("stdout") == ["a" * 100]
    assert session.diagnostics("line_too_large") and code != 0


TRAPS_SIGNALS = """
    import signal, sys
    def caught(signum, frame):
        print("got " + signal.Signals(signum).name, flush=True)
        if {exits}:
            sys.exit(130)
    signal.signal(signal.SIGINT, caught)
    signal.signal(signal.SIGTERM, caught)
    print("ready", flush=True)
    while True:
        signal.pause()
"""


def test_an_interrupt_reaches_the_agent_as_sigint(tmp_path, new_session):
    session = new_session()
    harness = ProcessHarness(agent(tmp_path, TRAPS_SIGNALS.format(exits=True)))
    thread, out = in_thread(harness.run, session)
    wait_for(lambda: "ready" in session.lines("stdout"), timeout=10, what="the agent to start", interval=0.02)
    session.interrupt()
    thread.join(10)
    assert out["code"] == 130
    assert session.lines("stdout") == ["ready", "got SIGINT"]
    assert_valid_envelopes(session.events)


def test_an_agent_ignoring_sigint_and_sigterm_is_sigkilled(tmp_path, new_session):
    session = new_session()
    harness = ProcessHarness(agent(tmp_path, TRAPS_SIGNALS.format(exits=False)), sigterm_after=0.2,
                             sigkill_after=0.2)
    thread, out = in_thread(harness.run, session)
    wait_for(lambda: "ready" in session.lines("stdout"), timeout=10, what="the agent to start", interval=0.02)
    session.interrupt()
    thread.join(10)
    assert out["code"] == 128 + signal.SIGKILL
    assert session.lines("stdout") == ["ready", "got SIGINT", "got SIGTERM"]


def test_after_a_runner_restart_the_lost_agent_is_a_failed_run_not_a_second_start(tmp_path, new_session):
    session = new_session(restored_checkpoint={"process": "started"})
    marker = tmp_path / "started"
    code = ProcessHarness(agent(tmp_path, f"open({str(marker)!r}, 'w').close()")).run(session)
    assert code == 1 and not marker.exists()
    assert "harness lost on runner restart" in session.diagnostics("harness_lost")[0]["message"]
    assert_valid_envelopes(session.events)


@pytest.mark.parametrize("mode, code, disposition", [("fail", 2, None), ("report_failure", 1, "yielded"),
                                                     ("sleep", 0, "yielded")])
def test_the_example_heartbeat_agent_without_a_server(mode, code, disposition, new_session):
    """Modes that need no API: the agent's exit code comes back, its result line is mapped."""
    session = new_session(env={"EXAMPLE_AGENT_MODE": mode, "EXAMPLE_AGENT_SLEEP": "0",
                               "PAPERCLIP_API_URL": "http://127.0.0.1:9"})
    assert ProcessHarness([sys.executable, str(REPO / "examples" / "heartbeat_agent.py")]).run(session) == code
    results = [p for _, p, _, _ in session.of_type("run.result.proposed")]
    assert (results[0]["reportedWorkDisposition"] if results else None) == disposition
    if mode == "fail":
        assert session.lines("stderr") == ["simulated failure (EXAMPLE_AGENT_MODE=fail)"]
    if mode == "report_failure":
        assert results[0]["continuation"]["kind"] == "retry" and results[0]["summary"] == "Simulated failure; retry me."
    assert_valid_envelopes(session.events)
