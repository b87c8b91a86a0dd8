"""Export (§6.2.2, §4.1.4): a Paperclip issue becomes a task in the tracker, over real HTTP against the
GitHub, Linear and Jira sandboxes. What a user relies on: one request (or one retry of it, also after
an answer that was lost on the way back) creates exactly one task, carrying the issue's title,
description, priority and a backlink; the link is Paperclip's (originSide paperclip, Paperclip-owned
content, shared state) and the outbound engine then writes to it like to any write-enabled link;
failures answer in the one error shape and leave the export failed with no link; the same action
works from the API, the console and the command line."""
from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone
from rest_framework.test import APIClient

from connectors.choices import ExportStatus, OutboundKind, OutboundStatus
from connectors.models import (
    Conflict,
    InboundEvent,
    Intervention,
    OutboundEffect,
    SyncError,
    TaskExport,
    TaskLink,
)
from connectors.providers.base import _REGISTRY, Capabilities, ExternalTaskRef, register
from connectors.providers.github import BACKLINK_MARKER
from connectors.sandbox.github import GitHubSandbox
from connectors.sandbox.jira import JiraSandbox
from connectors.sandbox.linear import LinearSandbox
from connectors.services import outbound
from connectors.services.common import adapter_for
from connectors.services.instances import instance_create
from issues.actors import SYSTEM, Actor
from issues.models import ActivityLog, Issue
from issues.services.issues import issue_update
from tests import github_sandbox as gh
from tests import jira_sandbox as jira
from tests import linear_sandbox as linear
from tests.connector_fakes import FakeStore, FakeTrackerAdapter
from tests.factories import AgentFactory, IssueFactory, MembershipFactory
from tests.test_errors import assert_error
from tests.connector_helpers import delivery_headers

PROVIDERS = ("github", "linear", "jira")
# The create request of each provider, as the sandbox sees it ("METHOD path\nbody"): its answer gets lost.
CREATE_REQUEST = {"github": r"^POST /repos/[^/]+/[^/]+/issues\n", "linear": r"^POST .*\n.*issueCreate",
                  "jira": r"^POST /rest/api/3/issue\n"}
NAMED_STATES = {"In Progress": "active", "In Review": "review", "Done": "terminal"}


class Tracker:
    """One provider's sandbox (real clock, as a real tracker has) and the connector instance on it."""

    def __init__(self, key, sandbox, instance, capture):
        self.key, self.sandbox, self.instance, self.capture = key, sandbox, instance, capture
        self._forwarded = 0

    @property
    def container(self) -> str:
        return self.instance.containers[0]

    def tasks(self) -> list:
        """Every task of the container, read through the adapter (the tracker's own listing)."""
        adapter, cursor, out = adapter_for(self.instance), None, []
        for _ in range(20):
            page = adapter.list_candidate_tasks(self.container, cursor)
            out += page.items
            if not page.cursor or page.cursor == cursor:
                return out
            cursor = page.cursor
        return out

    def task(self, link):
        return adapter_for(self.instance).get_task(ExternalTaskRef(link.external_task_id, link.external_key))

    def lose_next_create(self):
        self.sandbox.lose_answer(CREATE_REQUEST[self.key])

    def backlinks(self, link) -> list[str]:
        """The backlinks the engine wrote with the provider's own kind (comment / attachment / remote link)."""
        if self.key == "github":
            number = int(link.external_key.rsplit("#", 1)[1])
            return [c["body"].split("Tracked in Paperclip: ", 1)[1] for c in self.sandbox.comments_of(number)
                    if BACKLINK_MARKER in c["body"]]
        if self.key == "linear":
            return [a["url"] for a in self.sandbox.attachments_of(link.external_task_id)
                    if (a.get("metadata") or {}).get("paperclip") == "backlink"]
        return [lnk["object"]["url"] for lnk in self.sandbox.remote_links_of(link.external_task_id)
                if lnk.get("globalId") == "paperclip:backlink"]

    def forward(self) -> list:
        """Deliver the tracker's webhooks produced since the last forward to Paperclip's endpoint."""
        deliveries = self.sandbox.deliveries[self._forwarded:]
        self._forwarded += len(deliveries)
        for delivery in deliveries:
            headers = delivery_headers(delivery)
            with self.capture(execute=True):
                response = APIClient().post(f"/api/connectors/{self.instance.pk}/webhook", data=delivery.body,
                                            content_type="application/json", **headers)
            assert response.status_code == 202, response.content
        return deliveries


