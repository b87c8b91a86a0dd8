"""Asana task source adapter (External Task Protocol layer 1, Appendix A.3).

``base_url`` is the API root (``https://app.asana.com/api/1.0``, or the sandbox
:mod:`connectors.sandbox.asana`); ``credentials`` a personal access token (``Authorization: Bearer``).
Containers are Asana *project* gids. ``service_account_id`` is the token's user gid (echo suppression).

Modules: :mod:`.client` (HTTP, pagination, errors), :mod:`.normalize` (tasks, comment stories),
:mod:`.states` (the state mapping: sections per project + completion), :mod:`.webhook` (handshake,
signature, the events of a delivery).

Listing and cursors
-------------------
``list_candidate_tasks`` reads ``GET /tasks?project=<gid>&modified_since=<since>&limit=N&offset=...`` with
``opt_fields``. The cursor is the shared keyset shape (compact JSON)::

    {"v": 1, "scope": "<project gid>", "since": "<ISO ms>"|null, "seen": [gids at exactly since],
     "hw": ..., "hwSeen": [...], "offset": "<Asana next_page.offset>"   # mid-pass only}

``since`` stays fixed while ``offset`` walks a pass; when ``next_page`` is null ``since``/``seen`` move to
the highest ``modified_at`` listed. An expired or foreign offset (Asana: 400 about the offset) is
``cursor_invalid``. ``list_comments`` pages ``GET /tasks/{gid}/stories`` the same way (scope = task gid;
stories have no modification time, so the cursor follows ``created_at`` and edits are found by the
engine's full-thread reconcile).

Writes
------
``post_comment``: ``POST /tasks/{gid}/stories {"text"}`` (plain text: the engine's effect marker stays
visible as its last line). ``update_task_state``: a section name -> ``POST /sections/{gid}/addTask`` in the
task's configured project (un-completing a completed task first); ``Completed`` -> ``completed: true``.
``set_fields``: ``title`` -> ``name``, ``description`` -> ``notes``, ``dueAt`` -> ``due_on``, ``state``.
``set_backlink``: a comment story ``Tracked in Paperclip: <url>`` with the marker
``<!-- paperclip:backlink -->`` (Asana has no writable external link for a personal token);
``find_backlinks`` reads those stories back (only the connector's own when ``service_account_id`` is set).

Webhooks
--------
``register_webhook``: ``POST /webhooks {"data": {"resource": <project>, "target": <callback>, "filters"}}``;
Asana performs the ``X-Hook-Secret`` handshake against the callback *during* that request (the engine
answers and stores the secret for the ``?scope=``). ``check_webhook``: ``GET /webhooks/{gid}`` (``active``,
``last_failure_at``, ``last_failure_content``; 404 -> inactive). See :mod:`.webhook` for deliveries.

Limits: Asana answers 429 with ``Retry-After`` (seconds) -> ``provider_rate_limited`` with ``retry_after``.
"""
from __future__ import annotations

import re
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
    required_title,
)
from ..http import parse_utc as utc
from . import normalize, states, webhook
from .client import PAGE_SIZE, AsanaHttp

BACKLINK_MARKER = "<!-- paperclip:backlink -->"
BACKLINK_PREFIX = "Tracked in Paperclip: "
_BACKLINK_RE = re.compile(r"^Tracked in Paperclip: (\S+)\s*$", re.M)
MAX_STORY_PAGES = 20  # a task with thousands of stories is read this far for backlinks
WEBHOOK_FILTERS = ({"resource_type": "task"}, {"resource_type": "story", "resource_subtype": "comment_added"})
# custom_field: Asana tasks carry custom fields (read back with every task), so custom_field rules can match.
ROUTING_KINDS = frozenset({"default_route", "label", "state_lane", "comment_command", "user_mapping", "custom_field"})


