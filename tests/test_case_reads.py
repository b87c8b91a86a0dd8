"""Bounded paged reads of cases, documents and workflow prompts; case history; task links; and
the case list at 10,000 cases. Real database (SQLite and PostgreSQL), real HTTP-level API calls.

Offsets count bytes of the UTF-8 encoding of the paged text; pages never split a character."""
import json
import tracemalloc
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from cases.choices import CASE_STATUS_ORDER
from cases.documents import case_document_write
from cases.models import Case, CaseEvent, CaseIssueLink, WorkflowDefinition
from cases.selectors import case_browse
from cases.services import case_create, workflow_definition_create
from issues.actors import SYSTEM
from issues.models import ActivityLog, Issue
from issues.services.thread import document_write
from tests.conftest import is_postgres
from tests.factories import CompanyFactory, IssueFactory, MembershipFactory, ProjectFactory
from tests.test_errors import error_of

MULTI = "aé€😀"  # 1, 2, 3 and 4 bytes in UTF-8


def make_case(company, *, title="Review the contract", fields=None, workflow_text="w", **kwargs):
    case, _ = case_create(actor=SYSTEM, company=company, case_type="review", title=title, kickoff="k",
                          workflow_document_text=workflow_text, fields=fields or {}, **kwargs)
    return case


def read(client, case, **params):
    query = "&".join(f"{k}={v}" for k, v in {"agentRead": "true", **params}.items())
    return client.get(f"/api/cases/{case.pk}?{query}")


def walk(client, case, limit, **params):
    """All pages of a read, asserting the page contract on each; returns (bytes, pages, straddles)."""
    out, offset, snapshot, pages, straddles = b"", 0, None, [], 0
    while True:
        extra = {"offsetBytes": offset, "limitBytes": limit, **params}
        if snapshot:
            extra["snapshot"] = snapshot
        response = read(client, case, **extra)
        assert response.status_code == 200, response.content[:500]
        data = response.json()
        assert data["mode"] == "text"
        page = data["readPage"]
        chunk = page["text"].encode("utf-8")
        assert page["offsetBytes"] == offset == len(out)
        assert page["nextOffsetBytes"] == offset + len(chunk)
        assert len(chunk) <= limit
        if not page["done"]:
            assert len(chunk) > 0
            if len(chunk) < limit:
                straddles += 1  # the next character did not fit: it starts the next page
        if snapshot:
            assert data["snapshot"] == snapshot
        snapshot = data["snapshot"]
        out += chunk
        pages.append(data)
        offset = page["nextOffsetBytes"]
        if page["done"]:
            assert offset == page["totalBytes"] == len(out)
            return out, pages, straddles


def db_fields_text(case) -> bytes:
    """The database's own JSON text of ``fields``, read whole (the reference for exactness)."""
    with connection.cursor() as cursor:
        column = "fields::text" if is_postgres() else "fields"
        cursor.execute(f"SELECT {column} FROM cases_case WHERE id = %s",
                       [Case._meta.pk.get_db_prep_value(case.pk, connection)])
        return cursor.fetchone()[0].encode("utf-8")


def big_fields(n=300):
    return {"notes": [f"{i}:{MULTI * (i % 7)}" for i in range(n)], "title": MULTI * 50, "n": 1}


# --- the case projection: small structured, large paged ----------------------------------------


def test_small_case_is_structured_with_snapshot_and_versions(board_client, cases_company):
    case = make_case(cases_company, fields={"amount": 12, "who": MULTI})
    response = read(board_client, case)
    assert response.status_code == 200, response.content
    data = response.json()
    assert data["mode"] == "structured" and data["readPage"] is None and data["projection"] == "case"
    detail = board_client.get(f"/api/cases/{case.pk}").json()
    got = data["case"]
    assert got["fields"] == {"amount": 12, "who": MULTI}
    assert list(got)[-1] == "fields"
    for key in ("id", "identifier", "title", "status", "primaryTaskId", "updatedAt", "currentWorkflow", "phase"):
        assert got[key] == detail[key]
    assert got["links"] == detail["links"]
    assert data["snapshot"].startswith("rs1.")
    assert data["versions"]["primaryTaskId"] == str(case.primary_task_id)
    assert data["versions"]["caseUpdatedAt"] == detail["updatedAt"]
    # The plain detail is unchanged without agentRead.
    assert "events" in detail and "mode" not in detail


