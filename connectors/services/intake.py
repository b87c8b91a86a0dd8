"""Webhook intake (§7.1.1): verify on the raw body, store once, answer fast, process on commit.

- A delivery that verifies but does not parse (provider schema drift, §13.1.8) is stored raw as a parked
  ``unparsed`` event with a ``schema_drift`` health entry, instead of being refused: :func:`unparsed_replay`
  (the operator's replay) verifies and parses it again with the current code, so after an upgrade it
  applies; a redelivery of it that now parses upgrades the same row. Where each event has an id of its
  own (Trello, Asana, Notion) the parsed events get rows of their own: a redelivery stores them beside
  the parked row, and the replay finishes the parked row, pointing at the first of them (stored then, or
  already by the redelivery: applied once either way). Bodies nested deeper than
  ``PAPERCLIP["JSON_MAX_DEPTH"]`` and unsigned deliveries that do not parse are still refused (400).
- A delivery that names only its task (no container: a Linear comment removal) is accepted only for a task
  already linked on this instance, else refused like a wrong container (401, nothing stored).
- A delivery that carries several events (``VerifiedEvent.carried``: a Jira issue update with a comment)
  is stored as one inbox row per event, in order."""
from __future__ import annotations

from dataclasses import dataclass, replace

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from connectors.choices import ErrorCategory, EventKindChoice, EventSource, EventStatus, InstanceStatus, LinkStatus
from connectors.models import ConnectorInstance, InboundEvent, TaskLink
from connectors.providers.base import (
    EventKind,
    HandshakeReply,
    TaskSourceAdapter,
    VerifiedEvent,
    WebhookRejected,
    WebhookRequest,
    WebhookUnparseable,
)
from connectors.providers.http import webhook_event_id
from connectors.secrets import SecretUnavailable
from issues.exceptions import Unprocessable
from paperclip.core.parsers import has_nul, json_depth_exceeds, without_nul
from paperclip.core.parsers import max_depth as max_json_depth

from . import codec
from .common import adapter_for, conf, container_allowed, registration_of, sync_error_record
from .inbound import event_store, kick
from .instances import webhook_url
from .webhook_setup import handshake_accept


@dataclass
class IntakeResult:
    event: InboundEvent
    created: bool


class BodyTooLarge(Exception):
    pass


class WebhookTooDeep(WebhookUnparseable):
    """Verified, but nested deeper than any payload: refused (400), never stored."""


class MethodNotAllowed(Exception):
    """A non-POST request no handshake of this provider answers (405)."""


class WebhookTaskNotLinked(WebhookRejected):
    """The delivery names no container, only a task this instance does not link (401, nothing stored)."""


_TOO_DEEP = "Webhook body is nested too deep (more than {limit} levels of arrays/objects)."
UNPARSED_OUTCOME = "parked: verified, but the body did not parse (schema drift); replay it after an upgrade"


def webhook_rejected(instance_id, reason: str):
    """The only write a rejected delivery causes: the health counter (§12.2)."""
    ConnectorInstance.objects.filter(pk=instance_id).update(
        webhook_rejected_count=F("webhook_rejected_count") + 1, last_webhook_rejected_at=timezone.now(),
        last_webhook_rejected_reason=reason[:300])


def public_url(instance: ConnectorInstance, scope: str | None) -> str:
    """The URL the provider was given for ``scope`` (exactly as registered), for signatures that cover it."""
    registration = registration_of(instance, scope)
    return (registration or {}).get("callbackUrl") or webhook_url(instance, scope)


