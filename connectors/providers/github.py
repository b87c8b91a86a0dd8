"""GitHub Issues task source adapter (External Task Protocol layer 1, Appendix A.6).

Containers are repositories spelled ``"owner/name"`` (``AdapterConfig.containers``). ``base_url`` is
the REST root: ``https://api.github.com``, a GitHub Enterprise Server ``https://host/api/v3``, or the
sandbox (:mod:`connectors.sandbox.github`). The GraphQL endpoint is derived from it:
``api.github.com`` -> ``https://api.github.com/graphql``; a ``.../api/v3`` root -> ``.../api/graphql``;
anything else (the sandbox) -> ``<base_url>/graphql``.

Identifiers
-----------
``external_id`` is ``str(issue["id"])`` (the numeric database id, stable across renames);
``external_key`` is ``"owner/name#<number>"``; ``url`` is ``html_url``. GitHub addresses issues by
repository + number, so lookups and writes use the *key* of the :class:`ExternalTaskRef` (a ref
without a key, or whose repository is not one of the instance's containers, raises
``ProviderError(PROVIDER_PAYLOAD)``: the adapter never reads or writes outside its containers).

State mapping (configuration, not code)
---------------------------------------
``AdapterConfig.state_mapping`` is a JSON object::

    {
      "open": "backlog",                 # category of an open issue with no convention label
      "closed": "terminal",              # category of a closed issue (any state_reason)
      "closed:not_planned": "terminal",  # optional per-state_reason override: closed:<completed|not_planned|duplicate>
      "labels": {                        # optional label conventions, in PRECEDENCE ORDER
        "blocked": "blocked",            #   (the first key the issue carries wins; a list of
        "in review": "review",           #    [label, category] pairs is accepted too)
        "in progress": "active"
      },
      "labels_override_closed": false    # optional; when true conventions also apply to closed issues
    }

Keys and label names compare trimmed + lowercased. The effective state name (``state.name``) is:
the matching convention label (as normalized), else ``"open"``, else ``"closed"`` (state_reason
``completed`` or none) or ``"closed:<state_reason>"`` (``closed:not_planned``, ``closed:duplicate``).
Its category is looked up by that name (``closed:<reason>`` falls back to ``"closed"``; a closed
issue with reason ``completed`` also tries ``"closed:completed"`` first). A name with no mapping, or
mapped to an unknown category, becomes category ``backlog`` and the envelope carries
``unmappedState: <name>`` (§7.2: never guessed). :meth:`GitHubIssuesAdapter.update_task_state`
accepts exactly these names as targets. ``validate_state_mapping`` requires ``open`` and ``closed``.

Listing cursors
---------------
Issue listings (``GET /repos/{o}/{r}/issues?state=all&sort=updated&direction=asc&since=&per_page=100``)
and comment listings (``GET /repos/{o}/{r}/issues/{n}/comments?since=&per_page=100``) return a cursor
that is compact JSON::

    {"v": 1, "scope": "owner/name" | "owner/name#12", "since": "2026-01-01T00:00:05Z" | null,
     "seen": [<ids whose updated_at == since>], "next": "<Link rel=next URL>"   # only mid-pagination}

``since`` is the high-water ``updated_at`` of everything listed so far (pull requests included, as
they share the listing), ``seen`` the ids already listed at exactly that second (GitHub's ``since``
is inclusive, so those are filtered out on resume instead of being re-applied forever), ``next`` the
page to fetch when the previous call stopped mid-pagination. A page is returned with
``cursor=None`` only when the call listed nothing new and there is no next page ("no further page
now"): keep the last non-None cursor. A cursor that is not this shape, names another scope, or
whose ``next`` URL is not under ``base_url`` raises ``ProviderError(CURSOR_INVALID)`` (the token is
never sent to a host taken from a cursor). Known limitation of GitHub's page-number pagination: an
issue updated *while* a multi-page pass runs moves to the end and can shift an unchanged issue
across a page boundary; reconciliation (§7.1.3) covers that window.

Normalization
-------------
Labels are trimmed + lowercased (raw names kept in ``envelope["labels"]``); priority is ``None``;
``due_at`` is ``None`` (the milestone's ``due_on`` rides in the envelope). Bodies are GitHub Markdown
and kept as-is except for mentions: ``@name`` / ``@org/team`` outside code becomes ``name`` /
``org/team`` (a plain display name, §5.3), and inside code spans/fences the ``@`` is followed by a
WORD JOINER (U+2060) so the code reads the same but no ``@name`` token survives. Titles get the same
treatment. Neutralized logins are listed in ``envelope["mentionsNeutralized"]``. Actors are
:class:`ExternalActor` with ``external_user_id = str(user.id)``, ``display_name = login`` and
``is_connector_service_account`` when the id or login equals ``config.service_account_id``.
Timestamps are aware UTC datetimes; ``revision`` is the issue's ``updated_at`` string.

Webhooks
--------
``X-Hub-Signature-256: sha256=<hex HMAC-SHA256(secret, raw body)>`` is checked with
``hmac.compare_digest`` before the body is parsed (missing / malformed / wrong -> WebhookRejected,
category ``webhook_signature``). ``X-GitHub-Delivery`` is the ``event_id`` (a ``sha256:`` content hash
if absent). ``issues`` and ``issue_comment`` events normalize (``deleted``/``transferred`` ->
TASK_DELETED, comment ``deleted`` -> COMMENT_DELETED, other actions -> *_UPSERTED); pull requests,
``ping`` and every other event -> IGNORED. A payload whose ``repository`` is not one of the
containers raises ``WebhookRejected(category=provider_payload)``: the signature was fine, the
delivery is for another workspace (§14.2). Unparseable JSON or a missing required key raises
WebhookUnparseable.

Errors (§5.4)
-------------
401 -> ``provider_auth``; 403/429 with ``retry-after`` or ``x-ratelimit-remaining: 0`` (or a
"secondary rate limit" message, or any 429) -> ``provider_rate_limited`` with ``retry_after`` seconds
(``retry-after``, else ``x-ratelimit-reset`` - now, else 60); other non-2xx -> ``provider_status``
(``status`` set; 404/410 for a gone issue); transport failures -> ``provider_request``; a 2xx body
that is not JSON -> ``provider_payload``.
"""
from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping
from urllib.parse import urlsplit

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
    header_retry_after,
    json_body,
    lower_headers,
    maybe_json,
    normalize_each,
    note_envelope,
    required_title,
    retry_after,
    scan_rows,
    signature_matches,
    skipped_record,
    status_error,
    webhook_event_id,
    webhook_json,
)
from .http import load_cursor as _load_cursor
from .mentions import neutralize_mentions
from .http import parse_utc as _utc

