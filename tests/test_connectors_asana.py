"""Asana end to end (Appendix A.3): deliveries through the REAL webhook endpoint, round trips against the
Asana sandbox over real HTTP, polling with cursors, the Symphony profile and webhook registration.

Asana publishes no webhook payload files (there are none among the real payloads in connectors/sandbox/fixtures/): every
delivery here is built by the sandbox from the event shape Asana documents (developers.asana.com, the
"Webhooks" guide and the EventResponse schema) and signed as Asana signs (``X-Hook-Signature`` = hex
HMAC-SHA256 of the raw body with the webhook's handshake secret)."""
from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from rest_framework.test import APIClient

from connectors.choices import ConflictKind, LinkStatus, OutboundKind, OutboundStatus
from connectors.models import Conflict, ConnectorInstance, InboundEvent, OutboundEffect, SyncError, TaskLink
from connectors.providers.asana import BACKLINK_MARKER
from connectors.providers.base import ExternalTaskRef
from connectors.sandbox.asana import sign
from connectors.services import outbound, polling
from connectors.services.common import adapter_for
from connectors.services.conflicts import conflict_resolve
from connectors.services.instances import instance_create
from issues.actors import SYSTEM, Actor
from issues.models import Issue, WakeupRequest
from tests.asana_sandbox import SANDBOX_PROJECT, SANDBOX_TOKEN, SANDBOX_WEBHOOK_SECRET, make_sandbox
from tests.factories import AgentFactory, MembershipFactory
from tests.connector_helpers import agent_opens_pr, external_comments, update

MAPPING = {"completed": "terminal",
           "sections": {"To do": "backlog", "In Progress": "active", "Review": "review", "Done": "terminal"}}


@pytest.fixture
def agents(company):
    return {name: AgentFactory(company=company, name=name, status="idle")
            for name in ("triage", "coder", "fixer", "reviewer", "web")}


@pytest.fixture
def sandbox():
    with make_sandbox() as sb:
        yield sb


def build(company, sandbox, agents, monkeypatch, *, rules=None, webhook_secret=True, **extra):
    monkeypatch.setenv("PAPERCLIP_SECRET_ASANA_TOKEN", SANDBOX_TOKEN)
    monkeypatch.setenv("PAPERCLIP_SECRET_ASANA_HOOK", SANDBOX_WEBHOOK_SECRET)
    return instance_create(
        actor=SYSTEM, company=company, name=extra.pop("name", "asana-launch"), provider_key="asana",
        base_url=sandbox.api_url, containers=[sandbox.project_gid(SANDBOX_PROJECT)],
        state_mapping=extra.pop("state_mapping", MAPPING), credentials="env:PAPERCLIP_SECRET_ASANA_TOKEN",
        webhook_secret="env:PAPERCLIP_SECRET_ASANA_HOOK" if webhook_secret else None,
        service_account_id=sandbox.service_user["gid"], triage_agent_id=agents["triage"].pk,
        default_sync_mode="bidirectional",
        routing_rules=rules or [{"kind": "default_route", "agentId": agents["coder"].pk}], **extra)


class Tracker:
    """The sandbox as its users see it, plus the webhook hop to the real endpoint."""

    def __init__(self, sandbox, instance, capture):
        self.sandbox, self.instance, self.capture = sandbox, instance, capture
        self.project = sandbox.project_gid(SANDBOX_PROJECT)
        self._forwarded = 0

    def post(self, delivery, *, scope=None, body=None, signature=None):
        body = delivery.body if body is None else body
        headers = {"HTTP_X_HOOK_SIGNATURE": signature if signature is not None else
                   delivery.headers.get("X-Hook-Signature", "")}
        url = f"/api/connectors/{self.instance.pk}/webhook" + (f"?scope={scope}" if scope else "")
        with self.capture(execute=True):
            return APIClient().post(url, data=body, content_type="application/json", **headers)

    def pending(self):
        return self.sandbox.deliveries[self._forwarded:]

    def forward(self):
        deliveries = self.pending()
        self._forwarded += len(deliveries)
        responses = [self.post(d) for d in deliveries]
        assert all(r.status_code == 202 for r in responses), [r.content for r in responses]
        return deliveries

    def drop(self):
        self._forwarded = len(self.sandbox.deliveries)

    def open(self, name="Crash on start", **kwargs) -> str:
        return self.sandbox.create_task(name, project=self.project, notes="It crashes.", **kwargs)["gid"]

    def link(self, gid) -> TaskLink:
        return TaskLink.objects.get(instance=self.instance, external_task_id=gid)


