"""Jira Cloud task source adapter (External Task Protocol layer 1, Appendix A.2). REST API v3.

``base_url`` is the site root (``https://<site>.atlassian.net`` or the sandbox
:mod:`connectors.sandbox.jira`). ``credentials`` is ``"email:api_token"`` (HTTP basic, Jira Cloud API
tokens) or an OAuth 2.0 access token (anything without ``:``, sent as ``Bearer``). Containers are
project keys (``"ABC"``), compared case-insensitively.

Identifiers
-----------
``external_id`` is the issue id (numeric string, stable across moves); ``external_key`` the key
(``"ABC-1"``); ``container_id`` the project key. Lookups and writes address the issue by *key*
(``ref.external_key``), falling back to the id when a ref carries no key (Jira accepts either).

Normalization
-------------
``description`` / comment bodies are ADF and become Markdown through :mod:`connectors.providers.adf`;
node types that did not convert losslessly are listed in ``envelope["lossy"]`` and the raw ADF is kept
in ``envelope["descriptionAdf"]`` (§5.3). Older webhook generations carry wiki-markup strings: they are
unescaped best-effort (``envelope["descriptionFormat"] = "wiki"``, marked lossy). Mentions become the
plain display name. Labels lowercased; ``duedate`` -> ``due_at`` (00:00 UTC); ``revision`` = ``updated``.
``blocked_by`` comes from ``issuelinks`` of type *Blocks* (inward, "is blocked by").
Custom fields are read by id (``customfield_10010``): the ids the instance's ``custom_field`` routing rules
name (``AdapterConfig.custom_fields``) are requested with every read and kept as
``envelope["customFields"] = {id: text | [texts]}`` (select options by their value, users by display name,
ADF paragraphs as plain text; see :mod:`connectors.providers.custom_fields`). Webhooks carry every field;
only those ids are kept, so both channels give the same map.

State and priority mapping (configuration, not code)
----------------------------------------------------
``AdapterConfig.state_mapping``::

    {
      "statuses":   {"In Review": "review", "Blocked": "blocked"},          # by status NAME (trim+lowercase)
      "categories": {"new": "backlog", "indeterminate": "active", "done": "terminal"},  # statusCategory key (defaults)
      "projects":   {"ABC": {"statuses": {...}, "categories": {...}}},      # optional per-project overrides
      "priorities": {"Highest": 0, "High": 1, "Medium": 2, "Low": 3, "Lowest": 4},     # defaults (+ Blocker 0,
                                                                            #  Critical 1, Major 2, Minor 3, Trivial 4)
      "issueType":  "Task"                                                  # for create_task (default Task)
    }

Lookup: project ``statuses`` -> ``statuses`` (default ``{"in review": "review", "blocked": "blocked"}``) ->
project ``categories`` -> ``categories`` (defaults above). A status with no match (e.g. a payload without
``statusCategory``) is ``backlog`` with ``envelope["unmappedState"]`` (§7.2). Unknown priority names give
``priority=None`` with the raw name in the envelope. :meth:`JiraAdapter.workflow_statuses` reads the
project's live statuses (``GET /rest/api/3/project/{key}/statuses``) so setup can validate the mapping.

Cursors
-------
``list_candidate_tasks`` posts ``/rest/api/3/search/jql`` with
``project = "ABC" [AND updated >= "yyyy/MM/dd HH:mm"] ORDER BY updated ASC, id ASC`` and walks
``nextPageToken`` (absent on the last page). JQL dates have minute precision and are read in the
API user's time zone (fetched once from ``GET /rest/api/3/myself``), so the query bound is the floor of
the high-water mark in that zone and rows at or before the mark are filtered client-side. Cursor JSON::

    {"v": 1, "scope": "ABC", "since": "<ISO ms>"|null, "seen": [ids updated exactly at since],
     "hw": ..., "hwSeen": [...], "next": "<nextPageToken>"}   # hw/hwSeen/next only mid-pass

``list_comments`` pages ``GET /issue/{key}/comment?startAt=&orderBy=created&expand=properties`` (Jira has no
"updated since" filter for comments, so each pass reads the thread and returns comments updated after
the mark); its cursor has ``startAt`` instead of ``next``. A malformed cursor, or a page token Jira
rejects (400), raises ``ProviderError(CURSOR_INVALID)``.

Webhooks
--------
When the instance has a webhook secret, ``X-Hub-Signature: sha256=<hex HMAC-SHA256>`` is required and
compared in constant time before parsing. Without a secret the delivery is accepted as an *untrusted
hint* (``trusted_content=False``: the engine applies only what it reads back through this adapter's
``get_task`` / ``list_comments``, never the delivered body). ``event_id`` is
``X-Atlassian-Webhook-Identifier`` (stable across retries), else ``sha256:<content hash>``.
``jira:issue_created``/``jira:issue_updated`` -> TASK_UPSERTED, ``jira:issue_deleted`` -> TASK_DELETED,
``comment_created``/``comment_updated`` -> COMMENT_UPSERTED, ``comment_deleted`` -> COMMENT_DELETED,
anything else IGNORED. A ``jira:issue_updated`` whose ``issue_event_type_name`` is ``issue_commented`` /
``issue_comment_edited`` / ``issue_comment_deleted`` also carries ``comment``: the event carries a second one
(``VerifiedEvent.carried``, ``event_id`` ``<delivery>:comment:<comment id>``) so the task update and the
comment both apply. A project that is not a container is rejected (``provider_payload``).
Late / repeated deliveries are fine: ids are stable, and ``occurred_at`` is the payload ``timestamp``.

Writes
------
``post_comment`` converts Markdown to ADF; hidden ``<!-- paperclip:... -->`` markers (not representable
in ADF) are stored as the comment property ``paperclip`` (``{"markers": [...]}``) and restored by
``list_comments`` as trailing ``<!-- ... -->`` lines. ``update_task_state`` resolves the transition whose
target status (or transition name) matches at apply time. ``set_backlink`` is a remote issue link with
``globalId`` ``paperclip:backlink`` (Jira updates the link with the same globalId: idempotent).

Errors (§5.4): 401/403 -> ``provider_auth``; 429 -> ``provider_rate_limited`` with ``Retry-After``
(default 60); other non-2xx -> ``provider_status``; transport -> ``provider_request``; bad JSON ->
``provider_payload``.
"""
from __future__ import annotations

