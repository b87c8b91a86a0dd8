"""Trello adapter (layer 1, Appendix A.5): the real Trello payloads through webhook verification, and every
read and write over real HTTP against the Trello sandbox (listing cursors across pages, comments, lanes,
backlinks, rate limits, errors, mapping validation, webhook registration). No database needed."""
import base64
import hashlib
import hmac
import json
from pathlib import Path

import pytest

from connectors import sandbox as sandbox_pkg
from connectors.providers.base import (
    AdapterConfig,
    ErrorCategory,
    EventKind,
    ExternalTaskRef,
    ProviderError,
    StateCategory,
    WebhookRegistration,
    WebhookRejected,
    WebhookRequest,
    WebhookUnparseable,
    adapter_class,
)
from connectors.providers.trello import TrelloAdapter
from connectors.providers.trello.states import narrowing_errors
from connectors.providers.trello.webhook import sign
from connectors.sandbox import trello as trello_sb
from tests.trello_sandbox import (
    DEFAULT_STATE_MAPPING,
    SANDBOX_KEY,
    SANDBOX_TOKEN,
    make_trello_sandbox,
    trello_adapter_for,
)

FIXTURES = Path(sandbox_pkg.__file__).resolve().parent / "fixtures" / "trello"  # the real payloads, unchanged
BOARD = "53582e2da0fac5676a714277"  # the board of the real payloads
URL = "https://paperclip.example.com/api/connectors/11111111-2222-3333-4444-555555555555/webhook"
SECRET = "trello-app-secret"


def adapter(containers=(BOARD,), secret=SECRET, mapping=None, **kw):
    return TrelloAdapter(AdapterConfig(base_url="https://api.trello.com", containers=tuple(containers),
                                       state_mapping=DEFAULT_STATE_MAPPING if mapping is None else mapping,
                                       credentials="key:token", webhook_secret=secret, **kw))


def raw(name: str) -> bytes:
    return (FIXTURES / f"{name}.json").read_bytes()


def signed(body: bytes, *, url=URL, secret=SECRET, signed_url=None) -> WebhookRequest:
    return WebhookRequest(body=body, url=url, headers={"x-trello-webhook": sign(secret, body, signed_url or url),
                                                       "content-type": "application/json"})


def ref(card) -> ExternalTaskRef:
    return ExternalTaskRef(card["id"], card["shortLink"])


# --- signature -------------------------------------------------------------------------------------
def test_signature_is_base64_hmac_sha1_of_body_plus_callback_url():
    body = b'{"hello": "world"}'
    expected = base64.b64encode(hmac.new(b"secret", body + b"https://example.com/webhooks", hashlib.sha1).digest())
    assert sign("secret", body, "https://example.com/webhooks") == expected.decode()
    assert trello_sb.sign("secret", body, "https://example.com/webhooks") == expected.decode()


def test_every_real_payload_verifies_against_the_callback_url_it_was_signed_for():
    names = sorted(p.stem for p in FIXTURES.glob("*.json"))
    assert names == ["zulip_adding_comment_to_card", "zulip_changing_cards_list"]
    moved = adapter().verify_webhook(signed(raw("zulip_changing_cards_list")))
    assert (moved.event_id, moved.kind, moved.action) == ("572a340644ed9c7d8b6f9a30", EventKind.TASK_UPSERTED, "updateCard")
    # sparse: the engine reads the card back; the container is the board the payload names
    assert moved.task is None and moved.external_task_id == "53582e2da0fac5676a71427f" and moved.container_id == BOARD
    assert moved.actor.display_name == "TomaszKolek" and not moved.actor.is_connector_service_account
    comment = adapter().verify_webhook(signed(raw("zulip_adding_comment_to_card")))
    assert (comment.event_id, comment.kind) == ("5735bd3a54bf8d93c35149bb", EventKind.COMMENT_UPSERTED)
    c = comment.comment
    assert (c.external_comment_id, c.external_task_id, c.body) == ("5735bd3a54bf8d93c35149bb",
                                                                   "53582e2da0fac5676a714280", "New comment")
    assert c.author.display_name == "TomaszKolek" and c.url == "https://trello.com/c/xPKXoSTQ#comment-5735bd3a54bf8d93c35149bb"
    assert comment.container_id == BOARD and comment.task is None