def test_large_case_pages_reconstruct_the_exact_json(board_client, cases_company):
    case = make_case(cases_company, title=f"Überprüfung {MULTI}", fields=big_fields())
    structured = read(board_client, case, limitBytes=256 * 1024).json()
    assert structured["mode"] == "structured"
    raw, pages, straddles = walk(board_client, case, 61)
    assert len(pages) > 10 and straddles > 0  # the title's characters straddle page limits
    assert json.loads(raw.decode("utf-8")) == structured["case"]
    # The fields part of the text is the database's own JSON text, byte for byte.
    assert db_fields_text(case) in raw
    # Same answer with the default budget when the case is over it.
    default = read(board_client, case, limitBytes=200).json()
    assert default["mode"] == "text" and default["readPage"]["totalBytes"] == len(raw)


@pytest.mark.parametrize("limit", [4, 5, 7, 64, 1000])
def test_fields_pages_are_the_exact_bytes_of_the_database_text(board_client, cases_company, limit):
    case = make_case(cases_company, fields=big_fields(80 if limit >= 64 else 6))
    raw, pages, straddles = walk(board_client, case, limit, section="fields")
    assert raw == db_fields_text(case)
    assert json.loads(raw) == Case.objects.get(pk=case.pk).fields
    assert all(p["projection"] == "fields" for p in pages)
    if is_postgres() and limit < 64:
        # PostgreSQL's JSON text keeps the characters (SQLite's stores \\u escapes, all ASCII).
        assert straddles > 0


def test_offset_inside_a_character_is_rejected(board_client, cases_company):
    case = make_case(cases_company, title=f"x{MULTI}", fields={"a": 1})
    first = read(board_client, case, limitBytes=8).json()
    raw, _, _ = walk(board_client, case, 8)
    inside = raw.index("€".encode()) + 1
    response = read(board_client, case, limitBytes=8, offsetBytes=inside, snapshot=first["snapshot"])
    assert response.status_code == 400 and response.json()["code"] == "invalid_offset"
    past = read(board_client, case, limitBytes=8, offsetBytes=len(raw) + 1, snapshot=first["snapshot"])
    assert past.status_code == 400 and "offsetBytes" in past.json()["details"]


def test_read_parameter_errors(board_client, cases_company):
    case = make_case(cases_company, fields={"a": 1})
    no_snapshot = read(board_client, case, offsetBytes=3)
    assert no_snapshot.status_code == 400 and "snapshot" in no_snapshot.json()["details"]
    bad = read(board_client, case, limitBytes=3, section="nope")
    assert bad.status_code == 400
    bad = read(board_client, case, limitBytes=3)
    assert bad.status_code == 400 and "limitBytes" in bad.json()["details"]
    forged = read(board_client, case, offsetBytes=2, snapshot="garbage")
    assert forged.status_code == 400 and forged.json()["code"] == "invalid_snapshot"
    no_key = read(board_client, case, section="document")
    assert no_key.status_code == 400 and "documentKey" in no_key.json()["details"]
    without_flag = board_client.get(f"/api/cases/{case.pk}?section=fields")
    assert without_flag.status_code == 400 and "section" in without_flag.json()["details"]
    huge = read(board_client, case, section="fields", limitBytes=10**9).json()
    assert huge["readPage"]["limitBytes"] == 256 * 1024


# --- snapshots: 409 after a change, restart works ---------------------------------------------


def first_page(client, case, limit=50, **params):
    response = read(client, case, offsetBytes=0, limitBytes=limit, **params)
    assert response.status_code == 200, response.content[:300]
    data = response.json()
    assert not data["readPage"]["done"]
    return data


def continue_read(client, case, data, limit=50, **params):
    return read(client, case, offsetBytes=data["readPage"]["nextOffsetBytes"], limitBytes=limit,
                snapshot=data["snapshot"], **params)


def assert_stale(response, changed):
    assert response.status_code == 409, response.content[:300]
    error = error_of(response)
    assert error["code"] == "read_snapshot_stale" and changed in error["details"]["changed"]
    assert error["details"]["restartOffsetBytes"] == 0