import base64
import re
from datetime import datetime, timezone
from typing import Any, Mapping
from urllib.parse import quote
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import httpx

from . import adf
from .base import (
    AdapterConfig,
    Capabilities,
    ErrorCategory,
    EventKind,
    ExternalActor,
    ExternalComment,
    ExternalState,
    ExternalTask,
    ExternalTaskRef,
    Page,
    ProviderError,
    StateCategory,
    TaskSourceAdapter,
    VerifiedEvent,
    WebhookRejected,
    WebhookRequest,
    WebhookUnparseable,
    normalize_labels,
    normalize_state_name,
    register,
    web_url,
)
from .custom_fields import custom_fields as routed_custom_fields
from .http import (
    ALL_OPERATIONS,
    HttpClientMixin,
    advance_cursor,
    check_categories,
    check_overrides,
    decode_cursor,
    due_date,
    encode_cursor,
    lower_headers,
    mapped_state,
    norm_names,
    normalize_each,
    parse_due,
    parse_utc,
    required_title,
    retry_after,
    signature_matches,
    skipped_record,
    status_error,
    webhook_event_id,
    webhook_json,
)
from .http import json_body as _json_body
from .mentions import neutralize_mentions

USER_AGENT = "paperclip-connector-jira/1.0"
# ``jira:issue_updated`` deliveries whose ``issue_event_type_name`` says a comment rides along.
COMMENT_CARRYING_TYPES = {"issue_commented": EventKind.COMMENT_UPSERTED,
                          "issue_comment_edited": EventKind.COMMENT_UPSERTED,
                          "issue_comment_deleted": EventKind.COMMENT_DELETED}
API = "/rest/api/3"
PAGE_SIZE = 50
BATCH = 100
SKIP_PAGES = 20
FIELDS = ["summary", "description", "status", "priority", "labels", "assignee", "reporter", "duedate", "created",
          "updated", "project", "issuetype", "parent", "components", "issuelinks"]
DEFAULT_CATEGORIES = {"new": "backlog", "indeterminate": "active", "done": "terminal"}
DEFAULT_STATUSES = {"in review": "review", "blocked": "blocked"}
# Which Jira status category best stands for a category when the mapping names categories only (§10.3).
CATEGORY_PREFERENCE = {"active": ("indeterminate", "new"), "terminal": ("done",), "backlog": ("new",),
                       "review": ("indeterminate",), "blocked": ("indeterminate",)}
DEFAULT_PRIORITIES = {"highest": 0, "high": 1, "medium": 2, "low": 3, "lowest": 4,
                      "blocker": 0, "critical": 1, "major": 2, "minor": 3, "trivial": 4}
BACKLINK_GLOBAL_ID = "paperclip:backlink"
MARKER_PROPERTY = "paperclip"
ALL_ROUTING_KINDS = frozenset({"default_route", "custom_field", "label", "state_lane", "comment_command", "user_mapping"})
_SIG_RE = re.compile(r"^sha256=([0-9a-fA-F]{64})$")
_WIKI_MENTION_RE = re.compile(r"\[~(?:accountid:)?([^\]]+)\]")
_WIKI_ESCAPE_RE = re.compile(r"\\([!*_{}\[\]()#+\-.|~^?])")
_MISSING_RE = re.compile(r"issue with key '([^']+)' does not exist", re.I)
CUSTOM_FIELD_ID_RE = re.compile(r"^customfield_\d+$")


def _utc(value: Any) -> datetime | None:
    return parse_utc(value.strip() if isinstance(value, str) else value)  # Jira values are read trimmed


def _jql_quote(value: str) -> str:
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def wiki_to_markdown(text: str) -> str:
    """Best effort for legacy wiki-markup strings: unescape ``\\!``, mentions -> the account text."""
    text = _WIKI_MENTION_RE.sub(lambda m: m.group(1), text or "")
    return _WIKI_ESCAPE_RE.sub(lambda m: m.group(1), text)


class _Mapping:
    def __init__(self, raw: Mapping[str, Any] | None):
        raw = raw if isinstance(raw, Mapping) else {}
        self.statuses = dict(DEFAULT_STATUSES)
        self.statuses.update(norm_names(raw.get("statuses")))
        self.categories = dict(DEFAULT_CATEGORIES)
        self.categories.update(norm_names(raw.get("categories")))
        self.projects: dict[str, tuple[dict, dict]] = {}
        projects = raw.get("projects") if isinstance(raw.get("projects"), Mapping) else {}
        for key, value in projects.items():
            if isinstance(value, Mapping):
                self.projects[normalize_state_name(key)] = (norm_names(value.get("statuses")),
                                                            norm_names(value.get("categories")))
        self.priorities = dict(DEFAULT_PRIORITIES)
        if isinstance(raw.get("priorities"), Mapping):
            self.priorities = {normalize_state_name(k): v for k, v in raw["priorities"].items()
                               if isinstance(v, int) and not isinstance(v, bool)}
        self.issue_type = str(raw.get("issueType") or "Task")

    def category(self, status: str | None, category_key: str | None, project: str | None) -> str | None:
        name, cat = normalize_state_name(status), normalize_state_name(category_key)
        override = self.projects.get(normalize_state_name(project))
        if override and name in override[0]:
            return override[0][name]
        if name in self.statuses:
            return self.statuses[name]
        if override and cat in override[1]:
            return override[1][cat]
        return self.categories.get(cat) if cat else None

    def priority_name(self, value: int | None) -> str | None:
        if value is None:
            return None
        for name, level in self.priorities.items():
            if level == int(value):
                return name.title()
        return None


