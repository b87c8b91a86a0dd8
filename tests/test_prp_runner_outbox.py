"""The reference runner's durable outbox (prp_runner.outbox) on real SQLite files: what it stores
is what is sent on every retry and after restarts, what the host ACKs is pruned and nothing
more, the bound drops only P1/P2 without a seq gap, and a SIGKILLed writer loses nothing it
committed."""
import json
import logging
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from issues.runner import contract
from prp_runner.canonical import canonical_json
from prp_runner.envelope import P0, P1, P2
from prp_runner.outbox import FrameTooLarge, Outbox, OutboxError

RUN = "0b5c6a9e-2c1f-4a3b-9e8d-7f6a5b4c3d2e"
ROOT = Path(__file__).resolve().parents[1]


def open_outbox(path, run_id=RUN, version=2, **kwargs) -> Outbox:
    box = Outbox(path, run_id, **kwargs)
    box.protocol_version = version
    return box


def phase(box, seq_hint="running", **kwargs):
    return box.append("runtime.phase.changed", {"phase": seq_hint}, priority=P1, **kwargs)


def stored(box) -> list[dict]:
    return [json.loads(body) for body in box.pending(10**6, 10**9)]


def test_envelopes_are_built_once_and_byte_identical_across_reopen(tmp_path):
    path = tmp_path / "outbox.sqlite3"
    box = open_outbox(path)
    source = box.source_instance_id
    assert source.startswith("prp-") and len(source) == 20
    first = box.append("session.started", {}, priority=P0)
    box.append("item.delta", {"text": "héllo ✓"}, priority=P2, turn_id="turn-3", item_id="log-stdout")
    phase(box)
    before = box.pending(100, 1 << 20)
    box.close()

    again = open_outbox(path)
    assert again.source_instance_id == source
    assert again.pending(100, 1 << 20) == before  # the very bytes, never rebuilt
    envelopes = [json.loads(body) for body in before]
    assert [e["sourceSeq"] for e in envelopes] == [1, 2, 3]
    assert [e["sourceEventId"] for e in envelopes] == [f"{source}-{n}" for n in (1, 2, 3)]
    assert envelopes[0] == first and before[0] == canonical_json(first)
    assert envelopes[1]["turnId"] == "turn-3" and envelopes[1]["itemId"] == "log-stdout"
    assert envelopes[1]["payload"]["text"] == "héllo ✓"
    for env in envelopes:  # the host's contract takes every one of them
        contract.validate_event(env, protocol_version=2)
        assert env["runId"] == RUN and env["sourceKind"] == "runner" and env["emittedAt"].endswith("Z")
    assert again.append("session.closed", {}, priority=P0)["sourceSeq"] == 4  # the sequence goes on


def test_v1_envelopes_follow_the_negotiated_version(tmp_path):
    box = open_outbox(tmp_path / "v1.sqlite3", version=1)
    env = box.append("runner.backpressure", {"droppedEvents": 1}, priority=P0)
    assert (env["schema"], env["schemaVersion"]) == ("paperclip.prp.event.v1", 1)
    contract.validate_event(env, protocol_version=1)


def test_wal_and_fsync_on_every_commit_are_set(tmp_path):
    path = tmp_path / "outbox.sqlite3"
    box = open_outbox(path)
    assert box.pragmas() == {"journal_mode": "wal", "synchronous": 2}  # 2 = FULL
    phase(box)
    with sqlite3.connect(path) as other:  # WAL is a property of the file, seen by any connection
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_another_runs_file_and_a_second_runner_are_refused(tmp_path):
    path = tmp_path / "outbox.sqlite3"
    box = open_outbox(path)
    with pytest.raises(OutboxError, match="in use by another runner"):
        Outbox(path, RUN)
    box.close()
    with pytest.raises(OutboxError, match=f"belongs to run {RUN}"):
        Outbox(path, "another-run")
    assert open_outbox(path).run_id == RUN  # the refusal changed nothing


def test_acks_prune_up_to_the_ack_and_bad_acks_are_rejected(tmp_path, caplog):
    path = tmp_path / "outbox.sqlite3"
    box = open_outbox(path)
    for _ in range(5):
        phase(box)
    assert box.ack(0) and box.pending_count == 5
    assert box.ack(2)
    assert [e["sourceSeq"] for e in stored(box)] == [3, 4, 5]
    caplog.set_level(logging.WARNING, logger="prp_runner")
    assert box.ack(1) is False  # backwards
    assert box.ack(6) is False  # past what was produced
    assert box.ack("3") is False
    messages = [r.getMessage() for r in caplog.records if r.name == "prp_runner"]
    assert "ACK 1 rejected: it goes backwards (acknowledged 2, produced 5)" in messages
    assert "ACK 6 rejected: it is past the last event produced (acknowledged 2, produced 5)" in messages
    assert box.acked_seq == 2 and [e["sourceSeq"] for e in stored(box)] == [3, 4, 5]
    assert box.ack(2)  # the same ACK again is fine and changes nothing
    box.close()
    again = open_outbox(path)
    assert again.acked_seq == 2 and [e["sourceSeq"] for e in stored(again)] == [3, 4, 5]
    assert again.ack(5) and again.pending_count == 0 and again.produced_seq == 5


