import json as json_module

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from issues.choices import AgentRole
from issues.models import Company
from issues.services.companies import agent_api_key_create, agent_create
from paperclip.core.errors import ApiError


class Command(BaseCommand):
    help = "Add an agent to an existing company and print its id and API key (the key is shown once)."

    def add_arguments(self, parser):
        parser.add_argument("--company", required=True, help="Company issue prefix (e.g. ACME) or id.")
        parser.add_argument("--name", required=True)
        parser.add_argument("--role", default=AgentRole.GENERAL, help=f"One of: {', '.join(AgentRole.values)}")
        parser.add_argument("--adapter", default="none", help="Adapter type: process, http or none.")
        parser.add_argument("--adapter-config", default="{}", help="Adapter config as a JSON object.")
        parser.add_argument("--budget-cents", type=int, default=0, help="Monthly budget in cents (0: none).")
        parser.add_argument("--json", action="store_true", help="Print machine-readable JSON.")

    def handle(self, *args, company, name, role, adapter, adapter_config, budget_cents, json: bool, **options):
        target = company_by_ref(company)
        try:
            config = json_module.loads(adapter_config)
        except ValueError as exc:
            raise CommandError(f"--adapter-config is not JSON: {exc}")
        if not isinstance(config, dict):
            raise CommandError("--adapter-config must be a JSON object.")
        try:
            with transaction.atomic():
                agent = agent_create(company=target, name=name, role=role, adapter_type=adapter,
                                     adapter_config=config, budget_monthly_cents=budget_cents)
                _, raw = agent_api_key_create(agent=agent)
        except ApiError as exc:
            raise CommandError(f"{exc.message} {exc.details}")
        result = {"agentId": str(agent.pk), "name": agent.name, "role": agent.role, "apiKey": raw}
        if json:
            self.stdout.write(json_module.dumps(result, indent=2))
        else:
            self.stdout.write(f"agent {agent.name} ({agent.role}) id={agent.pk} key={raw}")


def company_by_ref(ref: str) -> Company:
    """A company by issue prefix or id; a clear CommandError otherwise."""
    company = Company.objects.filter(issue_prefix=ref.upper()).first()
    if company is None:
        try:
            company = Company.objects.filter(pk=ref).first()
        except (ValueError, ValidationError):  # not a UUID
            company = None
    if company is None:
        raise CommandError(f"No company with prefix or id '{ref}'.")
    return company