def _sandbox(key):
    if key == "github":
        return GitHubSandbox(repos=(gh.SANDBOX_REPO,), token=gh.SANDBOX_TOKEN, service_login=gh.SERVICE_LOGIN,
                             webhook_secret=gh.SANDBOX_WEBHOOK_SECRET, real_clock=True)
    if key == "linear":
        return LinearSandbox(teams=(linear.SANDBOX_TEAM,), token=linear.SANDBOX_TOKEN,
                             service_user=linear.SERVICE_USER, webhook_secret=linear.SANDBOX_WEBHOOK_SECRET,
                             real_clock=True)
    return JiraSandbox(projects=(jira.SANDBOX_PROJECT,), email=jira.SANDBOX_EMAIL, token=jira.SANDBOX_TOKEN,
                       webhook_secret=jira.SANDBOX_WEBHOOK_SECRET, real_clock=True)


def _instance(key, sandbox, company, monkeypatch, **fields):
    env = f"PAPERCLIP_SECRET_EXPORT_{key.upper()}"
    if key == "github":
        token, hook, extra = gh.SANDBOX_TOKEN, gh.SANDBOX_WEBHOOK_SECRET, dict(
            provider_key="github_issues", containers=[gh.SANDBOX_REPO], state_mapping=gh.DEFAULT_STATE_MAPPING,
            service_account_id=gh.SERVICE_LOGIN)
    elif key == "linear":
        token, hook, extra = linear.SANDBOX_TOKEN, linear.SANDBOX_WEBHOOK_SECRET, dict(
            provider_key="linear", containers=[linear.SANDBOX_TEAM], service_account_id=sandbox.service_user["id"],
            state_mapping={"types": linear.DEFAULT_STATE_MAPPING["types"], "states": NAMED_STATES})
    else:
        token, hook, extra = sandbox.credentials, jira.SANDBOX_WEBHOOK_SECRET, dict(
            provider_key="jira", containers=[jira.SANDBOX_PROJECT], service_account_id=sandbox.service_user["accountId"],
            state_mapping={"statuses": NAMED_STATES, "categories": jira.DEFAULT_STATE_MAPPING["categories"]})
    monkeypatch.setenv(f"{env}_TOKEN", token)
    monkeypatch.setenv(f"{env}_HOOK", hook)
    extra.update({"name": f"{key} tracker", **fields})
    return instance_create(actor=SYSTEM, company=company, base_url=sandbox.base_url,
                           credentials=f"env:{env}_TOKEN", webhook_secret=f"env:{env}_HOOK", **extra)


@pytest.fixture
def fast(settings):
    settings.CONNECTORS = {**settings.CONNECTORS, "RETRY_BASE_SECONDS": 0.0}


@pytest.fixture(params=PROVIDERS)
def tracker(request, company, monkeypatch, django_capture_on_commit_callbacks, fast):
    with _sandbox(request.param) as sandbox:
        yield Tracker(request.param, sandbox, _instance(request.param, sandbox, company, monkeypatch),
                      django_capture_on_commit_callbacks)


@pytest.fixture
def github(company, monkeypatch, django_capture_on_commit_callbacks, fast):
    with _sandbox("github") as sandbox:
        yield Tracker("github", sandbox, _instance("github", sandbox, company, monkeypatch),
                      django_capture_on_commit_callbacks)


@pytest.fixture
def work(company):
    return IssueFactory(company=company, title="Crash on start", description="It crashes when **started**.",
                        priority="high")


def export(client, tracker, issue, key="export-1", **body):
    with tracker.capture(execute=True):
        return client.post(f"/api/issues/{issue.identifier}/connector-links",
                           {"instanceId": str(tracker.instance.pk), "idempotencyKey": key, **body}, format="json")


