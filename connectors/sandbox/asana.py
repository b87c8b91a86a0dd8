"""A small Asana-compatible REST server for tests and the offline demo (stdlib only, no Django).

It serves what :mod:`connectors.providers.asana` calls, under ``/api/1.0`` (``sandbox.api_url`` is the
adapter's ``base_url``), with Asana's shapes: ``Authorization: Bearer <token>``; request and answer bodies
wrapped in ``{"data": ...}``; ``opt_fields`` (top-level fields only; without it records are compact
``{gid, resource_type, name}``); ``limit`` (1-100) / ``offset`` pagination with ``next_page: {offset, path,
uri}`` (null on the last page; an offset of another query is a 400 about the offset); errors as
``{"errors": [{"message", "help", "phrase"}]}``; 429 with ``Retry-After``.

Endpoints: ``GET /users/me``; ``GET /tasks?project=&modified_since=`` (project order, i.e. creation order,
*not* by modification time), ``GET|PUT|DELETE /tasks/{gid}``, ``POST /tasks``; ``GET|POST
/tasks/{gid}/stories``, ``PUT|DELETE /stories/{gid}``; ``GET /projects/{gid}/sections``, ``POST
/sections/{gid}/addTask``; ``POST /webhooks``, ``GET|DELETE /webhooks/{gid}``.

Webhooks as Asana does them (the event shape of developers.asana.com "Webhooks" / the EventResponse schema):

- ``POST /webhooks {"data": {"resource": <project gid>, "target", "filters"}}`` POSTs the handshake to the
  target *during* the request (an empty body with ``X-Hook-Secret``) and fails with 400 unless the answer is
  200/204 echoing that header; the webhook then signs its deliveries with that secret.
- Every change produces compact events ``{user: {gid, resource_type}, created_at, action, resource: {gid,
  resource_type, resource_subtype}, parent: {gid, resource_type} | null, change?: {field, action,
  new_value?}}``; the events of one mutation (or of a :meth:`batch` block) go out as ONE POST ``{"events":
  [...]}`` per webhook whose project holds the task, signed ``X-Hook-Signature`` = hex HMAC-SHA256(secret,
  body). :meth:`heartbeat` sends ``{"events": []}``. No delivery id header (Asana sends none).
- ``webhook_url``/``webhook_secret`` given to the constructor act as one pre-existing webhook on every
  project (deliveries recorded; sent when the URL is set), for tests that post deliveries themselves.

Use from Python::

    sb = AsanaSandbox(projects=("Launch",), token="t", webhook_secret="s").start()
    project = sb.project_gid("Launch")                  # the container gid
    task = sb.create_task("Fix login", project=project)  # -> delivery with "added" events
    sb.move_task(task["gid"], "In Progress"); sb.add_comment(task["gid"], "On it"); sb.complete_task(task["gid"])
    with sb.batch(): ...                                 # several mutations, one POST
    sb.fail_next(1, "rate_limit", retry_after=7)         # or "auth" (401), "error" (status=500)
    sb.deliveries[-1].payload; sb.requests_to(r"^/tasks$"); sb.stop()

Standalone: ``python -m connectors.sandbox.asana --port 8768 --project Launch --token "$ASANA_SANDBOX_TOKEN"``;
control endpoints ``POST /_sandbox/<control method>`` (JSON keyword arguments), ``GET /_sandbox/deliveries``.
"""
from __future__ import annotations

import base64
import contextlib
import hmac
import json
import secrets
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

from connectors.sandbox.base import (
    DeliveryRecord,
    RequestRecord,
    SandboxServer,
    cli_parser,
    hmac_sha256_hex,
    mutation,
    serve_until_interrupted,
)
from connectors.sandbox.base import iso_ms as _iso
from connectors.sandbox.base import parse_ts as _parse_ts

API_PREFIX = "/api/1.0"
DEFAULT_SECTIONS = ("To do", "In Progress", "Review", "Done")
DEFAULT_FIXTURES_DIR = str(Path(__file__).resolve().parent / "fixtures" / "asana")
CONTROL_METHODS = ("add_project", "add_section", "add_user", "create_task", "update_task", "move_task", "complete_task",
                   "add_to_project", "remove_from_project", "delete_task", "add_comment", "edit_comment",
                   "delete_comment", "heartbeat", "deactivate_webhook", "fail_next", "flush", "advance", "outage",
                   "recover")
TASK_FIELDS = ("gid", "resource_type", "resource_subtype", "name", "notes", "html_notes", "completed", "completed_at",
               "created_at", "modified_at", "due_on", "due_at", "assignee", "tags", "memberships", "permalink_url",
               "custom_fields", "parent", "workspace", "created_by", "projects")


def sign(secret: str, body: bytes) -> str:
    """Asana's ``X-Hook-Signature``: hex HMAC-SHA256(webhook secret, raw body)."""
    return hmac_sha256_hex(secret, body)