@pytest.fixture
def tracker(company, sandbox, agents, monkeypatch, django_capture_on_commit_callbacks, settings):
    settings.CONNECTORS = {**settings.CONNECTORS, "RETRY_BASE_SECONDS": 0.0, "PUBLIC_BASE_URL": "http://testserver"}
    instance = build(company, sandbox, agents, monkeypatch)
    return Tracker(sandbox, instance, django_capture_on_commit_callbacks)


def linked(tracker, name="Crash on start"):
    gid = tracker.open(name)
    tracker.forward()
    link = tracker.link(gid)
    tracker.forward()  # the backlink comment's echo
    return gid, link


# --- one POST, several events, delivered 5x -----------------------------------------------------------------
def test_a_batch_for_two_tasks_is_applied_once_each_in_order_per_task_delivered_five_times(tracker, agents):
    sb = tracker.sandbox
    with sb.batch():
        a = tracker.open("Login broken")
        b = tracker.open("Logo blurry")
        sb.move_task(a, "In Progress")
        sb.update_task(b, name="Logo blurry on retina")
        sb.add_comment(a, "Seen on 2.3 too", actor="Carol")
        sb.move_task(b, "Review", actor="Carol")
    [delivery] = tracker.pending()
    entries = delivery.payload["events"]
    assert len(entries) == 10  # 2 + 2 created, 2 moved, 1 renamed, 1 comment, 2 moved
    responses = [tracker.post(delivery) for _ in range(5)]
    assert [r.status_code for r in responses] == [202] * 5
    assert [r.json()["duplicate"] for r in responses] == [False, True, True, True, True]
    events = list(InboundEvent.objects.filter(instance=tracker.instance).order_by("id"))
    # one row per entry, ever, in the order of the POST, each under its own content key
    assert len(events) == 10 and len({e.idempotency_key for e in events}) == 10
    assert [e.external_task_id for e in events] == [
        x["resource"]["gid"] if x["resource"]["resource_type"] == "task" else x["parent"]["gid"] for x in entries]
    assert all(e.status in ("applied", "dropped") and e.attempts == 1 for e in events), \
        [(e.action, e.status, e.outcome) for e in events]
    for gid in (a, b):
        mine = [e for e in events if e.external_task_id == gid]
        # in order per task: the task's first entry is the one that imported it (any later one applied first
        # would have imported it instead), and every one applied at its first attempt
        assert "imported" in mine[0].outcome and not any("imported as" in e.outcome for e in mine[1:])
        assert all(e.applied_at >= prev.applied_at for prev, e in zip(mine, mine[1:]))
    link_a, link_b = tracker.link(a), tracker.link(b)
    assert link_a.issue.title.endswith("Login broken") and link_a.external_state_name == "In Progress"
    assert link_b.issue.title.endswith("Logo blurry on retina") and link_b.external_state_name == "Review"
    [comment] = external_comments(link_a.issue)
    assert "Seen on 2.3 too" in comment.body and comment.provenance["actor"]["displayName"] == "Carol"
    comment_event = next(e for e in events if e.kind == "comment.upserted")
    assert comment_event.verification == "signature" and comment_event.verified
    assert Issue.objects.filter(company=tracker.instance.company).count() == 2