def webhook_intake(*, instance: ConnectorInstance, body: bytes, headers: dict, method: str = "POST",
                   scope: str | None = None) -> IntakeResult | HandshakeReply:
    """Raises BodyTooLarge, WebhookRejected, WebhookUnparseable (a body nested too deep, or an unsigned
    one that does not parse), SecretUnavailable or HandshakeRefused (nothing stored for any of them but the
    rejection counter, which the caller updates). A signed delivery that does not parse is stored parked.
    A provider's setup request (a handshake) returns the reply the view sends instead of an event."""
    if len(body) > int(conf("WEBHOOK_MAX_BODY_BYTES")):
        raise BodyTooLarge()
    adapter = adapter_for(instance, with_credentials=False, with_webhook_secret=True, scope=scope)
    request = WebhookRequest(body=body, headers=headers, url=public_url(instance, scope), method=method.upper(),
                             scope=scope or None)
    reply = adapter.webhook_handshake(request)
    if reply is not None:
        return handshake_accept(instance=instance, reply=reply, scope=scope or None)
    if request.method != "POST":
        raise MethodNotAllowed(request.method)
    try:
        verified = _verify(adapter, request)
    except WebhookTooDeep:
        raise
    except WebhookUnparseable as exc:
        if not _signed(adapter):
            raise  # an unverifiable body that does not even parse is not worth keeping
        return _park_unparsed(instance, adapter, request, str(exc) or "Unparseable webhook payload.")
    verified = _admit(instance, verified)
    # An unsigned delivery (no webhook secret) is stored as an unverified hint: the engine applies
    # only what the provider's API returns when it reads the task back (readback.py, §5.1.5).
    signed = _signed(adapter)
    if verified.carried:  # several events: their rows commit together
        with transaction.atomic():
            event, created = _store(instance, verified, headers=_kept_headers(headers), body=body)
    else:  # one event: its single INSERT is its own transaction
        event, created = _store(instance, verified, headers=_kept_headers(headers), body=body)
    _note_delivery(instance, signed)
    return IntakeResult(event=event, created=created)


def _signed(adapter: TaskSourceAdapter) -> bool:
    """Providers check the signature before they parse (TaskSourceAdapter.verify_webhook) and refuse an
    unsigned delivery unless they take hints (Jira without a secret): with a secret, an unparseable
    body got past the signature check."""
    return bool(adapter.config.webhook_secret)


def _verify(adapter: TaskSourceAdapter, request: WebhookRequest) -> VerifiedEvent:
    limit = max_json_depth()
    try:
        verified = adapter.verify_webhook(request)
    except RecursionError:
        # Verified, but nested beyond what the JSON decoder can recurse: refused (400), never a 500.
        raise WebhookTooDeep(_TOO_DEEP.format(limit=limit)) from None
    except WebhookUnparseable:
        if json_depth_exceeds(request.body, limit):
            raise WebhookTooDeep(_TOO_DEEP.format(limit=limit)) from None
        raise
    if json_depth_exceeds(request.body, limit):  # verified, parsed, but deeper than any payload
        raise WebhookTooDeep(_TOO_DEEP.format(limit=limit))
    return _without_nul(verified) if _may_hold_nul(request.body) else verified


# How a NUL can reach parsed text: raw, JSON-escaped, or form-encoded. A body with none of them (nearly
# every delivery) skips the walk over the normalized event.
_NUL_SPELLINGS = (b"\x00", b"\\u0000", b"%00")


def _may_hold_nul(body: bytes) -> bool:
    return any(spelling in body for spelling in _NUL_SPELLINGS)


def _events_of(verified: VerifiedEvent) -> list[VerifiedEvent]:
    """The delivery's events in order: the first, then those it carries (each without ``carried``)."""
    return [replace(verified, carried=()), *verified.carried]


