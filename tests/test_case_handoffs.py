"""Case handoffs on a real database: kickoff from a shared definition or inline text, transfers
that wait for the outgoing run to settle, adopt / refresh / preserve / detach, the hold when the
workflow document moved, cancel and restart, principal-scoped idempotency, closure intents and
their invalidation, the enable_cases flag, and the periodic sweep as a safety net."""
import threading

import pytest
from django.db import connections
from django.test import TestCase
from django.utils import timezone
from rest_framework.test import APIClient

from cases.models import Case, CaseEvent, CaseHandoff
from issues.actors import SYSTEM
from issues.models import ActivityLog, Document, HeartbeatRun, Issue, WakeupRequest
from issues.services.runs import issue_run_stop, run_finish
from issues.services.scheduling import sweep
from tests.conftest import AgentClient
from tests.factories import AgentFactory, MembershipFactory, RunFactory

PROMPT_A = "# Intake\n\n```mermaid\nstateDiagram-v2\n  [*] --> intake\n```\nCollect the facts.\n"
PROMPT_B = "# Review\n\nCheck every fact against its source.\n"


@pytest.fixture
def agents(cases_company, make_agent_client):
    """Two agents of the company, each with a key (runs are attached per step)."""
    return [make_agent_client(AgentFactory(company=cases_company, name=name), with_run=False)
            for name in ("ada", "bob")]


