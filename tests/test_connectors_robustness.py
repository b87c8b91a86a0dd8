"""Robustness on real payloads (issue #16): provider schema drift parks a verified delivery raw and a replay
after an upgrade applies it (§13.1.8); one malformed record in a poll page is reported and skipped while the
rest applies and the cursor moves on (GitHub, Linear and Jira sandboxes over real HTTP); a Jira issue update
that carries a comment applies both; a delivery naming only its task is resolved through the task's link
(§7.1.1); restart recovery runs one pass per instance at worker start (§13.2); the state mapping is checked at
instance creation (§7.2). Real payloads are the unchanged fixtures, signed with each provider's scheme."""
import hashlib
import hmac
import json
import re
import time
import uuid
from io import StringIO
from pathlib import Path
from types import SimpleNamespace

import pytest
from celery.signals import worker_ready
from django.core.management import call_command
from rest_framework.test import APIClient

from connectors.choices import ErrorCategory, LinkStatus
from connectors.models import ConnectorInstance, InboundEvent, SyncCursor, SyncError, TaskLink
from connectors.providers.base import WebhookRejected, WebhookRequest
from connectors.providers.github import GitHubIssuesAdapter
from connectors.providers.linear import LinearAdapter
from connectors.sandbox.github import DEFAULT_FIXTURES_DIR as GITHUB_FIXTURES
from connectors.sandbox.jira import DEFAULT_FIXTURES_DIR as JIRA_FIXTURES
from connectors.sandbox.linear import DEFAULT_FIXTURES_DIR as LINEAR_FIXTURES
from connectors.selectors import instance_health
from connectors.services import polling
from connectors.services.common import adapter_for
from connectors.services.drain import restart_recover
from connectors.services.instances import instance_create
from issues.actors import SYSTEM
from issues.exceptions import InvalidInput
from issues.models import ActivityLog, Comment, Issue
from tests.connector_factories import make_instance
from tests.connector_helpers import post_webhook
from tests.factories import IssueFactory, MembershipFactory
from tests.github_sandbox import DEFAULT_STATE_MAPPING as GITHUB_MAPPING
from tests.github_sandbox import SANDBOX_REPO, SANDBOX_TOKEN, SERVICE_LOGIN
from tests.jira_sandbox import DEFAULT_STATE_MAPPING as JIRA_MAPPING
from tests.jira_sandbox import SANDBOX_PROJECT
from tests.linear_sandbox import DEFAULT_STATE_MAPPING as LINEAR_MAPPING
from tests.linear_sandbox import SANDBOX_TEAM
from tests.linear_sandbox import SANDBOX_TOKEN as LINEAR_TOKEN
from tests.test_errors import assert_error

SECRET = "robustness-test-secret"
REAL_JIRA_EXTRA = Path(__file__).parent / "fixtures" / "providers" / "jira"  # real, unchanged (README there)
LIN_TEAM_ID = "df657590-816b-4754-9518-68e6cc61f275"  # team LIN, as lhc_linearIssueCreated names it
LIN_28 = "6a17c5cc-5188-4487-ab56-44626a9b2daf"  # the issue the lhc comment fixtures are on


def hmac_hex(body: bytes, secret: str = SECRET) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def raw(folder: str, name: str) -> bytes:
    return (Path(folder) / name).read_bytes()


def fresh(body: bytes) -> bytes:
    """A Linear fixture delivered now: the bytes unchanged except a current webhookTimestamp."""
    return re.sub(rb'"webhookTimestamp": \d+', b'"webhookTimestamp": %d' % int(time.time() * 1000), body)


def post(instance, body: bytes, capture, **headers):
    with capture(execute=True):
        return APIClient().post(f"/api/connectors/{instance.pk}/webhook", data=body,
                                content_type="application/json", **headers)


def github_headers(body: bytes, *, event="issues", delivery: str | None = None, secret=SECRET) -> dict:
    headers = {"HTTP_X_GITHUB_EVENT": event, "HTTP_X_HUB_SIGNATURE_256": f"sha256={hmac_hex(body, secret)}"}
    if delivery:
        headers["HTTP_X_GITHUB_DELIVERY"] = delivery
    return headers


def linear_headers(body: bytes, *, delivery: str | None = None) -> dict:
    return {"HTTP_LINEAR_SIGNATURE": hmac_hex(body), **({"HTTP_LINEAR_DELIVERY": delivery} if delivery else {})}


