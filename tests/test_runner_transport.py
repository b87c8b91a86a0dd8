"""The PRP transport, in process: runner credentials, hello negotiation, the event intake's
delivery rules (duplicates, conflicts, gaps, out-of-order, cumulative ACK), batch limits, a query
count constant in the batch size, and the command lane (offer order, results idempotent)."""
import json
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from issues.choices import RunEventKind, RunnerCommandStatus, RunStatus
from issues.models import AgentApiKey, BoardApiKey, HeartbeatRun, RunEvent, RunnerCommand, RunnerEvent, RunnerSession
from issues.models.agent import hash_key
from issues.runner.commands import command_issue
from issues.services.companies import agent_api_key_create
from issues.services.runs import run_finish
from tests.factories import MembershipFactory
from tests.runner_helpers import (
    capabilities,
    envelope,
    envelopes,
    hello_body,
    post_events,
    runner_client,
    runner_run,
    runner_url,
    say_hello,
    source_key,
)
from tests.test_errors import assert_error

pytestmark = pytest.mark.django_db
SRC = source_key()


@pytest.fixture
def rk():
    return runner_run()


@pytest.fixture
def client(rk):
    return runner_client(rk[1])


@pytest.fixture
def run(rk):
    return rk[0]


@pytest.fixture
def ready(client, run):
    """A run whose runner said hello with 1..1 (v1 selected; the helpers' envelopes are v1)."""
    say_hello(client, run, 1, 1)
    return run


def stored_ids(run):
    return list(RunnerEvent.objects.filter(run=run).order_by("position").values_list("source_event_id", flat=True))


# --- credentials ------------------------------------------------------------------------------
def test_no_credential_is_401(run):
    response = APIClient().post(runner_url(run, "hello"), hello_body(), format="json")
    assert_error(response, 401, "unauthorized")
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_unknown_key_is_401(run):
    assert_error(runner_client("pcp_nope").post(runner_url(run, "hello"), hello_body(), format="json"), 401)


def test_board_session_is_not_a_runner_credential(run):
    user = MembershipFactory(company=run.company, role="owner").user
    client = APIClient()
    client.force_login(user)
    assert_error(client.post(runner_url(run, "hello"), hello_body(), format="json"), 401, "unauthorized")


def test_board_key_is_403(run):
    user = MembershipFactory(company=run.company, role="owner").user
    raw = "pcp_board_" + "x" * 40
    BoardApiKey.objects.create(user=user, name="k", prefix=raw[:16], key_hash=hash_key(raw))
    response = runner_client(raw).post(runner_url(run, "hello"), hello_body(), format="json")
    assert_error(response, 403, "runner_key_required")


def test_long_lived_agent_key_is_403(run):
    _, raw = agent_api_key_create(agent=run.agent)
    assert_error(runner_client(raw).post(runner_url(run, "hello"), hello_body(), format="json"),
                 403, "runner_key_required")


def test_another_runs_key_and_another_companys_run_are_404(run, client):
    sibling, sibling_key = runner_run(agent=run.agent)
    assert_error(runner_client(sibling_key).post(runner_url(run, "hello"), hello_body(), format="json"), 404,
                 "not_found")
    foreign, _ = runner_run()
    assert_error(client.post(runner_url(foreign, "hello"), hello_body(), format="json"), 404, "not_found")
    assert_error(client.get(runner_url(foreign, "commands")), 404, "not_found")
    assert not RunnerSession.objects.filter(pk__in=[foreign.pk, run.pk]).exists()


def test_key_revoked_while_the_run_lives_is_401(run, client):
    AgentApiKey.objects.filter(run=run).update(revoked_at=timezone.now())
    assert_error(client.post(runner_url(run, "hello"), hello_body(), format="json"), 401)


