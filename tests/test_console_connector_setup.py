"""Setting a connector up from the console: the provider choice lists every registered provider, the form
explains each field from the adapter's ``setup_help``, saves through ``instance_create`` / ``instance_update``
(their field errors next to the fields, the operator's input kept), stores a typed secret encrypted without
ever rendering it back, shows what the state mapping check found against a live workflow (the Linear and Jira
sandboxes over real HTTP), and the connector page shows the webhook URL, handshake, registrations and the
first poll. Board admins only; another company's connector is a 404 — Django test client, real database."""
import html
import json
import re
import socket
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from connectors import sandbox as sandbox_pkg
from connectors import secrets
from connectors.models import ConnectorInstance, ConnectorSecret, RoutingRule
from connectors.providers.base import adapter_class, provider_keys
from connectors.sandbox.jira import JiraSandbox
from connectors.services.instances import instance_create, webhook_url
from issues.actors import SYSTEM
from issues.models import ActivityLog
from tests.factories import AgentFactory, CompanyFactory, MembershipFactory
from tests.jira_sandbox import SANDBOX_EMAIL, SANDBOX_TOKEN as JIRA_TOKEN
from tests.linear_sandbox import SANDBOX_TEAM
from tests.linear_sandbox import SANDBOX_TOKEN as LINEAR_TOKEN

TOKEN_ENV = "PAPERCLIP_SECRET_SETUP_TOKEN"
HOOK_ENV = "PAPERCLIP_SECRET_SETUP_HOOK"
PLAINTEXT = "typed-plaintext-9f3c1e7d"
# A container each provider accepts, as its payloads spell them (a provider added later gets a generic one).
CONTAINERS = {"github_issues": "acme/site", "linear": "ENG", "jira": "ABC", "trello": "5f1e2d3c4b5a69788796a5b4",
              "asana": "1204567890123456", "notion": "1a2b3c4d-5e6f-4a8b-9c0d-1e2f3a4b5c6d"}
NOTION_FIXTURES = Path(sandbox_pkg.__file__).resolve().parent / "fixtures" / "notion"  # real, unchanged
# The shipped providers (whatever the registry holds; test fakes registered by other modules are left out).
SHIPPED = [key for key in provider_keys() if adapter_class(key).__module__.startswith("connectors.providers.")]


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def referenced_secrets(monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, "exported-token")
    monkeypatch.setenv(HOOK_ENV, "exported-hook-secret")


