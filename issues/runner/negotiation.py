"""PRP hello: version negotiation and the capability snapshot, plus the locking and error helpers
the intake and the command lane share.

A runner offers ``protocolMin..protocolMax``; the host selects the highest version both support
(``contract.SUPPORTED_VERSIONS``). The capability document must validate for that version. A v2
snapshot must carry ``sessionGoals``, so a runner that offers 1..2 but sends a *v1* capability
document is taken at its word: version 1 is selected (the document names its own version in its
``schema`` discriminator). A repeated hello (a runner restart) is answered with the current
cursors so the runner resumes from its outbox; it may not change the selected version once
events were committed under it. Refusals are kept on the session and written to the run log.

Lock order, everywhere in issues.runner: the HeartbeatRun row first, then the RunnerSession.
"""
from __future__ import annotations

import re

from django.conf import settings
from django.db import transaction
from django.db.models.functions import Coalesce
from django.utils import timezone

from issues.choices import RunEventKind, RunStatus
from issues.exceptions import ApiError, Conflict, InvalidInput
from issues.models import HeartbeatRun, RunnerSession, RunnerSource
from issues.services.runs import run_append_event

from . import contract, launch

_CAPS_SCHEMA = re.compile(r"^paperclip\.prp\.capabilities\.v(\d+)$")


# --- shared by negotiation, intake and offers -------------------------------------------------
def max_batch() -> int:
    return int(settings.PAPERCLIP.get("RUNNER_MAX_BATCH", 100))


def max_batch_bytes() -> int:
    return int(settings.PAPERCLIP.get("RUNNER_MAX_BATCH_BYTES", 1024 * 1024))


def batch_limits() -> dict:
    """What one events request may carry (answered in hello, so a runner splits its frames)."""
    return {"maxBatchEvents": max_batch(), "maxBatchBytes": max_batch_bytes()}


def lock_run(run_id) -> HeartbeatRun:
    """The run row, locked (first in the lock order). Call inside ``transaction.atomic``."""
    return HeartbeatRun.objects.select_for_update().get(pk=run_id)


def lock_session(run: HeartbeatRun) -> RunnerSession | None:
    """The run's session, locked (after the run row)."""
    return RunnerSession.objects.select_for_update().filter(pk=run.pk).first()


def run_not_live(run: HeartbeatRun) -> Conflict:
    return Conflict("The run has ended.", code="run_not_live", details={"status": run.status})


def hello_required() -> Conflict:
    return Conflict("Say hello first: the protocol version is negotiated there.", code="hello_required")


def contract_error(err, *, path_prefix: str, field: str, **extra) -> InvalidInput:
    """A :class:`contract.ContractError` in the one error shape: its code, the JSON path rooted
    at the request body (``details.field`` and ``details.path``: ``$.events[3].payload.kind``),
    and ``details[field]`` (e.g. ``events[3]``) holding the message."""
    err = err.prefixed(path_prefix)
    details = err.as_details()
    details["path"] = err.field
    details[field] = [err.message]
    details.update(extra)
    return InvalidInput(err.message, code=err.code, details=details)


def source_cursors(run) -> dict:
    return dict(RunnerSource.objects.filter(run=run).order_by("source_key").values_list("source_key", "acked_seq"))


# --- hello -------------------------------------------------------------------------------------
def _int_field(body: dict, name: str, errors: dict):
    value = body.get(name)
    if type(value) is not int or value < 1:
        errors[name] = ["A positive integer is required."]
        return None
    return value


def _parse_hello(body) -> dict:
    if not isinstance(body, dict):
        raise InvalidInput(details={"non_field_errors": ["A JSON object is required."]})
    errors: dict = {}
    low, high = _int_field(body, "protocolMin", errors), _int_field(body, "protocolMax", errors)
    if low is not None and high is not None and low > high:
        errors["protocolMax"] = ["Must be at least protocolMin."]
    instance = body.get("runnerInstanceId")
    if not isinstance(instance, str) or not 1 <= len(instance) <= 160:
        errors["runnerInstanceId"] = ["A string of 1 to 160 characters is required."]
    if not isinstance(body.get("capabilities"), dict):
        errors["capabilities"] = ["The capability document (an object) is required."]
    identity = body.get("identity", {})
    if not isinstance(identity, dict):
        errors["identity"] = ["Must be an object."]
    if errors:
        raise InvalidInput(details=errors)
    try:
        contract.check_storable({"runnerInstanceId": instance, "identity": identity})
    except contract.ContractError as err:
        raise InvalidInput(err.message, code=err.code, details=err.as_details()) from None
    return {"low": low, "high": high, "instance": instance, "capabilities": body["capabilities"],
            "identity": identity}


