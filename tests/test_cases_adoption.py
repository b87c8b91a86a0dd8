"""A new case adopts the workflow definition it names (its prompt becomes the primary task's
``workflow`` document, name and fingerprint captured; contradicting inline text is refused), and a
kickoff (or a plain create) may bind an existing issue of the company as the primary task, which
later handoffs and replays reuse."""
import pytest

from cases.models import Case, CaseEvent, CaseHandoff
from cases.services import prompt_fingerprint
from issues.models import ActivityLog, Comment, Document, Issue
from tests.factories import AgentFactory, CompanyFactory, IssueFactory, RunFactory
from tests.test_errors import assert_error

PROMPT = "# Intake\n\nCollect  the facts, then hand on.\n"


@pytest.fixture
def agents(cases_company, make_agent_client):
    return [make_agent_client(AgentFactory(company=cases_company, name=name), with_run=False)
            for name in ("ada", "bob")]


@pytest.fixture
def intake(board_client, cases_company):
    response = board_client.post(f"/api/companies/{cases_company.pk}/workflows", {"name": "Intake", "prompt": PROMPT},
                                 format="json")
    assert response.status_code == 201, response.content
    return response.json()


def create(client, company, **extra):
    data = {"type": "claim", "title": "Claim 7", "kickoff": "Assess claim 7.", **extra}
    return client.post(f"/api/companies/{company.pk}/cases", data, format="json")


def kickoff(client, company, recipient, **extra):
    data = {"type": "claim", "title": "Claim 7", "kickoff": "Assess claim 7.", "to": str(recipient.pk), **extra}
    return client.post(f"/api/companies/{company.pk}/case-handoffs", data, format="json")


def workflow_body(case_id) -> str:
    case = Case.objects.get(pk=case_id)
    return Document.objects.get(issue_id=case.primary_task_id, key="workflow").latest_revision.body


def counts():
    return (Case.objects.count(), Issue.objects.count(), Document.objects.count(), CaseHandoff.objects.count())


# --- 1. a case created with workflowDefinitionId adopts it -----------------------------------
def test_create_with_a_definition_adopts_its_prompt_and_captures_name_and_fingerprint(
        board_client, cases_company, intake):
    response = create(board_client, cases_company, workflowDefinitionId=intake["id"], phase="intake")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["currentWorkflow"] == {"id": intake["id"], "name": "Intake", "fingerprint": intake["fingerprint"]}
    assert workflow_body(data["id"]) == PROMPT
    created = CaseEvent.objects.get(case_id=data["id"], kind="created")
    assert created.details["workflowDefinitionId"] == intake["id"]
    assert created.details["workflowName"] == "Intake"
    assert created.details["workflowFingerprint"] == intake["fingerprint"] == prompt_fingerprint(PROMPT)
    audit = ActivityLog.objects.get(entity_id=data["id"], action="case.created")
    assert (audit.details["workflowName"], audit.details["workflowFingerprint"]) == ("Intake", intake["fingerprint"])
    # The label and the document agree: a later handoff naming the same definition is a refresh
    # that has nothing to rewrite.
    handoff = board_client.post(f"/api/companies/{cases_company.pk}/case-handoffs",
                                {"caseId": data["id"], "to": str(AgentFactory(company=cases_company).pk),
                                 "workflowId": intake["id"]}, format="json").json()
    assert (handoff["workflowAction"], handoff["status"]) == ("refresh", "applied")
    assert Document.objects.get(issue_id=data["primaryTaskId"], key="workflow").revision_count == 1


def test_inline_text_repeating_the_prompt_verbatim_is_accepted(board_client, cases_company, intake):
    response = create(board_client, cases_company, workflowDefinitionId=intake["id"], workflowDocumentText=PROMPT)
    assert response.status_code == 201, response.content
    assert workflow_body(response.json()["id"]) == PROMPT


