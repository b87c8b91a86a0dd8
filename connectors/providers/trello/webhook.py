"""Trello webhook deliveries (Appendix A.5): the callback check, the signature, and what an action means.

Setup: Trello checks a callback URL with a ``HEAD`` request before it creates the webhook and creates it
only on a 200 (:func:`handshake`); nothing is handed over (the signing secret is the Trello app's own).

Signature: ``X-Trello-Webhook`` = base64(HMAC-SHA1(app secret, raw body + callbackURL)), where callbackURL
is exactly the URL the webhook was registered with (``WebhookRequest.url``: the public URL, with its
``?scope=``). It is compared in constant time before anything is parsed; a signature made for another URL
does not verify. The delivery identity is ``action.id`` (Trello has no delivery id or timestamp header).

Payload ``{"model": ..., "action": {"id", "type", "date", "data", "memberCreator"}}``; the board is
``action.data.board.id`` (else the model's). Card actions carry only a few card fields, so they become
sparse ``TASK_UPSERTED`` events (``task=None``: the engine reads the card back through the API). Comments
are complete in the payload. ``moveCardFromBoard`` (the card left a container board) is ``TASK_DELETED``
(action suffix ``;transfer``), like ``deleteCard``. With ``config["lists"]`` narrowing a board, a card moved
out of the narrowed lists is ``TASK_DELETED`` too, and an action on a card in another list is ``IGNORED``;
an action that does not say the card's list on a narrowed board (a label change) is ``IGNORED`` as well
(the poll and reconcile backstops read the card)."""
from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any, Mapping

from ..base import (
    ErrorCategory,
    EventKind,
    HandshakeReply,
    VerifiedEvent,
    WebhookRejected,
    WebhookRequest,
    WebhookUnparseable,
)
from ..http import lower_headers, parse_utc, webhook_event_id, webhook_json

SIGNATURE_HEADER = "x-trello-webhook"
# Actions that change a card (the card is read back); the rest of Trello's action types are IGNORED.
CARD_ACTIONS = frozenset({
    "createCard", "updateCard", "copyCard", "moveCardToBoard", "convertToCardFromCheckItem", "emailCard",
    "addLabelToCard", "removeLabelFromCard", "addMemberToCard", "removeMemberFromCard", "updateCheckItemStateOnCard",
    "addChecklistToCard", "removeChecklistFromCard", "updateCustomFieldItem",
})
COMMENT_ACTIONS = frozenset({"commentCard", "updateComment", "deleteComment"})
LEAVE_ACTIONS = frozenset({"deleteCard", "moveCardFromBoard"})


