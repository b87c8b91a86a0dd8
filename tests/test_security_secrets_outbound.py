"""A hostile company admin against the trust boundary (External Task Protocol §14.1–14.3):
secret references stay inside the server's allow-list and the company that stored them, and
requests to tenant-configured URLs go only to addresses the operator allows.

Everything runs against the live server over HTTP; a local listener stands in for whatever URL
the admin points the connector or agent at, and records what it receives."""
from __future__ import annotations

import http.server
import socket
import threading

import httpx
import pytest
from django.conf import settings as django_settings
from django.test import Client

from connectors.models import ConnectorInstance, ConnectorSecret, SyncError
from issues.adapters import get_adapter, prepare_context
from issues.choices import RunStatus
from issues.models import Agent
from paperclip.core import outbound_http
from paperclip.core.outbound_http import OutboundRefused, guarded_client
from tests.conftest import LOOPBACK_OUTBOUND
from tests.factories import AgentFactory, CompanyFactory, IssueFactory, MembershipFactory, RunFactory
from tests.test_errors import error_of

pytestmark = pytest.mark.django_db(transaction=True)


class Listener:
    """A loopback HTTP server that records every request it gets (and answers 200, or a redirect)."""

    def __init__(self, redirect_to: str | None = None):
        self.requests: list[dict] = []
        listener = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _any(self):
                length = int(self.headers.get("Content-Length") or 0)
                listener.requests.append({"method": self.command, "path": self.path, "headers": dict(self.headers),
                                          "body": self.rfile.read(length) if length else b""})
                if redirect_to:
                    self.send_response(302)
                    self.send_header("Location", redirect_to)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = b'{"number": 1, "id": 1, "title": "t", "state": "open", "labels": [], "assignees": []}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PATCH = _any

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
        assert not self.thread.is_alive()


@pytest.fixture
def listener():
    server = Listener()
    yield server
    server.close()


@pytest.fixture
def strict_outbound(settings):
    """The production default: no non-public address allowed, no plain http."""
    settings.PAPERCLIP = {**settings.PAPERCLIP, "OUTBOUND_ALLOWED_HOSTS": [], "OUTBOUND_ALLOW_HTTP": False}


@pytest.fixture
def admin_http(live_server):
    """An httpx client logged in as a company owner on the live server (session + CSRF token)."""
    company = CompanyFactory()
    user = MembershipFactory(company=company, role="owner").user
    django_client = Client()
    django_client.force_login(user)
    csrf = "a" * 32
    client = httpx.Client(base_url=f"{live_server.url}/api", timeout=30, trust_env=False,
                          cookies={django_settings.SESSION_COOKIE_NAME:
                                   django_client.cookies[django_settings.SESSION_COOKIE_NAME].value,
                                   django_settings.CSRF_COOKIE_NAME: csrf},
                          headers={"X-CSRFToken": csrf})
    client.company = company
    yield client
    client.close()


def create_connector(client, **overrides):
    body = {"name": "Tracker", "provider": "github_issues", "containers": ["acme/site"],
            "credentials": {"value": "tok-123"}, **overrides}
    return client.post(f"/companies/{client.company.pk}/connectors", json=body)


# --- env: references stay inside the allow-list -------------------------------------------------
@pytest.mark.parametrize("name", ["SECRET_KEY", "DATABASE_URL", "CELERY_BROKER_URL", "PAPERCLIP_SECRETS_KEY",
                                  "HOME", "UNLISTED_TOKEN"])
def test_an_admin_cannot_reference_the_servers_own_variables(admin_http, listener, monkeypatch, name):
    monkeypatch.setenv(name, "server-only-value")
    for field in ("credentials", "webhookSecret"):
        response = create_connector(admin_http, baseUrl=listener.url, **{field: f"env:{name}"})
        assert response.status_code == 400, response.text
        error = error_of(response)
        assert error["code"] == "validation_error" and list(error["details"]) == [field], error
        assert name in error["details"][field][0] and "server-only-value" not in response.text
    assert ConnectorInstance.objects.count() == 0
    assert listener.requests == []


def test_the_server_variables_stay_refused_even_when_the_allow_list_matches_them(admin_http, settings, monkeypatch):
    settings.PAPERCLIP = {**settings.PAPERCLIP, "SECRET_ENV_ALLOWLIST": ["*"]}
    monkeypatch.setenv("SECRET_KEY", "server-only-value")
    monkeypatch.setenv("ANY_TENANT_TOKEN", "tenant-value")
    refused = create_connector(admin_http, credentials="env:SECRET_KEY")
    assert refused.status_code == 400 and "server's own configuration" in refused.text
    assert create_connector(admin_http, credentials="env:ANY_TENANT_TOKEN").status_code == 201