API_VERSION = "2022-11-28"
USER_AGENT = "paperclip-connector-github/1.0"
PER_PAGE = 100
GRAPHQL_BATCH = 100
BACKLINK_MARKER = "<!-- paperclip:backlink -->"
_BACKLINK_RE = re.compile(r"\A<!-- paperclip:backlink -->\r?\nTracked in Paperclip: (\S+)\s*\Z")
CLOSED_REASONS = ("completed", "not_planned", "duplicate")
ISSUE_ACTIONS_DELETE = {"deleted", "transferred"}

_KEY_RE = re.compile(r"^([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+)#(\d+)$")
_REPO_RE = re.compile(r"^([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+)$")
_SIG_RE = re.compile(r"^sha256=([0-9a-fA-F]{64})$")


def _iso(value: datetime) -> str:
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def graphql_url_for(base_url: str) -> str:
    base = base_url.rstrip("/")
    parts = urlsplit(base)
    if parts.hostname == "api.github.com":
        return f"{parts.scheme or 'https'}://api.github.com/graphql"
    if parts.path.endswith("/api/v3"):
        return base[: -len("/v3")] + "/graphql"
    return base + "/graphql"


def parse_key(key: str | None) -> tuple[str, str, int]:
    m = _KEY_RE.match((key or "").strip())
    if not m:
        raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD,
                            f"GitHub task refs need an external_key 'owner/name#number', got {key!r}.")
    return m.group(1), m.group(2), int(m.group(3))


class _Mapping:
    """The normalized, runtime view of a state mapping (lenient: bad entries count as unmapped)."""

    def __init__(self, raw: Mapping[str, Any] | None):
        raw = raw or {}
        self.states: dict[str, str] = {}
        self.labels: list[tuple[str, str]] = []
        self.labels_override_closed = bool(raw.get("labels_override_closed", False))
        for key, value in raw.items():
            name = normalize_state_name(key)
            if name in ("labels", "labels_override_closed"):
                continue
            if isinstance(value, str):
                self.states[name] = normalize_state_name(value)
        for label, category in _label_pairs(raw.get("labels")):
            self.labels.append((normalize_state_name(label), normalize_state_name(category)))

    def label_names(self) -> set[str]:
        return {label for label, _ in self.labels}


def _label_pairs(value) -> list[tuple[Any, Any]]:
    if isinstance(value, Mapping):
        return list(value.items())
    if isinstance(value, list):
        return [tuple(p) for p in value if isinstance(p, (list, tuple)) and len(p) == 2]
    return []


