"""The Content-Security-Policy holds beyond the console: Django's admin and the API docs (Swagger UI,
ReDoc) run in headless Chromium under their policies, with no script, style or connection refused."""
import pytest
from playwright.sync_api import expect

from tests.factories import CompanyFactory, UserFactory

from .conftest import log_in

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def refused(page):
    """What Chromium refused under the page's policy (it reports each refusal on the console)."""
    seen = []
    page.on("console", lambda message: seen.append(message.text)
            if "Content Security Policy" in message.text or "Refused to" in message.text else None)
    return seen


def test_the_admin_runs_under_the_csp(page, refused):
    CompanyFactory(name="Acme Robotics")
    staff = UserFactory(is_staff=True, is_superuser=True)
    log_in(page, staff, next_url="/admin/")
    response = page.goto("/admin/issues/company/")
    assert "script-src 'self';" in response.headers["content-security-policy"]
    expect(page.get_by_role("link", name="Acme Robotics")).to_be_visible()
    page.get_by_role("link", name="Acme Robotics").click()
    expect(page.get_by_label("Name:")).to_have_value("Acme Robotics")
    assert page.evaluate("typeof django.jQuery") == "function"  # the admin's own scripts ran
    assert refused == []


def test_redoc_and_swagger_ui_run_under_the_api_docs_csp(page, refused):
    # ReDoc's "API docs by Redocly" logo comes from its CDN: refused on purpose (no third-party request;
    # ReDoc hides the image when it does not load). Nothing else is refused.
    with page.expect_console_message(lambda message: "https://cdn.redoc.ly/" in message.text) as logo:
        response = page.goto("/api/redoc/")
    assert "img-src" in logo.value.text
    refused.remove(logo.value.text)
    policy = response.headers["content-security-policy"]
    assert "script-src 'self';" in policy and "connect-src 'self'" in policy
    expect(page.get_by_role("heading", name="Paperclip API").first).to_be_visible()  # ReDoc read the schema
    page.goto("/api/docs/")  # (last: the fixture's full-page screenshot of ReDoc's long page times out)
    expect(page.get_by_role("button", name="GET /api/agent-tools/connector/conflicts", exact=True)).to_be_visible()
    assert refused == []