@pytest.mark.parametrize("name", ["zulip_adding_comment_to_card", "zulip_changing_cards_list"])
def test_a_signature_for_another_url_secret_or_body_is_rejected(name):
    body = raw(name)
    query_url = URL + "?scope=" + BOARD
    good = signed(body).headers["x-trello-webhook"]
    for request in (signed(body, signed_url="https://evil.example.com/hook"),  # another callback URL
                    signed(body, url=query_url, signed_url=URL),  # registered with ?scope=, signed without
                    signed(body, secret="wrong-secret"),
                    WebhookRequest(body=body + b" ", url=URL, headers={"x-trello-webhook": good}),  # tampered
                    WebhookRequest(body=body, url=URL, headers={"x-trello-webhook": good[:-4] + "AAA="}),  # forged
                    WebhookRequest(body=body, url=URL, headers={})):  # missing
        with pytest.raises(WebhookRejected) as exc:
            adapter().verify_webhook(request)
        assert exc.value.category == ErrorCategory.WEBHOOK_SIGNATURE
    assert adapter().verify_webhook(signed(body, url=query_url)).event_id  # the exact registered URL verifies
    with pytest.raises(WebhookRejected):
        adapter(secret=None).verify_webhook(signed(body))
    with pytest.raises(WebhookRejected):  # no public URL known: nothing to check the signature against
        adapter().verify_webhook(signed(body, url="", signed_url=URL))


def test_a_payload_for_another_board_is_refused_and_garbage_is_unparseable():
    with pytest.raises(WebhookRejected) as exc:
        adapter(containers=("0123456789abcdef01234567",)).verify_webhook(signed(raw("zulip_changing_cards_list")))
    assert exc.value.category == ErrorCategory.PROVIDER_PAYLOAD
    for body in (b"not json", b"[]", b'{"model": {}}', b'{"action": {"id": "x"}}'):
        with pytest.raises(WebhookUnparseable):
            adapter().verify_webhook(signed(body))


def test_head_is_the_callback_check_and_posts_are_deliveries():
    reply = adapter(secret=None).webhook_handshake(WebhookRequest(body=b"", headers={}, url=URL, method="HEAD"))
    assert reply.status == 200 and reply.secret is None
    assert adapter().webhook_handshake(signed(raw("zulip_changing_cards_list"))) is None


def _action(type_, data, action_id="6a0000000000000000000001", member=None):
    member = member or {"id": "53582e2da0fac5676a714276", "username": "tomaszkolek", "fullName": "Tomasz"}
    return json.dumps({"model": {"id": BOARD, "name": "Welcome Board", "prefs": {}}, "action": {
        "id": action_id, "type": type_, "date": "2026-01-01T00:00:00.000Z", "data": {
            "board": {"id": BOARD, "name": "Welcome Board"}, **data}, "memberCreator": member,
        "idMemberCreator": member["id"]}}).encode()


CARD = {"id": "53582e2da0fac5676a71427f", "name": "This is a card.", "shortLink": "r33ylX2Z", "idShort": 2}
BASICS, INTERMEDIATE = {"id": "53582e2da0fac5676a714279", "name": "Basics"}, {"id": "53582e2da0fac5676a71427a",
                                                                              "name": "Intermediate"}


