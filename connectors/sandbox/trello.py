"""A small Trello-compatible REST server for tests and the offline demo (stdlib only, no Django).

It speaks the ``/1`` shapes :mod:`connectors.providers.trello` uses, holds everything in memory, and sends
Trello-shaped webhook deliveries (``{"model": <board>, "action": {...}}``) for every change, signed like
Trello: ``X-Trello-Webhook: base64(HMAC-SHA1(app secret, body + callbackURL))``.

Routes (under ``/1``): ``GET /members/me``; ``GET /boards/{id}`` ; ``GET /boards/{id}/lists``
(``filter``); ``GET /boards/{id}/cards[/{filter}]`` (``filter`` all|open|closed|visible, ``fields``,
``members``); ``GET|PUT|DELETE /cards/{id or shortLink}``; ``POST /cards``; ``GET /cards/{id}/actions``
(``filter``, ``limit`` <= 1000, ``before``/``since`` = action id or date, newest first);
``POST /cards/{id}/actions/comments``; ``PUT|DELETE /cards/{id}/actions/{action}/comments``;
``GET|POST /cards/{id}/attachments``; ``GET /batch?urls=`` (<= 10 GET urls, answers ``[{"200": ...}]``);
``POST /webhooks`` (sends ``HEAD`` to ``callbackURL`` and refuses with 400 unless it answers 200; a second
webhook for the same token, model and callback is a 400 "already exists"); ``GET|PUT|DELETE /webhooks/{id}``;
``GET /tokens/{token}/webhooks``. Parameters come as query string or JSON body, like Trello accepts.

Auth: ``Authorization: OAuth oauth_consumer_key="<key>", oauth_token="<token>"`` or ``key``/``token`` query
parameters (``token=None`` disables auth); 401 ``invalid token`` (plain text, like Trello's errors).
Rate limits: ``rate_limit`` requests per ``rate_window`` seconds per token (and ``key_rate_limit`` per key)
-> 429 ``{"error": "API_TOKEN_LIMIT_EXCEEDED", "message": "Rate limit exceeded"}`` without ``Retry-After``,
with the ``x-rate-limit-api-token-*`` headers Trello sends. Failure injection ``fail_next(count, mode)``:
``rate_limit`` (that 429), ``key_limit`` (API_KEY_LIMIT_EXCEEDED), ``auth`` (401), ``error`` (``status``,
default 500).

Webhook targets: every webhook registered through ``POST /webhooks`` on a board (deliveries sent to its
``callbackURL`` and signed with it), plus the constructor's ``webhook_url`` (sent there) or
``callback_url`` (recorded only, signed as if sent there: tests post them through a test client).

Use from Python::

    sb = TrelloSandbox(key="k", token="t", webhook_secret="app-secret").start()
    sb.base_url; sb.credentials                      # "k:t"
    sb.callback_url = "http://testserver/api/connectors/<id>/webhook"
    card = sb.create_card("Fix login", list="To Do"); sb.move_card(card["id"], "Doing")
    sb.add_comment(card["id"], "On it"); sb.archive_card(card["id"])
    sb.deliver_fixture("zulip_changing_cards_list")  # a real payload, unchanged, signed

Standalone: ``python -m connectors.sandbox.trello --port 8769 --key K --token T --webhook-url ...
--webhook-secret S --seed 3``."""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from connectors.sandbox.base import (  # noqa: F401  (START_TIME, RequestRecord: public names of this module)
    START_TIME,
    DeliveryRecord,
    RequestRecord,
    SandboxServer,
    cli_parser,
    iso_ms,
    mutation,
    parse_ts,
    serve_until_interrupted,
)

DEFAULT_FIXTURES_DIR = str(Path(__file__).resolve().parent / "fixtures" / "trello")  # real payloads, unchanged
DEFAULT_LISTS = ("To Do", "Doing", "Paperclip: QA", "Done")
CONTROL_METHODS = ("add_board", "add_list", "add_member", "create_card", "update_card", "move_card", "archive_card",
                   "unarchive_card", "delete_card", "move_card_to_board", "add_label", "add_comment", "edit_comment",
                   "delete_comment", "deliver_fixture", "fail_next", "flush", "advance", "outage", "recover")
_OAUTH_RE = re.compile(r'(\w+)="([^"]*)"')


def sign(secret: str, body: bytes, callback_url: str) -> str:
    """Trello's ``X-Trello-Webhook``: base64(HMAC-SHA1(app secret, body + callbackURL))."""
    return base64.b64encode(hmac.new(secret.encode("utf-8"), body + callback_url.encode("utf-8"),
                                     hashlib.sha1).digest()).decode("ascii")


@dataclass
class Delivery(DeliveryRecord):
    action_id: str
    action_type: str
    callback_url: str
    headers: dict
    body: bytes

    def summary(self) -> dict:
        return {"actionId": self.action_id, "type": self.action_type, "callbackURL": self.callback_url,
                "url": self.url, "status": self.status, "error": self.error, "delivered": self.delivered}


class _TrelloError(Exception):
    def __init__(self, status: int, text: str, payload: dict | None = None):
        super().__init__(text)
        self.status, self.text, self.payload = status, text, payload


