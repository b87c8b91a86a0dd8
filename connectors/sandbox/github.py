"""A small GitHub-compatible HTTP server for tests and the offline demo (stdlib only, no Django).

It speaks the real REST shapes the GitHub Issues adapter uses, holds everything in memory, and sends
signed webhook deliveries shaped like GitHub's (``X-GitHub-Event``, ``X-GitHub-Delivery``,
``X-Hub-Signature-256``) for every mutation, whether made through the API or a control method.

Use from Python::

    sandbox = GitHubSandbox(repos=("demo/app",), token="t", webhook_secret="s").start()
    sandbox.base_url            # "http://127.0.0.1:<port>"  (REST root; GraphQL at base_url + "/graphql")
    issue = sandbox.open_issue("Fix the README", labels=["bug"])   # emits issues.opened
    sandbox.comment(issue["number"], "On it")                       # emits issue_comment.created
    sandbox.deliveries[-1].headers / .body / .status
    sandbox.stop()

Standalone (offline demo; secrets from arguments or the environment only)::

    python -m connectors.sandbox.github --port 8765 --repo demo/app --token "$GITHUB_SANDBOX_TOKEN" \\
        --webhook-url http://127.0.0.1:8000/... --webhook-secret "$GITHUB_SANDBOX_WEBHOOK_SECRET" --seed 5

Control endpoints for the demo: ``POST /_sandbox/<control method>`` with a JSON object of keyword
arguments (e.g. ``/_sandbox/open_issue {"title": "x"}``), ``GET /_sandbox/deliveries``,
``GET /_sandbox/requests``; they need the same bearer token.

REST endpoints: ``GET /user``, ``GET /rate_limit``, ``GET /repos/{o}/{r}``,
``GET|POST /repos/{o}/{r}/issues`` (``state``, ``sort``, ``direction``, ``since``, ``labels``,
``per_page``, ``page``; ``Link`` headers in GitHub's ``/repositories/{id}/...`` form, which is served
too), ``GET|PATCH /repos/{o}/{r}/issues/{n}`` (404 unknown, 410 deleted),
``GET|POST /repos/{o}/{r}/issues/{n}/comments`` (``since``, paging),
``GET|PATCH|DELETE /repos/{o}/{r}/issues/comments/{id}``, ``POST /repos/{o}/{r}/issues/{n}/labels``,
``DELETE /repos/{o}/{r}/issues/{n}/labels/{name}``, ``GET|POST /repos/{o}/{r}/hooks`` and
``POST /graphql`` for exactly the aliased ``repository(owner:, name:) { iN: issue(number: N) {...} }``
query. Every path is also served under ``/api/v3`` (GraphQL under ``/api/graphql``) to look like
GitHub Enterprise Server. Every response carries ``x-ratelimit-*`` headers.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import parse_qs, quote, urlencode

from connectors.sandbox.base import (  # noqa: F401  (RequestRecord: a public name of this module)
    START_TIME,
    DeliveryRecord,
    RequestRecord,
    SandboxServer,
    cli_parser,
    deep_merge,
    hmac_sha256_hex,
    serve_until_interrupted,
)
from connectors.sandbox.base import parse_ts as _parse_ts

# Real payloads (octokit/webhooks), copied unchanged; see fixtures/README.md for their sources.
DEFAULT_FIXTURES_DIR = str(Path(__file__).resolve().parent / "fixtures" / "github")
FIXTURE_REPO = "Codertocat/Hello-World"
DOCS = "https://docs.github.com/rest"
RATE_LIMIT = 5000
CLOSED_REASONS = ("completed", "not_planned", "duplicate")
CONTROL_METHODS = (
    "add_repo", "add_user", "add_hook", "open_issue", "open_pull_request", "edit_issue", "close_issue",
    "reopen_issue", "label", "unlabel", "assign", "unassign", "comment", "edit_comment", "delete_comment",
    "delete_issue", "transfer_issue", "deliver_fixture", "fail_next", "flush", "advance",
    "outage", "recover",
)


def _iso(value: datetime | None) -> str | None:
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ") if value else None


def sign(secret: str, body: bytes) -> str:
    """``sha256=<hex HMAC-SHA256(secret, body)>``, GitHub's ``X-Hub-Signature-256``."""
    return "sha256=" + hmac_sha256_hex(secret, body)


@dataclass
class Delivery(DeliveryRecord):
    """One webhook delivery (sent or only recorded). ``headers`` as sent; ``body`` the exact bytes."""

    event: str
    action: str | None
    delivery_id: str
    headers: dict
    body: bytes
    hook_id: int | None = None

    def summary(self) -> dict:
        return {"event": self.event, "action": self.action, "deliveryId": self.delivery_id, "hookId": self.hook_id,
                "url": self.url, "status": self.status, "error": self.error, "delivered": self.delivered}


@dataclass
class _Issue:
    id: int
    node_id: str
    repo: str  # lower full name
    number: int
    title: str
    body: str | None
    user: str  # login (lower key)
    created_at: datetime
    updated_at: datetime
    labels: list = field(default_factory=list)  # label names as spelled
    assignees: list = field(default_factory=list)  # logins
    state: str = "open"
    state_reason: str | None = None
    closed_at: datetime | None = None
    is_pr: bool = False
    deleted: bool = False
    transferred_to: tuple | None = None  # (repo, number)
    locked: bool = False


@dataclass
class _Comment:
    id: int
    node_id: str
    repo: str
    number: int
    issue_id: int
    body: str
    user: str
    created_at: datetime
    updated_at: datetime
    deleted: bool = False