@pytest.mark.parametrize("type_,data,kind,action", [
    ("createCard", {"card": CARD, "list": BASICS}, EventKind.TASK_UPSERTED, "createCard"),
    ("updateCard", {"card": {**CARD, "closed": True}, "old": {"closed": False}, "list": BASICS},
     EventKind.TASK_UPSERTED, "updateCard"),
    ("deleteCard", {"card": {"id": CARD["id"], "idShort": 2}, "list": BASICS}, EventKind.TASK_DELETED, "deleteCard"),
    ("moveCardFromBoard", {"card": CARD, "boardTarget": {"id": "0123456789abcdef01234567"}}, EventKind.TASK_DELETED,
     "moveCardFromBoard;transfer"),
    ("moveCardToBoard", {"card": CARD, "boardSource": {"id": "0123456789abcdef01234567"}, "list": BASICS},
     EventKind.TASK_UPSERTED, "moveCardToBoard"),
    ("updateComment", {"card": CARD, "action": {"id": "6a00000000000000000000aa", "text": "edited"},
                       "old": {"text": "orig"}}, EventKind.COMMENT_UPSERTED, "updateComment"),
    ("deleteComment", {"card": CARD, "action": {"id": "6a00000000000000000000aa"}}, EventKind.COMMENT_DELETED,
     "deleteComment"),
    ("addAttachmentToCard", {"card": CARD, "attachment": {"id": "x"}}, EventKind.IGNORED, "addAttachmentToCard"),
    ("updateList", {"list": BASICS}, EventKind.IGNORED, "updateList"),
])
def test_action_types_become_the_protocol_events(type_, data, kind, action):
    event = adapter().verify_webhook(signed(_action(type_, data)))
    assert (event.kind, event.action) == (kind, action)
    assert event.event_id == "6a0000000000000000000001"
    if kind in (EventKind.COMMENT_UPSERTED, EventKind.COMMENT_DELETED):
        assert event.comment.external_comment_id == "6a00000000000000000000aa"  # the comment's own id
        assert event.external_task_id == CARD["id"]
        if type_ == "updateComment":
            assert event.comment.body == "edited" and event.comment.updated_at is not None


def test_narrowed_lists_decide_which_card_actions_are_the_connectors():
    narrow = adapter(options={"lists": {BOARD: [BASICS["id"]]}})
    moved_out = narrow.verify_webhook(signed(raw("zulip_changing_cards_list")))  # Basics -> Intermediate
    assert (moved_out.kind, moved_out.action) == (EventKind.TASK_DELETED, "updateCard;transfer:out-of-lists")
    into = adapter(options={"lists": {BOARD: ["Intermediate"]}}).verify_webhook(signed(raw("zulip_changing_cards_list")))
    assert into.kind == EventKind.TASK_UPSERTED  # by list name, too
    elsewhere = narrow.verify_webhook(signed(_action("createCard", {"card": CARD, "list": INTERMEDIATE})))
    assert (elsewhere.kind, elsewhere.action) == (EventKind.IGNORED, "createCard;outside-lists")
    unknown = narrow.verify_webhook(signed(_action("addLabelToCard", {"card": CARD, "label": {"id": "l"}})))
    assert unknown.action == "addLabelToCard;list-unknown" and unknown.kind == EventKind.IGNORED
    comment = adapter(options={"lists": {BOARD: ["Intermediate"]}}).verify_webhook(signed(raw("zulip_adding_comment_to_card")))
    assert comment.kind == EventKind.IGNORED  # the comment's card is in Basics
    assert narrowing_errors({"lists": {BOARD: []}}) and narrowing_errors({"lists": ["x"]})
    assert narrowing_errors({"lists": {BOARD: [BASICS["id"], "Doing"]}}) == {}


def test_the_connectors_own_member_is_the_service_account():
    own = adapter(service_account_id="53582e2da0fac5676a714276").verify_webhook(signed(raw("zulip_adding_comment_to_card")))
    assert own.comment.author.is_connector_service_account and own.actor.is_connector_service_account
    by_name = adapter(service_account_id="tomaszkolek").verify_webhook(signed(raw("zulip_changing_cards_list")))
    assert by_name.actor.is_connector_service_account


# --- state mapping -----------------------------------------------------------------------------------
def test_mapping_validation_names_each_bad_field():
    a = adapter()
    assert a.validate_state_mapping(DEFAULT_STATE_MAPPING) == {}
    assert a.validate_state_mapping({}) == {}
    errors = a.validate_state_mapping({"lists": {"Doing": "started"}, "listIds": {"Doing": "active"},
                                       "boards": {BOARD: {"lists": {"QA": "review"}, "states": {}}}, "closed": "terminal"})
    assert set(errors) == {"lists.Doing", "listIds.Doing", f"boards.{BOARD}.states", "closed"}
    assert a.validate_state_mapping([]) == {"stateMapping": ["must be an object"]}


