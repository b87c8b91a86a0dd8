"""The PRP session reducer: a fixture's (or a run's) events -> ``paperclip.prp.session-snapshot.v1``.

Pure: no database, no I/O, no clock. The same input gives the same snapshot (and the same bytes
once dumped); the input is never mutated (everything kept is a deep copy). ``replay_fixture``
validates a fixture with the contract first (a :class:`~issues.runner.contract.ContractError`
propagates: nothing is reduced from a refused document); ``reduce_session`` trusts its envelopes
to have been validated (the intake stores only valid ones) but never fails on an odd payload.

Delivery rules (per source ``"<sourceKind>:<sourceInstanceId>"``, in input order):

* A repeated ``sourceEventId`` is a duplicate with no second effect and is listed once in
  ``duplicateEventIds`` (sorted). If its canonical JSON differs from the first delivery's it is
  also a protocol violation: the first delivery stays, a ``conflicting_duplicate`` diagnostic
  names it and ``integrity`` is ``conflict`` (the intake answers such a repeat with 409 and stores
  nothing, so a live run never shows this; a fixture can).
* ``sourceSeq`` at or behind the source's cursor (a new id): out of order, listed in
  ``outOfOrderEventIds``, not applied (a late event never rewrites what came after it, even one
  that fills a recorded gap). ``integrity`` becomes ``gap_detected``.
* ``sourceSeq`` past cursor + 1: a gap ``{sourceKey, expected, received, missingCount, missing,
  truncated}`` (``missing`` holds at most ``MAX_RECORDED_MISSING`` numbers) is recorded,
  ``integrity`` becomes ``gap_detected``, and the event is still applied: the missing events are
  never invented, the cursor moves to the event.
* Every applied event moves its cursor, joins ``processedEventIds`` and gets a timeline entry.

Projections (by ``eventType`` and payload only, never by fixture or id; each handler also returns
the timeline summary):

* ``runtime.phase.changed`` -> ``runPhase`` = ``payload.phase`` (start ``queued``); the first
  ``run.terminal`` -> ``terminal`` and ``runPhase`` ``terminal``, final. A later terminal is
  ignored (``terminal`` keeps the first) and diagnosed (``second_terminal``, and its summary).
* ``session.started|resumed`` -> ``sessionState`` running, ``.closed`` closed, ``.failed`` failed
  (start ``not_started``). ``turn.started`` -> ``turnState`` running and ``activeTurnId``;
  ``turn.completed|failed|interrupted|cancelled`` -> that state, no active turn. The terminal
  changes neither (it reports its own turn/run states).
* ``item.started|delta|completed|failed`` with an ``itemId`` -> one item per id, in first-seen
  order: ``delta`` appends ``payload.text``, the others replace the text when they carry one
  (the completed text is authoritative); status running / completed / failed, and a finished
  item is not reopened by a late delta.
* ``runtime_request.created`` -> a request (``payload.request``; first creation wins);
  ``.resolved|expired|cancelled`` (``payload.requestId`` or ``payload.request.requestId``) closes
  a pending one with that status (a closed request stays closed).
* ``run.result.proposed`` -> ``proposedResult`` (the latest before the terminal; one after it is
  ignored and diagnosed ``result_after_terminal``).
* ``usage.reported`` -> ``usage``: ``runDelta`` summed only from reports with
  ``runDeltaAvailable`` true; ``cumulative`` is the latest session figure, never summed.
* v2: ``session.goal.snapshot|updated`` -> ``sessionGoal`` = ``payload.goal`` (may be null),
  ``session.goal.cleared`` -> null; ``session.capabilities.updated`` -> the snapshot's
  ``capabilities.sessionGoals``. ``auth.credentials.updated`` and ``runtime.activity.recorded``
  only get a timeline summary (the projections keep them on the session, never a secret).
* Anything else is kept in the timeline (summary: the event type with dots as spaces).

Output: the upstream key order (``SNAPSHOT_KEYS``), then, only when they have content,
``usage``, ``sessionGoal`` and ``diagnostics`` — so a snapshot of events upstream's goldens cover
is byte-identical to them. ``fixtureName`` is the fixture's ``name``; for a live run (no name) it
is ``"live:<identity.runId>"``.
"""
from __future__ import annotations