def test_ended_run_grace_allows_reacks_and_results_only(ready, client):
    run = ready
    body = post_events(client, run, envelopes(1, 2, run=run, event_type="runtime.phase.changed")).json()
    session = RunnerSession.objects.get(pk=run.pk)
    command = command_issue(session=session, command_type="run.cancel")
    run_finish(run=run, status=RunStatus.CANCELLED)
    assert AgentApiKey.objects.get(run=run).revoked_at is not None
    # The lost ACK of the last batch: the same batch again is re-acknowledged, no effect.
    again = post_events(client, run, envelopes(1, 2, run=run))
    assert again.status_code == 200 and again.json()["ackedSourceSeq"] == body["ackedSourceSeq"] == 2
    assert again.json()["duplicates"] == [f"runner_test-{i}" for i in (1, 2)]
    # New events, hello, commands: the run has ended.
    assert_error(post_events(client, run, envelopes(3, 3, run=run)), 409, "run_not_live")
    assert_error(client.post(runner_url(run, "hello"), hello_body(), format="json"), 409, "run_not_live")
    assert_error(client.get(runner_url(run, "commands")), 409, "run_not_live")
    # The cancel's confirmation arriving after the end is still stored.
    result = client.post(runner_url(run, f"commands/{command.command_id}/result"), {"status": "succeeded"},
                         format="json")
    assert result.status_code == 200, result.content
    assert stored_ids(run) == ["runner_test-1", "runner_test-2"]
    # After the grace window the revoked key is just revoked.
    HeartbeatRun.objects.filter(pk=run.pk).update(finished_at=timezone.now() - timedelta(seconds=601))
    assert_error(post_events(client, run, envelopes(1, 2, run=run)), 401)


def test_key_revoked_before_the_run_ended_gets_no_grace(ready, client):
    AgentApiKey.objects.filter(run=ready).update(revoked_at=timezone.now() - timedelta(seconds=5))
    run_finish(run=ready, status=RunStatus.SUCCEEDED)
    assert_error(post_events(client, ready, envelopes(1, 1, run=ready)), 401)


# --- hello ------------------------------------------------------------------------------------
@pytest.mark.parametrize("low, high, version, expected", [
    (1, 1, 1, 1), (1, 2, 2, 2), (2, 2, 2, 2), (1, 3, 2, 2), (1, 2, 1, 1),
])
def test_hello_selects_the_highest_mutual_version(client, run, low, high, version, expected):
    identity = {"normalizedSessionId": "s1", "driverSessionId": "d1"}
    body = say_hello(client, run, low, high, caps=capabilities(version), identity=identity)
    assert body["protocolVersion"] == expected
    assert body["supportedVersions"] == [1, 2]
    assert body["limits"] == {"maxBatchEvents": 100, "maxBatchBytes": 1024 * 1024}  # what a runner splits by
    # The run's first commands are durable as soon as the version is selected.
    assert body["sources"] == {} and body["controllerSeq"] == 3
    assert list(RunnerCommand.objects.filter(run=run).values_list("controller_seq", "command_type")) == [
        (1, "run.prepare"), (2, "session.open"), (3, "turn.start")]
    assert body["capabilities"] == capabilities(version)
    session = RunnerSession.objects.get(pk=run.pk)
    assert (session.protocol_min, session.protocol_max, session.protocol_version) == (low, high, expected)
    assert session.capabilities == capabilities(version) and session.identity == identity
    assert session.runner_instance_id == "runner_test" and session.hello_at and session.refusal == {}
    assert RunEvent.objects.filter(run=run, kind=RunEventKind.SYSTEM, message__contains=f"v{expected}").exists()


def test_hello_refuses_an_offer_without_a_supported_version(client, run):
    response = client.post(runner_url(run, "hello"), hello_body(3, 4, caps=capabilities(2)), format="json")
    error = assert_error(response, 400, "unsupported_required_version")
    assert error["details"]["supported"] == [1, 2]
    assert error["details"]["value"] == {"protocolMin": 3, "protocolMax": 4}
    assert "protocolMin" in error["details"]["field"] and "protocolMax" in error["details"]["field"]
    session = RunnerSession.objects.get(pk=run.pk)
    assert session.refusal["code"] == "unsupported_required_version" and session.protocol_version is None
    assert RunEvent.objects.filter(run=run, message__contains="refused").exists()


