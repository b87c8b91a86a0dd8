"""Notion task source adapter (External Task Protocol layer 1, Appendix A.4).

``base_url`` is the API root (``https://api.notion.com``, or the sandbox :mod:`connectors.sandbox.notion`);
requests go to ``<base_url>/v1/...`` with ``Authorization: Bearer <integration token>`` and
``Notion-Version: 2022-06-28`` (see :mod:`.client`). ``service_account_id`` is the integration's bot user
id (``GET /v1/users/me``): its comments and edits are the connector's own (echo suppression).

Containers
----------
Spelled as payloads spell them (dashed UUIDs), compared without dashes (:meth:`container_key`):

- a **database** id: its pages, listed with ``POST /v1/databases/{id}/query`` (filter
  ``{"timestamp": "last_edited_time", "last_edited_time": {"on_or_after": <high-water>}}``, sorted by
  ``last_edited_time`` ascending). Data-source ids (API 2025-09-03) are not containers: configure the
  database id; a webhook whose parent names the data source of a configured database still matches through
  ``data.parent.database_id`` when Notion sends it.
- a **parent page** id: its child pages (``GET /v1/blocks/{id}/children``, ``child_page`` blocks; each changed
  one read with ``GET /v1/pages/{id}``); these pages have only a title.
- the **workspace** id (``config.workspaceId``, as webhooks name it in ``workspace_id`` and ``data.parent``
  of type ``space``): the workspace's top-level pages (``POST /v1/search``, filtered to
  ``parent.type == "workspace"``; Notion's page object does not carry the workspace id, hence the option).

A task's ``container_id`` is its parent's id in the configured spelling; ``external_id`` the page id (dashed),
``external_key`` None (Notion has no keys).

Normalization
-------------
Title from the ``title`` property (plain text). Description (Markdown, best effort, see :mod:`.richtext`):
the rich text property ``config.descriptionProperty`` if set, then the page content (first 100 top-level
blocks; ``config.readContent`` false turns it off: one request less per changed page). The envelope keeps
the block references (``blocks``) and what the conversion lost (``descriptionLossy``). Assignees from a
``people`` property (``config.assigneeProperty``, default one named Assignee/Assignees/Owner), labels from a
``multi_select`` property (``config.labelsProperty``, default Tags/Labels), ``due_at`` from a ``date``
property (``config.dueProperty``, default Due/Due date). Priority is null and blockers empty (Notion has
neither natively): the raw ``Priority`` select and every relation property ride in the envelope, with the
property schema snapshot (name -> id/type) and the select/status values. Mentions of users become plain
names. ``revision`` = ``last_edited_time`` + a digest of the properties and content (Notion rounds
``last_edited_time`` to the minute, so two edits in one minute still differ).

State mapping: see :mod:`.states` (a status/select property; without one, import-only: ``backlog``, and a
page in the trash ``terminal``).

Cursors
-------
``{"v": 1, "scope", "kind": "database"|"page"|"workspace", "since", "seen", "hw", "hwSeen", "after"}``: the
pass keeps ``since`` (the ``on_or_after`` high-water mark, a minute) while ``after`` walks Notion's
``next_cursor``; when ``has_more`` is false ``since``/``seen`` move to the highest ``last_edited_time`` listed.
``seen`` holds ``<page id>@<row mark>`` of the rows listed at exactly ``since``: a page edited again within
the same minute has another mark and is listed again; one listed already is not. (A content-only edit
within the minute of the last listing is left to the ``page.content_updated`` webhook.) Parent-page and
workspace containers cannot be filtered server-side: a pass reads every child/search page and keeps the
changed ones. ``list_comments`` walks ``GET /v1/comments?block_id=`` the same way (scope = page id).

Webhooks: :mod:`.webhook` (verification token handshake, ``X-Notion-Signature``, sparse events).
Notion's API cannot create webhook subscriptions (the integration's settings do): ``register_webhook`` is
not declared; polling is the primary channel and webhooks the hint.

Writes (§5.2): ``post_comment`` (``POST /v1/comments``; Markdown -> rich text, the effect marker as a gray
tag), ``update_task_state`` (the mapped status/select property; a select option the database does not have
is refused, never created), ``set_fields`` (title), ``set_backlink`` (``config.backlinkProperty``, a ``url``
property, else one comment ``Tracked in Paperclip: <url>`` by the bot), ``create_task`` (a page in a database
or under a parent page, the description as content or ``descriptionProperty``)."""
from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from typing import Any, Mapping

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
    WebhookRequest,
    register,
)
from ..http import (
    ALL_OPERATIONS,
    advance_cursor,
    decode_cursor,
    encode_cursor,
    iso_ms,
    load_cursor,
    normalize_each,
    parse_utc,
    required_title,
)
from . import richtext, states, webhook
from .client import MAX_PAGE_SIZE, NotionClient
from .normalize import NotionNormalizer, digest
from .states import NO_PROPERTY_STATE, StateMapping, uuid_key

