"""Host commands, each applied once.

A command's result is stored in the outbox in the same transaction as its effects (the events it
emits, the applied ``controllerSeq``), then reported to the host until the host has it. A command
offered again (a poll that asked from an earlier ``afterSeq``) with the same canonical bytes gets
its stored result again, without a second effect; the same ``commandId`` with different bytes is
rejected (``command_conflict``) and nothing is stored for it.

After a restart :meth:`CommandApplier.restore` replays the stored commands' state — the turn, an
interrupt or a cancel, the resolutions of runtime requests — without emitting anything again.

What each command does (through the runner, :mod:`.session`, and its :class:`TurnControl`):

* ``run.prepare`` — succeeded, ``{"observeCredentials": false, "workspace": …}``: this runner
  observes no credentials, and says which directory its harness works in;
* ``session.open`` — emits ``session.started``;
* ``turn.start`` — emits ``turn.started`` (``turnId`` = ``payload.turnId`` or ``turn-<controllerSeq>``)
  and hands the task packet (``payload.text``) to the harness; a second turn is rejected;
* ``turn.interrupt`` — the interrupt flag; ``run.cancel`` — cancel and interrupt;
* ``request.resolve`` — emits ``runtime_request.resolved`` and wakes the harness waiting on that
  ``requestId``; a request the runner never asked is rejected (``unknown_request``), a second
  answer too (``already_resolved``);
* ``session.goal.*`` (v2) — the harness's answer when it supports goals, else ``unsupported``;
* anything else — rejected, ``unsupported``.
"""
from __future__ import annotations

import logging
import threading
import time

from .canonical import digest
from .envelope import COMMAND_SCHEMAS, PROTOCOL_MAX

log = logging.getLogger("prp_runner")


def succeeded(result: dict | None = None) -> dict:
    return {"status": "succeeded", "result": result or {}}


def rejected(code: str, message: str) -> dict:
    return {"status": "rejected", "error": {"code": code, "message": message}}


class TurnControl:
    """What the host's stops and answers change, as the harness sees it: the interrupt and cancel
    flags (a cancel also interrupts) and the resolutions of runtime requests."""

    def __init__(self):
        self.interrupt_requested, self.cancel_requested = threading.Event(), threading.Event()
        self._resolutions: dict[str, dict] = {}
        self._wakeup = threading.Condition()

    def stop(self, *, cancel: bool):
        if cancel:
            self.cancel_requested.set()
        self.interrupt_requested.set()
        with self._wakeup:
            self._wakeup.notify_all()

    def resolve(self, request_id: str, response: dict):
        with self._wakeup:
            self._resolutions[request_id] = response
            self._wakeup.notify_all()

    def resolution(self, request_id: str) -> dict | None:
        with self._wakeup:
            return self._resolutions.get(request_id)

    def wait_resolution(self, request_id: str, timeout: float | None) -> dict | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._wakeup:
            while request_id not in self._resolutions:
                remaining = None if deadline is None else deadline - time.monotonic()
                if self.interrupt_requested.is_set() or (remaining is not None and remaining <= 0):
                    return None
                self._wakeup.wait(remaining)
            return self._resolutions[request_id]


