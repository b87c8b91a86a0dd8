"""Resolve a connector conflict entry (§11.3) from the command line."""
import json
import uuid

from django.core.management.base import CommandError

from connectors.choices import ConflictAction
from connectors.models import Conflict, TaskLink
from connectors.services.conflicts import conflict_resolve

from ._base import ConnectorCommand


class Command(ConnectorCommand):
    help = "Resolve CONFLICT_ID with --action keep_paperclip|keep_external|merge_manual|unlink|dismiss."

    def add_arguments(self, parser):
        parser.add_argument("conflict")
        parser.add_argument("--action", required=True, choices=ConflictAction.values)
        parser.add_argument("--merged-value", help="JSON value (required for merge_manual), e.g. '\"New title\"'.")
        self.add_actor_arguments(parser)

    def handle(self, *args, **options):
        try:
            conflict = Conflict.objects.select_related("link").get(pk=uuid.UUID(str(options["conflict"])))
        except (ValueError, Conflict.DoesNotExist):
            raise CommandError(f"No conflict '{options['conflict']}'.")
        merged = None
        if options.get("merged_value") is not None:
            try:
                merged = json.loads(options["merged_value"])
            except json.JSONDecodeError as exc:
                raise CommandError(f"--merged-value is not valid JSON: {exc}")
        elif options["action"] == ConflictAction.MERGE_MANUAL:
            raise CommandError("--merged-value is required for merge_manual.")
        row = self.call(conflict_resolve, actor=self.actor(options), conflict=conflict, action=options["action"],
                        merged_value=merged, idempotency_key=self.key(options))
        result = {"conflictId": str(row.pk), "status": row.status, "resolution": row.resolution,
                  "value": row.resolution_value, "linkStatus": TaskLink.objects.get(pk=row.link_id).status}
        self.emit(options, result, f"conflict {row.pk} {row.status} ({row.resolution}); link {result['linkStatus']}")
