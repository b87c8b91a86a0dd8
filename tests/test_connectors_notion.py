"""Notion end to end (Appendix A.4) through the REAL webhook endpoint and the Notion sandbox over real HTTP:
the real fixtures in ../shared/fixtures/providers/notion/ (unchanged bytes: the verification request is the
handshake, the page event is signed with its token and delivered 5x), bad signatures, the verification
handshake and its refusal, round trips (import with routing, comments in and out, status projection, a
three-way conflict and its resolution, reopen -> follow-up, deletion -> conflict), polling with cursors
(a crash between a page and its cursor save re-applies idempotently) and the Symphony profile refused on a
database without a status property."""
from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from connectors import sandbox as sandbox_pkg
from connectors import secrets
from connectors.choices import ConflictKind, EventStatus, LinkStatus, OutboundKind, OutboundStatus
from connectors.models import Conflict, ConnectorInstance, InboundEvent, OutboundEffect, TaskLink
from connectors.services import outbound, polling
from connectors.services.conflicts import conflict_resolve
from connectors.services.instances import instance_create
from connectors.services.webhook_setup import handshake_window_open
from issues.actors import SYSTEM, Actor
from issues.models import Issue
from tests.factories import AgentFactory, MembershipFactory
from tests.notion_sandbox import (
    FIXTURE_PAGE_ID,
    SANDBOX_TOKEN,
    STATE_MAPPING,
    VERIFICATION_TOKEN,
    WORKSPACE_ID,
    make_sandbox,
)
from tests.test_errors import assert_error
from tests.connector_helpers import agent_says, delivery_headers, external_comments, update

REAL = Path(sandbox_pkg.__file__).resolve().parent / "fixtures" / "notion"  # the real payloads, copied unchanged
FIXTURES = sorted(p.name for p in REAL.glob("*.json"))
VERIFICATION = "zulip_verification.json"
PAGE_EVENT = "zulip_page_properties_updated.json"


def body_of(name: str) -> bytes:
    return (REAL / name).read_bytes()


def signature(token: str, body: bytes) -> str:
    return "sha256=" + hmac.new(token.encode(), body, hashlib.sha256).hexdigest()


def post(instance, body: bytes, capture, *, sig: str | None = None):
    headers = {"HTTP_X_NOTION_SIGNATURE": sig} if sig is not None else {}
    with capture(execute=True):
        return APIClient().post(f"/api/connectors/{instance.pk}/webhook", data=body, content_type="application/json",
                                **headers)


@pytest.fixture
def sandbox():
    with make_sandbox() as sb:
        yield sb


@pytest.fixture
def agents(company):
    return {"triage": AgentFactory(company=company, name="triage"), "coder": AgentFactory(company=company, name="coder"),
            "fixer": AgentFactory(company=company, name="bug-fixer")}


def connect(sandbox, company, agents, monkeypatch, *, secret: str | None = VERIFICATION_TOKEN, state_mapping=None,
            containers=None, **fields):
    monkeypatch.setenv("PAPERCLIP_SECRET_NOTION_TOKEN", SANDBOX_TOKEN)
    extra = {}
    if secret is not None:
        monkeypatch.setenv("PAPERCLIP_SECRET_NOTION_HOOK", secret)
        extra["webhook_secret"] = "env:PAPERCLIP_SECRET_NOTION_HOOK"
    return instance_create(
        actor=SYSTEM, company=company, name="notion", provider_key="notion", base_url=sandbox.base_url,
        containers=containers or [sandbox.tasks["id"], WORKSPACE_ID],
        state_mapping=STATE_MAPPING if state_mapping is None else state_mapping,
        credentials="env:PAPERCLIP_SECRET_NOTION_TOKEN", service_account_id=sandbox.bot["id"],
        config={"workspaceId": WORKSPACE_ID}, triage_agent_id=agents["triage"].pk, default_sync_mode="bidirectional",
        routing_rules=[{"kind": "label", "match": {"label": "bug"}, "agentId": agents["fixer"].pk},
                       {"kind": "default_route", "agentId": agents["coder"].pk}], **extra, **fields)


def test_the_fixture_directory_holds_the_two_real_payloads():
    assert FIXTURES == sorted([VERIFICATION, PAGE_EVENT])
    assert json.loads(body_of(VERIFICATION)) == {"verification_token": VERIFICATION_TOKEN}


