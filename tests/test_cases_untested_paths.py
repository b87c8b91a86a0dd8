"""Handoff paths that existed without a test: a run-scoped Stop keeps the work recorded after it;
a delayed transfer whose requester lost authority fails closed (``requester_not_authorized``,
``provenance_missing``, ``requester_unavailable``); a handoff A -> B from a run that ends
``empty_response`` leaves A without a continuation and B's task without an "exhausted" comment;
and the audit rows of a handoff name its workflows and phases."""
import pytest
from django.contrib.auth import get_user_model
from django.db import transaction

from cases.models import Case, CaseHandoff
from issues.models import ActivityLog, Comment, HeartbeatRun, Issue, Membership, WakeupRequest
from issues.services.run_policy import run_policy_for
from issues.services.runs import run_finish
from tests.factories import AgentFactory
from tests.test_case_handoffs import PROMPT_A, PROMPT_B, definition, finish, handoff, kickoff, on_commit, start_work

# Above the kernel's pid_max: a run "with a process" that nothing can signal, so a Stop leaves it
# live (stopping) until it is finished explicitly, as a real process takes a moment to die.
UNSIGNALLABLE_PID = 2 ** 22 + 17


@pytest.fixture
def agents(cases_company, make_agent_client):
    return [make_agent_client(AgentFactory(company=cases_company, name=name), with_run=False)
            for name in ("ada", "bob")]


def new_case(board_client, company, ada, **extra):
    case_id = kickoff(board_client, company, ada.agent, workflowDocumentText="w", **extra).json()["caseId"]
    return case_id, Case.objects.get(pk=case_id).primary_task_id


def history(board_client, case_id):
    return {h["id"]: h for h in board_client.get(f"/api/cases/{case_id}/handoffs").json()["items"]}


def stop_but_keep_running(board_client, run, task_id):
    HeartbeatRun.objects.filter(pk=run.pk).update(pid=UNSIGNALLABLE_PID)
    with on_commit():
        response = board_client.post(f"/api/issues/{task_id}/run/stop")
    assert response.status_code == 200, response.content
    run.refresh_from_db()
    assert run.stop_requested_at is not None and run.status == "running"


# --- a run-scoped Stop keeps newer work --------------------------------------------------------
def test_a_closure_intent_recorded_after_a_run_scoped_stop_survives_the_stopped_run(
        board_client, cases_company, agents):
    ada, _ = agents
    case_id, task_id = new_case(board_client, cases_company, ada)
    run = start_work(ada, case_id)
    stop_but_keep_running(board_client, run, task_id)
    intent = handoff(board_client, cases_company, case_id, "done")
    assert intent.status_code == 201 and intent.json()["status"] == "accepted", intent.content
    with on_commit():
        run_finish(run=HeartbeatRun.objects.get(pk=run.pk), status="cancelled", error="stopped: issue_stop")
    assert history(board_client, case_id)[intent.json()["id"]]["status"] == "accepted"
    # The kept intent still closes the case on the task's accepted completion.
    assert board_client.patch(f"/api/issues/{task_id}", {"status": "done"}, format="json").status_code == 200
    assert Case.objects.get(pk=case_id).status == "done"
    assert history(board_client, case_id)[intent.json()["id"]]["status"] == "applied"


def test_a_transfer_requested_after_a_run_scoped_stop_applies_when_the_run_ends(board_client, cases_company, agents):
    ada, bob = agents
    case_id, task_id = new_case(board_client, cases_company, ada)
    run = start_work(ada, case_id)
    stop_but_keep_running(board_client, run, task_id)
    moved = handoff(board_client, cases_company, case_id, bob.agent, phase="review")
    assert moved.status_code == 201 and moved.json()["status"] == "accepted", moved.content  # waits for the run
    with on_commit():
        run_finish(run=HeartbeatRun.objects.get(pk=run.pk), status="cancelled", error="stopped: issue_stop")
    row = history(board_client, case_id)[moved.json()["id"]]
    assert row["status"] == "applied" and row["recoveryDetail"] == {}
    assert Issue.objects.get(pk=task_id).assignee_agent_id == bob.agent.pk