def test_a_heartbeat_is_accepted_and_changes_nothing(tracker):
    [beat] = tracker.sandbox.heartbeat()
    first, again = tracker.post(beat), tracker.post(beat)
    assert (first.status_code, again.status_code) == (202, 202)
    assert (first.json()["duplicate"], again.json()["duplicate"]) == (False, True)
    [event] = InboundEvent.objects.filter(instance=tracker.instance)
    assert event.kind == "ignored" and event.external_task_id == "" and event.action == "heartbeat"
    assert not TaskLink.objects.exists() and not Issue.objects.exists()


@pytest.mark.parametrize("how", ["forged", "missing", "wrong-secret", "tampered"])
def test_bad_signatures_are_401_and_store_nothing(tracker, how):
    tracker.open()
    [delivery] = tracker.pending()
    body = delivery.body
    if how == "forged":
        response = tracker.post(delivery, signature="0" * 64)
    elif how == "missing":
        response = tracker.post(delivery, signature="")
    elif how == "wrong-secret":
        response = tracker.post(delivery, signature=sign("not-the-secret", body))
    else:
        response = tracker.post(delivery, body=body.replace(b'"added"', b'"deleted"', 1))
    assert response.status_code == 401
    assert not InboundEvent.objects.exists() and not TaskLink.objects.exists()
    tracker.instance.refresh_from_db()
    assert tracker.instance.webhook_rejected_count == 1


def test_a_delivery_naming_another_project_is_refused(tracker):
    other = tracker.sandbox.add_project("Marketing")["gid"]
    gid = tracker.sandbox.create_task("Elsewhere", project=other)["gid"]
    delivery = tracker.pending()[-1]
    response = tracker.post(delivery, scope=other)  # parent null events would belong to Marketing
    assert response.status_code == 401 and not InboundEvent.objects.exists()
    assert not TaskLink.objects.filter(external_task_id=gid).exists()


# --- the handshake through the real view --------------------------------------------------------------------
def test_the_x_hook_secret_handshake_through_the_view_then_signed_deliveries(
        company, sandbox, agents, monkeypatch, django_capture_on_commit_callbacks, settings):
    from connectors.services.webhook_setup import handshake_window_open

    settings.CONNECTORS = {**settings.CONNECTORS, "PUBLIC_BASE_URL": "http://testserver"}
    instance = build(company, sandbox, agents, monkeypatch, webhook_secret=False)
    project = sandbox.project_gid(SANDBOX_PROJECT)
    url = f"/api/connectors/{instance.pk}/webhook?scope={project}"

    def handshake(secret, where=url):
        return APIClient().post(where, data=b"", content_type="application/json", HTTP_X_HOOK_SECRET=secret)

    # nobody is registering a webhook for this project: a stranger's handshake stores nothing
    refused = handshake("bad" * 10)
    assert refused.status_code == 409 and "X-Hook-Secret" not in refused
    instance.refresh_from_db()
    assert instance.webhook_registrations == [] and not instance.last_handshake_at
    # the instance's own window is for an unscoped secret only: a project's needs its registration under way
    handshake_window_open(actor=Actor(user=MembershipFactory(company=company, role="owner").user), instance=instance)
    assert handshake("bad" * 10).status_code == 409
    # while connector_register_webhooks creates this project's webhook (the window it opens for that project:
    # see test_webhooks_register_performs_the_handshake_and_deliveries_verify for the whole call), Asana's
    # handshake is echoed and stored, once
    ConnectorInstance.objects.filter(pk=instance.pk).update(webhook_registrations=[{
        "scope": project, "externalId": "", "callbackUrl": f"http://testserver{url}", "active": False,
        "handshakeUntil": (timezone.now() + timedelta(minutes=1)).isoformat()}])
    response = handshake("f00d" * 16)
    assert response.status_code == 200 and response["X-Hook-Secret"] == "f00d" * 16
    assert handshake("bad" * 10).status_code == 409  # a second one, racing the provider
    instance.refresh_from_db()
    [registration] = instance.webhook_registrations
    assert registration["scope"] == project and registration["secretRef"] and instance.last_handshake_at
    assert not InboundEvent.objects.exists()
    # deliveries of that webhook are signed with the handshake secret (and only that)
    tracker = Tracker(sandbox, instance, django_capture_on_commit_callbacks)
    gid = tracker.open()
    delivery = tracker.pending()[-1]
    body = delivery.body
    assert tracker.post(delivery, scope=project, signature=sign("bad" * 10, body)).status_code == 401
    assert tracker.post(delivery, scope=project, signature=sign("f00d" * 16, body)).status_code == 202
    assert tracker.link(gid).issue.title.endswith("Crash on start")