def test_pending_batches_whole_envelopes_within_the_byte_limit(tmp_path):
    box = open_outbox(tmp_path / "outbox.sqlite3")
    for _ in range(6):
        phase(box)
    size = len(box.pending(1, 10**6)[0])
    # wrapper 13 bytes + 2 envelopes + 1 comma fit; a third does not.
    assert len(box.pending(100, 13 + 2 * size + 1)) == 2
    assert len(box.pending(100, 13 + 3 * size + 1)) == 2
    assert len(box.pending(100, 13 + 3 * size + 2)) == 3
    assert len(box.pending(4, 10**6)) == 4
    assert len(box.pending(100, 1)) == 1  # never zero: an envelope is not split
    assert [json.loads(b)["sourceSeq"] for b in box.pending(100, 10**6, through=3)] == [1, 2, 3]


def test_the_bound_drops_p1_and_p2_counted_without_a_gap_and_keeps_p0(tmp_path):
    path = tmp_path / "outbox.sqlite3"
    box = open_outbox(path, max_pending_events=3)
    assert all(phase(box) for _ in range(3))
    assert phase(box, checkpoint={"step": 4}) is None
    assert box.append("item.delta", {"text": "x"}, priority=P2) is None
    assert box.append("run.terminal", {"schema": "paperclip.prp.terminal.v1", "turnTerminalState": "completed",
                                       "runTerminalState": "succeeded", "reportedWorkDisposition": "done"},
                      priority=P0)["sourceSeq"] == 4
    assert box.dropped == {"1": 1, "2": 1}
    assert box.checkpoint == {"step": 4}  # the harness got past the dropped event
    assert [e["sourceSeq"] for e in stored(box)] == [1, 2, 3, 4]  # no seq was spent on a drop
    assert not box.pressure_cleared()
    box.ack(3)
    assert box.pressure_cleared()
    assert box.append("runner.backpressure", {"droppedEvents": 2}, priority=P0, clear_drops=True)["sourceSeq"] == 5
    assert box.dropped == {"1": 0, "2": 0}

    by_bytes = open_outbox(tmp_path / "bytes.sqlite3", max_pending_bytes=1200)
    stored_count = sum(phase(by_bytes) is not None for _ in range(10))
    assert 0 < stored_count < 10 and by_bytes.dropped == {"1": 10 - stored_count, "2": 0}
    assert by_bytes.produced_seq == stored_count


def test_a_checkpoint_is_stored_with_its_event_or_not_at_all(tmp_path):
    path = tmp_path / "outbox.sqlite3"
    box = open_outbox(path)
    phase(box, checkpoint={"step": 1})
    box.max_envelope_bytes = 600
    with pytest.raises(FrameTooLarge):
        box.append("item.started", {"text": "z" * 1000}, priority=P1, checkpoint={"step": 2})
    with pytest.raises(RuntimeError):
        with box.atomic():
            phase(box, checkpoint={"step": 3})
            raise RuntimeError("crash before the commit")
    assert (box.checkpoint, box.produced_seq) == ({"step": 1}, 1)
    box.close()
    again = open_outbox(path)
    assert (again.checkpoint, again.produced_seq) == ({"step": 1}, 1)
    assert phase(again)["sourceSeq"] == 2


def test_facts_for_the_terminal_survive_a_reopen(tmp_path):
    path = tmp_path / "outbox.sqlite3"
    box = open_outbox(path)
    box.append("run.result.proposed", {"reportedWorkDisposition": "done"}, priority=P0)
    box.append("runtime_request.created", {"request": {"requestId": "req_1"}}, priority=P0)
    terminal = {"schema": "paperclip.prp.terminal.v1"}
    box.append("run.terminal", terminal, priority=P0)
    box.append("run.terminal", terminal, priority=P0)
    box.close()
    again = open_outbox(path)
    assert again.result == {"reportedWorkDisposition": "done"}
    assert again.request_ids == ["req_1"] and again.terminal_seq == 3  # the first terminal


def test_command_results_are_stored_and_replayed(tmp_path):
    path = tmp_path / "outbox.sqlite3"
    box = open_outbox(path)
    command = {"schema": "paperclip.prp.command.v2", "commandId": "cmd_1", "controllerSeq": 2, "type": "turn.start",
               "issuedAt": "2026-08-07T12:00:00.000Z", "payload": {"text": "task"}}
    result = {"status": "succeeded", "result": {"turnId": "turn-2"}}
    with box.atomic():  # the command's effects and its result commit together
        box.append("turn.started", {}, priority=P0, turn_id="turn-2")
        box.record_command(command, result)
    assert box.command_result("cmd_missing") is None
    assert box.unreported_results() == [("cmd_1", result)]
    box.mark_reported("cmd_1")
    assert box.unreported_results() == []
    box.close()
    again = open_outbox(path)
    stored_result = again.command_result("cmd_1")
    assert stored_result["result"] == result and stored_result["reported"] is True
    assert stored_result["digest"] == contract.digest(command)  # the host's canonical form
    assert again.applied_commands() == [command] and again.applied_controller_seq == 2


