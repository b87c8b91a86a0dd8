"""The PRP command lane, host side: every host -> runner command is a durable row before it is
offered, numbered by ``controllerSeq`` contiguous from 1 per run (the session row is the counter,
taken under its row lock)."""
from __future__ import annotations

import uuid
from datetime import datetime, timezone as dt_timezone

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from issues.models import HeartbeatRun, RunnerCommand, RunnerSession

from .contract import COMMAND_SCHEMAS  # the command schema discriminator per negotiated version


def iso_now(now: datetime | None = None) -> str:
    """RFC 3339 with milliseconds and ``Z``, as the protocol's fixtures write times."""
    now = now or timezone.now()
    return now.astimezone(dt_timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


def command_issue(*, session: RunnerSession, command_type: str, payload: dict | None = None,
                  confirm_by: datetime | None = None, interaction=None) -> RunnerCommand:
    """Store the next command of ``session``'s run. The counter moves in the same transaction as
    the row is written, so sequence numbers never skip or repeat, even with concurrent issuers."""
    with transaction.atomic():
        # Run first, then the session, as every other writer of a runner session does: a board
        # answer or a test issuing a command while the runner posts events deadlocked otherwise
        # (the command row's deferred FK check takes a key-share lock on the run at commit).
        HeartbeatRun.objects.select_for_update().filter(pk=session.pk).values_list("pk").first()
        RunnerSession.objects.filter(pk=session.pk).update(controller_seq=F("controller_seq") + 1)
        seq, version = RunnerSession.objects.values_list("controller_seq", "protocol_version").get(pk=session.pk)
        command_id = f"cmd_{uuid.uuid4().hex}"
        envelope = {
            "schema": COMMAND_SCHEMAS.get(version or 1, COMMAND_SCHEMAS[1]),
            "commandId": command_id,
            "controllerSeq": seq,
            "type": command_type,
            "issuedAt": iso_now(),
            "payload": payload or {},
        }
        session.controller_seq = seq
        return RunnerCommand.objects.create(
            run_id=session.pk, controller_seq=seq, command_id=command_id, command_type=command_type,
            envelope=envelope, confirm_by=confirm_by, interaction=interaction)