PAGE_SIZE = MAX_PAGE_SIZE
QUIET_PAGES = 10  # pages read in one call while they hold nothing new (then the cursor is handed back)
KINDS = ("database", "page", "workspace")
ROUTING_KINDS = frozenset({"default_route", "label", "state_lane", "comment_command", "user_mapping"})
BACKLINK_HEAD = "Tracked in Paperclip: "
_BACKLINK_RE = re.compile(r"^Tracked in Paperclip: \[(https?://[^\]\s]+)\]\((https?://[^)\s]+)\)$")


def _minute(value: datetime) -> datetime:
    return value.astimezone(timezone.utc).replace(second=0, microsecond=0)


@register
class NotionAdapter(NotionNormalizer, NotionClient, TaskSourceAdapter):
    provider_key = "notion"
    display_name = "Notion"
    default_poll_interval_seconds = 60  # polling is the primary channel (Appendix A.4); webhooks are hints
    default_base_url = "https://api.notion.com"
    capabilities = Capabilities(
        operations=ALL_OPERATIONS,  # no register_webhook: subscriptions are made in Notion's settings
        state_categories=frozenset(StateCategory.ALL),
        signed_webhooks=True,
        routing_rule_kinds=ROUTING_KINDS,  # no custom_field: routing reads named properties, not field ids
        has_external_keys=False,
        settable_fields=frozenset({"title"}),
    )
    setup_help = {
        "containers": "Database ids, parent page ids (their child pages) and/or the workspace id (top-level "
                      "pages; also set config.workspaceId), spelled as Notion shows them (dashed or not).",
        "baseUrl": "https://api.notion.com (the API root; Notion-Version 2022-06-28 is pinned).",
        "credentials": "The internal integration token (secret_... / ntn_...), sent as a Bearer token. Share "
                       "the databases and pages with the integration.",
        "webhookSecret": "Leave empty: Notion's verification request hands over the token; Paperclip stores it "
                         "and shows it once so you can paste it back into Notion.",
        "stateMapping": "The status or select property and what its options mean. Without one the database is "
                        "import-only (every page backlog) and cannot run the Symphony profile.",
        "serviceAccountId": "The integration's bot user id (GET /v1/users/me): its edits and comments are "
                            "Paperclip's own and are not imported back.",
        "config": "workspaceId, descriptionProperty (a rich text property), readContent (default true), "
                  "backlinkProperty (a URL property), assigneeProperty, labelsProperty, dueProperty.",
        "webhooks": "Create the webhook subscription in the integration's settings with this URL; Notion "
                    "sends a verification token, shown here, to paste back. Polling stays the primary channel.",
        "stateMappingExample": json.dumps({"property": "Status", "values": {
            "Not started": "backlog", "In progress": "active", "In review": "review", "Done": "terminal"}}),
    }

    def __init__(self, config: AdapterConfig, *, client: httpx.Client | None = None, page_size: int = PAGE_SIZE):
        super().__init__(config)
        self.base_url = (config.base_url or self.default_base_url).rstrip("/")
        self.page_size = max(1, min(MAX_PAGE_SIZE, int(page_size)))
        self._containers = {uuid_key(c): str(c).strip() for c in config.containers if str(c).strip()}
        self._mapping = StateMapping(config.state_mapping)
        self.options = dict(config.options or {})
        self._init_client(client)
        self._users: dict[str, str] = {}
        self._schemas: dict[str, dict] = {}

    # --- configuration -------------------------------------------------------------------------
    @classmethod
    def container_key(cls, value: str) -> str:
        return uuid_key(value)

    @property
    def workspace_id(self) -> str | None:
        value = self.options.get("workspaceId")
        return str(value).strip() if isinstance(value, str) and value.strip() else None

    @property
    def read_content(self) -> bool:
        return self.options.get("readContent", True) is not False

    def _option(self, name: str) -> str | None:
        value = self.options.get(name)
        return value.strip() if isinstance(value, str) and value.strip() else None

    def _configured(self, value: Any) -> str | None:
        return self._containers.get(uuid_key(value)) if value else None

    def _scope(self, scope: str) -> str:
        container = self._configured(scope)
        if container is None:
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, f"Notion {scope!r} is not one of this connector's containers.")
        return container

    def _is_workspace(self, container: str) -> bool:
        return bool(self.workspace_id) and uuid_key(container) == uuid_key(self.workspace_id)

    def container_of_parent(self, parent: Any) -> str | None:
        """A webhook's ``data.parent`` (``{id, type, data_source_id?, database_id?}``) -> configured container."""
        if not isinstance(parent, Mapping):
            return None
        for key in ("id", "database_id", "data_source_id"):
            found = self._configured(parent.get(key))
            if found:
                return found
        return None

    @staticmethod
    def _parent(page: Mapping[str, Any]) -> tuple[str, str | None]:
        """(parent type without the ``_id`` suffix, parent id or None for the workspace)."""
        parent = page.get("parent") if isinstance(page.get("parent"), Mapping) else {}
        kind = str(parent.get("type") or "")
        return kind.removesuffix("_id"), (str(parent.get(kind)) if kind.endswith("_id") and parent.get(kind) else None)

    def _page_container(self, page: Mapping[str, Any]) -> str | None:
        kind, pid = self._parent(page)
        if kind == "workspace":
            return self._configured(self.workspace_id) if self.workspace_id else None
        parent = page.get("parent") if isinstance(page.get("parent"), Mapping) else {}
        return self._configured(pid) or self._configured(parent.get("database_id"))

    # --- cursors ---------------------------------------------------------------------------------
    def _decode(self, cursor: str | None, scope: str) -> tuple[dict, str | None]:
        state = decode_cursor(cursor, scope, "after", provider="Notion", page_types=(str,),
                              page_error="Notion cursor 'after' is not a string.")
        kind = load_cursor(cursor, scope, "Notion").get("kind") if cursor else None
        if kind is not None and kind not in KINDS:
            raise ProviderError(ErrorCategory.CURSOR_INVALID, f"Notion cursor kind {kind!r} is unknown.")
        return state, kind

    @staticmethod
    def _encode(scope: str, state: dict, kind: str | None) -> str:
        data = json.loads(encode_cursor(scope, state, "after"))
        if kind:
            data["kind"] = kind
        return json.dumps(data, separators=(",", ":"))

    def since_cursor(self, scope: str, since: datetime) -> str | None:
        """From the minute of ``since`` (Notion's ``last_edited_time`` has minute precision)."""
        return json.dumps({"v": 1, "scope": self._scope(scope), "since": iso_ms(_minute(since)), "seen": []},
                          separators=(",", ":"))

    # --- §5.1 required ---------------------------------------------------------------------------
    def list_candidate_tasks(self, scope: str, cursor: str | None) -> Page:
        container = self._scope(scope)
        state, kind = self._decode(cursor, container)
        resumed = state["after"] is not None  # a pass under way (its cursor was stored mid-pass)
        if kind is None and self._is_workspace(container):
            kind = "workspace"
        for _ in range(QUIET_PAGES):
            rows, nxt, kind = self._rows(container, state, kind)
            keyed = [(f"{r.get('id')}@{self.row_mark(r)}", parse_utc(r.get("last_edited_time")), r) for r in rows]
            fresh, state, _ = advance_cursor(state, keyed, nxt, "after", drop_older=kind != "database")
            if fresh or nxt is None:
                break
            # Nothing new on this page (the high-water minute is re-listed: on_or_after, minute precision):
            # read on instead of handing back an empty page whose cursor the caller would store mid-pass.
        if kind == "page":
            fresh = [p for p in (self._child_page(b) for b in fresh) if p is not None]
        tasks, skipped = normalize_each(self._full, fresh, "Notion page in listing")
        # a pass that ended here after a stored mid-pass cursor hands back its end state, so it is stored too
        advanced = bool(fresh) or nxt is not None or resumed
        return Page(items=tasks, cursor=self._encode(container, state, kind) if advanced else None, skipped=skipped)

    def _rows(self, container: str, state: dict, kind: str | None) -> tuple[list, str | None, str]:
        """One page of candidate rows of the container -> (rows, Notion's next cursor, container kind)."""
        if kind in (None, "database"):
            try:
                rows, nxt = self._query(container, state)
                return rows, nxt, "database"
            except ProviderError as exc:
                # a page id queried as a database: 400 validation_error ("is a page, not a database") or 404
                if kind == "database" or exc.category != ErrorCategory.PROVIDER_STATUS or exc.status not in (400, 404):
                    raise
                kind = "page"
        if kind == "page":
            data = self.api("GET", f"/blocks/{container}/children", params={"page_size": self.page_size,
                                                                          "start_cursor": state["after"]})
            blocks, nxt = self.results(data, "Notion child pages")
            return [b for b in blocks if b.get("type") == "child_page"], nxt, kind
        data = self.api("POST", "/search", body={
            "filter": {"property": "object", "value": "page"}, "page_size": self.page_size,
            "sort": {"timestamp": "last_edited_time", "direction": "ascending"},
            **({"start_cursor": state["after"]} if state["after"] else {})})
        found, nxt = self.results(data, "Notion workspace search")
        return [p for p in found if self._parent(p)[0] == "workspace"], nxt, "workspace"

    def _query(self, container: str, state: dict) -> tuple[list, str | None]:
        body: dict[str, Any] = {"page_size": self.page_size,
                                "sorts": [{"timestamp": "last_edited_time", "direction": "ascending"}]}
        if state["since"]:
            body["filter"] = {"timestamp": "last_edited_time", "last_edited_time": {"on_or_after": state["since"]}}
        if state["after"]:
            body["start_cursor"] = state["after"]
        return self.results(self.api("POST", f"/databases/{container}/query", body=body), "Notion database query")

    def _child_page(self, block: Mapping[str, Any]) -> dict | None:
        try:
            return self.api("GET", f"/pages/{block['id']}")
        except ProviderError as exc:
            if exc.status == 404:
                return None  # gone between the listing and the read
            raise

    def _page_id(self, ref: ExternalTaskRef) -> str:
        value = (ref.external_id or "").strip()
        if not value:
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, "Notion task refs need an external_id (the page id).")
        return value

    def _page(self, ref: ExternalTaskRef) -> dict:
        page = self.api("GET", f"/pages/{self._page_id(ref)}")
        if self._page_container(page) is None:
            raise ProviderError(ErrorCategory.PROVIDER_STATUS, f"Notion page {ref.external_id} is not in a configured "
                                                               "container.", status=404)
        return page

    def get_task(self, ref: ExternalTaskRef) -> ExternalTask:
        page = self._page(ref)
        try:
            return self._full(page)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, f"Malformed Notion page: {exc!r}") from exc

    def get_task_states(self, refs: list[ExternalTaskRef]) -> dict[str, ExternalState | None]:
        """One page read per task (Notion has no batch read); a page in the trash, gone, or moved out of
        the containers is ``None``."""
        out: dict[str, ExternalState | None] = {}
        for ref in refs:
            page_id = self._page_id(ref)
            if page_id in out:
                continue
            try:
                page = self.api("GET", f"/pages/{page_id}")
            except ProviderError as exc:
                if exc.status == 404:
                    out[page_id] = None
                    continue
                raise
            gone = page.get("in_trash") or page.get("archived") or self._page_container(page) is None
            out[page_id] = None if gone else self._state(page)[0]
        return out

    def list_comments(self, ref: ExternalTaskRef, cursor: str | None) -> Page:
        page_id = self._page_id(ref)
        state, _ = self._decode(cursor, page_id)
        resumed = state["after"] is not None
        for _ in range(QUIET_PAGES):
            data = self.api("GET", "/comments", params={"block_id": page_id, "page_size": self.page_size,
                                                        "start_cursor": state["after"]})
            rows, nxt = self.results(data, "Notion comments")
            keyed = [(f"{r.get('id')}@{digest(r.get('rich_text'))}", parse_utc(r.get("last_edited_time")), r)
                     for r in rows]
            fresh, state, _ = advance_cursor(state, keyed, nxt, "after", drop_older=True)
            if fresh or nxt is None:
                break
        comments, skipped = normalize_each(lambda row: self.normalize_comment(row, page_id), fresh, "Notion comment")
        advanced = bool(fresh) or nxt is not None or resumed
        return Page(items=comments, cursor=self._encode(page_id, state, None) if advanced else None, skipped=skipped)

    def webhook_handshake(self, request: WebhookRequest) -> HandshakeReply | None:
        return webhook.handshake(request)

    def verify_webhook(self, request: WebhookRequest) -> VerifiedEvent:
        return webhook.verify(self, request)

    def validate_state_mapping(self, mapping: Mapping[str, Any]) -> dict[str, list[str]]:
        return states.validate(mapping)

    def run_mode_refusal(self, run_mode: str) -> str | None:
        if run_mode != "symphony_compatible":
            return None
        uncovered = [c for c in self._containers.values() if not self._mapping.for_database(c).configured]
        if uncovered:
            return (f"no status or select property is configured (stateMapping.property) for {', '.join(uncovered)}: "
                    "Notion pages there have no state that could become active, so the Symphony profile cannot run "
                    "(Appendix A.4: such databases are import-only). Configure stateMapping.property and values, or "
                    "use paperclip_controlled.")
        without_active = [c for c in self._containers.values()
                          if StateCategory.ACTIVE not in self._mapping.for_database(c).values.values()]
        if without_active:
            return (f"stateMapping.values maps no option to active for {', '.join(without_active)}: nothing would "
                    "ever request execution.")
        return None

    # --- workflow metadata ----------------------------------------------------------------------------
    def _database(self, database_id: str) -> dict:
        key = uuid_key(database_id)
        if key not in self._schemas:
            self._schemas[key] = self.api("GET", f"/databases/{database_id}")
        return self._schemas[key]

    def _container_kind(self, container: str) -> tuple[str, dict | None]:
        """("database", schema) | ("page", None) | ("workspace", None); 404 when it is neither."""
        if self._is_workspace(container):
            return "workspace", None
        try:
            return "database", self._database(container)
        except ProviderError as exc:
            if exc.category != ErrorCategory.PROVIDER_STATUS or exc.status not in (400, 404):
                raise
        self.api("GET", f"/pages/{container}")
        return "page", None

    def workflow_metadata(self, scope: str) -> dict:
        container = self._scope(scope)
        kind, schema = self._container_kind(container)
        meta: dict[str, Any] = {"containerKind": kind, "keys": [container, uuid_key(container)],
                                "nameSections": ["values"], "overrideSection": "databases", "states": []}
        if kind == "database":
            if schema.get("id"):
                meta["keys"] += [str(schema["id"]), uuid_key(schema["id"])]
            mapping = self._mapping.for_database(container)
            if not mapping.configured:
                meta["states"] = [{"name": NO_PROPERTY_STATE, "category": StateCategory.BACKLOG, "mapped": True}]
                meta["importOnly"] = True
                return meta
            name, prop = self._prop(schema.get("properties") or {}, mapping.property)
            if not name or prop.get("type") not in states.STATE_PROPERTY_TYPES:
                meta["problems"] = [f"database has no status or select property named {mapping.property!r}"]
                return meta
            for option in states.schema_options(prop):
                category = states.option_category(mapping, option)
                meta["states"].append({"name": option, "category": category or StateCategory.BACKLOG,
                                       "mapped": category is not None, "type": prop.get("type")})
        else:
            meta["states"] = [{"name": NO_PROPERTY_STATE, "category": StateCategory.BACKLOG, "mapped": True}]
            meta["importOnly"] = True
        return meta

    # --- §5.2 optional writes ----------------------------------------------------------------------
    def _state_target(self, page: Mapping[str, Any]) -> tuple[str, str, list[str], states.PropertyMapping]:
        """(property name, its type, the database's option names, mapping) for a page's state writes."""
        kind, pid = self._parent(page)
        mapping = self._mapping.for_database(pid) if kind == "database" else None
        if kind != "database" or not mapping.configured:
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, "This Notion page has no mapped status or select "
                                                                "property (import-only); its state cannot be set.")
        schema = self._database(pid)
        name, prop = self._prop(schema.get("properties") or {}, mapping.property, states.STATE_PROPERTY_TYPES)
        if not name:
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD,
                                f"Notion database {pid} has no status or select property {mapping.property!r}.")
        return name, prop["type"], states.schema_options(prop), mapping

    def update_task_state(self, ref: ExternalTaskRef, target_state_name: str) -> None:
        page = self._page(ref)
        name, kind, options, _ = self._state_target(page)
        wanted = next((o for o in options if o.strip().lower() == (target_state_name or "").strip().lower()), None)
        if wanted is None:  # a select would silently gain a new option: refuse instead
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD,
                                f"Notion property {name!r} has no option {target_state_name!r} ({', '.join(options)}).")
        self.api("PATCH", f"/pages/{page['id']}", body={"properties": {name: {kind: {"name": wanted}}}})

    def state_for_category(self, ref: ExternalTaskRef, category: str) -> str | None:
        page = self._page(ref)
        try:
            _, _, options, mapping = self._state_target(page)
        except ProviderError:
            return None
        return states.preferred(category, options, lambda n: states.option_category(mapping, n))

    def post_comment(self, ref: ExternalTaskRef, body: str) -> str:
        rich = richtext.from_markdown(body)
        if len(rich) > 100:  # Notion takes at most 100 rich text objects: the text as is, in plain chunks
            rich = richtext._text(body)[:100]
        comment = self.api("POST", "/comments", body={"parent": {"page_id": self._page_id(ref)}, "rich_text": rich})
        return str(comment["id"])

    def set_fields(self, ref: ExternalTaskRef, fields: Mapping[str, Any]) -> None:
        unknown = [k for k in fields if k != "title"]
        if unknown:
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, f"Notion set_fields supports title only; not {unknown}.")
        if not fields:
            return
        page = self._page(ref)
        title = next((k for k, v in (page.get("properties") or {}).items()
                      if isinstance(v, Mapping) and v.get("type") == "title"), "title")
        self.api("PATCH", f"/pages/{page['id']}", body={"properties": {
            title: {"title": richtext._text(str(fields["title"] or ""))}}})

    def _comments(self, page_id: str):
        for row in self.walk("GET", "/comments", params={"block_id": page_id}, what="Notion comments"):
            yield row

    def _backlink_comments(self, page_id: str) -> list[str]:
        service = (self.config.service_account_id or "").strip()
        found = []
        for row in self._comments(page_id):
            if service and str((row.get("created_by") or {}).get("id") or "") != service:
                continue  # only the bot's own comment in exactly our format is a backlink
            text, _ = richtext.to_markdown(row.get("rich_text"))
            m = _BACKLINK_RE.match(text.strip())
            if m and m.group(1) == m.group(2):
                found.append(m.group(1))
        return found

    def set_backlink(self, ref: ExternalTaskRef, paperclip_url: str) -> None:
        """A URL property (``config.backlinkProperty``), else one bot comment ``Tracked in Paperclip: <url>``
        (posted only when the page has none with this URL: Notion's API cannot edit comments)."""
        page_id = self._page_id(ref)
        prop = self._option("backlinkProperty")
        if prop:
            self.api("PATCH", f"/pages/{page_id}", body={"properties": {prop: {"url": paperclip_url}}})
            return
        if paperclip_url in self._backlink_comments(page_id):
            return
        rich = richtext._text(BACKLINK_HEAD) + richtext._text(paperclip_url, link=paperclip_url)
        self.api("POST", "/comments", body={"parent": {"page_id": page_id}, "rich_text": rich})

    def find_backlinks(self, ref: ExternalTaskRef) -> list[str]:
        prop = self._option("backlinkProperty")
        if prop:
            page = self.api("GET", f"/pages/{self._page_id(ref)}")
            _, value = self._prop(page.get("properties") or {}, prop, "url")
            return [str(value["url"])] if value and value.get("url") else []
        return self._backlink_comments(self._page_id(ref))

    def create_task(self, scope: str, projection: Mapping[str, Any]) -> ExternalTask:
        container = self._scope(scope)
        title = required_title(projection)
        kind, schema = self._container_kind(container)
        if kind == "workspace":
            raise ProviderError(ErrorCategory.CONFIG, "Notion internal integrations cannot create workspace-level pages; "
                                                      "export to a database or a parent page.")
        description = projection.get("description") or ""
        body: dict[str, Any] = {}
        if kind == "database":
            props = schema.get("properties") or {}
            title_name = next((k for k, v in props.items() if isinstance(v, Mapping) and v.get("type") == "title"), "title")
            properties: dict[str, Any] = {title_name: {"title": richtext._text(title)}}
            desc_name, _ = self._prop(props, self._option("descriptionProperty"), "rich_text")
            if desc_name and description:
                properties[desc_name] = {"rich_text": richtext.from_markdown(description)[:100]}
            elif description:
                body["children"] = richtext.markdown_blocks(description)
            mapping = self._mapping.for_database(container)
            state_name, state_prop = self._prop(props, mapping.property, states.STATE_PROPERTY_TYPES)
            wanted = projection.get("state")
            if state_name and isinstance(wanted, str) and wanted.strip():
                option = next((o for o in states.schema_options(state_prop) if o.lower() == wanted.strip().lower()), None)
                if option:
                    properties[state_name] = {state_prop["type"]: {"name": option}}
            body.update(parent={"database_id": container}, properties=properties)
        else:
            body.update(parent={"page_id": container}, properties={"title": {"title": richtext._text(title)}})
            if description:
                body["children"] = richtext.markdown_blocks(description)
        page = self.api("POST", "/pages", body=body)
        return self._full(page)
