"""Capabilities are consumed (§5.2, §8.2, issue #16): routing rules of a kind the provider's adapter does
not declare are refused on every path that writes them (API, configuration import, management
commands, Django admin) with the offending key named; the console hides what a provider cannot do and
says why; the ``/paperclip`` verbs the parser accepts are the ones the capability metadata lists;
``custom_field`` routing works on real Jira payloads (custom fields by id, over real HTTP against the
Jira sandbox) and is not declared where payloads carry none (Linear, GitHub)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.forms import inlineformset_factory
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from connectors import sandbox as sandbox_pkg
from connectors.admin import RoutingRuleInlineFormSet
from connectors.models import Conflict, ConnectorInstance, Intervention, RoutingRule, TaskLink
from connectors.providers.base import AdapterConfig, Capabilities, StateCategory, WebhookRequest, _REGISTRY, register
from connectors.providers.base import adapter_class, provider_keys
from connectors.providers.custom_fields import field_text
from connectors.providers.jira import JiraAdapter
from connectors.sandbox.jira import sign as jira_sign
from connectors.services import polling, routing
from connectors.services.commands import VERBS
from connectors.services.instances import instance_create
from issues.actors import SYSTEM
from issues.exceptions import InvalidInput
from issues.models import Comment
from tests.connector_factories import SECRET, STATE_MAPPING, make_instance
from tests.connector_fakes import FakeStore, FakeTrackerAdapter
from tests.connector_helpers import delivery_headers, post_webhook
from tests.factories import AgentFactory, MembershipFactory
from tests.jira_sandbox import DEFAULT_STATE_MAPPING as JIRA_MAPPING
from tests.jira_sandbox import SANDBOX_PROJECT, SANDBOX_WEBHOOK_SECRET
from tests.test_errors import assert_error

REAL_FIXTURES = Path(sandbox_pkg.__file__).resolve().parent / "fixtures"  # the real payloads, copied unchanged


def client_for(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


@pytest.fixture
def owner(company):
    return MembershipFactory(company=company, role="owner").user


def github_body(**extra) -> dict:
    body = {"name": "GitHub", "provider": "github_issues", "baseUrl": "https://api.github.com",
            "containers": ["octo/app"], "credentials": {"value": "gh-token"}, "webhookSecret": {"value": "s"}}
    body.update(extra)
    return body


def rule_reasons(response, index=0) -> dict:
    return response.json()["details"]["routingRules"][index]


# --- 1. routing rule kinds the adapter does not declare are refused -----------------------------------
def test_the_api_refuses_a_routing_rule_kind_the_provider_does_not_support(company, owner):
    api = client_for(owner)
    response = api.post(f"/api/companies/{company.pk}/connectors", github_body(routingRules=[
        {"kind": "label", "match": {"label": "pc:agent/*"}},
        {"kind": "custom_field", "match": {"field": "Paperclip Agent"}}]), format="json")
    assert_error(response, 400, "validation_error", fields=["routingRules"])
    assert rule_reasons(response, 0) == {}  # the valid rule is not blamed
    [reason] = rule_reasons(response, 1)["kind"]
    assert "github_issues connector does not support custom_field" in reason and "label" in reason
    assert not ConnectorInstance.objects.exists()  # nothing half-created

    created = api.post(f"/api/companies/{company.pk}/connectors", github_body(), format="json")
    assert created.status_code == 201, created.content
    instance_id = created.json()["id"]
    patch = api.patch(f"/api/connectors/{instance_id}", {"routingRules": [
        {"kind": "custom_field", "match": {"field": "customfield_10010"}}]}, format="json")
    assert_error(patch, 400, "validation_error", fields=["routingRules"])
    assert not RoutingRule.objects.filter(instance_id=instance_id).exists()


def test_linear_declares_no_custom_field_routing_because_its_payloads_carry_none(company, owner):
    # Every real Linear payload: issue data has labels, states, assignees — no custom field at all.
    for path in sorted((REAL_FIXTURES / "linear").glob("*.json")):
        data = json.loads(path.read_text()).get("data") or {}
        assert not [key for key in data if "custom" in key.lower()], path.name
    assert "custom_field" not in adapter_class("linear").capabilities.routing_rule_kinds
    assert "custom_field" not in adapter_class("github_issues").capabilities.routing_rule_kinds
    api = client_for(owner)
    response = api.post(f"/api/companies/{company.pk}/connectors", {
        "name": "Linear", "provider": "linear", "containers": ["ENG"], "credentials": {"value": "lin_api_x"},
        "webhookSecret": {"value": "s"}, "routingRules": [{"kind": "custom_field", "match": {"field": "x"}}]},
        format="json")
    assert_error(response, 400, "validation_error", fields=["routingRules"])
    assert "linear connector does not support custom_field" in rule_reasons(response)["kind"][0]


def test_jira_custom_field_rules_name_the_field_by_id(company):
    fields = dict(provider_key="jira", base_url="https://acme.atlassian.net", containers=["ABC"],
                  webhook_secret={"value": "s"})
    with pytest.raises(InvalidInput) as refused:
        instance_create(actor=SYSTEM, company=company, name="jira by name", **fields,
                        routing_rules=[{"kind": "custom_field", "match": {"field": "Paperclip Agent"}}])
    [reason] = refused.value.details["routingRules"][0]["match.field"]
    assert "by id (e.g. customfield_10010)" in reason
    with pytest.raises(InvalidInput) as empty:  # a rule the kind cannot read is refused for any provider
        instance_create(actor=SYSTEM, company=company, name="jira empty", **fields,
                        routing_rules=[{"kind": "label", "match": {}}])
    assert "match.label" in empty.value.details["routingRules"][0]
    ok = instance_create(actor=SYSTEM, company=company, name="jira by id", **fields,
                         routing_rules=[{"kind": "custom_field", "match": {"field": "customfield_10010"}}])
    assert list(ok.routing_rules.values_list("kind", flat=True)) == ["custom_field"]


def test_the_configuration_import_and_the_commands_refuse_it_too(company, tmp_path):
    document = {"format": "paperclip.connector/1", "connector": {
        "name": "imported", "provider": "github_issues", "baseUrl": "https://api.github.com",
        "containers": ["octo/app"], "routingRules": [{"kind": "custom_field", "match": {"field": "Agent"}}]}}
    path = tmp_path / "connector.json"
    path.write_text(json.dumps(document))
    with pytest.raises(CommandError, match="does not support custom_field"):
        call_command("connector_import", str(path), company=company.issue_prefix)
    config = json.dumps({"containers": ["octo/app"], "baseUrl": "https://api.github.com",
                         "routingRules": [{"kind": "custom_field", "match": {"field": "Agent"}}]})
    with pytest.raises(CommandError, match="does not support custom_field"):
        call_command("connector_create", company=company.issue_prefix, provider="github", name="cli", config=config)
    assert not ConnectorInstance.objects.exists()


@pytest.fixture
def fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def test_the_django_admin_forms_refuse_it(company, admin_client, fast_password_hashing):
    instance = instance_create(actor=SYSTEM, company=company, name="gh", provider_key="github_issues",
                               base_url="https://api.github.com", containers=["octo/app"])
    response = admin_client.post(reverse("admin:connectors_routingrule_add"), {
        "instance": str(instance.pk), "order": "0", "kind": "custom_field", "match": '{"field": "Agent"}',
        "target_alias": "", "enabled": "on", "description": ""})
    assert response.status_code == 200  # the form again, with the error
    assert "does not support custom_field" in response.content.decode()
    assert not RoutingRule.objects.exists()
    # the inline on the connector's own page (the formset the admin builds for it)
    Formset = inlineformset_factory(ConnectorInstance, RoutingRule, formset=RoutingRuleInlineFormSet,
                                    fields=("order", "kind", "match", "target_agent", "target_alias", "enabled"))
    prefix = Formset.get_default_prefix()
    data = {f"{prefix}-TOTAL_FORMS": "2", f"{prefix}-INITIAL_FORMS": "0",
            f"{prefix}-0-order": "0", f"{prefix}-0-kind": "label", f"{prefix}-0-match": '{"label": "bug"}',
            f"{prefix}-1-order": "1", f"{prefix}-1-kind": "custom_field", f"{prefix}-1-match": '{"field": "x"}'}
    formset = Formset(data, instance=instance)
    assert not formset.is_valid()
    assert formset.forms[0].errors == {} and "does not support custom_field" in str(formset.forms[1].errors["kind"])
    data[f"{prefix}-1-kind"], data[f"{prefix}-1-match"] = "state_lane", '{"state": "In Review"}'
    assert Formset(data, instance=instance).is_valid()


def test_a_stored_rule_of_an_undeclared_kind_never_routes(company):
    triage, fixer = AgentFactory(company=company, name="triage"), AgentFactory(company=company, name="fixer")
    instance = instance_create(actor=SYSTEM, company=company, name="gh", provider_key="github_issues",
                               base_url="https://api.github.com", containers=["octo/app"], triage_agent_id=triage.pk)
    # a row written before the check existed (or by raw SQL): the pipeline leaves it out
    RoutingRule.objects.create(instance=instance, kind="custom_field", match={"field": "x"}, target_agent=fixer)
    assert routing.rules_for(instance) == []


# --- 2. the console hides what a provider cannot do ---------------------------------------------------
READ_ONLY = "fake_read_only"


class ReadOnlyTracker(FakeTrackerAdapter):
    """The fake tracker without any optional write, and without re-reading a single task."""

    provider_key = READ_ONLY
    capabilities = Capabilities(
        operations=frozenset({"list_candidate_tasks", "get_task_states", "list_comments", "verify_webhook"}),
        state_categories=frozenset(StateCategory.ALL), signed_webhooks=True,
        routing_rule_kinds=frozenset({"label", "default_route"}))


if READ_ONLY not in _REGISTRY:
    register(ReadOnlyTracker)


def console_world(company, provider, capture):
    """An imported task of ``provider`` (a fake tracker) with a field conflict, and an operator's client."""
    coder = AgentFactory(company=company, name="coder")
    store = FakeStore()
    instance = instance_create(actor=SYSTEM, company=company, name=provider, provider_key=provider,
                               credentials={"value": "fake-token"}, webhook_secret={"value": SECRET},
                               base_url=store.base_url, containers=[store.container], state_mapping=STATE_MAPPING,
                               service_account_id="paperclip-bot", default_sync_mode="bidirectional",
                               routing_rules=[{"kind": "default_route", "agentId": coder.pk}])
    raw = store.add_task(1, title="Printer on fire")
    body, _ = store.delivery("task", raw["id"])
    assert post_webhook(APIClient(), instance, body, capture=capture).status_code == 202
    link = TaskLink.objects.get(instance=instance)
    conflict = Conflict.objects.create(company=company, instance=instance, link=link, kind="field", field="title",
                                       base_value="a", external_value="b", paperclip_value="c")
    operator = MembershipFactory(company=company, role="operator").user
    client = Client()
    client.force_login(operator)
    return instance, link, conflict, client


