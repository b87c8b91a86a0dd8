"""Pause a connector instance, or one link with --link."""
from django.core.management.base import CommandError

from connectors.services.interventions import instance_pause, link_pause

from ._base import ConnectorCommand


class Command(ConnectorCommand):
    help = "Pause a connector instance (INSTANCE) or a single link (--link LINK_ID)."

    def add_arguments(self, parser):
        parser.add_argument("instance", nargs="?")
        parser.add_argument("--link")
        self.add_actor_arguments(parser)

    def handle(self, *args, **options):
        common = {"actor": self.actor(options), "idempotency_key": self.key(options), "reason": options["reason"]}
        if options["link"]:
            result = self.call(link_pause, link=self.link(options["link"]), **common)
        elif options["instance"]:
            result = self.call(instance_pause, instance=self.instance(options["instance"]), **common)
        else:
            raise CommandError("Give an instance id or --link.")
        self.emit(options, result, f"pause: {result}")
