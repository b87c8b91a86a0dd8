"""Issue attachments (paperclip-api.md §5 "Attachments", and the skill's "files to POST
/api/companies/{companyId}/issues/{issueId}/attachments"): upload, list, read the bytes, delete.

The bytes live in the ``attachments`` storage (a temporary folder per test session, tests/conftest.py);
every test that changes rows also checks what is on disk, since a row without bytes (or bytes
without a row) is the failure a user would meet.
"""
import hashlib
import io
import os
import time

import pytest
from django.utils import timezone

from issues.actors import SYSTEM
from issues.exceptions import Unprocessable
from issues.models import ActivityLog, Attachment
from issues.models.attachment import attachment_storage
from issues.services import attachments as attachment_services
from issues.services.thread import comment_create
from tests.attachment_files import PNG, a_file, stored_keys
from tests.factories import AgentFactory, CompanyFactory, IssueFactory, MembershipFactory, RunFactory
from tests.test_errors import assert_error

pytestmark = pytest.mark.django_db


def upload_url(issue, company=None):
    return f"/api/companies/{(company or issue.company).pk}/issues/{issue.pk}/attachments"


def upload(client, issue, name="shot.png", content=PNG, content_type="image/png", company=None, **fields):
    data = {"file": a_file(name, content, content_type), **fields}
    return client.post(upload_url(issue, company), data, format="multipart")


def content_of(response):
    return b"".join(response.streaming_content)


def test_an_agent_attaches_a_file_and_reads_it_back(agent_client, company, issue):
    response = upload(agent_client, issue)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["originalFilename"] == "shot.png" and body["contentType"] == "image/png"
    assert body["byteSize"] == len(PNG) and body["sha256"] == hashlib.sha256(PNG).hexdigest()
    assert body["issueId"] == str(issue.pk) and body["companyId"] == str(company.pk)
    assert body["createdByAgentId"] == str(agent_client.agent.pk) and body["runId"] == str(agent_client.run.pk)
    assert body["contentPath"] == f"/api/attachments/{body['id']}/content"
    assert stored_keys(issue) == {body["objectKey"]}

    content = agent_client.get(body["contentPath"])
    assert content.status_code == 200
    assert content_of(content) == PNG
    assert content["Content-Type"] == "image/png" and content["Content-Length"] == str(len(PNG))
    assert content["Content-Disposition"].startswith("inline")
    assert content["X-Content-Type-Options"] == "nosniff" and "sandbox" in content["Content-Security-Policy"]

    listed = agent_client.get(f"/api/issues/{issue.identifier}/attachments").json()
    assert [a["id"] for a in listed] == [body["id"]]
    assert agent_client.get(f"/api/attachments/{body['id']}").json() == body
    audit = ActivityLog.objects.get(action="issue.attachment_added", entity_id=str(issue.pk))
    assert audit.details["attachmentId"] == body["id"] and audit.details["sha256"] == body["sha256"]


def test_the_heartbeat_context_lists_the_issues_attachments(agent_client, issue):
    first = upload(agent_client, issue, name="a.txt", content=b"one", content_type="text/plain").json()
    second = upload(agent_client, issue, name="b.png").json()
    listed = agent_client.get(f"/api/issues/{issue.pk}/heartbeat-context").json()["attachments"]
    assert [a["id"] for a in listed] == [first["id"], second["id"]]
    assert listed[0] == {"id": first["id"], "filename": "a.txt", "contentType": "text/plain", "byteSize": 3,
                         "contentPath": first["contentPath"], "createdAt": first["createdAt"]}


def test_a_file_can_belong_to_one_of_the_issues_comments(board_client, company, issue):
    comment = comment_create(actor=SYSTEM, issue=issue, body="see the screenshot")
    response = upload(board_client, issue, issueCommentId=str(comment.pk))
    assert response.status_code == 201, response.content
    assert response.json()["issueCommentId"] == str(comment.pk)
    assert response.json()["createdByUserId"] is not None and response.json()["authorType"] == "user"

    elsewhere = comment_create(actor=SYSTEM, issue=IssueFactory(company=company), body="another issue's")
    refused = upload(board_client, issue, issueCommentId=str(elsewhere.pk))
    assert_error(refused, 404, fields=["issueCommentId"])
    assert_error(upload(board_client, issue, issueCommentId="not-a-uuid"), 400, "validation_error",
                 fields=["issueCommentId"])
    assert Attachment.objects.filter(issue=issue).count() == 1 and len(stored_keys(issue)) == 1


