#!/usr/bin/env python
"""Capture screenshots of the operator console for the README.

Seeds a throwaway SQLite database (in a temporary folder, never ``var/``), serves the console from
an in-process server on a free port, logs in with headless system Chromium (Playwright, no browser
download) and writes PNGs into ``docs/screenshots/``.

    .venv/bin/python scripts/console_screenshots.py [--out docs/screenshots]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PASSWORD = "screenshots-only"


def setup_django(tmp: Path):
    sys.path.insert(0, str(ROOT))
    os.environ["DATABASE_URL"] = f"sqlite:///{tmp / 'console.sqlite3'}"
    os.environ.pop("CELERY_BROKER_URL", None)
    os.environ["PAPERCLIP_WORKSPACE_ROOT"] = str(tmp / "workspaces")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "paperclip.settings")
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def seed():
    """A small company with everything the console shows, written through the services."""
    from django.contrib.auth import get_user_model

    from cases import handoffs
    from cases import services as case_services
    from issues.actors import Actor
    from issues.models import Project
    from issues.services.companies import agent_api_key_create, agent_create, company_create, membership_set
    from issues.services.dispatch import run_claim
    from issues.services.issues import issue_create, issue_update
    from issues.services.runs import run_append_event, run_finish
    from issues.services.thread import comment_create, document_write, interaction_create
    from issues.services.wakeups import agent_wakeup

    user = get_user_model().objects.create_user("operator", password=PASSWORD)
    company = company_create(name="Acme Robotics", issue_prefix="ACME", enable_cases=True)
    membership_set(company=company, user=user, role="owner")
    board = Actor(user=user)
    ada = agent_create(company=company, name="Ada", role="ceo", title="Chief Executive", budget_monthly_cents=50_000)
    linus = agent_create(company=company, name="Linus", role="engineer", title="Engineer", reports_to=ada,
                         adapter_type="process", budget_monthly_cents=20_000,
                         adapter_config={"command": ["python", "examples/heartbeat_agent.py"],
                                         "env": {"EXAMPLE_AGENT_MODE": "done"}})
    grace = agent_create(company=company, name="Grace", role="qa", title="QA", reports_to=ada)
    agent_api_key_create(agent=linus, name="worker")
    project = Project.objects.create(company=company, name="Website")

    parent, _ = issue_create(actor=board, company=company, title="Ship the landing page", priority="high",
                             project_id=project.pk, assignee_agent_id=ada.pk,
                             description="The **v1** landing page: hero, pricing, footer.\n\n- [x] copy\n- [ ] deploy")
    hero, _ = issue_create(actor=board, company=company, title="Write the hero copy", parent_id=parent.pk,
                           assignee_agent_id=linus.pk, project_id=project.pk)
    issue_create(actor=board, company=company, title="Build the pricing table", priority="high",
                 parent_id=parent.pk, assignee_agent_id=linus.pk)
    issue_create(actor=board, company=company, title="Set up analytics", priority="low", status="backlog")
    footer, _ = issue_create(actor=board, company=company, title="Fix the broken footer link", priority="critical")
    issue_update(actor=board, issue=footer, changes={"status": "done"})
    review, _ = issue_create(actor=board, company=company, title="Review accessibility", assignee_agent_id=grace.pk)
    issue_update(actor=board, issue=review, changes={"status": "in_review"})

    comment_create(actor=board, issue=hero, body="Keep it under **12 words**, please.")
    first = document_write(actor=board, issue=hero, key="plan", title="Plan",
                           body="# Plan\n\n1. Draft three options\n2. Pick one\n3. Ship\n")
    document_write(actor=board, issue=hero, key="plan", base_revision_id=first.pk,
                   body="# Plan\n\n1. Draft five options\n2. Test them with two users\n3. Pick one\n4. Ship\n")
    interaction_create(actor=board, issue=hero, kind="request_confirmation", title="Approve the plan",
                       body="Five options, tested with two users, then ship.", document_key="plan")

    wake = agent_wakeup(actor=board, agent=linus, issue=hero, reason="assigned")
    run = run_claim(run_id=wake.run_id, owner="screenshots") or wake.run
    for kind, message in [("system", "workspace ready: worktree paperclip/ACME-2"),
                          ("stdout", "GET /api/agents/me -> 200"),
                          ("stdout", "checkout ACME-2 -> in_progress"),
                          ("stdout", "drafting five hero options"),
                          ("stderr", "warning: style guide not found, using defaults")]:
        run_append_event(run_id=run.pk, kind=kind, message=message)
    earlier = agent_wakeup(actor=board, agent=grace, issue=review, reason="review").run
    if earlier is not None:
        run_claim(run_id=earlier.pk, owner="screenshots")
        run_append_event(run_id=earlier.pk, kind="stdout", message="axe: 0 violations")
        from issues.models import HeartbeatRun

        run_finish(run=HeartbeatRun.objects.get(pk=earlier.pk), status="succeeded")

    triage = case_services.workflow_definition_create(
        actor=board, company=company, name="Bug triage", description="Reproduce, classify, route.",
        prompt="# Bug triage\n\n1. **Reproduce** the report\n2. Classify severity\n3. Route to an owner\n")
    case_services.workflow_definition_create(
        actor=board, company=company, name="Release", prompt="# Release\n\n- tag\n- changelog\n- deploy\n")
    case, _ = case_services.case_create(
        actor=board, company=company, case_type="bug", title="Checkout fails on Safari",
        kickoff="Customers report a blank page at checkout on Safari 17.",
        workflow_document_text=triage.prompt, workflow_definition_id=triage.pk, project_id=project.pk,
        fields={"severity": "high", "browser": {"name": "Safari", "version": "17.4"}, "reports": 7})
    handoffs.handoff_request(actor=board, company=company, case=case, to=str(linus.pk), workflow_id=str(triage.pk),
                             phase="reproduce", note="Start with the HAR file.")
    for title, case_type in [("Refund request #4411", "support"), ("Q3 price change", "change"),
                             ("Onboarding Globex", "customer")]:
        case_services.case_create(actor=board, company=company, case_type=case_type, title=title,
                                  kickoff="Kickoff", workflow_document_text="# Steps")
    data = {"user": user, "company": company, "hero": hero, "run": run, "case": case, "triage": triage,
            "linus": linus}
    data.update(seed_connector(company, project, linus))
    return data


def seed_connector(company, project, linus):
    """A GitHub connector with a bit of history: a healthy imported link, an open title conflict, a
    queued event, a scheduled retry, a parked event and recent errors (rows written directly: the
    screenshots show the console, not a provider)."""
    from datetime import timedelta

    from django.utils import timezone

    from connectors.models import Conflict, InboundEvent, SyncError, TaskLink
    from connectors.services.instances import instance_create
    from issues.actors import SYSTEM
    from issues.services.issues import issue_create

    instance = instance_create(
        actor=SYSTEM, company=company, name="GitHub acme/site", provider_key="github_issues",
        credentials="env:PAPERCLIP_SECRET_GITHUB_TOKEN", webhook_secret="env:PAPERCLIP_SECRET_GITHUB_WEBHOOK_SECRET", containers=["acme/site"],
        state_mapping={"open": "active", "closed": "terminal"}, default_sync_mode="bidirectional",
        project_id=project.pk, routing_rules=[{"kind": "label", "match": {"label": "frontend"},
                                               "agentId": str(linus.pk)},
                                              {"kind": "default_route", "agentId": str(linus.pk)}])
    now = timezone.now()
    instance.last_webhook_at, instance.webhook_verified = now - timedelta(seconds=40), True
    instance.last_poll_at, instance.last_reconcile_at = now - timedelta(minutes=3), now - timedelta(minutes=9)
    instance.save(update_fields=["last_webhook_at", "webhook_verified", "last_poll_at", "last_reconcile_at"])
    instance.cursors.create(scope="acme/site", cursor=(now - timedelta(minutes=3)).isoformat())
    imported, _ = issue_create(actor=SYSTEM, company=company, title="Broken link in the README",
                               project_id=project.pk, assignee_agent_id=linus.pk, origin_kind="connector")
    link = TaskLink.objects.create(
        company=company, instance=instance, provider_key="github_issues", project=project, issue=imported,
        external_task_id="2000000012", external_key="acme/site#12", external_title="Broken link in the README",
        external_url="https://github.com/acme/site/issues/12", external_state_name="open",
        external_state_category="active", sync_mode="bidirectional", status="conflict",
        last_inbound_at=now - timedelta(seconds=40), last_outbound_at=now - timedelta(seconds=35),
        last_reconcile_at=now - timedelta(minutes=9),
        field_policy={"title": "shared", "description": "external", "priority": "external", "labels": "external",
                      "dueAt": "external", "state": "shared"},
        routing={"kind": "label", "ruleId": 1, "agentName": "Linus", "reason": "label 'frontend'"})
    Conflict.objects.create(
        company=company, instance=instance, link=link, kind="field", field="title",
        base_value="Broken link in the README", external_value="Broken Getting started link in the README",
        paperclip_value="Fix the broken docs link in the README",
        actors={"external": "octocat", "paperclip": "Linus"}, detail="Both sides changed the title.")
    Conflict.objects.create(
        company=company, instance=instance, link=link, kind="field", field="description",
        base_value="The link is broken.\n\nSee the footer.",
        external_value="The link is broken.\n\nSee the footer and the sidebar.",
        paperclip_value="The Getting started link is broken.\n\nSee the footer.",
        actors={"external": "hubot", "paperclip": "operator"})
    events = [("pending", 0, "", ""), ("failed", 2, "provider_rate_limited", "429 Too Many Requests"),
              ("parked", 5, "apply_failed", "Issue ACME-4 is checked out by another run")]
    for n, (status, attempts, category, message) in enumerate(events):
        InboundEvent.objects.create(instance=instance, company=company, idempotency_key=f"shot-{n}",
                                    kind="task.upserted", action="issues.edited",
                                    external_task_id=f"20000000{20 + n}", status=status, attempts=attempts,
                                    error_category=category, error_message=message,
                                    next_attempt_at=now + timedelta(seconds=45) if status == "failed" else None)
    for category, message in [("provider_rate_limited", "GitHub answered 429; retrying after 45s"),
                              ("apply_failed", "Event #3 parked after 5 attempts")]:
        SyncError.objects.create(instance=instance, company=company, category=category, message=message)
    return {"connector": instance, "linked_issue": imported}


def serve():
    from django.contrib.staticfiles.handlers import StaticFilesHandler
    from django.test.testcases import LiveServerThread

    server = LiveServerThread("127.0.0.1", StaticFilesHandler, connections_override={}, port=0)
    server.daemon = True
    server.start()
    server.is_ready.wait()
    if server.error:
        raise server.error
    return server, f"http://127.0.0.1:{server.port}"


def capture(base_url: str, data: dict, out: Path):
    from playwright.sync_api import sync_playwright

    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # seeding is done; the server thread has no loop
    chromium = os.environ.get("PAPERCLIP_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_context(base_url=base_url, viewport={"width": 1360, "height": 900}).new_page()
        page.goto("/accounts/login/?next=/dashboard/")
        page.get_by_label("Username").fill(data["user"].username)
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url("**/dashboard/")

        def shot(name, url=None, full=True):
            if url:
                page.goto(url)
            page.wait_for_load_state("networkidle")
            path = out / f"{name}.png"
            page.screenshot(path=str(path), full_page=full)
            print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")

        hero = data["hero"].identifier
        shot("dashboard")
        shot("issues-list", "/issues/")
        shot("issues-board", "/issues/board/")
        shot("issue-detail", f"/issues/{hero}/")
        shot("document-diff", f"/issues/{hero}/documents/plan/")
        shot("run-log", f"/runs/{data['run'].pk}/", full=False)
        shot("agents", "/agents/")
        page.goto(f"/agents/{data['linus'].pk}/")
        page.get_by_label("Key name").fill("laptop")
        page.get_by_role("button", name="Create key").click()
        page.locator("#raw-key").wait_for()
        shot("agent-key-once")
        shot("cases-grouped", "/cases/?groupBy=type&sortField=title")
        shot("case-detail", f"/cases/{data['case'].identifier}/")
        shot("workflow-detail", f"/workflows/{data['triage'].pk}/")
        page.goto(f"/workflows/{data['triage'].pk}/edit/")
        page.locator("#preview h1").wait_for()
        shot("workflow-edit-preview")
        shot("connector-health", f"/connectors/{data['connector'].pk}/")
        shot("conflict-queue", "/connectors/conflicts/")
        page.goto(f"/issues/{data['linked_issue'].identifier}/")
        page.locator("#link-panel").wait_for()
        shot("issue-link-panel")
        browser.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "screenshots"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="paperclip-screens-") as tmp:
        setup_django(Path(tmp))
        data = seed()
        server, url = serve()
        try:
            capture(url, data, Path(args.out))
        finally:
            server.terminate()


if __name__ == "__main__":
    main()