class CommandApplier:
    def __init__(self, outbox, runner):
        self.outbox, self.runner, self.control = outbox, runner, runner.control
        self._handlers = {"run.prepare": self._prepare, "session.open": self._session_open,
                          "turn.start": self._turn_start, "turn.interrupt": self._interrupt,
                          "run.cancel": self._cancel, "request.resolve": self._resolve,
                          "session.goal.get": self._goal, "session.goal.set": self._goal,
                          "session.goal.clear": self._goal}

    def apply(self, command: dict) -> tuple[dict, bool]:
        """(the result body, whether it is stored). A stored result is marked to be reported again."""
        command_id = command["commandId"]
        stored = self.outbox.command_result(command_id)
        if stored is not None:
            if stored["digest"] == digest(command):
                log.info("command %s (#%s %s) offered again: its stored result is reported, it is not re-applied",
                         command_id, command.get("controllerSeq"), command.get("type"))
                self.outbox.mark_reported(command_id, False)
                return stored["result"], True
            log.warning("command %s offered again with different content: rejected", command_id)
            return rejected("command_conflict", "This commandId was applied with different content."), False
        handler = self._handlers.get(command.get("type"), self._unsupported)
        if not self._schema_supported(command.get("schema")):  # SOURCES.md: an unsupported schema fails closed
            handler = self._unsupported_schema
        with self.outbox.atomic():
            result = handler(command, restoring=False)
            self.outbox.record_command(command, result)
        log.info("command #%s %s: %s", command.get("controllerSeq"), command.get("type"), result["status"])
        return result, True

    def restore(self) -> int:
        """Re-create the state of every stored command (no events); returns how many."""
        commands = self.outbox.applied_commands()
        for command in commands:
            if self.outbox.command_result(command["commandId"])["result"]["status"] == "succeeded":
                self._handlers.get(command["type"], self._unsupported)(command, restoring=True)
        return len(commands)

    # --- handlers: (command, restoring) -> result body -------------------------------------------
    def _prepare(self, command, restoring):
        return succeeded({"observeCredentials": False, "workspace": self.runner.workspace})

    def _session_open(self, command, restoring):
        if not restoring:
            self.runner.emit("session.started", {"reuse": _payload(command).get("reuse", "new_per_run")})
        return succeeded()

    def _turn_start(self, command, restoring):
        payload = _payload(command)
        turn_id = payload.get("turnId") or f"turn-{command['controllerSeq']}"
        if not restoring:
            if self.runner.turn_id is not None:
                return rejected("turn_active", f"Turn {self.runner.turn_id} was started already.")
            if self.control.cancel_requested.is_set():
                return rejected("run_cancelled", "The run was cancelled before its turn started.")
            self.runner.emit("turn.started", {}, turn_id=turn_id)
        self.runner.set_turn(turn_id, str(payload.get("text") or ""))
        return succeeded({"turnId": turn_id})

    def _interrupt(self, command, restoring):
        self.control.stop(cancel=False)
        return succeeded({"interrupted": True})

    def _cancel(self, command, restoring):
        self.control.stop(cancel=True)
        return succeeded({"cancelled": True})

    def _resolve(self, command, restoring):
        payload = _payload(command)
        request_id, response = payload.get("requestId"), payload.get("response")
        if not restoring:
            if request_id not in self.outbox.request_ids:
                return rejected("unknown_request", f"No runtime request {request_id!r} was asked by this runner.")
            if self.control.resolution(request_id) is not None:
                return rejected("already_resolved", f"Runtime request {request_id} was resolved already.")
            self.runner.emit("runtime_request.resolved", {"requestId": request_id, "response": response})
        self.control.resolve(request_id, response if isinstance(response, dict) else {"value": response})
        return succeeded({"requestId": request_id})

    def _goal(self, command, restoring):
        if restoring:  # the harness keeps its own goal state; nothing to replay here
            return succeeded()
        answer = self.runner.goal_command(command)
        if answer is None:
            return rejected("unsupported", f"The harness does not support {command['type']}.")
        return succeeded(answer)

    def _unsupported(self, command, restoring):
        return rejected("unsupported", f"This runner does not apply {command.get('type')!r} commands.")

    def _schema_supported(self, schema) -> bool:
        """A command schema of the negotiated version or an older one (the host never sends newer)."""
        version = self.runner.protocol_version or PROTOCOL_MAX
        return schema in {COMMAND_SCHEMAS[v] for v in COMMAND_SCHEMAS if v <= version}

    def _unsupported_schema(self, command, restoring):
        return rejected("unsupported_required_schema",
                        f"Command schema {command.get('schema')!r} is not one this runner negotiated.")


def _payload(command: dict) -> dict:
    payload = command.get("payload")
    return payload if isinstance(payload, dict) else {}
