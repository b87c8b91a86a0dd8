"""``POST /api/issues/{id}/documents/{key}/revisions/{revisionId}/restore`` (paperclip-api.md §5.2): a
new latest revision with an old one's title and body; history is kept."""
import pytest

from issues.actors import SYSTEM
from issues.models import ActivityLog, DocumentRevision
from issues.services.thread import document_write
from tests.factories import AgentFactory, CompanyFactory, IssueFactory

pytestmark = pytest.mark.django_db


def url(issue, key, revision):
    return f"/api/issues/{issue.pk}/documents/{key}/revisions/{revision.pk}/restore"


@pytest.fixture
def plan(issue):
    first = document_write(actor=SYSTEM, issue=issue, key="plan", body="v1 body", title="Plan v1")
    document_write(actor=SYSTEM, issue=issue, key="plan", body="v2 body", title="Plan v2",
                   base_revision_id=first.pk)
    return first


def test_restoring_writes_a_new_latest_revision_and_keeps_history(board_client, issue, plan):
    response = board_client.post(url(issue, "plan", plan))
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["body"], body["title"], body["latestRevisionNumber"]) == ("v1 body", "Plan v1", 3)
    revisions = board_client.get(f"/api/issues/{issue.pk}/documents/plan/revisions").json()
    assert [(r["revisionNumber"], r["body"]) for r in revisions] == [(1, "v1 body"), (2, "v2 body"), (3, "v1 body")]
    assert DocumentRevision.objects.get(document__issue=issue, number=3).change_summary == "Restored revision 1"
    entry = ActivityLog.objects.get(action="issue.document_restored", entity_id=str(issue.pk))
    assert (entry.details["restoredFromRevisionNumber"], entry.details["revisionNumber"]) == (1, 3)


def test_an_agent_that_may_not_change_the_issue_is_refused(make_agent_client, company, issue, plan):
    issue.assignee_agent = AgentFactory(company=company, name="Owner")  # another agent's issue
    issue.save()
    stranger = make_agent_client(company=company, name="Stranger")
    response = stranger.post(url(issue, "plan", plan))
    assert response.status_code == 403, response.content
    assert DocumentRevision.objects.filter(document__issue=issue).count() == 2


def test_unknown_or_foreign_revisions_and_keys_are_404s(board_client, company, issue, plan):
    other = document_write(actor=SYSTEM, issue=issue, key="notes", body="notes")
    response = board_client.post(url(issue, "plan", other))
    assert response.status_code == 404 and "revisionId" in response.json()["details"], response.content
    assert board_client.post(url(issue, "missing", plan)).status_code == 404
    foreign = IssueFactory(company=CompanyFactory())
    foreign_revision = document_write(actor=SYSTEM, issue=foreign, key="plan", body="theirs")
    assert board_client.post(url(foreign, "plan", foreign_revision)).status_code == 404
    assert board_client.post(url(issue, "plan", foreign_revision)).status_code == 404
    assert DocumentRevision.objects.filter(document__issue=issue, document__key="plan").count() == 2