def test_missing_empty_and_several_files_are_refused_with_upstreams_words(agent_client, issue):
    error = assert_error(agent_client.post(upload_url(issue), {}, format="multipart"), 400, "missing_file",
                         fields=["file"])
    assert error["message"] == "Missing file field 'file'"
    error = assert_error(upload(agent_client, issue, content=b""), 422, "attachment_empty", fields=["file"])
    assert error["message"] == "Attachment is empty"
    two = {"file": [a_file("a.png"),
                    a_file("b.png")]}
    assert_error(agent_client.post(upload_url(issue), two, format="multipart"), 400, fields=["file"])
    assert_error(agent_client.post(upload_url(issue), {"file": "text"}, format="json"), 415)
    assert not Attachment.objects.exists() and stored_keys(issue) == set()


def test_the_size_limit_is_upstreams_answer_and_nothing_is_kept(agent_client, issue, settings):
    settings.PAPERCLIP = {**settings.PAPERCLIP, "ATTACHMENT_MAX_BYTES": 100_000}
    at_limit = upload(agent_client, issue, content=b"x" * 100_000, name="a.txt", content_type="text/plain")
    assert at_limit.status_code == 201, at_limit.content
    # Past the limit the file is dropped while it streams in (paperclip.core.uploads), never stored.
    error = assert_error(upload(agent_client, issue, content=b"x" * 300_000, name="b.txt", content_type="text/plain"),
                         422, "attachment_too_large", fields=["file"])
    assert error["message"] == "Attachment exceeds 100000 bytes" and error["details"]["maxBytes"] == 100_000
    assert Attachment.objects.filter(issue=issue).count() == 1 and len(stored_keys(issue)) == 1


def test_a_file_larger_than_the_json_body_limit_uploads_under_the_default_limit(agent_client, issue, settings):
    content = b"x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1024)  # streamed to a temporary file, not memory
    body = upload(agent_client, issue, name="big.txt", content=content, content_type="text/plain").json()
    assert body["byteSize"] == len(content) and body["sha256"] == hashlib.sha256(content).hexdigest()
    assert content_of(agent_client.get(body["contentPath"])) == content


def test_the_service_refuses_an_oversized_file_handed_to_it_directly(issue, settings):
    settings.PAPERCLIP = {**settings.PAPERCLIP, "ATTACHMENT_MAX_BYTES": 10}
    with pytest.raises(Unprocessable) as refused:
        attachment_services.attachment_create(actor=SYSTEM, issue=issue,
                                              upload=a_file("a.txt", b"x" * 11, "text/plain"))
    assert refused.value.code == "attachment_too_large"


def test_content_types_follow_the_allow_list(agent_client, issue, settings):
    error = assert_error(upload(agent_client, issue, name="page.html", content=b"<script>1</script>",
                                content_type="text/html"), 422, "attachment_type_unsupported", fields=["file"])
    assert error["message"] == "Unsupported attachment type: text/html"
    # A generic or missing part type is guessed from the name (curl -F sends octet-stream).
    guessed = upload(agent_client, issue, name="notes.md", content=b"# notes", content_type="application/octet-stream")
    assert guessed.status_code == 201 and guessed.json()["contentType"] == "text/markdown"
    assert_error(upload(agent_client, issue, name="blob", content=b"\x00\x01", content_type="application/octet-stream"),
                 422, "attachment_type_unsupported")
    # Parameters are dropped, case is folded; a family entry admits its members.
    assert upload(agent_client, issue, name="a.txt", content=b"hi",
                  content_type="Text/Plain; charset=utf-8").json()["contentType"] == "text/plain"
    settings.PAPERCLIP = {**settings.PAPERCLIP, "ATTACHMENT_ALLOWED_TYPES": ["image/*"]}
    assert upload(agent_client, issue, name="a.avif", content=b"avif", content_type="image/avif").status_code == 201
    assert_error(upload(agent_client, issue, name="a.txt", content=b"hi", content_type="text/plain"), 422)


def test_downloads_are_sandboxed_and_names_are_only_names(board_client, issue):
    body = upload(board_client, issue, name="../../etc/r\u00e9sum\u00e9\x07.pdf", content=b"%PDF-1.4",
                  content_type="application/pdf").json()
    assert body["originalFilename"] == "r\u00e9sum\u00e9.pdf"
    assert body["objectKey"] == f"{issue.company_id}/issues/{issue.pk}/{body['id']}"  # ids only, never the name
    content = board_client.get(body["contentPath"])
    assert content_of(content) == b"%PDF-1.4"
    disposition = content["Content-Disposition"]
    assert disposition.startswith("attachment") and "filename*=utf-8''r%C3%A9sum%C3%A9.pdf" in disposition
    assert "sandbox" in content["Content-Security-Policy"] and content["X-Content-Type-Options"] == "nosniff"
    # The JSON error shape whatever the client accepts.
    missing = board_client.get("/api/attachments/00000000-0000-0000-0000-000000000000/content",
                               HTTP_ACCEPT="application/pdf")
    assert_error(missing, 404)