def test_the_first_unscoped_handshake_becomes_the_connectors_secret(
        company, sandbox, agents, monkeypatch, django_capture_on_commit_callbacks, settings):
    settings.CONNECTORS = {**settings.CONNECTORS, "PUBLIC_BASE_URL": "http://testserver"}
    instance = build(company, sandbox, agents, monkeypatch, webhook_secret=False)
    url = f"/api/connectors/{instance.pk}/webhook"
    first = APIClient().post(url, data=b"", content_type="application/json", HTTP_X_HOOK_SECRET="cafe" * 16)
    assert first.status_code == 200 and first["X-Hook-Secret"] == "cafe" * 16
    instance.refresh_from_db()
    assert instance.webhook_secret_ref
    second = APIClient().post(url, data=b"", content_type="application/json", HTTP_X_HOOK_SECRET="beef" * 16)
    assert second.status_code == 409  # never replaced by a stranger's
    tracker = Tracker(sandbox, instance, django_capture_on_commit_callbacks)
    tracker.open()
    delivery = tracker.pending()[-1]
    assert tracker.post(delivery, signature=sign("beef" * 16, delivery.body)).status_code == 401
    assert tracker.post(delivery, signature=sign("cafe" * 16, delivery.body)).status_code == 202


# --- round trips against the sandbox ----------------------------------------------------------------------------
def test_import_routes_by_tag_section_and_custom_field(company, sandbox, agents, monkeypatch,
                                                       django_capture_on_commit_callbacks, settings):
    settings.CONNECTORS = {**settings.CONNECTORS, "PUBLIC_BASE_URL": "http://testserver"}
    rules = [{"kind": "state_lane", "match": {"state": "Review"}, "agentId": agents["reviewer"].pk},
             {"kind": "label", "match": {"label": "bug"}, "agentId": agents["fixer"].pk},
             {"kind": "custom_field", "match": {"field": "cf-team", "value": "Web"}, "agentId": agents["web"].pk},
             {"kind": "default_route", "agentId": agents["coder"].pk}]
    instance = build(company, sandbox, agents, monkeypatch, rules=rules)
    tracker = Tracker(sandbox, instance, django_capture_on_commit_callbacks)
    review = tracker.open("Check copy", section="Review")
    bug = tracker.open("Crash", tags=["Bug"])
    web = tracker.open("Landing page", custom_fields=[{"gid": "cf-team", "name": "Team", "display_value": "Web"}])
    plain = tracker.open("Something")
    tracker.forward()
    got = {gid: tracker.link(gid).issue for gid in (review, bug, web, plain)}
    assert got[review].assignee_agent == agents["reviewer"]  # the section is the lane
    assert got[bug].assignee_agent == agents["fixer"]
    assert got[web].assignee_agent == agents["web"]
    assert got[plain].assignee_agent == agents["coder"]
    assert (tracker.link(review).external_state_name, tracker.link(review).external_state_category) == \
        ("Review", "review")
    # the sparse events were read back with the routed custom field asked for
    reads = sandbox.requests_to(rf"^/tasks/{web}$", "GET")
    assert reads and "custom_fields.display_value" in reads[0].query["opt_fields"][0]