def test_a_handoff_made_before_the_stop_is_still_cancelled_by_it(board_client, cases_company, agents):
    ada, bob = agents
    case_id, task_id = new_case(board_client, cases_company, ada)
    run = start_work(ada, case_id)
    earlier = handoff(ada, cases_company, case_id, bob.agent).json()
    stop_but_keep_running(board_client, run, task_id)
    with on_commit():
        run_finish(run=HeartbeatRun.objects.get(pk=run.pk), status="cancelled", error="stopped: issue_stop")
    row = history(board_client, case_id)[earlier["id"]]
    assert row["status"] == "cancelled" and row["recoveryDetail"]["cancelReason"] == "execution_stopped"
    assert Issue.objects.get(pk=task_id).assignee_agent_id == ada.agent.pk


# --- delayed assignment with lost authority fails closed ---------------------------------------
def lose_authority(how, board_user, company, handoff_id):
    if how == "requester_not_authorized":
        Membership.objects.filter(user=board_user, company=company).update(role="viewer")
    elif how == "requester_unavailable":
        get_user_model().objects.filter(pk=board_user.pk).delete()
    else:  # a historical row written before provenance was kept
        CaseHandoff.objects.filter(pk=handoff_id).update(principal="")


@pytest.mark.parametrize("how", ["requester_not_authorized", "requester_unavailable", "provenance_missing"])
def test_a_delayed_board_transfer_fails_closed_when_the_requester_lost_authority(
        board_client, board_user, cases_company, agents, how):
    ada, bob = agents
    case_id, task_id = new_case(board_client, cases_company, ada)
    run = start_work(ada, case_id)
    moved = handoff(board_client, cases_company, case_id, bob.agent).json()
    assert moved["status"] == "accepted"
    lose_authority(how, board_user, cases_company, moved["id"])
    finish(run)
    row = CaseHandoff.objects.get(pk=moved["id"])
    assert (row.status, row.recovery_detail["reason"]) == ("failed", how)
    task = Issue.objects.get(pk=task_id)
    assert task.assignee_agent_id == ada.agent.pk  # nothing moved
    assert not WakeupRequest.objects.filter(agent=bob.agent, reason="case_handoff").exists()
    audit = ActivityLog.objects.get(entity_id=str(case_id), action="case.handoff_failed")
    assert audit.details["reason"] == how and audit.details["handoffId"] == moved["id"]


def test_a_delayed_agent_transfer_fails_closed_when_the_requester_is_terminated(board_client, cases_company,
                                                                                 agents):
    ada, bob = agents
    case_id, task_id = new_case(board_client, cases_company, ada)
    run = start_work(ada, case_id)
    moved = handoff(ada, cases_company, case_id, bob.agent).json()
    type(ada.agent).objects.filter(pk=ada.agent.pk).update(status="terminated")
    finish(run)
    row = history(board_client, case_id)[moved["id"]]
    assert (row["status"], row["recoveryDetail"]["reason"]) == ("failed", "requester_unavailable")
    assert Issue.objects.get(pk=task_id).assignee_agent_id == ada.agent.pk


