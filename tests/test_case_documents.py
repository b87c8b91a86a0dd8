"""Case-owned documents (seed 001): ``section=document`` with ``documentKey`` alone pages the
case's own document; ``documentIssueId`` selects a primary or linked task's document instead.
The REST storage is revisioned like issue documents, behind ``enable_cases``, audited, with the
same system/quarantine visibility for page reads. Real database, HTTP-level API calls."""
import pytest
from django.utils import timezone

from cases.documents import case_document_write
from cases.models import Case, CaseDocument, CaseDocumentRevision, CaseEvent
from issues.actors import SYSTEM
from issues.exceptions import Forbidden
from issues.models import ActivityLog, Issue
from issues.services.thread import document_write
from tests.factories import CompanyFactory, RunFactory
from tests.test_case_reads import MULTI, assert_stale, continue_read, first_page, make_case, read, walk
from tests.test_errors import assert_error

pytestmark = pytest.mark.django_db


def put(client, case, key, body, **extra):
    return client.put(f"/api/cases/{case.pk}/documents/{key}", {"body": body, **extra}, format="json")


def case_doc(key="notes"):
    return {"section": "document", "documentKey": key}


def test_write_read_and_revise_a_case_document(board_client, cases_company):
    case = make_case(cases_company)
    created = put(board_client, case, "notes", "first " + MULTI, title="Notes")
    assert created.status_code == 201, created.content
    doc = created.json()
    assert (doc["caseId"], doc["key"], doc["title"], doc["body"], doc["latestRevisionNumber"]) == (
        str(case.pk), "notes", "Notes", "first " + MULTI, 1)
    # A second write must name the latest revision; a stale or missing base is a 409 with the current one.
    stale = put(board_client, case, "notes", "lost")
    error = assert_error(stale, 409, "stale_revision", fields=["key"])
    assert error["details"]["currentRevisionId"] == doc["latestRevisionId"]
    revised = put(board_client, case, "notes", "second", baseRevisionId=doc["latestRevisionId"])
    assert revised.status_code == 200 and revised.json()["latestRevisionNumber"] == 2
    assert revised.json()["title"] == "Notes"  # kept when not given
    # Reads: one document, the list (no bodies), the revisions oldest first with their window.
    assert board_client.get(f"/api/cases/{case.identifier}/documents/notes").json()["body"] == "second"
    listed = board_client.get(f"/api/cases/{case.pk}/documents").json()
    assert [d["key"] for d in listed] == ["notes"] and "body" not in listed[0]
    revisions = board_client.get(f"/api/cases/{case.pk}/documents/notes/revisions").json()
    assert [(r["revisionNumber"], r["body"]) for r in revisions] == [(1, "first " + MULTI), (2, "second")]
    assert board_client.get(f"/api/cases/{case.pk}/documents/notes/revisions?limit=1&offset=1").json()[0][
        "revisionNumber"] == 2
    assert_error(board_client.get(f"/api/cases/{case.pk}/documents/plan"), 404, "not_found")
    assert_error(board_client.get(f"/api/cases/{case.pk}/documents/plan/revisions"), 404, "not_found")
    # History: a case event and an activity row per revision; the case moved (browse order, snapshots).
    events = CaseEvent.objects.filter(case=case, kind="document_revised").order_by("created_at")
    assert [e.details["revisionNumber"] for e in events] == [1, 2]
    assert ActivityLog.objects.filter(action="case.document_revised", entity_id=str(case.pk)).count() == 2
    assert Case.objects.get(pk=case.pk).updated_at > case.updated_at
    # The primary task's documents are untouched: a case document is not a task document.
    assert not Issue.objects.get(pk=case.primary_task_id).documents.filter(key="notes").exists()


def test_bad_input_writes_nothing(board_client, cases_company):
    case = make_case(cases_company)
    assert_error(put(board_client, case, "Bad Key", "x"), 400, fields=["key"])
    assert_error(put(board_client, case, "notes", "x", format="docx"), 400, fields=["format"])
    assert_error(board_client.put(f"/api/cases/{case.pk}/documents/notes", {"title": "t"}, format="json"), 400,
                 fields=["body"])
    assert_error(put(board_client, case, "notes", "x", baseRevisionId="00000000-0000-0000-0000-000000000000"),
                 409, "stale_revision")
    assert not CaseDocument.objects.exists() and not CaseEvent.objects.filter(kind="document_revised").exists()


def test_document_key_alone_pages_the_case_document(board_client, cases_company):
    body = ("## Finding " + MULTI + "\n") * 30
    case = make_case(cases_company, workflow_text="the task's procedure")
    case_document_write(actor=SYSTEM, case=case, key="workflow", body=body)
    raw, pages, straddles = walk(board_client, case, 9, **case_doc("workflow"))
    assert raw.decode("utf-8") == body and straddles > 0
    doc = pages[0]["document"]
    assert doc["owner"] == "case" and doc["caseId"] == str(case.pk) and doc["issueId"] is None
    assert doc["revisionNumber"] == 1 and pages[0]["versions"]["documentRevisionId"] == doc["revisionId"]
    # The same key with documentIssueId is the primary task's document, a different projection.
    task = read(board_client, case, documentIssueId=case.primary_task_id, **case_doc("workflow")).json()
    assert task["readPage"]["text"] == "the task's procedure" and task["document"]["owner"] == "task"
    data = first_page(board_client, case, **case_doc("workflow"))
    assert_stale(continue_read(board_client, case, data, documentIssueId=case.primary_task_id,
                               **case_doc("workflow")), "projection")
    # A new revision of the case document stops a continuation; restarting reads the new body.
    case_document_write(actor=SYSTEM, case=case, key="workflow", body=body.upper(),
                        base_revision_id=doc["revisionId"])
    response = continue_read(board_client, case, data, **case_doc("workflow"))
    assert_error(response, 409, "read_snapshot_stale")
    raw, pages, _ = walk(board_client, case, 4096, **case_doc("workflow"))
    assert raw.decode() == body.upper() and pages[0]["document"]["revisionNumber"] == 2
    # A task-document edit leaves a case-document read alone (another document).
    data = first_page(board_client, case, **case_doc("workflow"))
    primary = Issue.objects.get(pk=case.primary_task_id)
    document_write(actor=SYSTEM, issue=primary, key="plan", body="unrelated")
    assert continue_read(board_client, case, data, **case_doc("workflow")).status_code == 200