def jira_headers(body: bytes, *, identifier: str | None = None) -> dict:
    headers = {"HTTP_X_HUB_SIGNATURE": f"sha256={hmac_hex(body)}"}
    if identifier:
        headers["HTTP_X_ATLASSIAN_WEBHOOK_IDENTIFIER"] = identifier
    return headers


@pytest.fixture
def hook_secret(monkeypatch):
    monkeypatch.setenv("PAPERCLIP_SECRET_ROBUSTNESS_HOOK", SECRET)
    return "env:PAPERCLIP_SECRET_ROBUSTNESS_HOOK"


@pytest.fixture
def board(company):
    client = APIClient()
    client.force_login(MembershipFactory(company=company, role="owner").user)
    return client


def webhook_instance(company, provider, containers, hook_secret, mapping, name=None):
    return instance_create(actor=SYSTEM, company=company, name=name or f"{provider}-robustness", provider_key=provider,
                           base_url={"github_issues": "https://api.github.invalid", "linear": "https://api.linear.invalid",
                                     "jira": "https://example.atlassian.invalid"}[provider],
                           containers=list(containers), state_mapping=mapping, webhook_secret=hook_secret)


def break_parser(monkeypatch, cls, what="normalize_issue"):
    """This release's parser as an older one: it insists on a key the real payload does not have."""
    def older(*args, **kwargs):
        raise KeyError("a key this payload generation does not have")

    monkeypatch.setattr(cls, what, older)


# --- schema drift: a verified delivery that does not parse (§13.1.8) ---------------------------------------
def test_github_delivery_that_does_not_parse_is_parked_once_and_a_replay_after_an_upgrade_applies_it(
        company, hook_secret, board, monkeypatch, django_capture_on_commit_callbacks):
    instance = webhook_instance(company, "github_issues", ["Codertocat/Hello-World"], hook_secret, GITHUB_MAPPING)
    body = raw(GITHUB_FIXTURES, "issues_opened.payload.json")
    with monkeypatch.context() as old_release:
        break_parser(old_release, GitHubIssuesAdapter)
        answers = [post(instance, body, django_capture_on_commit_callbacks, **github_headers(body, delivery="d-1"))
                   for _ in range(5)]
        assert [a.status_code for a in answers] == [202] * 5
        assert [a.json()["duplicate"] for a in answers] == [False, True, True, True, True]
        event = InboundEvent.objects.get()
        assert answers[0].json() == {"eventId": event.pk, "idempotencyKey": "d-1", "status": "parked",
                                     "duplicate": False}
        assert (event.kind, event.status, event.verified, event.external_task_id) == ("unparsed", "parked", True, "")
        assert bytes(event.raw_body) == body and event.error_category == ErrorCategory.PROVIDER_PAYLOAD
        assert "does not have" in event.error_message and not Issue.objects.exists()
        drift = SyncError.objects.get(instance=instance)
        assert drift.category == ErrorCategory.SCHEMA_DRIFT and drift.event_id == event.pk
        health = instance_health(instance)
        assert health["parkedCount"] == 1 and health["status"] == "degraded"
        assert health["lastError"]["category"] == "schema_drift"
        # replayed before the upgrade: refused, still parked
        refused = board.post(f"/api/connector-events/{event.pk}/replay", {"idempotencyKey": "r-0"}, format="json")
        assert_error(refused, 422, "webhook_unparseable", fields=("error",))
        event.refresh_from_db()
        assert event.status == "parked"
    # after the upgrade (this release's parser), the replay verifies and parses the raw body again
    with django_capture_on_commit_callbacks(execute=True):
        replay = board.post(f"/api/connector-events/{event.pk}/replay", {"idempotencyKey": "r-1"}, format="json")
    assert replay.status_code == 200, replay.content
    assert replay.json()["reparsed"] is True and replay.json()["kind"] == "task.upserted"
    event.refresh_from_db()
    assert (event.kind, event.status, event.idempotency_key) == ("task.upserted", "applied", "d-1")
    link = TaskLink.objects.get(instance=instance)
    assert link.issue.title == json.loads(body)["issue"]["title"] and Issue.objects.count() == 1
    again = board.post(f"/api/connector-events/{event.pk}/replay", {"idempotencyKey": "r-1"}, format="json")
    assert again.json()["replayed"] is True and Issue.objects.count() == 1
    assert ActivityLog.objects.filter(action="connector.event.replay").count() == 1


