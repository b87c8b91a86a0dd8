"""The GitHub and Linear sandboxes behind one small vocabulary, for the run-mode / sync-mode and §7.4
close/reopen tests (tests/test_connectors_run_modes.py, tests/test_connectors_close_reopen.py).

A human acts on the tracker (``open``, ``activate``, ``close``, ``reopen``, ``comment``, ``delete``);
``forward()`` posts every webhook the tracker produced since the last call to the real endpoint, signed,
over HTTP, and runs what the commit queued (the inbound apply, outbound writes to the sandbox). The
engine is provider-neutral: each test runs once per provider."""
from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from connectors.models import TaskLink
from connectors.sandbox.github import GitHubSandbox
from connectors.sandbox.linear import LinearSandbox
from connectors.services.instances import instance_create
from issues.actors import SYSTEM
from tests import github_sandbox as gh
from tests import linear_sandbox as lin
from tests.connector_helpers import delivery_headers

PROVIDERS = ("github_issues", "linear")
GH_ACTIVE_LABEL = "in progress"  # tests/github_sandbox.DEFAULT_STATE_MAPPING: the label that means active


class Tracker:
    def __init__(self, key: str, sandbox, capture):
        self.key, self.sandbox, self.capture = key, sandbox, capture
        self.instance = None
        self._forwarded = 0

    # --- the tracker, as its users see it ---------------------------------------------------------
    def open(self, title: str, *, active: bool = False, actor: str = "alice") -> str:
        """A human opens a task (backlog, or already active); returns the handle the other calls take."""
        if self.key == "github_issues":
            labels = (GH_ACTIVE_LABEL,) if active else ()
            return str(self.sandbox.open_issue(title, "It crashes.", labels=labels, actor=actor)["number"])
        return self.sandbox.create_issue(title, team=lin.SANDBOX_TEAM, description="It crashes.",
                                         state="In Progress" if active else "Todo", actor=actor)["id"]

    def activate(self, handle: str, *, actor: str = "alice"):
        if self.key == "github_issues":
            self.sandbox.label(int(handle), GH_ACTIVE_LABEL, actor=actor)
        else:
            self.sandbox.move_issue(handle, "In Progress", actor=actor)

    def close(self, handle: str, *, actor: str = "carol"):
        if self.key == "github_issues":
            self.sandbox.close_issue(int(handle), actor=actor)
        else:
            self.sandbox.move_issue(handle, "Done", actor=actor)

    def reopen(self, handle: str, *, actor: str = "dave"):
        """Back to work: active (a GitHub reopen keeps the task's labels, Linear moves to In Progress)."""
        if self.key == "github_issues":
            self.sandbox.reopen_issue(int(handle), actor=actor)
        else:
            self.sandbox.move_issue(handle, "In Progress", actor=actor)

    def retitle(self, handle: str, title: str, *, actor: str = "alice"):
        if self.key == "github_issues":
            self.sandbox.edit_issue(int(handle), title=title, actor=actor)
        else:
            self.sandbox.update_issue(handle, title=title, actor=actor)

    def comment(self, handle: str, body: str, *, actor: str = "erin") -> str:
        if self.key == "github_issues":
            return str(self.sandbox.comment(int(handle), body, actor=actor)["id"])
        return self.sandbox.add_comment(handle, body, actor=actor)["id"]

    def edit_comment(self, comment_id: str, body: str, *, actor: str = "erin"):
        if self.key == "github_issues":
            self.sandbox.edit_comment(int(comment_id), body, actor=actor)
        else:
            self.sandbox.edit_comment(comment_id, body, actor=actor)

    def delete(self, handle: str, *, actor: str = "alice"):
        if self.key == "github_issues":
            self.sandbox.delete_issue(int(handle), actor=actor)
        else:
            self.sandbox.delete_issue(handle, actor=actor)

    def comments(self, handle: str) -> list[str]:
        """The bodies of every comment on the task, as its users see them."""
        if self.key == "github_issues":
            return [c["body"] for c in self.sandbox.comments_of(int(handle))]
        return [c["body"] for c in self.sandbox.comments_of(handle)]

    def writes(self) -> list:
        """Every request Paperclip made that changes the tracker (REST writes; Linear mutations)."""
        if self.key == "github_issues":
            return [r for r in self.sandbox.requests if r.method in ("POST", "PATCH", "PUT", "DELETE")
                    and "graphql" not in r.path]
        return [r for r in self.sandbox.requests
                if (r.operation or "").endswith(("Create", "Update", "Delete", "Archive"))]

    # --- Paperclip's side --------------------------------------------------------------------------
    def link(self, handle: str) -> TaskLink:
        if self.key == "github_issues":
            external_id = str(self.sandbox.issue(int(handle))["id"])
        else:
            external_id = handle
        return TaskLink.objects.select_related("issue").get(instance=self.instance, external_task_id=external_id)

    def forward(self) -> list:
        """Deliver every webhook the tracker produced since the last forward, in order (202 each)."""
        deliveries = self.sandbox.deliveries[self._forwarded:]
        self._forwarded += len(deliveries)
        responses = [self.post(d) for d in deliveries]
        assert all(r.status_code == 202 for r in responses), [r.content for r in responses]
        return deliveries

    def post(self, delivery):
        headers = delivery_headers(delivery)
        with self.capture(execute=True):
            return APIClient().post(f"/api/connectors/{self.instance.pk}/webhook", data=delivery.body,
                                    content_type="application/json", **headers)