def test_an_allow_listed_reference_is_accepted_and_reads_back_as_a_reference(admin_http, monkeypatch):
    monkeypatch.setenv("PAPERCLIP_SECRET_ACME_GITHUB", "ghp_tenant_token")
    response = create_connector(admin_http, credentials="env:PAPERCLIP_SECRET_ACME_GITHUB")
    assert response.status_code == 201, response.text
    detail = admin_http.get(f"/connectors/{response.json()['id']}")
    assert detail.json()["credentialsRef"] == "env:PAPERCLIP_SECRET_ACME_GITHUB"
    assert "ghp_tenant_token" not in detail.text


def test_an_unset_reference_is_refused_at_creation(admin_http):
    response = create_connector(admin_http, credentials="env:PAPERCLIP_SECRET_NEVER_EXPORTED")
    assert response.status_code == 400
    assert "not set" in error_of(response)["details"]["credentials"][0]
    assert ConnectorInstance.objects.count() == 0


def test_a_row_written_before_the_rule_is_refused_when_used(admin_http, listener, monkeypatch):
    """An instance stored with env:SECRET_KEY before the allow-list existed: every action that
    needs the credentials answers a clear 4xx, records a health entry and sends nothing."""
    monkeypatch.setenv("SECRET_KEY", "server-only-value")
    created = create_connector(admin_http, baseUrl=listener.url)
    assert created.status_code == 201, created.text
    instance_id = created.json()["id"]
    ConnectorInstance.objects.filter(pk=instance_id).update(credentials_ref="env:SECRET_KEY")

    response = admin_http.post(f"/connectors/{instance_id}/import",
                               json={"externalKey": "acme/site#1", "idempotencyKey": "imp-1"})
    assert response.status_code == 422, response.text
    error = error_of(response)
    assert error["code"] == "secret_unavailable" and "SECRET_KEY" in error["details"]["credentials"][0]
    mapping = admin_http.post(f"/connectors/{instance_id}/check-mapping")
    assert mapping.status_code < 500
    assert "server-only-value" not in response.text + mapping.text
    assert listener.requests == []

    from connectors.services.polling import instance_poll

    instance_poll(instance_id=instance_id)
    assert SyncError.objects.filter(instance_id=instance_id, message__contains="SECRET_KEY").exists()
    health = admin_http.get(f"/connectors/{instance_id}/health").json()
    assert any("SECRET_KEY" in e["message"] for e in health["errors"]), health
    assert listener.requests == []


def test_a_connector_whose_credentials_vanished_answers_4xx_on_every_action(admin_http, listener, monkeypatch):
    monkeypatch.setenv("PAPERCLIP_SECRET_SOON_GONE", "tok")
    created = create_connector(admin_http, baseUrl=listener.url, credentials="env:PAPERCLIP_SECRET_SOON_GONE")
    assert created.status_code == 201, created.text
    instance_id = created.json()["id"]
    monkeypatch.delenv("PAPERCLIP_SECRET_SOON_GONE")
    response = admin_http.post(f"/connectors/{instance_id}/import",
                               json={"externalKey": "acme/site#1", "idempotencyKey": "imp-1"})
    assert response.status_code == 422 and error_of(response)["code"] == "secret_unavailable"
    rotate = admin_http.post(f"/connectors/{instance_id}/credentials",
                             json={"credentials": "env:PAPERCLIP_SECRET_SOON_GONE", "idempotencyKey": "rot-1"})
    assert rotate.status_code == 400 and "credentials" in error_of(rotate)["details"]
    assert listener.requests == []


# --- stored secrets belong to their company -------------------------------------------------------
def test_another_companys_stored_secret_is_a_404(admin_http):
    from connectors import secrets

    other = CompanyFactory()
    foreign = secrets.secret_store(company=other, name="theirs", value="their-token")
    response = create_connector(admin_http, credentials=foreign)
    assert response.status_code == 404, response.text
    assert error_of(response)["code"] == "not_found" and "their-token" not in response.text
    assert ConnectorInstance.objects.count() == 0
    own = create_connector(admin_http, name="Own", credentials={"value": "mine"})
    assert own.status_code == 201
    ref = own.json()["credentialsRef"]
    assert ref.startswith("secret:") and "mine" not in own.text
    assert not ConnectorSecret.objects.filter(ciphertext__contains="mine").exists()