@pytest.mark.parametrize("section", [None, "fields"])
def test_continuation_after_a_case_edit_is_409_and_restart_succeeds(board_client, cases_company, section):
    params = {"section": section} if section else {}
    case = make_case(cases_company, fields=big_fields(40))
    data = first_page(board_client, case, **params)
    # A same-length edit of fields through the API.
    fields = Case.objects.get(pk=case.pk).fields
    fields["n"] = 2
    assert board_client.patch(f"/api/cases/{case.pk}", {"fields": fields}, format="json").status_code == 200
    assert_stale(continue_read(board_client, case, data, **params), "case")
    raw, _, _ = walk(board_client, case, 50, **params)
    text = json.loads(raw)
    assert (text["fields"]["n"] if section is None else text["n"]) == 2


def test_title_edit_invalidates_the_case_projection(board_client, cases_company):
    case = make_case(cases_company, fields=big_fields(40))
    data = first_page(board_client, case)
    board_client.patch(f"/api/cases/{case.pk}", {"title": "Renamed"}, format="json")
    assert_stale(continue_read(board_client, case, data), "case")


@pytest.mark.parametrize("section", [None, "fields"])
def test_continuation_after_a_task_edit_is_409(board_client, cases_company, section):
    params = {"section": section} if section else {}
    case = make_case(cases_company, fields=big_fields(40))
    data = first_page(board_client, case, **params)
    response = board_client.patch(f"/api/issues/{case.primary_task_id}", {"priority": "high"}, format="json")
    assert response.status_code == 200, response.content
    assert_stale(continue_read(board_client, case, data, **params), "task")
    assert walk(board_client, case, 50, **params)[0]


def test_same_length_edit_behind_the_orms_back_is_caught_by_the_sql_digest(board_client, cases_company):
    """The snapshot binds the md5 of the paged text computed in SQL (PostgreSQL's md5(), SQLite's
    paperclip_md5): even a same-length write that leaves ``updated_at`` alone stops the continuation."""
    case = make_case(cases_company, fields={"v": "a" * 500})
    data = first_page(board_client, case, section="fields")
    Case.objects.filter(pk=case.pk).update(fields={"v": "b" * 500})  # same length, same updated_at
    assert_stale(continue_read(board_client, case, data, section="fields"), "case")


def test_projection_mismatch_is_409(board_client, cases_company):
    case = make_case(cases_company, fields=big_fields(40))
    data = first_page(board_client, case, section="fields")
    assert_stale(continue_read(board_client, case, data), "projection")
    assert_stale(continue_read(board_client, case, data, section="document", documentKey="workflow",
                               documentIssueId=case.primary_task_id), "projection")


def test_link_change_invalidates_the_case_projection(board_client, cases_company):
    case = make_case(cases_company, fields=big_fields(40))
    data = first_page(board_client, case)
    other = IssueFactory(company=cases_company)
    board_client.post(f"/api/cases/{case.pk}/links", {"issueId": str(other.pk), "role": "reference"}, format="json")
    assert_stale(continue_read(board_client, case, data), "case")


# --- document sections -------------------------------------------------------------------------


def test_document_section_with_documentIssueId_pages_the_primary_task_document(board_client, cases_company):
    body = ("# Procedure " + MULTI + "\n") * 40
    case = make_case(cases_company, workflow_text=body)
    task_doc = {"section": "document", "documentKey": "workflow", "documentIssueId": case.primary_task_id}
    raw, pages, straddles = walk(board_client, case, 9, **task_doc)
    assert raw.decode("utf-8") == body and straddles > 0
    doc = pages[0]["document"]
    assert doc["key"] == "workflow" and doc["issueId"] == str(case.primary_task_id) and doc["revisionNumber"] == 1
    assert doc["owner"] == "task" and doc["caseId"] == str(case.pk)
    assert pages[0]["versions"]["documentRevisionId"] == doc["revisionId"]
    # Without documentIssueId the key names the case's own document: this case has none.
    assert read(board_client, case, section="document", documentKey="workflow").status_code == 404
    # An edit of the document (a new revision) stops the continuation; restarting reads the new body.
    data = first_page(board_client, case, **task_doc)
    task = Issue.objects.get(pk=case.primary_task_id)
    document_write(actor=SYSTEM, issue=task, key="workflow", body=body.replace("Procedure", "Prozedur!"),
                   base_revision_id=doc["revisionId"])
    assert_stale(continue_read(board_client, case, data, **task_doc), "document")
    raw, pages, _ = walk(board_client, case, 64, **task_doc)
    assert raw.decode() == body.replace("Procedure", "Prozedur!") and pages[0]["document"]["revisionNumber"] == 2


