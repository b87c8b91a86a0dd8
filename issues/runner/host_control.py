"""The host's own stops over the PRP command lane, and what the host does with command results.

A stop of a runner run that said hello is a command, not a kill: an issue-scoped stop sends
``turn.interrupt``, a board cancel or the budget hard stop ``run.cancel``, each with
``confirm_by = now + RUNNER_STOP_CONFIRM_SECONDS`` (also offered to the runner as ``deadlineAt``).
The confirmation is the run's ``run.terminal`` (the projection ends the run with it; the stop
command is then closed). A ``succeeded`` result only says the runner accepted the stop: the host
keeps waiting for the terminal until ``confirm_by``. A ``rejected`` or ``failed`` result is a
runner that will not stop: it is treated at once as a stop not confirmed at its deadline. A stop
not confirmed in time (``runner_stops_expire``, on the periodic sweep) ends the run cancelled as
"runner lost": the run's key is revoked with it, so nothing the runner sends later is taken.

``confirm_by`` is set only while a stop waits for its confirmation and cleared once it is settled,
so the sweep's one query only ever sees the stops still waiting.
"""
from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from issues import events
from issues.actors import SYSTEM
from issues.choices import (
    LIVE_RUN_STATUSES,
    PROTOCOL_ADAPTER_TYPES,
    RUNNER_COMMAND_OPEN,
    RUNNER_COMMAND_RESULTS,
    RunEventKind,
    RunLiveness,
    RunnerCommandStatus,
    RunStatus,
)
from issues.models import HeartbeatRun, RunnerCommand, RunnerEvent, RunnerSession
from issues.services import runs as run_services
from issues.services.activity import activity_record

from .commands import command_issue, iso_now

TURN_INTERRUPT, RUN_CANCEL = "turn.interrupt", "run.cancel"
STOP_COMMANDS = (TURN_INTERRUPT, RUN_CANCEL)
ISSUE_STOP = "issue_stop"  # services.runs.issue_run_stop's reason: only the turn is interrupted
REFUSED = (RunnerCommandStatus.FAILED, RunnerCommandStatus.REJECTED)
# What a stop command's status can be while its run still waits for the terminal.
AWAITING = RUNNER_COMMAND_OPEN + RUNNER_COMMAND_RESULTS


def confirm_seconds() -> int:
    return settings.PAPERCLIP["RUNNER_STOP_CONFIRM_SECONDS"]


def stop_command_for(reason: str) -> str:
    """An issue-scoped stop interrupts the turn; every other stop (board cancel, budget, an agent
    paused or terminated) cancels the run."""
    return TURN_INTERRUPT if reason == ISSUE_STOP else RUN_CANCEL


def log(run_id, message: str, **data):
    """One line of the run's log about the host's side of the protocol (not liveness)."""
    run_services.run_append_event(run_id=run_id, kind=RunEventKind.SYSTEM, message=message,
                                  data={"runner": True, **data}, liveness=False)


# --- stopping --------------------------------------------------------------------------------------
def request_stop(*, run: HeartbeatRun, session: RunnerSession, reason: str, command_type: str) -> RunnerCommand:
    """Send the stop ``command_type`` to the runner (the caller holds the run's row lock). At most
    one stop command of each type per run: a repeated stop returns the waiting one."""
    if command_type not in STOP_COMMANDS:
        raise ValueError(f"{command_type} is not a stop command")
    now = timezone.now()
    HeartbeatRun.objects.filter(pk=run.pk, stop_requested_at__isnull=True).update(
        stop_requested_at=now, stop_reason=reason, updated_at=now)
    run.stop_requested_at, run.stop_reason = run.stop_requested_at or now, run.stop_reason or reason
    waiting = RunnerCommand.objects.filter(run_id=run.pk, command_type=command_type,
                                           confirm_by__isnull=False).first()
    if waiting is not None:
        return waiting
    payload = {"reason": reason}
    if command_type == TURN_INTERRUPT:
        turn_id = (RunnerEvent.objects.filter(run_id=run.pk, event_type="turn.started").order_by("-position")
                   .values_list("envelope__turnId", flat=True).first())
        if isinstance(turn_id, str) and turn_id:
            payload["turnId"] = turn_id
    confirm_by = now + timedelta(seconds=confirm_seconds())
    command = command_issue(session=session, command_type=command_type, payload=payload, confirm_by=confirm_by)
    command.envelope["deadlineAt"] = iso_now(confirm_by)  # the same deadline, told to the runner
    command.save(update_fields=["envelope"])
    log(run.pk, f"Stop requested ({reason}): {command_type} sent to the runner as command "
                f"{command.controller_seq}; it must end the run by {iso_now(confirm_by)} or it is treated as lost.",
        commandId=command.command_id, commandType=command_type, reason=reason, confirmBy=iso_now(confirm_by))
    return command


def _stop_port(run: HeartbeatRun, reason: str) -> bool:
    """services.runs._request_stop for a "runner" run: a runner that said hello is stopped over
    the command lane (True: wait for its terminal); one that never did ends at once as before."""
    if run.status not in LIVE_RUN_STATUSES:
        return False
    session = RunnerSession.objects.filter(pk=run.pk, protocol_version__isnull=False).first()
    if session is None:
        return False
    request_stop(run=run, session=session, reason=reason, command_type=stop_command_for(reason))
    return True


def runner_stops_expire(*, now=None, command_ids=None) -> int:
    """End the runs whose stop passed ``confirm_by`` without the run ending: the command expires
    (a refused one keeps its status and result), the run ends cancelled as "runner lost", audited.
    One query when nothing is due. Returns the number of runs ended."""
    now = now or timezone.now()
    due = RunnerCommand.objects.filter(status__in=AWAITING, confirm_by__lte=now)
    if command_ids is not None:
        due = due.filter(pk__in=command_ids)
    return sum(_expire(pk, run_id, now) for pk, run_id in due.values_list("pk", "run_id"))


