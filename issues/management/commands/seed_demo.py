import secrets
import sys
from pathlib import Path

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


class Command(BaseCommand):
    help = "Create (once) a demo company with agents and issues; (re)set and print the demo login."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")

    @transaction.atomic
    def handle(self, *args, username, **options):
        User = get_user_model()
        user, _ = User.objects.get_or_create(username=username, defaults={"is_staff": True, "is_superuser": True})
        password = secrets.token_urlsafe(12)  # fresh each time; never stored in the repository
        user.set_password(password)
        user.save()

        company = Company.objects.filter(issue_prefix=DEMO_PREFIX).first()
        if company is None:
            company = self._create_demo(user)
        membership_set(company=company, user=user, role="owner")
        agent = company.agents.order_by("created_at").first()
        _, raw_key = agent_api_key_create(agent=agent, name="demo")

        self.stdout.write(self.style.SUCCESS("Demo ready."))
        self.stdout.write(f"  Console:   http://127.0.0.1:8000/   user: {username}   password: {password}")
        self.stdout.write("  API docs:  http://127.0.0.1:8000/api/docs/")
        self.stdout.write(f"  Agent key for {agent.name}: {raw_key}   (company id {company.pk})")

    def _create_demo(self, user):
        company = company_create(name="Paperclip Demo", issue_prefix=DEMO_PREFIX, enable_cases=True)
        ceo = agent_create(company=company, name="Ada", role="ceo", title="Chief Executive")
        # Linus is a real local agent process: the example Heartbeat agent, run by the worker.
        eng = agent_create(company=company, name="Linus", role="engineer", title="Engineer", reports_to=ceo,
                           adapter_type="process",
                           adapter_config={"command": [sys.executable, str(EXAMPLE_AGENT)],
                                           "env": {"EXAMPLE_AGENT_MODE": "done"}})
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