def test_a_redelivery_that_parses_after_an_upgrade_applies_the_parked_row(
        company, hook_secret, monkeypatch, django_capture_on_commit_callbacks):
    instance = webhook_instance(company, "github_issues", ["Codertocat/Hello-World"], hook_secret, GITHUB_MAPPING)
    body = raw(GITHUB_FIXTURES, "issues_labeled.payload.json")
    with monkeypatch.context() as old_release:
        break_parser(old_release, GitHubIssuesAdapter)
        for _ in range(2):  # no delivery id header: the content hash is the key
            assert post(instance, body, django_capture_on_commit_callbacks, **github_headers(body)).status_code == 202
    event = InboundEvent.objects.get()
    assert event.idempotency_key == "sha256:" + hashlib.sha256(body).hexdigest() and event.status == "parked"
    response = post(instance, body, django_capture_on_commit_callbacks, **github_headers(body))
    assert response.status_code == 202 and response.json()["status"] in ("pending", "applied")
    event.refresh_from_db()
    assert InboundEvent.objects.count() == 1 and (event.kind, event.status) == ("task.upserted", "applied")
    assert TaskLink.objects.filter(instance=instance).count() == 1


def test_connector_replay_command_reparses_with_the_current_code(
        company, hook_secret, monkeypatch, django_capture_on_commit_callbacks):
    instance = webhook_instance(company, "github_issues", ["Codertocat/Hello-World"], hook_secret, GITHUB_MAPPING)
    body = raw(GITHUB_FIXTURES, "issue_comment_created.payload.json")
    with monkeypatch.context() as old_release:
        break_parser(old_release, GitHubIssuesAdapter, "normalize_comment")
        post(instance, body, django_capture_on_commit_callbacks,
             **github_headers(body, event="issue_comment", delivery="c-1"))
    event = InboundEvent.objects.get(kind="unparsed")
    with django_capture_on_commit_callbacks(execute=True):
        call_command("connector_replay", "--instance", str(instance.pk), "--all-parked", stdout=StringIO())
    event.refresh_from_db()
    assert (event.kind, event.status) == ("comment.upserted", "applied"), event.outcome
    link = TaskLink.objects.get(instance=instance)  # the comment's task was imported, then the comment
    assert Comment.objects.filter(issue=link.issue, provenance__kind="external_comment").count() == 1


def test_linear_replay_hours_later_measures_the_timestamp_against_the_arrival(
        company, hook_secret, board, monkeypatch, django_capture_on_commit_callbacks):
    instance = webhook_instance(company, "linear", ["LIN"], hook_secret, LINEAR_MAPPING)
    body = fresh(raw(LINEAR_FIXTURES, "lhc_linearIssueCreated.json"))
    with monkeypatch.context() as old_release:
        break_parser(old_release, LinearAdapter)
        assert post(instance, body, django_capture_on_commit_callbacks,
                    **linear_headers(body, delivery="lin-1")).json()["status"] == "parked"
    event = InboundEvent.objects.get()
    later = time.time() + 3 * 3600
    monkeypatch.setattr("connectors.providers.linear.time", SimpleNamespace(time=lambda: later))
    with pytest.raises(WebhookRejected, match="stale or replayed"):  # the same body, verified as a new delivery
        adapter_for(instance, with_credentials=False, with_webhook_secret=True).verify_webhook(
            WebhookRequest(body=body, headers={"linear-signature": hmac_hex(body)}))
    with django_capture_on_commit_callbacks(execute=True):
        replay = board.post(f"/api/connector-events/{event.pk}/replay", {"idempotencyKey": "lr-1"}, format="json")
    assert replay.status_code == 200, replay.content
    assert TaskLink.objects.get(instance=instance).external_key == "LIN-34"