def definition(client, company, name, prompt):
    response = client.post(f"/api/companies/{company.pk}/workflows", {"name": name, "prompt": prompt}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def kickoff(client, company, recipient, **extra):
    data = {"type": "claim", "title": "Claim 7", "kickoff": "Assess claim 7.", "to": str(recipient.pk), **extra}
    return client.post(f"/api/companies/{company.pk}/case-handoffs", data, format="json")


def handoff(client, company, case_id, to, **extra):
    data = {"caseId": str(case_id), "to": to if isinstance(to, str) else str(to.pk), **extra}
    return client.post(f"/api/companies/{company.pk}/case-handoffs", data, format="json")


def workflow_doc(case_id) -> Document:
    case = Case.objects.get(pk=case_id)
    return Document.objects.select_related("latest_revision").get(issue_id=case.primary_task_id, key="workflow")


def start_work(client: AgentClient, case_id):
    """The recipient works in the run its handoff wake created and checks the task out."""
    case = Case.objects.get(pk=case_id)
    wake = WakeupRequest.objects.filter(agent=client.agent, issue_id=case.primary_task_id,
                                        reason="case_handoff").latest("created_at")
    client.use_run(wake.run)
    response = client.post(f"/api/issues/{case.primary_task_id}/checkout",
                           {"agentId": str(client.agent.pk), "expectedStatuses": ["todo"]}, format="json")
    assert response.status_code == 200, response.content
    return wake.run


def on_commit():
    """The test transaction never commits: run the on-commit subscribers (run_finished) as a commit would."""
    return TestCase.captureOnCommitCallbacks(execute=True)


def finish(run):
    with on_commit():
        run_finish(run=HeartbeatRun.objects.get(pk=run.pk), status="succeeded")


def stop(task):
    with on_commit():
        issue_run_stop(actor=SYSTEM, issue=Issue.objects.get(pk=task.pk))


# --- kickoff and reuse ------------------------------------------------------------------------
def test_one_definition_is_reused_by_two_cases_and_edits_affect_future_adoptions_only(
        board_client, cases_company, agents):
    ada, _ = agents
    wf = definition(board_client, cases_company, "Intake", PROMPT_A)
    first = kickoff(board_client, cases_company, ada.agent, workflowId=wf["id"], phase="intake")
    second = kickoff(board_client, cases_company, ada.agent, workflowId=wf["id"], title="Claim 8")
    assert first.status_code == second.status_code == 201, first.content
    one, two = first.json(), second.json()
    assert one["caseId"] != two["caseId"] and one["status"] == two["status"] == "applied"
    assert one["workflowAction"] == "adopt" and one["workflowName"] == "Intake" and one["kickoff"] is True
    for data in (one, two):
        case = Case.objects.select_related("primary_task").get(pk=data["caseId"])
        assert case.current_workflow_id is not None and str(case.current_workflow_id) == wf["id"]
        assert workflow_doc(case.pk).latest_revision.body == PROMPT_A
        assert case.primary_task.assignee_agent_id == ada.agent.pk and case.status == "in_progress"
    # Delivery is a wake of the recipient about the primary task.
    wake = WakeupRequest.objects.get(pk=one["wakeupId"])
    assert wake.agent_id == ada.agent.pk and wake.reason == "case_handoff"
    assert str(wake.issue_id) == str(Case.objects.get(pk=one["caseId"]).primary_task_id)
    # A shared edit changes future adoptions only: both cases keep their copies.
    edited = board_client.patch(f"/api/workflows/{wf['id']}", {"prompt": PROMPT_A + "\nNew rule.\n"}, format="json")
    assert edited.status_code == 200
    assert workflow_doc(one["caseId"]).latest_revision.body == PROMPT_A
    assert workflow_doc(two["caseId"]).latest_revision.body == PROMPT_A
    assert workflow_doc(one["caseId"]).revision_count == 1


def test_kickoff_with_inline_text_and_initial_documents(board_client, cases_company, agents):
    ada, _ = agents
    response = kickoff(board_client, cases_company, ada.agent, workflowDocumentText="Inline  procedure\n",
                       initialDocuments=[{"key": "brief", "body": "Facts so far.", "title": "Brief"}])
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["workflowAction"] == "preserve" and data["workflowId"] is None and data["status"] == "applied"
    case = Case.objects.get(pk=data["caseId"])
    assert case.current_workflow_id is None
    assert workflow_doc(case.pk).latest_revision.body == "Inline  procedure\n"
    brief = Document.objects.get(issue_id=case.primary_task_id, key="brief")
    assert brief.latest_revision.body == "Facts so far." and brief.title == "Brief"


@pytest.mark.parametrize("extra, field", [
    ({}, "workflowDocumentText"),
    ({"workflowDocumentText": "w", "initialDocuments": [{"key": "workflow", "body": "x"}]},
     "initialDocuments[0].key"),
    ({"workflowDocumentText": "w", "initialDocuments": [{"key": "Bad Key", "body": "x"}]},
     "initialDocuments[0].key"),
    ({"workflowDocumentText": "w", "to": "done"}, "to"),
    ({"workflowDocumentText": "w", "workflowId": "0b5c2f7e-8d1a-4c3e-9f00-000000000000"}, "workflowId"),
])
def test_bad_kickoff_is_rejected_before_any_write(board_client, cases_company, agents, extra, field):
    ada, _ = agents
    before = (Case.objects.count(), Issue.objects.count(), Document.objects.count(), CaseHandoff.objects.count())
    response = kickoff(board_client, cases_company, ada.agent, **extra)
    assert response.status_code == 400, response.content
    assert field in response.json()["details"]
    assert (Case.objects.count(), Issue.objects.count(), Document.objects.count(),
            CaseHandoff.objects.count()) == before


def test_seed_budget_counts_workflow_text_and_documents_together(board_client, cases_company, agents, settings):
    settings.PAPERCLIP = {**settings.PAPERCLIP, "CASE_SEED_BUDGET_BYTES": 100}
    ada, _ = agents
    response = kickoff(board_client, cases_company, ada.agent, workflowDocumentText="w" * 60,
                       initialDocuments=[{"key": "brief", "body": "é" * 25}])  # 60 + 50 bytes
    assert response.status_code == 400 and "initialDocuments" in response.json()["details"]
    assert not Case.objects.exists()


# --- the A -> B -> A journey ------------------------------------------------------------------
def test_case_moves_a_to_b_to_a_on_the_same_task_with_full_history(board_client, cases_company, agents):
    ada, bob = agents
    wf_a = definition(board_client, cases_company, "Intake", PROMPT_A)
    wf_b = definition(board_client, cases_company, "Review", PROMPT_B)
    first = kickoff(board_client, cases_company, ada.agent, workflowId=wf_a["id"], phase="intake").json()
    case_id = first["caseId"]
    task_id = Case.objects.get(pk=case_id).primary_task_id

    # Ada works, then hands to Bob under workflow B while her run is still live: accepted, not applied.
    run = start_work(ada, case_id)
    response = handoff(ada, cases_company, case_id, bob.agent, workflowId=wf_b["id"], phase="review",
                       note="Facts collected; please review.", idempotencyKey="to-bob")
    assert response.status_code == 201, response.content
    to_bob = response.json()
    assert to_bob["status"] == "accepted" and to_bob["workflowAction"] == "adopt"
    assert to_bob["previousWorkflowName"] == "Intake" and to_bob["workflowName"] == "Review"
    assert Issue.objects.get(pk=task_id).assignee_agent_id == ada.agent.pk  # nothing moved yet
    assert workflow_doc(case_id).latest_revision.body == PROMPT_A

    finish(run)  # the outgoing execution settles: workflow, phase, document and assignee move together
    after = CaseHandoff.objects.get(pk=to_bob["id"])
    assert after.status == "applied"
    case = Case.objects.get(pk=case_id)
    task = Issue.objects.get(pk=task_id)
    assert (str(case.current_workflow_id), case.phase) == (wf_b["id"], "review")
    assert workflow_doc(case_id).latest_revision.body == PROMPT_B
    assert str(after.applied_revision_id) == str(workflow_doc(case_id).latest_revision_id)
    assert (task.assignee_agent_id, task.status) == (bob.agent.pk, "todo")
    assert task.comments.filter(body="Facts collected; please review.", author_agent=ada.agent).exists()

    # Bob works and hands back to Ada under workflow A, on the same task.
    run = start_work(bob, case_id)
    back = handoff(bob, cases_company, case_id, ada.agent, workflowId=wf_a["id"], phase="intake-2").json()
    finish(run)
    assert CaseHandoff.objects.get(pk=back["id"]).status == "applied"
    case.refresh_from_db()
    assert (str(case.current_workflow_id), case.phase, case.primary_task_id) == (wf_a["id"], "intake-2", task_id)
    assert workflow_doc(case_id).latest_revision.body == PROMPT_A and workflow_doc(case_id).revision_count == 3

    history = board_client.get(f"/api/cases/{case_id}/handoffs").json()["items"]
    assert [(h["workflowName"], h["previousWorkflowName"], h["phase"], h["previousPhase"], h["status"])
            for h in history] == [
        ("Intake", "", "intake", "", "applied"),
        ("Review", "Intake", "review", "intake", "applied"),
        ("Intake", "Review", "intake-2", "review", "applied"),
    ]
    kinds = list(CaseEvent.objects.filter(case_id=case_id).values_list("kind", flat=True))
    assert kinds.count("handoff") == 3 and kinds.count("handoff_applied") == 3
    applied = CaseEvent.objects.filter(case_id=case_id, kind="handoff_applied").order_by("created_at", "id")
    assert [e.details["workflowName"] for e in applied] == ["Intake", "Review", "Intake"]
    assert ActivityLog.objects.filter(entity_id=str(case_id), action="case.handoff_applied").count() == 3


def test_refresh_picks_up_an_edited_definition(board_client, cases_company, agents):
    ada, bob = agents
    wf = definition(board_client, cases_company, "Intake", PROMPT_A)
    case_id = kickoff(board_client, cases_company, ada.agent, workflowId=wf["id"]).json()["caseId"]
    board_client.patch(f"/api/workflows/{wf['id']}", {"prompt": "# Intake v2\n"}, format="json")
    response = handoff(board_client, cases_company, case_id, bob.agent, workflowId=wf["id"])
    assert response.status_code == 201, response.content
    data = response.json()
    assert (data["workflowAction"], data["status"]) == ("refresh", "applied")
    assert workflow_doc(case_id).latest_revision.body == "# Intake v2\n"


def test_preserve_keeps_workflow_and_document_and_detach_unbinds_the_definition(
        board_client, cases_company, agents):
    ada, bob = agents
    wf = definition(board_client, cases_company, "Intake", PROMPT_A)
    case_id = kickoff(board_client, cases_company, ada.agent, workflowId=wf["id"], phase="intake").json()["caseId"]
    kept = handoff(board_client, cases_company, case_id, bob.agent).json()
    assert (kept["workflowAction"], kept["workflowName"], kept["phase"]) == ("preserve", "Intake", "intake")
    case = Case.objects.get(pk=case_id)
    assert (str(case.current_workflow_id), case.phase) == (wf["id"], "intake")
    detached = handoff(board_client, cases_company, case_id, ada.agent, workflowId=None).json()
    assert (detached["workflowAction"], detached["workflowName"], detached["previousWorkflowName"]) == (
        "detach", "", "Intake")
    case.refresh_from_db()
    assert case.current_workflow_id is None
    assert workflow_doc(case_id).latest_revision.body == PROMPT_A and workflow_doc(case_id).revision_count == 1


# --- hold, cancel, restart --------------------------------------------------------------------
def test_conflicting_document_edit_holds_then_cancel_and_restart(board_client, cases_company, agents):
    ada, bob = agents
    wf_a = definition(board_client, cases_company, "Intake", PROMPT_A)
    wf_b = definition(board_client, cases_company, "Review", PROMPT_B)
    case_id = kickoff(board_client, cases_company, ada.agent, workflowId=wf_a["id"]).json()["caseId"]
    task_id = Case.objects.get(pk=case_id).primary_task_id
    run = start_work(ada, case_id)
    held = handoff(ada, cases_company, case_id, bob.agent, workflowId=wf_b["id"], idempotencyKey="k1").json()
    # After acceptance, Ada edits the workflow document in the same run.
    base = str(workflow_doc(case_id).latest_revision_id)
    edit = ada.put(f"/api/issues/{task_id}/documents/workflow",
                   {"body": PROMPT_A + "\nAda's local note.\n", "baseRevisionId": base}, format="json")
    assert edit.status_code in (200, 201), edit.content
    finish(run)

    row = CaseHandoff.objects.get(pk=held["id"])
    assert row.status == "held" and row.recovery_detail["reason"] == "workflow_document_changed"
    assert row.recovery_detail["currentRevisionId"] == str(workflow_doc(case_id).latest_revision_id)
    assert workflow_doc(case_id).latest_revision.body.endswith("Ada's local note.\n")  # never overwritten
    assert Issue.objects.get(pk=task_id).assignee_agent_id == ada.agent.pk
    assert Case.objects.get(pk=case_id).current_workflow.name == "Intake"
    assert CaseEvent.objects.filter(case_id=case_id, kind="handoff_held").exists()

    # A retry with the same base stays held; another handoff is refused while this one is open.
    assert board_client.post(f"/api/cases/{case_id}/handoffs/{held['id']}/retry").json()["status"] == "held"
    assert handoff(board_client, cases_company, case_id, bob.agent).status_code == 409

    # Recovery: cancel the old intent, read the document back, hand off again.
    cancelled = board_client.post(f"/api/cases/{case_id}/handoffs/{held['id']}/cancel",
                                  {"reason": "document edited after acceptance"}, format="json")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    restart = handoff(board_client, cases_company, case_id, bob.agent, workflowId=wf_b["id"])
    assert restart.status_code == 201 and restart.json()["status"] == "applied", restart.content
    assert workflow_doc(case_id).latest_revision.body == PROMPT_B
    assert Issue.objects.get(pk=task_id).assignee_agent_id == bob.agent.pk


# --- idempotency ------------------------------------------------------------------------------
def test_replayed_handoff_returns_the_same_handoff_across_runs_of_the_principal(board_client, cases_company,
                                                                                  agents):
    ada, bob = agents
    case_id = kickoff(board_client, cases_company, ada.agent, workflowDocumentText="w").json()["caseId"]
    run = start_work(ada, case_id)
    first = handoff(ada, cases_company, case_id, bob.agent, phase="p", idempotencyKey="move-1")
    again = handoff(ada, cases_company, case_id, bob.agent, phase="p", idempotencyKey="move-1")
    assert (first.status_code, again.status_code) == (201, 200) and first.json()["id"] == again.json()["id"]
    finish(run)
    # Idempotency belongs to the principal, not the run: a later run replaying the key gets it too.
    ada.use_run(RunFactory(agent=ada.agent))
    later = handoff(ada, cases_company, case_id, bob.agent, phase="p", idempotencyKey="move-1")
    assert later.status_code == 200 and later.json()["id"] == first.json()["id"]
    assert later.json()["status"] == "applied"
    reused = handoff(ada, cases_company, case_id, bob.agent, phase="other", idempotencyKey="move-1")
    assert reused.status_code == 409 and reused.json()["code"] == "idempotency_key_reused"
    assert CaseHandoff.objects.filter(case_id=case_id).count() == 2  # kickoff + one transfer


def test_kickoff_replay_creates_one_case(board_client, cases_company, agents):
    ada, _ = agents
    first = kickoff(board_client, cases_company, ada.agent, workflowDocumentText="w", idempotencyKey="k")
    again = kickoff(board_client, cases_company, ada.agent, workflowDocumentText="w", idempotencyKey="k")
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"] and Case.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_replays_of_one_kickoff_make_one_case_and_one_handoff(cases_company, agents):
    ada, _ = agents
    user = MembershipFactory(company=cases_company, role="owner").user
    results, barrier = [], threading.Barrier(8)

    def post():
        client = APIClient()
        client.force_login(user)
        barrier.wait()
        try:
            results.append(kickoff(client, cases_company, ada.agent, workflowDocumentText="w",
                                   idempotencyKey="same").status_code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=post) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results).count(201) == 1 and all(code in (200, 201) for code in results), results
    assert Case.objects.count() == 1 and CaseHandoff.objects.count() == 1 and Issue.objects.count() == 1