def test_lists_map_to_categories_and_an_archived_card_is_terminal(trello_sandbox):
    sb = trello_sandbox
    qa = sb.list_id("Paperclip: QA")
    a = trello_adapter_for(sb, state_mapping={"lists": {"Doing": "active"}, "listIds": {qa: "review"},
                                              "boards": {sb.board_id: {"lists": {"Done": "terminal"}}}})
    cards = {name: sb.create_card(name, list=name) for name in ("To Do", "Doing", "Paperclip: QA", "Done")}
    states = {name: a.get_task(ref(card)).state for name, card in cards.items()}
    assert states["Doing"].category == "active" and states["Paperclip: QA"].category == "review"
    assert states["Done"].category == "terminal"
    todo = a.get_task(ref(cards["To Do"]))  # the mapping names lists, not this one: backlog, reported
    assert todo.state.category == "backlog" and todo.envelope["unmappedState"] == "To Do"
    sb.archive_card(cards["Doing"]["id"])
    archived = a.get_task(ref(cards["Doing"]))
    assert (archived.state.name, archived.state.category) == ("Archived", "terminal")
    # no mapping at all: imports without configuration (open -> backlog, archived -> terminal), nothing unmapped
    plain = trello_adapter_for(sb, state_mapping={})
    assert plain.get_task(ref(cards["Done"])).state.category == "backlog"
    assert plain.get_task(ref(cards["Done"])).envelope["stateMapped"] is True
    assert plain.get_task(ref(cards["Doing"])).state.category == "terminal"


def test_workflow_metadata_is_the_boards_open_lists(trello_sandbox):
    sb = trello_sandbox
    sb.add_list(sb.board_id, "Old", closed=True)
    meta = trello_adapter_for(sb, state_mapping={"lists": {"Doing": "active"}}).workflow_metadata(sb.board_id)
    assert [s["name"] for s in meta["states"]] == ["To Do", "Doing", "Paperclip: QA", "Done"]
    assert [s["mapped"] for s in meta["states"]] == [False, True, False, False]
    assert meta["nameSections"] == ["lists"] and meta["overrideSection"] == "boards"
    assert sb.board_id in meta["keys"] and meta["containerKind"] == "board"


def test_symphony_needs_a_list_mapped_to_active():
    assert adapter(mapping={"lists": {"To Do": "backlog"}}).run_mode_refusal("symphony_compatible")
    assert adapter().run_mode_refusal("symphony_compatible") is None
    assert adapter(mapping={}).run_mode_refusal("paperclip_controlled") is None


# --- listing with cursors ------------------------------------------------------------------------------
def test_listing_walks_pages_by_last_activity_and_resumes_after_a_crash(trello_sandbox):
    sb = trello_sandbox
    a = trello_adapter_for(sb, page_size=2)
    made = [sb.create_card(f"Card {n}", list="To Do" if n % 2 else "Doing") for n in range(5)]
    seen, cursor, pages = [], None, 0
    while True:
        page = a.list_candidate_tasks(sb.board_id, cursor)
        if page.cursor is None:
            assert not page.items
            break
        pages += 1
        seen += [t.title for t in page.items]
        if pages == 2:
            # the worker died before saving this page's cursor: the same page again, nothing skipped
            again = a.list_candidate_tasks(sb.board_id, cursor)
            assert [t.external_id for t in again.items] == [t.external_id for t in page.items]
            assert again.cursor == page.cursor
        cursor = page.cursor
    assert seen == [f"Card {n}" for n in range(5)] and pages == 3
    # a change moves one card past the mark: only it is listed again
    sb.move_card(made[1]["id"], "Done")
    page = a.list_candidate_tasks(sb.board_id, cursor)
    assert [t.external_id for t in page.items] == [made[1]["id"]] and page.items[0].state.name == "Done"
    assert a.list_candidate_tasks(sb.board_id, page.cursor).cursor is None
    # an archive is a change too (filter=all)
    sb.archive_card(made[2]["id"])
    page = a.list_candidate_tasks(sb.board_id, page.cursor)
    assert [(t.external_id, t.state.category) for t in page.items] == [(made[2]["id"], "terminal")]
    [req] = sb.requests_to(r"/boards/[0-9a-f]+/cards$")[-1:]
    assert req.query["filter"] == ["all"]


