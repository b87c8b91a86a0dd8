"""The process harness: runs an agent command (e.g. ``examples/heartbeat_agent.py``) and maps its
output to PRP events.

The command (an argv list, no shell) starts in ``session.workspace`` with ``session.env`` (the
runner's environment without ``PAPERCLIP_RUNNER_URL``: the agent gets ``PAPERCLIP_API_URL``,
``PAPERCLIP_API_KEY``, ``PAPERCLIP_RUN_ID``… as the host gave them to the runner) in a process group
of its own. When the environment names no ``PAPERCLIP_TASK_PACKET_PATH``, the turn's task packet
(``turn.start`` text) is written to a private temporary file named there, removed at the end.

Output, line by line (a line is at most ``max_line_bytes``, 64 KiB by default, without its newline):

* every stdout / stderr line → a log line of that stream (``session.log``), verbatim, result and
  usage lines included;
* a stdout line ``PAPERCLIP_RESULT {json}`` (seed 003's output contract: ``status``
  done|handoff|failed|aborted, ``summary``, ``final_state``, ``pr_url``, ``liveness``, ``reason``; a
  line must give a status or a liveness) → remembered; the last valid one is proposed once, when the
  command has exited, as ``run.result.proposed`` (mapping below). An invalid one → a
  ``runner.diagnostic`` ``result_line_invalid`` saying why;
* a stdout line ``PAPERCLIP_USAGE {json}`` → ``usage.reported``. Its members are this run's usage
  since the previous usage line, named as the usage receipt's measurement: ``inputTokens``,
  ``outputTokens``, ``cacheReadTokens``, ``cacheWriteTokens`` (integers ≥ 0, default 0),
  ``activeSeconds`` (≥ 0, default 0), ``requests`` and ``providerCostUsd`` (default unknown), with
  ``provider`` (default ``"unknown"``), ``model``, ``providerSessionId``, ``providerRequestId``. It
  becomes ``runDelta`` (``runDeltaAvailable`` true); ``cumulative`` is the sum of this run's lines
  for the same provider and model; ``costSource`` is ``provider_reported`` when a cost is given.
  An invalid one → ``runner.diagnostic`` ``usage_line_invalid``;
* a line over the limit fails the run cleanly: ``runner.diagnostic`` ``line_too_large``, the group
  is terminated (SIGTERM, SIGKILL after ``sigkill_after`` s) and the exit code is non-zero, so the
  runner's derived terminal is failed.

Items: ``item.started`` (``itemId`` ``agent-process``, ``{"kind": "command", "text": <argv>}``) before
the command starts, ``item.completed`` / ``item.failed`` (with ``exitCode``) when it has exited.
The exit code is returned (a signal N as 128 + N); the runner derives the one terminal from it,
the proposed result and the interrupt (``prp_runner.outcome``).

Interrupt (``turn.interrupt`` / ``run.cancel``): SIGINT to the group, SIGTERM ``sigterm_after`` s
later (5), SIGKILL ``sigkill_after`` s after that (5).

Resume: none. ``item.started`` stores the checkpoint ``{"process": "started"}`` before the command
starts, so a runner restarted after that finds it in ``session.restored_checkpoint``: the agent
process of the earlier runner cannot be re-attached, and the harness reports ``harness_lost``
("harness lost on runner restart") and exits 1 — a failed run — without starting the command again.

The result and usage lines are parsed by :mod:`.output_lines` (the mapping to
``paperclip.run_result.v1`` is documented there).
"""
from __future__ import annotations

import logging
import os
import queue
import shlex
import signal
import subprocess
import tempfile
import threading
import time

from .capabilities import capability_doc
from .output_lines import RESULT_PREFIX, LineError, UsageTotals, parse_result_line, parse_usage_line, run_result

log = logging.getLogger("prp_runner")

ITEM_ID = "agent-process"
STARTED = {"process": "started"}
DEFAULT_MAX_LINE_BYTES = 64 * 1024
EXIT_LOST, EXIT_LINE_TOO_LARGE, EXIT_INTERRUPTED = 1, 1, 130
EXIT_NOT_FOUND, EXIT_NOT_RUNNABLE = 127, 126  # the shell's codes for a command that cannot start
TICK = 0.05  # how often the supervisor looks at the interrupt flag and the process
OUTPUT_GRACE = 2.0  # quiet seconds after the exit before pipes a descendant keeps open are abandoned
MAX_LINE_DIAGNOSTICS = 10  # per code: diagnostics are never dropped, so agent output must not flood them
QUEUE_LINES = 1000  # bounded: a fast writer waits on its pipe instead of filling memory


