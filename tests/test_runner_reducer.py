"""The PRP session reducer (issues/runner/reducer.py): every golden we hold, the other fixtures by
the same rules, and hand-made delivery cases. Pure: no database."""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from issues.runner import reducer
from issues.runner.contract import ContractError
from tests.runner_helpers import capabilities, envelope, session_goals_capability

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "prp"
GOLDEN_DIRS = ("phase-01", "upstream-replay")
UPSTREAM_GOLDENS = (
    "budget-cost-stop-reason", "duplicate-event", "failed-run", "happy-path", "interrupted-run",
    "semantic-tool-artifact-happy-path", "semantic-tool-conflict-duplicate-retry",
    "semantic-tool-denial-redaction", "semantic-tool-governance-wake-monitor",
    "semantic-tool-unknown-optional-envelope", "source-gap", "unknown-optional-fields",
)
GOLDEN_CASES = [("phase-01", "happy-path"), ("phase-01", "duplicate-event")] + [
    ("upstream-replay", name) for name in UPSTREAM_GOLDENS]


def load(relative: str) -> dict:
    return json.loads((FIXTURES / relative).read_text(encoding="utf-8"))


def dump(doc) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def test_every_golden_file_is_covered():
    found = {(d, p.name[: -len(".snapshot.json")]) for d in GOLDEN_DIRS
             for p in (FIXTURES / d / "golden").glob("*.snapshot.json")}
    assert found == set(GOLDEN_CASES)


@pytest.mark.parametrize("folder,name", GOLDEN_CASES, ids=[f"{d}/{n}" for d, n in GOLDEN_CASES])
def test_reducer_matches_golden(folder, name):
    snapshot = reducer.replay_fixture(load(f"{folder}/{name}.json"))
    golden = FIXTURES / folder / "golden" / f"{name}.snapshot.json"
    assert snapshot == json.loads(golden.read_text(encoding="utf-8"))
    assert dump(snapshot).encode("utf-8") == golden.read_bytes()  # key order and bytes too
    summary = FIXTURES / folder / "golden" / f"{name}.summary.json"
    assert reducer.parity_summary(snapshot) == json.loads(summary.read_text(encoding="utf-8"))
    assert dump(reducer.parity_summary(snapshot)).encode("utf-8") == summary.read_bytes()


_UPSTREAM_IDS = re.compile(r"\b(company|issue|run|lease|runner|session|driver|provider|item|turn|retry|resume)_replay")


@pytest.mark.parametrize("name", ["failed-run", "interrupted-run", "source-gap", "unknown-optional-fields"])
def test_shared_fixtures_follow_the_same_rules_as_upstream_goldens(name):
    """Our phase-01 copies are upstream's replay fixtures with older ids (`*_phase1` for
    `*_replay`): with the ids mapped, upstream's golden is exactly our snapshot."""
    golden = (FIXTURES / "upstream-replay" / "golden" / f"{name}.snapshot.json").read_text(encoding="utf-8")
    golden = _UPSTREAM_IDS.sub(r"\1_phase1", golden).replace("replay-contract-v1", "phase1-contract-v1")
    assert dump(reducer.replay_fixture(load(f"phase-01/{name}.json"))) == golden


def test_source_gap_is_recorded_and_later_events_still_applied():
    snapshot = reducer.replay_fixture(load("phase-01/source-gap.json"))
    assert snapshot["gaps"] == [{"sourceKey": "runner:runner_phase1", "expected": 3, "received": 4,
                                 "missingCount": 1, "missing": [3], "truncated": False}]
    assert snapshot["integrity"] == "gap_detected"
    assert snapshot["processedEventIds"] == ["event_gap_01", "event_gap_02", "event_gap_04",
                                             "event_gap_05", "event_gap_06"]
    assert [e["sourceSeq"] for e in snapshot["timeline"]] == [1, 2, 4, 5, 6]  # 3 is never invented
    assert snapshot["sourceCursors"] == {"runner:runner_phase1": 6}
    assert snapshot["terminal"]["runTerminalState"] == "succeeded"
    assert reducer.parity_summary(snapshot)["integrity"] == "gap_detected"


