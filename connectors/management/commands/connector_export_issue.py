"""Export one Paperclip issue to a tracker (§6.2.2): create its task in a container of a connector and
link it. Idempotent on --idempotency-key: running it again with the same key prints the same link and
creates no second task, also after an attempt whose answer was lost. (``connector_export`` exports a
connector's configuration, not an issue.)"""
from django.core.exceptions import ValidationError
from django.core.management.base import CommandError

from connectors.services.export import issue_export
from issues.models import Issue

from ._base import ConnectorCommand


class Command(ConnectorCommand):
    help = ("Create the external task of an issue (e.g. PAP-12) in one of a connector's containers and link it "
            "(originSide=paperclip). Give --idempotency-key to make a retry safe.")

    def add_arguments(self, parser):
        parser.add_argument("issue", help="Issue identifier (PAP-12) or id.")
        parser.add_argument("instance", help="Connector instance id (of the issue's company).")
        parser.add_argument("--container", help="One of the instance's containers (default: its only one).")
        self.add_actor_arguments(parser)

    def handle(self, *args, **options):
        issue = self._issue(options["issue"])
        instance = self.instance(options["instance"])
        if instance.company_id != issue.company_id:
            raise CommandError(f"No connector instance '{options['instance']}' in {issue.company.issue_prefix}.")
        key = self.key(options)
        outcome = self.call(issue_export, actor=self.actor(options), instance=instance, issue=issue,
                            container=options.get("container"), idempotency_key=key, reason=options["reason"])
        export, link = outcome.export, outcome.link
        result = {"exportId": export.pk, "status": export.status, "idempotencyKey": export.idempotency_key,
                  "issue": issue.identifier, "container": export.container, "linkId": str(link.pk),
                  "externalTaskId": link.external_task_id, "externalKey": link.external_key,
                  "externalUrl": link.external_url, "created": outcome.created, "attempts": export.attempts}
        verb = "Exported" if outcome.created else "Already exported"
        self.emit(options, result, f"{verb} {issue.identifier} to {instance.name} as "
                                   f"{link.external_key or link.external_task_id} {link.external_url} "
                                   f"(link {link.pk}, key {export.idempotency_key}).")

    def _issue(self, ref) -> Issue:
        ref = str(ref).strip()
        issue = Issue.objects.select_related("company").filter(identifier=ref.upper()).first()
        if issue is None:
            try:
                issue = Issue.objects.select_related("company").filter(pk=ref).first()
            except (ValidationError, ValueError):  # not a UUID either
                issue = None
        if issue is None:
            raise CommandError(f"No issue '{ref}'.")
        return issue
