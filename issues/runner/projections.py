"""PRP projections: what a committed event changes beyond the run log (issue #17).

The intake calls :func:`project_events` inside the transaction that stores the events, with the
run row locked and then the session row, and has already written one run-log line per event and
counted it as liveness. By ``eventType``:

* ``usage.reported`` (``usage.schema.json``) — spend counts ``runDelta`` only when
  ``runDeltaAvailable`` is true; ``cumulative`` is the provider session's figure, kept on
  ``session.usage["cumulative"]`` (replaced by each report, never summed). Mapping of a delta:
  ``inputTokens`` / ``outputTokens`` -> the run's input/output tokens and the ledger row's,
  ``cacheReadTokens`` -> the ledger's ``cached_input_tokens``, ``providerCostUsd`` (US dollars,
  null = unknown = 0) -> cents. Cents are charged from the run's exact dollar total per
  provider/model (``session.usage["charged"]``): ``round_half_up(total × 100)`` minus what was
  charged before, so many sub-cent deltas still add up. The batch's deltas are one ledger row per
  provider/model (``services.costs.ledger_record``, the ledger every run's spend goes through; the
  run's totals grow with saturation, ``services.runs.run_usage_add``); when the agent's (or the
  company's) budget is reached and the run does not end in this batch, the hard stop is
  ``run.cancel`` over the command lane (``host_control.request_stop``), with that stop's reason.
* ``run.result.proposed`` — ``session.proposed_result`` (the latest before the terminal; one after
  it is ignored, logged and listed in ``session.decision["ignoredResults"]``).
* ``run.terminal`` — the first sets ``session.terminal`` / ``terminal_event_id``; the host decides
  (:mod:`.decisions`), changes the issue if its rules allow, sets the run's result fields and ends
  the run with ``run_finish`` (succeeded / failed / cancelled from ``runTerminalState``; locks
  released as for every run). A second terminal changes nothing: a system line in the run log and
  its id in ``session.decision["ignoredTerminals"]``.
* ``session.goal.snapshot`` / ``.updated`` -> ``session.goal`` (may be null), ``.cleared`` -> null,
  ``session.capabilities.updated`` -> ``session.goal_capability`` (its ``sessionGoals``).
* ``auth.credentials.updated`` -> ``session.credentials["<provider>/<bindingId>"]`` =
  ``{provider, bindingId, revision, detection, sourceEventId, recordedAt}`` — the payload's four
  fields and nothing else (no secret can be stored); a revision never moves back (an older or equal
  one is ignored); each advance is audited (``run.credentials_updated``, the same fields).
* ``runtime.activity.recorded`` -> ``session.activity[namespace][activityKey]`` =
  ``{count, lastSourceEventId, lastEmittedAt}``.
* ``runtime_request.*`` -> ``requests.project_request_event`` (interactions).
* anything else: the log line only.

Cost: the in-memory projections cost no query; the session is saved once per batch (only the
fields that changed), usage is one flush per batch, a credential advance one audit row, a
diagnosed event one log line, a terminal its decision and ``run_finish`` — constant per event.
"""
from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from issues.actors import Actor
from issues.choices import LIVE_RUN_STATUSES
from issues.models import HeartbeatRun, RunnerEvent, RunnerSession
from issues.services import runs as run_services
from issues.services.activity import activity_record
from issues.services.costs import ledger_record

from . import decisions, host_control, requests
from .commands import iso_now

MAX_ACTIVITY_KEYS = 1000  # distinct namespace/activityKey pairs kept per run (later ones: logged only)
MAX_CREDENTIAL_BINDINGS = 100
MAX_IGNORED_IDS = 100  # ids kept in session.decision's ignored lists (the log keeps every one)
COST_PLACES = Decimal("0.000000001")
USD_MAX = Decimal(run_services.USAGE_MAX) / 100  # the most the ledger can charge, in dollars
USAGE_MAX = run_services.USAGE_MAX


def _payload(event: RunnerEvent) -> dict:
    payload = event.envelope.get("payload") if isinstance(event.envelope, dict) else None
    return payload if isinstance(payload, dict) else {}


