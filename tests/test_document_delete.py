"""``DELETE /api/issues/{id}/documents/{key}`` (upstream §5.2 documents: board only, ``{ok: true}``):
the document goes with all its revisions, audited; nothing is deleted when the caller may not or
when an interaction is bound to one of its revisions."""
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from issues.actors import SYSTEM
from issues.models import ActivityLog, Document, DocumentRevision
from issues.services.thread import document_write, interaction_create
from tests.factories import CompanyFactory, IssueFactory, MembershipFactory
from tests.test_errors import assert_error


def write(issue, key, *bodies):
    revision = None
    for body in bodies:
        revision = document_write(actor=SYSTEM, issue=issue, key=key, body=body,
                                  base_revision_id=revision.pk if revision else None)
    return revision


def test_board_deletes_a_document_with_its_revisions_and_it_is_audited(board_client, company):
    issue = IssueFactory(company=company)
    write(issue, "plan", "1. Reproduce", "1. Reproduce\n2. Fix")
    kept = write(issue, "notes", "scratch")

    response = board_client.delete(f"/api/issues/{issue.identifier}/documents/PLAN")  # keys ignore case

    assert response.status_code == 200, response.content
    assert response.json() == {"ok": True}
    assert list(Document.objects.filter(issue=issue).values_list("key", flat=True)) == ["notes"]
    assert list(DocumentRevision.objects.filter(document__issue=issue)) == [kept]
    assert_error(board_client.get(f"/api/issues/{issue.pk}/documents/plan"), 404)
    row = ActivityLog.objects.get(action="issue.document_deleted")
    assert (row.entity_type, row.entity_id) == ("issue", str(issue.pk))
    assert row.details["key"] == "plan" and row.details["revisionCount"] == 2 and row.actor_user is not None
    # The key is free again: the next write starts a new document at revision 1.
    again = board_client.put(f"/api/issues/{issue.pk}/documents/plan", {"format": "markdown", "body": "fresh"},
                             format="json")
    assert again.status_code == 201 and again.json()["latestRevisionNumber"] == 1


def test_only_board_writers_delete_documents(agent_client, company):
    issue = IssueFactory(company=company, assignee_agent=agent_client.agent)
    write(issue, "plan", "1. Fix")
    viewer = APIClient()
    viewer.force_login(MembershipFactory(company=company, role="viewer").user)

    assert_error(agent_client.delete(f"/api/issues/{issue.pk}/documents/plan"), 403, "board_only")
    assert_error(viewer.delete(f"/api/issues/{issue.pk}/documents/plan"), 403)

    assert Document.objects.filter(issue=issue, key="plan").exists()
    assert not ActivityLog.objects.filter(action="issue.document_deleted").exists()


def test_an_unknown_document_is_a_404(board_client, company):
    issue = IssueFactory(company=company)
    assert_error(board_client.delete(f"/api/issues/{issue.pk}/documents/plan"), 404)
    assert_error(board_client.delete(f"/api/issues/{issue.pk}/documents/Not a key!"), 404)


def test_a_document_an_interaction_is_bound_to_is_kept(board_client, company):
    issue = IssueFactory(company=company)
    revision = write(issue, "plan", "1. Fix")
    interaction = interaction_create(actor=SYSTEM, issue=issue, kind="request_confirmation", title="Approve the plan?",
                                     document_key="plan")
    assert interaction.document_revision_id == revision.pk

    error = assert_error(board_client.delete(f"/api/issues/{issue.pk}/documents/plan"), 409,
                         "document_delete_restricted")

    assert error["details"]["interactionIds"] == [str(interaction.pk)]
    assert DocumentRevision.objects.filter(pk=revision.pk).exists()
    assert not ActivityLog.objects.filter(action="issue.document_deleted").exists()


# --- the console's document page ----------------------------------------------------------------------


def console_login(user):
    client = Client()
    client.force_login(user)
    return client


def delete_url(issue, key):
    return reverse("console:issue-document-delete", args=[issue.identifier, key])


def test_the_console_deletes_a_document_after_a_confirmation_step(board_user, company):
    issue = IssueFactory(company=company)
    write(issue, "plan", "1. Fix", "1. Fix\n2. Ship")
    client = console_login(board_user)
    page = client.get(reverse("console:issue-document", args=[issue.identifier, "plan"])).content.decode()
    assert f'<form method="post" action="{delete_url(issue, "plan")}">' in page
    assert "The document and all 2 revisions are removed for good." in page

    assert client.get(delete_url(issue, "plan")).status_code == 405
    response = client.post(delete_url(issue, "plan"))

    assert response.status_code == 302
    assert response["Location"] == reverse("console:issue-detail", args=[issue.identifier]) + "#documents"
    assert not Document.objects.filter(issue=issue).exists()
    detail = client.get(response["Location"]).content.decode()
    assert "Deleted the document “plan” and its revisions." in detail and "No documents." in detail


def test_the_console_shows_why_a_bound_document_is_kept(board_user, company):
    issue = IssueFactory(company=company)
    write(issue, "plan", "1. Fix")
    interaction_create(actor=SYSTEM, issue=issue, kind="request_confirmation", title="Approve?", document_key="plan")
    client = console_login(board_user)

    detail = client.post(delete_url(issue, "plan"), follow=True).content.decode()

    assert "Interactions are bound to this document&#x27;s revisions" in detail
    assert Document.objects.filter(issue=issue, key="plan").exists()


def test_viewers_and_other_companies_cannot_delete_from_the_console(company):
    issue = IssueFactory(company=company)
    write(issue, "plan", "1. Fix")
    viewer = console_login(MembershipFactory(company=company, role="viewer").user)
    page = viewer.get(reverse("console:issue-document", args=[issue.identifier, "plan"])).content.decode()
    assert delete_url(issue, "plan") not in page
    assert viewer.post(delete_url(issue, "plan")).status_code == 403
    stranger = console_login(MembershipFactory(company=CompanyFactory(), role="owner").user)
    assert stranger.post(delete_url(issue, "plan")).status_code == 404
    assert Document.objects.filter(issue=issue, key="plan").exists()