# --- the verification handshake through the real view ---------------------------------------------------
def test_the_verification_request_stores_the_token_and_a_second_one_is_refused(
        sandbox, company, agents, monkeypatch, django_capture_on_commit_callbacks):
    instance = connect(sandbox, company, agents, monkeypatch, secret=None)
    response = post(instance, body_of(VERIFICATION), django_capture_on_commit_callbacks)
    assert response.status_code == 200, response.content
    instance.refresh_from_db()
    assert instance.webhook_secret_ref and instance.last_handshake_at is not None
    assert "paste it into the integration's webhook settings" in instance.last_handshake_detail
    stored = secrets.resolve(instance.webhook_secret_ref, company_id=company.pk, field="webhookSecret")
    assert stored == VERIFICATION_TOKEN
    assert not InboundEvent.objects.exists()  # a handshake is not an event

    # a stranger's (or a repeated) verification while a token is stored and no window is open: 409
    forged = json.dumps({"verification_token": "secret_attacker"}).encode()
    assert_error(post(instance, forged, django_capture_on_commit_callbacks), 409, "handshake_refused")
    instance.refresh_from_db()
    assert secrets.resolve(instance.webhook_secret_ref, company_id=company.pk, field="webhookSecret") == stored

    # the operator expects Notion to resend it (a new subscription): the window lets the new token in
    owner = MembershipFactory(company=company, role="owner").user
    handshake_window_open(actor=Actor(user=owner), instance=instance)
    sandbox.webhook_secret = None
    resent = sandbox.send_verification("secret_rotated_token")
    assert post(instance, resent.body, django_capture_on_commit_callbacks).status_code == 200
    instance.refresh_from_db()
    assert secrets.resolve(instance.webhook_secret_ref, company_id=company.pk,
                           field="webhookSecret") == "secret_rotated_token"


# --- the real page event, signed with the token, 5x ----------------------------------------------------
def test_the_real_page_event_five_times_is_one_import_read_back_from_the_api(
        sandbox, company, agents, monkeypatch, django_capture_on_commit_callbacks):
    # the fixture's page sits at the workspace top level ("space" parent = workspace_id): the sandbox holds it
    sandbox.add_page("Quarterly plan", workspace=True, page_id=FIXTURE_PAGE_ID, content="Draft the plan.")
    instance = connect(sandbox, company, agents, monkeypatch)
    body = body_of(PAGE_EVENT)
    answers = [post(instance, body, django_capture_on_commit_callbacks, sig=signature(VERIFICATION_TOKEN, body))
               for _ in range(5)]
    assert [a.status_code for a in answers] == [202] * 5, answers[0].content
    assert [a.json()["duplicate"] for a in answers] == [False, True, True, True, True]
    event = InboundEvent.objects.get(instance=instance)
    assert event.idempotency_key == json.loads(body)["id"] and event.status == EventStatus.APPLIED, event.outcome
    link = TaskLink.objects.get(instance=instance)
    assert link.external_task_id == FIXTURE_PAGE_ID and Issue.objects.count() == 1
    assert link.issue.title == "Quarterly plan" and "Draft the plan." in link.issue.description
    assert link.issue.assignee_agent == agents["coder"]  # the default route (no labels at the top level)
    assert link.external_state_category == "backlog"  # a top-level page has no status: import-only default
    assert sandbox.requests_to(rf"^/pages/{FIXTURE_PAGE_ID}$", "GET")  # the sparse event was read back

    # Notion's retry of the same event (attempt_number 2, other bytes, same id): still one effect
    retry = json.loads(body)
    retry["attempt_number"] = 2
    raw = json.dumps(retry).encode()
    again = post(instance, raw, django_capture_on_commit_callbacks, sig=signature(VERIFICATION_TOKEN, raw))
    assert again.status_code == 202 and again.json()["duplicate"] is True
    assert InboundEvent.objects.filter(instance=instance).count() == 1