def test_document_of_a_linked_task_and_linkage_checked_on_every_page(board_client, cases_company):
    case = make_case(cases_company)
    linked = IssueFactory(company=cases_company)
    document_write(actor=SYSTEM, issue=linked, key="notes", body="n" * 300)
    params = {"section": "document", "documentKey": "notes", "documentIssueId": str(linked.pk)}
    assert read(board_client, case, **params).status_code == 404  # not linked yet
    board_client.post(f"/api/cases/{case.pk}/links", {"issueId": str(linked.pk), "role": "work"}, format="json")
    data = first_page(board_client, case, **params)
    assert data["document"]["issueId"] == str(linked.pk)
    assert board_client.delete(f"/api/cases/{case.pk}/links/{linked.pk}").status_code == 204
    response = continue_read(board_client, case, data, **params)
    assert response.status_code == 404 and response.json()["code"] == "not_found"
    # A task of another company, even one that has the key, reads like a missing document.
    other = CompanyFactory(enable_cases=True)
    foreign = IssueFactory(company=other)
    document_write(actor=SYSTEM, issue=foreign, key="notes", body="secret")
    response = read(board_client, case, section="document", documentKey="notes", documentIssueId=str(foreign.pk))
    ghost = read(board_client, case, section="document", documentKey="notes", documentIssueId=str(uuid.uuid4()))
    assert response.status_code == 404 and response.json() == ghost.json()
    assert read(board_client, case, section="document", documentKey="nope").status_code == 404


# --- bounded memory ------------------------------------------------------------------------------


def test_a_page_of_a_multi_megabyte_fields_value_runs_in_bounded_memory(board_client, cases_company):
    """A 64 KiB page of a multi-megabyte ``fields`` value allocates a small, size-independent
    amount of Python memory (the database cuts the window); loading the value whole does not."""
    fields = {"blob": [MULTI * 64 for _ in range(12000)]}  # ~7.7 MB (PostgreSQL) / ~19 MB (SQLite) of JSON
    case = make_case(cases_company, fields=fields)
    del fields
    size = len(db_fields_text(case))
    assert size > 7_000_000
    read(board_client, case, section="fields", limitBytes=64 * 1024)  # warm imports and caches

    def peak_of(fn):
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        result = fn()
        return result, tracemalloc.get_traced_memory()[1] - before

    tracemalloc.start()
    try:
        response, first_peak = peak_of(lambda: read(board_client, case, section="fields", limitBytes=64 * 1024))
        data = response.json()
        second, second_peak = peak_of(lambda: read(
            board_client, case, section="fields", limitBytes=64 * 1024,
            offsetBytes=data["readPage"]["nextOffsetBytes"], snapshot=data["snapshot"]))
        _, whole_peak = peak_of(lambda: Case.objects.get(pk=case.pk).fields)
    finally:
        tracemalloc.stop()
    assert second.status_code == 200 and data["readPage"]["totalBytes"] == size
    assert max(first_peak, second_peak) < 2 * 1024 * 1024 < size / 3, (first_peak, second_peak, size)
    assert whole_peak > size


# --- workflow prompt pages -----------------------------------------------------------------------


def prompt_page(client, definition, **params):
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return client.get(f"/api/workflows/{definition.pk}?{query}")


def walk_prompt(client, definition, limit):
    out, offset, fingerprint = b"", 0, None
    while True:
        params = {"offsetBytes": offset, "limitBytes": limit}
        if fingerprint:
            params["fingerprint"] = fingerprint
        response = prompt_page(client, definition, **params)
        assert response.status_code == 200, response.content[:300]
        data = response.json()
        page = data["readPage"]
        chunk = page["text"].encode()
        assert page["offsetBytes"] == len(out) and len(chunk) <= limit
        fingerprint = fingerprint or data["fingerprint"]
        assert data["fingerprint"] == fingerprint
        out += chunk
        offset = page["nextOffsetBytes"]
        if page["done"]:
            return out, fingerprint


