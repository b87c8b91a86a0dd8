"""A PRP runner's runtime requests as issue interactions (issues.runner.requests): created ->
an interaction on the run's issue (once per requestId), the board's answer -> a request.resolve
command in the same transaction, linked to the interaction; resolved / expired / cancelled
events close a pending one; an answer after the run ended closes it without a command."""
import pytest
from django.utils import timezone

from issues.actors import Actor
from issues.choices import InteractionKind, InteractionStatus, RunStatus
from issues.exceptions import InvalidInput
from issues.models import ActivityLog, HeartbeatRun, Interaction, RunEvent, RunnerCommand, RunnerSession, WakeupRequest
from issues.runner import contract, requests
from issues.services.runs import run_finish
from issues.services.thread import interaction_create, interaction_respond
from tests.factories import IssueFactory, MembershipFactory
from tests.runner_helpers import capabilities, envelope, runner_run
from tests.test_errors import assert_error

PERMISSION = {"schema": "paperclip.runtime_request.v1", "requestKind": "runtime", "requestId": "req_perm",
              "type": "permission", "status": "pending", "prompt": "Allow the fake driver to write its fixture?",
              "choices": [{"key": "allow", "label": "Allow"}, {"key": "deny", "label": "Deny"}]}
INPUT_V1 = {"schema": "paperclip.runtime_request.v1", "requestKind": "runtime", "requestId": "req_input",
            "type": "input", "status": "pending", "prompt": "Name the local trace.", "choices": []}
QUESTIONS = {
    "schema": "paperclip.runtime_request.v2", "requestKind": "runtime", "requestId": "req_questions", "type": "input",
    "status": "pending", "prompt": "Two questions before I go on",
    "input": {"schema": "paperclip.question_set.v1", "title": "Setup", "questions": [
        {"id": "mode", "prompt": "Which mode?", "required": True, "answerMode": "single_select",
         "options": [{"id": "fast", "label": "Fast"}, {"id": "safe", "label": "Safe", "recommended": True}]},
        {"id": "tags", "prompt": "Tags?", "required": False, "answerMode": "multi_select",
         "options": [{"id": "a", "label": "A"}, {"id": "b", "label": "B"}], "customAnswer": {"enabled": True}},
        {"id": "name", "prompt": "Trace name", "required": True, "answerMode": "text",
         "textValidation": {"minLength": 3, "maxLength": 20}},
    ]}}


@pytest.fixture
def prp(db):
    run, _key = runner_run()
    issue = IssueFactory(company=run.company, assignee_agent=run.agent, status="in_progress")
    HeartbeatRun.objects.filter(pk=run.pk).update(issue=issue)
    run.refresh_from_db()
    session = RunnerSession.objects.create(run=run, company=run.company, protocol_min=1, protocol_max=2,
                                           protocol_version=2, capabilities=capabilities(2), hello_at=timezone.now())
    return run, session, issue


def board_for(company) -> Actor:
    return Actor(user=MembershipFactory(company=company).user)


_SEQ = {}


def request_event(run, event_type, request=None, **payload):
    seq = _SEQ[run.pk] = _SEQ.get(run.pk, 0) + 1
    body = {"request": request, **payload} if request is not None else payload
    return envelope(seq, event_type, body, run=run, version=2)


def created(run, session, request):
    return requests.project_request_event(session=session, event=request_event(run, "runtime_request.created", request))


def resolve_commands(run):
    return list(RunnerCommand.objects.filter(run=run, command_type="request.resolve"))


def test_fixture_requests_are_valid_request_documents():
    for doc in (PERMISSION, INPUT_V1, QUESTIONS):
        contract.validate_request(doc)


def test_created_becomes_an_interaction_on_the_issue(prp):
    run, session, issue = prp
    interaction = created(run, session, PERMISSION)
    assert interaction.issue_id == issue.pk and interaction.kind == InteractionKind.RUNTIME_REQUEST
    assert interaction.status == InteractionStatus.PENDING and interaction.title == PERMISSION["prompt"]
    assert interaction.created_by_agent_id == run.agent_id and interaction.run_id == run.pk
    assert interaction.payload["requestId"] == "req_perm" and interaction.payload["type"] == "permission"
    assert interaction.payload["request"] == PERMISSION
    audit = ActivityLog.objects.get(action="interaction.created", details__interactionId=str(interaction.pk))
    assert audit.actor_type == "agent" and audit.run_id == run.pk and audit.details["requestId"] == "req_perm"
    assert RunEvent.objects.filter(run=run, message__contains="asked on the issue").exists()


