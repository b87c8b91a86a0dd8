"""Notion webhooks: the one-time verification request and signed, sparse event deliveries.

Verification: when a subscription is created in the integration's settings (Notion's API cannot create
one), Notion POSTs ``{"verification_token": "secret_..."}`` once, unsigned. :func:`handshake` answers it
with ``HandshakeReply(secret=token, show_operator=True)``: the engine stores the token as the webhook
secret and shows it to the operator, who pastes it back into Notion to verify the subscription.

Deliveries: ``X-Notion-Signature: sha256=<hex HMAC-SHA256(verification token, raw body)>``, compared in
constant time before the body is parsed. Events are sparse (``entity`` id + ``type``, ``data.parent``):

- ``page.created`` / ``properties_updated`` / ``content_updated`` / ``undeleted`` / ``moved`` / ``locked`` /
  ``unlocked`` -> TASK_UPSERTED with ``task=None`` (the engine reads the page back with ``get_task``);
- ``page.deleted`` (moved to the trash) -> TASK_DELETED;
- ``comment.created`` / ``updated`` -> COMMENT_UPSERTED and ``comment.deleted`` -> COMMENT_DELETED, naming
  the comment id and ``data.page_id`` only: the signature is good but the payload carries no content, so
  the event is marked ``sparse`` and the engine reads the comment back through the API
  (``list_comments``) before it imports anything;
- anything else (``database.*``, ``data_source.*``) -> IGNORED.

The container is ``data.parent.id`` (or its ``data_source_id`` / ``database_id``), compared without dashes
against the containers; a page event whose parent is none of them (a workspace-wide subscription also
reports unrelated pages) is IGNORED, except ``page.moved``, which then means the page left its container
(TASK_DELETED, ``transfer``; the engine applies it only to a linked page). Comment events name no
container (``container_id=None``): the engine accepts them for linked pages only. ``event_id`` is the
event ``id``: a retry carries the same id with a higher ``attempt_number``, so it is one effect."""
from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, Mapping

from ..base import (
    EventKind,
    ExternalActor,
    ExternalComment,
    HandshakeReply,
    VerifiedEvent,
    WebhookRejected,
    WebhookRequest,
    WebhookUnparseable,
)
from ..http import lower_headers, parse_utc, signature_matches, webhook_json

if TYPE_CHECKING:
    from . import NotionAdapter

SIGNATURE_HEADER = "x-notion-signature"
_SIGNATURE = re.compile(r"^sha256=([0-9a-fA-F]{64})$")
HANDSHAKE_MAX_BYTES = 4096
PAGE_UPSERTS = ("page.created", "page.properties_updated", "page.content_updated", "page.undeleted", "page.moved",
                "page.locked", "page.unlocked")
COMMENT_UPSERTS = ("comment.created", "comment.updated")


