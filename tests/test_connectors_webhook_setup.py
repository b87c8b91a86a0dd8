"""The engine's webhook setup (External Task Protocol Appendix A.3-A.5, §13.2), provider-neutral:
handshakes answered by the real webhook view (a secret handed over is stored encrypted, only while one is
expected), per-container registrations with their own signing secrets chosen by ``?scope=``, the public
URL signatures see, registration and re-verification at worker start, and run modes a provider refuses.

The test adapter (tests/connector_fakes.py) creates and checks webhooks in its in-memory store and is given
the other hooks a provider implements (``webhook_handshake``, ``run_mode_refusal``) per test; the real Asana, Trello and Notion
handshakes and registrations are exercised against their sandboxes in their own test modules."""
from __future__ import annotations

import json

import pytest
from django.core.management.base import CommandError
from rest_framework.test import APIClient

from connectors import secrets
from connectors.models import ConnectorInstance, ConnectorSecret, InboundEvent, SyncError
from connectors.providers.base import ErrorCategory, HandshakeReply, ProviderError
from connectors.services import webhook_setup
from connectors.services.drain import restart_recover
from connectors.services.instances import instance_create, instance_update, webhook_url
from issues.actors import SYSTEM
from issues.models import ActivityLog
from tests.connector_factories import SECRET, make_instance
from tests.connector_fakes import FakeTrackerAdapter, sign
from tests.factories import CompanyFactory, MembershipFactory
from tests.test_errors import assert_error

HOOK_HEADER = "X-Fake-Hook-Secret"
PUBLIC = "https://paperclip.example/base"


@pytest.fixture(autouse=True)
def public_url(settings):
    settings.CONNECTORS = {**settings.CONNECTORS, "PUBLIC_BASE_URL": PUBLIC + "/"}


@pytest.fixture
def echo_handshake(monkeypatch):
    """The test adapter answers an Asana-style handshake: a request carrying the hook header gets it echoed and
    hands the value over as the signing secret."""
    def webhook_handshake(self, request):
        value = request.headers.get(HOOK_HEADER.lower())
        if value:
            return HandshakeReply(headers={HOOK_HEADER: value}, secret=value, detail="fake handshake")
        return None

    monkeypatch.setattr(FakeTrackerAdapter, "webhook_handshake", webhook_handshake)


@pytest.fixture
def seen_urls(monkeypatch):
    urls = []
    original = FakeTrackerAdapter.verify_webhook

    def verify(self, request):
        urls.append((request.url, request.scope, self.config.webhook_secret))
        return original(self, request)

    monkeypatch.setattr(FakeTrackerAdapter, "verify_webhook", verify)
    return urls


def _post(instance, body=b"", *, scope=None, host=None, **headers):
    path = f"/api/connectors/{instance.pk}/webhook" + (f"?scope={scope}" if scope else "")
    extra = {"HTTP_" + k.upper().replace("-", "_"): v for k, v in headers.items()}
    if host:
        extra["HTTP_HOST"] = host
    return APIClient().post(path, data=body, content_type="application/json", **extra)


def _delivery(store, task_id="1001", secret=SECRET):
    body, _ = store.delivery("task", task_id)
    return body, {"X-Fake-Signature": sign(secret, body)}


def _admin(company, role="owner"):
    client = APIClient()
    client.force_login(MembershipFactory(company=company, role=role).user)
    return client


# ------------------------------------------------------------------------------- the public URL
def test_signatures_see_the_public_url_never_the_host_header(company, seen_urls, settings):
    settings.ALLOWED_HOSTS = ["*"]  # a proxy that forwards any Host: the URL still comes from configuration
    instance, store = make_instance(company)
    store.add_task(title="Crash")
    body, headers = _delivery(store)
    response = _post(instance, body, host="attacker.example", **headers)
    assert response.status_code == 202, response.content
    assert seen_urls == [(f"{PUBLIC}/api/connectors/{instance.pk}/webhook", None, SECRET)]


def test_head_is_refused_by_a_provider_without_a_callback_check(company):
    instance, _ = make_instance(company)
    response = APIClient().head(f"/api/connectors/{instance.pk}/webhook")
    assert response.status_code == 405
    assert response["Allow"] == "POST"
    assert not InboundEvent.objects.filter(instance=instance).exists()