def test_a_repeated_request_id_is_the_same_interaction(prp):
    run, session, _ = prp
    first = created(run, session, PERMISSION)
    again = created(run, session, {**PERMISSION, "prompt": "Asked again"})
    assert first.pk == again.pk and Interaction.objects.filter(run=run).count() == 1
    assert RunEvent.objects.filter(run=run, message__contains="already asked").exists()


def test_a_run_asks_at_most_its_cap_of_questions(prp, monkeypatch):
    run, session, _ = prp
    monkeypatch.setattr(requests, "MAX_REQUESTS_PER_RUN", 3)
    asked = [created(run, session, {**PERMISSION, "requestId": f"req_{i}"}) for i in range(5)]
    assert [a is not None for a in asked] == [True, True, True, False, False]
    assert Interaction.objects.filter(run=run).count() == 3
    assert RunEvent.objects.filter(run=run, message__contains="at most 3 per run").count() == 2


def test_a_run_without_an_issue_keeps_the_request_on_the_session(db):
    run, _key = runner_run()
    session = RunnerSession.objects.create(run=run, company=run.company, protocol_version=1, hello_at=timezone.now())
    assert created(run, session, PERMISSION) is None
    assert not Interaction.objects.exists()
    assert RunEvent.objects.filter(run=run, message__contains="has no issue to be asked on").exists()


def test_an_invalid_request_document_is_not_asked(prp):
    run, session, _ = prp
    assert created(run, session, {**PERMISSION, "type": None}) is None
    assert not Interaction.objects.exists()
    assert RunEvent.objects.filter(run=run, message__contains="$.payload.request").exists()


@pytest.mark.parametrize("event_type,status", [("runtime_request.resolved", "answered"),
                                               ("runtime_request.expired", "expired"),
                                               ("runtime_request.cancelled", "cancelled")])
def test_runner_events_close_a_pending_interaction(prp, event_type, status):
    run, session, _ = prp
    interaction = created(run, session, PERMISSION)
    closed = requests.project_request_event(
        session=session, event=request_event(run, event_type, {**PERMISSION, "status": event_type.split(".")[1]}))
    assert closed.pk == interaction.pk
    interaction.refresh_from_db()
    assert interaction.status == status and interaction.responded_at is not None
    assert interaction.response["closedBy"] == "runner" and interaction.response["eventType"] == event_type
    assert not RunnerCommand.objects.filter(run=run).exists()  # the runner closed it: nothing to send
    assert ActivityLog.objects.filter(action="interaction.closed", details__status=status).exists()


def test_a_closing_event_may_name_only_the_request_id(prp):
    run, session, _ = prp
    interaction = created(run, session, INPUT_V1)
    requests.project_request_event(session=session,
                                   event=request_event(run, "runtime_request.expired", requestId="req_input"))
    interaction.refresh_from_db()
    assert interaction.status == InteractionStatus.EXPIRED


def test_allow_becomes_a_linked_request_resolve_command(prp):
    run, session, _ = prp
    interaction = created(run, session, PERMISSION)
    answered = interaction_respond(actor=board_for(run.company), interaction=interaction, status="accepted")
    [command] = resolve_commands(run)
    assert command.interaction_id == interaction.pk and command.controller_seq == 1
    assert command.envelope["payload"] == {"requestId": "req_perm", "response": {"decision": "allow"}}
    contract.validate_command(command.envelope, protocol_version=2)
    assert answered.status == "accepted"
    assert answered.response["delivery"] == {"status": "sent", "commandId": command.command_id, "controllerSeq": 1}
    interaction.refresh_from_db()
    assert interaction.response["delivery"]["commandId"] == command.command_id
    # The runner learns the answer from its command; the agent gets no new wake for it.
    assert not WakeupRequest.objects.filter(agent=run.agent).exists()


def test_deny_and_cancel(prp):
    run, session, _ = prp
    board = board_for(run.company)
    interaction_respond(actor=board, interaction=created(run, session, PERMISSION), status="rejected")
    interaction_respond(actor=board, interaction=created(run, session, INPUT_V1), status="cancelled")
    assert [c.envelope["payload"]["response"] for c in resolve_commands(run)] == [{"decision": "deny"},
                                                                                  {"decision": "cancel"}]


