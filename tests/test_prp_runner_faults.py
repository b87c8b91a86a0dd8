"""Fault tests of the reference runner (issue #18) with real processes: ``python -m prp_runner``
playing a fake-harness script against the host's web process (``manage.py runserver`` on this
test's database) through a loopback proxy. The runner is SIGKILLed mid-stream and restarted; the
web process is SIGKILLed between committing a batch and answering it, then restarted; the network
is down while the harness keeps producing past a small outbox bound. Each time every event the
runner kept reaches the host exactly once and in order, and the run ends as its script says."""
from __future__ import annotations

import pytest

from issues.models import HeartbeatRun, RunnerEvent
from tests.prp_fault_helpers import (FaultRig, acked_seq, assert_one_ordered_stream, assert_script_delivered_once,
                                     emitted_at, finish_steps, item_events, item_stream, prp_run, step_payload,
                                     write_script)
from tests.test_celery_topology import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

RUNNER_EXIT_TIMEOUT = 120


@pytest.fixture
def rig(transactional_db, tmp_path):
    rig = FaultRig(tmp_path)
    try:
        yield rig
    finally:
        rig.close()


def run_status(run) -> str:
    return HeartbeatRun.objects.get(pk=run.pk).status


def deltas_on_host(run) -> int:
    return RunnerEvent.objects.filter(run=run, event_type="item.delta").count()


def test_a_runner_killed_mid_stream_resumes_and_delivers_every_event_once_in_order(rig, tmp_path):
    run, key = prp_run()
    steps = item_stream(300, delay_ms=10) + finish_steps()
    runner = rig.runner(run, key, write_script(tmp_path, "stream", steps))

    runner.start()
    wait_for(lambda: acked_seq(run) >= 60, timeout=60, what="the host to acknowledge part of the stream",
             logs=rig.dump)
    runner.kill()
    wait_for(lambda: rig.proxy.events_in_flight() == 0, timeout=30,
             what="the killed runner's last batch to be committed or dropped", logs=rig.dump)
    cursor = acked_seq(run)
    assert deltas_on_host(run) < 300 and not RunnerEvent.objects.filter(run=run, event_type="run.terminal").exists()
    assert runner.outbox.exists()  # what was produced but not acknowledged is still there
    restarted_at = len(rig.proxy.delivered)

    runner.start()
    assert runner.wait(timeout=RUNNER_EXIT_TIMEOUT, logs=rig.dump) == 0, rig.dump()

    assert_script_delivered_once(run, steps)
    assert run_status(run) == "succeeded"
    acks = rig.proxy.acks_seen()
    assert acks == sorted(acks), f"an ACK went backwards: {acks}"
    # The restarted runner resumed from the host's cursor: its first batch is the next event, and
    # nothing the host had was sent again.
    resumed = rig.proxy.events_exchanges(restarted_at)
    assert resumed[0].first_seq == cursor + 1, rig.dump()
    assert all(not x.body["duplicates"] for x in resumed)
    assert not runner.outbox.exists()  # a clean end removes the outbox


def test_a_web_process_killed_between_commit_and_answer_gets_the_batch_again_as_a_duplicate(rig, tmp_path):
    run, key = prp_run()
    steps = item_stream(300, delay_ms=5) + finish_steps()
    runner = rig.runner(run, key, write_script(tmp_path, "stream", steps))

    runner.start()
    wait_for(lambda: acked_seq(run) >= 20, timeout=60, what="the first batches to be acknowledged", logs=rig.dump)
    rig.proxy.arm_kill(rig.server.kill)
    wait_for(rig.proxy.tripped.is_set, timeout=60, what="a committed batch to be held back", logs=rig.dump)
    lost = rig.proxy.swallowed
    assert not rig.server.alive()
    assert lost.body["accepted"] > 0
    committed = set(RunnerEvent.objects.filter(run=run).values_list("source_event_id", flat=True))
    assert set(lost.event_ids) <= committed  # committed, never answered
    assert acked_seq(run) == lost.body["ackedSourceSeq"]
    wait_for(lambda: rig.proxy.refused >= 1, timeout=30, what="the runner to retry against the dead host",
             logs=rig.dump)
    after_kill = len(rig.proxy.delivered)

    rig.server.start()  # the same port
    assert runner.wait(timeout=RUNNER_EXIT_TIMEOUT, logs=rig.dump) == 0, rig.dump()

    resent = rig.proxy.events_exchanges(after_kill)[0]
    assert set(lost.event_ids) <= set(resent.event_ids), "the runner did not resend the unanswered batch"
    assert set(lost.event_ids) <= set(resent.body["duplicates"]), resent.body
    assert resent.body["ackedSourceSeq"] >= lost.body["ackedSourceSeq"]
    assert_script_delivered_once(run, steps)  # no second effect: one row and one log line per event
    assert run_status(run) == "succeeded"


