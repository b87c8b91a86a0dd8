"""Trello task source adapter (External Task Protocol layer 1, Appendix A.5). REST API ``/1``.

``base_url`` is the API root (``https://api.trello.com``, or the sandbox :mod:`connectors.sandbox.trello`);
``credentials`` resolves to ``"<api key>:<token>"`` (see :mod:`.client`); the webhook secret is the Trello
app's secret (the "OAuth1 secret" of the API key). Containers are board ids (24 hex, as payloads carry
them), optionally narrowed to some lists (``config["lists"]``, see :mod:`.states`). Lists are lanes; the
state mapping maps lists to categories (:mod:`.states`), an archived card is terminal.

Listing (cursors)
-----------------
Trello cannot filter a board's cards by change time, so ``list_candidate_tasks`` reads
``GET /1/boards/{id}/cards?filter=all`` (open and archived cards: an archive is a terminal change) and
keeps the cards whose ``dateLastActivity`` is past the cursor, oldest first, ``page_size`` per page. The
cursor is the high-water mark with the ids listed exactly at it::

    {"v": 1, "scope": "<board id>", "since": "<ISO ms dateLastActivity>"|null, "seen": [card ids at since]}

Each page's cursor is its last card's mark; ``cursor=None`` when nothing new was listed. A crash between a
page and its cursor save re-lists that page (re-applied idempotently). ``list_comments`` pages
``GET /1/cards/{id}/actions?filter=commentCard&limit=&before=<action id>`` (newest first) through the whole
thread in one call and returns the comments created or edited past the mark.

Webhooks: :mod:`.webhook`. Registration: ``POST /1/webhooks`` (``callbackURL``, ``idModel`` = board,
``description``; Trello sends a ``HEAD`` to the callback first and refuses without a 200), re-verified with
``GET /1/webhooks/{id}`` (``active``, ``consecutiveFailures``, ``callbackURL``).

Writes
------
``post_comment`` -> ``POST /1/cards/{id}/actions/comments`` (the effect marker ``<!-- paperclip:... -->``
stays in the text: Trello keeps comment text verbatim). ``update_task_state(name)``: a list of the card's
board (by name or id) -> ``PUT /1/cards/{id}`` ``idList`` (and ``closed: false``); :data:`~.states.ARCHIVED`
-> ``closed: true``. ``state_for_category``: the first open list of the board mapped to the category;
terminal falls back to archiving. ``set_fields``: ``name``, ``desc``, ``due``. ``set_backlink``: a link
attachment named :data:`BACKLINK_NAME` (added once per URL; ``find_backlinks`` reads the attachments with
that name back). ``create_task``: ``POST /1/cards`` in the list the projection's state names, else the
first open list mapped to backlog, else the first open (narrowed) list.

Errors (§5.4): 401/403 -> ``provider_auth``; 429 -> ``provider_rate_limited`` (``retry_after`` 10 s, Trello
sends no ``Retry-After``); other non-2xx -> ``provider_status``; transport -> ``provider_request``; non-JSON
-> ``provider_payload``."""
from __future__ import annotations

from typing import Any, Mapping
from urllib.parse import quote

import httpx

from ..base import (
    AdapterConfig,
    Capabilities,
    ErrorCategory,
    ExternalState,
    ExternalTask,
    ExternalTaskRef,
    HandshakeReply,
    Page,
    ProviderError,
    StateCategory,
    TaskSourceAdapter,
    VerifiedEvent,
    WebhookRegistration,
    WebhookRequest,
    normalize_state_name,
    register,
)
from ..http import (
    ALL_OPERATIONS,
    advance_cursor,
    decode_cursor,
    due_date,
    encode_cursor,
    normalize_each,
    parse_utc,
    required_title,
    scan_rows,
)
from . import webhook
from .client import TrelloClient
from .normalize import TrelloNormalizer
from .states import ARCHIVED, ListMapping, Narrowing, first_mapped, mapping_errors, narrowing_errors

PAGE_SIZE = 50
COMMENT_PAGE = 1000  # Trello's actions endpoints take limit up to 1000
MAX_COMMENT_PAGES = 20
BATCH = 10  # GET /1/batch takes up to 10 urls
MAX_ATTACHMENTS = 1000
BACKLINK_NAME = "Paperclip"
CARD_FIELDS = ("id,idShort,shortLink,shortUrl,url,name,desc,closed,idBoard,idList,idMembers,idLabels,labels,"
               "due,dueComplete,start,dateLastActivity,pos,idChecklists,badges")
