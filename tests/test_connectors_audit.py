"""§14.5 audit and §12.1 logging of the connector engine, against the GitHub sandbox over real HTTP
(and the fake tracker for a failing read): every issue mutation an applied event causes names the
link, the event key and the external actor in the issue's activity; the link's activity lists those
rows, paged; pruning applied events keeps the audit trail; the engine's log lines carry the §12.1
keys for applied, dropped and failed events, outbound outcomes, health entries and polls."""
from __future__ import annotations

import json
import logging
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from connectors.models import InboundEvent, TaskLink
from connectors.services import interventions, polling
from connectors.services.instances import instance_create
from issues.actors import SYSTEM
from issues.models import ActivityLog
from issues.services.activity import activity_context, activity_record
from issues.services.issues import issue_update
from tests.connector_factories import make_instance
from tests.connector_helpers import delivery_headers, post_webhook
from tests.factories import AgentFactory, MembershipFactory
from tests.github_sandbox import (
    DEFAULT_STATE_MAPPING,
    SANDBOX_REPO,
    SANDBOX_TOKEN,
    SANDBOX_WEBHOOK_SECRET,
    SERVICE_LOGIN,
)

ENGINE = "connectors.engine"
KEYS = ("connectorInstanceId", "providerKey", "linkId", "externalTaskId", "externalKey", "issueId", "eventKind",
        "idempotencyKey", "outcome")


@pytest.fixture
def instance(company, github_sandbox, monkeypatch):
    monkeypatch.setenv("PAPERCLIP_SECRET_GH_AUDIT_TOKEN", SANDBOX_TOKEN)
    monkeypatch.setenv("PAPERCLIP_SECRET_GH_AUDIT_HOOK", SANDBOX_WEBHOOK_SECRET)
    coder = AgentFactory(company=company, name="coder")
    return instance_create(
        actor=SYSTEM, company=company, name="sandbox-audit", provider_key="github_issues",
        base_url=github_sandbox.base_url, containers=[SANDBOX_REPO], state_mapping=DEFAULT_STATE_MAPPING,
        credentials="env:PAPERCLIP_SECRET_GH_AUDIT_TOKEN", webhook_secret="env:PAPERCLIP_SECRET_GH_AUDIT_HOOK",
        service_account_id=SERVICE_LOGIN, triage_agent_id=coder.pk, default_sync_mode="bidirectional",
        routing_rules=[{"kind": "default_route", "agentId": coder.pk}])


class Hop:
    """The webhook hop from the sandbox to the instance: forwards what the tracker sent since last time."""

    def __init__(self, sandbox, instance, capture):
        self.sandbox, self.instance, self.capture, self.sent = sandbox, instance, capture, 0

    def forward(self):
        """Until the tracker is quiet: our own writes (the backlink comment) produce deliveries too."""
        while self.sent < len(self.sandbox.deliveries):
            delivery = self.sandbox.deliveries[self.sent]
            self.sent += 1
            headers = delivery_headers(delivery)
            with self.capture(execute=True):
                response = APIClient().post(f"/api/connectors/{self.instance.pk}/webhook", data=delivery.body,
                                            content_type="application/json", **headers)
            assert response.status_code == 202, response.content


def event_key(action: str) -> str:
    """The inbox key of the one event with this provider action (``issues.edited``...)."""
    return InboundEvent.objects.get(action=action).idempotency_key


@pytest.fixture
def hop(github_sandbox, instance, django_capture_on_commit_callbacks):
    return Hop(github_sandbox, instance, django_capture_on_commit_callbacks)


@pytest.fixture
def linked(github_sandbox, instance, hop):
    """octocat opens a task, hubot retitles it, carol comments: three events applied through the link."""
    gh = github_sandbox.open_issue("Crash on start", "It crashes.", actor="octocat")
    hop.forward()
    github_sandbox.edit_issue(gh["number"], title="Crash on start (macOS)", actor="hubot")
    hop.forward()
    github_sandbox.comment(gh["number"], "Same here.", actor="carol")
    hop.forward()
    keys = {"opened": event_key("issues.opened"), "edited": event_key("issues.edited"),
            "commented": InboundEvent.objects.filter(action="issue_comment.created").order_by("-id")[0].idempotency_key}
    return TaskLink.objects.get(instance=instance), gh, keys


