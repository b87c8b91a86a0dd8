"""A tiny PRP runner for the runner adapter's tests (not the reference runner): it says hello,
reads the host's first commands, posts a short session as events and exits.

PRP_SCRIPT_MODE: ``complete`` (default: a session ending with run.result.proposed and
run.terminal), ``no_terminal`` (the same without the terminal: the host must fail the run),
``linger`` (the full session, then the process stays alive: the host terminates it), or
``await_cancel`` (no terminal until the host sends run.cancel; then a cancelled terminal, exit 0).
Standard library + httpx only; everything it knows comes from the environment the adapter gives it.
"""
import os
import sys
import time

import httpx

URL, KEY, RUN_ID = os.environ["PAPERCLIP_RUNNER_URL"], os.environ["PAPERCLIP_API_KEY"], os.environ["PAPERCLIP_RUN_ID"]
MODE = os.environ.get("PRP_SCRIPT_MODE", "complete")
SOURCE = "script_runner"
CAPABILITIES = {"schema": "paperclip.prp.capabilities.v1", "sessionReusePolicy": "new_per_run",
                "driver": {"kind": "script", "version": "1.0.0"}, "steer": False, "interrupt": True,
                "resume": False, "runtimeRequests": False, "structuredResult": True, "typedEvents": True}


def envelope(seq, event_type, payload=None, **extra):
    return {"schema": "paperclip.prp.event.v1", "sourceEventId": f"{SOURCE}-{seq}", "sourceSeq": seq,
            "sourceInstanceId": SOURCE, "sourceKind": "runner", "runId": RUN_ID, "eventType": event_type,
            "schemaVersion": 1, "priority": 0, "emittedAt": "2026-12-02T12:00:00.000Z", "payload": payload or {},
            **extra}


def main():
    client = httpx.Client(base_url=URL, headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    hello = client.post("hello", json={"protocolMin": 1, "protocolMax": 1, "runnerInstanceId": SOURCE,
                                       "capabilities": CAPABILITIES})
    hello.raise_for_status()
    commands = client.get("commands", params={"afterSeq": 0, "wait": 0}).json()["commands"]
    turn = next(c for c in commands if c["type"] == "turn.start")
    print(f"script runner: v{hello.json()['protocolVersion']}, commands {[c['type'] for c in commands]}", flush=True)
    usage = {"provider": "script", "model": "m1",
             "cumulative": {"inputTokens": 100, "outputTokens": 20, "cacheReadTokens": 0, "cacheWriteTokens": 0,
                            "activeSeconds": 1, "requests": 1, "providerCostUsd": 0.02},
             "runDelta": {"inputTokens": 100, "outputTokens": 20, "cacheReadTokens": 0, "cacheWriteTokens": 0,
                          "activeSeconds": 1, "requests": 1, "providerCostUsd": 0.02},
             "runDeltaAvailable": True, "costSource": "provider_reported"}
    result = {"schema": "paperclip.run_result.v1", "reportedWorkDisposition": "needs_review",
              "summary": f"Read {len(turn['payload']['text'])} characters of task packet.",
              "completionClaim": {"contractRevision": "script-v1", "objectiveSatisfied": True, "criteria": [],
                                  "remainingWork": []},
              "evidence": [], "verification": [], "attentionRequests": [], "artifacts": []}
    events = [envelope(1, "session.started"), envelope(2, "turn.started", turnId="t1"),
              envelope(3, "usage.reported", usage), envelope(4, "run.result.proposed", result),
              envelope(5, "turn.completed", turnId="t1")]
    if MODE not in ("no_terminal", "await_cancel"):
        events.append(envelope(6, "run.terminal", {"schema": "paperclip.prp.terminal.v1",
                                                   "turnTerminalState": "completed", "runTerminalState": "succeeded",
                                                   "reportedWorkDisposition": "needs_review"}))
    ack = client.post("events", json={"events": events})
    ack.raise_for_status()
    print(f"script runner: acked {ack.json()['ackedSourceSeq']}", flush=True)
    if MODE == "linger":
        time.sleep(600)
    if MODE == "await_cancel":
        return await_cancel(client, commands[-1]["controllerSeq"])
    return 0


def await_cancel(client, after: int) -> int:
    """Long-poll the command lane until run.cancel; confirm it with the terminal."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        offered = client.get("commands", params={"afterSeq": after, "wait": 5}).json()["commands"]
        for command in offered:
            after = command["controllerSeq"]
            if command["type"] == "run.cancel":
                client.post(f"commands/{command['commandId']}/result", json={"status": "succeeded"})
                ack = client.post("events", json={"events": [envelope(6, "run.terminal", {
                    "schema": "paperclip.prp.terminal.v1", "turnTerminalState": "cancelled",
                    "runTerminalState": "cancelled", "reportedWorkDisposition": "yielded"})]})
                ack.raise_for_status()
                print("script runner: cancelled on request", flush=True)
                return 0
    return 3


if __name__ == "__main__":
    sys.exit(main())
