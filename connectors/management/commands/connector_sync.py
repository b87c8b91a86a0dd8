"""Poll a connector now (the backstop channel); --reconcile runs a reconciliation tick too."""
from connectors.services.polling import instance_poll, instance_reconcile

from ._base import ConnectorCommand


class Command(ConnectorCommand):
    help = "Poll a connector instance now."

    def add_arguments(self, parser):
        parser.add_argument("instance")
        parser.add_argument("--max-pages", type=int)
        parser.add_argument("--reconcile", action="store_true")
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **options):
        instance = self.instance(options["instance"])
        result = {"poll": instance_poll(instance_id=instance.pk, max_pages=options["max_pages"])}
        if options["reconcile"]:
            result["reconcile"] = instance_reconcile(instance_id=instance.pk)
        self.emit(options, result, f"{instance.name}: {result}")