def handshake(request: WebhookRequest) -> HandshakeReply | None:
    """The verification request (a small unsigned JSON object with ``verification_token``), else None."""
    if request.method != "POST" or len(request.body or b"") > HANDSHAKE_MAX_BYTES:
        return None
    if lower_headers(request.headers).get(SIGNATURE_HEADER):
        return None  # a signed delivery is never the verification request
    try:
        payload = json.loads((request.body or b"").decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    token = payload.get("verification_token") if isinstance(payload, dict) else None
    if not isinstance(token, str) or not token.strip() or "type" in payload:
        return None
    return HandshakeReply(status=200, body={"ok": True}, secret=token.strip(), show_operator=True,
                          detail="Notion verification token received: paste it into the integration's webhook "
                                 "settings to verify the subscription; deliveries are then signed with it.")


def verify(adapter: "NotionAdapter", request: WebhookRequest) -> VerifiedEvent:
    secret = adapter.config.webhook_secret
    if not secret:
        raise WebhookRejected("No verification token is stored for this connector; Notion deliveries cannot be "
                              "verified (complete the webhook verification first).")
    header = (lower_headers(request.headers).get(SIGNATURE_HEADER) or "").strip()
    if not header:
        raise WebhookRejected("Missing X-Notion-Signature header.")
    m = _SIGNATURE.match(header)
    if not m:
        raise WebhookRejected("Malformed X-Notion-Signature header (expected sha256=<64 hex digits>).")
    body = request.body or b""
    if not signature_matches(secret, body, m.group(1)):
        raise WebhookRejected("X-Notion-Signature does not match the body.")
    # --- signature verified; only now parse -----------------------------------------------------------
    payload = webhook_json(body, "Notion")
    event_id, kind = payload.get("id"), payload.get("type")
    entity = payload.get("entity") if isinstance(payload.get("entity"), Mapping) else {}
    data = payload.get("data") if isinstance(payload.get("data"), Mapping) else {}
    if not isinstance(event_id, str) or not event_id or not isinstance(kind, str):
        raise WebhookUnparseable("Notion event has no id or type.")
    occurred = parse_utc(payload.get("timestamp"))
    actor = _actor(adapter, payload.get("authors"))
    action = f"{kind}#attempt{payload.get('attempt_number')}" if payload.get("attempt_number") else kind
    base = dict(event_id=event_id, action=action, occurred_at=occurred, actor=actor)
    if kind.startswith("page."):
        page_id = str(entity.get("id") or "")
        if not page_id:
            raise WebhookUnparseable(f"Notion {kind} event names no page.")
        container = adapter.container_of_parent(data.get("parent"))
        if container is None:
            if kind == "page.moved":
                return VerifiedEvent(kind=EventKind.TASK_DELETED, external_task_id=page_id,
                                     **{**base, "action": "page.moved;transfer"})
            return VerifiedEvent(kind=EventKind.IGNORED, external_task_id=None,
                                 **{**base, "action": f"{kind};outside the containers"})
        if kind == "page.deleted":
            return VerifiedEvent(kind=EventKind.TASK_DELETED, external_task_id=page_id, container_id=container, **base)
        if kind in PAGE_UPSERTS:
            return VerifiedEvent(kind=EventKind.TASK_UPSERTED, external_task_id=page_id, container_id=container,
                                 task=None, **base)
        return VerifiedEvent(kind=EventKind.IGNORED, external_task_id=None, **base)
    if kind.startswith("comment."):
        comment_id, page_id = str(entity.get("id") or ""), str(data.get("page_id") or "")
        if not comment_id or not page_id:
            raise WebhookUnparseable(f"Notion {kind} event names no comment or page.")
        stub = ExternalComment(external_comment_id=comment_id, external_task_id=page_id,
                               author=actor or ExternalActor(adapter.provider_key, "", "Notion"), body="",
                               created_at=occurred, updated_at=occurred, envelope={"sparse": True})
        if kind in COMMENT_UPSERTS:
            # signed, but no content in the payload: the engine reads the comment back (sparse)
            return VerifiedEvent(kind=EventKind.COMMENT_UPSERTED, external_task_id=page_id, comment=stub,
                                 sparse=True, **base)
        if kind == "comment.deleted":
            return VerifiedEvent(kind=EventKind.COMMENT_DELETED, external_task_id=page_id, comment=stub, **base)
    return VerifiedEvent(kind=EventKind.IGNORED, external_task_id=None, **base)


def _actor(adapter: "NotionAdapter", authors: Any) -> ExternalActor | None:
    """The first author; the connector's own bot only when every author is it (aggregated events may
    combine a person's edit with ours: that is not an echo)."""
    rows = [a for a in authors or () if isinstance(a, Mapping) and a.get("id")] if isinstance(authors, list) else []
    if not rows:
        return None
    service = (adapter.config.service_account_id or "").strip()
    own = bool(service) and all(str(a["id"]) == service for a in rows)
    first = rows[0]
    return ExternalActor(provider_key=adapter.provider_key, external_user_id=str(first["id"]),
                         display_name=f"Notion {first.get('type') or 'user'} {str(first['id'])[:8]}",
                         is_connector_service_account=own)