@dataclass
class Delivery(DeliveryRecord):
    """One POST of events to one webhook; ``body`` the exact signed bytes."""

    events: list
    webhook_gid: str | None
    scope: str | None  # the project the webhook is registered on (None: the constructor's webhook)
    headers: dict
    body: bytes

    def summary(self) -> dict:
        return {"events": len(self.events), "webhook": self.webhook_gid, "scope": self.scope, "url": self.url,
                "status": self.status, "error": self.error, "delivered": self.delivered}


class _ApiError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class AsanaSandbox(SandboxServer):
    """In-memory Asana workspace. ``projects``: project names to create (each with ``sections``);
    ``token``: the personal access token accepted (``None`` disables auth); ``service_user``: the token's
    user (API writes are attributed to it); ``default_actor``: who control-method changes are made by."""

    provider = "asana"
    server_version = "AsanaSandbox/1.0"
    control_methods = CONTROL_METHODS
    failure_modes = ("rate_limit", "auth", "error")

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, projects=("Launch",), sections=DEFAULT_SECTIONS,
                 token: str | None = "asana-sandbox-token", service_user: str = "Paperclip Bot",
                 default_actor: str = "Ada Lovelace", webhook_url: str | None = None, webhook_secret: str | None = None,
                 delivery_mode: str = "sync", real_clock: bool = False, tick: float = 1.0,
                 fixtures_dir: str | None = None, delivery_timeout: float = 10.0):
        self._init_sandbox(host=host, port=port, token=token, delivery_mode=delivery_mode, real_clock=real_clock,
                           tick=tick, fixtures_dir=fixtures_dir, default_fixtures_dir=DEFAULT_FIXTURES_DIR,
                           delivery_timeout=delivery_timeout)
        self.webhook_url, self.webhook_secret = webhook_url, webhook_secret
        self._next_gid = 1204000000000000
        self.workspace_gid = self._gid()
        self._users: dict[str, dict] = {}
        self._projects: dict[str, dict] = {}
        self._tasks: dict[str, dict] = {}
        self._stories: dict[str, dict] = {}
        self._webhooks: dict[str, dict] = {}
        self._events: list[dict] = []
        self._batching = 0
        self.service_user = self.add_user(service_user)
        self.default_actor = self.add_user(default_actor)
        self._sections_default = tuple(sections)
        for name in projects:
            self.add_project(name)

    @property
    def api_url(self) -> str:
        return self.base_url + API_PREFIX

    _format_ts = staticmethod(_iso)

    def _gid(self) -> str:
        self._next_gid += 1
        return str(self._next_gid)

    # --- directory -------------------------------------------------------------------------------------
    def add_user(self, name: str) -> dict:
        with self._lock:
            for user in self._users.values():
                if user["name"] == name:
                    return user
            user = {"gid": self._gid(), "name": name, "resource_type": "user",
                    "email": f"{name.split(' ')[0].lower()}@example.com"}
            self._users[user["gid"]] = user
            return user

    def add_project(self, name: str, *, sections=None) -> dict:
        with self._lock:
            existing = next((p for p in self._projects.values() if p["name"] == name), None)
            if existing:
                return existing
            project = {"gid": self._gid(), "name": name, "sections": []}
            self._projects[project["gid"]] = project
            for section in self._sections_default if sections is None else sections:
                self.add_section(project["gid"], section)
            return project

    def add_section(self, project: str, name: str) -> dict:
        with self._lock:
            p = self._project(project)
            section = {"gid": self._gid(), "name": name, "project": p["gid"]}
            p["sections"].append(section)
            return section

    def project_gid(self, name_or_gid: str | None = None) -> str:
        with self._lock:
            return self._project(name_or_gid)["gid"]

    def _project(self, ref: str | None) -> dict:
        if ref is None:
            return next(iter(self._projects.values()))
        for project in self._projects.values():
            if project["gid"] == ref or project["name"] == ref:
                return project
        raise KeyError(f"no project {ref!r}")

    def _section(self, project: dict, ref: str | None) -> dict:
        if ref is None:
            return project["sections"][0]
        for section in project["sections"]:
            if section["gid"] == ref or section["name"].lower() == str(ref).lower():
                return section
        raise KeyError(f"project {project['name']} has no section {ref!r}")

    def _user(self, ref: str | None) -> dict:
        if ref is None:
            return self.default_actor
        return self._users.get(ref) or self.add_user(ref)

    # --- rendering ---------------------------------------------------------------------------------------
    @staticmethod
    def _compact(record: dict, resource_type: str) -> dict:
        return {"gid": record["gid"], "resource_type": resource_type, "name": record.get("name")}

    def render_task(self, task: dict) -> dict:
        memberships = []
        for m in task["memberships"]:
            project = self._projects[m["project"]]
            section = next(s for s in project["sections"] if s["gid"] == m["section"])
            memberships.append({"project": self._compact(project, "project"),
                                "section": self._compact(section, "section")})
        assignee = self._users.get(task.get("assignee") or "")
        return {
            "gid": task["gid"], "resource_type": "task", "resource_subtype": "default_task", "name": task["name"],
            "notes": task["notes"], "html_notes": f"<body>{task['notes']}</body>", "completed": task["completed"],
            "completed_at": _iso(task.get("completed_at")), "created_at": _iso(task["created_at"]),
            "modified_at": _iso(task["modified_at"]), "due_on": task.get("due_on"), "due_at": task.get("due_at"),
            "assignee": self._compact(assignee, "user") if assignee else None,
            "tags": [{"gid": t["gid"], "name": t["name"], "resource_type": "tag"} for t in task["tags"]],
            "memberships": memberships, "projects": [m["project"] for m in memberships],
            "permalink_url": f"https://app.asana.com/0/{task['memberships'][0]['project'] if task['memberships'] else 0}"
                             f"/{task['gid']}",
            "custom_fields": [dict(f) for f in task.get("custom_fields") or ()], "parent": None,
            "workspace": {"gid": self.workspace_gid, "resource_type": "workspace"},
            "created_by": {"gid": task["created_by"], "resource_type": "user"},
        }

    def render_story(self, story: dict) -> dict:
        user = self._users[story["created_by"]]
        return {"gid": story["gid"], "resource_type": "story", "resource_subtype": story["subtype"],
                "type": "comment" if story["subtype"] == "comment_added" else "system", "text": story["text"],
                "html_text": f"<body>{story['text']}</body>", "created_at": _iso(story["created_at"]),
                "created_by": self._compact(user, "user"), "is_edited": story.get("is_edited", False),
                "target": {"gid": story["task"], "resource_type": "task"}}

    def task(self, gid: str) -> dict:
        with self._lock:
            return self.render_task(self._tasks[gid])

    def comments_of(self, gid: str) -> list[dict]:
        with self._lock:
            return [self.render_story(s) for s in self._stories.values() if s["task"] == gid and not s["deleted"]
                    and s["subtype"] == "comment_added"]

    def section_of(self, gid: str, project: str | None = None) -> str:
        """The name of the task's section in ``project`` (default: its first project)."""
        with self._lock:
            task = self._tasks[gid]
            m = next(m for m in task["memberships"] if project is None or m["project"] == self.project_gid(project))
            return self._section(self._projects[m["project"]], m["section"])["name"]

    def webhooks(self) -> list[dict]:
        with self._lock:
            return [{k: v for k, v in w.items() if k != "secret"} for w in self._webhooks.values()]

    # --- events and deliveries ---------------------------------------------------------------------------
    def _event(self, action: str, resource: dict, *, parent: dict | None = None, change: dict | None = None,
               user: dict | None = None) -> None:
        if self._muted:
            return
        event = {"user": {"gid": user["gid"], "resource_type": "user"} if user else None,
                 "created_at": _iso(self._clock), "action": action, "resource": resource,
                 "parent": parent}
        if change is not None:
            event["change"] = change
        self._events.append(event)

    @staticmethod
    def _ref(gid: str, resource_type: str, subtype: str | None = None) -> dict:
        ref = {"gid": gid, "resource_type": resource_type}
        if subtype:
            ref["resource_subtype"] = subtype
        return ref

    def _projects_of_event(self, event: dict) -> set[str]:
        resource, parent = event["resource"], event.get("parent") or {}
        task_gid = resource["gid"] if resource["resource_type"] == "task" else (
            self._stories.get(resource["gid"], {}).get("task"))
        projects = {m["project"] for m in self._tasks.get(task_gid or "", {}).get("memberships", ())}
        if parent.get("resource_type") == "project":
            projects.add(parent["gid"])
        projects |= set(self._tasks.get(task_gid or "", {}).get("former_projects", ()))
        return projects

    @staticmethod
    def _matches(webhook: dict, event: dict) -> bool:
        filters = webhook.get("filters") or []
        if not filters:
            return True
        res = event["resource"]
        return any(f.get("resource_type") == res["resource_type"] and (
            not f.get("resource_subtype") or f.get("resource_subtype") == res.get("resource_subtype"))
            and (not f.get("action") or f.get("action") == event["action"]) for f in filters)

    def _package(self) -> None:
        """Turn the events collected so far into one delivery per webhook (under the lock)."""
        if self._batching or not self._events:
            return
        events, self._events = self._events, []
        if self.webhook_url or self.webhook_secret:
            self._deliver(events, None, None, self.webhook_url, self.webhook_secret)
        for hook in self._webhooks.values():
            if not hook["active"]:
                continue
            mine = [e for e in events if hook["resource"] in self._projects_of_event(e) and self._matches(hook, e)]
            if mine:
                self._deliver(mine, hook["gid"], hook["resource"], hook["target"], hook["secret"])

    def _deliver(self, events: list, webhook_gid, scope, url, secret) -> Delivery:
        body = json.dumps({"events": events}).encode("utf-8")
        headers = {"Content-Type": "application/json; charset=UTF-8", "User-Agent": "Asana"}
        if secret:
            headers["X-Hook-Signature"] = sign(secret, body)
        return self._record(Delivery(events=events, webhook_gid=webhook_gid, scope=scope, headers=headers, body=body,
                                     url=url))

    def _after_mutation(self) -> None:
        with self._lock:
            self._package()
        super()._after_mutation()

    @contextlib.contextmanager
    def batch(self):
        """Every change inside the block goes out in ONE POST per webhook (Asana batches events)."""
        with self._lock:
            self._batching += 1
        try:
            yield self
        finally:
            with self._lock:
                self._batching -= 1
            self._after_mutation()

    @mutation
    def heartbeat(self) -> list:
        """Asana's keep-alive: ``{"events": []}`` to every active webhook (and the constructor's)."""
        out = []
        if self.webhook_url or self.webhook_secret:
            out.append(self._deliver([], None, None, self.webhook_url, self.webhook_secret))
        for hook in self._webhooks.values():
            if hook["active"]:
                out.append(self._deliver([], hook["gid"], hook["resource"], hook["target"], hook["secret"]))
        return out

    def redeliver(self, delivery: Delivery) -> Delivery:
        """Asana's retry of a POST that got no 2xx: the same bytes again."""
        again = Delivery(events=delivery.events, webhook_gid=delivery.webhook_gid, scope=delivery.scope,
                         headers=dict(delivery.headers), body=delivery.body, url=delivery.url)
        with self._lock:
            self._record(again)
        self._after_mutation()
        return again

    @mutation
    def deactivate_webhook(self, webhook_gid: str, *, failure: str = "410 Gone") -> dict:
        hook = self._webhooks[webhook_gid]
        hook.update(active=False, last_failure_at=_iso(self._stamp()), last_failure_content=failure)
        return {k: v for k, v in hook.items() if k != "secret"}

    def _handshake(self, target: str) -> tuple[bool, str, str]:
        """POST the handshake to ``target`` now -> (acknowledged?, secret, what happened)."""
        secret = secrets.token_hex(32)
        req = urllib.request.Request(target, data=b"", method="POST",
                                     headers={"X-Hook-Secret": secret, "Content-Type": "application/json",
                                              "User-Agent": "Asana"})
        try:
            with urllib.request.urlopen(req, timeout=self.delivery_timeout) as resp:
                status, echoed = resp.status, resp.headers.get("X-Hook-Secret")
        except urllib.error.HTTPError as exc:
            return False, secret, f"the target answered {exc.code}"
        except (urllib.error.URLError, OSError) as exc:
            return False, secret, f"the target could not be reached: {exc}"
        if status not in (200, 204):
            return False, secret, f"the target answered {status}"
        if not echoed or not hmac.compare_digest(echoed, secret):
            return False, secret, "the target did not echo X-Hook-Secret"
        return True, secret, "ok"

    # --- failure injection -----------------------------------------------------------------------------
    def fail_next(self, count: int = 1, mode: str = "rate_limit", *, retry_after: int | None = None,
                  status: int | None = None) -> None:
        """The next ``count`` API responses fail: ``rate_limit`` (429, ``Retry-After`` when given), ``auth``
        (401), ``error`` (``status``, default 500)."""
        self._queue_failure(count, mode, retry_after=retry_after, status=status)

    # --- mutations (control methods; the API uses the same code) -----------------------------------------
    def _touch(self, task: dict) -> None:
        task["modified_at"] = self._stamp()

    def _create_task(self, name: str, project: str | None, notes: str, section: str | None, actor: dict, *,
                     tags=(), assignee: str | None = None, due_on: str | None = None, completed: bool = False,
                     custom_fields=None, extra_projects=()) -> dict:
        p = self._project(project)
        s = self._section(p, section)
        now = self._stamp()
        task = {"gid": self._gid(), "name": name, "notes": notes or "", "completed": bool(completed),
                "completed_at": now if completed else None, "created_at": now, "modified_at": now, "due_on": due_on,
                "due_at": None, "assignee": self._user(assignee)["gid"] if assignee else None,
                "tags": [{"gid": self._gid(), "name": t} for t in tags], "memberships": [
                    {"project": p["gid"], "section": s["gid"]}], "custom_fields": list(custom_fields or ()),
                "created_by": actor["gid"], "deleted": False, "former_projects": []}
        for other in extra_projects:
            op = self._project(other)
            task["memberships"].append({"project": op["gid"], "section": op["sections"][0]["gid"]})
        self._tasks[task["gid"]] = task
        ref = self._ref(task["gid"], "task", "default_task")
        for m in task["memberships"]:
            self._event("added", ref, parent=self._ref(m["project"], "project"), user=actor)
        self._event("added", ref, parent=self._ref(s["gid"], "section"), user=actor)
        return task

    @mutation
    def create_task(self, name: str = "Untitled", *, project: str | None = None, notes: str = "",
                    section: str | None = None, tags=(), assignee: str | None = None, due_on: str | None = None,
                    completed: bool = False, custom_fields=None, also_in=(), actor: str | None = None) -> dict:
        """A person creates a task in ``project`` (name or gid; default the first) and ``section`` (default the
        first); ``also_in``: further projects it is a member of (multi-homing)."""
        return self.render_task(self._create_task(name, project, notes, section, self._user(actor), tags=tags,
                                                  assignee=assignee, due_on=due_on, completed=completed,
                                                  custom_fields=custom_fields, extra_projects=also_in))

    def _update_task(self, task: dict, actor: dict, **changes) -> dict:
        ref = self._ref(task["gid"], "task", "default_task")
        for key, value in changes.items():
            if key in ("name", "notes", "due_on", "due_at"):
                task[key] = value
            elif key == "completed":
                task["completed"] = bool(value)
                task["completed_at"] = self._clock if value else None
            elif key == "assignee":
                task["assignee"] = self._user(value)["gid"] if value else None
            elif key == "tags":
                task["tags"] = [{"gid": self._gid(), "name": t} for t in value]
            elif key == "custom_fields":
                task["custom_fields"] = list(value)
            else:
                raise _ApiError(400, f"{key}: Unknown field")
            self._touch(task)
            change = {"field": key, "action": "changed"}
            if key == "assignee" and task["assignee"]:
                change["new_value"] = {"gid": task["assignee"], "resource_type": "user"}
            self._event("changed", ref, change=change, user=actor)
        return task

    @mutation
    def update_task(self, gid: str, *, actor: str | None = None, **changes) -> dict:
        """Change ``name``, ``notes``, ``due_on``, ``completed``, ``assignee``, ``tags``, ``custom_fields``."""
        return self.render_task(self._update_task(self._tasks[gid], self._user(actor), **changes))

    def complete_task(self, gid: str, completed: bool = True, *, actor: str | None = None) -> dict:
        return self.update_task(gid, completed=completed, actor=actor)

    def _move(self, task: dict, section: dict, actor: dict) -> None:
        m = next(m for m in task["memberships"] if m["project"] == section["project"])
        if m["section"] == section["gid"]:
            return
        old, m["section"] = m["section"], section["gid"]
        self._touch(task)
        ref = self._ref(task["gid"], "task", "default_task")
        self._event("removed", ref, parent=self._ref(old, "section"), user=actor)
        self._event("added", ref, parent=self._ref(section["gid"], "section"), user=actor)

    @mutation
    def move_task(self, gid: str, section: str, *, project: str | None = None, actor: str | None = None) -> dict:
        """A person drags the task to ``section`` (name or gid) of ``project`` (default: its first)."""
        task = self._tasks[gid]
        p = self._projects[task["memberships"][0]["project"]] if project is None else self._project(project)
        self._move(task, self._section(p, section), self._user(actor))
        return self.render_task(task)

    @mutation
    def add_to_project(self, gid: str, project: str, *, actor: str | None = None) -> dict:
        task, p = self._tasks[gid], self._project(project)
        if not any(m["project"] == p["gid"] for m in task["memberships"]):
            task["memberships"].append({"project": p["gid"], "section": p["sections"][0]["gid"]})
            self._touch(task)
            self._event("added", self._ref(gid, "task", "default_task"), parent=self._ref(p["gid"], "project"),
                        user=self._user(actor))
        return self.render_task(task)

    @mutation
    def remove_from_project(self, gid: str, project: str, *, actor: str | None = None) -> dict:
        task, p = self._tasks[gid], self._project(project)
        task["memberships"] = [m for m in task["memberships"] if m["project"] != p["gid"]]
        task["former_projects"].append(p["gid"])
        self._touch(task)
        self._event("removed", self._ref(gid, "task", "default_task"), parent=self._ref(p["gid"], "project"),
                    user=self._user(actor))
        return self.render_task(task)

    def _delete_task(self, task: dict, actor: dict) -> None:
        task["deleted"] = True
        self._event("deleted", self._ref(task["gid"], "task", "default_task"), user=actor)

    @mutation
    def delete_task(self, gid: str, *, actor: str | None = None) -> None:
        self._delete_task(self._tasks[gid], self._user(actor))

    def _add_story(self, task: dict, text: str, actor: dict, subtype: str = "comment_added") -> dict:
        story = {"gid": self._gid(), "task": task["gid"], "subtype": subtype, "text": text, "created_by": actor["gid"],
                 "created_at": self._stamp(), "deleted": False}
        self._stories[story["gid"]] = story
        self._touch(task)  # Asana counts a new story as a modification of its task (modified_since)
        self._event("added", self._ref(story["gid"], "story", subtype), parent=self._ref(task["gid"], "task"),
                    user=actor)
        return story

    @mutation
    def add_comment(self, gid: str, text: str, *, actor: str | None = None) -> dict:
        return self.render_story(self._add_story(self._tasks[gid], text, self._user(actor)))

    @mutation
    def add_system_story(self, gid: str, text: str, subtype: str = "section_changed", *,
                         actor: str | None = None) -> dict:
        return self.render_story(self._add_story(self._tasks[gid], text, self._user(actor), subtype))

    @mutation
    def edit_comment(self, story_gid: str, text: str, *, actor: str | None = None) -> dict:
        story = self._stories[story_gid]
        story.update(text=text, is_edited=True)
        self._event("changed", self._ref(story_gid, "story", story["subtype"]),
                    change={"field": "text", "action": "changed"}, user=self._user(actor))
        return self.render_story(story)

    @mutation
    def delete_comment(self, story_gid: str, *, actor: str | None = None) -> None:
        story = self._stories[story_gid]
        story["deleted"] = True
        self._event("removed", self._ref(story_gid, "story", story["subtype"]),
                    parent=self._ref(story["task"], "task"), user=self._user(actor))

    # --- HTTP ------------------------------------------------------------------------------------------------
    def _authorized(self, headers: dict) -> dict | None:
        if self.token is None:
            return self.service_user
        value = headers.get("authorization", "")
        if value.lower().startswith("bearer ") and hmac.compare_digest(value[7:].strip(), self.token):
            return self.service_user
        return None

    @staticmethod
    def _error_body(message: str):
        return {"errors": [{"message": message, "help": "For more information on API status codes and how to "
                                                        "handle them, read the docs on errors: "
                                                        "https://developers.asana.com/docs/errors"}]}

    @staticmethod
    def _finish(record, status, payload, headers=None):
        record.status = status
        body = json.dumps(payload).encode("utf-8")
        return status, {"Content-Type": "application/json; charset=UTF-8", **(headers or {})}, body

    def handle(self, method: str, raw_path: str, headers: dict, raw_body: bytes):
        parts, path, query, body, ok = self._parse_request(raw_path, raw_body)
        api_path = path[len(API_PREFIX):] if path.startswith(API_PREFIX) else path
        record = RequestRecord(method, api_path, query, headers, body)
        self._log_request(record)
        user = self._authorized(headers)
        if path.startswith("/_sandbox/"):
            if user is None:
                return self._finish(record, 401, self._error_body("Not Authorized"))
            return self._control(record, method, path, body)
        if not path.startswith(API_PREFIX + "/"):
            return self._finish(record, 404, self._error_body("Unknown path"))
        failure = self._take_failure()
        if failure:
            return self._failure(record, failure)
        if user is None:
            return self._finish(record, 401, self._error_body("Not Authorized"))
        if not ok:
            return self._finish(record, 400, self._error_body("Could not parse request data, invalid JSON"))
        try:
            with self._lock:
                status, payload = self._route(method, api_path, query, body, user)
        except _ApiError as exc:
            return self._finish(record, exc.status, self._error_body(exc.message))
        except KeyError as exc:
            return self._finish(record, 404, self._error_body(f"Unknown object: {exc}"))
        self._after_mutation()
        return self._finish(record, status, payload)

    def _failure(self, record, failure):
        mode = failure["mode"]
        if mode == "rate_limit":
            retry = failure.get("retry_after")
            return self._finish(record, failure.get("status") or 429, self._error_body(
                "You have made too many requests recently. Please, be chill."),
                {"Retry-After": str(retry)} if retry is not None else {})
        if mode == "auth":
            return self._finish(record, failure.get("status") or 401, self._error_body("Not Authorized"))
        return self._finish(record, failure.get("status") or 500, self._error_body("Server Error"))

    # --- routing ---------------------------------------------------------------------------------------------
    @staticmethod
    def _fields(query: dict) -> set[str] | None:
        raw = (query.get("opt_fields") or [""])[0]
        return {f.split(".")[0] for f in raw.split(",") if f.strip()} or None

    def _shape(self, record: dict, fields: set[str] | None, resource_type: str) -> dict:
        if fields is None:
            return {k: record.get(k) for k in ("gid", "resource_type", "name")} | {"resource_type": resource_type}
        return {k: v for k, v in record.items() if k in fields or k in ("gid", "resource_type")}

    @staticmethod
    def _data(body) -> dict:
        if not isinstance(body, dict) or not isinstance(body.get("data"), dict):
            raise _ApiError(400, "data: Missing input")
        return body["data"]

    def _paginate(self, rows: list, query: dict, path: str) -> dict:
        try:
            limit = int((query.get("limit") or ["0"])[0] or 0)
        except ValueError:
            raise _ApiError(400, "limit: Not a valid integer") from None
        if limit and not 1 <= limit <= 100:
            raise _ApiError(400, "limit: Must be between 1 and 100")
        signature = json.dumps({k: v for k, v in sorted(query.items()) if k not in ("offset", "limit")})
        start = 0
        offset = (query.get("offset") or [None])[0]
        if offset:
            try:
                token = json.loads(base64.urlsafe_b64decode(offset.encode()))
                start, seen_signature = int(token["i"]), token["q"]
            except (ValueError, KeyError, TypeError):
                raise _ApiError(400, "offset: Your pagination token is invalid or has expired.") from None
            if seen_signature != signature:
                raise _ApiError(400, "offset: Your pagination token is for another query.")
        if not limit:
            return {"data": rows[start:]}
        page, end = rows[start:start + limit], start + limit
        next_page = None
        if end < len(rows):
            token = base64.urlsafe_b64encode(json.dumps({"i": end, "q": signature}).encode()).decode()
            params = {k: v[0] for k, v in query.items() if k != "offset"} | {"offset": token}
            next_page = {"offset": token, "path": f"{path}?{urlencode(params)}",
                         "uri": f"{self.api_url}{path}?{urlencode(params)}"}
        return {"data": page, "next_page": next_page}

    def _live_task(self, gid: str) -> dict:
        task = self._tasks.get(gid)
        if task is None or task["deleted"]:
            raise _ApiError(404, "task: Unknown object: " + gid)
        return task

    def _route(self, method: str, path: str, query: dict, body, user: dict):
        seg = [s for s in path.split("/") if s]
        fields = self._fields(query)
        if method == "GET" and seg == ["users", "me"]:
            return 200, {"data": dict(user) | {"workspaces": [{"gid": self.workspace_gid, "resource_type": "workspace"}]}}
        if seg == ["tasks"] and method == "GET":
            project = (query.get("project") or [None])[0]
            if not project:
                raise _ApiError(400, "project: Must specify exactly one of project, tag, section, user task list, "
                                     "or assignee + workspace")
            p = self._projects.get(project)
            if p is None:
                raise _ApiError(404, "project: Unknown object: " + project)
            since_raw = (query.get("modified_since") or [None])[0]
            try:
                since = _parse_ts(since_raw) if since_raw else None
            except ValueError:
                raise _ApiError(400, "modified_since: Not a valid date-time") from None
            rows = [t for t in self._tasks.values() if not t["deleted"]
                    and any(m["project"] == p["gid"] for m in t["memberships"])
                    and (since is None or t["modified_at"] >= since)]
            result = self._paginate(rows, query, path)
            result["data"] = [self._shape(self.render_task(t), fields, "task") for t in result["data"]]
            return 200, result
        if seg == ["tasks"] and method == "POST":
            data = self._data(body)
            projects = data.get("projects") or []
            if not data.get("name") or not projects:
                raise _ApiError(400, "projects: A task must be created in a project (or workspace)")
            task = self._create_task(data["name"], projects[0], data.get("notes") or "", None, user,
                                     due_on=data.get("due_on"), extra_projects=projects[1:])
            return 201, {"data": self._shape(self.render_task(task), fields, "task")}
        if len(seg) == 2 and seg[0] == "tasks":
            task = self._live_task(seg[1])
            if method == "GET":
                return 200, {"data": self._shape(self.render_task(task), fields, "task")}
            if method == "PUT":
                data = self._data(body)
                unknown = [k for k in data if k not in ("name", "notes", "due_on", "due_at", "completed", "assignee")]
                if unknown:
                    raise _ApiError(400, f"{unknown[0]}: Cannot write this property")
                self._update_task(task, user, **data)
                return 200, {"data": self._shape(self.render_task(task), fields, "task")}
            if method == "DELETE":
                self._delete_task(task, user)
                return 200, {"data": {}}
        if len(seg) == 3 and seg[0] == "tasks" and seg[2] == "stories":
            task = self._live_task(seg[1])
            if method == "GET":
                rows = sorted((s for s in self._stories.values() if s["task"] == task["gid"] and not s["deleted"]),
                              key=lambda s: (s["created_at"], s["gid"]))
                result = self._paginate(rows, query, path)
                result["data"] = [self._shape(self.render_story(s), fields, "story") for s in result["data"]]
                return 200, result
            if method == "POST":
                data = self._data(body)
                if not str(data.get("text") or data.get("html_text") or "").strip():
                    raise _ApiError(400, "text: Missing input")
                story = self._add_story(task, str(data.get("text") or data.get("html_text")), user)
                return 201, {"data": self._shape(self.render_story(story), fields, "story")}
        if len(seg) == 2 and seg[0] == "stories":
            story = self._stories.get(seg[1])
            if story is None or story["deleted"]:
                raise _ApiError(404, "story: Unknown object: " + seg[1])
            if method == "PUT":
                story.update(text=str(self._data(body).get("text") or ""), is_edited=True)
                self._event("changed", self._ref(story["gid"], "story", story["subtype"]),
                            change={"field": "text", "action": "changed"}, user=user)
                return 200, {"data": self._shape(self.render_story(story), fields, "story")}
            if method == "DELETE":
                story["deleted"] = True
                self._event("removed", self._ref(story["gid"], "story", story["subtype"]),
                            parent=self._ref(story["task"], "task"), user=user)
                return 200, {"data": {}}
        if method == "GET" and len(seg) == 3 and seg[0] == "projects" and seg[2] == "sections":
            p = self._projects.get(seg[1])
            if p is None:
                raise _ApiError(404, "project: Unknown object: " + seg[1])
            result = self._paginate(list(p["sections"]), query, path)
            result["data"] = [self._shape(dict(s, resource_type="section"), fields, "section") for s in result["data"]]
            return 200, result
        if method == "POST" and len(seg) == 3 and seg[0] == "sections" and seg[2] == "addTask":
            section = next((s for p in self._projects.values() for s in p["sections"] if s["gid"] == seg[1]), None)
            if section is None:
                raise _ApiError(404, "section: Unknown object: " + seg[1])
            task = self._live_task(str(self._data(body).get("task") or ""))
            if not any(m["project"] == section["project"] for m in task["memberships"]):
                raise _ApiError(400, "task: The task is not in the section's project")
            self._move(task, section, user)
            return 200, {"data": {}}
        if seg == ["webhooks"] and method == "POST":
            return self._create_webhook(self._data(body))
        if len(seg) == 2 and seg[0] == "webhooks":
            hook = self._webhooks.get(seg[1])
            if hook is None:
                raise _ApiError(404, "webhook: Unknown object: " + seg[1])
            if method == "GET":
                return 200, {"data": self._render_webhook(hook)}
            if method == "DELETE":
                del self._webhooks[seg[1]]
                return 200, {"data": {}}
        raise _ApiError(404, f"No matching route for request: {method} {path}")

    def _render_webhook(self, hook: dict) -> dict:
        project = self._projects[hook["resource"]]
        return {"gid": hook["gid"], "resource_type": "webhook", "active": hook["active"],
                "resource": self._compact(project, "project"), "target": hook["target"],
                "created_at": hook["created_at"], "last_failure_at": hook.get("last_failure_at"),
                "last_failure_content": hook.get("last_failure_content") or "", "last_success_at": None,
                "filters": hook["filters"]}

    def _create_webhook(self, data: dict):
        resource, target = str(data.get("resource") or ""), str(data.get("target") or "")
        if resource not in self._projects:
            raise _ApiError(404, "resource: Unknown object: " + resource)
        if not target.startswith(("http://", "https://")):
            raise _ApiError(400, "target: Must be a valid URL")
        # The handshake goes out while this request is open; the lock is released so the target may call the
        # API back (and so deliveries are not blocked).
        self._lock.release()
        try:
            acknowledged, secret, detail = self._handshake(target)
        finally:
            self._lock.acquire()
        if not acknowledged:
            raise _ApiError(400, f"The remote server did not respond with the handshake secret ({detail}).")
        hook = {"gid": self._gid(), "resource": resource, "target": target, "secret": secret, "active": True,
                "filters": list(data.get("filters") or []), "created_at": _iso(self._stamp())}
        self._webhooks[hook["gid"]] = hook
        return 201, {"data": self._render_webhook(hook)}

    # --- demo (manage.py demo_sandbox --provider asana) ---------------------------------------------------------
    def demo_instance_fields(self) -> dict:
        project = self.project_gid()
        return {"containers": [project], "base_url": self.api_url, "service_account_id": self.service_user["gid"],
                "state_mapping": {"sections": {"In Progress": "active", "Review": "review", "Done": "terminal"},
                                  "completed": "terminal"},
                "config": {"outboundStates": {"terminal": "Completed"}}}  # closure completes the task

    def demo_open_task(self, title: str, body: str) -> str:
        return self.create_task(title, project=self.project_gid(), notes=body)["gid"]


