"""The runner loop: one run, from hello to the drained terminal, and the API a harness gets.

Threads: the *sender* (:mod:`.delivery`) drains the outbox to the host; the *command lane*
long-polls commands, applies each once (:mod:`.commands`) and reports results; the *harness* runs
the turn; the main thread waits for the end, drains, cleans up and answers the exit code:

* 0 — the terminal and every event and command result were acknowledged (the outbox is deleted
  unless ``keep_outbox``);
* 3 — fatal: hello refused, an event batch or the command lane refused (``event_conflict``, any
  4xx but ``run_not_live`` after the runner's own terminal), the host ended the run before the
  runner's terminal, or the outbox unusable (another run's, in use);
* 4 — the drain timed out (the outbox is kept: a restart resumes delivery);
* 128 + signal — stopped by SIGINT/SIGTERM: like a crash, but with the harness's process groups
  killed; nothing more is stored, the outbox is kept and a restart resumes.

A restart with the same outbox says hello again, takes the host's cursor for its source as the
ACK, re-creates the applied commands' state (a turn in progress, an interrupt, a cancel,
resolutions) and restarts the harness with its last checkpoint unless the terminal was produced.
"""
from __future__ import annotations

import logging
import os
import signal
import sqlite3
import threading
import time
from dataclasses import dataclass

from .commands import CommandApplier, TurnControl
from .delivery import CommandLane, Sender
from .emitter import EventSink
from .envelope import BATCH_WRAPPER_BYTES, LOG_EVENT, PROTOCOL_MAX, PROTOCOL_MIN, log_event
from .outbox import Outbox, OutboxError
from .outcome import derive_terminal
from .processes import ProcessGroups
from .redact import Redactor
from .transport import Backoff, HostClient, HostRefused, Transient

log = logging.getLogger("prp_runner")
EXIT_OK, EXIT_FATAL, EXIT_DRAIN_TIMEOUT = 0, 3, 4
DEFAULT_LIMITS = {"maxBatchEvents": 100, "maxBatchBytes": 1 << 20}
RUNNER_ONLY_ENV = ("PAPERCLIP_RUNNER_URL", "PAPERCLIP_AGENT_KEY")
WORKER_JOIN_SECONDS = 2.0


@dataclass
class RunnerConfig:
    url: str
    key: str
    run_id: str
    outbox_path: str
    keep_outbox: bool = False
    cwd: str | None = None
    drain_timeout: float = 600.0
    max_pending_events: int = 10000
    max_pending_bytes: int = 64 << 20
    poll_wait: float = 20.0


class HarnessSession:
    """What a harness gets for its turn. Every event method commits to the outbox before it
    returns; ``checkpoint`` (any JSON object) is stored with that event, and a restarted runner
    hands the last one back as ``restored_checkpoint`` (``resumed`` is then True). ``emit``
    returns False when the event was dropped under pressure (P1/P2) or refused (too large, not
    storable: a diagnostic says so)."""

    def __init__(self, runner: "Runner", *, turn_id: str, task_packet: str, restored_checkpoint: dict | None,
                 resumed: bool):
        self._runner, self._events = runner, runner.events
        self.run_id, self.protocol_version = runner.config.run_id, runner.protocol_version
        self.turn_id, self.task_packet = turn_id, task_packet
        self.workspace = runner.workspace
        # The runner's own credentials stay with it: the agent gets the run key, not the runner URL or
        # (attach mode) the agent's long-lived key.
        self.env = {k: v for k, v in os.environ.items() if k not in RUNNER_ONLY_ENV}
        self.restored_checkpoint = restored_checkpoint
        self.resumed = resumed  # the turn had started before a runner restart
        self.interrupt_requested, self.cancel_requested = runner.interrupt_requested, runner.cancel_requested

    def emit(self, event_type: str, payload: dict, *, item_id: str | None = None,
             checkpoint: dict | None = None) -> bool:
        if event_type == "run.terminal":
            return self.terminal(payload, checkpoint=checkpoint)
        return self._events.emit(event_type, payload, item_id=item_id, checkpoint=checkpoint, turn_id=self.turn_id)

    def log(self, stream: str, text: str, *, checkpoint: dict | None = None) -> None:
        """One line of ``stream`` (stdout/stderr): an ``item.delta`` of item ``log-<stream>``."""
        item_id, payload = log_event(stream, self._runner.redact(text))
        self._events.emit(LOG_EVENT, payload, item_id=item_id, checkpoint=checkpoint, turn_id=self.turn_id)

    def request(self, request: dict, *, checkpoint=None) -> None:
        """Ask the host (``runtime_request.created``; ``request`` is a runtime request document)."""
        self._events.emit("runtime_request.created", {"request": request}, checkpoint=checkpoint,
                          turn_id=self.turn_id)

    def wait_resolution(self, request_id: str, timeout: float | None = None) -> dict | None:
        """The ``response`` of the host's request.resolve; None on interrupt, cancel or timeout."""
        return self._runner.control.wait_resolution(request_id, timeout)

    def wait_interrupt(self, timeout: float | None = None) -> bool:
        return self.interrupt_requested.wait(timeout)

    def propose_result(self, result: dict, *, checkpoint=None) -> None:
        self._events.emit("run.result.proposed", result, checkpoint=checkpoint, turn_id=self.turn_id)

    def terminal(self, terminal: dict, *, checkpoint=None) -> bool:
        """The run's terminal; False (logged as ``duplicate_terminal``, not sent) when it has one."""
        return self._events.terminal(terminal, checkpoint=checkpoint, turn_id=self.turn_id)

    def diagnostic(self, code: str, message: str, **details) -> None:
        self._events.diagnostic(code, message, **details)

    def register_process(self, popen) -> None:
        """A child started with ``start_new_session=True``: its group is ended when the runner ends."""
        self._runner.processes.register(popen)


