"""Linear task source adapter (External Task Protocol layer 1, Appendix A.1).

``base_url`` is the API root (``https://api.linear.app``, or the sandbox :mod:`connectors.sandbox.linear`);
the GraphQL endpoint is ``<base_url>/graphql``. ``credentials`` is a personal API key (``lin_api_...``,
sent as ``Authorization: <key>``) or an OAuth access token (anything else, sent as ``Bearer <token>``).
Containers are Linear *teams*, spelled by key (``"ENG"``) or id (uuid); keys compare case-insensitively.

Identifiers
-----------
``external_id`` is the issue id (uuid, stable across team moves); ``external_key`` the identifier
(``"ENG-12"``); ``container_id`` the team key as configured. Lookups and writes use ``ref.external_id``.

Normalization
-------------
Priority: Linear ``0`` (no priority) -> ``None``; ``1`` urgent -> 0, ``2`` high -> 1, ``3`` medium -> 2,
``4`` low -> 3 (the raw value and ``priorityLabel`` ride in the envelope). Labels lowercased (raw
names + ids in the envelope). ``dueDate`` (a day) -> ``due_at`` at 00:00 UTC. ``branchName`` ->
``branch_name``. ``blocked_by`` from ``inverseRelations`` of type ``blocks``. Descriptions are Linear
Markdown; ``@name`` mentions are neutralized (plain name, see :func:`connectors.providers.mentions.neutralize_mentions`)
and Linear's profile-link mentions ``[@Name](https://linear.app/<org>/profiles/<user>)`` become ``Name``.

State mapping (configuration, not code)
---------------------------------------
``AdapterConfig.state_mapping``::

    {
      "types":  {"triage": "backlog", "backlog": "backlog", "unstarted": "backlog",   # by workflow state TYPE;
                 "started": "active", "completed": "terminal", "canceled": "terminal", #  these are the defaults
                 "duplicate": "terminal"},                                            #  (a partial object merges)
      "states": {"In Review": "review", "Blocked": "blocked"},  # by state NAME (trim + lowercase), wins over type
      "teams":  {"ENG": {"states": {...}, "types": {...}}}     # optional per-team overrides (key or id)
    }

Lookup order: team ``states`` -> ``states`` -> team ``types`` -> ``types`` -> defaults. An empty mapping
``{}`` therefore gives the default-by-type behaviour, plus ``"in review" -> review`` which is part of
the default ``states``. A state with no mapping (an unknown type) is category ``backlog`` and the
envelope carries ``unmappedState`` (§7.2: never guessed). ``update_task_state`` takes a *state name*
and resolves its id from the issue's team workflow states at apply time.

Cursors
-------
``list_candidate_tasks`` queries ``issues(filter: {team: ..., updatedAt: {gte: since}}, orderBy: updatedAt,
first: N, after: endCursor)``. The cursor is compact JSON::

    {"v": 1, "scope": "<team as configured>", "since": "<ISO ms>"|null, "seen": [ids at exactly since],
     "hw": "<highest updatedAt listed in this pass>", "hwSeen": [...], "after": "<endCursor>"  # mid-pass only}

During a pass ``since`` stays fixed and ``after`` walks the pages; when ``hasNextPage`` is false the pass
ends and ``since``/``seen`` advance to the high-water mark. ``gte`` + ``seen`` make the boundary exact
(no skipped ties, no endless re-listing). ``cursor=None`` is returned only when nothing new was listed
and the pass is complete. A cursor of another shape or scope, or one Linear rejects (``INVALID_INPUT`` on
``after``), raises ``ProviderError(CURSOR_INVALID)``. A page that claims ``hasNextPage`` without an
``endCursor`` is a ``provider_payload`` error. ``list_comments`` uses the same shape (scope = issue id).

Webhooks
--------
``Linear-Signature`` = hex HMAC-SHA256(secret, raw body), compared in constant time before parsing.
``webhookTimestamp`` (ms) more than ``WEBHOOK_TOLERANCE`` (60 s) from ``clock()`` is rejected (replay).
Older payload generations have no ``webhookTimestamp``: they are accepted (the signature still holds)
and the event's ``action`` carries the suffix ``;no-timestamp`` so the history shows it. ``event_id`` is the
``Linear-Delivery`` header, else ``sha256:<content hash>``. ``type`` Issue / Comment with ``action``
create/update/remove -> TASK_UPSERTED / TASK_DELETED / COMMENT_UPSERTED / COMMENT_DELETED; any other
``type`` is IGNORED; an Issue whose team is not a container (or a Comment whose issue identifier, taken
from ``data.issue.team`` or the comment ``url``, names another team) is rejected (``provider_payload``).
A Comment that does not say its team (no ``data.issue.team`` and no issue ``url``, as a removal may be), or
names only a team key while the containers are spelled by team id, has ``container_id=None``: the engine
accepts it only for a task already linked on this instance. A stored delivery verified again later (a
replay) measures ``webhookTimestamp`` against ``WebhookRequest.received_at``.

Errors (§5.4)
-------------
401/403 -> ``provider_auth``; 429, or a GraphQL error with ``extensions.code == "RATELIMITED"`` (Linear
answers 400 for those) -> ``provider_rate_limited`` with ``retry_after`` from ``Retry-After``, else
``X-RateLimit-Requests-Reset`` (epoch ms) - now, else 60 s; GraphQL ``AUTHENTICATION_ERROR`` /
``FORBIDDEN`` -> ``provider_auth``; an entity-not-found error -> ``provider_status`` 404; other non-2xx or
GraphQL errors -> ``provider_status``; transport -> ``provider_request``; bad JSON -> ``provider_payload``.
"""
from __future__ import annotations

