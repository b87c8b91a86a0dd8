"""The cases and connectors admins write through the services and keep rows in their company: a
case's facts go through ``case_update`` (its status, task and links are not edited here), workflow
definitions through their create/update services, links are shown only, and a connector's project,
goal, triage agent and rule targets are its company's."""
import re

import pytest
from django.urls import reverse

from cases.models import CaseEvent, WorkflowDefinition
from cases.services import case_create, workflow_definition_create
from connectors.models import Intervention, RoutingRule, TaskLink
from connectors.services.instances import instance_create
from issues.actors import SYSTEM
from issues.models import ActivityLog
from tests.factories import AgentFactory, CompanyFactory, IssueFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def referenced_secrets(monkeypatch):
    monkeypatch.setenv("PAPERCLIP_SECRET_GH_TOKEN_FOR_TESTS", "test-token")


@pytest.fixture
def company(db):
    return CompanyFactory(name="Acme", enable_cases=True)


def inline_data(client, url) -> dict:
    page = client.get(url).content.decode()
    return dict(re.findall(r'<input type="hidden" name="([\w-]+-(?:TOTAL|INITIAL|MIN_NUM|MAX_NUM)_FORMS)"'
                           r'[^>]*value="(\d*)"', page))


# --- cases and workflow definitions ------------------------------------------------------------------


def test_a_cases_facts_change_through_the_service(admin_client, admin_user, company):
    case, _ = case_create(actor=SYSTEM, company=company, case_type="refund", title="Refund #1", kickoff="k",
                          workflow_document_text="w")
    url = reverse("admin:cases_case_change", args=[case.pk])
    page = admin_client.get(url).content.decode()
    assert 'name="title"' in page
    assert not re.search(r'name="(status|phase|company|primary_task|project|parent|caselink_set-0-issue)"', page)
    data = {"title": "Refund #1 (urgent)", "summary": "Customer waited", "fields": '{"amount": 12}'}
    data.update(inline_data(admin_client, url))
    response = admin_client.post(url, data, follow=True)
    assert "was changed successfully" in response.content.decode()
    case.refresh_from_db()
    assert (case.title, case.summary, case.fields) == ("Refund #1 (urgent)", "Customer waited", {"amount": 12})
    assert case.status == "draft"
    event = CaseEvent.objects.filter(case=case, kind="updated").latest("created_at")
    assert event.details["changes"] == ["fields", "summary", "title"]
    assert ActivityLog.objects.get(action="case.updated", entity_id=str(case.pk)).actor_user == admin_user


def test_cases_and_their_links_are_not_added_in_the_admin(admin_client):
    assert admin_client.get(reverse("admin:cases_case_add")).status_code == 403
    assert admin_client.get(reverse("admin:cases_caseissuelink_add")).status_code == 403


def test_workflow_definitions_are_written_by_their_services(admin_client, admin_user, company):
    definition = workflow_definition_create(actor=SYSTEM, company=company, name="Review", prompt="v1")
    workflow_definition_create(actor=SYSTEM, company=company, name="Triage", prompt="t")
    url = reverse("admin:cases_workflowdefinition_change", args=[definition.pk])
    assert not re.search(r'name="company"', admin_client.get(url).content.decode())
    response = admin_client.post(url, {"name": "Review", "description": "", "prompt": "v2"}, follow=True)
    assert "was changed successfully" in response.content.decode()
    before = definition.fingerprint
    definition.refresh_from_db()
    assert definition.prompt == "v2" and definition.fingerprint != before
    entry = ActivityLog.objects.get(action="workflow_definition.updated", entity_id=str(definition.pk))
    assert entry.actor_user == admin_user
    taken = admin_client.post(url, {"name": "triage", "description": "", "prompt": "v2"}, follow=True)
    assert "Not saved" in taken.content.decode()
    definition.refresh_from_db()
    assert definition.name == "Review"


def test_a_workflow_definition_added_in_the_admin_is_audited(admin_client, admin_user, company):
    response = admin_client.post(reverse("admin:cases_workflowdefinition_add"),
                                 {"company": str(company.pk), "name": "Onboarding", "description": "", "prompt": "Go"},
                                 follow=True)
    assert "was added successfully" in response.content.decode()
    definition = WorkflowDefinition.objects.get(company=company, name="Onboarding")
    assert definition.fingerprint
    assert ActivityLog.objects.get(action="workflow_definition.created",
                                   entity_id=str(definition.pk)).actor_user == admin_user


# --- connectors ----------------------------------------------------------------------------------------


@pytest.fixture
def instance(company):
    return instance_create(actor=SYSTEM, company=company, name="GitHub", provider_key="github_issues",
                           credentials="env:PAPERCLIP_SECRET_GH_TOKEN_FOR_TESTS", containers=["demo/app"])


def test_links_are_shown_not_edited(admin_client, instance):
    issue = IssueFactory(company=instance.company)
    link = TaskLink.objects.create(company=instance.company, instance=instance, provider_key=instance.provider_key,
                                   issue=issue, external_task_id="demo/app#1", external_key="demo/app#1",
                                   external_title="Task 1", external_state_name="open",
                                   external_state_category="active", status="healthy")
    assert admin_client.get(reverse("admin:connectors_tasklink_add")).status_code == 403
    page = admin_client.get(reverse("admin:connectors_tasklink_change", args=[link.pk])).content.decode()
    assert not re.search(r'<(input|select)[^>]+name="(status|issue|instance|company)"', page)
    admin_client.post(reverse("admin:connectors_tasklink_change", args=[link.pk]), {"status": "unlinked"})
    link.refresh_from_db()
    assert link.status == "healthy"