def test_the_console_hides_actions_and_toggles_a_provider_cannot_honour(company, fast_password_hashing,
                                                                        django_capture_on_commit_callbacks):
    instance, link, conflict, client = console_world(company, READ_ONLY, django_capture_on_commit_callbacks)
    issue_page = client.get(reverse("console:issue-detail", args=[link.issue.identifier])).content.decode()
    assert 'id="link-panel"' in issue_page and "Resync now" not in issue_page  # it cannot read a task back
    assert reverse("connectors_console:link-action", args=[link.pk, "pause"]) in issue_page  # Paperclip-side: kept
    refused = client.post(reverse("connectors_console:link-action", args=[link.pk, "resync"]),
                          {"idempotency_key": "r1"}, follow=True)
    assert "cannot read a task again" in refused.content.decode()
    assert not Intervention.objects.filter(action="link.resync").exists()

    health = client.get(reverse("connectors_console:instance-detail", args=[instance.pk])).content.decode()
    caps = health[health.index('id="capabilities"'):]
    assert "project Paperclip status" in caps and "export Paperclip issues as new tasks" in caps
    start = caps.index('id="caps-write-toggles"')
    writes = caps[start:caps.index("</dd>", start)]
    assert "projectStatus" not in writes and "postBacklink" not in writes  # toggles it cannot honour: hidden
    assert "toggles without effect: " in caps and "projectStatus" in caps
    assert "/paperclip assign" in caps  # the command verbs, from the capability metadata

    queue = client.get(reverse("connectors_console:conflict-list")).content.decode()
    card = queue[queue.index(f'id="conflict-{conflict.pk}"'):]
    assert 'value="keep_paperclip"' not in card and 'value="keep_external"' in card
    assert f"The {READ_ONLY} connector cannot write fields" in card


