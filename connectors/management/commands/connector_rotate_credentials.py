"""Rotate a connector's credentials and/or webhook secret (env:VAR references)."""
from django.core.management.base import CommandError

from connectors.services.interventions import credentials_rotate

from ._base import ConnectorCommand


class Command(ConnectorCommand):
    help = "Point INSTANCE at new secret references."

    def add_arguments(self, parser):
        parser.add_argument("instance")
        parser.add_argument("--credentials", help="env:VAR")
        parser.add_argument("--webhook-secret", help="env:VAR")
        self.add_actor_arguments(parser)

    def handle(self, *args, **options):
        for flag in ("credentials", "webhook_secret"):
            if options[flag] and not options[flag].startswith("env:"):
                raise CommandError(f"--{flag.replace('_', '-')} must be env:VAR.")
        result = self.call(credentials_rotate, actor=self.actor(options), instance=self.instance(options["instance"]),
                           idempotency_key=self.key(options), credentials=options["credentials"],
                           webhook_secret=options["webhook_secret"], reason=options["reason"])
        self.emit(options, result, f"rotated: {result}")