def main(argv=None) -> int:
    parser = cli_parser(
        "asana", "Run the Asana-compatible REST sandbox (offline demo).", 8768,
        "personal access token the server accepts (env ASANA_SANDBOX_TOKEN); omit to disable auth",
        "create N demo tasks at start (no webhooks)",
        after_port=lambda p: p.add_argument("--project", action="append", dest="projects",
                                            help="project name (repeatable; default Launch)"))
    args = parser.parse_args(argv)
    projects = tuple(args.projects or ["Launch"])
    sandbox = AsanaSandbox(host=args.host, port=args.port, projects=projects, token=args.token,
                           webhook_url=args.webhook_url, webhook_secret=args.webhook_secret,
                           delivery_mode="queued" if args.queued else "sync", real_clock=True)
    with sandbox.quiet():
        for n in range(args.seed):
            sandbox.create_task(f"Demo task {n + 1}", project=projects[0], notes=f"Seeded ({n + 1}/{args.seed}).")
    return serve_until_interrupted(sandbox, lambda sb: (
        f"Asana sandbox on {sb.api_url}; projects: "
        + ", ".join(f"{p['name']} ({p['gid']})" for p in sb._projects.values())
        + f"; auth {'on' if args.token else 'off'}"))


if __name__ == "__main__":
    sys.exit(main())
