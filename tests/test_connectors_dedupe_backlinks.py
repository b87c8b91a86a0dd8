"""§6.3 dedupe by the backlinks we write, and the §6.2.3 manual-link comparison, against the GitHub,
Linear and Jira sandboxes over real HTTP: a re-import after an unlink and an import by a second
instance of the same tracker link the issue the task's backlink names instead of creating a
duplicate; a backlink naming another company's issue, or one forged on a task this company never
linked, is not followed; a manual link compares every synced field."""
from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from connectors.choices import ConflictStatus, LinkStatus, OutboundKind, OutboundStatus
from connectors.models import Conflict, OutboundEffect, TaskLink
from connectors.providers.base import ExternalTaskRef
from connectors.sandbox.github import GitHubSandbox
from connectors.sandbox.jira import JiraSandbox
from connectors.sandbox.linear import LinearSandbox
from connectors.services import interventions, polling
from connectors.services.backlinks import issue_identifier_of
from connectors.services.instances import instance_create
from connectors.services.outbound import issue_url
from issues.actors import SYSTEM
from issues.models import ActivityLog, Issue
from tests.factories import AgentFactory, CompanyFactory, IssueFactory
from tests.github_sandbox import DEFAULT_STATE_MAPPING as GITHUB_MAPPING
from tests.github_sandbox import SANDBOX_REPO, SERVICE_LOGIN, github_adapter_for
from tests.jira_sandbox import DEFAULT_STATE_MAPPING as JIRA_MAPPING
from tests.jira_sandbox import SANDBOX_EMAIL, SANDBOX_PROJECT, jira_adapter_for
from tests.linear_sandbox import DEFAULT_STATE_MAPPING as LINEAR_MAPPING
from tests.linear_sandbox import SANDBOX_TEAM, SERVICE_USER, linear_adapter_for
from tests.connector_helpers import delivery_headers

PROVIDERS = ("github", "linear", "jira")
TOKEN = "dedupe-sandbox-token"
HOOK = "dedupe-sandbox-hook"


class Tracker:
    """One provider's sandbox as its users see it, and the webhook hop to any number of instances."""

    def __init__(self, key: str, sandbox, monkeypatch):
        self.key, self.sandbox = key, sandbox
        self._forwarded: dict = {}
        monkeypatch.setenv("PAPERCLIP_SECRET_DEDUPE_TOKEN", sandbox.credentials if key == "jira" else TOKEN)
        monkeypatch.setenv("PAPERCLIP_SECRET_DEDUPE_HOOK", HOOK)

    def instance(self, company, name: str):
        agent = AgentFactory(company=company, name=f"coder-{name}")
        if self.key == "github":
            extra = dict(provider_key="github_issues", containers=[SANDBOX_REPO], state_mapping=GITHUB_MAPPING,
                         service_account_id=SERVICE_LOGIN)
        elif self.key == "linear":
            extra = dict(provider_key="linear", containers=[SANDBOX_TEAM], state_mapping=LINEAR_MAPPING,
                         service_account_id=self.sandbox.service_user["id"])
        else:
            extra = dict(provider_key="jira", containers=[SANDBOX_PROJECT], state_mapping=JIRA_MAPPING,
                         service_account_id=self.sandbox.service_user["accountId"])
        return instance_create(actor=SYSTEM, company=company, name=name, base_url=self.sandbox.base_url,
                               credentials="env:PAPERCLIP_SECRET_DEDUPE_TOKEN",
                               webhook_secret="env:PAPERCLIP_SECRET_DEDUPE_HOOK", triage_agent_id=agent.pk,
                               default_sync_mode="bidirectional",
                               routing_rules=[{"kind": "default_route", "agentId": agent.pk}], **extra)

    def adapter(self):
        return {"github": github_adapter_for, "linear": linear_adapter_for, "jira": jira_adapter_for}[self.key](
            self.sandbox, **({} if self.key == "jira" else {"token": TOKEN}), webhook_secret=HOOK)

    def open(self, title: str) -> ExternalTaskRef:
        if self.key == "github":
            raw = self.sandbox.open_issue(title, "It crashes.", actor="octocat")
            return ExternalTaskRef(str(raw["id"]), f"{SANDBOX_REPO}#{raw['number']}")
        if self.key == "linear":
            raw = self.sandbox.create_issue(title, team=SANDBOX_TEAM, description="It crashes.")
            return ExternalTaskRef(raw["id"], raw["identifier"])
        raw = self.sandbox.create_issue(title, project=SANDBOX_PROJECT, description="It crashes.")
        return ExternalTaskRef(raw["id"], raw["key"])

    def backlink_urls(self, ref: ExternalTaskRef) -> list[str]:
        return self.adapter().find_backlinks(ref)

    def forge_backlink(self, ref: ExternalTaskRef, url: str):
        """A tracker user (not the connector) writes a marker in exactly our format."""
        if self.key == "github":
            number = int(ref.external_key.rsplit("#", 1)[1])
            self.sandbox.comment(number, f"<!-- paperclip:backlink -->\nTracked in Paperclip: {url}", actor="mallory")
        elif self.key == "linear":
            self.sandbox.add_attachment(ref.external_id, url, actor="Mallory", metadata={"paperclip": "backlink"})
        else:
            self.adapter().set_backlink(ref, url)  # anyone with Jira access can add this remote link

    def backlink_reads(self) -> int:
        if self.key == "linear":
            return len(self.sandbox.requests_for("IssueAttachments"))
        return len(self.sandbox.requests_to(r"/comments$" if self.key == "github" else r"/remotelink$", "GET"))

    def forward(self, instance, capture):
        """Deliver every webhook the tracker produced since the last forward to ``instance``."""
        start = self._forwarded.get(instance.pk, 0)
        deliveries = self.sandbox.deliveries[start:]
        self._forwarded[instance.pk] = start + len(deliveries)
        for delivery in deliveries:
            headers = delivery_headers(delivery)
            with capture(execute=True):
                response = APIClient().post(f"/api/connectors/{instance.pk}/webhook", data=delivery.body,
                                            content_type="application/json", **headers)
            assert response.status_code == 202, response.content