# --- who may hand off -------------------------------------------------------------------------
def test_agents_hand_off_only_their_own_work(board_client, cases_company, agents):
    ada, bob = agents
    case_id = kickoff(board_client, cases_company, ada.agent, workflowDocumentText="w").json()["caseId"]
    bob.use_run(RunFactory(agent=bob.agent))
    response = handoff(bob, cases_company, case_id, bob.agent)
    assert response.status_code == 403 and response.json()["code"] == "not_your_work"
    assert CaseHandoff.objects.filter(case_id=case_id).count() == 1
    ada.use_run(None)
    assert handoff(ada, cases_company, case_id, bob.agent).status_code == 401  # agents need their run


def test_unknown_recipient_and_foreign_workflow_are_404(board_client, cases_company, agents, make_agent_client):
    ada, _ = agents
    case_id = kickoff(board_client, cases_company, ada.agent, workflowDocumentText="w").json()["caseId"]
    stranger = AgentFactory()
    assert handoff(board_client, cases_company, case_id, stranger).status_code == 404
    assert handoff(board_client, cases_company, case_id, "not-a-uuid").status_code == 404
    assert CaseHandoff.objects.filter(case_id=case_id).count() == 1


# --- closure intents ---------------------------------------------------------------------------
def test_done_intent_closes_the_case_on_the_tasks_accepted_completion(board_client, cases_company, agents):
    ada, _ = agents
    case_id = kickoff(board_client, cases_company, ada.agent, workflowDocumentText="w").json()["caseId"]
    task_id = Case.objects.get(pk=case_id).primary_task_id
    run = start_work(ada, case_id)
    wakes = WakeupRequest.objects.count()
    intent = handoff(ada, cases_company, case_id, "done")
    assert intent.status_code == 201 and intent.json()["status"] == "accepted", intent.content
    assert intent.json()["target"] == "done" and intent.json()["toAgentId"] is None
    assert WakeupRequest.objects.count() == wakes  # no wake, no assignment
    assert Issue.objects.get(pk=task_id).assignee_agent_id == ada.agent.pk
    # Waiting on review preserves the intent; completion closes the case with the task.
    assert ada.patch(f"/api/issues/{task_id}", {"status": "in_review"}, format="json").status_code == 200
    assert CaseHandoff.objects.get(pk=intent.json()["id"]).status == "accepted"
    assert Case.objects.get(pk=case_id).status == "in_progress"
    assert ada.patch(f"/api/issues/{task_id}", {"status": "done"}, format="json").status_code == 200
    assert Case.objects.get(pk=case_id).status == "done"
    assert CaseHandoff.objects.get(pk=intent.json()["id"]).status == "applied"
    assert CaseEvent.objects.filter(case_id=case_id, kind="closed").exists()
    finish(run)
    assert handoff(board_client, cases_company, case_id, ada.agent).status_code == 422  # closed