def test_a_network_outage_buffers_within_the_bound_never_drops_p0_and_drains(rig, tmp_path):
    bound, burst = 50, 150
    run, key = prp_run()
    # The burst starts after the host acknowledged item.started: by then the link is down.
    steps = item_stream(burst, item_id="item_burst", lead_ms=500) + finish_steps()
    runner = rig.runner(run, key, write_script(tmp_path, "burst", steps), "--max-pending-events", str(bound))

    def started_acked(x) -> bool:
        seqs = [e["sourceSeq"] for e in x.request["events"] if e["eventType"] == "item.started"]
        return bool(seqs) and x.status == 200 and x.body["ackedSourceSeq"] >= seqs[0]

    rig.proxy.outage_after(lambda x: x.is_events and started_acked(x), seconds=4)
    runner.start()
    assert runner.wait(timeout=RUNNER_EXIT_TIMEOUT, logs=rig.dump) == 0, rig.dump()

    [outage] = rig.proxy.outages
    assert outage.up_at is not None
    rows = assert_one_ordered_stream(run)
    assert run_status(run) == "succeeded"

    # P0 is never dropped: the result and the terminal were produced during the outage and arrived.
    results = [r for r in rows if r.event_type == "run.result.proposed"]
    terminals = [r for r in rows if r.event_type == "run.terminal"]
    assert [r.envelope["payload"] for r in results] == [step_payload(steps, "result")]
    assert [r.envelope["payload"] for r in terminals] == [step_payload(steps, "terminal")]
    for row in results + terminals:
        assert outage.down_at - 0.001 <= emitted_at(row) <= outage.up_at, rig.dump()

    # P1/P2 beyond the bound were dropped, never reordered; those kept stayed within the bound.
    expected = item_events(steps)
    got = [(r.event_type, r.envelope.get("itemId"), r.envelope["payload"]) for r in rows
           if r.event_type.startswith("item.")]
    assert len(got) < len(expected), "nothing was dropped: the outage did not put the outbox under pressure"
    kept = iter(expected)
    assert all(event in kept for event in got), "the events kept are not in script order"
    buffered = [r for r in rows if r.source_seq > outage.acked_before and r.envelope["priority"] != 0
                and emitted_at(r) <= outage.up_at]
    assert len(buffered) <= bound, (len(buffered), bound)

    # The drops were counted and reported once, as P0, ahead of the terminal (the host takes
    # nothing after the terminal of a run).
    [report] = backpressure_reports(rows)
    assert report.envelope["priority"] == 0 and report.position < terminals[0].position, report.envelope
    dropped = report.envelope["payload"]
    assert dropped["droppedEvents"] == len(expected) - len(got) == sum(dropped["droppedByPriority"].values()), dropped


def backpressure_reports(rows):
    """PRP v1 has ``runner.backpressure``; v2 has no such event type: there the runner reports the
    drops as a ``runner.diagnostic`` with code ``backpressure``."""
    return [r for r in rows if r.event_type == "runner.backpressure"
            or (r.event_type == "runner.diagnostic" and r.envelope["payload"].get("code") == "backpressure")]
