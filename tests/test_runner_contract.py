"""The PRP contract (issues.runner.contract): fixtures, fail-closed versions, closed objects, the two
seed events, the local-only registry, canonical JSON. Pure: no database."""
import copy
import json
import shutil
import socket
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from referencing.exceptions import Unresolvable

from issues.runner import contract as c

FIXTURES = Path(__file__).parent / "fixtures" / "prp"
SCHEMAS = Path(c.__file__).with_name("schemas")
# The fixtures whose description says they must fail closed, and how (a later copy may add more).
REJECTED = {
    "unsupported-required-version": ("$.protocolVersion", 3, [1, 2]),
    "semantic-tool-unsupported-required-version": ("$.events[0].payload.semantic_tool.schemaVersion", 2, [1]),
}


def load(rel):
    return json.loads((FIXTURES / rel).read_text(encoding="utf-8"))


def replay_fixtures():
    """Every paperclip.prp.fixture.v1 under tests/fixtures/prp (phase-01, replay, and any later copy)."""
    out = []
    for path in sorted(FIXTURES.rglob("*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(doc, dict) and doc.get("schema") == c.FIXTURE_SCHEMA:
            out.append(path.relative_to(FIXTURES).as_posix())
    return out


ACCEPTED = [p for p in replay_fixtures() if "unsupported" not in Path(p).stem]
REFUSED = [p for p in replay_fixtures() if "unsupported" in Path(p).stem]


def refused(fn, *args, **kwargs) -> c.ContractError:
    with pytest.raises(c.ContractError) as info:
        fn(*args, **kwargs)
    return info.value


def event(event_type="session.started", payload=None, version=1, **extra):
    env = {
        "schema": c.EVENT_SCHEMAS[version], "sourceEventId": "ev_1", "sourceSeq": 1,
        "sourceInstanceId": "runner_1", "sourceKind": "runner", "runId": "run_1",
        "normalizedSessionId": "session_1", "eventType": event_type, "schemaVersion": version,
        "priority": 0, "emittedAt": "2026-08-07T12:50:00.010Z", "payload": {} if payload is None else payload,
    }
    env.update(extra)
    return env


CREDENTIALS = {"schema": "paperclip.auth.credentials.updated.v1", "provider": "codex",
               "bindingId": "harness-auth", "revision": 3, "detection": "credential_store"}
ACTIVITY = {"namespace": "paperclip.cli", "activityKey": "issue.comment.created"}
MEASUREMENT = {"inputTokens": 10, "outputTokens": 5, "cacheReadTokens": 0, "cacheWriteTokens": 0,
               "activeSeconds": 1.5, "requests": 1, "providerCostUsd": 0.01}
USAGE = {"provider": "openai", "model": "gpt-5", "cumulative": MEASUREMENT, "runDeltaAvailable": True,
         "runDelta": MEASUREMENT, "costSource": "provider_reported"}


# ---------------------------------------------------------------- the schema set

def test_the_contract_compiles_once_and_every_ref_resolves():
    contract = c._contract()
    assert contract is c._contract()
    ids = {json.loads(p.read_text())["$id"] for p in SCHEMAS.glob("*.json")}
    assert ids <= set(contract.validators)
    for path in SCHEMAS.glob("*.json"):
        doc = json.loads(path.read_text())
        resolver = contract.registry.resolver(base_uri=doc["$id"])
        for ref in c._walk_refs(doc):
            resolver.lookup(ref)  # raises if any $ref of any file is missing


def test_only_v1_and_v2_are_shipped_and_every_file_is_documented():
    names = sorted(p.name for p in SCHEMAS.glob("*.json"))
    assert not [n for n in names if "-v3" in n]
    sources = (SCHEMAS / "SOURCES.md").read_text()
    assert [n for n in names if f"`{n}`" not in sources] == []
    assert c.SUPPORTED_VERSIONS == (1, 2)


def test_a_missing_ref_fails_the_build_and_nothing_is_fetched(tmp_path, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("the contract tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    nope = "https://paperclip.dev/schemas/prp/v1/nope.schema.json"
    # An ad-hoc schema against the contract's registry: the unknown URI is refused, not retrieved.
    with pytest.raises(Unresolvable):
        Draft202012Validator({"$ref": nope}, registry=c.schema_registry()).validate({})
    # A schema file whose $ref points nowhere stops the contract from loading at all.
    for path in SCHEMAS.glob("*.json"):
        shutil.copy(path, tmp_path / path.name)
    (tmp_path / "broken.schema.json").write_text(json.dumps(
        {"$schema": "https://json-schema.org/draft/2020-12/schema",
         "$id": "https://paperclip.dev/schemas/prp/v1/broken.schema.json", "$ref": nope}))
    with pytest.raises(RuntimeError, match="nope.schema.json"):
        c._Contract(tmp_path)


# ---------------------------------------------------------------- the fixtures

@pytest.mark.parametrize("rel", ACCEPTED)
def test_accepted_replay_fixture_validates_whole_and_piece_by_piece(rel):
    doc = load(rel)
    before = c.canonical_json(doc)
    c.validate_fixture(doc)
    assert c.canonical_json(doc) == before  # validation changes nothing
    pv = doc["protocolVersion"]
    c.validate_capabilities(doc["capabilities"], protocol_version=pv)
    for command in doc["commands"]:
        c.validate_command(command, protocol_version=pv)
    for envelope in doc["events"]:
        c.validate_event(envelope, protocol_version=pv)
        c.validate_event(envelope, protocol_version=2)  # a v2 run accepts v1 events
        if envelope["eventType"] == "run.terminal":
            c.validate_terminal(envelope["payload"])
        if envelope["eventType"] == "run.result.proposed":
            c.validate_result(envelope["payload"])
    for request in doc.get("requests", []):
        c.validate_request(request)
    c.validate_result(doc["result"])


def test_replay_fixtures_include_the_known_ones():
    assert {"phase-01/happy-path.json", "phase-01/duplicate-event.json", "phase-01/unknown-optional-fields.json",
            "replay/budget-cost-stop-reason.json"} <= set(ACCEPTED)
    assert "phase-01/unsupported-required-version.json" in REFUSED


def test_unknown_optional_fields_are_accepted_and_kept():
    doc = load("phase-01/unknown-optional-fields.json")
    c.validate_fixture(doc)
    assert doc["futureFixtureHint"] == {"producerVersion": "1.1-preview"}
    assert doc["identity"]["futureIdentityLabel"] == "preserved"
    assert doc["capabilities"]["futureCapability"] == {"mode": "optional"}
    assert doc["capabilities"]["driver"]["futureDriverField"] is True
    assert doc["commands"][0]["futureDeadlineMode"] == "soft"
    assert doc["events"][0]["futureEnvelopeField"] == 42
    assert doc["events"][0]["payload"] == {"futureSessionDetail": "ignored"}
    assert doc["events"][3]["payload"]["futureTerminalReason"] == "optional"
    assert doc["result"]["futureResultAnnotation"] == {"safe": True}


@pytest.mark.parametrize("rel", REFUSED)
def test_unsupported_required_version_fails_closed(rel):
    field, value, supported = REJECTED[Path(rel).stem]
    err = refused(c.validate_fixture, load(rel))
    assert (err.code, err.field, err.value, err.supported) == ("unsupported_required_version", field, value, supported)
    details = err.as_details()
    assert (details["field"], details["value"], details["supported"]) == (field, value, supported)
    assert details["reason"].strip() and details[field] == [details["reason"]]


def test_budget_stop_reason_is_validated_not_passed_through():
    doc = load("replay/budget-cost-stop-reason.json")
    bad = copy.deepcopy(doc)
    bad["events"][-1]["payload"]["stopReason"]["limitClass"] = "galactic"
    err = refused(c.validate_fixture, bad)
    assert (err.code, err.field) == ("schema_invalid", "$.events[1].payload.stopReason.limitClass")
    bad = copy.deepcopy(doc)
    bad["events"][-1]["payload"]["stopReason"]["schemaVersion"] = 2
    err = refused(c.validate_fixture, bad)
    assert (err.code, err.field, err.value, err.supported) == (
        "unsupported_required_version", "$.events[1].payload.stopReason.schemaVersion", 2, [1])


def test_native_execution_bundle_validates_and_keeps_its_extra_field():
    doc = load("evals/native-execution-seeded.json")
    c.validate_native_execution(doc)
    assert doc["x_fixturePurpose"].startswith("Proves seeded provenance")
    for envelope in doc["events"]:
        c.validate_event(envelope, protocol_version=1)
    c.validate_terminal(doc["terminal"])
    bad = copy.deepcopy(doc)
    bad["events"][0]["payload"]["semantic_tool"]["schemaVersion"] = 2
    err = refused(c.validate_native_execution, bad)
    assert (err.code, err.field) == ("unsupported_required_version", "$.events[0].payload.semantic_tool.schemaVersion")


def test_phase00_tracer_is_not_a_prp_document_but_is_self_consistent():
    # phase-00 is the runner-side cross-language tracer (paperclip.runner.phase0.*), outside the PRP
    # contract: the contract refuses it, and its expected output is derived from its input.
    run, expected = load("phase-00-minimal-run.json"), load("phase-00-expected-output.json")
    assert run["schemaVersion"] == "paperclip.runner.phase0.fixture.v1"
    assert refused(c.validate_fixture, run).field == "$.protocolVersion"
    assert [e["sequence"] for e in run["events"]] == list(range(1, len(run["events"]) + 1))
    assert {e["runId"] for e in run["events"]} == {run["run"]["runId"]}
    assert expected == {"schemaVersion": "paperclip.runner.phase0.output.v1",
                        "runIdentity": {"runId": run["run"]["runId"], "sessionId": run["run"]["sessionId"]},
                        "result": {"status": run["result"]["status"], "summary": run["result"]["summary"]}}


STEP_KINDS = {"event", "log", "delay", "request", "await_resolution", "await_interrupt", "result",
              "terminal", "exit", "spawn_worker"}


@pytest.mark.parametrize("path", sorted((FIXTURES / "phase-02" / "scripts").glob("*.json")), ids=lambda p: p.stem)
def test_phase02_script_payloads_are_valid_prp(path):
    # Fake-harness scripts: the events, requests, results and terminals a local runner will emit must
    # each pass the contract (wrapped in a v1 envelope where the script gives only type and payload).
    script = json.loads(path.read_text())
    assert script["schema"] == "paperclip.fake_harness.script.v1"
    for i, step in enumerate(script["steps"], start=1):
        assert step["kind"] in STEP_KINDS
        if step["kind"] == "event":
            extra = {"itemId": step["item_id"]} if "item_id" in step else {}
            c.validate_event(event(step["event_type"], step["payload"], sourceSeq=i, **extra), protocol_version=1)
        elif step["kind"] == "request":
            c.validate_request(step["request"])
            c.validate_event(event("runtime_request.created", {"request": step["request"]}), protocol_version=1)
        elif step["kind"] == "result":
            c.validate_result(step["payload"])
        elif step["kind"] == "terminal":
            c.validate_terminal(step["payload"])


def test_phase04b_driver_table_is_not_a_prp_fixture_and_its_goal_actions_exist():
    # A driver mapping table (Codex app-server ↔ PRP), runner side: only its goal actions touch the
    # host contract (the session-goal capability actions, plus session.goal.get).
    table = load("phase-04b/driver-conformance.json")
    assert refused(c.validate_fixture, table).code == "schema_invalid"  # no protocolVersion
    goal_schema = json.loads((SCHEMAS / "session-goal.schema.json").read_text())
    actions = set(goal_schema["$defs"]["capability"]["properties"]["actions"]["items"]["enum"])
    assert {g["action"] for g in table["goals"]} == actions | {"get"}


# ---------------------------------------------------------------- fail closed

def test_event_versions_fail_closed():
    err = refused(c.validate_event, event(schemaVersion=3), protocol_version=2)
    assert (err.code, err.field, err.value, err.supported) == ("unsupported_required_version", "$.schemaVersion", 3, [1, 2])
    err = refused(c.validate_event, event(schema="paperclip.prp.event.v3", schemaVersion=2), protocol_version=2)
    assert (err.code, err.field, err.value) == ("unsupported_required_schema", "$.schema", "paperclip.prp.event.v3")
    assert err.supported == ["paperclip.prp.event.v1", "paperclip.prp.event.v2"]
    assert refused(c.validate_event, event(schema="paperclip.prp.event.v3", version=2), protocol_version=2).code == \
        "unsupported_required_schema"


def test_an_event_newer_than_the_run_is_refused():
    err = refused(c.validate_event, event(version=2), protocol_version=1)
    assert (err.code, err.field, err.value, err.supported) == ("unsupported_required_version", "$.schemaVersion", 2, [1])
    err = refused(c.validate_event, event(schema="paperclip.prp.event.v2"), protocol_version=1)
    assert (err.code, err.field, err.supported) == ("unsupported_required_schema", "$.schema", ["paperclip.prp.event.v1"])
    c.validate_event(event(version=2), protocol_version=2)
    with pytest.raises(ValueError):
        c.validate_event(event(), protocol_version=3)


def test_capabilities_and_commands_fail_closed_on_schema():
    caps = load("phase-01/happy-path.json")["capabilities"]
    err = refused(c.validate_capabilities, dict(caps, schema="paperclip.prp.capabilities.v9"), protocol_version=2)
    assert (err.code, err.field, err.value) == ("unsupported_required_schema", "$.schema", "paperclip.prp.capabilities.v9")
    v2 = dict(caps, schema="paperclip.prp.capabilities.v2")  # without sessionGoals
    assert refused(c.validate_capabilities, v2, protocol_version=1).supported == ["paperclip.prp.capabilities.v1"]
    assert refused(c.validate_capabilities, v2, protocol_version=2).field == "$.sessionGoals"
    command = {"schema": "paperclip.prp.command.v2", "commandId": "cmd_1", "controllerSeq": 1,
               "type": "session.goal.set", "issuedAt": "2026-08-07T12:50:00Z", "payload": {"objective": "Ship"}}
    c.validate_command(command, protocol_version=2)
    assert refused(c.validate_command, command, protocol_version=1).code == "unsupported_required_schema"
    err = refused(c.validate_command, dict(command, schema="paperclip.prp.command.v1"), protocol_version=2)
    assert (err.code, err.field, err.value) == ("schema_invalid", "$.type", "session.goal.set")


def test_a_nested_unknown_schema_fails_closed():
    terminal = {"schema": "paperclip.prp.terminal.v2", "turnTerminalState": "completed",
                "runTerminalState": "succeeded", "reportedWorkDisposition": "done"}
    err = refused(c.validate_event, event("run.terminal", terminal), protocol_version=1)
    assert (err.code, err.field, err.value, err.supported) == (
        "unsupported_required_schema", "$.payload.schema", "paperclip.prp.terminal.v2", ["paperclip.prp.terminal.v1"])
    assert refused(c.validate_terminal, terminal).code == "unsupported_required_schema"
    # debug is free-form provider data and is not read for discriminators
    c.validate_event(event(debug={"schema": "paperclip.prp.terminal.v9"}), protocol_version=1)


def test_fixture_errors_carry_the_path_inside_the_fixture():
    doc = load("phase-01/happy-path.json")
    bad = copy.deepcopy(doc)
    bad["events"][2]["schemaVersion"] = 3
    err = refused(c.validate_fixture, bad)
    assert (err.code, err.field, err.value) == ("unsupported_required_version", "$.events[2].schemaVersion", 3)
    bad = copy.deepcopy(doc)
    bad["events"][2]["payload"] = "not an object"
    assert refused(c.validate_fixture, bad).field == "$.events[2].payload"
    bad = copy.deepcopy(doc)
    bad["fixtureVersion"] = 2
    err = refused(c.validate_fixture, bad)
    assert (err.code, err.field, err.supported) == ("unsupported_required_version", "$.fixtureVersion", [1])
    bad = copy.deepcopy(doc)
    bad["events"][0] = dict(bad["events"][0], schema="paperclip.prp.event.v2", schemaVersion=2)
    err = refused(c.validate_fixture, bad)  # a v2 event in a protocolVersion 1 fixture
    assert (err.code, err.field, err.supported) == ("unsupported_required_version", "$.events[0].schemaVersion", [1])
    err = refused(c.validate_event, bad["events"][0], protocol_version=1, at="$.events[7]")
    assert err.field == "$.events[7].schemaVersion"


# ---------------------------------------------------------------- closed objects and the host bindings

def test_closed_objects_reject_unknown_members_with_their_path():
    err = refused(c.validate_event, event("usage.reported", dict(USAGE, bonus=1)), protocol_version=1)
    assert (err.code, err.field, err.keyword) == ("schema_invalid", "$.payload.bonus", "additionalProperties")
    usage = copy.deepcopy(USAGE)
    usage["runDelta"]["bonusTokens"] = 1
    assert refused(c.validate_event, event("usage.reported", usage, version=2), protocol_version=2).field == \
        "$.payload.runDelta.bonusTokens"
    chunk = {"schema": "paperclip.output.body.chunk.v1", "offset": "0", "sha256": "a" * 64, "text": "hello",
             "body": {"schema": "paperclip.output.body.v1", "bodyId": "b" * 64, "sha256": "c" * 64,
                      "byteLength": "5", "mediaType": "text/plain; charset=utf-8"}}
    c.validate_event(event("output.body.chunk", chunk), protocol_version=1)
    bad = copy.deepcopy(chunk)
    bad["body"]["encoding"] = "gzip"
    err = refused(c.validate_event, event("output.body.chunk", bad), protocol_version=1)
    assert (err.code, err.field) == ("schema_invalid", "$.payload.body.encoding")
    details = err.as_details()
    assert details["field"] == "$.payload.body.encoding" and details["$.payload.body.encoding"][0].strip()


def test_usage_terminal_result_and_requests_are_bound_in_both_versions():
    c.validate_event(event("usage.reported", USAGE), protocol_version=1)
    c.validate_event(event("usage.reported", dict(USAGE, runDeltaAvailable=False, runDelta=None), version=2), protocol_version=2)
    missing = {k: v for k, v in USAGE.items() if k != "cumulative"}
    assert refused(c.validate_event, event("usage.reported", missing), protocol_version=1).field == "$.payload.cumulative"
    terminal = {"schema": "paperclip.prp.terminal.v1", "turnTerminalState": "completed", "runTerminalState": "won",
                "reportedWorkDisposition": "done"}
    err = refused(c.validate_event, event("run.terminal", terminal, version=2), protocol_version=2)
    assert (err.field, err.value) == ("$.payload.runTerminalState", "won")
    assert refused(c.validate_event, event("run.result.proposed", {"schema": "paperclip.run_result.v1"}, version=2),
                   protocol_version=2).code == "schema_invalid"
    assert refused(c.validate_event, event("runtime_request.created", {}), protocol_version=1).field == "$.payload.request"


# ---------------------------------------------------------------- the two seed events

@pytest.mark.parametrize("version", [1, 2])
def test_credentials_updated_accepts_only_its_metadata(version):
    c.validate_event(event("auth.credentials.updated", CREDENTIALS, version=version), protocol_version=version)
    c.validate_event(event("auth.credentials.updated", dict(CREDENTIALS, detection="native_hook"), version=version),
                     protocol_version=version)
    for secret in ("token", "accessToken", "accountId", "credentialPath", "fingerprint"):
        err = refused(c.validate_event, event("auth.credentials.updated", dict(CREDENTIALS, **{secret: "x"}), version=version),
                      protocol_version=version)
        assert (err.code, err.field) == ("schema_invalid", f"$.payload.{secret}")
    for member in CREDENTIALS:
        payload = {k: v for k, v in CREDENTIALS.items() if k != member}
        assert refused(c.validate_event, event("auth.credentials.updated", payload, version=version),
                       protocol_version=version).field == f"$.payload.{member}"
    for bad in ({"detection": "oauth_refresh"}, {"revision": 0}, {"revision": "3"}, {"bindingId": "harness-auth\n"},
                {"provider": ""}):
        key = next(iter(bad))
        assert refused(c.validate_event, event("auth.credentials.updated", dict(CREDENTIALS, **bad), version=version),
                       protocol_version=version).field == f"$.payload.{key}"
    err = refused(c.validate_event, event("auth.credentials.updated",
                                          dict(CREDENTIALS, schema="paperclip.auth.credentials.updated.v2"), version=version),
                  protocol_version=version)
    assert (err.code, err.field) == ("unsupported_required_schema", "$.payload.schema")


@pytest.mark.parametrize("version", [1, 2])
def test_activity_recorded_is_exactly_namespace_and_key(version):
    def check(payload):
        c.validate_event(event("runtime.activity.recorded", payload, version=version), protocol_version=version)

    check(ACTIVITY)
    check({"namespace": "é" * 160, "activityKey": "😀" * 160})  # code points, not bytes or UTF-16 units
    for member, value in [("namespace", ""), ("activityKey", "😀" * 161), ("namespace", "a\x07b"),
                          ("activityKey", "tab\there"), ("namespace", "line\n"), ("activityKey", "del\x7f"),
                          ("namespace", 7)]:
        err = refused(check, dict(ACTIVITY, **{member: value}))
        assert (err.code, err.field) == ("schema_invalid", f"$.payload.{member}"), (member, value)
    for extra in ("companyId", "taskId", "agentId"):
        assert refused(check, dict(ACTIVITY, **{extra: "x"})).field == f"$.payload.{extra}"
    assert refused(check, {"namespace": "n"}).field == "$.payload.activityKey"


# ---------------------------------------------------------------- host rules

def test_date_time_and_ecma_anchors_are_enforced():
    for bad in ("yesterday", "2026-02-30T00:00:00Z", "2026-08-07 12:50:00Z", "2026-08-07T12:50:00"):
        err = refused(c.validate_event, event(emittedAt=bad), protocol_version=1)
        assert (err.field, err.keyword) == ("$.emittedAt", "format")
    c.validate_event(event(emittedAt="2026-08-07T12:50:00.123456+05:30"), protocol_version=1)
    epoch = "0a0b0c0d-0000-4000-8000-000000000000"
    c.validate_event(event(sourceEpoch=epoch), protocol_version=1)
    assert refused(c.validate_event, event(sourceEpoch=epoch + "\n"), protocol_version=1).field == "$.sourceEpoch"


def test_unstorable_values_are_refused_with_their_path():
    for value in (float("nan"), float("inf"), "nul\x00", "lone \ud800"):
        err = refused(c.validate_event, event(payload={"a": [1, value]}), protocol_version=1)
        assert (err.code, err.field) == ("schema_invalid", "$.payload.a[1]")
    assert refused(c.validate_event, event(payload={"k\x00": 1}), protocol_version=1).field == "$.payload"
    assert refused(c.validate_event, event(debug={"raw": {"x": float("nan")}}), protocol_version=1).field == "$.debug.raw.x"


def test_missing_and_mistyped_versions_are_invalid_not_unsupported():
    env = event()
    del env["schemaVersion"]
    err = refused(c.validate_event, env, protocol_version=1)
    assert (err.code, err.field) == ("schema_invalid", "$.schemaVersion")
    assert refused(c.validate_event, event(schemaVersion=True), protocol_version=1).code == "schema_invalid"
    assert refused(c.validate_event, event(schemaVersion="1"), protocol_version=1).code == "schema_invalid"
    assert refused(c.validate_event, [event()], protocol_version=1).field == "$"


# ---------------------------------------------------------------- canonical JSON

def test_canonical_json_is_stable_under_key_order_and_digest_tells_bytes_apart():
    a = {"b": 1, "a": {"y": [1, 2, {"d": "é", "c": None}], "x": True}}
    b = {"a": {"x": True, "y": [1, 2, {"c": None, "d": "é"}]}, "b": 1}
    assert c.canonical_json(a) == c.canonical_json(b) == '{"a":{"x":true,"y":[1,2,{"c":null,"d":"é"}]},"b":1}'.encode()
    assert c.digest(a) == c.digest(b) and len(c.digest(a)) == 64
    assert c.digest(a) != c.digest({**a, "b": 2})
    assert c.digest({"y": [1, 2]}) != c.digest({"y": [2, 1]})
    for bad in (float("nan"), float("-inf"), "\udc00"):
        assert refused(c.canonical_json, {"x": bad}).code == "schema_invalid"


def test_error_details_shape():
    err = c.ContractError("unsupported_required_schema", "Nope.", field="$.schema", value="x.v3", supported=["x.v1"])
    assert err.as_details() == {"field": "$.schema", "reason": "Nope.", "$.schema": ["Nope."], "value": "x.v3",
                                "supported": ["x.v1"]}
    moved = err.prefixed("$.events[4]")
    assert (moved.field, moved.value, moved.supported) == ("$.events[4].schema", "x.v3", ["x.v1"])
    assert "value" not in c.ContractError("schema_invalid", "Bad.", field="$.a").as_details()