def _expire(command_pk, run_id, now) -> bool:
    with transaction.atomic():
        run = HeartbeatRun.objects.select_for_update().filter(pk=run_id).first()  # run first, as everywhere
        command = RunnerCommand.objects.select_for_update().get(pk=command_pk)
        if command.confirm_by is None or command.confirm_by > now:
            return False  # settled (or moved) meanwhile
        if run is None or run.status not in LIVE_RUN_STATUSES:
            command.confirm_by = None
            command.save(update_fields=["confirm_by"])
            return False
        waited = max(0, round((now - command.created_at).total_seconds()))
        refused = command.status in REFUSED
        error = f"runner lost: {command.command_type} not confirmed in {waited}s"
        if refused:
            error += f" (the runner answered {command.status}{_result_reason(command)})"
        else:
            command.status = RunnerCommandStatus.EXPIRED
        command.confirm_by = None
        command.save(update_fields=["status", "confirm_by"])
        log(run.pk, error, commandId=command.command_id, commandType=command.command_type)
        activity_record(actor=SYSTEM, company_id=run.company_id, action="run.runner_lost", entity_type="run",
                        entity_id=run.pk, run=run,
                        details={"commandId": command.command_id, "commandType": command.command_type,
                                 "commandStatus": command.status, "waitedSeconds": waited})
        run_services.run_finish(run=run, status=RunStatus.CANCELLED, error=error, liveness=RunLiveness.FAILED,
                                liveness_reason=error)
    return True


def _settle_stops(sender, run, **kwargs):
    """run_finished_atomic: the run ended, so its waiting stops are settled. Ended by its
    run.terminal, an open stop is confirmed (succeeded); ended any other way it expired."""
    if run.adapter_type not in PROTOCOL_ADAPTER_TYPES:
        return
    waiting = RunnerCommand.objects.filter(run_id=run.pk, confirm_by__isnull=False)
    if not waiting.exists():
        return
    confirmed = (RunnerSession.objects.filter(pk=run.pk, terminal__isnull=False).exists()
                 or RunnerEvent.objects.filter(run_id=run.pk, event_type="run.terminal").exists())
    status = RunnerCommandStatus.SUCCEEDED if confirmed else RunnerCommandStatus.EXPIRED
    names = list(waiting.values_list("command_type", flat=True))
    waiting.filter(status__in=RUNNER_COMMAND_OPEN).update(status=status)
    waiting.update(confirm_by=None)
    if confirmed:
        log(run.pk, f"Stop confirmed by the runner's run.terminal ({', '.join(names)}).", commandTypes=names)


# --- command results -----------------------------------------------------------------------------------
def _result_reason(command: RunnerCommand) -> str:
    """The runner's code and message, from the result body (``error`` or ``result``) or the
    result document itself."""
    body = command.result if isinstance(command.result, dict) else {}
    parts = []
    for doc in (body.get("error"), body.get("result"), body):
        if isinstance(doc, dict):
            parts += [str(doc[k]) for k in ("code", "message", "reason") if isinstance(doc.get(k), (str, int))]
        if parts:
            break
    reason = " ".join(parts)
    return f": {reason[:300]}" if reason else ""


def result_status(command: RunnerCommand) -> str:
    """The outcome the runner reported: the stored status once the transport mapped it, else the
    result body's own ``status``."""
    if command.status in RUNNER_COMMAND_RESULTS:
        return command.status
    body = command.result if isinstance(command.result, dict) else {}
    return str(body.get("status") or command.status)


def on_command_result(*, session: RunnerSession, command: RunnerCommand):
    """Called by the transport inside the transaction that stored ``command``'s result (run and
    session locked; the transport logs the result itself). A stop the runner accepted still waits
    for its terminal; one it refused is treated as unconfirmed at once (ended after this commit,
    outside the transport's locks). A refused request.resolve or goal command is logged with its
    reason and changes nothing else: the request and the goal show what the runner's events say."""
    status = result_status(command)
    waiting_stop = command.command_type in STOP_COMMANDS and command.confirm_by is not None
    if waiting_stop and status == RunnerCommandStatus.SUCCEEDED:
        log(session.pk, f"The runner accepted {command.command_type}; waiting for its run.terminal until "
                        f"{iso_now(command.confirm_by)}.", commandId=command.command_id)
    elif status in REFUSED:
        line = f"The runner refused {command.command_type} (command {command.controller_seq}){_result_reason(command)}"
        if waiting_stop:
            now = timezone.now()
            RunnerCommand.objects.filter(pk=command.pk, confirm_by__isnull=False).update(confirm_by=now)
            command.confirm_by = now
            transaction.on_commit(lambda: runner_stops_expire(command_ids=[command.pk]))
            line += "; the stop is treated as not confirmed and the run ends"
        log(session.pk, line + ".", commandId=command.command_id, commandType=command.command_type, status=status)


def _sweep(sender, now, **kwargs):
    return {"runnerStopsExpired": runner_stops_expire(now=now)}


def connect():
    """IssuesConfig.ready: the stop port for "runner" and "prp" runs, stop expiry on the periodic sweep (Celery
    beat and the embedded worker alike), and stop settlement when a runner run ends."""
    for adapter_type in PROTOCOL_ADAPTER_TYPES:
        run_services.STOP_PORTS[adapter_type] = _stop_port
    events.sweep_ticked.connect(_sweep, dispatch_uid="issues.runner.stops_expire")
    events.run_finished_atomic.connect(_settle_stops, dispatch_uid="issues.runner.stops_settle")
