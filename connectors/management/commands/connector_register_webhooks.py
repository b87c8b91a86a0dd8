"""Create the provider webhooks of a connector (one per container), re-verify them, or open the handshake
window for one an operator creates by hand (Appendix A.3-A.5, §13.2)."""
from datetime import timedelta

from django.core.management.base import CommandError

from connectors.models import ConnectorInstance
from connectors.providers.base import ProviderError
from connectors.services.webhook_setup import handshake_window_open, webhooks_register, webhooks_reverify

from ._base import ConnectorCommand


class Command(ConnectorCommand):
    help = ("Register the connector's webhooks with its provider (Asana, Trello: one per container, callback "
            "PAPERCLIP_PUBLIC_URL + the webhook path + ?scope=<container>), or re-verify them with --verify.")

    def add_arguments(self, parser):
        parser.add_argument("instance", nargs="?", help="Connector instance id (or use --company/--connector).")
        parser.add_argument("--company", help="Company issue prefix or id.")
        parser.add_argument("--connector", help="Connector name within --company.")
        parser.add_argument("--verify", action="store_true", help="Only re-verify the existing registrations.")
        parser.add_argument("--expect-handshake", type=int, metavar="MINUTES",
                            help="Only open the handshake window (e.g. before Notion resends its verification "
                                 "token, or before creating a webhook by hand).")
        self.add_actor_arguments(parser)

    def _target(self, options) -> ConnectorInstance:
        if options.get("instance"):
            return self.instance(options["instance"])
        if not (options.get("company") and options.get("connector")):
            raise CommandError("Give an instance id, or --company and --connector.")
        company = self.company(options["company"])
        instance = ConnectorInstance.objects.filter(company=company, name__iexact=options["connector"]).first()
        if instance is None:
            raise CommandError(f"No connector '{options['connector']}' in {company.issue_prefix}.")
        return instance

    def handle(self, *args, **options):
        instance, actor = self._target(options), self.actor(options)
        if options.get("expect_handshake"):
            until = self.call(handshake_window_open, actor=actor, instance=instance,
                              duration=timedelta(minutes=max(options["expect_handshake"], 1)))
            return self.emit(options, {"handshakeOpenUntil": until.isoformat()},
                             f"Handshake window open until {until.isoformat()}.")
        try:
            results = (self.call(webhooks_reverify, instance=instance, actor=actor) if options["verify"]
                       else self.call(webhooks_register, instance=instance, actor=actor))
        except ProviderError as exc:  # the adapter could not even be asked (e.g. its base URL refused)
            raise CommandError(str(exc))
        lines = [f"{r['scope']}: {'active' if r.get('active') else 'NOT active'} "
                 f"{r.get('externalId') or ''} {r.get('detail') or ''}".rstrip() for r in results]
        self.emit(options, {"registrations": results}, "\n".join(lines) or "No registrations.")
        if any(not r.get("active") for r in results):
            raise CommandError("Some webhooks are not active (see above); polling continues as the backstop.")