def _int(value) -> int:
    """A count from the runner; the schema sets no maximum, the ledger's columns do (saturate)."""
    return min(value, USAGE_MAX) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _sum(a: int, b: int) -> int:
    return min(a + b, USAGE_MAX)


def _usd(value) -> Decimal:
    """A measurement's providerCostUsd as an exact decimal (its shortest repr: 0.1 is 0.1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return Decimal(0)
    try:
        return min(Decimal(repr(value)), USD_MAX).quantize(COST_PLACES)
    except InvalidOperation:
        return Decimal(0)


class _Batch:
    """One call of project_events: in-memory changes to the session, the usage to flush, and the
    first terminal, applied in :meth:`finish`."""

    def __init__(self, session: RunnerSession):
        self.session = session
        self.changed: set[str] = set()
        self._run: HeartbeatRun | None = None
        self.usage: dict[tuple[str, str], dict] = {}  # (provider, model) -> summed delta
        self.terminal: RunnerEvent | None = None
        self.had_terminal = bool(session.terminal_event_id) or session.terminal is not None

    @property
    def run(self) -> HeartbeatRun:
        if self._run is None:  # locked by the intake already; read once per batch
            self._run = HeartbeatRun.objects.select_related("agent").get(pk=self.session.pk)
        return self._run

    def touch(self, *fields: str):
        self.changed.update(fields)

    def _decision(self) -> dict:
        if not isinstance(self.session.decision, dict):
            self.session.decision = {}
        return self.session.decision

    def diagnose(self, event: RunnerEvent, key: str, message: str):
        """An event the host ignores: its id on session.decision[key] and a line in the run log."""
        ids = self._decision().setdefault(key, [])
        if len(ids) < MAX_IGNORED_IDS:
            ids.append(event.source_event_id)
        self.touch("decision")
        host_control.log(self.session.pk, message, sourceEventId=event.source_event_id, eventType=event.event_type)

    # --- per event ---------------------------------------------------------------------------------
    def usage_reported(self, event: RunnerEvent):
        payload, session = _payload(event), self.session
        usage = session.usage if isinstance(session.usage, dict) else {}
        usage.update(cumulative=payload.get("cumulative"), provider=payload.get("provider"),
                     model=payload.get("model"), providerSessionId=payload.get("providerSessionId"),
                     costSource=payload.get("costSource"), sourceEventId=event.source_event_id,
                     reports=int(usage.get("reports") or 0) + 1)
        delta = payload.get("runDelta")
        if payload.get("runDeltaAvailable") is True and isinstance(delta, dict):
            usage["runDeltaReports"] = int(usage.get("runDeltaReports") or 0) + 1
            key = (str(payload.get("provider") or "unknown")[:100], str(payload.get("model") or "")[:200])
            total = self.usage.setdefault(key, {"input": 0, "output": 0, "cached": 0, "usd": Decimal(0)})
            total["input"] = _sum(total["input"], _int(delta.get("inputTokens")))
            total["output"] = _sum(total["output"], _int(delta.get("outputTokens")))
            total["cached"] = _sum(total["cached"], _int(delta.get("cacheReadTokens")))
            total["usd"] = min(total["usd"] + _usd(delta.get("providerCostUsd")), USD_MAX)
        session.usage = usage
        self.touch("usage")

    def result_proposed(self, event: RunnerEvent):
        if self.had_terminal or self.terminal is not None:
            self.diagnose(event, "ignoredResults", f"run.result.proposed {event.source_event_id} after the run's "
                                                   "terminal: ignored.")
            return
        self.session.proposed_result = _payload(event)
        self.touch("proposed_result")

    def terminal_reported(self, event: RunnerEvent):
        if self.had_terminal or self.terminal is not None:
            first = self.session.terminal_event_id or (self.terminal.source_event_id if self.terminal else "")
            self.diagnose(event, "ignoredTerminals", f"Second run.terminal {event.source_event_id} ignored: the "
                                                     f"run's terminal is {first}; nothing changes.")
            return
        self.terminal = event
        self.session.terminal, self.session.terminal_event_id = _payload(event), event.source_event_id
        self.touch("terminal", "terminal_event_id")

    def goal(self, event: RunnerEvent):
        goal = _payload(event).get("goal") if event.event_type != "session.goal.cleared" else None
        self.session.goal = goal if isinstance(goal, dict) else None
        self.touch("goal")

    def capabilities_updated(self, event: RunnerEvent):
        capability = _payload(event).get("sessionGoals")
        if isinstance(capability, dict):
            self.session.goal_capability = capability
            self.touch("goal_capability")

    def credentials_updated(self, event: RunnerEvent):
        payload = _payload(event)
        provider, binding, revision = payload.get("provider"), payload.get("bindingId"), _int(payload.get("revision"))
        if not (isinstance(provider, str) and isinstance(binding, str) and revision):
            return  # the contract refuses such an event; nothing to record
        credentials = self.session.credentials if isinstance(self.session.credentials, dict) else {}
        key = f"{provider}/{binding}"
        previous = credentials.get(key) if isinstance(credentials.get(key), dict) else None
        if previous is not None and _int(previous.get("revision")) >= revision:
            return  # a revision never moves back (a redelivery after a restart, or coalesced updates)
        if previous is None and len(credentials) >= MAX_CREDENTIAL_BINDINGS:
            host_control.log(self.session.pk, f"auth.credentials.updated for {key} not recorded: more than "
                                              f"{MAX_CREDENTIAL_BINDINGS} bindings.",
                             sourceEventId=event.source_event_id)
            return
        entry = {"provider": provider, "bindingId": binding, "revision": revision,
                 "detection": str(payload.get("detection") or ""), "sourceEventId": event.source_event_id,
                 "recordedAt": iso_now()}
        credentials[key] = entry
        self.session.credentials = credentials
        self.touch("credentials")
        run = self.run
        activity_record(actor=Actor(agent=run.agent, _run=run), company_id=run.company_id,
                        action="run.credentials_updated", entity_type="run", entity_id=run.pk, run=run,
                        details={**{k: entry[k] for k in ("provider", "bindingId", "revision", "detection",
                                                          "sourceEventId")},
                                 "previousRevision": previous.get("revision") if previous else None})

    def activity_recorded(self, event: RunnerEvent):
        payload = _payload(event)
        namespace, key = payload.get("namespace"), payload.get("activityKey")
        if not (isinstance(namespace, str) and isinstance(key, str)):
            return
        activity = self.session.activity if isinstance(self.session.activity, dict) else {}
        keys = activity.get(namespace) if isinstance(activity.get(namespace), dict) else {}
        entry = keys.get(key) if isinstance(keys.get(key), dict) else None
        if entry is None and sum(len(v) for v in activity.values() if isinstance(v, dict)) >= MAX_ACTIVITY_KEYS:
            host_control.log(self.session.pk, f"runtime.activity.recorded {namespace}/{key} not counted: more than "
                                              f"{MAX_ACTIVITY_KEYS} distinct activities.",
                             sourceEventId=event.source_event_id)
            return
        keys[key] = {"count": int((entry or {}).get("count") or 0) + 1, "lastSourceEventId": event.source_event_id,
                     "lastEmittedAt": event.envelope.get("emittedAt")}
        activity[namespace] = keys
        self.session.activity = activity
        self.touch("activity")

    def runtime_request(self, event: RunnerEvent):
        requests.project_request_event(session=self.session, event=event)

    # --- once per batch ---------------------------------------------------------------------------------
    def _flush_usage(self) -> str | None:
        """The batch's run deltas into the run's totals and the ledger. Returns the budget stop reached
        (``budget_exceeded``, ``company_budget_exceeded``: costs.spend_add), or None."""
        if not self.usage:
            return None
        run, usage = self.run, self.session.usage
        charged = usage.setdefault("charged", {})
        reached = None
        for (provider, model), total in self.usage.items():
            key = f"{provider}/{model}"
            mark = charged.get(key) if isinstance(charged.get(key), dict) else {"costUsd": "0", "cents": 0}
            usd = min(Decimal(str(mark.get("costUsd") or "0")) + total["usd"], USD_MAX)
            cents = max(int((usd * 100).quantize(Decimal(1), rounding=ROUND_HALF_UP)) - int(mark.get("cents") or 0), 0)
            charged[key] = {"costUsd": str(usd), "cents": _sum(int(mark.get("cents") or 0), cents)}
            if not (cents or total["input"] or total["output"] or total["cached"]):
                continue
            run_services.run_usage_add(run, input_tokens=total["input"], output_tokens=total["output"],
                                       cost_cents=cents)
            _, crossed = ledger_record(
                company_id=run.company_id, agent_id=run.agent_id, cost_cents=cents, provider=provider, model=model,
                biller=provider, input_tokens=total["input"], cached_input_tokens=total["cached"],
                output_tokens=total["output"], run=run, issue_id=run.issue_id)
            reached = crossed or reached  # the company's stop, once reached, is every later one
        return reached

    def _end_run(self):
        """The first terminal: decide, apply, record the result fields, end the run."""
        run, session, event = self.run, self.session, self.terminal
        terminal = session.terminal if isinstance(session.terminal, dict) else {}
        result = session.proposed_result if isinstance(session.proposed_result, dict) else None
        decision = decisions.decide(run=run, terminal=terminal, result=result, terminal_event_id=event.source_event_id)
        if run.status in LIVE_RUN_STATUSES:
            decision = decisions.apply(run=run, decision=decision)
        fields = decisions.result_fields(decision, result)
        HeartbeatRun.objects.filter(pk=run.pk).update(**fields)
        session.decision = {**self._decision(), **decision}
        self.touch("decision")
        self._save()
        status = decision["runStatus"]
        error = ""
        if status != "succeeded":
            stop = terminal.get("stopReason") if isinstance(terminal.get("stopReason"), dict) else {}
            error = f"runner reported run {status} (turn {terminal.get('turnTerminalState')})"
            if stop.get("code") or stop.get("kind"):
                error += f": {stop.get('kind') or 'stop'} {stop.get('code') or ''}".rstrip()
        run_services.run_finish(run=run, status=status, error=error)

    def _save(self):
        if self.changed:
            self.session.save(update_fields=sorted(self.changed | {"updated_at"}))
            self.changed = set()

    def finish(self):
        reached = self._flush_usage()
        if self.terminal is not None:
            self._end_run()
            return
        self._save()
        if reached and self.run.status in LIVE_RUN_STATUSES:
            # The hard stop, as for other runs, but over the command lane: the runner confirms with its terminal.
            host_control.request_stop(run=self.run, session=self.session, reason=reached,
                                      command_type=host_control.RUN_CANCEL)


_HANDLERS = {
    "usage.reported": _Batch.usage_reported,
    "run.result.proposed": _Batch.result_proposed,
    "run.terminal": _Batch.terminal_reported,
    "session.goal.snapshot": _Batch.goal,
    "session.goal.updated": _Batch.goal,
    "session.goal.cleared": _Batch.goal,
    "session.capabilities.updated": _Batch.capabilities_updated,
    "auth.credentials.updated": _Batch.credentials_updated,
    "runtime.activity.recorded": _Batch.activity_recorded,
}


def project_events(*, session: RunnerSession, events: list[RunnerEvent]) -> None:
    """Project the just-stored ``events`` (commit order) of ``session``'s run; see the module doc."""
    batch = _Batch(session)
    for event in events:
        handler = _HANDLERS.get(event.event_type)
        if handler is not None:
            handler(batch, event)
        elif event.event_type.startswith("runtime_request."):
            batch.runtime_request(event)
    batch.finish()


def runner_state(session: RunnerSession) -> dict:
    """The projections of a session as the run detail API shows them (``GET /api/runs/{id}``: the
    ``runner`` object). Never a secret: credentials hold revisions only."""
    return {
        "protocolVersion": session.protocol_version,
        "helloAt": session.hello_at.isoformat() if session.hello_at else None,
        "eventCount": session.event_count,
        "controllerSeq": session.controller_seq,
        "proposedResult": session.proposed_result,
        "terminal": session.terminal,
        "terminalEventId": session.terminal_event_id or None,
        "decision": session.decision or {},
        "usage": session.usage or {},
        "goal": session.goal,
        "goalCapability": session.goal_capability,
        "credentials": session.credentials or {},
        "activity": session.activity or {},
    }