def test_comments_in_and_out_with_echo_suppression(tracker, agents):
    gid, link = linked(tracker)
    # the backlink: a marked comment story, found again by find_backlinks (§6.3 dedupe)
    assert adapter_for(tracker.instance).find_backlinks(ExternalTaskRef(gid)) == [outbound.issue_url(link.issue)]
    assert any(BACKLINK_MARKER in c["text"] for c in tracker.sandbox.comments_of(gid))
    assert not external_comments(link.issue).exists()  # its echo was dropped
    # in: a person's comment (the delivery has only ids: the text is read back)
    story = tracker.sandbox.add_comment(gid, "Happens on every start", actor="Carol")
    tracker.forward()
    [imported] = external_comments(link.issue)
    assert "Happens on every start" in imported.body and imported.provenance["externalCommentId"] == story["gid"]
    # out: a milestone (the agent opened a PR), posted by the service account with the effect marker
    agent_opens_pr(tracker, agents["coder"], link.issue)
    effect = OutboundEffect.objects.get(link=link, kind=OutboundKind.COMMENT, source_id__startswith="artifact:")
    assert effect.status == OutboundStatus.DONE
    [posted] = [c for c in tracker.sandbox.comments_of(gid) if f"paperclip:effect:{effect.pk}" in c["text"]]
    assert posted["created_by"]["gid"] == tracker.sandbox.service_user["gid"] and "PR opened" in posted["text"]
    before = set(InboundEvent.objects.values_list("pk", flat=True))
    tracker.forward()
    echoes = InboundEvent.objects.exclude(pk__in=before)
    assert [e.outcome for e in echoes] == ["the connector's own comment (echo)"]
    assert external_comments(link.issue).count() == 1
    # a person deletes their comment: the imported copy is marked deleted
    tracker.sandbox.delete_comment(story["gid"])
    tracker.forward()
    imported.refresh_from_db()
    assert imported.provenance["externalDeleted"] is True  # recorded; the host comment is kept


def test_state_projection_moves_sections_and_completes_with_closure_permitted(tracker):
    gid, link = linked(tracker)
    issue = update(tracker, link.issue, status="in_progress")
    assert tracker.sandbox.section_of(gid) == "In Progress"
    effect = OutboundEffect.objects.get(link=link, kind=OutboundKind.STATE)
    assert effect.status == OutboundStatus.DONE and effect.payload["stateName"] == "In Progress"
    before = set(InboundEvent.objects.values_list("pk", flat=True))
    tracker.forward()  # our own move comes back: echoes
    outcomes = set(InboundEvent.objects.exclude(pk__in=before).values_list("outcome", flat=True))
    assert outcomes == {"the connector's own change (echo)"}
    issue = update(tracker, issue, status="in_review")
    assert tracker.sandbox.section_of(gid) == "Review"
    tracker.forward()
    TaskLink.objects.filter(pk=link.pk).update(field_policy={**link.field_policy, "state": "paperclip"})
    # two terminal states (completion, the Done section): the operator names the one closure uses
    tracker.instance.config = {**tracker.instance.config, "outboundStates": {"terminal": "Completed"}}
    tracker.instance.save(update_fields=["config"])
    update(tracker, issue, status="done")
    assert tracker.sandbox.task(gid)["completed"] is True and tracker.sandbox.section_of(gid) == "Review"
    tracker.forward()
    link.refresh_from_db()
    assert link.external_state_name == "Completed" and link.external_state_category == "terminal"
    assert not Conflict.objects.exists()


