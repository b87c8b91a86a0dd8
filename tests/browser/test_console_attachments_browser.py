"""The issue page's Attachments card in headless Chromium: a multipart upload through htmx and the
two-step delete (no JavaScript dialog), under the console's Content-Security-Policy."""
import re

import pytest
from playwright.sync_api import expect

from issues import selectors
from issues.models import Attachment
from tests.factories import CompanyFactory, IssueFactory, MembershipFactory

from .conftest import log_in

pytestmark = pytest.mark.django_db(transaction=True)

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4


def test_upload_open_and_delete_an_attachment(page):
    company = CompanyFactory(name="Acme Robotics")
    owner = MembershipFactory(company=company, role="owner").user
    issue = IssueFactory(company=company, title="Ship the landing page")
    refused = []
    page.on("console", lambda message: refused.append(message.text)
            if "Content Security Policy" in message.text or "Refused to" in message.text else None)

    log_in(page, owner, f"/issues/{issue.identifier}/")
    card = page.locator("#attachments")
    expect(card).to_contain_text("No attachments.")
    page.evaluate("window.__samePage = true")  # survives only if htmx swaps instead of navigating
    page.get_by_label("Attach a file").set_input_files(
        {"name": "shot.png", "mimeType": "image/png", "buffer": PNG})
    card.get_by_role("button", name="Upload").click()
    expect(page.locator("#messages")).to_contain_text("Attached “shot.png”.")
    link = page.locator("#attachments").get_by_role("link", name="shot.png")
    expect(link).to_have_attribute("target", "_blank")
    assert page.evaluate("window.__samePage") is True
    attachment = Attachment.objects.get(issue=issue)
    assert selectors.attachment_content(attachment).read() == PNG

    content = page.request.get(link.get_attribute("href"))  # the board session reads the bytes
    assert content.status == 200 and content.body() == PNG

    card = page.locator("#attachments")
    expect(card.get_by_role("button", name="Confirm delete")).to_be_hidden()
    card.get_by_text("Delete…").click()
    card.get_by_role("button", name="Confirm delete").click()
    expect(page.locator("#messages")).to_contain_text("Deleted “shot.png”.")
    expect(page.locator("#attachments")).to_contain_text("No attachments.")
    expect(page).to_have_url(re.compile(rf"/issues/{issue.identifier}/"))
    assert not Attachment.objects.filter(issue=issue).exists()
    assert refused == []
