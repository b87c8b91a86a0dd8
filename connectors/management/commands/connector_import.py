"""Create or update a connector instance from a connector_export document (idempotent)."""
import json
import sys
from pathlib import Path

from django.core.management.base import CommandError

from connectors.console.transfer import instance_import

from ._base import ConnectorCommand


class Command(ConnectorCommand):
    help = ("Create the connector described by a connector_export JSON file in --company, or update the one "
            "with the same name; importing the same file again changes nothing.")

    def add_arguments(self, parser):
        parser.add_argument("file", help="The JSON file ('-' for standard input).")
        parser.add_argument("--company", required=True, help="Target company issue prefix or id.")
        parser.add_argument("--user", help="Username recorded as the acting operator (default: system).")
        parser.add_argument("--json", action="store_true", help="Print the result as JSON.")

    def handle(self, *args, **options):
        source = options["file"]
        try:
            raw = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
        except OSError as exc:
            raise CommandError(f"Cannot read {source}: {exc.strerror}.")
        try:
            document = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise CommandError(f"{source} is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno}).")
        company = self.company(options["company"])
        instance, outcome = self.call(instance_import, actor=self.actor(options), company=company,
                                      document=document)
        result = {"id": str(instance.pk), "name": instance.name, "company": company.issue_prefix, "outcome": outcome}
        self.emit(options, result, f"{outcome.capitalize()} connector {instance.name} ({instance.pk}) "
                                   f"in {company.issue_prefix}.")
