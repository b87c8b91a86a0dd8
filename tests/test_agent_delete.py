"""DELETE /api/agents/{id} (upstream's purge, board only): the agent goes with its runs, wakes and
keys while its issues stay; refused while kept history names the agent (case handoffs, and the
comments, attachments and document revisions it wrote: terminate it instead, the history goes on
naming it) or while it has a live run; deleting the whole company still removes that history with
the agents."""
import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from cases.models import Case, CaseEvent, CaseHandoff
from issues.actors import Actor
from issues.models import ActivityLog, Agent, AgentApiKey, Comment, Company, DocumentRevision, HeartbeatRun, Issue
from issues.services.thread import comment_create, document_write
from tests.attachment_files import a_file
from tests.factories import AgentFactory, CompanyFactory, IssueFactory, RunFactory
from tests.test_case_handoffs import finish, handoff, kickoff, start_work
from tests.test_errors import assert_error


@pytest.fixture
def agents(cases_company, make_agent_client):
    return [make_agent_client(AgentFactory(company=cases_company, name=name), with_run=False)
            for name in ("ada", "bob")]


def purge(client, agent):
    return client.delete(f"/api/agents/{agent.pk}")


def hand_over(sender, recipient, company, case_id):
    """The sender works the case's task in its run and hands it to the recipient (from -> to)."""
    run = start_work(sender, case_id)
    moved = handoff(sender, company, case_id, recipient.agent)
    assert moved.status_code == 201, moved.content
    finish(run)
    assert CaseHandoff.objects.get(pk=moved.json()["id"]).status == "applied"


def test_board_purges_an_agent_without_case_history(board_client, company, make_agent_client):
    gone = make_agent_client(AgentFactory(company=company, name="gone"), with_run=False).agent
    report = AgentFactory(company=company, name="report", reports_to=gone)
    RunFactory(agent=gone, status="succeeded", finished_at=timezone.now())
    task = IssueFactory(company=company, assignee_agent=gone, created_by_agent=gone)

    response = purge(board_client, gone)

    assert response.status_code == 200, response.content
    assert response.json() == {"ok": True}
    assert not Agent.objects.filter(pk=gone.pk).exists()
    assert not HeartbeatRun.objects.filter(agent_id=gone.pk).exists()
    assert not AgentApiKey.objects.filter(agent_id=gone.pk).exists()
    task.refresh_from_db()
    report.refresh_from_db()
    assert (task.assignee_agent_id, task.created_by_agent_id, report.reports_to_id) == (None, None, None)
    entry = ActivityLog.objects.get(action="agent.deleted", entity_id=str(gone.pk))
    assert entry.details["name"] == "gone" and entry.company_id == company.pk
    assert_error(purge(board_client, gone), 404, "not_found")


def test_only_the_board_purges_and_another_companys_agent_is_a_404(board_client, company, make_agent_client):
    caller = make_agent_client(AgentFactory(company=company, name="caller"))
    target = AgentFactory(company=company, name="target")
    assert_error(purge(caller, target), 403, "board_only")
    assert_error(purge(caller, caller.agent), 403, "board_only")
    foreign = AgentFactory(company=CompanyFactory(issue_prefix="OTH"), name="foreign")
    assert_error(purge(board_client, foreign), 404, "not_found")
    assert Agent.objects.filter(pk__in=[target.pk, caller.agent.pk, foreign.pk]).count() == 3
    assert not ActivityLog.objects.filter(action="agent.deleted").exists()


def test_purge_is_refused_while_case_handoffs_reference_the_agent(board_client, cases_company, agents):
    ada, bob = agents
    case_id = kickoff(board_client, cases_company, ada.agent, workflowDocumentText="w").json()["caseId"]
    kickoff(board_client, cases_company, ada.agent, workflowDocumentText="w", title="Claim 8")
    hand_over(ada, bob, cases_company, case_id)
    before = CaseHandoff.objects.count()

    error = assert_error(purge(board_client, ada.agent), 409, "agent_case_history_retained")
    assert error["details"] == {"agentId": str(ada.agent.pk), "handoffs": 3}  # two kickoffs to her, one from her
    error = assert_error(purge(board_client, bob.agent), 409, "agent_case_history_retained")
    assert error["details"]["handoffs"] == 1

    assert Agent.objects.filter(pk__in=[ada.agent.pk, bob.agent.pk]).count() == 2
    assert CaseHandoff.objects.count() == before
    assert not ActivityLog.objects.filter(action="agent.deleted").exists()