import re
import time
from typing import Any, Callable, Mapping

import httpx

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
    maybe_json,
    norm_names,
    normalize_each,
    note_envelope,
    parse_due,
    required_title,
    retry_after,
    signature_matches,
    status_error,
    webhook_event_id,
    webhook_json,
)
from .http import parse_utc as _utc
from .mentions import neutralize_mentions

USER_AGENT = "paperclip-connector-linear/1.0"
PAGE_SIZE = 50
BATCH = 100
WEBHOOK_TOLERANCE = 60.0
BACKLINK_TITLE = "Paperclip"
BACKLINK_MARKER = "<!-- paperclip:backlink -->"
MAX_ATTACHMENT_PAGES = 20  # an issue with thousands of attachments is read this far for backlinks
DEFAULT_TYPES = {"triage": "backlog", "backlog": "backlog", "unstarted": "backlog", "started": "active",
                 "completed": "terminal", "canceled": "terminal", "duplicate": "terminal"}
DEFAULT_STATES = {"in review": "review"}
STATE_TYPES = tuple(DEFAULT_TYPES)
# No custom_field: Linear issues carry no custom fields (its API and webhook payloads have none; routing
# reads labels, workflow states, assignees and comments), so a custom_field rule could never match.
ROUTING_KINDS = frozenset({"default_route", "label", "state_lane", "comment_command", "user_mapping"})
_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")
_IDENT_RE = re.compile(r"/issue/([A-Za-z0-9]+)-(\d+)")
_UUID_RE = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_PROFILE_MENTION_RE = re.compile(r"\[@([^\]]+)\]\(https?://linear\.app/[^)]*/profiles/[^)]*\)")

ISSUE_FIELDS = """
  id identifier number title description priority priorityLabel url branchName estimate
  createdAt updatedAt archivedAt canceledAt completedAt startedAt dueDate
  state { id name type }
  team { id key name }
  assignee { id name displayName email }
  creator { id name displayName }
  labels(first: 50) { nodes { id name } }
  project { id name }
  cycle { id number }
  parent { id identifier }
  inverseRelations(first: 50) { nodes { type issue { id identifier state { name type } } } }
"""

Q_ISSUES = ("query Issues($filter: IssueFilter, $first: Int, $after: String) {"
            " issues(filter: $filter, first: $first, after: $after, orderBy: updatedAt) {"
            " nodes {" + ISSUE_FIELDS + "} pageInfo { hasNextPage endCursor } } }")
Q_ISSUE = "query Issue($id: String!) { issue(id: $id) {" + ISSUE_FIELDS + "} }"
Q_ISSUE_STATES = ("query IssueStates($ids: [ID!], $first: Int) {"
                  " issues(filter: {id: {in: $ids}}, first: $first, includeArchived: true) {"
                  " nodes { id identifier archivedAt trashed state { id name type } team { id key } } } }")
Q_COMMENTS = ("query IssueComments($id: String!, $first: Int, $after: String, $filter: CommentFilter) {"
              " issue(id: $id) { id comments(first: $first, after: $after, filter: $filter, orderBy: updatedAt) {"
              " nodes { id body url createdAt updatedAt user { id name displayName } botActor { id name } }"
              " pageInfo { hasNextPage endCursor } } } }")
# Which Linear state types best stand for a category when a mapping names types only (§10.3).
TYPE_PREFERENCE = {"active": ("started", "unstarted"), "terminal": ("completed", "canceled", "duplicate"),
                   "backlog": ("backlog", "triage"), "review": ("started",), "blocked": ("started",)}
Q_ISSUE_TEAM = ("query IssueTeam($id: String!) { issue(id: $id) { id team { id key"
                " states(first: 250) { nodes { id name type } } labels(first: 250) { nodes { id name } } } } }")
Q_TEAMS = ("query Teams($filter: TeamFilter) { teams(filter: $filter, first: 50) { nodes { id key name"
           " states(first: 250) { nodes { id name type } } labels(first: 250) { nodes { id name } } } } }")
M_COMMENT_CREATE = ("mutation CommentCreate($input: CommentCreateInput!) {"
                    " commentCreate(input: $input) { success comment { id url } } }")
M_ISSUE_UPDATE = ("mutation IssueUpdate($id: String!, $input: IssueUpdateInput!) {"
                  " issueUpdate(id: $id, input: $input) { success issue { id updatedAt state { id name type } } } }")
M_ISSUE_CREATE = ("mutation IssueCreate($input: IssueCreateInput!) {"
                  " issueCreate(input: $input) { success issue {" + ISSUE_FIELDS + "} } }")
M_ATTACHMENT_CREATE = ("mutation AttachmentCreate($input: AttachmentCreateInput!) {"
                       " attachmentCreate(input: $input) { success attachment { id url } } }")
Q_ATTACHMENTS = ("query IssueAttachments($id: String!, $first: Int, $after: String) {"
                 " issue(id: $id) { id attachments(first: $first, after: $after) {"
                 " nodes { id url title metadata creator { id name displayName } }"
                 " pageInfo { hasNextPage endCursor } } } }")


def linear_priority(raw: Any) -> int | None:
    """Linear 0 (none) -> None, 1 (urgent) -> 0, 2 (high) -> 1, 3 (medium) -> 2, 4 (low) -> 3."""
    try:
        value = int(raw)
    except (TypeError, ValueError):
        return None
    return value - 1 if 1 <= value <= 4 else None