def test_interrupted_run_keeps_the_pending_request_and_a_cancelled_terminal():
    snapshot = reducer.replay_fixture(load("phase-01/interrupted-run.json"))
    assert snapshot["requests"] == [{"requestId": "request_interrupted_permission", "requestKind": "runtime",
                                     "type": "permission", "status": "pending",
                                     "prompt": "Allow the fake command?"}]
    assert snapshot["turnState"] == "interrupted" and snapshot["activeTurnId"] is None
    assert (snapshot["terminal"]["turnTerminalState"], snapshot["terminal"]["runTerminalState"]) == (
        "interrupted", "cancelled")
    assert snapshot["timeline"][2]["summary"] == "permission: Allow the fake command?"


def test_failed_run_projects_the_failed_item_and_turn():
    snapshot = reducer.replay_fixture(load("phase-01/failed-run.json"))
    assert snapshot["items"] == [{"itemId": "item_failed_command", "kind": "command", "status": "failed", "text": ""}]
    assert snapshot["turnState"] == "failed"
    assert snapshot["terminal"]["runTerminalState"] == "failed"
    assert snapshot["proposedResult"]["continuation"]["kind"] == "retry"


def test_unknown_optional_fields_are_preserved_where_they_belong():
    fixture = load("phase-01/unknown-optional-fields.json")
    snapshot = reducer.replay_fixture(fixture)
    assert snapshot["identity"] == fixture["identity"]
    assert snapshot["capabilities"] == fixture["capabilities"]
    unknown = [k for k in fixture["capabilities"] if k not in load("phase-01/happy-path.json")["capabilities"]]
    assert unknown and all(k in snapshot["capabilities"] for k in unknown)
    assert snapshot["terminal"]["futureTerminalReason"] == "optional"
    assert snapshot["proposedResult"] == fixture["result"]
    assert snapshot["integrity"] == "complete"
    upstream = reducer.replay_fixture(load("upstream-replay/unknown-optional-fields.json"))
    assert upstream["identity"]["futureIdentityLabel"] == "preserved"
    assert upstream["capabilities"]["driver"]["futureDriverField"] is True


def test_budget_stop_reason_kept_on_the_terminal():
    fixture = load("replay/budget-cost-stop-reason.json")
    snapshot = reducer.replay_fixture(fixture)
    assert snapshot["terminal"] == fixture["events"][1]["payload"]
    assert snapshot["terminal"]["stopReason"]["code"] == "budget_hard_stop"
    assert (snapshot["runPhase"], snapshot["sessionState"], snapshot["turnState"]) == (
        "terminal", "not_started", "not_started")
    assert snapshot["proposedResult"]["blocker"]["reasonCode"] == "budget_hard_stop"
    assert reducer.parity_summary(snapshot)["runTerminalState"] == "cancelled"


@pytest.mark.parametrize("path,code,field", [
    ("phase-01/unsupported-required-version.json", "unsupported_required_version", "$.protocolVersion"),
    ("upstream-replay/unsupported-required-version.json", "unsupported_required_version", "$.protocolVersion"),
    # a v2 semantic_tool envelope: refused on its schemaVersion or its schema, whichever the contract checks first
    ("upstream-replay/semantic-tool-unsupported-required-version.json", "unsupported_required_",
     "$.events[0].payload.semantic_tool.schema"),
])
def test_rejected_fixtures_fail_closed(path, code, field):
    with pytest.raises(ContractError) as caught:
        reducer.replay_fixture(load(path))
    assert caught.value.code.startswith(code) and caught.value.field.startswith(field)


# ---------------------------------------------------------------- hand-made cases

BASE = load("upstream-replay/happy-path.json")
RUN = BASE["identity"]["runId"]
TERMINAL = {"schema": "paperclip.prp.terminal.v1", "turnTerminalState": "completed",
            "runTerminalState": "succeeded", "reportedWorkDisposition": "done"}


def fixture(events, version: int = 1) -> dict:
    doc = copy.deepcopy(BASE)
    doc.update(events=events, protocolVersion=version, commands=[], capabilities=capabilities(version),
               name="Hand-made")
    return doc