# ---------------------------------------------------------------------------------- handshakes
def test_a_first_handshake_is_echoed_and_its_secret_stored_encrypted(company, echo_handshake):
    instance, store = make_instance(company, secret="")
    assert instance.webhook_secret_ref == "" and instance.handshake_open_until is not None  # awaits the provider
    response = _post(instance, **{HOOK_HEADER: "hs-secret-1"})
    assert response.status_code == 200, response.content
    assert response[HOOK_HEADER] == "hs-secret-1"
    instance.refresh_from_db()
    assert instance.webhook_secret_ref.startswith("secret:")
    row = ConnectorSecret.objects.get(pk=instance.webhook_secret_ref.removeprefix("secret:"))
    assert "hs-secret-1" not in row.ciphertext  # encrypted at rest
    assert secrets.resolve(instance.webhook_secret_ref, company_id=company.pk) == "hs-secret-1"
    assert instance.last_handshake_at is not None and "fake handshake" in instance.last_handshake_detail
    assert not InboundEvent.objects.filter(instance=instance).exists()  # a handshake is not an event
    entry = ActivityLog.objects.get(action="connector.webhook_handshake", entity_id=str(instance.pk))
    assert "hs-secret-1" not in json.dumps(entry.details)
    # the first secret closes the window: a stranger racing the provider cannot replace it
    assert instance.handshake_open_until is None
    assert_error(_post(instance, **{HOOK_HEADER: "stranger"}), 409, "handshake_refused")
    # deliveries are now verified with the handed-over secret
    store.add_task(title="Crash")
    body, headers = _delivery(store, secret="hs-secret-1")
    assert _post(instance, body, **headers).status_code == 202
    body, headers = _delivery(store, secret=SECRET)
    assert _post(instance, body, **headers).status_code == 401


def test_a_handshake_never_replaces_a_stored_secret_unless_expected(company, echo_handshake):
    instance, store = make_instance(company)
    before = instance.webhook_secret_ref
    assert_error(_post(instance, **{HOOK_HEADER: "stranger"}), 409, "handshake_refused")
    instance.refresh_from_db()
    assert instance.webhook_secret_ref == before
    assert not ConnectorSecret.objects.filter(company=company, name__contains="webhook secret").exclude(
        pk=before.removeprefix("secret:")).exists()
    assert instance.webhook_rejected_count == 1
    # an admin opens the window (e.g. before re-creating the provider's webhook by hand): accepted once
    response = _admin(company).post(f"/api/connectors/{instance.pk}/handshake-window")
    assert response.status_code == 200, response.content
    assert _post(instance, **{HOOK_HEADER: "rotated"}).status_code == 200
    assert_error(_post(instance, **{HOOK_HEADER: "second"}), 409, "handshake_refused")
    instance.refresh_from_db()
    assert secrets.resolve(instance.webhook_secret_ref, company_id=company.pk) == "rotated"
    assert not ConnectorSecret.objects.filter(pk=before.removeprefix("secret:")).exists()  # the replaced one


def test_the_handshake_window_is_for_admins_of_the_company(company):
    instance, _ = make_instance(company)
    assert_error(_admin(company, role="viewer").post(f"/api/connectors/{instance.pk}/handshake-window"), 403)
    assert_error(_admin(CompanyFactory()).post(f"/api/connectors/{instance.pk}/handshake-window"), 404)
    instance.refresh_from_db()
    assert instance.handshake_open_until is None


def test_a_scoped_secret_is_taken_only_while_that_container_registers(company, echo_handshake, seen_urls):
    instance, store = make_instance(company)
    scope = store.container
    # outside its registration nobody may add a scope's secret (its deliveries would verify with it), not
    # even inside the instance's own window, and never for a container the connector does not have
    webhook_setup.handshake_window_open(actor=SYSTEM, instance=instance)
    assert_error(_post(instance, scope=scope, **{HOOK_HEADER: "stranger"}), 409, "handshake_refused")
    assert_error(_post(instance, scope="not/configured", **{HOOK_HEADER: "x"}), 409, "handshake_refused")
    answers = []
    store.on_register = lambda scope_, url: answers.extend(
        [_post(instance, scope=scope_, **{HOOK_HEADER: "project-secret"}).status_code,
         _post(instance, scope=scope_, **{HOOK_HEADER: "racing-stranger"}).status_code])
    webhook_setup.webhooks_register(instance=instance)
    assert answers == [200, 409]  # the provider's handshake, then nothing more
    instance.refresh_from_db()
    (entry,) = instance.webhook_registrations
    assert entry["scope"] == scope and entry["secretRef"].startswith("secret:") and not entry["handshakeUntil"]
    assert secrets.resolve(entry["secretRef"], company_id=company.pk) == "project-secret"
    assert instance.webhook_secret_ref != entry["secretRef"]
    assert_error(_post(instance, scope=scope, **{HOOK_HEADER: "later"}), 409, "handshake_refused")
    store.add_task(title="Crash")
    body, headers = _delivery(store, secret="project-secret")
    assert _post(instance, body, scope=scope, **headers).status_code == 202
    assert seen_urls[-1] == (webhook_url(instance, scope), scope, "project-secret")
    # the instance's own secret does not sign that scope's deliveries, and a scope's secret nothing else
    body, headers = _delivery(store, secret=SECRET)
    assert _post(instance, body, scope=scope, **headers).status_code == 401
    body, headers = _delivery(store, secret="project-secret")
    assert _post(instance, body, **headers).status_code == 401
    # health shows the registration, never its secret reference
    health = _admin(company).get(f"/api/connectors/{instance.pk}/health").json()
    assert health["webhookUrl"] == f"{PUBLIC}/api/connectors/{instance.pk}/webhook"
    assert health["webhookRegistrations"][0]["hasOwnSecret"] is True
    assert "secretRef" not in json.dumps(health)


