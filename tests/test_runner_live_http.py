"""The PRP transport over real HTTP (pytest-django's live server, httpx on loopback): a runner's
conversation with duplicates, a byte-different duplicate, a gap and its repair, out-of-order
redelivery, a lost ACK (the response dropped on the way back by a proxy: the runner resends, one
effect), credentials, negotiation, limits, and the command lane's long-poll and results."""
import json
import socket
import threading

import httpx
import pytest

from issues.models import BoardApiKey, RunEvent, RunnerCommand, RunnerEvent, RunnerSession
from issues.models.agent import hash_key
from issues.runner.commands import command_issue
from tests.factories import MembershipFactory
from tests.runner_helpers import capabilities, envelope, envelopes, hello_body, runner_run, source_key

pytestmark = pytest.mark.django_db(transaction=True)
SRC = source_key()


def http(live_server, key=None, *, origin=None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=f"{origin or live_server.url}/api/runner/v1", headers=headers, timeout=30)


def error(response, status, code=None) -> dict:
    assert response.status_code == status, (response.status_code, response.text[:600])
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error", "code", "details"}, body
    if code:
        assert body["code"] == code, body
    return body


def ids(run):
    return list(RunnerEvent.objects.filter(run=run).order_by("position").values_list("source_event_id", flat=True))


class LossyProxy:
    """Forwards one HTTP request to the server, reads the server's whole response, then closes
    the client's connection without a byte of it: the commit happened, the ACK is lost."""

    def __init__(self, target_url: str):
        host, port = target_url.removeprefix("http://").split(":")
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.swallowed = b""
        self.thread = threading.Thread(target=self._serve_one, daemon=True)
        self.thread.start()

    @staticmethod
    def _read_message(sock) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(body) < length:
            body += sock.recv(65536)
        return head + b"\r\n\r\n" + body

    def _serve_one(self):
        conn, _ = self.listener.accept()
        with conn, socket.create_connection(self.target) as upstream:
            upstream.sendall(self._read_message(conn))
            self.swallowed = self._read_message(upstream)
        self.listener.close()


def test_a_runner_conversation_over_http(live_server):
    run, key = runner_run()
    with http(live_server, key) as client:
        hello = client.post(f"/runs/{run.pk}/hello", json=hello_body(1, 3, identity={"normalizedSessionId": "s"}))
        assert hello.status_code == 200, hello.text
        assert hello.json() == {"protocolVersion": 2, "capabilities": capabilities(2), "sources": {},
                                "controllerSeq": 3, "supportedVersions": [1, 2],  # 3 initial commands
                                "limits": {"maxBatchEvents": 100, "maxBatchBytes": 1024 * 1024}}

        def post(batch):
            return client.post(f"/runs/{run.pk}/events", json={"events": batch})

        first = post(envelopes(1, 3, run=run, version=2))
        assert first.json() == {"ackedSourceSeq": 3, "acks": {SRC: 3}, "accepted": 3, "duplicates": []}
        # Duplicates beside a new event: re-acknowledged, one new effect.
        body = post(envelopes(2, 4, run=run, version=2)).json()
        assert (body["ackedSourceSeq"], body["accepted"], body["duplicates"]) == (4, 1, ["runner_test-2",
                                                                                          "runner_test-3"])
        # A byte-different duplicate: 409, nothing of its batch stored.
        changed = envelope(4, run=run, version=2, payload={"phase": "running"})
        conflict = error(post([envelope(5, run=run, version=2), changed]), 409, "event_conflict")
        assert conflict["details"]["sourceEventId"] == "runner_test-4"
        assert ids(run) == [f"runner_test-{i}" for i in range(1, 5)]
        # A gap: 7 and 8 without 5 and 6 are not acknowledged past 4.
        body = post(envelopes(7, 8, run=run, version=2)).json()
        assert body["ackedSourceSeq"] == 4 and body["expected"] == {SRC: 5} and body["accepted"] == 0
        assert body["gaps"][0]["heldSeqs"] == [7, 8]
        # The repair arrives out of order, with a redelivery of the held events.
        body = post([envelope(s, run=run, version=2) for s in (8, 6, 7, 5)]).json()
        assert body == {"ackedSourceSeq": 8, "acks": {SRC: 8}, "accepted": 4, "duplicates": []}
        assert ids(run) == [f"runner_test-{i}" for i in range(1, 9)]
        # A restarted runner says hello again and resumes from its cursor.
        again = client.post(f"/runs/{run.pk}/hello", json=hello_body(1, 2))
        assert again.json()["sources"] == {SRC: 8}
    assert RunEvent.objects.filter(run=run, kind="runner").count() == 8
    assert RunnerSession.objects.get(pk=run.pk).event_count == 8