def linear_priority_from(normalized: Any) -> int:
    """Inverse of :func:`linear_priority` (None -> 0; 4, which Linear cannot hold, -> 4 low)."""
    if normalized is None:
        return 0
    return min(4, max(1, int(normalized) + 1))


def neutralize(text: str | None) -> tuple[str | None, list[str]]:
    if not text:
        return text, []
    names = _PROFILE_MENTION_RE.findall(text)
    text = _PROFILE_MENTION_RE.sub(lambda m: m.group(1), text)
    text, more = neutralize_mentions(text)
    return text, list(dict.fromkeys(names + more))


class _Mapping:
    def __init__(self, raw: Mapping[str, Any] | None):
        raw = raw if isinstance(raw, Mapping) else {}
        self.types = dict(DEFAULT_TYPES)
        self.types.update(norm_names(raw.get("types")))
        self.states = dict(DEFAULT_STATES)
        self.states.update(norm_names(raw.get("states")))
        self.teams: dict[str, tuple[dict, dict]] = {}
        for team, value in (raw.get("teams") or {}).items() if isinstance(raw.get("teams"), Mapping) else ():
            if isinstance(value, Mapping):
                self.teams[normalize_state_name(team)] = (norm_names(value.get("states")), norm_names(value.get("types")))

    def category(self, name: str | None, type_: str | None, team_keys=()) -> str | None:
        name, type_ = normalize_state_name(name), normalize_state_name(type_)
        overrides = [self.teams[t] for t in (normalize_state_name(k) for k in team_keys if k) if t in self.teams]
        for states, _ in overrides:
            if name in states:
                return states[name]
        if name in self.states:
            return self.states[name]
        for _, types in overrides:
            if type_ in types:
                return types[type_]
        return self.types.get(type_)


