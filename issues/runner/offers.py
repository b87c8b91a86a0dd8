"""The command lane, runner side of the host: offering the durable command rows (``commands``)
in ``controllerSeq`` order, and storing the runner's results.

Offering is a bounded long-poll: when nothing is newer than ``afterSeq`` the request re-queries
every ``RUNNER_COMMAND_POLL_SECONDS`` for up to ``min(wait, RUNNER_COMMAND_WAIT_SECONDS)``.
Under WSGI this holds a worker for that long; size the pool (or keep ``wait`` short) accordingly.
Commands are rendered for the negotiated version at offer time (a command issued before hello is
stored with the v1 discriminator). Offering marks pending commands delivered; they are offered
again to any later poll with a smaller ``afterSeq`` (a restarted runner), results being idempotent.

A result is stored once with its digest (canonical JSON of the body as received): a repeat with
the same digest answers the stored result, a different one is 409 ``command_result_conflict``.
"""
from __future__ import annotations

import copy
import time
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from issues.choices import LIVE_RUN_STATUSES, RUNNER_COMMAND_RESULTS, RunEventKind, RunnerCommandStatus
from issues.exceptions import Conflict, InvalidInput, NotFound
from issues.models import HeartbeatRun, RunnerCommand, RunnerSession
from issues.services.runs import run_append_event

from . import contract
from .negotiation import hello_required, lock_run, lock_session, max_batch, run_not_live



def _knob(name: str, default):
    return settings.PAPERCLIP.get(name, default)


def parse_offer_params(params) -> tuple[int, float]:
    """``afterSeq`` (default 0) and ``wait`` seconds (default 0, capped by the setting)."""
    errors, after, wait = {}, 0, 0.0
    try:
        after = int(params.get("afterSeq", 0))
        if not 0 <= after < 2**63:
            raise ValueError
    except (TypeError, ValueError):
        errors["afterSeq"] = ["A non-negative integer is required."]
    try:
        wait = float(params.get("wait", 0))
        if not 0 <= wait < float("inf"):
            raise ValueError
    except (TypeError, ValueError):
        errors["wait"] = ["A non-negative number of seconds is required."]
    if errors:
        raise InvalidInput(details=errors)
    return after, min(wait, float(_knob("RUNNER_COMMAND_WAIT_SECONDS", 25)))


def _render(command: RunnerCommand, version: int) -> dict:
    doc = copy.deepcopy(command.envelope)
    doc["schema"] = contract.COMMAND_SCHEMAS.get(version, doc.get("schema"))
    return doc


def _touch_heartbeat(run_id, now):
    """A polling runner is alive (not necessarily working: last_activity_at is left alone).
    Throttled in SQL: one conditional UPDATE, no write within the throttle window."""
    throttle = timedelta(seconds=settings.PAPERCLIP["RUN_ACTIVITY_THROTTLE_SECONDS"])
    HeartbeatRun.objects.filter(pk=run_id, status__in=LIVE_RUN_STATUSES).filter(
        Q(last_heartbeat_at__isnull=True) | Q(last_heartbeat_at__lt=now - throttle)).update(last_heartbeat_at=now)


def runner_commands(*, run: HeartbeatRun, after_seq: int, wait: float) -> dict:
    """Commands of ``run`` with ``controllerSeq > after_seq`` (at most RUNNER_MAX_BATCH), waiting
    up to ``wait`` seconds for one to be issued."""
    run.refresh_from_db(fields=["status"])
    if not run.is_live:
        raise run_not_live(run)
    session = RunnerSession.objects.filter(pk=run.pk).only("protocol_version", "hello_at").first()
    if session is None or session.hello_at is None:
        raise hello_required()
    interval = max(float(_knob("RUNNER_COMMAND_POLL_SECONDS", 0.5)), 0.01)
    deadline = time.monotonic() + wait
    limit = max_batch()
    _touch_heartbeat(run.pk, timezone.now())
    while True:
        commands = list(RunnerCommand.objects.filter(run_id=run.pk, controller_seq__gt=after_seq)
                        .order_by("controller_seq")[:limit])
        remaining = deadline - time.monotonic()
        if commands or remaining <= 0:
            break
        time.sleep(min(interval, remaining))  # a bounded long-poll, outside any transaction
    pending = [c.pk for c in commands if c.status == RunnerCommandStatus.PENDING]
    if pending:
        now = timezone.now()
        RunnerCommand.objects.filter(pk__in=pending, status=RunnerCommandStatus.PENDING).update(
            status=RunnerCommandStatus.DELIVERED, delivered_at=now)
    version = RunnerSession.objects.values_list("protocol_version", "controller_seq").get(pk=run.pk)
    return {"commands": [_render(c, version[0]) for c in commands], "controllerSeq": version[1]}


def _parse_result(body) -> dict:
    if not isinstance(body, dict):
        raise InvalidInput(details={"non_field_errors": ["A JSON object is required."]})
    errors = {}
    if body.get("status") not in RUNNER_COMMAND_RESULTS:
        errors["status"] = [f"One of {', '.join(RUNNER_COMMAND_RESULTS)} is required."]
    for name in ("result", "error"):
        if name in body and body[name] is not None and not isinstance(body[name], dict):
            errors[name] = ["Must be an object."]
    if errors:
        raise InvalidInput(details=errors)
    try:
        contract.check_storable(body)
    except contract.ContractError as err:
        raise InvalidInput(err.message, code=err.code, details=err.as_details()) from None
    return body


def result_body(command: RunnerCommand, *, duplicate: bool) -> dict:
    return {"commandId": command.command_id, "controllerSeq": command.controller_seq, "status": command.status,
            "result": command.result, "resultAt": command.result_at.isoformat() if command.result_at else None,
            "duplicate": duplicate}


def _on_command_result(*, session, command):
    # host_control sits above commands; imported here so this module loads without it.
    from . import host_control

    host_control.on_command_result(session=session, command=command)


def runner_command_result(*, run: HeartbeatRun, command_id: str, body) -> dict:
    """Store the runner's result of one command (idempotent by digest). Allowed on an ended run
    within the key's grace window: a cancel is typically confirmed after the terminal event."""
    body = _parse_result(body)
    dig = contract.digest(body)
    with transaction.atomic():
        run = lock_run(run.pk)
        session = lock_session(run)
        command = session and RunnerCommand.objects.select_for_update().filter(
            run=run, command_id=command_id).first()
        if not command:
            raise NotFound("Command not found.")
        if command.result_digest:
            if command.result_digest != dig:
                raise Conflict("A different result was already stored for this command.",
                               code="command_result_conflict",
                               details={"commandId": command_id, "status": command.status})
            return result_body(command, duplicate=True)
        now = timezone.now()
        command.result, command.result_digest, command.result_at = body, dig, now
        # A stop the host already settled (expired, or confirmed by the run's end) keeps the host's word.
        if command.status != RunnerCommandStatus.EXPIRED and command.status not in RUNNER_COMMAND_RESULTS:
            command.status = body["status"]
        command.save(update_fields=["result", "result_digest", "result_at", "status"])
        run_append_event(run_id=run.pk, kind=RunEventKind.SYSTEM,
                         message=f"runner command result: {command.command_type} #{command.controller_seq} "
                                 f"{body['status']}",
                         data={"runnerCommandResult": {"commandId": command_id, "controllerSeq": command.controller_seq,
                                                       "type": command.command_type, "status": body["status"]}},
                         liveness=run.is_live)
        _on_command_result(session=session, command=command)
        return result_body(command, duplicate=False)