def test_a_lost_ack_is_resent_with_one_effect(live_server):
    run, key = runner_run()
    batch = envelopes(1, 5, run=run)
    with http(live_server, key) as client:
        client.post(f"/runs/{run.pk}/hello", json=hello_body(1, 1)).raise_for_status()
        proxy = LossyProxy(live_server.url)
        with http(live_server, key, origin=proxy.url) as lossy:
            with pytest.raises(httpx.TransportError):
                lossy.post(f"/runs/{run.pk}/events", json={"events": batch})
        proxy.thread.join(timeout=30)
        lost = json.loads(proxy.swallowed.partition(b"\r\n\r\n")[2])
        assert lost["ackedSourceSeq"] == 5 and lost["accepted"] == 5  # committed before it was answered
        resent = client.post(f"/runs/{run.pk}/events", json={"events": batch}).json()
    assert resent["ackedSourceSeq"] == lost["ackedSourceSeq"] == 5
    assert resent["accepted"] == 0 and len(resent["duplicates"]) == 5
    assert ids(run) == [f"runner_test-{i}" for i in range(1, 6)]
    assert RunEvent.objects.filter(run=run, kind="runner").count() == 5


def test_credentials_over_http(live_server):
    run, key = runner_run()
    sibling, sibling_key = runner_run(agent=run.agent)
    foreign, _ = runner_run()
    user = MembershipFactory(company=run.company, role="owner").user
    board = "pcp_board_" + "y" * 40
    BoardApiKey.objects.create(user=user, name="k", prefix=board[:16], key_hash=hash_key(board))
    path = f"/runs/{run.pk}/hello"
    with http(live_server) as anonymous:
        response = anonymous.post(path, json=hello_body())
        error(response, 401, "unauthorized")
        assert response.headers["www-authenticate"].startswith("Bearer")
    with http(live_server, "pcp_not_a_key") as unknown:
        error(unknown.post(path, json=hello_body()), 401)
    with http(live_server, board) as client:
        error(client.post(path, json=hello_body()), 403, "runner_key_required")
    with http(live_server, sibling_key) as client:
        error(client.post(path, json=hello_body()), 404, "not_found")
    with http(live_server, key) as client:
        error(client.post(f"/runs/{foreign.pk}/hello", json=hello_body()), 404, "not_found")
        error(client.post(f"/runs/{run.pk}/events", json={"events": envelopes(1, 1, run=run)}), 409, "hello_required")
    assert not RunnerSession.objects.exists()


def test_negotiation_over_http(live_server):
    cases = [((1, 1), capabilities(1), 1), ((1, 2), capabilities(2), 2), ((1, 3), capabilities(2), 2),
             ((1, 2), capabilities(1), 1)]
    for (low, high), caps, expected in cases:
        run, key = runner_run()
        with http(live_server, key) as client:
            response = client.post(f"/runs/{run.pk}/hello", json=hello_body(low, high, caps=caps))
            assert response.status_code == 200 and response.json()["protocolVersion"] == expected, response.text
    run, key = runner_run()
    with http(live_server, key) as client:
        refused = error(client.post(f"/runs/{run.pk}/hello", json=hello_body(3, 4, caps=capabilities(2))), 400,
                        "unsupported_required_version")
        assert refused["details"]["supported"] == [1, 2]
        assert refused["details"]["value"] == {"protocolMin": 3, "protocolMax": 4}
        caps = capabilities(2, sessionGoals={"availability": "available"})
        bad = error(client.post(f"/runs/{run.pk}/hello", json=hello_body(1, 2, caps=caps)), 400, "schema_invalid")
        assert bad["details"]["path"].startswith("$.capabilities.sessionGoals")
    assert RunnerSession.objects.get(pk=run.pk).refusal["code"] == "schema_invalid"