def test_a_title_changed_on_both_sides_is_one_conflict_and_its_resolution_sticks(tracker, company):
    gid, link = linked(tracker)
    update(tracker, link.issue, title="Paperclip title")
    tracker.sandbox.update_task(gid, name="Tracker title", actor="Carol")
    [delivery] = tracker.forward()
    conflict = Conflict.objects.get(link=link)
    assert (conflict.kind, conflict.field, conflict.status) == ("field", "title", "open")
    assert tracker.post(delivery).json()["duplicate"] is True  # Asana's retry of the same POST
    assert Conflict.objects.filter(link=link).count() == 1
    operator = MembershipFactory(company=company, role="operator").user
    with tracker.capture(execute=True):
        conflict_resolve(actor=Actor(user=operator), conflict=conflict, action="keep_paperclip",
                         idempotency_key="asana-keep")
    assert tracker.sandbox.task(gid)["name"] == "Paperclip title"
    tracker.forward()  # the echo of our write
    tracker.sandbox.update_task(gid, notes="More detail", actor="Carol")
    tracker.forward()
    link.refresh_from_db()
    assert link.status == LinkStatus.HEALTHY and not Conflict.objects.filter(status="open").exists()
    assert Issue.objects.get(pk=link.issue_id).title.endswith("Paperclip title")


def test_reopen_in_asana_makes_a_follow_up(tracker, agents):
    gid, link = linked(tracker)
    first = link.issue
    update(tracker, first, status="done")
    tracker.forward()
    tracker.sandbox.complete_task(gid, actor="Carol")
    tracker.forward()
    tracker.sandbox.complete_task(gid, False, actor="Carol")  # reopened in Asana
    tracker.forward()
    link.refresh_from_db()
    assert link.issue_id != first.pk and Issue.objects.get(pk=first.pk).status == "done"
    assert [h["issueId"] for h in link.handoff_history] == [str(first.pk)]


def test_deleting_the_task_in_asana_opens_a_deletion_conflict(tracker):
    gid, link = linked(tracker)
    tracker.sandbox.delete_task(gid, actor="Carol")
    [delivery] = tracker.forward()
    assert delivery.payload["events"][0]["action"] == "deleted"
    conflict = Conflict.objects.get(link=link)
    assert conflict.kind == ConflictKind.DELETION and conflict.status == "open"
    assert conflict.detail == "external task deleted" and conflict.actors["external"]
    link.refresh_from_db()
    assert link.status == LinkStatus.CONFLICT and Issue.objects.filter(pk=link.issue_id).exists()


def test_removing_the_task_from_the_project_is_a_transfer_conflict(tracker):
    gid, link = linked(tracker)
    other = tracker.sandbox.add_project("Archive")["gid"]
    tracker.sandbox.add_to_project(gid, other)
    tracker.forward()
    tracker.sandbox.remove_from_project(gid, tracker.project)
    tracker.forward()
    conflict = Conflict.objects.get(link=link)
    assert conflict.kind == ConflictKind.DELETION
    assert conflict.detail == "external task moved out of the connector's container"
    # the deletion of a task that is still in another project is the same conflict, not a second one
    tracker.sandbox.delete_task(gid)
    tracker.forward()
    assert Conflict.objects.filter(link=link).count() == 1


def test_leaving_one_configured_project_for_another_is_no_deletion(tracker):
    """A.3: one task can sit in several of the connector's projects; removed from one, it is still here."""
    gid, link = linked(tracker)
    other = tracker.sandbox.add_project("Platform")["gid"]
    ConnectorInstance.objects.filter(pk=tracker.instance.pk).update(containers=[tracker.project, other])
    tracker.sandbox.add_to_project(gid, other)
    tracker.forward()
    tracker.sandbox.remove_from_project(gid, tracker.project)
    tracker.forward()
    assert not Conflict.objects.filter(link=link).exists()
    link.refresh_from_db()
    assert link.status == LinkStatus.HEALTHY
    removal = InboundEvent.objects.filter(instance=tracker.instance, action__contains="transfer").get()
    assert removal.status == "applied"