def _admit(instance: ConnectorInstance, verified: VerifiedEvent) -> VerifiedEvent:
    """The container check (§14.2) of every event the delivery carries; returns what is admitted. One that
    names no container is resolved through the task's existing link (§7.1.1): accepted only when it is
    linked here. In a batch of several events (Asana) such an entry is left out and the others stored; a
    delivery with nothing left, or naming another container anywhere, is refused (401, nothing stored)."""
    every = _events_of(verified)
    for event in every:
        if event.container_id is not None and not container_allowed(instance, event.container_id):
            raise WebhookRejected(f"Payload for another container ({event.container_id}).")
    # container-less entries that must already be linked here: one query for the whole delivery
    wanted = {e.external_task_id for e in every if e.container_id is None and e.external_task_id
              and e.kind != EventKind.IGNORED and not (e.kind == EventKind.TASK_UPSERTED and e.task is None)}
    linked = set(TaskLink.objects.filter(instance=instance, external_task_id__in=wanted).exclude(
        status=LinkStatus.UNLINKED).values_list("external_task_id", flat=True)) if wanted and instance.containers \
        else wanted
    events = [e for e in every if e.container_id is not None or e.external_task_id not in wanted - linked]
    if not events:
        task_id = next(iter(wanted - linked))
        raise WebhookTaskNotLinked(f"The delivery names no container, only task {task_id}, which is not linked on "
                                   "this connector.", category=ErrorCategory.PROVIDER_PAYLOAD)
    return replace(events[0], carried=tuple(events[1:]))


def _store(instance: ConnectorInstance, verified: VerifiedEvent, *, headers: dict, body: bytes,
           source: str = EventSource.WEBHOOK) -> tuple[InboundEvent, bool]:
    """One inbox row per event of the delivery (the carried ones after the first), each once per key;
    a key held by a parked unparsed row (an earlier delivery of this body) upgrades that row."""
    first, created = None, False
    for position, event in enumerate(_events_of(verified)):
        signed = event.trusted_content
        row, new = event_store(instance=instance, event=event, source=source, headers=headers, body=body,
                               verified=signed, verification="signature" if signed else "unverified")
        if not new and row.kind == EventKindChoice.UNPARSED and row.status == EventStatus.PARKED:
            row, new = _reparsed(row, event), True
        if new and instance.status == InstanceStatus.ACTIVE and row.external_task_id and \
                row.status == EventStatus.PENDING:
            kick(instance.pk, row.external_task_id)
        if position == 0:
            first, created = row, new
    return first, created


def _reparsed(row: InboundEvent, event: VerifiedEvent) -> InboundEvent:
    """An unparsed row now parsed by the current code: it becomes the event it always was (same key)."""
    row.kind, row.action = event.kind, (event.action or "")[:100]
    row.external_task_id = event.external_task_id or ""
    row.payload, row.occurred_at = codec.dump(event), event.occurred_at
    row.verified = event.trusted_content
    row.verification = "signature" if event.trusted_content else "unverified"
    row.attempts, row.next_attempt_at, row.error_category, row.error_message = 0, None, "", ""
    if event.kind == EventKind.IGNORED or not row.external_task_id:
        row.status, row.outcome = EventStatus.DROPPED, f"re-parsed: nothing to do for {event.action or 'this event'}"
    else:
        row.status, row.outcome = EventStatus.PENDING, "re-parsed with the current code"
    row.save(update_fields=["kind", "action", "external_task_id", "payload", "occurred_at", "verified",
                            "verification", "attempts", "next_attempt_at", "error_category", "error_message",
                            "status", "outcome"])
    return row


def _park_unparsed(instance: ConnectorInstance, adapter: TaskSourceAdapter, request: WebhookRequest,
                   message: str) -> IntakeResult:
    """§13.1.8: keep the verified body raw, parked, with a health entry; once per delivery (the
    provider's delivery id header when it sends one, else a content hash — the key it would get parsed,
    except where each event has an id of its own: see unparsed_replay)."""
    header = adapter.delivery_id_header
    key = webhook_event_id(request.headers.get(header) if header else None, request.body)[:300]
    message = without_nul(message)[:2000]
    with transaction.atomic():
        try:
            with transaction.atomic():
                row = InboundEvent.objects.create(
                    instance=instance, company_id=instance.company_id, idempotency_key=key,
                    source=EventSource.WEBHOOK, kind=EventKindChoice.UNPARSED, action="unparsed",
                    raw_headers=_kept_headers(request.headers), raw_body=request.body,
                    payload={"unparsed": {"error": message, "url": request.url, "scope": request.scope}}, verified=True,
                    verification="signature", status=EventStatus.PARKED, outcome=UNPARSED_OUTCOME,
                    error_category=ErrorCategory.PROVIDER_PAYLOAD, error_message=message)
        except IntegrityError:
            return IntakeResult(event=InboundEvent.objects.get(instance=instance, idempotency_key=key), created=False)
        sync_error_record(instance=instance, category=ErrorCategory.SCHEMA_DRIFT, event=row,
                          message=f"Webhook delivery {key} verified but did not parse; stored raw and parked "
                                  f"(replay it after an upgrade): {message}",
                          details={"eventId": row.pk, "idempotencyKey": key, "error": message})
    _note_delivery(instance, True)
    return IntakeResult(event=row, created=True)


