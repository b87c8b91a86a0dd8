"""Trello end to end (Appendix A.5) through the real webhook endpoint and the Trello sandbox over real HTTP:
every real Trello payload signed with the board's callback URL and delivered 5x (one effect); forged,
missing, wrong-secret and wrong-callback-URL signatures refused with nothing stored; the HEAD callback
check; round trips (import with routing, comments both ways, lane projection, a three-way conflict and its
resolution, reopen -> follow-up, deletion and leaving the board -> conflict); polling with cursors; the
Symphony profile (active list -> todo -> wake); and webhook registration, where Trello's HEAD check and its
signed deliveries reach a live server."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from connectors import sandbox as sandbox_pkg
from connectors.choices import ConflictKind, EventStatus, LinkStatus, OutboundKind, OutboundStatus
from connectors.models import Conflict, ConnectorInstance, InboundEvent, OutboundEffect, SyncError, TaskLink
from connectors.providers.base import WebhookUnparseable
from connectors.providers.trello import webhook as trello_webhook
from connectors.providers.trello.webhook import sign
from connectors.selectors import instance_health
from connectors.services import outbound, polling
from connectors.services.common import cursor_get, cursor_save
from connectors.services.conflicts import conflict_resolve
from connectors.services.instances import instance_create, webhook_url
from connectors.services.webhook_setup import webhooks_register, webhooks_reverify
from issues.actors import SYSTEM, Actor
from issues.exceptions import InvalidInput
from issues.models import Comment, Issue, WakeupRequest
from tests.factories import AgentFactory, MembershipFactory, RunFactory
from tests.trello_sandbox import SANDBOX_APP_SECRET, make_trello_sandbox
from tests.connector_helpers import PR_URL, agent_opens_pr, external_comments, update

FIXTURES = Path(sandbox_pkg.__file__).resolve().parent / "fixtures" / "trello"  # the real payloads, unchanged
ALL = sorted(p.name for p in FIXTURES.glob("*.json"))
BOARD = "53582e2da0fac5676a714277"  # "Welcome Board" of the real payloads
LISTS = {"Basics": "53582e2da0fac5676a714279", "Intermediate": "53582e2da0fac5676a71427a"}
MOVED_CARD, COMMENTED_CARD = "53582e2da0fac5676a71427f", "53582e2da0fac5676a714280"
EFFECT_MARKER = re.compile(r"paperclip:effect:(\d+)")
MAPPING = {"lists": {"To Do": "backlog", "Doing": "active", "Paperclip: QA": "review", "Done": "terminal"},
           "boards": {BOARD: {"lists": {"Basics": "backlog", "Intermediate": "active"}}}}


def fixture_body(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


@pytest.fixture
def public(settings):
    settings.CONNECTORS = {**settings.CONNECTORS, "PUBLIC_BASE_URL": "http://testserver", "RETRY_BASE_SECONDS": 0.0}
    return "http://testserver"


@pytest.fixture
def agents(company):
    return {name: AgentFactory(company=company, name=name, status="idle") for name in ("triage", "coder", "fixer", "qa")}


@pytest.fixture
def sandbox():
    with make_trello_sandbox() as sb:
        # the board of the real payloads, with its ids, and the two cards they name
        sb.add_board("Welcome Board", ["Basics", "Intermediate", "Advanced"], board_id=BOARD, list_ids=LISTS)
        with sb.quiet():
            sb.create_card("This is a card.", board=BOARD, list="Intermediate", card_id=MOVED_CARD, short_link="r33ylX2Z")
        yield sb


def make_connector(company, sandbox, agents, monkeypatch, **fields):
    monkeypatch.setenv("PAPERCLIP_SECRET_TRELLO_CREDENTIALS", sandbox.credentials)
    monkeypatch.setenv("PAPERCLIP_SECRET_TRELLO_APP_SECRET", SANDBOX_APP_SECRET)
    rules = fields.pop("routing_rules", [
        {"kind": "label", "match": {"label": "bug"}, "agentId": agents["fixer"].pk},
        {"kind": "state_lane", "match": {"state": "Paperclip: QA"}, "agentId": agents["qa"].pk},
        {"kind": "default_route", "agentId": agents["coder"].pk}])
    instance = instance_create(
        actor=SYSTEM, company=company, name=fields.pop("name", "trello-board"), provider_key="trello",
        base_url=sandbox.base_url, containers=fields.pop("containers", [sandbox.board_id, BOARD]),
        state_mapping=fields.pop("state_mapping", MAPPING), credentials="env:PAPERCLIP_SECRET_TRELLO_CREDENTIALS",
        webhook_secret="env:PAPERCLIP_SECRET_TRELLO_APP_SECRET", service_account_id=sandbox.service_member["id"],
        triage_agent_id=agents["triage"].pk, default_sync_mode="bidirectional", routing_rules=rules, **fields)
    sandbox.callback_url = webhook_url(instance)  # what Trello signs: the URL the webhook was registered with
    return instance


class Board:
    """The Trello board as its users see it, plus the webhook hop (signed for the public URL) to Paperclip."""

    def __init__(self, sandbox, instance, capture):
        self.sandbox, self.instance, self.capture = sandbox, instance, capture
        self._forwarded = len(sandbox.deliveries)

    def post(self, body: bytes, *, signature: str | None = None, url: str | None = None, method="post"):
        headers = {"HTTP_USER_AGENT": "Trello"}
        if signature is not None:
            headers["HTTP_X_TRELLO_WEBHOOK"] = signature
        url = url or f"/api/connectors/{self.instance.pk}/webhook"
        with self.capture(execute=True):
            if method in ("head", "get"):
                return getattr(APIClient(), method)(url, **headers)
            return APIClient().post(url, data=body, content_type="application/json", **headers)

    def deliver(self, body: bytes, *, secret: str = SANDBOX_APP_SECRET, callback: str | None = None):
        return self.post(body, signature=sign(secret, body, callback or webhook_url(self.instance)))

    def forward(self) -> list:
        deliveries = self.sandbox.deliveries[self._forwarded:]
        self._forwarded += len(deliveries)
        for delivery in deliveries:
            response = self.post(delivery.body, signature=delivery.headers.get("X-Trello-Webhook"))
            assert response.status_code == 202, response.content
        return deliveries

    def open(self, title: str, **kwargs) -> str:
        return self.sandbox.create_card(title, desc="It crashes.", **kwargs)["id"]

    def link(self, card_id: str) -> TaskLink:
        return TaskLink.objects.get(instance=self.instance, external_task_id=card_id)

    def imported(self, title: str = "Crash on start", **kwargs) -> tuple[str, TaskLink]:
        card_id = self.open(title, **kwargs)
        self.forward()
        link = self.link(card_id)
        self.forward()  # the echo of the backlink write
        return card_id, link

    def marked(self, card_id: str) -> list[dict]:
        return [c for c in self.sandbox.comments_of(card_id) if EFFECT_MARKER.search(c["data"]["text"])]


@pytest.fixture
def board(company, sandbox, agents, monkeypatch, public, django_capture_on_commit_callbacks):
    return Board(sandbox, make_connector(company, sandbox, agents, monkeypatch), django_capture_on_commit_callbacks)


# --- the real payloads ----------------------------------------------------------------------------
def test_the_fixture_directory_holds_the_two_real_trello_payloads():
    assert ALL == ["zulip_adding_comment_to_card.json", "zulip_changing_cards_list.json"]


@pytest.mark.parametrize("name", ALL)
def test_each_real_payload_through_the_endpoint_five_times_is_one_effect(board, agents, name):
    payload = json.loads(fixture_body(name))
    if name == "zulip_adding_comment_to_card.json":
        # the comment names a card Paperclip already links (imported from its creation webhook)
        with board.sandbox.quiet():
            board.sandbox.create_card("New card", board=BOARD, list="Basics", card_id=COMMENTED_CARD,
                                      short_link="xPKXoSTQ")
        board.sandbox.deliver_fixture(str(FIXTURES / name), {"action": {"type": "createCard", "id": "6a" + "0" * 22}})
        board.forward()  # a createCard for that card, signed like Trello
        board.forward()
        assert board.link(COMMENTED_CARD)
    before = InboundEvent.objects.filter(instance=board.instance).count()
    body = fixture_body(name)  # unchanged bytes
    answers = [board.deliver(body) for _ in range(5)]
    assert [a.status_code for a in answers] == [202] * 5, answers[0].content
    assert [a.json()["duplicate"] for a in answers] == [False, True, True, True, True]
    event = InboundEvent.objects.get(instance=board.instance, idempotency_key=payload["action"]["id"])
    assert InboundEvent.objects.filter(instance=board.instance).count() == before + 1
    assert event.status == EventStatus.APPLIED and event.verified, event.outcome
    if name == "zulip_changing_cards_list.json":
        # sparse: the card was read back through the API; the lane it was moved to is active
        link = board.link(MOVED_CARD)
        issue = link.issue
        assert (link.external_key, issue.title) == ("r33ylX2Z", "This is a card.")
        assert link.external_state_name == "Intermediate" and link.external_state_category == "active"
        assert issue.assignee_agent == agents["coder"] and Issue.objects.count() == 1
        assert issue.status == "todo"  # imported from an active lane
    else:
        [comment] = external_comments(board.link(COMMENTED_CARD).issue)
        assert comment.provenance["externalCommentId"] == payload["action"]["id"]
        assert "New comment" in comment.body and comment.provenance["actor"]["displayName"] == "TomaszKolek"


@pytest.mark.parametrize("name", ALL)
def test_forged_missing_wrong_secret_and_wrong_callback_url_signatures_store_nothing(board, name, settings):
    body = fixture_body(name)
    url = webhook_url(board.instance)
    bad = {
        "forged": sign(SANDBOX_APP_SECRET, body, url)[:-6] + "AAAAA=",
        "wrong secret": sign("another-app-secret", body, url),
        "wrong callback URL": sign(SANDBOX_APP_SECRET, body, url.replace("testserver", "paperclip.example.com")),
        "callback URL without its scope": sign(SANDBOX_APP_SECRET, body, url),
    }
    for case, signature in bad.items():
        target = f"/api/connectors/{board.instance.pk}/webhook" + ("?scope=" + BOARD if "scope" in case else "")
        response = board.post(body, signature=signature, url=target)
        assert response.status_code == 401, (case, response.content)
        assert response.json()["code"] == "webhook_signature"
    assert board.post(body).status_code == 401  # missing
    assert not InboundEvent.objects.exists() and not Issue.objects.exists()
    board.instance.refresh_from_db()
    assert board.instance.webhook_rejected_count == 5
    # the Host header never decides the URL: behind a proxy the public URL differs from what Django sees
    settings.CONNECTORS = {**settings.CONNECTORS, "PUBLIC_BASE_URL": "https://paperclip.example.com"}
    host_signed = sign(SANDBOX_APP_SECRET, body, f"http://testserver/api/connectors/{board.instance.pk}/webhook")
    assert board.post(body, signature=host_signed).status_code == 401
    assert board.deliver(body).status_code == 202  # signed for the public URL


@pytest.mark.parametrize("redelivered", [False, True], ids=["replay", "redelivery-then-replay"])
def test_a_parked_unparsed_delivery_is_finished_by_its_replay(board, company, monkeypatch, redelivered):
    """§13.1.8 for a provider without a delivery id: a delivery that does not parse is parked under its
    body's hash. Parsed after an upgrade it is stored under its action id: by an operator's replay, which
    finishes the parked row pointing at it, or first by a redelivery (stored beside the parked row), and
    then the replay finishes the parked row without applying the delivery a second time."""
    body = fixture_body("zulip_changing_cards_list.json")  # the real payload, unchanged
    with monkeypatch.context() as old_release:
        def older_parse(adapter, request, body):
            raise WebhookUnparseable("Trello webhook body has no action this release knows.")

        old_release.setattr(trello_webhook, "parse", older_parse)
        assert [board.deliver(body).json()["status"] for _ in range(2)] == ["parked", "parked"]
    parked = InboundEvent.objects.get(instance=board.instance)
    assert parked.kind == "unparsed" and parked.idempotency_key.startswith("sha256:")
    if redelivered:
        assert board.deliver(body).json()["duplicate"] is False  # stored under its action id, applied
        assert instance_health(board.instance)["parkedCount"] == 1  # the parked row waits for the replay
    owner = APIClient()
    owner.force_login(MembershipFactory(company=company, role="owner").user)
    with board.capture(execute=True):
        answer = owner.post(f"/api/connector-events/{parked.pk}/replay", {"idempotencyKey": "r-1"}, format="json")
    assert answer.status_code == 200 and answer.json()["reparsed"] is True, answer.content
    event = InboundEvent.objects.get(instance=board.instance, idempotency_key=json.loads(body)["action"]["id"])
    assert answer.json()["eventId"] == event.pk and event.status == EventStatus.APPLIED, event.outcome
    parked.refresh_from_db()
    assert parked.status == EventStatus.DROPPED and parked.outcome.endswith(f"stored as event {event.pk}")
    assert instance_health(board.instance)["parkedCount"] == 0
    assert Issue.objects.count() == 1 and InboundEvent.objects.filter(instance=board.instance).count() == 2
    again = owner.post(f"/api/connector-events/{parked.pk}/replay", {"idempotencyKey": "r-2"}, format="json")
    assert again.status_code == 422 and again.json()["code"] == "event_not_parked"
    assert board.deliver(body).json()["duplicate"] is True  # a later redelivery is the same event


def test_the_head_callback_check_answers_200_through_the_real_view(board):
    response = board.post(b"", method="head")
    assert response.status_code == 200 and response.content == b""
    assert not InboundEvent.objects.exists()
    board.instance.refresh_from_db()
    assert board.instance.last_handshake_at is not None and "HEAD" in board.instance.last_handshake_detail
    assert board.post(b"", method="get").status_code == 405


# --- round trips -----------------------------------------------------------------------------------
def test_import_routes_by_label_and_by_lane(board, agents):
    bug_id, bug = board.imported("Crash on start", labels=["Bug"])
    assert bug.issue.assignee_agent == agents["fixer"] and bug.issue.status == "backlog"
    assert bug.external_key == board.sandbox.card(bug_id)["shortLink"]
    # the backlink went through the outbound engine: one attachment named Paperclip
    assert [a["url"] for a in board.sandbox.attachments_of(bug_id)] == [outbound.issue_url(bug.issue)]
    plain_id, plain = board.imported("Add dark mode")
    assert plain.issue.assignee_agent == agents["coder"]
    # a card moved into the "Paperclip: QA" lane is routed to QA (state_lane on the list name)
    board.sandbox.move_card(plain_id, "Paperclip: QA")
    board.forward()
    plain.refresh_from_db()
    assert plain.issue.assignee_agent == agents["qa"] and plain.external_state_category == "review"
    # archived cards are terminal: never imported
    gone = board.open("Old idea")
    board.sandbox.archive_card(gone)
    before = set(InboundEvent.objects.values_list("pk", flat=True))
    board.forward()
    assert not TaskLink.objects.filter(external_task_id=gone).exists()
    assert ("dropped", "terminal external task is not imported") in list(
        InboundEvent.objects.exclude(pk__in=before).values_list("status", "outcome"))


def test_comments_flow_both_ways_and_our_echo_is_dropped(board, agents):
    card_id, link = board.imported()
    agent_opens_pr(board, agents["coder"], link.issue)  # a milestone comment
    [posted] = board.marked(card_id)
    effect = OutboundEffect.objects.get(link=link, kind=OutboundKind.COMMENT)
    assert effect.status == OutboundStatus.DONE and effect.external_ref == posted["id"]
    assert f"PR opened: [Fix the config loader]({PR_URL})" in posted["data"]["text"]
    assert posted["memberCreator"]["id"] == board.sandbox.service_member["id"]
    before = set(InboundEvent.objects.values_list("pk", flat=True))
    board.forward()  # the commentCard of our own comment comes back
    assert list(InboundEvent.objects.exclude(pk__in=before).values_list("status", "outcome")) == [
        ("dropped", "the connector's own comment (echo)")]
    # a bridge that copies our comment under another member: dropped by the marker it carries
    before = set(InboundEvent.objects.values_list("pk", flat=True))
    board.sandbox.add_comment(card_id, f"copied\n\n<!-- paperclip:effect:{effect.pk} -->", actor="Relay Bot")
    board.forward()
    assert list(InboundEvent.objects.exclude(pk__in=before).values_list("status", "outcome")) == [
        ("dropped", "mirrored comment marker (loop prevention)")]
    # a person's comment arrives; their edit updates it; the deletion is recorded
    human = board.sandbox.add_comment(card_id, "Thanks, @alice, that fixed it.")["id"]
    board.forward()
    [imported] = external_comments(link.issue)
    assert imported.provenance["externalCommentId"] == human and "Thanks, alice, that fixed it." in imported.body
    board.sandbox.edit_comment(human, "Thanks, it works now.")
    board.forward()
    imported.refresh_from_db()
    assert "it works now" in imported.body
    board.sandbox.delete_comment(human)
    board.forward()
    imported.refresh_from_db()
    assert imported.provenance.get("externalDeleted") is True
    # a retried job finds its own marked comment on the card and posts nothing twice
    OutboundEffect.objects.filter(pk=effect.pk).update(status=OutboundStatus.PENDING, next_attempt_at=None)
    assert outbound.effect_deliver(effect_id=effect.pk) == "done"
    assert [c["id"] for c in board.marked(card_id)
            if c["memberCreator"]["id"] == board.sandbox.service_member["id"]] == [posted["id"]]


def test_status_projection_moves_the_card_between_lanes_and_archives_only_when_permitted(board):
    card_id, link = board.imported()
    issue = update(board, link.issue, status="in_progress")
    assert board.sandbox.list_name(card_id) == "Doing"
    before = set(InboundEvent.objects.values_list("pk", flat=True))
    board.forward()
    assert ("dropped", "the connector's own change (echo)") in list(
        InboundEvent.objects.exclude(pk__in=before).values_list("status", "outcome"))
    issue = update(board, issue, status="in_review")
    assert board.sandbox.list_name(card_id) == "Paperclip: QA"
    board.forward()
    issue = update(board, issue, status="done")  # shared state policy: a completion comment, the card stays
    assert board.sandbox.list_name(card_id) == "Paperclip: QA" and not board.sandbox.card(card_id)["closed"]
    assert any("Closing the task is left to you" in c["data"]["text"] for c in board.marked(card_id))
    board.forward()
    TaskLink.objects.filter(pk=link.pk).update(field_policy={**link.field_policy, "state": "paperclip"})
    issue = update(board, issue, status="todo")
    update(board, issue, status="done")
    assert board.sandbox.list_name(card_id) == "Done"
    board.forward()
    link.refresh_from_db()
    assert not Conflict.objects.exists() and link.external_state_category == "terminal"


def test_without_a_done_list_permitted_closure_archives_the_card(company, sandbox, agents, monkeypatch, public,
                                                                 django_capture_on_commit_callbacks):
    instance = make_connector(company, sandbox, agents, monkeypatch, containers=[sandbox.board_id],
                              state_mapping={"lists": {"Doing": "active"}})
    b = Board(sandbox, instance, django_capture_on_commit_callbacks)
    card_id, link = b.imported()
    TaskLink.objects.filter(pk=link.pk).update(field_policy={**link.field_policy, "state": "paperclip"})
    update(b, link.issue, status="done")
    assert sandbox.card(card_id)["closed"] is True
    b.forward()
    link.refresh_from_db()
    assert link.external_state_name == "Archived" and link.external_state_category == "terminal"


def test_a_title_changed_on_both_sides_is_one_conflict_and_its_resolution_writes_once(board, company):
    card_id, link = board.imported()
    update(board, link.issue, title="Paperclip title")
    board.sandbox.update_card(card_id, name="Trello title")
    [delivery] = board.forward()
    conflict = Conflict.objects.get(link=link)
    assert (conflict.kind, conflict.field, conflict.paperclip_value) == ("field", "title", "Paperclip title")
    assert board.post(delivery.body, signature=delivery.headers["X-Trello-Webhook"]).json()["duplicate"] is True
    board.sandbox.update_card(card_id, desc="More detail from the reporter.")
    board.forward()
    assert Conflict.objects.filter(link=link).count() == 1
    link.refresh_from_db()
    assert link.status == LinkStatus.CONFLICT and "More detail from the reporter." in link.issue.description
    assert board.sandbox.card(card_id)["name"] == "Trello title"  # nothing pushed over the human's edit
    operator = MembershipFactory(company=company, role="operator").user
    with board.capture(execute=True):
        conflict_resolve(actor=Actor(user=operator), conflict=conflict, action="keep_paperclip",
                         idempotency_key="trello-keep")
    assert board.sandbox.card(card_id)["name"] == "Paperclip title"
    board.forward()  # our own rename comes back: not a change, not a conflict
    board.sandbox.update_card(card_id, desc="Steps to reproduce: start it.")
    board.forward()
    link.refresh_from_db()
    assert link.status == LinkStatus.HEALTHY and not Conflict.objects.filter(status="open").exists()
    renames = [r for r in board.sandbox.requests_to(rf"^/cards/{card_id}$", "PUT") if "name" in (r.body or {})]
    assert len(renames) == 1


def test_reopening_an_archived_card_after_paperclip_finished_is_a_follow_up(board):
    card_id, link = board.imported()
    first = link.issue
    update(board, first, status="done")
    board.forward()
    board.sandbox.archive_card(card_id)
    board.forward()
    board.sandbox.unarchive_card(card_id)  # a person restores the card: reopened
    board.forward()
    link = TaskLink.objects.get(pk=link.pk)
    assert link.issue_id != first.pk and Issue.objects.get(pk=first.pk).status == "done"
    assert [h["issueId"] for h in link.handoff_history] == [str(first.pk)]


@pytest.mark.parametrize("how", ["delete", "move to another board"])
def test_deleting_the_card_or_moving_it_off_the_board_is_a_deletion_conflict(board, how):
    card_id, link = board.imported()
    if how == "delete":
        board.sandbox.delete_card(card_id)
    else:
        other = board.sandbox.add_board("Someone else's board", ["Inbox"])
        board.sandbox.callback_url = webhook_url(board.instance)
        board.sandbox.move_card_to_board(card_id, other["id"])
    deliveries = board.sandbox.deliveries[board._forwarded:]
    # a webhook on another board is not ours: only the source board's action reaches this connector
    for delivery in deliveries:
        action = json.loads(delivery.body)["action"]
        if action["data"]["board"]["id"] != board.sandbox.board_id:
            assert board.post(delivery.body, signature=delivery.headers["X-Trello-Webhook"]).status_code == 401
        else:
            assert board.post(delivery.body, signature=delivery.headers["X-Trello-Webhook"]).status_code == 202
    board._forwarded += len(deliveries)
    conflict = Conflict.objects.get(link=link)
    assert conflict.kind == ConflictKind.DELETION and conflict.status == "open"
    if how != "delete":
        assert "moved out" in conflict.detail


# --- polling -----------------------------------------------------------------------------------------
def test_polling_imports_with_cursors_and_a_crash_before_the_cursor_save_reapplies_idempotently(board):
    board.sandbox.clear_deliveries()  # every webhook is lost: polling is the backstop
    with board.sandbox.quiet():
        ids = [board.sandbox.create_card(f"Polled {n}", list="To Do")["id"] for n in range(4)]
    result = polling.instance_poll(instance_id=board.instance.pk)
    assert result["tasks"] >= 4
    assert {link.external_task_id for link in TaskLink.objects.filter(instance=board.instance)} >= set(ids)
    scope = f"tasks:{board.sandbox.board_id}"
    saved = cursor_get(board.instance, scope)
    with board.sandbox.quiet():
        board.sandbox.move_card(ids[0], "Doing")
    polling.instance_poll(instance_id=board.instance.pk)
    assert board.link(ids[0]).external_state_category == "active"
    # the worker died after applying the pages, before their cursor was saved: the next pass re-lists
    cursor_save(board.instance, scope, saved)
    issues = Issue.objects.count()
    polling.instance_poll(instance_id=board.instance.pk)
    assert Issue.objects.count() == issues and TaskLink.objects.filter(instance=board.instance).count() == issues
    assert not Conflict.objects.exists()


# --- the Symphony profile ------------------------------------------------------------------------------
def test_symphony_active_list_moves_backlog_to_todo_and_wakes_the_assignee(company, sandbox, agents, monkeypatch, public,
                                                                          django_capture_on_commit_callbacks):
    instance = make_connector(company, sandbox, agents, monkeypatch, default_run_mode="symphony_compatible",
                              containers=[sandbox.board_id],
                              routing_rules=[{"kind": "default_route", "agentId": agents["coder"].pk}])
    b = Board(sandbox, instance, django_capture_on_commit_callbacks)
    card_id, link = b.imported("Fix login")
    wakes = WakeupRequest.objects.filter(source="connector")
    assert link.issue.status == "backlog" and not wakes.exists()  # backlog is never woken
    sandbox.move_card(card_id, "Doing")
    b.forward()
    link.refresh_from_db()
    assert link.issue.status == "todo"
    wake = wakes.get()
    assert wake.agent == agents["coder"] and wake.issue_id == link.issue_id
    packet = wake.context["taskPacket"]
    assert sandbox.card(card_id)["shortLink"] in packet and "untrusted input" in packet
    # done in Trello while the run is active: a closure conflict naming the person, nothing closed
    run = RunFactory(agent=agents["coder"], issue=link.issue, status="running")
    Issue.objects.filter(pk=link.issue_id).update(status="in_progress", checkout_run=run, execution_run=run)
    sandbox.move_card(card_id, "Done", actor="Carol Jones")
    b.forward()
    link.refresh_from_db()
    assert link.issue.status == "in_progress"
    assert Conflict.objects.filter(link=link, kind=ConflictKind.CLOSURE, status="open").count() == 1
    assert Comment.objects.filter(issue=link.issue, body__startswith="Carol Jones moved").exists()


def test_symphony_is_refused_when_no_list_is_mapped_active(company, sandbox, agents, monkeypatch):
    from issues.exceptions import Unprocessable

    with pytest.raises(Unprocessable) as exc:
        make_connector(company, sandbox, agents, monkeypatch, default_run_mode="symphony_compatible",
                       state_mapping={"lists": {"Done": "terminal"}})
    assert "active" in str(exc.value.details["defaultRunMode"][0])


def test_the_mapping_check_reads_each_boards_lists(board):
    from connectors.services.mapping_check import mapping_report

    ConnectorInstance.objects.filter(pk=board.instance.pk).update(state_mapping={
        "lists": {"Doing": "active", "Shipped": "terminal"},
        "boards": {BOARD: {"lists": {"Intermediate": "active", "Expert": "review"}}}})
    board.instance.refresh_from_db()
    report = mapping_report(board.instance)
    fields = {e["field"] for e in report["errors"]}
    assert f"stateMapping.boards.{BOARD}.lists.Expert" in fields and "stateMapping.lists.Shipped" in fields
    assert report["status"] == "invalid"
    assert any("'To Do'" in w["reason"] for w in report["warnings"])  # live but unmapped: inert backlog


# --- registration ---------------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_registration_passes_trellos_head_check_and_its_signed_deliveries_arrive(
        company, sandbox, agents, monkeypatch, live_server, settings):
    settings.CONNECTORS = {**settings.CONNECTORS, "PUBLIC_BASE_URL": live_server.url, "RETRY_BASE_SECONDS": 0.0}
    instance = make_connector(company, sandbox, agents, monkeypatch, containers=[sandbox.board_id])
    sandbox.callback_url = None  # deliveries go to the registered webhook only
    # queued: Trello delivers from its own side; a sync send from inside a sandbox request would hold the
    # sandbox while the live server, applying an earlier delivery, calls the sandbox (the backlink write)
    sandbox.delivery_mode = "queued"
    [entry] = webhooks_register(instance=instance)
    callback = webhook_url(instance, sandbox.board_id)
    assert entry["active"] and entry["callbackUrl"] == callback and "?scope=" in callback
    [hook] = sandbox.webhooks
    assert (hook["idModel"], hook["callbackURL"]) == (sandbox.board_id, callback)
    instance.refresh_from_db()
    assert instance.last_handshake_at is not None  # the HEAD check reached the real view
    # a person adds a card: Trello POSTs it, signed over the registered URL with its ?scope=
    card_id = sandbox.create_card("Registered and delivered", desc="It crashes.")["id"]
    sandbox.flush()
    [delivery] = [d for d in sandbox.deliveries if d.action_type == "createCard" and card_id in d.body.decode()]
    assert delivery.status == 202 and delivery.callback_url == callback
    assert TaskLink.objects.filter(instance=instance, external_task_id=card_id).exists()
    # registering again re-checks instead of creating a second webhook
    webhooks_register(instance=instance)
    assert len(sandbox.webhooks) == 1
    # Trello disabled it after failures: the re-verification says so in health
    sandbox.fail_webhook(hook["id"], 5, deactivate=True)
    instance.refresh_from_db()
    [checked] = webhooks_reverify(instance=instance)
    assert not checked["active"] and "5 consecutive failed deliveries" in checked["detail"]
    assert SyncError.objects.filter(instance=instance, category="config", message__contains="not active").exists()


def test_a_malformed_list_narrowing_is_refused_naming_the_field(company, sandbox, agents, monkeypatch):
    with pytest.raises(InvalidInput) as refused:
        make_connector(company, sandbox, agents, monkeypatch, config={"lists": {"not-a-board": []}})
    assert set(refused.value.details) == {"config.lists.not-a-board"}
    assert not ConnectorInstance.objects.filter(company=company).exists()
