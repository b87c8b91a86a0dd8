"""A small Notion-compatible REST server for tests and the offline demo (stdlib only, no Django).

It serves the ``/v1`` endpoints :mod:`connectors.providers.notion` uses, with Notion's shapes and rules:
``Authorization: Bearer <token>`` (else 401 ``unauthorized``) and a ``Notion-Version`` header (else 400
``missing_version``); list responses ``{"object": "list", "results", "next_cursor", "has_more"}`` with
``page_size`` <= 100 (else 400 ``validation_error``) and opaque ``start_cursor`` values (a bad one is a 400
``validation_error`` naming ``start_cursor``); errors ``{"object": "error", "status", "code", "message"}``;
``last_edited_time`` rounded down to the minute, as Notion does. Endpoints: ``GET /v1/users/me``,
``GET /v1/users/{id}``, ``GET /v1/databases/{id}``, ``POST /v1/databases/{id}/query`` (filter
``{"timestamp": "last_edited_time", "last_edited_time": {"on_or_after"|"after": ...}}``, sorts by
``last_edited_time``; a page id is a 400 "is a page, not a database"), ``POST /v1/search`` (pages),
``GET|PATCH /v1/pages/{id}``, ``POST /v1/pages``, ``GET|PATCH /v1/blocks/{id}/children``,
``GET|POST /v1/comments``.

Rate limit: a token bucket of ``rate`` requests per second (3, like Notion's average) with ``burst``
requests of headroom; an empty bucket answers 429 ``rate_limited`` with ``Retry-After`` (seconds).

Webhooks: every mutation emits a sparse Notion event (``page.created``, ``page.properties_updated``,
``page.content_updated``, ``page.deleted``, ``page.undeleted``, ``comment.created``...; ``entity`` +
``data.parent``) signed ``X-Notion-Signature: sha256=<hex HMAC-SHA256(verification token, body)>``,
recorded in ``sandbox.deliveries`` and POSTed to ``webhook_url`` when one is set. :meth:`send_verification`
POSTs the one-time ``{"verification_token": ...}`` (unsigned); :meth:`redeliver` re-sends an event with the
same ``id`` and ``attempt_number`` + 1. Notion's API has no endpoint that creates subscriptions, nor has this.

Use from Python::

    sb = NotionSandbox(token="secret_t", webhook_secret="secret_verification").start()
    db = sb.add_database("Tasks")                        # Status: Not started / In progress / In review / Done
    page = sb.add_page("Fix login", database=db["id"], status="Not started", content="It crashes.")
    sb.update_page(page["id"], status="In progress"); sb.add_comment(page["id"], "On it")
    sb.trash_page(page["id"]); sb.deliver_fixture("zulip_page_properties_updated")
    sb.fail_next(1, "rate_limit", retry_after=7)        # or "auth" (401), "error" (status=500)

Standalone: ``python -m connectors.sandbox.notion --port 8768 --token "$NOTION_SANDBOX_TOKEN" --seed 3``."""
from __future__ import annotations

import base64
import copy
import hmac
import json
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from connectors.sandbox.base import (
    DeliveryRecord,
    RequestRecord,
    SandboxServer,
    cli_parser,
    hmac_sha256_hex,
    mutation,
    serve_until_interrupted,
)
from connectors.sandbox.base import iso_ms as _iso
from connectors.sandbox.base import parse_ts as _parse_ts

DEFAULT_FIXTURES_DIR = str(Path(__file__).resolve().parent / "fixtures" / "notion")  # real payloads, unchanged
NOTION_VERSIONS = ("2022-06-28", "2025-09-03")
STATUS_OPTIONS = (("Not started", "default", "to_do"), ("In progress", "blue", "in_progress"),
                  ("In review", "purple", "in_progress"), ("Done", "green", "complete"))
CONTROL_METHODS = ("add_database", "add_page", "update_page", "set_content", "trash_page", "restore_page",
                   "add_comment", "add_user", "deliver_fixture", "send_verification", "fail_next", "flush",
                   "advance", "outage", "recover")


def sign(token: str, body: bytes) -> str:
    """Notion's ``X-Notion-Signature``: ``sha256=`` + hex HMAC-SHA256(verification token, raw body)."""
    return "sha256=" + hmac_sha256_hex(token, body)


def _minute(value: datetime) -> datetime:
    return value.replace(second=0, microsecond=0)


def _key(value) -> str:
    return str(value or "").replace("-", "").lower()


def _dashed(value: str) -> str:
    raw = _key(value)
    return f"{raw[:8]}-{raw[8:12]}-{raw[12:16]}-{raw[16:20]}-{raw[20:]}" if len(raw) == 32 else str(value)


def _text(content: str) -> list[dict]:
    return [{"type": "text", "text": {"content": content, "link": None}, "annotations": _annotations(),
             "plain_text": content, "href": None}] if content else []


def _annotations(**on) -> dict:
    base = {"bold": False, "italic": False, "strikethrough": False, "underline": False, "code": False,
            "color": "default"}
    base.update(on)
    return base


def _rendered(rich) -> list[dict]:
    """Rich text as Notion returns it: every object with ``plain_text``, ``href`` and full annotations."""
    out = []
    for seg in rich or ():
        if not isinstance(seg, dict):
            raise ValueError("rich text items must be objects")
        kind = seg.get("type") or "text"
        if kind == "text":
            text = seg.get("text") or {}
            content = str(text.get("content") or "")
            if len(content) > 2000:
                raise ValueError("body.rich_text[].text.content.length should be ≤ 2000")
            link = text.get("link") if isinstance(text.get("link"), dict) else None
            out.append({"type": "text", "text": {"content": content, "link": link},
                        "annotations": _annotations(**(seg.get("annotations") or {})), "plain_text": content,
                        "href": (link or {}).get("url")})
        else:
            out.append({**copy.deepcopy(seg), "annotations": _annotations(**(seg.get("annotations") or {}))})
    if len(out) > 100:
        raise ValueError("body.rich_text.length should be ≤ 100")
    return out


