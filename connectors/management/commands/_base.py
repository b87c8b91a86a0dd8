"""Shared bits of the connector operator commands: company/instance lookup and the acting user."""
import json
import uuid

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from connectors.models import ConnectorInstance, InboundEvent, TaskLink
from issues.actors import SYSTEM, Actor
from issues.models import Company
from paperclip.core.errors import ApiError


class ConnectorCommand(BaseCommand):
    def add_actor_arguments(self, parser):
        parser.add_argument("--user", help="Username recorded as the acting operator (default: system).")
        parser.add_argument("--idempotency-key", help="Default: a new random key.")
        parser.add_argument("--reason", default="")
        parser.add_argument("--json", action="store_true", help="Print the result as JSON.")

    def actor(self, options) -> Actor:
        if not options.get("user"):
            return SYSTEM
        user = get_user_model().objects.filter(username=options["user"]).first()
        if user is None:
            raise CommandError(f"No user '{options['user']}'.")
        return Actor(user=user)

    def key(self, options) -> str:
        return options.get("idempotency_key") or f"cli-{uuid.uuid4()}"

    def instance(self, ref) -> ConnectorInstance:
        try:
            return ConnectorInstance.objects.select_related("company").get(pk=uuid.UUID(str(ref)))
        except (ValueError, ConnectorInstance.DoesNotExist):
            raise CommandError(f"No connector instance '{ref}'.")

    def link(self, ref) -> TaskLink:
        try:
            return TaskLink.objects.select_related("instance").get(pk=uuid.UUID(str(ref)))
        except (ValueError, TaskLink.DoesNotExist):
            raise CommandError(f"No task link '{ref}'.")

    def event(self, ref) -> InboundEvent:
        try:
            return InboundEvent.objects.select_related("instance").get(pk=int(ref))
        except (ValueError, InboundEvent.DoesNotExist):
            raise CommandError(f"No inbound event '{ref}'.")

    def company(self, ref) -> Company:
        company = Company.objects.filter(issue_prefix=str(ref).upper()).first()
        if company is None:
            try:
                company = Company.objects.filter(pk=uuid.UUID(str(ref))).first()
            except ValueError:
                company = None
        if company is None:
            raise CommandError(f"No company '{ref}' (give its issue prefix or id).")
        return company

    def call(self, fn, **kwargs):
        try:
            return fn(**kwargs)
        except ApiError as exc:
            detail = f" {json.dumps(exc.details, default=str)}" if exc.details else ""
            raise CommandError(f"{exc.message}{detail}")

    def emit(self, options, result: dict, text: str):
        if options.get("json"):
            self.stdout.write(json.dumps(result, default=str))
        else:
            self.stdout.write(text)


class InstanceOrLinkCommand(ConnectorCommand):
    """An intervention on a whole instance (INSTANCE) or one link (--link): pause and resume."""
    verb = ""
    instance_action = link_action = None  # services taking (actor, idempotency_key, reason, instance|link)

    def add_arguments(self, parser):
        parser.add_argument("instance", nargs="?")
        parser.add_argument("--link")
        self.add_actor_arguments(parser)

    def handle(self, *args, **options):
        common = {"actor": self.actor(options), "idempotency_key": self.key(options), "reason": options["reason"]}
        if options["link"]:
            result = self.call(type(self).link_action, link=self.link(options["link"]), **common)
        elif options["instance"]:
            result = self.call(type(self).instance_action, instance=self.instance(options["instance"]), **common)
        else:
            raise CommandError("Give an instance id or --link.")
        self.emit(options, result, f"{self.verb}: {result}")