@pytest.mark.parametrize("text", ["# Something else\n", PROMPT.strip(), PROMPT + " "])
def test_inline_text_that_differs_from_the_definition_is_refused_before_any_write(
        board_client, cases_company, intake, text):
    before = counts()
    response = create(board_client, cases_company, workflowDefinitionId=intake["id"], workflowDocumentText=text)
    error = assert_error(response, 400, "workflow_text_mismatch", fields=["workflowDocumentText"])
    assert error["details"]["workflowFingerprint"] == intake["fingerprint"]
    assert counts() == before


def test_text_is_required_only_without_a_definition_and_a_foreign_definition_is_404(board_client, cases_company):
    assert_error(create(board_client, cases_company), 400, fields=["workflowDocumentText"])
    foreign = CompanyFactory(enable_cases=True)
    from cases.models import WorkflowDefinition
    other = WorkflowDefinition.objects.create(company=foreign, name="Theirs", prompt="x",
                                              fingerprint=prompt_fingerprint("x"))
    assert_error(create(board_client, cases_company, workflowDefinitionId=str(other.pk)), 404,
                 fields=["workflowDefinitionId"])
    assert not Case.objects.exists()


def test_seed_budget_counts_the_adopted_prompt(board_client, cases_company, intake, settings):
    settings.PAPERCLIP = {**settings.PAPERCLIP, "CASE_SEED_BUDGET_BYTES": len(PROMPT.encode()) + 3}
    response = create(board_client, cases_company, workflowDefinitionId=intake["id"],
                      initialDocuments=[{"key": "brief", "body": "four"}])
    assert_error(response, 400, fields=["initialDocuments"])


# --- 2. a kickoff binds an existing task -------------------------------------------------------
def test_kickoff_binds_an_existing_issue_and_later_calls_reuse_it(board_client, cases_company, agents, intake):
    ada, bob = agents
    task = IssueFactory(company=cases_company, title="Customer reported claim", description="Original text.")
    issues_before = Issue.objects.count()
    response = kickoff(board_client, cases_company, ada.agent, workflowId=intake["id"], primaryTaskId=str(task.pk),
                       idempotencyKey="bind-1")
    assert response.status_code == 201, response.content
    data = response.json()
    assert (data["status"], data["workflowAction"], data["workflowName"]) == ("applied", "adopt", "Intake")
    case = Case.objects.get(pk=data["caseId"])
    assert case.primary_task_id == task.pk and Issue.objects.count() == issues_before
    task.refresh_from_db()
    assert (task.title, task.description, task.assignee_agent_id) == (
        "Customer reported claim", "Original text.", ada.agent.pk)
    assert workflow_body(case.pk) == PROMPT
    assert Comment.objects.filter(issue=task, body="Assess claim 7.").exists()  # the kickoff, posted
    created = CaseEvent.objects.get(case=case, kind="created")
    assert created.details["boundExistingTask"] is True and created.details["primaryTaskId"] == str(task.pk)
    assert case.issue_links.get().role == "origin"

    # A replay of the principal's key returns the same handoff; no second case or task.
    again = kickoff(board_client, cases_company, ada.agent, workflowId=intake["id"], primaryTaskId=str(task.pk),
                    idempotencyKey="bind-1")
    assert again.status_code == 200 and again.json()["id"] == data["id"]
    assert Case.objects.count() == 1 and Issue.objects.count() == issues_before
    # A later handoff moves the same task.
    moved = board_client.post(f"/api/companies/{cases_company.pk}/case-handoffs",
                              {"caseId": str(case.pk), "to": str(bob.agent.pk)}, format="json")
    assert moved.status_code == 201 and moved.json()["status"] == "applied", moved.content
    assert Issue.objects.get(pk=task.pk).assignee_agent_id == bob.agent.pk
    assert Case.objects.get(pk=case.pk).primary_task_id == task.pk