@register
class LinearAdapter(HttpClientMixin, TaskSourceAdapter):
    provider_key = "linear"
    display_name = "Linear"
    setup_help = {
        "containers": "Teams, by key (ENG) or id, one per line.",
        "baseUrl": "The API root, https://api.linear.app (leave empty for it); GraphQL is <base URL>/graphql.",
        "credentials": "A personal API key (lin_api_…) or an OAuth access token of the user Paperclip writes as.",
        "webhookSecret": "The signing secret Linear shows for the webhook (Settings → API → Webhooks): deliveries "
                         "carry Linear-Signature (HMAC-SHA256 of the body).",
        "serviceAccountId": "The Linear user id of the key's owner (query viewer { id }): its own changes are "
                            "echoes.",
        "stateMapping": "By workflow state type (types) and by state name (states, wins over the type), with "
                        "optional per-team overrides (teams). Without one, state types map by default (started → "
                        "active, completed/canceled → terminal, In Review → review). Checked against each team's "
                        "workflow states.",
        "config": "Optional; e.g. outboundStates naming the state each category is written as.",
        "webhooks": "Create a webhook in Linear (Settings → API → Webhooks) with this URL for Issues and "
                    "Comments, and copy its signing secret here. Polling is the backstop.",
        "stateMappingExample": '{"types": {"triage": "backlog", "backlog": "backlog", "unstarted": "backlog", '
                               '"started": "active", "completed": "terminal", "canceled": "terminal", '
                               '"duplicate": "terminal"}, "states": {"In Review": "review"}}',
    }
    delivery_id_header = "linear-delivery"
    default_base_url = "https://api.linear.app"
    capabilities = Capabilities(
        operations=ALL_OPERATIONS,
        state_categories=frozenset(StateCategory.ALL),
        signed_webhooks=True,
        routing_rule_kinds=ROUTING_KINDS,
        has_external_keys=True,
        settable_fields=frozenset({"title", "description", "priority"}),
    )

    def __init__(self, config: AdapterConfig, *, client: httpx.Client | None = None, page_size: int = PAGE_SIZE,
                 clock: Callable[[], float] | None = None):
        """``client``: an httpx.Client to use; ``page_size``: ``first`` for listings (1-250);
        ``clock``: seconds since the epoch (``time.time``), injectable for webhook timestamp tests."""
        super().__init__(config)
        self.base_url = (config.base_url or self.default_base_url).rstrip("/")
        self.graphql_url = self.base_url + "/graphql"
        self.page_size = max(1, min(250, int(page_size)))
        self.clock = clock or time.time
        self._containers = {c.strip().lower(): c.strip() for c in config.containers}
        self._mapping = _Mapping(config.state_mapping)
        self._init_client(client)
        self._team_ids: dict[str, str] = {}  # team id -> configured container spelling (learned)

    # --- HTTP ------------------------------------------------------------------------------------
    def _client_headers(self) -> dict:
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
        token = self.config.credentials
        if token:
            headers["Authorization"] = token if token.startswith("lin_api_") else f"Bearer {token}"
        return headers

    def graphql(self, operation: str, query: str, variables: Mapping[str, Any] | None = None) -> dict:
        """POST one operation; returns ``data`` or raises ProviderError per §5.4."""
        body = {"query": query, "variables": dict(variables or {}), "operationName": operation}
        response = self._send("POST", self.graphql_url, f"Linear {operation}", json=body)
        status = response.status_code
        payload = maybe_json(response)
        errors = (payload or {}).get("errors") if isinstance(payload, Mapping) else None
        codes = []
        for err in errors or ():
            ext = err.get("extensions") if isinstance(err, Mapping) else None
            codes.append(str((ext or {}).get("code") or "").upper())
        what = f"Linear {operation} -> {status}"
        if errors:
            what += ": " + "; ".join(str(e.get("message")) for e in errors if isinstance(e, Mapping))
        # Linear answers rate limits and auth failures as HTTP 400 with an error code, too.
        limited = status == 429 or "RATELIMITED" in codes
        auth = status in (401, 403) or "AUTHENTICATION_ERROR" in codes or "FORBIDDEN" in codes
        if limited or auth:
            wait = retry_after(response.headers, "x-ratelimit-requests-reset", "x-ratelimit-complexity-reset") if limited else None
            raise status_error(what, status, rate_limited=limited, retry_after=wait, auth=auth)
        if not response.is_success and not errors:
            raise ProviderError(ErrorCategory.PROVIDER_STATUS, what, status=status)
        if errors:
            messages = " ".join(str(e.get("message") or "") for e in errors if isinstance(e, Mapping)).lower()
            if "not found" in messages or "entity_not_found" in messages.replace(" ", "_"):
                raise ProviderError(ErrorCategory.PROVIDER_STATUS, what, status=404)
            if "INVALID_INPUT" in codes and "cursor" in messages:
                raise ProviderError(ErrorCategory.CURSOR_INVALID, what, status=status)
            raise ProviderError(ErrorCategory.PROVIDER_STATUS, what, status=status)
        if not isinstance(payload, Mapping) or not isinstance(payload.get("data"), Mapping):
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, f"Linear {operation} returned no data object.")
        return payload["data"]

    # --- helpers ---------------------------------------------------------------------------------
    def _container_for(self, team: Mapping[str, Any] | None, team_id: str | None = None) -> str | None:
        """The configured container a team (``{id, key}``) belongs to, or None."""
        key = str((team or {}).get("key") or "").lower()
        tid = str((team or {}).get("id") or team_id or "").lower()
        for candidate in (key, tid):
            if candidate and candidate in self._containers:
                if tid:
                    self._team_ids[tid] = self._containers[candidate]
                return self._containers[candidate]
        return self._team_ids.get(tid) if tid else None

    def _team_undetermined(self, team: Mapping[str, Any]) -> bool:
        """Whether a payload's team reference cannot say if it is one of the containers: no team at all
        (a comment that names only ``issue.id``), or only a team key while some container is spelled by
        an id (a key cannot be compared with it). The engine then accepts the delivery only for a task
        it already links on this instance (§7.1.1)."""
        if team.get("id"):
            return False
        if not team.get("key"):
            return True
        return any(_UUID_RE.fullmatch(c) for c in self._containers)

    def _scope(self, scope: str) -> str:
        value = (scope or "").strip().lower()
        if value not in self._containers:
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, f"Linear team {scope!r} is not one of this connector's containers.")
        return self._containers[value]

    @staticmethod
    def _team_filter(container: str) -> dict:
        if re.fullmatch(r"[0-9a-fA-F-]{36}", container):
            return {"id": {"eq": container}}
        return {"key": {"eq": container}}

    def actor(self, user: Mapping[str, Any] | None) -> ExternalActor | None:
        if not isinstance(user, Mapping) or not (user.get("id") or user.get("name")):
            return None
        uid = str(user.get("id") or "")
        name = str(user.get("name") or user.get("displayName") or uid)
        service = (self.config.service_account_id or "").strip()
        is_service = bool(service) and service in (uid, str(user.get("name") or ""), str(user.get("email") or ""))
        return ExternalActor(provider_key=self.provider_key, external_user_id=uid or name, display_name=name,
                             is_connector_service_account=is_service)

    def _state(self, state: Mapping[str, Any] | None, team: Mapping[str, Any] | None) -> tuple[ExternalState, str | None]:
        state = state if isinstance(state, Mapping) else {}
        name = str(state.get("name") or state.get("type") or "unknown")
        team = team if isinstance(team, Mapping) else {}
        return mapped_state(name, self._mapping.category(name, state.get("type"), (team.get("key"), team.get("id"))))

    @staticmethod
    def _nodes(value) -> list:
        if isinstance(value, Mapping):
            value = value.get("nodes")
        return [v for v in value or () if isinstance(v, Mapping)]

    def normalize_issue(self, issue: Mapping[str, Any], *, url: str | None = None) -> ExternalTask:
        """GraphQL issue node or webhook ``data`` -> ExternalTask (KeyError/TypeError when malformed)."""
        issue_id = str(issue["id"])
        team = issue.get("team") if isinstance(issue.get("team"), Mapping) else {"id": issue.get("teamId")}
        container = self._container_for(team, issue.get("teamId")) or team.get("key") or team.get("id")
        identifier = issue.get("identifier")
        if not identifier and (issue.get("url") or url):  # webhook data has no identifier; its url has
            m = _IDENT_RE.search(issue.get("url") or url)
            identifier = f"{m.group(1)}-{m.group(2)}" if m else None
        if not identifier and team.get("key") and issue.get("number") is not None:
            identifier = f"{team['key']}-{issue['number']}"
        raw_labels = self._nodes(issue.get("labels"))
        label_names = [str(lbl.get("name")) for lbl in raw_labels if lbl.get("name") is not None]
        state, unmapped = self._state(issue.get("state"), team)
        title, t_mentions = neutralize(str(issue.get("title") or ""))
        description, d_mentions = neutralize(issue.get("description"))
        assignee = self.actor(issue.get("assignee")) if isinstance(issue.get("assignee"), Mapping) else None
        if assignee is None and issue.get("assigneeId"):
            assignee = ExternalActor(self.provider_key, str(issue["assigneeId"]), str(issue["assigneeId"]))
        blocked_by = []
        for rel in self._nodes(issue.get("inverseRelations")):
            other = rel.get("issue") if isinstance(rel.get("issue"), Mapping) else None
            if rel.get("type") == "blocks" and other and other.get("id"):
                blocked_by.append(ExternalTaskRef(str(other["id"]), other.get("identifier"),
                                                  (other.get("state") or {}).get("name")))
        st = issue.get("state") if isinstance(issue.get("state"), Mapping) else {}
        envelope: dict[str, Any] = {
            "identifier": identifier,
            "number": issue.get("number"),
            "team": {"id": team.get("id"), "key": team.get("key"), "name": team.get("name")},
            "workflowState": {"id": st.get("id") or issue.get("stateId"), "name": st.get("name"), "type": st.get("type")},
            "labels": [{"id": lbl.get("id"), "name": lbl.get("name")} for lbl in raw_labels],
            "labelIds": list(issue.get("labelIds") or [lbl.get("id") for lbl in raw_labels]),
            "priority": issue.get("priority"),
            "priorityLabel": issue.get("priorityLabel"),
            "estimate": issue.get("estimate"),
            "project": issue.get("project") if isinstance(issue.get("project"), Mapping) else (
                {"id": issue["projectId"]} if issue.get("projectId") else None),
            "cycle": issue.get("cycle") if isinstance(issue.get("cycle"), Mapping) else (
                {"id": issue["cycleId"]} if issue.get("cycleId") else None),
            "parent": issue.get("parent") if isinstance(issue.get("parent"), Mapping) else (
                {"id": issue["parentId"]} if issue.get("parentId") else None),
            "archivedAt": issue.get("archivedAt"),
            "descriptionFormat": "markdown",
        }
        note_envelope(envelope, t_mentions + d_mentions, unmapped)
        # The adapter resolved the category (type defaults, names, team overrides): tell the engine, whose
        # name-only lookup would report a type-mapped state such as "Todo" as unmapped (§7.2).
        envelope["stateMapped"] = unmapped is None
        return ExternalTask(
            provider_key=self.provider_key, external_id=issue_id, external_key=identifier, title=title or "",
            description=description, state=state, priority=linear_priority(issue.get("priority")),
            assignees=(assignee,) if assignee else (), labels=tuple(normalize_labels(label_names)),
            blocked_by=tuple(blocked_by), url=web_url(issue.get("url") or url), branch_name=issue.get("branchName"),
            due_at=parse_due(issue.get("dueDate")), created_at=_utc(issue.get("createdAt")), updated_at=_utc(issue.get("updatedAt")),
            revision=issue.get("updatedAt"), container_id=container, envelope=envelope)

    def normalize_comment(self, comment: Mapping[str, Any], external_task_id: str, *, url: str | None = None) -> ExternalComment:
        body, mentions = neutralize(comment.get("body") or "")
        user = comment.get("user") if isinstance(comment.get("user"), Mapping) else None
        if user is None and comment.get("userId"):
            user = {"id": comment["userId"]}
        bot = comment.get("botActor") if isinstance(comment.get("botActor"), Mapping) else None
        author = self.actor(user) or self.actor(bot) or ExternalActor(self.provider_key, "", "Linear")
        envelope: dict[str, Any] = {"editedAt": comment.get("editedAt")}
        if mentions:
            envelope["mentionsNeutralized"] = mentions
        if bot:
            envelope["botActor"] = {"id": bot.get("id"), "name": bot.get("name")}
        return ExternalComment(
            external_comment_id=str(comment["id"]), external_task_id=external_task_id, author=author,
            body=body or "", url=web_url(comment.get("url") or url), created_at=_utc(comment.get("createdAt")),
            updated_at=_utc(comment.get("updatedAt")), envelope=envelope)

    # --- cursors ---------------------------------------------------------------------------------
    @staticmethod
    def _decode_cursor(cursor: str | None, scope: str) -> dict:
        return decode_cursor(cursor, scope, "after", provider="Linear", page_types=(str,),
                             page_error="Linear cursor 'after' is not a string.")

    def _advance(self, state: dict, rows: list[Mapping], page_info: Mapping | None) -> tuple[list, dict, bool]:
        """Apply one fetched page to the cursor state -> (fresh rows, new state, advanced?)."""
        info = page_info if isinstance(page_info, Mapping) else {}
        has_next = bool(info.get("hasNextPage"))
        end = info.get("endCursor")
        if has_next and not end:
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, "Linear page claims hasNextPage without an endCursor.")
        keyed = [(str(row.get("id")), _utc(row.get("updatedAt")), row) for row in rows]
        return advance_cursor(state, keyed, end if has_next else None, "after")

    # --- §5.1 required ---------------------------------------------------------------------------
    def list_candidate_tasks(self, scope: str, cursor: str | None) -> Page:
        container = self._scope(scope)
        state = self._decode_cursor(cursor, container)
        flt: dict[str, Any] = {"team": self._team_filter(container)}
        if state["since"]:
            flt["updatedAt"] = {"gte": state["since"]}
        data = self.graphql("Issues", Q_ISSUES, {"filter": flt, "first": self.page_size, "after": state["after"]})
        conn = data.get("issues") if isinstance(data.get("issues"), Mapping) else None
        if conn is None:
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, "Linear Issues response has no issues connection.")
        rows = self._nodes(conn)
        fresh, new_state, advanced = self._advance(state, rows, conn.get("pageInfo"))
        # One malformed issue is reported and left out; the rest of the page and the cursor go on (§13.1.8).
        tasks, skipped = normalize_each(self.normalize_issue, fresh, "Linear issue in listing",
                                        key_of=lambda row: row.get("identifier"))
        return Page(items=tasks, cursor=encode_cursor(container, new_state, "after") if advanced else None,
                    skipped=skipped)

    def _issue_id(self, ref: ExternalTaskRef) -> str:
        value = (ref.external_id or ref.external_key or "").strip()
        if not value:
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, "Linear task refs need an external_id.")
        return value

    def _check_container(self, task: ExternalTask) -> ExternalTask:
        if (task.container_id or "").lower() not in self._containers:
            raise ProviderError(ErrorCategory.PROVIDER_STATUS,
                                f"Linear issue {task.external_key} is in team {task.container_id}, not a container.",
                                status=404)
        return task

    def get_task(self, ref: ExternalTaskRef) -> ExternalTask:
        data = self.graphql("Issue", Q_ISSUE, {"id": self._issue_id(ref)})
        issue = data.get("issue")
        if not isinstance(issue, Mapping):
            raise ProviderError(ErrorCategory.PROVIDER_STATUS, f"Linear issue {ref.external_id} not found.", status=404)
        try:
            task = self.normalize_issue(issue)
        except (KeyError, TypeError, ValueError) as exc:
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, f"Malformed Linear issue: {exc!r}") from exc
        return self._check_container(task)

    def get_task_states(self, refs: list[ExternalTaskRef]) -> dict[str, ExternalState | None]:
        ids = list(dict.fromkeys(self._issue_id(ref) for ref in refs))
        out: dict[str, ExternalState | None] = {}
        for start in range(0, len(ids), BATCH):
            chunk = ids[start:start + BATCH]
            data = self.graphql("IssueStates", Q_ISSUE_STATES, {"ids": chunk, "first": len(chunk)})
            found = {}
            for node in self._nodes(data.get("issues")):
                found[str(node.get("id"))] = node
            for issue_id in chunk:
                node = found.get(issue_id)
                team = node.get("team") if node else None
                if node is None or node.get("trashed") or self._container_for(team) is None:
                    out[issue_id] = None  # deleted, trashed, or moved to a team outside the containers
                else:
                    out[issue_id] = self._state(node.get("state"), team)[0]
        return out

    def list_comments(self, ref: ExternalTaskRef, cursor: str | None) -> Page:
        issue_id = self._issue_id(ref)
        state = self._decode_cursor(cursor, issue_id)
        variables: dict[str, Any] = {"id": issue_id, "first": self.page_size, "after": state["after"]}
        if state["since"]:
            variables["filter"] = {"updatedAt": {"gte": state["since"]}}
        data = self.graphql("IssueComments", Q_COMMENTS, variables)
        issue = data.get("issue")
        if not isinstance(issue, Mapping):
            raise ProviderError(ErrorCategory.PROVIDER_STATUS, f"Linear issue {issue_id} not found.", status=404)
        conn = issue.get("comments") if isinstance(issue.get("comments"), Mapping) else {}
        fresh, new_state, advanced = self._advance(state, self._nodes(conn), conn.get("pageInfo"))
        comments, skipped = normalize_each(lambda row: self.normalize_comment(row, issue_id), fresh, "Linear comment")
        return Page(items=comments, cursor=encode_cursor(issue_id, new_state, "after") if advanced else None,
                    skipped=skipped)

    def verify_webhook(self, request: WebhookRequest) -> VerifiedEvent:
        headers = lower_headers(request.headers)
        secret = self.config.webhook_secret
        if not secret:
            raise WebhookRejected("No webhook secret is configured for this connector; Linear deliveries cannot be verified.")
        signature = (headers.get("linear-signature") or "").strip()
        if not signature:
            raise WebhookRejected("Missing Linear-Signature header.")
        if not _HEX64.match(signature):
            raise WebhookRejected("Malformed Linear-Signature header (expected 64 hex digits).")
        body = request.body or b""
        if not signature_matches(secret, body, signature):
            raise WebhookRejected("Linear-Signature does not match the body.")
        # --- signature verified; only now parse -------------------------------------------------
        payload = webhook_json(body, "Linear")
        stamp = payload.get("webhookTimestamp")
        if stamp is not None:
            try:
                now = request.received_at if request.received_at is not None else self.clock()
                skew = abs(now - float(stamp) / 1000.0)
            except (TypeError, ValueError):
                raise WebhookUnparseable("Linear webhookTimestamp is not a number.") from None
            if skew > WEBHOOK_TOLERANCE:
                raise WebhookRejected(f"Linear webhookTimestamp is {skew:.0f}s from now (limit {WEBHOOK_TOLERANCE:.0f}s): "
                                      "stale or replayed delivery.")
        event_id = webhook_event_id(headers.get("linear-delivery"), body)
        kind_name, action = payload.get("type"), payload.get("action")
        action_name = f"{kind_name}.{action}" + ("" if stamp is not None else ";no-timestamp")
        occurred = _utc(payload.get("createdAt"))
        data = payload.get("data")
        if kind_name not in ("Issue", "Comment"):
            return VerifiedEvent(event_id=event_id, kind=EventKind.IGNORED, action=action_name, external_task_id=None,
                                 occurred_at=occurred)
        if action not in ("create", "update", "remove") or not isinstance(data, Mapping) or not data.get("id"):
            raise WebhookUnparseable(f"Linear {kind_name} payload has no usable action/data.")
        url = payload.get("url") if isinstance(payload.get("url"), str) else None
        try:
            if kind_name == "Issue":
                team = data.get("team") if isinstance(data.get("team"), Mapping) else {"id": data.get("teamId")}
                container = self._container_for(team, data.get("teamId"))
                if container is None:
                    raise WebhookRejected(f"Delivery for Linear team {team.get('key') or team.get('id')!r}, which is not "
                                          "one of this connector's containers.", category=ErrorCategory.PROVIDER_PAYLOAD)
                task = self.normalize_issue(data, url=url)
                kind = EventKind.TASK_DELETED if action == "remove" else EventKind.TASK_UPSERTED
                actor = self.actor(payload.get("actor"))
                return VerifiedEvent(event_id=event_id, kind=kind, action=action_name, external_task_id=task.external_id,
                                     occurred_at=occurred or task.updated_at, task=task, actor=actor, container_id=container)
            issue = data.get("issue") if isinstance(data.get("issue"), Mapping) else {}
            task_id = str(data.get("issueId") or issue.get("id") or "")
            if not task_id:
                raise KeyError("issueId")
            team = issue.get("team") if isinstance(issue.get("team"), Mapping) else None
            if team is None:
                m = _IDENT_RE.search(url or "")
                team = {"key": m.group(1)} if m else {}
            container = self._container_for(team)
            if container is None and not self._team_undetermined(team):
                raise WebhookRejected(f"Comment delivery for Linear team {team.get('key') or team.get('id')!r}, which is "
                                      "not one of this connector's containers.", category=ErrorCategory.PROVIDER_PAYLOAD)
            comment = self.normalize_comment(data, task_id, url=url)
        except (KeyError, TypeError, ValueError) as exc:
            raise WebhookUnparseable(f"Linear {action_name} payload is missing or has a bad key: {exc}") from None
        kind = EventKind.COMMENT_DELETED if action == "remove" else EventKind.COMMENT_UPSERTED
        return VerifiedEvent(event_id=event_id, kind=kind, action=action_name, external_task_id=task_id,
                             occurred_at=occurred or comment.updated_at, comment=comment, actor=comment.author,
                             container_id=container)

    def validate_state_mapping(self, mapping: Mapping[str, Any]) -> dict[str, list[str]]:
        errors: dict[str, list[str]] = {}

        def add(field_name, reason):
            errors.setdefault(field_name, []).append(reason)

        def check_states(prefix, value):
            check_categories(add, prefix, value, shape="state name", names="state names")

        def check_types(prefix, value):
            check_categories(add, prefix, value, shape="workflow state type", keys=STATE_TYPES,
                             key_reason=f"unknown Linear workflow state type; expected one of {', '.join(STATE_TYPES)}")

        if not isinstance(mapping, Mapping):
            return {"stateMapping": ["must be an object"]}
        for key, value in mapping.items():
            if key == "types":
                check_types("types", value)
            elif key == "states":
                check_states("states", value)
            elif key == "teams":
                check_overrides(add, "teams", value, "team key or id", {"states": check_states, "types": check_types})
            else:
                add(key, "unknown key; expected types, states, teams")
        return errors

    # --- workflow metadata (additive helper for setup validation) ------------------------------
    def _teams(self, container: str) -> dict:
        data = self.graphql("Teams", Q_TEAMS, {"filter": self._team_filter(container)})
        nodes = self._nodes(data.get("teams"))
        if not nodes:
            raise ProviderError(ErrorCategory.PROVIDER_STATUS, f"Linear team {container!r} not found.", status=404)
        return nodes[0]

    def workflow_states(self, scope: str) -> list[dict]:
        """The team's workflow states ``[{id, name, type, category}]`` with the configured category."""
        container = self._scope(scope)
        team = self._teams(container)
        return [{"id": s.get("id"), "name": s.get("name"), "type": s.get("type"),
                 "category": self._state(s, team)[0].category} for s in self._nodes(team.get("states"))]

    # --- §5.2 optional writes --------------------------------------------------------------------
    def _issue_team(self, issue_id: str) -> dict:
        data = self.graphql("IssueTeam", Q_ISSUE_TEAM, {"id": issue_id})
        issue = data.get("issue")
        if not isinstance(issue, Mapping) or not isinstance(issue.get("team"), Mapping):
            raise ProviderError(ErrorCategory.PROVIDER_STATUS, f"Linear issue {issue_id} not found.", status=404)
        if self._container_for(issue["team"]) is None:
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, f"Linear issue {issue_id} is not in a configured team.")
        return issue["team"]

    def _state_id(self, team: Mapping, target_state_name: str) -> str:
        target = normalize_state_name(target_state_name)
        for state in self._nodes(team.get("states")):
            if normalize_state_name(state.get("name")) == target:
                return str(state["id"])
        names = ", ".join(str(s.get("name")) for s in self._nodes(team.get("states")))
        raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD,
                            f"Linear team {team.get('key')} has no workflow state {target_state_name!r} ({names}).")

    def _label_ids(self, team: Mapping, names) -> list[str]:
        by_name = {normalize_state_name(lbl.get("name")): str(lbl["id"]) for lbl in self._nodes(team.get("labels"))}
        ids, missing = [], []
        for name in names or ():
            key = normalize_state_name(name)
            (ids.append(by_name[key]) if key in by_name else missing.append(name))
        if missing:
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD,
                                f"Linear team {team.get('key')} has no labels {', '.join(map(str, missing))}.")
        return ids

    def _field_input(self, team: Mapping, fields: Mapping[str, Any]) -> dict:
        out: dict[str, Any] = {}
        for key, value in fields.items():
            if key == "title":
                out["title"] = value
            elif key in ("description", "body"):
                out["description"] = value
            elif key == "priority":
                out["priority"] = linear_priority_from(value)
            elif key == "labels":
                out["labelIds"] = self._label_ids(team, value)
            elif key in ("dueAt", "due_at", "dueDate"):
                out["dueDate"] = due_date(value)
            elif key == "state":
                out["stateId"] = self._state_id(team, value)
            else:
                raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD,
                                    f"Linear set_fields supports title, description, priority, labels, dueAt, state; not {key!r}.")
        return out

    def _mutation_ok(self, data: Mapping, name: str) -> Mapping:
        result = data.get(name)
        if not isinstance(result, Mapping) or not result.get("success"):
            raise ProviderError(ErrorCategory.PROVIDER_STATUS, f"Linear {name} did not succeed.")
        return result

    def create_task(self, scope: str, projection: Mapping[str, Any]) -> ExternalTask:
        container = self._scope(scope)
        title = required_title(projection)
        team = self._teams(container)
        fields = {k: v for k, v in projection.items() if k in ("description", "priority", "labels", "dueAt", "state")
                  and v not in (None, [], "")}
        payload = {"teamId": team["id"], "title": title, **self._field_input(team, fields)}
        result = self._mutation_ok(self.graphql("IssueCreate", M_ISSUE_CREATE, {"input": payload}), "issueCreate")
        return self.normalize_issue(result["issue"])

    def update_task_state(self, ref: ExternalTaskRef, target_state_name: str) -> None:
        issue_id = self._issue_id(ref)
        team = self._issue_team(issue_id)
        state_id = self._state_id(team, target_state_name)
        self._mutation_ok(self.graphql("IssueUpdate", M_ISSUE_UPDATE, {"id": issue_id, "input": {"stateId": state_id}}),
                          "issueUpdate")

    def state_for_category(self, ref: ExternalTaskRef, category: str) -> str | None:
        """First state of the issue's team mapped to ``category``, preferring the usual type of that
        category (started for active, completed for terminal) and then the team's order."""
        team = self._issue_team(self._issue_id(ref))
        candidates = []
        for index, node in enumerate(self._nodes(team.get("states"))):
            state, unmapped = self._state(node, team)
            if unmapped is None and state.category == category:
                rank = TYPE_PREFERENCE.get(category, ()).index(node.get("type")) \
                    if node.get("type") in TYPE_PREFERENCE.get(category, ()) else 99
                candidates.append((rank, index, str(node.get("name"))))
        return min(candidates)[2] if candidates else None

    def post_comment(self, ref: ExternalTaskRef, body: str) -> str:
        issue_id = self._issue_id(ref)
        result = self._mutation_ok(self.graphql("CommentCreate", M_COMMENT_CREATE,
                                                {"input": {"issueId": issue_id, "body": body}}), "commentCreate")
        return str(result["comment"]["id"])

    def set_fields(self, ref: ExternalTaskRef, fields: Mapping[str, Any]) -> None:
        if not fields:
            return
        issue_id = self._issue_id(ref)
        needs_team = any(k in fields for k in ("labels", "state"))
        team = self._issue_team(issue_id) if needs_team else {}
        payload = self._field_input(team, fields)
        if payload:
            self._mutation_ok(self.graphql("IssueUpdate", M_ISSUE_UPDATE, {"id": issue_id, "input": payload}),
                              "issueUpdate")

    def set_backlink(self, ref: ExternalTaskRef, paperclip_url: str) -> None:
        """A link attachment (Linear updates the attachment with the same URL on the same issue, so this
        is idempotent); ``metadata.paperclip`` = ``"backlink"`` marks it for §6.3 dedupe."""
        issue_id = self._issue_id(ref)
        self._mutation_ok(self.graphql("AttachmentCreate", M_ATTACHMENT_CREATE, {"input": {
            "issueId": issue_id, "url": paperclip_url, "title": BACKLINK_TITLE,
            "subtitle": "Tracked in Paperclip", "metadata": {"paperclip": "backlink"}}}), "attachmentCreate")

    def find_backlinks(self, ref: ExternalTaskRef) -> list[str]:
        """The URLs of the issue's attachments whose ``metadata.paperclip`` is ``"backlink"``."""
        issue_id = self._issue_id(ref)
        found, after = [], None
        for _ in range(MAX_ATTACHMENT_PAGES):
            data = self.graphql("IssueAttachments", Q_ATTACHMENTS, {"id": issue_id, "first": self.page_size,
                                                                    "after": after})
            issue = data.get("issue")
            if not isinstance(issue, Mapping):
                raise ProviderError(ErrorCategory.PROVIDER_STATUS, f"Linear issue {issue_id} not found.", status=404)
            conn = issue.get("attachments") if isinstance(issue.get("attachments"), Mapping) else {}
            for node in self._nodes(conn):
                metadata = node.get("metadata") if isinstance(node, Mapping) else None
                if isinstance(metadata, Mapping) and metadata.get("paperclip") == "backlink" and node.get("url"):
                    found.append(str(node["url"]))
            info = conn.get("pageInfo") if isinstance(conn.get("pageInfo"), Mapping) else {}
            if not info.get("hasNextPage") or not info.get("endCursor"):
                break
            after = info["endCursor"]
        return found

    # --- setup validation (TaskSourceAdapter.workflow_metadata) --------------------------------------
    def workflow_metadata(self, scope: str) -> dict:
        """The team's workflow states (as :meth:`workflow_states`, plus ``mapped``) and where the mapping
        names states; per-team overrides may be keyed by the team key or id."""
        team = self._teams(self._scope(scope))
        states = []
        for node in self._nodes(team.get("states")):
            state, unmapped = self._state(node, team)
            states.append({"id": node.get("id"), "name": node.get("name"), "type": node.get("type"),
                           "category": state.category, "mapped": unmapped is None})
        return {"containerKind": "team", "keys": [k for k in (scope, team.get("key"), team.get("id")) if k],
                "nameSections": ["states"], "overrideSection": "teams", "states": states}