# --- 1. one task, the issue's content, a Paperclip-owned link ---------------------------------------
def test_export_creates_one_task_with_the_issue_content_and_a_paperclip_owned_link(tracker, work, board_client):
    response = export(board_client, tracker, work, container=tracker.container)
    assert response.status_code == 201, response.content
    body = response.json()
    [task] = tracker.tasks()
    assert task.title == "Crash on start"
    assert "It crashes when **started**." in task.description
    url = outbound.issue_url(work)
    assert f"Exported from Paperclip: [{work.identifier}]({url})" in task.description
    if tracker.key != "github":  # GitHub Issues has no priority field
        assert task.priority == 1  # high
    link = TaskLink.objects.get(issue=work)
    assert (link.external_task_id, link.origin_side, link.status) == (task.external_id, "paperclip", "healthy")
    assert link.field_policy == {"title": "paperclip", "description": "paperclip", "priority": "paperclip",
                                 "labels": "paperclip", "dueAt": "paperclip", "state": "shared"}
    assert tracker.instance.default_sync_mode == "import_only" and link.sync_mode == "bidirectional"
    assert body["status"] == "linked" and body["replayed"] is False and body["attempts"] == 1
    assert body["link"]["id"] == str(link.pk) and body["link"]["originSide"] == "paperclip"
    # the provider's own backlink kind went through the outbound engine (§10.2 postBacklink)
    assert tracker.backlinks(link) == [url]
    assert Intervention.objects.filter(action="task.export", target_id=str(work.pk)).count() == 1
    audit = ActivityLog.objects.get(action="connector.task_exported")
    assert audit.entity_id == str(link.pk) and audit.details["externalTaskId"] == task.external_id
    assert audit.details["found"] is False and audit.actor_user_id is not None

    # the same request again: the same export and link, no second task
    again = export(board_client, tracker, work, container=tracker.container)
    assert again.status_code == 200, again.content
    assert (again.json()["id"], again.json()["link"]["id"], again.json()["replayed"]) == (body["id"], str(link.pk), True)
    assert len(tracker.tasks()) == 1 and TaskExport.objects.count() == 1

    # the tracker's webhooks for what the export wrote are echoes: no issue, no conflict
    issues_before = Issue.objects.count()
    assert tracker.forward()
    assert Issue.objects.count() == issues_before
    assert not Conflict.objects.exists()
    link.refresh_from_db()
    assert link.status == "healthy"


# --- 2. a retry after a lost answer creates nothing new ---------------------------------------------
def test_a_retry_after_a_lost_answer_links_the_task_the_first_attempt_created(tracker, work, board_client):
    tracker.lose_next_create()
    lost = export(board_client, tracker, work)  # the only container is the default
    assert_error(lost, 502, "provider_status")
    assert lost.json()["details"]["exportId"]
    assert len(tracker.tasks()) == 1  # the tracker did create it; Paperclip does not know
    row = TaskExport.objects.get()
    assert (row.status, row.attempts, row.link_id) == ("failed", 1, None)
    assert "502" in row.error_message
    assert not TaskLink.objects.exists() and not OutboundEffect.objects.exists()
    assert SyncError.objects.filter(instance=tracker.instance, category="provider_status").exists()

    # the task's creation webhook arrives before the retry: it is the export's, not a new issue
    issues_before = Issue.objects.count()
    tracker.forward()
    assert Issue.objects.count() == issues_before and not TaskLink.objects.exists()
    assert "created by the export of" in InboundEvent.objects.filter(kind="task.upserted").first().outcome

    retry = export(board_client, tracker, work)
    assert retry.status_code == 201, retry.content
    [task] = tracker.tasks()
    link = TaskLink.objects.get(issue=work)
    assert link.external_task_id == task.external_id and link.origin_side == "paperclip"
    row.refresh_from_db()
    assert (row.status, row.attempts, row.link_id, row.error_message) == ("linked", 2, link.pk, "")
    assert ActivityLog.objects.get(action="connector.task_exported").details["found"] is True
    assert ActivityLog.objects.filter(action="connector.task_export_failed").count() == 1
    assert tracker.backlinks(link) == [outbound.issue_url(work)]
    tracker.forward()
    assert not Conflict.objects.exists() and Issue.objects.count() == issues_before

    assert export(board_client, tracker, work).status_code == 200
    assert len(tracker.tasks()) == 1


def test_a_new_key_after_a_lost_answer_still_finds_the_task_instead_of_a_second_one(github, work, board_client):
    github.lose_next_create()
    assert export(board_client, github, work, key="first-form").status_code == 502
    again = export(board_client, github, work, key="second-form")  # a fresh form, not the retry button
    assert again.status_code == 201, again.content
    [task] = github.tasks()
    assert TaskLink.objects.get(issue=work).external_task_id == task.external_id
    assert again.json()["attempts"] == 1 and ActivityLog.objects.get(action="connector.task_exported").details["found"]


