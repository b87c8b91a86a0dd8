"""The first commands of a PRP run, issued once its runner said hello.

:func:`issue_initial_commands` puts ``run.prepare``, ``session.open`` and ``turn.start`` on the
command lane, in that order (controllerSeq 1..3), when the runner has said hello and the run has
no command yet; otherwise it does nothing, so a repeated hello (a runner restart) never sends the
work twice. Payloads (the command schemas leave ``payload`` open; these are the shapes the
upstream fixtures use, plus the seed's credential opt-in):

* ``run.prepare`` — ``{"workspace": <cwd or "">, "observeCredentials": true, "issueId": …}``: the
  working directory is the runner's configured ``cwd`` (adapterConfig), else the run's workspace;
  ``observeCredentials`` opts in to ``auth.credentials.updated`` before ``session.open`` (seed 004);
  ``issueId`` only when the run has an issue;
* ``session.open`` — ``{"reuse": <capabilities.sessionReusePolicy>}`` (default ``new_per_run``);
* ``turn.start`` — ``{"text": <the run's task packet>}``: the same wake prompt every adapter gets
  (issues.run_context: the issue, why the agent was woken, the comments, the API hints).

Every envelope is checked against the negotiated command schema before the transaction commits.
"""
from __future__ import annotations

from django.db import transaction

from issues import run_context
from issues.choices import LIVE_RUN_STATUSES
from issues.models import HeartbeatRun, RunnerCommand, RunnerSession
from issues.services.wakeups import wakeups_fold_locked

from . import contract
from .commands import command_issue
from .host_control import log

RUN_PREPARE, SESSION_OPEN, TURN_START = "run.prepare", "session.open", "turn.start"
DEFAULT_REUSE = "new_per_run"


def _workspace(run: HeartbeatRun) -> str:
    config = run.agent.adapter_config if isinstance(run.agent.adapter_config, dict) else {}
    cwd = config.get("cwd")
    if isinstance(cwd, str) and cwd:
        return cwd
    return run.workspace.path if run.workspace_id and run.workspace and run.workspace.path else ""


def initial_payloads(run: HeartbeatRun, session: RunnerSession) -> list[tuple[str, dict]]:
    """The three commands and their payloads (no write)."""
    prepare = {"workspace": _workspace(run), "observeCredentials": True}
    if run.issue_id:
        prepare["issueId"] = str(run.issue_id)
    caps = session.capabilities if isinstance(session.capabilities, dict) else {}
    reuse = caps.get("sessionReusePolicy")
    text = run_context.build(run, run.issue).packet
    return [(RUN_PREPARE, prepare), (SESSION_OPEN, {"reuse": reuse if isinstance(reuse, str) and reuse
                                                    else DEFAULT_REUSE}),
            (TURN_START, {"text": text})]


def issue_initial_commands(session: RunnerSession) -> list[RunnerCommand]:
    """Issue the run's first commands (see the module doc); [] when there is nothing to do. Takes the
    run row's lock, then the session's (the caller may already hold both)."""
    with transaction.atomic():
        run = (HeartbeatRun.objects.select_for_update(of=("self",)).select_related("agent", "issue", "workspace")
               .filter(pk=session.pk).first())
        locked = RunnerSession.objects.select_for_update().filter(pk=session.pk).first()
        if run is None or locked is None or run.status not in LIVE_RUN_STATUSES:
            return []
        if locked.hello_at is None or not locked.protocol_version or locked.controller_seq:
            return []  # no hello yet, or commands were issued already (a re-hello resumes, it does not restart)
        wakeups_fold_locked(run)  # the first turn's packet holds every wake that joined the run while queued
        issued = []
        for command_type, payload in initial_payloads(run, locked):
            command = command_issue(session=locked, command_type=command_type, payload=payload)
            contract.validate_command(command.envelope, protocol_version=locked.protocol_version)
            issued.append(command)
        session.controller_seq = locked.controller_seq
        log(run.pk, "Initial commands issued: " + ", ".join(f"{c.command_type} (#{c.controller_seq})" for c in issued)
            + ".", commandIds=[c.command_id for c in issued])
    return issued