def test_refusals_stay_refusals_and_store_nothing(company, hook_secret, monkeypatch):
    instance = webhook_instance(company, "github_issues", ["Codertocat/Hello-World"], hook_secret, GITHUB_MAPPING)
    client = APIClient()
    url = f"/api/connectors/{instance.pk}/webhook"
    garbage = b'{"action": "opened", "issue": 7'
    assert_error(client.post(url, data=garbage, content_type="application/json",
                             **github_headers(garbage, secret="forged")), 401)
    deep = raw(GITHUB_FIXTURES, "issues_opened.payload.json")[:-2] + b', "x": ' + b"[" * 100 + b"]" * 100 + b"}"
    assert_error(client.post(url, data=deep, content_type="application/json", **github_headers(deep)), 400,
                 "webhook_unparseable")
    # a Jira connector without a secret takes unsigned hints; an unsigned body that does not parse is refused
    unsigned = instance_create(actor=SYSTEM, company=company, name="jira-unsigned", provider_key="jira",
                               base_url="https://example.atlassian.invalid", containers=["BUG"],
                               state_mapping=JIRA_MAPPING)
    assert_error(client.post(f"/api/connectors/{unsigned.pk}/webhook", data=garbage,
                             content_type="application/json"), 400, "webhook_unparseable")
    assert not InboundEvent.objects.exists() and not SyncError.objects.exists()


# --- one malformed record in a poll page (§13.1.8) ------------------------------------------------------
def _sandbox_instance(company, provider, sandbox, containers, mapping, credentials):
    return instance_create(actor=SYSTEM, company=company, name=f"{provider}-poll", provider_key=provider,
                           base_url=sandbox.base_url, containers=list(containers), state_mapping=mapping,
                           credentials={"value": credentials}, service_account_id=SERVICE_LOGIN)


def _serve_malformed(monkeypatch, sandbox, bad_id, spoil):
    """The sandbox serves one record of its listings in a shape the adapter cannot normalize."""
    render = sandbox.render_issue

    def rendered(issue, *args, **kwargs):
        out = render(issue, *args, **kwargs)
        return spoil(out) if str(out.get("id")) == str(bad_id) else out

    monkeypatch.setattr(sandbox, "render_issue", rendered)


def _assert_skipped_once_and_cursor_past(instance, scope, bad_id, good_keys, capture):
    with capture(execute=True):
        result = polling.instance_poll(instance_id=instance.pk)
    assert result["pages"] >= 1
    assert sorted(TaskLink.objects.filter(instance=instance).values_list("external_key", flat=True)) == good_keys
    entry = SyncError.objects.get(instance=instance, category=ErrorCategory.SCHEMA_DRIFT)
    assert entry.details["recordId"] == str(bad_id) and entry.details["scope"] == scope
    assert "Malformed" in entry.details["reason"] and "skipped" in entry.message
    cursor = SyncCursor.objects.get(instance=instance, scope=f"tasks:{scope}").cursor
    assert cursor
    with capture(execute=True):
        polling.instance_poll(instance_id=instance.pk)  # nothing changed: the cursor is past the bad record
    assert SyncError.objects.filter(instance=instance, category=ErrorCategory.SCHEMA_DRIFT).count() == 1


def test_github_poll_skips_one_malformed_issue(company, github_sandbox, monkeypatch,
                                               django_capture_on_commit_callbacks):
    sb = github_sandbox
    issues = [sb.open_issue(f"Task {n}") for n in range(3)]
    _serve_malformed(monkeypatch, sb, issues[1]["id"], lambda row: {k: v for k, v in row.items() if k != "number"})
    instance = _sandbox_instance(company, "github_issues", sb, [SANDBOX_REPO], GITHUB_MAPPING, SANDBOX_TOKEN)
    _assert_skipped_once_and_cursor_past(instance, SANDBOX_REPO, issues[1]["id"],
                                         sorted(f"{SANDBOX_REPO}#{i['number']}" for i in (issues[0], issues[2])),
                                         django_capture_on_commit_callbacks)
    # repaired upstream and edited: the next poll imports it like any change
    monkeypatch.undo()
    sb.edit_issue(issues[1]["number"], title="Task 1 (fixed)")
    with django_capture_on_commit_callbacks(execute=True):
        polling.instance_poll(instance_id=instance.pk)
    assert TaskLink.objects.filter(instance=instance).count() == 3


def test_linear_poll_skips_one_malformed_issue(company, linear_sandbox, monkeypatch,
                                               django_capture_on_commit_callbacks):
    sb = linear_sandbox
    issues = [sb.create_issue(f"Task {n}", team=SANDBOX_TEAM) for n in range(3)]
    _serve_malformed(monkeypatch, sb, issues[1]["id"], lambda row: {**row, "labels": 7})
    instance = _sandbox_instance(company, "linear", sb, [SANDBOX_TEAM], LINEAR_MAPPING, LINEAR_TOKEN)
    _assert_skipped_once_and_cursor_past(instance, SANDBOX_TEAM, issues[1]["id"],
                                         sorted(i["identifier"] for i in (issues[0], issues[2])),
                                         django_capture_on_commit_callbacks)


