"""A small Jira Cloud-compatible REST server for tests and the offline demo (stdlib only, no Django).

It speaks the REST v3 shapes :mod:`connectors.providers.jira` uses, holds everything in memory, and
sends Jira-shaped webhook deliveries (``webhookEvent`` ``jira:issue_created|updated|deleted``,
``comment_created|updated|deleted``; headers ``X-Atlassian-Webhook-Identifier`` (stable per event, also
on a redelivery), ``X-Atlassian-Webhook-Retry`` and, with a secret, ``X-Hub-Signature: sha256=<hex>``)
for every mutation. Webhook issues use the v2 representation (description/body as text), like Jira.

Routes (all under ``/rest/api/3``): ``GET /myself``; ``POST /search/jql`` (JQL subset:
``project = "K"``, ``updated >= "yyyy/MM/dd HH:mm"``, ``id in (...)``, ``key in (...)``, ``AND``,
``ORDER BY updated ASC, id ASC``; ``nextPageToken`` absent on the last page; unknown ids -> 400 naming
them; a bad token -> 400); ``GET|PUT /issue/{idOrKey}`` (404 unknown); ``POST /issue``;
``GET|POST /issue/{k}/transitions``; ``GET|POST /issue/{k}/comment`` (``startAt``, ``maxResults``,
``expand=properties``; ADF bodies; comment ``properties`` kept); ``PUT|DELETE /issue/{k}/comment/{id}``;
``GET|POST /issue/{k}/remotelink`` (``globalId`` upsert); ``GET /project/{k}/statuses``. Auth is basic
``email:token`` (or ``Bearer token``). Failure injection: ``fail_next(count, mode)`` with ``rate_limit``
(429 + ``Retry-After``), ``auth`` (401), ``error`` (``status``, default 500).

Use from Python::

    sb = JiraSandbox(projects=("ABC",), email="bot@example.com", token="t", webhook_secret="s").start()
    sb.base_url                              # adapter base_url; credentials "bot@example.com:t"
    issue = sb.create_issue("Fix login", project="ABC", description="**bold**", labels=["Bug"], priority="High")
    sb.transition(issue["key"], "In Progress"); sb.add_comment(issue["key"], "On it")
    sb.deliver_fixture("zulip_issue_created", {"issue": {"fields": {"project": {"key": "ABC"}}}})
    sb.redeliver(sb.deliveries[-1])          # same identifier, X-Atlassian-Webhook-Retry: 1
    sb.requests_to(r"/search/jql$"); sb.stop()

Standalone (offline demo; secrets from arguments or the environment only)::

    python -m connectors.sandbox.jira --port 8767 --project ABC --email bot@example.com \\
        --token "$JIRA_SANDBOX_TOKEN" --webhook-url http://127.0.0.1:8000/... \\
        --webhook-secret "$JIRA_SANDBOX_WEBHOOK_SECRET" --seed 5

Control endpoints for the demo: ``POST /_sandbox/<control method>`` (JSON keyword arguments),
``GET /_sandbox/deliveries``, ``GET /_sandbox/requests`` (same credentials).
"""
from __future__ import annotations

import base64
import contextlib
import copy
import hashlib
import hmac
import json
import os
import re
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from connectors.sandbox.base import (  # noqa: F401  (START_TIME, RequestRecord: public names of this module)
    START_TIME,
    DeliveryRecord,
    RequestRecord,
    SandboxServer,
    cli_parser,
    hmac_sha256_hex,
    iso_ms,
    mutation,
    serve_until_interrupted,
)

try:  # the sandbox is stdlib-only except for this optional nicety (Markdown seeding)
    from connectors.providers.adf import adf_to_markdown, markdown_to_adf, plain_text
except Exception:  # pragma: no cover - standalone without the project on the path
    markdown_to_adf = None
    adf_to_markdown = None
    plain_text = None

DEFAULT_FIXTURES_DIR = str(Path(__file__).resolve().parent / "fixtures" / "jira")  # real payloads, copied unchanged
# (status name, statusCategory key, transition name that leads to it)
DEFAULT_WORKFLOW = (("To Do", "new", "Back to do"), ("In Progress", "indeterminate", "Start progress"),
                    ("In Review", "indeterminate", "Request review"), ("Blocked", "indeterminate", "Block"),
                    ("Done", "done", "Resolve"))
CATEGORIES = {"new": (2, "To Do", "blue-gray"), "indeterminate": (4, "In Progress", "yellow"),
              "done": (3, "Done", "green")}
PRIORITIES = (("1", "Highest"), ("2", "High"), ("3", "Medium"), ("4", "Low"), ("5", "Lowest"))
CONTROL_METHODS = ("add_project", "add_user", "create_issue", "update_issue", "transition", "delete_issue",
                   "add_comment", "edit_comment", "delete_comment", "deliver_fixture", "fail_next", "flush", "advance",
                   "outage", "recover")


def _jira_ts(value: datetime | None) -> str | None:
    return iso_ms(value, "+0000")


def sign(secret: str, body: bytes) -> str:
    """``sha256=<hex HMAC-SHA256(secret, body)>`` — Jira Cloud's ``X-Hub-Signature`` for webhooks with a secret."""
    return "sha256=" + hmac_sha256_hex(secret, body)