class _SandboxError(Exception):
    def __init__(self, status: int, message: str, extra: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.extra = status, message, extra or {}


class GitHubSandbox(SandboxServer):
    """In-memory GitHub with an HTTP server. See the module docstring for the endpoint list.

    ``repos``: repositories to create (``"owner/name"``); ``token``: the bearer token the API accepts
    (``None`` disables auth); ``service_login``: the user that token belongs to (API mutations are
    attributed to it); ``default_actor``: the human who performs control-method mutations;
    ``webhook_url`` + ``webhook_secret``: register one hook at start (a secret without a URL records
    signed deliveries without sending them); ``delivery_mode``: ``"sync"`` (sent before the mutating
    call returns) or ``"queued"`` (sent by :meth:`flush`); ``real_clock``: timestamps from the wall
    clock instead of a deterministic clock that starts at 2026-01-01T00:00:00Z and moves ``tick``
    seconds per mutation."""

    provider = "github"
    server_version = "GitHubSandbox/1.0"
    http_methods = ("GET", "POST", "PATCH", "DELETE", "PUT")
    control_methods = CONTROL_METHODS
    failure_modes = ("rate_limit", "secondary", "retry_after_429", "error")

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, repos=("octo-org/octo-repo",),
                 token: str | None = "sandbox-token", service_login: str = "paperclip-bot",
                 default_actor: str = "octocat", webhook_url: str | None = None, webhook_secret: str | None = None,
                 delivery_mode: str = "sync", real_clock: bool = False, tick: float = 1.0,
                 fixtures_dir: str | None = None, delivery_timeout: float = 10.0):
        self._init_sandbox(host=host, port=port, token=token, delivery_mode=delivery_mode, real_clock=real_clock,
                           tick=tick, fixtures_dir=fixtures_dir, default_fixtures_dir=DEFAULT_FIXTURES_DIR,
                           delivery_timeout=delivery_timeout)
        self._clock = START_TIME  # also with real_clock: advance() then moves only the deterministic clock
        self.service_login = service_login
        self.default_actor = default_actor
        self._ids = {"user": 5000000, "repo": 700000000, "issue": 2000000000, "comment": 3000000000,
                     "hook": 400000000, "label": 100000}
        self._users: dict[str, dict] = {}
        self._repos: dict[str, dict] = {}
        self._issues: dict[tuple[str, int], _Issue] = {}
        self._comments: dict[int, _Comment] = {}
        self._label_ids: dict[tuple[str, str], int] = {}
        self._hooks: list[dict] = []
        self._rate = {"core": 0, "graphql": 0}
        self._rate_reset = int(time.time()) + 3600
        self.add_user(service_login, type="Bot" if service_login.endswith("[bot]") else "User")
        self.add_user(default_actor)
        for repo in repos:
            self.add_repo(repo)
        if webhook_url or webhook_secret:
            self.add_hook(webhook_url, webhook_secret)

    @property
    def graphql_url(self) -> str:
        return self.base_url + "/graphql"

    @property
    def enterprise_base_url(self) -> str:
        """The same server addressed GHES-style (REST under /api/v3, GraphQL at /api/graphql)."""
        return self.base_url + "/api/v3"

    # --- ids, clock, users, repos --------------------------------------------------------------
    def _next_id(self, kind: str) -> int:
        self._ids[kind] += 1
        return self._ids[kind]

    _format_ts = staticmethod(_iso)

    def _stamp(self) -> datetime:
        if self.real_clock:  # GitHub timestamps have whole seconds
            return datetime.now(timezone.utc).replace(microsecond=0)
        return super()._stamp()

    def now(self) -> str:
        return _iso(datetime.now(timezone.utc) if self.real_clock else self._clock)

    def add_user(self, login: str, *, type: str = "User") -> dict:
        with self._lock:
            key = login.lower()
            if key not in self._users:
                uid = self._next_id("user")
                self._users[key] = {"login": login, "id": uid, "type": type,
                                    "node_id": base64.b64encode(f"04:User{uid}".encode()).decode()}
            return self.render_user(login)

    def user(self, login: str) -> dict:
        return self.render_user(login)

    def add_repo(self, full_name: str) -> dict:
        with self._lock:
            key = full_name.lower()
            if key not in self._repos:
                owner, name = full_name.split("/", 1)
                self.add_user(owner, type="Organization")
                rid = self._next_id("repo")
                self._repos[key] = {"id": rid, "full_name": full_name, "owner": owner, "name": name,
                                    "next_number": 1, "created_at": self._stamp(),
                                    "node_id": base64.b64encode(f"010:Repository{rid}".encode()).decode()}
            return self.render_repo(full_name)

    def _repo(self, repo: str | None) -> dict:
        key = (repo or next(iter(self._repos.values()))["full_name"]).lower()
        if key not in self._repos:
            raise _SandboxError(404, "Not Found")
        return self._repos[key]

    def _repo_by_id(self, rid: int) -> dict:
        for repo in self._repos.values():
            if repo["id"] == rid:
                return repo
        raise _SandboxError(404, "Not Found")

    def _issue(self, repo: str | None, number: int, *, allow_deleted=False) -> _Issue:
        r = self._repo(repo)
        issue = self._issues.get((r["full_name"].lower(), int(number)))
        if issue is None:
            raise _SandboxError(404, "Not Found")
        if issue.transferred_to and not allow_deleted:
            raise _SandboxError(301, "Moved Permanently")
        if issue.deleted and not allow_deleted:
            raise _SandboxError(410, "This issue was deleted")
        return issue

    # --- rendering (REST / webhook shapes) -----------------------------------------------------
    def render_user(self, login: str | None) -> dict | None:
        if not login:
            return None
        u = self._users.get(login.lower()) or self._users[self.add_user(login)["login"].lower()]
        api, html, name = self.base_url, self.base_url, u["login"]
        return {
            "login": name, "id": u["id"], "node_id": u["node_id"],
            "avatar_url": f"{html}/avatars/{name}", "gravatar_id": "", "url": f"{api}/users/{name}",
            "html_url": f"{html}/{name}", "followers_url": f"{api}/users/{name}/followers",
            "following_url": f"{api}/users/{name}/following{{/other_user}}",
            "gists_url": f"{api}/users/{name}/gists{{/gist_id}}",
            "starred_url": f"{api}/users/{name}/starred{{/owner}}{{/repo}}",
            "subscriptions_url": f"{api}/users/{name}/subscriptions", "organizations_url": f"{api}/users/{name}/orgs",
            "repos_url": f"{api}/users/{name}/repos", "events_url": f"{api}/users/{name}/events{{/privacy}}",
            "received_events_url": f"{api}/users/{name}/received_events", "type": u["type"], "site_admin": False,
        }

    def render_repo(self, repo: str | dict) -> dict:
        r = self._repo(repo) if isinstance(repo, str) else repo
        full, api, html = r["full_name"], f"{self.base_url}/repos/{r['full_name']}", f"{self.base_url}/{r['full_name']}"
        urls = {k: f"{api}/{v}" for k, v in {
            "forks_url": "forks", "keys_url": "keys{/key_id}", "collaborators_url": "collaborators{/collaborator}",
            "teams_url": "teams", "hooks_url": "hooks", "issue_events_url": "issues/events{/number}",
            "events_url": "events", "assignees_url": "assignees{/user}", "branches_url": "branches{/branch}",
            "tags_url": "tags", "blobs_url": "git/blobs{/sha}", "git_tags_url": "git/tags{/sha}",
            "git_refs_url": "git/refs{/sha}", "trees_url": "git/trees{/sha}", "statuses_url": "statuses/{sha}",
            "languages_url": "languages", "stargazers_url": "stargazers", "contributors_url": "contributors",
            "subscribers_url": "subscribers", "subscription_url": "subscription", "commits_url": "commits{/sha}",
            "git_commits_url": "git/commits{/sha}", "comments_url": "comments{/number}",
            "issue_comment_url": "issues/comments{/number}", "contents_url": "contents/{+path}",
            "compare_url": "compare/{base}...{head}", "merges_url": "merges", "archive_url": "{archive_format}{/ref}",
            "downloads_url": "downloads", "issues_url": "issues{/number}", "pulls_url": "pulls{/number}",
            "milestones_url": "milestones{/number}", "notifications_url": "notifications{?since,all,participating}",
            "labels_url": "labels{/name}", "releases_url": "releases{/id}", "deployments_url": "deployments"}.items()}
        open_count = sum(1 for i in self._issues.values()
                         if i.repo == full.lower() and i.state == "open" and not i.deleted and not i.transferred_to)
        out = {"id": r["id"], "node_id": r["node_id"], "name": r["name"], "full_name": full, "private": True,
               "owner": self.render_user(r["owner"]), "html_url": html, "description": None, "fork": False,
               "url": api}
        out.update(urls)
        out.update({
            "created_at": _iso(r["created_at"]), "updated_at": _iso(r["created_at"]), "pushed_at": _iso(r["created_at"]),
            "git_url": f"git://sandbox/{full}.git", "ssh_url": f"git@sandbox:{full}.git", "clone_url": f"{html}.git",
            "svn_url": html, "homepage": None, "size": 0, "stargazers_count": 0, "watchers_count": 0,
            "language": None, "has_issues": True, "has_projects": True, "has_downloads": True, "has_wiki": True,
            "has_pages": False, "forks_count": 0, "mirror_url": None, "archived": False, "disabled": False,
            "open_issues_count": open_count, "license": None, "forks": 0, "open_issues": open_count, "watchers": 0,
            "default_branch": "main", "is_template": False, "topics": [], "visibility": "private",
            "web_commit_signoff_required": False, "custom_properties": {},
        })
        return out

    def render_label(self, repo_key: str, name: str) -> dict:
        key = (repo_key, name.lower())
        if key not in self._label_ids:
            self._label_ids[key] = self._next_id("label")
        lid = self._label_ids[key]
        full = self._repos[repo_key]["full_name"]
        return {"id": lid, "node_id": base64.b64encode(f"05:Label{lid}".encode()).decode(),
                "url": f"{self.base_url}/repos/{full}/labels/{quote(name)}", "name": name,
                "color": hashlib.md5(name.lower().encode()).hexdigest()[:6], "default": False, "description": None}

    def render_issue(self, issue: _Issue) -> dict:
        full = self._repos[issue.repo]["full_name"]
        api, html = f"{self.base_url}/repos/{full}", f"{self.base_url}/{full}"
        kind = "pull" if issue.is_pr else "issues"
        comments = sum(1 for c in self._comments.values() if c.issue_id == issue.id and not c.deleted)
        assignees = [self.render_user(a) for a in issue.assignees]
        out = {
            "url": f"{api}/issues/{issue.number}", "repository_url": api,
            "labels_url": f"{api}/issues/{issue.number}/labels{{/name}}",
            "comments_url": f"{api}/issues/{issue.number}/comments",
            "events_url": f"{api}/issues/{issue.number}/events", "html_url": f"{html}/{kind}/{issue.number}",
            "id": issue.id, "node_id": issue.node_id, "number": issue.number, "title": issue.title,
            "user": self.render_user(issue.user),
            "labels": [self.render_label(issue.repo, name) for name in issue.labels],
            "state": issue.state, "locked": issue.locked, "assignee": assignees[0] if assignees else None,
            "assignees": assignees, "milestone": None, "comments": comments,
            "created_at": _iso(issue.created_at), "updated_at": _iso(issue.updated_at),
            "closed_at": _iso(issue.closed_at), "author_association": "OWNER" if issue.user.lower() == self._repos[issue.repo]["owner"].lower() else "MEMBER",
            "active_lock_reason": None, "body": issue.body,
            "reactions": {"url": f"{api}/issues/{issue.number}/reactions", "total_count": 0, "+1": 0, "-1": 0,
                          "laugh": 0, "hooray": 0, "confused": 0, "heart": 0, "rocket": 0, "eyes": 0},
            "timeline_url": f"{api}/issues/{issue.number}/timeline", "performed_via_github_app": None,
            "state_reason": issue.state_reason,
        }
        if issue.is_pr:
            out["draft"] = False
            out["pull_request"] = {"url": f"{api}/pulls/{issue.number}", "html_url": f"{html}/pull/{issue.number}",
                                   "diff_url": f"{html}/pull/{issue.number}.diff",
                                   "patch_url": f"{html}/pull/{issue.number}.patch", "merged_at": None}
        return out

    def render_comment(self, c: _Comment) -> dict:
        full = self._repos[c.repo]["full_name"]
        api, html = f"{self.base_url}/repos/{full}", f"{self.base_url}/{full}"
        return {
            "url": f"{api}/issues/comments/{c.id}", "html_url": f"{html}/issues/{c.number}#issuecomment-{c.id}",
            "issue_url": f"{api}/issues/{c.number}", "id": c.id, "node_id": c.node_id,
            "user": self.render_user(c.user), "created_at": _iso(c.created_at), "updated_at": _iso(c.updated_at),
            "author_association": "MEMBER", "body": c.body,
            "reactions": {"url": f"{api}/issues/comments/{c.id}/reactions", "total_count": 0, "+1": 0, "-1": 0,
                          "laugh": 0, "hooray": 0, "confused": 0, "heart": 0, "rocket": 0, "eyes": 0},
            "performed_via_github_app": None,
        }

    # --- read helpers for tests ----------------------------------------------------------------
    def issue(self, number: int, *, repo: str | None = None) -> dict:
        with self._lock:
            return self.render_issue(self._issue(repo, number, allow_deleted=True))

    def comments_of(self, number: int, *, repo: str | None = None) -> list[dict]:
        with self._lock:
            issue = self._issue(repo, number, allow_deleted=True)
            return [self.render_comment(c) for c in sorted(self._comments.values(), key=lambda c: c.id)
                    if c.issue_id == issue.id and not c.deleted]

    # --- webhooks ------------------------------------------------------------------------------
    def add_hook(self, url: str | None, secret: str | None, *, events=("*",), ping: bool = False) -> dict:
        """Register a repository webhook (``url=None`` records signed deliveries without sending)."""
        with self._lock:
            hook = {"id": self._next_id("hook"), "url": url, "secret": secret, "events": list(events), "active": True}
            self._hooks.append(hook)
            if ping:
                self._emit("ping", {"zen": "Keep it logically awesome.", "hook_id": hook["id"],
                                    "hook": {"type": "Repository", "id": hook["id"], "active": True,
                                             "events": hook["events"], "config": {"url": url, "content_type": "json"}},
                                    "repository": self.render_repo(next(iter(self._repos.values()))),
                                    "sender": self.render_user(self.service_login)}, hooks=[hook])
        self._after_mutation()
        return {k: v for k, v in hook.items() if k != "secret"}

    def _emit(self, event: str, payload: dict, *, hooks=None) -> None:
        if self._muted:
            return
        action = payload.get("action")
        targets = hooks if hooks is not None else [h for h in self._hooks if h["active"] and
                                                   ("*" in h["events"] or event in h["events"])]
        body = json.dumps(payload).encode("utf-8")
        for hook in targets:
            headers = {"Content-Type": "application/json", "User-Agent": "GitHub-Hookshot/sandbox",
                       "X-GitHub-Event": event, "X-GitHub-Delivery": str(uuid.uuid4()),
                       "X-GitHub-Hook-ID": str(hook["id"]),
                       "X-GitHub-Hook-Installation-Target-Type": "repository"}
            if payload.get("repository", {}).get("id"):
                headers["X-GitHub-Hook-Installation-Target-ID"] = str(payload["repository"]["id"])
            if hook.get("secret"):
                headers["X-Hub-Signature"] = "sha1=" + hmac.new(hook["secret"].encode(), body, hashlib.sha1).hexdigest()
                headers["X-Hub-Signature-256"] = sign(hook["secret"], body)
            self._record(Delivery(event=event, action=action, delivery_id=headers["X-GitHub-Delivery"],
                                  headers=headers, body=body, hook_id=hook["id"], url=hook.get("url")))

    @property
    def pending_deliveries(self) -> list[Delivery]:
        with self._lock:
            return list(self._pending)

    @property
    def last_delivery(self) -> Delivery | None:
        with self._lock:
            return self._deliveries[-1] if self._deliveries else None

    def deliver_fixture(self, name: str, overrides: dict | None = None, *, repo: str | None = None,
                        event: str | None = None) -> list[Delivery]:
        """Send a real fixture payload (``issues_opened``, ``issue_comment_created``... or a path), re-targeted
        to the sandbox repository (``Codertocat/Hello-World`` rewritten, ``repository`` replaced) and
        deep-merged with ``overrides``; signed for every hook. Returns the deliveries."""
        path = self._fixture_path(name, ".payload.json")
        base = os.path.basename(path).split(".")[0]
        with self._lock:
            r = self._repo(repo)
            text = open(path, encoding="utf-8").read()
            text = text.replace(f"api.github.com/repos/{FIXTURE_REPO}", f"{self.base_url.split('//', 1)[1]}/repos/{r['full_name']}")
            text = text.replace(FIXTURE_REPO, r["full_name"])
            payload = json.loads(text)
            if "repository" in payload:
                payload["repository"] = self.render_repo(r)
            if overrides:
                deep_merge(payload, overrides)
            if event is None:
                event = "issue_comment" if base.startswith("issue_comment") else base.rsplit("_", 1)[0]
            before = len(self._deliveries)
            self._emit(event, payload)
            made = self._deliveries[before:]
        self._after_mutation()
        return made

    # --- failure injection ---------------------------------------------------------------------
    def fail_next(self, count: int = 1, mode: str = "rate_limit", *, retry_after: int | None = None,
                  reset_in: int = 60, status: int | None = None) -> None:
        """Make the next ``count`` API responses fail. Modes: ``rate_limit`` (primary: 403,
        ``x-ratelimit-remaining: 0``, reset in ``reset_in`` s), ``secondary`` (403 + ``retry-after``),
        ``retry_after_429`` (429 + ``retry-after``), ``error`` (``status``, default 500). ``status``
        overrides the code of the rate-limit modes too."""
        self._queue_failure(count, mode, retry_after=retry_after, reset_in=reset_in, status=status)

    def force_rate_limit(self, count: int = 1, *, reset_in: int = 60, status: int = 403) -> None:
        self.fail_next(count, "rate_limit", reset_in=reset_in, status=status)

    def force_secondary_rate_limit(self, count: int = 1, *, retry_after: int = 30, status: int = 403) -> None:
        self.fail_next(count, "secondary", retry_after=retry_after, status=status)

    def force_429(self, count: int = 1, *, retry_after: int = 30) -> None:
        self.fail_next(count, "retry_after_429", retry_after=retry_after)

    def force_server_error(self, count: int = 1, *, status: int = 500) -> None:
        self.fail_next(count, "error", status=status)

    # --- mutations (control methods; the API handlers use the same code) -----------------------
    def _actor(self, actor: str | None) -> str:
        login = actor or self.default_actor
        self.add_user(login)
        return login

    def _issue_payload(self, action: str, issue: _Issue, actor: str, **extra) -> dict:
        payload = {"action": action, "issue": self.render_issue(issue)}
        payload.update(extra)
        payload["repository"] = self.render_repo(self._repos[issue.repo])
        payload["sender"] = self.render_user(actor)
        return payload

    def _create(self, repo: str | None, title: str, body: str | None, labels, assignees, actor: str,
                *, is_pr: bool = False) -> _Issue:
        r = self._repo(repo)
        if not isinstance(title, str) or not title.strip():
            raise _SandboxError(422, "Validation Failed", {"errors": [{"resource": "Issue", "field": "title", "code": "missing_field"}]})
        now = self._stamp()
        iid = self._next_id("issue")
        number = r["next_number"]
        r["next_number"] += 1
        for login in assignees or ():
            self.add_user(login)
        issue = _Issue(id=iid, node_id=("PR_" if is_pr else "I_") + base64.b64encode(f"sandbox{iid}".encode()).decode().rstrip("="),
                       repo=r["full_name"].lower(), number=number, title=title, body=body, user=actor,
                       created_at=now, updated_at=now, labels=list(dict.fromkeys(labels or ())),
                       assignees=list(dict.fromkeys(assignees or ())), is_pr=is_pr)
        self._issues[(issue.repo, number)] = issue
        if is_pr:
            self._emit("pull_request", {"action": "opened", "number": number, "pull_request": self.render_issue(issue),
                                        "repository": self.render_repo(r), "sender": self.render_user(actor)})
        else:
            self._emit("issues", self._issue_payload("opened", issue, actor))
        return issue

    def _update(self, issue: _Issue, actor: str, *, title=None, body=None, state=None, state_reason=None,
                labels=None, assignees=None, _body_set=False) -> _Issue:
        changes = {}
        if title is not None and title != issue.title:
            if not title.strip():
                raise _SandboxError(422, "Validation Failed")
            changes["title"] = {"from": issue.title}
            issue.title = title
        if _body_set and body != issue.body:
            changes["body"] = {"from": issue.body}
            issue.body = body
        if changes:
            issue.updated_at = self._stamp()
            self._emit("issues", self._issue_payload("edited", issue, actor, changes=changes))
        if state is not None:
            if state not in ("open", "closed"):
                raise _SandboxError(422, "Validation Failed")
            if state_reason is not None and state_reason not in CLOSED_REASONS + ("reopened",):
                raise _SandboxError(422, "Validation Failed")
            if state == "closed" and issue.state != "closed":
                issue.state, issue.state_reason = "closed", state_reason or "completed"
                issue.closed_at = issue.updated_at = self._stamp()
                self._emit("issues", self._issue_payload("closed", issue, actor))
            elif state == "closed" and state_reason and state_reason != issue.state_reason:
                issue.state_reason, issue.updated_at = state_reason, self._stamp()
                self._emit("issues", self._issue_payload("closed", issue, actor))
            elif state == "open" and issue.state != "open":
                issue.state, issue.state_reason = "open", "reopened"
                issue.updated_at = self._stamp()
                self._emit("issues", self._issue_payload("reopened", issue, actor))
        if labels is not None:
            wanted = list(dict.fromkeys(str(n) for n in labels))
            current_lower = {n.lower() for n in issue.labels}
            wanted_lower = {n.lower() for n in wanted}
            for name in [n for n in issue.labels if n.lower() not in wanted_lower]:
                issue.labels.remove(name)
                issue.updated_at = self._stamp()
                self._emit("issues", self._issue_payload("unlabeled", issue, actor, label=self.render_label(issue.repo, name)))
            for name in [n for n in wanted if n.lower() not in current_lower]:
                issue.labels.append(name)
                issue.updated_at = self._stamp()
                self._emit("issues", self._issue_payload("labeled", issue, actor, label=self.render_label(issue.repo, name)))
        if assignees is not None:
            wanted = list(dict.fromkeys(str(n) for n in assignees))
            for login in [a for a in issue.assignees if a.lower() not in {w.lower() for w in wanted}]:
                issue.assignees.remove(login)
                issue.updated_at = self._stamp()
                self._emit("issues", self._issue_payload("unassigned", issue, actor, assignee=self.render_user(login)))
            for login in [w for w in wanted if w.lower() not in {a.lower() for a in issue.assignees}]:
                self.add_user(login)
                issue.assignees.append(login)
                issue.updated_at = self._stamp()
                self._emit("issues", self._issue_payload("assigned", issue, actor, assignee=self.render_user(login)))
        return issue

    def open_issue(self, title: str = "Untitled", body: str | None = "", *, repo: str | None = None, labels=(),
                   assignees=(), actor: str | None = None) -> dict:
        """Create an issue as ``actor`` (default: the human ``default_actor``); emits ``issues.opened``."""
        return self._mutate(lambda: self.render_issue(self._create(repo, title, body, labels, assignees, self._actor(actor))))

    def open_pull_request(self, title: str = "A pull request", body: str | None = "", *, repo: str | None = None,
                          actor: str | None = None) -> dict:
        """A pull request: listed by the issues endpoint with a ``pull_request`` key; emits ``pull_request.opened``."""
        return self._mutate(lambda: self.render_issue(self._create(repo, title, body, (), (), self._actor(actor), is_pr=True)))

    def edit_issue(self, number: int, *, repo: str | None = None, actor: str | None = None, **fields) -> dict:
        """Fields: title, body, state, state_reason, labels, assignees (as the REST PATCH)."""
        def run():
            issue = self._issue(repo, number)
            kwargs = {k: fields[k] for k in ("title", "state", "state_reason", "labels", "assignees") if k in fields}
            return self.render_issue(self._update(issue, self._actor(actor), body=fields.get("body"),
                                                  _body_set="body" in fields, **kwargs))
        return self._mutate(run)

    def close_issue(self, number: int, *, state_reason: str = "completed", repo: str | None = None,
                    actor: str | None = None) -> dict:
        return self.edit_issue(number, repo=repo, actor=actor, state="closed", state_reason=state_reason)

    def reopen_issue(self, number: int, *, repo: str | None = None, actor: str | None = None) -> dict:
        return self.edit_issue(number, repo=repo, actor=actor, state="open")

    def label(self, number: int, *names: str, repo: str | None = None, actor: str | None = None) -> dict:
        def run():
            issue = self._issue(repo, number)
            return self.render_issue(self._update(issue, self._actor(actor), labels=issue.labels + list(names)))
        return self._mutate(run)

    def unlabel(self, number: int, *names: str, repo: str | None = None, actor: str | None = None) -> dict:
        def run():
            issue = self._issue(repo, number)
            drop = {n.lower() for n in names}
            return self.render_issue(self._update(issue, self._actor(actor),
                                                  labels=[n for n in issue.labels if n.lower() not in drop]))
        return self._mutate(run)

    def assign(self, number: int, *logins: str, repo: str | None = None, actor: str | None = None) -> dict:
        def run():
            issue = self._issue(repo, number)
            return self.render_issue(self._update(issue, self._actor(actor), assignees=issue.assignees + list(logins)))
        return self._mutate(run)

    def unassign(self, number: int, *logins: str, repo: str | None = None, actor: str | None = None) -> dict:
        def run():
            issue = self._issue(repo, number)
            drop = {n.lower() for n in logins}
            return self.render_issue(self._update(issue, self._actor(actor),
                                                  assignees=[a for a in issue.assignees if a.lower() not in drop]))
        return self._mutate(run)

    def _add_comment(self, issue: _Issue, body: str, actor: str) -> _Comment:
        if not isinstance(body, str) or not body:
            raise _SandboxError(422, "Validation Failed")
        now = self._stamp()
        cid = self._next_id("comment")
        c = _Comment(id=cid, node_id="IC_" + base64.b64encode(f"sandbox{cid}".encode()).decode().rstrip("="),
                     repo=issue.repo, number=issue.number, issue_id=issue.id, body=body, user=actor,
                     created_at=now, updated_at=now)
        self._comments[cid] = c
        issue.updated_at = now
        self._emit("issue_comment", self._issue_payload("created", issue, actor, comment=self.render_comment(c)))
        return c

    def _comment_obj(self, comment_id: int, repo: str | None = None) -> _Comment:
        c = self._comments.get(int(comment_id))
        if c is None or c.deleted or (repo and c.repo != repo.lower()):
            raise _SandboxError(404, "Not Found")
        return c

    def _edit_comment(self, c: _Comment, body: str, actor: str) -> _Comment:
        if not isinstance(body, str) or not body:
            raise _SandboxError(422, "Validation Failed")
        old = c.body
        c.body, c.updated_at = body, self._stamp()
        issue = self._issues[(c.repo, c.number)]
        self._emit("issue_comment", self._issue_payload("edited", issue, actor, changes={"body": {"from": old}},
                                                        comment=self.render_comment(c)))
        return c

    def _delete_comment(self, c: _Comment, actor: str) -> None:
        c.deleted = True
        issue = self._issues[(c.repo, c.number)]
        self._emit("issue_comment", self._issue_payload("deleted", issue, actor, comment=self.render_comment(c)))

    def comment(self, number: int, body: str, *, repo: str | None = None, actor: str | None = None) -> dict:
        """Comment as ``actor``; emits ``issue_comment.created`` (also bumps the issue's updated_at)."""
        return self._mutate(lambda: self.render_comment(self._add_comment(self._issue(repo, number), body, self._actor(actor))))

    def edit_comment(self, comment_id: int, body: str, *, actor: str | None = None) -> dict:
        return self._mutate(lambda: self.render_comment(self._edit_comment(self._comment_obj(comment_id), body, self._actor(actor))))

    def delete_comment(self, comment_id: int, *, actor: str | None = None) -> None:
        self._mutate(lambda: self._delete_comment(self._comment_obj(comment_id), self._actor(actor)))

    def delete_issue(self, number: int, *, repo: str | None = None, actor: str | None = None) -> dict:
        """Delete (REST then answers 410); emits ``issues.deleted``."""
        def run():
            issue = self._issue(repo, number)
            issue.deleted = True
            self._emit("issues", self._issue_payload("deleted", issue, self._actor(actor)))
            return self.render_issue(issue)
        return self._mutate(run)

    def transfer_issue(self, number: int, new_repo: str, *, repo: str | None = None, actor: str | None = None) -> dict:
        """Move an issue to ``new_repo`` (created if needed): ``issues.transferred`` for the old one (REST then
        answers 301), ``issues.opened`` for the new one. Returns the new issue."""
        def run():
            issue = self._issue(repo, number)
            login = self._actor(actor)
            self.add_repo(new_repo)
            new = self._create(new_repo, issue.title, issue.body, issue.labels, issue.assignees, issue.user)
            issue.transferred_to = (new.repo, new.number)
            self._emit("issues", self._issue_payload(
                "transferred", issue, login,
                changes={"new_issue": self.render_issue(new), "new_repository": self.render_repo(self._repos[new.repo])}))
            return self.render_issue(new)
        return self._mutate(run)

    # --- HTTP routing --------------------------------------------------------------------------
    def _rate_headers(self, resource: str, *, exhausted: bool = False, reset_in: int | None = None) -> dict:
        now = int(time.time())
        if now >= self._rate_reset:
            self._rate = {"core": 0, "graphql": 0}
            self._rate_reset = now + 3600
        reset = now + reset_in if reset_in is not None else self._rate_reset
        if not exhausted:
            self._rate[resource] = self._rate.get(resource, 0) + 1
        used = RATE_LIMIT if exhausted else self._rate[resource]
        return {"x-ratelimit-limit": str(RATE_LIMIT), "x-ratelimit-remaining": str(max(0, RATE_LIMIT - used)),
                "x-ratelimit-used": str(used), "x-ratelimit-reset": str(reset), "x-ratelimit-resource": resource}

    def _authorized_login(self, headers: dict) -> str | None:
        if self.token is None:
            return self.service_login
        auth = headers.get("authorization", "")
        scheme, _, value = auth.partition(" ")
        if scheme.lower() in ("bearer", "token") and value and hmac.compare_digest(value.strip(), self.token):
            return self.service_login
        return None

    def handle(self, method: str, raw_path: str, headers: dict, raw_body: bytes):
        """Returns (status, headers, body bytes). Used by the HTTP handler."""
        parts, path, query, body, body_ok = self._parse_request(raw_path, raw_body)
        if path.startswith("/api/v3/"):
            path = path[len("/api/v3"):]
        elif path == "/api/graphql":
            path = "/graphql"
        if not body_ok and not path.startswith("/_sandbox"):
            return self._finish(RequestRecord(method, path, query, headers), 400, {"message": "Problems parsing JSON"}, {})
        record = RequestRecord(method, path, query, headers, body)
        self._log_request(record)
        resource = "graphql" if path == "/graphql" else "core"
        if not path.startswith("/_sandbox"):
            failure = self._take_failure()
            if failure:
                return self._failure_response(record, failure, resource)
        login = self._authorized_login(headers)
        if login is None:
            with self._lock:
                rate = self._rate_headers(resource)
            return self._finish(record, 401, {"message": "Bad credentials", "documentation_url": DOCS, "status": "401"}, rate)
        control = re.fullmatch(r"/_sandbox/(\w+)", path) if method == "POST" else None
        try:
            if control:
                with self._lock:
                    rate = self._rate_headers(resource)
                return self._finish(record, 200, self.run_control(control.group(1), body), rate)
            with self._lock:
                rate = self._rate_headers(resource)
                status, payload, extra = self._route(method, path, query, body, login, parts.query)
        except _SandboxError as exc:
            status, payload, extra = exc.status, {"message": exc.message, "documentation_url": DOCS, **exc.extra}, {}
        self._after_mutation()
        return self._finish(record, status, payload, {**rate, **extra})

    def _finish(self, record, status, payload, headers):
        record.status = status
        body = b"" if payload is None else json.dumps(payload).encode("utf-8")
        out = {"X-GitHub-Api-Version-Selected": "2022-11-28", "X-GitHub-Request-Id": uuid.uuid4().hex[:16].upper()}
        if payload is not None:
            out["Content-Type"] = "application/json; charset=utf-8"
        out.update(headers)
        return status, out, body

    def _failure_response(self, record, failure, resource):
        mode = failure["mode"]
        with self._lock:
            if mode == "rate_limit":
                rate = self._rate_headers(resource, exhausted=True, reset_in=failure["reset_in"])
                return self._finish(record, failure["status"] or 403, {
                    "message": "API rate limit exceeded for user ID 1. If you reach out to GitHub Support for help, "
                               "please include the request ID.",
                    "documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api"}, rate)
            rate = self._rate_headers(resource)
        if mode in ("secondary", "retry_after_429"):
            status = failure["status"] or (429 if mode == "retry_after_429" else 403)
            retry = failure["retry_after"] if failure["retry_after"] is not None else 30
            return self._finish(record, status, {
                "message": "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.",
                "documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api"},
                {**rate, "retry-after": str(retry)})
        return self._finish(record, failure["status"] or 500, {"message": "Server Error"}, rate)

    def _page(self, rows: list, query: dict, link_base: str, raw_query: str):
        def num(name, default, low, high):
            try:
                return max(low, min(high, int(query.get(name, [default])[0])))
            except ValueError:
                return default
        per_page = num("per_page", 30, 1, 100)
        page = num("page", 1, 1, 10**9)
        last = max(1, (len(rows) + per_page - 1) // per_page)
        chunk = rows[(page - 1) * per_page: page * per_page]
        params = [(k, v) for k, vs in parse_qs(raw_query, keep_blank_values=True).items() if k != "page" for v in vs]

        def link(p, rel):
            return f'<{link_base}?{urlencode(params + [("page", str(p))])}>; rel="{rel}"'

        links = []
        if page > 1:
            links.append(link(page - 1, "prev"))
        if page < last:
            links.append(link(page + 1, "next"))
            links.append(link(last, "last"))
        if page > 1:
            links.append(link(1, "first"))
        return chunk, ({"Link": ", ".join(links)} if links else {})

    def _since(self, query: dict) -> datetime | None:
        value = query.get("since", [None])[0]
        if not value:
            return None
        try:
            return _parse_ts(value)
        except ValueError:
            raise _SandboxError(422, "Validation Failed", {"errors": [{"field": "since", "code": "invalid"}]}) from None

    _ROUTES = [
        ("GET", r"/user", "r_user"),
        ("GET", r"/rate_limit", "r_rate_limit"),
        ("POST", r"/graphql", "r_graphql"),
        ("GET", r"/repos/(?P<owner>[^/]+)/(?P<name>[^/]+)", "r_repo"),
        ("GET", r"/repos/(?P<owner>[^/]+)/(?P<name>[^/]+)/issues", "r_list_issues"),
        ("GET", r"/repositories/(?P<rid>\d+)/issues", "r_list_issues"),
        ("POST", r"/repos/(?P<owner>[^/]+)/(?P<name>[^/]+)/issues", "r_create_issue"),
        ("GET", r"/repos/(?P<owner>[^/]+)/(?P<name>[^/]+)/issues/comments/(?P<cid>\d+)", "r_get_comment"),
        ("PATCH", r"/repos/(?P<owner>[^/]+)/(?P<name>[^/]+)/issues/comments/(?P<cid>\d+)", "r_patch_comment"),
        ("DELETE", r"/repos/(?P<owner>[^/]+)/(?P<name>[^/]+)/issues/comments/(?P<cid>\d+)", "r_delete_comment"),
        ("GET", r"/repos/(?P<owner>[^/]+)/(?P<name>[^/]+)/issues/(?P<number>\d+)", "r_get_issue"),
        ("PATCH", r"/repos/(?P<owner>[^/]+)/(?P<name>[^/]+)/issues/(?P<number>\d+)", "r_patch_issue"),
        ("GET", r"/repos/(?P<owner>[^/]+)/(?P<name>[^/]+)/issues/(?P<number>\d+)/comments", "r_list_comments"),
        ("GET", r"/repositories/(?P<rid>\d+)/issues/(?P<number>\d+)/comments", "r_list_comments"),
        ("POST", r"/repos/(?P<owner>[^/]+)/(?P<name>[^/]+)/issues/(?P<number>\d+)/comments", "r_create_comment"),
        ("POST", r"/repos/(?P<owner>[^/]+)/(?P<name>[^/]+)/issues/(?P<number>\d+)/labels", "r_add_labels"),
        ("DELETE", r"/repos/(?P<owner>[^/]+)/(?P<name>[^/]+)/issues/(?P<number>\d+)/labels/(?P<label>.+)", "r_remove_label"),
        ("GET", r"/repos/(?P<owner>[^/]+)/(?P<name>[^/]+)/hooks", "r_list_hooks"),
        ("POST", r"/repos/(?P<owner>[^/]+)/(?P<name>[^/]+)/hooks", "r_create_hook"),
        ("GET", r"/_sandbox/deliveries", "r_sb_deliveries"),
        ("GET", r"/_sandbox/requests", "r_sb_requests"),
    ]

    def _route(self, method, path, query, body, login, raw_query):
        matched_path = False
        for verb, pattern, handler in self._ROUTES:
            m = re.fullmatch(pattern, path)
            if m:
                matched_path = True
                if verb == method:
                    return getattr(self, handler)(query=query, body=body, login=login, raw_query=raw_query,
                                                  **m.groupdict())
        raise _SandboxError(404 if not matched_path else 405, "Not Found")

    def _repo_from(self, owner=None, name=None, rid=None) -> dict:
        return self._repo_by_id(int(rid)) if rid else self._repo(f"{owner}/{name}")

    def r_user(self, login, **_):
        return 200, self.render_user(login), {}

    def r_rate_limit(self, **_):
        core = {"limit": RATE_LIMIT, "used": self._rate["core"], "remaining": RATE_LIMIT - self._rate["core"],
                "reset": self._rate_reset}
        return 200, {"resources": {"core": core}, "rate": core}, {}

    def r_repo(self, owner, name, **_):
        return 200, self.render_repo(self._repo(f"{owner}/{name}")), {}

    def r_list_issues(self, query, raw_query, owner=None, name=None, rid=None, **_):
        r = self._repo_from(owner, name, rid)
        state = query.get("state", ["open"])[0]
        sort = query.get("sort", ["created"])[0]
        direction = query.get("direction", ["desc"])[0]
        since = self._since(query)
        wanted_labels = {x.strip().lower() for x in query.get("labels", [""])[0].split(",") if x.strip()}
        rows = [i for i in self._issues.values()
                if i.repo == r["full_name"].lower() and not i.deleted and not i.transferred_to
                and (state == "all" or i.state == state) and (since is None or i.updated_at >= since)
                and wanted_labels <= {n.lower() for n in i.labels}]
        key = {"updated": lambda i: (i.updated_at, i.id), "comments": lambda i: (
            sum(1 for c in self._comments.values() if c.issue_id == i.id and not c.deleted), i.id)}.get(
            sort, lambda i: (i.created_at, i.id))
        rows.sort(key=key, reverse=(direction != "asc"))
        chunk, links = self._page(rows, query, f"{self.base_url}/repositories/{r['id']}/issues", raw_query)
        return 200, [self.render_issue(i) for i in chunk], links

    def r_create_issue(self, body, login, owner, name, **_):
        body = body if isinstance(body, dict) else {}
        issue = self._create(f"{owner}/{name}", body.get("title"), body.get("body"), body.get("labels") or (),
                             body.get("assignees") or ([body["assignee"]] if body.get("assignee") else ()), login)
        return 201, self.render_issue(issue), {}

    def r_get_issue(self, owner, name, number, **_):
        try:
            return 200, self.render_issue(self._issue(f"{owner}/{name}", number)), {}
        except _SandboxError as exc:
            if exc.status == 301:
                issue = self._issue(f"{owner}/{name}", number, allow_deleted=True)
                new_repo, new_number = issue.transferred_to
                url = f"{self.base_url}/repos/{self._repos[new_repo]['full_name']}/issues/{new_number}"
                return 301, {"message": "Moved Permanently", "url": url, "documentation_url": DOCS}, {"Location": url}
            raise

    def r_patch_issue(self, body, login, owner, name, number, **_):
        body = body if isinstance(body, dict) else {}
        issue = self._issue(f"{owner}/{name}", number)
        kwargs = {k: body[k] for k in ("title", "state", "state_reason", "labels", "assignees") if k in body}
        if "labels" in kwargs:
            kwargs["labels"] = [(x.get("name") if isinstance(x, dict) else x) for x in kwargs["labels"] or []]
        self._update(issue, login, body=body.get("body"), _body_set="body" in body, **kwargs)
        return 200, self.render_issue(issue), {}

    def r_list_comments(self, query, raw_query, number, owner=None, name=None, rid=None, **_):
        r = self._repo_from(owner, name, rid)
        issue = self._issue(r["full_name"], number)
        since = self._since(query)
        rows = sorted((c for c in self._comments.values() if c.issue_id == issue.id and not c.deleted
                       and (since is None or c.updated_at >= since)), key=lambda c: c.id)
        chunk, links = self._page(rows, query, f"{self.base_url}/repositories/{r['id']}/issues/{number}/comments", raw_query)
        return 200, [self.render_comment(c) for c in chunk], links

    def r_create_comment(self, body, login, owner, name, number, **_):
        body = body if isinstance(body, dict) else {}
        c = self._add_comment(self._issue(f"{owner}/{name}", number), body.get("body"), login)
        return 201, self.render_comment(c), {}

    def r_get_comment(self, owner, name, cid, **_):
        return 200, self.render_comment(self._comment_obj(cid, f"{owner}/{name}")), {}

    def r_patch_comment(self, body, login, owner, name, cid, **_):
        body = body if isinstance(body, dict) else {}
        return 200, self.render_comment(self._edit_comment(self._comment_obj(cid, f"{owner}/{name}"), body.get("body"), login)), {}

    def r_delete_comment(self, login, owner, name, cid, **_):
        self._delete_comment(self._comment_obj(cid, f"{owner}/{name}"), login)
        return 204, None, {}

    def r_add_labels(self, body, login, owner, name, number, **_):
        names = body.get("labels", []) if isinstance(body, dict) else (body or [])
        issue = self._issue(f"{owner}/{name}", number)
        self._update(issue, login, labels=issue.labels + [(n.get("name") if isinstance(n, dict) else n) for n in names])
        return 200, [self.render_label(issue.repo, n) for n in issue.labels], {}

    def r_remove_label(self, login, owner, name, number, label, **_):
        issue = self._issue(f"{owner}/{name}", number)
        if label.lower() not in {n.lower() for n in issue.labels}:
            raise _SandboxError(404, "Label does not exist")
        self._update(issue, login, labels=[n for n in issue.labels if n.lower() != label.lower()])
        return 200, [self.render_label(issue.repo, n) for n in issue.labels], {}

    def r_list_hooks(self, owner, name, **_):
        self._repo(f"{owner}/{name}")
        return 200, [{"id": h["id"], "active": h["active"], "events": h["events"], "type": "Repository",
                      "config": {"url": h["url"], "content_type": "json", "insecure_ssl": "0"}} for h in self._hooks], {}

    def r_create_hook(self, body, owner, name, **_):
        self._repo(f"{owner}/{name}")
        body = body if isinstance(body, dict) else {}
        config = body.get("config") or {}
        if not config.get("url"):
            raise _SandboxError(422, "Validation Failed")
        hook = self.add_hook(config["url"], config.get("secret"), events=body.get("events") or ["push"], ping=True)
        return 201, {"id": hook["id"], "active": True, "events": hook["events"], "type": "Repository",
                     "config": {"url": config["url"], "content_type": config.get("content_type", "json")}}, {}

    _GQL_REPO = re.compile(r'repository\s*\(\s*owner\s*:\s*(?P<owner>"(?:[^"\\]|\\.)*"|\$\w+)\s*,\s*'
                           r'name\s*:\s*(?P<name>"(?:[^"\\]|\\.)*"|\$\w+)\s*\)')
    _GQL_ALIAS = re.compile(r'(?P<alias>[A-Za-z_]\w*)\s*:\s*issue\s*\(\s*number\s*:\s*(?P<number>\d+|\$\w+)\s*\)')

    def r_graphql(self, body, **_):
        body = body if isinstance(body, dict) else {}
        query, variables = str(body.get("query") or ""), body.get("variables") or {}

        def value(token):
            return variables.get(token[1:]) if token.startswith("$") else json.loads(token)

        m = self._GQL_REPO.search(query)
        if not m:
            return 200, {"errors": [{"message": "The sandbox only understands repository(owner:, name:) { alias: issue(number:) {...} } queries."}]}, {}
        owner, name = value(m.group("owner")), value(m.group("name"))
        repo = self._repos.get(f"{owner}/{name}".lower())
        if repo is None:
            return 200, {"data": {"repository": None}, "errors": [{
                "type": "NOT_FOUND", "path": ["repository"], "locations": [{"line": 1, "column": 9}],
                "message": f"Could not resolve to a Repository with the name '{owner}/{name}'."}]}, {}
        data, errors = {}, []
        for am in self._GQL_ALIAS.finditer(query[m.end():]):
            alias, number = am.group("alias"), int(value(am.group("number")))
            issue = self._issues.get((repo["full_name"].lower(), number))
            if issue is None or issue.is_pr or issue.deleted or issue.transferred_to:
                data[alias] = None
                errors.append({"type": "NOT_FOUND", "path": ["repository", alias], "locations": [{"line": 1, "column": 1}],
                               "message": f"Could not resolve to an Issue with the number of {number}."})
                continue
            data[alias] = {"databaseId": issue.id, "id": issue.node_id, "number": issue.number, "title": issue.title,
                           "state": issue.state.upper(),
                           "stateReason": issue.state_reason.upper() if issue.state_reason else None,
                           "updatedAt": _iso(issue.updated_at),
                           "labels": {"nodes": [{"name": n} for n in issue.labels]}}
        out = {"data": {"repository": data}}
        if errors:
            out["errors"] = errors
        return 200, out, {}

    def r_sb_deliveries(self, **_):
        return 200, [d.summary() for d in self._deliveries], {}

    def r_sb_requests(self, **_):
        return 200, [r.summary() for r in self._requests], {}

    def run_control(self, control: str, body) -> object:
        """``POST /_sandbox/<control>``: call a control method with the JSON object as keyword arguments
        (``"args": [...]`` for positional ones). Runs outside the state lock (it flushes webhooks)."""
        if control not in self.control_methods:
            raise _SandboxError(404, f"Unknown sandbox control {control!r}")
        try:
            return self._invoke_control(control, body)
        except self.control_errors as exc:
            raise _SandboxError(400, f"{control}: {exc}") from None


def main(argv=None) -> int:
    parser = cli_parser(
        "github", "Run the GitHub-compatible sandbox server (offline demo).", 8765,
        "bearer token the API accepts (env GITHUB_SANDBOX_TOKEN); omit to disable auth",
        "open N demo issues at start (no webhooks)",
        after_port=lambda p: p.add_argument("--repo", action="append", dest="repos",
                                            help="owner/name (repeatable; default demo/app)"),
        after_secret=lambda p: p.add_argument("--service-login", default="paperclip-bot"))
    args = parser.parse_args(argv)
    sandbox = GitHubSandbox(host=args.host, port=args.port, repos=tuple(args.repos or ["demo/app"]), token=args.token,
                            service_login=args.service_login, webhook_url=args.webhook_url,
                            webhook_secret=args.webhook_secret, delivery_mode="queued" if args.queued else "sync",
                            real_clock=True)
    with sandbox.quiet():
        for n in range(args.seed):
            sandbox.open_issue(f"Demo issue {n + 1}", f"Seeded by the sandbox ({n + 1}/{args.seed}).",
                               labels=["demo"])
    return serve_until_interrupted(sandbox, lambda sb: (
        f"GitHub sandbox on {sb.base_url}  (GraphQL {sb.graphql_url}); repos: "
        f"{', '.join(args.repos or ['demo/app'])}; auth {'on' if args.token else 'off'}; "
        f"webhook {'-> ' + args.webhook_url if args.webhook_url else 'none'}"))


if __name__ == "__main__":
    sys.exit(main())