def test_cards_with_the_same_activity_time_are_neither_skipped_nor_repeated(trello_sandbox):
    sb = trello_sandbox
    sb.tick = 0  # every card changes at the same millisecond
    ids = {sb.create_card(f"Same {n}")["id"] for n in range(5)}
    a = trello_adapter_for(sb, page_size=2)
    listed, cursor = [], None
    for _ in range(10):
        page = a.list_candidate_tasks(sb.board_id, cursor)
        if not page.cursor:
            break
        listed += [t.external_id for t in page.items]
        cursor = page.cursor
    assert sorted(listed) == sorted(ids) and len(listed) == 5


def test_since_cursor_starts_at_a_time_and_bad_cursors_are_cursor_invalid(trello_sandbox):
    sb = trello_sandbox
    a = trello_adapter_for(sb)
    sb.create_card("Old")
    mark = sb.advance(3600)
    sb.create_card("New")
    from connectors.providers.http import parse_utc

    page = a.list_candidate_tasks(sb.board_id, a.since_cursor(sb.board_id, parse_utc(mark)))
    assert [t.title for t in page.items] == ["New"]
    for bad in ("nope", json.dumps({"v": 1, "scope": "0123456789abcdef01234567", "since": None, "seen": []}),
                json.dumps({"v": 2})):
        with pytest.raises(ProviderError) as exc:
            a.list_candidate_tasks(sb.board_id, bad)
        assert exc.value.category == ErrorCategory.CURSOR_INVALID


def test_listing_skips_cards_outside_the_narrowed_lists_but_moves_past_them(trello_sandbox):
    sb = trello_sandbox
    a = trello_adapter_for(sb, options={"lists": {sb.board_id: ["Doing", sb.list_id("Paperclip: QA")]}})
    outside = sb.create_card("Backlog idea", list="To Do")
    inside = sb.create_card("Being done", list="Doing")
    page = a.list_candidate_tasks(sb.board_id, None)
    assert [t.external_id for t in page.items] == [inside["id"]]
    assert a.list_candidate_tasks(sb.board_id, page.cursor).cursor is None
    with pytest.raises(ProviderError) as exc:
        a.get_task(ref(outside))
    assert exc.value.status == 404
    states = a.get_task_states([ref(outside), ref(inside)])
    assert states[outside["id"]] is None and states[inside["id"]].category == "active"


# --- reads ---------------------------------------------------------------------------------------------
def test_a_card_normalizes_with_members_labels_and_raw_lane_values(trello_sandbox):
    sb = trello_sandbox
    alice = sb.add_member("alice", full_name="Alice Smith")
    card = sb.create_card("Fix @bob login", list="Doing", desc="Steps: ask @carol", labels=["Bug", "green"],
                          members=["alice"], due="2026-02-01T12:00:00.000Z")
    task = trello_adapter_for(sb).get_task(ref(card))
    assert (task.external_id, task.external_key, task.container_id) == (card["id"], card["shortLink"], sb.board_id)
    assert task.title == "Fix bob login" and task.description == "Steps: ask carol"
    assert task.envelope["mentionsNeutralized"] == ["bob", "carol"]
    assert task.labels == ("bug", "green") and task.priority is None and task.blocked_by == ()
    assert [(m.external_user_id, m.display_name) for m in task.assignees] == [(alice["id"], "alice")]
    assert task.url.startswith(f"https://trello.com/c/{card['shortLink']}/")
    assert task.state.name == "Doing" and task.envelope["idList"] == sb.list_id("Doing")
    assert task.envelope["pos"] is not None and task.envelope["priority"] is None
    assert task.due_at.isoformat() == "2026-02-01T12:00:00+00:00"
    assert task.created_at is not None and task.revision == sb.card(card["id"])["dateLastActivity"]
    # by shortLink as well (what a human copies from the URL)
    assert trello_adapter_for(sb).get_task(ExternalTaskRef(card["shortLink"])).external_id == card["id"]