class Runner:
    def __init__(self, config: RunnerConfig, harness):
        self.config, self.harness = config, harness
        self.workspace = config.cwd or os.getcwd()
        self.redact = Redactor.for_run(config.key, os.environ)
        self._workers: list[threading.Thread] = []
        self.control = TurnControl()
        self.interrupt_requested, self.cancel_requested = (self.control.interrupt_requested,
                                                           self.control.cancel_requested)
        self.stopping, self.done = threading.Event(), threading.Event()
        self.appended, self.changed = threading.Event(), threading.Event()  # something to send; progress
        self.fatal: str | None = None
        self.signalled: int | None = None
        self.protocol_version = None
        self.limits = dict(DEFAULT_LIMITS)
        self.turn_id: str | None = None
        self._task_packet = ""
        self._harness_thread: threading.Thread | None = None
        self.processes = ProcessGroups()
        self.sender_closed = False  # the host took the terminal and refuses anything after it
        self.outbox: Outbox | None = None
        self.events: EventSink | None = None

    # --- main ---------------------------------------------------------------------------------------
    def run(self) -> int:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, self._on_signal)
        try:
            self.outbox = Outbox(self.config.outbox_path, self.config.run_id,
                                 max_pending_events=self.config.max_pending_events,
                                 max_pending_bytes=self.config.max_pending_bytes)
        except (OutboxError, OSError, sqlite3.Error) as exc:  # another run's or in use; no such folder; not SQLite
            log.error("outbox %s unusable: %s", self.config.outbox_path, exc)
            return EXIT_FATAL
        self.events = EventSink(self.outbox, self.appended)
        code = EXIT_FATAL
        try:
            code = self._run()
            return code
        finally:
            self.stopping.set()
            self.processes.kill_all()
            for worker in self._workers:  # they see stopping; a long-poll in flight is left to its end
                worker.join(timeout=WORKER_JOIN_SECONDS)
            if code == EXIT_OK and not self.config.keep_outbox:
                self.outbox.delete()
            else:
                self.outbox.close()
                log.info("outbox kept: %s", self.outbox.path)
            log.info("exit %d", code)

    def _run(self) -> int:
        box = self.outbox
        log.info("outbox %s: source %s, %d events produced, %d acknowledged (%s)", box.path, box.source_instance_id,
                 box.produced_seq, box.acked_seq, box.pragmas())
        if not self._hello():
            return self._stopped_code()
        applier = CommandApplier(box, self)
        restored = applier.restore()
        log.info("resume: %d events to send, %d commands applied (last controllerSeq %d)%s",
                 box.produced_seq - box.acked_seq, restored, box.applied_controller_seq,
                 ", turn " + self.turn_id if self.turn_id else "")
        self._workers = [Sender(self), CommandLane(self, applier)]
        for worker in self._workers:
            worker.start()
        self.after_command(resumed=True)
        while not self.done.wait(0.5):
            pass
        if self.fatal or self.signalled:
            self._abort()
            return self._stopped_code()
        return self._drain()

    def _hello(self) -> bool:
        body = {"protocolMin": PROTOCOL_MIN, "protocolMax": PROTOCOL_MAX,
                "runnerInstanceId": self.outbox.source_instance_id,
                "capabilities": self.harness.capabilities(PROTOCOL_MAX)}
        client, backoff = HostClient(self.config.url, self.config.key), Backoff()
        try:
            while not self.done.is_set():
                try:
                    answer = client.hello(body)
                    break
                except Transient as exc:
                    if backoff.current == backoff.first:  # said once, not on every retry
                        log.warning("hello: host not reachable (%s); retrying until it answers", exc)
                    backoff.wait(self.done)
                except HostRefused as exc:
                    if exc.code == "run_not_live" and self.outbox.terminal_seq is not None:
                        return self._ended_on_host()
                    self.fail(f"hello refused: {exc} {exc.details}")
            else:
                return False
        finally:
            client.close()
        chosen = answer.get("protocolVersion")
        if not isinstance(chosen, int) or not PROTOCOL_MIN <= chosen <= PROTOCOL_MAX:
            self.fail(f"hello: the host chose PRP version {chosen!r}, outside the {PROTOCOL_MIN}..{PROTOCOL_MAX} "
                      "this runner offered")
            return False
        self.protocol_version = self.outbox.protocol_version = chosen
        self.limits.update({k: v for k, v in (answer.get("limits") or {}).items() if k in DEFAULT_LIMITS})
        self.outbox.max_envelope_bytes = self.limits["maxBatchBytes"] - BATCH_WRAPPER_BYTES
        cursor = (answer.get("sources") or {}).get(f"runner:{self.outbox.source_instance_id}", 0)
        log.info("hello: PRP v%d, limits %s, host cursor %d, controllerSeq %s", self.protocol_version, self.limits,
                 cursor, answer.get("controllerSeq"))
        if not self.outbox.ack(cursor):
            self.fail(f"the host's cursor {cursor} does not fit this outbox (acknowledged "
                      f"{self.outbox.acked_seq}, produced {self.outbox.produced_seq})")
            return False
        return True

    def _ended_on_host(self) -> bool:
        """A restart after the terminal was sent, the run since ended (its ACK was lost): the host
        takes only exact redeliveries now (within its grace), so offer what leads up to the
        terminal and store nothing new."""
        log.info("hello: the run has ended; redelivering up to the terminal (seq %d)", self.outbox.terminal_seq)
        self.sender_closed = True
        self.events.close()
        return True

    def _drain(self) -> int:
        deadline = time.monotonic() + self.config.drain_timeout
        log.info("harness done; draining %d events", self.outbox.produced_seq - self.outbox.acked_seq)
        while not self._delivered():
            if self.fatal or self.signalled:
                return self._stopped_code()
            if time.monotonic() >= deadline:
                log.error("drain timed out after %ss: %d events not acknowledged", self.config.drain_timeout,
                          self.outbox.produced_seq - self.outbox.acked_seq)
                return EXIT_DRAIN_TIMEOUT
            self.changed.wait(0.5)
            self.changed.clear()
        refused = self.outbox.produced_seq - self.outbox.acked_seq
        if refused:
            log.warning("%d events after the terminal were not taken: the run has ended", refused)
        return EXIT_OK

    def _delivered(self) -> bool:
        box = self.outbox
        events = box.acked_seq >= (box.terminal_seq if self.sender_closed else box.produced_seq)
        return events and not box.unreported_results()

    def _stopped_code(self) -> int:
        return 128 + self.signalled if self.signalled else EXIT_FATAL

    def _abort(self):
        """Stop without a word more: nothing the harness does from now on is stored (a harness told
        to stop would report a stop the host never asked for), so a restart resumes where this ended."""
        self.stopping.set()
        self.events.close()

    def fail(self, reason: str):
        if self.fatal is None:
            log.error("fatal: %s", reason)
            self.fatal = reason
        self.done.set()

    def _on_signal(self, signum, frame):
        log.warning("signal %d: stopping (the outbox is kept)", signum)
        self.signalled = signum
        self.done.set()

    # --- what the commands do (commands.CommandApplier's control) --------------------------------------
    def emit(self, event_type: str, payload: dict, *, turn_id: str | None = None) -> bool:
        return self.events.emit(event_type, payload, turn_id=turn_id)

    def set_turn(self, turn_id: str, task_packet: str):
        self.turn_id, self._task_packet = turn_id, task_packet

    def goal_command(self, command: dict) -> dict | None:
        goals = (self.harness.capabilities(self.protocol_version) or {}).get("sessionGoals") or {}
        handler = getattr(self.harness, "goal_command", None)
        if goals.get("availability") != "available" or handler is None:
            return None
        return handler(command)

    def after_command(self, *, resumed: bool = False):
        """Start the harness once a turn is known, or end a run cancelled before its turn."""
        with self.events.end_lock:
            if self._harness_thread is not None or self.done.is_set():
                return
            if self.outbox.terminal_seq is not None:
                self.done.set()  # the terminal was produced before a restart
            elif self.cancel_requested.is_set():
                self._finish(None)
            elif self.turn_id is not None:
                session = HarnessSession(self, turn_id=self.turn_id, task_packet=self._task_packet, resumed=resumed,
                                         restored_checkpoint=self.outbox.checkpoint if resumed else None)
                self._harness_thread = threading.Thread(target=self._harness_main, args=(session,), daemon=True,
                                                        name="prp-harness")
                log.info("harness %s: %s turn %s", getattr(self.harness, "name", "?"),
                         "resuming" if resumed else "starting", self.turn_id)
                self._harness_thread.start()

    def _harness_main(self, session: HarnessSession):
        try:
            code = self.harness.run(session)
        except Exception as exc:  # a broken harness is a failed run, reported, not a hung runner
            log.exception("harness failed")
            self.events.diagnostic("harness_error", f"The harness raised {exc.__class__.__name__}: {exc}"[:2000])
            code = None
        log.info("harness exited with code %s", code)
        if not self.stopping.is_set():
            self._finish(code)

    def _finish(self, exit_code: int | None):
        with self.events.end_lock:
            if self.outbox.terminal_seq is None:
                self.events.terminal(derive_terminal(exit_code=exit_code, result=self.outbox.result,
                                                     interrupted=self.interrupt_requested.is_set(),
                                                     cancelled=self.cancel_requested.is_set()), turn_id=self.turn_id)
            self.done.set()