# --- 3. after the export the link is written to like any write-enabled link -------------------------
def test_the_outbound_engine_writes_an_exported_links_title_and_status(tracker, work, board_user, board_client):
    assert export(board_client, tracker, work).status_code == 201
    link = TaskLink.objects.get(issue=work)
    operator = Actor(user=board_user)
    with tracker.capture(execute=True):
        issue_update(actor=operator, issue=work, changes={"title": "Crash on start (Linux only)"})
    with tracker.capture(execute=True):
        issue_update(actor=operator, issue=Issue.objects.get(pk=work.pk), assignment_wake=False,
                     changes={"status": "in_progress", "assignee_agent_id": AgentFactory(company=work.company).pk})
    task = tracker.task(link)
    assert task.title == "Crash on start (Linux only)"  # Paperclip owns the title of an exported task
    assert task.state.category == "active" and task.state.name.lower() == "in progress"
    written = set(OutboundEffect.objects.filter(link=link, status=OutboundStatus.DONE).values_list("kind", flat=True))
    assert {OutboundKind.BACKLINK, OutboundKind.FIELDS, OutboundKind.STATE} <= written


# --- 4. failures: the one error shape, the export failed, nothing linked -----------------------------
def test_a_provider_failure_fails_the_export_with_no_link_and_a_retry_creates_one_task(github, work, board_client):
    github.sandbox.fail_next(1, "error", status=500)
    failed = export(board_client, github, work)
    error = assert_error(failed, 502, "provider_status")
    assert error["details"]["providerStatus"] == 500 and error["details"]["category"] == "provider_status"
    assert not github.tasks() and not TaskLink.objects.exists() and not OutboundEffect.objects.exists()
    row = TaskExport.objects.get()
    assert row.status == ExportStatus.FAILED and "500" in row.error_message
    failure = ActivityLog.objects.get(action="connector.task_export_failed")
    assert failure.details["exportId"] == row.pk and failure.details["category"] == "provider_status"

    github.sandbox.fail_next(1, "secondary", retry_after=30)  # a rate limit: 503 with when to come back
    limited = export(board_client, github, work)
    assert assert_error(limited, 503, "provider_rate_limited")["details"]["retryAfter"] == 30

    assert export(board_client, github, work).status_code == 201
    assert len(github.tasks()) == 1
    row.refresh_from_db()
    assert (row.status, row.attempts) == ("linked", 3)


def test_an_attempt_in_flight_is_not_repeated_by_a_concurrent_request(github, work, board_client):
    TaskExport.objects.create(company=work.company, instance=github.instance, issue=work, idempotency_key="busy",
                              container=gh.SANDBOX_REPO, attempts=1)  # another request is calling the provider
    assert_error(export(board_client, github, work, key="busy"), 409, "export_in_progress", fields=["exportId"])
    assert not github.tasks()
    # a claim whose worker died (older than the lease) is taken over, looking for its task first
    TaskExport.objects.filter(idempotency_key="busy").update(updated_at=timezone.now() - timedelta(minutes=10))
    assert export(board_client, github, work, key="busy").status_code == 201
    assert len(github.tasks()) == 1


class NoCreateTracker(FakeTrackerAdapter):
    """A provider that reads but cannot create tasks (no ``create_task`` in its capabilities)."""

    provider_key = "fake_readonly_tracker"
    capabilities = Capabilities(operations=FakeTrackerAdapter.capabilities.operations - {"create_task"},
                                state_categories=FakeTrackerAdapter.capabilities.state_categories,
                                signed_webhooks=True, routing_rule_kinds=frozenset({"default_route"}))


if NoCreateTracker.provider_key not in _REGISTRY:
    register(NoCreateTracker)


def readonly_instance(company):
    return instance_create(actor=SYSTEM, company=company, name="read-only tracker",
                           provider_key=NoCreateTracker.provider_key, base_url=FakeStore().base_url,
                           containers=["acme/tracker"], credentials={"value": "t"}, webhook_secret={"value": "s"})


def test_bad_requests_are_refused_with_their_field_before_the_provider_is_called(github, work, company, board_client,
                                                                                  monkeypatch):
    two = _instance("github", github.sandbox, company, monkeypatch, name="two repos",
                    containers=[gh.SANDBOX_REPO, "octo-org/other"])
    url = f"/api/issues/{work.identifier}/connector-links"
    post = lambda body: board_client.post(url, body, format="json")  # noqa: E731
    base = {"instanceId": str(github.instance.pk), "idempotencyKey": "k"}
    assert_error(post({**base, "container": "octo-org/elsewhere"}), 400, "validation_error", fields=["container"])
    assert_error(post({**base, "instanceId": str(two.pk)}), 400, "validation_error", fields=["container"])
    assert_error(post({"instanceId": str(github.instance.pk)}), 400, "validation_error", fields=["idempotencyKey"])
    assert_error(post({**base, "instanceId": str(readonly_instance(company).pk)}), 400, "capability_missing",
                 fields=["instanceId"])
    assert_error(post({**base, "instanceId": "not-an-id"}), 404, "not_found")
    github.instance.status = "paused"
    github.instance.save()
    assert_error(post(base), 409, "connector_paused", fields=["instanceId"])
    github.instance.status = "active"
    github.instance.save()
    assert not TaskExport.objects.exists() and not github.sandbox.requests_to(r"/issues$", "POST")

    assert export(board_client, github, work, key="k").status_code == 201
    other = IssueFactory(company=company, title="Another")
    assert_error(export(board_client, github, other, key="k"), 409, "idempotency_key_reused", fields=["idempotencyKey"])
    assert_error(export(board_client, github, work, key="k2"), 409, "already_linked", fields=["issueId", "linkId"])
    assert len(github.tasks()) == 1


