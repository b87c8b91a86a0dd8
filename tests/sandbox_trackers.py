"""One tracker per provider sandbox (GitHub, Linear, Jira) as its users see it, wired to a connector
instance, for the comment backstop and write toggle tests: people open tasks and write, edit and
delete comments; their webhooks are forwarded to the real endpoint, or dropped (a lost delivery).

    from tests.sandbox_trackers import tracker, PROVIDERS  # noqa: F401  (fixture import)

The ``tracker`` fixture is parametrized over the three providers; ``make_tracker(key, ...)`` builds
one (a context manager) where a test wants one provider only."""
from __future__ import annotations

import contextlib

import pytest
from rest_framework.test import APIClient

from connectors.models import TaskLink
from connectors.sandbox import jira as jira_sb
from connectors.sandbox import linear as linear_sb
from connectors.sandbox.github import GitHubSandbox
from connectors.services.common import adapter_for
from connectors.services.instances import instance_create
from issues.actors import SYSTEM
from tests.connector_helpers import delivery_headers, external_comments  # noqa: F401  (external_comments: re-exported)
from tests.factories import AgentFactory
from tests.github_sandbox import DEFAULT_STATE_MAPPING as GITHUB_MAPPING
from tests.github_sandbox import SANDBOX_REPO, SERVICE_LOGIN
from tests.github_sandbox import SANDBOX_TOKEN as GITHUB_TOKEN
from tests.github_sandbox import SANDBOX_WEBHOOK_SECRET as GITHUB_HOOK
from tests.jira_sandbox import SANDBOX_EMAIL, SANDBOX_PROJECT
from tests.jira_sandbox import SANDBOX_TOKEN as JIRA_TOKEN
from tests.jira_sandbox import SANDBOX_WEBHOOK_SECRET as JIRA_HOOK
from tests.linear_sandbox import SANDBOX_TEAM, SERVICE_USER
from tests.linear_sandbox import SANDBOX_TOKEN as LINEAR_TOKEN
from tests.linear_sandbox import SANDBOX_WEBHOOK_SECRET as LINEAR_HOOK

PROVIDERS = ("github", "linear", "jira")
PROVIDER_KEYS = {"github": "github_issues", "linear": "linear", "jira": "jira"}
LINEAR_TYPES = {"triage": "backlog", "backlog": "backlog", "unstarted": "backlog", "started": "active",
                "completed": "terminal", "canceled": "terminal", "duplicate": "terminal"}
JIRA_CATEGORIES = {"new": "backlog", "indeterminate": "active", "done": "terminal"}
# the page size each adapter takes as a constructor argument (tests use small pages)
PAGE_ARG = {"github": "per_page", "linear": "page_size", "jira": "page_size"}


class Tracker:
    def __init__(self, key: str, sandbox, instance, capture):
        self.key, self.sandbox, self.instance, self.capture = key, sandbox, instance, capture
        self._forwarded = 0
        self._numbers: dict[str, int] = {}  # GitHub addresses issues by number

    # --- what people do in the tracker -----------------------------------------------------------
    def open(self, title: str) -> str:
        """A person opens a task; returns the id Paperclip links it by."""
        if self.key == "github":
            raw = self.sandbox.open_issue(title, "It crashes.")
            self._numbers[str(raw["id"])] = raw["number"]
            return str(raw["id"])
        if self.key == "linear":
            return self.sandbox.create_issue(title, team=SANDBOX_TEAM, description="It crashes.")["id"]
        return self.sandbox.create_issue(title, project=SANDBOX_PROJECT, description="It crashes.")["id"]

    def comment(self, task_id: str, body: str) -> str:
        if self.key == "github":
            return str(self.sandbox.comment(self._numbers[task_id], body)["id"])
        return str(self.sandbox.add_comment(task_id, body)["id"])

    def edit_comment(self, comment_id: str, body: str):
        self.sandbox.edit_comment(int(comment_id) if self.key == "github" else comment_id, body)

    def delete_comment(self, comment_id: str):
        self.sandbox.delete_comment(int(comment_id) if self.key == "github" else comment_id)

    def fail_next(self, count: int = 1, *, retry_after: int = 30):
        """The provider answers the next requests with a rate limit."""
        self.sandbox.fail_next(count, "rate_limit" if self.key != "github" else "retry_after_429",
                               retry_after=retry_after)

    def comment_listings(self) -> int:
        """How many comment listing requests the tracker served."""
        if self.key == "linear":
            return len(self.sandbox.requests_for("IssueComments"))
        suffix = "/comments" if self.key == "github" else "/comment"
        return sum(1 for r in self.sandbox.requests if r.method == "GET" and r.path.endswith(suffix))

    def listed_tasks(self) -> list[str]:
        """The task (GitHub: issue number, Linear: id, Jira: key) of every comment listing, in order."""
        if self.key == "linear":
            return [r.variables.get("id") for r in self.sandbox.requests_for("IssueComments")]
        suffix = "/comments" if self.key == "github" else "/comment"
        return [r.path.rsplit("/", 2)[-2] for r in self.sandbox.requests if r.method == "GET"
                and r.path.endswith(suffix)]

    def ref_of(self, link: TaskLink) -> str:
        if self.key == "github":
            return str(self._numbers[link.external_task_id])
        return link.external_task_id if self.key == "linear" else link.external_key

    # --- the webhook hop --------------------------------------------------------------------------
    def pending(self) -> list:
        return self.sandbox.deliveries[self._forwarded:]

    def drop(self) -> list:
        """Every webhook produced since the last forward is lost on the way (never reaches Paperclip)."""
        lost = self.pending()
        self._forwarded += len(lost)
        return lost

    def forward(self) -> list:
        deliveries = self.pending()
        self._forwarded += len(deliveries)
        for delivery in deliveries:
            response = self.post(delivery)
            assert response.status_code == 202, response.content
        return deliveries

    def post(self, delivery):
        headers = delivery_headers(delivery)
        with self.capture(execute=True):
            return APIClient().post(f"/api/connectors/{self.instance.pk}/webhook", data=delivery.body,
                                    content_type="application/json", **headers)

    # --- Paperclip's side -----------------------------------------------------------------------------
    def link_task(self, title: str = "Crash on start") -> tuple[str, TaskLink]:
        """A task imported through its webhook, with the writes that followed forwarded too."""
        task_id = self.open(title)
        self.forward()
        link = TaskLink.objects.get(instance=self.instance, external_task_id=task_id)
        self.forward()  # the tracker's echo of the backlink write
        return task_id, link

    def small_pages(self, size: int):
        """The instance's adapter with ``size`` comments per listing page (real HTTP, same sandbox)."""
        adapter = adapter_for(self.instance)
        return type(adapter)(adapter.config, **{PAGE_ARG[self.key]: size})


