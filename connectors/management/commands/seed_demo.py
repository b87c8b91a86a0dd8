"""The demo company: lives in the connectors app because it seeds all three apps (connectors ->
cases -> issues is the one allowed direction)."""
import os
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

from django.apps import apps
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from issues.actors import SYSTEM, Actor
from issues.models import Company, Goal, Project
from issues.services.companies import agent_api_key_create, agent_create, company_create, membership_set
from issues.services.issues import issue_create
from issues.services.wakeups import agent_wakeup

DEMO_PREFIX = "DEMO"
EXAMPLE_AGENT = Path(__file__).resolve().parents[3] / "examples" / "heartbeat_agent.py"
# The offline GitHub demo (connectors app, when installed): the sandbox of `make run` serves
# demo/app on this URL; credentials are references to variables the Makefile generates at start.
SANDBOX_URL = os.environ.get("PAPERCLIP_DEMO_GITHUB_URL", "http://127.0.0.1:8765")
CONNECTOR_NAME = "GitHub sandbox"
# GitHub has open/closed only; the "in review" label carries the review state both ways, so the
# example agent's in_review is projected back to the tracker as that label.
DEMO_STATE_MAPPING = {"open": "active", "closed": "terminal", "labels": {"in review": "review"}}
SANDBOX_REPO = "demo/app"
TOKEN_REF = "env:PAPERCLIP_SECRET_GITHUB_SANDBOX_TOKEN"
WEBHOOK_SECRET_REF = "env:PAPERCLIP_SECRET_GITHUB_SANDBOX_WEBHOOK_SECRET"
# Issue #1 of the sandbox (opened quietly when it starts, see connectors.management.commands.demo_sandbox):
# linked here with one open title conflict for the operator to resolve.
CONFLICT_TASK = {"number": 1, "id": "2000000001", "base": "Update the onboarding guide",
                 "external": "Update the onboarding guide for v2", "paperclip": "Rewrite the onboarding guide"}


