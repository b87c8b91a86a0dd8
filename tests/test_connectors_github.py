"""End to end with the real GitHub adapter: every fixture in ../shared/fixtures/providers/github/
replayed through the real webhook endpoint with correct HMAC signatures, plus a session against
the GitHub-compatible sandbox (webhook deliveries, polling and reconciliation over real HTTP)."""
import hashlib
import hmac
import json
import uuid
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from connectors.choices import ConflictKind, EventStatus, LinkStatus
from connectors.sandbox.github import DEFAULT_FIXTURES_DIR
from connectors.models import Conflict, InboundEvent, TaskLink
from connectors.services import polling
from connectors.services.instances import instance_create
from issues.actors import SYSTEM
from issues.models import Comment, Issue
from tests.connector_helpers import delivery_headers
from tests.factories import AgentFactory
from tests.github_sandbox import (
    DEFAULT_STATE_MAPPING,
    SANDBOX_REPO,
    SANDBOX_TOKEN,
    SANDBOX_WEBHOOK_SECRET,
    SERVICE_LOGIN,
)

FIXTURES = Path(DEFAULT_FIXTURES_DIR)  # the real GitHub payloads, copied unchanged into the package
SECRET = "It's a Secret to Everybody"
REPO = "Codertocat/Hello-World"
ALL = sorted(p.name for p in FIXTURES.glob("*.payload.json"))
ORDER = ["issues_opened", "issues_edited", "issues_labeled", "issues_assigned", "issue_comment_created",
         "issue_comment_edited", "issues_unassigned", "issues_unlabeled", "issues_reopened", "issues_deleted"]