def test_jira_poll_skips_one_malformed_issue(company, jira_sandbox, monkeypatch, django_capture_on_commit_callbacks):
    sb = jira_sandbox
    issues = [sb.create_issue(f"Task {n}", project=SANDBOX_PROJECT) for n in range(3)]
    _serve_malformed(monkeypatch, sb, issues[1]["id"], lambda row: {k: v for k, v in row.items() if k != "key"})
    instance = _sandbox_instance(company, "jira", sb, [SANDBOX_PROJECT], JIRA_MAPPING, sb.credentials)
    _assert_skipped_once_and_cursor_past(instance, SANDBOX_PROJECT, issues[1]["id"],
                                         sorted(i["key"] for i in (issues[0], issues[2])),
                                         django_capture_on_commit_callbacks)


# --- a comment carried inside another event type (Jira issue_commented) ----------------------------------
def _external_comments(link):
    return Comment.objects.filter(issue=link.issue, provenance__kind="external_comment")


def test_jira_issue_update_carrying_a_comment_applies_the_update_and_the_comment(
        company, hook_secret, django_capture_on_commit_callbacks):
    instance = webhook_instance(company, "jira", ["BUG"], hook_secret, JIRA_MAPPING)
    created = raw(JIRA_FIXTURES, "zulip_issue_created.json")
    post(instance, created, django_capture_on_commit_callbacks, **jira_headers(created, identifier="wh-1"))
    link = TaskLink.objects.get(instance=instance, external_task_id="10400")
    assert link.external_updated_at.isoformat().startswith("2013-03-27T16:53:58")
    commented = (REAL_JIRA_EXTRA / "zulip_commented_v2.json").read_bytes()
    answers = [post(instance, commented, django_capture_on_commit_callbacks, **jira_headers(commented, identifier="wh-2"))
               for _ in range(5)]
    assert [a.status_code for a in answers] == [202] * 5
    rows = {e.idempotency_key: e for e in InboundEvent.objects.filter(idempotency_key__startswith="wh-2")}
    assert set(rows) == {"wh-2", "wh-2:comment:10400"}
    assert (rows["wh-2"].kind, rows["wh-2"].status) == ("task.upserted", "applied")
    assert (rows["wh-2:comment:10400"].kind, rows["wh-2:comment:10400"].status) == ("comment.upserted", "applied")
    assert rows["wh-2"].pk < rows["wh-2:comment:10400"].pk  # the update first, then its comment
    link.refresh_from_db()
    assert link.external_updated_at.isoformat().startswith("2013-03-27T16:57:45")  # the update applied
    comment = _external_comments(link).get()
    assert "Adding a comment. Oh, what a comment it is!" in comment.body
    assert comment.provenance["externalCommentId"] == "10400"
    # the same delivery again without its identifier (content-hash key), then the edit event: one comment
    post(instance, commented, django_capture_on_commit_callbacks, **jira_headers(commented))
    edited = (REAL_JIRA_EXTRA / "zulip_comment_edited_v2.json").read_bytes()
    post(instance, edited, django_capture_on_commit_callbacks, **jira_headers(edited, identifier="wh-3"))
    assert InboundEvent.objects.get(idempotency_key="wh-3").status == "applied"
    assert InboundEvent.objects.get(idempotency_key="wh-3:comment:10400").status == "dropped"  # nothing new
    assert _external_comments(link).count() == 1


def test_jira_issue_commented_for_a_new_task_imports_the_task_then_the_comment(
        company, hook_secret, django_capture_on_commit_callbacks):
    instance = webhook_instance(company, "jira", ["BUG"], hook_secret, JIRA_MAPPING)
    commented = (REAL_JIRA_EXTRA / "zulip_commented_v2.json").read_bytes()
    assert post(instance, commented, django_capture_on_commit_callbacks,
                **jira_headers(commented, identifier="wh-9")).status_code == 202
    link = TaskLink.objects.get(instance=instance, external_key="BUG-15")
    assert _external_comments(link).count() == 1


