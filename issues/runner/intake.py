"""PRP event intake: one batch of envelopes, committed in one transaction, then acknowledged.

Delivery rules (per source ``<sourceKind>:<sourceInstanceId>``, cursor = RunnerSource.acked_seq):

* a ``sourceEventId`` already stored (or earlier in the batch) with the same digest (canonical
  JSON of the envelope as received) is a duplicate: acknowledged again, no second effect; with
  different bytes it is a protocol violation (409 ``event_conflict``, the whole batch rolled back);
* a new event must be ``cursor + 1``; a new id at ``seq <= cursor`` is 409 ``sequence_conflict``;
* ``seq > cursor + 1`` is a forward gap: held, and accepted if the missing events arrive later in
  the same batch (out-of-order delivery inside a batch); otherwise left out, not acknowledged past,
  and reported with the expected sequence. An ACK never moves backwards.

Cost: a fixed number of statements per batch whatever its size (one read of the stored ids, one
of the cursors, two bulk inserts, one cursor upsert, one session and one run update, plus the
projections), so a runner's throughput grows with its batch size. Validation runs before the
locks are taken.
"""
from __future__ import annotations

from django.db import transaction
from django.db.models import F
from django.db.models.functions import Coalesce
from django.utils import timezone

from issues.choices import RunEventKind, RunStatus
from issues.exceptions import ApiError, Conflict, InvalidInput
from issues.models import HeartbeatRun, RunEvent, RunnerEvent, RunnerSession, RunnerSource

from . import contract, projections
from .negotiation import contract_error, hello_required, lock_run, lock_session, max_batch, max_batch_bytes, run_not_live


def batch_too_large(count: int) -> ApiError:
    return ApiError(f"A batch carries at most {max_batch()} events.", code="batch_too_large", status_code=413,
                    details={"maxEvents": max_batch(), "events": count})


def body_too_large(size: int | None) -> ApiError:
    return ApiError(f"An event batch is at most {max_batch_bytes()} bytes.", code="payload_too_large",
                    status_code=413, details={"maxBytes": max_batch_bytes(), "bytes": size})


def source_key_of(envelope: dict) -> str:
    return f"{envelope['sourceKind']}:{envelope['sourceInstanceId']}"


def _events_of(body) -> list:
    events = body.get("events") if isinstance(body, dict) else None
    if not isinstance(events, list) or not events:
        raise InvalidInput(details={"events": ["A non-empty list of event envelopes is required."]})
    if len(events) > max_batch():
        raise batch_too_large(len(events))
    return events


def _validate(events: list, *, run_id: str, version: int) -> list[str]:
    """Every envelope against the negotiated contract (any failure rejects the batch); returns
    their digests."""
    digests = []
    for i, env in enumerate(events):
        try:
            contract.validate_event(env, protocol_version=version)
        except contract.ContractError as err:
            raise contract_error(err, path_prefix=f"$.events[{i}]", field=f"events[{i}]", event=i)
        if env["runId"] != run_id:
            message = "The envelope names another run than the path."
            raise InvalidInput(message, code="run_mismatch", details={
                f"events[{i}]": [message], "event": i, "path": f"$.events[{i}].runId", "value": env["runId"],
                "expected": run_id})
        digests.append(contract.digest(env))
    return digests


def _conflict(code: str, message: str, i: int, env: dict, **details) -> Conflict:
    return Conflict(message, code=code, details={
        f"events[{i}]": [message], "event": i, "path": f"$.events[{i}]", "sourceEventId": env["sourceEventId"],
        "sourceKey": source_key_of(env), "sourceSeq": env["sourceSeq"], **details})


class _Plan:
    """What a batch does, decided under the locks before anything is written."""

    def __init__(self, cursors: dict):
        self.cursors = dict(cursors)  # source key -> acked seq, advanced as events are accepted
        self.accepted: list[tuple[dict, str]] = []  # (envelope, digest) in acceptance order
        self.duplicates: list[str] = []
        self.held: dict[str, dict[int, tuple[int, dict, str]]] = {}  # key -> seq -> (index, env, digest)

    def accept(self, key: str, env: dict, dig: str):
        self.accepted.append((env, dig))
        self.cursors[key] = env["sourceSeq"]
        held = self.held.get(key, {})
        while self.cursors[key] + 1 in held:  # a held event whose gap just closed
            _, nxt, nxt_dig = held.pop(self.cursors[key] + 1)
            self.accepted.append((nxt, nxt_dig))
            self.cursors[key] = nxt["sourceSeq"]


def _plan(events, digests, *, stored: dict, cursors: dict) -> _Plan:
    plan, seen = _Plan(cursors), {}
    for i, (env, dig) in enumerate(zip(events, digests)):
        event_id, key, seq = env["sourceEventId"], source_key_of(env), env["sourceSeq"]
        known = stored.get(event_id) or seen.get(event_id)
        if known is not None:
            if known != dig:
                raise _conflict("event_conflict", "This sourceEventId was already received with different "
                                "content (canonical JSON differs).", i, env)
            plan.duplicates.append(event_id)
            continue
        seen[event_id] = dig
        cursor = plan.cursors.setdefault(key, 0)
        held = plan.held.setdefault(key, {})
        if seq <= cursor or seq in held:
            raise _conflict("sequence_conflict", "Another event already holds this sourceSeq for its source.",
                            i, env, ackedSourceSeq=cursor)
        if seq == cursor + 1:
            plan.accept(key, env, dig)
        else:
            held[seq] = (i, env, dig)
    return plan


