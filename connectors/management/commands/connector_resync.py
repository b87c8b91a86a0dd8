"""Force a resync of one link (re-read the task and its comments)."""
from connectors.services.interventions import link_resync

from ._base import ConnectorCommand


class Command(ConnectorCommand):
    help = "Resync LINK_ID now."

    def add_arguments(self, parser):
        parser.add_argument("link")
        self.add_actor_arguments(parser)

    def handle(self, *args, **options):
        result = self.call(link_resync, actor=self.actor(options), link=self.link(options["link"]),
                           idempotency_key=self.key(options), reason=options["reason"])
        self.emit(options, result, f"resync queued: {result}")