def unparsed_replay(*, event: InboundEvent) -> dict:
    """An operator's replay of a parked ``unparsed`` event (inside the intervention's transaction):
    verify and parse its raw body again with the current code and the current webhook secret. Parsed,
    it becomes the event it always was and is queued; otherwise the replay is refused (422) and the row
    stays parked. A stored Linear-style timestamp is measured against when the delivery arrived."""
    instance = event.instance
    info = (event.payload or {}).get("unparsed") or {}
    scope = info.get("scope") or None
    request = WebhookRequest(body=bytes(event.raw_body or b""), headers=dict(event.raw_headers or {}),
                             url=info.get("url") or "", received_at=event.received_at.timestamp(), scope=scope)
    try:
        verified = _verify(adapter_for(instance, with_credentials=False, with_webhook_secret=True, scope=scope),
                           request)
        verified = _admit(instance, verified)
    except WebhookUnparseable as exc:
        raise Unprocessable("The stored delivery still does not parse with this version.", code="webhook_unparseable",
                            details={"error": [str(exc)[:500]]})
    except WebhookRejected as exc:
        raise Unprocessable("The stored delivery no longer verifies for this connector.", code="webhook_rejected",
                            details={"error": [str(exc)[:500]]})
    except (SecretUnavailable, LookupError) as exc:
        raise Unprocessable("The connector's webhook secret or provider is not available.",
                            code="webhook_secret_unavailable", details={"error": [str(exc)[:500]]})
    row, _ = _store(instance, verified, headers=dict(event.raw_headers or {}), body=bytes(event.raw_body or b""),
                    source=event.source)
    if row.pk != event.pk:  # keyed by its events (Trello, Asana, Notion): the parked row is finished
        event.status, event.applied_at = EventStatus.DROPPED, timezone.now()
        event.outcome = f"re-parsed with the current code: stored as event {row.pk}"
        event.save(update_fields=["status", "applied_at", "outcome"])
    return {"eventId": row.pk, "status": row.status, "kind": row.kind, "reparsed": True}


def _note_delivery(instance: ConnectorInstance, signed: bool):
    now = timezone.now()
    if (signed and not instance.webhook_verified) or instance.last_webhook_at is None or \
            (now - instance.last_webhook_at).total_seconds() >= 1:
        # At most one health write per second per instance: a busy repository does not contend on it.
        health = {"last_webhook_at": now} | ({"webhook_verified": True} if signed else {})
        ConnectorInstance.objects.filter(pk=instance.pk).update(**health)


def _without_nul(event: VerifiedEvent) -> VerifiedEvent:
    """A tracker's text may hold a NUL, which PostgreSQL's text and jsonb cannot store (a 500 at
    intake): the normalized event keeps U+FFFD in its place (the raw body is bytes, kept exact)."""
    if event.carried:
        event = replace(event, carried=tuple(_without_nul(extra) for extra in event.carried))
    main = replace(event, carried=())
    data = codec.dump(main)
    return replace(codec.event_load(without_nul(data)), carried=event.carried) if has_nul(data) else event


SKIPPED_HEADERS = {"authorization", "cookie"}


def _kept_headers(headers: dict) -> dict:
    return without_nul({k: v for k, v in headers.items() if k.lower() not in SKIPPED_HEADERS})