# --- deliveries that name only their task (§7.1.1) --------------------------------------------------------
def _link_lin_28(company, instance):
    return TaskLink.objects.create(
        company=company, instance=instance, provider_key=instance.provider_key, issue=IssueFactory(company=company),
        external_task_id=LIN_28, external_key="LIN-28", external_title="Save comments!",
        external_url="https://linear.app/linear-hill-charts/issue/LIN-28", external_state_name="Todo",
        external_state_category="backlog", status=LinkStatus.HEALTHY)


def test_linear_comment_whose_team_cannot_be_told_is_resolved_through_the_task_link(
        company, hook_secret, django_capture_on_commit_callbacks):
    # Containers spelled by team id: the comment's URL names the team by key only, so the payload cannot
    # say whether it is one of ours. Refused while the task is not linked here; accepted once it is.
    instance = webhook_instance(company, "linear", [LIN_TEAM_ID], hook_secret, LINEAR_MAPPING)
    body = fresh(raw(LINEAR_FIXTURES, "lhc_linearCommentCreated.json"))
    refused = post(instance, body, django_capture_on_commit_callbacks, **linear_headers(body, delivery="lc-1"))
    assert_error(refused, 401, "webhook_task_not_linked")
    assert not InboundEvent.objects.exists()
    instance.refresh_from_db()
    assert instance.webhook_rejected_count == 1
    link = _link_lin_28(company, instance)
    accepted = post(instance, body, django_capture_on_commit_callbacks, **linear_headers(body, delivery="lc-1"))
    assert accepted.status_code == 202, accepted.content
    assert InboundEvent.objects.get().status == "applied"
    assert _external_comments(link).get().provenance["externalCommentId"] == "66b59ec2-931e-49b6-9a10-4efeee1603ec"


@pytest.mark.parametrize("containers", [["LIN"], [LIN_TEAM_ID]])
def test_linear_comment_removal_naming_only_data_issue_id(company, hook_secret, containers,
                                                          django_capture_on_commit_callbacks):
    instance = webhook_instance(company, "linear", containers, hook_secret, LINEAR_MAPPING)
    link = _link_lin_28(company, instance)
    created = fresh(raw(LINEAR_FIXTURES, "lhc_linearCommentCreated.json"))
    assert post(instance, created, django_capture_on_commit_callbacks, **linear_headers(created)).status_code == 202
    # The removal of that comment, derived from the real payload: a remove carries the comment's data, whose
    # issue is named by id only (data.issue has no team), and here no issue URL either.
    payload = json.loads(created)
    payload["action"] = "remove"
    payload.pop("url")
    removal = json.dumps(payload).encode()
    assert post(instance, removal, django_capture_on_commit_callbacks, **linear_headers(removal)).status_code == 202
    comment = _external_comments(link).get()
    assert comment.provenance["externalDeleted"] is True
    # once the task is no longer linked here, the same shape is refused and nothing is stored
    TaskLink.objects.filter(pk=link.pk).update(status=LinkStatus.UNLINKED)
    payload["data"]["id"] = str(uuid.uuid4())
    other = json.dumps(payload).encode()
    assert_error(post(instance, other, django_capture_on_commit_callbacks, **linear_headers(other)), 401,
                 "webhook_task_not_linked")
    assert InboundEvent.objects.count() == 2


# --- restart recovery (§13.2) -----------------------------------------------------------------------------
def _pending_event_left_by_a_dead_worker(instance, store, settings):
    task = store.add_task(1)
    body, _ = store.delivery("task", task["id"])
    settings.CONNECTORS = {**settings.CONNECTORS, "KICK_ON_COMMIT": False}  # stored; its kick died with a worker
    assert post_webhook(APIClient(), instance, body).status_code == 202
    settings.CONNECTORS = {**settings.CONNECTORS, "KICK_ON_COMMIT": True}
    return InboundEvent.objects.get(instance=instance)