def _doc(markdown_or_doc) -> dict:
    if isinstance(markdown_or_doc, dict):
        return markdown_or_doc
    text = markdown_or_doc or ""
    if markdown_to_adf is not None:
        return markdown_to_adf(text)
    return {"type": "doc", "version": 1, "content": [{"type": "paragraph", "content": [{"type": "text", "text": text}]}]}


def _text_of(doc) -> str:
    if doc is None:
        return ""
    if plain_text is not None:
        return plain_text(doc)
    return json.dumps(doc)


@dataclass
class Delivery(DeliveryRecord):
    event: str
    identifier: str
    headers: dict
    body: bytes
    retry: int = 0

    def summary(self) -> dict:
        return {"event": self.event, "identifier": self.identifier, "retry": self.retry, "url": self.url,
                "status": self.status, "error": self.error, "delivered": self.delivered}


class _JiraError(Exception):
    def __init__(self, status: int, messages, errors: dict | None = None):
        super().__init__(str(messages))
        self.status = status
        self.messages = [messages] if isinstance(messages, str) else list(messages)
        self.errors = errors or {}


class JiraSandbox(SandboxServer):
    """In-memory Jira Cloud site. See the module docstring for routes and controls.

    ``projects``: project keys; ``email``/``token``: the basic-auth credentials accepted (``token=None``
    disables auth); ``service_name``: display name of the API user; ``default_actor``: the human behind
    control-method mutations; ``time_zone``: what ``/myself`` reports (JQL dates are read in it);
    ``webhook_url``/``webhook_secret``: delivery target and signing secret (no secret: unsigned, like a
    Jira webhook without one); deterministic clock (``tick`` s per mutation) unless ``real_clock``."""

    provider = "jira"
    server_version = "JiraSandbox/1.0"
    control_methods = CONTROL_METHODS
    failure_modes = ("rate_limit", "auth", "error")

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, projects=("ABC",), email: str = "bot@example.com",
                 token: str | None = "jira-sandbox-token", service_name: str = "Paperclip Bot",
                 default_actor: str = "Grace Hopper", time_zone: str = "UTC", webhook_url: str | None = None,
                 webhook_secret: str | None = None, delivery_mode: str = "sync", real_clock: bool = False,
                 tick: float = 1.0, fixtures_dir: str | None = None, delivery_timeout: float = 10.0,
                 workflow=DEFAULT_WORKFLOW):
        self._init_sandbox(host=host, port=port, token=token, delivery_mode=delivery_mode, real_clock=real_clock,
                           tick=tick, fixtures_dir=fixtures_dir, default_fixtures_dir=DEFAULT_FIXTURES_DIR,
                           delivery_timeout=delivery_timeout)
        self.email = email
        self.time_zone = time_zone
        self.webhook_url, self.webhook_secret = webhook_url, webhook_secret
        self.workflow = tuple(workflow)
        self._ids = {"issue": 10000, "comment": 10000, "project": 10000, "link": 10000}
        self._users: dict[str, dict] = {}  # accountId -> user
        self._projects: dict[str, dict] = {}  # key -> project
        self._issues: dict[str, dict] = {}  # id -> issue
        self._comments: dict[str, dict] = {}
        self._links: dict[str, dict] = {}
        self._statuses = {name: {"id": str(10000 + i), "name": name, "category": cat}
                          for i, (name, cat, _) in enumerate(self.workflow)}
        self.service_user = self.add_user(service_name, email=email)
        self.default_actor = self.add_user(default_actor)
        for key in projects:
            self.add_project(key)

    @property
    def credentials(self) -> str:
        """The adapter's ``credentials`` value (``email:token``)."""
        return f"{self.email}:{self.token}"

    # --- the offline demo (manage.py demo_sandbox --provider jira) --------------------------------
    def demo_instance_fields(self) -> dict:
        return {"containers": [next(iter(self._projects))], "base_url": self.base_url,
                "service_account_id": self.service_user["accountId"],
                "state_mapping": {"categories": {"new": "backlog", "indeterminate": "active", "done": "terminal"}}}

    def demo_open_task(self, title: str, body: str) -> str:
        return self.create_issue(title, project=next(iter(self._projects)), description=body)["id"]

    # --- clock, ids, directory -------------------------------------------------------------------
    def _next(self, kind: str) -> str:
        self._ids[kind] += 1
        return str(self._ids[kind])

    _format_ts = staticmethod(_jira_ts)

    def add_user(self, name: str, *, email: str | None = None) -> dict:
        with self._lock:
            for user in self._users.values():
                if user["displayName"] == name:
                    return user
            account = "5b10" + hashlib.sha1(name.encode()).hexdigest()[:20]
            user = {"accountId": account, "displayName": name, "active": True, "accountType": "atlassian",
                    "emailAddress": email or f"{name.split(' ')[0].lower()}@example.com", "timeZone": self.time_zone}
            self._users[account] = user
            return user

    def add_project(self, key: str, *, name: str | None = None) -> dict:
        with self._lock:
            if key in self._projects:
                return self._projects[key]
            project = {"id": self._next("project"), "key": key, "name": name or f"{key} project", "next": 1}
            self._projects[key] = project
            return project

    def _user(self, ref: str | None) -> dict:
        if ref is None:
            return self.default_actor
        if ref in self._users:
            return self._users[ref]
        return self.add_user(ref)

    # --- rendering -------------------------------------------------------------------------------
    def _render_user(self, account: str | None) -> dict | None:
        user = self._users.get(account) if account else None
        if not user:
            return None
        return {"self": f"{self.base_url}/rest/api/3/user?accountId={user['accountId']}", **user,
                "avatarUrls": {"48x48": f"{self.base_url}/avatar/{user['accountId']}"}}

    def _render_status(self, name: str) -> dict:
        status = self._statuses[name]
        cid, cname, color = CATEGORIES[status["category"]]
        return {"self": f"{self.base_url}/rest/api/3/status/{status['id']}", "description": "", "name": name,
                "id": status["id"], "iconUrl": f"{self.base_url}/",
                "statusCategory": {"self": f"{self.base_url}/rest/api/3/statuscategory/{cid}", "id": cid,
                                   "key": status["category"], "colorName": color, "name": cname}}

    def _render_priority(self, name: str | None) -> dict | None:
        for pid, pname in PRIORITIES:
            if pname == name:
                return {"self": f"{self.base_url}/rest/api/3/priority/{pid}", "name": pname, "id": pid,
                        "iconUrl": f"{self.base_url}/images/icons/priorities/{pname.lower()}.svg"}
        return None

    def _render_fields(self, issue: dict, *, v2: bool = False) -> dict:
        project = self._projects[issue["project"]]
        links = []
        for other in self._issues.values():
            if issue["id"] in other.get("blocks", []) and not other["deleted"]:
                links.append({"id": self._next("link"), "type": {"id": "10000", "name": "Blocks", "inward": "is blocked by",
                                                                  "outward": "blocks"},
                              "inwardIssue": {"id": other["id"], "key": other["key"],
                                              "fields": {"status": self._render_status(other["status"])}}})
        return {
            "summary": issue["summary"],
            "description": (adf_to_markdown(issue["description"]) if adf_to_markdown else _text_of(issue["description"]))
            if v2 and issue["description"] is not None else issue["description"],
            "status": self._render_status(issue["status"]),
            "priority": self._render_priority(issue.get("priority")),
            "labels": list(issue["labels"]),
            "assignee": self._render_user(issue.get("assignee")),
            "reporter": self._render_user(issue.get("reporter")),
            "duedate": issue.get("duedate"),
            "created": _jira_ts(issue["created"]), "updated": _jira_ts(issue["updated"]),
            "project": {"self": f"{self.base_url}/rest/api/3/project/{project['id']}", "id": project["id"],
                        "key": project["key"], "name": project["name"], "projectTypeKey": "software"},
            "issuetype": {"self": f"{self.base_url}/rest/api/3/issuetype/10001", "id": "10001",
                          "name": issue.get("issuetype") or "Task", "subtask": False},
            "parent": None, "components": [], "issuelinks": links,
            # custom fields by id, as Jira sends them (a select option is {"value": ...}); absent ones are null
            **{key: copy.deepcopy(value) for key, value in (issue.get("custom") or {}).items()},
        }

    def render_issue(self, issue: dict, *, v2: bool = False) -> dict:
        return {"expand": "renderedFields,names,schema,operations,editmeta,changelog", "id": issue["id"],
                "self": f"{self.base_url}/rest/api/{2 if v2 else 3}/issue/{issue['id']}", "key": issue["key"],
                "fields": self._render_fields(issue, v2=v2)}

    def render_comment(self, c: dict, *, v2: bool = False, properties: bool = False) -> dict:
        issue = self._issues[c["issueId"]]
        out = {"self": f"{self.base_url}/rest/api/{2 if v2 else 3}/issue/{issue['id']}/comment/{c['id']}", "id": c["id"],
               "author": self._render_user(c["author"]),
               "body": ((adf_to_markdown(c["body"]) if adf_to_markdown else _text_of(c["body"])) if v2 else c["body"]),
               "updateAuthor": self._render_user(c.get("updateAuthor") or c["author"]),
               "created": _jira_ts(c["created"]), "updated": _jira_ts(c["updated"]), "jsdPublic": True}
        if properties:
            out["properties"] = [dict(p) for p in c.get("properties") or []]
        return out

    def _find(self, id_or_key: str, *, allow_deleted: bool = False) -> dict:
        issue = self._issues.get(id_or_key) or next((i for i in self._issues.values() if i["key"] == id_or_key), None)
        if issue is None or (issue["deleted"] and not allow_deleted):
            raise _JiraError(404, "Issue does not exist or you do not have permission to see it.")
        return issue

    def issue(self, id_or_key: str) -> dict:
        with self._lock:
            return self.render_issue(self._find(id_or_key))

    def comments_of(self, id_or_key: str) -> list[dict]:
        with self._lock:
            issue = self._find(id_or_key)
            return [self.render_comment(c, properties=True) for c in self._comments.values()
                    if c["issueId"] == issue["id"] and not c["deleted"]]

    def remote_links_of(self, id_or_key: str) -> list[dict]:
        with self._lock:
            issue = self._find(id_or_key)
            return [copy.deepcopy(link) for link in self._links.values() if link["issueId"] == issue["id"]]

    # --- webhooks ------------------------------------------------------------------------------
    def _emit(self, event: str, payload: dict) -> Delivery | None:
        if self._muted:
            return None
        body = json.dumps(payload).encode("utf-8")
        identifier = str(uuid.uuid4())
        headers = {"Content-Type": "application/json; charset=UTF-8", "User-Agent": "Atlassian Webhook HTTP Client",
                   "X-Atlassian-Webhook-Identifier": identifier, "X-Atlassian-Webhook-Retry": "0",
                   "X-Atlassian-Webhook-Flow": "Primary"}
        if self.webhook_secret:
            headers["X-Hub-Signature"] = sign(self.webhook_secret, body)
        return self._record(Delivery(event=event, identifier=identifier, headers=headers, body=body, url=self.webhook_url))

    def _issue_event(self, event: str, issue: dict, actor: dict, changelog: list | None = None) -> None:
        payload = {"timestamp": int(time.time() * 1000), "webhookEvent": event,
                   "issue_event_type_name": {"jira:issue_created": "issue_created", "jira:issue_deleted": "issue_deleted"}
                   .get(event, "issue_generic"),
                   "user": self._render_user(actor["accountId"]), "issue": self.render_issue(issue, v2=True)}
        if changelog:
            payload["changelog"] = {"id": str(uuid.uuid4().int % 10**6), "items": changelog}
        self._emit(event, payload)

    def _comment_event(self, event: str, c: dict) -> None:
        issue = self._issues[c["issueId"]]
        fields = self._render_fields(issue, v2=True)
        payload = {"timestamp": int(time.time() * 1000), "webhookEvent": event,
                   "comment": self.render_comment(c, v2=True),
                   "issue": {"id": issue["id"], "self": f"{self.base_url}/rest/api/2/issue/{issue['id']}", "key": issue["key"],
                             "fields": {k: fields[k] for k in ("summary", "issuetype", "project", "assignee", "priority",
                                                                "status")}}}
        self._emit(event, payload)

    def redeliver(self, delivery: Delivery) -> Delivery:
        """Jira's retry: the same body and ``X-Atlassian-Webhook-Identifier``, ``X-Atlassian-Webhook-Retry`` + 1."""
        with self._lock:
            retry = delivery.retry + 1
            headers = dict(delivery.headers, **{"X-Atlassian-Webhook-Retry": str(retry)})
            again = self._record(Delivery(event=delivery.event, identifier=delivery.identifier, headers=headers,
                                          body=delivery.body, url=self.webhook_url, retry=retry))
        self._after_mutation()
        return again

    def deliver_fixture(self, name: str, overrides: dict | None = None) -> Delivery:
        """Send a real fixture (``zulip_issue_created``, ``zulip_comment_created``, ``zulip_comment_updated`` or a
        path) unchanged except for ``overrides`` (deep-merged), signed like every delivery."""
        payload = self._load_fixture(name, overrides)
        with self._lock:
            delivery = self._emit(str(payload.get("webhookEvent")), payload)
        self._after_mutation()
        return delivery

    # --- failure injection / request log -------------------------------------------------------
    def fail_next(self, count: int = 1, mode: str = "rate_limit", *, retry_after: int | None = 30,
                  status: int | None = None) -> None:
        """Fail the next ``count`` API calls: ``rate_limit`` (429 + ``Retry-After``), ``auth`` (401), ``error``."""
        self._queue_failure(count, mode, retry_after=retry_after, status=status)

    # --- mutations -------------------------------------------------------------------------------
    def _create(self, project: str | None, summary: str, description, labels, priority, assignee, actor: dict,
                status: str | None = None, duedate: str | None = None, issuetype: str | None = None,
                custom: dict | None = None) -> dict:
        proj = self._projects[project] if project else next(iter(self._projects.values()))
        now = self._stamp()
        number = proj["next"]
        proj["next"] += 1
        status = status or self.workflow[0][0]
        if status not in self._statuses:
            raise _JiraError(400, f"Unknown status {status!r}")
        issue = {"id": self._next("issue"), "key": f"{proj['key']}-{number}", "project": proj["key"], "summary": summary,
                 "description": _doc(description) if description is not None else None, "labels": list(labels or ()),
                 "priority": priority or "Medium", "assignee": self._user(assignee)["accountId"] if assignee else None,
                 "reporter": actor["accountId"], "status": status, "created": now, "updated": now, "duedate": duedate,
                 "issuetype": issuetype or "Task", "deleted": False, "blocks": [], "custom": dict(custom or {})}
        self._issues[issue["id"]] = issue
        self._issue_event("jira:issue_created", issue, actor)
        return issue

    def _update(self, issue: dict, actor: dict, **changes) -> dict:
        items = []
        for key, value in changes.items():
            if key == "summary" or key == "title":
                items.append({"field": "summary", "fromString": issue["summary"], "toString": value})
                issue["summary"] = value
            elif key == "description":
                issue["description"] = _doc(value) if value is not None else None
                items.append({"field": "description"})
            elif key == "labels":
                items.append({"field": "labels", "fromString": " ".join(issue["labels"]), "toString": " ".join(value)})
                issue["labels"] = list(value)
            elif key == "priority":
                if value is not None and self._render_priority(value) is None:
                    raise _JiraError(400, [], {"priority": f"Priority name '{value}' is not valid"})
                issue["priority"] = value
            elif key == "assignee":
                issue["assignee"] = self._user(value)["accountId"] if value else None
            elif key == "duedate":
                issue["duedate"] = value
            elif key == "status":
                if value not in self._statuses:
                    raise _JiraError(400, f"Unknown status {value!r}")
                items.append({"field": "status", "fromString": issue["status"], "toString": value})
                issue["status"] = value
            elif key == "blocks":
                issue["blocks"] = list(value)
            elif key.startswith("customfield_"):  # raw value, e.g. {"value": "CodexCoder"} for a select list
                items.append({"field": key, "fieldtype": "custom"})
                issue.setdefault("custom", {})[key] = value
            else:
                raise _JiraError(400, [], {key: "Field cannot be set. It is not on the appropriate screen, or unknown."})
        issue["updated"] = self._stamp()
        self._issue_event("jira:issue_updated", issue, actor, items)
        return issue

    @mutation
    def create_issue(self, summary: str = "Untitled", *, project: str | None = None, description=None, labels=(),
                     priority: str | None = "Medium", assignee: str | None = None, status: str | None = None,
                     duedate: str | None = None, actor: str | None = None, custom: dict | None = None) -> dict:
        """``description``: Markdown (converted to ADF) or an ADF dict; ``custom``: custom field values by
        id (``{"customfield_10010": {"value": "CodexCoder"}}``)."""
        return self.render_issue(self._create(project, summary, description, labels, priority, assignee,
                                              self._user(actor), status, duedate, custom=custom))

    @mutation
    def update_issue(self, id_or_key: str, *, actor: str | None = None, **changes) -> dict:
        """``summary``, ``description`` (Markdown/ADF), ``labels``, ``priority`` (name), ``assignee``,
        ``duedate``, ``status`` (name, no transition check), ``blocks`` (ids this issue blocks), and custom
        fields by id (``customfield_10010={"value": "CodexCoder"}``, raw Jira values)."""
        return self.render_issue(self._update(self._find(id_or_key), self._user(actor), **changes))

    def transition(self, id_or_key: str, status: str, *, actor: str | None = None) -> dict:
        return self.update_issue(id_or_key, status=status, actor=actor)

    @mutation
    def delete_issue(self, id_or_key: str, *, actor: str | None = None) -> None:
        issue = self._find(id_or_key)
        issue["deleted"] = True
        self._issue_event("jira:issue_deleted", issue, self._user(actor))

    def _add_comment(self, issue: dict, body, author: dict, properties=None) -> dict:
        now = self._stamp()
        c = {"id": self._next("comment"), "issueId": issue["id"], "body": _doc(body), "author": author["accountId"],
             "created": now, "updated": now, "deleted": False, "properties": list(properties or [])}
        self._comments[c["id"]] = c
        self._comment_event("comment_created", c)
        return c

    @mutation
    def add_comment(self, id_or_key: str, body, *, actor: str | None = None) -> dict:
        return self.render_comment(self._add_comment(self._find(id_or_key), body, self._user(actor)), properties=True)

    @mutation
    def edit_comment(self, comment_id: str, body, *, actor: str | None = None) -> dict:
        c = self._comments[comment_id]
        c["body"], c["updated"], c["updateAuthor"] = _doc(body), self._stamp(), self._user(actor)["accountId"]
        self._comment_event("comment_updated", c)
        return self.render_comment(c, properties=True)

    @mutation
    def delete_comment(self, comment_id: str, *, actor: str | None = None) -> None:
        c = self._comments[comment_id]
        c["deleted"] = True
        self._comment_event("comment_deleted", c)

    # --- HTTP ----------------------------------------------------------------------------------------
    def _authorized(self, headers: dict) -> dict | None:
        if self.token is None:
            return self.service_user
        scheme, _, value = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "basic":
            try:
                email, _, token = base64.b64decode(value.strip()).decode("utf-8").partition(":")
            except (ValueError, UnicodeDecodeError):
                return None
            if hmac.compare_digest(email, self.email) and hmac.compare_digest(token, self.token):
                return self.service_user
        elif scheme.lower() == "bearer" and value and hmac.compare_digest(value.strip(), self.token):
            return self.service_user
        return None

    def handle(self, method: str, raw_path: str, headers: dict, raw_body: bytes):
        _parts, path, query, body, body_ok = self._parse_request(raw_path, raw_body)
        if not body_ok:
            return self._finish(RequestRecord(method, path, query, headers), 400,
                                {"errorMessages": ["Unexpected character in request body."], "errors": {}})
        if path.startswith("/rest/api/3"):
            path = path[len("/rest/api/3"):] or "/"
        record = RequestRecord(method, path, query, headers, body)
        self._log_request(record)
        user = self._authorized(headers)
        if path.startswith("/_sandbox/"):
            if user is None:
                return self._finish(record, 401, {"errorMessages": ["Unauthorized"]})
            return self._control(record, method, path, body)
        failure = self._take_failure()
        if failure:
            if failure["mode"] == "rate_limit":
                extra = {"Retry-After": str(failure["retry_after"])} if failure["retry_after"] is not None else {}
                return self._finish(record, failure["status"] or 429,
                                    {"errorMessages": ["Rate limit exceeded."]}, {**extra, "X-RateLimit-Reason": "jira-quota-tenant-based"})
            if failure["mode"] == "auth":
                return self._finish(record, failure["status"] or 401,
                                    {"errorMessages": ["Client must be authenticated to access this resource."]})
            return self._finish(record, failure["status"] or 500, {"errorMessages": ["Internal server error"]})
        if user is None:
            return self._finish(record, 401, {"errorMessages": ["Client must be authenticated to access this resource."]})
        try:
            with self._lock:
                status, payload = self._route(method, path, query, body, user)
        except _JiraError as exc:
            status, payload = exc.status, {"errorMessages": exc.messages, "errors": exc.errors}
        self._after_mutation()
        return self._finish(record, status, payload)

    control_errors = SandboxServer.control_errors + (_JiraError,)

    def _error_body(self, message: str):
        return {"errorMessages": [message]}

    @staticmethod
    def _finish(record, status, payload, headers=None):
        record.status = status
        body = b"" if payload is None else json.dumps(payload).encode("utf-8")
        out = {"X-AREQUESTID": uuid.uuid4().hex[:12]}
        if payload is not None:
            out["Content-Type"] = "application/json;charset=UTF-8"
        out.update(headers or {})
        return status, out, body

    _ROUTES = [
        ("GET", r"/myself", "r_myself"),
        ("POST", r"/search/jql", "r_search"),
        ("POST", r"/issue", "r_create_issue"),
        ("GET", r"/issue/(?P<key>[^/]+)", "r_get_issue"),
        ("PUT", r"/issue/(?P<key>[^/]+)", "r_put_issue"),
        ("GET", r"/issue/(?P<key>[^/]+)/transitions", "r_get_transitions"),
        ("POST", r"/issue/(?P<key>[^/]+)/transitions", "r_post_transition"),
        ("GET", r"/issue/(?P<key>[^/]+)/comment", "r_list_comments"),
        ("POST", r"/issue/(?P<key>[^/]+)/comment", "r_add_comment"),
        ("PUT", r"/issue/(?P<key>[^/]+)/comment/(?P<cid>\d+)", "r_edit_comment"),
        ("DELETE", r"/issue/(?P<key>[^/]+)/comment/(?P<cid>\d+)", "r_delete_comment"),
        ("GET", r"/issue/(?P<key>[^/]+)/remotelink", "r_list_links"),
        ("POST", r"/issue/(?P<key>[^/]+)/remotelink", "r_add_link"),
        ("GET", r"/project/(?P<key>[^/]+)/statuses", "r_project_statuses"),
    ]

    def _route(self, method, path, query, body, user):
        for verb, pattern, name in self._ROUTES:
            m = re.fullmatch(pattern, path)
            if m and verb == method:
                return getattr(self, name)(query=query, body=body, user=user, **m.groupdict())
        raise _JiraError(404, f"No route for {method} {path}")

    # --- JQL subset ------------------------------------------------------------------------------
    def _jql(self, jql: str):
        text = jql.strip()
        order = re.search(r"\s+ORDER\s+BY\s+(.+)$", text, re.I)
        if order:
            text = text[:order.start()]
        preds = []
        for clause in re.split(r"\s+AND\s+", text, flags=re.I) if text else []:
            clause = clause.strip()
            m = re.fullmatch(r'project\s*=\s*"?([A-Za-z0-9_]+)"?', clause, re.I)
            if m:
                key = m.group(1)
                if key not in self._projects:
                    raise _JiraError(400, f"The value '{key}' does not exist for the field 'project'.")
                preds.append(lambda i, k=key: i["project"] == k)
                continue
            m = re.fullmatch(r'updated\s*(>=|>|<=|<)\s*"(\d{4}[/-]\d{2}[/-]\d{2}(?: \d{2}:\d{2})?)"', clause, re.I)
            if m:
                op, raw = m.group(1), m.group(2).replace("-", "/")
                fmt = "%Y/%m/%d %H:%M" if " " in raw else "%Y/%m/%d"
                tz = timezone.utc
                with contextlib.suppress(Exception):
                    from zoneinfo import ZoneInfo
                    tz = ZoneInfo(self.time_zone)
                bound = datetime.strptime(raw, fmt).replace(tzinfo=tz).astimezone(timezone.utc)
                cmp = {">=": lambda a, b: a >= b, ">": lambda a, b: a > b, "<=": lambda a, b: a <= b,
                       "<": lambda a, b: a < b}[op]
                preds.append(lambda i, b=bound, c=cmp: c(i["updated"], b))
                continue
            m = re.fullmatch(r"(id|key|issue)\s+in\s*\(([^)]*)\)", clause, re.I)
            if m:
                values = [v.strip().strip('"') for v in m.group(2).split(",") if v.strip()]
                missing = [v for v in values if not any((i["id"] == v or i["key"] == v) and not i["deleted"]
                                                        for i in self._issues.values())]
                if missing:
                    raise _JiraError(400, [f"An issue with key '{v}' does not exist for field '{m.group(1).lower()}'."
                                           for v in missing])
                wanted = set(values)
                preds.append(lambda i, w=wanted: i["id"] in w or i["key"] in w)
                continue
            raise _JiraError(400, f"Error in the JQL Query: unsupported clause {clause!r} (sandbox subset).")
        rows = [i for i in self._issues.values() if not i["deleted"] and all(p(i) for p in preds)]
        if order:
            keys = [k.strip().split() for k in order.group(1).split(",")]
            for parts in reversed(keys):
                fieldname, direction = parts[0].lower(), (parts[1].upper() if len(parts) > 1 else "ASC")
                keyfn = {"updated": lambda i: i["updated"], "created": lambda i: i["created"],
                         "id": lambda i: int(i["id"]), "key": lambda i: (i["project"], int(i["key"].split("-")[1]))}[fieldname]
                rows.sort(key=keyfn, reverse=direction == "DESC")
        else:
            rows.sort(key=lambda i: int(i["id"]))
        return rows

    # --- routes ----------------------------------------------------------------------------------
    def r_myself(self, user, **_):
        return 200, {"self": f"{self.base_url}/rest/api/3/user?accountId={user['accountId']}", **user}

    def r_search(self, body, **_):
        body = body if isinstance(body, dict) else {}
        jql = body.get("jql")
        if not isinstance(jql, str) or not jql.strip():
            raise _JiraError(400, "Invalid request payload. Refer to the REST API documentation and try again.")
        max_results = int(body.get("maxResults") or 50)
        max_results = max(1, min(100, max_results))
        offset = 0
        token = body.get("nextPageToken")
        digest = hashlib.sha1(jql.encode()).hexdigest()[:12]
        if token:
            try:
                data = json.loads(base64.urlsafe_b64decode(str(token).encode()))
                if data["q"] != digest:
                    raise ValueError
                offset = int(data["o"])
            except (ValueError, KeyError, TypeError):
                raise _JiraError(400, "Invalid nextPageToken.") from None
        rows = self._jql(jql)
        page = rows[offset:offset + max_results]
        fields = body.get("fields") or ["*navigable"]
        rendered = []
        for issue in page:
            full = self.render_issue(issue)
            if "*all" not in fields and "*navigable" not in fields:
                full["fields"] = {k: v for k, v in full["fields"].items() if k in fields}
            rendered.append(full)
        out: dict = {"issues": rendered, "isLast": offset + max_results >= len(rows)}
        if not out["isLast"]:
            out["nextPageToken"] = base64.urlsafe_b64encode(json.dumps({"q": digest, "o": offset + max_results}).encode()).decode()
        return 200, out

    def r_get_issue(self, key, query, **_):
        issue = self.render_issue(self._find(key))
        wanted = [f for v in query.get("fields", []) for f in v.split(",") if f]
        if wanted and "*all" not in wanted and "*navigable" not in wanted:
            issue["fields"] = {k: v for k, v in issue["fields"].items() if k in wanted}
        return 200, issue

    def _fields_changes(self, fields: dict) -> dict:
        changes = {}
        for key, value in fields.items():
            if key == "summary":
                changes["summary"] = value
            elif key == "description":
                if value is not None and not (isinstance(value, dict) and value.get("type") == "doc"):
                    raise _JiraError(400, [], {"description": "Operation value must be an Atlassian Document (see the "
                                                              "Atlassian Document Format)"})
                changes["description"] = value
            elif key == "labels":
                if any(" " in str(v) for v in value or ()):
                    raise _JiraError(400, [], {"labels": "The label 'x y' contains spaces which is invalid."})
                changes["labels"] = list(value or [])
            elif key == "priority":
                changes["priority"] = (value or {}).get("name") if value else None
            elif key == "duedate":
                changes["duedate"] = value
            elif key == "assignee":
                changes["assignee"] = (value or {}).get("accountId") if value else None
            elif key.startswith("customfield_"):
                changes[key] = value
            elif key in ("project", "issuetype"):
                continue
            else:
                raise _JiraError(400, [], {key: "Field cannot be set. It is not on the appropriate screen, or unknown."})
        return changes

    def r_put_issue(self, key, body, user, **_):
        issue = self._find(key)
        fields = (body or {}).get("fields") or {}
        self._update(issue, user, **self._fields_changes(fields))
        return 204, None

    def r_create_issue(self, body, user, **_):
        fields = (body or {}).get("fields") or {}
        project = (fields.get("project") or {}).get("key")
        if project not in self._projects:
            raise _JiraError(400, [], {"project": "valid project is required"})
        if not fields.get("summary"):
            raise _JiraError(400, [], {"summary": "You must specify a summary of the issue."})
        changes = self._fields_changes({k: v for k, v in fields.items() if k not in ("summary",)})
        issue = self._create(project, fields["summary"], changes.get("description"), changes.get("labels"),
                             changes.get("priority"), None, user, duedate=changes.get("duedate"),
                             issuetype=(fields.get("issuetype") or {}).get("name"),
                             custom={k: v for k, v in changes.items() if k.startswith("customfield_")})
        return 201, {"id": issue["id"], "key": issue["key"], "self": f"{self.base_url}/rest/api/3/issue/{issue['id']}"}

    def _transitions(self, issue: dict) -> list[dict]:
        out = []
        for i, (name, _cat, tname) in enumerate(self.workflow):
            if name == issue["status"]:
                continue
            out.append({"id": str(11 + 10 * i), "name": tname, "hasScreen": False, "isGlobal": True,
                        "isInitial": False, "isAvailable": True, "isConditional": False,
                        "to": self._render_status(name)})
        return out

    def r_get_transitions(self, key, **_):
        return 200, {"expand": "transitions", "transitions": self._transitions(self._find(key))}

    def r_post_transition(self, key, body, user, **_):
        issue = self._find(key)
        tid = str(((body or {}).get("transition") or {}).get("id") or "")
        chosen = next((t for t in self._transitions(issue) if t["id"] == tid), None)
        if chosen is None:
            raise _JiraError(400, "Transition id '%s' is not valid for this issue." % tid)
        self._update(issue, user, status=chosen["to"]["name"])
        return 204, None

    def r_list_comments(self, key, query, **_):
        issue = self._find(key)
        start = int((query.get("startAt") or ["0"])[0] or 0)
        max_results = max(1, min(100, int((query.get("maxResults") or ["50"])[0] or 50)))
        props = "properties" in ",".join(query.get("expand", []))
        rows = sorted((c for c in self._comments.values() if c["issueId"] == issue["id"] and not c["deleted"]),
                      key=lambda c: (c["created"], int(c["id"])))
        page = rows[start:start + max_results]
        return 200, {"startAt": start, "maxResults": max_results, "total": len(rows),
                     "comments": [self.render_comment(c, properties=props) for c in page]}

    def r_add_comment(self, key, body, user, **_):
        issue = self._find(key)
        doc = (body or {}).get("body")
        if not (isinstance(doc, dict) and doc.get("type") == "doc"):
            raise _JiraError(400, [], {"comment": "Comment body must be an Atlassian Document."})
        props = (body or {}).get("properties") or []
        c = self._add_comment(issue, doc, user, props)
        return 201, self.render_comment(c, properties=True)

    def r_edit_comment(self, key, cid, body, user, **_):
        c = self._comments.get(cid)
        if c is None or c["deleted"]:
            raise _JiraError(404, "Comment not found")
        c["body"], c["updated"], c["updateAuthor"] = _doc((body or {}).get("body")), self._stamp(), user["accountId"]
        self._comment_event("comment_updated", c)
        return 200, self.render_comment(c)

    def r_delete_comment(self, key, cid, **_):
        c = self._comments.get(cid)
        if c is None or c["deleted"]:
            raise _JiraError(404, "Comment not found")
        c["deleted"] = True
        self._comment_event("comment_deleted", c)
        return 204, None

    def r_list_links(self, key, **_):
        issue = self._find(key)
        return 200, [copy.deepcopy(link) for link in self._links.values() if link["issueId"] == issue["id"]]

    def r_add_link(self, key, body, **_):
        issue = self._find(key)
        obj = (body or {}).get("object") or {}
        if not obj.get("url") or not obj.get("title"):
            raise _JiraError(400, [], {"object": "url and title are required"})
        gid = (body or {}).get("globalId")
        existing = next((link for link in self._links.values() if gid and link["issueId"] == issue["id"]
                         and link.get("globalId") == gid), None)
        if existing:
            existing.update({k: v for k, v in (body or {}).items()})
            return 200, {"id": existing["id"], "self": f"{self.base_url}/rest/api/3/issue/{key}/remotelink/{existing['id']}"}
        link = {"id": self._next("link"), "issueId": issue["id"], **(body or {})}
        self._links[link["id"]] = link
        return 201, {"id": link["id"], "self": f"{self.base_url}/rest/api/3/issue/{key}/remotelink/{link['id']}"}

    def r_project_statuses(self, key, **_):
        if key not in self._projects:
            raise _JiraError(404, f"No project could be found with key '{key}'.")
        statuses = [self._render_status(name) for name, _c, _t in self.workflow]
        return 200, [{"self": f"{self.base_url}/rest/api/3/issuetype/10001", "id": "10001", "name": "Task",
                      "subtask": False, "statuses": statuses}]