@pytest.mark.parametrize("how", ["missing", "forged", "wrong-secret", "malformed"])
def test_bad_signatures_are_401_and_store_nothing(sandbox, company, agents, monkeypatch, how,
                                                  django_capture_on_commit_callbacks):
    sandbox.add_page("Quarterly plan", workspace=True, page_id=FIXTURE_PAGE_ID)
    instance = connect(sandbox, company, agents, monkeypatch)
    body = body_of(PAGE_EVENT)
    if how == "missing":
        response = post(instance, body, django_capture_on_commit_callbacks)
    elif how == "forged":
        tampered = body.replace(b"page.properties_updated", b"page.created")
        response = post(instance, tampered, django_capture_on_commit_callbacks, sig=signature(VERIFICATION_TOKEN, body))
    elif how == "wrong-secret":
        response = post(instance, body, django_capture_on_commit_callbacks, sig=signature("secret_wrong", body))
    else:
        response = post(instance, body, django_capture_on_commit_callbacks,
                        sig=signature(VERIFICATION_TOKEN, body).removeprefix("sha256="))
    assert response.status_code == 401
    assert not InboundEvent.objects.exists() and not Issue.objects.exists() and not TaskLink.objects.exists()
    instance.refresh_from_db()
    assert instance.webhook_rejected_count == 1


def test_an_unsigned_page_event_is_not_mistaken_for_a_verification_request(
        sandbox, company, agents, monkeypatch, django_capture_on_commit_callbacks):
    instance = connect(sandbox, company, agents, monkeypatch, secret=None)
    response = post(instance, body_of(PAGE_EVENT), django_capture_on_commit_callbacks)
    assert response.status_code == 401  # no token stored yet: nothing can verify it, nothing is stored
    instance.refresh_from_db()
    assert not instance.webhook_secret_ref and not InboundEvent.objects.exists()


# --- round trips against the sandbox -------------------------------------------------------------------
class Board:
    """The Notion sandbox as its users see it, wired to an instance through the real endpoint."""

    def __init__(self, sandbox, instance, capture):
        self.sandbox, self.instance, self.capture = sandbox, instance, capture
        self._forwarded = 0

    def open(self, title: str, **values) -> str:
        values.setdefault("content", "It crashes.")
        return self.sandbox.add_page(title, database=self.sandbox.tasks["id"], **values)["id"]

    def post(self, delivery):
        headers = delivery_headers(delivery)
        with self.capture(execute=True):
            return APIClient().post(f"/api/connectors/{self.instance.pk}/webhook", data=delivery.body,
                                    content_type="application/json", **headers)

    def forward(self) -> list:
        deliveries = self.sandbox.deliveries[self._forwarded:]
        self._forwarded += len(deliveries)
        answers = [self.post(d) for d in deliveries]
        assert all(a.status_code == 202 for a in answers), [a.content for a in answers]
        return deliveries

    def drop(self) -> None:
        self._forwarded = len(self.sandbox.deliveries)

    def status(self, page_id: str) -> str | None:
        return ((self.sandbox.page(page_id)["properties"]["Status"].get("status")) or {}).get("name")

    def title(self, page_id: str) -> str:
        return "".join(s["plain_text"] for s in self.sandbox.page(page_id)["properties"]["Name"]["title"])

    def comments(self, page_id: str) -> list[dict]:
        out = []
        for c in self.sandbox.comments_of(page_id):
            text = "".join(s["plain_text"] for s in c["rich_text"])
            out.append({"id": c["id"], "text": text, "author": c["created_by"]["id"]})
        return out

    def marked(self, page_id: str) -> list[dict]:
        return [c for c in self.comments(page_id) if "paperclip:effect:" in c["text"]]


@pytest.fixture
def board(sandbox, company, agents, monkeypatch, django_capture_on_commit_callbacks, settings):
    settings.CONNECTORS = {**settings.CONNECTORS, "RETRY_BASE_SECONDS": 0.0}
    yield Board(sandbox, connect(sandbox, company, agents, monkeypatch), django_capture_on_commit_callbacks)


@pytest.fixture
def linked(board):
    page_id = board.open("Crash on start", tags=["Bug"])
    board.forward()
    link = TaskLink.objects.get(instance=board.instance, external_task_id=page_id)
    board.forward()  # the backlink comment's comment.created: our own, read back and dropped
    return board, page_id, link


