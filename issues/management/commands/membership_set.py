import json as json_module
import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from issues.choices import MemberRole
from issues.models import Membership
from issues.services.companies import membership_set

from .agent_create import company_by_ref


def user_by_username(username: str):
    """The user named ``username``; a clear CommandError otherwise."""
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise CommandError(f"No user '{username}'. Create one with `manage.py membership_set ... --create-user` "
                           "or `manage.py createsuperuser`.")
    return user


class Command(BaseCommand):
    help = ("Give a user a role in a company (creates or updates the membership), so a board user can be "
            "scripted without the admin. With --create-user a missing user is created with a generated "
            "password, printed once.")

    def add_arguments(self, parser):
        parser.add_argument("--company", required=True, help="Company issue prefix (e.g. ACME) or id.")
        parser.add_argument("--user", required=True, help="Username.")
        parser.add_argument("--role", required=True, choices=MemberRole.values)
        parser.add_argument("--create-user", action="store_true",
                            help="Create the user when missing (its generated password is printed once).")
        parser.add_argument("--json", action="store_true", help="Print machine-readable JSON.")

    def handle(self, *args, company, user, role, create_user, json: bool, **options):
        target = company_by_ref(company)
        password = None
        with transaction.atomic():
            found = get_user_model().objects.filter(username=user).first()
            if found is None and create_user:
                password = secrets.token_urlsafe(18)
                found = get_user_model().objects.create_user(username=user, password=password)
            elif found is None:
                user_by_username(user)  # raises the clear error
            previous = Membership.objects.filter(company=target, user=found).values_list("role", flat=True).first()
            membership = membership_set(company=target, user=found, role=role)
        result = {"companyId": str(target.pk), "issuePrefix": target.issue_prefix, "userId": found.pk,
                  "username": found.get_username(), "role": membership.role, "previousRole": previous,
                  "userCreated": password is not None}
        if password is not None:
            result["password"] = password  # shown this once; only its hash is stored
        if json:
            self.stdout.write(json_module.dumps(result, indent=2))
            return
        change = f"was {previous}" if previous else "new membership"
        self.stdout.write(f"{found.get_username()} is {membership.role} of {target.issue_prefix} ({change})")
        if password is not None:
            self.stdout.write(f"  created user {found.get_username()} with password: {password}")