def connect(tracker: Tracker, company, monkeypatch, *, rules=None, **fields):
    """The connector instance for ``tracker`` (secrets by env reference, as an operator sets them up)."""
    prefix = "PAPERCLIP_SECRET_POLICY_" + ("GH" if tracker.key == "github_issues" else "LIN")
    if tracker.key == "github_issues":
        monkeypatch.setenv(f"{prefix}_TOKEN", gh.SANDBOX_TOKEN)
        monkeypatch.setenv(f"{prefix}_HOOK", gh.SANDBOX_WEBHOOK_SECRET)
        extra = dict(containers=[gh.SANDBOX_REPO], state_mapping=gh.DEFAULT_STATE_MAPPING,
                     service_account_id=gh.SERVICE_LOGIN)
    else:
        monkeypatch.setenv(f"{prefix}_TOKEN", lin.SANDBOX_TOKEN)
        monkeypatch.setenv(f"{prefix}_HOOK", lin.SANDBOX_WEBHOOK_SECRET)
        extra = dict(containers=[lin.SANDBOX_TEAM], state_mapping=lin.DEFAULT_STATE_MAPPING,
                     service_account_id=tracker.sandbox.service_user["id"])
    extra.update(fields)
    tracker.instance = instance_create(
        actor=SYSTEM, company=company, name=f"{tracker.key}-policies", provider_key=tracker.key,
        base_url=tracker.sandbox.base_url, credentials=f"env:{prefix}_TOKEN", webhook_secret=f"env:{prefix}_HOOK",
        routing_rules=rules, **extra)
    return tracker.instance


def sandbox_for(key: str):
    if key == "github_issues":
        return GitHubSandbox(repos=(gh.SANDBOX_REPO,), token=gh.SANDBOX_TOKEN, service_login=gh.SERVICE_LOGIN,
                             webhook_secret=gh.SANDBOX_WEBHOOK_SECRET)
    return LinearSandbox(teams=(lin.SANDBOX_TEAM,), token=lin.SANDBOX_TOKEN, service_user=lin.SERVICE_USER,
                         webhook_secret=lin.SANDBOX_WEBHOOK_SECRET)


@pytest.fixture(params=PROVIDERS)
def tracker(request, settings, django_capture_on_commit_callbacks):
    """A started sandbox of each provider (deliveries recorded, forwarded by ``Tracker.forward``)."""
    settings.CONNECTORS = {**settings.CONNECTORS, "RETRY_BASE_SECONDS": 0.0}
    with sandbox_for(request.param) as sandbox:
        yield Tracker(request.param, sandbox, django_capture_on_commit_callbacks)
