"""Webhook intake (§7.1.1): verify on the raw body, store once, answer fast, process on commit."""
from __future__ import annotations

from dataclasses import dataclass

from django.db.models import F
from django.utils import timezone

from connectors.choices import EventSource, InstanceStatus
from connectors.models import ConnectorInstance, InboundEvent
from connectors.providers.base import VerifiedEvent, WebhookRejected, WebhookRequest, WebhookUnparseable
from paperclip.core.parsers import has_nul, json_depth_exceeds, without_nul
from paperclip.core.parsers import max_depth as max_json_depth

from . import codec
from .common import adapter_for, conf, container_allowed
from .inbound import event_store, kick


@dataclass
class IntakeResult:
    event: InboundEvent
    created: bool


class BodyTooLarge(Exception):
    pass


_TOO_DEEP = "Webhook body is nested too deep (more than {limit} levels of arrays/objects)."


def webhook_rejected(instance_id, reason: str):
    """The only write a rejected delivery causes: the health counter (§12.2)."""
    ConnectorInstance.objects.filter(pk=instance_id).update(
        webhook_rejected_count=F("webhook_rejected_count") + 1, last_webhook_rejected_at=timezone.now(),
        last_webhook_rejected_reason=reason[:300])


def webhook_intake(*, instance: ConnectorInstance, body: bytes, headers: dict, url: str = "") -> IntakeResult:
    """Raises BodyTooLarge, WebhookRejected, WebhookUnparseable (also for a verified body nested
    deeper than ``PAPERCLIP["JSON_MAX_DEPTH"]``) or SecretUnavailable (nothing stored for any of
    them but the rejection counter, which the caller updates)."""
    if len(body) > int(conf("WEBHOOK_MAX_BODY_BYTES")):
        raise BodyTooLarge()
    adapter = adapter_for(instance, with_credentials=False, with_webhook_secret=True)
    try:
        verified = adapter.verify_webhook(WebhookRequest(body=body, headers=headers, url=url))
    except RecursionError:
        # Providers check the signature before they parse, so this body is verified but nested
        # beyond what the JSON decoder can recurse: unparseable (400), never a 500.
        raise WebhookUnparseable(_TOO_DEEP.format(limit=max_json_depth())) from None
    if json_depth_exceeds(body, max_json_depth()):  # verified, parsed, but deeper than any payload
        raise WebhookUnparseable(_TOO_DEEP.format(limit=max_json_depth()))
    if not container_allowed(instance, verified.container_id):
        raise WebhookRejected(f"Payload for another container ({verified.container_id}).")
    verified = _without_nul(verified)
    # An unsigned delivery (no webhook secret) is stored as an unverified hint: the engine applies
    # only what the provider's API returns when it reads the task back (readback.py, §5.1.5).
    signed = verified.trusted_content
    event, created = event_store(instance=instance, event=verified, source=EventSource.WEBHOOK,
                                 headers=_kept_headers(headers), body=body, verified=signed,
                                 verification="signature" if signed else "unverified")
    now = timezone.now()
    if (signed and not instance.webhook_verified) or instance.last_webhook_at is None or \
            (now - instance.last_webhook_at).total_seconds() >= 1:
        # At most one health write per second per instance: a busy repository does not contend on it.
        health = {"last_webhook_at": now} | ({"webhook_verified": True} if signed else {})
        ConnectorInstance.objects.filter(pk=instance.pk).update(**health)
    if created and instance.status == InstanceStatus.ACTIVE and event.external_task_id:
        kick(instance.pk, event.external_task_id)
    return IntakeResult(event=event, created=created)


def _without_nul(event: VerifiedEvent) -> VerifiedEvent:
    """A tracker's text may hold a NUL, which PostgreSQL's text and jsonb cannot store (a 500 at
    intake): the normalized event keeps U+FFFD in its place (the raw body is bytes, kept exact)."""
    data = codec.dump(event)
    return codec.event_load(without_nul(data)) if has_nul(data) else event


SKIPPED_HEADERS = {"authorization", "cookie"}


def _kept_headers(headers: dict) -> dict:
    return without_nul({k: v for k, v in headers.items() if k.lower() not in SKIPPED_HEADERS})