def test_same_length_case_document_edit_behind_the_orm_is_409(board_client, cases_company):
    from tests.test_case_reads_sqlite_digest import raw_update

    body = ("# Notes " + MULTI + "\n") * 20
    case = make_case(cases_company)
    revision = case_document_write(actor=SYSTEM, case=case, key="notes", body=body)
    data = first_page(board_client, case, **case_doc())
    edited = body.replace("Notes", "Nutes")
    raw_update(CaseDocumentRevision, "body", revision.pk, edited)
    assert_stale(continue_read(board_client, case, data, **case_doc()), "document")
    assert read(board_client, case, limitBytes=4096, **case_doc()).json()["readPage"]["text"] == edited


def test_quarantined_and_system_case_documents_are_not_paged(board_client, board_user, cases_company):
    case = make_case(cases_company)
    case_document_write(actor=SYSTEM, case=case, key="host-notes", body="the host's own", system=True)
    case_document_write(actor=SYSTEM, case=case, key="notes", body="n" * 200)
    missing = read(board_client, case, **case_doc("nothing-here")).json()
    assert read(board_client, case, **case_doc("host-notes")).json() == missing
    data = first_page(board_client, case, **case_doc())
    quarantined = board_client.post(f"/api/cases/{case.pk}/documents/notes/quarantine", {"reason": "leaks a key"},
                                    format="json")
    assert quarantined.status_code == 200 and quarantined.json()["quarantineReason"] == "leaks a key"
    # Mid-read and from the start, a withheld document reads like a missing one.
    assert continue_read(board_client, case, data, **case_doc()).json() == missing
    assert read(board_client, case, **case_doc()).json() == missing
    # The operator still sees it, marked; releasing serves it again; both are audited on the case.
    listed = {d["key"]: d for d in board_client.get(f"/api/cases/{case.pk}/documents").json()}
    assert listed["notes"]["quarantinedAt"] and listed["host-notes"]["system"] is True
    assert board_client.post(f"/api/cases/{case.pk}/documents/notes/release").status_code == 200
    assert read(board_client, case, limitBytes=4096, **case_doc()).json()["readPage"]["text"] == "n" * 200
    actions = list(ActivityLog.objects.filter(entity_type="case", entity_id=str(case.pk),
                                              action__startswith="document.").values_list("action", flat=True))
    assert sorted(actions) == ["document.quarantined", "document.released"]


def test_agents_write_from_a_run_and_never_quarantine(make_agent_client, cases_company):
    case = make_case(cases_company)
    me = make_agent_client(company=cases_company)
    written = put(me, case, "notes", "from my run")
    assert written.status_code == 201
    revision = CaseDocumentRevision.objects.get(document__case=case)
    assert (revision.author_type, revision.author_agent_id, revision.run_id) == ("agent", me.agent.pk, me.run.pk)
    assert_error(me.post(f"/api/cases/{case.pk}/documents/notes/quarantine", {}, format="json"), 403)
    assert CaseDocument.objects.get(case=case).quarantined_at is None
    # From a run that has ended, an agent's write is refused before anything is written.
    me.run.status, me.run.finished_at = "succeeded", timezone.now()
    me.run.save(update_fields=["status", "finished_at"])
    assert_error(put(me, case, "other", "x"), 409, "run_not_live")
    assert not CaseDocument.objects.filter(key="other").exists()
    # While the primary task is in progress, only the run holding its checkout writes the case.
    holder = RunFactory(agent=me.agent, status="running", started_at=timezone.now())
    Issue.objects.filter(pk=case.primary_task_id).update(status="in_progress", assignee_agent=me.agent,
                                                         checkout_run=holder, execution_run=holder)
    me.use_run(RunFactory(agent=me.agent, status="running", started_at=timezone.now()))
    assert_error(put(me, case, "other", "x"), 409, "not_checkout_owner")
    me.use_run(holder)
    assert put(me, case, "other", "x").status_code == 201


def test_only_the_host_writes_system_case_documents(board_user, cases_company):
    from issues.actors import Actor

    case = make_case(cases_company)
    with pytest.raises(Forbidden):
        case_document_write(actor=Actor(user=board_user), case=case, key="host-notes", body="x", system=True)
    assert not CaseDocument.objects.filter(case=case).exists()


def test_other_companys_case_documents_are_404_and_deleting_the_company_removes_them(board_client,
                                                                                      cases_company):
    other = CompanyFactory(enable_cases=True)
    case = make_case(other)
    case_document_write(actor=SYSTEM, case=case, key="notes", body="secret")
    for response in (board_client.get(f"/api/cases/{case.pk}/documents"),
                     board_client.get(f"/api/cases/{case.pk}/documents/notes"),
                     put(board_client, case, "notes", "hijacked"),
                     read(board_client, case, **case_doc())):
        assert_error(response, 404, "not_found")
        assert "secret" not in response.content.decode()
    assert CaseDocumentRevision.objects.filter(document__case=case).count() == 1
    other.delete()
    assert not CaseDocument.objects.exists() and not CaseDocumentRevision.objects.exists()