def test_a_permission_is_not_answered_with_text(prp):
    run, session, _ = prp
    interaction = created(run, session, PERMISSION)
    with pytest.raises(InvalidInput):
        interaction_respond(actor=board_for(run.company), interaction=interaction, status="answered",
                            response={"answer": "sure"})
    interaction.refresh_from_db()
    assert interaction.status == InteractionStatus.PENDING and not resolve_commands(run)  # rolled back together


def test_a_text_question_is_answered_with_text(prp):
    run, session, _ = prp
    board = board_for(run.company)
    interaction = created(run, session, INPUT_V1)
    with pytest.raises(InvalidInput):
        interaction_respond(actor=board, interaction=interaction, status="answered", response={})
    interaction_respond(actor=board, interaction=interaction, status="answered", response={"answer": "trace-7"})
    [command] = resolve_commands(run)
    assert command.envelope["payload"]["response"] == {"text": "trace-7"}


def test_a_question_set_is_answered_per_question(prp):
    run, session, _ = prp
    board = board_for(run.company)
    interaction = created(run, session, QUESTIONS)
    for bad, field in (({"mode": ["slow"], "name": ["trace"]}, "mode"), ({"mode": ["fast"]}, "name"),
                       ({"mode": ["fast", "safe"], "name": ["trace"]}, "mode"),
                       ({"mode": ["fast"], "name": ["ab"]}, "name"), ({"mode": ["fast"], "name": ["x1"], "zz": ["1"]}, "zz")):
        with pytest.raises(InvalidInput) as caught:
            interaction_respond(actor=board, interaction=interaction, status="answered", response={"answers": bad})
        assert field in caught.value.details["answers"], (bad, caught.value.details)
    interaction_respond(actor=board, interaction=interaction, status="answered",
                        response={"answers": {"mode": ["safe"], "tags": ["a", "my own"], "name": "trace-1"}})
    [command] = resolve_commands(run)
    assert command.envelope["payload"] == {"requestId": "req_questions", "response": {"answers": {
        "mode": {"answers": ["safe"]}, "tags": {"answers": ["a", "my own"]}, "name": {"answers": ["trace-1"]}}}}


def test_an_answer_after_the_run_ended_closes_without_a_command(prp):
    run, session, _ = prp
    interaction = created(run, session, PERMISSION)
    run_finish(run=run, status=RunStatus.FAILED, error="gone")
    answered = interaction_respond(actor=board_for(run.company), interaction=interaction, status="accepted")
    assert answered.status == "accepted" and not resolve_commands(run)
    assert answered.response["delivery"] == {"status": "not_delivered", "reason": "the run has ended"}
    assert RunEvent.objects.filter(run=run, message__contains="recorded but not sent").exists()


def test_a_runner_event_after_the_board_answer_changes_nothing(prp):
    run, session, _ = prp
    interaction = created(run, session, PERMISSION)
    interaction_respond(actor=board_for(run.company), interaction=interaction, status="accepted")
    requests.project_request_event(session=session,
                                   event=request_event(run, "runtime_request.resolved", {**PERMISSION, "status": "resolved"}))
    interaction.refresh_from_db()
    assert interaction.status == "accepted" and len(resolve_commands(run)) == 1


def test_agents_cannot_create_runtime_request_interactions(prp):
    run, _session, issue = prp
    with pytest.raises(InvalidInput):
        interaction_create(actor=board_for(run.company), issue=issue, kind="runtime_request", title="x")


def test_the_api_answer_becomes_the_command(prp, client):
    run, session, _ = prp
    interaction = created(run, session, INPUT_V1)
    user = MembershipFactory(company=run.company).user
    client.force_login(user)
    bad = client.post(f"/api/interactions/{interaction.pk}/respond", {"status": "accepted"},
                      content_type="application/json")
    assert_error(bad, 400, fields=("status",))
    response = client.post(f"/api/interactions/{interaction.pk}/respond",
                           {"status": "answered", "response": {"answer": "api-trace"}}, content_type="application/json")
    assert response.status_code == 200, response.content
    assert response.json()["response"]["delivery"]["status"] == "sent"
    [command] = resolve_commands(run)
    assert command.envelope["payload"]["response"] == {"text": "api-trace"}


def test_another_companys_board_cannot_answer(prp, client):
    run, session, _ = prp
    interaction = created(run, session, PERMISSION)
    client.force_login(MembershipFactory().user)
    response = client.post(f"/api/interactions/{interaction.pk}/respond", {"status": "accepted"},
                           content_type="application/json")
    assert_error(response, 404)
    assert not resolve_commands(run)