def ev(seq, event_type, payload=None, version=1, **fields):
    return envelope(seq, event_type, payload, run=RUN, version=version, **fields)


def measurement(tokens_in, tokens_out, cost):
    return {"inputTokens": tokens_in, "outputTokens": tokens_out, "cacheReadTokens": 0, "cacheWriteTokens": 0,
            "activeSeconds": 1.5, "requests": 1, "providerCostUsd": cost}


def test_different_bytes_duplicate_is_a_conflict_and_the_first_delivery_stays():
    first = ev(1, "item.completed", {"kind": "assistant_message", "text": "first"}, itemId="item_1")
    forged = copy.deepcopy(first)
    forged["payload"]["text"] = "second"
    snapshot = reducer.replay_fixture(fixture([first, forged, ev(2, "run.terminal", TERMINAL)]))
    assert snapshot["items"][0]["text"] == "first"
    assert snapshot["duplicateEventIds"] == [first["sourceEventId"]]
    assert snapshot["processedEventIds"] == [first["sourceEventId"], "runner_test-2"]
    assert snapshot["integrity"] == "conflict"
    assert [d["code"] for d in snapshot["diagnostics"]] == ["conflicting_duplicate"]
    assert reducer.parity_summary(snapshot)["integrity"] == "conflict"
    # the byte-identical repeat is a plain duplicate: no diagnostic, integrity complete
    same = reducer.replay_fixture(fixture([first, copy.deepcopy(first)]))
    assert (same["integrity"], same["duplicateEventIds"], "diagnostics" in same) == (
        "complete", [first["sourceEventId"]], False)


def test_event_behind_the_cursor_is_out_of_order_and_not_applied():
    events = [ev(1, "session.started"), ev(2, "turn.started", turnId="turn_1"),
              ev(4, "turn.completed", turnId="turn_1"), ev(3, "turn.failed", turnId="turn_1"),
              ev(2, "session.closed", event_id="late_other_id")]
    snapshot = reducer.replay_fixture(fixture(events))
    assert snapshot["outOfOrderEventIds"] == ["runner_test-3", "late_other_id"]
    assert snapshot["turnState"] == "completed" and snapshot["sessionState"] == "running"
    assert snapshot["gaps"][0]["missing"] == [3]  # the late seq 3 does not erase the recorded gap
    assert snapshot["sourceCursors"] == {"runner:runner_test": 4}
    assert snapshot["integrity"] == "gap_detected"
    only_late = reducer.replay_fixture(fixture([ev(1, "session.started"), ev(1, "session.closed", event_id="x")]))
    assert (only_late["outOfOrderEventIds"], only_late["gaps"], only_late["integrity"]) == (["x"], [], "gap_detected")


def test_second_terminal_is_ignored_and_diagnosed():
    failed = dict(TERMINAL, turnTerminalState="failed", runTerminalState="failed")
    snapshot = reducer.replay_fixture(fixture([ev(1, "run.terminal", TERMINAL), ev(2, "run.terminal", failed),
                                               ev(3, "runtime.phase.changed", {"phase": "workspace_preparing"})]))
    assert snapshot["terminal"] == TERMINAL and snapshot["runPhase"] == "terminal"
    assert snapshot["timeline"][1]["summary"] == "Second terminal ignored (run already succeeded)"
    assert snapshot["diagnostics"] == [{"sourceEventId": "runner_test-2", "sourceSeq": 2, "code": "second_terminal",
                                        "detail": "a second run.terminal (failed) after the run ended succeeded; ignored"}]
    assert snapshot["integrity"] == "complete"  # a runner bug, not a delivery gap
    assert reducer.parity_summary(snapshot)["runTerminalState"] == "succeeded"


def test_result_after_terminal_is_ignored():
    result = BASE["result"]
    late = dict(result, summary="Too late")
    snapshot = reducer.replay_fixture(fixture([ev(1, "run.result.proposed", result), ev(2, "run.terminal", TERMINAL),
                                               ev(3, "run.result.proposed", late)]))
    assert snapshot["proposedResult"] == result
    assert snapshot["diagnostics"][0]["code"] == "result_after_terminal"