def test_completion_without_an_intent_leaves_the_case_open(board_client, cases_company, agents):
    ada, _ = agents
    case_id = kickoff(board_client, cases_company, ada.agent, workflowDocumentText="w").json()["caseId"]
    task_id = Case.objects.get(pk=case_id).primary_task_id
    start_work(ada, case_id)
    assert ada.patch(f"/api/issues/{task_id}", {"status": "done"}, format="json").status_code == 200
    assert Case.objects.get(pk=case_id).status == "in_progress"


@pytest.mark.parametrize("invalidate, reason", [
    ("reassign", "task_reassigned"),
    ("release", "task_reassigned"),  # the agent gives the task back: no assignee, as an unassignment
    ("cancel", "task_cancelled"),
    ("stop", "execution_stopped"),
])
def test_done_intent_is_invalidated_by_reassignment_cancellation_or_stop(board_client, cases_company, agents,
                                                                         invalidate, reason):
    ada, bob = agents
    case_id = kickoff(board_client, cases_company, ada.agent, workflowDocumentText="w").json()["caseId"]
    task_id = Case.objects.get(pk=case_id).primary_task_id
    start_work(ada, case_id)
    intent = handoff(ada, cases_company, case_id, "done").json()
    task = Issue.objects.get(pk=task_id)
    if invalidate == "reassign":
        board_client.patch(f"/api/issues/{task_id}", {"assigneeAgentId": str(bob.agent.pk)}, format="json")
    elif invalidate == "release":
        assert ada.post(f"/api/issues/{task_id}/release").status_code == 200
    elif invalidate == "cancel":
        board_client.patch(f"/api/issues/{task_id}", {"status": "cancelled"}, format="json")
    else:
        stop(task)
    row = CaseHandoff.objects.get(pk=intent["id"])
    assert row.status == "cancelled" and row.recovery_detail["cancelReason"] == reason
    # Completing later does not close the case.
    if invalidate in ("reassign", "release"):
        board_client.patch(f"/api/issues/{task_id}", {"status": "done"}, format="json")
    assert Case.objects.get(pk=case_id).status == "in_progress"