def _select_version(offer: dict) -> int:
    supported = list(contract.SUPPORTED_VERSIONS)
    mutual = [v for v in supported if offer["low"] <= v <= offer["high"]]
    if not mutual:
        reason = f"No protocol version in {offer['low']}..{offer['high']} is supported (supported: {supported})."
        raise InvalidInput(reason, code="unsupported_required_version", details={
            "field": "protocolMin..protocolMax", "value": {"protocolMin": offer["low"], "protocolMax": offer["high"]},
            "supported": supported, "reason": reason})
    selected = max(mutual)
    match = _CAPS_SCHEMA.match(str(offer["capabilities"].get("schema", "")))
    if match and int(match.group(1)) in mutual:
        selected = min(selected, int(match.group(1)))  # a v1 snapshot cannot run v2 (no sessionGoals)
    try:
        contract.validate_capabilities(offer["capabilities"], protocol_version=selected)
    except contract.ContractError as err:
        raise contract_error(err, path_prefix="$.capabilities", field="capabilities", protocolVersion=selected)
    return selected


def _refusal_record(run, session, refusal: ApiError, offer: dict | None):
    doc = {"code": refusal.code, "message": refusal.message, "details": refusal.details,
           "at": timezone.now().isoformat()}
    if offer:
        doc["offer"] = {"protocolMin": offer["low"], "protocolMax": offer["high"],
                        "runnerInstanceId": offer["instance"]}
    session.refusal = doc
    session.save(update_fields=["refusal", "updated_at"])
    run_append_event(run_id=run.pk, kind=RunEventKind.SYSTEM, message=f"runner hello refused: {refusal.code}",
                     data={"runnerHelloRefused": doc}, liveness=False)


def runner_hello(*, run: HeartbeatRun, body) -> dict:
    """Negotiate (or renegotiate after a runner restart) and answer the current cursors."""
    now = timezone.now()
    outcome: dict | ApiError
    with transaction.atomic():
        run = lock_run(run.pk)
        if not run.is_live:
            raise run_not_live(run)
        session = lock_session(run) or RunnerSession.objects.create(run=run, company_id=run.company_id)
        offer = None
        try:
            offer = _parse_hello(body)
            version = _select_version(offer)
            if session.protocol_version and version != session.protocol_version and session.event_count:
                raise Conflict("The protocol version cannot change once events were committed under it.",
                               code="protocol_version_locked",
                               details={"protocolVersion": session.protocol_version, "selected": version,
                                        "eventCount": session.event_count})
        except ApiError as refusal:
            _refusal_record(run, session, refusal, offer)
            outcome = refusal  # raised after the commit, so the refusal is kept
        else:
            repeated = session.hello_at is not None
            session.protocol_min, session.protocol_max, session.protocol_version = offer["low"], offer["high"], version
            session.capabilities, session.identity = offer["capabilities"], offer["identity"]
            session.runner_instance_id, session.hello_at, session.refusal = offer["instance"], now, {}
            session.save()
            if run.status == RunStatus.QUEUED:  # a runner that says hello is running the run
                HeartbeatRun.objects.filter(pk=run.pk, status=RunStatus.QUEUED).update(
                    status=RunStatus.RUNNING, started_at=Coalesce("started_at", now), updated_at=now)
            run_append_event(run_id=run.pk, kind=RunEventKind.SYSTEM,
                             message=f"runner {'re-' if repeated else ''}hello: PRP v{version} selected "
                                     f"(offer {offer['low']}..{offer['high']})",
                             data={"runnerHello": {"protocolVersion": version, "protocolMin": offer["low"],
                                                   "protocolMax": offer["high"],
                                                   "runnerInstanceId": offer["instance"], "repeated": repeated}})
            # The run's first commands exist as soon as the version is known (a re-hello issues none).
            launch.issue_initial_commands(session)
            outcome = {"protocolVersion": version, "capabilities": session.capabilities,
                       "sources": source_cursors(run), "controllerSeq": session.controller_seq,
                       "supportedVersions": list(contract.SUPPORTED_VERSIONS), "limits": batch_limits()}
    if isinstance(outcome, ApiError):
        raise outcome
    return outcome