@register
class AsanaAdapter(AsanaHttp, TaskSourceAdapter):
    provider_key = "asana"
    display_name = "Asana"
    default_base_url = "https://app.asana.com/api/1.0"
    delivery_id_header = ""  # Asana sends none: every event is keyed by its content hash
    capabilities = Capabilities(
        operations=ALL_OPERATIONS | {"register_webhook", "check_webhook"},
        state_categories=frozenset(StateCategory.ALL),
        signed_webhooks=True,
        routing_rule_kinds=ROUTING_KINDS,
        has_external_keys=False,  # tasks have gids only
        settable_fields=frozenset({"title", "description"}),
    )
    setup_help = {
        "containers": "Asana project gids (the number in the project URL, app.asana.com/0/<gid>/...).",
        "baseUrl": "The API root, https://app.asana.com/api/1.0 (leave empty for it).",
        "credentials": "A personal access token (or a service account token) of the user Paperclip writes as.",
        "webhookSecret": "Leave empty: Asana hands the signing secret over in the X-Hook-Secret handshake, "
                         "which Paperclip answers and stores per project when it registers the webhooks.",
        "stateMapping": "Sections per project plus completion: {\"sections\": {<section name>: category}, "
                        "\"completed\": category, \"projects\": {<project gid>: {\"sections\": {...}}}}. Without "
                        "one, a completed task is terminal and every section is backlog. When a section is mapped "
                        "terminal too, set config.outboundStates.terminal to \"Completed\" (or the section) to say "
                        "which one Paperclip's closure uses.",
        "serviceAccountId": "The user gid of the token's owner (GET /users/me): its own changes are echoes.",
        "config": "No provider settings are required; outboundStates ({category: section name or \"Completed\"}) "
                  "names the state each Paperclip status moves the task to when several are mapped.",
        "webhooks": "Run connector_register_webhooks (or the console's Register button): one webhook per project, "
                    "created through Asana's API; polling by modified_since is the backstop.",
        "stateMappingExample": '{"sections": {"In Progress": "active", "Review": "review", "Waiting": "blocked"}, '
                               '"completed": "terminal"}',
    }

    def __init__(self, config: AdapterConfig, *, client: httpx.Client | None = None, page_size: int = PAGE_SIZE):
        super().__init__(config)
        self.base_url = (config.base_url or self.default_base_url).rstrip("/")
        self.page_size = max(1, min(100, int(page_size)))
        self.containers = tuple(str(c).strip() for c in config.containers if str(c).strip())
        self.mapping = states.AsanaMapping(config.state_mapping)
        self._init_client(client)

    # --- helpers ---------------------------------------------------------------------------------
    def _scope(self, scope: str) -> str:
        value = str(scope or "").strip()
        if value not in self.containers:
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, f"Asana project {scope!r} is not one of this "
                                                                "connector's containers.")
        return value

    @staticmethod
    def _gid(ref: ExternalTaskRef) -> str:
        value = str(ref.external_id or "").strip()
        if not value:
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, "Asana task refs need an external_id (the task gid).")
        return value

    def normalize_task(self, raw: Mapping[str, Any], prefer: str | None = None) -> ExternalTask:
        return normalize.task(raw, mapping=self.mapping, containers=self.containers,
                              service_account_id=self.config.service_account_id,
                              wanted_fields=tuple(self.config.custom_fields), prefer=prefer)

    def _raw_task(self, gid: str, fields: str = normalize.TASK_FIELDS) -> dict:
        raw = self.data("GET", f"/tasks/{gid}", params={"opt_fields": fields})
        if not isinstance(raw, Mapping):
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, f"Asana task {gid} is not an object.")
        return dict(raw)

    def _member(self, raw: Mapping[str, Any]) -> dict:
        member = normalize.container_of(raw, self.containers)
        if member is None:
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD,
                                f"Asana task {raw.get('gid')} is in none of this connector's projects.")
        return member

    def _pages(self, path: str, params: dict, max_pages: int):
        offset = None
        for _ in range(max_pages):
            payload = self.call("GET", path, params={**params, "limit": self.page_size, "offset": offset})
            yield self.rows(payload, path)
            offset = self.next_offset(payload)
            if offset is None:
                return

    def sections(self, project: str) -> list[dict]:
        """The project's sections in board order ``[{gid, name}]``."""
        out = []
        for rows in self._pages(f"/projects/{project}/sections", {"opt_fields": "gid,name"}, 50):
            out.extend({"gid": str(r.get("gid")), "name": str(r.get("name") or "")} for r in rows
                       if isinstance(r, Mapping) and r.get("gid"))
        return out

    # --- cursors ---------------------------------------------------------------------------------
    @staticmethod
    def _decode(cursor: str | None, scope: str) -> dict:
        return decode_cursor(cursor, scope, "offset", provider="Asana", page_types=(str,),
                             page_error="Asana cursor 'offset' is not a string.")

    # --- §5.1 required ---------------------------------------------------------------------------
    def list_candidate_tasks(self, scope: str, cursor: str | None) -> Page:
        project = self._scope(scope)
        state = self._decode(cursor, project)
        payload = self.call("GET", "/tasks", params={
            "project": project, "modified_since": state["since"], "limit": self.page_size, "offset": state["offset"],
            "opt_fields": normalize.TASK_FIELDS})
        rows = [r for r in self.rows(payload, "task") if isinstance(r, Mapping)]
        keyed = [(str(r.get("gid")), utc(r.get("modified_at")), r) for r in rows]
        fresh, new_state, advanced = advance_cursor(state, keyed, self.next_offset(payload), "offset")
        tasks, skipped = normalize_each(lambda r: self.normalize_task(r, prefer=project), fresh, "Asana task in listing",
                                        key_of=lambda r: r.get("gid"))
        return Page(items=tasks, cursor=encode_cursor(project, new_state, "offset") if advanced else None,
                    skipped=skipped)

    def get_task(self, ref: ExternalTaskRef) -> ExternalTask:
        raw = self._raw_task(self._gid(ref))
        try:
            task = self.normalize_task(raw)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, f"Malformed Asana task: {exc!r}") from exc
        if task.container_id is None:  # removed from every configured project: gone for this connector
            raise ProviderError(ErrorCategory.PROVIDER_STATUS, f"Asana task {task.external_id} is in none of this "
                                                               "connector's projects.", status=404)
        return task

    def get_task_states(self, refs: list[ExternalTaskRef]) -> dict[str, ExternalState | None]:
        """One read per task (Asana has no batch read); ``None`` for a deleted task or one that left every
        configured project."""
        out: dict[str, ExternalState | None] = {}
        for gid in dict.fromkeys(self._gid(ref) for ref in refs):
            try:
                raw = self._raw_task(gid, normalize.STATE_FIELDS)
            except ProviderError as exc:
                if exc.status == 404:
                    out[gid] = None
                    continue
                raise
            member = normalize.container_of(raw, self.containers)
            if member is None:
                out[gid] = None
                continue
            name, category, _ = self.mapping.state(completed=bool(raw.get("completed")), section=member["sectionName"],
                                                   project=member["project"])
            out[gid] = ExternalState(name, category)
        return out

    def list_comments(self, ref: ExternalTaskRef, cursor: str | None) -> Page:
        gid = self._gid(ref)
        state = self._decode(cursor, gid)
        payload = self.call("GET", f"/tasks/{gid}/stories", params={
            "limit": self.page_size, "offset": state["offset"], "opt_fields": normalize.STORY_FIELDS})
        rows = [r for r in self.rows(payload, "story") if isinstance(r, Mapping)]
        keyed = [(str(r.get("gid")), utc(r.get("created_at")), r) for r in rows]
        fresh, new_state, advanced = advance_cursor(state, keyed, self.next_offset(payload), "offset", drop_older=True)
        sa = self.config.service_account_id
        comments, skipped = normalize_each(lambda r: normalize.comment(r, gid, service_account_id=sa),
                                           [r for r in fresh if normalize.is_comment(r)], "Asana comment story")
        return Page(items=comments, cursor=encode_cursor(gid, new_state, "offset") if advanced else None,
                    skipped=skipped)

    def webhook_handshake(self, request: WebhookRequest) -> HandshakeReply | None:
        return webhook.handshake(request)

    def verify_webhook(self, request: WebhookRequest) -> VerifiedEvent:
        return webhook.verify(request, secret=self.config.webhook_secret, containers=self.containers,
                              service_account_id=self.config.service_account_id)

    def validate_state_mapping(self, mapping: Mapping[str, Any]) -> dict[str, list[str]]:
        return states.validate(mapping)

    # --- webhook registration (§13.2) ------------------------------------------------------------------
    def register_webhook(self, scope: str, callback_url: str) -> WebhookRegistration:
        project = self._scope(scope)
        data = self.data("POST", "/webhooks", data={"resource": project, "target": callback_url,
                                                    "filters": [dict(f) for f in WEBHOOK_FILTERS]})
        if not isinstance(data, Mapping) or not data.get("gid"):
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, "Asana POST /webhooks answered without a webhook gid.")
        # Asana answers 201 only after the handshake was acknowledged: the webhook is established.
        return WebhookRegistration(scope=project, external_id=str(data["gid"]),
                                   callback_url=str(data.get("target") or callback_url), active=True,
                                   detail="created; X-Hook-Secret handshake completed")

    def check_webhook(self, registration: WebhookRegistration) -> WebhookRegistration:
        try:
            data = self.data("GET", f"/webhooks/{registration.external_id}",
                             params={"opt_fields": "gid,active,target,resource,last_failure_at,last_failure_content,"
                                                   "last_success_at"})
        except ProviderError as exc:
            if exc.status == 404:
                return WebhookRegistration(registration.scope, registration.external_id, registration.callback_url,
                                           active=False, detail="the webhook no longer exists in Asana")
            raise
        data = data if isinstance(data, Mapping) else {}
        active = bool(data.get("active"))
        target = str(data.get("target") or registration.callback_url)
        detail = "active" if active else "inactive in Asana"
        if data.get("last_failure_at"):
            detail += f"; last failure {data['last_failure_at']}: {str(data.get('last_failure_content') or '')[:200]}"
        if target != registration.callback_url:
            active, detail = False, f"the webhook calls {target}, not {registration.callback_url}"
        return WebhookRegistration(registration.scope, registration.external_id, target, active=active, detail=detail)

    # --- setup validation --------------------------------------------------------------------------------
    def workflow_metadata(self, scope: str) -> dict:
        """The project's sections (board order) with their configured category, plus ``Completed``."""
        project = self._scope(scope)
        listed = []
        for section in self.sections(project):
            name, category, mapped = self.mapping.state(completed=False, section=section["name"], project=project)
            listed.append({"gid": section["gid"], "name": name, "category": category, "mapped": mapped,
                           "type": "section"})
        listed.append({"gid": None, "name": states.COMPLETED_STATE, "category": self.mapping.completed, "mapped": True,
                       "type": "completed"})
        return {"containerKind": "project", "keys": [project], "nameSections": ["sections"],
                "overrideSection": "projects", "states": listed}

    # --- §5.2 optional writes ----------------------------------------------------------------------------
    def _set_completed(self, gid: str, value: bool) -> None:
        self.data("PUT", f"/tasks/{gid}", data={"completed": value}, params={"opt_fields": "gid,completed"})

    def _move(self, raw: Mapping[str, Any], target_state_name: str) -> None:
        gid = str(raw["gid"])
        target = normalize_state_name(target_state_name)
        if target == normalize_state_name(states.COMPLETED_STATE):
            if not raw.get("completed"):
                self._set_completed(gid, True)
            return
        member = self._member(raw)
        sections = self.sections(member["project"])
        section = next((s for s in sections if normalize_state_name(s["name"]) == target), None)
        if section is None:
            names = ", ".join(s["name"] for s in sections) or "none"
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, f"Asana project {member['project']} has no section "
                                                                f"{target_state_name!r} ({names}).")
        if raw.get("completed"):
            self._set_completed(gid, False)  # a section state is an open task
        if member["section"] != section["gid"]:
            self.data("POST", f"/sections/{section['gid']}/addTask", data={"task": gid})

    def update_task_state(self, ref: ExternalTaskRef, target_state_name: str) -> None:
        self._move(self._raw_task(self._gid(ref), normalize.STATE_FIELDS), target_state_name)

    def state_for_category(self, ref: ExternalTaskRef, category: str) -> str | None:
        """``Completed`` when completion maps to ``category``; else the first section of the task's project
        (board order) mapped to it."""
        if category == self.mapping.completed:
            return states.COMPLETED_STATE
        member = self._member(self._raw_task(self._gid(ref), normalize.STATE_FIELDS))
        for section in self.sections(member["project"]):
            if self.mapping.section_category(section["name"], member["project"]) == category:
                return section["name"]
        return None

    def post_comment(self, ref: ExternalTaskRef, body: str) -> str:
        story = self.data("POST", f"/tasks/{self._gid(ref)}/stories", data={"text": body},
                          params={"opt_fields": "gid"})
        if not isinstance(story, Mapping) or not story.get("gid"):
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, "Asana answered a new comment without its gid.")
        return str(story["gid"])

    def _fields(self, fields: Mapping[str, Any]) -> tuple[dict, str | None]:
        out: dict[str, Any] = {}
        state = None
        for key, value in fields.items():
            if key in ("title", "name"):
                out["name"] = value
            elif key in ("description", "body", "notes"):
                out["notes"] = value or ""
            elif key in ("dueAt", "due_at", "dueDate", "due"):
                out["due_on"] = due_date(value)
            elif key == "state":
                state = value
            else:
                raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD,
                                    f"Asana set_fields supports title, description, dueAt, state; not {key!r}.")
        return out, state

    def set_fields(self, ref: ExternalTaskRef, fields: Mapping[str, Any]) -> None:
        gid = self._gid(ref)
        data, state = self._fields(fields)
        if data:
            self.data("PUT", f"/tasks/{gid}", data=data, params={"opt_fields": "gid"})
        if state:
            self.update_task_state(ref, state)

    def create_task(self, scope: str, projection: Mapping[str, Any]) -> ExternalTask:
        project = self._scope(scope)
        title = required_title(projection)
        data, state = self._fields({k: v for k, v in projection.items() if k in ("description", "dueAt", "state")
                                    and v not in (None, "")})
        raw = self.data("POST", "/tasks", data={"name": title, "projects": [project], **data},
                        params={"opt_fields": normalize.TASK_FIELDS})
        if not isinstance(raw, Mapping) or not raw.get("gid"):
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, "Asana answered a new task without its gid.")
        if state:
            self._move(raw, state)
            raw = self._raw_task(str(raw["gid"]))
        return self.normalize_task(raw, prefer=project)

    def _comment_stories(self, gid: str):
        for rows in self._pages(f"/tasks/{gid}/stories", {"opt_fields": normalize.STORY_FIELDS}, MAX_STORY_PAGES):
            yield from (r for r in rows if isinstance(r, Mapping) and normalize.is_comment(r))

    def find_backlinks(self, ref: ExternalTaskRef) -> list[str]:
        """The URLs of the task's backlink comments (``Tracked in Paperclip: <url>`` + the marker), the
        connector's own only when ``service_account_id`` is configured."""
        service = (self.config.service_account_id or "").strip()
        found = []
        for story in self._comment_stories(self._gid(ref)):
            text = str(story.get("text") or "")
            author = str((story.get("created_by") or {}).get("gid") or "") if isinstance(story.get("created_by"),
                                                                                          Mapping) else ""
            if BACKLINK_MARKER not in text or (service and author != service):
                continue
            match = _BACKLINK_RE.search(text)
            if match and match.group(1) not in found:
                found.append(match.group(1))
        return found

    def set_backlink(self, ref: ExternalTaskRef, paperclip_url: str) -> None:
        """A marked comment story, once per URL (a retry finds the one it wrote)."""
        if paperclip_url in self.find_backlinks(ref):
            return
        self.post_comment(ref, f"{BACKLINK_PREFIX}{paperclip_url}\n\n{BACKLINK_MARKER}")
