"""The fake harness: plays a ``paperclip.fake_harness.script.v1`` script, step by step.

A script is ``{"schema": "paperclip.fake_harness.script.v1", "name": …, "steps": [...]}``; the
steps, in order:

* ``event`` (``event_type``, ``payload``, optional ``item_id``) — that event;
* ``log`` (``stream`` stdout|stderr, ``text``) — one log line;
* ``delay`` (``milliseconds``) — a pause;
* ``request`` (``request``: a ``paperclip.runtime_request.v1`` document) — ``runtime_request.created``;
* ``await_resolution`` (``request_id``) — waits for the host's ``request.resolve``;
* ``await_interrupt`` — waits for ``turn.interrupt`` / ``run.cancel``;
* ``result`` (``payload``) — ``run.result.proposed``;
* ``terminal`` (``payload``) — ``run.terminal``; a second one is refused by the session (it reports
  ``duplicate_terminal``) and the script goes on;
* ``exit`` (``code``) — the harness ends with that exit code (a script without one ends with 0);
* ``spawn_worker`` — starts a lingering process group (``start_new_session``) registered with the
  session, which ends it when the runner cleans up. The worker also ends when the runner's process
  dies (it waits for end-of-file on a pipe the runner holds), so a killed runner leaves no orphan.

Stops: an interrupt (or cancel) ends the script before its next step, or during a ``delay`` or an
``await_resolution``, with exit code 130 — the runner then derives the cancelled terminal. Only an
``await_interrupt`` step consumes the interrupt: after it the script plays on (its own ending).

Resume: each step that emits stores ``checkpoint={"step": i + 1}`` with its event, in the same
outbox transaction. Started again with ``session.restored_checkpoint`` ``{"step": k}`` (a runner
restart), the script continues at step ``k``: nothing before it is emitted again and delays before
it are not replayed; ``spawn_worker`` steps before it are (the earlier worker ended with the old
runner), and an ``await_interrupt`` before it counts as having consumed the interrupt.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from importlib import resources
from pathlib import Path

from .capabilities import capability_doc

SCRIPT_SCHEMA = "paperclip.fake_harness.script.v1"
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what an interrupted command exits with
EXIT_FAILED = 1
BUNDLED_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,79}$")
WORKER_ARGV = (sys.executable, "-c", "import sys; sys.stdin.read()")

JSON_TYPES = {str: "string", dict: "object", int: "integer"}
# kind -> {field: type} every step of that kind must have (optional fields are checked where used).
STEP_FIELDS = {
    "event": {"event_type": str, "payload": dict},
    "log": {"stream": str, "text": str},
    "delay": {"milliseconds": int},
    "request": {"request": dict},
    "await_resolution": {"request_id": str},
    "await_interrupt": {},
    "result": {"payload": dict},
    "terminal": {"payload": dict},
    "exit": {"code": int},
    "spawn_worker": {},
}


def script_path(name_or_path: str) -> Path:
    """A bundled script (``prp_runner/scripts/<name>.json``) for a bare name, otherwise a path."""
    if BUNDLED_NAME.match(name_or_path):
        bundled = resources.files("prp_runner") / "scripts" / f"{name_or_path}.json"
        if bundled.is_file():
            return Path(str(bundled))
    return Path(name_or_path)


def load_script(name_or_path: str) -> dict:
    """The script, checked step by step; ValueError says what is wrong (OSError: unreadable)."""
    path = script_path(name_or_path)
    where = f"script {name_or_path}"
    try:
        script = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{where}: no bundled script of that name and no such file") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not JSON ({exc})") from None
    if not isinstance(script, dict) or script.get("schema") != SCRIPT_SCHEMA:
        raise ValueError(f"{where}: expected a {SCRIPT_SCHEMA} document")
    steps = script.get("steps")
    if not isinstance(steps, list):
        raise ValueError(f"{where}: steps must be a list")
    for i, step in enumerate(steps):
        kind = step.get("kind") if isinstance(step, dict) else None
        if kind not in STEP_FIELDS:
            raise ValueError(f"{where}: step {i}: unknown kind {kind!r}")
        for field, kind_type in STEP_FIELDS[kind].items():
            value = step.get(field)
            if not isinstance(value, kind_type) or isinstance(value, bool):
                raise ValueError(f"{where}: step {i} ({kind}): {field} must be a JSON {JSON_TYPES[kind_type]}")
        if kind == "log" and step["stream"] not in ("stdout", "stderr"):
            raise ValueError(f"{where}: step {i} (log): stream must be stdout or stderr")
        if kind == "delay" and step["milliseconds"] < 0:
            raise ValueError(f"{where}: step {i} (delay): milliseconds must not be negative")
        if kind == "request" and not isinstance(step["request"].get("requestId"), str):
            raise ValueError(f"{where}: step {i} (request): request.requestId must be a string")
    return script


class FakeHarness:
    name = "fake"

    def __init__(self, script: dict):
        self.script = script
        self.steps = script["steps"]
        self.resolutions: dict[str, dict] = {}  # request id -> the host's answer, as awaited
        self.workers: list[subprocess.Popen] = []

    @classmethod
    def from_options(cls, options: dict) -> "FakeHarness":
        script = options.get("script")
        if not script:
            raise ValueError("the fake harness needs a script (--script NAME_OR_PATH)")
        return cls(load_script(script))

    def capabilities(self, version: int) -> dict:
        return capability_doc(version, driver="fake-harness", steer=False, interrupt=True, resume=True,
                              runtimeRequests=True, structuredResult=True, typedEvents=True)

    def goal_command(self, command: dict) -> dict | None:
        return None  # advertised as unsupported

    def run(self, session) -> int:
        start = _resume_step(session.restored_checkpoint, len(self.steps))
        if start is None:
            session.diagnostic("checkpoint_invalid", "The fake harness cannot resume from this checkpoint; "
                               "replaying the script would emit its events twice.",
                               checkpoint=session.restored_checkpoint)
            return EXIT_FAILED
        done = self.steps[:start]
        for step in done:
            if step["kind"] == "spawn_worker":
                self._spawn_worker(session)
        interrupt_consumed = any(step["kind"] == "await_interrupt" for step in done)
        for i in range(start, len(self.steps)):
            if session.interrupt_requested.is_set() and not interrupt_consumed:
                return EXIT_INTERRUPTED
            step, checkpoint = self.steps[i], {"step": i + 1}
            kind = step["kind"]
            if kind == "event":
                session.emit(step["event_type"], step["payload"], item_id=step.get("item_id"), checkpoint=checkpoint)
            elif kind == "log":
                session.log(step["stream"], step["text"], checkpoint=checkpoint)
            elif kind == "delay":
                seconds = step["milliseconds"] / 1000
                if interrupt_consumed:
                    threading.Event().wait(seconds)  # the script's own pause, no longer interruptible
                elif session.interrupt_requested.wait(seconds):
                    return EXIT_INTERRUPTED
            elif kind == "request":
                session.request(step["request"], checkpoint=checkpoint)
            elif kind == "await_resolution":
                response = session.wait_resolution(step["request_id"])
                if response is None:  # only an interrupt or cancel ends an untimed wait
                    return EXIT_INTERRUPTED
                self.resolutions[step["request_id"]] = response
            elif kind == "await_interrupt":
                session.wait_interrupt()
                interrupt_consumed = True
            elif kind == "result":
                session.propose_result(step["payload"], checkpoint=checkpoint)
            elif kind == "terminal":
                session.terminal(step["payload"], checkpoint=checkpoint)  # a refused duplicate changes nothing
            elif kind == "exit":
                return step["code"]
            elif kind == "spawn_worker":
                self._spawn_worker(session)
        return 0

    def _spawn_worker(self, session):
        worker = subprocess.Popen(WORKER_ARGV, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, start_new_session=True)
        self.workers.append(worker)  # holds the pipe's write end: the worker lives as long as this process
        session.register_process(worker)


def _resume_step(checkpoint, count: int) -> int | None:
    """The step to start at: 0 without a checkpoint, else its ``step``; None when it is unusable."""
    if checkpoint is None:
        return 0
    step = checkpoint.get("step") if isinstance(checkpoint, dict) else None
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= count:
        return None
    return step