@pytest.fixture(params=PROVIDERS)
def tracker(request, monkeypatch):
    key = request.param
    if key == "github":
        sandbox = GitHubSandbox(repos=(SANDBOX_REPO,), token=TOKEN, service_login=SERVICE_LOGIN, webhook_secret=HOOK)
    elif key == "linear":
        sandbox = LinearSandbox(teams=(SANDBOX_TEAM,), token=TOKEN, service_user=SERVICE_USER, webhook_secret=HOOK)
    else:
        sandbox = JiraSandbox(projects=(SANDBOX_PROJECT,), email=SANDBOX_EMAIL, token=TOKEN, webhook_secret=HOOK)
    with sandbox:
        yield Tracker(key, sandbox, monkeypatch)


def imported(tracker, instance, capture, title="Crash on start") -> tuple[ExternalTaskRef, TaskLink]:
    """A human opens a task; the webhook imports it and the backlink is written to the tracker."""
    ref = tracker.open(title)
    tracker.forward(instance, capture)
    link = TaskLink.objects.get(instance=instance, external_task_id=ref.external_id)
    assert OutboundEffect.objects.get(link=link, kind=OutboundKind.BACKLINK).status == OutboundStatus.DONE
    assert tracker.backlink_urls(ref) == [issue_url(link.issue)]
    return ref, link


def unlink(link, key):
    interventions.link_unlink(actor=SYSTEM, link=link, idempotency_key=key)


def linked_by(link) -> dict:
    return ActivityLog.objects.get(action="connector.task_linked", entity_id=str(link.pk)).details


def test_reimport_after_an_unlink_links_the_issue_the_backlink_names(tracker, company,
                                                                     django_capture_on_commit_callbacks):
    instance = tracker.instance(company, "tracker-a")
    ref, first = imported(tracker, instance, django_capture_on_commit_callbacks)
    issue = first.issue
    unlink(first, "unlink-1")
    reads = tracker.backlink_reads()
    with django_capture_on_commit_callbacks(execute=True):
        result = interventions.task_import_manual(actor=SYSTEM, instance=instance, idempotency_key="reimport-1",
                                                  external_task_id=ref.external_id, external_key=ref.external_key)
    assert result["created"] is True and result["issueId"] == str(issue.pk)
    assert Issue.objects.filter(company=company).count() == 1  # no duplicate
    again = TaskLink.objects.get(pk=result["linkId"])
    assert again.issue_id == issue.pk and again.origin_side == "manual_link"
    assert again.status == LinkStatus.HEALTHY and not Conflict.objects.filter(link=again).exists()  # both sides agree
    assert tracker.backlink_reads() > reads  # found through the tracker's backlink, over HTTP
    assert linked_by(again)["dedupe"] == "backlink" and linked_by(again)["divergedFields"] == []
    assert tracker.backlink_urls(ref) == [issue_url(issue)]  # still one backlink


