"""``DELETE /api/companies/{id}`` (upstream §5.9, board only, ``{ok: true}``): an owner deletes an
archived company with everything in it — threads, files, agents, runs, cases, connectors — and the
server log keeps the record; nothing is deleted for another role, a company still active, or one
with a run still ending. Another company stays whole."""
import logging

from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from cases.models import Case as CaseRecord
from cases.services import case_create
from connectors.models import ConnectorInstance, TaskLink
from issues.actors import SYSTEM, Actor
from issues.models import ActivityLog, Agent, Asset, Attachment, Company, HeartbeatRun, Interaction, Issue
from issues.models.attachment import attachment_storage
from issues.services.assets import company_logo_upload
from issues.services.attachments import attachment_create
from issues.services.thread import comment_create, document_write, interaction_create
from tests.attachment_files import a_file
from tests.connector_factories import make_instance
from tests.factories import AgentFactory, CompanyFactory, IssueFactory, MembershipFactory, RunFactory
from tests.test_errors import assert_error


def client_with(company, role):
    client = APIClient()
    client.force_login(MembershipFactory(company=company, role=role).user)
    return client


def archive(client, company):
    response = client.post(f"/api/companies/{company.pk}/archive")
    assert response.status_code == 200, response.content


def populate(company):
    """A company with a bit of everything that hangs off it."""
    agent = AgentFactory(company=company, name="worker")
    issue = IssueFactory(company=company, assignee_agent=agent)
    comment_create(actor=Actor(agent=agent), issue=issue, body="On it")
    document_write(actor=SYSTEM, issue=issue, key="plan", body="1. Fix")
    interaction_create(actor=SYSTEM, issue=issue, kind="request_confirmation", title="Plan ok?", document_key="plan")
    attachment = attachment_create(actor=SYSTEM, issue=issue, upload=a_file())
    logo = company_logo_upload(actor=SYSTEM, company=company, upload=a_file("logo.png"))
    RunFactory(agent=agent, issue=issue, status="succeeded", finished_at=timezone.now())
    instance, _ = make_instance(company)
    TaskLink.objects.create(company=company, instance=instance, provider_key=instance.provider_key, issue=issue,
                            external_task_id="T-1")
    return [attachment.object_key, logo.object_key]


def test_an_owner_deletes_an_archived_company_with_everything_in_it(
        company, django_capture_on_commit_callbacks, caplog):
    owner = client_with(company, "owner")
    keys = populate(company)
    company.enable_cases = True
    company.save()
    case_create(actor=SYSTEM, company=company, case_type="review", title="A case", kickoff="k",
                workflow_document_text="w")
    other = CompanyFactory()
    other_keys = populate(other)
    archive(owner, company)

    with django_capture_on_commit_callbacks(execute=True), caplog.at_level(logging.WARNING, "paperclip.audit"):
        response = owner.delete(f"/api/companies/{company.pk}")

    assert response.status_code == 200, response.content
    assert response.json() == {"ok": True}
    connection.check_constraints()
    assert not Company.objects.filter(pk=company.pk).exists()
    for model in (Issue, Agent, HeartbeatRun, Interaction, Attachment, Asset, ConnectorInstance, TaskLink,
                  CaseRecord, ActivityLog):
        assert not model.objects.filter(company_id=company.pk).exists(), model
    storage = attachment_storage()
    assert not any(storage.exists(key) for key in keys)
    assert all(storage.exists(key) for key in other_keys)
    assert Issue.objects.filter(company=other).count() == 1 and Agent.objects.filter(company=other).count() == 1
    assert f"company {company.pk}" in caplog.text and "deleted by user" in caplog.text
    assert_error(owner.get(f"/api/companies/{company.pk}"), 404)


def test_only_an_owner_deletes_and_only_an_archived_company(company, make_agent_client):
    populate(company)
    for role in ("admin", "operator", "viewer"):
        assert_error(client_with(company, role).delete(f"/api/companies/{company.pk}"), 403)
    ceo = make_agent_client(AgentFactory(company=company, role="ceo"))
    assert_error(ceo.delete(f"/api/companies/{company.pk}"), 403, "board_only")
    owner = client_with(company, "owner")
    error = assert_error(owner.delete(f"/api/companies/{company.pk}"), 409, "company_not_archived")
    assert error["details"]["status"] == ["active"]
    assert Company.objects.filter(pk=company.pk).exists() and Issue.objects.filter(company=company).exists()


def test_a_run_still_ending_holds_the_deletion(company):
    owner = client_with(company, "owner")
    archive(owner, company)
    ending = RunFactory(agent=AgentFactory(company=company), status="running", started_at=timezone.now())

    error = assert_error(owner.delete(f"/api/companies/{company.pk}"), 409, "company_run_active")

    assert error["details"]["liveRunIds"] == [str(ending.pk)]
    assert Company.objects.filter(pk=company.pk).exists()


def test_another_companys_owner_gets_a_404(company):
    stranger = client_with(CompanyFactory(), "owner")
    client_with(company, "owner").post(f"/api/companies/{company.pk}/archive")
    assert_error(stranger.delete(f"/api/companies/{company.pk}"), 404)
    assert Company.objects.filter(pk=company.pk).exists()


def test_the_admin_deletes_only_an_archived_company_through_the_same_rules(admin_client, company, caplog):
    from django.urls import reverse

    url = reverse("admin:issues_company_delete", args=[company.pk])
    assert admin_client.get(url).status_code == 403  # active
    changelist = admin_client.get(reverse("admin:issues_company_changelist")).content.decode()
    assert 'value="delete_selected"' not in changelist
    Company.objects.filter(pk=company.pk).update(status="archived")
    ending = RunFactory(agent=AgentFactory(company=company), status="running", started_at=timezone.now())
    assert admin_client.post(url, {"post": "yes"}).status_code == 403  # a run is still ending
    assert Company.objects.filter(pk=company.pk).exists()
    HeartbeatRun.objects.filter(pk=ending.pk).update(status="cancelled", finished_at=timezone.now())

    with caplog.at_level(logging.WARNING, "paperclip.audit"):
        response = admin_client.post(url, {"post": "yes"})

    assert response.status_code == 302
    assert not Company.objects.filter(pk=company.pk).exists() and f"company {company.pk}" in caplog.text