def test_a_provider_that_can_write_keeps_every_action(company, fast_password_hashing,
                                                      django_capture_on_commit_callbacks):
    instance, link, conflict, client = console_world(company, "fake_tracker", django_capture_on_commit_callbacks)
    issue_page = client.get(reverse("console:issue-detail", args=[link.issue.identifier])).content.decode()
    assert "Resync now" in issue_page
    health = client.get(reverse("connectors_console:instance-detail", args=[instance.pk])).content.decode()
    writes = health[health.index('id="caps-write-toggles"'):]
    assert "postBacklink: on" in writes[:writes.index("</dd>")]
    # the fake tracker writes comments and backlinks but no fields: Keep Paperclip is replaced by the reason
    queue = client.get(reverse("connectors_console:conflict-list")).content.decode()
    assert "cannot write fields" in queue
    object.__setattr__(FakeTrackerAdapter.capabilities, "operations",
                       FakeTrackerAdapter.capabilities.operations | {"set_fields"})
    try:
        queue = client.get(reverse("connectors_console:conflict-list")).content.decode()
    finally:
        object.__setattr__(FakeTrackerAdapter.capabilities, "operations",
                           FakeTrackerAdapter.capabilities.operations - {"set_fields"})
    assert 'value="keep_paperclip"' in queue and "cannot write fields" not in queue