def test_import_with_routing_backlink_and_the_echo_of_our_backlink(linked, agents):
    board, page_id, link = linked
    issue = link.issue
    assert issue.title == "Crash on start" and "It crashes." in issue.description
    assert issue.assignee_agent == agents["fixer"]  # the Tags multi_select carries "Bug" -> label rule
    assert link.external_url.endswith(page_id.replace("-", "")) and link.external_key == ""
    assert link.external_state_name == "Not started" and link.external_state_category == "backlog"
    assert link.envelope["stateProperty"] == "Status" and link.envelope["priority"] is None
    assert [b["type"] for b in link.envelope["blocks"]] == ["paragraph"]
    # the backlink: one bot comment in exactly our format, read back by find_backlinks (dedupe, §6.3)
    [backlink] = board.comments(page_id)
    assert backlink["text"] == f"Tracked in Paperclip: {outbound.issue_url(issue)}"
    assert backlink["author"] == board.sandbox.bot["id"]
    from connectors.providers.base import ExternalTaskRef
    from connectors.services.common import adapter_for

    assert adapter_for(board.instance).find_backlinks(ExternalTaskRef(page_id)) == [outbound.issue_url(issue)]
    # its comment.created came back signed and sparse: read back, recognised as the bot's, never imported
    echo = InboundEvent.objects.filter(instance=board.instance, action__startswith="comment.created").get()
    assert echo.status == "dropped" and "own comment" in echo.outcome and echo.verification == "signature"
    assert not external_comments(issue).exists()


def test_a_persons_comment_arrives_and_an_agent_comment_goes_out_once(linked, agents):
    board, page_id, link = linked
    human = board.sandbox.add_comment(page_id, "Still broken on **2.3**, see `config.py`", actor="Dave")
    board.forward()
    [imported] = external_comments(link.issue)
    assert imported.provenance["externalCommentId"] == human["id"]
    assert "Still broken on" in imported.body and imported.provenance["actor"]["displayName"] == "Dave"
    # out: an agent's comment mirrored through the outbound engine, attributed and marked; its echo is dropped
    TaskLink.objects.filter(pk=link.pk).update(write_policy={"mirrorAgentComments": True})
    agent_says(board, agents["coder"], link.issue, "Plan ready: fix the config loader.")
    effect = OutboundEffect.objects.get(link=link, kind=OutboundKind.COMMENT, source_id__startswith="comment:")
    assert effect.status == OutboundStatus.DONE
    [posted] = board.marked(page_id)
    assert "Plan ready: fix the config loader." in posted["text"] and "coder via Paperclip" in posted["text"]
    assert posted["text"].endswith(f"paperclip:effect:{effect.pk}")  # the marker as a small gray tag
    assert posted["author"] == board.sandbox.bot["id"] and effect.external_ref == posted["id"]
    board.forward()
    assert external_comments(link.issue).count() == 1
    # a retried job whose answer was lost finds its marker on the page and posts nothing
    OutboundEffect.objects.filter(pk=effect.pk).update(status=OutboundStatus.PENDING, next_attempt_at=None)
    assert outbound.effect_deliver(effect_id=effect.pk) == "done"
    assert [c["id"] for c in board.marked(page_id)] == [posted["id"]]


def test_status_projection_moves_the_mapped_status_property(linked):
    board, page_id, link = linked
    issue = update(board, link.issue, status="in_progress")
    assert board.status(page_id) == "In progress"
    effect = OutboundEffect.objects.get(link=link, kind=OutboundKind.STATE)
    assert effect.status == OutboundStatus.DONE and effect.external_ref == "In progress"
    before = set(InboundEvent.objects.values_list("pk", flat=True))
    board.forward()  # our own PATCH comes back as page.properties_updated authored by the bot: an echo
    outcomes = list(InboundEvent.objects.exclude(pk__in=before).values_list("status", "outcome"))
    assert outcomes == [("dropped", "the connector's own change (echo)")]
    update(board, issue, status="in_review")
    assert board.status(page_id) == "In review"
    board.forward()
    link.refresh_from_db()
    assert link.external_state_category == "review" and not Conflict.objects.exists()
    # a person moves it in Notion: the category reaches Paperclip
    board.sandbox.update_page(page_id, status="In progress")
    board.forward()
    link.refresh_from_db()
    assert link.external_state_name == "In progress" and link.external_state_category == "active"