def test_usage_counts_run_delta_only_when_available_and_never_sums_cumulative():
    reports = [
        {"provider": "openai", "model": "m", "cumulative": measurement(100, 10, 0.1), "runDeltaAvailable": True,
         "runDelta": measurement(100, 10, 0.1)},
        {"provider": "openai", "model": "m", "cumulative": measurement(250, 30, 0.2), "runDeltaAvailable": False,
         "runDelta": None},
        {"provider": "openai", "model": "m", "cumulative": measurement(400, 50, 0.3), "runDeltaAvailable": True,
         "runDelta": measurement(150, 20, 0.2)},
        {"provider": "openai", "model": "m", "cumulative": measurement(500, 60, 0.4),
         "runDelta": measurement(999, 999, 9.0)},  # runDeltaAvailable absent: not counted
    ]
    snapshot = reducer.replay_fixture(fixture([ev(i + 1, "usage.reported", r) for i, r in enumerate(reports)]))
    usage = snapshot["usage"]
    assert usage["reports"] == 4 and usage["runDeltaReports"] == 2
    assert usage["runDelta"] == {"inputTokens": 250, "outputTokens": 30, "cacheReadTokens": 0, "cacheWriteTokens": 0,
                                 "activeSeconds": 3.0, "requests": 2, "providerCostUsd": 0.3}
    assert usage["cumulative"] == measurement(500, 60, 0.4)  # the latest figure, not a sum
    assert snapshot["timeline"][1]["summary"] == "Usage reported by openai: no run delta (cumulative only, not counted)"


def test_v2_goal_lifecycle_and_capability_update():
    goal = {"objective": "Ship the release", "status": "active", "tokenBudget": 1000, "tokensUsed": 10,
            "elapsedSeconds": 1.5, "iterations": 1, "lastReason": None, "createdAt": "2026-08-07T12:00:00.000Z",
            "updatedAt": "2026-08-07T12:00:00.000Z", "completedAt": None, "workingNow": True}
    paused = dict(goal, status="paused", workingNow=False)
    narrowed = session_goals_capability(actions=("set", "clear"))
    events = [ev(1, "session.started", version=2),
              ev(2, "session.capabilities.updated", {"sessionGoals": narrowed}, version=2),
              ev(3, "session.goal.snapshot", {"goal": None}, version=2),
              ev(4, "session.goal.updated", {"goal": goal}, version=2),
              ev(5, "session.goal.updated", {"goal": paused}, version=2),
              ev(6, "session.goal.cleared", {}, version=2)]
    doc = fixture(events, version=2)
    snapshots = [reducer.reduce_session(identity=doc["identity"], capabilities=doc["capabilities"], events=events[:n])
                 for n in (1, 3, 4, 5, 6)]
    assert "sessionGoal" not in snapshots[0]
    assert [s["sessionGoal"] for s in snapshots[1:]] == [None, goal, paused, None]
    final = reducer.replay_fixture(doc)
    assert final == snapshots[-1] | {"fixtureName": "Hand-made"}
    assert final["capabilities"]["sessionGoals"] == narrowed
    assert [e["summary"] for e in final["timeline"][1:]] == [
        "Session goals available", "No session goal", "Goal active: Ship the release",
        "Goal paused: Ship the release", "Goal cleared"]
    assert final["integrity"] == "complete"


def test_credentials_and_activity_events_do_not_break_the_snapshot():
    creds = {"schema": "paperclip.auth.credentials.updated.v1", "provider": "codex", "bindingId": "harness-auth",
             "revision": 3, "detection": "credential_store"}
    events = [ev(1, "session.started", version=2), ev(2, "auth.credentials.updated", creds, version=2),
              ev(3, "runtime.activity.recorded", {"namespace": "git", "activityKey": "push"}, version=2),
              ev(4, "run.terminal", TERMINAL, version=2),
              ev(5, "auth.credentials.updated", dict(creds, revision=4), version=2)]  # after cleanup: allowed
    snapshot = reducer.replay_fixture(fixture(events, version=2))
    assert [e["summary"] for e in snapshot["timeline"][1:3]] == [
        "Credentials updated: codex harness-auth revision 3", "Activity git/push"]
    assert snapshot["integrity"] == "complete" and "diagnostics" not in snapshot
    assert snapshot["terminal"] == TERMINAL and len(snapshot["processedEventIds"]) == 5


