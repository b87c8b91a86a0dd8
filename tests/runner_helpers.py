"""Shared helpers for the PRP host-side tests (issue #17): a runner run with its run-scoped key,
hello bodies, capability documents and event envelopes. Names here are stable: other test
modules import them.

    run, key = runner_run()
    client = runner_client(key)                       # DRF APIClient with the run's Bearer key
    client.post(runner_url(run, "hello"), hello_body(), format="json")
    client.post(runner_url(run, "events"), {"events": [envelope(1, run=run)]}, format="json")
"""
from __future__ import annotations

import copy

from rest_framework.test import APIClient

from issues.adapters.base import issue_run_key
from tests.factories import AgentFactory, CompanyFactory, RunFactory

SOURCE_INSTANCE = "runner_test"
SOURCE_KIND = "runner"
EMITTED_AT = "2026-08-07T12:00:00.000Z"
EVENT_SCHEMAS = {1: "paperclip.prp.event.v1", 2: "paperclip.prp.event.v2"}

_CAPABILITIES_V1 = {
    "schema": "paperclip.prp.capabilities.v1",
    "sessionReusePolicy": "new_per_run",
    "driver": {"kind": "fake", "version": "1.0.0"},
    "steer": True,
    "interrupt": True,
    "resume": True,
    "runtimeRequests": True,
    "structuredResult": True,
    "typedEvents": True,
    "unsupported": [],
}


def runner_run(company=None, agent=None, issue=None, *, status="running"):
    """A run driven by a PRP runner and the raw run-scoped key (AgentApiKey with run=run)."""
    if agent is None:
        agent = AgentFactory(company=company or CompanyFactory(), adapter_type="runner")
    run = RunFactory(agent=agent, company=agent.company, issue=issue, status=status, adapter_type="runner")
    return run, issue_run_key(run)


def runner_client(key, client=None) -> APIClient:
    """An APIClient speaking with ``Authorization: Bearer <key>`` (no run header, no session)."""
    client = client or APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def runner_url(run, suffix: str = "") -> str:
    """``/api/runner/v1/runs/<run id>/<suffix>`` (``run`` may be a run or its id)."""
    run_id = getattr(run, "pk", run)
    return f"/api/runner/v1/runs/{run_id}/{suffix}"


def capabilities(version: int = 1, **overrides) -> dict:
    """A valid capability document for ``version``. v2 carries ``sessionGoals`` (mandatory in
    every v2 snapshot, seed 004) with the actions it advertises."""
    doc = copy.deepcopy(_CAPABILITIES_V1)
    if version == 2:
        doc["schema"] = "paperclip.prp.capabilities.v2"
        doc["sessionGoals"] = session_goals_capability()
    doc.update(overrides)
    return doc


def session_goals_capability(availability: str = "available", actions=("set", "pause", "resume", "clear"),
                             **overrides) -> dict:
    """A v2 ``sessionGoals`` capability (session-goal.schema.json#/$defs/capability)."""
    doc = {"availability": availability, "actions": list(actions), "autonomousUpdates": True,
           "persistentAcrossResume": True, "maxObjectiveChars": 4000, "tokenBudgetControl": True,
           "usageReporting": True}
    doc.update(overrides)
    return doc


def hello_body(protocol_min: int = 1, protocol_max: int = 2, *, caps: dict | None = None,
               runner_instance_id: str = SOURCE_INSTANCE, identity: dict | None = None, **extra) -> dict:
    """The hello body. Without ``caps`` the capabilities match the version the host will pick
    (v2 when the offer reaches 2, else v1)."""
    if caps is None:
        caps = capabilities(2 if protocol_min <= 2 <= protocol_max else 1)
    body = {"protocolMin": protocol_min, "protocolMax": protocol_max, "runnerInstanceId": runner_instance_id,
            "capabilities": caps}
    if identity is not None:
        body["identity"] = identity
    body.update(extra)
    return body


def envelope(seq: int, event_type: str = "runtime.phase.changed", payload: dict | None = None, *, run,
             version: int = 1, source_instance_id: str = SOURCE_INSTANCE, source_kind: str = SOURCE_KIND,
             event_id: str | None = None, **fields) -> dict:
    """A PRP event envelope for ``run`` (``runId`` is the run's id), ``sourceSeq = seq``. The
    event id defaults to ``<source>-<seq>``; ``fields`` add or override members verbatim
    (camelCase), e.g. ``envelope(3, run=run, debug={"x": 1})``."""
    doc = {
        "schema": EVENT_SCHEMAS[version],
        "sourceEventId": event_id or f"{source_instance_id}-{seq}",
        "sourceSeq": seq,
        "sourceInstanceId": source_instance_id,
        "sourceKind": source_kind,
        "runId": str(getattr(run, "pk", run)),
        "eventType": event_type,
        "schemaVersion": version,
        "priority": 1,
        "emittedAt": EMITTED_AT,
        "payload": {"phase": "workspace_preparing"} if payload is None and event_type == "runtime.phase.changed"
        else (payload or {}),
    }
    doc.update(fields)
    return doc


def envelopes(first: int, last: int, *, run, **kwargs) -> list[dict]:
    """``envelope(seq, run=run, **kwargs)`` for seq in first..last (inclusive)."""
    return [envelope(seq, run=run, **kwargs) for seq in range(first, last + 1)]


def source_key(source_instance_id: str = SOURCE_INSTANCE, source_kind: str = SOURCE_KIND) -> str:
    """The host's key for a source's cursor: ``<sourceKind>:<sourceInstanceId>``."""
    return f"{source_kind}:{source_instance_id}"


def say_hello(client, run, protocol_min: int = 1, protocol_max: int = 2, **kwargs):
    """POST hello and assert it was accepted; returns the response body."""
    response = client.post(runner_url(run, "hello"), hello_body(protocol_min, protocol_max, **kwargs), format="json")
    assert response.status_code == 200, (response.status_code, response.content[:600])
    return response.json()


def post_events(client, run, events: list[dict]):
    """POST a batch (the response, unchecked)."""
    return client.post(runner_url(run, "events"), {"events": events}, format="json")