def test_only_board_writers_export(github, work, company, agent_client):
    viewer = MembershipFactory(company=company, role="viewer").user
    client = APIClient()
    client.force_login(viewer)
    assert_error(export(client, github, work), 403, "read_only_role")
    assert agent_client.agent.company_id == company.pk  # an agent of the company: the API is for board users
    assert_error(export(agent_client, github, work), 403)
    assert not github.tasks() and not TaskExport.objects.exists()


# --- 5. the command ---------------------------------------------------------------------------------
def test_the_command_exports_once_per_key(github, work):
    def run(*extra):
        out = StringIO()
        call_command("connector_export_issue", work.identifier, str(github.instance.pk), "--idempotency-key",
                     "cli-1", "--json", *extra, stdout=out)
        return json.loads(out.getvalue())

    with github.capture(execute=True):
        first = run("--container", gh.SANDBOX_REPO)
    assert first["created"] is True and first["externalKey"] == f"{gh.SANDBOX_REPO}#1"
    second = run()
    assert second["created"] is False and second["linkId"] == first["linkId"]
    assert len(github.tasks()) == 1
    with pytest.raises(CommandError, match="container"):
        call_command("connector_export_issue", IssueFactory(company=work.company).identifier,
                     str(github.instance.pk), "--container", "nope/nope", stdout=StringIO())
    with pytest.raises(CommandError, match="No issue"):
        call_command("connector_export_issue", "ZZ-404", str(github.instance.pk), stdout=StringIO())


# --- 6. the console action ---------------------------------------------------------------------------
def test_the_issue_page_exports_to_a_tracker_and_retries_a_failed_export(github, work, company, board_client):
    readonly_instance(company)
    page = board_client.get(f"/issues/{work.identifier}/")
    html = page.content.decode()
    assert page.status_code == 200 and "Export to tracker" in html
    option = f"{github.instance.pk}::{gh.SANDBOX_REPO}"
    assert option in html and "read-only tracker" not in html  # only providers that can create tasks

    action = f"/connectors/issues/{work.identifier}/export/"
    github.sandbox.fail_next(1, "error", status=500)
    with github.capture(execute=True):
        failed = board_client.post(action, {"target": option, "idempotency_key": "console-k"})
    assert failed.status_code == 302 and not TaskLink.objects.exists()
    shown = board_client.get(failed["Location"]).content.decode()
    assert "Export to github tracker failed" in shown and "Retry export" in shown
    row = TaskExport.objects.get()

    with github.capture(execute=True):
        retried = board_client.post(action, {"retry": str(row.pk)})
    assert retried.status_code == 302
    link = TaskLink.objects.get(issue=work)
    assert link.origin_side == "paperclip" and len(github.tasks()) == 1
    assert f"exported to github tracker as {link.external_key}" in board_client.get(retried["Location"]).content.decode()
    with github.capture(execute=True):  # a double submit of the first form: the same key, nothing new
        board_client.post(action, {"target": option, "idempotency_key": "console-k"})
    assert len(github.tasks()) == 1 and TaskExport.objects.count() == 1
    after = board_client.get(f"/issues/{work.identifier}/").content.decode()
    assert option not in after and "Retry export" not in after  # linked: nothing left to export here


def test_viewers_see_no_export_action_and_cannot_post_it(github, work, company):
    viewer = MembershipFactory(company=company, role="viewer").user
    client = APIClient()
    client.force_login(viewer)
    assert "Export to tracker" not in client.get(f"/issues/{work.identifier}/").content.decode()
    response = client.post(f"/connectors/issues/{work.identifier}/export/",
                           {"target": f"{github.instance.pk}::{gh.SANDBOX_REPO}"})
    assert response.status_code == 403 and not github.tasks()