WRITER = """
import sys
from prp_runner.outbox import Outbox
box = Outbox(sys.argv[1], sys.argv[2])
box.protocol_version = 2
while True:
    env = box.append("item.delta", {"text": "line " * 20}, priority=2, checkpoint={"step": box.produced_seq + 1})
    print(env["sourceSeq"], flush=True)
"""


def test_a_sigkilled_writer_loses_no_committed_event(tmp_path):
    path = tmp_path / "outbox.sqlite3"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), RUN], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True)
    committed = 0
    try:
        for line in writer.stdout:  # each line is printed after its commit returned
            committed = int(line)
            if committed >= 200:
                break
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait(10)
        writer.stdout.close()
    assert committed >= 200
    box = open_outbox(path)
    envelopes = stored(box)
    assert box.produced_seq >= committed
    assert [e["sourceSeq"] for e in envelopes] == list(range(1, box.produced_seq + 1))
    assert {e["sourceEventId"] for e in envelopes} == {f"{box.source_instance_id}-{n}"
                                                       for n in range(1, box.produced_seq + 1)}
    assert all(e["payload"] == {"text": "line " * 20} for e in envelopes)
    assert box.checkpoint == {"step": box.produced_seq}  # the checkpoint of the last committed event
    assert phase(box)["sourceSeq"] == box.produced_seq  # and the sequence continues without a gap


# --- commands: the schema and the controllerSeq (SOURCES.md) ---------------------------------------------
def _runner(box, version):
    from types import SimpleNamespace

    from prp_runner.commands import TurnControl

    return SimpleNamespace(outbox=box, control=TurnControl(), protocol_version=version, workspace="", turn_id=None,
                           emit=lambda *args, **kwargs: None)


def _cancel(seq, schema="paperclip.prp.command.v1"):
    return {"schema": schema, "commandId": f"cmd_{seq}", "controllerSeq": seq, "type": "run.cancel",
            "issuedAt": "2026-08-07T12:00:00.000Z", "payload": {"reason": "board_cancel"}}


@pytest.mark.parametrize("schema", ["paperclip.prp.command.v2", "paperclip.prp.command.v3", "bogus"])
def test_a_command_of_a_schema_not_negotiated_fails_closed(tmp_path, schema):
    """"every schema discriminator is required; an unsupported one fails closed": on a v1 run a v2 (or
    unknown) command is answered rejected and changes nothing; a v1 one applies."""
    from prp_runner.commands import CommandApplier

    box = open_outbox(tmp_path / "outbox.sqlite3", version=1)
    runner = _runner(box, 1)
    applier = CommandApplier(box, runner)
    result, stored = applier.apply(_cancel(1, schema))
    assert (result["status"], result["error"]["code"], stored) == ("rejected", "unsupported_required_schema", True)
    assert not runner.control.cancel_requested.is_set()
    result, _ = applier.apply(_cancel(2))
    assert result["status"] == "succeeded" and runner.control.cancel_requested.is_set()


def test_the_command_lane_never_applies_past_a_gap_in_controller_seq(tmp_path):
    """Commands carry a contiguous controllerSeq: #3 offered right after #1 is not applied; the lane
    polls again from #1 (and applies #2, then #3, when the host offers them)."""
    import threading
    from types import SimpleNamespace

    from prp_runner.commands import CommandApplier
    from prp_runner.delivery import CommandLane

    box = open_outbox(tmp_path / "outbox.sqlite3", version=1)
    runner = _runner(box, 1)
    runner.stopping, runner.changed = threading.Event(), threading.Event()
    runner.config = SimpleNamespace(poll_wait=0)
    runner.after_command = lambda: None
    runner.fail = lambda why: pytest.fail(why)
    offers = iter([[_cancel(1), _cancel(3)], [_cancel(2), _cancel(3)]])
    asked, posted = [], []

    class Host:
        def commands(self, after_seq, wait):
            asked.append(after_seq)
            offer = next(offers, None)
            if offer is None:
                runner.stopping.set()
            return {"commands": offer or []}

        def post_result(self, command_id, body):
            posted.append(command_id)

    lane = CommandLane(runner, CommandApplier(box, runner))
    lane.loop(Host())
    assert asked == [0, 1, 3]  # polled again from #1 after the gap, then after #3
    assert [c["controllerSeq"] for c in box.applied_commands()] == [1, 2, 3] and box.applied_controller_seq == 3