def test_get_task_states_batches_and_reports_gone_cards(trello_sandbox):
    sb = trello_sandbox
    other = sb.add_board("Other", ["Inbox"])
    cards = [sb.create_card(f"C{n}", list="Doing") for n in range(12)]
    sb.delete_card(cards[0]["id"])
    sb.archive_card(cards[1]["id"])
    sb.move_card_to_board(cards[2]["id"], other["id"])
    sb.clear_requests()
    states = trello_adapter_for(sb).get_task_states([ref(c) for c in cards])
    assert states[cards[0]["id"]] is None and states[cards[2]["id"]] is None
    assert states[cards[1]["id"]].category == "terminal" and states[cards[5]["id"]].name == "Doing"
    assert len(sb.requests_to(r"^/batch$")) == 2  # 12 cards, 10 per batch


def test_comments_page_through_the_thread_and_pick_up_edits(trello_sandbox):
    sb = trello_sandbox
    card = sb.create_card("Talk")
    ids = [sb.add_comment(card["id"], f"comment {n}")["id"] for n in range(5)]
    a = trello_adapter_for(sb, comment_page_size=2)
    sb.clear_requests()
    page = a.list_comments(ref(card), None)
    assert sorted(c.external_comment_id for c in page.items) == sorted(ids)
    assert [r.query.get("before") for r in sb.requests] == [None, [ids[3]], [ids[1]]]  # newest first, 2 a page
    cursor = page.cursor
    assert a.list_comments(ref(card), cursor).cursor is None  # nothing new
    sb.edit_comment(ids[1], "comment 1 (edited)")  # Trello cannot list by edit time: the pass finds it
    page = a.list_comments(ref(card), cursor)
    [edited] = page.items
    assert (edited.external_comment_id, edited.body) == (ids[1], "comment 1 (edited)")
    assert edited.updated_at > edited.created_at
    assert a.list_comments(ref(card), page.cursor).cursor is None
    new = sb.add_comment(card["id"], "a new one")["id"]
    assert [c.external_comment_id for c in a.list_comments(ref(card), page.cursor).items] == [new]


def test_a_thread_longer_than_one_call_continues_from_a_mid_pass_cursor(trello_sandbox, monkeypatch):
    from connectors.providers import trello as trello_module

    sb = trello_sandbox
    card = sb.create_card("Long")
    ids = [sb.add_comment(card["id"], f"c{n}")["id"] for n in range(5)]
    monkeypatch.setattr(trello_module, "MAX_COMMENT_PAGES", 1)
    a = trello_adapter_for(sb, comment_page_size=2)
    got, cursor = [], None
    for _ in range(6):
        page = a.list_comments(ref(card), cursor)
        got += [c.external_comment_id for c in page.items]
        if not page.cursor:
            break
        cursor = page.cursor
    assert sorted(got) == sorted(ids) and len(got) == 5
    # the next pass (nothing new) walks the thread again, call by call, and comes back to the same mark
    # (the poller stops at its page bound)
    pages = [a.list_comments(ref(card), cursor)]
    for _ in range(2):
        pages.append(a.list_comments(ref(card), pages[-1].cursor))
    assert not any(p.items for p in pages) and pages[-1].cursor == cursor


# --- writes --------------------------------------------------------------------------------------------
def test_writes_move_archive_comment_and_set_fields(trello_sandbox):
    sb = trello_sandbox
    card = sb.create_card("Write me")
    a = trello_adapter_for(sb)
    a.update_task_state(ref(card), "Doing")
    assert sb.list_name(card["id"]) == "Doing"
    a.update_task_state(ref(card), sb.list_id("Paperclip: QA"))  # by list id too
    assert sb.list_name(card["id"]) == "Paperclip: QA"
    assert a.state_for_category(ref(card), "active") == "Doing"
    assert a.state_for_category(ref(card), "terminal") == "Done"
    assert trello_adapter_for(sb, state_mapping={}).state_for_category(ref(card), "terminal") == "Archived"
    assert trello_adapter_for(sb, state_mapping={}).state_for_category(ref(card), "active") is None
    a.update_task_state(ref(card), "Archived")
    assert sb.card(card["id"])["closed"] is True
    a.update_task_state(ref(card), "To Do")  # reopening moves it back and unarchives it
    assert sb.card(card["id"])["closed"] is False and sb.list_name(card["id"]) == "To Do"
    with pytest.raises(ProviderError) as exc:
        a.update_task_state(ref(card), "Nowhere")
    assert exc.value.category == ErrorCategory.PROVIDER_PAYLOAD
    a.set_fields(ref(card), {"title": "Renamed", "description": "Now with detail", "dueAt": "2026-03-01"})
    shown = sb.card(card["id"])
    assert (shown["name"], shown["desc"], shown["due"]) == ("Renamed", "Now with detail", "2026-03-01T00:00:00.000Z")
    with pytest.raises(ProviderError):
        a.set_fields(ref(card), {"priority": 1})
    comment_id = a.post_comment(ref(card), "Plan ready\n\n<!-- paperclip:effect:7 -->")
    [mine] = [c for c in a.list_comments(ref(card), None).items if c.external_comment_id == comment_id]
    assert "<!-- paperclip:effect:7 -->" in mine.body and mine.author.is_connector_service_account
    # every API write is recorded as the token's member: its webhooks are echoes
    assert {d.payload["action"]["memberCreator"]["id"] for d in sb.deliveries[-3:]} == {sb.service_member["id"]}


