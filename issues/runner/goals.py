"""PRP v2 session goals, host controls: the board sets, pauses, resumes or clears a runner's
session goal with ``session.goal.set`` / ``session.goal.clear`` commands, and only for an action
the negotiated capability advertises.

The capability is the latest ``session.capabilities.updated`` (``RunnerSession.goal_capability``,
kept by the projections) or else the hello snapshot's ``sessionGoals``. An action is offered when
the session negotiated v2 or later, the capability's ``availability`` is ``available`` and the
action is in its ``actions``; otherwise it is a 409 ``goal_action_unsupported`` naming the action
and what the runner advertised (a v1 runner never gets a goal command: it has no such capability).
Pause and resume are ``session.goal.set`` with ``status`` paused / active. The goal shown is what
the runner's ``session.goal.*`` events said (``RunnerSession.goal``); a command changes it only
through them.
"""
from __future__ import annotations

from django.db import transaction

from issues.actors import Actor
from issues.choices import LIVE_RUN_STATUSES
from issues.exceptions import Conflict, InvalidInput
from issues.models import HeartbeatRun, RunnerCommand, RunnerSession
from issues.services.activity import activity_record

from . import contract
from .commands import command_issue, iso_now
from .contract import COMMAND_SCHEMAS
from .host_control import log

ACTIONS = ("set", "pause", "resume", "clear")
GOAL_SET, GOAL_CLEAR = "session.goal.set", "session.goal.clear"
MAX_OBJECTIVE = 4000  # command-v2.schema.json's bound; a capability may advertise less


def goal_capability(session: RunnerSession | None) -> dict | None:
    """What the runner advertises for session goals, latest first (None: nothing advertised)."""
    if session is None:
        return None
    if isinstance(session.goal_capability, dict):
        return session.goal_capability
    caps = session.capabilities if isinstance(session.capabilities, dict) else {}
    return caps.get("sessionGoals") if isinstance(caps.get("sessionGoals"), dict) else None


def unsupported_reason(session: RunnerSession | None, action: str) -> str | None:
    """Why ``action`` may not be sent on ``session`` (None: it may)."""
    if session is None or session.protocol_version is None:
        return "the runner has not said hello"
    if session.protocol_version < 2:
        return f"the session negotiated protocol v{session.protocol_version}; session goals need v2"
    capability = goal_capability(session)
    if capability is None:
        return "the runner advertised no sessionGoals capability"
    if capability.get("availability") != "available":
        reason = capability.get("reason") or capability.get("reasonCode")
        return f"sessionGoals is {capability.get('availability')!r}" + (f" ({reason})" if reason else "")
    if action not in (capability.get("actions") or []):
        return f"the runner advertises only {', '.join(map(str, capability.get('actions') or [])) or 'no actions'}"
    return None


def goal_controls(session: RunnerSession | None) -> dict:
    """action -> True when the console may offer it (advertised, and it fits the current goal:
    pause an active goal, resume a paused one, clear an existing one)."""
    goal = session.goal if session is not None and isinstance(session.goal, dict) else None
    status = (goal or {}).get("status")
    fits = {"set": True, "pause": status == "active", "resume": status == "paused", "clear": goal is not None}
    return {action: fits[action] and unsupported_reason(session, action) is None for action in ACTIONS}


def _token_budget(value, capability: dict):
    """None (no budget) or a whole number >= 1, from the API's int or the console's text."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if capability.get("tokenBudgetControl") is False:
        raise InvalidInput(details={"tokenBudget": ["The runner does not accept a token budget."]})
    text = value.strip() if isinstance(value, str) else value
    if isinstance(text, str) and text.isdigit():
        text = int(text)
    if not isinstance(text, int) or isinstance(text, bool) or text < 1:
        raise InvalidInput(details={"tokenBudget": ["A whole number of tokens, at least 1 (or empty for none)."]})
    return text


def _payload(action: str, session: RunnerSession, objective, token_budget) -> tuple[str, dict]:
    capability = goal_capability(session) or {}
    if action == "clear":
        return GOAL_CLEAR, {}
    if action in ("pause", "resume"):
        if not isinstance(session.goal, dict):
            raise Conflict("There is no session goal to " + action + ".", code="goal_missing",
                           details={"action": action})
        return GOAL_SET, {"status": "paused" if action == "pause" else "active"}
    objective = objective.strip() if isinstance(objective, str) else ""
    limit = min(int(capability.get("maxObjectiveChars") or MAX_OBJECTIVE), MAX_OBJECTIVE)
    if not objective:
        raise InvalidInput(details={"objective": ["The goal's objective is required."]})
    if len(objective) > limit:
        raise InvalidInput(details={"objective": [f"At most {limit} characters (the runner's limit)."]})
    return GOAL_SET, {"objective": objective, "status": "active",
                      "tokenBudget": _token_budget(token_budget, capability)}


def _check(command_type: str, payload: dict, version: int):
    """The command as it will be offered must validate (command-v2.schema.json) before it is stored."""
    doc = {"schema": COMMAND_SCHEMAS[version], "commandId": "cmd_check", "controllerSeq": 1, "type": command_type,
           "issuedAt": iso_now(), "payload": payload}
    try:
        contract.validate_command(doc, protocol_version=version)
    except contract.ContractError as exc:
        raise InvalidInput(exc.message, details={"payload": [f"{exc.field}: {exc.message}"]}) from exc


def goal_action(*, actor: Actor, run: HeartbeatRun, action: str, objective=None, token_budget=None) -> RunnerCommand:
    """Send one goal action of the board to the run's runner: a durable command, audited, in the
    run log. Refused unless the negotiated capability advertises it."""
    actor.ensure_board()
    actor.ensure_can_write(run.company_id)
    if action not in ACTIONS:
        raise InvalidInput(details={"action": [f"Must be one of {', '.join(ACTIONS)}."]})
    with transaction.atomic():
        run = HeartbeatRun.objects.select_for_update().get(pk=run.pk)  # run first, then the session
        if run.status not in LIVE_RUN_STATUSES:
            raise Conflict("The run has ended.", code="run_not_live", details={"status": run.status})
        session = RunnerSession.objects.filter(pk=run.pk).first()
        reason = unsupported_reason(session, action)
        if reason:
            raise Conflict(f"The runner does not support the goal action {action!r}: {reason}.",
                           code="goal_action_unsupported",
                           details={"action": action, "reason": reason,
                                    "protocolVersion": getattr(session, "protocol_version", None),
                                    "advertised": goal_capability(session)})
        command_type, payload = _payload(action, session, objective, token_budget)
        _check(command_type, payload, session.protocol_version)
        command = command_issue(session=session, command_type=command_type, payload=payload)
        activity_record(actor=actor, company_id=run.company_id, action=f"run.session_goal.{action}",
                        entity_type="run", entity_id=run.pk, run=run,
                        details={"commandId": command.command_id, "commandType": command_type, "payload": payload})
        log(run.pk, f"The board asked the runner to {action} the session goal: {command_type} sent as command "
                    f"{command.controller_seq}.", commandId=command.command_id, action=action)
    return command