def test_termination_keeps_the_attribution_and_purge_stays_refused(board_client, cases_company, agents):
    ada, bob = agents
    case_id = kickoff(board_client, cases_company, ada.agent, workflowDocumentText="w").json()["caseId"]
    hand_over(ada, bob, cases_company, case_id)

    response = board_client.post(f"/api/agents/{ada.agent.pk}/terminate")
    assert response.status_code == 200 and response.json()["status"] == "terminated"

    history = board_client.get(f"/api/cases/{case_id}/handoffs").json()["items"]
    assert [(h["fromAgentId"], h["toAgentId"]) for h in history] == [
        (None, str(ada.agent.pk)), (str(ada.agent.pk), str(bob.agent.pk))]
    assert_error(purge(board_client, ada.agent), 409, "agent_case_history_retained")
    assert Agent.objects.get(pk=ada.agent.pk).status == "terminated"


def test_purge_is_refused_while_the_agent_has_a_live_run_until_it_is_terminated(board_client, company):
    busy = AgentFactory(company=company, name="busy")
    run = RunFactory(agent=busy, status="running", started_at=timezone.now())
    error = assert_error(purge(board_client, busy), 409, "agent_run_active")
    assert error["details"]["liveRunIds"] == [str(run.pk)]
    assert HeartbeatRun.objects.get(pk=run.pk).status == "running"

    assert board_client.post(f"/api/agents/{busy.pk}/terminate").status_code == 200  # cancels the run
    assert purge(board_client, busy).status_code == 200
    assert not HeartbeatRun.objects.filter(pk=run.pk).exists()


def test_company_deletion_removes_case_history_with_its_agents(board_client, cases_company, agents):
    ada, bob = agents
    case_id = kickoff(board_client, cases_company, ada.agent, workflowDocumentText="w").json()["caseId"]
    hand_over(ada, bob, cases_company, case_id)
    open_case = kickoff(board_client, cases_company, bob.agent, workflowDocumentText="w", title="Claim 9").json()
    handoff(board_client, cases_company, open_case["caseId"], "done")  # an open closure intent
    board_client.post(f"/api/agents/{ada.agent.pk}/terminate")
    assert CaseHandoff.objects.filter(company=cases_company).count() == 4

    Company.objects.get(pk=cases_company.pk).delete()
    connection.check_constraints()  # the deferred foreign keys hold, as a commit would check them

    for model in (CaseHandoff, CaseEvent, Case, Agent, Issue):
        assert not model.objects.exists(), model


def test_purge_is_refused_while_the_agent_is_named_as_a_writer_and_nothing_is_lost(
        board_client, company, make_agent_client):
    writer = make_agent_client(AgentFactory(company=company, name="writer"))
    task = IssueFactory(company=company)
    commented = writer.post(f"/api/issues/{task.pk}/comments", {"body": "Root cause found"}, format="json")
    assert commented.status_code == 201, commented.content
    upload = writer.post(f"/api/companies/{company.pk}/issues/{task.pk}/attachments",
                         {"file": a_file("trace.txt", b"boom", "text/plain")}, format="multipart")
    assert upload.status_code == 201, upload.content
    document_write(actor=Actor(agent=writer.agent, run_header=str(writer.run.pk)), issue=task, key="plan",
                   body="1. Fix")
    writer.run.status, writer.run.finished_at = "succeeded", timezone.now()
    writer.run.save()

    error = assert_error(purge(board_client, writer.agent), 409, "agent_delete_restricted")

    assert error["details"]["agentId"] == str(writer.agent.pk)
    assert set(error["details"]["referencedBy"]) == {"comment", "attachment", "document revision"}
    assert Agent.objects.filter(pk=writer.agent.pk).exists() and HeartbeatRun.objects.filter(pk=writer.run.pk).exists()
    assert Comment.objects.get(issue=task).author_agent_id == writer.agent.pk
    assert not ActivityLog.objects.filter(action="agent.deleted").exists()
    # Terminating is the way out; what it wrote stays attributed to it.
    assert board_client.post(f"/api/agents/{writer.agent.pk}/terminate").status_code == 200
    assert_error(purge(board_client, writer.agent), 409, "agent_delete_restricted")
    assert DocumentRevision.objects.get(document__issue=task).author_agent_id == writer.agent.pk


def test_company_deletion_removes_what_its_agents_wrote_with_them(company):
    writer = AgentFactory(company=company)
    task = IssueFactory(company=company)
    comment_create(actor=Actor(agent=writer), issue=task, body="done")
    document_write(actor=Actor(agent=writer), issue=task, key="plan", body="1. Fix")

    Company.objects.get(pk=company.pk).delete()
    connection.check_constraints()

    assert not Comment.objects.exists() and not DocumentRevision.objects.exists() and not Agent.objects.exists()


def test_a_revision_written_as_an_agent_must_name_it(company):
    writer = AgentFactory(company=company)
    revision = document_write(actor=Actor(agent=writer), issue=IssueFactory(company=company), key="plan", body="x")
    for change in ({"author_agent": None}, {"author_type": "ghost"}):
        with pytest.raises(IntegrityError), transaction.atomic():
            DocumentRevision.objects.filter(pk=revision.pk).update(**change)