def test_a_title_changed_on_both_sides_is_one_conflict_resolved_once(linked, company):
    board, page_id, link = linked
    update(board, link.issue, title="Paperclip title")
    board.sandbox.update_page(page_id, title="Notion title")
    [delivery] = board.forward()
    conflict = Conflict.objects.get(link=link)
    assert (conflict.kind, conflict.field, conflict.status) == ("field", "title", "open")
    assert (conflict.base_value, conflict.paperclip_value, conflict.external_value) == (
        "Crash on start", "Paperclip title", "Notion title")
    assert board.post(board.sandbox.redeliver(delivery)).json()["duplicate"] is True  # Notion's retry
    board.drop()
    assert board.title(page_id) == "Notion title"  # nothing was pushed over the person's edit
    operator = MembershipFactory(company=company, role="operator").user
    with board.capture(execute=True):
        conflict_resolve(actor=Actor(user=operator), conflict=conflict, action="keep_paperclip", idempotency_key="np-1")
    assert board.title(page_id) == "Paperclip title"
    effect = OutboundEffect.objects.get(link=link, source_id=f"conflict:{conflict.pk}")
    assert (effect.kind, effect.status, effect.attempts) == (OutboundKind.FIELDS, OutboundStatus.DONE, 1)
    board.forward()  # the echo of our title write
    board.sandbox.set_content(page_id, "Steps: start it.")
    board.forward()
    link.refresh_from_db()
    assert link.status == LinkStatus.HEALTHY and not Conflict.objects.filter(status="open").exists()
    assert Issue.objects.get(pk=link.issue_id).title == "Paperclip title"
    assert "Steps: start it." in Issue.objects.get(pk=link.issue_id).description
    title_writes = [r for r in board.sandbox.requests_to(rf"^/pages/{page_id}$", "PATCH")
                    if "Name" in ((r.body or {}).get("properties") or {})]
    assert len(title_writes) == 1


def test_reopen_after_done_becomes_a_follow_up(linked):
    board, page_id, link = linked
    first = link.issue
    update(board, first, status="done")
    board.forward()
    board.sandbox.update_page(page_id, status="Done", actor="Dave")
    board.forward()
    board.sandbox.update_page(page_id, status="In progress", actor="Dave")
    board.forward()
    link.refresh_from_db()
    follow_up = Issue.objects.get(pk=link.issue_id)
    assert follow_up.pk != first.pk and Issue.objects.get(pk=first.pk).status == "done"
    assert [h["issueId"] for h in link.handoff_history] == [str(first.pk)]
    assert follow_up.status == "todo"


def test_a_page_moved_to_the_trash_is_a_deletion_conflict_and_the_issue_stays(linked):
    board, page_id, link = linked
    board.sandbox.trash_page(page_id, actor="Dave")
    board.forward()
    link.refresh_from_db()
    assert link.status == LinkStatus.CONFLICT and link.status_detail == "external task deleted"
    assert Conflict.objects.filter(link=link, kind=ConflictKind.DELETION, status="open").count() == 1
    assert Issue.objects.get(pk=link.issue_id).status not in ("cancelled", "done")


def test_a_comment_event_on_an_unlinked_page_is_refused_without_a_trace(board):
    page_id = board.open("Never imported")
    board.drop()
    delivery = board.sandbox.deliveries[-1]
    board.sandbox.add_comment(page_id, "hello", actor="Dave")
    [comment] = [d for d in board.sandbox.deliveries if d.type == "comment.created"]
    response = board.post(comment)
    assert_error(response, 401, "webhook_task_not_linked")
    assert delivery.type == "page.created" and not InboundEvent.objects.exists()