def test_hello_refuses_bad_capabilities_with_their_json_path(client, run):
    caps = capabilities(2)
    del caps["sessionGoals"]  # every v2 snapshot carries sessionGoals
    error = assert_error(client.post(runner_url(run, "hello"), hello_body(1, 2, caps=caps), format="json"), 400,
                         fields=["capabilities"])
    assert error["details"]["path"].startswith("$.capabilities")
    assert RunnerSession.objects.get(pk=run.pk).refusal["details"]["path"].startswith("$.capabilities")
    caps = capabilities(1)
    del caps["driver"]
    error = assert_error(client.post(runner_url(run, "hello"), hello_body(1, 1, caps=caps), format="json"), 400)
    assert error["details"]["path"].startswith("$.capabilities")


def test_hello_body_shape_is_checked(client, run):
    assert_error(client.post(runner_url(run, "hello"), {"protocolMin": "1", "protocolMax": 0}, format="json"), 400,
                 "validation_error", fields=["protocolMin", "protocolMax", "runnerInstanceId", "capabilities"])
    assert_error(client.post(runner_url(run, "hello"), hello_body(2, 1), format="json"), 400, fields=["protocolMax"])


def test_repeated_hello_answers_cursors_and_keeps_the_version_once_events_exist(client, run):
    say_hello(client, run)
    assert say_hello(client, run, 1, 1)["protocolVersion"] == 1  # no events yet: renegotiation is fine
    post_events(client, run, envelopes(1, 3, run=run))
    body = say_hello(client, run, 1, 1)
    assert body["sources"] == {SRC: 3}
    error = assert_error(client.post(runner_url(run, "hello"), hello_body(1, 2), format="json"), 409,
                         "protocol_version_locked")
    assert error["details"] == {"protocolVersion": 1, "selected": 2, "eventCount": 3}
    assert RunnerSession.objects.get(pk=run.pk).protocol_version == 1


def test_hello_starts_a_queued_run(rk):
    run, key = runner_run(status="queued")
    say_hello(runner_client(key), run)
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and run.started_at


# --- events -----------------------------------------------------------------------------------
def test_events_need_hello_first(client, run):
    assert_error(post_events(client, run, envelopes(1, 1, run=run)), 409, "hello_required")


def test_a_batch_is_committed_logged_and_acknowledged(ready, client):
    run = ready
    before = timezone.now()
    response = post_events(client, run, envelopes(1, 3, run=run))
    assert response.status_code == 200, response.content
    assert response.json() == {"ackedSourceSeq": 3, "acks": {SRC: 3}, "accepted": 3, "duplicates": []}
    rows = list(RunnerEvent.objects.filter(run=run).order_by("position"))
    assert [(r.position, r.source_seq, r.source_key) for r in rows] == [(1, 1, SRC), (2, 2, SRC), (3, 3, SRC)]
    assert rows[0].envelope == envelope(1, run=run)
    log = list(RunEvent.objects.filter(run=run, kind=RunEventKind.RUNNER).order_by("seq"))
    assert [e.data for e in log] == [{"sourceKey": SRC, "sourceEventId": f"runner_test-{i}", "sourceSeq": i,
                                      "eventType": "runtime.phase.changed"} for i in (1, 2, 3)]
    assert log[0].message == f"runtime.phase.changed ({SRC} #1)"
    run.refresh_from_db()
    assert run.last_activity_at >= before and run.last_heartbeat_at >= before
    assert run.event_seq == RunEvent.objects.filter(run=run).count()
    assert RunnerSession.objects.get(pk=run.pk).event_count == 3


def test_the_run_log_line_carries_the_events_first_words(ready, client):
    line = {"kind": "log", "stream": "stderr", "text": "scripted   harness\nfailure " + "x" * 400}
    post_events(client, ready, [envelope(1, "item.delta", line, run=ready, itemId="log-stderr")])
    [entry] = RunEvent.objects.filter(run=ready, kind=RunEventKind.RUNNER)
    assert entry.message.startswith(f"item.delta ({SRC} #1): scripted harness failure xxx")
    assert len(entry.message) <= 300


