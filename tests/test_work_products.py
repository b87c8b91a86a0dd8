"""Work products over the API: agents and board users record them on an issue, everybody who can see
the issue lists them, values are validated with field errors, writes are audited and company-scoped."""
import pytest
from rest_framework.test import APIClient

from issues.models import ActivityLog, WorkProduct
from issues.actors import SYSTEM
from issues.services.issues import issue_update
from tests.factories import CompanyFactory, IssueFactory, MembershipFactory, RunFactory

PR = {"kind": "pull_request", "title": "Fix the config loader", "url": "https://github.com/o/r/pull/12",
      "externalId": "12", "status": "open"}


def url(issue):
    return f"/api/issues/{issue.pk}/work-products"


def test_an_agent_records_a_pull_request_and_anyone_in_the_company_lists_it(agent_client, company, issue):
    issue.assignee_agent = agent_client.agent  # its own task's work (another agent's: 403, see test_fences)
    issue.save(update_fields=["assignee_agent"])
    created = agent_client.post(url(issue), PR, format="json")
    assert created.status_code == 201
    body = created.json()
    assert (body["kind"], body["title"], body["url"], body["externalId"], body["status"]) == (
        "pull_request", "Fix the config loader", "https://github.com/o/r/pull/12", "12", "open")
    assert body["runId"] == str(agent_client.run.pk) and body["issueId"] == str(issue.pk)
    viewer = APIClient()
    viewer.force_login(MembershipFactory(company=company, role="viewer").user)
    listed = viewer.get(url(issue))
    assert listed.status_code == 200 and [w["id"] for w in listed.json()] == [body["id"]]
    audit = ActivityLog.objects.get(action="work_product.created")
    assert audit.details["workProductId"] == body["id"] and audit.entity_id == str(issue.pk)
    assert audit.actor_type == "agent"


def test_board_users_with_a_write_role_record_by_identifier_viewers_cannot(board_client, company, issue):
    created = board_client.post(f"/api/issues/{issue.identifier}/work-products",
                                {"kind": "branch", "externalId": "fix/config-loader"}, format="json")
    assert created.status_code == 201 and created.json()["runId"] is None
    viewer = APIClient()
    viewer.force_login(MembershipFactory(company=company, role="viewer").user)
    refused = viewer.post(url(issue), PR, format="json")
    assert refused.status_code == 403
    assert WorkProduct.objects.filter(issue=issue).count() == 1


@pytest.mark.parametrize("payload, field", [
    ({"kind": "commit", "url": "https://x.test/c/1"}, "kind"),
    ({"kind": "artifact", "url": "javascript:alert(1)"}, "url"),
    ({"kind": "artifact", "url": "not a url"}, "url"),
    ({"kind": "document", "title": "nowhere"}, "url"),
    ({"kind": "artifact", "url": "https://x.test/a", "status": "s" * 33}, "status"),
    ({"kind": "artifact", "url": "https://x.test/a", "colour": "red"}, "colour"),
    ({"url": "https://x.test/a"}, "kind"),
])
def test_invalid_work_products_are_400_naming_the_field(board_client, issue, payload, field):
    response = board_client.post(url(issue), payload, format="json")
    assert response.status_code == 400
    assert field in response.json()["details"]
    assert not WorkProduct.objects.exists()


def test_another_companys_issue_is_404_for_agents_and_board_users(agent_client, board_client):
    other = IssueFactory(company=CompanyFactory())
    for client in (agent_client, board_client):
        assert client.post(url(other), PR, format="json").status_code == 404
        assert client.get(url(other)).status_code == 404
    assert not WorkProduct.objects.exists()


def test_an_agent_needs_the_checkout_run_while_the_issue_is_in_progress(agent_client, company):
    issue = IssueFactory(company=company, assignee_agent=agent_client.agent)
    owner_run = RunFactory(agent=agent_client.agent, issue=issue)
    issue_update(actor=SYSTEM, issue=issue, changes={"status": "in_progress"})
    issue.__class__.objects.filter(pk=issue.pk).update(checkout_run=owner_run, execution_run=owner_run)
    refused = agent_client.post(url(issue), PR, format="json")
    assert refused.status_code == 409 and refused.json()["code"] == "not_checkout_owner"
    agent_client.use_run(owner_run)
    assert agent_client.post(url(issue), PR, format="json").status_code == 201


def test_an_agent_mutation_without_a_run_header_is_refused(make_agent_client, company):
    client = make_agent_client(company=company, with_run=False)
    # Run-scoped on the agent's own in_progress issue only (ref §2.3).
    issue = IssueFactory(company=company, assignee_agent=client.agent, status="in_progress")
    response = client.post(url(issue), PR, format="json")
    assert response.status_code == 401 and response.json()["code"] == "run_id_required"
    assert not WorkProduct.objects.exists()