@register
class GitHubIssuesAdapter(HttpClientMixin, TaskSourceAdapter):
    provider_key = "github_issues"
    display_name = "GitHub Issues"
    setup_help = {
        "containers": "Repositories spelled owner/name (e.g. octo-org/octo-repo), one per line.",
        "baseUrl": "The REST root: https://api.github.com, or https://<host>/api/v3 for GitHub Enterprise "
                   "Server. Required.",
        "credentials": "A token (fine-grained or classic personal access token, or a GitHub App installation "
                       "token) with read/write access to the repositories' issues.",
        "webhookSecret": "The secret set on the repository (or organization) webhook: GitHub signs each delivery "
                         "with X-Hub-Signature-256 (HMAC-SHA256 of the body).",
        "serviceAccountId": "The numeric user id of the account the token belongs to (GET /user → id): its own "
                            "comments and changes are echoes.",
        "stateMapping": "open and closed (required), optional closed:<state_reason> overrides and label "
                        "conventions in precedence order: {\"labels\": {\"blocked\": \"blocked\", \"in review\": "
                        "\"review\"}}. GitHub has no workflow to check the mapping against.",
        "config": "Optional; e.g. outboundStates naming the state each category is written as.",
        "webhooks": "Add a webhook to each repository (Settings → Webhooks) with this URL, content type "
                    "application/json, the webhook secret, and the Issues and Issue comments events. Polling is "
                    "the backstop.",
        "stateMappingExample": '{"open": "backlog", "closed": "terminal", "labels": {"blocked": "blocked", '
                               '"in review": "review", "in progress": "active"}}',
    }
    delivery_id_header = "x-github-delivery"
    capabilities = Capabilities(
        operations=ALL_OPERATIONS,
        state_categories=frozenset(StateCategory.ALL),
        signed_webhooks=True,
        routing_rule_kinds=frozenset({"default_route", "label", "state_lane", "comment_command", "user_mapping"}),
        has_external_keys=True,
    )

    def __init__(self, config: AdapterConfig, *, client: httpx.Client | None = None, per_page: int = PER_PAGE):
        """``client``: an httpx.Client to use instead of the adapter's own (tests, shared pools);
        ``per_page``: listing page size (GitHub's maximum, 100, unless a test wants small pages)."""
        super().__init__(config)
        self.per_page = max(1, min(100, int(per_page)))
        self.base_url = config.base_url.rstrip("/")
        self.graphql_url = graphql_url_for(self.base_url)
        self._containers = {c.strip().lower(): c.strip() for c in config.containers}
        self._mapping = _Mapping(config.state_mapping)
        self._init_client(client)

    # --- HTTP ------------------------------------------------------------------------------------
    def _client_headers(self) -> dict:
        headers = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": API_VERSION,
                   "User-Agent": USER_AGENT}
        if self.config.credentials:
            headers["Authorization"] = f"Bearer {self.config.credentials}"
        return headers

    def _same_origin(self, url: str) -> bool:
        base, target = urlsplit(self.base_url), urlsplit(url)
        return (target.scheme, target.netloc) == (base.scheme, base.netloc) and \
            target.path.startswith(base.path.rstrip("/") + "/")

    def _url(self, path: str) -> str:
        return self.base_url + path

    def _request(self, method: str, url: str, *, params=None, json_body=None) -> httpx.Response:
        response = self._send(method, url, f"GitHub {method} {url}", params=params, json=json_body)
        if response.is_success:
            return response
        raise self._status_error(method, url, response)

    @staticmethod
    def _status_error(method: str, url: str, response: httpx.Response) -> ProviderError:
        status = response.status_code
        body = maybe_json(response)
        message = (body.get("message") if isinstance(body, dict) else None) or response.reason_phrase
        what = f"GitHub {method} {urlsplit(url).path} -> {status}: {message}"
        headers = response.headers
        # 403 is a rate limit only when GitHub says so (headers or message); any 429 is one.
        exhausted = headers.get("x-ratelimit-remaining") == "0"
        limited = status in (403, 429) and (header_retry_after(headers) is not None or exhausted or status == 429
                                            or "rate limit" in str(message).lower())
        # Reset time only counts when the quota is exhausted; otherwise GitHub says wait a minute.
        wait = retry_after(headers, *(["x-ratelimit-reset"] if exhausted else [])) if limited else None
        return status_error(what, status, rate_limited=limited, retry_after=wait, auth=status == 401)

    def _json(self, response: httpx.Response):
        return json_body(response, f"GitHub returned a non-JSON body for {response.request.url.path}.")

    # --- helpers ---------------------------------------------------------------------------------
    def _container(self, owner: str, name: str) -> str:
        full = f"{owner}/{name}".lower()
        if full not in self._containers:
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD,
                                f"Repository '{owner}/{name}' is not one of this connector's containers.")
        return self._containers[full]

    def _scope(self, scope: str) -> str:
        m = _REPO_RE.match((scope or "").strip())
        if not m:
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, f"GitHub scope must be 'owner/name', got {scope!r}.")
        return self._container(m.group(1), m.group(2))

    def _ref_target(self, ref: ExternalTaskRef) -> tuple[str, int]:
        owner, name, number = parse_key(ref.external_key)
        return self._container(owner, name), number

    def actor(self, user: Mapping[str, Any] | None) -> ExternalActor | None:
        if not isinstance(user, Mapping):
            return None
        login = str(user.get("login") or "")
        uid = str(user.get("id") or "")
        service = (self.config.service_account_id or "").strip()
        is_service = bool(service) and (service == uid or service.lower() == login.lower())
        return ExternalActor(provider_key=self.provider_key, external_user_id=uid or login, display_name=login,
                             is_connector_service_account=is_service)

    def _state(self, state: str | None, state_reason: str | None, labels: Iterable[str]) -> tuple[ExternalState, str | None]:
        mapping = self._mapping
        state = normalize_state_name(state)
        reason = normalize_state_name(state_reason) or None
        label_set = set(labels)
        if state == "open" or (state == "closed" and mapping.labels_override_closed):
            for label, category in mapping.labels:
                if label in label_set:
                    if category in StateCategory.ALL:
                        return ExternalState(label, category), None
                    return ExternalState(label, StateCategory.BACKLOG), label
        if state == "closed":
            name = "closed" if reason in (None, "completed") else f"closed:{reason}"
            candidates = [f"closed:{reason or 'completed'}", "closed"]
        else:
            name = state or "unknown"
            candidates = [name]
        for candidate in candidates:
            category = mapping.states.get(candidate)
            if category is not None:
                if category in StateCategory.ALL:
                    return ExternalState(name, category), None
                break
        return ExternalState(name, StateCategory.BACKLOG), name

    def normalize_issue(self, issue: Mapping[str, Any], repository: Mapping[str, Any] | None = None) -> ExternalTask:
        """REST/webhook issue object -> ExternalTask. Raises KeyError/TypeError on a malformed object."""
        number = int(issue["number"])
        full_name = None
        if isinstance(repository, Mapping) and repository.get("full_name"):
            full_name = repository["full_name"]
        else:
            m = re.search(r"/repos/([^/]+/[^/]+)$", str(issue.get("repository_url") or ""))
            full_name = m.group(1) if m else None
        container = self._containers.get((full_name or "").lower(), full_name)
        raw_labels = [(lbl.get("name") if isinstance(lbl, Mapping) else lbl) for lbl in issue.get("labels") or ()]
        raw_labels = [str(lbl) for lbl in raw_labels if lbl is not None]
        labels = normalize_labels(raw_labels)
        state, unmapped = self._state(issue.get("state"), issue.get("state_reason"), labels)
        title, title_mentions = neutralize_mentions(str(issue.get("title") or ""))
        body, body_mentions = neutralize_mentions(issue.get("body"))
        assignees = [a for a in (issue.get("assignees") or ()) if isinstance(a, Mapping)]
        if not assignees and isinstance(issue.get("assignee"), Mapping):
            assignees = [issue["assignee"]]
        milestone = issue.get("milestone") if isinstance(issue.get("milestone"), Mapping) else None
        reactions = issue.get("reactions") if isinstance(issue.get("reactions"), Mapping) else None
        pr = issue.get("pull_request") if isinstance(issue.get("pull_request"), Mapping) else None
        envelope: dict[str, Any] = {
            "number": number,
            "nodeId": issue.get("node_id"),
            "repository": {"fullName": container,
                           "id": repository.get("id") if isinstance(repository, Mapping) else None},
            "state": issue.get("state"),
            "stateReason": issue.get("state_reason"),
            "labels": raw_labels,
            "assignees": [a.get("login") for a in assignees],
            "milestone": ({"number": milestone.get("number"), "title": milestone.get("title"),
                           "state": milestone.get("state"), "dueOn": milestone.get("due_on")} if milestone else None),
            "reactions": ({k: v for k, v in reactions.items() if k != "url"} if reactions else None),
            "pullRequest": ({"url": pr.get("html_url") or pr.get("url"), "mergedAt": pr.get("merged_at")} if pr else None),
            "authorAssociation": issue.get("author_association"),
            "author": ({"login": issue["user"].get("login"), "id": issue["user"].get("id")}
                       if isinstance(issue.get("user"), Mapping) else None),
            "locked": issue.get("locked"),
            "activeLockReason": issue.get("active_lock_reason"),
            "commentCount": issue.get("comments"),
            "closedAt": issue.get("closed_at"),
            "descriptionFormat": "markdown",
        }
        note_envelope(envelope, title_mentions + body_mentions, unmapped)
        return ExternalTask(
            provider_key=self.provider_key,
            external_id=str(issue["id"]),
            external_key=f"{container}#{number}" if container else None,
            title=title or "",
            description=body,
            state=state,
            priority=None,
            assignees=tuple(a for a in (self.actor(u) for u in assignees) if a),
            labels=tuple(labels),
            url=web_url(issue.get("html_url")),
            created_at=_utc(issue.get("created_at")),
            updated_at=_utc(issue.get("updated_at")),
            revision=issue.get("updated_at"),
            container_id=container,
            envelope=envelope,
        )

    def normalize_comment(self, comment: Mapping[str, Any], external_task_id: str) -> ExternalComment:
        body, mentions = neutralize_mentions(comment.get("body") or "")
        envelope = {"nodeId": comment.get("node_id"), "authorAssociation": comment.get("author_association"),
                    "issueUrl": comment.get("issue_url")}
        if mentions:
            envelope["mentionsNeutralized"] = mentions
        if comment.get("performed_via_github_app"):
            app = comment["performed_via_github_app"]
            envelope["performedViaGithubApp"] = app.get("slug") if isinstance(app, Mapping) else app
        author = self.actor(comment.get("user")) or ExternalActor(self.provider_key, "", "ghost")
        return ExternalComment(
            external_comment_id=str(comment["id"]), external_task_id=external_task_id, author=author,
            body=body or "", url=web_url(comment.get("html_url")), created_at=_utc(comment.get("created_at")),
            updated_at=_utc(comment.get("updated_at")), envelope=envelope)

    # --- cursors ---------------------------------------------------------------------------------
    def _decode_cursor(self, cursor: str | None, scope: str, path_suffix: str) -> dict:
        if cursor is None:
            return {"v": 1, "scope": scope, "since": None, "seen": []}
        data = _load_cursor(cursor, scope, "GitHub")
        since = data.get("since")
        if since is not None and (not isinstance(since, str) or _utc(since) is None):
            raise ProviderError(ErrorCategory.CURSOR_INVALID, "GitHub cursor 'since' is not a timestamp.")
        seen = data.get("seen", [])
        if not isinstance(seen, list) or not all(isinstance(s, (str, int)) for s in seen):
            raise ProviderError(ErrorCategory.CURSOR_INVALID, "GitHub cursor 'seen' is not a list of ids.")
        nxt = data.get("next")
        if nxt is not None:
            if not isinstance(nxt, str) or not self._same_origin(nxt) or not urlsplit(nxt).path.endswith(path_suffix):
                raise ProviderError(ErrorCategory.CURSOR_INVALID, "GitHub cursor 'next' is not a listing URL on this host.")
        return {"v": 1, "scope": data["scope"], "since": since, "seen": [str(s) for s in seen], "next": nxt}

    @staticmethod
    def _encode_cursor(state: dict) -> str:
        out = {"v": 1, "scope": state["scope"], "since": state["since"], "seen": state["seen"]}
        if state.get("next"):
            out["next"] = state["next"]
        return json.dumps(out, separators=(",", ":"))

    def _page(self, state: dict, first_url: str, params: dict, path_suffix: str, bad: list | None = None):
        """Fetch one listing page; returns (new raw items, next state, advanced?). With ``bad`` (a list),
        rows without an id are reported there instead of failing the page."""
        if state.get("next"):
            response = self._request("GET", state["next"])
        else:
            q = dict(params)
            if state["since"]:
                q["since"] = state["since"]
            response = self._request("GET", first_url, params=q)
        rows = self._json(response)
        if not isinstance(rows, list):
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, "GitHub listing did not return a JSON array.")
        keyed = []
        for row in rows:
            if not isinstance(row, Mapping) or "id" not in row:
                if bad is None:
                    raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, "GitHub listing row without an id.")
                bad.append(skipped_record(row, "GitHub listing row without an id."))
                continue
            keyed.append((str(row["id"]), _utc(row.get("updated_at")), row))
        # GitHub's since is inclusive: the high water is the next since, its ids the next seen.
        fresh, since, seen = scan_rows(keyed, state["since"], state["seen"], state["since"], state["seen"], fmt=_iso)
        nxt = (response.links.get("next") or {}).get("url")
        new_state = {"v": 1, "scope": state["scope"], "since": since, "seen": seen, "next": nxt}
        if nxt and not (self._same_origin(nxt) and urlsplit(nxt).path.endswith(path_suffix)):
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD,
                                f"GitHub's Link rel=next ({nxt}) is not a listing URL under {self.base_url}.")
        return fresh, new_state, bool(fresh) or bool(nxt)

    # --- §5.1 required ---------------------------------------------------------------------------
    def list_candidate_tasks(self, scope: str, cursor: str | None) -> Page:
        repo = self._scope(scope)
        state = self._decode_cursor(cursor, repo, "/issues")
        params = {"state": "all", "sort": "updated", "direction": "asc", "per_page": self.per_page}
        skipped: list[dict] = []
        rows, new_state, advanced = self._page(state, self._url(f"/repos/{repo}/issues"), params, "/issues",
                                               bad=skipped)
        # One malformed issue is reported and left out; the rest of the page and the cursor go on (§13.1.8).
        tasks, malformed = normalize_each(self.normalize_issue, [row for row in rows if "pull_request" not in row],
                                          "GitHub issue in listing", key_of=lambda row: f"{repo}#{row.get('number')}")
        return Page(items=tasks, cursor=self._encode_cursor(new_state) if advanced else None,
                    skipped=skipped + malformed)

    def get_task(self, ref: ExternalTaskRef) -> ExternalTask:
        repo, number = self._ref_target(ref)
        issue = self._json(self._request("GET", self._url(f"/repos/{repo}/issues/{number}")))
        if not isinstance(issue, Mapping):
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, "GitHub issue response is not an object.")
        if "pull_request" in issue:
            raise ProviderError(ErrorCategory.PROVIDER_STATUS, f"{repo}#{number} is a pull request.", status=404)
        try:
            return self.normalize_issue(issue)
        except (KeyError, TypeError, ValueError) as exc:
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, f"Malformed GitHub issue: {exc!r}") from exc

    def get_task_states(self, refs: list[ExternalTaskRef]) -> dict[str, ExternalState | None]:
        by_repo: dict[str, list[tuple[ExternalTaskRef, int]]] = {}
        for ref in refs:
            repo, number = self._ref_target(ref)
            by_repo.setdefault(repo, []).append((ref, number))
        result: dict[str, ExternalState | None] = {}
        for repo, items in by_repo.items():
            owner, name = repo.split("/", 1)
            for start in range(0, len(items), GRAPHQL_BATCH):
                chunk = items[start:start + GRAPHQL_BATCH]
                result.update(self._graphql_states(owner, name, chunk))
        return result

    def _graphql_states(self, owner: str, name: str, chunk) -> dict[str, ExternalState | None]:
        fields = "databaseId number state stateReason labels(first: 100) { nodes { name } }"
        numbers = sorted({number for _, number in chunk})
        aliases = " ".join(f"i{n}: issue(number: {n}) {{ {fields} }}" for n in numbers)
        query = f"query {{ repository(owner: {json.dumps(owner)}, name: {json.dumps(name)}) {{ {aliases} }} }}"
        response = self._request("POST", self.graphql_url, json_body={"query": query})
        payload = self._json(response)
        if not isinstance(payload, Mapping):
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, "GitHub GraphQL response is not an object.")
        errors = payload.get("errors") or []
        missing: set[str] = set()
        for err in errors:
            kind = str(err.get("type") or "").upper() if isinstance(err, Mapping) else ""
            path = err.get("path") or [] if isinstance(err, Mapping) else []
            if kind == "RATE_LIMITED":
                raise ProviderError(ErrorCategory.PROVIDER_RATE_LIMITED, f"GitHub GraphQL: {err.get('message')}",
                                    retry_after=60.0)
            if kind == "NOT_FOUND" and len(path) == 2 and path[0] == "repository":
                missing.add(str(path[1]))
            elif kind == "NOT_FOUND" and list(path) == ["repository"]:
                raise ProviderError(ErrorCategory.PROVIDER_STATUS, f"GitHub repository {owner}/{name} not found.", status=404)
            else:
                raise ProviderError(ErrorCategory.PROVIDER_STATUS, f"GitHub GraphQL error: {err}")
        data = payload.get("data")
        repo_data = data.get("repository") if isinstance(data, Mapping) else None
        if not isinstance(repo_data, Mapping):
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, "GitHub GraphQL response has no repository data.")
        out: dict[str, ExternalState | None] = {}
        for ref, number in chunk:
            node = repo_data.get(f"i{number}")
            if not isinstance(node, Mapping) or str(node.get("databaseId")) != str(ref.external_id):
                # absent (deleted / transferred / a pull request) or another issue under that number
                out[ref.external_id] = None
                continue
            labels = normalize_labels([(n or {}).get("name") for n in ((node.get("labels") or {}).get("nodes") or [])])
            state, _ = self._state(node.get("state"), node.get("stateReason"), labels)
            out[ref.external_id] = state
        return out

    def list_comments(self, ref: ExternalTaskRef, cursor: str | None) -> Page:
        repo, number = self._ref_target(ref)
        state = self._decode_cursor(cursor, f"{repo}#{number}", "/comments")
        skipped: list[dict] = []
        rows, new_state, advanced = self._page(state, self._url(f"/repos/{repo}/issues/{number}/comments"),
                                               {"per_page": self.per_page}, "/comments", bad=skipped)
        # one malformed comment is reported and left out; the rest and the cursor go on (§13.1.8)
        comments, malformed = normalize_each(lambda row: self.normalize_comment(row, ref.external_id), rows,
                                             "GitHub comment")
        return Page(items=comments, cursor=self._encode_cursor(new_state) if advanced else None,
                    skipped=skipped + malformed)

    def verify_webhook(self, request: WebhookRequest) -> VerifiedEvent:
        headers = lower_headers(request.headers)
        secret = self.config.webhook_secret
        if not secret:
            raise WebhookRejected("No webhook secret is configured for this connector; GitHub deliveries cannot be verified.")
        signature = headers.get("x-hub-signature-256")
        if not signature:
            raise WebhookRejected("Missing X-Hub-Signature-256 header.")
        m = _SIG_RE.match(signature.strip())
        if not m:
            raise WebhookRejected("Malformed X-Hub-Signature-256 header (expected 'sha256=<64 hex>').")
        body = request.body or b""
        if not signature_matches(secret, body, m.group(1)):
            raise WebhookRejected("X-Hub-Signature-256 does not match the body.")
        # --- signature verified; only now parse -------------------------------------------------
        event_id = webhook_event_id(headers.get("x-github-delivery"), body)
        event = (headers.get("x-github-event") or "").strip()
        if not event:
            raise WebhookUnparseable("Missing X-GitHub-Event header.")
        payload = webhook_json(body, "GitHub")
        repository = payload.get("repository")
        container = None
        if repository is not None:
            if not isinstance(repository, Mapping) or not isinstance(repository.get("full_name"), str):
                raise WebhookUnparseable("GitHub webhook 'repository' has no full_name.")
            container = self._containers.get(repository["full_name"].lower())
            if container is None:
                raise WebhookRejected(
                    f"Delivery for repository '{repository['full_name']}', which is not one of this connector's "
                    f"containers ({', '.join(sorted(self._containers.values())) or 'none'}).",
                    category=ErrorCategory.PROVIDER_PAYLOAD)
        action = payload.get("action")
        action_name = f"{event}.{action}" if isinstance(action, str) and action else event
        actor = self.actor(payload.get("sender"))
        if event not in ("issues", "issue_comment"):
            return VerifiedEvent(event_id=event_id, kind=EventKind.IGNORED, action=action_name, external_task_id=None,
                                 actor=actor, container_id=container)
        try:
            if not isinstance(action, str) or not action:
                raise KeyError("action")
            if container is None:
                raise KeyError("repository")
            issue = payload["issue"]
            if not isinstance(issue, Mapping):
                raise TypeError("issue is not an object")
            task_id = str(issue["id"])
            is_pr = "pull_request" in issue
            if is_pr:
                return VerifiedEvent(event_id=event_id, kind=EventKind.IGNORED, action=action_name,
                                     external_task_id=task_id, actor=actor, container_id=container)
            task = self.normalize_issue(issue, repository)
            if event == "issues":
                kind = EventKind.TASK_DELETED if action in ISSUE_ACTIONS_DELETE else EventKind.TASK_UPSERTED
                return VerifiedEvent(event_id=event_id, kind=kind, action=action_name, external_task_id=task_id,
                                     occurred_at=task.updated_at, task=task, actor=actor, container_id=container)
            raw_comment = payload["comment"]
            if not isinstance(raw_comment, Mapping):
                raise TypeError("comment is not an object")
            comment = self.normalize_comment(raw_comment, task_id)
        except (KeyError, TypeError, ValueError) as exc:
            raise WebhookUnparseable(f"GitHub {action_name} payload is missing or has a bad key: {exc}") from None
        kind = EventKind.COMMENT_DELETED if action == "deleted" else EventKind.COMMENT_UPSERTED
        return VerifiedEvent(event_id=event_id, kind=kind, action=action_name, external_task_id=task_id,
                             occurred_at=comment.updated_at or comment.created_at, task=task, comment=comment,
                             actor=actor, container_id=container)

    def validate_state_mapping(self, mapping: Mapping[str, Any]) -> dict[str, list[str]]:
        errors: dict[str, list[str]] = {}

        def add(field_name, reason):
            errors.setdefault(field_name, []).append(reason)

        if not isinstance(mapping, Mapping):
            return {"stateMapping": ["must be an object"]}
        categories = ", ".join(StateCategory.ALL)
        keys = {normalize_state_name(k): k for k in mapping}
        for required in ("open", "closed"):
            if required not in keys:
                add(required, f"required: map {required} issues to one of {categories}")
        for norm, key in keys.items():
            value = mapping[key]
            if norm == "labels":
                if not isinstance(value, (Mapping, list)):
                    add("labels", "must be an object {label: category} or a list of [label, category] pairs")
                    continue
                if isinstance(value, list) and len(_label_pairs(value)) != len(value):
                    add("labels", "every entry must be a [label, category] pair")
                seen = set()
                for label, category in _label_pairs(value):
                    lname = normalize_state_name(label) if isinstance(label, str) else ""
                    if not lname:
                        add("labels", f"label names must be non-empty strings, got {label!r}")
                        continue
                    if lname in seen:
                        add(f"labels.{lname}", "duplicate label (names compare trimmed + lowercased)")
                    seen.add(lname)
                    if normalize_state_name(category if isinstance(category, str) else "") not in StateCategory.ALL:
                        add(f"labels.{lname}", f"unknown category {category!r}; expected one of {categories}")
            elif norm == "labels_override_closed":
                if not isinstance(value, bool):
                    add(key, "must be true or false")
            elif norm in ("open", "closed") or (norm.startswith("closed:") and norm[7:] in CLOSED_REASONS):
                if not isinstance(value, str) or normalize_state_name(value) not in StateCategory.ALL:
                    add(key, f"unknown category {value!r}; expected one of {categories}")
            else:
                add(key, "unknown key; expected open, closed, closed:<completed|not_planned|duplicate>, labels, "
                         "labels_override_closed")
        return errors

    # --- §5.2 optional writes --------------------------------------------------------------------
    def create_task(self, scope: str, projection: Mapping[str, Any]) -> ExternalTask:
        repo = self._scope(scope)
        title = required_title(projection)
        body = {"title": title}
        if projection.get("description") is not None:
            body["body"] = projection["description"]
        if projection.get("labels"):
            body["labels"] = list(projection["labels"])
        issue = self._json(self._request("POST", self._url(f"/repos/{repo}/issues"), json_body=body))
        task = self.normalize_issue(issue)
        target = projection.get("state")
        if target:
            ref = ExternalTaskRef(task.external_id, task.external_key)
            self.update_task_state(ref, target)
            task = self.get_task(ref)
        return task

    def update_task_state(self, ref: ExternalTaskRef, target_state_name: str) -> None:
        repo, number = self._ref_target(ref)
        target = normalize_state_name(target_state_name)
        conventions = self._mapping.label_names()
        url = self._url(f"/repos/{repo}/issues/{number}")
        if target == "closed" or (target.startswith("closed:") and target[7:] in CLOSED_REASONS):
            reason = "completed" if target == "closed" else target[7:]
            self._request("PATCH", url, json_body={"state": "closed", "state_reason": reason})
            return
        if target != "open" and target not in conventions:
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD,
                                f"Unknown GitHub target state {target_state_name!r}; expected open, closed, "
                                f"closed:<reason> or a label convention ({', '.join(sorted(conventions)) or 'none'}).")
        issue = self._json(self._request("GET", url))
        current = [(lbl.get("name") if isinstance(lbl, Mapping) else lbl) for lbl in (issue or {}).get("labels") or ()]
        keep = [lbl for lbl in current if normalize_state_name(lbl) not in conventions]
        if target != "open":
            keep.append(target)
        body: dict[str, Any] = {"labels": keep}
        if (issue or {}).get("state") != "open":
            body.update(state="open", state_reason="reopened")
        self._request("PATCH", url, json_body=body)

    def post_comment(self, ref: ExternalTaskRef, body: str) -> str:
        repo, number = self._ref_target(ref)
        comment = self._json(self._request("POST", self._url(f"/repos/{repo}/issues/{number}/comments"),
                                           json_body={"body": body}))
        return str(comment["id"])

    def set_fields(self, ref: ExternalTaskRef, fields: Mapping[str, Any]) -> None:
        repo, number = self._ref_target(ref)
        body: dict[str, Any] = {}
        for key, value in fields.items():
            if key == "title":
                body["title"] = value
            elif key in ("description", "body"):
                body["body"] = value
            elif key == "labels":
                body["labels"] = list(value or [])
            else:
                raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD,
                                    f"GitHub set_fields supports title, description, labels; not {key!r}.")
        if body:
            self._request("PATCH", self._url(f"/repos/{repo}/issues/{number}"), json_body=body)

    def set_backlink(self, ref: ExternalTaskRef, paperclip_url: str) -> None:
        """One comment carrying ``<!-- paperclip:backlink -->``: edited in place when it exists."""
        repo, number = self._ref_target(ref)
        text = f"{BACKLINK_MARKER}\nTracked in Paperclip: {paperclip_url}"
        for comment in self._all_comments(repo, number):
            if isinstance(comment, Mapping) and _BACKLINK_RE.match(comment.get("body") or ""):
                if comment.get("body") != text:
                    self._request("PATCH", self._url(f"/repos/{repo}/issues/comments/{comment['id']}"),
                                  json_body={"body": text})
                return
        self._request("POST", self._url(f"/repos/{repo}/issues/{number}/comments"), json_body={"body": text})

    def find_backlinks(self, ref: ExternalTaskRef) -> list[str]:
        """The comments in exactly the format :meth:`set_backlink` writes (a mirrored comment that
        quotes the marker has an attribution line first and does not count)."""
        repo, number = self._ref_target(ref)
        found = []
        for comment in self._all_comments(repo, number):
            match = _BACKLINK_RE.match(comment.get("body") or "") if isinstance(comment, Mapping) else None
            if match:
                found.append(match.group(1))
        return found

    def _all_comments(self, repo: str, number: int):
        """Every comment of the issue, oldest first, following ``Link rel=next`` on this host only."""
        url = self._url(f"/repos/{repo}/issues/{number}/comments")
        params: dict | None = {"per_page": self.per_page}
        while url:
            response = self._request("GET", url, params=params)
            rows = self._json(response)
            if not isinstance(rows, list):
                raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, "GitHub comment listing is not a JSON array.")
            yield from rows
            url, params = (response.links.get("next") or {}).get("url"), None
            if url and not self._same_origin(url):
                raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, "GitHub pagination link points at another host.")