def _head(url: str, timeout: float) -> int | None:
    req = urllib.request.Request(url, method="HEAD", headers={"User-Agent": "Trello"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None


class TrelloSandbox(SandboxServer):
    """In-memory Trello. ``boards``: ``{name: (list names...)}`` created at start (``board_id`` is the first
    board's id); ``key``/``token``: the credentials accepted (``token=None``: no auth); ``service_username``:
    the token's member (the connector's service account); ``default_actor``: the human behind control-method
    changes; ``webhook_secret``: the app secret deliveries are signed with; deterministic clock (``tick`` s
    per change) unless ``real_clock``."""

    provider = "trello"
    server_version = "TrelloSandbox/1.0"
    http_methods = ("GET", "POST", "PUT", "DELETE", "HEAD")
    control_methods = CONTROL_METHODS
    failure_modes = ("rate_limit", "key_limit", "auth", "error")

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, boards=None, key: str = "trello-sandbox-key",
                 token: str | None = "trello-sandbox-token", service_username: str = "paperclipbot",
                 default_actor: str = "Grace Hopper", webhook_url: str | None = None, callback_url: str | None = None,
                 webhook_secret: str | None = None, delivery_mode: str = "sync", real_clock: bool = False,
                 tick: float = 1.0, fixtures_dir: str | None = None, delivery_timeout: float = 10.0,
                 rate_limit: int | None = None, key_rate_limit: int | None = None, rate_window: float = 10.0):
        self._init_sandbox(host=host, port=port, token=token, delivery_mode=delivery_mode, real_clock=real_clock,
                           tick=tick, fixtures_dir=fixtures_dir, default_fixtures_dir=DEFAULT_FIXTURES_DIR,
                           delivery_timeout=delivery_timeout)
        self.key = key
        self.webhook_url, self.callback_url, self.webhook_secret = webhook_url, callback_url, webhook_secret
        self.rate_limit, self.key_rate_limit, self.rate_window = rate_limit, key_rate_limit, rate_window
        self._hits: dict[str, list[float]] = {}
        self._counter = 0
        self._members: dict[str, dict] = {}
        self._boards: dict[str, dict] = {}
        self._lists: dict[str, dict] = {}
        self._cards: dict[str, dict] = {}
        self._actions: dict[str, dict] = {}  # comment actions by id (their text is edited in place)
        self._attachments: dict[str, dict] = {}
        self._webhooks: dict[str, dict] = {}
        self.service_member = self.add_member(service_username, full_name="Paperclip Bot")
        self.default_actor = self.add_member(default_actor.split(" ")[0].lower(), full_name=default_actor)
        for name, lists in (boards or {"Sandbox Board": DEFAULT_LISTS}).items():
            self.add_board(name, lists)

    @property
    def credentials(self) -> str:
        return f"{self.key}:{self.token}"

    @property
    def board_id(self) -> str:
        return next(iter(self._boards))

    # --- ids, clock, directory -------------------------------------------------------------------
    _format_ts = staticmethod(iso_ms)

    def _new_id(self) -> str:
        """A Mongo-style id like Trello's: the creation time (8 hex) then a counter."""
        self._counter += 1
        return f"{int(self._clock.timestamp()):08x}" + f"{self._counter:016x}"

    def _short_link(self, seed: str) -> str:
        alphabet = "abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789"
        digest = hashlib.sha1(seed.encode()).digest()
        return "".join(alphabet[b % len(alphabet)] for b in digest[:8])

    def add_member(self, username: str, *, full_name: str | None = None, member_id: str | None = None) -> dict:
        with self._lock:
            for member in self._members.values():
                if member["username"] == username:
                    return member
            member = {"id": member_id or self._new_id(), "username": username, "fullName": full_name or username,
                      "initials": "".join(p[0] for p in (full_name or username).split())[:3].upper(), "avatarHash": None}
            self._members[member["id"]] = member
            return member

    def add_board(self, name: str, lists=DEFAULT_LISTS, *, board_id: str | None = None,
                  list_ids: dict | None = None) -> dict:
        """A board with open lists (``list_ids``: {list name: id} to pin ids, e.g. a fixture's)."""
        with self._lock:
            bid = board_id or self._new_id()
            board = {"id": bid, "name": name, "shortLink": self._short_link(bid), "closed": False, "desc": ""}
            self._boards[bid] = board
            for pos, list_name in enumerate(lists):
                self.add_list(bid, list_name, list_id=(list_ids or {}).get(list_name), pos=(pos + 1) * 16384)
            return dict(board)

    def add_list(self, board: str, name: str, *, list_id: str | None = None, pos: float | None = None,
                 closed: bool = False) -> dict:
        with self._lock:
            bid = self._board(board)["id"]
            existing = [lst for lst in self._lists.values() if lst["idBoard"] == bid]
            lst = {"id": list_id or self._new_id(), "name": name, "closed": closed, "idBoard": bid,
                   "pos": pos if pos is not None else (len(existing) + 1) * 16384}
            self._lists[lst["id"]] = lst
            return dict(lst)

    def _board(self, ref: str | None) -> dict:
        if ref is None:
            return next(iter(self._boards.values()))
        board = self._boards.get(ref) or next((b for b in self._boards.values()
                                               if ref in (b["shortLink"], b["name"])), None)
        if board is None:
            raise _TrelloError(404, "The requested resource was not found.")
        return board

    def _list(self, ref: str | None, board_id: str | None = None) -> dict:
        lists = [lst for lst in self._lists.values() if board_id is None or lst["idBoard"] == board_id]
        if ref is None:
            return sorted(lists, key=lambda r: r["pos"])[0]
        found = self._lists.get(ref) or next((lst for lst in lists if lst["name"] == ref), None)
        if found is None:
            raise _TrelloError(400, "invalid value for idList")
        return found

    def _member(self, ref: str | None) -> dict:
        if ref is None:
            return self.default_actor
        return self._members.get(ref) or self.add_member(ref.split(" ")[0].lower(), full_name=ref)

    def _card(self, ref: str) -> dict:
        card = self._cards.get(ref) or next((c for c in self._cards.values() if c["shortLink"] == ref), None)
        if card is None or card["deleted"]:
            raise _TrelloError(404, "The requested resource was not found.")
        return card

    # --- rendering ---------------------------------------------------------------------------------
    def render_card(self, card: dict, fields=None, *, members: bool = False) -> dict:
        out = {"id": card["id"], "idShort": card["idShort"], "shortLink": card["shortLink"],
               "shortUrl": f"https://trello.com/c/{card['shortLink']}",
               "url": f"https://trello.com/c/{card['shortLink']}/{card['idShort']}-"
                      + re.sub(r"[^a-z0-9]+", "-", card["name"].lower()).strip("-"),
               "name": card["name"], "desc": card["desc"], "closed": card["closed"], "idBoard": card["idBoard"],
               "idList": card["idList"], "idMembers": list(card["idMembers"]), "idLabels": [lb["id"] for lb in card["labels"]],
               "labels": [dict(lb, idBoard=card["idBoard"]) for lb in card["labels"]], "due": card["due"],
               "dueComplete": False, "start": None, "dateLastActivity": iso_ms(card["dateLastActivity"]),
               "pos": card["pos"], "idChecklists": [], "subscribed": False,
               "badges": {"comments": sum(1 for a in self._actions.values() if a["cardId"] == card["id"]
                                          and not a["deleted"]), "attachments": sum(
                   1 for a in self._attachments.values() if a["cardId"] == card["id"])}}
        if fields and fields != ["all"]:
            out = {k: v for k, v in out.items() if k in fields or k == "id"}
        if members:
            out["members"] = [{k: self._members[m][k] for k in ("id", "username", "fullName")}
                              for m in card["idMembers"] if m in self._members]
        return out

    def _card_ref(self, card: dict, **extra) -> dict:
        return {"id": card["id"], "name": card["name"], "idShort": card["idShort"], "shortLink": card["shortLink"], **extra}

    def _board_ref(self, board_id: str) -> dict:
        board = self._boards[board_id]
        return {"id": board["id"], "name": board["name"], "shortLink": board["shortLink"]}

    def _list_ref(self, list_id: str) -> dict:
        lst = self._lists[list_id]
        return {"id": lst["id"], "name": lst["name"]}

    def _render_member(self, member: dict) -> dict:
        return {k: member[k] for k in ("id", "avatarHash", "fullName", "initials", "username")}

    def render_comment(self, action: dict) -> dict:
        card = self._cards[action["cardId"]]
        data = {"text": action["text"], "card": self._card_ref(card), "board": self._board_ref(card["idBoard"]),
                "list": self._list_ref(card["idList"])}
        if action.get("edited"):
            data["dateLastEdited"] = iso_ms(action["edited"])
        return {"id": action["id"], "idMemberCreator": action["memberId"], "type": "commentCard",
                "date": iso_ms(action["date"]), "data": data,
                "memberCreator": self._render_member(self._members[action["memberId"]])}

    def card(self, ref: str) -> dict:
        with self._lock:
            return self.render_card(self._card(ref), members=True)

    def list_name(self, card_ref: str) -> str:
        with self._lock:
            return self._lists[self._card(card_ref)["idList"]]["name"]

    def list_id(self, name: str, board: str | None = None) -> str:
        with self._lock:
            return self._list(name, self._board(board)["id"])["id"]

    def comments_of(self, card_ref: str) -> list[dict]:
        with self._lock:
            card = self._card(card_ref)
            return [self.render_comment(a) for a in sorted(self._actions.values(), key=lambda a: a["date"])
                    if a["cardId"] == card["id"] and not a["deleted"]]

    def attachments_of(self, card_ref: str) -> list[dict]:
        with self._lock:
            card = self._card(card_ref)
            return [dict(a) for a in self._attachments.values() if a["cardId"] == card["id"]]

    @property
    def webhooks(self) -> list[dict]:
        with self._lock:
            return [dict(h) for h in self._webhooks.values()]

    # --- webhooks ----------------------------------------------------------------------------------
    def _model(self, board_id: str) -> dict:
        board = self._boards[board_id]
        return {"id": board["id"], "name": board["name"], "desc": board["desc"], "descData": None,
                "closed": board["closed"], "idOrganization": None, "pinned": False,
                "url": f"https://trello.com/b/{board['shortLink']}/{board['name'].lower().replace(' ', '-')}",
                "shortUrl": f"https://trello.com/b/{board['shortLink']}", "prefs": {"permissionLevel": "private"},
                "labelNames": {}}

    def _targets(self, board_id: str) -> list[tuple[str | None, str]]:
        """(send to, callbackURL signed) for every webhook watching the board."""
        targets = [(h["callbackURL"], h["callbackURL"]) for h in self._webhooks.values()
                   if h["idModel"] == board_id and h["active"]]
        if self.webhook_url or self.callback_url:
            targets.append((self.webhook_url, self.callback_url or self.webhook_url))
        return targets or [(None, "")]

    def _emit(self, board_id: str, action_type: str, data: dict, actor: dict, *, action_id: str | None = None,
              date: datetime | None = None) -> str:
        action_id = action_id or self._new_id()
        if self._muted:
            return action_id
        action = {"id": action_id, "idMemberCreator": actor["id"], "data": data, "type": action_type,
                  "date": iso_ms(date or self._clock), "memberCreator": self._render_member(actor)}
        body = json.dumps({"model": self._model(board_id), "action": action}).encode("utf-8")
        for url, callback in self._targets(board_id):
            self._record(self._delivery(action_id, action_type, body, url, callback))
        return action_id

    def _delivery(self, action_id, action_type, body, url, callback) -> Delivery:
        headers = {"Content-Type": "application/json", "User-Agent": "Trello"}
        if self.webhook_secret:
            headers["X-Trello-Webhook"] = sign(self.webhook_secret, body, callback)
        return Delivery(action_id=action_id, action_type=action_type, callback_url=callback, headers=headers,
                        body=body, url=url)

    def deliver_fixture(self, name: str, overrides: dict | None = None) -> list:
        """Send a real fixture (``zulip_changing_cards_list``, ``zulip_adding_comment_to_card`` or a path) to
        every target of its board, signed like every delivery. Without ``overrides`` the bytes are the
        file's own, unchanged."""
        path = self._fixture_path(name)
        with open(path, "rb") as fh:
            raw = fh.read()
        payload = json.loads(raw)
        if overrides:
            payload = self._load_fixture(name, overrides)
            raw = json.dumps(payload).encode("utf-8")
        action = payload.get("action") or {}
        board_id = ((action.get("data") or {}).get("board") or {}).get("id") or (payload.get("model") or {}).get("id")
        with self._lock:
            out = [self._record(self._delivery(str(action.get("id")), str(action.get("type")), raw, url, callback))
                   for url, callback in self._targets(board_id)]
        self._after_mutation()
        return out

    def fail_next(self, count: int = 1, mode: str = "rate_limit", *, status: int | None = None) -> None:
        """Fail the next ``count`` API calls: ``rate_limit``/``key_limit`` (429, no ``Retry-After``),
        ``auth`` (401), ``error`` (``status``, default 500)."""
        self._queue_failure(count, mode, status=status, retry_after=None)

    # --- mutations (what people do on the board) ----------------------------------------------------
    def _touch(self, card: dict) -> None:
        card["dateLastActivity"] = self._stamp()

    def _create(self, name: str, list_ref, board_ref, desc, labels, members, due, actor, card_id=None,
                short_link=None) -> dict:
        board = self._board(board_ref)
        lst = self._list(list_ref, board["id"])
        self._stamp()
        cid = card_id or self._new_id()
        board_cards = [c for c in self._cards.values() if c["idBoard"] == board["id"]]
        card = {"id": cid, "idShort": len(board_cards) + 1, "shortLink": short_link or self._short_link(cid),
                "name": name, "desc": desc or "", "closed": False, "idBoard": board["id"], "idList": lst["id"],
                "idMembers": [self._member(m)["id"] for m in members or ()], "due": due,
                "labels": [self._label(lb) for lb in labels or ()], "pos": (len(board_cards) + 1) * 16384.0,
                "deleted": False, "dateLastActivity": self._clock}
        self._cards[cid] = card
        self._emit(board["id"], "createCard", {"card": self._card_ref(card), "list": self._list_ref(lst["id"]),
                                               "board": self._board_ref(board["id"])}, actor)
        return card

    def _label(self, name_or_color: str) -> dict:
        colors = ("green", "yellow", "orange", "red", "purple", "blue", "sky", "lime", "pink", "black")
        color = name_or_color if name_or_color in colors else colors[len(name_or_color) % len(colors)]
        name = "" if name_or_color in colors else name_or_color
        return {"id": hashlib.sha1(name_or_color.encode()).hexdigest()[:24], "name": name, "color": color}

    def _update(self, card: dict, actor: dict, **changes) -> dict:
        """One updateCard action per changed field (as Trello records them)."""
        for key, value in changes.items():
            board, lst = card["idBoard"], card["idList"]
            if key in ("name", "desc", "due"):
                old = card[key]
                card[key] = value if key != "desc" else (value or "")
                self._touch(card)
                data = {"card": self._card_ref(card, **{key: card[key]}), "old": {key: old},
                        "board": self._board_ref(board), "list": self._list_ref(lst)}
            elif key == "idList":
                target = self._list(value, board)
                if target["id"] == lst:
                    continue
                card["idList"] = target["id"]
                self._touch(card)
                data = {"card": self._card_ref(card, idList=target["id"]), "old": {"idList": lst},
                        "listBefore": self._list_ref(lst), "listAfter": self._list_ref(target["id"]),
                        "board": self._board_ref(board)}
            elif key == "closed":
                if bool(value) == card["closed"]:
                    continue
                card["closed"] = bool(value)
                self._touch(card)
                data = {"card": self._card_ref(card, closed=card["closed"]), "old": {"closed": not card["closed"]},
                        "board": self._board_ref(board), "list": self._list_ref(lst)}
            else:
                raise _TrelloError(400, f"invalid value for {key}")
            self._emit(board, "updateCard", data, actor)
        return card

    @mutation
    def create_card(self, name: str = "Untitled", *, list: str | None = None, board: str | None = None, desc: str = "",
                    labels=(), members=(), due: str | None = None, actor: str | None = None,
                    card_id: str | None = None, short_link: str | None = None) -> dict:
        """A person adds a card (``list``: name or id, default the board's first list)."""
        card = self._create(name, list, board, desc, labels, members, due, self._member(actor), card_id, short_link)
        return self.render_card(card, members=True)

    @mutation
    def update_card(self, card_ref: str, *, actor: str | None = None, **changes) -> dict:
        """``name``, ``desc``, ``due``, ``idList`` (list name or id), ``closed``."""
        return self.render_card(self._update(self._card(card_ref), self._member(actor), **changes), members=True)

    def move_card(self, card_ref: str, list_ref: str, *, actor: str | None = None) -> dict:
        return self.update_card(card_ref, idList=list_ref, actor=actor)

    def archive_card(self, card_ref: str, *, actor: str | None = None) -> dict:
        return self.update_card(card_ref, closed=True, actor=actor)

    def unarchive_card(self, card_ref: str, *, actor: str | None = None) -> dict:
        return self.update_card(card_ref, closed=False, actor=actor)

    @mutation
    def add_label(self, card_ref: str, label: str, *, actor: str | None = None) -> dict:
        card = self._card(card_ref)
        lb = self._label(label)
        card["labels"].append(lb)
        self._touch(card)
        self._emit(card["idBoard"], "addLabelToCard", {"card": self._card_ref(card), "board": self._board_ref(card["idBoard"]),
                                                       "label": dict(lb), "text": lb["name"]}, self._member(actor))
        return self.render_card(card, members=True)

    @mutation
    def delete_card(self, card_ref: str, *, actor: str | None = None) -> None:
        card = self._card(card_ref)
        card["deleted"] = True
        self._emit(card["idBoard"], "deleteCard", {"card": {"id": card["id"], "idShort": card["idShort"]},
                                                   "list": self._list_ref(card["idList"]),
                                                   "board": self._board_ref(card["idBoard"])}, self._member(actor))

    @mutation
    def move_card_to_board(self, card_ref: str, board: str, *, list: str | None = None, actor: str | None = None) -> dict:
        card, who = self._card(card_ref), self._member(actor)
        source, target = card["idBoard"], self._board(board)["id"]
        lst = self._list(list, target)
        card["idBoard"], card["idList"] = target, lst["id"]
        self._touch(card)
        self._emit(source, "moveCardFromBoard", {"card": self._card_ref(card), "board": self._board_ref(source),
                                                 "boardTarget": {"id": target}}, who)
        self._emit(target, "moveCardToBoard", {"card": self._card_ref(card), "board": self._board_ref(target),
                                               "boardSource": {"id": source}, "list": self._list_ref(lst["id"])}, who)
        return self.render_card(card, members=True)

    def _add_comment(self, card: dict, text: str, member: dict, action_id: str | None = None) -> dict:
        now = self._stamp()
        action = {"id": action_id or self._new_id(), "cardId": card["id"], "text": text, "memberId": member["id"],
                  "date": now, "edited": None, "deleted": False}
        self._actions[action["id"]] = action
        card["dateLastActivity"] = now
        self._emit(card["idBoard"], "commentCard", {"text": text, "card": self._card_ref(card),
                                                    "board": self._board_ref(card["idBoard"]),
                                                    "list": self._list_ref(card["idList"])}, member,
                   action_id=action["id"], date=now)
        return action

    @mutation
    def add_comment(self, card_ref: str, text: str, *, actor: str | None = None, action_id: str | None = None) -> dict:
        return self.render_comment(self._add_comment(self._card(card_ref), text, self._member(actor), action_id))

    def _edit_comment(self, action: dict, text: str, member: dict) -> dict:
        card = self._cards[action["cardId"]]
        old, action["text"], action["edited"] = action["text"], text, self._stamp()
        self._emit(card["idBoard"], "updateComment", {
            "action": {"id": action["id"], "text": text}, "old": {"text": old}, "card": self._card_ref(card),
            "board": self._board_ref(card["idBoard"])}, member)
        return action

    @mutation
    def edit_comment(self, action_id: str, text: str, *, actor: str | None = None) -> dict:
        action = self._actions[action_id]
        return self.render_comment(self._edit_comment(action, text, self._members[action["memberId"]]
                                                      if actor is None else self._member(actor)))

    def _delete_comment(self, action: dict, member: dict) -> None:
        card = self._cards[action["cardId"]]
        action["deleted"] = True
        self._stamp()
        self._emit(card["idBoard"], "deleteComment", {"action": {"id": action["id"]}, "card": self._card_ref(card),
                                                      "board": self._board_ref(card["idBoard"]),
                                                      "list": self._list_ref(card["idList"])}, member)

    @mutation
    def delete_comment(self, action_id: str, *, actor: str | None = None) -> None:
        action = self._actions[action_id]
        self._delete_comment(action, self._members[action["memberId"]] if actor is None else self._member(actor))

    # --- demo (manage.py demo_sandbox --provider trello) -----------------------------------------------
    def demo_instance_fields(self) -> dict:
        return {"containers": [self.board_id], "base_url": self.base_url,
                "state_mapping": {"lists": {"To Do": "backlog", "Doing": "active", "Paperclip: QA": "review",
                                            "Done": "terminal"}},
                "service_account_id": self.service_member["id"], "config": {}}

    def demo_open_task(self, title: str, body: str) -> str:
        return self.create_card(title, desc=body)["id"]

    # --- HTTP ----------------------------------------------------------------------------------------
    def _credentials_of(self, headers: dict, query: dict) -> tuple[str | None, str | None]:
        auth = headers.get("authorization", "")
        if auth.lower().startswith("oauth "):
            params = dict(_OAUTH_RE.findall(auth))
            return params.get("oauth_consumer_key"), params.get("oauth_token")
        return (query.get("key") or [None])[0], (query.get("token") or [None])[0]

    def _limited(self, bucket: str, limit: int | None, now: float) -> tuple[bool, int]:
        if not limit:
            return False, 0
        hits = [t for t in self._hits.get(bucket, []) if now - t < self.rate_window]
        limited = len(hits) >= limit
        if not limited:
            hits.append(now)
        self._hits[bucket] = hits
        return limited, max(0, limit - len(hits))

    def handle(self, method: str, raw_path: str, headers: dict, raw_body: bytes):
        path, query, body, body_ok = self._parse_request(raw_path, raw_body)[1:]
        if not body_ok:
            form = parse_qs(raw_body.decode("utf-8", "replace"), keep_blank_values=True)
            body, body_ok = ({k: v[0] for k, v in form.items()} if form else None), bool(form)
        if path.startswith("/1/"):
            path = path[2:]
        record = RequestRecord(method, path, query, headers, body)
        self._log_request(record)
        if not body_ok:
            return self._finish(record, 400, "invalid request body")
        key, token = self._credentials_of(headers, query)
        authorized = self.token is None or (token is not None and key is not None and hmac.compare_digest(token, self.token)
                                            and hmac.compare_digest(key, self.key))
        if path.startswith("/_sandbox/"):
            if not authorized:
                return self._finish(record, 401, "invalid token")
            return self._control(record, method, path, body)
        with self._lock:
            now = time.monotonic()
            key_limited, _ = self._limited(f"key:{key}", self.key_rate_limit, now)
            token_limited, remaining = self._limited(f"token:{token}", self.rate_limit, now)
        rate = {} if not self.rate_limit else {"x-rate-limit-api-token-interval-ms": str(int(self.rate_window * 1000)),
                                               "x-rate-limit-api-token-max": str(self.rate_limit),
                                               "x-rate-limit-api-token-remaining": str(remaining)}
        failure = self._take_failure()
        if failure:
            if failure["mode"] in ("rate_limit", "key_limit"):
                token_limited, key_limited = failure["mode"] == "rate_limit", failure["mode"] == "key_limit"
            elif failure["mode"] == "auth":
                return self._finish(record, failure["status"] or 401, "invalid token")
            else:
                return self._finish(record, failure["status"] or 500, "Internal server error")
        if key_limited or token_limited:
            which = "API_KEY_LIMIT_EXCEEDED" if key_limited else "API_TOKEN_LIMIT_EXCEEDED"
            return self._finish(record, 429, {"error": which, "message": "Rate limit exceeded"}, rate)
        if not authorized:
            return self._finish(record, 401, "invalid key" if key != self.key else "invalid token")
        params = {k: v[-1] for k, v in query.items()}
        if isinstance(body, dict):
            params.update(body)
        try:
            if method == "POST" and path == "/webhooks":
                status, payload = self.r_create_webhook(params, token)  # the HEAD check runs outside the lock
            else:
                with self._lock:  # HEAD answers like GET (the body is dropped by the client)
                    status, payload = self._route("GET" if method == "HEAD" else method, path, params,
                                                  self._member_for(token))
        except _TrelloError as exc:
            status, payload = exc.status, exc.payload if exc.payload is not None else exc.text
        self._after_mutation()
        return self._finish(record, status, payload, rate)

    def _member_for(self, token) -> dict:
        return self.service_member

    def _error_body(self, message: str):
        return message

    @staticmethod
    def _finish(record, status, payload, headers=None):
        record.status = status
        if isinstance(payload, str):
            body, ctype = payload.encode("utf-8"), "text/plain; charset=utf-8"
        else:
            body, ctype = json.dumps(payload).encode("utf-8"), "application/json; charset=utf-8"
        return status, {"Content-Type": ctype, **(headers or {})}, body

    _ROUTES = [
        ("GET", r"/members/me", "r_me"),
        ("GET", r"/boards/(?P<bid>[^/]+)", "r_board"),
        ("GET", r"/boards/(?P<bid>[^/]+)/lists", "r_board_lists"),
        ("GET", r"/boards/(?P<bid>[^/]+)/cards(?:/(?P<flt>all|open|closed|visible|none))?", "r_board_cards"),
        ("POST", r"/cards", "r_create_card"),
        ("GET", r"/cards/(?P<cid>[^/]+)", "r_get_card"),
        ("PUT", r"/cards/(?P<cid>[^/]+)", "r_put_card"),
        ("DELETE", r"/cards/(?P<cid>[^/]+)", "r_delete_card"),
        ("GET", r"/cards/(?P<cid>[^/]+)/actions", "r_card_actions"),
        ("POST", r"/cards/(?P<cid>[^/]+)/actions/comments", "r_add_comment"),
        ("PUT", r"/cards/(?P<cid>[^/]+)/actions/(?P<aid>[^/]+)/comments", "r_edit_comment"),
        ("DELETE", r"/cards/(?P<cid>[^/]+)/actions/(?P<aid>[^/]+)/comments", "r_delete_comment"),
        ("GET", r"/cards/(?P<cid>[^/]+)/attachments", "r_attachments"),
        ("POST", r"/cards/(?P<cid>[^/]+)/attachments", "r_add_attachment"),
        ("GET", r"/batch", "r_batch"),
        ("GET", r"/webhooks/(?P<wid>[^/]+)", "r_get_webhook"),
        ("PUT", r"/webhooks/(?P<wid>[^/]+)", "r_put_webhook"),
        ("DELETE", r"/webhooks/(?P<wid>[^/]+)", "r_delete_webhook"),
        ("GET", r"/tokens/(?P<tok>[^/]+)/webhooks", "r_token_webhooks"),
    ]

    def _route(self, method, path, params, user):
        for verb, pattern, name in self._ROUTES:
            m = re.fullmatch(pattern, path)
            if m and verb == method:
                return getattr(self, name)(params=params, user=user, **{k: v for k, v in m.groupdict().items()
                                                                         if v is not None})
        raise _TrelloError(404, f"Cannot {method} /1{path}")

    @staticmethod
    def _fields(params) -> list[str] | None:
        value = params.get("fields")
        return [f for f in str(value).split(",") if f] if value else None

    # --- routes ------------------------------------------------------------------------------------
    def r_me(self, user, **_):
        return 200, dict(user)

    def r_board(self, bid, params, **_):
        board = self._board(bid)
        fields = self._fields(params)
        return 200, {k: v for k, v in board.items() if not fields or k in fields or k == "id"}

    def r_board_lists(self, bid, params, **_):
        board = self._board(bid)
        flt = params.get("filter", "open")
        rows = sorted((lst for lst in self._lists.values() if lst["idBoard"] == board["id"]
                       and (flt == "all" or (flt == "closed") == lst["closed"])), key=lambda r: r["pos"])
        fields = self._fields(params)
        return 200, [{k: v for k, v in r.items() if not fields or k in fields or k == "id"} for r in rows]

    def r_board_cards(self, bid, params, flt=None, **_):
        board = self._board(bid)
        flt = flt or params.get("filter") or "visible"
        if flt not in ("all", "open", "closed", "visible", "none"):
            raise _TrelloError(400, "invalid value for filter")
        rows = [c for c in self._cards.values() if c["idBoard"] == board["id"] and not c["deleted"]
                and (flt == "all" or (flt == "closed" and c["closed"]) or (flt in ("open", "visible") and not c["closed"]))]
        rows.sort(key=lambda c: (c["idList"], c["pos"]))  # board order, not change order (as Trello does)
        members = str(params.get("members", "false")).lower() == "true"
        return 200, [self.render_card(c, self._fields(params), members=members) for c in rows]

    def r_get_card(self, cid, params, **_):
        card = self._card(cid)
        return 200, self.render_card(card, self._fields(params), members=str(params.get("members", "")).lower() == "true")

    def r_create_card(self, params, user, **_):
        if not params.get("idList"):
            raise _TrelloError(400, "invalid value for idList")
        lst = self._lists.get(str(params["idList"]))
        if lst is None:
            raise _TrelloError(400, "invalid value for idList")
        card = self._create(str(params.get("name") or ""), lst["id"], lst["idBoard"], params.get("desc"), (), (),
                            params.get("due"), user)
        return 200, self.render_card(card)

    def r_put_card(self, cid, params, user, **_):
        card = self._card(cid)
        changes = {}
        for key in ("name", "desc", "due", "idList", "closed"):
            if key in params:
                value = params[key]
                if key == "closed" and isinstance(value, str):
                    value = value.lower() == "true"
                if key == "idList" and value not in self._lists:
                    raise _TrelloError(400, "invalid value for idList")
                changes[key] = value
        unknown = [k for k in params if k not in ("name", "desc", "due", "idList", "closed", "key", "token", "pos")]
        if unknown:
            raise _TrelloError(400, f"invalid value for {unknown[0]}")
        # one updateCard action per field, the unarchive before the move (as Trello records one edit)
        self._update(card, user, **{k: changes[k] for k in ("closed", "idList", "name", "desc", "due") if k in changes})
        return 200, self.render_card(card)

    def r_delete_card(self, cid, user, **_):
        card = self._card(cid)
        card["deleted"] = True
        self._emit(card["idBoard"], "deleteCard", {"card": {"id": card["id"], "idShort": card["idShort"]},
                                                   "list": self._list_ref(card["idList"]),
                                                   "board": self._board_ref(card["idBoard"])}, user)
        return 200, {"limits": {}}

    def _bound(self, value) -> datetime | str:
        value = str(value)
        if re.fullmatch(r"[0-9a-f]{24}", value):
            return value
        try:
            return parse_ts(value)
        except ValueError:
            raise _TrelloError(400, "invalid value for before/since") from None

    def r_card_actions(self, cid, params, **_):
        card = self._card(cid)
        types = str(params.get("filter") or "commentCard").split(",")
        limit = int(params.get("limit") or 50)
        if not 0 <= limit <= 1000:
            raise _TrelloError(400, "invalid value for limit")
        rows = [a for a in self._actions.values() if a["cardId"] == card["id"] and not a["deleted"]
                and "commentCard" in types + (["commentCard"] if "all" in types else [])]
        rows.sort(key=lambda a: a["id"], reverse=True)  # newest first (ids grow with time)
        for name, keep in (("before", lambda a, b: a["id"] < b if isinstance(b, str) else a["date"] < b),
                           ("since", lambda a, b: a["id"] > b if isinstance(b, str) else a["date"] > b)):
            if params.get(name):
                bound = self._bound(params[name])
                rows = [a for a in rows if keep(a, bound)]
        return 200, [self.render_comment(a) for a in rows[:limit]]

    def r_add_comment(self, cid, params, user, **_):
        text = params.get("text")
        if not text:
            raise _TrelloError(400, "invalid value for text")
        return 200, self.render_comment(self._add_comment(self._card(cid), str(text), user))

    def _own_comment(self, cid, aid) -> dict:
        card, action = self._card(cid), self._actions.get(aid)
        if action is None or action["deleted"] or action["cardId"] != card["id"]:
            raise _TrelloError(404, "The requested resource was not found.")
        return action

    def r_edit_comment(self, cid, aid, params, user, **_):
        action = self._own_comment(cid, aid)
        if action["memberId"] != user["id"]:
            raise _TrelloError(401, "unauthorized comment permission requested")
        return 200, self.render_comment(self._edit_comment(action, str(params.get("text") or ""), user))

    def r_delete_comment(self, cid, aid, user, **_):
        self._delete_comment(self._own_comment(cid, aid), user)
        return 200, {"limits": {}}

    def r_attachments(self, cid, params, **_):
        card = self._card(cid)
        return 200, [dict(a) for a in self._attachments.values() if a["cardId"] == card["id"]]

    def r_add_attachment(self, cid, params, user, **_):
        card = self._card(cid)
        url = params.get("url")
        if not url or not re.match(r"^https?://", str(url)):
            raise _TrelloError(400, "invalid value for url")
        aid = self._new_id()
        self._stamp()
        attachment = {"id": aid, "cardId": card["id"], "name": str(params.get("name") or url), "url": str(url),
                      "isUpload": False, "idMember": user["id"], "date": iso_ms(self._clock), "mimeType": ""}
        self._attachments[aid] = attachment
        self._touch(card)
        self._emit(card["idBoard"], "addAttachmentToCard", {
            "card": self._card_ref(card), "board": self._board_ref(card["idBoard"]),
            "attachment": {"id": aid, "name": attachment["name"], "url": attachment["url"]}}, user)
        return 200, dict(attachment)

    def r_batch(self, params, user, **_):
        urls = [u for u in str(params.get("urls") or "").split(",") if u]
        if not urls or len(urls) > 10:
            raise _TrelloError(400, "Invalid batch request: 1 to 10 urls")
        out = []
        for url in urls:
            sub = urlsplit(url if url.startswith("/") else "/" + url)
            sub_params = {k: v[-1] for k, v in parse_qs(sub.query).items()}
            try:
                status, payload = self._route("GET", sub.path[2:] if sub.path.startswith("/1/") else sub.path,
                                              sub_params, user)
            except _TrelloError as exc:
                status, payload = exc.status, {"message": exc.text}
            out.append({str(status): payload})
        return 200, out

    # --- webhooks API ------------------------------------------------------------------------------
    def r_create_webhook(self, params, token):
        callback, model = str(params.get("callbackURL") or ""), str(params.get("idModel") or "")
        with self._lock:
            if model not in self._boards and model not in self._cards:
                raise _TrelloError(400, "invalid value for idModel")
            if not re.match(r"^https?://", callback):
                raise _TrelloError(400, "invalid value for callbackURL")
            if any(h["idModel"] == model and h["callbackURL"] == callback and h["token"] == token
                   for h in self._webhooks.values()):
                raise _TrelloError(400, "A webhook with that callback, model, and token already exists")
        status = _head(callback, self.delivery_timeout)  # Trello's callback check, before anything is created
        if status != 200:
            raise _TrelloError(400, f"URL ({callback}) did not return 200 status code, got {status}")
        with self._lock:
            hook = {"id": self._new_id(), "description": str(params.get("description") or ""), "idModel": model,
                    "callbackURL": callback, "active": str(params.get("active", True)).lower() != "false",
                    "consecutiveFailures": 0, "firstConsecutiveFailDate": None, "token": token}
            self._webhooks[hook["id"]] = hook
            return 200, self._render_webhook(hook)

    @staticmethod
    def _render_webhook(hook: dict) -> dict:
        return {k: v for k, v in hook.items() if k != "token"}

    def _webhook(self, wid) -> dict:
        hook = self._webhooks.get(wid)
        if hook is None:
            raise _TrelloError(404, "The requested resource was not found.")
        return hook

    def r_get_webhook(self, wid, **_):
        return 200, self._render_webhook(self._webhook(wid))

    def r_put_webhook(self, wid, params, **_):
        hook = self._webhook(wid)
        for key in ("description", "callbackURL", "idModel"):
            if key in params:
                hook[key] = str(params[key])
        if "active" in params:
            hook["active"] = str(params["active"]).lower() == "true"
        return 200, self._render_webhook(hook)

    def r_delete_webhook(self, wid, **_):
        self._webhooks.pop(self._webhook(wid)["id"])
        return 200, {"_value": None}

    def r_token_webhooks(self, tok, **_):
        return 200, [self._render_webhook(h) for h in self._webhooks.values() if h["token"] == tok]

    def fail_webhook(self, webhook_id: str, failures: int = 1, *, deactivate: bool = False) -> None:
        """Trello's view of a failing callback: consecutive failures counted, optionally disabled."""
        with self._lock:
            hook = self._webhook(webhook_id)
            hook["consecutiveFailures"] += failures
            hook["firstConsecutiveFailDate"] = hook["firstConsecutiveFailDate"] or iso_ms(self._clock)
            if deactivate:
                hook["active"] = False


def main(argv=None) -> int:
    def key_and_board(parser):
        parser.add_argument("--key", default=os.environ.get("TRELLO_SANDBOX_KEY", "trello-sandbox-key"))
        parser.add_argument("--board", default="Sandbox Board")

    parser = cli_parser("trello", "Run the Trello-compatible REST sandbox (offline demo).", 8769,
                        "API token accepted with --key (env TRELLO_SANDBOX_TOKEN); omit to disable auth",
                        "create N demo cards at start (no webhooks)", after_port=key_and_board)
    args = parser.parse_args(argv)
    sandbox = TrelloSandbox(host=args.host, port=args.port, boards={args.board: DEFAULT_LISTS}, key=args.key,
                            token=args.token, webhook_url=args.webhook_url, webhook_secret=args.webhook_secret,
                            delivery_mode="queued" if args.queued else "sync", real_clock=True)
    with sandbox.quiet():
        for n in range(args.seed):
            sandbox.create_card(f"Demo card {n + 1}", desc=f"Seeded ({n + 1}/{args.seed}).", labels=["demo"])
    return serve_until_interrupted(sandbox, lambda sb: (
        f"Trello sandbox on {sb.base_url}; board {sb.board_id}; credentials {args.key}:<token>; "
        f"webhook {'-> ' + args.webhook_url if args.webhook_url else 'none'}"))


if __name__ == "__main__":
    sys.exit(main())