def _ack_body(events, plan: _Plan) -> dict:
    keys = list(dict.fromkeys(source_key_of(env) for env in events))
    acks = {key: plan.cursors.get(key, 0) for key in keys}
    body = {"ackedSourceSeq": acks[keys[0]], "acks": acks, "accepted": len(plan.accepted),
            "duplicates": plan.duplicates}
    gaps = [{"sourceKey": key, "expectedSeq": plan.cursors[key] + 1, "heldSeqs": sorted(held),
             "sourceEventIds": [held[s][1]["sourceEventId"] for s in sorted(held)]}
            for key, held in plan.held.items() if held]
    if gaps:
        body["expected"] = {gap["sourceKey"]: gap["expectedSeq"] for gap in gaps}
        body["gaps"] = gaps
    return body


_SHOWN_TEXT = ("text", "message", "summary", "prompt")


def _summary(env: dict, key: str) -> str:
    """The run-log line of an event: its type and source, and the first words it carries (a log
    line, a diagnostic, a result's summary) so the run page reads like a log."""
    line = f"{env['eventType']} ({key} #{env['sourceSeq']})"
    payload = env.get("payload") if isinstance(env.get("payload"), dict) else {}
    text = next((payload[k] for k in _SHOWN_TEXT if isinstance(payload.get(k), str) and payload[k].strip()), "")
    if text:
        line += ": " + " ".join(text.split())[:240]
    return line[:300]


def _store(run: HeartbeatRun, session: RunnerSession, plan: _Plan, old_cursors: dict, now) -> list[RunnerEvent]:
    n = len(plan.accepted)
    rows = [RunnerEvent(run_id=run.pk, position=session.event_count + 1 + k, source_key=source_key_of(env),
                        source_event_id=env["sourceEventId"], source_seq=env["sourceSeq"],
                        event_type=env["eventType"], digest=dig, envelope=env)
            for k, (env, dig) in enumerate(plan.accepted)]
    rows = RunnerEvent.objects.bulk_create(rows)
    RunEvent.objects.bulk_create([
        RunEvent(run_id=run.pk, seq=run.event_seq + 1 + k, kind=RunEventKind.RUNNER,
                 message=_summary(row.envelope, row.source_key),
                 data={"sourceKey": row.source_key, "sourceEventId": row.source_event_id,
                       "sourceSeq": row.source_seq, "eventType": row.event_type})
        for k, row in enumerate(rows)])
    moved = {key: seq for key, seq in plan.cursors.items() if seq != old_cursors.get(key, 0)}
    new = [RunnerSource(run_id=run.pk, source_key=key, acked_seq=seq) for key, seq in moved.items()
           if key not in old_cursors]
    if new:
        RunnerSource.objects.bulk_create(new)
    changed = [RunnerSource(pk=old_cursors.pk_of[key], acked_seq=seq, updated_at=now)
               for key, seq in moved.items() if key in old_cursors]
    if changed:
        RunnerSource.objects.bulk_update(changed, ["acked_seq", "updated_at"])
    RunnerSession.objects.filter(pk=session.pk).update(event_count=F("event_count") + n, updated_at=now)
    session.event_count += n
    # The run's log seqs for all N events in one statement (run_append_event does one per event),
    # and the events are liveness and activity; a queued run a runner reports on is running.
    updates = {"event_seq": F("event_seq") + n, "last_heartbeat_at": now, "last_activity_at": now, "updated_at": now}
    if run.status == RunStatus.QUEUED:
        updates.update(status=RunStatus.RUNNING, started_at=Coalesce("started_at", now))
    HeartbeatRun.objects.filter(pk=run.pk).update(**updates)
    run.event_seq += n
    return rows


class _Cursors(dict):
    """source key -> acked seq, with the row ids for the update."""
    pk_of: dict


def _cursors(run, keys) -> _Cursors:
    found = _Cursors()
    found.pk_of = {}
    for pk, key, seq in RunnerSource.objects.filter(run=run, source_key__in=keys).values_list(
            "pk", "source_key", "acked_seq"):
        found[key], found.pk_of[key] = seq, pk
    return found


def runner_events(*, run: HeartbeatRun, body) -> dict:
    """Commit a batch and return its acknowledgement (produced after the commit)."""
    events = _events_of(body)
    session = RunnerSession.objects.filter(pk=run.pk).only("protocol_version", "hello_at").first()
    if session is None or session.hello_at is None or not session.protocol_version:
        raise hello_required()
    version = session.protocol_version
    digests = _validate(events, run_id=str(run.pk), version=version)
    with transaction.atomic():
        run = lock_run(run.pk)
        session = lock_session(run)
        if session.protocol_version != version:  # renegotiated meanwhile (only before any event)
            digests = _validate(events, run_id=str(run.pk), version=session.protocol_version)
        keys = {source_key_of(env) for env in events}
        ids = [env["sourceEventId"] for env in events]
        stored = dict(RunnerEvent.objects.filter(run=run, source_event_id__in=ids).values_list(
            "source_event_id", "digest"))
        cursors = _cursors(run, keys)
        plan = _plan(events, digests, stored=stored, cursors=cursors)
        if not run.is_live and (plan.accepted or any(plan.held.values())):
            raise run_not_live(run)  # an ended run takes re-deliveries (re-ACKs) only
        if plan.accepted:
            rows = _store(run, session, plan, cursors, timezone.now())
            projections.project_events(session=session, events=rows)
        ack = _ack_body(events, plan)
    return ack
