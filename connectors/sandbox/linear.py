"""A small Linear-compatible GraphQL server for tests and the offline demo (stdlib only, no Django).

It serves ``POST /graphql`` and answers exactly the operations :mod:`connectors.providers.linear` sends,
dispatched on ``operationName`` (``Issues``, ``Issue``, ``IssueStates``, ``IssueComments``, ``IssueTeam``,
``Teams``, ``CommentCreate``, ``IssueUpdate``, ``IssueCreate``, ``AttachmentCreate``, ``IssueAttachments``), with Linear's
response shapes (``nodes``, ``pageInfo {hasNextPage endCursor}``, ``{success, issue}`` payloads) and
errors (HTTP 400 + ``extensions.code`` ``RATELIMITED`` / ``AUTHENTICATION_ERROR`` / ``INVALID_INPUT``,
``Entity not found``). Filters implemented: ``team {key|id {eq}}``, ``updatedAt {gt|gte}``, ``id {in}``;
``orderBy: updatedAt`` sorts ascending by ``(updatedAt, id)`` and ``after`` is a keyset cursor. Every
response carries ``X-RateLimit-Requests-Limit/-Remaining/-Reset`` (reset in epoch ms).

Every mutation (API or control method) emits a Linear-shaped webhook delivery signed with
``Linear-Signature`` (hex HMAC-SHA256 of the body), a ``Linear-Delivery`` uuid header, ``Linear-Event``
(``Issue``/``Comment``) and a ``webhookTimestamp`` (wall-clock ms), recorded in ``sandbox.deliveries``
and POSTed to ``webhook_url`` when one is set.

Use from Python::

    sb = LinearSandbox(teams=("ENG",), token="t", webhook_secret="s").start()
    sb.graphql_url                               # "http://127.0.0.1:<port>/graphql"; adapter base_url = sb.base_url
    issue = sb.create_issue("Fix login", team="ENG", state="Todo", labels=["Bug"], priority=2)
    sb.move_issue(issue["id"], "In Progress"); sb.add_comment(issue["id"], "On it")
    sb.deliver_fixture("lhc_linearIssueCreated", {"data": {"title": "x"}})
    sb.fail_next(1, "rate_limit", retry_after=7)  # or "ratelimited_400", "auth" (401), "error" (status=500)
    sb.requests_for("Issues"); sb.deliveries[-1].payload; sb.stop()

Standalone (offline demo; secrets from arguments or the environment only)::

    python -m connectors.sandbox.linear --port 8766 --team ENG --token "$LINEAR_SANDBOX_TOKEN" \\
        --webhook-url http://127.0.0.1:8000/... --webhook-secret "$LINEAR_SANDBOX_WEBHOOK_SECRET" --seed 5

Control endpoints for the demo: ``POST /_sandbox/<control method>`` with a JSON object of keyword
arguments, ``GET /_sandbox/deliveries``, ``GET /_sandbox/requests`` (same token).
"""
from __future__ import annotations

import base64
import hmac
import json
import re
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from connectors.sandbox.base import (  # noqa: F401  (START_TIME: a public name of this module)
    START_TIME,
    DeliveryRecord,
    SandboxServer,
    cli_parser,
    hmac_sha256_hex,
    mutation,
    serve_until_interrupted,
)
from connectors.sandbox.base import iso_ms as _iso
from connectors.sandbox.base import parse_ts as _parse_ts

DEFAULT_FIXTURES_DIR = str(Path(__file__).resolve().parent / "fixtures" / "linear")  # real payloads, copied unchanged
RATE_LIMIT = 5000
DEFAULT_STATES = (("Triage", "triage"), ("Backlog", "backlog"), ("Todo", "unstarted"), ("In Progress", "started"),
                  ("In Review", "started"), ("Done", "completed"), ("Canceled", "canceled"), ("Duplicate", "duplicate"))
CONTROL_METHODS = ("add_team", "add_user", "add_label", "create_issue", "update_issue", "move_issue", "delete_issue",
                   "add_comment", "edit_comment", "delete_comment", "deliver_fixture", "fail_next", "flush", "advance",
                   "outage", "recover", "add_attachment")


def sign(secret: str, body: bytes) -> str:
    """Linear's ``Linear-Signature``: hex HMAC-SHA256(secret, raw body), no prefix."""
    return hmac_sha256_hex(secret, body)


@dataclass
class Delivery(DeliveryRecord):
    """One webhook delivery (sent or only recorded); ``body`` the exact signed bytes."""

    type: str
    action: str
    delivery_id: str
    headers: dict
    body: bytes

    def summary(self) -> dict:
        return {"type": self.type, "action": self.action, "deliveryId": self.delivery_id, "url": self.url,
                "status": self.status, "error": self.error, "delivered": self.delivered}


@dataclass
class RequestRecord:
    method: str
    path: str
    headers: dict
    operation: str | None = None
    variables: dict = field(default_factory=dict)
    body: object = None
    status: int | None = None

    def summary(self) -> dict:
        return {"method": self.method, "path": self.path, "operation": self.operation, "variables": self.variables,
                "status": self.status}


