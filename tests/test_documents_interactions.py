"""Key-addressed documents with base revisions, and confirmations bound to a revision."""
import threading

import pytest
from django.db import connection
from django.test import Client

from issues.models import DocumentRevision, Interaction
from tests.factories import IssueFactory


def put(client, issue, key, **body):
    return client.put(f"/api/issues/{issue.pk}/documents/{key}", body, format="json")


def test_first_write_creates_then_base_revision_is_required(board_client, issue):
    first = put(board_client, issue, "plan", body="v1", title="Plan")
    assert first.status_code == 201 and first.json()["revisionNumber"] == 1
    stale = put(board_client, issue, "plan", body="v2 without base")
    assert stale.status_code == 409
    assert stale.json()["details"]["currentRevisionId"] == first.json()["revisionId"]
    second = put(board_client, issue, "plan", body="v2", baseRevisionId=first.json()["revisionId"])
    assert second.status_code == 200 and second.json()["revisionNumber"] == 2
    assert board_client.get(f"/api/issues/{issue.pk}/documents/plan").json()["body"] == "v2"
    revisions = board_client.get(f"/api/issues/{issue.pk}/documents/plan/revisions").json()
    assert [r["body"] for r in revisions] == ["v1", "v2"]
    # Writing again on the old base loses nothing: 409 and the text stays v2.
    again = put(board_client, issue, "plan", body="v2-bis", baseRevisionId=first.json()["revisionId"])
    assert again.status_code == 409
    assert DocumentRevision.objects.filter(document__issue=issue).count() == 2


@pytest.mark.parametrize("key", ["Plan!", "-x", "a b", "x" * 65])  # upper case alone is fine (lower-cased)
def test_bad_document_keys_are_400(board_client, issue, key):
    response = put(board_client, issue, key, body="x")
    assert response.status_code == 400 and "key" in response.json()["details"]


def test_missing_document_is_404(board_client, issue):
    assert board_client.get(f"/api/issues/{issue.pk}/documents/nothing").status_code == 404


@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_on_the_same_base_one_wins(company, board_user):
    issue = IssueFactory(company=company)
    client = Client()
    client.force_login(board_user)
    base = client.put(f"/api/issues/{issue.pk}/documents/plan", {"body": "v1"},
                      content_type="application/json").json()["revisionId"]
    barrier = threading.Barrier(6)
    codes = []

    def write(n):
        try:
            c = Client()
            c.force_login(board_user)
            barrier.wait(timeout=30)
            codes.append(c.put(f"/api/issues/{issue.pk}/documents/plan", {"body": f"v2-{n}", "baseRevisionId": base},
                               content_type="application/json").status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=write, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(codes) == [200] + [409] * 5
    assert DocumentRevision.objects.filter(document__issue=issue).count() == 2


def test_confirmation_bound_to_revision_and_answered_by_board(agent_client, board_client, issue):
    # The agent asks about its own task (another agent's issue is not its to change: test_fences).
    issue.assignee_agent = agent_client.agent
    issue.save(update_fields=["assignee_agent"])
    put(board_client, issue, "plan", body="v1")
    created = agent_client.post(f"/api/issues/{issue.pk}/interactions",
                                {"kind": "request_confirmation", "title": "Go?", "documentKey": "plan"}, format="json")
    assert created.status_code == 201
    interaction = created.json()
    assert interaction["status"] == "pending" and interaction["documentRevisionId"]
    # Agents cannot answer their own question.
    assert agent_client.post(f"/api/interactions/{interaction['id']}/respond", {"status": "accepted"},
                             format="json").status_code == 403
    accepted = board_client.post(f"/api/interactions/{interaction['id']}/respond", {"status": "accepted"}, format="json")
    assert accepted.status_code == 200 and accepted.json()["status"] == "accepted"
    again = board_client.post(f"/api/interactions/{interaction['id']}/respond", {"status": "rejected"}, format="json")
    assert again.status_code == 409


def test_confirmation_on_an_outdated_revision_expires_instead_of_accepting(board_client, issue):
    v1 = put(board_client, issue, "plan", body="v1").json()
    interaction = board_client.post(f"/api/issues/{issue.pk}/interactions",
                                    {"kind": "request_confirmation", "title": "Go?", "documentKey": "plan"},
                                    format="json").json()
    put(board_client, issue, "plan", body="v2", baseRevisionId=v1["revisionId"])
    response = board_client.post(f"/api/interactions/{interaction['id']}/respond", {"status": "accepted"},
                                 format="json")
    assert response.status_code == 409 and response.json()["code"] == "stale_revision"
    assert Interaction.objects.get(pk=interaction["id"]).status == "expired"


def test_interaction_kind_is_validated(board_client, issue):
    response = board_client.post(f"/api/issues/{issue.pk}/interactions", {"kind": "vote", "title": "?"}, format="json")
    assert response.status_code == 400 and "kind" in response.json()["details"]