def test_a_failed_registration_leaves_no_open_door(company, echo_handshake):
    instance, store = make_instance(company)

    def provider_refuses(scope, url):
        raise ProviderError(ErrorCategory.PROVIDER_RATE_LIMITED, "slow down", status=429, retry_after=30)

    store.on_register = provider_refuses
    (reg,) = webhook_setup.webhooks_register(instance=instance)
    assert reg["active"] is False and "registration failed" in reg["detail"]
    assert_error(_post(instance, scope=store.container, **{HOOK_HEADER: "stranger"}), 409, "handshake_refused")
    assert SyncError.objects.filter(instance=instance, category="provider_rate_limited").exists()


def test_the_verification_token_is_only_a_secret_the_provider_asked_to_show(company, monkeypatch):
    """Notion's token is shown to admins to paste back; a secret that merely exists (or a Trello HEAD that
    set last_handshake_at) is never revealed."""
    instance, _ = make_instance(company)
    client = _admin(company)
    ConnectorInstance.objects.filter(pk=instance.pk).update(last_handshake_at=instance.created_at)
    assert client.get(f"/api/connectors/{instance.pk}/verification-token").json() == {"verificationToken": None}
    monkeypatch.setattr(FakeTrackerAdapter, "webhook_handshake", lambda self, request: HandshakeReply(
        secret="notion-like-token", show_operator=True) if b"verification_token" in request.body else None)
    webhook_setup.handshake_window_open(actor=SYSTEM, instance=instance)
    assert _post(instance, b'{"verification_token": "x"}').status_code == 200
    response = client.get(f"/api/connectors/{instance.pk}/verification-token")
    assert response.json() == {"verificationToken": "notion-like-token"} and response["Cache-Control"] == "no-store"
    assert ActivityLog.objects.filter(action="connector.verification_token_shown", entity_id=str(instance.pk)).exists()
    assert_error(_admin(company, role="viewer").get(f"/api/connectors/{instance.pk}/verification-token"), 403)


# ------------------------------------------------------------------------------- registrations
def test_registration_per_container_with_the_handshake_answered_meanwhile(company, echo_handshake):
    instance, store = make_instance(company)
    seen_window = []

    def provider_calls_back(scope, callback_url):
        row = ConnectorInstance.objects.get(pk=instance.pk)
        seen_window.append(bool(row.webhook_registrations[0]["handshakeUntil"]) and row.handshake_open_until is None)
        assert callback_url == f"{PUBLIC}/api/connectors/{instance.pk}/webhook?scope=acme%2Ftracker"
        assert _post(instance, scope=scope, **{HOOK_HEADER: f"secret-of-{scope}"}).status_code == 200

    store.on_register = provider_calls_back
    response = _admin(company).post(f"/api/connectors/{instance.pk}/webhooks/register")
    assert response.status_code == 200, response.content
    (reg,) = response.json()["registrations"]
    assert reg["scope"] == store.container and reg["externalId"] == "wh-1" and reg["active"] is True
    assert "secretRef" not in reg
    assert seen_window == [True]
    instance.refresh_from_db()
    assert not instance.webhook_registrations[0]["handshakeUntil"]  # closed again
    assert secrets.resolve(instance.webhook_registrations[0]["secretRef"], company_id=company.pk) == \
        f"secret-of-{store.container}"
    # registering again re-checks the active webhook instead of creating a second one
    store.on_register = None
    assert _admin(company).post(f"/api/connectors/{instance.pk}/webhooks/register").status_code == 200
    assert (store.calls["register_webhook"], store.calls["check_webhook"]) == (1, 1)
    assert len(store.webhooks) == 1
    instance.refresh_from_db()
    assert len(instance.webhook_registrations) == 1 and instance.webhook_registrations[0]["secretRef"]
    assert ActivityLog.objects.filter(action="connector.webhooks_registered", entity_id=str(instance.pk)).count() == 2
    # a webhook the provider dropped is created again
    store.webhooks.clear()
    assert _admin(company).post(f"/api/connectors/{instance.pk}/webhooks/register").json()[
        "registrations"][0]["active"] is True
    assert store.calls["register_webhook"] == 2