import copy

from . import contract

SNAPSHOT_SCHEMA = "paperclip.prp.session-snapshot.v1"
MAX_RECORDED_MISSING = 256
LIVE_NAME_PREFIX = "live:"
SNAPSHOT_KEYS = (
    "schema", "fixtureName", "identity", "capabilities", "runPhase", "sessionState", "turnState",
    "activeTurnId", "items", "requests", "proposedResult", "terminal", "timeline", "sourceCursors",
    "processedEventIds", "duplicateEventIds", "outOfOrderEventIds", "gaps", "integrity",
)
EXTENSION_KEYS = ("usage", "sessionGoal", "diagnostics")
INTEGRITY_COMPLETE, INTEGRITY_GAP, INTEGRITY_CONFLICT = "complete", "gap_detected", "conflict"

_SESSION_STATES = {"session.started": "running", "session.resumed": "running",
                   "session.closed": "closed", "session.failed": "failed"}
_TURN_ENDS = {"turn.completed": "completed", "turn.failed": "failed",
              "turn.interrupted": "interrupted", "turn.cancelled": "cancelled"}
_ITEM_STATUS = {"item.started": "running", "item.delta": "running",
                "item.completed": "completed", "item.failed": "failed"}
_REQUEST_CLOSERS = {"runtime_request.resolved": "resolved", "runtime_request.expired": "expired",
                    "runtime_request.cancelled": "cancelled"}
_MEASUREMENT_KEYS = ("inputTokens", "outputTokens", "cacheReadTokens", "cacheWriteTokens",
                     "activeSeconds", "requests", "providerCostUsd")


def _obj(value) -> dict:
    return value if isinstance(value, dict) else {}


def _text(value, default: str = "") -> str:
    return value if isinstance(value, str) else default


def _humanize(value: str) -> str:
    return value.replace("_", " ")


def _sentence(value: str) -> str:
    return value[:1].upper() + value[1:]


def _request_line(request_type: str, prompt: str) -> str:
    return f"{request_type}: {prompt}" if prompt else f"{request_type} request"


