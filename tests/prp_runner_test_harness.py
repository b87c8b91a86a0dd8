"""A small harness for the reference runner's own tests, loaded by the runner subprocess with
``--harness module:tests.prp_runner_test_harness:make --script <mode>`` (standard library only:
it runs inside the runner, next to no Django).

Modes: ``happy`` (an item, two log lines, a ``done`` result, exit 0, no terminal: the runner
derives it), ``error`` (a ``done`` result, exit 7), ``await_interrupt`` (an item, then waits for
the host's interrupt or cancel, exit 130; after a restart it resumes past the item), ``request``
(asks a permission, waits for its resolution and reports the answer in an item), ``big`` (a log
line and an item over the frame limit), ``many`` (40 items).
"""
from __future__ import annotations

import json

BIG = 5000  # characters: over the small frame limit the tests set
REQUEST = {"schema": "paperclip.runtime_request.v1", "requestKind": "runtime", "requestId": "req_runner_test",
           "type": "permission", "status": "pending", "prompt": "May the test harness proceed?",
           "choices": [{"key": "allow", "label": "Allow"}, {"key": "deny", "label": "Deny"}]}
GOALS_UNSUPPORTED = {"availability": "unsupported", "actions": [], "autonomousUpdates": False,
                     "persistentAcrossResume": False, "maxObjectiveChars": 1, "tokenBudgetControl": False,
                     "usageReporting": False}


def result(disposition: str) -> dict:
    return {"schema": "paperclip.run_result.v1", "reportedWorkDisposition": disposition,
            "summary": "The test harness finished.",
            "completionClaim": {"contractRevision": "test-v1", "objectiveSatisfied": True, "criteria": [],
                                "remainingWork": []},
            "evidence": [], "verification": [], "attentionRequests": [], "artifacts": []}


class RunnerTestHarness:
    name = "runner-test"

    def __init__(self, mode: str):
        self.mode = mode

    def capabilities(self, version: int) -> dict:
        doc = {"schema": f"paperclip.prp.capabilities.v{version}", "sessionReusePolicy": "new_per_run",
               "driver": {"kind": "runner-test", "version": "1.0.0"}, "steer": False, "interrupt": True,
               "resume": True, "runtimeRequests": True, "structuredResult": True, "typedEvents": True}
        if version >= 2:
            doc["sessionGoals"] = GOALS_UNSUPPORTED
        return doc

    def run(self, session) -> int:
        return getattr(self, "_" + self.mode)(session)

    def _happy(self, session):
        session.emit("item.started", {"kind": "command", "text": session.task_packet[:80]}, item_id="item_1")
        session.log("stdout", "first line")
        session.log("stderr", "second line")
        session.emit("item.completed", {"kind": "command", "text": "done"}, item_id="item_1")
        session.propose_result(result("done"))
        session.emit("turn.completed", {})
        return 0

    def _error(self, session):
        session.propose_result(result("done"))
        return 7

    def _await_interrupt(self, session):
        if session.restored_checkpoint is None:
            session.emit("item.started", {"kind": "command", "text": "waiting"}, item_id="item_wait",
                         checkpoint={"step": 1})
        session.wait_interrupt()
        return 130

    def _request(self, session):
        session.request(REQUEST, checkpoint={"step": 1})
        response = session.wait_resolution(REQUEST["requestId"], timeout=60)
        session.emit("item.completed", {"kind": "assistant_message", "text": json.dumps(response, sort_keys=True)},
                     item_id="item_answer")
        return 0 if response else 1

    def _big(self, session):
        session.log("stdout", "x" * BIG)
        session.emit("item.started", {"kind": "command", "text": "y" * BIG}, item_id="item_big")
        return 0

    def _many(self, session):
        for i in range(40):
            session.emit("item.started", {"kind": "command", "text": f"step {i}"}, item_id=f"item_{i}")
        return 0


def make(options: dict) -> RunnerTestHarness:
    return RunnerTestHarness(options.get("script") or "happy")
