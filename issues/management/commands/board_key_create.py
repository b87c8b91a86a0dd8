import json as json_module
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from issues.actors import SYSTEM
from issues.services.board_keys import DEFAULT_EXPIRY, board_key_create

MAX_DAYS = 36500


class Command(BaseCommand):
    help = ("Create a board API key (pcp_board_…) for a user and print it (shown once; only its hash is stored). "
            "Requests with it act as the user, with their company memberships and roles.")

    def add_arguments(self, parser):
        parser.add_argument("--user", required=True, help="The username the key acts as.")
        parser.add_argument("--name", default="cli", help="A label for the key.")
        lifetime = parser.add_mutually_exclusive_group()
        lifetime.add_argument("--expires-days", type=int, help="Days until it expires (default 30).")
        lifetime.add_argument("--no-expiry", action="store_true", help="The key never expires.")
        parser.add_argument("--json", action="store_true", help='Print {"id", "token", "expiresAt"} as JSON.')

    def handle(self, *args, user, name, expires_days, no_expiry, json: bool, **options):
        found = get_user_model().objects.filter(username=user).first()
        if found is None:
            raise CommandError(f"No user '{user}'.")
        if expires_days is not None and not 1 <= expires_days <= MAX_DAYS:
            raise CommandError(f"--expires-days must be from 1 to {MAX_DAYS}.")
        expires_at = (None if no_expiry else DEFAULT_EXPIRY if expires_days is None
                      else timezone.now() + timedelta(days=expires_days))
        key, token = board_key_create(actor=SYSTEM, user=found, name=name, expires_at=expires_at)
        expires = key.expires_at.isoformat() if key.expires_at else None
        if json:
            self.stdout.write(json_module.dumps({"id": str(key.pk), "token": token, "expiresAt": expires}))
        else:
            self.stdout.write(f"board key {key.prefix}… for {found.get_username()} "
                              f"(expires {expires or 'never'}): {token}")