def test_plain_create_binds_an_existing_issue_too(board_client, cases_company):
    project_task = IssueFactory(company=cases_company, project=None)
    response = create(board_client, cases_company, workflowDocumentText="w", primaryTaskId=str(project_task.pk))
    assert response.status_code == 201, response.content
    assert response.json()["primaryTaskId"] == str(project_task.pk)


def test_another_companys_issue_is_404_and_nothing_is_written(board_client, cases_company, agents):
    ada, _ = agents
    foreign = IssueFactory(company=CompanyFactory())
    before = counts()
    response = kickoff(board_client, cases_company, ada.agent, workflowDocumentText="w", primaryTaskId=str(foreign.pk))
    assert_error(response, 404, fields=["primaryTaskId"])
    assert_error(kickoff(board_client, cases_company, ada.agent, workflowDocumentText="w", primaryTaskId="nope"), 400,
                 fields=["primaryTaskId"])
    assert counts() == before


def test_an_issue_already_primary_of_another_case_is_409(board_client, cases_company, agents):
    ada, _ = agents
    first = kickoff(board_client, cases_company, ada.agent, workflowDocumentText="w").json()
    task_id = str(Case.objects.get(pk=first["caseId"]).primary_task_id)
    before = counts()
    for response in (kickoff(board_client, cases_company, ada.agent, workflowDocumentText="w", title="Other",
                             primaryTaskId=task_id),
                     create(board_client, cases_company, workflowDocumentText="w", primaryTaskId=task_id)):
        error = assert_error(response, 409, "task_already_primary", fields=["primaryTaskId"])
        assert error["details"]["caseId"] == first["caseId"]
    assert counts() == before


def test_an_issue_with_a_workflow_document_or_cancelled_is_refused(board_client, cases_company, agents):
    ada, _ = agents
    documented = IssueFactory(company=cases_company)
    put = board_client.put(f"/api/issues/{documented.pk}/documents/workflow", {"body": "mine"}, format="json")
    assert put.status_code in (200, 201), put.content
    cancelled = IssueFactory(company=cases_company, status="cancelled")
    before = counts()
    assert_error(kickoff(board_client, cases_company, ada.agent, workflowDocumentText="w",
                         primaryTaskId=str(documented.pk)), 409, "workflow_document_exists", fields=["primaryTaskId"])
    assert_error(kickoff(board_client, cases_company, ada.agent, workflowDocumentText="w",
                         primaryTaskId=str(cancelled.pk)), 422, "task_cancelled", fields=["primaryTaskId"])
    assert counts() == before
    assert Document.objects.get(issue=documented, key="workflow").latest_revision.body == "mine"


def test_an_agent_binds_only_an_issue_it_may_change(cases_company, agents):
    ada, bob = agents
    ada.use_run(RunFactory(agent=ada.agent))
    bobs = IssueFactory(company=cases_company, assignee_agent=bob.agent)
    before = counts()
    assert_error(kickoff(ada, cases_company, bob.agent, workflowDocumentText="w", primaryTaskId=str(bobs.pk)),
                 403, "not_your_issue")
    assert counts() == before
    own = IssueFactory(company=cases_company, assignee_agent=ada.agent)
    response = kickoff(ada, cases_company, bob.agent, workflowDocumentText="w", primaryTaskId=str(own.pk))
    assert response.status_code == 201 and response.json()["status"] == "applied", response.content
    assert Issue.objects.get(pk=own.pk).assignee_agent_id == bob.agent.pk


def test_primary_task_id_is_a_kickoff_only_field(board_client, cases_company, agents):
    ada, _ = agents
    case_id = kickoff(board_client, cases_company, ada.agent, workflowDocumentText="w").json()["caseId"]
    response = board_client.post(f"/api/companies/{cases_company.pk}/case-handoffs",
                                 {"caseId": case_id, "to": str(ada.agent.pk),
                                  "primaryTaskId": str(IssueFactory(company=cases_company).pk)}, format="json")
    assert_error(response, 400, fields=["primaryTaskId"])