# --- A -> B without a note while A's run derives empty_response --------------------------------
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("exhausted", [False, True])
@pytest.mark.parametrize("inside_batch", [False, True])
def test_handoff_from_an_empty_response_run_neither_continues_a_nor_comments_on_bs_task(
        board_client, cases_company, agents, exhausted, inside_batch):
    """``inside_batch``: the run ends inside a larger transaction, as the runner's event intake
    ends a run from its terminal event; the transfer must still land before the follow-up is
    decided, or A would be continued on (or B's task get the exhausted comment for) work A gave away."""
    ada, bob = agents
    case_id, task_id = new_case(board_client, cases_company, ada)
    run = start_work(ada, case_id)
    if exhausted:  # A's chain is at its limit: a continuation would post the "exhausted" comment
        limit = run_policy_for(agent=ada.agent, issue=Issue.objects.get(pk=task_id)).max_turns
        HeartbeatRun.objects.filter(pk=run.pk).update(continuation_attempt=limit)
    moved = handoff(ada, cases_company, case_id, bob.agent).json()  # no note
    assert moved["status"] == "accepted"
    if inside_batch:
        with transaction.atomic():
            run_finish(run=HeartbeatRun.objects.get(pk=run.pk), status="succeeded")
    else:
        run_finish(run=HeartbeatRun.objects.get(pk=run.pk), status="succeeded")  # commits: real on-commit order
    run.refresh_from_db()
    assert run.liveness == "empty_response", run.liveness_reason
    assert CaseHandoff.objects.get(pk=moved["id"]).status == "applied"
    assert Issue.objects.get(pk=task_id).assignee_agent_id == bob.agent.pk
    assert not WakeupRequest.objects.filter(agent=ada.agent, reason="liveness_continuation").exists()
    assert HeartbeatRun.objects.filter(agent=ada.agent).exclude(pk=run.pk).count() == 0
    assert not Comment.objects.filter(issue_id=task_id, provenance__kind="liveness_continuations_exhausted").exists()
    assert not Comment.objects.filter(issue_id=task_id, body__contains="continuations are exhausted").exists()
    # Bob has the task through the transfer's wakes (one run), not a continuation of Ada's chain.
    bobs = WakeupRequest.objects.filter(agent=bob.agent)
    assert set(bobs.values_list("reason", flat=True)) <= {"case_handoff", "issue_assigned"}
    assert len({run_id for run_id in bobs.values_list("run_id", flat=True) if run_id}) == 1


# --- the audit log names the workflows and phases ---------------------------------------------
def test_handoff_audit_rows_name_workflows_and_phases_including_a_kept_phase(board_client, cases_company, agents):
    ada, bob = agents
    intake = definition(board_client, cases_company, "Intake", PROMPT_A)
    review = definition(board_client, cases_company, "Review", PROMPT_B)
    case_id = kickoff(board_client, cases_company, ada.agent, workflowId=intake["id"], phase="intake").json()["caseId"]
    identifier = Case.objects.get(pk=case_id).identifier
    moved = handoff(board_client, cases_company, case_id, bob.agent, workflowId=review["id"], phase="review").json()
    kept = handoff(board_client, cases_company, case_id, ada.agent).json()  # workflow and phase omitted: kept

    def audit(action, handoff_id):
        return ActivityLog.objects.get(entity_id=str(case_id), action=action, details__handoffId=handoff_id).details

    first = audit("case.handoff_applied", moved["id"])
    assert (first["caseIdentifier"], first["workflowId"], first["workflowName"], first["previousWorkflowName"],
            first["phase"], first["previousPhase"], first["phaseKept"]) == (
        identifier, review["id"], "Review", "Intake", "review", "intake", False)
    assert first["transition"] == 'workflow "Intake" -> "Review"; phase "intake" -> "review"'
    assert audit("case.handoff_accepted", moved["id"])["transition"] == first["transition"]
    second = audit("case.handoff_applied", kept["id"])
    assert (second["workflowName"], second["phase"], second["phaseKept"]) == ("Review", "review", True)
    assert second["transition"] == 'workflow "Review" kept; phase "review" kept'
    start = audit("case.handoff_applied", str(CaseHandoff.objects.get(case_id=case_id, kickoff=True).pk))
    assert start["transition"] == 'workflow "Intake" adopted; phase "intake"'
    assert str(start["taskId"]) == str(Case.objects.get(pk=case_id).primary_task_id)
