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

``PAPERCLIP_RESULT`` → ``paperclip.run_result.v1`` (``reportedWorkDisposition``,
``completionClaim.objectiveSatisfied``, ``continuation.kind``):

* status done → done, true, none;
* status handoff → needs_review, false, none;
* status failed → yielded, false, retry;
* status aborted → yielded, false, same_agent;
* no status (liveness only) → yielded, false, same_agent.

``summary`` is the line's summary, else its reason, else "The agent reported <status|liveness>."
(cut to 4000 characters as seed 003 does); ``completionClaim`` has ``contractRevision``
``paperclip-result-line-v1``, no criteria, and — unless done — one ``remainingWork`` entry (the
reason or summary, ``blocksCompletion`` true); ``pr_url`` becomes an artifact ``{"kind":
"pull_request", "ref": <url>}``; ``evidence``, ``verification`` and ``attentionRequests`` are empty;
a continuation's ``idempotencyKey`` is ``<run id>:<turn id>:<kind>``. The line itself is kept as
``resultLine`` (its members as given) — liveness, reason and final_state travel there; the host
decides the issue's status from the disposition, not from ``final_state``.
"""
from __future__ import annotations

import json
import logging
import math
import os
import queue
import shlex
import signal
import subprocess
import tempfile
import threading
import time

from .capabilities import capability_doc

log = logging.getLogger("prp_runner")

RESULT_PREFIX, USAGE_PREFIX = "PAPERCLIP_RESULT", "PAPERCLIP_USAGE"
RESULT_SCHEMA = "paperclip.run_result.v1"
CONTRACT_REVISION = "paperclip-result-line-v1"
ITEM_ID = "agent-process"
STARTED = {"process": "started"}
DEFAULT_MAX_LINE_BYTES = 64 * 1024
EXIT_LOST, EXIT_LINE_TOO_LARGE, EXIT_INTERRUPTED = 1, 1, 130
EXIT_NOT_FOUND, EXIT_NOT_RUNNABLE = 127, 126  # the shell's codes for a command that cannot start
TICK = 0.05  # how often the supervisor looks at the interrupt flag and the process
OUTPUT_GRACE = 2.0  # quiet seconds after the exit before pipes a descendant keeps open are abandoned
MAX_LINE_DIAGNOSTICS = 10  # per code: diagnostics are never dropped, so agent output must not flood them
QUEUE_LINES = 1000  # bounded: a fast writer waits on its pipe instead of filling memory

# seed 003 (issues.adapters.result_line, issues.choices): the values and bounds of the output contract.
STATUSES = ("done", "handoff", "failed", "aborted")
LIVENESS = ("completed", "advanced", "plan_only", "empty_response", "blocked", "failed", "needs_followup")
FINAL_STATE_MAX, PR_URL_MAX, REASON_MAX, SUMMARY_MAX = 100, 1000, 300, 4000
DISPOSITIONS = {"done": "done", "handoff": "needs_review", "failed": "yielded", "aborted": "yielded"}
CONTINUATIONS = {"failed": "retry", "aborted": "same_agent", "": "same_agent"}
COUNTERS = ("inputTokens", "outputTokens", "cacheReadTokens", "cacheWriteTokens")
OPTIONAL_NUMBERS = ("requests", "providerCostUsd")  # null when the agent does not say
USAGE_TEXT = {"provider": 80, "model": 240, "providerSessionId": 240, "providerRequestId": 240}


class LineError(ValueError):
    """A result or usage line that cannot be used; the message says why."""


# --- PAPERCLIP_RESULT ----------------------------------------------------------------------------------
def parse_result_line(text: str) -> dict | None:
    """``PAPERCLIP_RESULT {...}`` → the contract's values (status, liveness, reason, summary,
    final_state, pr_url; empty strings when absent); None for any other line."""
    if not text.startswith(RESULT_PREFIX):
        return None
    payload = _json_object(text[len(RESULT_PREFIX):], RESULT_PREFIX)
    values = {}
    for key in ("status", "liveness", "summary", "final_state", "pr_url"):
        value = payload.get(key)
        if value is not None and not isinstance(value, str):
            raise LineError(f"{key} must be a string")
        values[key] = (value or "").strip()
    reason = payload.get("reason")
    values["reason"] = ("" if reason is None else str(reason))[:REASON_MAX]  # free text, as seed 003 keeps it
    if not (values["status"] or values["liveness"]):
        raise LineError("neither status nor liveness given")
    if values["status"] and values["status"] not in STATUSES:
        raise LineError(f"status {values['status'][:40]!r} is not one of {', '.join(STATUSES)}")
    if values["liveness"] and values["liveness"] not in LIVENESS:
        raise LineError(f"liveness {values['liveness'][:40]!r} is not one of {', '.join(LIVENESS)}")
    if len(values["final_state"]) > FINAL_STATE_MAX:
        raise LineError(f"final_state is longer than {FINAL_STATE_MAX} characters")
    url = values["pr_url"]
    if url and (len(url) > PR_URL_MAX or not url.startswith(("http://", "https://")) or any(c.isspace() for c in url)):
        raise LineError(f"pr_url must be an http(s) URL of at most {PR_URL_MAX} characters")
    values["summary"] = values["summary"][:SUMMARY_MAX]
    return values


def run_result(report: dict, *, run_id: str, turn_id: str) -> dict:
    """The ``paperclip.run_result.v1`` payload of a parsed result line (see the module doc)."""
    status = report["status"]
    said = status or f"liveness {report['liveness']}"
    summary = report["summary"] or report["reason"] or f"The agent reported {said}."
    remaining = [] if status == "done" else [
        {"description": report["reason"] or report["summary"] or f"The agent reported {said}.",
         "blocksCompletion": True}]
    result = {
        "schema": RESULT_SCHEMA,
        "reportedWorkDisposition": DISPOSITIONS.get(status, "yielded"),
        "summary": summary,
        "completionClaim": {"contractRevision": CONTRACT_REVISION, "objectiveSatisfied": status == "done",
                            "criteria": [], "remainingWork": remaining},
        "evidence": [],
        "verification": [],
        "attentionRequests": [],
        "artifacts": [{"kind": "pull_request", "ref": report["pr_url"], "title": "Pull request"}]
        if report["pr_url"] else [],
        "resultLine": {key: value for key, value in report.items() if value},
    }
    if result["reportedWorkDisposition"] == "yielded":
        kind = CONTINUATIONS[status]
        result["continuation"] = {"kind": kind, "summary": summary, "idempotencyKey": f"{run_id}:{turn_id}:{kind}"}
    return result


# --- PAPERCLIP_USAGE -----------------------------------------------------------------------------------
def parse_usage_line(text: str) -> dict | None:
    """``PAPERCLIP_USAGE {...}`` → the increment's values; None for any other line."""
    if not text.startswith(USAGE_PREFIX):
        return None
    payload = _json_object(text[len(USAGE_PREFIX):], USAGE_PREFIX)
    usage = {}
    for key, limit in USAGE_TEXT.items():
        value = payload.get(key)
        if value is not None and (not isinstance(value, str) or not 0 < len(value) <= limit):
            raise LineError(f"{key} must be a string of 1 to {limit} characters")
        usage[key] = value
    usage["provider"] = usage["provider"] or "unknown"
    for key in COUNTERS + ("activeSeconds",) + OPTIONAL_NUMBERS:
        value = payload.get(key)
        if value is None:
            usage[key] = None if key in OPTIONAL_NUMBERS else 0
            continue
        integral = key in COUNTERS or key == "requests"
        if isinstance(value, bool) or not isinstance(value, int if integral else (int, float)) \
                or not math.isfinite(value) or value < 0:  # json.loads takes NaN and Infinity
            raise LineError(f"{key} must be a{'n integer' if integral else ' number'} ≥ 0")
        usage[key] = value
    return usage