def issue_rows(issue, action):
    return list(ActivityLog.objects.filter(entity_type="issue", entity_id=str(issue.pk), action=action))


def test_every_issue_mutation_an_event_causes_names_the_link_the_event_and_the_actor(linked, instance):
    link, gh, keys = linked
    issue = link.issue
    expected = {"source": "connector", "eventSource": "webhook", "connectorInstanceId": str(instance.pk),
                "providerKey": "github_issues", "linkId": str(link.pk), "externalTaskId": link.external_task_id}
    for action, key, login in (("issue.created", keys["opened"], "octocat"),
                               ("issue.updated", keys["edited"], "hubot"),
                               ("comment.created", keys["commented"], "carol")):
        rows = issue_rows(issue, action)
        assert len(rows) == 1, action
        details = rows[0].details
        assert {k: details.get(k) for k in expected} == expected, action
        assert details["eventKey"] == key
        assert details["externalActor"]["displayName"] == login
    assert issue_rows(issue, "issue.updated")[0].details["changes"]  # the row's own details are kept
    # a change made in Paperclip, not through the link, is not attributed to it
    issue_update(actor=SYSTEM, issue=issue, changes={"priority": "high"})
    direct = ActivityLog.objects.filter(entity_id=str(issue.pk), action="issue.updated").order_by("-id").first()
    assert "linkId" not in direct.details and "eventKey" not in direct.details


def test_link_activity_lists_the_issue_rows_caused_through_the_link_paged(linked, company):
    link, _, _ = linked
    issue_update(actor=SYSTEM, issue=link.issue, changes={"priority": "high"})  # not through the link
    api = APIClient()
    api.force_login(MembershipFactory(company=company, role="viewer").user)
    url = f"/api/connector-links/{link.pk}/activity"
    everything = api.get(url, {"limit": 100}).json()
    actions = [(row["entityType"], row["action"]) for row in everything]
    assert ("connector_link", "connector.task_imported") in actions
    assert {("issue", "issue.created"), ("issue", "issue.updated"), ("issue", "comment.created")} <= set(actions)
    issue_rows_listed = [row for row in everything if row["entityType"] == "issue"]
    assert all(row["details"]["linkId"] == str(link.pk) for row in issue_rows_listed)
    assert sum(1 for row in issue_rows_listed if row["action"] == "issue.updated") == 1  # the direct edit is not
    ids = [row["id"] for row in everything]
    pages = [api.get(url, {"limit": 2, "offset": offset}).json() for offset in range(0, len(ids), 2)]
    assert [row["id"] for page in pages for row in page] == ids  # newest first, no row twice or lost
    assert all(len(page) <= 2 for page in pages)


def test_pruning_applied_events_keeps_the_audit_trail(linked, company, settings):
    link, _, keys = linked
    api = APIClient()
    api.force_login(MembershipFactory(company=company, role="viewer").user)
    url = f"/api/connector-links/{link.pk}/activity"
    before = api.get(url, {"limit": 100}).json()
    old = timezone.now() - timedelta(days=int(settings.CONNECTORS.get("EVENT_RETENTION_DAYS", 30)) + 1)
    InboundEvent.objects.filter(instance_id=link.instance_id).update(received_at=old)
    result = polling.retention_prune()
    assert result["events"] >= 3 and not InboundEvent.objects.filter(idempotency_key=keys["edited"]).exists()
    assert api.get(url, {"limit": 100}).json() == before  # every row, with its event key, is still there
    row = issue_rows(link.issue, "issue.updated")[0]
    assert row.details["eventKey"] == keys["edited"] and row.details["linkId"] == str(link.pk)


def test_an_operator_import_names_its_link_and_request(github_sandbox, instance, django_capture_on_commit_callbacks):
    gh = github_sandbox.open_issue("Imported by hand", "Body.", actor="octocat")  # no webhook forwarded
    with django_capture_on_commit_callbacks(execute=True):
        result = interventions.task_import_manual(actor=SYSTEM, instance=instance, idempotency_key="op-import-1",
                                                  external_key=f"{SANDBOX_REPO}#{gh['number']}")
    link = TaskLink.objects.get(pk=result["linkId"])
    [created] = issue_rows(link.issue, "issue.created")
    assert {k: created.details.get(k) for k in ("linkId", "eventKey", "eventSource", "connectorInstanceId")} == {
        "linkId": str(link.pk), "eventKey": "op-import-1", "eventSource": "operator",
        "connectorInstanceId": str(instance.pk)}