def test_duplicates_are_reacknowledged_without_a_second_effect(ready, client):
    post_events(client, ready, envelopes(1, 3, run=ready))
    body = post_events(client, ready, envelopes(1, 4, run=ready)).json()
    assert body["accepted"] == 1 and body["ackedSourceSeq"] == 4
    assert body["duplicates"] == ["runner_test-1", "runner_test-2", "runner_test-3"]
    twice = envelope(5, run=ready)
    body = post_events(client, ready, [twice, twice]).json()
    assert body["accepted"] == 1 and body["duplicates"] == ["runner_test-5"]
    assert RunnerEvent.objects.filter(run=ready).count() == 5
    assert RunEvent.objects.filter(run=ready, kind=RunEventKind.RUNNER).count() == 5


def test_a_byte_different_duplicate_is_409_and_nothing_of_the_batch_is_stored(ready, client):
    post_events(client, ready, envelopes(1, 2, run=ready))
    changed = envelope(2, run=ready, priority=0)
    error = assert_error(post_events(client, ready, [envelope(3, run=ready), changed]), 409,
                         "event_conflict", fields=["events[1]"])
    assert error["details"]["sourceEventId"] == "runner_test-2"
    assert stored_ids(ready) == ["runner_test-1", "runner_test-2"]
    # Inside one batch too.
    assert_error(post_events(client, ready, [envelope(3, run=ready),
                                             envelope(3, run=ready, priority=2)]), 409, "event_conflict")
    assert stored_ids(ready) == ["runner_test-1", "runner_test-2"]


def test_a_duplicate_whose_numbers_are_written_another_way_is_still_the_same_event(ready, client):
    """SOURCES.md: a repeat must be byte-identical in canonical JSON, where a whole number has one form
    (RFC 8785: ``1.0`` and ``1e2`` are ``1`` and ``100``): a runner whose serialiser writes it
    differently on a retry is acknowledged, not refused; another value is still a conflict."""
    first = envelope(1, "sandbox.metric", {"cpu": 1.0, "memory": 1e2, "load": 0.5}, run=ready)
    assert post_events(client, ready, [first]).json()["accepted"] == 1
    raw = json.dumps({"events": [first]}).replace('"cpu": 1.0', '"cpu": 1').replace('"memory": 100.0', '"memory": 100')
    assert '"cpu": 1,' in raw and '"memory": 100,' in raw
    again = client.generic("POST", runner_url(ready, "events"), raw, content_type="application/json")
    assert again.status_code == 200 and again.json()["duplicates"] == [first["sourceEventId"]], again.content
    other = json.dumps({"events": [first]}).replace('"load": 0.5', '"load": 0.25')
    assert_error(client.generic("POST", runner_url(ready, "events"), other, content_type="application/json"), 409,
                 "event_conflict")
    assert RunnerEvent.objects.filter(run=ready).count() == 1


def test_a_new_id_behind_the_cursor_is_a_sequence_conflict(ready, client):
    post_events(client, ready, envelopes(1, 3, run=ready))
    error = assert_error(post_events(client, ready, [envelope(2, run=ready, event_id="other")]), 409,
                         "sequence_conflict")
    assert error["details"]["ackedSourceSeq"] == 3
    assert RunnerEvent.objects.filter(run=ready).count() == 3


def test_a_forward_gap_is_not_acknowledged_past_and_is_repaired(ready, client):
    body = post_events(client, ready, [envelope(s, run=ready) for s in (1, 3, 4)]).json()
    assert body["ackedSourceSeq"] == 1 and body["accepted"] == 1
    assert body["expected"] == {SRC: 2}
    assert body["gaps"] == [{"sourceKey": SRC, "expectedSeq": 2, "heldSeqs": [3, 4],
                             "sourceEventIds": ["runner_test-3", "runner_test-4"]}]
    assert stored_ids(ready) == ["runner_test-1"]
    body = post_events(client, ready, envelopes(2, 4, run=ready)).json()
    assert body == {"ackedSourceSeq": 4, "acks": {SRC: 4}, "accepted": 3, "duplicates": []}