def test_bytes_missing_from_storage_are_a_404(board_client, issue):
    body = upload(board_client, issue).json()
    attachment_storage().delete(body["objectKey"])
    assert_error(board_client.get(body["contentPath"]), 404, "attachment_content_missing")


def test_an_agent_writes_through_the_same_fences_as_comments(make_agent_client, company):
    holder = AgentFactory(company=company, name="Holder")
    run = RunFactory(agent=holder, status="running", started_at=timezone.now())
    wip = IssueFactory(company=company, status="in_progress", assignee_agent=holder, checkout_run=run,
                       execution_run=run, execution_locked_at=timezone.now(), started_at=timezone.now())
    other = make_agent_client(company=company, name="Other")
    assert_error(upload(other, wip), 409, "not_checkout_owner")
    assert not Attachment.objects.exists() and stored_keys(wip) == set()
    # Unassigned or someone else's issue not in progress: any agent of the company may attach, as it may comment.
    assert upload(other, IssueFactory(company=company, assignee_agent=holder)).status_code == 201


def test_a_viewer_cannot_attach_or_delete(company, issue):
    from rest_framework.test import APIClient

    viewer = APIClient()
    viewer.force_login(MembershipFactory(company=company, role="viewer").user)
    assert_error(upload(viewer, issue), 403)
    attachment = attachment_services.attachment_create(
        actor=SYSTEM, issue=issue, upload=a_file("a.png"))
    assert_error(viewer.delete(f"/api/attachments/{attachment.pk}"), 403)
    assert viewer.get(f"/api/attachments/{attachment.pk}/content").status_code == 200  # reading is fine
    assert Attachment.objects.filter(issue=issue).count() == 1


def test_deleting_removes_the_row_then_the_bytes(agent_client, make_agent_client, board_client, company, issue,
                                                 django_capture_on_commit_callbacks):
    mine = upload(agent_client, issue).json()
    theirs = upload(board_client, issue, name="b.png").json()
    stranger = make_agent_client(company=company, name="Stranger")
    assert_error(stranger.delete(f"/api/attachments/{mine['id']}"), 403, "attachment_not_owned")
    assert_error(agent_client.delete(f"/api/attachments/{theirs['id']}"), 403, "attachment_not_owned")

    with django_capture_on_commit_callbacks(execute=True):
        response = agent_client.delete(f"/api/attachments/{mine['id']}")
    assert response.status_code == 200 and response.json() == {"ok": True}
    assert stored_keys(issue) == {theirs["objectKey"]}
    assert ActivityLog.objects.filter(action="issue.attachment_removed", details__attachmentId=mine["id"]).exists()
    with django_capture_on_commit_callbacks(execute=True):
        assert board_client.delete(f"/api/attachments/{theirs['id']}").status_code == 200
    assert not Attachment.objects.exists() and stored_keys(issue) == set()
    assert_error(board_client.delete(f"/api/attachments/{theirs['id']}"), 404)


def test_deleting_the_issue_removes_its_attachments_bytes(board_client, issue, django_capture_on_commit_callbacks):
    upload(board_client, issue)
    upload(board_client, issue, name="b.png")
    assert len(stored_keys(issue)) == 2
    with django_capture_on_commit_callbacks(execute=True):
        assert board_client.delete(f"/api/issues/{issue.pk}").status_code == 200
    assert not Attachment.objects.exists() and stored_keys(issue) == set()


def test_bytes_of_a_row_that_does_not_commit_are_removed(issue, monkeypatch):
    def fail(**kwargs):
        raise RuntimeError("audit write failed")

    monkeypatch.setattr(attachment_services, "activity_record", fail)
    with pytest.raises(RuntimeError):
        attachment_services.attachment_create(actor=SYSTEM, issue=issue, upload=a_file("a.png"))
    assert not Attachment.objects.exists() and stored_keys(issue) == set()


