"""Replay parked and failed outbound writes (one by id, or every one of an instance)."""
from django.core.management.base import CommandError

from connectors.models import OutboundEffect
from connectors.services.outbound_replay import effect_replay, instance_outbound_replay

from ._base import ConnectorCommand


class Command(ConnectorCommand):
    help = "Replay a parked or failed outbound write (EFFECT_ID), or --all of --instance."

    def add_arguments(self, parser):
        parser.add_argument("effect", nargs="?")
        parser.add_argument("--instance")
        parser.add_argument("--all", action="store_true", help="every parked and failed write of --instance")
        self.add_actor_arguments(parser)

    def handle(self, *args, **options):
        common = {"actor": self.actor(options), "idempotency_key": self.key(options), "reason": options["reason"]}
        if options["effect"] and not options["all"]:
            try:
                effect = OutboundEffect.objects.select_related("instance").get(pk=int(options["effect"]))
            except (ValueError, OutboundEffect.DoesNotExist):
                raise CommandError(f"No outbound effect '{options['effect']}'.")
            result = self.call(effect_replay, effect=effect, **common)
            text = f"Outbound effect #{effect.pk}: {result['outcome']}."
        elif options["all"] and options["instance"]:
            result = self.call(instance_outbound_replay, instance=self.instance(options["instance"]), **common)
            text = (f"Replayed {result['replayedCount']} outbound write(s)"
                    f"{'; ' + str(len(result['supersededEffectIds'])) + ' superseded' if result['supersededEffectIds'] else ''}.")
        else:
            raise CommandError("Give an effect id, or --instance with --all.")
        self.emit(options, result, text)