def test_out_of_order_inside_a_batch_is_accepted_in_sequence_order(ready, client):
    body = post_events(client, ready, [envelope(s, run=ready) for s in (3, 1, 2)]).json()
    assert body["ackedSourceSeq"] == 3 and body["accepted"] == 3 and "gaps" not in body
    assert stored_ids(ready) == ["runner_test-1", "runner_test-2", "runner_test-3"]


def test_the_ack_never_moves_backwards(ready, client):
    post_events(client, ready, envelopes(1, 5, run=ready))
    body = post_events(client, ready, envelopes(1, 2, run=ready)).json()
    assert body["ackedSourceSeq"] == 5 and body["accepted"] == 0


def test_sources_have_cursors_of_their_own(ready, client):
    batch = [envelope(1, run=ready), envelope(1, run=ready, source_instance_id="cred"),
             envelope(2, run=ready, source_instance_id="cred")]
    body = post_events(client, ready, batch).json()
    assert body["ackedSourceSeq"] == 1 and body["acks"] == {SRC: 1, "runner:cred": 2}
    assert say_hello(client, ready, 1, 1)["sources"] == {SRC: 1, "runner:cred": 2}


def test_an_envelope_for_another_run_is_refused(ready, client):
    error = assert_error(post_events(client, ready, [envelope(1, run="run_other")]), 400, "run_mismatch",
                         fields=["events[0]"])
    assert error["details"]["path"] == "$.events[0].runId"


def test_an_invalid_envelope_rejects_the_whole_batch_with_its_path(ready, client):
    bad = envelope(3, run=ready, priority=7)  # priority is 0, 1 or 2
    batch = envelopes(1, 2, run=ready) + [bad]
    error = assert_error(post_events(client, ready, batch), 400, "schema_invalid", fields=["events[2]"])
    assert error["details"]["path"] == error["details"]["field"] == "$.events[2].priority"
    assert error["details"]["event"] == 2
    closed = envelope(1, run=ready, sourceEpochTransition={"schema": "paperclip.prp.event-epoch.v1", "x": 1})
    error = assert_error(post_events(client, ready, [closed]), 400, "schema_invalid")
    assert error["details"]["path"].startswith("$.events[0].sourceEpochTransition")
    wrong_version = envelope(1, run=ready, version=2)  # v1 was negotiated
    assert_error(post_events(client, ready, [wrong_version]), 400)
    assert RunnerEvent.objects.filter(run=ready).count() == 0


def test_batch_count_and_body_size_limits(ready, client, settings, monkeypatch):
    error = assert_error(post_events(client, ready, envelopes(1, 101, run=ready)), 413, "batch_too_large")
    assert error["details"] == {"maxEvents": 100, "events": 101}
    assert_error(post_events(client, ready, []), 400, fields=["events"])
    big = envelope(1, run=ready, debug={"blob": "x" * (1024 * 1024)})
    error = assert_error(post_events(client, ready, [big]), 413, "payload_too_large")
    assert error["details"]["maxBytes"] == 1024 * 1024
    monkeypatch.setitem(settings.PAPERCLIP, "RUNNER_MAX_BATCH", 2)
    assert_error(post_events(client, ready, envelopes(1, 3, run=ready)), 413, "batch_too_large")
    assert RunnerEvent.objects.filter(run=ready).count() == 0


def test_queries_per_batch_are_constant_in_the_batch_size(ready, client):
    post_events(client, ready, envelopes(1, 1, run=ready))  # warm: key last_used_at, source row
    counts, seq = {}, 2
    for size in (1, 10, 100):
        with CaptureQueriesContext(connection) as queries:
            response = post_events(client, ready, envelopes(seq, seq + size - 1, run=ready))
        assert response.status_code == 200 and response.json()["accepted"] == size
        counts[size], seq = len(queries), seq + size
    assert counts[1] == counts[10] == counts[100], counts
    assert counts[1] <= 40, counts  # 13 statements today (savepoints included); projections add a constant