def instance_form_data(client, url, **changes) -> dict:
    """What a browser posts back for the connector's change form: every field as shown, then ``changes``."""
    form = client.get(url).context["adminform"].form
    data = {}
    for name, field in form.fields.items():
        value = field.prepare_value(form.initial.get(name))
        if isinstance(value, bool):
            if value:
                data[name] = "on"
        elif value is not None:
            data[name] = value
    data.update(inline_data(client, url))
    data.update(changes)
    return data


def test_a_connector_keeps_its_company_and_refers_only_to_its_own(admin_client, instance):
    url = reverse("admin:connectors_connectorinstance_change", args=[instance.pk])
    page = admin_client.get(url).content.decode()
    assert 'name="name"' in page
    assert not re.search(r'<(input|select)[^>]+name="(company|provider_key|status|webhook_registrations)"', page)
    assert admin_client.get(reverse("admin:connectors_connectorinstance_add")).status_code == 403
    foreign = AgentFactory(company=CompanyFactory())
    response = admin_client.post(url, instance_form_data(admin_client, url, triage_agent=str(foreign.pk)))
    assert response.status_code == 200  # the form again, with the error
    assert "Must belong to the same company" in response.content.decode()
    instance.refresh_from_db()
    assert instance.triage_agent_id is None


def test_connector_settings_change_through_the_service(admin_client, admin_user, instance):
    url = reverse("admin:connectors_connectorinstance_change", args=[instance.pk])
    response = admin_client.post(url, instance_form_data(admin_client, url, poll_interval_seconds="120"),
                                 follow=True)
    assert "was changed successfully" in response.content.decode(), [str(m) for m in response.context["messages"]]
    instance.refresh_from_db()
    assert instance.poll_interval_seconds == 120
    entry = ActivityLog.objects.get(action="connector.updated", entity_id=str(instance.pk))
    assert entry.details["fields"] == ["poll_interval_seconds"] and entry.actor_user == admin_user
    # the service's validation: a state mapping naming no Paperclip status is refused, nothing saved
    bad = admin_client.post(url, instance_form_data(admin_client, url, state_mapping='{"open": "nonsense"}',
                                                    poll_interval_seconds="60"), follow=True)
    assert "Not saved" in bad.content.decode()
    instance.refresh_from_db()
    assert instance.poll_interval_seconds == 120


def test_a_secret_reference_changed_in_the_admin_is_a_rotation(admin_client, instance, monkeypatch):
    monkeypatch.setenv("PAPERCLIP_SECRET_GH_TOKEN_NEXT", "next-token")
    url = reverse("admin:connectors_connectorinstance_change", args=[instance.pk])
    response = admin_client.post(url, instance_form_data(admin_client, url,
                                                         credentials_ref="env:PAPERCLIP_SECRET_GH_TOKEN_NEXT"),
                                 follow=True)
    assert "was changed successfully" in response.content.decode(), [str(m) for m in response.context["messages"]]
    instance.refresh_from_db()
    assert instance.credentials_ref == "env:PAPERCLIP_SECRET_GH_TOKEN_NEXT"
    rotation = Intervention.objects.get(instance=instance, action="credentials.rotate")
    assert rotation.result == {"rotated": ["credentials"]}


def test_pausing_a_connector_in_the_admin_is_an_intervention(admin_client, admin_user, instance):
    response = admin_client.post(reverse("admin:connectors_connectorinstance_changelist"),
                                 {"action": "pause_connectors", "_selected_action": [str(instance.pk)]}, follow=True)
    assert "GitHub paused." in response.content.decode(), [str(m) for m in response.context["messages"]]
    instance.refresh_from_db()
    assert instance.status == "paused"
    assert Intervention.objects.get(instance=instance, action="instance.pause").actor_user == admin_user


def test_a_routing_rule_targets_an_agent_of_the_connectors_company(admin_client, instance):
    foreign = AgentFactory(company=CompanyFactory())
    response = admin_client.post(reverse("admin:connectors_routingrule_add"), {
        "instance": str(instance.pk), "order": "1", "kind": "label", "match": '{"label": "backend"}',
        "target_agent": str(foreign.pk), "target_alias": "", "enabled": "on"})
    assert "Must belong to the same company" in response.content.decode()
    assert not RoutingRule.objects.filter(instance=instance).exists()


def test_a_rule_added_on_the_connector_page_targets_an_agent_of_its_company(admin_client, instance):
    foreign = AgentFactory(company=CompanyFactory())
    url = reverse("admin:connectors_connectorinstance_change", args=[instance.pk])
    data = instance_form_data(admin_client, url)
    data.update({"routing_rules-TOTAL_FORMS": "1", "routing_rules-0-order": "1", "routing_rules-0-kind": "label",
                 "routing_rules-0-match": '{"label": "backend"}', "routing_rules-0-target_agent": str(foreign.pk),
                 "routing_rules-0-target_alias": "", "routing_rules-0-enabled": "on"})
    response = admin_client.post(url, data)
    assert response.status_code == 200 and "Must belong to the same company" in response.content.decode()
    assert not RoutingRule.objects.filter(instance=instance).exists()
