"""Connectors API: instance CRUD (owners/admins), secrets never inline, health and link surfaces,
conflicts, events, interventions (idempotent, audit-logged) and the management commands."""
import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from rest_framework.test import APIClient

from connectors.models import ConnectorInstance, ConnectorSecret, InboundEvent, Intervention, TaskLink
from issues.models import ActivityLog
from tests.connector_factories import SECRET, STATE_MAPPING, make_instance
from tests.connector_fakes import PROVIDER, FakeStore
from tests.connector_helpers import post_webhook
from tests.factories import AgentFactory, MembershipFactory, ProjectFactory


def client_for(user):
    client = APIClient()
    client.force_login(user)
    return client


@pytest.fixture
def owner(company):
    return MembershipFactory(company=company, role="owner").user


@pytest.fixture
def api(owner):
    return client_for(owner)


def create_body(store, **extra):
    body = {"name": "Tracker", "provider": PROVIDER, "baseUrl": store.base_url, "containers": [store.container],
            "stateMapping": STATE_MAPPING, "credentials": {"value": "tok-123"}, "webhookSecret": {"value": SECRET}}
    body.update(extra)
    return body


def test_owner_creates_an_instance_with_encrypted_secrets(api, company):
    store = FakeStore()
    triage = AgentFactory(company=company)
    project = ProjectFactory(company=company)
    response = api.post(f"/api/companies/{company.pk}/connectors", create_body(
        store, triageAgentId=str(triage.pk), projectId=str(project.pk),
        routingRules=[{"kind": "label", "match": {"label": "pc:agent/*"}}]), format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["webhookUrl"].endswith(f"/api/connectors/{data['id']}/webhook")
    assert data["credentialsRef"].startswith("secret:") and "tok-123" not in response.content.decode()
    assert data["capabilities"]["signedWebhooks"] is True
    assert data["routingRules"][0]["kind"] == "label"
    instance = ConnectorInstance.objects.get(pk=data["id"])
    assert instance.triage_agent == triage and instance.project == project
    for row in ConnectorSecret.objects.all():
        assert "tok-123" not in row.ciphertext and SECRET not in row.ciphertext
    assert ActivityLog.objects.filter(action="connector.created", entity_id=str(instance.pk)).exists()


@pytest.mark.parametrize("body,field", [
    ({"credentials": "ghp_plaintexttoken"}, "credentials"),
    ({"config": {"apiToken": "x"}}, "config.apiToken"),
    ({"provider": "nope"}, "provider"),
    ({"defaultSyncMode": "sideways"}, "defaultSyncMode"),
    ({"unknownField": 1}, "unknownField"),
    ({"pollIntervalSeconds": 0}, "pollIntervalSeconds"),
])
def test_bad_instance_input_is_400_with_the_field(api, company, body, field):
    response = api.post(f"/api/companies/{company.pk}/connectors", create_body(FakeStore(), **body), format="json")
    assert response.status_code == 400, response.content
    details = response.json()["details"]
    assert any(k.startswith(field.split(".")[0]) or k == field for k in details), details
    assert not ConnectorInstance.objects.exists() and not ConnectorSecret.objects.exists()


def test_database_refuses_an_inline_secret(company):
    from django.db import IntegrityError

    instance, _ = make_instance(company)
    with pytest.raises(IntegrityError):
        ConnectorInstance.objects.filter(pk=instance.pk).update(credentials_ref="ghp_live_token_value")


@pytest.mark.parametrize("role,status", [("admin", 201), ("operator", 403), ("viewer", 403)])
def test_only_owners_and_admins_create(company, role, status):
    user = MembershipFactory(company=company, role=role).user
    response = client_for(user).post(f"/api/companies/{company.pk}/connectors", create_body(FakeStore()),
                                     format="json")
    assert response.status_code == status, response.content


def test_agents_cannot_use_the_connector_api(agent_client, company):
    instance, _ = make_instance(company)
    assert agent_client.get(f"/api/connectors/{instance.pk}").status_code == 403
    assert agent_client.get(f"/api/companies/{company.pk}/connectors").status_code == 403


def test_patch_replaces_rules_and_validates(api, company):
    instance, _ = make_instance(company)
    qa = AgentFactory(company=company)
    response = api.patch(f"/api/connectors/{instance.pk}", {
        "pollIntervalSeconds": 60, "routingAliases": {"qa": str(qa.pk)},
        "routingRules": [{"kind": "state_lane", "match": {"state": "review"}, "routingAlias": "qa"}]}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["pollIntervalSeconds"] == 60
    assert [r["routingAlias"] for r in response.json()["routingRules"]] == ["qa"]
    bad = api.patch(f"/api/connectors/{instance.pk}", {"routingAliases": {"qa": "not-an-agent"}}, format="json")
    assert bad.status_code == 400


def test_health_links_conflicts_and_events_surfaces(api, company, django_capture_on_commit_callbacks):
    instance, store = make_instance(company)
    raw = store.add_task(1)
    body, _ = store.delivery("task", raw["id"])
    post_webhook(APIClient(), instance, body, capture=django_capture_on_commit_callbacks)
    body, _ = store.delivery("task_deleted", raw["id"])
    post_webhook(APIClient(), instance, body, capture=django_capture_on_commit_callbacks)
    health = api.get(f"/api/connectors/{instance.pk}/health").json()
    for key in ("lastWebhookAt", "lastPollAt", "lastReconcileAt", "webhookVerified", "queueDepth", "retryCount",
                "conflictCount", "lastError", "status", "oldestPendingAgeSeconds", "retries", "errors", "cursors"):
        assert key in health
    assert health["webhookVerified"] is True and health["conflictCount"] == 1 and health["queueDepth"] == 0
    links = api.get(f"/api/connectors/{instance.pk}/links?status=conflict").json()
    assert len(links) == 1 and links[0]["externalKey"] == "acme/tracker#1"
    assert links[0]["claim"]["claimed"] is False and links[0]["routing"]["kind"] in ("triage", "none")
    assert api.get(f"/api/connectors/{instance.pk}/links?status=healthy").json() == []
    assert api.get(f"/api/connectors/{instance.pk}/links?status=bogus").status_code == 400
    detail = api.get(f"/api/connector-links/{links[0]['id']}").json()
    assert [t["to"] for t in detail["transitions"]] == ["healthy", "conflict"]  # imported links are born healthy
    assert detail["openConflicts"] == 1
    conflicts = api.get(f"/api/connectors/{instance.pk}/conflicts?kind=deletion").json()
    assert conflicts[0]["status"] == "open"
    events = api.get(f"/api/connectors/{instance.pk}/events").json()
    assert [e["status"] for e in events] == ["applied", "applied"]
    issue_links = api.get(f"/api/issues/{links[0]['issueIdentifier']}/connector-links").json()
    assert [l["id"] for l in issue_links] == [links[0]["id"]]


def test_interventions_are_idempotent_and_audited(api, owner, company, django_capture_on_commit_callbacks):
    instance, store = make_instance(company)
    raw = store.add_task(1)
    body, _ = store.delivery("task", raw["id"])
    post_webhook(APIClient(), instance, body, capture=django_capture_on_commit_callbacks)
    link = TaskLink.objects.get()
    url = f"/api/connector-links/{link.pk}"
    first = api.post(f"{url}/pause", {"idempotencyKey": "k-1", "reason": "noisy"}, format="json")
    again = api.post(f"{url}/pause", {"idempotencyKey": "k-1", "reason": "noisy"}, format="json")
    assert first.status_code == 200 and first.json()["replayed"] is False and again.json()["replayed"] is True
    assert ActivityLog.objects.filter(action="connector.link.pause").count() == 1
    log = ActivityLog.objects.get(action="connector.link.pause")
    assert log.actor_user == owner and log.details["idempotencyKey"] == "k-1"
    reused = api.post(f"{url}/resume", {"idempotencyKey": "k-1"}, format="json")
    assert reused.status_code == 409
    assert api.post(f"{url}/pause", {}, format="json").status_code == 400  # key required
    with django_capture_on_commit_callbacks(execute=True):
        assert api.post(f"{url}/resume", {"idempotencyKey": "k-2"}, format="json").json()["status"] == "healthy"
        assert api.post(f"{url}/resync", {"idempotencyKey": "k-3"}, format="json").status_code == 200
    assert InboundEvent.objects.filter(source="resync").count() >= 1
    assert api.post(f"{url}/unlink", {"idempotencyKey": "k-4"}, format="json").json()["status"] == "unlinked"
    link.refresh_from_db()
    assert link.status == "unlinked" and link.issue.status != "cancelled"
    assert TaskLink.objects.filter(pk=link.pk).exists()
    inst = f"/api/connectors/{instance.pk}"
    assert api.post(f"{inst}/pause", {"idempotencyKey": "k-5"}, format="json").json()["status"] == "paused"
    assert api.post(f"{inst}/resume", {"idempotencyKey": "k-6"}, format="json").json()["status"] == "active"
    rotated = api.post(f"{inst}/credentials", {"idempotencyKey": "k-7", "webhookSecret": {"value": "new-secret"}},
                       format="json")
    assert rotated.status_code == 200 and rotated.json()["rotated"] == ["webhook_secret"]
    assert Intervention.objects.count() == 7
    activity = api.get(f"{url}/activity").json()
    assert {"connector.task_imported", "connector.link.pause", "connector.link.unlink"} <= {a["action"] for a in activity}
    body, _ = store.delivery("task", raw["id"])
    assert post_webhook(APIClient(), instance, body).status_code == 401  # the old secret no longer works
    assert post_webhook(APIClient(), instance, body, secret="new-secret").status_code == 202


def test_replay_only_for_parked_events(api, company, django_capture_on_commit_callbacks):
    instance, store = make_instance(company)
    raw = store.add_task(1)
    body, _ = store.delivery("task", raw["id"])
    post_webhook(APIClient(), instance, body, capture=django_capture_on_commit_callbacks)
    event = InboundEvent.objects.get()
    response = api.post(f"/api/connector-events/{event.pk}/replay", {"idempotencyKey": "r"}, format="json")
    assert response.status_code == 422 and response.json()["code"] == "event_not_parked"


# --- management commands ---------------------------------------------------------------------


def test_connector_create_command_prints_id_and_webhook_url(company, monkeypatch):
    store = FakeStore()
    monkeypatch.setenv("PAPERCLIP_SECRET_TRACKER_TOKEN", "t")
    monkeypatch.setenv("PAPERCLIP_SECRET_TRACKER_HOOK", "h")
    out = StringIO()
    call_command("connector_create", "--company", company.issue_prefix, "--provider", PROVIDER, "--name", "cli",
                 "--config", json.dumps({"containers": [store.container], "baseUrl": store.base_url,
                                         "stateMapping": STATE_MAPPING}),
                 "--credentials", "env:PAPERCLIP_SECRET_TRACKER_TOKEN", "--webhook-secret", "env:PAPERCLIP_SECRET_TRACKER_HOOK", "--json", stdout=out)
    result = json.loads(out.getvalue())
    instance = ConnectorInstance.objects.get(pk=result["id"])
    assert result["webhookUrl"].endswith(f"/api/connectors/{instance.pk}/webhook")
    assert instance.credentials_ref == "env:PAPERCLIP_SECRET_TRACKER_TOKEN" and instance.webhook_secret_ref == "env:PAPERCLIP_SECRET_TRACKER_HOOK"


@pytest.mark.parametrize("args,message", [
    (["--company", "NOPE"], "No company"),
    (["--provider", "unknown"], "Unknown provider"),
    (["--config", "{not json"], "not valid JSON"),
    (["--config", '{"bogus": 1}'], "Unknown --config keys"),
    (["--credentials", "plaintext-token"], "must be env:VAR"),
])
def test_connector_create_command_rejects_bad_arguments(company, args, message):
    base = {"--company": company.issue_prefix, "--provider": PROVIDER, "--name": "cli", "--config": "{}"}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    argv = [x for pair in base.items() for x in pair]
    with pytest.raises(CommandError, match=message):
        call_command("connector_create", *argv, stdout=StringIO())
    assert not ConnectorInstance.objects.exists()


def test_connector_create_exit_code_is_nonzero_on_bad_arguments(company):
    import subprocess
    import sys

    from django.conf import settings

    result = subprocess.run([sys.executable, "manage.py", "connector_create", "--company", "ZZZZ", "--provider",
                             PROVIDER, "--name", "x"], cwd=settings.BASE_DIR, capture_output=True, text=True,
                            timeout=120)
    # (the subprocess uses the configured database, not the test one: any error there is fine)
    assert result.returncode != 0 and result.stderr.strip()


def test_operator_commands(company, django_capture_on_commit_callbacks, fast_retries, monkeypatch):
    instance, store = make_instance(company)
    raw = store.add_task(1)
    body, _ = store.delivery("task", raw["id"])
    post_webhook(APIClient(), instance, body, capture=django_capture_on_commit_callbacks)
    link = TaskLink.objects.get()
    out = StringIO()
    call_command("connector_pause", "--link", str(link.pk), "--json", stdout=out)
    assert json.loads(out.getvalue())["status"] == "paused"
    with django_capture_on_commit_callbacks(execute=True):
        call_command("connector_resume", "--link", str(link.pk), stdout=StringIO())
    call_command("connector_pause", str(instance.pk), stdout=StringIO())
    instance.refresh_from_db()
    assert instance.status == "paused"
    call_command("connector_resume", str(instance.pk), stdout=StringIO())
    with django_capture_on_commit_callbacks(execute=True):
        call_command("connector_sync", str(instance.pk), "--reconcile", stdout=StringIO())
        call_command("connector_reconcile", str(instance.pk), "--ticks", "2", stdout=StringIO())
        call_command("connector_resync", str(link.pk), stdout=StringIO())
    with pytest.raises(CommandError, match="Only parked"):
        call_command("connector_replay", str(InboundEvent.objects.first().pk), stdout=StringIO())
    call_command("connector_unlink", str(link.pk), "--reason", "done", stdout=StringIO())
    link.refresh_from_db()
    assert link.status == "unlinked"
    assert ActivityLog.objects.filter(action__startswith="connector.link.").count() == 4


def test_manual_import_and_manual_link_with_divergence(api, company, django_capture_on_commit_callbacks):
    from connectors.models import Conflict
    from tests.factories import IssueFactory

    instance, store = make_instance(company)
    closed = store.add_task(1, state="done", title="Closed but wanted")
    response = api.post(f"/api/connectors/{instance.pk}/import",
                        {"idempotencyKey": "imp-1", "externalKey": "acme/tracker#1"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["created"] is True
    again = api.post(f"/api/connectors/{instance.pk}/import",
                     {"idempotencyKey": "imp-2", "externalTaskId": closed["id"]}, format="json")
    assert again.json()["created"] is False and again.json()["linkId"] == response.json()["linkId"]
    missing = api.post(f"/api/connectors/{instance.pk}/import",
                       {"idempotencyKey": "imp-3", "externalKey": "acme/tracker#99"}, format="json")
    assert missing.status_code == 400

    store.add_task(2, title="External wording")
    issue = IssueFactory(company=company, title="Our wording")
    linked = api.post(f"/api/connectors/{instance.pk}/links",
                      {"idempotencyKey": "ml-1", "externalKey": "acme/tracker#2", "issueId": issue.identifier},
                      format="json")
    assert linked.status_code == 200, linked.content
    link = TaskLink.objects.get(pk=linked.json()["linkId"])
    assert link.origin_side == "manual_link" and link.status == "conflict"
    conflict = Conflict.objects.get(link=link, field="title")  # every synced field is compared (§6.2.3)
    assert (conflict.field, conflict.external_value, conflict.paperclip_value) == (
        "title", "External wording", "Our wording")
    issue.refresh_from_db()
    assert issue.title == "Our wording"  # no winner picked
    dup = api.post(f"/api/connectors/{instance.pk}/links",
                   {"idempotencyKey": "ml-2", "externalKey": "acme/tracker#2", "issueId": str(issue.pk)},
                   format="json")
    assert dup.status_code == 409


def test_connector_create_accepts_a_short_provider_name(company, monkeypatch):
    monkeypatch.setenv("PAPERCLIP_SECRET_GH_HOOK", "x")
    out = StringIO()
    call_command("connector_create", "--company", company.issue_prefix, "--provider", "github", "--name", "gh",
                 "--config", json.dumps({"containers": ["octo/repo"],
                                         "stateMapping": {"open": "backlog", "closed": "terminal"}}),
                 "--webhook-secret", "env:PAPERCLIP_SECRET_GH_HOOK", "--json", stdout=out)
    assert ConnectorInstance.objects.get(pk=json.loads(out.getvalue())["id"]).provider_key == "github_issues"