@dataclass
class Delivery(DeliveryRecord):
    """One webhook delivery; ``body`` the exact (signed) bytes."""

    type: str
    event_id: str
    headers: dict
    body: bytes

    def summary(self) -> dict:
        return {"type": self.type, "eventId": self.event_id, "url": self.url, "status": self.status,
                "error": self.error, "delivered": self.delivered}


class _ApiError(Exception):
    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class NotionSandbox(SandboxServer):
    """In-memory Notion workspace (see the module docstring).

    ``token``: the integration token the server accepts (``None`` disables auth); ``webhook_secret``: the
    subscription's verification token (deliveries are signed with it); ``workspace_id``: the workspace (as
    webhooks name it); ``rate``/``burst``: the rate limit; the data clock is deterministic (2026-01-01,
    ``tick`` seconds per mutation) unless ``real_clock``."""

    provider = "notion"
    server_version = "NotionSandbox/1.0"
    http_methods = ("GET", "POST", "PATCH", "DELETE")
    control_methods = CONTROL_METHODS
    failure_modes = ("rate_limit", "auth", "error")

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, token: str | None = "secret_notion_sandbox",
                 webhook_url: str | None = None, webhook_secret: str | None = None, delivery_mode: str = "sync",
                 real_clock: bool = False, tick: float = 1.0, fixtures_dir: str | None = None,
                 delivery_timeout: float = 10.0, workspace_id: str = "13950b26-c203-4f3b-b97d-93ec06319565",
                 workspace_name: str = "Sandbox Workspace", bot_name: str = "Paperclip",
                 default_actor: str = "Ada Lovelace", rate: float = 3.0, burst: float = 300.0):
        self._init_sandbox(host=host, port=port, token=token, delivery_mode=delivery_mode, real_clock=real_clock,
                           tick=tick, fixtures_dir=fixtures_dir, default_fixtures_dir=DEFAULT_FIXTURES_DIR,
                           delivery_timeout=delivery_timeout)
        self.webhook_url, self.webhook_secret = webhook_url, webhook_secret
        self.workspace_id, self.workspace_name = workspace_id, workspace_name
        self.subscription_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"notion-sandbox:{workspace_id}:subscription"))
        self.integration_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"notion-sandbox:{workspace_id}:integration"))
        self.rate, self.burst = float(rate), float(burst)
        self._bucket, self._bucket_at = float(burst), time.monotonic()
        self._bucket_lock = threading.Lock()
        self._users: dict[str, dict] = {}
        self._databases: dict[str, dict] = {}
        self._pages: dict[str, dict] = {}
        self._blocks: dict[str, dict] = {}
        self._comments: dict[str, dict] = {}
        self.bot = self.add_user(bot_name, bot=True)
        self.default_actor = self.add_user(default_actor)

    _format_ts = staticmethod(_iso)

    @staticmethod
    def _uuid() -> str:
        return str(uuid.uuid4())

    # --- directory ---------------------------------------------------------------------------------
    def add_user(self, name: str, *, bot: bool = False, email: str | None = None) -> dict:
        with self._lock:
            for user in self._users.values():
                if user["name"] == name:
                    return user
            user = {"object": "user", "id": self._uuid(), "name": name, "avatar_url": None,
                    "type": "bot" if bot else "person"}
            user["bot" if bot else "person"] = {"owner": {"type": "workspace", "workspace": True},
                                                "workspace_name": self.workspace_name} if bot else \
                {"email": email or f"{name.split(' ')[0].lower()}@example.com"}
            self._users[user["id"]] = user
            return user

    def _user(self, name_or_id: str | None) -> dict:
        if name_or_id is None:
            return self.default_actor
        if name_or_id in self._users:
            return self._users[name_or_id]
        return self.add_user(name_or_id)

    def add_database(self, title: str = "Tasks", *, status_property: str | None = "Status", kind: str = "status",
                     options=STATUS_OPTIONS, extra_properties: dict | None = None, parent_page: str | None = None,
                     database_id: str | None = None) -> dict:
        """A database with a title property ``Name``, a ``status`` (or ``select``) property (None: none),
        ``Tags`` (multi_select), ``Assignee`` (people), ``Due`` (date), ``Priority`` (select), ``Blocked by``
        (relation) and ``Description`` (rich_text)."""
        with self._lock:
            did = _dashed(database_id) if database_id else self._uuid()
            props = {"Name": {"id": "title", "name": "Name", "type": "title", "title": {}},
                     "Tags": {"id": "tg%3D", "name": "Tags", "type": "multi_select", "multi_select": {"options": []}},
                     "Assignee": {"id": "as%3A", "name": "Assignee", "type": "people", "people": {}},
                     "Due": {"id": "du%3B", "name": "Due", "type": "date", "date": {}},
                     "Priority": {"id": "pr%3C", "name": "Priority", "type": "select", "select": {"options": [
                         {"id": f"p{i}", "name": n, "color": "default"} for i, n in enumerate(("High", "Medium", "Low"))]}},
                     "Blocked by": {"id": "bl%3E", "name": "Blocked by", "type": "relation",
                                    "relation": {"database_id": did, "type": "single_property", "single_property": {}}},
                     "Description": {"id": "de%3F", "name": "Description", "type": "rich_text", "rich_text": {}}}
            if status_property:
                opts = [{"id": f"s{i}", "name": o[0], "color": o[1]} for i, o in enumerate(options)]
                body = {"options": opts}
                if kind == "status":
                    body["groups"] = [{"id": f"g{i}", "name": g, "color": "gray",
                                       "option_ids": [f"s{j}" for j, o in enumerate(options) if o[2] == g]}
                                      for i, g in enumerate(("to_do", "in_progress", "complete"))]
                props[status_property] = {"id": "st%40", "name": status_property, "type": kind, kind: body}
            props.update(copy.deepcopy(extra_properties or {}))
            now = self._stamp()
            db = {"object": "database", "id": did, "title": _text(title), "properties": props,
                  "parent": {"type": "page_id", "page_id": parent_page} if parent_page else
                  {"type": "workspace", "workspace": True},
                  "created_time": now, "last_edited_time": now, "archived": False, "in_trash": False}
            self._databases[did] = db
            return self._render_database(db)

    # --- rendering -----------------------------------------------------------------------------------
    def _render_database(self, db: dict) -> dict:
        out = {k: copy.deepcopy(v) for k, v in db.items() if k not in ("created_time", "last_edited_time")}
        out.update(created_time=_iso(_minute(db["created_time"])), last_edited_time=_iso(_minute(db["last_edited_time"])),
                   url=f"https://www.notion.so/{_key(db['id'])}", is_inline=False, description=[], icon=None, cover=None)
        return out

    def _page_url(self, page: dict) -> str:
        slug = "-".join(self._title(page).split())[:40] or "Untitled"
        return f"https://www.notion.so/{slug}-{_key(page['id'])}"

    def _title(self, page: dict) -> str:
        prop = next((v for v in page["properties"].values() if v.get("type") == "title"), None)
        return "".join(s.get("plain_text", "") for s in (prop or {}).get("title") or ())

    def render_page(self, page: dict) -> dict:
        return {"object": "page", "id": page["id"], "created_time": _iso(_minute(page["created_time"])),
                "last_edited_time": _iso(_minute(page["last_edited_time"])),
                "created_by": {"object": "user", "id": page["created_by"]},
                "last_edited_by": {"object": "user", "id": page["last_edited_by"]},
                "cover": None, "icon": None, "parent": copy.deepcopy(page["parent"]),
                "archived": page["in_trash"], "in_trash": page["in_trash"],
                "properties": copy.deepcopy(page["properties"]), "url": self._page_url(page), "public_url": None}

    def _render_block(self, block: dict) -> dict:
        out = copy.deepcopy(block)
        out.update(created_time=_iso(_minute(block["created_time"])), last_edited_time=_iso(_minute(block["last_edited_time"])))
        return out

    def page(self, page_id: str) -> dict:
        with self._lock:
            return self.render_page(self._pages[_dashed(page_id)])

    def content_of(self, page_id: str) -> list[dict]:
        with self._lock:
            return [self._render_block(self._blocks[b]) for b in self._pages[_dashed(page_id)]["children"]]

    def comments_of(self, page_id: str) -> list[dict]:
        with self._lock:
            return [self._render_comment(c) for c in self._comments.values() if c["page_id"] == _dashed(page_id)]

    def _render_comment(self, c: dict) -> dict:
        return {"object": "comment", "id": c["id"], "parent": {"type": "page_id", "page_id": c["page_id"]},
                "discussion_id": c["discussion_id"], "created_time": _iso(c["created_time"]),
                "last_edited_time": _iso(c["last_edited_time"]), "created_by": {"object": "user", "id": c["user"]},
                "rich_text": copy.deepcopy(c["rich_text"]), "display_name": {"type": "integration",
                                                                             "resolved_name": self._users[c["user"]]["name"]}}

    # --- property values ------------------------------------------------------------------------------
    def _schema_of(self, page: dict) -> dict:
        parent = page["parent"]
        if parent.get("type") == "database_id":
            return self._databases[parent["database_id"]]["properties"]
        return {"title": {"id": "title", "name": "title", "type": "title", "title": {}}}

    def _value(self, schema_prop: dict, given) -> dict:
        """A property value in Notion's page shape from a friendly value (str, list, dict) or an API value."""
        kind = schema_prop["type"]
        out = {"id": schema_prop["id"], "type": kind}
        if isinstance(given, dict) and kind in given:
            given = given[kind]
            api = True
        else:
            api = False
        if kind in ("title", "rich_text"):
            out[kind] = _rendered(given) if api else _text(str(given or ""))
        elif kind in ("status", "select"):
            name = (given or {}).get("name") if api else given
            if name is None:
                out[kind] = None
            else:
                options = schema_prop[kind]["options"]
                option = next((o for o in options if o["name"] == name), None)
                if option is None:
                    if kind == "status":
                        raise _ApiError(400, "validation_error", f"Invalid status option. Status option \"{name}\" "
                                                                 "does not exist.")
                    option = {"id": self._uuid()[:4], "name": name, "color": "default"}
                    options.append(option)  # a select gains the option, as Notion does
                out[kind] = dict(option)
        elif kind == "multi_select":
            names = [o.get("name") for o in given] if api else list(given or ())
            options = schema_prop[kind]["options"]
            values = []
            for name in names:
                option = next((o for o in options if o["name"] == name), None)
                if option is None:
                    option = {"id": self._uuid()[:4], "name": name, "color": "default"}
                    options.append(option)
                values.append(dict(option))
            out[kind] = values
        elif kind == "people":
            users = [u.get("id") for u in given] if api else [self._user(n)["id"] for n in given or ()]
            out[kind] = [{"object": "user", **{k: v for k, v in self._users[u].items() if k != "object"}}
                         for u in users if u in self._users]
        elif kind == "date":
            start = (given or {}).get("start") if api or isinstance(given, dict) else given
            out[kind] = {"start": start, "end": None, "time_zone": None} if start else None
        elif kind == "relation":
            ids = [r.get("id") for r in given] if api else list(given or ())
            out[kind] = [{"id": _dashed(i)} for i in ids]
            out["has_more"] = False
        elif kind == "url":
            out[kind] = given if given else None
        else:
            out[kind] = given
        return out

    def _set_props(self, page: dict, values: dict) -> list[str]:
        schema = self._schema_of(page)
        changed = []
        for name, given in values.items():
            prop = schema.get(name) or next((p for p in schema.values() if p["id"] == name), None)
            if prop is None:
                raise _ApiError(400, "validation_error", f"{name} is not a property that exists.")
            page["properties"][prop["name"]] = self._value(prop, given)
            changed.append(prop["id"])
        return changed

    def _friendly(self, page: dict, **values) -> dict:
        """Friendly keyword names (title, status, tags, assignee, due, priority, blocked_by, description)."""
        schema = self._schema_of(page)
        names = {"title": next(k for k, v in schema.items() if v["type"] == "title"), "tags": "Tags",
                 "assignee": "Assignee", "due": "Due", "priority": "Priority", "blocked_by": "Blocked by",
                 "description": "Description"}
        status = next((k for k, v in schema.items() if v["type"] in ("status",)), None) or \
            next((k for k, v in schema.items() if v["type"] == "select" and k != "Priority"), None)
        out = {}
        for key, value in values.items():
            if key == "status":
                if status is None:
                    raise KeyError("this database has no status property")
                out[status] = value
            elif key in names and names[key] in schema:
                out[names[key]] = [value] if key == "assignee" and isinstance(value, str) else value
            elif key in schema:
                out[key] = value
            else:
                raise KeyError(f"unknown property {key!r}")
        return out

    # --- webhooks --------------------------------------------------------------------------------------
    def _parent_ref(self, page: dict) -> dict:
        parent = page["parent"]
        kind = parent.get("type")
        if kind == "database_id":
            return {"id": parent["database_id"], "type": "database"}
        if kind == "page_id":
            return {"id": parent["page_id"], "type": "page"}
        return {"id": self.workspace_id, "type": "space"}

    def _emit(self, type_: str, entity: dict, data: dict, *, author: dict | None = None,
              raw: dict | None = None) -> Delivery | None:
        if self._muted:
            return None
        payload = raw if raw is not None else {
            "id": self._uuid(), "timestamp": _iso(self._clock), "workspace_id": self.workspace_id,
            "workspace_name": self.workspace_name, "subscription_id": self.subscription_id,
            "integration_id": self.integration_id, "type": type_,
            "authors": [{"id": (author or self.default_actor)["id"], "type": (author or self.default_actor)["type"]}],
            "accessible_by": [], "attempt_number": 1, "entity": entity, "data": data}
        return self._send_event(payload)

    def _send_event(self, payload: dict) -> Delivery:
        body = json.dumps(payload).encode("utf-8")
        headers = {"Content-Type": "application/json", "User-Agent": "notion-api"}
        if self.webhook_secret:
            headers["X-Notion-Signature"] = sign(self.webhook_secret, body)
        return self._record(Delivery(type=str(payload.get("type")), event_id=str(payload.get("id")), headers=headers,
                                     body=body, url=self.webhook_url))

    def deliver_fixture(self, name: str, overrides: dict | None = None) -> Delivery:
        """Send a real fixture payload unchanged (except ``overrides``, deep-merged), signed like any event."""
        payload = self._load_fixture(name, overrides)
        with self._lock:
            delivery = self._send_event(payload)
        self._after_mutation()
        return delivery

    def redeliver(self, delivery: Delivery) -> Delivery:
        """Notion's retry of an event: same ``id``, ``attempt_number`` + 1, signed again."""
        payload = json.loads(delivery.body)
        payload["attempt_number"] = int(payload.get("attempt_number") or 1) + 1
        with self._lock:
            again = self._send_event(payload)
        self._after_mutation()
        return again

    def send_verification(self, token: str | None = None) -> Delivery:
        """The one-time verification request a new subscription sends: ``{"verification_token": ...}``,
        unsigned. The token becomes this sandbox's signing secret."""
        with self._lock:
            self.webhook_secret = token or self.webhook_secret or f"secret_{uuid.uuid4().hex}"
            body = json.dumps({"verification_token": self.webhook_secret}).encode("utf-8")
            delivery = self._record(Delivery(type="verification", event_id="", body=body, url=self.webhook_url,
                                             headers={"Content-Type": "application/json", "User-Agent": "notion-api"}))
        self._after_mutation()
        return delivery

    # --- failure injection -------------------------------------------------------------------------------
    def fail_next(self, count: int = 1, mode: str = "rate_limit", *, retry_after: int | None = None,
                  status: int | None = None) -> None:
        """The next ``count`` API responses fail: ``rate_limit`` (429 ``rate_limited`` + ``Retry-After`` when
        given), ``auth`` (401 ``unauthorized``), ``error`` (``status``, default 500 ``internal_server_error``)."""
        self._queue_failure(count, mode, retry_after=retry_after, status=status)

    def _take_token(self) -> float | None:
        """None when the request may go, else the seconds until the bucket holds a token again."""
        with self._bucket_lock:
            now = time.monotonic()
            self._bucket = min(self.burst, self._bucket + (now - self._bucket_at) * self.rate)
            self._bucket_at = now
            if self._bucket >= 1:
                self._bucket -= 1
                return None
            return (1 - self._bucket) / self.rate if self.rate > 0 else 60.0

    # --- mutations (control methods; the API uses the same code) ----------------------------------------
    def _touch(self, page: dict, user: dict) -> None:
        page["last_edited_time"], page["last_edited_by"] = self._stamp(), user["id"]

    def _new_block(self, kind: str, text: str, parent_id: str, user: dict, **extra) -> dict:
        now = self._stamp()
        block = {"object": "block", "id": self._uuid(), "parent": {"type": "page_id", "page_id": parent_id},
                 "created_time": now, "last_edited_time": now, "created_by": {"object": "user", "id": user["id"]},
                 "last_edited_by": {"object": "user", "id": user["id"]}, "has_children": False, "archived": False,
                 "in_trash": False, "type": kind, kind: {"rich_text": _text(text), "color": "default", **extra}}
        self._blocks[block["id"]] = block
        return block

    def _create_page(self, parent: dict, props: dict, user: dict, *, children=(), page_id: str | None = None,
                     friendly: dict | None = None, content: str | None = None) -> dict:
        now = self._stamp()
        page = {"id": _dashed(page_id) if page_id else self._uuid(), "parent": parent, "properties": {},
                "created_time": now, "last_edited_time": now, "created_by": user["id"], "last_edited_by": user["id"],
                "in_trash": False, "children": []}
        schema = self._schema_of(page)
        for name, prop in schema.items():  # every property has a (possibly empty) value, as in Notion
            page["properties"][name] = self._value(prop, [] if prop["type"] in ("multi_select", "people", "relation")
                                                   else None)
        for name, prop in schema.items():  # a new page's status is the property's first option, as in Notion
            if prop["type"] == "status" and prop["status"]["options"]:
                page["properties"][name]["status"] = dict(prop["status"]["options"][0])
        self._set_props(page, props)
        if friendly:
            self._set_props(page, self._friendly(page, **friendly))
        for child in children or ():
            page["children"].append(self._append_block(child, page["id"], user)["id"])
        for paragraph in [p for p in (content or "").split("\n\n") if p.strip()]:
            page["children"].append(self._new_block("paragraph", paragraph, page["id"], user)["id"])
        self._pages[page["id"]] = page
        if parent.get("type") == "page_id" and parent["page_id"] in self._pages:
            host = self._pages[parent["page_id"]]
            block = {"object": "block", "id": page["id"], "parent": {"type": "page_id", "page_id": parent["page_id"]},
                     "created_time": now, "last_edited_time": now, "has_children": True, "archived": False,
                     "in_trash": False, "type": "child_page", "child_page": {"title": self._title(page)}}
            self._blocks[page["id"]] = block
            host["children"].append(page["id"])
        self._emit("page.created", {"id": page["id"], "type": "page"}, {"parent": self._parent_ref(page)}, author=user)
        return page

    def _sync_child_block(self, page: dict) -> None:
        block = self._blocks.get(page["id"])
        if block is not None and block.get("type") == "child_page":
            block.update(last_edited_time=page["last_edited_time"], in_trash=page["in_trash"],
                         archived=page["in_trash"], child_page={"title": self._title(page)})

    def _append_block(self, child: dict, parent_id: str, user: dict) -> dict:
        kind = child.get("type")
        if not kind or not isinstance(child.get(kind), dict):
            raise _ApiError(400, "validation_error", "body.children[].type should be defined")
        block = self._new_block(kind, "", parent_id, user)
        block[kind] = {**copy.deepcopy(child[kind]), "rich_text": _rendered(child[kind].get("rich_text")),
                       "color": "default"}
        return block

    def _update_page(self, page: dict, user: dict, props: dict) -> dict:
        changed = self._set_props(page, props)
        self._touch(page, user)
        self._sync_child_block(page)
        self._emit("page.properties_updated", {"id": page["id"], "type": "page"},
                   {"parent": self._parent_ref(page), "updated_properties": changed}, author=user)
        return page

    def _set_trash(self, page: dict, user: dict, trashed: bool) -> None:
        if page["in_trash"] == trashed:
            return
        page["in_trash"] = trashed
        self._touch(page, user)
        self._sync_child_block(page)
        self._emit("page.deleted" if trashed else "page.undeleted", {"id": page["id"], "type": "page"},
                   {"parent": self._parent_ref(page)}, author=user)

    def _add_comment(self, page: dict, rich_text: list, user: dict, discussion_id: str | None = None) -> dict:
        now = self._stamp()
        c = {"id": self._uuid(), "page_id": page["id"], "discussion_id": discussion_id or self._uuid(),
             "created_time": now, "last_edited_time": now, "user": user["id"], "rich_text": rich_text}
        self._comments[c["id"]] = c
        self._emit("comment.created", {"id": c["id"], "type": "comment"},
                   {"page_id": page["id"], "parent": {"id": page["id"], "type": "page"}}, author=user)
        return c

    def _get_page(self, page_id: str) -> dict:
        page = self._pages.get(_dashed(page_id))
        if page is None:
            raise _ApiError(404, "object_not_found", f"Could not find page with ID: {page_id}. Make sure the relevant "
                                                     "pages and databases are shared with your integration.")
        return page

    @mutation
    def add_page(self, title: str = "Untitled", *, database: str | None = None, parent_page: str | None = None,
                 workspace: bool = False, page_id: str | None = None, content: str | None = None,
                 actor: str | None = None, **values) -> dict:
        """A person creates a page in ``database`` (or under ``parent_page``, or at the workspace top level)
        with ``content`` (paragraphs split on blank lines) and friendly property values (``status``, ``tags``,
        ``assignee``, ``due``, ``priority``, ``description``, ``blocked_by``)."""
        if database:
            parent = {"type": "database_id", "database_id": _dashed(database)}
        elif parent_page:
            parent = {"type": "page_id", "page_id": _dashed(parent_page)}
        elif workspace or not self._databases:
            parent = {"type": "workspace", "workspace": True}
        else:
            parent = {"type": "database_id", "database_id": next(iter(self._databases))}
        probe = {"parent": parent, "properties": {}}
        title_name = next(k for k, v in self._schema_of(probe).items() if v["type"] == "title")
        page = self._create_page(parent, {title_name: title}, self._user(actor), page_id=page_id,
                                 friendly=values or None, content=content)
        return self.render_page(page)

    @mutation
    def update_page(self, page_id: str, *, actor: str | None = None, **values) -> dict:
        """A person edits properties (friendly names as in :meth:`add_page`): one ``page.properties_updated``."""
        page = self._get_page(page_id)
        return self.render_page(self._update_page(page, self._user(actor), self._friendly(page, **values)))

    @mutation
    def set_content(self, page_id: str, content: str, *, actor: str | None = None) -> dict:
        """A person rewrites the page body (paragraphs): one ``page.content_updated``."""
        page, user = self._get_page(page_id), self._user(actor)
        page["children"] = [b for b in page["children"] if self._blocks[b]["type"] == "child_page"]
        blocks = [self._new_block("paragraph", p, page["id"], user) for p in content.split("\n\n") if p.strip()]
        page["children"] += [b["id"] for b in blocks]
        self._touch(page, user)
        self._emit("page.content_updated", {"id": page["id"], "type": "page"},
                   {"parent": self._parent_ref(page), "updated_blocks": [{"id": b["id"], "type": "block"} for b in blocks]},
                   author=user)
        return self.render_page(page)

    @mutation
    def trash_page(self, page_id: str, *, actor: str | None = None) -> dict:
        page = self._get_page(page_id)
        self._set_trash(page, self._user(actor), True)
        return self.render_page(page)

    @mutation
    def restore_page(self, page_id: str, *, actor: str | None = None) -> dict:
        page = self._get_page(page_id)
        self._set_trash(page, self._user(actor), False)
        return self.render_page(page)

    @mutation
    def add_comment(self, page_id: str, body: str, *, actor: str | None = None) -> dict:
        return self._render_comment(self._add_comment(self._get_page(page_id), _text(body), self._user(actor)))

    # --- HTTP ----------------------------------------------------------------------------------------------
    def _authorized(self, headers: dict) -> dict | None:
        if self.token is None:
            return self.bot
        value = headers.get("authorization", "").strip()
        if value.lower().startswith("bearer ") and hmac.compare_digest(value[7:].strip(), self.token):
            return self.bot
        return None

    @staticmethod
    def _error(status: int, code: str, message: str) -> dict:
        return {"object": "error", "status": status, "code": code, "message": message,
                "request_id": str(uuid.uuid4())}

    def _error_body(self, message: str):
        return self._error(400, "validation_error", message)

    @staticmethod
    def _finish(record, status, payload, headers=None):
        record.status = status
        body = json.dumps(payload).encode("utf-8")
        return status, {"Content-Type": "application/json; charset=utf-8", **(headers or {})}, body

    def handle(self, method: str, raw_path: str, headers: dict, raw_body: bytes):
        parts, path, query, body, parsed = self._parse_request(raw_path, raw_body)
        api_path = path[len("/v1"):] if path.startswith("/v1/") else path
        record = RequestRecord(method, api_path, query, headers, body)
        self._log_request(record)
        user = self._authorized(headers)
        if path.startswith("/_sandbox/"):
            if user is None:
                return self._finish(record, 401, self._error(401, "unauthorized", "API token is invalid."))
            return self._control(record, method, path, body)
        failure = self._take_failure()
        if failure:
            return self._failure(record, failure)
        wait = self._take_token()
        if wait is not None:
            return self._finish(record, 429, self._error(429, "rate_limited", "You have been rate limited. Please try "
                                                                              "again in a few minutes."),
                                {"Retry-After": str(max(1, int(wait + 0.999)))})
        if user is None:
            return self._finish(record, 401, self._error(401, "unauthorized", "API token is invalid."))
        if not headers.get("notion-version"):
            return self._finish(record, 400, self._error(400, "missing_version", "Notion-Version header failed "
                                                                                  "validation: Notion-Version header should be defined."))
        if headers.get("notion-version") not in NOTION_VERSIONS:
            return self._finish(record, 400, self._error(400, "validation_error", "Notion-Version header is invalid."))
        if not parsed:
            return self._finish(record, 400, self._error(400, "invalid_json", "Error parsing JSON body."))
        try:
            with self._lock:
                status, payload = self._route(method, api_path, {k: v[-1] for k, v in query.items()}, body or {}, user)
        except _ApiError as exc:
            return self._finish(record, exc.status, self._error(exc.status, exc.code, exc.message))
        except (ValueError, TypeError, KeyError) as exc:
            return self._finish(record, 400, self._error(400, "validation_error", str(exc)))
        self._after_mutation()
        return self._finish(record, status, payload)

    def _failure(self, record, failure):
        mode, retry = failure["mode"], failure["retry_after"]
        if mode == "rate_limit":
            extra = {"Retry-After": str(retry)} if retry is not None else {}
            return self._finish(record, failure["status"] or 429, self._error(429, "rate_limited", "You have been rate "
                                                                              "limited."), extra)
        if mode == "auth":
            return self._finish(record, failure["status"] or 401, self._error(401, "unauthorized", "API token is invalid."))
        status = failure["status"] or 500
        return self._finish(record, status, self._error(status, "internal_server_error" if status == 500 else
                                                        "service_unavailable", "Unexpected error."))

    def _route(self, method: str, path: str, query: dict, body: dict, user: dict):
        seg = [s for s in path.split("/") if s]
        if method == "GET" and seg == ["users", "me"]:
            return 200, copy.deepcopy(self.bot)
        if method == "GET" and len(seg) == 2 and seg[0] == "users":
            found = self._users.get(_dashed(seg[1]))
            if found is None:
                raise _ApiError(404, "object_not_found", f"Could not find user with ID: {seg[1]}.")
            return 200, copy.deepcopy(found)
        if len(seg) >= 2 and seg[0] == "databases":
            did = _dashed(seg[1])
            if did not in self._databases:
                if did in self._pages:
                    raise _ApiError(400, "validation_error", f"Provided ID {seg[1]} is a page, not a database. Use "
                                                             "the retrieve page API instead, or pass a database ID.")
                raise _ApiError(404, "object_not_found", f"Could not find database with ID: {seg[1]}.")
            if method == "GET" and len(seg) == 2:
                return 200, self._render_database(self._databases[did])
            if method == "POST" and seg[2:] == ["query"]:
                return 200, self._query(did, body)
        if method == "POST" and seg == ["search"]:
            return 200, self._search(body)
        if seg and seg[0] == "pages":
            if method == "POST" and len(seg) == 1:
                return 200, self.render_page(self._api_create_page(body, user))
            if len(seg) == 2:
                page = self._get_page(seg[1])
                if method == "GET":
                    return 200, self.render_page(page)
                if method == "PATCH":
                    return 200, self.render_page(self._api_update_page(page, body, user))
        if len(seg) == 3 and seg[0] == "blocks" and seg[2] == "children":
            return 200, self._children(seg[1], method, query, body, user)
        if seg == ["comments"]:
            if method == "GET":
                page = self._get_page(query.get("block_id") or "")
                rows = sorted((c for c in self._comments.values() if c["page_id"] == page["id"]),
                              key=lambda c: (c["created_time"], c["id"]))
                return 200, self._paged([self._render_comment(c) for c in rows], query, "comment")
            if method == "POST":
                page = self._get_page(((body.get("parent") or {}).get("page_id")) or "")
                rich = _rendered(body.get("rich_text"))
                if not rich:
                    raise _ApiError(400, "validation_error", "body.rich_text should be defined")
                return 200, self._render_comment(self._add_comment(page, rich, user, body.get("discussion_id")))
        raise _ApiError(400, "invalid_request_url", "Invalid request URL.")

    def _api_create_page(self, body: dict, user: dict) -> dict:
        parent = body.get("parent") or {}
        if parent.get("database_id"):
            did = _dashed(parent["database_id"])
            if did not in self._databases:
                raise _ApiError(404, "object_not_found", f"Could not find database with ID: {parent['database_id']}.")
            ref = {"type": "database_id", "database_id": did}
        elif parent.get("page_id"):
            ref = {"type": "page_id", "page_id": self._get_page(parent["page_id"])["id"]}
        else:
            raise _ApiError(400, "validation_error", "body.parent.page_id or body.parent.database_id should be defined")
        children = body.get("children") or []
        if len(children) > 100:
            raise _ApiError(400, "validation_error", "body.children.length should be ≤ 100")
        return self._create_page(ref, dict(body.get("properties") or {}), user, children=children)

    def _api_update_page(self, page: dict, body: dict, user: dict) -> dict:
        trashed = body.get("in_trash", body.get("archived"))
        if body.get("properties"):
            self._update_page(page, user, dict(body["properties"]))
        if trashed is not None:
            self._set_trash(page, user, bool(trashed))
        return page

    def _children(self, block_id: str, method: str, query: dict, body: dict, user: dict) -> dict:
        page = self._pages.get(_dashed(block_id))
        if page is None:
            raise _ApiError(404, "object_not_found", f"Could not find block with ID: {block_id}.")
        if method == "PATCH":
            blocks = [self._append_block(c, page["id"], user) for c in body.get("children") or []]
            page["children"] += [b["id"] for b in blocks]
            self._touch(page, user)
            self._emit("page.content_updated", {"id": page["id"], "type": "page"},
                       {"parent": self._parent_ref(page), "updated_blocks": [{"id": b["id"], "type": "block"}
                                                                            for b in blocks]}, author=user)
            return {"object": "list", "results": [self._render_block(b) for b in blocks], "next_cursor": None,
                    "has_more": False, "type": "block", "block": {}}
        rows = [self._render_block(self._blocks[b]) for b in page["children"]
                if not self._blocks[b].get("in_trash")]
        return self._paged(rows, query, "block")

    # --- listing ---------------------------------------------------------------------------------------
    @staticmethod
    def _size(value) -> int:
        size = 100 if value in (None, "") else value
        try:
            size = int(size)
        except (TypeError, ValueError):
            raise _ApiError(400, "validation_error", "page_size should be a number") from None
        if size < 1 or size > 100:
            raise _ApiError(400, "validation_error", "body.page_size should be ≤ 100 and ≥ 1")
        return size

    @staticmethod
    def _position(cursor) -> int:
        if cursor in (None, ""):
            return 0
        try:
            return int(json.loads(base64.urlsafe_b64decode(str(cursor).encode()))["i"])
        except (ValueError, TypeError, KeyError):
            raise _ApiError(400, "validation_error", "body failed validation: body.start_cursor should be a valid "
                                                     "cursor.") from None

    def _paged(self, rows: list, params: dict, kind: str, key=None) -> dict:
        """Offset pagination over ``rows``; with ``key`` (a sort key function) the cursor is a keyset one, so
        rows that move during a pass (a page edited meanwhile) are neither repeated nor skipped."""
        size = self._size(params.get("page_size"))
        cursor = params.get("start_cursor")
        if key is not None:
            if cursor:
                try:
                    mark = json.loads(base64.urlsafe_b64decode(str(cursor).encode()))["k"]
                except (ValueError, TypeError, KeyError):
                    raise _ApiError(400, "validation_error", "body failed validation: body.start_cursor should be "
                                                             "a valid cursor.") from None
                rows = [r for r in rows if list(key(r)) > mark]
            page, more = rows[:size], len(rows) > size
            nxt = base64.urlsafe_b64encode(json.dumps({"k": list(key(page[-1]))}).encode()).decode() if more else None
        else:
            start = self._position(cursor)
            page, more = rows[start:start + size], len(rows) > start + size
            nxt = base64.urlsafe_b64encode(json.dumps({"i": start + size}).encode()).decode() if more else None
        return {"object": "list", "results": page, "next_cursor": nxt, "has_more": more, "type": kind, kind: {}}

    def _time_filter(self, flt):
        if not flt:
            return lambda page: True
        if flt.get("timestamp") != "last_edited_time" or not isinstance(flt.get("last_edited_time"), dict):
            raise _ApiError(400, "validation_error", "The sandbox supports the last_edited_time timestamp filter only.")
        checks = []
        for op, raw in flt["last_edited_time"].items():
            try:
                bound = _parse_ts(raw)
            except (TypeError, ValueError, AttributeError):
                raise _ApiError(400, "validation_error", f"body.filter.last_edited_time.{op} should be a date") from None
            compare = {"on_or_after": lambda a, b: a >= b, "after": lambda a, b: a > b,
                       "before": lambda a, b: a < b, "on_or_before": lambda a, b: a <= b}.get(op)
            if compare is None:
                raise _ApiError(400, "validation_error", f"unsupported last_edited_time filter {op}")
            checks.append(lambda page, c=compare, b=bound: c(_minute(page["last_edited_time"]), b))
        return lambda page: all(check(page) for check in checks)

    def _sort_key(self, sorts):
        direction = "ascending"
        for sort in sorts or ():
            if sort.get("timestamp") != "last_edited_time":
                raise _ApiError(400, "validation_error", "The sandbox sorts by last_edited_time only.")
            direction = sort.get("direction", "ascending")
        if direction != "ascending":
            raise _ApiError(400, "validation_error", "The sandbox sorts ascending only.")
        return lambda rendered: (rendered["last_edited_time"], rendered["id"])

    def _query(self, did: str, body: dict) -> dict:
        ok = self._time_filter(body.get("filter"))
        key = self._sort_key(body.get("sorts"))
        rows = [self.render_page(p) for p in self._pages.values()
                if p["parent"].get("database_id") == did and not p["in_trash"] and ok(p)]
        return self._paged(sorted(rows, key=key), body, "page_or_database", key=key)

    def _search(self, body: dict) -> dict:
        flt = body.get("filter") or {}
        if flt and flt != {"property": "object", "value": "page"}:
            raise _ApiError(400, "validation_error", "The sandbox searches pages only.")
        key = self._sort_key([body["sort"]] if body.get("sort") else None)
        rows = [self.render_page(p) for p in self._pages.values() if not p["in_trash"]]
        return self._paged(sorted(rows, key=key), body, "page_or_database", key=key)

    # --- the demo ----------------------------------------------------------------------------------------
    def demo_instance_fields(self) -> dict:
        """``instance_create`` keyword arguments for ``manage.py demo_sandbox --provider notion``."""
        with self._lock:
            if not self._databases:
                self.add_database("Paperclip demo")
            database = next(iter(self._databases))
        return {"containers": [database], "service_account_id": self.bot["id"], "base_url": self.base_url,
                "state_mapping": {"property": "Status", "values": {"Not started": "backlog", "In progress": "active",
                                                                   "In review": "review", "Done": "terminal"}},
                "config": {"workspaceId": self.workspace_id}}

    def demo_open_task(self, title: str, body: str) -> str:
        """A person opens a page in the first database (its ``page.created`` is recorded/sent)."""
        database = self.demo_instance_fields()["containers"][0]
        return self.add_page(title, database=database, status="Not started", content=body)["id"]


def main(argv=None) -> int:
    parser = cli_parser("notion", "Run the Notion-compatible REST sandbox (offline demo).", 8768,
                        "integration token the server accepts (env NOTION_SANDBOX_TOKEN); omit to disable auth",
                        "create N demo pages at start (no webhooks)")
    args = parser.parse_args(argv)
    sandbox = NotionSandbox(host=args.host, port=args.port, token=args.token, webhook_url=args.webhook_url,
                            webhook_secret=args.webhook_secret, delivery_mode="queued" if args.queued else "sync",
                            real_clock=True)
    db = sandbox.add_database("Tasks")
    with sandbox.quiet():
        for n in range(args.seed):
            sandbox.add_page(f"Demo page {n + 1}", database=db["id"], status="Not started",
                             content=f"Seeded ({n + 1}/{args.seed}).")
    return serve_until_interrupted(sandbox, lambda sb: (
        f"Notion sandbox on {sb.base_url}/v1; database {db['id']}; auth {'on' if args.token else 'off'}; "
        f"webhook {'-> ' + args.webhook_url if args.webhook_url else 'none'}"))


if __name__ == "__main__":
    sys.exit(main())
