"""Run reconciliation ticks (each reads the next window of links)."""
from connectors.services.polling import instance_reconcile

from ._base import ConnectorCommand


class Command(ConnectorCommand):
    help = "Run one (or --ticks N) reconciliation ticks of a connector instance."

    def add_arguments(self, parser):
        parser.add_argument("instance")
        parser.add_argument("--ticks", type=int, default=1)
        parser.add_argument("--batch", type=int)
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **options):
        instance = self.instance(options["instance"])
        results = [instance_reconcile(instance_id=instance.pk, batch=options["batch"]) for _ in
                   range(max(options["ticks"], 1))]
        self.emit(options, {"ticks": results}, "\n".join(f"tick {i + 1}: {r}" for i, r in enumerate(results)))