def test_create_task_lands_in_the_mapped_backlog_list_or_the_named_one(trello_sandbox):
    sb = trello_sandbox
    a = trello_adapter_for(sb)
    task = a.create_task(sb.board_id, {"title": "Exported", "description": "From Paperclip"})
    assert (task.title, task.description, task.state.name) == ("Exported", "From Paperclip", "To Do")
    doing = a.create_task(sb.board_id, {"title": "Started", "state": "Doing"})
    assert doing.state.category == "active" and doing.container_id == sb.board_id
    with pytest.raises(ProviderError):
        a.create_task(sb.board_id, {"title": " "})


def test_backlink_is_one_marked_attachment_read_back_by_find_backlinks(trello_sandbox):
    sb = trello_sandbox
    card = sb.create_card("Linked")
    a = trello_adapter_for(sb)
    url = "http://127.0.0.1:8000/issues/PC-1"
    a.set_backlink(ref(card), url)
    a.set_backlink(ref(card), url)  # a retried effect adds nothing
    assert [x["url"] for x in sb.attachments_of(card["id"])] == [url]
    assert a.find_backlinks(ref(card)) == [url]
    # a comment or an attachment of someone else's that merely carries a Paperclip URL is no backlink
    sb.add_comment(card["id"], f"see {url.replace('PC-1', 'PC-2')}")
    assert a.find_backlinks(ref(sb.create_card("Plain"))) == []


# --- errors and rate limits ------------------------------------------------------------------------------
def test_a_429_without_retry_after_waits_one_trello_window(trello_sandbox):
    sb = trello_sandbox
    a = trello_adapter_for(sb)
    sb.fail_next(1, "rate_limit")
    with pytest.raises(ProviderError) as exc:
        a.list_candidate_tasks(sb.board_id, None)
    assert (exc.value.category, exc.value.status, exc.value.retry_after) == (ErrorCategory.PROVIDER_RATE_LIMITED, 429, 10.0)
    assert "Rate limit exceeded" in str(exc.value)
    sb.fail_next(1, "key_limit")
    with pytest.raises(ProviderError) as exc:
        a.get_task_states([ExternalTaskRef("0123456789abcdef01234567")])
    assert exc.value.category == ErrorCategory.PROVIDER_RATE_LIMITED
    assert a.list_candidate_tasks(sb.board_id, None).cursor is None  # recovered


def test_the_sandbox_enforces_the_per_token_limit_like_trello():
    with make_trello_sandbox(rate_limit=3, rate_window=60.0) as sb:
        a = trello_adapter_for(sb)
        for _ in range(3):
            a.list_candidate_tasks(sb.board_id, None)
        with pytest.raises(ProviderError) as exc:
            a.list_candidate_tasks(sb.board_id, None)
        assert exc.value.category == ErrorCategory.PROVIDER_RATE_LIMITED and exc.value.retry_after == 10.0
        [limited] = [r for r in sb.requests if r.status == 429]
        assert limited.path.endswith("/cards")