def test_a_stopped_run_cancels_the_transfer_it_requested(board_client, cases_company, agents):
    ada, bob = agents
    case_id = kickoff(board_client, cases_company, ada.agent, workflowDocumentText="w").json()["caseId"]
    start_work(ada, case_id)
    moved = handoff(ada, cases_company, case_id, bob.agent).json()
    stop(Issue.objects.get(pk=Case.objects.get(pk=case_id).primary_task_id))
    row = CaseHandoff.objects.get(pk=moved["id"])
    assert row.status == "cancelled" and row.recovery_detail["cancelReason"] == "execution_stopped"
    assert Issue.objects.get(pk=row.case.primary_task_id).assignee_agent_id == ada.agent.pk


# --- flag off, sweep --------------------------------------------------------------------------
def test_flag_off_hides_case_routes_but_cancel_still_works(board_client, cases_company, agents):
    ada, bob = agents
    case_id = kickoff(board_client, cases_company, ada.agent, workflowDocumentText="w").json()["caseId"]
    start_work(ada, case_id)
    pending = handoff(ada, cases_company, case_id, bob.agent).json()
    cases_company.enable_cases = False
    cases_company.save()
    assert handoff(board_client, cases_company, case_id, bob.agent).status_code == 404
    assert board_client.get(f"/api/cases/{case_id}/handoffs").status_code == 404
    assert board_client.post(f"/api/cases/{case_id}/handoffs/{pending['id']}/retry").status_code == 404
    response = ada.post(f"/api/cases/{case_id}/handoffs/{pending['id']}/cancel")
    assert response.status_code == 200 and response.json()["status"] == "cancelled", response.content


