import json as json_module

from django.core.management.base import BaseCommand, CommandError

from django.db import transaction

from issues.choices import AgentRole, MemberRole
from issues.services.companies import agent_api_key_create, agent_create, company_create, membership_set
from paperclip.core.errors import ApiError

from .membership_set import user_by_username


class Command(BaseCommand):
    help = "Create a company with agents and print the ids and API keys (keys are shown once)."

    def add_arguments(self, parser):
        parser.add_argument("--name", required=True)
        parser.add_argument("--prefix", required=True, help="Issue identifier prefix, e.g. ACME")
        parser.add_argument("--agent", action="append", default=[], metavar="NAME[:ROLE]",
                            help=f"Repeatable. ROLE is one of: {', '.join(AgentRole.values)}")
        parser.add_argument("--enable-cases", action="store_true")
        parser.add_argument("--owner", metavar="USERNAME", help="An existing user who becomes the company's owner.")
        parser.add_argument("--json", action="store_true", help="Print machine-readable JSON.")

    def handle(self, *args, name, prefix, agent, enable_cases, json: bool, owner=None, **options):
        specs = []
        for spec in agent:
            agent_name, _, role = spec.partition(":")
            role = role or AgentRole.GENERAL
            if role not in AgentRole.values:
                raise CommandError(f"--agent {spec}: role must be one of {', '.join(AgentRole.values)}")
            specs.append((agent_name.strip(), role))
        owner_user = user_by_username(owner) if owner else None  # checked before anything is created
        try:
            with transaction.atomic():
                company = company_create(name=name, issue_prefix=prefix, enable_cases=enable_cases)
                if owner_user is not None:
                    membership_set(company=company, user=owner_user, role=MemberRole.OWNER)
                agents = []
                for agent_name, role in specs:
                    created = agent_create(company=company, name=agent_name, role=role)
                    _, raw = agent_api_key_create(agent=created)
                    agents.append({"id": str(created.pk), "name": created.name, "role": role, "apiKey": raw})
        except ApiError as exc:
            raise CommandError(f"{exc.message} {exc.details}")
        result = {"companyId": str(company.pk), "issuePrefix": company.issue_prefix, "agents": agents,
                  "owner": ({"userId": owner_user.pk, "username": owner_user.get_username(), "role": MemberRole.OWNER.value}
                            if owner_user is not None else None)}
        if json:
            self.stdout.write(json_module.dumps(result, indent=2))
        else:
            self.stdout.write(f"Company {company.name} ({company.issue_prefix}) id={company.pk}")
            if owner_user is not None:
                self.stdout.write(f"  owner {owner_user.get_username()}")
            for a in agents:
                self.stdout.write(f"  agent {a['name']} ({a['role']}) id={a['id']} key={a['apiKey']}")
