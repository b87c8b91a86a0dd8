"""A test-only task source adapter (provider key ``fake_tracker``) backed by an in-memory store.

Enough of a tracker for engine tests: tasks with states/labels/assignees, comments, HMAC-signed
webhook deliveries (``X-Fake-Signature: <hex HMAC-SHA256(secret, body)>``), paged listing with a
cursor, batched state reads — and call counters so tests can assert what the engine asked for.
Each store is addressed by the instance's ``base_url`` (``fake://<uuid>``)."""
from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import uuid
from collections import Counter
from datetime import datetime, timedelta, timezone

from connectors.providers.base import (
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
    WebhookRegistration,
    WebhookRejected,
    WebhookRequest,
    WebhookUnparseable,
    _REGISTRY,
    normalize_labels,
    normalize_state_name,
    register,
)

PROVIDER = "fake_tracker"
STORES: dict[str, "FakeStore"] = {}
SERVICE_LOGIN = "paperclip-bot"
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def sign(secret: str, body: bytes) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class FakeStore:
    def __init__(self, container="acme/tracker"):
        self.base_url = f"fake://{uuid.uuid4()}"
        self.container = container
        self.tasks: dict[str, dict] = {}
        self.comments: dict[str, list[dict]] = {}
        self.calls: Counter = Counter()
        self.state_batches: list[int] = []
        self.fail_get_task: int = 0
        self.fail_states: int = 0  # get_task_states raises provider_rate_limited this many times
        self.reject_cursor: int = 0  # list_candidate_tasks raises cursor_invalid for a given cursor
        self.clock = itertools.count(1)
        self.webhooks: dict[str, dict] = {}  # provider-side webhooks register_webhook created
        self.on_register = None  # called (scope, callback_url) during creation: the provider's callback
        STORES[self.base_url] = self

    def tick(self) -> str:
        return (T0 + timedelta(seconds=next(self.clock))).isoformat()

    def add_task(self, number: int | None = None, *, title="A task", body="Body", state="todo", labels=(),
                 assignees=(), custom=None, task_id=None) -> dict:
        number = number or (len(self.tasks) + 1)
        task_id = task_id or str(1000 + number)
        task = {"id": task_id, "number": number, "title": title, "body": body, "state": state,
                "labels": list(labels), "assignees": list(assignees), "custom": custom or {}, "updated": self.tick(),
                "container": self.container}
        self.tasks[task_id] = task
        self.comments.setdefault(task_id, [])
        return task

    def update(self, task_id: str, **fields) -> dict:
        self.tasks[task_id].update(fields, updated=self.tick())
        return self.tasks[task_id]

    def add_comment(self, task_id: str, body: str, author="alice", comment_id=None) -> dict:
        comment = {"id": comment_id or str(uuid.uuid4().int % 10**9), "task": task_id, "body": body,
                   "author": author, "created": self.tick()}
        comment["updated"] = comment["created"]
        self.comments.setdefault(task_id, []).append(comment)
        return comment

    # --- deliveries -------------------------------------------------------------------------
    def delivery(self, kind: str, task_id: str, *, comment: dict | None = None, sender="alice",
                 delivery_id: str | None = None, container: str | None = None) -> tuple[bytes, str]:
        body = {"id": delivery_id or str(uuid.uuid4()), "type": kind, "sender": sender,
                "container": container or self.container, "task": dict(self.tasks.get(task_id) or {"id": task_id}),
                "comment": comment}
        return json.dumps(body).encode(), body["id"]


def _actor(login: str | None, service_id: str | None) -> ExternalActor | None:
    if not login:
        return None
    return ExternalActor(provider_key=PROVIDER, external_user_id=f"u-{login}", display_name=login,
                         is_connector_service_account=bool(service_id) and login == service_id)


