"""Bounded case page reads skip system-written and quarantined documents, and their snapshot is
bound to the selected document's identity. Quarantine is a board-only, audited API action."""
import pytest
from rest_framework.test import APIClient

from cases.documents import case_document_write
from issues.actors import SYSTEM
from issues.exceptions import Forbidden
from issues.models import ActivityLog, Document, Issue
from issues.services.thread import document_write
from tests.factories import CompanyFactory, IssueFactory, MembershipFactory
from tests.test_case_reads import assert_stale, continue_read, first_page, make_case, read
from tests.test_errors import assert_error

pytestmark = pytest.mark.django_db

DOC = {"section": "document", "documentKey": "workflow"}


def task_doc(case):
    """The primary task's ``workflow`` document (documentKey alone names the case's own)."""
    return {**DOC, "documentIssueId": str(case.primary_task_id)}


def doc_url(issue_id, key="workflow"):
    return f"/api/issues/{issue_id}/documents/{key}"


def quarantine(client, issue_id, key="workflow", **body):
    return client.post(f"{doc_url(issue_id, key)}/quarantine", body, format="json")


def release(client, issue_id, key="workflow"):
    return client.post(f"{doc_url(issue_id, key)}/release")


def missing(client, case):
    """What a read of a document that does not exist answers (the reference 404)."""
    response = read(client, case, section="document", documentKey="nothing-here")
    assert_error(response, 404, "not_found")
    return response.json()


def test_system_documents_are_never_paged(board_client, cases_company):
    case = make_case(cases_company)
    task = Issue.objects.get(pk=case.primary_task_id)
    document_write(actor=SYSTEM, issue=task, key="host-notes", body="the host's own bookkeeping", system=True)
    response = read(board_client, case, section="document", documentKey="host-notes",
                    documentIssueId=str(task.pk))
    assert response.status_code == 404 and response.json() == missing(board_client, case)
    # The operator still sees it in the thread, marked as system-written.
    shown = board_client.get(doc_url(task.pk, "host-notes")).json()
    assert shown["system"] is True and shown["quarantinedAt"] is None
    assert board_client.get(doc_url(task.pk)).json()["system"] is False


def test_only_the_host_writes_system_documents(board_user, cases_company):
    from issues.actors import Actor

    task = IssueFactory(company=cases_company)
    with pytest.raises(Forbidden):
        document_write(actor=Actor(user=board_user), issue=task, key="host-notes", body="x", system=True)
    assert not Document.objects.filter(issue=task).exists()


def test_quarantine_hides_the_document_from_page_reads_until_released(board_client, board_user, cases_company):
    body = "step one\n" * 40
    case = make_case(cases_company, workflow_text=body)
    task_id = case.primary_task_id
    data = first_page(board_client, case, **task_doc(case))

    response = quarantine(board_client, task_id, reason="prompt injection in step 3")
    assert response.status_code == 200, response.content
    shown = response.json()
    assert shown["quarantinedAt"] and shown["quarantineReason"] == "prompt injection in step 3"
    # The next page of a read in progress, and a new read, answer like a missing document.
    assert continue_read(board_client, case, data, **task_doc(case)).json() == missing(board_client, case)
    assert read(board_client, case, **task_doc(case)).json() == missing(board_client, case)
    # Quarantining again keeps the first quarantine and records nothing more.
    again = quarantine(board_client, task_id, reason="other")
    assert again.status_code == 200 and again.json()["quarantineReason"] == "prompt injection in step 3"
    rows = ActivityLog.objects.filter(company=cases_company, action="document.quarantined")
    assert rows.count() == 1
    row = rows.get()
    assert row.details["key"] == "workflow" and row.details["reason"] == "prompt injection in step 3"
    assert row.entity_id == str(task_id) and row.actor_user_id == board_user.pk

    response = release(board_client, task_id)
    assert response.status_code == 200 and response.json()["quarantinedAt"] is None
    assert response.json()["quarantineReason"] == ""
    assert ActivityLog.objects.filter(company=cases_company, action="document.released").count() == 1
    # The content never changed: the old snapshot continues, a new read starts again.
    assert continue_read(board_client, case, data, **task_doc(case)).status_code == 200
    assert read(board_client, case, offsetBytes=0, limitBytes=4096, **task_doc(case)).json()["readPage"]["text"] == body
    assert release(board_client, task_id).status_code == 200
    assert ActivityLog.objects.filter(company=cases_company, action="document.released").count() == 1