def _add(total, value):
    """Sum for a usage measurement field; None (not reported) stays out of the sum."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return total
    if total is None:
        return value
    result = total + value
    return round(result, 9) if isinstance(result, float) else result  # no float noise in output


class _Session:
    """The mutable state of one reduction; ``snapshot()`` renders it."""

    def __init__(self, identity, capabilities, fixture_name):
        self.identity = copy.deepcopy(identity) if isinstance(identity, dict) else {}
        self.capabilities = copy.deepcopy(capabilities) if isinstance(capabilities, dict) else {}
        if fixture_name is None:
            fixture_name = LIVE_NAME_PREFIX + str(self.identity.get("runId", ""))
        self.fixture_name = fixture_name
        self.run_phase = "queued"
        self.session_state = "not_started"
        self.turn_state = "not_started"
        self.active_turn_id = None
        self.items: dict[str, dict] = {}
        self.requests: dict[str, dict] = {}
        self.proposed_result = None
        self.terminal = None
        self.timeline: list[dict] = []
        self.cursors: dict[str, int] = {}
        self.processed: list[str] = []
        self.duplicates: set[str] = set()
        self.out_of_order: list[str] = []
        self.gaps: list[dict] = []
        self.seen: dict[str, str] = {}  # sourceEventId -> digest of its first delivery
        self.conflict = False
        self.usage = None
        self.goal_seen, self.goal = False, None
        self.diagnostics: list[dict] = []

    # ------------------------------------------------------------ delivery

    def offer(self, event) -> None:
        event = _obj(event)
        event_id = str(event.get("sourceEventId", ""))
        fingerprint = contract.digest(event)
        first = self.seen.get(event_id)
        if first is not None:
            self.duplicates.add(event_id)
            if first != fingerprint:
                self.conflict = True
                self._diagnose(event, "conflicting_duplicate",
                               "repeated sourceEventId with different canonical bytes; the first delivery is kept")
            return
        self.seen[event_id] = fingerprint
        key = f"{event.get('sourceKind')}:{event.get('sourceInstanceId')}"
        seq = event.get("sourceSeq")
        seq = seq if isinstance(seq, int) and not isinstance(seq, bool) else 0
        cursor = self.cursors.get(key, 0)
        if seq <= cursor:
            self.out_of_order.append(event_id)
            return
        if seq > cursor + 1:
            self._gap(key, cursor + 1, seq)
        self.cursors[key] = seq
        self.processed.append(event_id)
        entry = {"position": len(self.timeline) + 1, "sourceEventId": event_id, "sourceSeq": seq,
                 "eventType": event.get("eventType"), "emittedAt": event.get("emittedAt")}
        if "itemId" in event:
            entry["itemId"] = event["itemId"]
        entry["summary"] = self._apply(event)
        self.timeline.append(entry)

    def _gap(self, key: str, expected: int, received: int) -> None:
        missing_count = received - expected
        recorded = min(missing_count, MAX_RECORDED_MISSING)
        self.gaps.append({"sourceKey": key, "expected": expected, "received": received,
                          "missingCount": missing_count,
                          "missing": list(range(expected, expected + recorded)),
                          "truncated": recorded < missing_count})

    def _diagnose(self, event: dict, code: str, detail: str) -> None:
        self.diagnostics.append({"sourceEventId": str(event.get("sourceEventId", "")),
                                 "sourceSeq": event.get("sourceSeq"), "code": code, "detail": detail})

    # ------------------------------------------------------------ projections

    def _apply(self, event: dict) -> str:
        """Apply one in-order event; returns its timeline summary."""
        event_type = _text(event.get("eventType"))
        payload = _obj(event.get("payload"))
        if event_type in _SESSION_STATES:
            self.session_state = _SESSION_STATES[event_type]
        elif event_type in _TURN_ENDS:
            self.turn_state, self.active_turn_id = _TURN_ENDS[event_type], None
        elif event_type in _ITEM_STATUS:
            return self._item(event, event_type, payload)
        elif event_type in _REQUEST_CLOSERS:
            return self._close_request(event_type, payload)
        elif event_type in _HANDLERS:
            return _HANDLERS[event_type](self, event, payload)
        return _default_summary(event_type, payload)

    def _phase(self, event, payload) -> str:
        phase = _text(payload.get("phase"), "unknown")
        if self.terminal is None:  # terminal is final
            self.run_phase = phase
        return f"Phase changed to {_humanize(phase)}"

    def _turn_started(self, event, payload) -> str:
        self.turn_state = "running"
        self.active_turn_id = event.get("turnId")
        return "turn started"

    def _item(self, event, event_type, payload) -> str:
        kind = payload.get("kind")
        if event_type == "item.started":
            summary = f"Started {_text(kind, 'item')}"
        elif event_type == "item.delta":
            summary = _text(payload.get("text"), "Item updated")
        elif event_type == "item.completed":
            summary = f"Completed {_text(kind, 'item')}"
        else:
            summary = _text(payload.get("message"), "Item failed")
        item_id = event.get("itemId")
        if not isinstance(item_id, str):
            return summary
        text = _text(payload.get("text"))
        item = self.items.get(item_id)
        if item is None:
            item = self.items[item_id] = {"itemId": item_id, "kind": _text(kind, "unknown"),
                                          "status": _ITEM_STATUS[event_type], "text": text}
            return summary
        if isinstance(kind, str):
            item["kind"] = kind
        finished = item["status"] in ("completed", "failed")
        if event_type == "item.delta":
            item["text"] += text
        elif text:
            item["text"] = text
        if not (finished and _ITEM_STATUS[event_type] == "running"):
            item["status"] = _ITEM_STATUS[event_type]
        return summary

    def _request_created(self, event, payload) -> str:
        request = _obj(payload.get("request")) or payload
        request_type = _text(request.get("type"), "runtime")
        prompt = _text(request.get("prompt"))
        request_id = _text(request.get("requestId"))
        if request_id and request_id not in self.requests:
            self.requests[request_id] = {"requestId": request_id,
                                         "requestKind": _text(request.get("requestKind"), "runtime"),
                                         "type": request_type,
                                         "status": _text(request.get("status"), "pending"),
                                         "prompt": prompt}
        return _request_line(request_type, prompt)

    def _close_request(self, event_type, payload) -> str:
        request_id = _text(payload.get("requestId")) or _text(_obj(payload.get("request")).get("requestId"))
        status = _REQUEST_CLOSERS[event_type]
        action = _sentence(status)
        request = self.requests.get(request_id)
        if request is None:
            return f"{action} runtime request {request_id}".strip()
        if request["status"] == "pending":
            request["status"] = status
        return f"{action} {_request_line(request['type'], request['prompt'])}"

    def _result(self, event, payload) -> str:
        summary = _text(payload.get("summary"), "Structured result proposed")
        if self.terminal is not None:
            self._diagnose(event, "result_after_terminal", "run.result.proposed after run.terminal; ignored")
            return f"Result after terminal ignored: {summary}"
        self.proposed_result = copy.deepcopy(payload)
        return summary

    def _terminal(self, event, payload) -> str:
        state = _text(payload.get("runTerminalState"), "terminal")
        if self.terminal is not None:
            first = _text(self.terminal.get("runTerminalState"), "terminal")
            self._diagnose(event, "second_terminal", f"a second run.terminal ({state}) after the run ended {first}; ignored")
            return f"Second terminal ignored (run already {first})"
        self.terminal = copy.deepcopy(payload)
        self.run_phase = "terminal"
        return f"Run {state}"

    def _usage(self, event, payload) -> str:
        usage = self.usage or {"reports": 0, "runDeltaReports": 0, "runDelta": None, "cumulative": None}
        usage["reports"] += 1
        if isinstance(payload.get("cumulative"), dict):
            usage["cumulative"] = copy.deepcopy(payload["cumulative"])  # a session figure: replaced
        delta = payload.get("runDelta")
        counted = payload.get("runDeltaAvailable") is True and isinstance(delta, dict)
        if counted:
            total = usage["runDelta"] or {}
            usage["runDelta"] = {key: _add(total.get(key), delta.get(key)) for key in _MEASUREMENT_KEYS}
            usage["runDeltaReports"] += 1
        self.usage = usage
        provider = _text(payload.get("provider"), "provider")
        if not counted:
            return f"Usage reported by {provider}: no run delta (cumulative only, not counted)"
        return (f"Usage reported by {provider}: {delta.get('inputTokens', 0)} input / "
                f"{delta.get('outputTokens', 0)} output tokens this run")

    def _goal(self, event, payload) -> str:
        self.goal_seen = True
        if event.get("eventType") == "session.goal.cleared":
            self.goal = None
            return "Goal cleared"
        goal = payload.get("goal")
        self.goal = copy.deepcopy(goal) if isinstance(goal, dict) else None
        if self.goal is None:
            return "No session goal"
        return f"Goal {_humanize(_text(self.goal.get('status'), 'unknown'))}: {_text(self.goal.get('objective'))}"

    def _capabilities_updated(self, event, payload) -> str:
        goals = payload.get("sessionGoals")
        if isinstance(goals, dict):
            self.capabilities["sessionGoals"] = copy.deepcopy(goals)
            return f"Session goals {_humanize(_text(goals.get('availability'), 'unknown'))}"
        return "session capabilities updated"

    def _credentials(self, event, payload) -> str:
        # Only the documented, secret-free fields are named; the payload itself is not kept.
        return (f"Credentials updated: {_text(payload.get('provider'), 'provider')} "
                f"{_text(payload.get('bindingId'), 'binding')} revision {payload.get('revision')}")

    def _activity(self, event, payload) -> str:
        return f"Activity {_text(payload.get('namespace'))}/{_text(payload.get('activityKey'))}"

    # ------------------------------------------------------------ output

    def integrity(self) -> str:
        if self.conflict:
            return INTEGRITY_CONFLICT
        return INTEGRITY_GAP if self.gaps or self.out_of_order else INTEGRITY_COMPLETE

    def snapshot(self) -> dict:
        doc = {
            "schema": SNAPSHOT_SCHEMA,
            "fixtureName": self.fixture_name,
            "identity": self.identity,
            "capabilities": self.capabilities,
            "runPhase": self.run_phase,
            "sessionState": self.session_state,
            "turnState": self.turn_state,
            "activeTurnId": self.active_turn_id,
            "items": list(self.items.values()),
            "requests": list(self.requests.values()),
            "proposedResult": self.proposed_result,
            "terminal": self.terminal,
            "timeline": self.timeline,
            "sourceCursors": dict(self.cursors),
            "processedEventIds": self.processed,
            "duplicateEventIds": sorted(self.duplicates),
            "outOfOrderEventIds": self.out_of_order,
            "gaps": self.gaps,
            "integrity": self.integrity(),
        }
        if self.usage is not None:
            doc["usage"] = self.usage
        if self.goal_seen:
            doc["sessionGoal"] = self.goal
        if self.diagnostics:
            doc["diagnostics"] = self.diagnostics
        return doc


def _default_summary(event_type: str, payload: dict) -> str:
    if event_type in ("runner.diagnostic", "harness.diagnostic"):
        message, code = _text(payload.get("message")), _text(payload.get("code"))
        if message or code:
            return message or _sentence(_humanize(code))
    return event_type.replace(".", " ")


_HANDLERS = {
    "runtime.phase.changed": _Session._phase,
    "turn.started": _Session._turn_started,
    "runtime_request.created": _Session._request_created,
    "run.result.proposed": _Session._result,
    "run.terminal": _Session._terminal,
    "usage.reported": _Session._usage,
    "session.goal.snapshot": _Session._goal,
    "session.goal.updated": _Session._goal,
    "session.goal.cleared": _Session._goal,
    "session.capabilities.updated": _Session._capabilities_updated,
    "auth.credentials.updated": _Session._credentials,
    "runtime.activity.recorded": _Session._activity,
}


def reduce_session(*, identity: dict, capabilities: dict, events, fixture_name: str | None = None) -> dict:
    """The session snapshot (``paperclip.prp.session-snapshot.v1``) of ``events`` in the given
    order (a fixture's order, or the run's commit order). ``fixture_name`` None: a live run."""
    session = _Session(identity, capabilities, fixture_name)
    for event in events:
        session.offer(event)
    return session.snapshot()


def parity_summary(snapshot: dict) -> dict:
    """The compact parity summary of a snapshot (upstream's ``golden/*.summary.json`` format)."""
    terminal = _obj(snapshot.get("terminal"))
    return {
        "runId": _obj(snapshot.get("identity")).get("runId"),
        "integrity": snapshot.get("integrity"),
        "timelineCount": len(snapshot.get("timeline") or ()),
        "duplicateEventIds": list(snapshot.get("duplicateEventIds") or ()),
        "gaps": copy.deepcopy(list(snapshot.get("gaps") or ())),
        "turnTerminalState": terminal.get("turnTerminalState"),
        "runTerminalState": terminal.get("runTerminalState"),
    }


def replay_fixture(doc: dict) -> dict:
    """Validate a replay fixture (fail closed: ``ContractError`` propagates), then reduce it."""
    contract.validate_fixture(doc)
    return reduce_session(identity=doc["identity"], capabilities=doc["capabilities"],
                          events=doc["events"], fixture_name=doc["name"])