@register
class JiraAdapter(HttpClientMixin, TaskSourceAdapter):
    provider_key = "jira"
    display_name = "Jira"
    setup_help = {
        "containers": "Project keys (ABC), one per line.",
        "baseUrl": "The site root, https://<site>.atlassian.net. Required.",
        "credentials": "email:api_token (an Atlassian API token, HTTP basic) or an OAuth 2.0 access token of the "
                       "account Paperclip writes as.",
        "webhookSecret": "The secret of the Jira webhook (System → WebHooks): deliveries carry X-Hub-Signature "
                         "(HMAC-SHA256 of the body).",
        "serviceAccountId": "The accountId of the token's account (GET /rest/api/3/myself): its own changes are "
                            "echoes.",
        "stateMapping": "By status name (statuses) and status category (categories: new, indeterminate, done), "
                        "with per-project overrides (projects) and priorities. Checked against each project's "
                        "live statuses: names that do not exist are errors.",
        "config": "Optional; e.g. outboundStates naming the status each category is written as.",
        "webhooks": "Create a webhook in Jira (System → WebHooks) with this URL and a secret, for issue and "
                    "comment events of these projects. Polling is the backstop.",
        "stateMappingExample": '{"statuses": {"In Review": "review", "Blocked": "blocked"}, "categories": '
                               '{"new": "backlog", "indeterminate": "active", "done": "terminal"}}',
    }
    delivery_id_header = "x-atlassian-webhook-identifier"
    capabilities = Capabilities(
        operations=ALL_OPERATIONS,
        state_categories=frozenset(StateCategory.ALL),
        signed_webhooks=True,
        routing_rule_kinds=ALL_ROUTING_KINDS,
        has_external_keys=True,
        settable_fields=frozenset({"title", "description", "priority"}),
    )

    def __init__(self, config: AdapterConfig, *, client: httpx.Client | None = None, page_size: int = PAGE_SIZE):
        super().__init__(config)
        self.base_url = (config.base_url or "").rstrip("/")
        self.page_size = max(1, min(100, int(page_size)))
        self._containers = {c.strip().lower(): c.strip() for c in config.containers}
        self._mapping = _Mapping(config.state_mapping)
        self._init_client(client)
        self._tz: timezone | ZoneInfo | None = None

    # --- HTTP ------------------------------------------------------------------------------------
    def _client_headers(self) -> dict:
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        cred = self.config.credentials
        if cred:
            if ":" in cred:
                headers["Authorization"] = "Basic " + base64.b64encode(cred.encode("utf-8")).decode("ascii")
            else:
                headers["Authorization"] = f"Bearer {cred}"
        return headers

    def _request(self, method: str, path: str, *, params=None, json_body=None, cursor_request: bool = False):
        response = self._send(method, self.base_url + API + path, f"Jira {method} {path}", params=params, json=json_body)
        if response.is_success:
            return _json_body(response, f"Jira {method} {path} returned non-JSON.")
        status = response.status_code
        try:
            err = response.json()
            messages = list(err.get("errorMessages") or []) + [f"{k}: {v}" for k, v in (err.get("errors") or {}).items()]
        except (ValueError, AttributeError):
            messages = []
        what = f"Jira {method} {path} -> {status}: {'; '.join(messages) or response.reason_phrase}"
        if cursor_request and status == 400:
            raise ProviderError(ErrorCategory.CURSOR_INVALID, what, status=status)
        limited = status == 429
        error = status_error(what, status, rate_limited=limited, retry_after=retry_after(response.headers) if limited else None)
        if error.category == ErrorCategory.PROVIDER_STATUS:  # get_task_states reads the missing ids from them
            error.messages = messages  # type: ignore[attr-defined]
        raise error

    @classmethod
    def routing_match_errors(cls, kind: str, match: Mapping[str, Any]) -> dict[str, list[str]]:
        field = match.get("field")
        if kind == "custom_field" and isinstance(field, str) and not CUSTOM_FIELD_ID_RE.match(field.strip()):
            return {"field": [f"Jira custom fields are named by id (e.g. customfield_10010), not {field!r}: "
                              f"the id is in the field's configuration URL or GET /rest/api/3/field."]}
        return {}

    # --- helpers ---------------------------------------------------------------------------------
    def _fields(self) -> list[str]:
        """The issue fields every read asks for: the normalized ones plus the custom fields routing reads."""
        return FIELDS + [f for f in self.config.custom_fields if f not in FIELDS]

    def _scope(self, scope: str) -> str:
        value = (scope or "").strip().lower()
        if value not in self._containers:
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, f"Jira project {scope!r} is not one of this connector's containers.")
        return self._containers[value]

    def _project_of(self, key: str) -> str | None:
        return self._containers.get(key.rsplit("-", 1)[0].lower()) if "-" in key else None

    def _ref_key(self, ref: ExternalTaskRef) -> str:
        key = (ref.external_key or "").strip()
        if key:
            if self._project_of(key) is None:
                raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, f"Jira issue {key} is not in one of this connector's projects.")
            return key
        if (ref.external_id or "").strip():
            return ref.external_id.strip()
        raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, "Jira task refs need an external_key or external_id.")

    def actor(self, user: Mapping[str, Any] | None) -> ExternalActor | None:
        if not isinstance(user, Mapping):
            return None
        uid = str(user.get("accountId") or user.get("key") or user.get("name") or "")
        name = str(user.get("displayName") or user.get("name") or uid)
        if not uid and not name:
            return None
        service = (self.config.service_account_id or "").strip()
        is_service = bool(service) and service in (uid, str(user.get("emailAddress") or ""), str(user.get("name") or ""))
        return ExternalActor(provider_key=self.provider_key, external_user_id=uid or name, display_name=name,
                             is_connector_service_account=is_service)

    def _state(self, status: Mapping[str, Any] | None, project: str | None) -> tuple[ExternalState, str | None]:
        status = status if isinstance(status, Mapping) else {}
        name = str(status.get("name") or "unknown")
        cat = (status.get("statusCategory") or {}).get("key") if isinstance(status.get("statusCategory"), Mapping) else None
        return mapped_state(name, self._mapping.category(name, cat, project))

    def _rich(self, value: Any) -> tuple[str | None, str, list[str]]:
        """description/body -> (Markdown, source format, lossy kinds)."""
        if value is None:
            return None, "adf", []
        if isinstance(value, str):
            return wiki_to_markdown(value), "wiki", (["wiki-markup"] if value != wiki_to_markdown(value) else [])
        text, lossy = adf.adf_to_markdown_ex(value)
        return text, "adf", lossy

    def normalize_issue(self, issue: Mapping[str, Any]) -> ExternalTask:
        fields = issue.get("fields") if isinstance(issue.get("fields"), Mapping) else {}
        key = str(issue["key"])
        project = fields.get("project") if isinstance(fields.get("project"), Mapping) else {}
        project_key = str(project.get("key") or key.rsplit("-", 1)[0])
        container = self._containers.get(project_key.lower(), project_key)
        state, unmapped = self._state(fields.get("status"), project_key)
        raw_desc = fields.get("description")
        description, fmt, lossy = self._rich(raw_desc)
        description, d_mentions = neutralize_mentions(description) if description else (description, [])
        title, t_mentions = neutralize_mentions(str(fields.get("summary") or ""))
        prio = fields.get("priority") if isinstance(fields.get("priority"), Mapping) else None
        prio_name = (prio or {}).get("name")
        priority = self._mapping.priorities.get(normalize_state_name(prio_name)) if prio_name else None
        labels = [str(lbl) for lbl in fields.get("labels") or () if lbl is not None]
        blocked_by = []
        for link in fields.get("issuelinks") or ():
            if not isinstance(link, Mapping):
                continue
            ltype = link.get("type") or {}
            other = link.get("inwardIssue")
            if isinstance(other, Mapping) and (ltype.get("name") == "Blocks" or ltype.get("inward") == "is blocked by"):
                blocked_by.append(ExternalTaskRef(str(other.get("id")), other.get("key"),
                                                  ((other.get("fields") or {}).get("status") or {}).get("name")))
        status = fields.get("status") if isinstance(fields.get("status"), Mapping) else {}
        issuetype = fields.get("issuetype") if isinstance(fields.get("issuetype"), Mapping) else {}
        parent = fields.get("parent") if isinstance(fields.get("parent"), Mapping) else None
        envelope: dict[str, Any] = {
            "key": key,
            "project": {"id": project.get("id"), "key": project_key, "name": project.get("name")},
            "issueType": {"id": issuetype.get("id"), "name": issuetype.get("name")},
            "status": {"id": status.get("id"), "name": status.get("name"),
                       "categoryKey": (status.get("statusCategory") or {}).get("key")},
            "priority": {"id": (prio or {}).get("id"), "name": prio_name} if prio else None,
            "labels": labels,
            "components": [c.get("name") for c in fields.get("components") or () if isinstance(c, Mapping)],
            "parent": {"id": parent.get("id"), "key": parent.get("key")} if parent else None,
            "reporter": ((fields.get("reporter") or {}).get("accountId") if isinstance(fields.get("reporter"), Mapping) else None),
            "descriptionFormat": fmt,
            "self": issue.get("self"),
        }
        if isinstance(raw_desc, Mapping):
            envelope["descriptionAdf"] = raw_desc
        if lossy:
            envelope["lossy"] = lossy
        if prio_name and priority is None:
            envelope["unmappedPriority"] = prio_name
        if unmapped:
            envelope["unmappedState"] = unmapped
        # The category came from the status name, the status category or a project override: tell the
        # engine, whose name-only lookup would report a category-mapped status as unmapped (§7.2).
        envelope["stateMapped"] = unmapped is None
        if self.config.custom_fields:  # §8.1 custom_field routing, by field id (Appendix A.2)
            envelope["customFields"] = routed_custom_fields(fields, tuple(self.config.custom_fields))
        mentions = list(dict.fromkeys(t_mentions + d_mentions))
        if mentions:
            envelope["mentionsNeutralized"] = mentions
        assignee = self.actor(fields.get("assignee"))
        return ExternalTask(
            provider_key=self.provider_key, external_id=str(issue["id"]), external_key=key, title=title or "",
            description=description, state=state, priority=priority, assignees=(assignee,) if assignee else (),
            labels=tuple(normalize_labels(labels)), blocked_by=tuple(blocked_by), url=web_url(f"{self._browse_base(issue)}/browse/{key}"),
            due_at=parse_due(fields.get("duedate")), created_at=_utc(fields.get("created")), updated_at=_utc(fields.get("updated")),
            revision=fields.get("updated"), container_id=container, envelope=envelope)

    def _browse_base(self, issue: Mapping[str, Any]) -> str:
        m = re.match(r"^(https?://[^/]+)", str(issue.get("self") or ""))
        return m.group(1) if m else self.base_url

    def normalize_comment(self, comment: Mapping[str, Any], external_task_id: str, *, issue_key: str | None = None,
                          issue_self: str | None = None) -> ExternalComment:
        body, fmt, lossy = self._rich(comment.get("body"))
        body, mentions = neutralize_mentions(body or "")
        markers = []
        for prop in comment.get("properties") or ():
            if isinstance(prop, Mapping) and prop.get("key") == MARKER_PROPERTY and isinstance(prop.get("value"), Mapping):
                markers = [str(m) for m in prop["value"].get("markers") or []]
        if markers:
            body = (body.rstrip("\n") + "\n\n" if body else "") + "\n".join(f"<!-- {m} -->" for m in markers)
        envelope: dict[str, Any] = {"bodyFormat": fmt, "self": comment.get("self")}
        if lossy:
            envelope["lossy"] = lossy
        if mentions:
            envelope["mentionsNeutralized"] = mentions
        if isinstance(comment.get("body"), Mapping):
            envelope["bodyAdf"] = comment["body"]
        author = self.actor(comment.get("author")) or ExternalActor(self.provider_key, "", "Jira")
        url = None
        if issue_key:
            base = re.match(r"^(https?://[^/]+)", str(comment.get("self") or issue_self or ""))
            url = f"{base.group(1) if base else self.base_url}/browse/{issue_key}?focusedCommentId={comment.get('id')}"
        return ExternalComment(
            external_comment_id=str(comment["id"]), external_task_id=external_task_id, author=author, body=body,
            url=web_url(url), created_at=_utc(comment.get("created")), updated_at=_utc(comment.get("updated")), envelope=envelope)

    # --- cursors ---------------------------------------------------------------------------------
    @staticmethod
    def _decode_cursor(cursor: str | None, scope: str, page_key: str) -> dict:
        return decode_cursor(cursor, scope, page_key, provider="Jira", page_types=(str, int),
                             page_error=f"Jira cursor {page_key!r} is invalid.")

    @staticmethod
    def _advance(state: dict, rows: list[tuple[str, datetime | None, Any]], next_page, page_key: str):
        """rows: (id, updated, raw). JQL re-lists the boundary minute, so rows before ``since`` drop too."""
        return advance_cursor(state, rows, next_page, page_key, drop_older=True)

    def _user_tz(self):
        if self._tz is None:
            me = self._request("GET", "/myself") or {}
            try:
                self._tz = ZoneInfo(str(me.get("timeZone") or "UTC"))
            except (ZoneInfoNotFoundError, ValueError):
                self._tz = timezone.utc
        return self._tz

    def _jql_since(self, since: str) -> str:
        local = _utc(since).astimezone(self._user_tz())
        return local.strftime("%Y/%m/%d %H:%M")

    # --- §5.1 required ---------------------------------------------------------------------------
    def search(self, jql: str, *, fields=None, max_results: int | None = None, next_page_token: str | None = None,
               cursor_request: bool = False) -> dict:
        body: dict[str, Any] = {"jql": jql, "fields": list(fields or self._fields()), "maxResults": max_results or self.page_size}
        if next_page_token:
            body["nextPageToken"] = next_page_token
        result = self._request("POST", "/search/jql", json_body=body, cursor_request=cursor_request and bool(next_page_token))
        if not isinstance(result, Mapping) or not isinstance(result.get("issues"), list):
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, "Jira search/jql response has no issues list.")
        return dict(result)

    def list_candidate_tasks(self, scope: str, cursor: str | None) -> Page:
        project = self._scope(scope)
        state = self._decode_cursor(cursor, project, "next")
        jql = f"project = {_jql_quote(project)}"
        if state["since"]:
            jql += f" AND updated >= {_jql_quote(self._jql_since(state['since']))}"
        jql += " ORDER BY updated ASC, id ASC"
        bad: list[dict] = []
        for _ in range(SKIP_PAGES):
            # JQL's minute precision re-lists the boundary minute: pages holding only already-listed
            # rows are skipped inside this call (bounded) instead of being handed back empty.
            result = self.search(jql, next_page_token=state["next"], cursor_request=True)
            rows = []
            for issue in result["issues"]:
                if not isinstance(issue, Mapping) or "id" not in issue:
                    bad.append(skipped_record(issue, "Jira search row without an id."))
                    continue
                fields = issue.get("fields") if isinstance(issue.get("fields"), Mapping) else {}
                rows.append((str(issue["id"]), _utc(fields.get("updated")), issue))
            next_token = result.get("nextPageToken") if not result.get("isLast") else None
            fresh, new_state, advanced = self._advance(state, rows, next_token or None, "next")
            if fresh or not next_token:
                break
            state = new_state
        # One malformed issue is reported and left out; the rest of the page and the cursor go on (§13.1.8).
        tasks, skipped = normalize_each(self.normalize_issue, fresh, "Jira issue in search",
                                        key_of=lambda row: row.get("key"))
        return Page(items=tasks, cursor=encode_cursor(project, new_state, "next") if advanced else None,
                    skipped=bad + skipped)

    def get_task(self, ref: ExternalTaskRef) -> ExternalTask:
        key = self._ref_key(ref)
        issue = self._request("GET", f"/issue/{quote(key)}", params={"fields": ",".join(self._fields())})
        if not isinstance(issue, Mapping):
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, "Jira issue response is not an object.")
        try:
            task = self.normalize_issue(issue)
        except (KeyError, TypeError, ValueError) as exc:
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, f"Malformed Jira issue: {exc!r}") from exc
        if (task.container_id or "").lower() not in self._containers:
            raise ProviderError(ErrorCategory.PROVIDER_STATUS, f"Jira issue {task.external_key} moved out of the projects.",
                                status=404)
        return task

    def get_task_states(self, refs: list[ExternalTaskRef]) -> dict[str, ExternalState | None]:
        ids = list(dict.fromkeys(str(ref.external_id).strip() for ref in refs if str(ref.external_id or "").strip()))
        bad = [i for i in ids if not i.isdigit()]
        if bad:
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, f"Jira issue ids are numeric, got {bad[:3]}.")
        out: dict[str, ExternalState | None] = {}
        for start in range(0, len(ids), BATCH):
            pending = ids[start:start + BATCH]
            for _ in range(3):  # Jira answers 400 naming ids that no longer exist: drop them and ask again
                if not pending:
                    break
                jql = f"id in ({', '.join(pending)})"
                try:
                    result = self.search(jql, fields=["status", "project"], max_results=len(pending))
                except ProviderError as exc:
                    missing = {m for msg in getattr(exc, "messages", []) for m in _MISSING_RE.findall(msg)}
                    if exc.status != 400 or not missing:
                        raise
                    for gone in missing & set(pending):
                        out[gone] = None
                    pending = [i for i in pending if i not in missing]
                    continue
                found = {str(i.get("id")): i for i in result["issues"] if isinstance(i, Mapping)}
                for issue_id in pending:
                    issue = found.get(issue_id)
                    fields = (issue or {}).get("fields") or {}
                    project = str((fields.get("project") or {}).get("key") or "")
                    if issue is None or project.lower() not in self._containers:
                        out[issue_id] = None
                    else:
                        out[issue_id] = self._state(fields.get("status"), project)[0]
                break
        return out

    def list_comments(self, ref: ExternalTaskRef, cursor: str | None) -> Page:
        key = self._ref_key(ref)
        state = self._decode_cursor(cursor, key, "startAt")
        start_at = int(state["startAt"] or 0)
        result = self._request("GET", f"/issue/{quote(key)}/comment",
                               params={"startAt": start_at, "maxResults": self.page_size, "orderBy": "created",
                                       "expand": "properties"})
        if not isinstance(result, Mapping) or not isinstance(result.get("comments"), list):
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, "Jira comment listing has no comments list.")
        comments = result["comments"]
        total = int(result.get("total") or 0)
        next_start = start_at + len(comments) if comments and start_at + len(comments) < total else None
        rows = [(str(c.get("id")), _utc(c.get("updated")), c) for c in comments if isinstance(c, Mapping)]
        fresh, new_state, advanced = self._advance(state, rows, next_start, "startAt")
        task_id = str(ref.external_id or key)
        items, skipped = normalize_each(lambda c: self.normalize_comment(c, task_id, issue_key=key), fresh,
                                        "Jira comment")
        return Page(items=items, cursor=encode_cursor(key, new_state, "startAt") if advanced else None,
                    skipped=skipped)

    def verify_webhook(self, request: WebhookRequest) -> VerifiedEvent:
        headers = lower_headers(request.headers)
        body = request.body or b""
        secret = self.config.webhook_secret
        trusted = bool(secret)
        if secret:
            signature = (headers.get("x-hub-signature") or "").strip()
            if not signature:
                raise WebhookRejected("Missing X-Hub-Signature header (this connector has a webhook secret).")
            m = _SIG_RE.match(signature)
            if not m:
                raise WebhookRejected("Malformed X-Hub-Signature header (expected 'sha256=<64 hex>').")
            if not signature_matches(secret, body, m.group(1)):
                raise WebhookRejected("X-Hub-Signature does not match the body.")
        # --- verified (or explicitly unsigned: a hint to read back); only now parse -------------
        payload = webhook_json(body, "Jira")
        event_id = webhook_event_id(headers.get("x-atlassian-webhook-identifier"), body)
        event = str(payload.get("webhookEvent") or "")
        occurred = None
        if isinstance(payload.get("timestamp"), (int, float)):
            occurred = datetime.fromtimestamp(payload["timestamp"] / 1000.0, tz=timezone.utc)
        actor = self.actor(payload.get("user"))
        retry = headers.get("x-atlassian-webhook-retry")
        action = event + (f";retry={retry}" if retry and retry != "0" else "")
        issue_events = {"jira:issue_created": EventKind.TASK_UPSERTED, "jira:issue_updated": EventKind.TASK_UPSERTED,
                        "jira:issue_deleted": EventKind.TASK_DELETED}
        comment_events = {"comment_created": EventKind.COMMENT_UPSERTED, "comment_updated": EventKind.COMMENT_UPSERTED,
                          "comment_deleted": EventKind.COMMENT_DELETED}
        if event not in issue_events and event not in comment_events:
            return VerifiedEvent(event_id=event_id, kind=EventKind.IGNORED, action=action or "unknown",
                                 external_task_id=None, occurred_at=occurred, actor=actor, trusted_content=trusted)
        issue = payload.get("issue")
        if not isinstance(issue, Mapping) or not issue.get("id") or not issue.get("key"):
            raise WebhookUnparseable(f"Jira {event} payload has no issue id/key.")
        fields = issue.get("fields") if isinstance(issue.get("fields"), Mapping) else {}
        project_key = str((fields.get("project") or {}).get("key") or str(issue["key"]).rsplit("-", 1)[0])
        container = self._containers.get(project_key.lower())
        if container is None:
            raise WebhookRejected(f"Delivery for Jira project {project_key!r}, which is not one of this connector's "
                                  "containers.", category=ErrorCategory.PROVIDER_PAYLOAD)
        task_id = str(issue["id"])
        try:
            if event in issue_events:
                task = self.normalize_issue(issue)
                carried = ()
                type_name = str(payload.get("issue_event_type_name") or "")
                if event == "jira:issue_updated" and type_name in COMMENT_CARRYING_TYPES:
                    # The update carries a comment (Jira's issue_commented / issue_comment_edited): the task
                    # update and the comment are two effects of one delivery, stored as two inbox rows.
                    raw = payload.get("comment")
                    if not isinstance(raw, Mapping) or not raw.get("id"):
                        raise KeyError("comment")
                    comment = self.normalize_comment(raw, task_id, issue_key=str(issue["key"]),
                                                     issue_self=issue.get("self"))
                    carried = (VerifiedEvent(
                        event_id=f"{event_id}:comment:{comment.external_comment_id}",
                        kind=COMMENT_CARRYING_TYPES[type_name], action=f"{action};{type_name}",
                        external_task_id=task_id, occurred_at=occurred or comment.updated_at, task=task,
                        comment=comment, actor=actor or comment.author, container_id=container,
                        trusted_content=trusted),)
                return VerifiedEvent(event_id=event_id, kind=issue_events[event], action=action, external_task_id=task_id,
                                     occurred_at=occurred or task.updated_at, task=task, actor=actor,
                                     container_id=container, trusted_content=trusted, carried=carried)
            raw = payload.get("comment")
            if not isinstance(raw, Mapping) or not raw.get("id"):
                raise KeyError("comment")
            comment = self.normalize_comment(raw, task_id, issue_key=str(issue["key"]), issue_self=issue.get("self"))
        except (KeyError, TypeError, ValueError) as exc:
            raise WebhookUnparseable(f"Jira {event} payload is missing or has a bad key: {exc}") from None
        return VerifiedEvent(event_id=event_id, kind=comment_events[event], action=action, external_task_id=task_id,
                             occurred_at=occurred or comment.updated_at, comment=comment, actor=actor or comment.author,
                             container_id=container, trusted_content=trusted)

    def validate_state_mapping(self, mapping: Mapping[str, Any]) -> dict[str, list[str]]:
        errors: dict[str, list[str]] = {}

        def add(field_name, reason):
            errors.setdefault(field_name, []).append(reason)

        def check(prefix, value, keys=None):
            check_categories(add, prefix, value, shape="name", names="names", keys=keys,
                             key_reason=f"unknown status category key; expected one of {', '.join(keys or ())}")

        if not isinstance(mapping, Mapping):
            return {"stateMapping": ["must be an object"]}
        for key, value in mapping.items():
            if key == "statuses":
                check("statuses", value)
            elif key == "categories":
                check("categories", value, tuple(DEFAULT_CATEGORIES))
            elif key == "projects":
                check_overrides(add, "projects", value, "project key", {
                    "statuses": check, "categories": lambda field, v: check(field, v, tuple(DEFAULT_CATEGORIES))})
            elif key == "priorities":
                if not isinstance(value, Mapping):
                    add("priorities", "must be an object {priority name: 0-4}")
                    continue
                for name, level in value.items():
                    if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= 4:
                        add(f"priorities.{name}", "must be an integer 0-4 (0 most urgent)")
            elif key == "issueType":
                if not isinstance(value, str) or not value.strip():
                    add("issueType", "must be a non-empty issue type name")
            else:
                add(key, "unknown key; expected statuses, categories, projects, priorities, issueType")
        return errors

    def workflow_statuses(self, scope: str) -> list[dict]:
        """Live statuses of the project (``GET /project/{key}/statuses``) with their configured category
        and ``mapped`` (False when only the unmapped-backlog fallback applies) — for setup validation."""
        project = self._scope(scope)
        result = self._request("GET", f"/project/{quote(project)}/statuses") or []
        out, seen = [], set()
        for itype in result if isinstance(result, list) else ():
            for status in (itype or {}).get("statuses") or ():
                name = status.get("name")
                if not name or name in seen:
                    continue
                seen.add(name)
                state, unmapped = self._state(status, project)
                out.append({"id": status.get("id"), "name": name,
                            "statusCategory": (status.get("statusCategory") or {}).get("key"),
                            "category": state.category, "mapped": unmapped is None})
        return out

    # --- §5.2 optional writes --------------------------------------------------------------------
    def _adf_body(self, markdown: str) -> tuple[dict, list[str]]:
        text, markers = adf.split_markers(markdown or "")
        return adf.markdown_to_adf(text), markers

    def _fields_payload(self, fields: Mapping[str, Any]) -> dict:
        out: dict[str, Any] = {}
        for key, value in fields.items():
            if key == "title":
                out["summary"] = value
            elif key in ("description", "body"):
                out["description"] = self._adf_body(value)[0] if value is not None else None
            elif key == "labels":
                out["labels"] = [str(v).replace(" ", "-") for v in value or ()]
            elif key == "priority":
                name = self._mapping.priority_name(value)
                if value is not None and name is None:
                    raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, f"No Jira priority is mapped to {value!r}.")
                out["priority"] = {"name": name} if name else None
            elif key in ("dueAt", "due_at", "duedate"):
                out["duedate"] = due_date(value)
            else:
                raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD,
                                    f"Jira set_fields supports title, description, labels, priority, dueAt; not {key!r}.")
        return out

    def create_task(self, scope: str, projection: Mapping[str, Any]) -> ExternalTask:
        project = self._scope(scope)
        title = required_title(projection)
        extra = {k: v for k, v in projection.items() if k in ("description", "labels", "priority", "dueAt")
                 and v not in (None, [], "")}
        fields = {"project": {"key": project}, "summary": title, "issuetype": {"name": self._mapping.issue_type},
                  **self._fields_payload(extra)}
        created = self._request("POST", "/issue", json_body={"fields": fields}) or {}
        ref = ExternalTaskRef(str(created.get("id")), created.get("key"))
        if projection.get("state"):
            self.update_task_state(ref, projection["state"])
        return self.get_task(ref)

    def update_task_state(self, ref: ExternalTaskRef, target_state_name: str) -> None:
        key = self._ref_key(ref)
        target = normalize_state_name(target_state_name)
        result = self._request("GET", f"/issue/{quote(key)}/transitions") or {}
        transitions = [t for t in result.get("transitions") or () if isinstance(t, Mapping)]
        chosen = next((t for t in transitions if normalize_state_name((t.get("to") or {}).get("name")) == target), None)
        chosen = chosen or next((t for t in transitions if normalize_state_name(t.get("name")) == target), None)
        if chosen is None:
            current = self._request("GET", f"/issue/{quote(key)}", params={"fields": "status"}) or {}
            if normalize_state_name(((current.get("fields") or {}).get("status") or {}).get("name")) == target:
                return  # already there
            names = ", ".join(f"{t.get('name')} -> {(t.get('to') or {}).get('name')}" for t in transitions)
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD,
                                f"Jira issue {key} has no transition to {target_state_name!r} (available: {names or 'none'}).")
        self._request("POST", f"/issue/{quote(key)}/transitions", json_body={"transition": {"id": str(chosen["id"])}})

    def state_for_category(self, ref: ExternalTaskRef, category: str) -> str | None:
        """The target status of an available transition mapped to ``category`` (transitions are the
        issue's own workflow), preferring the status category that usually means it."""
        key = self._ref_key(ref)
        project = key.split("-", 1)[0] if "-" in key else None
        result = self._request("GET", f"/issue/{quote(key)}/transitions") or {}
        candidates = []
        for index, transition in enumerate(t for t in result.get("transitions") or () if isinstance(t, Mapping)):
            target = transition.get("to") if isinstance(transition.get("to"), Mapping) else {}
            state, unmapped = self._state(target, project)
            if unmapped is None and state.category == category and target.get("name"):
                status_category = (target.get("statusCategory") or {}).get("key") \
                    if isinstance(target.get("statusCategory"), Mapping) else None
                preferred = CATEGORY_PREFERENCE.get(category, ())
                rank = preferred.index(status_category) if status_category in preferred else 99
                candidates.append((rank, index, str(target["name"])))
        return min(candidates)[2] if candidates else None

    def post_comment(self, ref: ExternalTaskRef, body: str) -> str:
        key = self._ref_key(ref)
        doc, markers = self._adf_body(body)
        payload: dict[str, Any] = {"body": doc}
        if markers:
            payload["properties"] = [{"key": MARKER_PROPERTY, "value": {"markers": markers}}]
        result = self._request("POST", f"/issue/{quote(key)}/comment", json_body=payload) or {}
        return str(result["id"])

    def set_fields(self, ref: ExternalTaskRef, fields: Mapping[str, Any]) -> None:
        payload = self._fields_payload(fields or {})
        if payload:
            self._request("PUT", f"/issue/{quote(self._ref_key(ref))}", json_body={"fields": payload})

    def set_backlink(self, ref: ExternalTaskRef, paperclip_url: str) -> None:
        key = self._ref_key(ref)
        self._request("POST", f"/issue/{quote(key)}/remotelink", json_body={
            "globalId": BACKLINK_GLOBAL_ID,
            "application": {"type": "ai.paperclip", "name": "Paperclip"},
            "relationship": "tracked in",
            "object": {"url": paperclip_url, "title": "Paperclip", "summary": "Tracked in Paperclip"}})

    def find_backlinks(self, ref: ExternalTaskRef) -> list[str]:
        """The URL of the remote link with ``globalId`` ``paperclip:backlink`` (``GET /issue/{key}/remotelink``)."""
        rows = self._request("GET", f"/issue/{quote(self._ref_key(ref))}/remotelink")
        if not isinstance(rows, list):
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, "Jira remote links are not a JSON array.")
        return [str(row["object"]["url"]) for row in rows
                if isinstance(row, Mapping) and row.get("globalId") == BACKLINK_GLOBAL_ID
                and isinstance(row.get("object"), Mapping) and row["object"].get("url")]

    # --- setup validation (TaskSourceAdapter.workflow_metadata) --------------------------------------
    def workflow_metadata(self, scope: str) -> dict:
        """The project's live statuses (:meth:`workflow_statuses`) and where the mapping names statuses."""
        return {"containerKind": "project", "keys": [self._scope(scope)], "nameSections": ["statuses"],
                "overrideSection": "projects", "states": self.workflow_statuses(scope)}
