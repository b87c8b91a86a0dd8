"""The operator's main flows in headless Chromium against the live test server."""
import re

import pytest
from playwright.sync_api import expect

from cases import services as case_services
from cases.models import WorkflowDefinition
from issues.actors import Actor
from issues.models import Agent, AgentApiKey, HeartbeatRun, Interaction
from issues.models.agent import hash_key
from issues.services.runs import run_append_event, run_finish
from issues.services.thread import document_write, interaction_create
from tests.factories import AgentFactory, CompanyFactory, IssueFactory, MembershipFactory, RunFactory

from .conftest import log_in

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def owner():
    company = CompanyFactory(name="Acme Robotics", enable_cases=True)
    return MembershipFactory(company=company, role="owner").user


def company_of(user):
    return user.memberships.get().company


def test_login_dashboard_filter_open_issue_and_accept_a_confirmation(page, owner):
    company = company_of(owner)
    board = Actor(user=owner)
    agent = AgentFactory(company=company, name="Linus", budget_monthly_cents=5000, spent_monthly_cents=1000)
    issue = IssueFactory(company=company, title="Ship the landing page", assignee_agent=agent)
    IssueFactory(company=company, title="Archive old logs", status="done")
    document_write(actor=board, issue=issue, key="plan", body="1. Build\n2. Ship\n", title="Plan")
    interaction = interaction_create(actor=board, issue=issue, kind="request_confirmation",
                                     title="Approve the plan", document_key="plan")

    log_in(page, owner)
    expect(page.get_by_role("heading", name="Dashboard")).to_be_visible()
    expect(page.get_by_role("link", name="Linus")).to_be_visible()
    expect(page.locator(".tile", has_text="pending interactions")).to_contain_text("1")

    page.get_by_role("navigation", name="Main").get_by_role("link", name="Issues").click()
    expect(page.get_by_role("heading", name="Issues")).to_be_visible()
    page.evaluate("window.__samePage = true")  # survives only if htmx swaps instead of navigating
    page.get_by_label("Status").fill("done")
    page.get_by_label("Status").press("Enter")
    expect(page.locator("#issue-results")).to_contain_text("Archive old logs")
    expect(page.locator("#issue-results")).not_to_contain_text("Ship the landing page")
    expect(page).to_have_url(re.compile(r"status=done"))
    assert page.evaluate("window.__samePage") is True

    page.get_by_label("Status").fill("")
    page.get_by_label("Search").fill("landing")  # typing triggers the search after a pause
    expect(page.locator("#issue-results")).not_to_contain_text("Archive old logs")
    page.locator("#issue-results").get_by_role("link", name="Ship the landing page").click()

    expect(page.get_by_role("heading", name=re.compile("Ship the landing page"))).to_be_visible()
    card = page.locator(f"#interaction-{interaction.pk}")
    expect(card).to_contain_text("Pending")
    card.get_by_role("button", name="Accept").click()
    expect(page.locator("#messages")).to_contain_text("“Approve the plan” accepted.")
    expect(page.locator(f"#interaction-{interaction.pk}")).to_contain_text("Accepted")
    interaction.refresh_from_db()
    assert interaction.status == "accepted" and interaction.responded_by_id == owner.pk


def test_workflow_definition_with_a_safe_markdown_preview(page, owner):
    log_in(page, owner, "/workflows/")
    page.get_by_role("link", name="New workflow").click()
    page.get_by_label("Name").fill("Incident response")
    prompt = ("# Respond\n\n1. **Page** the on-call\n2. Write the timeline\n\n"
              "<script>window.__pwned = true; alert('x')</script>\n\n<img src=x onerror=\"window.__pwned = true\">")
    page.locator("#id_prompt").fill(prompt)
    preview = page.locator("#preview")
    expect(preview.get_by_role("heading", name="Respond")).to_be_visible()
    expect(preview.locator("strong")).to_have_text("Page")
    expect(preview.locator("script")).to_have_count(0)
    expect(preview).not_to_contain_text("window.__pwned")
    assert "onerror" not in preview.inner_html()
    assert page.evaluate("window.__pwned") is None

    page.get_by_role("button", name="Create").click()
    expect(page.get_by_role("heading", name="Incident response")).to_be_visible()
    definition = WorkflowDefinition.objects.get(company=company_of(owner), name="Incident response")
    expect(page.locator("#fingerprint")).to_have_text(definition.fingerprint)
    expect(page.locator("#rendered-prompt").get_by_role("heading", name="Respond")).to_be_visible()
    expect(page.locator("#rendered-prompt script")).to_have_count(0)
    assert page.evaluate("window.__pwned") is None