# --- commands ---------------------------------------------------------------------------------
def issue(run, command_type="turn.interrupt", **payload):
    session = RunnerSession.objects.get_or_create(run=run, defaults={"company_id": run.company_id})[0]
    return command_issue(session=session, command_type=command_type, payload=payload)


def test_commands_need_hello(client, run):
    assert_error(client.get(runner_url(run, "commands")), 409, "hello_required")


def test_commands_are_offered_in_order_rendered_for_the_negotiated_version(client, run):
    early = issue(run, "turn.interrupt")  # before hello: stored as v1
    assert early.envelope["schema"] == "paperclip.prp.command.v1"
    say_hello(client, run)
    later = [issue(run, "run.cancel", reason=f"r{i}") for i in range(2)]
    body = client.get(runner_url(run, "commands"), {"afterSeq": 0, "wait": 0}).json()
    assert [c["controllerSeq"] for c in body["commands"]] == [1, 2, 3] and body["controllerSeq"] == 3
    assert {c["schema"] for c in body["commands"]} == {"paperclip.prp.command.v2"}
    assert [c["commandId"] for c in body["commands"]] == [early.command_id] + [c.command_id for c in later]
    assert set(RunnerCommand.objects.filter(run=run).values_list("status", flat=True)) == {"delivered"}
    assert all(RunnerCommand.objects.filter(run=run).values_list("delivered_at", flat=True))
    body = client.get(runner_url(run, "commands"), {"afterSeq": 2}).json()
    assert [c["controllerSeq"] for c in body["commands"]] == [3]


def test_an_empty_long_poll_is_bounded(ready, client, settings, monkeypatch):
    monkeypatch.setitem(settings.PAPERCLIP, "RUNNER_COMMAND_WAIT_SECONDS", 0.05)
    monkeypatch.setitem(settings.PAPERCLIP, "RUNNER_COMMAND_POLL_SECONDS", 0.01)
    started = timezone.now()
    body = client.get(runner_url(ready, "commands"), {"afterSeq": 3, "wait": 3600}).json()
    assert body == {"commands": [], "controllerSeq": 3}  # the three initial commands are behind afterSeq
    assert timezone.now() - started < timedelta(seconds=5)
    assert_error(client.get(runner_url(ready, "commands"), {"afterSeq": -1, "wait": "x"}), 400,
                 fields=["afterSeq", "wait"])


def test_command_results_are_idempotent_and_conflicts_rejected(ready, client):
    command = issue(ready, "turn.interrupt")
    url = runner_url(ready, f"commands/{command.command_id}/result")
    body = {"status": "succeeded", "result": {"interrupted": True}}
    first = client.post(url, body, format="json")
    assert first.status_code == 200, first.content
    assert first.json()["status"] == "succeeded" and first.json()["duplicate"] is False
    command.refresh_from_db()
    assert command.status == RunnerCommandStatus.SUCCEEDED and command.result == body and command.result_digest
    stored_at = command.result_at
    again = client.post(url, body, format="json")
    assert again.status_code == 200 and again.json()["duplicate"] is True
    assert again.json()["result"] == body
    command.refresh_from_db()
    assert command.result_at == stored_at
    assert_error(client.post(url, {"status": "failed", "error": {"message": "no"}}, format="json"), 409,
                 "command_result_conflict")
    assert_error(client.post(runner_url(ready, "commands/cmd_unknown/result"), body, format="json"), 404)
    assert_error(client.post(url, {"status": "done"}, format="json"), 400, fields=["status"])
    results = RunEvent.objects.filter(run=ready, message__startswith="runner command result")
    assert results.count() == 1


def test_another_runs_command_is_404(ready, client):
    other, other_key = runner_run()
    say_hello(runner_client(other_key), other)
    command = issue(other, "turn.interrupt")
    assert_error(client.post(runner_url(ready, f"commands/{command.command_id}/result"), {"status": "succeeded"},
                             format="json"), 404)
    assert RunnerCommand.objects.get(pk=command.pk).result is None


