"""Export a connector instance's configuration as JSON (secret references only, never values)."""
import json
from pathlib import Path

from django.core.management.base import CommandError

from connectors.console.transfer import instance_export
from connectors.models import ConnectorInstance

from ._base import ConnectorCommand


class Command(ConnectorCommand):
    help = ("Print (or write with --output) the JSON configuration of a connector: settings, state mapping, "
            "routing rules; credentials as references (env:NAME / secret:<id>), never secret values.")

    def add_arguments(self, parser):
        parser.add_argument("instance", nargs="?", help="Instance id (or give --company and --name).")
        parser.add_argument("--company", help="Company issue prefix or id (with --name).")
        parser.add_argument("--name", help="Connector name (with --company).")
        parser.add_argument("--output", "-o", help="Write to this file instead of standard output.")

    def handle(self, *args, **options):
        if options["instance"]:
            instance = self.instance(options["instance"])
        elif options["company"] and options["name"]:
            company = self.company(options["company"])
            instance = ConnectorInstance.objects.filter(company=company, name__iexact=options["name"]).first()
            if instance is None:
                raise CommandError(f"No connector named '{options['name']}' in {company.issue_prefix}.")
        else:
            raise CommandError("Give an instance id, or --company and --name.")
        text = json.dumps(instance_export(instance), indent=2, sort_keys=True, ensure_ascii=False, default=str)
        if options["output"]:
            try:
                Path(options["output"]).write_text(text + "\n", encoding="utf-8")
            except OSError as exc:
                raise CommandError(f"Cannot write {options['output']}: {exc.strerror}.")
            self.stderr.write(f"Wrote {instance.name} to {options['output']}")
        else:
            self.stdout.write(text)