def dead_url():
    """A loopback URL nothing listens on: the check's provider reads fail fast and stay on this machine."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


class World:
    def __init__(self):
        self.company = CompanyFactory(name="Acme")
        self.users = {role: MembershipFactory(company=self.company, role=role).user
                      for role in ("owner", "admin", "operator", "viewer")}
        self.agent = AgentFactory(company=self.company, name="Linus")
        self.other = CompanyFactory(name="Globex")
        self.other_admin = MembershipFactory(company=self.other, role="admin").user

    def client(self, role="admin", *, csrf=False) -> Client:
        client = Client(enforce_csrf_checks=csrf)
        client.force_login(self.other_admin if role == "other" else self.users[role])
        return client


@pytest.fixture
def world(db):
    return World()


def text(response) -> str:
    return response.content.decode()


def form_fields(response) -> dict:
    """The form's values as a browser would submit them (text inputs, textareas, selected options, checked
    boxes), read from the rendered page."""
    page = text(response)
    form = page[page.index('id="setup-form"'):page.index("</form>", page.index('id="setup-form"'))]
    data = {}
    for m in re.finditer(r'<input([^>]*)>', form):
        attrs = dict(re.findall(r'(\w[\w-]*)="([^"]*)"', m.group(1)))
        kind = attrs.get("type", "text")
        if "name" not in attrs or "disabled" in m.group(1).split():
            continue
        if kind == "checkbox":
            if re.search(r"\bchecked\b", m.group(1)):
                data[attrs["name"]] = "on"
        elif kind != "submit":
            data[attrs["name"]] = html.unescape(attrs.get("value", ""))
    for m in re.finditer(r'<textarea[^>]*name="([^"]+)"[^>]*>(.*?)</textarea>', form, re.S):
        data[m.group(1)] = html.unescape(m.group(2))
    for m in re.finditer(r'<select[^>]*name="([^"]+)"[^>]*>(.*?)</select>', form, re.S):
        chosen = re.search(r'<option value="([^"]*)"[^>]*\bselected\b', m.group(2)) or \
            re.search(r'<option value="([^"]*)"', m.group(2))
        data[m.group(1)] = html.unescape(chosen.group(1)) if chosen else ""
    return data


def create_url(key):
    return reverse("connectors_console:connector-create", args=[key])


def detail_url(instance):
    return reverse("connectors_console:instance-detail", args=[instance.pk])


def edit_url(instance):
    return reverse("connectors_console:connector-edit", args=[instance.pk])


def filled_form(client, key, **overrides):
    data = form_fields(client.get(create_url(key)))
    data.update({"name": f"{key} setup", "containers": CONTAINERS.get(key, "container-1"), "base_url": dead_url(),
                 "credentials_ref": f"env:{TOKEN_ENV}", "webhook_secret_ref": f"env:{HOOK_ENV}"})
    data.update(overrides)
    return data


def make_instance(world, name="jira existing", **fields):
    fields.setdefault("base_url", dead_url())
    return instance_create(actor=SYSTEM, company=world.company, name=name, provider_key="jira",
                           containers=["ABC"], credentials=f"env:{TOKEN_ENV}", webhook_secret=f"env:{HOOK_ENV}",
                           **fields)


# --- the provider choice and the form for every provider ------------------------------------------


def test_the_list_offers_new_connector_to_admins_only(world):
    url = reverse("connectors_console:instance-list")
    assert 'id="new-connector"' in text(world.client("admin").get(url))
    assert 'id="new-connector"' in text(world.client("owner").get(url))
    assert 'id="new-connector"' not in text(world.client("operator").get(url))


def test_the_provider_choice_lists_every_registered_provider(world):
    page = text(world.client().get(reverse("connectors_console:connector-new")))
    assert provider_keys(), "no provider registered"
    for key in provider_keys():
        cls = adapter_class(key)
        assert f'href="{create_url(key)}"' in page
        assert html.escape(cls.display_name or key) in page


@pytest.mark.parametrize("key", SHIPPED)
def test_each_provider_form_explains_its_fields_and_creates_a_connector(world, key):
    cls = adapter_class(key)
    client = world.client()
    form = client.get(create_url(key))
    assert form.status_code == 200
    page = text(form)
    assert cls.display_name, f"{key} has no display_name"
    for field in ("containers", "credentials", "stateMapping"):
        assert cls.setup_help.get(field), f"{key} explains no {field}"
        assert html.escape(cls.setup_help[field]) in page
    example = cls.setup_help.get("stateMappingExample", "")
    assert example and form_fields(form)["state_mapping"] == example  # pre-filled from the adapter
    if getattr(cls, "default_base_url", ""):
        assert f'placeholder="{cls.default_base_url}"' in page

    response = client.post(create_url(key), filled_form(client, key))
    assert response.status_code == 302, text(response)[:3000]
    instance = ConnectorInstance.objects.get(company=world.company, provider_key=key)
    assert response["Location"] == detail_url(instance) + "#setup"
    assert instance.state_mapping == json.loads(example)
    assert instance.containers == [CONTAINERS.get(key, "container-1")]
    assert instance.credentials_ref == f"env:{TOKEN_ENV}" and instance.webhook_secret_ref == f"env:{HOOK_ENV}"
    assert ActivityLog.objects.filter(action="connector.created", entity_id=str(instance.pk)).exists()

    detail = text(client.get(detail_url(instance)))
    assert webhook_url(instance) in detail
    assert 'id="mapping-check-state"' in detail or 'id="mapping-findings"' in detail


# --- validation: the service's errors next to the fields, input kept --------------------------------


def test_invalid_json_is_refused_before_the_service_with_everything_kept(world):
    client = world.client()
    data = filled_form(client, "jira", state_mapping='{"statuses": {"In Review": "review",}}', name="Kept name")
    response = client.post(create_url("jira"), data)
    assert response.status_code == 400
    page = text(response)
    assert 'id="error-state_mapping"' in page and "Not valid JSON" in page
    kept = form_fields(response)
    assert kept["name"] == "Kept name" and kept["containers"] == "ABC"
    assert kept["state_mapping"] == '{"statuses": {"In Review": "review",}}'
    assert not ConnectorInstance.objects.exists()


def test_service_errors_are_shown_next_to_their_fields(world):
    client = world.client()
    bad_mapping = filled_form(client, "jira", state_mapping='{"statuses": {"In Review": "reviewing"}}')
    response = client.post(create_url("jira"), bad_mapping)
    assert response.status_code == 400
    page = text(response)
    error = re.search(r'id="error-state_mapping"[^>]*>([^<]*)<', page)
    assert error and error.group(1).startswith("statuses.In Review:"), page[:2000]
    assert form_fields(response)["state_mapping"] == '{"statuses": {"In Review": "reviewing"}}'

    unresolvable = filled_form(client, "jira", credentials_ref="env:PAPERCLIP_SECRET_NOT_EXPORTED")
    page = text(client.post(create_url("jira"), unresolvable))
    assert 'id="error-credentials"' in page
    assert 'value="env:PAPERCLIP_SECRET_NOT_EXPORTED"' in page  # the reference is kept (it is not a secret)

    bad_rule = filled_form(client, "jira", **{"rule-0-kind": "label", "rule-0-match": "state=QA",
                                              "rule-0-agent": str(world.agent.pk)})
    response = client.post(create_url("jira"), bad_rule)
    page = text(response)
    assert 'id="rule-0-error-1"' in page and "match.label" in page
    assert form_fields(response)["rule-0-match"] == "state=QA"

    base = filled_form(client, "jira", base_url="ftp://example.invalid")
    assert 'id="error-base_url"' in text(client.post(create_url("jira"), base))

    make_instance(world, name="Taken")
    taken = text(client.post(create_url("jira"), filled_form(client, "jira", name="taken")))
    assert re.search(r'id="error-name"[^>]*>A connector with this name already exists', taken)
    assert ConnectorInstance.objects.count() == 1


def test_routing_rows_write_and_field_policy_reach_the_instance(world):
    client = world.client()
    data = filled_form(client, "jira", **{"rule-0-kind": "label", "rule-0-match": "label=backend",
                                          "rule-0-agent": str(world.agent.pk), "rule-0-enabled": "on",
                                          "rule-1-kind": "default_route", "rule-1-agent": str(world.agent.pk),
                                          "field_policy.title": "paperclip", "triage_agent": str(world.agent.pk),
                                          "sync_mode": "bidirectional"})
    data.pop("write_policy.postBacklink", None)  # unticked
    data.pop("rule-1-enabled", None)
    assert client.post(create_url("jira"), data).status_code == 302
    instance = ConnectorInstance.objects.get()
    rules = list(RoutingRule.objects.filter(instance=instance).order_by("order"))
    assert [(r.kind, r.match, r.target_agent_id, r.enabled) for r in rules] == [
        ("label", {"label": "backend"}, world.agent.pk, True), ("default_route", {}, world.agent.pk, False)]
    assert instance.write_policy["postBacklink"] is False and instance.write_policy["projectStatus"] is True
    assert instance.field_policy["title"] == "paperclip" and instance.default_sync_mode == "bidirectional"
    assert instance.triage_agent_id == world.agent.pk


# --- secrets: stored encrypted, never rendered back ----------------------------------------------


def test_a_typed_secret_is_stored_encrypted_and_never_echoed(world):
    client = world.client()
    data = filled_form(client, "jira", credentials_ref="", credentials_new=PLAINTEXT)
    response = client.post(create_url("jira"), data, follow=True)
    assert response.status_code == 200
    assert PLAINTEXT not in text(response)
    instance = ConnectorInstance.objects.get()
    assert instance.credentials_ref.startswith("secret:")
    assert secrets.resolve(instance.credentials_ref, company_id=world.company.pk) == PLAINTEXT
    row = ConnectorSecret.objects.get(pk=instance.credentials_ref.split(":", 1)[1])
    assert PLAINTEXT not in row.ciphertext and row.company_id == world.company.pk
    assert PLAINTEXT not in text(client.get(edit_url(instance)))


def test_a_refused_save_stores_no_secret_and_asks_for_it_again(world):
    client = world.client()
    data = filled_form(client, "jira", name="", webhook_secret_ref="", webhook_secret_new=PLAINTEXT)
    response = client.post(create_url("jira"), data)
    assert response.status_code == 400
    page = text(response)
    assert PLAINTEXT not in page
    assert 'id="dropped-webhook_secret"' in page and 'id="error-name"' in page
    assert not ConnectorSecret.objects.exists() and not ConnectorInstance.objects.exists()


# --- the mapping check against a live workflow ----------------------------------------------------


def test_findings_against_the_live_linear_workflow_show_the_unmapped_state(
        world, linear_sandbox, django_capture_on_commit_callbacks):
    linear_sandbox.add_team("OPS", states=(("Queue", "unstarted"), ("Parked", "paused"), ("Live", "completed")))
    client = world.client()
    data = filled_form(client, "linear", containers=f"{SANDBOX_TEAM}\nOPS", base_url=linear_sandbox.base_url,
                       credentials_ref="", credentials_new=LINEAR_TOKEN)
    with django_capture_on_commit_callbacks(execute=True):  # the check instance_create queues after commit
        response = client.post(create_url("linear"), data)
    assert response.status_code == 302
    instance = ConnectorInstance.objects.get()
    page = text(client.get(response["Location"]))
    findings = page[page.index('id="mapping-findings"'):]
    assert "Checked against the live workflow after saving" in findings
    assert ("status &#x27;Parked&#x27; in team OPS is unmapped (type paused); tasks in it are treated as backlog"
            in findings)
    # the recorded check (queued by instance_create) is on the page too
    recorded = ActivityLog.objects.get(action="connector.mapping_checked", entity_id=str(instance.pk))
    assert recorded.details["trigger"] == "create" and recorded.details["warnings"] >= 1
    assert re.search(r'id="mapping-check-state"[^>]*>Last recorded check .*\(create\)', page)
    # the findings are shown once; the recorded outcome stays
    again = text(client.get(detail_url(instance)))
    assert 'id="mapping-findings"' not in again and 'id="mapping-check-state"' in again


@pytest.fixture
def jira():
    with JiraSandbox(projects=("ABC",), email=SANDBOX_EMAIL, token=JIRA_TOKEN) as sandbox:
        yield sandbox


def test_a_status_the_jira_workflow_lacks_is_an_error_shown_and_recorded(
        world, jira, django_capture_on_commit_callbacks):
    client = world.client()
    data = filled_form(client, "jira", base_url=jira.base_url, credentials_ref="", credentials_new=jira.credentials,
                       state_mapping='{"statuses": {"Shipped": "terminal", "In Review": "review"}}')
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(create_url("jira"), data, follow=True)
    page = text(response)
    assert 'id="mapping-status">invalid' in page
    errors = page[page.index('id="mapping-errors"'):]
    assert "stateMapping.statuses.Shipped" in errors and "no status named &#x27;Shipped&#x27; in project ABC" in errors
    # on a later visit the recorded check (health entry) still lists the error
    instance = ConnectorInstance.objects.get()
    later = text(client.get(detail_url(instance)))
    recorded = later[later.index('id="recorded-mapping-errors"'):]
    assert "no status named &#x27;Shipped&#x27;" in recorded

    # fixed in the edit form: the check runs again and is clean
    fixed = form_fields(client.get(edit_url(instance)))
    fixed["state_mapping"] = '{"statuses": {"In Review": "review"}}'
    with django_capture_on_commit_callbacks(execute=True):
        page = text(client.post(edit_url(instance), fixed, follow=True))
    assert 'id="mapping-status">ok' in page
    assert ActivityLog.objects.filter(action="connector.mapping_checked", entity_id=str(instance.pk),
                                      details__trigger="update").exists()

    # "Check the mapping again": the recorded check on demand
    response = client.post(reverse("connectors_console:connector-check-mapping", args=[instance.pk]), follow=True)
    assert 'Checked against the live workflow just now' in text(response)
    assert ActivityLog.objects.filter(action="connector.mapping_checked", entity_id=str(instance.pk),
                                      details__trigger="console").exists()


# --- edit settings --------------------------------------------------------------------------------


def test_edit_settings_shows_the_current_values_and_saves_through_instance_update(world):
    instance = make_instance(world, state_mapping={"statuses": {"In Review": "review"}},
                             routing_rules=[{"kind": "label", "match": {"label": "backend"}, "agentId": world.agent.pk}])
    client = world.client()
    current = form_fields(client.get(edit_url(instance)))
    assert current["name"] == "jira existing" and current["containers"] == "ABC"
    assert json.loads(current["state_mapping"]) == {"statuses": {"In Review": "review"}}
    assert current["rule-0-kind"] == "label" and current["rule-0-match"] == "label=backend"
    assert current["credentials_ref"] == f"env:{TOKEN_ENV}" and "credentials_new" in current

    current.update({"containers": "ABC\nPC", "rule-0-match": "label=frontend", "webhook_secret_new": PLAINTEXT})
    response = client.post(edit_url(instance), current, follow=True)
    assert PLAINTEXT not in text(response)
    instance.refresh_from_db()
    assert instance.containers == ["ABC", "PC"]
    assert instance.credentials_ref == f"env:{TOKEN_ENV}"  # untouched boxes keep the secret
    assert instance.webhook_secret_ref.startswith("secret:")
    assert secrets.resolve(instance.webhook_secret_ref, company_id=world.company.pk) == PLAINTEXT
    assert list(RoutingRule.objects.filter(instance=instance).values_list("match", flat=True)) == [{"label": "frontend"}]
    assert ActivityLog.objects.filter(action="connector.updated", entity_id=str(instance.pk)).exists()

    # a refused edit changes nothing (not even the secret typed with it)
    refused = form_fields(client.get(edit_url(instance)))
    refused.update({"sync_mode": "sometimes", "credentials_new": "another-plaintext"})
    response = client.post(edit_url(instance), refused)
    assert response.status_code == 400 and 'id="error-sync_mode"' in text(response)
    assert "another-plaintext" not in text(response)
    instance.refresh_from_db()
    assert instance.credentials_ref == f"env:{TOKEN_ENV}" and ConnectorSecret.objects.count() == 1


# --- the connector page: webhook URL, handshake, registrations, first poll ---------------------------


def test_the_connector_page_shows_webhook_url_registrations_handshake_and_poll(world, linear_sandbox):
    instance = instance_create(actor=SYSTEM, company=world.company, name="linear", provider_key="linear",
                               base_url=linear_sandbox.base_url, containers=[SANDBOX_TEAM],
                               credentials={"value": LINEAR_TOKEN})
    ConnectorInstance.objects.filter(pk=instance.pk).update(webhook_registrations=[
        {"scope": SANDBOX_TEAM, "externalId": "wh-1", "callbackUrl": webhook_url(instance, SANDBOX_TEAM),
         "active": False, "detail": "disabled by the provider", "checkedAt": "2026-12-01T10:00:00+00:00",
         "secretRef": "secret:00000000000000000000000000000000"}])
    linear_sandbox.create_issue("Set up the pipeline", team=SANDBOX_TEAM)
    client = world.client()
    page = text(client.get(detail_url(instance)))
    assert f'id="webhook-url">{webhook_url(instance)}<' in page
    table = page[page.index('id="webhook-registrations"'):]
    assert "wh-1" in table and "disabled by the provider" in table and "inactive" in table
    assert "secret:0000" not in page  # a registration's secret reference is never shown
    assert "not polled yet" in page and "none yet" in page

    response = client.post(reverse("connectors_console:connector-poll", args=[instance.pk]), follow=True)
    assert "1 task(s) changed" in text(response)
    instance.refresh_from_db()
    assert instance.last_poll_at is not None
    assert "last poll" in text(client.get(detail_url(instance)))


def test_a_notion_verification_token_is_revealed_to_admins_only(world, monkeypatch,
                                                                django_capture_on_commit_callbacks):
    monkeypatch.setenv("PAPERCLIP_SECRET_NOTION_TOKEN", "notion-token")
    instance = instance_create(actor=SYSTEM, company=world.company, name="notion", provider_key="notion",
                               base_url=dead_url(), containers=[CONTAINERS["notion"]],
                               credentials="env:PAPERCLIP_SECRET_NOTION_TOKEN")
    body = (NOTION_FIXTURES / "zulip_verification.json").read_bytes()
    token = json.loads(body)["verification_token"]
    with django_capture_on_commit_callbacks(execute=True):  # the real verification request, real view
        answer = APIClient().post(f"/api/connectors/{instance.pk}/webhook", data=body, content_type="application/json")
    assert answer.status_code == 200, answer.content
    admin = world.client()
    page = text(admin.get(detail_url(instance)))
    assert 'id="show-verification-token"' in page and token not in page
    assert 'id="handshake-state"' in page and "none yet" not in page[page.index('id="handshake-state"'):][:300]
    url = reverse("connectors_console:connector-verification-token", args=[instance.pk])
    revealed = admin.post(url, HTTP_HX_REQUEST="true")
    assert revealed.status_code == 200 and token in text(revealed)
    assert revealed["Cache-Control"] == "no-store" and "<html" not in text(revealed)  # the htmx fragment
    assert ActivityLog.objects.filter(action="connector.verification_token_shown", entity_id=str(instance.pk)).exists()
    assert token not in text(admin.get(detail_url(instance)))  # shown on request only, never kept

    operator = world.client("operator")
    assert 'id="show-verification-token"' not in text(operator.get(detail_url(instance)))
    refused = operator.post(url)
    assert refused.status_code == 403 and token not in text(refused)


# --- permissions, company boundary, CSRF ------------------------------------------------------------


def _urls(instance):
    return {
        "get": [reverse("connectors_console:connector-new"), create_url("jira"), edit_url(instance)],
        "post": [create_url("jira"), edit_url(instance),
                 *[reverse(f"connectors_console:{name}", args=[instance.pk]) for name in (
                     "connector-check-mapping", "connector-poll", "connector-register-webhooks",
                     "connector-handshake-window", "connector-verification-token")]],
    }


@pytest.mark.parametrize("role", ["operator", "viewer"])
def test_setup_is_for_board_admins_only(world, role):
    instance = make_instance(world)
    client = world.client(role)
    urls = _urls(instance)
    for url in urls["get"]:
        assert client.get(url).status_code == 403, url
    for url in urls["post"]:
        assert client.post(url, {"name": "x"}).status_code == 403, url
    assert ConnectorInstance.objects.count() == 1
    assert not ActivityLog.objects.filter(action__in=("connector.handshake_window_opened",
                                                      "connector.updated")).exists()
    page = text(client.get(detail_url(instance)))
    assert 'href="' + edit_url(instance) + '"' not in page and "Poll now" not in page


def test_another_companys_connector_is_a_404(world):
    instance = make_instance(world)
    client = world.client("other")
    urls = _urls(instance)
    for url in [edit_url(instance)]:
        assert client.get(url).status_code == 404
    for url in urls["post"][1:]:
        assert client.post(url, {"name": "hijacked"}).status_code == 404, url
    instance.refresh_from_db()
    assert instance.name == "jira existing"
    # and an unknown provider is a 404 too
    assert world.client().get(create_url("no_such_tracker")).status_code == 404


def test_an_agent_of_another_company_is_a_field_error(world):
    foreign = AgentFactory(company=world.other, name="Spy")
    client = world.client()
    response = client.post(create_url("jira"), filled_form(client, "jira", triage_agent=str(foreign.pk)))
    assert response.status_code == 400 and 'id="error-triage_agent"' in text(response)
    assert not ConnectorInstance.objects.exists()


def test_forms_are_csrf_protected(world):
    client = world.client(csrf=True)
    data = filled_form(client, "jira")
    data.pop("csrfmiddlewaretoken", None)
    assert client.post(create_url("jira"), data).status_code == 403
    assert not ConnectorInstance.objects.exists()


def test_handshake_window_and_registration_from_the_page(world):
    instance = make_instance(world)  # Jira: no handshake, no registration through its API
    client = world.client()
    page = text(client.get(detail_url(instance)))
    assert "Register webhooks" not in page and "Expect a handshake" not in page
    refused = client.post(reverse("connectors_console:connector-register-webhooks", args=[instance.pk]), follow=True)
    assert "cannot be created through its API" in text(refused)
    assert ConnectorInstance.objects.get(pk=instance.pk).webhook_registrations == []

    client.post(reverse("connectors_console:connector-handshake-window", args=[instance.pk]))
    instance.refresh_from_db()
    assert instance.handshake_open_until is not None
    assert "expecting one until" in text(client.get(detail_url(instance)))
    assert ActivityLog.objects.filter(action="connector.handshake_window_opened", entity_id=str(instance.pk)).exists()
    for key in [k for k in SHIPPED if "register_webhook" in adapter_class(k).capabilities.operations]:
        other = instance_create(actor=SYSTEM, company=world.company, name=f"{key} hooks", provider_key=key,
                                base_url=dead_url(), containers=[CONTAINERS.get(key, "container-1")],
                                credentials=f"env:{TOKEN_ENV}")
        assert "Register webhooks" in text(client.get(detail_url(other)))