def test_workflow_prompt_pages_round_trip_and_same_length_edit_is_409(board_client, cases_company):
    prompt = ("## Step " + MULTI + "\n") * 30
    definition = workflow_definition_create(actor=SYSTEM, company=cases_company, name="Review", prompt=prompt)
    raw, fingerprint = walk_prompt(board_client, definition, 7)
    assert raw.decode() == prompt and fingerprint == definition.fingerprint
    first = prompt_page(board_client, definition, limitBytes=40).json()
    same_length = prompt.replace("Step", "Stap", 1)
    assert len(same_length.encode()) == len(prompt.encode())
    assert board_client.patch(f"/api/workflows/{definition.pk}", {"prompt": same_length},
                              format="json").status_code == 200
    stale = prompt_page(board_client, definition, offsetBytes=first["readPage"]["nextOffsetBytes"], limitBytes=40,
                        fingerprint=first["fingerprint"])
    assert stale.status_code == 409 and stale.json()["code"] == "read_snapshot_stale"
    raw, new_fingerprint = walk_prompt(board_client, definition, 40)  # restart
    assert raw.decode() == same_length and new_fingerprint != fingerprint
    no_fp = prompt_page(board_client, definition, offsetBytes=4, limitBytes=40)
    assert no_fp.status_code == 400 and "fingerprint" in no_fp.json()["details"]
    # A rename does not change the content: continuations go on.
    first = prompt_page(board_client, definition, limitBytes=40).json()
    board_client.patch(f"/api/workflows/{definition.pk}", {"name": "Renamed"}, format="json")
    assert prompt_page(board_client, definition, offsetBytes=first["readPage"]["nextOffsetBytes"], limitBytes=40,
                       fingerprint=first["fingerprint"]).status_code == 200
    # Without paging parameters the definition is answered whole, as before.
    assert board_client.get(f"/api/workflows/{definition.pk}").json()["prompt"] == same_length


def test_every_prompt_page_rechecks_company_access(cases_company):
    definition = workflow_definition_create(actor=SYSTEM, company=cases_company, name="R", prompt="p" * 200)
    membership = MembershipFactory(company=cases_company, role="viewer")
    client = APIClient()
    client.force_login(membership.user)
    first = prompt_page(client, definition, limitBytes=50).json()
    membership.delete()
    response = prompt_page(client, definition, offsetBytes=first["readPage"]["nextOffsetBytes"], limitBytes=50,
                           fingerprint=first["fingerprint"])
    assert response.status_code == 404


# --- history -----------------------------------------------------------------------------------


def test_case_events_oldest_first_and_paginated(board_client, cases_company):
    case = make_case(cases_company)
    for i in range(3):
        board_client.patch(f"/api/cases/{case.pk}", {"summary": f"s{i}"}, format="json")
    everything = board_client.get(f"/api/cases/{case.pk}/events").json()
    kinds = [e["kind"] for e in everything["items"]]
    assert kinds == ["created", "issue_linked", "updated", "updated", "updated"] and everything["total"] == 5
    ids = [e["id"] for e in everything["items"]]
    pages = [board_client.get(f"/api/cases/{case.identifier}/events?limit=2&offset={o}").json() for o in (0, 2, 4)]
    assert [e["id"] for p in pages for e in p["items"]] == ids


# --- task links ----------------------------------------------------------------------------------


def test_link_is_idempotent_audited_and_listed_from_the_issue(board_client, cases_company):
    case = make_case(cases_company)
    issue = IssueFactory(company=cases_company)
    url = f"/api/cases/{case.pk}/links"
    created = board_client.post(url, {"issueId": str(issue.pk), "role": "work"}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["issue"]["id"] == str(issue.pk) and created.json()["role"] == "work"
    again = board_client.post(url, {"issueId": str(issue.pk), "role": "work"}, format="json")
    assert again.status_code == 200 and again.json() == created.json()
    other_role = board_client.post(url, {"issueId": str(issue.pk), "role": "reference"}, format="json")
    assert other_role.status_code == 409 and other_role.json()["code"] == "case_link_exists"
    assert CaseIssueLink.objects.filter(case=case, issue=issue).count() == 1
    assert CaseEvent.objects.filter(case=case, kind="issue_linked", details__issueId=str(issue.pk)).count() == 1
    assert ActivityLog.objects.filter(action="case.issue_linked", entity_id=str(case.pk)).count() == 1

    listed = board_client.get(f"/api/issues/{issue.identifier}/cases")
    assert listed.status_code == 200
    assert [(r["case"]["id"], r["role"]) for r in listed.json()] == [(str(case.pk), "work")]
    primary = board_client.get(f"/api/issues/{case.primary_task_id}/cases").json()
    assert [(r["case"]["identifier"], r["role"]) for r in primary] == [(case.identifier, "origin")]

    origin = board_client.post(url, {"issueId": str(issue.pk), "role": "origin"}, format="json")
    assert origin.status_code == 400 and "role" in origin.json()["details"]
    bad = board_client.post(url, {"issueId": str(issue.pk), "extra": 1}, format="json")
    assert bad.status_code == 400 and "extra" in bad.json()["details"]
    bad = board_client.post(url, {"issueId": 12, "role": "boss"}, format="json")
    assert bad.status_code == 400 and {"issueId", "role"} <= set(bad.json()["details"])

    assert board_client.delete(f"{url}/{issue.pk}").status_code == 204
    assert not CaseIssueLink.objects.filter(case=case, issue=issue).exists()
    removed = CaseEvent.objects.filter(case=case, kind="issue_unlinked").get()
    assert removed.details["issueId"] == str(issue.pk) and removed.details["role"] == "work"
    assert ActivityLog.objects.filter(action="case.issue_unlinked", entity_id=str(case.pk)).exists()
    assert board_client.get(f"/api/issues/{issue.pk}/cases").json() == []
    assert board_client.delete(f"{url}/{issue.pk}").status_code == 404
    protected = board_client.delete(f"{url}/{case.primary_task_id}")
    assert protected.status_code == 409 and protected.json()["code"] == "case_origin_link"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="concurrent writers need PostgreSQL row locks")