class ProcessHarness:
    name = "process"

    def __init__(self, command: list[str], *, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
                 sigterm_after: float = 5.0, sigkill_after: float = 5.0):
        if not command or not all(isinstance(arg, str) for arg in command):
            raise ValueError("the process harness needs a command (an argv list): --harness process -- COMMAND …")
        if max_line_bytes < 1:
            raise ValueError("max_line_bytes must be positive")
        self.command = list(command)
        self.max_line_bytes = max_line_bytes
        self.sigterm_after, self.sigkill_after = sigterm_after, sigkill_after

    @classmethod
    def from_options(cls, options: dict) -> "ProcessHarness":
        extra = {k: options[k] for k in ("max_line_bytes", "sigterm_after", "sigkill_after") if k in options}
        return cls(options.get("command") or [], **extra)

    def capabilities(self, version: int) -> dict:
        return capability_doc(version, driver="process", steer=False, interrupt=True, resume=False,
                              runtimeRequests=False, structuredResult=True, typedEvents=True)

    def goal_command(self, command: dict) -> dict | None:
        return None  # advertised as unsupported

    def run(self, session) -> int:
        if session.restored_checkpoint is not None:
            message = "harness lost on runner restart: the agent process of the previous runner cannot be re-attached"
            session.diagnostic("harness_lost", message, checkpoint=session.restored_checkpoint)
            session.emit("item.failed", {"kind": "command", "message": message}, item_id=ITEM_ID)
            return EXIT_LOST
        if session.interrupt_requested.is_set():
            return EXIT_INTERRUPTED  # stopped before the command started
        env, packet_path = dict(session.env), None
        if session.task_packet and "PAPERCLIP_TASK_PACKET_PATH" not in env:
            packet_path = _write_packet(session.task_packet)
            env["PAPERCLIP_TASK_PACKET_PATH"] = packet_path
        try:
            return _Supervisor(self, session).run(env)
        finally:
            if packet_path:
                os.unlink(packet_path)


def _write_packet(text: str) -> str:
    fd, path = tempfile.mkstemp(prefix="paperclip-task-packet-", suffix=".md")  # mode 0600
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    return path