# Every runner route, against another company's run that has said hello, events and a command:
# the caller's own run key gets a 404 and changes nothing. The route list is read from the URL
# resolver, so a new runner route without a case here fails (tests/test_cross_company.py leaves
# runner-* routes to this test: they take run keys, not the agent and board actors it swaps).
RUNNER_ROUTE_CASES = {
    ("runner-hello", "POST"): lambda foreign, command: ("hello", hello_body()),
    ("runner-events", "POST"): lambda foreign, command: ("events", {"events": [envelope(2, run=foreign)]}),
    ("runner-commands", "GET"): lambda foreign, command: ("commands?afterSeq=0&wait=0", None),
    ("runner-command-result", "POST"): lambda foreign, command: (
        f"commands/{command.command_id}/result", {"status": "succeeded", "result": {}}),
}


def test_every_runner_route_is_404_for_another_companys_run(run, client):
    from tests.test_cross_company import api_routes

    # runner-attach names no run (the agent's own key asks for its next run; another company's run
    # is never offered: tests/test_prp_adapter.py).
    assert {r for r in api_routes() if (r[0] or "").startswith("runner-") and r[0] != "runner-attach"} == set(
        RUNNER_ROUTE_CASES)
    foreign, foreign_key = runner_run()
    foreign_client = runner_client(foreign_key)
    say_hello(foreign_client, foreign, 1, 1)
    assert foreign_client.post(runner_url(foreign, "events"), {"events": [envelope(1, run=foreign)]},
                               format="json").status_code == 200
    command = RunnerCommand.objects.filter(run=foreign).order_by("controller_seq").first()
    before = (RunnerEvent.objects.filter(run=foreign).count(),
              RunnerSession.objects.values_list("hello_at", "event_count").get(pk=foreign.pk),
              list(RunnerCommand.objects.filter(run=foreign).values_list("status", "result")))
    for (name, method), case in RUNNER_ROUTE_CASES.items():
        suffix, body = case(foreign, command)
        url = runner_url(foreign, suffix)
        response = client.get(url) if method == "GET" else client.post(url, body, format="json")
        assert_error(response, 404, "not_found")
    after = (RunnerEvent.objects.filter(run=foreign).count(),
             RunnerSession.objects.values_list("hello_at", "event_count").get(pk=foreign.pk),
             list(RunnerCommand.objects.filter(run=foreign).values_list("status", "result")))
    assert after == before


def test_hello_answers_the_configured_batch_limits(client, run, settings):
    settings.PAPERCLIP = {**settings.PAPERCLIP, "RUNNER_MAX_BATCH": 7, "RUNNER_MAX_BATCH_BYTES": 4096}
    assert say_hello(client, run, 1, 1)["limits"] == {"maxBatchEvents": 7, "maxBatchBytes": 4096}
    too_many = post_events(client, run, envelopes(1, 8, run=run))
    assert_error(too_many, 413, "batch_too_large")



def test_unstorable_text_in_a_result_or_a_hello_is_a_400_not_a_500(ready, client):
    """A lone surrogate parses as JSON but cannot be stored (PostgreSQL's jsonb refuses it)."""
    command = issue(ready, "turn.interrupt")
    url = runner_url(ready, f"commands/{command.command_id}/result")
    bad = '{"status": "succeeded", "result": {"note": "\\ud800"}}'
    error = assert_error(client.post(url, bad, content_type="application/json"), 400, "schema_invalid")
    assert error["details"]["field"] == "$.result.note"
    command.refresh_from_db()
    assert not command.result_digest and command.result is None
    hello = json.dumps(hello_body(1, 1, identity={"normalizedSessionId": "s1"})).replace('"s1"', '"\\ud800"')
    error = assert_error(client.post(runner_url(ready, "hello"), hello, content_type="application/json"), 400,
                         "schema_invalid")
    assert error["details"]["field"] == "$.identity.normalizedSessionId"