class _GqlError(Exception):
    def __init__(self, message: str, code: str = "INVALID_INPUT", status: int = 200):
        super().__init__(message)
        self.message, self.code, self.status = message, code, status


class LinearSandbox(SandboxServer):
    """In-memory Linear workspace with a GraphQL endpoint. See the module docstring.

    ``teams``: team keys to create (each gets the default workflow states); ``token``: the API key the
    server accepts (``Authorization: <key>`` or ``Bearer <key>``; ``None`` disables auth);
    ``service_user``: the name of the user that key belongs to (API mutations are attributed to it);
    ``webhook_url``/``webhook_secret``: where and how deliveries are signed/sent (secret without URL:
    recorded only); ``delivery_mode`` ``"sync"`` or ``"queued"`` (sent by :meth:`flush`); the data clock
    is deterministic (starts 2026-01-01, ``tick`` seconds per mutation) unless ``real_clock``."""

    provider = "linear"
    server_version = "LinearSandbox/1.0"
    control_methods = CONTROL_METHODS
    failure_modes = ("rate_limit", "ratelimited_400", "auth", "error")

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, teams=("ENG",), token: str | None = "lin_api_sandbox",
                 service_user: str = "Paperclip Bot", default_actor: str = "Ada Lovelace", organization: str = "sandbox-org",
                 webhook_url: str | None = None, webhook_secret: str | None = None, delivery_mode: str = "sync",
                 real_clock: bool = False, tick: float = 1.0, fixtures_dir: str | None = None,
                 delivery_timeout: float = 10.0):
        self._init_sandbox(host=host, port=port, token=token, delivery_mode=delivery_mode, real_clock=real_clock,
                           tick=tick, fixtures_dir=fixtures_dir, default_fixtures_dir=DEFAULT_FIXTURES_DIR,
                           delivery_timeout=delivery_timeout)
        self.organization = organization
        self.webhook_url, self.webhook_secret = webhook_url, webhook_secret
        self.organization_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"linear-sandbox:{organization}"))
        self._teams: dict[str, dict] = {}  # id -> team
        self._users: dict[str, dict] = {}  # id -> user
        self._issues: dict[str, dict] = {}
        self._comments: dict[str, dict] = {}
        self._attachments: dict[str, dict] = {}
        self._used = 0
        self.service_user = self.add_user(service_user)
        self.default_actor = self.add_user(default_actor)
        for key in teams:
            self.add_team(key)

    @property
    def graphql_url(self) -> str:
        return self.base_url + "/graphql"

    # --- the offline demo (manage.py demo_sandbox --provider linear) ------------------------------
    def demo_instance_fields(self) -> dict:
        team = next(iter(self._teams.values()))["key"]
        return {"containers": [team], "base_url": self.base_url, "service_account_id": self.service_user["id"],
                "state_mapping": {"types": {"triage": "backlog", "backlog": "backlog", "unstarted": "backlog",
                                            "started": "active", "completed": "terminal", "canceled": "terminal",
                                            "duplicate": "terminal"}, "states": {"In Review": "review"}}}

    def demo_open_task(self, title: str, body: str) -> str:
        return self.create_issue(title, team=next(iter(self._teams.values()))["key"], description=body)["id"]

    # --- clock, ids ------------------------------------------------------------------------------
    _format_ts = staticmethod(_iso)

    @staticmethod
    def _uuid() -> str:
        return str(uuid.uuid4())

    # --- directory ---------------------------------------------------------------------------------
    def add_user(self, name: str, *, email: str | None = None) -> dict:
        with self._lock:
            for user in self._users.values():
                if user["name"] == name:
                    return user
            uid = self._uuid()
            user = {"id": uid, "name": name, "displayName": name.split(" ")[0].lower(),
                    "email": email or f"{name.split(' ')[0].lower()}@example.com"}
            self._users[uid] = user
            return user

    def add_team(self, key: str, *, name: str | None = None, states=DEFAULT_STATES) -> dict:
        with self._lock:
            existing = self._team(key, missing_ok=True)
            if existing:
                return existing
            team = {"id": self._uuid(), "key": key, "name": name or f"{key} team", "next": 1,
                    "states": [{"id": self._uuid(), "name": n, "type": t, "position": i} for i, (n, t) in enumerate(states)],
                    "labels": []}
            self._teams[team["id"]] = team
            return team

    def add_label(self, team: str, name: str) -> dict:
        with self._lock:
            t = self._team(team)
            for label in t["labels"]:
                if label["name"].lower() == name.lower():
                    return label
            label = {"id": self._uuid(), "name": name, "color": "#4EA7FC"}
            t["labels"].append(label)
            return label

    def _team(self, ref: str | None, *, missing_ok: bool = False) -> dict | None:
        if ref is None:
            return next(iter(self._teams.values()))
        for team in self._teams.values():
            if team["id"] == ref or team["key"].lower() == str(ref).lower():
                return team
        if missing_ok:
            return None
        raise KeyError(f"no team {ref!r}")

    def team(self, ref: str | None = None) -> dict:
        with self._lock:
            return self._team(ref)

    def state_named(self, team: str | None, name: str) -> dict:
        t = self._team(team)
        for state in t["states"]:
            if state["name"].lower() == name.lower():
                return state
        raise KeyError(f"team {t['key']} has no state {name!r}")

    def _user_ref(self, name_or_id: str | None) -> dict:
        if name_or_id is None:
            return self.default_actor
        if name_or_id in self._users:
            return self._users[name_or_id]
        return self.add_user(name_or_id)

    # --- rendering -------------------------------------------------------------------------------
    def _state_of(self, issue: dict) -> dict:
        team = self._teams[issue["teamId"]]
        return next(s for s in team["states"] if s["id"] == issue["stateId"])

    def render_user(self, uid: str | None) -> dict | None:
        user = self._users.get(uid) if uid else None
        return {k: user[k] for k in ("id", "name", "displayName", "email")} if user else None

    def render_issue(self, issue: dict) -> dict:
        team = self._teams[issue["teamId"]]
        state = self._state_of(issue)
        labels = [lbl for lbl in team["labels"] if lbl["id"] in issue["labelIds"]]
        relations = []
        for other in self._issues.values():
            if issue["id"] in other.get("blocks", []) and not other["trashed"]:
                ost = self._state_of(other)
                relations.append({"type": "blocks", "issue": {"id": other["id"], "identifier": other["identifier"],
                                                              "state": {"name": ost["name"], "type": ost["type"]}}})
        return {
            "id": issue["id"], "identifier": issue["identifier"], "number": issue["number"], "title": issue["title"],
            "description": issue["description"], "priority": issue["priority"],
            "priorityLabel": ["No priority", "Urgent", "High", "Medium", "Low"][issue["priority"]],
            "url": f"https://linear.app/{self.organization}/issue/{issue['identifier']}",
            "branchName": f"{self.display_name(self.default_actor['id'])}/{issue['identifier'].lower()}",
            "estimate": issue.get("estimate"), "createdAt": _iso(issue["createdAt"]), "updatedAt": _iso(issue["updatedAt"]),
            "archivedAt": _iso(issue.get("archivedAt")), "canceledAt": None, "completedAt": None, "startedAt": None,
            "dueDate": issue.get("dueDate"), "trashed": issue["trashed"] or None,
            "state": {"id": state["id"], "name": state["name"], "type": state["type"], "color": "#bec2c8"},
            "team": {"id": team["id"], "key": team["key"], "name": team["name"]},
            "assignee": self.render_user(issue.get("assigneeId")),
            "creator": self.render_user(issue.get("creatorId")),
            "labels": {"nodes": [{"id": lbl["id"], "name": lbl["name"]} for lbl in labels]},
            "project": None, "cycle": None, "parent": None,
            "inverseRelations": {"nodes": relations},
        }

    def display_name(self, uid: str) -> str:
        return self._users[uid]["displayName"]

    def render_comment(self, c: dict) -> dict:
        issue = self._issues[c["issueId"]]
        return {"id": c["id"], "body": c["body"], "createdAt": _iso(c["createdAt"]), "updatedAt": _iso(c["updatedAt"]),
                "editedAt": _iso(c.get("editedAt")),
                "url": f"https://linear.app/{self.organization}/issue/{issue['identifier']}#comment-{c['id'][:8]}",
                "user": self.render_user(c["userId"]), "botActor": None}

    def issue(self, issue_id: str) -> dict:
        with self._lock:
            return self.render_issue(self._issues[issue_id])

    def comments_of(self, issue_id: str) -> list[dict]:
        with self._lock:
            return [self.render_comment(c) for c in self._comments.values() if c["issueId"] == issue_id and not c["deleted"]]

    def attachments_of(self, issue_id: str) -> list[dict]:
        with self._lock:
            return [dict(a) for a in self._attachments.values() if a["issueId"] == issue_id]

    # --- webhooks ------------------------------------------------------------------------------
    def _webhook_data_issue(self, issue: dict) -> dict:
        """The ``data`` object of an Issue webhook (flat ids + nested state/team/labels, like Linear)."""
        r = self.render_issue(issue)
        return {
            "id": r["id"], "createdAt": r["createdAt"], "updatedAt": r["updatedAt"], "archivedAt": r["archivedAt"],
            "number": r["number"], "title": r["title"], "description": r["description"], "priority": r["priority"],
            "priorityLabel": r["priorityLabel"], "identifier": r["identifier"], "url": r["url"],
            "teamId": r["team"]["id"], "stateId": r["state"]["id"], "assigneeId": issue.get("assigneeId"),
            "creatorId": issue.get("creatorId"), "labelIds": list(issue["labelIds"]), "dueDate": r["dueDate"],
            "subscriberIds": [issue.get("creatorId")] if issue.get("creatorId") else [],
            "state": r["state"], "team": r["team"], "labels": r["labels"]["nodes"],
            **({"assignee": {"id": r["assignee"]["id"], "name": r["assignee"]["name"]}} if r["assignee"] else {}),
        }

    def _webhook_data_comment(self, c: dict) -> dict:
        r = self.render_comment(c)
        issue = self._issues[c["issueId"]]
        team = self._teams[issue["teamId"]]
        user = self._users[c["userId"]]
        return {"id": r["id"], "createdAt": r["createdAt"], "updatedAt": r["updatedAt"], "body": r["body"],
                "issueId": issue["id"], "userId": user["id"], "reactionData": [],
                **({"editedAt": r["editedAt"]} if r["editedAt"] else {}),
                "issue": {"id": issue["id"], "title": issue["title"], "identifier": issue["identifier"],
                          "teamId": team["id"], "team": {"id": team["id"], "key": team["key"], "name": team["name"]}},
                "user": {"id": user["id"], "name": user["name"]}}

    def _emit(self, type_: str, action: str, data: dict, *, url: str, actor: dict | None = None,
              updated_from: dict | None = None, raw: dict | None = None) -> Delivery | None:
        if self._muted:
            return None
        if raw is not None:
            payload = raw
        else:
            payload = {"action": action, "type": type_, "createdAt": data.get("updatedAt") or _iso(self._clock),
                       "data": data, "url": url, "organizationId": self.organization_id,
                       "webhookTimestamp": int(time.time() * 1000), "webhookId": str(uuid.uuid5(uuid.NAMESPACE_URL, self.base_url))}
            if actor:
                payload["actor"] = {"id": actor["id"], "name": actor["name"], "type": "user"}
            if updated_from is not None:
                payload["updatedFrom"] = updated_from
        body = json.dumps(payload).encode("utf-8")
        headers = {"Content-Type": "application/json; charset=utf-8", "User-Agent": "Linear-Webhook",
                   "Linear-Delivery": str(uuid.uuid4()), "Linear-Event": str(payload.get("type") or type_)}
        if self.webhook_secret:
            headers["Linear-Signature"] = sign(self.webhook_secret, body)
        return self._record(Delivery(type=str(payload.get("type")), action=str(payload.get("action")),
                                     delivery_id=headers["Linear-Delivery"], headers=headers, body=body,
                                     url=self.webhook_url))

    def deliver_fixture(self, name: str, overrides: dict | None = None) -> Delivery:
        """Send a real fixture payload (``lhc_linearIssueCreated``, ``lks_createIssue``, ... or a path) unchanged
        except for ``overrides`` (deep-merged; e.g. ``{"webhookTimestamp": <now ms>}`` to make an old one
        fresh). Signed like every delivery; returns it."""
        payload = self._load_fixture(name, overrides)
        with self._lock:
            delivery = self._emit(str(payload.get("type")), str(payload.get("action")), {}, url="", raw=payload)
        self._after_mutation()
        return delivery

    # --- failure injection ---------------------------------------------------------------------
    def fail_next(self, count: int = 1, mode: str = "rate_limit", *, retry_after: int | None = None,
                  status: int | None = None) -> None:
        """Make the next ``count`` GraphQL responses fail. Modes: ``rate_limit`` (HTTP 429 + ``Retry-After``
        when given), ``ratelimited_400`` (HTTP 400, ``RATELIMITED`` error, ``X-RateLimit-Requests-Reset``
        in ``retry_after`` s), ``auth`` (401, ``AUTHENTICATION_ERROR``), ``error`` (``status``, default 500)."""
        self._queue_failure(count, mode, retry_after=retry_after, status=status)

    # --- request log -----------------------------------------------------------------------------
    def requests_for(self, operation: str) -> list[RequestRecord]:
        return [r for r in self.requests if r.operation == operation]

    # --- mutations (control methods; the API uses the same code) -----------------------------------
    def _touch(self, issue: dict) -> None:
        issue["updatedAt"] = self._stamp()

    def _issue_url(self, issue: dict) -> str:
        return f"https://linear.app/{self.organization}/issue/{issue['identifier']}"

    def _create_issue(self, title: str, team: str | None, description: str | None, state: str | None, labels,
                      priority: int, assignee: str | None, actor: dict, due_date: str | None = None,
                      state_id: str | None = None, label_ids=None) -> dict:
        t = self._team(team)
        if state_id:
            if not any(s["id"] == state_id for s in t["states"]):
                raise _GqlError("Argument Validation Error: stateId is not a state of the team")
            sid = state_id
        else:
            sid = self.state_named(t["id"], state or "Todo")["id"]
        ids = list(label_ids or []) + [self.add_label(t["id"], name)["id"] for name in labels or ()]
        now = self._stamp()
        number = t["next"]
        t["next"] += 1
        issue = {"id": self._uuid(), "number": number, "identifier": f"{t['key']}-{number}", "teamId": t["id"],
                 "title": title, "description": description, "priority": int(priority or 0), "stateId": sid,
                 "labelIds": ids, "assigneeId": self._user_ref(assignee)["id"] if assignee else None,
                 "creatorId": actor["id"], "createdAt": now, "updatedAt": now, "dueDate": due_date,
                 "trashed": False, "blocks": []}
        self._issues[issue["id"]] = issue
        self._emit("Issue", "create", self._webhook_data_issue(issue), url=self._issue_url(issue), actor=actor)
        return issue

    def _update_issue(self, issue: dict, actor: dict, **changes) -> dict:
        before = self._webhook_data_issue(issue)
        team = self._teams[issue["teamId"]]
        for key, value in changes.items():
            if key == "state":
                issue["stateId"] = self.state_named(team["id"], value)["id"]
            elif key == "stateId":
                if not any(s["id"] == value for s in team["states"]):
                    raise _GqlError("Argument Validation Error: stateId is not a state of the issue's team")
                issue["stateId"] = value
            elif key == "labels":
                issue["labelIds"] = [self.add_label(team["id"], n)["id"] for n in value]
            elif key == "labelIds":
                known = {lbl["id"] for lbl in team["labels"]}
                if any(v not in known for v in value):
                    raise _GqlError("Argument Validation Error: unknown label id")
                issue["labelIds"] = list(value)
            elif key == "assignee":
                issue["assigneeId"] = self._user_ref(value)["id"] if value else None
            elif key == "priority":
                issue["priority"] = int(value or 0)
            elif key in ("title", "description", "dueDate", "estimate"):
                issue[key] = value
            elif key == "blocks":
                issue["blocks"] = list(value)
            else:
                raise _GqlError(f"Argument Validation Error: unknown field {key}")
        self._touch(issue)
        after = self._webhook_data_issue(issue)
        updated_from = {k: before[k] for k in ("updatedAt", "title", "description", "priority", "stateId", "labelIds",
                                               "assigneeId", "dueDate") if before.get(k) != after.get(k)}
        updated_from["updatedAt"] = before["updatedAt"]
        self._emit("Issue", "update", after, url=self._issue_url(issue), actor=actor, updated_from=updated_from)
        return issue

    @mutation
    def create_issue(self, title: str = "Untitled", *, team: str | None = None, description: str | None = "",
                     state: str | None = "Todo", labels=(), priority: int = 0, assignee: str | None = None,
                     due_date: str | None = None, actor: str | None = None) -> dict:
        issue = self._create_issue(title, team, description, state, labels, priority, assignee, self._user_ref(actor),
                                   due_date)
        return self.render_issue(issue)

    @mutation
    def update_issue(self, issue_id: str, *, actor: str | None = None, **changes) -> dict:
        """Change ``title``, ``description``, ``state`` (name), ``labels`` (names), ``priority``, ``assignee``,
        ``dueDate``, ``blocks`` (ids of issues this one blocks)."""
        return self.render_issue(self._update_issue(self._issues[issue_id], self._user_ref(actor), **changes))

    def move_issue(self, issue_id: str, state: str, *, actor: str | None = None) -> dict:
        return self.update_issue(issue_id, state=state, actor=actor)

    @mutation
    def delete_issue(self, issue_id: str, *, actor: str | None = None) -> dict:
        """Trash the issue (Linear's delete): ``remove`` webhook; it disappears from listings."""
        issue = self._issues[issue_id]
        issue["trashed"] = True
        self._touch(issue)
        self._emit("Issue", "remove", self._webhook_data_issue(issue), url=self._issue_url(issue),
                   actor=self._user_ref(actor))
        return self.render_issue(issue)

    def _add_comment(self, issue: dict, body: str, user: dict) -> dict:
        now = self._stamp()
        c = {"id": self._uuid(), "issueId": issue["id"], "body": body, "userId": user["id"], "createdAt": now,
             "updatedAt": now, "deleted": False}
        self._comments[c["id"]] = c
        self._emit("Comment", "create", self._webhook_data_comment(c),
                   url=self.render_comment(c)["url"], actor=user)
        return c

    @mutation
    def add_comment(self, issue_id: str, body: str, *, actor: str | None = None) -> dict:
        c = self._add_comment(self._issues[issue_id], body, self._user_ref(actor))
        return self.render_comment(c)

    @mutation
    def edit_comment(self, comment_id: str, body: str, *, actor: str | None = None) -> dict:
        c = self._comments[comment_id]
        old = {"body": c["body"], "updatedAt": _iso(c["updatedAt"]), "editedAt": _iso(c.get("editedAt"))}
        c["body"], c["updatedAt"] = body, self._stamp()
        c["editedAt"] = c["updatedAt"]
        self._emit("Comment", "update", self._webhook_data_comment(c), url=self.render_comment(c)["url"],
                   actor=self._user_ref(actor), updated_from=old)
        return self.render_comment(c)

    def _attach(self, issue: dict, url: str, user: dict, *, title=None, subtitle=None, metadata=None) -> dict:
        """attachmentCreate semantics: one attachment per (issue, url), updated in place."""
        existing = next((a for a in self._attachments.values() if a["issueId"] == issue["id"] and a["url"] == url), None)
        if existing is None:
            existing = {"id": self._uuid(), "issueId": issue["id"], "url": url, "creatorId": user["id"],
                        "createdAt": self._stamp()}
            self._attachments[existing["id"]] = existing
        existing.update(title=title, subtitle=subtitle, metadata=metadata or {}, updatedAt=self._stamp())
        return existing

    @mutation
    def add_attachment(self, issue_id: str, url: str, *, actor: str | None = None, title: str | None = None,
                       metadata: dict | None = None) -> dict:
        """Someone (``actor``, default the default user) attaches a link to the issue."""
        return dict(self._attach(self._issues[issue_id], url, self._user_ref(actor), title=title, metadata=metadata))

    @mutation
    def delete_comment(self, comment_id: str, *, actor: str | None = None) -> None:
        c = self._comments[comment_id]
        c["deleted"] = True
        self._emit("Comment", "remove", self._webhook_data_comment(c), url=self.render_comment(c)["url"],
                   actor=self._user_ref(actor))

    # --- HTTP ----------------------------------------------------------------------------------------
    def _rate_headers(self, exhausted: bool = False, reset_in: float | None = None) -> dict:
        if not exhausted:
            self._used += 1
        reset_ms = int((time.time() + (reset_in if reset_in is not None else 3600)) * 1000)
        remaining = 0 if exhausted else max(0, RATE_LIMIT - self._used)
        return {"X-RateLimit-Requests-Limit": str(RATE_LIMIT), "X-RateLimit-Requests-Remaining": str(remaining),
                "X-RateLimit-Requests-Reset": str(reset_ms)}

    def _authorized(self, headers: dict) -> dict | None:
        if self.token is None:
            return self.service_user
        value = headers.get("authorization", "").strip()
        if value.lower().startswith("bearer "):
            value = value[7:].strip()
        if value and hmac.compare_digest(value, self.token):
            return self.service_user
        return None

    def handle(self, method: str, raw_path: str, headers: dict, raw_body: bytes):
        """Returns (status, headers, body bytes)."""
        path = urlsplit(raw_path).path
        try:
            body = json.loads(raw_body) if raw_body else None
        except ValueError:
            body = None
        operation = (body or {}).get("operationName") if isinstance(body, dict) else None
        if not operation and isinstance(body, dict):
            m = re.match(r"\s*(?:query|mutation)\s+(\w+)", str(body.get("query") or ""))
            operation = m.group(1) if m else None
        record = RequestRecord(method, path, headers, operation,
                               dict((body or {}).get("variables") or {}) if isinstance(body, dict) else {}, body)
        self._log_request(record)
        user = self._authorized(headers)
        if path.startswith("/_sandbox/"):
            if user is None:
                return self._finish(record, 401, {"message": "unauthorized"}, {})
            return self._control(record, method, path, body)
        if path != "/graphql" or method != "POST":
            return self._finish(record, 404, {"message": "Not found"}, {})
        failure = self._take_failure()
        if failure:
            return self._failure(record, failure)
        if user is None:
            with self._lock:
                rate = self._rate_headers()
            return self._finish(record, 400, {"errors": [{
                "message": "Authentication required, not authenticated",
                "extensions": {"code": "AUTHENTICATION_ERROR", "type": "authentication error",
                               "userPresentableMessage": "You need to authenticate to access this operation."}}]}, rate)
        if not isinstance(body, dict) or not isinstance(body.get("query"), str):
            return self._finish(record, 400, {"errors": [{"message": "Must provide query string.",
                                                          "extensions": {"code": "GRAPHQL_PARSE_FAILED"}}]}, {})
        handler = getattr(self, f"op_{operation}", None)
        with self._lock:
            rate = self._rate_headers()
            if handler is None:
                return self._finish(record, 400, {"errors": [{"message": f"Unknown operation {operation!r}",
                                                              "extensions": {"code": "GRAPHQL_VALIDATION_FAILED"}}]}, rate)
            try:
                data = handler(record.variables, user)
                status, payload = 200, {"data": data}
            except _GqlError as exc:
                status, payload = exc.status, {"data": None, "errors": [{
                    "message": exc.message, "extensions": {"code": exc.code, "userPresentableMessage": exc.message}}]}
        self._after_mutation()
        return self._finish(record, status, payload, rate)

    def _failure(self, record, failure):
        mode, retry = failure["mode"], failure["retry_after"]
        with self._lock:
            if mode in ("rate_limit", "ratelimited_400"):
                rate = self._rate_headers(exhausted=True, reset_in=retry if retry is not None else 60)
            else:
                rate = self._rate_headers()
        if mode == "rate_limit":
            extra = {"Retry-After": str(retry)} if retry is not None else {}
            return self._finish(record, failure["status"] or 429, {"errors": [{
                "message": "Rate limit exceeded", "extensions": {"code": "RATELIMITED"}}]}, {**rate, **extra})
        if mode == "ratelimited_400":
            return self._finish(record, 400, {"errors": [{"message": "Rate limit exceeded",
                                                          "extensions": {"code": "RATELIMITED"}}]}, rate)
        if mode == "auth":
            return self._finish(record, failure["status"] or 401, {"errors": [{
                "message": "Authentication required, not authenticated",
                "extensions": {"code": "AUTHENTICATION_ERROR"}}]}, rate)
        return self._finish(record, failure["status"] or 500, {"errors": [{"message": "Internal server error",
                                                                          "extensions": {"code": "INTERNAL_SERVER_ERROR"}}]}, rate)

    @staticmethod
    def _finish(record, status, payload, headers=None):
        record.status = status
        body = json.dumps(payload).encode("utf-8")
        return status, {"Content-Type": "application/json; charset=utf-8", **(headers or {})}, body

    # --- GraphQL operations ----------------------------------------------------------------------
    @staticmethod
    def _encode_after(issue_like: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps([_iso(issue_like["updatedAt"]), issue_like["id"]]).encode()).decode()

    @staticmethod
    def _decode_after(after: str) -> tuple:
        try:
            ts, rid = json.loads(base64.urlsafe_b64decode(after.encode()))
            return (_parse_ts(ts), str(rid))
        except (ValueError, TypeError):
            raise _GqlError("Argument Validation Error: after cursor is invalid", "INVALID_INPUT", 400) from None

    def _paginate(self, rows: list[dict], variables: dict) -> dict:
        rows = sorted(rows, key=lambda r: (r["updatedAt"], r["id"]))
        after = variables.get("after")
        if after:
            key = self._decode_after(after)
            rows = [r for r in rows if (r["updatedAt"], r["id"]) > key]
        first = variables.get("first") or 50
        if not isinstance(first, int) or first < 1 or first > 250:
            raise _GqlError("Argument Validation Error: first must be between 1 and 250")
        page, more = rows[:first], len(rows) > first
        return {"page": page, "pageInfo": {"hasNextPage": more, "endCursor": self._encode_after(page[-1]) if page else None,
                                           "hasPreviousPage": bool(after), "startCursor": self._encode_after(page[0]) if page else None}}

    @staticmethod
    def _time_filter(value: dict | None):
        if not value:
            return lambda ts: True
        checks = []
        for op, raw in value.items():
            try:
                bound = _parse_ts(raw)
            except (TypeError, ValueError, AttributeError):
                raise _GqlError(f"Argument Validation Error: updatedAt.{op} is not a date") from None
            checks.append({"gt": lambda ts, b=bound: ts > b, "gte": lambda ts, b=bound: ts >= b,
                           "lt": lambda ts, b=bound: ts < b, "lte": lambda ts, b=bound: ts <= b}[op])
        return lambda ts: all(c(ts) for c in checks)

    def _team_match(self, flt: dict | None):
        if not flt:
            return lambda team: True
        key = (flt.get("key") or {}).get("eq")
        tid = (flt.get("id") or {}).get("eq")
        return lambda team: (key is None or team["key"] == key) and (tid is None or team["id"] == tid)

    def op_Issues(self, v, user):
        flt = v.get("filter") or {}
        team_ok = self._team_match(flt.get("team"))
        time_ok = self._time_filter(flt.get("updatedAt"))
        ids = (flt.get("id") or {}).get("in")
        rows = [i for i in self._issues.values() if not i["trashed"] and team_ok(self._teams[i["teamId"]])
                and time_ok(i["updatedAt"]) and (ids is None or i["id"] in ids)]
        result = self._paginate(rows, v)
        return {"issues": {"nodes": [self.render_issue(i) for i in result["page"]], "pageInfo": result["pageInfo"]}}

    def op_IssueStates(self, v, user):
        ids = v.get("ids") or []
        if len(ids) > 250:
            raise _GqlError("Argument Validation Error: too many ids")
        rows = [i for i in self._issues.values() if i["id"] in ids and not i["trashed"]]
        result = self._paginate(rows, {"first": v.get("first") or 50})
        return {"issues": {"nodes": [self.render_issue(i) for i in result["page"]], "pageInfo": result["pageInfo"]}}

    def _get_issue(self, issue_id: str) -> dict:
        issue = self._issues.get(issue_id)
        if issue is None:
            issue = next((i for i in self._issues.values() if i["identifier"] == issue_id), None)
        if issue is None or issue["trashed"]:
            raise _GqlError("Entity not found: Issue", "INVALID_INPUT")
        return issue

    def op_Issue(self, v, user):
        return {"issue": self.render_issue(self._get_issue(v.get("id")))}

    def op_IssueComments(self, v, user):
        issue = self._get_issue(v.get("id"))
        time_ok = self._time_filter(((v.get("filter") or {}).get("updatedAt")))
        rows = [c for c in self._comments.values() if c["issueId"] == issue["id"] and not c["deleted"]
                and time_ok(c["updatedAt"])]
        result = self._paginate(rows, v)
        return {"issue": {"id": issue["id"], "comments": {"nodes": [self.render_comment(c) for c in result["page"]],
                                                          "pageInfo": result["pageInfo"]}}}

    def _render_team(self, team: dict) -> dict:
        return {"id": team["id"], "key": team["key"], "name": team["name"],
                "states": {"nodes": [{"id": s["id"], "name": s["name"], "type": s["type"]} for s in team["states"]]},
                "labels": {"nodes": [{"id": lbl["id"], "name": lbl["name"]} for lbl in team["labels"]]}}

    def op_IssueTeam(self, v, user):
        issue = self._get_issue(v.get("id"))
        return {"issue": {"id": issue["id"], "team": self._render_team(self._teams[issue["teamId"]])}}

    def op_Teams(self, v, user):
        match = self._team_match(v.get("filter"))
        return {"teams": {"nodes": [self._render_team(t) for t in self._teams.values() if match(t)]}}

    def op_CommentCreate(self, v, user):
        data = v.get("input") or {}
        if not data.get("body"):
            raise _GqlError("Argument Validation Error: body should not be empty")
        c = self._add_comment(self._get_issue(data.get("issueId")), data["body"], user)
        return {"commentCreate": {"success": True, "comment": {"id": c["id"], "url": self.render_comment(c)["url"]}}}

    def op_IssueUpdate(self, v, user):
        issue = self._get_issue(v.get("id"))
        allowed = ("title", "description", "priority", "stateId", "labelIds", "dueDate", "estimate")
        data = {k: val for k, val in (v.get("input") or {}).items()}
        unknown = [k for k in data if k not in allowed]
        if unknown:
            raise _GqlError(f"Argument Validation Error: unsupported input fields {unknown}")
        self._update_issue(issue, user, **data)
        st = self._state_of(issue)
        return {"issueUpdate": {"success": True, "issue": {"id": issue["id"], "updatedAt": _iso(issue["updatedAt"]),
                                                           "state": {"id": st["id"], "name": st["name"], "type": st["type"]}}}}

    def op_IssueCreate(self, v, user):
        data = dict(v.get("input") or {})
        if not data.get("teamId") or not data.get("title"):
            raise _GqlError("Argument Validation Error: teamId and title are required")
        issue = self._create_issue(data["title"], data["teamId"], data.get("description"), "Todo", (),
                                   data.get("priority") or 0, None, user, data.get("dueDate"),
                                   state_id=data.get("stateId"), label_ids=data.get("labelIds"))
        return {"issueCreate": {"success": True, "issue": self.render_issue(issue)}}

    def op_AttachmentCreate(self, v, user):
        data = v.get("input") or {}
        issue = self._get_issue(data.get("issueId"))
        url = data.get("url")
        if not url:
            raise _GqlError("Argument Validation Error: url is required")
        existing = self._attach(issue, url, user, title=data.get("title"), subtitle=data.get("subtitle"),
                                metadata=data.get("metadata"))
        return {"attachmentCreate": {"success": True, "attachment": {"id": existing["id"], "url": url}}}

    def op_IssueAttachments(self, v, user):
        issue = self._get_issue(v.get("id"))
        result = self._paginate([a for a in self._attachments.values() if a["issueId"] == issue["id"]], v)
        nodes = [{"id": a["id"], "url": a["url"], "title": a.get("title"), "subtitle": a.get("subtitle"),
                  "metadata": a.get("metadata") or {}, "creator": self.render_user(a.get("creatorId")),
                  "createdAt": _iso(a["createdAt"]), "updatedAt": _iso(a["updatedAt"])} for a in result["page"]]
        return {"issue": {"id": issue["id"], "attachments": {"nodes": nodes, "pageInfo": result["pageInfo"]}}}