def test_a_second_instance_of_the_same_tracker_links_the_existing_issue(tracker, company,
                                                                        django_capture_on_commit_callbacks):
    first_instance = tracker.instance(company, "tracker-a")
    ref, first = imported(tracker, first_instance, django_capture_on_commit_callbacks)
    second_instance = tracker.instance(company, "tracker-b")
    with django_capture_on_commit_callbacks(execute=True):
        polling.instance_poll(instance_id=second_instance.pk)  # its first poll lists the task
    second = TaskLink.objects.get(instance=second_instance, external_task_id=ref.external_id)
    assert second.issue_id == first.issue_id and Issue.objects.filter(company=company).count() == 1
    assert second.origin_side == "manual_link" and second.status == LinkStatus.HEALTHY
    assert linked_by(second)["dedupe"] == "backlink"
    first.refresh_from_db()
    assert first.status == LinkStatus.HEALTHY  # the first instance's link is untouched


def test_a_backlink_to_another_companys_issue_is_not_followed(tracker, company, django_capture_on_commit_callbacks):
    ours = tracker.instance(company, "tracker-ours")
    ref, first = imported(tracker, ours, django_capture_on_commit_callbacks)
    other_company = CompanyFactory()
    theirs = tracker.instance(other_company, "tracker-theirs")
    with django_capture_on_commit_callbacks(execute=True):
        polling.instance_poll(instance_id=theirs.pk)  # the other company imports the same task
    their_issue = TaskLink.objects.get(instance=theirs).issue
    assert their_issue.company_id == other_company.pk
    assert issue_url(their_issue) in tracker.backlink_urls(ref)  # the task now names the other company's issue
    unlink(first, "unlink-ours")
    with django_capture_on_commit_callbacks(execute=True):
        result = interventions.task_import_manual(actor=SYSTEM, instance=ours, idempotency_key="reimport-ours",
                                                  external_task_id=ref.external_id, external_key=ref.external_key)
    again = TaskLink.objects.get(pk=result["linkId"])
    assert again.issue.company_id == company.pk and again.issue_id != their_issue.pk
    assert again.issue_id == first.issue_id
    # GitHub and Jira keep one backlink (the last writer's: the other company's), so our own attribution
    # finds the issue (§6.3 step 3); Linear keeps one attachment per URL, ours among them.
    assert linked_by(again)["dedupe"] == ("backlink" if tracker.key == "linear" else "reference")
    assert not TaskLink.objects.filter(instance=ours, issue=their_issue).exists()


def test_a_backlink_forged_on_a_task_never_linked_here_is_not_followed(tracker, company,
                                                                       django_capture_on_commit_callbacks):
    instance = tracker.instance(company, "tracker-a")
    target = IssueFactory(company=company, title="Payroll secrets")
    ref = tracker.open("Innocent bug report")
    tracker.forge_backlink(ref, issue_url(target))
    tracker.forward(instance, django_capture_on_commit_callbacks)
    link = TaskLink.objects.get(instance=instance, external_task_id=ref.external_id)
    assert link.issue_id != target.pk and link.origin_side == "external"  # a new issue, not the named one
    assert link.issue.title == "Innocent bug report"
    assert not TaskLink.objects.filter(issue=target).exists()


def test_issue_urls_are_ours_only(settings):
    settings.CONNECTORS = {**settings.CONNECTORS, "PUBLIC_BASE_URL": "https://paperclip.example/app/"}
    assert issue_identifier_of("https://paperclip.example/app/issues/ACME-12") == "ACME-12"
    assert issue_identifier_of("HTTPS://Paperclip.Example/app/issues/ACME-12/") == "ACME-12"
    assert issue_identifier_of("https://other.example/app/issues/ACME-12") is None
    assert issue_identifier_of("https://paperclip.example/issues/ACME-12") is None
    assert issue_identifier_of("https://paperclip.example/app/projects/ACME-12") is None
    assert issue_identifier_of("https://paperclip.example/app/issues/") is None