@pytest.mark.django_db(transaction=True)
def test_concurrent_identical_links_make_one_link_and_one_event(board_user, cases_company):
    """Real concurrent clients (threads, each with its own connection) link the same pair."""
    import threading

    from django.db import connections

    case = make_case(cases_company)
    issue = IssueFactory(company=cases_company)
    barrier, results = threading.Barrier(4), []

    def post():
        client = APIClient()
        client.force_login(board_user)
        barrier.wait()
        try:
            response = client.post(f"/api/cases/{case.pk}/links", {"issueId": str(issue.pk), "role": "work"},
                                   format="json")
            results.append((response.status_code, response.json()))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=post) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(code for code, _ in results) == [200, 200, 200, 201], results
    assert len({json.dumps(body, sort_keys=True) for _, body in results}) == 1
    assert CaseIssueLink.objects.filter(case=case, issue=issue).count() == 1
    assert CaseEvent.objects.filter(case=case, kind="issue_linked", details__issueId=str(issue.pk)).count() == 1


def test_agents_link_with_a_live_run(make_agent_client, cases_company):
    client = make_agent_client(company=cases_company)
    case = make_case(cases_company)
    issue = IssueFactory(company=cases_company)
    run = client.run
    client.use_run(None)
    response = client.post(f"/api/cases/{case.pk}/links", {"issueId": str(issue.pk)}, format="json")
    assert response.status_code == 401 and response.json()["code"] == "run_id_required"
    client.use_run(run)
    response = client.post(f"/api/cases/{case.pk}/links", {"issueId": str(issue.pk)}, format="json")
    assert response.status_code == 201 and response.json()["role"] == "work"
    event = CaseEvent.objects.get(case=case, kind="issue_linked", details__issueId=str(issue.pk))
    assert event.run == client.run and event.actor_agent == client.agent
    run.status, run.finished_at = "succeeded", timezone.now()
    run.save()
    ended = client.delete(f"/api/cases/{case.pk}/links/{issue.pk}")
    assert ended.status_code == 409 and ended.json()["code"] == "run_not_live"
    assert CaseIssueLink.objects.filter(case=case, issue=issue).exists()


def test_viewer_cannot_link(cases_company):
    case = make_case(cases_company)
    issue = IssueFactory(company=cases_company)
    viewer = MembershipFactory(company=cases_company, role="viewer").user
    client = APIClient()
    client.force_login(viewer)
    response = client.post(f"/api/cases/{case.pk}/links", {"issueId": str(issue.pk)}, format="json")
    assert response.status_code == 403
    assert client.get(f"/api/issues/{issue.pk}/cases").status_code == 200
    assert not CaseIssueLink.objects.filter(issue=issue).exists()


# --- the company boundary and the flag -------------------------------------------------------------


def new_routes(case, issue, definition, key="workflow"):
    return [
        ("get", f"/api/cases/{case.pk}?agentRead=true", None),
        ("get", f"/api/cases/{case.pk}?agentRead=true&section=fields", None),
        ("get", f"/api/cases/{case.pk}?agentRead=true&section=document&documentKey={key}", None),
        ("get", f"/api/workflows/{definition.pk}?offsetBytes=0&limitBytes=10", None),
        ("get", f"/api/cases/{case.pk}/events", None),
        ("get", f"/api/cases/{case.pk}/documents", None),
        ("get", f"/api/cases/{case.pk}/documents/{key}", None),
        ("get", f"/api/cases/{case.pk}/documents/{key}/revisions", None),
        ("post", f"/api/cases/{case.pk}/links", {"issueId": str(issue.pk), "role": "work"}),
        ("delete", f"/api/cases/{case.pk}/links/{issue.pk}", None),
        ("get", f"/api/issues/{issue.pk}/cases", None),
    ]