def test_restart_recovery_runs_one_pass_per_instance_when_two_workers_start(company, settings):
    instance, store = make_instance(company)
    event = _pending_event_left_by_a_dead_worker(instance, store, settings)
    assert event.status == "pending"
    first, second = restart_recover(), restart_recover()  # two workers starting together
    assert (first["instances"], second["instances"], second["skipped"]) == (1, 0, 1)
    event.refresh_from_db()
    assert event.status == "applied" and TaskLink.objects.filter(instance=instance).count() == 1
    assert store.calls["list_candidate_tasks"] >= 1 and store.calls["get_task_states"] == 1  # poll + one pass
    instance.refresh_from_db()
    assert instance.last_reconcile_at is not None and instance.last_poll_at is not None
    # a later restart (past the grace) runs a pass again
    ConnectorInstance.objects.filter(pk=instance.pk).update(last_reconcile_at=instance.last_reconcile_at.replace(
        year=instance.last_reconcile_at.year - 1))
    assert restart_recover()["instances"] == 1 and store.calls["get_task_states"] == 2


def test_restart_poll_resumes_the_stored_cursor(company, github_sandbox, django_capture_on_commit_callbacks):
    sb = github_sandbox
    issues = [sb.open_issue(f"Task {n}") for n in range(3)]
    instance = _sandbox_instance(company, "github_issues", sb, [SANDBOX_REPO], GITHUB_MAPPING, SANDBOX_TOKEN)
    with django_capture_on_commit_callbacks(execute=True):
        polling.instance_poll(instance_id=instance.pk)
    assert InboundEvent.objects.filter(source="poll").count() == 3
    sb.edit_issue(issues[2]["number"], title="Changed while the worker was down")
    with django_capture_on_commit_callbacks(execute=True):
        assert restart_recover()["instances"] == 1
    assert InboundEvent.objects.filter(source="poll").count() == 4  # only the change, from the saved cursor
    assert TaskLink.objects.get(external_key=f"{SANDBOX_REPO}#{issues[2]['number']}").issue.title == \
        "Changed while the worker was down"


@pytest.mark.django_db(transaction=True)  # the worker closes connections left outside autocommit
def test_worker_start_runs_the_recovery_pass(company, settings):
    instance, store = make_instance(company)
    event = _pending_event_left_by_a_dead_worker(instance, store, settings)
    call_command("paperclip_worker", "--once", stdout=StringIO())  # the in-process worker
    event.refresh_from_db()
    assert event.status == "applied" and store.calls["get_task_states"] == 1
    # a Celery worker: worker_ready queues the same pass (eager here); inside the grace it is not repeated
    worker_ready.send(sender=None)
    assert store.calls["get_task_states"] == 1
    ConnectorInstance.objects.filter(pk=instance.pk).update(last_reconcile_at=None)
    worker_ready.send(sender=None)
    assert store.calls["get_task_states"] == 2


# --- state mapping validation at creation (§7.2) ---------------------------------------------------------
def test_state_mapping_is_validated_when_an_instance_is_created(company, board, jira_sandbox,
                                                                django_capture_on_commit_callbacks):
    with pytest.raises(InvalidInput) as refused:
        instance_create(actor=SYSTEM, company=company, name="bad", provider_key="jira", containers=["ABC"],
                        state_mapping={"categories": {"new": "someday"}, "colors": {}})
    assert set(refused.value.details) == {"stateMapping.categories.new", "stateMapping.colors"}
    response = board.post(f"/api/companies/{company.pk}/connectors", {
        "name": "bad", "provider": "github_issues", "containers": ["a/b"], "stateMapping": {"open": "active"}},
        format="json")
    assert_error(response, 400, fields=("stateMapping.closed",))
    assert not ConnectorInstance.objects.exists()
    # shape fine, names wrong for the live workflow: created, then checked against the provider after commit
    with django_capture_on_commit_callbacks(execute=True):
        instance = instance_create(actor=SYSTEM, company=company, name="jira-live", provider_key="jira",
                                   base_url=jira_sandbox.base_url, containers=[SANDBOX_PROJECT],
                                   credentials={"value": jira_sandbox.credentials}, state_mapping={
                                       **JIRA_MAPPING, "projects": {SANDBOX_PROJECT: {"statuses": {"Shipped": "terminal"}}}})
    entry = SyncError.objects.get(instance=instance)
    assert entry.category == ErrorCategory.CONFIG and entry.details["trigger"] == "create"
    assert entry.details["errors"][0]["field"] == f"stateMapping.projects.{SANDBOX_PROJECT}.statuses.Shipped"
    assert instance_health(instance)["lastError"]["category"] == "config"
    assert ActivityLog.objects.get(action="connector.mapping_checked").details["trigger"] == "create"