def signature(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def test_signature_scheme_matches_the_published_test_vector():
    assert signature("It's a Secret to Everybody", b"Hello, World!") == \
        "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"


@pytest.fixture
def agents(company):
    return {"triage": AgentFactory(company=company, name="triage"), "coder": AgentFactory(company=company,
                                                                                         name="coder"),
            "fixer": AgentFactory(company=company, name="bug-fixer")}


@pytest.fixture
def instance(company, agents, monkeypatch):
    monkeypatch.setenv("PAPERCLIP_SECRET_GH_FIXTURE_HOOK_SECRET", SECRET)
    return instance_create(
        actor=SYSTEM, company=company, name="hello-world", provider_key="github_issues",
        base_url="https://api.github.invalid", containers=[REPO], state_mapping=DEFAULT_STATE_MAPPING,
        webhook_secret="env:PAPERCLIP_SECRET_GH_FIXTURE_HOOK_SECRET", triage_agent_id=agents["triage"].pk,
        routing_rules=[{"kind": "label", "match": {"label": "bug"}, "agentId": agents["fixer"].pk},
                       {"kind": "user_mapping", "match": {"login": "Codertocat"}, "agentId": agents["coder"].pk}])


def fixture_body(name: str) -> bytes:
    return (FIXTURES / (name if name.endswith(".json") else f"{name}.payload.json")).read_bytes()


def deliver(instance, name, capture, *, delivery=None, secret=SECRET, body=None):
    body = body if body is not None else fixture_body(name)
    event = "issue_comment" if name.startswith("issue_comment") else "issues"
    headers = {"HTTP_X_GITHUB_EVENT": event, "HTTP_X_GITHUB_DELIVERY": delivery or str(uuid.uuid4()),
               "HTTP_USER_AGENT": "GitHub-Hookshot/test"}
    if secret is not None:
        headers["HTTP_X_HUB_SIGNATURE_256"] = signature(secret, body)
    with capture(execute=True):
        return APIClient().post(f"/api/connectors/{instance.pk}/webhook", data=body,
                                content_type="application/json", **headers)


def test_fixture_directory_is_complete():
    assert len(ALL) == 10 and {f"{n}.payload.json" for n in ORDER} == set(ALL)


@pytest.mark.parametrize("name", ALL)
def test_each_fixture_alone_through_the_endpoint_five_times(instance, agents, name,
                                                            django_capture_on_commit_callbacks):
    payload = json.loads(fixture_body(name))
    delivery = str(uuid.uuid4())
    answers = [deliver(instance, name, django_capture_on_commit_callbacks, delivery=delivery) for _ in range(5)]
    assert [a.status_code for a in answers] == [202] * 5, answers[0].content
    assert InboundEvent.objects.filter(instance=instance).count() == 1
    event = InboundEvent.objects.get(instance=instance)
    assert event.idempotency_key == delivery and event.verified
    issue_id = str(payload["issue"]["id"])
    if name == "issues_deleted.payload.json":
        assert event.status == EventStatus.DROPPED  # never linked: nothing to delete, nothing created
        assert not Issue.objects.exists() and not TaskLink.objects.exists()
        return
    assert event.status == EventStatus.APPLIED, event.outcome
    link = TaskLink.objects.get(instance=instance, external_task_id=issue_id)
    issue = link.issue
    assert Issue.objects.count() == 1
    assert link.external_key == f"{REPO}#1" and link.external_url == payload["issue"]["html_url"]
    assert issue.title == payload["issue"]["title"]
    assert payload["issue"]["html_url"] in issue.description
    assert issue.origin_kind == "connector"
    assert issue.assignee_agent == agents["fixer"]  # label "bug" wins over the user mapping
    assert link.status == LinkStatus.HEALTHY
    comments = Comment.objects.filter(issue=issue, provenance__kind="external_comment")
    if name.startswith("issue_comment"):
        comment = comments.get()
        assert comment.provenance["externalCommentId"] == str(payload["comment"]["id"])
        assert comment.provenance["url"] == payload["comment"]["html_url"]
        assert comment.provenance["actor"]["displayName"] == "Codertocat"
        assert comment.author_type == "external"
    else:
        assert not comments.exists()


def test_fixtures_in_order_build_the_right_state(instance, agents, django_capture_on_commit_callbacks):
    for name in ORDER:
        response = deliver(instance, name, django_capture_on_commit_callbacks)
        assert response.status_code == 202, (name, response.content)
    events = list(InboundEvent.objects.filter(instance=instance).order_by("id"))
    assert len(events) == 10 and all(e.status in ("applied", "dropped") for e in events), \
        [(e.action, e.status, e.outcome) for e in events]
    link = TaskLink.objects.get(instance=instance)
    assert Issue.objects.count() == 1
    comments = Comment.objects.filter(issue=link.issue, provenance__kind="external_comment")
    assert comments.count() == 1  # created, then edited in place
    edited = json.loads(fixture_body("issue_comment_edited"))["comment"]["body"]
    assert edited.strip().splitlines()[0] in comments.get().body
    assert link.status == LinkStatus.CONFLICT and link.status_detail == "external task deleted"
    assert Conflict.objects.filter(link=link, kind=ConflictKind.DELETION, status="open").count() == 1
    assert link.issue.status not in ("cancelled", "done")
    assert link.external_state_category == "backlog"


@pytest.mark.parametrize("how", ["missing", "forged", "wrong-secret"])
def test_github_bad_signatures_are_401_and_store_nothing(instance, how, django_capture_on_commit_callbacks):
    body = fixture_body("issues_opened")
    if how == "missing":
        response = deliver(instance, "issues_opened", django_capture_on_commit_callbacks, secret=None)
    elif how == "wrong-secret":
        response = deliver(instance, "issues_opened", django_capture_on_commit_callbacks, secret="nope")
    else:
        tampered = body.replace(b"Spelling error in the README file", b"Wire the money")
        headers = {"HTTP_X_GITHUB_EVENT": "issues", "HTTP_X_GITHUB_DELIVERY": "x",
                   "HTTP_X_HUB_SIGNATURE_256": signature(SECRET, body)}
        response = APIClient().post(f"/api/connectors/{instance.pk}/webhook", data=tampered,
                                    content_type="application/json", **headers)
    assert response.status_code == 401
    assert not InboundEvent.objects.exists() and not Issue.objects.exists()
    instance.refresh_from_db()
    assert instance.webhook_rejected_count == 1


def test_github_oversized_body_is_413(instance, settings, django_capture_on_commit_callbacks):
    settings.CONNECTORS = {**settings.CONNECTORS, "WEBHOOK_MAX_BODY_BYTES": 4096}
    body = fixture_body("issues_opened")
    assert len(body) > 4096
    assert deliver(instance, "issues_opened", django_capture_on_commit_callbacks).status_code == 413
    assert not InboundEvent.objects.exists()


def test_delivery_for_another_repository_is_rejected(instance, django_capture_on_commit_callbacks):
    payload = json.loads(fixture_body("issues_opened"))
    payload["repository"]["full_name"] = "someone/else"
    body = json.dumps(payload).encode()
    response = deliver(instance, "issues_opened", django_capture_on_commit_callbacks, body=body)
    assert response.status_code == 401
    assert not InboundEvent.objects.exists()


# --- against the GitHub-compatible sandbox (real HTTP) -------------------------------------------


@pytest.fixture
def sandbox_instance(company, agents, github_sandbox, monkeypatch):
    monkeypatch.setenv("PAPERCLIP_SECRET_GH_SANDBOX_TOKEN", SANDBOX_TOKEN)
    monkeypatch.setenv("PAPERCLIP_SECRET_GH_SANDBOX_HOOK", SANDBOX_WEBHOOK_SECRET)
    return instance_create(
        actor=SYSTEM, company=company, name="sandbox", provider_key="github_issues",
        base_url=github_sandbox.base_url, containers=[SANDBOX_REPO], state_mapping=DEFAULT_STATE_MAPPING,
        credentials="env:PAPERCLIP_SECRET_GH_SANDBOX_TOKEN", webhook_secret="env:PAPERCLIP_SECRET_GH_SANDBOX_HOOK",
        service_account_id=SERVICE_LOGIN, triage_agent_id=agents["triage"].pk,
        routing_rules=[{"kind": "label", "match": {"label": "pc:agent/*"}}])


def forward(sandbox, instance, capture, start=0):
    """Hand the sandbox's signed deliveries to the webhook endpoint, exactly as sent."""
    out = []
    for delivery in sandbox.deliveries[start:]:
        headers = delivery_headers(delivery)
        with capture(execute=True):
            out.append(APIClient().post(f"/api/connectors/{instance.pk}/webhook", data=delivery.body,
                                        content_type="application/json", **headers))
    return out


def test_sandbox_session_webhooks_echo_suppression_poll_and_reconcile(
        sandbox_instance, github_sandbox, agents, django_capture_on_commit_callbacks):
    sb = github_sandbox
    issue = sb.open_issue("Crash on start", "It crashes. cc @octocat", labels=["pc:agent/coder"])
    sb.comment(issue["number"], "Any update?", actor="octocat")
    sb.comment(issue["number"], "Progress: plan ready", actor=SERVICE_LOGIN)  # our own echo
    responses = forward(sb, sandbox_instance, django_capture_on_commit_callbacks)
    assert all(r.status_code == 202 for r in responses), [r.content for r in responses]
    link = TaskLink.objects.get(instance=sandbox_instance)
    assert link.issue.assignee_agent == agents["coder"]
    imported = Comment.objects.filter(issue=link.issue, provenance__kind="external_comment")
    assert [c.provenance["actor"]["displayName"] for c in imported] == ["octocat"]
    echo = InboundEvent.objects.filter(outcome__contains="echo")
    assert echo.count() == 1
    # Polling backstop over real HTTP: a change made while webhooks were lost still arrives.
    seen = len(sb.deliveries)
    sb.edit_issue(issue["number"], title="Crash on start (repro attached)")
    with django_capture_on_commit_callbacks(execute=True):
        polling.instance_poll(instance_id=sandbox_instance.pk)
    link.refresh_from_db()
    assert link.issue.title == "Crash on start (repro attached)"
    # Reconciliation: a deletion nobody told us about becomes a deletion conflict.
    sb.delete_issue(issue["number"])
    with django_capture_on_commit_callbacks(execute=True):
        result = polling.instance_reconcile(instance_id=sandbox_instance.pk)
    assert result["links"] == 1
    link.refresh_from_db()
    assert link.status == LinkStatus.CONFLICT
    assert Issue.objects.filter(pk=link.issue_id).exists()
    lost = sb.deliveries[seen:]  # the edit's and the deletion's webhooks: recorded, never sent to us
    assert len(lost) >= 2 and not any(d.delivered for d in lost)