def _sandbox(key: str):
    if key == "github":
        return GitHubSandbox(repos=(SANDBOX_REPO,), token=GITHUB_TOKEN, service_login=SERVICE_LOGIN,
                             webhook_secret=GITHUB_HOOK)
    if key == "linear":
        return linear_sb.LinearSandbox(teams=(SANDBOX_TEAM,), token=LINEAR_TOKEN, service_user=SERVICE_USER,
                                       webhook_secret=LINEAR_HOOK)
    return jira_sb.JiraSandbox(projects=(SANDBOX_PROJECT,), email=SANDBOX_EMAIL, token=JIRA_TOKEN,
                               webhook_secret=JIRA_HOOK)


def _instance(key: str, sandbox, company, agent, monkeypatch, **fields):
    env = f"PAPERCLIP_SECRET_BACKSTOP_{key.upper()}"
    if key == "github":
        monkeypatch.setenv(f"{env}_TOKEN", GITHUB_TOKEN)
        monkeypatch.setenv(f"{env}_HOOK", GITHUB_HOOK)
        extra = dict(containers=[SANDBOX_REPO], state_mapping=GITHUB_MAPPING, service_account_id=SERVICE_LOGIN)
    elif key == "linear":
        monkeypatch.setenv(f"{env}_TOKEN", LINEAR_TOKEN)
        monkeypatch.setenv(f"{env}_HOOK", LINEAR_HOOK)
        extra = dict(containers=[SANDBOX_TEAM], state_mapping={"types": LINEAR_TYPES},
                     service_account_id=sandbox.service_user["id"])
    else:
        monkeypatch.setenv(f"{env}_TOKEN", sandbox.credentials)
        monkeypatch.setenv(f"{env}_HOOK", JIRA_HOOK)
        extra = dict(containers=[SANDBOX_PROJECT], state_mapping={"categories": JIRA_CATEGORIES},
                     service_account_id=sandbox.service_user["accountId"])
    return instance_create(
        actor=SYSTEM, company=company, name=f"{key}-backstop", provider_key=PROVIDER_KEYS[key],
        base_url=sandbox.base_url, credentials=f"env:{env}_TOKEN", webhook_secret=f"env:{env}_HOOK",
        triage_agent_id=agent.pk, default_sync_mode="bidirectional",
        routing_rules=[{"kind": "default_route", "agentId": agent.pk}], **extra, **fields)


@contextlib.contextmanager
def make_tracker(key: str, company, monkeypatch, capture, *, agent=None, **fields):
    agent = agent or AgentFactory(company=company, name="coder")
    with _sandbox(key) as sandbox:
        yield Tracker(key, sandbox, _instance(key, sandbox, company, agent, monkeypatch, **fields), capture)


@pytest.fixture(params=PROVIDERS)
def tracker(request, company, monkeypatch, django_capture_on_commit_callbacks, settings):
    settings.CONNECTORS = {**settings.CONNECTORS, "RETRY_BASE_SECONDS": 0.0}
    with make_tracker(request.param, company, monkeypatch, django_capture_on_commit_callbacks) as board:
        yield board