def main(argv=None) -> int:
    parser = cli_parser(
        "linear", "Run the Linear-compatible GraphQL sandbox (offline demo).", 8766,
        "API key the server accepts (env LINEAR_SANDBOX_TOKEN); omit to disable auth",
        "create N demo issues at start (no webhooks)",
        after_port=lambda p: p.add_argument("--team", action="append", dest="teams",
                                            help="team key (repeatable; default ENG)"))
    args = parser.parse_args(argv)
    teams = tuple(args.teams or ["ENG"])
    sandbox = LinearSandbox(host=args.host, port=args.port, teams=teams, token=args.token,
                            webhook_url=args.webhook_url, webhook_secret=args.webhook_secret,
                            delivery_mode="queued" if args.queued else "sync", real_clock=True)
    with sandbox.quiet():
        for n in range(args.seed):
            sandbox.create_issue(f"Demo issue {n + 1}", team=teams[0], description=f"Seeded ({n + 1}/{args.seed}).",
                                 state="Todo", labels=["demo"], priority=3)
    return serve_until_interrupted(sandbox, lambda sb: (
        f"Linear sandbox on {sb.graphql_url}; teams: {', '.join(teams)}; auth {'on' if args.token else 'off'}; "
        f"webhook {'-> ' + args.webhook_url if args.webhook_url else 'none'}"))


if __name__ == "__main__":
    sys.exit(main())