def test_quarantine_of_a_linked_task_document(board_client, cases_company):
    case = make_case(cases_company)
    linked = IssueFactory(company=cases_company)
    document_write(actor=SYSTEM, issue=linked, key="notes", body="n" * 300)
    board_client.post(f"/api/cases/{case.pk}/links", {"issueId": str(linked.pk), "role": "work"}, format="json")
    params = {"section": "document", "documentKey": "notes", "documentIssueId": str(linked.pk)}
    data = first_page(board_client, case, **params)
    assert quarantine(board_client, linked.pk, "notes").status_code == 200
    assert_error(continue_read(board_client, case, data, **params), 404, "not_found")
    assert read(board_client, case, **task_doc(case)).status_code == 200  # the primary task's workflow is unaffected


def test_quarantine_is_board_only_with_a_write_role(make_agent_client, cases_company):
    case = make_case(cases_company)
    task_id = case.primary_task_id
    agent = make_agent_client(company=cases_company)
    assert_error(quarantine(agent, task_id), 403, "board_only")
    assert_error(release(agent, task_id), 403, "board_only")
    viewer = APIClient()
    viewer.force_login(MembershipFactory(company=cases_company, role="viewer").user)
    assert_error(quarantine(viewer, task_id), 403, "read_only_role")
    assert Document.objects.get(issue_id=task_id, key="workflow").quarantined_at is None
    assert not ActivityLog.objects.filter(action__in=["document.quarantined", "document.released"]).exists()


def test_quarantine_errors(board_client, cases_company):
    case = make_case(cases_company)
    assert_error(quarantine(board_client, case.primary_task_id, reason="r" * 501), 400, fields=["reason"])
    assert_error(quarantine(board_client, case.primary_task_id, "nope"), 404, "not_found")
    # Another company's document is a 404, like a missing one.
    foreign = IssueFactory(company=CompanyFactory(enable_cases=True))
    document_write(actor=SYSTEM, issue=foreign, key="workflow", body="theirs")
    assert_error(quarantine(board_client, foreign.pk), 404)
    assert_error(release(board_client, foreign.pk), 404)
    assert Document.objects.get(issue=foreign).quarantined_at is None


def test_snapshot_is_bound_to_the_selected_document_identity(board_client, cases_company):
    """Two linked tasks with byte-identical ``notes``: a snapshot of one never continues the
    other, and a document replaced by a new one with the same key and body is a new document."""
    case = make_case(cases_company)
    first, second = IssueFactory(company=cases_company), IssueFactory(company=cases_company)
    for task in (first, second):
        document_write(actor=SYSTEM, issue=task, key="notes", body="same body " * 30)
        board_client.post(f"/api/cases/{case.pk}/links", {"issueId": str(task.pk), "role": "work"}, format="json")
    params = {"section": "document", "documentKey": "notes"}
    data = first_page(board_client, case, documentIssueId=str(first.pk), **params)
    assert_stale(continue_read(board_client, case, data, documentIssueId=str(second.pk), **params), "projection")
    assert continue_read(board_client, case, data, documentIssueId=str(first.pk), **params).status_code == 200

    Document.objects.filter(issue=first, key="notes").delete()
    document_write(actor=SYSTEM, issue=first, key="notes", body="same body " * 30)
    assert_stale(continue_read(board_client, case, data, documentIssueId=str(first.pk), **params), "document")


@pytest.mark.parametrize("role", ["work", "reference"])
def test_document_issue_id_selects_the_primary_or_a_linked_task(board_client, cases_company, role):
    case = make_case(cases_company, workflow_text="primary procedure")
    linked = IssueFactory(company=cases_company)
    document_write(actor=SYSTEM, issue=linked, key="workflow", body="linked procedure")
    board_client.post(f"/api/cases/{case.pk}/links", {"issueId": str(linked.pk), "role": role}, format="json")
    case_document_write(actor=SYSTEM, case=case, key="workflow", body="the case's own procedure")
    by_default = read(board_client, case, limitBytes=4096, **DOC).json()
    primary = read(board_client, case, limitBytes=4096, documentIssueId=str(case.primary_task_id), **DOC).json()
    other = read(board_client, case, limitBytes=4096, documentIssueId=str(linked.pk), **DOC).json()
    assert by_default["readPage"]["text"] == "the case's own procedure" and by_default["document"]["owner"] == "case"
    assert by_default["document"]["issueId"] is None
    assert primary["readPage"]["text"] == "primary procedure" and primary["document"]["owner"] == "task"
    assert primary["document"]["issueId"] == str(case.primary_task_id) and primary["snapshot"] != by_default["snapshot"]
    assert other["readPage"]["text"] == "linked procedure" and other["document"]["issueId"] == str(linked.pk)
