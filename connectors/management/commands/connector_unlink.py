"""Unlink a task link (sync stops; neither the issue nor the external task is deleted)."""
from connectors.services.interventions import link_unlink

from ._base import ConnectorCommand


class Command(ConnectorCommand):
    help = "Unlink LINK_ID."

    def add_arguments(self, parser):
        parser.add_argument("link")
        self.add_actor_arguments(parser)

    def handle(self, *args, **options):
        result = self.call(link_unlink, actor=self.actor(options), link=self.link(options["link"]),
                           idempotency_key=self.key(options), reason=options["reason"])
        self.emit(options, result, f"unlinked: {result}")