class FakeTrackerAdapter(TaskSourceAdapter):
    provider_key = PROVIDER
    default_base_url = ""

    @classmethod
    def base_url_refusal(cls, url: str) -> str | None:
        # The fake tracker lives in this process: its base URL is a store key, never dialled.
        return None if url.startswith("fake://") else "Must be a fake:// store URL."
    capabilities = Capabilities(
        operations=frozenset({"list_candidate_tasks", "get_task", "get_task_states", "list_comments",
                              "verify_webhook", "post_comment", "set_backlink", "create_task", "register_webhook",
                              "check_webhook"}),
        state_categories=frozenset(StateCategory.ALL), signed_webhooks=True,
        routing_rule_kinds=frozenset({"comment_command", "custom_field", "label", "state_lane", "user_mapping",
                                      "default_route"}))

    @property
    def store(self) -> FakeStore:
        try:
            return STORES[self.config.base_url]
        except KeyError:
            raise ProviderError(ErrorCategory.PROVIDER_REQUEST, f"no tracker at {self.config.base_url}")

    def _state(self, name: str) -> tuple[ExternalState, bool]:
        mapping = {normalize_state_name(k): v for k, v in (self.config.state_mapping or {}).items()}
        category = mapping.get(normalize_state_name(name))
        if category in StateCategory.ALL:
            return ExternalState(name, category), True
        return ExternalState(name, StateCategory.BACKLOG), False

    def normalize(self, raw: dict) -> ExternalTask:
        state, mapped = self._state(raw["state"])
        envelope = {"number": raw["number"], "customFields": raw.get("custom") or {}}
        if not mapped:
            envelope["unmappedState"] = raw["state"]
        return ExternalTask(
            provider_key=PROVIDER, external_id=raw["id"], external_key=f"{raw['container']}#{raw['number']}",
            title=raw["title"], description=raw["body"], state=state,
            assignees=tuple(_actor(a, self.config.service_account_id) for a in raw.get("assignees") or ()),
            labels=tuple(normalize_labels(raw.get("labels"))), url=f"https://tracker.example/{raw['container']}/"
                                                                   f"{raw['number']}",
            updated_at=datetime.fromisoformat(raw["updated"]), revision=raw["updated"],
            container_id=raw["container"], envelope=envelope)

    def comment(self, raw: dict) -> ExternalComment:
        return ExternalComment(external_comment_id=raw["id"], external_task_id=raw["task"],
                               author=_actor(raw["author"], self.config.service_account_id), body=raw["body"],
                               url=f"https://tracker.example/c/{raw['id']}",
                               created_at=datetime.fromisoformat(raw["created"]),
                               updated_at=datetime.fromisoformat(raw["updated"]))

    def list_candidate_tasks(self, scope, cursor):
        self.store.calls["list_candidate_tasks"] += 1
        if cursor and self.store.reject_cursor:
            self.store.reject_cursor -= 1
            raise ProviderError(ErrorCategory.CURSOR_INVALID, "cursor expired")
        rows = sorted(self.store.tasks.values(), key=lambda t: (t["updated"], t["id"]))
        if cursor:
            rows = [r for r in rows if (r["updated"], r["id"]) > tuple(json.loads(cursor))]
        page = rows[:getattr(self.store, "page_size", 2)]
        if not page:
            return Page(items=[], cursor=None)
        return Page(items=[self.normalize(r) for r in page], cursor=json.dumps([page[-1]["updated"], page[-1]["id"]]))

    def get_task(self, ref: ExternalTaskRef):
        self.store.calls["get_task"] += 1
        if self.store.fail_get_task:
            self.store.fail_get_task -= 1
            raise ProviderError(ErrorCategory.PROVIDER_REQUEST, "tracker down")
        raw = self.store.tasks.get(ref.external_id) or next(
            (t for t in self.store.tasks.values() if ref.external_key == f"{t['container']}#{t['number']}"), None)
        if raw is None:
            raise ProviderError(ErrorCategory.PROVIDER_STATUS, "gone", status=404)
        return self.normalize(raw)

    def get_task_states(self, refs):
        self.store.calls["get_task_states"] += 1
        if self.store.fail_states:
            self.store.fail_states -= 1
            raise ProviderError(ErrorCategory.PROVIDER_RATE_LIMITED, "slow down", status=429, retry_after=30)
        self.store.state_batches.append(len(refs))
        out = {}
        for ref in refs:
            raw = self.store.tasks.get(ref.external_id)
            out[ref.external_id] = self._state(raw["state"])[0] if raw else None
        return out

    def create_task(self, scope, projection):
        """An export (§6.2.2): a new task in the store, as its listing and webhooks then show it."""
        self.store.calls["create_task"] += 1
        if scope != self.store.container:
            raise ProviderError(ErrorCategory.PROVIDER_PAYLOAD, f"{scope} is not this tracker's container")
        return self.normalize(self.store.add_task(title=projection["title"], body=projection.get("description") or ""))

    def register_webhook(self, scope, callback_url):
        self.store.calls["register_webhook"] += 1
        if self.store.on_register:
            self.store.on_register(scope, callback_url)
        hook_id = f"wh-{len(self.store.webhooks) + 1}"
        self.store.webhooks[hook_id] = {"scope": scope, "url": callback_url, "active": True}
        return WebhookRegistration(scope=scope, external_id=hook_id, callback_url=callback_url)

    def check_webhook(self, registration):
        self.store.calls["check_webhook"] += 1
        hook = self.store.webhooks.get(registration.external_id)
        if hook is None or not hook["active"]:
            return WebhookRegistration(scope=registration.scope, external_id=registration.external_id,
                                       callback_url=registration.callback_url, active=False,
                                       detail="gone" if hook is None else "disabled after failed deliveries")
        return WebhookRegistration(scope=hook["scope"], external_id=registration.external_id, callback_url=hook["url"])

    def list_comments(self, ref, cursor):
        self.store.calls["list_comments"] += 1
        rows = self.store.comments.get(ref.external_id, [])
        return Page(items=[self.comment(c) for c in rows], cursor=None)

    def verify_webhook(self, request: WebhookRequest) -> VerifiedEvent:
        secret = self.config.webhook_secret
        given = request.headers.get("x-fake-signature")
        if not secret or not given or not hmac.compare_digest(sign(secret, request.body), given):
            raise WebhookRejected("bad signature")
        try:
            body = json.loads(request.body)
            kind = body["type"]
        except (ValueError, KeyError, TypeError):
            raise WebhookUnparseable("not a fake tracker payload")
        if body.get("container") not in self.config.containers:
            raise WebhookRejected("another container", category=ErrorCategory.PROVIDER_PAYLOAD)
        actor = _actor(body.get("sender"), self.config.service_account_id)
        raw_task = body.get("task") or {}
        task = self.normalize(raw_task) if "state" in raw_task else None
        comment = self.comment(body["comment"]) if body.get("comment") else None
        kinds = {"task": EventKind.TASK_UPSERTED, "task_deleted": EventKind.TASK_DELETED,
                 "comment": EventKind.COMMENT_UPSERTED, "comment_deleted": EventKind.COMMENT_DELETED,
                 "ping": EventKind.IGNORED}
        if kind not in kinds:
            raise WebhookUnparseable(f"unknown type {kind}")
        return VerifiedEvent(event_id=body["id"], kind=kinds[kind], action=kind, external_task_id=raw_task.get("id"),
                             task=task, comment=comment, actor=actor, container_id=body.get("container"))


if PROVIDER not in _REGISTRY:
    register(FakeTrackerAdapter)
