"""Setting a connector up in headless Chromium: New connector → Linear → the form (explained, the state
mapping pre-filled, a typed token stored encrypted) → a refused save keeps the input → the created connector's
page shows the mapping check's findings against the sandbox's live workflow (an unmapped state) and the
webhook URL."""
import re

import pytest
from playwright.sync_api import expect

from connectors import secrets
from connectors.models import ConnectorInstance
from connectors.providers.linear import LinearAdapter
from connectors.services.instances import webhook_url
from tests.factories import AgentFactory, CompanyFactory, MembershipFactory
from tests.linear_sandbox import SANDBOX_TEAM, SANDBOX_TOKEN

from .conftest import log_in

pytestmark = pytest.mark.django_db(transaction=True)


def test_create_a_linear_connector_see_the_findings_and_the_webhook_url(page, linear_sandbox):
    linear_sandbox.add_team("OPS", states=(("Queue", "unstarted"), ("Parked", "paused"), ("Live", "completed")))
    company = CompanyFactory(name="Acme Robotics")
    admin = MembershipFactory(company=company, role="admin").user
    AgentFactory(company=company, name="Linus")

    log_in(page, admin, "/connectors/")
    page.get_by_role("link", name="New connector").first.click()
    expect(page.get_by_role("heading", name="New connector")).to_be_visible()
    page.locator("#provider-linear").get_by_role("link", name="Linear").click()
    expect(page.get_by_role("heading", name="New Linear connector")).to_be_visible()
    expect(page.locator("#help-containers")).to_have_text(LinearAdapter.setup_help["containers"])
    expect(page.get_by_label("State mapping (JSON)")).to_have_value(LinearAdapter.setup_help["stateMappingExample"])

    # a refused save: the service's error next to the field, the input kept, the typed token not rendered back
    page.get_by_label("Containers (one per line)").fill(f"{SANDBOX_TEAM}\nOPS")
    page.get_by_label("Base URL").fill(linear_sandbox.base_url)
    page.locator("#setup-credentials-new").fill(SANDBOX_TOKEN)
    page.get_by_label("State mapping (JSON)").fill('{"types": {"started": "working"}}')
    page.get_by_role("button", name="Create connector").click()
    expect(page.locator("#setup-errors")).to_contain_text("The connector was not created")
    expect(page.locator("#error-name")).to_be_visible()
    expect(page.get_by_label("Containers (one per line)")).to_have_value(f"{SANDBOX_TEAM}\nOPS")
    expect(page.locator("#setup-credentials-new")).to_have_value("")
    expect(page.locator("#dropped-credentials")).to_be_visible()
    assert SANDBOX_TOKEN not in page.content()
    assert not ConnectorInstance.objects.exists()

    page.get_by_label("Name", exact=True).fill("Linear ENG")
    page.locator("#setup-credentials-new").fill(SANDBOX_TOKEN)
    page.get_by_label("State mapping (JSON)").fill(LinearAdapter.setup_help["stateMappingExample"])
    page.get_by_role("button", name="Create connector").click()

    expect(page.get_by_role("heading", name="Linear ENG", exact=True)).to_be_visible()
    expect(page.locator("#messages")).to_contain_text("Connector Linear ENG created.")
    findings = page.locator("#mapping-findings")
    expect(findings).to_contain_text("Checked against the live workflow after saving")
    expect(page.locator("#mapping-warnings")).to_contain_text("status 'Parked' in team OPS is unmapped")
    instance = ConnectorInstance.objects.get(name="Linear ENG")
    expect(page.locator("#webhook-url")).to_have_text(webhook_url(instance))
    assert re.match(r"^https?://.+/api/connectors/[0-9a-f-]{36}/webhook$", webhook_url(instance))
    assert SANDBOX_TOKEN not in page.content()
    assert secrets.resolve(instance.credentials_ref, company_id=company.pk) == SANDBOX_TOKEN

    # the first poll, from the page
    expect(page.locator("#poll-state")).to_contain_text("not polled yet")
    linear_sandbox.create_issue("Set up the pipeline", team=SANDBOX_TEAM)
    page.get_by_role("button", name="Poll now").click()
    expect(page.locator("#messages")).to_contain_text("1 task(s) changed")
    expect(page.locator("#poll-state")).to_contain_text("last poll")


def _sandbox(provider):
    """A started sandbox of ``provider`` and the connector fields the form takes for it."""
    import json

    from connectors.management.commands._demo_providers import PROVIDERS, sandbox_class
    from connectors.sandbox.github import GitHubSandbox

    if provider == "github_issues":
        sandbox = GitHubSandbox(repos=("demo/app",), token="gh-browser-token")
        fields = {"containers": ["demo/app"], "base_url": None,
                  "state_mapping": {"open": "backlog", "closed": "terminal"}}
    else:
        sandbox = sandbox_class(PROVIDERS[provider])(token=f"{provider}-browser-token")
        fields = None
    sandbox.start()
    fields = fields or sandbox.demo_instance_fields()
    credentials = getattr(sandbox, "credentials", None)
    return sandbox, {"containers": "\n".join(fields["containers"]), "base_url": fields.get("base_url") or
                     sandbox.base_url, "state_mapping": json.dumps(fields["state_mapping"]),
                     "credentials": credentials if isinstance(credentials, str) else sandbox.token}


@pytest.mark.parametrize("provider", ["github_issues", "jira", "asana", "trello", "notion"])
def test_every_provider_is_set_up_from_the_console(page, provider):
    """The same flow for the other providers, each against its sandbox: the provider's own help, a save that
    the service validates and the mapping check reads, then the page with the webhook URL and the webhook
    set-up the provider offers (registration, or Notion's handshake)."""
    from connectors.providers.base import adapter_class

    cls = adapter_class(provider)
    company = CompanyFactory(name="Acme Robotics")
    admin = MembershipFactory(company=company, role="admin").user
    sandbox, given = _sandbox(provider)
    try:
        log_in(page, admin, "/connectors/new/")
        page.locator(f"#provider-{provider}").get_by_role("link").first.click()
        expect(page.locator("#help-containers")).to_have_text(cls.setup_help["containers"])
        page.get_by_label("Name", exact=True).fill(f"{cls.display_name} board")
        page.get_by_label("Containers (one per line)").fill(given["containers"])
        page.get_by_label("Base URL").fill(given["base_url"])
        page.locator("#setup-credentials-new").fill(given["credentials"])
        page.get_by_label("State mapping (JSON)").fill(given["state_mapping"])
        page.get_by_role("button", name="Create connector").click()
        expect(page.get_by_role("heading", name=f"{cls.display_name} board", exact=True)).to_be_visible()
        instance = ConnectorInstance.objects.get(name=f"{cls.display_name} board", provider_key=provider)
        expect(page.locator("#webhook-url")).to_have_text(webhook_url(instance))
        expect(page.locator("#mapping-findings")).to_be_visible()
        registers = "register_webhook" in cls.capabilities.operations
        expect(page.get_by_role("button", name="Register webhooks")).to_have_count(1 if registers else 0)
        assert given["credentials"] not in page.content()
        assert secrets.resolve(instance.credentials_ref, company_id=company.pk) == given["credentials"]
    finally:
        sandbox.stop()