# --- outbound requests go only where they may ----------------------------------------------------
@pytest.mark.parametrize("url", ["https://169.254.169.254/latest/meta-data/", "https://10.0.0.5/",
                                 "https://192.168.1.10:8443/", "https://[::1]/", "https://127.0.0.1/",
                                 "https://[::ffff:169.254.169.254]/", "https://100.100.100.200/",
                                 "http://example.com/", "file:///etc/passwd", "https://user:pw@example.com/"])
def test_a_base_url_of_a_non_public_address_is_refused(admin_http, strict_outbound, url):
    response = create_connector(admin_http, baseUrl=url)
    assert response.status_code == 400, (url, response.text)
    assert list(error_of(response)["details"]) == ["baseUrl"]
    assert ConnectorInstance.objects.count() == 0


def test_an_operator_allows_a_self_hosted_tracker_by_configuration(admin_http, strict_outbound, settings):
    assert create_connector(admin_http, baseUrl="https://10.0.0.5/").status_code == 400
    settings.PAPERCLIP = {**settings.PAPERCLIP, "OUTBOUND_ALLOWED_HOSTS": ["10.0.0.0/24"]}
    assert create_connector(admin_http, baseUrl="https://10.0.0.5/").status_code == 201
    settings.PAPERCLIP = {**settings.PAPERCLIP, "OUTBOUND_ALLOWED_HOSTS": ["jira.internal:8443"]}
    assert create_connector(admin_http, name="Jira", baseUrl="https://jira.internal:8443/").status_code == 201


def test_allowing_a_host_never_allows_a_refused_secret(admin_http, listener, monkeypatch, settings):
    settings.PAPERCLIP = {**settings.PAPERCLIP, "OUTBOUND_ALLOWED_HOSTS": [f"127.0.0.1:{listener.port}"]}
    monkeypatch.setenv("DATABASE_URL", "postgres://secret@db/prod")
    response = create_connector(admin_http, baseUrl=listener.url, credentials="env:DATABASE_URL")
    assert response.status_code == 400 and listener.requests == []


def test_requests_are_refused_before_a_byte_is_sent(listener, strict_outbound):
    with guarded_client(timeout=5) as client:
        with pytest.raises(OutboundRefused):
            client.get(listener.url)  # plain http, loopback not allowed
        with pytest.raises(OutboundRefused):
            client.get(f"https://127.0.0.1:{listener.port}/")  # loopback not allowed
    assert listener.requests == []


def test_plain_http_needs_the_setting_even_for_an_allowed_loopback_host(listener, settings):
    settings.PAPERCLIP = {**settings.PAPERCLIP, "OUTBOUND_ALLOWED_HOSTS": ["127.0.0.1"], "OUTBOUND_ALLOW_HTTP": False}
    with guarded_client(timeout=5) as client, pytest.raises(OutboundRefused):
        client.get(listener.url)
    settings.PAPERCLIP = {**settings.PAPERCLIP, "OUTBOUND_ALLOW_HTTP": True}
    with guarded_client(timeout=5) as client:
        assert client.get(listener.url).status_code == 200
    assert len(listener.requests) == 1


def test_dns_rebinding_is_caught_at_the_address_actually_connected(listener, settings, monkeypatch):
    """The name resolves to a public address when the configuration is checked and to loopback
    when the request is made: the connection is refused and the listener gets nothing."""
    settings.PAPERCLIP = {**settings.PAPERCLIP, "OUTBOUND_ALLOWED_HOSTS": [], "OUTBOUND_ALLOW_HTTP": True}
    answers = iter(["93.184.216.34", "127.0.0.1"])
    real = socket.getaddrinfo

    def rebinding(host, port, *args, **kwargs):
        if host == "tracker.rebind.test":
            address = next(answers)
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(outbound_http.socket, "getaddrinfo", rebinding)
    assert outbound_http.url_refusal(f"https://tracker.rebind.test:{listener.port}/") is None  # looks public
    with guarded_client(timeout=5) as client, pytest.raises(OutboundRefused, match="127.0.0.1"):
        client.get(f"https://tracker.rebind.test:{listener.port}/")
    assert listener.requests == []


def test_the_connection_goes_to_the_checked_address(listener, settings, monkeypatch):
    """A name is resolved once: the guard connects to the address it checked."""
    settings.PAPERCLIP = {**settings.PAPERCLIP, "OUTBOUND_ALLOWED_HOSTS": ["127.0.0.1"], "OUTBOUND_ALLOW_HTTP": True}
    lookups = []
    real = socket.getaddrinfo

    def counting(host, port, *args, **kwargs):
        lookups.append(host)
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(outbound_http.socket, "getaddrinfo", counting)
    with guarded_client(timeout=5) as client:
        assert client.get(f"http://localhost:{listener.port}/x").status_code == 200
    # The name is looked up once; the socket is then opened on the literal address that was checked.
    assert lookups == ["localhost", "127.0.0.1"]
    assert listener.requests[0]["headers"]["Host"] == f"localhost:{listener.port}"