def call(client, method, path, data):
    fn = getattr(client, method)
    return fn(path) if data is None else fn(path, data, format="json")


def test_other_companys_objects_are_404_on_every_new_route(board_client, cases_company):
    other = CompanyFactory(enable_cases=True)
    case = make_case(other, fields=big_fields(10))
    case_document_write(actor=SYSTEM, case=case, key="workflow", body="secret case notes")
    issue = IssueFactory(company=other)
    CaseIssueLink.objects.create(company=other, case=case, issue=issue, role="work")
    definition = workflow_definition_create(actor=SYSTEM, company=other, name="B", prompt="secret")
    own = make_case(cases_company)
    before = (list(CaseIssueLink.objects.values()), CaseEvent.objects.count(), ActivityLog.objects.count(),
              list(Case.objects.values("pk", "updated_at")))
    ghost_case = Case(pk=uuid.uuid4())
    ghost_issue = Issue(pk=uuid.uuid4())
    ghost_definition = WorkflowDefinition(pk=uuid.uuid4())
    for (method, path, data), (_, ghost_path, ghost_data) in zip(
            new_routes(case, issue, definition), new_routes(ghost_case, ghost_issue, ghost_definition)):
        response = call(board_client, method, path, data)
        assert response.status_code == 404, (method, path, response.status_code)
        assert response.json()["code"] == "not_found"
        assert "secret" not in response.content.decode()
        assert call(board_client, method, ghost_path, ghost_data).json() == response.json()
    # Own case, the other company's issue in the body / path / query.
    for method, path, data in [("post", f"/api/cases/{own.pk}/links", {"issueId": str(issue.pk)}),
                               ("delete", f"/api/cases/{own.pk}/links/{issue.pk}", None),
                               ("get", f"/api/cases/{own.pk}?agentRead=true&section=document&documentKey=workflow"
                                       f"&documentIssueId={case.primary_task_id}", None)]:
        assert call(board_client, method, path, data).status_code == 404, path
    after = (list(CaseIssueLink.objects.values()), CaseEvent.objects.count(), ActivityLog.objects.count(),
             list(Case.objects.values("pk", "updated_at")))
    assert after == before


def test_flag_off_new_routes_are_404(board_client, cases_company):
    case = make_case(cases_company, fields=big_fields(10))
    case_document_write(actor=SYSTEM, case=case, key="workflow", body="case notes")
    issue = IssueFactory(company=cases_company)
    CaseIssueLink.objects.create(company=cases_company, case=case, issue=issue, role="work")
    definition = workflow_definition_create(actor=SYSTEM, company=cases_company, name="A", prompt="p" * 40)
    for method, path, data in new_routes(case, issue, definition):  # the control: all reachable
        assert call(board_client, method, path, data).status_code < 300, (method, path)
        if method == "delete":
            CaseIssueLink.objects.create(company=cases_company, case=case, issue=issue, role="work")
    cases_company.enable_cases = False
    cases_company.save()
    links = CaseIssueLink.objects.count()
    for method, path, data in new_routes(case, issue, definition):
        response = call(board_client, method, path, data)
        assert response.status_code == 404, (method, path, response.status_code)
        assert response.json()["code"] == "not_found"
    assert CaseIssueLink.objects.count() == links


# --- the case list at 10,000 cases ------------------------------------------------------------------

TITLES = [f"title-{i:02d}" for i in range(37)]
TYPES = ["audit", "intake", "review", "triage"]