# --- polling with cursors ----------------------------------------------------------------------------------------
def test_polling_imports_with_cursors_and_a_crash_before_the_cursor_save_reapplies_idempotently(tracker):
    sb = tracker.sandbox
    with sb.quiet():  # webhooks lost: polling is the backstop
        gids = [tracker.open(f"Polled {n}") for n in range(3)]
    instance = tracker.instance
    adapter = type(adapter_for(instance))(adapter_for(instance).config, page_size=2)
    page = adapter.list_candidate_tasks(tracker.project, None)
    # the worker applies the page and dies before its cursor is saved
    with tracker.capture(execute=True), transaction.atomic():
        polling.poll_page_apply(instance=instance, scope=tracker.project, page=replace(page, cursor=None))
    assert TaskLink.objects.filter(instance=instance).count() == 2
    with tracker.capture(execute=True):
        result = polling.instance_poll(instance_id=instance.pk)
    assert result["tasks"] >= 1
    assert sorted(TaskLink.objects.filter(instance=instance).values_list("external_task_id", flat=True)) == sorted(gids)
    assert Issue.objects.filter(company=instance.company).count() == 3  # nothing imported twice
    cursor = json.loads(instance.cursors.get(scope=f"tasks:{tracker.project}").cursor)
    assert cursor["scope"] == tracker.project and cursor["since"] and "offset" not in cursor
    # a change made while webhooks are lost arrives with the next poll (modified_since from the cursor)
    sb.advance(60)
    with sb.quiet():
        sb.update_task(gids[0], name="Polled 0 (renamed)")
    seen = len(sb.requests_to(r"^/tasks$", "GET"))
    with tracker.capture(execute=True):
        polling.instance_poll(instance_id=instance.pk)
    assert tracker.link(gids[0]).issue.title.endswith("Polled 0 (renamed)")
    resumed = sb.requests_to(r"^/tasks$", "GET")[seen]
    assert resumed.query["modified_since"] == [cursor["since"]]  # incremental: the saved high-water mark


# --- rate limits (Asana: 429 with Retry-After) ---------------------------------------------------------------------
def test_a_rate_limited_write_waits_for_retry_after_and_the_poll_backs_off(tracker, agents):
    from django.utils import timezone

    gid, link = linked(tracker)
    tracker.sandbox.fail_next(1, "rate_limit", retry_after=120)
    agent_opens_pr(tracker, agents["coder"], link.issue)
    effect = OutboundEffect.objects.get(link=link, kind=OutboundKind.COMMENT)
    assert effect.status == OutboundStatus.PENDING and effect.error_category == "provider_rate_limited"
    assert (effect.next_attempt_at - timezone.now()).total_seconds() > 100  # never sooner than Retry-After
    tracker.instance.refresh_from_db()
    assert tracker.instance.provider_degraded_until > timezone.now()
    assert not [c for c in tracker.sandbox.comments_of(gid) if "PR opened" in c["text"]]
    # the poll meets the same limit: a health entry with the category, nothing half-applied
    tracker.sandbox.fail_next(1, "rate_limit", retry_after=30)
    with tracker.capture(execute=True):
        result = polling.instance_poll(instance_id=tracker.instance.pk)
    assert result["pages"] == 0
    assert SyncError.objects.filter(instance=tracker.instance, category="provider_rate_limited",
                                    message__contains="Poll of").exists()


# --- the Symphony profile ----------------------------------------------------------------------------------------
def test_symphony_profile_active_section_moves_to_todo_and_wakes_once(company, sandbox, agents, monkeypatch,
                                                                      django_capture_on_commit_callbacks, settings):
    settings.CONNECTORS = {**settings.CONNECTORS, "PUBLIC_BASE_URL": "http://testserver"}
    instance = build(company, sandbox, agents, monkeypatch, default_run_mode="symphony_compatible")
    tracker = Tracker(sandbox, instance, django_capture_on_commit_callbacks)
    gid = tracker.open("Fix login")
    tracker.forward()
    link = tracker.link(gid)
    wakes = WakeupRequest.objects.filter(source="connector")
    assert link.issue.status == "backlog" and not wakes.exists()  # "To do" is backlog: never woken
    sandbox.move_task(gid, "In Progress", actor="Carol")  # a person drags it to the active section
    tracker.forward()
    link.refresh_from_db()
    assert link.issue.status == "todo"
    wake = wakes.get()
    assert wake.agent == agents["coder"] and wake.issue_id == link.issue_id
    assert "Fix login" in wake.context["taskPacket"] and "untrusted" in wake.context["taskPacket"]
    tracker.post(tracker.sandbox.deliveries[-1])  # Asana retries the POST: nothing new
    assert wakes.count() == 1


