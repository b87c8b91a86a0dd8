import json as json_module

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from issues.models import Agent
from issues.services.companies import agent_api_key_create

from .agent_create import company_by_ref


class Command(BaseCommand):
    help = "Create another API key for an agent and print it (shown once; only its hash is stored)."

    def add_arguments(self, parser):
        parser.add_argument("--company", required=True, help="Company issue prefix (e.g. ACME) or id.")
        parser.add_argument("--agent", required=True, help="Agent name or id.")
        parser.add_argument("--key-name", default="cli", help="A label for the key.")
        parser.add_argument("--json", action="store_true", help="Print machine-readable JSON.")

    def handle(self, *args, company, agent, key_name, json: bool, **options):
        target = company_by_ref(company)
        found = Agent.objects.filter(company=target, name=agent).first()
        if found is None:
            try:
                found = Agent.objects.filter(company=target, pk=agent).first()
            except (ValueError, ValidationError):  # not a UUID
                found = None
        if found is None:
            raise CommandError(f"No agent '{agent}' in {target.issue_prefix}.")
        key, raw = agent_api_key_create(agent=found, name=key_name)
        result = {"agentId": str(found.pk), "keyId": str(key.pk), "prefix": key.prefix, "apiKey": raw}
        self.stdout.write(json_module.dumps(result, indent=2) if json else f"key {key.prefix}… for {found.name}: {raw}")