# --- polling: the primary channel -------------------------------------------------------------------------
def test_polling_imports_what_the_webhooks_missed_across_pages_and_cursors(board, monkeypatch):
    from connectors.services import common

    monkeypatch.setattr(common, "adapter_for", _small_pages(common.adapter_for), raising=True)
    monkeypatch.setattr(polling, "adapter_for", _small_pages(common.adapter_for.__wrapped__), raising=True)
    ids = [board.open(f"Task {n}") for n in range(5)]
    board.drop()  # every webhook lost
    with board.capture(execute=True):
        result = polling.instance_poll(instance_id=board.instance.pk)
    assert result["tasks"] == 5
    assert set(TaskLink.objects.filter(instance=board.instance).values_list("external_task_id", flat=True)) == set(ids)
    queries = board.sandbox.requests_to(rf"^/databases/{board.sandbox.tasks['id']}/query$", "POST")
    assert len(queries) >= 3 and all(q.body["page_size"] == 2 for q in queries)  # pages of two, cursors walked
    # an edit minutes later: only the changed page is listed again (on_or_after the high-water mark + seen marks)
    board.sandbox.advance(180)
    board.sandbox.update_page(ids[2], title="Task 2 (repro attached)")
    board.drop()
    with board.capture(execute=True):
        result = polling.instance_poll(instance_id=board.instance.pk)
    assert result["tasks"] == 1
    assert TaskLink.objects.get(external_task_id=ids[2]).issue.title == "Task 2 (repro attached)"
    assert Issue.objects.count() == 5


def _small_pages(build):
    def adapter_for(instance, **kwargs):
        adapter = build(instance, **kwargs)
        if instance.provider_key == "notion":
            adapter.page_size = 2
        return adapter

    adapter_for.__wrapped__ = build
    return adapter_for


def test_a_crash_between_a_poll_page_and_its_cursor_save_reapplies_idempotently(board, monkeypatch):
    from connectors.services import common

    monkeypatch.setattr(polling, "adapter_for", _small_pages(common.adapter_for))
    ids = [board.open(f"Task {n}") for n in range(3)]
    board.drop()
    real_save, calls = polling.cursor_save, []

    def crash_once(instance, scope, cursor):
        calls.append(cursor)
        if len(calls) == 1:
            raise RuntimeError("worker died before the cursor was saved")
        return real_save(instance, scope, cursor)

    monkeypatch.setattr(polling, "cursor_save", crash_once)
    with pytest.raises(RuntimeError), board.capture(execute=True):
        polling.instance_poll(instance_id=board.instance.pk)
    assert not TaskLink.objects.exists() and not Issue.objects.exists()  # the page's effects rolled back too
    with board.capture(execute=True):
        polling.instance_poll(instance_id=board.instance.pk)
    with board.capture(execute=True):
        polling.instance_poll(instance_id=board.instance.pk)
    assert sorted(TaskLink.objects.values_list("external_task_id", flat=True)) == sorted(ids)
    assert Issue.objects.count() == 3 and InboundEvent.objects.filter(source="poll").count() == 3


# --- the Symphony profile needs a status property ----------------------------------------------------------
def test_the_symphony_profile_is_refused_on_a_database_without_a_status_property(sandbox, company):
    owner = MembershipFactory(company=company, role="owner").user
    api = APIClient()
    api.force_login(owner)
    plain = sandbox.add_database("Notes", status_property=None)
    body = {"name": "Notes", "provider": "notion", "baseUrl": sandbox.base_url, "containers": [plain["id"]],
            "credentials": {"value": SANDBOX_TOKEN}, "defaultRunMode": "symphony_compatible"}
    response = api.post(f"/api/companies/{company.pk}/connectors", body, format="json")
    assert_error(response, 422, "run_mode_unsupported", fields=["defaultRunMode"])
    [reason] = response.json()["details"]["defaultRunMode"]
    assert "no status or select property is configured" in reason and "import-only" in reason
    assert not ConnectorInstance.objects.exists()
    # import-only is fine; and it cannot be switched to the profile later either
    created = api.post(f"/api/companies/{company.pk}/connectors", {**body, "defaultRunMode": "paperclip_controlled"},
                       format="json")
    assert created.status_code == 201, created.content
    patched = api.patch(f"/api/connectors/{created.json()['id']}", {"defaultRunMode": "symphony_compatible"},
                        format="json")
    assert_error(patched, 422, "run_mode_unsupported", fields=["defaultRunMode"])
    # with a status property mapped to an active option, the profile is accepted
    mapped = api.post(f"/api/companies/{company.pk}/connectors", {
        **body, "name": "Tasks", "containers": [sandbox.tasks["id"]], "stateMapping": STATE_MAPPING}, format="json")
    assert mapped.status_code == 201, mapped.content
    assert mapped.json()["defaultRunMode"] == "symphony_compatible"