# --- 3. the command verbs are the capability metadata's --------------------------------------------------
def test_every_provider_lists_exactly_the_verbs_the_parser_accepts(company, owner,
                                                                   django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    for key in provider_keys():
        assert adapter_class(key).capabilities.as_dict()["commandVerbs"] == list(VERBS), key
    assert VERBS == ("assign", "status", "pause", "resume")  # §8.2 minimum verbs
    instance, store = make_instance(company, rules=[{"kind": "default_route"}],
                                    triage_agent_id=AgentFactory(company=company).pk)
    api = client_for(owner)
    listed = api.get(f"/api/connectors/{instance.pk}").json()["capabilities"]["commandVerbs"]
    assert api.get(f"/api/connectors/{instance.pk}/health").json()["capabilities"]["commandVerbs"] == listed
    # an unknown verb is rejected with the same list (the reply lands on the issue: import-only link)
    raw = store.add_task(1)
    post_webhook(APIClient(), instance, store.delivery("task", raw["id"])[0], capture=capture)
    comment = store.add_comment(raw["id"], "/paperclip frobnicate now")
    assert post_webhook(APIClient(), instance, store.delivery("comment", raw["id"], comment=comment)[0],
                        capture=capture).status_code == 202
    link = TaskLink.objects.get(instance=instance)
    reply = Comment.objects.get(issue=link.issue, provenance__kind="command_reply")
    assert f"use one of: {', '.join(listed)}" in reply.body


# --- 4. custom_field routing on real Jira payloads ---------------------------------------------------------
def jira_fixture(name: str) -> bytes:
    return (REAL_FIXTURES / "jira" / f"{name}.json").read_bytes()


def test_custom_field_values_as_trackers_send_them():
    assert field_text({"self": "https://x/rest/api/2/customFieldOption/10100", "value": "CodexCoder",
                       "id": "10100"}) == "CodexCoder"  # a select list option
    assert field_text([{"value": "qa"}, {"value": "CodexCoder"}]) == ["qa", "CodexCoder"]  # multi-select
    assert field_text({"accountId": "5b10", "displayName": "Ada Lovelace"}) == "Ada Lovelace"  # user picker
    assert field_text({"type": "doc", "version": 1, "content": [{"type": "paragraph", "content": [
        {"type": "text", "text": "CodexCoder"}]}]}) == "CodexCoder"  # a paragraph field (ADF)
    assert field_text(3.0) == "3" and field_text("  ") is None and field_text(None) is None and field_text([]) is None


def test_the_real_jira_payload_routes_by_custom_field_id(company):
    """zulip_issue_created.json, unchanged: its customfield_10000 is null, so a rule on it does not match
    and the pipeline goes on; with the id in the adapter's configuration the envelope carries the field."""
    body = jira_fixture("zulip_issue_created")
    adapter = JiraAdapter(AdapterConfig(base_url="https://example.atlassian.net", containers=("BUG",),
                                        state_mapping=JIRA_MAPPING, webhook_secret="s",
                                        custom_fields=("customfield_10000",)))
    task = adapter.verify_webhook(WebhookRequest(body, {"x-hub-signature": jira_sign("s", body)})).task
    assert task.envelope["customFields"] == {}  # null is no value
    coder, fallback = AgentFactory(company=company, name="CodexCoder"), AgentFactory(company=company, name="dflt")
    instance = instance_create(actor=SYSTEM, company=company, name="jira", provider_key="jira",
                               base_url="https://example.atlassian.net", containers=["BUG"],
                               webhook_secret={"value": "s"}, routing_rules=[
                                   {"kind": "custom_field", "match": {"field": "customfield_10000"}},
                                   {"kind": "default_route", "agentId": fallback.pk}])
    decision = routing.routing_resolve(instance=instance, task=task)
    assert (decision.kind, decision.agent) == ("default_route", fallback)
    # the same payload as Jira sends it for a select list set to an agent's name
    payload = json.loads(body)
    payload["issue"]["fields"]["customfield_10000"] = {"value": "CodexCoder", "id": "10100"}
    raw = json.dumps(payload).encode()
    task = adapter.verify_webhook(WebhookRequest(raw, {"x-hub-signature": jira_sign("s", raw)})).task
    assert task.envelope["customFields"] == {"customfield_10000": "CodexCoder"}
    decision = routing.routing_resolve(instance=instance, task=task)
    assert (decision.kind, decision.agent) == ("custom_field", coder)


def forward(sandbox, instance, capture, start: int) -> int:
    for delivery in sandbox.deliveries[start:]:
        headers = delivery_headers(delivery)
        with capture(execute=True):
            response = APIClient().post(f"/api/connectors/{instance.pk}/webhook", data=delivery.body,
                                        content_type="application/json", **headers)
        assert response.status_code == 202, response.content
    return len(sandbox.deliveries)


def test_jira_custom_field_routing_over_real_http(company, jira_sandbox, monkeypatch,
                                                  django_capture_on_commit_callbacks):
    """A select list "Paperclip Agent" (customfield_10010) routes at import, on a change, and the poll
    backstop reads the same field (requested by id) so nothing flaps between the two channels."""
    monkeypatch.setenv("PAPERCLIP_SECRET_CAPS_JIRA_CRED", jira_sandbox.credentials)
    monkeypatch.setenv("PAPERCLIP_SECRET_CAPS_JIRA_HOOK", SANDBOX_WEBHOOK_SECRET)
    coder, reviewer = AgentFactory(company=company, name="CodexCoder"), AgentFactory(company=company, name="Reviewer")
    triage = AgentFactory(company=company, name="triage")
    instance = instance_create(
        actor=SYSTEM, company=company, name="jira", provider_key="jira", base_url=jira_sandbox.base_url,
        containers=[SANDBOX_PROJECT], state_mapping=JIRA_MAPPING, triage_agent_id=triage.pk,
        credentials="env:PAPERCLIP_SECRET_CAPS_JIRA_CRED", webhook_secret="env:PAPERCLIP_SECRET_CAPS_JIRA_HOOK",
        service_account_id=jira_sandbox.service_user["accountId"],
        routing_rules=[{"kind": "custom_field", "match": {"field": "customfield_10010"}}])
    issue = jira_sandbox.create_issue("Flaky login", project=SANDBOX_PROJECT,
                                      custom={"customfield_10010": {"value": "CodexCoder", "id": "10100"}})
    seen = forward(jira_sandbox, instance, django_capture_on_commit_callbacks, 0)
    link = TaskLink.objects.get(instance=instance)
    assert link.issue.assignee_agent == coder and link.routing["kind"] == "custom_field"
    assert link.envelope["customFields"] == {"customfield_10010": "CodexCoder"}

    # the poll backstop asks Jira for the field by id and finds the same value: no re-route, no conflict
    with django_capture_on_commit_callbacks(execute=True):
        polling.instance_poll(instance_id=instance.pk)
    searches = jira_sandbox.requests_to(r"/search/jql$")
    assert searches and all("customfield_10010" in (r.body or {}).get("fields", []) for r in searches)
    link.refresh_from_db()
    assert link.envelope["customFields"] == {"customfield_10010": "CodexCoder"}
    assert link.issue.assignee_agent == coder and not Conflict.objects.exists()

    jira_sandbox.update_issue(issue["key"], customfield_10010={"value": "Reviewer", "id": "10101"})
    forward(jira_sandbox, instance, django_capture_on_commit_callbacks, seen)
    link.refresh_from_db()
    assert link.issue.assignee_agent == reviewer and link.routing["agentName"] == "Reviewer"


def test_capabilities_payload_is_complete_for_every_provider():
    keys = {"operations", "stateCategories", "signedWebhooks", "routingRuleKinds", "hasExternalKeys",
            "settableFields", "commandVerbs"}
    for key in provider_keys():
        assert set(adapter_class(key).capabilities.as_dict()) == keys, key
