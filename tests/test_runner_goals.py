"""v2 session goals, host controls (issues.runner.goals): the board may set, pause, resume or
clear a goal only when the negotiated capability advertises the action; each becomes a
session.goal.set / session.goal.clear command valid against command-v2.schema.json."""
import pytest
from django.utils import timezone

from issues.actors import Actor
from issues.choices import RunStatus
from issues.exceptions import Conflict, Forbidden, InvalidInput
from issues.models import ActivityLog, AgentApiKey, RunEvent, RunnerCommand, RunnerSession
from issues.runner import contract
from issues.runner.goals import goal_action, goal_capability, goal_controls, unsupported_reason
from issues.services.runs import run_finish
from tests.factories import MembershipFactory
from tests.runner_helpers import capabilities, runner_run

GOAL = {"objective": "Ship the parser", "status": "active", "tokenBudget": 5000, "tokensUsed": 120,
        "elapsedSeconds": 30, "iterations": 2, "lastReason": None, "createdAt": None, "updatedAt": None,
        "completedAt": None, "workingNow": True}


def goals_capability(availability="available", actions=("set", "pause", "resume", "clear"), **extra):
    """A sessionGoals capability as session-goal.schema.json#/$defs/capability describes it."""
    return {"availability": availability, "actions": list(actions), "autonomousUpdates": True,
            "persistentAcrossResume": True, "maxObjectiveChars": 4000, "tokenBudgetControl": True,
            "usageReporting": True, **extra}


def session_for(run, *, version=2, capability=None, goal=None) -> RunnerSession:
    caps = capabilities(version)
    if version >= 2:
        caps["sessionGoals"] = capability if capability is not None else goals_capability()
    return RunnerSession.objects.create(run=run, company=run.company, protocol_min=1, protocol_max=version,
                                        protocol_version=version, capabilities=caps, hello_at=timezone.now(),
                                        goal=goal)


@pytest.fixture
def run(db):
    run, _key = runner_run()
    return run


@pytest.fixture
def board(run):
    return Actor(user=MembershipFactory(company=run.company, role="operator").user)


def test_the_hello_capability_validates_against_the_v2_capability_schema(run):
    session = session_for(run)
    contract.validate_capabilities(session.capabilities, protocol_version=2)


def test_controls_follow_the_advertised_actions_and_the_goal(run):
    session = session_for(run, capability=goals_capability(actions=("set", "clear")), goal=GOAL)
    assert goal_controls(session) == {"set": True, "pause": False, "resume": False, "clear": True}
    session.goal_capability = goals_capability()
    assert goal_controls(session) == {"set": True, "pause": True, "resume": False, "clear": True}
    session.goal = {**GOAL, "status": "paused"}
    assert goal_controls(session) == {"set": True, "pause": False, "resume": True, "clear": True}
    session.goal = None
    assert goal_controls(session) == {"set": True, "pause": False, "resume": False, "clear": False}


def test_capabilities_updated_overrides_the_hello_snapshot(run):
    session = session_for(run)
    session.goal_capability = goals_capability(availability="policy_disabled", reason="Disabled by policy")
    assert goal_capability(session)["availability"] == "policy_disabled"
    assert goal_controls(session) == dict.fromkeys(("set", "pause", "resume", "clear"), False)
    assert "policy_disabled" in unsupported_reason(session, "set") and "Disabled by policy" in unsupported_reason(session, "set")


@pytest.mark.parametrize("action,command_type,payload", [
    ("set", "session.goal.set", {"objective": "Ship the parser", "status": "active", "tokenBudget": 5000}),
    ("pause", "session.goal.set", {"status": "paused"}),
    ("resume", "session.goal.set", {"status": "active"}),
    ("clear", "session.goal.clear", {}),
])
def test_each_action_is_a_valid_v2_command(run, board, action, command_type, payload):
    goal = {**GOAL, "status": "paused"} if action == "resume" else GOAL
    session_for(run, goal=goal)
    command = goal_action(actor=board, run=run, action=action, objective="  Ship the parser ", token_budget="5000")
    assert command.command_type == command_type and command.envelope["payload"] == payload
    assert command.envelope["schema"] == "paperclip.prp.command.v2"
    contract.validate_command(command.envelope, protocol_version=2)
    audit = ActivityLog.objects.get(action=f"run.session_goal.{action}")
    assert audit.actor_type == "user" and audit.details["commandId"] == command.command_id
    assert RunEvent.objects.filter(run=run, message__contains=f"to {action} the session goal").exists()