MEMBER_FIELDS = "fullName,username"
# No custom_field: Trello custom fields are a Power-Up whose values neither the card nor the webhook payloads
# carry; no priority either. Lanes (state_lane) route on list names, e.g. a card moved into "Paperclip: QA".
ROUTING_KINDS = frozenset({"default_route", "label", "state_lane", "comment_command", "user_mapping"})


def _data(action: Mapping) -> Mapping:
    return action.get("data") if isinstance(action.get("data"), Mapping) else {}


@register
class TrelloAdapter(TrelloClient, TrelloNormalizer, TaskSourceAdapter):
    provider_key = "trello"
    display_name = "Trello"
    default_base_url = "https://api.trello.com"
    capabilities = Capabilities(
        operations=ALL_OPERATIONS | {"register_webhook", "check_webhook"},
        state_categories=frozenset(StateCategory.ALL),
        signed_webhooks=True,
        routing_rule_kinds=ROUTING_KINDS,
        has_external_keys=True,
        settable_fields=frozenset({"title", "description"}),
    )
    setup_help = {
        "containers": "Trello board ids (24 hex digits, e.g. from https://trello.com/b/<shortLink>.json → \"id\"). "
                      "Payloads name boards by id.",
        "baseUrl": "The Trello API root: https://api.trello.com (requests go to /1/...).",
        "credentials": "A secret reference that resolves to \"<api key>:<token>\": the API key of your Trello "
                       "Power-Up (trello.com/power-ups/admin → API key) and a token authorized for it. Sent as "
                       "an OAuth Authorization header.",
        "webhookSecret": "A secret reference to the same app's secret (\"OAuth1 secret\" next to the API key): "
                         "Trello signs X-Trello-Webhook with it over the body and the callback URL.",
        "serviceAccountId": "The Trello member id (or username) the token belongs to: its own comments and "
                            "moves are echoes, never imported.",
        "stateMapping": "Lists are lanes: {\"lists\": {list name: category}}, {\"listIds\": {list id: category}} "
                        "and per-board overrides {\"boards\": {board id: {\"lists\": ..., \"listIds\": ...}}}. "
                        "Categories: backlog, active, review, blocked, terminal. An archived card is always "
                        "terminal; without a mapping every open card is backlog.",
        "config": "Optional {\"lists\": {board id: [list id or name, ...]}}: only cards in those lists are "
                  "the connector's (a card moved out of them is treated as removed).",
        "webhooks": "Register with `manage.py connector_register_webhooks` (POST /1/webhooks per board; Trello "
                    "first sends a HEAD to the webhook URL, which answers 200). The signature covers the exact "
                    "public URL (PAPERCLIP_PUBLIC_URL): changing it needs a new registration. Polling is the "
                    "backstop.",
        "stateMappingExample": '{"lists": {"To Do": "backlog", "Doing": "active", "Paperclip: QA": "review", '
                               '"Done": "terminal"}}',
    }

    def __init__(self, config: AdapterConfig, *, client: httpx.Client | None = None, page_size: int = PAGE_SIZE,
                 comment_page_size: int = COMMENT_PAGE):
        super().__init__(config)
        self.base_url = (config.base_url or self.default_base_url).rstrip("/")
        self.page_size = max(1, min(1000, int(page_size)))
        self.comment_page_size = max(1, min(1000, int(comment_page_size)))
        self._containers = {c.strip().lower(): c.strip() for c in config.containers}
        self._mapping = ListMapping(config.state_mapping)
        self.narrowing = Narrowing(config.options)
        self._init_client(client)

    # --- helpers ---------------------------------------------------------------------------------
    def _scope(self, scope: str) -> str:
        board = self.container_of(scope)
        if board is None:
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, f"Trello board {scope!r} is not one of this "
                                                                "connector's containers.")
        return board

    @staticmethod
    def _card_id(ref: ExternalTaskRef) -> str:
        value = (ref.external_id or ref.external_key or "").strip()
        if not value:
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, "Trello task refs need an external_id.")
        return value

    def _lists(self, board_id: str) -> dict[str, dict]:
        rows = self.request("GET", f"/boards/{quote(board_id)}/lists",
                            params={"filter": "all", "fields": "id,name,closed,pos,idBoard"})
        if not isinstance(rows, list):
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, "Trello board lists are not a JSON array.")
        return {str(r["id"]): r for r in rows if isinstance(r, Mapping) and r.get("id")}

    def _in_scope(self, card: Mapping, lists: Mapping[str, Mapping]) -> bool:
        board = card.get("idBoard")
        if self.container_of(board) is None:
            return False
        lst = lists.get(str(card.get("idList"))) or {}
        return self.narrowing.allows(board, card.get("idList"), lst.get("name"))

    def _card(self, card_id: str) -> dict:
        card = self.request("GET", f"/cards/{quote(card_id)}", params={
            "fields": CARD_FIELDS, "members": "true", "member_fields": MEMBER_FIELDS})
        if not isinstance(card, Mapping) or not card.get("id"):
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, f"Trello card {card_id} is not a card object.")
        return dict(card)

    # --- §5.1 required ---------------------------------------------------------------------------
    def list_candidate_tasks(self, scope: str, cursor: str | None) -> Page:
        board = self._scope(scope)
        state = decode_cursor(cursor, board, "page", provider="Trello", page_types=(str,),
                              page_error="Trello cursor 'page' is not a string.")
        cards = self.request("GET", f"/boards/{quote(board)}/cards", params={
            "filter": "all", "fields": CARD_FIELDS, "members": "true", "member_fields": MEMBER_FIELDS})
        if not isinstance(cards, list):
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, "Trello board cards are not a JSON array.")
        epoch = parse_utc("1970-01-01T00:00:00Z")
        rows = sorted(((str(c.get("id")), parse_utc(c.get("dateLastActivity")), c) for c in cards if isinstance(c, Mapping)),
                      key=lambda r: (r[1] or epoch, r[0]))
        fresh, _hw, _seen = scan_rows(rows, state["since"], state["seen"], None, (), drop_older=True)
        chosen = {id(raw) for raw in fresh[:self.page_size]}
        page_rows = [row for row in rows if id(row[2]) in chosen]
        fresh, new_state, advanced = advance_cursor(state, page_rows, None, "page", drop_older=True)
        lists = self._lists(board) if fresh else {}
        # cards outside the narrowed lists move the cursor but are not candidates
        mine = [c for c in fresh if self._in_scope(c, lists)]
        tasks, skipped = normalize_each(lambda c: self.normalize_card(c, lists), mine, "Trello card in listing",
                                        key_of=lambda c: c.get("shortLink"))
        return Page(items=tasks, cursor=encode_cursor(board, new_state, "page") if advanced else None, skipped=skipped)

    def get_task(self, ref: ExternalTaskRef) -> ExternalTask:
        card = self._card(self._card_id(ref))
        lists = self._lists(str(card.get("idBoard") or "")) if self.container_of(card.get("idBoard")) else {}
        if not self._in_scope(card, lists):
            raise ProviderError(ErrorCategory.PROVIDER_STATUS, f"Trello card {card.get('shortLink') or card['id']} is "
                                                               "not on a board (or list) of this connector.", status=404)
        try:
            return self.normalize_card(card, lists)
        except (KeyError, TypeError, ValueError) as exc:
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, f"Malformed Trello card: {exc!r}") from exc

    def get_task_states(self, refs: list[ExternalTaskRef]) -> dict[str, ExternalState | None]:
        ids = list(dict.fromkeys(self._card_id(ref) for ref in refs))
        out: dict[str, ExternalState | None] = {}
        lists_by_board: dict[str, dict] = {}
        for start in range(0, len(ids), BATCH):
            chunk = ids[start:start + BATCH]
            # sub-urls are comma-separated: no field list (it would need commas); a card's defaults carry
            # closed, idBoard and idList
            urls = ",".join(f"/cards/{quote(cid)}" for cid in chunk)
            answers = self.request("GET", "/batch", params={"urls": urls})
            if not isinstance(answers, list) or len(answers) != len(chunk):
                raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, "Trello batch answer does not match the request.")
            for card_id, answer in zip(chunk, answers):
                card = answer.get("200") if isinstance(answer, Mapping) else None
                if not isinstance(card, Mapping):
                    status = next(iter(answer), "?") if isinstance(answer, Mapping) else "?"
                    if str(status) in ("404", "400"):  # deleted (or an id Trello no longer knows)
                        out[card_id] = None
                        continue
                    raise ProviderError(ErrorCategory.PROVIDER_STATUS, f"Trello batch read of card {card_id} -> {status}")
                board = str(card.get("idBoard") or "")
                if self.container_of(board) is None:
                    out[card_id] = None  # moved to a board outside the containers
                    continue
                if board not in lists_by_board:
                    lists_by_board[board] = self._lists(board)
                lists = lists_by_board[board]
                if not self._in_scope(card, lists):
                    out[card_id] = None
                    continue
                lst = lists.get(str(card.get("idList"))) or {}
                out[card_id] = self._mapping.state(closed=bool(card.get("closed")), list_id=card.get("idList"),
                                                   list_name=lst.get("name"), board_id=board)[0]
        return out

    def list_comments(self, ref: ExternalTaskRef, cursor: str | None) -> Page:
        """One pass over the thread (newest first, ``before`` paging) -> the comments created or edited past
        the mark. Trello cannot filter comments by edit time, so every pass reads the whole thread (up to
        :data:`MAX_COMMENT_PAGES`; a longer thread continues from a mid-pass cursor)."""
        card_id = self._card_id(ref)
        state = decode_cursor(cursor, card_id, "before", provider="Trello", page_types=(str,),
                              page_error="Trello cursor 'before' is not an action id.")
        resumed = state["before"] is not None
        epoch = parse_utc("1970-01-01T00:00:00Z")
        fresh_all: list = []
        for _ in range(MAX_COMMENT_PAGES):
            params = {"filter": "commentCard", "limit": str(self.comment_page_size), "memberCreator": "true",
                      "memberCreator_fields": MEMBER_FIELDS}
            if state["before"]:
                params["before"] = state["before"]
            rows = self.request("GET", f"/cards/{quote(card_id)}/actions", params=params)
            if not isinstance(rows, list):
                raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, "Trello card actions are not a JSON array.")
            rows = [r for r in rows if isinstance(r, Mapping) and r.get("id")]
            more = len(rows) >= self.comment_page_size
            keyed = sorted(((str(r["id"]), parse_utc(_data(r).get("dateLastEdited")) or parse_utc(r.get("date")), r)
                            for r in rows), key=lambda k: (k[1] or epoch, k[0]))
            fresh, state, _ = advance_cursor(state, keyed, str(rows[-1]["id"]) if more else None, "before",
                                             drop_older=True)
            fresh_all += fresh
            if not more:
                break
        comments, skipped = normalize_each(lambda row: self.normalize_comment(row, card_id), fresh_all,
                                           "Trello comment")
        moved = fresh_all or resumed or state["before"] is not None
        return Page(items=comments, cursor=encode_cursor(card_id, state, "before") if moved else None, skipped=skipped)

    def verify_webhook(self, request: WebhookRequest) -> VerifiedEvent:
        body = webhook.check_signature(request, self.config.webhook_secret)
        return webhook.parse(self, request, body)  # parsed only after the signature verified

    def webhook_handshake(self, request: WebhookRequest) -> HandshakeReply | None:
        return webhook.handshake(request)

    def validate_state_mapping(self, mapping: Mapping[str, Any]) -> dict[str, list[str]]:
        return mapping_errors(mapping)

    @classmethod
    def config_errors(cls, options: Mapping[str, Any]) -> dict[str, list[str]]:
        return narrowing_errors(options)

    def run_mode_refusal(self, run_mode: str) -> str | None:
        if run_mode == "symphony_compatible" and not self._mapping.maps_category(StateCategory.ACTIVE):
            return ("no Trello list is mapped to 'active' (stateMapping.lists, e.g. {\"Doing\": \"active\"}): "
                    "nothing would ever say a card became active.")
        return None

    # --- webhook registration (§13.2) ------------------------------------------------------------
    def register_webhook(self, scope: str, callback_url: str) -> WebhookRegistration:
        board = self._scope(scope)
        try:
            hook = self.request("POST", "/webhooks", body={
                "callbackURL": callback_url, "idModel": board, "active": True,
                "description": f"Paperclip connector (board {board})"})
        except ProviderError as exc:
            if exc.status == 400 and "already exists" in str(exc):
                hook = self._existing_webhook(board, callback_url)
                if hook is None:
                    raise
            else:
                raise
        return self._registration(board, hook, callback_url)

    def _existing_webhook(self, board: str, callback_url: str) -> Mapping | None:
        _key, token = self._credentials()
        # ``what`` names the path without the token: error texts reach health entries, logs and the console
        hooks = self.request("GET", f"/tokens/{quote(token)}/webhooks", what="Trello GET /tokens/<token>/webhooks") or []
        return next((h for h in hooks if isinstance(h, Mapping) and h.get("idModel") == board
                     and h.get("callbackURL") == callback_url), None)

    def _credentials(self) -> tuple[str, str]:
        from .client import split_credentials

        return split_credentials(self.config.credentials)

    @staticmethod
    def _registration(scope: str, hook: Any, callback_url: str) -> WebhookRegistration:
        if not isinstance(hook, Mapping) or not hook.get("id"):
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, "Trello webhook answer has no id.")
        failures = int(hook.get("consecutiveFailures") or 0)
        active = bool(hook.get("active", True))
        detail = "active" if active else "disabled by Trello"
        if failures:
            detail += f"; {failures} consecutive failed deliveries since {hook.get('firstConsecutiveFailDate')}"
        if hook.get("callbackURL") and hook["callbackURL"] != callback_url:
            # Trello signs with the URL it calls: deliveries would not verify against ours
            active, detail = False, f"calls {hook['callbackURL']}, not {callback_url}"
        return WebhookRegistration(scope=scope, external_id=str(hook["id"]), callback_url=callback_url, active=active,
                                   detail=detail)

    def check_webhook(self, registration: WebhookRegistration) -> WebhookRegistration:
        try:
            hook = self.request("GET", f"/webhooks/{quote(registration.external_id)}")
        except ProviderError as exc:
            if exc.category == ErrorCategory.PROVIDER_STATUS and exc.status in (400, 404):
                return WebhookRegistration(scope=registration.scope, external_id=registration.external_id,
                                           callback_url=registration.callback_url, active=False,
                                           detail=f"gone on Trello ({exc.status})")
            raise
        return self._registration(registration.scope, hook, registration.callback_url)

    # --- setup validation (TaskSourceAdapter.workflow_metadata) ----------------------------------
    def workflow_metadata(self, scope: str) -> dict:
        """The board's open lists with their configured category; overrides may be keyed by the board id or
        its shortLink. ("Archived" is no list: an archived card is always terminal.)"""
        board_id = self._scope(scope)
        board = self.request("GET", f"/boards/{quote(board_id)}", params={"fields": "id,name,shortLink,closed"}) or {}
        states = []
        for row in sorted(self._lists(board_id).values(), key=lambda r: (float(r.get("pos") or 0), str(r.get("id")))):
            if row.get("closed"):
                continue
            state, unmapped = self._mapping.state(closed=False, list_id=row.get("id"), list_name=row.get("name"),
                                                  board_id=board_id)
            states.append({"id": row.get("id"), "name": row.get("name"), "category": state.category,
                           "mapped": unmapped is None, "type": "list"})
        keys = [k for k in (scope, board.get("id"), board.get("shortLink")) if k]
        return {"containerKind": "board", "keys": keys, "nameSections": ["lists"], "overrideSection": "boards",
                "states": states}

    # --- §5.2 optional writes --------------------------------------------------------------------
    def _card_board(self, card_id: str) -> tuple[dict, dict[str, dict]]:
        card = self.request("GET", f"/cards/{quote(card_id)}", params={"fields": "id,idBoard,idList,closed,shortLink"})
        if not isinstance(card, Mapping) or self.container_of(card.get("idBoard")) is None:
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, f"Trello card {card_id} is not on a board of this connector.")
        return dict(card), self._lists(str(card["idBoard"]))

    def _list_named(self, lists: Mapping[str, Mapping], target: str) -> Mapping | None:
        wanted = normalize_state_name(target)
        by_id = lists.get(target.strip())
        if by_id is not None:
            return by_id
        candidates = [r for r in lists.values() if normalize_state_name(r.get("name")) == wanted]
        return next((r for r in candidates if not r.get("closed")), candidates[0] if candidates else None)

    def update_task_state(self, ref: ExternalTaskRef, target_state_name: str) -> None:
        card_id = self._card_id(ref)
        card, lists = self._card_board(card_id)
        target = self._list_named(lists, target_state_name)
        if target is None and normalize_state_name(target_state_name) == normalize_state_name(ARCHIVED):
            if not card.get("closed"):
                self.request("PUT", f"/cards/{quote(card_id)}", body={"closed": True})
            return
        if target is None:
            names = ", ".join(str(r.get("name")) for r in lists.values() if not r.get("closed"))
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, f"Trello board has no list {target_state_name!r} "
                                                                f"(lists: {names or 'none'}; or {ARCHIVED!r}).")
        if card.get("idList") == target["id"] and not card.get("closed"):
            return  # already there
        self.request("PUT", f"/cards/{quote(card_id)}", body={"idList": target["id"], "closed": False})

    def state_for_category(self, ref: ExternalTaskRef, category: str) -> str | None:
        card, lists = self._card_board(self._card_id(ref))
        board = str(card["idBoard"])
        name = first_mapped(list(lists.values()), category, self._mapping, board,
                            allowed=lambda row: self.narrowing.allows(board, row.get("id"), row.get("name")))
        if name is None and category == StateCategory.TERMINAL:
            return ARCHIVED  # an archived card is terminal: closing without a Done list archives it
        return name

    def post_comment(self, ref: ExternalTaskRef, body: str) -> str:
        action = self.request("POST", f"/cards/{quote(self._card_id(ref))}/actions/comments", body={"text": body})
        if not isinstance(action, Mapping) or not action.get("id"):
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, "Trello comment answer has no action id.")
        return str(action["id"])

    @staticmethod
    def _card_fields(fields: Mapping[str, Any]) -> dict:
        out: dict[str, Any] = {}
        for key, value in fields.items():
            if key == "title":
                out["name"] = value
            elif key in ("description", "body"):
                out["desc"] = value or ""
            elif key in ("dueAt", "due_at", "due"):
                out["due"] = (due_date(value) + "T00:00:00.000Z") if value else None
            else:
                raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD,
                                    f"Trello set_fields supports title, description, dueAt; not {key!r}.")
        return out

    def set_fields(self, ref: ExternalTaskRef, fields: Mapping[str, Any]) -> None:
        payload = self._card_fields(fields or {})
        if payload:
            self.request("PUT", f"/cards/{quote(self._card_id(ref))}", body=payload)

    def create_task(self, scope: str, projection: Mapping[str, Any]) -> ExternalTask:
        board = self._scope(scope)
        title = required_title(projection)
        lists = self._lists(board)
        allowed = [r for r in lists.values() if not r.get("closed")
                   and self.narrowing.allows(board, r.get("id"), r.get("name"))]
        target = self._list_named({str(r["id"]): r for r in allowed}, projection["state"]) if projection.get("state") else None
        if target is None:
            name = first_mapped(allowed, StateCategory.BACKLOG, self._mapping, board)
            target = self._list_named({str(r["id"]): r for r in allowed}, name) if name else None
        if target is None:
            target = min(allowed, key=lambda r: (float(r.get("pos") or 0), str(r.get("id"))), default=None)
        if target is None:
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, f"Trello board {board} has no open list to create in.")
        body = {"idList": target["id"], "name": title, "pos": "bottom",
                **self._card_fields({k: v for k, v in projection.items() if k in ("description", "dueAt") and v})}
        card = self.request("POST", "/cards", body=body)
        if not isinstance(card, Mapping) or not card.get("id"):
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, "Trello card creation answered no card.")
        return self.get_task(ExternalTaskRef(str(card["id"]), card.get("shortLink")))

    def set_backlink(self, ref: ExternalTaskRef, paperclip_url: str) -> None:
        """A link attachment named ``Paperclip`` (added only when the card has none with this URL: Trello
        would keep duplicates)."""
        card_id = self._card_id(ref)
        if paperclip_url in self._attachment_urls(card_id):
            return
        self.request("POST", f"/cards/{quote(card_id)}/attachments", body={"url": paperclip_url, "name": BACKLINK_NAME})

    def _attachment_urls(self, card_id: str) -> list[str]:
        rows = self.request("GET", f"/cards/{quote(card_id)}/attachments", params={"fields": "id,name,url,isUpload"})
        if not isinstance(rows, list):
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, "Trello attachments are not a JSON array.")
        return [str(r["url"]) for r in rows[:MAX_ATTACHMENTS] if isinstance(r, Mapping) and r.get("name") == BACKLINK_NAME
                and not r.get("isUpload") and r.get("url")]

    def find_backlinks(self, ref: ExternalTaskRef) -> list[str]:
        """The URLs of the card's link attachments named ``Paperclip``, in Trello's order."""
        return self._attachment_urls(self._card_id(ref))