def test_the_sweep_removes_old_bytes_no_row_names(agent_client, issue, monkeypatch, own_attachment_storage):
    from issues.services.scheduling import sweep

    kept = upload(agent_client, issue).json()["objectKey"]
    storage = attachment_storage()
    folder = f"{issue.company_id}/issues/{issue.pk}"

    def orphan(name, age_seconds):
        key = storage.save(f"{folder}/{name}", io.BytesIO(b"x"))
        then = time.time() - age_seconds
        os.utime(storage.path(key), (then, then))
        return key

    os.utime(storage.path(kept), (time.time() - 7200,) * 2)  # old, but a row names it
    orphan("stale-orphan", 7200)
    fresh = orphan("fresh", 0)
    assert attachment_services.attachments_orphan_sweep(force=True) == 1
    assert stored_keys(issue) == {kept, fresh}  # a fresh file may be an upload still committing
    # The host's periodic sweep runs it, at most once an hour per process (it walks the storage).
    monkeypatch.setattr(attachment_services, "_orphans_swept_at", None)
    second = orphan("second-orphan", 7200)
    assert sweep(owner="test")["attachmentOrphans"] == 1 and second not in stored_keys(issue)
    third = orphan("third-orphan", 7200)
    assert sweep(owner="test")["attachmentOrphans"] == 0 and third in stored_keys(issue)


def test_another_companys_attachments_are_404s(board_client, company, issue):
    foreign_issue = IssueFactory(company=CompanyFactory())
    foreign = attachment_services.attachment_create(
        actor=SYSTEM, issue=foreign_issue, upload=a_file("a.png"))
    for path in (f"/api/attachments/{foreign.pk}", f"/api/attachments/{foreign.pk}/content",
                 f"/api/issues/{foreign_issue.pk}/attachments"):
        assert_error(board_client.get(path), 404)
    assert_error(board_client.delete(f"/api/attachments/{foreign.pk}"), 404)
    assert_error(upload(board_client, foreign_issue), 404)
    assert_error(upload(board_client, foreign_issue, company=company), 404)  # own company in the path
    assert_error(upload(board_client, issue, company=foreign_issue.company), 404)  # foreign company in the path
    assert Attachment.objects.count() == 1 and stored_keys(issue) == set()


def test_a_patch_comment_or_a_new_comment_takes_the_attachments_it_mentions(agent_client, board_client, company,
                                                                            issue):
    first = upload(agent_client, issue).json()
    second = upload(agent_client, issue, name="b.png").json()
    patch = {"comment": "screenshots attached", "attachmentIds": [first["id"], second["id"]]}
    response = agent_client.patch(f"/api/issues/{issue.pk}", patch, format="json")
    assert response.status_code == 200, response.content
    comment_id = response.json()["comment"]["id"]
    assert {a["issueCommentId"] for a in agent_client.get(f"/api/issues/{issue.pk}/attachments").json()} == {
        comment_id}
    posted = board_client.post(f"/api/issues/{issue.pk}/comments", {"body": "moved", "attachmentIds": [second["id"]]},
                               format="json")
    assert posted.status_code == 201, posted.content
    assert str(Attachment.objects.get(pk=second["id"]).comment_id) == posted.json()["id"] != comment_id


def test_attachment_ids_need_a_comment_and_this_issues_attachments(agent_client, company, issue):
    mine = upload(agent_client, issue).json()
    error = assert_error(agent_client.patch(f"/api/issues/{issue.pk}", {"attachmentIds": [mine["id"]]},
                                            format="json"), 400, fields=["attachmentIds"])
    assert error["message"] == "Attachments are only supported when posting a comment"
    other_issue = IssueFactory(company=company)
    elsewhere = attachment_services.attachment_create(
        actor=SYSTEM, issue=other_issue, upload=a_file("a.png"))
    foreign = attachment_services.attachment_create(
        actor=SYSTEM, issue=IssueFactory(company=CompanyFactory()),
        upload=a_file("a.png"))
    comments = issue.comments.count()
    for wrong in (elsewhere, foreign):
        refused = agent_client.patch(f"/api/issues/{issue.pk}", {"comment": "see", "attachmentIds": [
            mine["id"], str(wrong.pk)]}, format="json")
        error = assert_error(refused, 404, fields=["attachmentIds"])
        assert str(wrong.pk) in error["details"]["attachmentIds"][0]
    assert issue.comments.count() == comments  # the comment was not written either
    assert Attachment.objects.get(pk=mine["id"]).comment_id is None


def test_the_openapi_schema_describes_the_upload_as_multipart():
    from drf_spectacular.generators import SchemaGenerator

    paths = SchemaGenerator().get_schema(request=None, public=True)["paths"]
    operation = paths["/api/companies/{company_id}/issues/{issue_id}/attachments"]["post"]
    assert list(operation["requestBody"]["content"]) == ["multipart/form-data"]
    assert "201" in operation["responses"]
    assert paths["/api/attachments/{attachment_id}/content"]["get"]["operationId"] == "attachments_content"
