"""Asana webhooks (Appendix A.3): the ``X-Hook-Secret`` handshake, the ``X-Hook-Signature`` check and the
translation of a delivery's ``{"events": [...]}`` into one VerifiedEvent per entry.

Handshake: while ``POST /webhooks`` is in flight Asana POSTs to the target with ``X-Hook-Secret`` (no
events); the answer must be 200/204 echoing the same header. That value is the webhook's signing secret.

Deliveries: ``X-Hook-Signature`` = hex HMAC-SHA256(secret, raw body), checked in constant time before the
body is parsed. There is no delivery id and a POST carries several events, so each entry's key is a content
hash: ``asana:`` + sha256 of the entry's canonical JSON (sorted keys) — its resource gid, action,
``created_at``, ``change`` and ``user`` — stable across Asana's retries of the same POST. A heartbeat
(``{"events": []}``) is one IGNORED event keyed by the body's hash.

Events are sparse (``resource``/``parent`` are ``{gid, resource_type[, resource_subtype]}``; no field
values), so:

- task ``added``/``changed``/``undeleted`` (and ``removed`` from a *section*, half of a section move) ->
  TASK_UPSERTED with ``task=None``: the engine reads the task back (``get_task``);
- task ``deleted`` -> TASK_DELETED; task ``removed`` from a configured project -> TASK_DELETED as a transfer
  (the engine reads the task back: still in another configured project it is an update, not a deletion); added to / removed from a project that is not a container -> IGNORED;
- story with ``resource_subtype == "comment_added"`` (or none given): ``added`` -> COMMENT_UPSERTED carrying only
  the story and task gids, marked ``sparse`` so the engine confirms it by reading the task
  and its stories back (the text, author and time come from the API, never from the delivery);
  ``removed``/``deleted`` -> COMMENT_DELETED (only the story gid is used); a story event without its task
  (``parent`` null, as an edit's ``changed`` is: the engine's comment reconcile repairs edits) or of another
  subtype (system stories) -> IGNORED;
- sections, projects and anything else -> IGNORED.

Container: an event's ``parent`` project when it names one, else the project the webhook was registered on
(``WebhookRequest.scope``, from the ``?scope=`` of the callback URL: events with ``parent: null`` belong to
it), else the single configured project, else None (the engine then resolves the task through its link or
the read-back). Registrations made by ``connector_register_webhooks`` always carry ``?scope=``; only a webhook
created by hand for a connector with several projects delivers container-less events, and the engine leaves
out of such a batch a comment on a task it does not link yet (the comment reconcile brings it in later).

The same change seen by two webhooks (a task in two configured projects) is the same entry, so the same key:
it is applied once."""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import replace
from typing import Any, Mapping

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
from ..http import lower_headers, signature_matches, webhook_event_id, webhook_json
from ..http import parse_utc as utc
from .normalize import COMMENT_SUBTYPES, PROVIDER, actor

_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")
MAX_SECRET = 512


def handshake(request: WebhookRequest) -> HandshakeReply | None:
    """The echo of ``X-Hook-Secret`` (a POST that carries it is the creation handshake, not a delivery)."""
    headers = lower_headers(request.headers)
    secret = (headers.get("x-hook-secret") or "").strip()
    if request.method != "POST" or not secret:
        return None
    if len(secret) > MAX_SECRET or not secret.isprintable():
        raise WebhookRejected("Asana X-Hook-Secret is not a plausible secret.")
    return HandshakeReply(status=200, headers={"X-Hook-Secret": secret}, secret=secret,
                          detail="Asana handshake: X-Hook-Secret echoed, signing secret received")


