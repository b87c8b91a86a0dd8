"""Replay parked inbound events (one by id, or every parked event of an instance)."""
from django.core.management.base import CommandError

from connectors.choices import EventStatus
from connectors.models import InboundEvent
from connectors.services.interventions import event_replay

from ._base import ConnectorCommand


class Command(ConnectorCommand):
    help = "Replay a parked event (EVENT_ID) or --all-parked events of --instance."

    def add_arguments(self, parser):
        parser.add_argument("event", nargs="?")
        parser.add_argument("--instance")
        parser.add_argument("--all-parked", action="store_true")
        self.add_actor_arguments(parser)

    def handle(self, *args, **options):
        if options["event"]:
            events = [self.event(options["event"])]
        elif options["all_parked"] and options["instance"]:
            instance = self.instance(options["instance"])
            events = list(InboundEvent.objects.filter(instance=instance, status=EventStatus.PARKED)
                          .select_related("instance").order_by("id"))
        else:
            raise CommandError("Give an event id, or --instance with --all-parked.")
        key = self.key(options)
        results = [self.call(event_replay, actor=self.actor(options), event=e,
                             idempotency_key=key if len(events) == 1 else f"{key}:{e.pk}", reason=options["reason"])
                   for e in events]
        self.emit(options, {"replayed": results}, f"Replayed {len(results)} event(s).")
