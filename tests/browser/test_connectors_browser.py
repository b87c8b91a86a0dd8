"""Connector pages in headless Chromium: the health page with its live queue, the conflict queue with
a two-step resolution through conflict_resolve, and the issue page's link panel."""
import re

import pytest
from playwright.sync_api import expect

from connectors.models import Conflict, InboundEvent, TaskLink
from connectors.services.instances import instance_create
from issues.actors import SYSTEM
from tests.factories import AgentFactory, CompanyFactory, IssueFactory, MembershipFactory

from .conftest import log_in

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def linked(monkeypatch):
    for name in ("PAPERCLIP_SECRET_GH_TOKEN_BROWSER", "PAPERCLIP_SECRET_GH_SECRET_BROWSER"):
        monkeypatch.setenv(name, "exported-by-the-deployment")  # references must resolve when created
    company = CompanyFactory(name="Acme Robotics")
    owner = MembershipFactory(company=company, role="owner").user
    agent = AgentFactory(company=company, name="Linus")
    instance = instance_create(actor=SYSTEM, company=company, name="GitHub", provider_key="github_issues",
                               credentials="env:PAPERCLIP_SECRET_GH_TOKEN_BROWSER", webhook_secret="env:PAPERCLIP_SECRET_GH_SECRET_BROWSER",
                               containers=["acme/site"])
    issue = IssueFactory(company=company, title="Rewrite the onboarding guide", assignee_agent=agent)
    link = TaskLink.objects.create(
        company=company, instance=instance, provider_key="github_issues", issue=issue, external_task_id="101",
        external_key="acme/site#7", external_title="Update the onboarding guide for v2",
        external_url="https://example.invalid/acme/site/issues/7", external_state_name="open",
        external_state_category="active", status="conflict", sync_mode="bidirectional",
        routing={"kind": "default_route", "agentName": "Linus", "ruleId": 1})
    conflict = Conflict.objects.create(
        company=company, instance=instance, link=link, kind="field", field="title",
        base_value="Update the onboarding guide", external_value="Update the onboarding guide for v2",
        paperclip_value="Rewrite the onboarding guide", actors={"external": "octocat", "paperclip": "Linus"})
    return {"owner": owner, "instance": instance, "issue": issue, "link": link, "conflict": conflict}


def test_health_page_live_queue_then_resolve_a_conflict_from_the_queue(page, linked):
    instance, conflict = linked["instance"], linked["conflict"]
    log_in(page, linked["owner"], "/connectors/")
    expect(page.get_by_role("heading", name="Connectors")).to_be_visible()
    page.get_by_role("link", name="GitHub", exact=True).click()
    expect(page.get_by_role("heading", name="GitHub", exact=True)).to_be_visible()
    expect(page.locator("#queue-depth .tile-n")).to_have_text("0")
    expect(page.locator("#live-note")).to_contain_text("Live")

    # An event arrives: the polled fragment shows it without a reload.
    page.evaluate("window.__samePage = true")
    InboundEvent.objects.create(instance=instance, company=instance.company, idempotency_key="browser-1",
                                kind="task.upserted", external_task_id="101")
    expect(page.locator("#queue-depth .tile-n")).to_have_text("1", timeout=15_000)
    assert page.evaluate("window.__samePage") is True

    page.get_by_role("navigation", name="Main").get_by_role("link", name="Conflicts").click()
    card = page.locator(f"#conflict-{conflict.pk}")
    expect(card).to_contain_text("Update the onboarding guide for v2")
    expect(card).to_contain_text("Rewrite the onboarding guide")
    expect(card.locator("ins").last).to_have_text("for v2")
    card.get_by_role("button", name="Keep external…").click()
    confirm = page.locator(f"#conflict-{conflict.pk}")
    expect(confirm).to_contain_text("written to the Paperclip issue")
    conflict.refresh_from_db()
    assert conflict.status == "open"  # nothing happens before the confirmation
    confirm.get_by_role("button", name="Confirm: Keep external").click()
    expect(page.locator("#messages")).to_contain_text("keep external done")
    expect(page.locator(f"#conflict-{conflict.pk}")).to_have_count(0)
    conflict.refresh_from_db()
    assert (conflict.status, conflict.resolution, conflict.resolved_by_user) == (
        "resolved", "keep_external", linked["owner"])
    linked["issue"].refresh_from_db()
    assert linked["issue"].title == "Update the onboarding guide for v2"


def test_issue_page_link_panel_pause_and_resume(page, linked):
    issue, link = linked["issue"], linked["link"]
    log_in(page, linked["owner"], f"/issues/{issue.identifier}/")
    panel = page.locator("#link-panel")
    expect(panel).to_contain_text("acme/site#7")
    expect(panel).to_contain_text("default_route")
    expect(panel.get_by_role("link", name=re.compile("Resolve conflict"))).to_be_visible()
    panel.get_by_role("button", name="Pause").click()
    expect(page.locator("#messages")).to_contain_text("paused")
    expect(page.locator("#link-panel .badge.link-paused")).to_be_visible()
    page.locator("#link-panel").get_by_role("button", name="Resume").click()
    expect(page.locator("#messages")).to_contain_text("resumed")
    link.refresh_from_db()
    assert link.status == "conflict"  # back where it was: the conflict is still open