def test_batch_and_body_limits_over_http(live_server):
    run, key = runner_run()
    with http(live_server, key) as client:
        client.post(f"/runs/{run.pk}/hello", json=hello_body(1, 1)).raise_for_status()
        too_many = error(client.post(f"/runs/{run.pk}/events", json={"events": envelopes(1, 101, run=run)}), 413,
                         "batch_too_large")
        assert too_many["details"]["maxEvents"] == 100
        big = envelope(1, run=run, debug={"blob": "x" * (1024 * 1024 + 1)})
        too_big = error(client.post(f"/runs/{run.pk}/events", json={"events": [big]}), 413, "payload_too_large")
        assert too_big["details"]["maxBytes"] == 1024 * 1024
        ok = client.post(f"/runs/{run.pk}/events", json={"events": envelopes(1, 100, run=run)})
        assert ok.status_code == 200 and ok.json()["ackedSourceSeq"] == 100
    assert RunnerEvent.objects.filter(run=run).count() == 100


def test_commands_long_poll_in_order_and_results_over_http(live_server):
    run, key = runner_run()
    with http(live_server, key) as client:
        client.post(f"/runs/{run.pk}/hello", json=hello_body(1, 2)).raise_for_status()
        session = RunnerSession.objects.get(pk=run.pk)
        first = command_issue(session=session, command_type="turn.interrupt")
        second = command_issue(session=session, command_type="run.cancel", payload={"reason": "board"})
        body = client.get(f"/runs/{run.pk}/commands", params={"afterSeq": 0, "wait": 0}).json()
        # The three commands the hello issued (run.prepare, session.open, turn.start), then ours.
        assert [c["type"] for c in body["commands"]] == ["run.prepare", "session.open", "turn.start",
                                                        "turn.interrupt", "run.cancel"]
        assert [c["commandId"] for c in body["commands"]][3:] == [first.command_id, second.command_id]
        assert [c["controllerSeq"] for c in body["commands"]] == [1, 2, 3, 4, 5] and body["controllerSeq"] == 5
        assert body["commands"][0]["schema"] == "paperclip.prp.command.v2"
        # A long-poll past the last command returns the one issued meanwhile (or at once when it
        # was already committed: both orders give the same answer).
        issuer = threading.Thread(target=lambda: command_issue(
            session=RunnerSession.objects.get(pk=run.pk), command_type="turn.interrupt"))
        issuer.start()
        polled = client.get(f"/runs/{run.pk}/commands", params={"afterSeq": 5, "wait": 10}).json()
        issuer.join()
        assert [c["controllerSeq"] for c in polled["commands"]] == [6]
        # Results: stored once, the same body again is the stored result, another is a conflict.
        url = f"/runs/{run.pk}/commands/{first.command_id}/result"
        result = {"status": "succeeded", "result": {"interrupted": True}}
        stored = client.post(url, json=result)
        assert stored.status_code == 200 and stored.json()["duplicate"] is False
        again = client.post(url, content=json.dumps(result, indent=2), headers={"content-type": "application/json"})
        assert again.status_code == 200 and again.json()["duplicate"] is True
        assert again.json()["resultAt"] == stored.json()["resultAt"]
        error(client.post(url, json={"status": "rejected", "error": {"code": "nope"}}), 409, "command_result_conflict")
        error(client.post(f"/runs/{run.pk}/commands/cmd_missing/result", json=result), 404, "not_found")
    first.refresh_from_db()
    assert first.status == "succeeded" and first.result == result
    assert RunnerCommand.objects.get(pk=second.pk).status == "delivered"