def test_worker_start_re_verifies_registrations_and_health_shows_a_dead_one(company):
    instance, store = make_instance(company)
    webhook_setup.webhooks_register(instance=instance)
    store.webhooks["wh-1"]["active"] = False
    instance.refresh_from_db()
    report = restart_recover()
    assert report["instances"] == 1
    assert store.calls["check_webhook"] == 1
    instance.refresh_from_db()
    (entry,) = instance.webhook_registrations
    assert entry["active"] is False and "disabled" in entry["detail"]
    error = SyncError.objects.get(instance=instance, category="config")
    assert "not active" in error.message and "connector_register_webhooks" in error.message
    health = _admin(company).get(f"/api/connectors/{instance.pk}/health").json()
    assert health["webhookRegistrations"][0]["active"] is False


def test_registration_is_refused_where_the_provider_api_cannot(company, monkeypatch):
    monkeypatch.setenv("PAPERCLIP_SECRET_SETUP_GH", "gh-token")
    instance = instance_create(actor=SYSTEM, company=company, name="gh", provider_key="github_issues",
                               credentials="env:PAPERCLIP_SECRET_SETUP_GH", containers=["octo/app"])
    assert_error(_admin(company).post(f"/api/connectors/{instance.pk}/webhooks/register"), 422,
                 "webhook_registration_unsupported", fields=("provider",))
    assert_error(_admin(company, role="viewer").post(f"/api/connectors/{instance.pk}/webhooks/register"), 403)
    instance.refresh_from_db()
    assert instance.webhook_registrations == []


def test_register_command_prints_each_container(company, capsys):
    from django.core.management import call_command

    instance, store = make_instance(company)
    call_command("connector_register_webhooks", "--company", company.issue_prefix, "--connector", instance.name,
                 "--json")
    out = json.loads(capsys.readouterr().out)
    assert out["registrations"][0]["externalId"] == "wh-1"
    store.webhooks["wh-1"]["active"] = False
    with pytest.raises(CommandError, match="not active"):
        call_command("connector_register_webhooks", str(instance.pk), "--verify")


# ------------------------------------------------------------------------------------- run modes
def test_a_run_mode_the_provider_refuses_is_a_422_naming_the_field(company, monkeypatch):
    monkeypatch.setattr(FakeTrackerAdapter, "run_mode_refusal", lambda self, mode: (
        "no state property to say a task is active" if mode == "symphony_compatible" and
        not (self.config.state_mapping or {}).get("doing") else None))
    instance, _ = make_instance(company, state_mapping={"todo": "backlog"})
    response = _admin(company).patch(f"/api/connectors/{instance.pk}", {"defaultRunMode": "symphony_compatible"},
                                     format="json")
    assert_error(response, 422, "run_mode_unsupported", fields=("defaultRunMode",))
    instance.refresh_from_db()
    assert instance.default_run_mode == "paperclip_controlled"
    # with a mapping that can say "active" it is accepted
    instance_update(actor=SYSTEM, instance=instance, changes={"state_mapping": {"doing": "active"},
                                                             "default_run_mode": "symphony_compatible"})
    instance.refresh_from_db()
    assert instance.default_run_mode == "symphony_compatible"


# ------------------------------------------------------------------------------- all six providers
SIX = {"github_issues": "octo/app", "linear": "ENG", "jira": "ABC", "asana": "1200000000000001",
       "trello": "5a" * 12, "notion": "13950b26-c203-4f3b-b97d-93ec06319565"}


@pytest.mark.parametrize("provider", sorted(SIX))
def test_every_provider_answers_setup_requests_and_refuses_unsigned_bodies(company, provider, monkeypatch):
    """The engine's part is the same for every provider: HEAD only where the provider checks its callback
    (Trello), the public webhook URL in health, an unsigned delivery refused with nothing stored."""
    monkeypatch.setenv("PAPERCLIP_SECRET_SIX_TOKEN", "token")
    monkeypatch.setenv("PAPERCLIP_SECRET_SIX_HOOK", "hook-secret")
    instance = instance_create(actor=SYSTEM, company=company, name=provider, provider_key=provider,
                               credentials="env:PAPERCLIP_SECRET_SIX_TOKEN", webhook_secret="env:PAPERCLIP_SECRET_SIX_HOOK",
                               containers=[SIX[provider]])
    head = APIClient().head(f"/api/connectors/{instance.pk}/webhook")
    assert head.status_code == (200 if provider == "trello" else 405)
    response = _post(instance, b'{"action": "created", "events": [], "id": "x"}')
    assert_error(response, 401)
    assert not InboundEvent.objects.filter(instance=instance).exists()
    health = _admin(company).get(f"/api/connectors/{instance.pk}/health").json()
    assert health["webhookUrl"] == f"{PUBLIC}/api/connectors/{instance.pk}/webhook"