def test_activity_context_is_scoped_and_a_rows_own_details_win(company):
    with activity_context(linkId="L1", eventKey="E1"):
        row = activity_record(actor=SYSTEM, company_id=company.pk, action="x.y", entity_type="issue", entity_id="1",
                              details={"eventKey": "own"})
    after = activity_record(actor=SYSTEM, company_id=company.pk, action="x.z", entity_type="issue", entity_id="1")
    assert row.details == {"linkId": "L1", "eventKey": "own"} and after.details == {}


# --- §12.1 log lines ---------------------------------------------------------------------------------


def engine_records(caplog, prefix):
    return [r for r in caplog.records if r.name == ENGINE and r.getMessage().startswith(prefix)]


def assert_keys(record, **expected):
    fields = {k: getattr(record, k) for k in KEYS}
    assert fields == {**fields, **expected}, fields
    assert record.connector["outcome"] == fields["outcome"]
    for key in expected:
        assert f"{key}={expected[key]}" in record.getMessage()


def test_engine_log_lines_carry_the_section_12_1_keys(github_sandbox, instance, hop, caplog):
    caplog.set_level(logging.INFO, logger=ENGINE)
    gh = github_sandbox.open_issue("Crash on start", "It crashes.", actor="octocat")
    hop.forward()
    link = TaskLink.objects.get(instance=instance)
    common = {"connectorInstanceId": str(instance.pk), "providerKey": "github_issues", "linkId": str(link.pk),
              "issueId": str(link.issue_id), "externalTaskId": link.external_task_id}
    applied = engine_records(caplog, "connector event applied")
    assert len(applied) == 1
    assert_keys(applied[0], **common, eventKind="task.upserted", idempotencyKey=event_key("issues.opened"),
                outcome="applied")
    done = engine_records(caplog, "connector outbound backlink done")
    assert len(done) == 1
    assert_keys(done[0], **common, externalKey=link.external_key, eventKind="outbound.backlink", outcome="done")

    interventions.link_pause(actor=SYSTEM, link=link, idempotency_key="pause-1")
    github_sandbox.edit_issue(gh["number"], title="Retitled", actor="hubot")
    caplog.clear()
    hop.forward()
    dropped = [r for r in engine_records(caplog, "connector event dropped")
               if r.idempotencyKey == event_key("issues.edited")]
    assert len(dropped) == 1
    assert_keys(dropped[0], **common, eventKind="task.upserted", outcome="dropped")

    caplog.clear()
    polling.instance_poll(instance_id=instance.pk)
    poll = engine_records(caplog, "connector poll pass")
    assert len(poll) == 1
    assert_keys(poll[0], connectorInstanceId=str(instance.pk), providerKey="github_issues", eventKind="poll")


def test_a_failed_event_and_its_health_entry_log_the_keys(company, caplog, django_capture_on_commit_callbacks):
    caplog.set_level(logging.INFO, logger=ENGINE)
    fake, store = make_instance(company)
    raw = store.add_task(3)
    store.fail_get_task = 1  # the sparse delivery needs a read; the tracker fails it once
    body = json.dumps({"id": "delivery-sparse", "type": "task", "sender": "alice", "container": store.container,
                       "task": {"id": raw["id"]}}).encode()
    assert post_webhook(APIClient(), fake, body, capture=django_capture_on_commit_callbacks).status_code == 202
    assert InboundEvent.objects.get(idempotency_key="delivery-sparse").status == "failed"
    base = {"connectorInstanceId": str(fake.pk), "providerKey": fake.provider_key, "externalTaskId": raw["id"],
            "eventKind": "task.upserted", "idempotencyKey": "delivery-sparse"}
    failed = engine_records(caplog, "connector event failed")
    assert len(failed) == 1 and failed[0].levelno == logging.WARNING
    assert_keys(failed[0], **base, outcome="failed")
    health = engine_records(caplog, "connector health entry")
    assert len(health) == 1
    assert_keys(health[0], **base)
    assert health[0].connector["category"] == health[0].outcome.split(":", 1)[1]