def test_a_redirect_to_a_denied_address_is_not_followed(settings):
    settings.PAPERCLIP = {**settings.PAPERCLIP, **LOOPBACK_OUTBOUND}
    redirector = Listener(redirect_to="http://169.254.169.254/latest/meta-data/")
    try:
        with guarded_client(timeout=5) as client:
            response = client.get(redirector.url)
        assert response.status_code == 302 and len(redirector.requests) == 1
        with pytest.raises(ValueError):
            guarded_client(follow_redirects=True)
    finally:
        redirector.close()


# --- agent adapter configuration obeys the same rules --------------------------------------------
def _agent_create(company, **config):
    from issues.services.companies import agent_create

    return agent_create(company=company, name="Wake", adapter_type=config.pop("adapter_type"),
                        adapter_config=config)


@pytest.mark.parametrize("config", [
    {"adapter_type": "process", "command": ["true"], "env": {"K": {"secret_ref": "env:SECRET_KEY"}}},
    {"adapter_type": "process", "command": ["true"], "env": {"K": {"secret_ref": "env:DATABASE_URL"}}},
    {"adapter_type": "http", "url": "https://agents.example.com/wake", "secret_ref": "env:SECRET_KEY"},
    {"adapter_type": "http", "url": "https://169.254.169.254/wake", "secret_ref": "env:PAPERCLIP_SECRET_WAKE"},
    {"adapter_type": "http", "url": "http://agents.example.com/wake", "secret_ref": "env:PAPERCLIP_SECRET_WAKE"},
])
def test_agent_adapter_configs_are_refused_at_write_time(config, strict_outbound):
    from issues.exceptions import InvalidInput

    company = CompanyFactory()
    with pytest.raises(InvalidInput) as caught:
        _agent_create(company, **config)
    assert list(caught.value.details) == ["adapterConfig"]
    assert not Agent.objects.filter(company=company).exists()


def test_a_process_agent_stored_with_a_refused_reference_fails_without_leaking(monkeypatch, tmp_path):
    monkeypatch.setenv("SECRET_KEY", "server-only-value")
    agent = AgentFactory(adapter_type="process", adapter_config={
        "command": ["python3", "-c", "import os; print(os.environ.get('LEAK'))"],
        "env": {"LEAK": {"secret_ref": "env:SECRET_KEY"}}})
    run = RunFactory(agent=agent, issue=IssueFactory(company=agent.company, assignee_agent=agent))
    result = get_adapter("process").execute(prepare_context(run, owner="test"))
    assert result.status == RunStatus.FAILED and "SECRET_KEY" in result.error
    assert "server-only-value" not in result.error
    assert not run.events.filter(message__contains="server-only-value").exists()


def test_an_http_agent_stored_with_a_metadata_url_sends_nothing(monkeypatch, strict_outbound):
    monkeypatch.setenv("PAPERCLIP_SECRET_WAKE", "wake-secret")
    agent = AgentFactory(adapter_type="http", adapter_config={"url": "https://169.254.169.254/wake",
                                                              "secret_ref": "env:PAPERCLIP_SECRET_WAKE"})
    run = RunFactory(agent=agent, issue=IssueFactory(company=agent.company, assignee_agent=agent))
    result = get_adapter("http").execute(prepare_context(run, owner="test"))
    assert result.status == RunStatus.FAILED and "169.254.169.254" in result.error


def test_an_http_agent_wake_to_an_allowed_receiver_is_delivered(monkeypatch, listener, settings):
    settings.PAPERCLIP = {**settings.PAPERCLIP, "OUTBOUND_ALLOWED_HOSTS": [f"127.0.0.1:{listener.port}"],
                          "OUTBOUND_ALLOW_HTTP": True}
    monkeypatch.setenv("PAPERCLIP_SECRET_WAKE", "wake-secret")
    agent = AgentFactory(adapter_type="http", adapter_config={"url": f"{listener.url}/wake",
                                                              "secret_ref": "env:PAPERCLIP_SECRET_WAKE"})
    run = RunFactory(agent=agent, issue=IssueFactory(company=agent.company, assignee_agent=agent))
    assert get_adapter("http").execute(prepare_context(run, owner="test")) is None
    assert [r["path"] for r in listener.requests] == ["/wake"]
