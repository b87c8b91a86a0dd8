"""Webhook intake (§7.1.1): verify on the raw body, store once, answer fast, process on commit."""
from __future__ import annotations

from dataclasses import dataclass

from django.db.models import F
from django.utils import timezone

from connectors.choices import EventSource, InstanceStatus
from connectors.models import ConnectorInstance, InboundEvent
from connectors.providers.base import WebhookRejected, WebhookRequest

from .common import adapter_for, conf, container_allowed
from .inbound import event_store, kick


@dataclass
class IntakeResult:
    event: InboundEvent
    created: bool


class BodyTooLarge(Exception):
    pass


def webhook_rejected(instance_id, reason: str):
    """The only write a rejected delivery causes: the health counter (§12.2)."""
    ConnectorInstance.objects.filter(pk=instance_id).update(
        webhook_rejected_count=F("webhook_rejected_count") + 1, last_webhook_rejected_at=timezone.now(),
        last_webhook_rejected_reason=reason[:300])


def webhook_intake(*, instance: ConnectorInstance, body: bytes, headers: dict, url: str = "") -> IntakeResult:
    """Raises BodyTooLarge, WebhookRejected, WebhookUnparseable or SecretUnavailable (nothing stored
    for any of them but the rejection counter, which the caller updates)."""
    if len(body) > int(conf("WEBHOOK_MAX_BODY_BYTES")):
        raise BodyTooLarge()
    adapter = adapter_for(instance, with_credentials=False, with_webhook_secret=True)
    verified = adapter.verify_webhook(WebhookRequest(body=body, headers=headers, url=url))
    if not container_allowed(instance, verified.container_id):
        raise WebhookRejected(f"Payload for another container ({verified.container_id}).")
    event, created = event_store(instance=instance, event=verified, source=EventSource.WEBHOOK,
                                 headers=_kept_headers(headers), body=body, verified=True,
                                 verification="signature" if type(adapter).capabilities.signed_webhooks else "unsigned")
    now = timezone.now()
    if not instance.webhook_verified or instance.last_webhook_at is None or \
            (now - instance.last_webhook_at).total_seconds() >= 1:
        # At most one health write per second per instance: a busy repository does not contend on it.
        ConnectorInstance.objects.filter(pk=instance.pk).update(last_webhook_at=now, webhook_verified=True)
    if created and instance.status == InstanceStatus.ACTIVE and event.external_task_id:
        kick(instance.pk, event.external_task_id)
    return IntakeResult(event=event, created=created)


SKIPPED_HEADERS = {"authorization", "cookie"}


def _kept_headers(headers: dict) -> dict:
    return {k: v for k, v in headers.items() if k.lower() not in SKIPPED_HEADERS}