def test_request_lifecycle_closes_once():
    request = {"schema": "paperclip.runtime_request.v1", "requestKind": "runtime", "requestId": "req_1",
               "type": "permission", "status": "pending", "prompt": "Run the migration?"}
    events = [ev(1, "runtime_request.created", {"request": request}),
              ev(2, "runtime_request.resolved", {"request": dict(request, status="resolved")}),
              ev(3, "runtime_request.cancelled", {"requestId": "req_1"}),
              ev(4, "runtime_request.expired", {"requestId": "req_unknown"})]
    snapshot = reducer.replay_fixture(fixture(events))
    assert [r["status"] for r in snapshot["requests"]] == ["resolved"]
    assert [e["summary"] for e in snapshot["timeline"]] == [
        "permission: Run the migration?", "Resolved permission: Run the migration?",
        "Cancelled permission: Run the migration?", "Expired runtime request req_unknown"]


def test_items_accumulate_deltas_and_completed_text_is_authoritative():
    events = [ev(1, "item.started", {"kind": "assistant_message", "text": ""}, itemId="a"),
              ev(2, "item.delta", {"text": "Hel"}, itemId="a"), ev(3, "item.delta", {"text": "lo"}, itemId="a"),
              ev(4, "item.started", {"kind": "reasoning"}, itemId="b"),
              ev(5, "item.completed", {"kind": "reasoning", "text": "Done thinking"}, itemId="b"),
              ev(6, "item.completed", {"kind": "assistant_message"}, itemId="a"),
              ev(7, "item.delta", {"text": "!"}, itemId="b")]
    items = reducer.replay_fixture(fixture(events))["items"]
    assert items == [{"itemId": "a", "kind": "assistant_message", "status": "completed", "text": "Hello"},
                     {"itemId": "b", "kind": "reasoning", "status": "completed", "text": "Done thinking!"}]


def test_sources_have_their_own_cursors_and_large_gaps_are_bounded():
    events = [ev(1, "session.started"), ev(1, "runtime.phase.changed", source_instance_id="helper"),
              ev(10**6, "turn.started", source_instance_id="helper", turnId="t")]
    snapshot = reducer.replay_fixture(fixture(events))
    assert snapshot["sourceCursors"] == {"runner:runner_test": 1, "runner:helper": 10**6}
    (gap,) = snapshot["gaps"]
    assert (gap["sourceKey"], gap["expected"], gap["missingCount"], gap["truncated"]) == (
        "runner:helper", 2, 10**6 - 2, True)
    assert gap["missing"] == list(range(2, 2 + reducer.MAX_RECORDED_MISSING))


def test_live_run_has_a_live_name_and_no_fixture():
    snapshot = reducer.reduce_session(identity={"runId": "r-42"}, capabilities={}, events=[ev(1, "session.started")])
    assert snapshot["fixtureName"] == "live:r-42"
    assert list(snapshot)[: len(reducer.SNAPSHOT_KEYS)] == list(reducer.SNAPSHOT_KEYS)
    empty = reducer.reduce_session(identity={"runId": "r-1"}, capabilities={}, events=[])
    assert (empty["runPhase"], empty["integrity"], empty["terminal"]) == ("queued", "complete", None)
    assert reducer.parity_summary(empty)["runTerminalState"] is None


@pytest.mark.parametrize("path", ["upstream-replay/interrupted-run.json", "upstream-replay/duplicate-event.json",
                                  "phase-01/unknown-optional-fields.json"])
def test_deterministic_and_input_untouched(path):
    doc = load(path)
    before = copy.deepcopy(doc)
    first = reducer.replay_fixture(doc)
    assert doc == before
    first["identity"]["runId"] = "changed"  # the snapshot holds copies, not the input's objects
    first["terminal"]["runTerminalState"] = "changed"
    assert doc == before
    assert dump(reducer.replay_fixture(doc)) == dump(reducer.replay_fixture(copy.deepcopy(before)))
    assert reducer.replay_fixture(doc) == reducer.replay_fixture(before)