def sign(secret: str, body: bytes, callback_url: str) -> str:
    """Trello's ``X-Trello-Webhook`` value for ``body`` sent to ``callback_url``."""
    digest = hmac.new(secret.encode("utf-8"), body + callback_url.encode("utf-8"), hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def handshake(request: WebhookRequest) -> HandshakeReply | None:
    if request.method.upper() == "HEAD":
        return HandshakeReply(status=200, detail="Trello callback check (HEAD) answered 200")
    return None


def check_signature(request: WebhookRequest, secret: str | None) -> bytes:
    """The verified raw body, or WebhookRejected."""
    if not secret:
        raise WebhookRejected("No webhook secret (the Trello app secret) is configured; Trello deliveries "
                              "cannot be verified.")
    if not request.url:
        raise WebhookRejected("The public webhook URL is not known (CONNECTORS PUBLIC_BASE_URL): the Trello "
                              "signature covers it.")
    signature = (lower_headers(request.headers).get(SIGNATURE_HEADER) or "").strip()
    if not signature:
        raise WebhookRejected("Missing X-Trello-Webhook header.")
    body = request.body or b""
    if not hmac.compare_digest(sign(secret, body, request.url).encode("ascii"), signature.encode("utf-8", "replace")):
        raise WebhookRejected("X-Trello-Webhook does not match the body and the registered callback URL.")
    return body


def _obj(value: Any) -> Mapping:
    return value if isinstance(value, Mapping) else {}


def parse(adapter, request: WebhookRequest, body: bytes) -> VerifiedEvent:
    """A verified body -> the event (``adapter``: container lookup, narrowing, normalization)."""
    payload = webhook_json(body, "Trello")
    action = payload.get("action")
    if not isinstance(action, Mapping) or not action.get("id") or not isinstance(action.get("type"), str):
        raise WebhookUnparseable("Trello webhook body has no action with an id and a type.")
    event_id = webhook_event_id(str(action["id"]), body)
    kind_name = str(action["type"])
    data, model = _obj(action.get("data")), _obj(payload.get("model"))
    occurred = parse_utc(action.get("date"))
    actor = adapter.actor(action.get("memberCreator")) or (
        adapter.actor({"id": action["idMemberCreator"]}) if action.get("idMemberCreator") else None)
    board_id = _obj(data.get("board")).get("id") or model.get("idBoard") or (
        model.get("id") if "prefs" in model or "idOrganization" in model else None)
    card = _obj(data.get("card"))
    card_id = str(card.get("id") or "") or None

    def event(kind, action_name=kind_name, **extra):
        return VerifiedEvent(event_id=event_id, kind=kind, action=action_name, external_task_id=card_id,
                             occurred_at=occurred, actor=actor, container_id=container, **extra)

    container = adapter.container_of(board_id) if board_id else None
    if kind_name not in CARD_ACTIONS | COMMENT_ACTIONS | LEAVE_ACTIONS or not card_id:
        return VerifiedEvent(event_id=event_id, kind=EventKind.IGNORED, action=kind_name, external_task_id=None,
                             occurred_at=occurred, actor=actor)
    if board_id and container is None:
        raise WebhookRejected(f"Delivery for Trello board {board_id!r}, which is not one of this connector's "
                              "containers.", category=ErrorCategory.PROVIDER_PAYLOAD)
    narrowing = adapter.narrowing
    narrowed = narrowing.narrowed(board_id)
    if kind_name in LEAVE_ACTIONS:
        target = _obj(data.get("boardTarget")).get("id")
        if kind_name == "moveCardFromBoard" and adapter.container_of(target) is not None:
            # moved to another board of this connector: the card is still ours (read it back there)
            container = adapter.container_of(target)
            return event(EventKind.TASK_UPSERTED, f"{kind_name};to-container")
        return event(EventKind.TASK_DELETED, kind_name + (";transfer" if kind_name == "moveCardFromBoard" else ""))
    if kind_name in COMMENT_ACTIONS:
        lst = _obj(data.get("list"))
        if narrowed and lst.get("id") and not narrowing.allows(board_id, lst.get("id"), lst.get("name")):
            return event(EventKind.IGNORED, f"{kind_name};outside-lists")
        try:
            if kind_name == "commentCard":
                comment = adapter.normalize_comment(action)
                return event(EventKind.COMMENT_UPSERTED, comment=comment)
            inner = _obj(data.get("action"))
            if not inner.get("id"):
                raise KeyError("data.action.id")
            original = {"id": inner["id"], "type": "commentCard", "date": inner.get("date") or action.get("date"),
                        "memberCreator": action.get("memberCreator"), "idMemberCreator": action.get("idMemberCreator"),
                        "data": {"text": inner.get("text") or "", "card": card,
                                 "dateLastEdited": action.get("date") if kind_name == "updateComment" else None}}
            comment = adapter.normalize_comment(original)
        except (KeyError, TypeError, ValueError) as exc:
            raise WebhookUnparseable(f"Trello {kind_name} payload is missing or has a bad key: {exc}") from None
        if kind_name == "deleteComment":
            return event(EventKind.COMMENT_DELETED, comment=comment)
        return event(EventKind.COMMENT_UPSERTED, comment=comment)
    # a card action: sparse, the engine reads the card back
    if narrowed:
        after = _obj(data.get("listAfter")) or _obj(data.get("list")) or (
            {"id": card.get("idList")} if card.get("idList") else {})
        before = _obj(data.get("listBefore"))
        if not after.get("id"):
            return event(EventKind.IGNORED, f"{kind_name};list-unknown")
        if not narrowing.allows(board_id, after.get("id"), after.get("name")):
            if before.get("id") and narrowing.allows(board_id, before.get("id"), before.get("name")):
                return event(EventKind.TASK_DELETED, f"{kind_name};transfer:out-of-lists")
            return event(EventKind.IGNORED, f"{kind_name};outside-lists")
    return event(EventKind.TASK_UPSERTED)