def test_case_list_sorts_and_groups(page, owner):
    company = company_of(owner)
    board = Actor(user=owner)
    for title, case_type in [("Charlie", "bug"), ("Alpha", "feature"), ("Bravo", "bug")]:
        case_services.case_create(actor=board, company=company, case_type=case_type, title=title, kickoff="k",
                                  workflow_document_text="w")
    log_in(page, owner, "/cases/")
    titles = page.locator("#case-results tbody tr[id^=case-] td:nth-child(2)")
    expect(titles).to_have_count(3)

    page.get_by_label("Sort by").select_option("title")
    page.get_by_label("Direction").select_option("asc")
    expect(titles).to_have_text(["Alpha", "Bravo", "Charlie"])
    expect(page).to_have_url(re.compile(r"sortField=title"))

    page.get_by_label("Direction").select_option("desc")
    expect(titles).to_have_text(["Charlie", "Bravo", "Alpha"])

    page.get_by_label("Group by").select_option("type")
    expect(page.locator("#case-results .group-row")).to_have_count(2)
    expect(page.locator("#case-results .group-row th")).to_have_text([re.compile("^bug"), re.compile("^feature")])
    expect(titles).to_have_text(["Charlie", "Bravo", "Alpha"])


def test_agent_create_and_api_key_shown_once(page, owner):
    log_in(page, owner, "/agents/")
    form = page.locator("#new-agent")
    form.get_by_label("Name").fill("Grace")
    form.get_by_label("Role").select_option("qa")
    form.get_by_label("Monthly budget ($)").fill("20")
    form.get_by_role("button", name="Create agent").click()
    expect(page.get_by_role("heading", name="Grace")).to_be_visible()
    agent = Agent.objects.get(company=company_of(owner), name="Grace")
    assert agent.budget_monthly_cents == 2000

    page.get_by_label("Key name").fill("laptop")
    page.get_by_role("button", name="Create key").click()
    raw = page.locator("#raw-key").inner_text()
    assert raw.startswith("pcp_")
    key = AgentApiKey.objects.get(agent=agent, name="laptop")
    assert key.key_hash == hash_key(raw)

    page.goto(f"/agents/{agent.pk}/")  # a later visit never shows it again
    expect(page.locator("#raw-key")).to_have_count(0)
    expect(page.locator(f"#key-{key.pk}")).to_contain_text(key.prefix)
    assert raw not in page.content()

    page.get_by_role("button", name="Pause").click()
    expect(page.locator("#agent-status")).to_have_text("Paused")
    page.get_by_role("button", name="Resume").click()
    expect(page.locator("#agent-status")).to_have_text("Idle")


def test_run_log_tail_follows_a_live_run_until_it_ends(page, owner):
    company = company_of(owner)
    agent = AgentFactory(company=company, name="Linus")
    run = RunFactory(agent=agent, status="running")
    run_append_event(run_id=run.pk, kind="stdout", message="checking out PAP-1")
    log_in(page, owner, f"/runs/{run.pk}/")
    expect(page.locator("#run-log")).to_contain_text("checking out PAP-1")

    run_append_event(run_id=run.pk, kind="stdout", message="posted a comment")
    expect(page.locator("#run-log")).to_contain_text("posted a comment")  # appended by the poll

    run_finish(run=HeartbeatRun.objects.get(pk=run.pk), status="succeeded")
    expect(page.locator("#log-end")).to_contain_text("Run ended: Succeeded")
    expect(page.locator("#run-status")).to_contain_text("Succeeded")
    expect(page.locator("#log-poller")).to_have_count(0)  # the 286 answer ended the polling
    assert page.locator(".log-line").count() == 2


def test_a_viewer_sees_no_actions(page):
    company = CompanyFactory(enable_cases=True)
    viewer = MembershipFactory(company=company, role="viewer").user
    owner = Actor(user=MembershipFactory(company=company, role="owner").user)
    issue = IssueFactory(company=company, title="Read me")
    interaction_create(actor=owner, issue=issue, kind="request_confirmation", title="Confirm")
    log_in(page, viewer, f"/issues/{issue.identifier}/")
    expect(page.get_by_role("heading", name=re.compile("Read me"))).to_be_visible()
    expect(page.get_by_role("button", name="Accept")).to_have_count(0)
    expect(page.get_by_role("button", name="Comment")).to_have_count(0)
    expect(page.get_by_text("Waiting for an operator.")).to_be_visible()
    assert Interaction.objects.get(issue=issue).status == "pending"


def test_hand_off_a_case_adopting_a_workflow(page, owner):
    company = company_of(owner)
    board = Actor(user=owner)
    agent = AgentFactory(company=company, name="Linus")
    release = case_services.workflow_definition_create(actor=board, company=company, name="Release",
                                                       prompt="# Release\n\n- tag\n- deploy")
    case, _ = case_services.case_create(actor=board, company=company, case_type="change", title="Q3 price change",
                                        kickoff="k", workflow_document_text="# Old steps")
    log_in(page, owner, f"/cases/{case.identifier}/")
    form = page.locator("#handoff-form")
    form.get_by_label("To").select_option(label="Linus")
    form.get_by_label("Workflow").select_option(label="Adopt “Release”")
    form.get_by_label("Phase (empty: unchanged)").fill("ship")
    form.get_by_role("button", name="Hand off").click()
    expect(page.locator("#messages")).to_contain_text("Handoff applied.")
    row = page.locator("#handoffs-section tbody tr").first
    expect(row).to_contain_text("Adopt")
    expect(row).to_contain_text("Release")
    expect(row).to_contain_text("ship")
    expect(row).to_contain_text("Applied")
    case.refresh_from_db()
    assert case.current_workflow_id == release.pk and case.phase == "ship"
    assert case.primary_task.assignee_agent_id == agent.pk