# --- registration (connector_register_webhooks) --------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_webhooks_register_performs_the_handshake_and_deliveries_verify(live_server, settings, monkeypatch):
    from connectors.services.webhook_setup import webhooks_register, webhooks_reverify
    from tests.factories import CompanyFactory

    settings.CONNECTORS = {**settings.CONNECTORS, "PUBLIC_BASE_URL": live_server.url}
    company = CompanyFactory()
    agents = {name: AgentFactory(company=company, name=name) for name in ("triage", "coder")}
    with make_sandbox(webhook_secret=None, delivery_mode="queued") as sandbox:
        instance = build(company, sandbox, agents, monkeypatch, webhook_secret=False)
        project = sandbox.project_gid(SANDBOX_PROJECT)
        [entry] = webhooks_register(instance=instance)
        assert entry["scope"] == project and entry["active"] and entry["externalId"]
        assert entry["callbackUrl"] == f"{live_server.url}/api/connectors/{instance.pk}/webhook?scope={project}"
        [hook] = sandbox.webhooks()
        assert hook["target"] == entry["callbackUrl"] and hook["active"]
        instance.refresh_from_db()
        assert instance.webhook_registrations[0]["secretRef"]  # the handshake's secret, stored encrypted
        # registering again re-checks instead of creating a second webhook
        webhooks_register(instance=instance)
        assert len(sandbox.webhooks()) == 1
        # a person opens a task: Asana POSTs the events to the registered URL, signed with that secret
        gid = sandbox.create_task("Registered", project=project)["gid"]
        [delivery] = sandbox.flush()
        assert delivery.status == 202, delivery.response_body
        events = InboundEvent.objects.filter(instance=instance)
        assert events.count() == 2 and all(e.verified for e in events)
        assert TaskLink.objects.filter(instance=instance, external_task_id=gid).exists()
        # §13.2 re-verification: Asana disabled the webhook
        sandbox.deactivate_webhook(entry["externalId"], failure="timeout")
        [checked] = webhooks_reverify(instance=instance)
        assert not checked["active"] and "timeout" in checked["detail"]
        assert SyncError.objects.filter(instance=instance, category="config", message__contains="not active").exists()
        # registering again creates a new webhook for the project (and a new handshake secret)
        [again] = webhooks_register(instance=instance)
        assert again["active"] and again["externalId"] != entry["externalId"]


# --- setup: the mapping check against the live sections ---------------------------------------------------------
def test_the_mapping_check_reads_the_projects_sections(tracker):
    from connectors.services.mapping_check import mapping_report

    report = mapping_report(tracker.instance)
    assert report["status"] == "ok", report
    [container] = report["containers"]
    assert [(s["name"], s["category"]) for s in container["states"]] == [
        ("To do", "backlog"), ("In Progress", "active"), ("Review", "review"), ("Done", "terminal"),
        ("Completed", "terminal")]
    tracker.instance.state_mapping = {"sections": {"Doing": "active"},
                                      "projects": {tracker.project: {"sections": {"Shipped": "terminal"}}}}
    tracker.instance.save(update_fields=["state_mapping"])
    report = mapping_report(tracker.instance)
    assert report["status"] == "invalid"
    assert {e["field"] for e in report["errors"]} == {
        "stateMapping.sections.Doing", f"stateMapping.projects.{tracker.project}.sections.Shipped"}
    assert any("'To do'" in w["reason"] and "unmapped" in w["reason"] for w in report["warnings"])