def test_bad_responses_map_to_categories(trello_sandbox):
    sb = trello_sandbox
    with pytest.raises(ProviderError) as exc:
        trello_adapter_for(sb, credentials=f"{SANDBOX_KEY}:wrong").get_task(ExternalTaskRef("x"))
    assert exc.value.category == ErrorCategory.PROVIDER_AUTH and "invalid token" in str(exc.value)
    with pytest.raises(ProviderError) as exc:
        trello_adapter_for(sb, credentials="no-colon-here").get_task(ExternalTaskRef("x"))
    assert exc.value.category == ErrorCategory.CONFIG
    with pytest.raises(ProviderError) as exc:
        trello_adapter_for(sb).get_task(ExternalTaskRef("0123456789abcdef01234567"))
    assert (exc.value.category, exc.value.status) == (ErrorCategory.PROVIDER_STATUS, 404)
    sb.fail_next(1, "error", status=502)
    with pytest.raises(ProviderError) as exc:
        trello_adapter_for(sb).list_candidate_tasks(sb.board_id, None)
    assert (exc.value.category, exc.value.status) == (ErrorCategory.PROVIDER_STATUS, 502)
    sb.fail_next(1, "auth")
    with pytest.raises(ProviderError) as exc:
        trello_adapter_for(sb).list_comments(ExternalTaskRef("x"), None)
    assert exc.value.category == ErrorCategory.PROVIDER_AUTH
    with pytest.raises(ProviderError) as exc:
        trello_adapter_for(sb).list_candidate_tasks("0123456789abcdef01234567", None)
    assert exc.value.category == ErrorCategory.PROVIDER_PAYLOAD  # not one of the connector's boards
    sb.stop()
    with pytest.raises(ProviderError) as exc:
        trello_adapter_for(sb).get_task(ExternalTaskRef("x"))
    assert exc.value.category == ErrorCategory.PROVIDER_REQUEST


def test_requests_authenticate_with_the_oauth_header_not_the_query(trello_sandbox):
    sb = trello_sandbox
    trello_adapter_for(sb).list_candidate_tasks(sb.board_id, None)
    req = sb.requests[-1]
    assert req.headers["authorization"] == f'OAuth oauth_consumer_key="{SANDBOX_KEY}", oauth_token="{SANDBOX_TOKEN}"'
    assert "token" not in req.query and "key" not in req.query


# --- registration ------------------------------------------------------------------------------------------
def test_registration_needs_the_head_check_and_reverify_reads_trellos_view(trello_sandbox):
    sb = trello_sandbox
    a = trello_adapter_for(sb)
    with pytest.raises(ProviderError) as exc:  # nothing answers HEAD there: Trello refuses to create it
        a.register_webhook(sb.board_id, "http://127.0.0.1:9/api/connectors/x/webhook")
    assert exc.value.status == 400 and "did not return 200" in str(exc.value)
    assert sb.webhooks == []
    # the sandbox itself answers HEAD /1/members/me with 200: a stand-in callback for this adapter-level test
    callback = f"{sb.base_url}/1/members/me?key={SANDBOX_KEY}&token={SANDBOX_TOKEN}"
    reg = a.register_webhook(sb.board_id, callback)
    assert (reg.scope, reg.callback_url, reg.active) == (sb.board_id, callback, True)
    assert sb.webhooks[0]["idModel"] == sb.board_id and sb.webhooks[0]["callbackURL"] == callback
    assert a.register_webhook(sb.board_id, callback).external_id == reg.external_id  # idempotent
    assert a.check_webhook(reg).active
    sb.fail_webhook(reg.external_id, 3, deactivate=True)
    checked = a.check_webhook(reg)
    assert not checked.active and "3 consecutive failed deliveries" in checked.detail
    gone = a.check_webhook(WebhookRegistration(sb.board_id, "0123456789abcdef01234567", callback))
    assert not gone.active and "gone" in gone.detail


def test_the_adapter_is_registered_and_declares_honest_capabilities():
    cls = adapter_class("trello")
    caps = cls.capabilities
    assert cls is TrelloAdapter and "custom_field" not in caps.routing_rule_kinds
    assert {"register_webhook", "check_webhook", "find_backlinks", "set_backlink"} <= caps.operations
    assert caps.settable_fields == frozenset({"title", "description"}) and caps.signed_webhooks
    assert StateCategory.REVIEW in caps.state_categories
    assert "<api key>:<token>" in cls.setup_help["credentials"] and cls.display_name == "Trello"