def test_sweep_applies_a_transfer_whose_run_ended_without_the_receiver(board_client, cases_company, agents):
    ada, bob = agents
    case_id = kickoff(board_client, cases_company, ada.agent, workflowDocumentText="w").json()["caseId"]
    run = start_work(ada, case_id)
    moved = handoff(ada, cases_company, case_id, bob.agent).json()
    # The run's process died and a reaper ended it by row update (no run_finished signal).
    HeartbeatRun.objects.filter(pk=run.pk).update(status="failed", finished_at=timezone.now())
    Issue.objects.filter(pk=Case.objects.get(pk=case_id).primary_task_id).update(
        checkout_run=None, execution_run=None, execution_locked_at=None)
    assert CaseHandoff.objects.get(pk=moved["id"]).status == "accepted"
    report = sweep(owner="test")
    assert report["caseHandoffsApplied"] == 1
    assert CaseHandoff.objects.get(pk=moved["id"]).status == "applied"


def test_patch_cannot_change_status_phase_or_routing(board_client, cases_company, agents):
    ada, _ = agents
    case_id = kickoff(board_client, cases_company, ada.agent, workflowDocumentText="w").json()["caseId"]
    for field, value in (("status", "done"), ("phase", "x"), ("assigneeAgentId", str(ada.agent.pk))):
        response = board_client.patch(f"/api/cases/{case_id}", {field: value}, format="json")
        assert response.status_code == 400 and field in response.json()["details"], field
    assert Case.objects.get(pk=case_id).status == "in_progress"