def bulk_cases(company, projects, start, count):
    """Cases straight into the table (no primary tasks), with many ties in every sort key."""
    base = timezone.now() - timedelta(days=30)
    project_choices = [*projects, None]
    Case.objects.bulk_create([
        Case(company=company, number=n, identifier=f"{company.issue_prefix}-C{n}", case_type=TYPES[n % 4],
             title=TITLES[n % 37], status=CASE_STATUS_ORDER[n % 6],
             project=project_choices[n % len(project_choices)], fields={"n": n})
        for n in range(start, start + count)], batch_size=1000)
    # 50 distinct timestamps (auto_now ignores explicit values on create, so set them after).
    buckets = {}
    for pk, n in Case.objects.filter(company=company, number__gte=start, number__lt=start + count).values_list(
            "pk", "number"):
        buckets.setdefault(n % 50, []).append(pk)
    for bucket, pks in buckets.items():
        Case.objects.filter(pk__in=pks).update(created_at=base + timedelta(minutes=bucket),
                                               updated_at=base + timedelta(minutes=(bucket * 7) % 50))


SORT_KEYS = {
    "updated": lambda c: c.updated_at,
    "created": lambda c: c.created_at,
    "title": lambda c: c.title,
    "status": lambda c: CASE_STATUS_ORDER.index(c.status),
    "type": lambda c: c.case_type,
}
GROUP_KEYS = {
    "none": lambda c: 0,
    "status": lambda c: CASE_STATUS_ORDER.index(c.status),
    "type": lambda c: c.case_type,
    "project": lambda c: (c.project_id is None, str(c.project_id or "")),
}


def expected_order(cases, sort_field, sort_dir, group_by):
    """Group ascending; inside, the sort key in the direction with the id as the tie-break."""
    ordered = sorted(cases, key=lambda c: (SORT_KEYS[sort_field](c), c.pk), reverse=sort_dir == "desc")
    return [c.pk for c in sorted(ordered, key=GROUP_KEYS[group_by])]  # stable sort keeps the inner order


COMBOS = [(f, g) for f in SORT_KEYS for g in GROUP_KEYS]


def browse_queries(client, company, params):
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(f"/api/companies/{company.pk}/cases?{params}")
    assert response.status_code == 200, response.content[:300]
    return len(ctx.captured_queries)


def test_case_list_at_10000_cases_runs_a_constant_number_of_queries(board_client, cases_company):
    projects = [ProjectFactory(company=cases_company) for _ in range(3)]
    bulk_cases(cases_company, projects, 1, 10)
    params = [f"sortField={f}&groupBy={g}&limit=10&offset=0" for f, g in COMBOS]
    small = [browse_queries(board_client, cases_company, p) for p in params]
    bulk_cases(cases_company, projects, 11, 9990)
    assert Case.objects.filter(company=cases_company).count() == 10_000
    large = [browse_queries(board_client, cases_company, p) for p in params]
    assert large == small  # the same number of queries at 10 and at 10,000 cases, for every sort and group
    deep = browse_queries(board_client, cases_company, "sortField=title&groupBy=project&limit=10&offset=9990")
    assert deep == small[0]


def walk_browse(company, sort_field, sort_dir, group_by):
    seen = []
    for offset in range(0, 10_000, 1000):
        page = case_browse(company=company, params={"sortField": sort_field, "sortDir": sort_dir,
                                                    "groupBy": group_by, "limit": "1000", "offset": str(offset)})
        assert page["total"] == 10_000
        seen += [c.pk for c in page["items"]]
    return seen


@pytest.mark.parametrize("group_by", list(GROUP_KEYS))
def test_case_list_pages_over_10000_cases_are_stable(board_client, cases_company, group_by):
    """Walking every page yields each case exactly once, in the documented order (group, then the
    sort key, then the id as the tie-break), for every sort field under this grouping."""
    projects = [ProjectFactory(company=cases_company) for _ in range(3)]
    bulk_cases(cases_company, projects, 1, 10_000)
    everything = list(Case.objects.filter(company=cases_company).defer("fields"))
    walks = [(field, "desc" if field in ("updated", "created") else "asc") for field in SORT_KEYS] + [
        ("title", "desc")]
    for sort_field, sort_dir in walks:
        seen = walk_browse(cases_company, sort_field, sort_dir, group_by)
        assert len(seen) == len(set(seen)) == 10_000, (sort_field, sort_dir)
        assert seen == expected_order(everything, sort_field, sort_dir, group_by), (sort_field, sort_dir)
    # And through the API with its defaults for the sort direction.
    seen = []
    for offset in range(0, 10_000, 1000):
        response = board_client.get(f"/api/companies/{cases_company.pk}/cases?sortField=status&groupBy={group_by}"
                                    f"&limit=1000&offset={offset}")
        seen += [item["id"] for item in response.json()["items"]]
    assert seen == [str(pk) for pk in expected_order(everything, "status", "asc", group_by)]