def test_github_backlinks_are_our_exact_format_only(monkeypatch):
    with GitHubSandbox(repos=(SANDBOX_REPO,), token=TOKEN, service_login=SERVICE_LOGIN, webhook_secret=HOOK) as sb:
        tracker = Tracker("github", sb, monkeypatch)
        adapter = tracker.adapter()
        ref = tracker.open("x")
        number = int(ref.external_key.rsplit("#", 1)[1])
        quoted = ("**Claude via Paperclip** · see\n<!-- paperclip:backlink -->\n"
                  "Tracked in Paperclip: http://127.0.0.1:8000/issues/ACME-9")
        sb.comment(number, quoted, actor=SERVICE_LOGIN)  # a mirrored agent comment quoting the marker
        assert adapter.find_backlinks(ref) == []
        adapter.set_backlink(ref, "http://127.0.0.1:8000/issues/ACME-1")
        adapter.set_backlink(ref, "http://127.0.0.1:8000/issues/ACME-2")  # edited in place
        assert adapter.find_backlinks(ref) == ["http://127.0.0.1:8000/issues/ACME-2"]
        assert quoted in [c["body"] for c in sb.comments_of(number)]  # the mirrored comment was left alone


# --- §6.2.3 manual link: every synced field is compared ----------------------------------------------


@pytest.fixture
def linear(monkeypatch):
    with LinearSandbox(teams=(SANDBOX_TEAM,), token=TOKEN, service_user=SERVICE_USER, webhook_secret=HOOK) as sb:
        yield Tracker("linear", sb, monkeypatch)


def manual_link(instance, issue, ref, key):
    result = interventions.link_manual_create(actor=SYSTEM, instance=instance, issue=issue, idempotency_key=key,
                                              external_task_id=ref.external_id, external_key=ref.external_key)
    return TaskLink.objects.get(pk=result["linkId"])


def test_manual_link_compares_every_synced_field(linear, company):
    from issues.models import Label

    instance = linear.instance(company, "linear-a")
    raw = linear.sandbox.create_issue("Checkout fails", team=SANDBOX_TEAM, description="Card declined.",
                                      state="In Progress", labels=["Bug"], priority=2)  # Linear 2 = high
    ref = ExternalTaskRef(raw["id"], raw["identifier"])
    task = linear.adapter().get_task(ref)
    from connectors.services.content import render_description

    issue = IssueFactory(company=company, title="Checkout broken", description=render_description(task, "linear"),
                         priority="low", status="backlog")
    issue.labels.add(Label.objects.create(company=company, name="Frontend"))
    link = manual_link(instance, issue, ref, "ml-1")
    conflicts = {c.field: (c.paperclip_value, c.external_value) for c in Conflict.objects.filter(
        link=link, status=ConflictStatus.OPEN)}
    assert conflicts == {"title": ("Checkout broken", "Checkout fails"), "priority": ("low", 1),
                         "labels": (["Frontend"], ["bug"]), "state": ("backlog", "active")}
    assert link.status == LinkStatus.CONFLICT  # no winner picked: the issue is as it was
    issue.refresh_from_db()
    assert (issue.title, issue.priority, issue.status) == ("Checkout broken", "low", "backlog")
    assert OutboundEffect.objects.filter(link=link, kind=OutboundKind.BACKLINK).exists()  # the task will point here


def test_manual_link_of_agreeing_records_is_healthy(linear, company):
    from connectors.services.content import render_description, render_title
    from issues.models import Label

    instance = linear.instance(company, "linear-a")
    raw = linear.sandbox.create_issue("Checkout fails", team=SANDBOX_TEAM, description="Card declined.",
                                      state="In Review", labels=["Bug"], priority=2)
    ref = ExternalTaskRef(raw["id"], raw["identifier"])
    task = linear.adapter().get_task(ref)
    issue = IssueFactory(company=company, title=render_title(task), description=render_description(task, "linear"),
                         priority="high", status="in_review")
    issue.labels.add(Label.objects.create(company=company, name="BUG"))
    link = manual_link(instance, issue, ref, "ml-2")
    assert not Conflict.objects.filter(link=link).exists()
    assert link.status == LinkStatus.HEALTHY