def test_handoff_history_keeps_its_agents_but_company_deletion_removes_everything(board_client, cases_company,
                                                                                   agents):
    from django.db.models import RestrictedError

    ada, _ = agents
    kickoff(board_client, cases_company, ada.agent, workflowDocumentText="w")
    with pytest.raises(RestrictedError):
        ada.agent.delete()
    cases_company.delete()
    assert not CaseHandoff.objects.exists() and not Case.objects.exists()


def test_an_agent_kicks_off_a_case_for_another_agent_from_its_run(cases_company, agents):
    ada, bob = agents
    ada.use_run(RunFactory(agent=ada.agent))
    response = kickoff(ada, cases_company, bob.agent, workflowDocumentText="w", note="Over to you.")
    assert response.status_code == 201, response.content
    data = response.json()
    assert (data["status"], data["fromAgentId"], data["toAgentId"]) == ("applied", str(ada.agent.pk), str(bob.agent.pk))
    assert data["requestedBy"] == {"type": "agent", "id": str(ada.agent.pk)}
    case = Case.objects.get(pk=data["caseId"])
    assert case.created_by_agent_id == ada.agent.pk
    assert case.primary_task.comments.filter(body="Over to you.", author_agent=ada.agent).exists()


@pytest.mark.django_db(transaction=True)
def test_concurrent_case_creates_with_one_idempotency_key_make_one_case(cases_company):
    user = MembershipFactory(company=cases_company, role="owner").user
    results, barrier = [], threading.Barrier(8)
    body = {"type": "claim", "title": "Claim 9", "kickoff": "k", "workflowDocumentText": "w", "idempotencyKey": "c9"}

    def post():
        client = APIClient()
        client.force_login(user)
        barrier.wait()
        try:
            response = client.post(f"/api/companies/{cases_company.pk}/cases", body, format="json")
            results.append((response.status_code, response.json().get("id")))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=post) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = sorted(code for code, _ in results)
    assert codes == [200] * 7 + [201], results
    assert len({case_id for _, case_id in results}) == 1
    assert Case.objects.count() == 1 and Issue.objects.count() == 1