def main(argv=None) -> int:
    def project_and_email(parser):
        parser.add_argument("--project", action="append", dest="projects", help="project key (repeatable; default ABC)")
        parser.add_argument("--email", default=os.environ.get("JIRA_SANDBOX_EMAIL", "bot@example.com"))

    parser = cli_parser("jira", "Run the Jira Cloud-compatible REST sandbox (offline demo).", 8767,
                        "API token accepted with --email (env JIRA_SANDBOX_TOKEN); omit to disable auth",
                        "create N demo issues at start (no webhooks)", after_port=project_and_email)
    args = parser.parse_args(argv)
    projects = tuple(args.projects or ["ABC"])
    sandbox = JiraSandbox(host=args.host, port=args.port, projects=projects, email=args.email, token=args.token,
                          webhook_url=args.webhook_url, webhook_secret=args.webhook_secret,
                          delivery_mode="queued" if args.queued else "sync", real_clock=True)
    with sandbox.quiet():
        for n in range(args.seed):
            sandbox.create_issue(f"Demo issue {n + 1}", project=projects[0],
                                 description=f"Seeded by the sandbox ({n + 1}/{args.seed}).", labels=["demo"])
    return serve_until_interrupted(sandbox, lambda sb: (
        f"Jira sandbox on {sb.base_url}; projects: {', '.join(projects)}; auth {'on' if args.token else 'off'}; "
        f"webhook {'-> ' + args.webhook_url if args.webhook_url else 'none'}"))


if __name__ == "__main__":
    sys.exit(main())