class UsageTotals:
    """This run's usage by provider and model: the ``cumulative`` of each report."""

    def __init__(self):
        self._totals: dict[tuple, dict] = {}

    def report(self, usage: dict) -> dict:
        """The ``usage.reported`` payload (usage.schema.json) of one increment."""
        delta = {key: usage[key] for key in COUNTERS + ("activeSeconds",) + OPTIONAL_NUMBERS}
        key = (usage["provider"], usage["model"])
        total = self._totals.get(key)
        total = dict(delta) if total is None else {k: _add(total[k], v) for k, v in delta.items()}
        self._totals[key] = total
        payload = {"provider": usage["provider"], "model": usage["model"], "cumulative": dict(total),
                   "runDelta": delta, "runDeltaAvailable": True,
                   "costSource": "provider_reported" if usage["providerCostUsd"] is not None else "unknown"}
        payload.update({k: usage[k] for k in ("providerSessionId", "providerRequestId") if usage[k] is not None})
        return payload


def _add(a, b):
    return None if a is None and b is None else (a or 0) + (b or 0)


def _json_object(body: str, prefix: str) -> dict:
    try:
        payload = json.loads(body.strip())
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise LineError(f"not valid JSON ({getattr(exc, 'msg', exc)})") from None
    if not isinstance(payload, dict):
        raise LineError(f"expected a JSON object after {prefix}")
    return payload


# --- the harness ---------------------------------------------------------------------------------------
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