def entry_key(entry: Mapping[str, Any]) -> str:
    canonical = json.dumps(entry, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "asana:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _ref(value: Any) -> dict:
    return dict(value) if isinstance(value, Mapping) else {}


class Translator:
    """One delivery's events -> VerifiedEvents for an adapter's configuration."""

    def __init__(self, containers: tuple[str, ...], service_account_id: str | None, scope: str | None):
        self.containers = containers
        self.service_account_id = service_account_id
        self.scope = (scope or "").strip() or None

    def _default_container(self) -> str | None:
        if self.scope and self.scope in self.containers:
            return self.scope
        if self.scope:
            return self.scope  # a registration for a project this instance no longer has: the engine refuses it
        return self.containers[0] if len(self.containers) == 1 else None

    def event(self, entry: Any) -> VerifiedEvent:
        if not isinstance(entry, Mapping):
            raise WebhookUnparseable("Asana event entry is not an object.")
        resource, parent = _ref(entry.get("resource")), _ref(entry.get("parent"))
        action = str(entry.get("action") or "")
        rtype = str(resource.get("resource_type") or entry.get("type") or "")
        subtype = resource.get("resource_subtype")
        gid = str(resource.get("gid") or "")
        if not gid or action not in ("added", "changed", "removed", "deleted", "undeleted"):
            raise WebhookUnparseable(f"Asana event without a resource gid or with an unknown action {action!r}.")
        change = _ref(entry.get("change"))
        name = f"{rtype}.{action}" + (f".{change.get('field')}" if change.get("field") else "") + \
            (f"@{parent.get('resource_type')}" if parent.get("resource_type") else "")
        common = {"event_id": entry_key(entry), "occurred_at": utc(entry.get("created_at")),
                  "actor": actor(entry.get("user"), self.service_account_id)}
        parent_type, parent_gid = parent.get("resource_type"), str(parent.get("gid") or "")

        def ignored(why: str) -> VerifiedEvent:
            return VerifiedEvent(kind=EventKind.IGNORED, action=f"{name};{why}", external_task_id=None, **common)

        if rtype == "task":
            if parent_type == "project":
                if parent_gid not in self.containers:
                    return ignored("another project")
                container = parent_gid
            else:
                container = self._default_container()
            if action == "deleted":
                kind = EventKind.TASK_DELETED
            elif action == "removed" and parent_type == "project":
                kind, name = EventKind.TASK_DELETED, name + ";transferred"
            else:
                kind = EventKind.TASK_UPSERTED
            return VerifiedEvent(kind=kind, action=name, external_task_id=gid, container_id=container, **common)
        if rtype == "story":
            # a story without a subtype may be a comment: the read-back (which lists comments only) decides
            if subtype is not None and subtype not in COMMENT_SUBTYPES:
                return ignored("not a comment")
            if parent_type != "task" or not parent_gid:
                return ignored("no task")
            author = common["actor"] or ExternalActor(PROVIDER, "", "Asana")
            placeholder = ExternalComment(external_comment_id=gid, external_task_id=parent_gid, author=author, body="",
                                          created_at=common["occurred_at"])
            container = self._default_container()
            if action in ("removed", "deleted"):
                return VerifiedEvent(kind=EventKind.COMMENT_DELETED, action=name, external_task_id=parent_gid,
                                     comment=placeholder, container_id=container, **common)
            # the delivery has no text: the engine reads the story back before anything is imported
            return VerifiedEvent(kind=EventKind.COMMENT_UPSERTED, action=name, external_task_id=parent_gid,
                                 comment=placeholder, container_id=container, sparse=True, **common)
        return ignored(f"{rtype or 'unknown'} resource")


def verify(request: WebhookRequest, *, secret: str | None, containers: tuple[str, ...],
           service_account_id: str | None) -> VerifiedEvent:
    if not secret:
        raise WebhookRejected("No webhook secret is stored for this Asana webhook (its handshake never completed).")
    headers = lower_headers(request.headers)
    signature = (headers.get("x-hook-signature") or "").strip()
    if not signature:
        raise WebhookRejected("Missing X-Hook-Signature header.")
    if not _HEX64.match(signature):
        raise WebhookRejected("Malformed X-Hook-Signature header (expected 64 hex digits).")
    body = request.body or b""
    if not signature_matches(secret, body, signature):
        raise WebhookRejected("X-Hook-Signature does not match the body.")
    # --- signature verified; only now parse -----------------------------------------------------
    payload = webhook_json(body, "Asana")
    entries = payload.get("events")
    if not isinstance(entries, list):
        raise WebhookUnparseable("Asana webhook body has no events list.")
    if not entries:
        return VerifiedEvent(event_id=webhook_event_id(None, body), kind=EventKind.IGNORED, action="heartbeat",
                             external_task_id=None)
    translator = Translator(containers, service_account_id, request.scope)
    events = [translator.event(entry) for entry in entries]
    seen: set[str] = set()
    unique = []
    for event in events:  # the very same entry twice in one POST is one event
        if event.event_id not in seen:
            seen.add(event.event_id)
            unique.append(event)
    first, *rest = unique
    return replace(first, carried=tuple(rest))