class Command(BaseCommand):
    help = "Create (once) a demo company with agents and issues; (re)set and print the demo login."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")
        parser.add_argument("--repo-dir", default=os.environ.get("PAPERCLIP_DEMO_REPO", ""),
                            help="Local git repository of the demo project (created when missing; "
                                 "default var/demo-repo).")
        parser.add_argument("--sandbox-url", default=SANDBOX_URL, help="Base URL of the GitHub sandbox.")

    @transaction.atomic
    def handle(self, *args, username, repo_dir="", sandbox_url=SANDBOX_URL, **options):
        User = get_user_model()
        user, _ = User.objects.get_or_create(username=username, defaults={"is_staff": True, "is_superuser": True})
        password = secrets.token_urlsafe(12)  # fresh each time; never stored in the repository
        user.set_password(password)
        user.save()

        company = Company.objects.filter(issue_prefix=DEMO_PREFIX).first()
        if company is None:
            company = self._create_demo(user)
        membership_set(company=company, user=user, role="owner")
        repo = Path(repo_dir or (Path(settings.BASE_DIR) / "var" / "demo-repo")).expanduser().resolve()
        extra = self._ensure_app_project(company, repo)
        self._ensure_case(company, user, extra)
        self._ensure_runner_agent(company, user)
        instance = self._ensure_connector(company, extra, sandbox_url) if apps.is_installed("connectors") else None
        agent = company.agents.order_by("created_at").first()
        _, raw_key = agent_api_key_create(agent=agent, name="demo")

        self.stdout.write(self.style.SUCCESS("Demo ready."))
        self.stdout.write(f"  Console:   http://127.0.0.1:8000/   user: {username}   password: {password}")
        self.stdout.write("  API docs:  http://127.0.0.1:8000/api/docs/")
        self.stdout.write(f"  Agent key for {agent.name}: {raw_key}   (company id {company.pk})")
        self.stdout.write(f"  Project {extra.name}: git repository {extra.repository}")
        if instance is not None:
            self.stdout.write(f"  Connector {instance.name}: {instance.base_url} repo {SANDBOX_REPO} "
                              f"(credentials {instance.credentials_ref}, webhook secret {instance.webhook_secret_ref})")

    def _create_demo(self, user):
        company = company_create(name="Paperclip Demo", issue_prefix=DEMO_PREFIX, enable_cases=True)
        ceo = agent_create(company=company, name="Ada", role="ceo", title="Chief Executive")
        # Linus is a real local agent process: the example Heartbeat agent, run by the worker.
        eng = agent_create(company=company, name="Linus", role="engineer", title="Engineer", reports_to=ceo,
                           adapter_type="process",
                           adapter_config={"command": [sys.executable, str(EXAMPLE_AGENT)],
                                           "env": {"EXAMPLE_AGENT_MODE": "review"}})
        agent_create(company=company, name="Grace", role="qa", title="QA", reports_to=ceo)
        project = Project.objects.create(company=company, name="Website")
        goal = Goal.objects.create(company=company, title="Launch v1")
        board = Actor(user=user)
        membership_set(company=company, user=user, role="owner")
        parent, _ = issue_create(actor=board, company=company, title="Ship the landing page", priority="high",
                                 project_id=project.pk, goal_id=goal.pk, assignee_agent_id=ceo.pk)
        for title, priority, status in [
            ("Write the hero copy", "medium", "todo"),
            ("Build the pricing table", "high", "todo"),
            ("Set up analytics", "low", "backlog"),
        ]:
            issue_create(actor=board, company=company, title=title, priority=priority, status=status,
                         parent_id=parent.pk, assignee_agent_id=eng.pk)
        issue_create(actor=SYSTEM, company=company, title="Fix the broken footer link", priority="critical")
        first = company.issues.filter(assignee_agent=eng).order_by("number").first()
        agent_wakeup(actor=board, agent=eng, issue=first, reason="demo: first assignment")
        return company

    def _ensure_runner_agent(self, company, user):
        """Hopper runs the same example agent through the reference PRP runner (adapter "prp"): the
        run's events, result and terminal reach the host only over the runner protocol."""
        if company.agents.filter(name="Hopper").exists():
            return
        ceo = company.agents.order_by("created_at").first()
        hopper = agent_create(company=company, name="Hopper", role="engineer", title="Engineer (PRP runner)",
                              reports_to=ceo, adapter_type="prp",
                              adapter_config={"harness": "process", "command": [sys.executable, str(EXAMPLE_AGENT)],
                                              "env": {"EXAMPLE_AGENT_MODE": "review"}})
        # The assignment wakes Hopper; the worker starts the runner.
        issue_create(actor=Actor(user=user), company=company, title="Tidy the changelog", priority="medium",
                     status="todo", assignee_agent_id=hopper.pk)

    # --- the project with a local git repository, a case with a workflow, the GitHub connector -------

    def _ensure_app_project(self, company, repo: Path):
        ensure_git_repository(repo)
        project = Project.objects.filter(company=company, name="App").first()
        if project is None:
            project = Project.objects.create(company=company, name="App", description="The demo/app repository.",
                                             workspace_strategy="isolated_workspace", repository=str(repo),
                                             base_ref="main")
        elif project.repository != str(repo):
            project.repository = str(repo)
            project.save(update_fields=["repository"])
        return project

    def _ensure_case(self, company, user, project):
        from cases import services as case_services
        from cases.models import Case, WorkflowDefinition

        board = Actor(user=user)
        definition = WorkflowDefinition.objects.filter(company=company, name="Bug triage").first()
        if definition is None:
            definition = case_services.workflow_definition_create(
                actor=board, company=company, name="Bug triage", description="Reproduce, classify, route.",
                prompt="# Bug triage\n\n1. **Reproduce** the report\n2. Classify severity\n3. Route to an owner\n")
        if not Case.objects.filter(company=company, title="Checkout fails on Safari").exists():
            case_services.case_create(
                actor=board, company=company, case_type="bug", title="Checkout fails on Safari",
                kickoff="Customers report a blank page at checkout on Safari 17.",
                workflow_document_text=definition.prompt, workflow_definition_id=definition.pk,
                project_id=project.pk, fields={"severity": "high", "reports": 7})

    def _ensure_connector(self, company, project, sandbox_url):
        from connectors.models import Conflict, ConnectorInstance, TaskLink
        from connectors.services.instances import instance_create, instance_update

        linus = company.agents.get(name="Linus")
        instance = ConnectorInstance.objects.filter(company=company, name=CONNECTOR_NAME).first()
        if instance is None:
            instance = instance_create(
                actor=SYSTEM, company=company, name=CONNECTOR_NAME, provider_key="github_issues",
                credentials=TOKEN_REF, webhook_secret=WEBHOOK_SECRET_REF, base_url=sandbox_url,
                containers=[SANDBOX_REPO], state_mapping=DEMO_STATE_MAPPING,
                default_sync_mode="bidirectional", default_run_mode="paperclip_controlled",
                project_id=project.pk, triage_agent_id=company.agents.get(name="Ada").pk,
                service_account_id="paperclip-bot", service_account_name="paperclip-bot",
                poll_interval_seconds=60,
                routing_rules=[{"kind": "default_route", "agentId": str(linus.pk)}])
        elif instance.base_url != sandbox_url:
            instance = instance_update(actor=SYSTEM, instance=instance, changes={"base_url": sandbox_url})
        task = CONFLICT_TASK
        if not TaskLink.objects.filter(instance=instance, external_task_id=task["id"]).exists():
            issue, _ = issue_create(actor=SYSTEM, company=company, title=task["paperclip"], project_id=project.pk,
                                    description="Imported from the GitHub sandbox; the title changed on both sides.",
                                    origin_kind="connector")
            link = TaskLink.objects.create(
                company=company, instance=instance, provider_key=instance.provider_key, project=project, issue=issue,
                external_task_id=task["id"], external_key=f"{SANDBOX_REPO}#{task['number']}",
                external_url=f"{sandbox_url}/{SANDBOX_REPO}/issues/{task['number']}",
                external_title=task["external"], external_state_name="open", external_state_category="active",
                sync_mode="bidirectional", status="conflict", status_detail="title changed on both sides",
                field_policy={"title": "shared", "description": "external", "priority": "external",
                              "labels": "external", "dueAt": "external", "state": "shared"},
                base_snapshot={"external": {"title": task["base"]}, "paperclip": {"title": task["base"]}},
                routing={"kind": "default_route", "agentName": None, "reason": "seeded by seed_demo"})
            Conflict.objects.create(company=company, instance=instance, link=link, kind="field", field="title",
                                    base_value=task["base"], external_value=task["external"],
                                    paperclip_value=task["paperclip"],
                                    actors={"external": "octocat", "paperclip": "admin"},
                                    detail="Both sides changed the title since the last sync.")
        return instance


def ensure_git_repository(path: Path):
    """A git repository with one commit on ``main`` at ``path`` (built aside, then renamed into place,
    so concurrent runs never see half of one)."""
    if (path / ".git").exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".demo-repo-", dir=path.parent))
    env = {**os.environ, "GIT_AUTHOR_NAME": "Paperclip demo", "GIT_AUTHOR_EMAIL": "demo@paperclip.invalid",
           "GIT_COMMITTER_NAME": "Paperclip demo", "GIT_COMMITTER_EMAIL": "demo@paperclip.invalid"}
    (work / "README.md").write_text("# demo/app\n\nThe demo project of the Paperclip offline demo.\n")
    for args in (["init", "--quiet", "-b", "main"], ["add", "README.md"],
                 ["commit", "--quiet", "-m", "Initial commit"]):
        subprocess.run(["git", *args], cwd=work, env=env, check=True, capture_output=True)
    try:
        work.rename(path)
    except OSError:  # another run made it first
        import shutil

        shutil.rmtree(work, ignore_errors=True)