def test_an_empty_budget_is_none(run, board):
    session_for(run)
    command = goal_action(actor=board, run=run, action="set", objective="Go", token_budget="")
    assert command.envelope["payload"] == {"objective": "Go", "status": "active", "tokenBudget": None}


def test_a_v1_session_is_refused(run, board):
    session_for(run, version=1)
    with pytest.raises(Conflict) as caught:
        goal_action(actor=board, run=run, action="set", objective="Go")
    assert caught.value.code == "goal_action_unsupported"
    assert caught.value.details["action"] == "set" and caught.value.details["protocolVersion"] == 1
    assert "v2" in caught.value.message and not RunnerCommand.objects.exists()


def test_an_action_not_advertised_is_refused_naming_what_was(run, board):
    session_for(run, capability=goals_capability(actions=("set",)), goal=GOAL)
    with pytest.raises(Conflict) as caught:
        goal_action(actor=board, run=run, action="clear")
    assert caught.value.code == "goal_action_unsupported"
    assert caught.value.details["advertised"]["actions"] == ["set"]
    assert "'clear'" in caught.value.message and "only set" in caught.value.message


def test_unsupported_availability_is_refused(run, board):
    session_for(run, capability=goals_capability(availability="unsupported", actions=()))
    with pytest.raises(Conflict) as caught:
        goal_action(actor=board, run=run, action="set", objective="Go")
    assert "'unsupported'" in caught.value.details["reason"]


def test_no_hello_is_refused(run, board):
    RunnerSession.objects.create(run=run, company=run.company)
    with pytest.raises(Conflict) as caught:
        goal_action(actor=board, run=run, action="set", objective="Go")
    assert caught.value.code == "goal_action_unsupported"


def test_pause_needs_a_goal(run, board):
    session_for(run)
    with pytest.raises(Conflict) as caught:
        goal_action(actor=board, run=run, action="pause")
    assert caught.value.code == "goal_missing"


def test_input_is_checked(run, board):
    session_for(run, capability=goals_capability(maxObjectiveChars=10, tokenBudgetControl=False))
    for kwargs, field in (({"objective": ""}, "objective"), ({"objective": "x" * 11}, "objective"),
                          ({"objective": "ok", "token_budget": "12"}, "tokenBudget"),
                          ({"action": "bogus"}, "action")):
        with pytest.raises(InvalidInput) as caught:
            goal_action(actor=board, run=run, **{"action": "set", **kwargs})
        assert field in caught.value.details
    session = RunnerSession.objects.get(pk=run.pk)
    session.goal_capability = goals_capability()
    session.save()
    for budget in ("0", "-3", "1.5", "many", True):
        with pytest.raises(InvalidInput):
            goal_action(actor=board, run=run, action="set", objective="ok", token_budget=budget)
    assert not RunnerCommand.objects.exists()


def test_board_users_only(run):
    session_for(run)
    agent = Actor(agent=run.agent)
    with pytest.raises(Forbidden):
        goal_action(actor=agent, run=run, action="set", objective="Go")
    viewer = Actor(user=MembershipFactory(company=run.company, role="viewer").user)
    with pytest.raises(Forbidden):
        goal_action(actor=viewer, run=run, action="set", objective="Go")
    assert not RunnerCommand.objects.exists()


def test_an_ended_run_gets_no_goal_command(run, board):
    session_for(run)
    run_finish(run=run, status=RunStatus.SUCCEEDED)
    with pytest.raises(Conflict) as caught:
        goal_action(actor=board, run=run, action="set", objective="Go")
    assert caught.value.code == "run_not_live"
    assert not AgentApiKey.objects.filter(run=run, revoked_at__isnull=True).exists()