class _Supervisor:
    """One run of the command: readers feed a bounded queue, this thread emits and signals."""

    def __init__(self, harness: ProcessHarness, session):
        self.harness, self.session = harness, session
        self.lines: queue.Queue = queue.Queue(QUEUE_LINES)
        self.closed = threading.Event()  # the supervisor stopped reading: readers drop what is left
        self.result: dict | None = None
        self.usage = UsageTotals()
        self.too_large = False
        self.diagnostics: dict[str, int] = {}
        self.stopping = False
        self.escalation: list[tuple[int, float]] = []  # (signal, seconds to wait before it), still to send
        self.next_signal_at = 0.0

    def run(self, env: dict) -> int:
        session, command = self.session, self.harness.command
        session.emit("item.started", {"kind": "command", "text": shlex.join(command)}, item_id=ITEM_ID,
                     checkpoint=STARTED)
        try:
            popen = subprocess.Popen(command, cwd=session.workspace, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            code = EXIT_NOT_FOUND if isinstance(exc, FileNotFoundError) else EXIT_NOT_RUNNABLE
            message = f"could not start {command[0]}: {exc.strerror or exc}"
            session.diagnostic("command_not_started", message)
            session.emit("item.failed", {"kind": "command", "message": message, "exitCode": code}, item_id=ITEM_ID)
            return code
        session.register_process(popen)
        for stream, pipe in (("stdout", popen.stdout), ("stderr", popen.stderr)):
            threading.Thread(target=self._read, args=(stream, pipe), daemon=True, name=f"prp-{stream}").start()
        try:
            code = self._supervise(popen)
        finally:
            self.closed.set()
        if code < 0:
            code = 128 - code  # killed by signal -code
        if self.too_large and code == 0:
            code = EXIT_LINE_TOO_LARGE  # a child that traps SIGTERM and exits 0 still failed its output contract
        if code == 0:
            session.emit("item.completed", {"kind": "command", "text": "exited with code 0", "exitCode": 0},
                         item_id=ITEM_ID)
        else:
            session.emit("item.failed", {"kind": "command", "message": f"exited with code {code}",
                                         "exitCode": code}, item_id=ITEM_ID)
        if self.result is not None:
            session.propose_result(run_result(self.result, run_id=session.run_id, turn_id=session.turn_id))
        return code

    def _supervise(self, popen) -> int:
        open_streams, exited, last_seen = 2, False, time.monotonic()
        while True:
            try:
                stream, data = self.lines.get(timeout=TICK)
                last_seen = time.monotonic()
                if data is None:
                    open_streams -= 1
                else:
                    self._line(stream, data, popen.pid)
            except queue.Empty:
                pass
            exited = exited or _exited(popen.pid)
            if not exited and not self.stopping and self.session.interrupt_requested.is_set():
                self._stop(popen.pid, signal.SIGINT)
            self._signal_due(popen.pid)  # also after the leader's exit: the rest of its group
            if exited and (open_streams == 0 or time.monotonic() - last_seen > OUTPUT_GRACE):
                return popen.wait()  # reaped only now: until here its pid keeps the group id from reuse

    def _stop(self, pgid: int, first: int):
        """Start the escalation at ``first`` (SIGINT for an interrupt, SIGTERM for a broken contract)."""
        h = self.harness
        steps = [(signal.SIGINT, 0.0), (signal.SIGTERM, h.sigterm_after), (signal.SIGKILL, h.sigkill_after)]
        start = [signum for signum, _ in steps].index(first)
        self.escalation = [(first, 0.0)] + steps[start + 1:]
        self.stopping, self.next_signal_at = True, time.monotonic()
        self._signal_due(pgid)

    def _signal_due(self, pgid: int):
        if self.escalation and time.monotonic() >= self.next_signal_at:
            signum, _ = self.escalation.pop(0)
            log.info("process group %d: %s", pgid, signal.Signals(signum).name)
            try:
                os.killpg(pgid, signum)
            except (ProcessLookupError, PermissionError):
                pass
            if self.escalation:
                self.next_signal_at = time.monotonic() + self.escalation[0][1]

    def _line(self, stream: str, data, pgid: int):
        session = self.session
        if data is _TOO_LARGE:
            limit = self.harness.max_line_bytes
            session.diagnostic("line_too_large", f"The agent wrote a {stream} line over {limit} bytes; the run "
                               "fails and the agent's process group is terminated.", stream=stream,
                               maxLineBytes=limit)
            if not self.too_large:
                self.too_large = True
                self._stop(pgid, signal.SIGTERM)
            return
        text = data.decode("utf-8", "replace").rstrip("\r\n")
        session.log(stream, text)
        if stream != "stdout":
            return
        try:
            report = parse_result_line(text)
            if report is not None:
                self.result = report  # the last valid line wins
                return
            usage = parse_usage_line(text)
            if usage is not None:
                session.emit("usage.reported", self.usage.report(usage))
        except LineError as exc:
            code = "result_line_invalid" if text.startswith(RESULT_PREFIX) else "usage_line_invalid"
            self._limited_diagnostic(code, f"{text.split(None, 1)[0]} ignored: {exc}")

    def _limited_diagnostic(self, code: str, message: str):
        seen = self.diagnostics[code] = self.diagnostics.get(code, 0) + 1
        if seen <= MAX_LINE_DIAGNOSTICS:
            self.session.diagnostic(code, message)

    def _read(self, stream: str, pipe):
        limit = self.harness.max_line_bytes
        try:
            while True:
                chunk = pipe.readline(limit + 1)
                if not chunk:
                    break
                if len(chunk) > limit and not chunk.endswith(b"\n"):
                    self._put(stream, _TOO_LARGE)
                    break  # the rest of this stream is the stopped agent's: unread
                self._put(stream, chunk)
        except (OSError, ValueError):
            pass
        finally:
            self._put(stream, None)

    def _put(self, stream: str, data):
        while not self.closed.is_set():
            try:
                self.lines.put((stream, data), timeout=1)
                return
            except queue.Full:
                continue


_TOO_LARGE = object()  # in the queue instead of a line over the limit (None: end of file)


def _exited(pid: int) -> bool:
    """Has the leader exited? It stays a zombie (not reaped), so its pid — the group id — is not reused."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True
