"""The Notion adapter against the Notion sandbox over real HTTP (Appendix A.4): listings with cursors
across pages (database, parent page, workspace), Notion's minute-precision ``last_edited_time``, a crash
between a page and its cursor save, reads, comments, writes, the verification handshake and webhook
verification, rate limits and error categories, and the state mapping checked against the live schema."""
from __future__ import annotations

import json

import httpx
import pytest

from connectors.providers.base import (
    ErrorCategory,
    EventKind,
    ExternalTaskRef,
    ProviderError,
    WebhookRejected,
    WebhookRequest,
    adapter_class,
)
from connectors.providers.notion import NotionAdapter, richtext
from connectors.sandbox.notion import sign
from connectors.services.mapping_check import mapping_report
from connectors.services.instances import instance_create
from issues.actors import SYSTEM
from tests.notion_sandbox import (
    FIXTURE_PAGE_ID,
    SANDBOX_TOKEN,
    STATE_MAPPING,
    VERIFICATION_TOKEN,
    WORKSPACE_ID,
    make_sandbox,
    notion_adapter_for,
)


def walk(adapter, scope, cursor=None, limit=20):
    """Every item until the listing says nothing more (cursor None or unchanged) -> (items, last cursor)."""
    items = []
    for _ in range(limit):
        page = adapter.list_candidate_tasks(scope, cursor)
        items += page.items
        if not page.cursor or page.cursor == cursor:
            return items, cursor
        cursor = page.cursor
    raise AssertionError("the listing never ended")


def test_the_provider_is_registered_with_honest_capabilities():
    cls = adapter_class("notion")
    caps = cls.capabilities
    assert cls is NotionAdapter and cls.display_name == "Notion"
    assert "register_webhook" not in caps.operations and "check_webhook" not in caps.operations
    assert "custom_field" not in caps.routing_rule_kinds and caps.settable_fields == {"title"}
    assert caps.signed_webhooks and not caps.has_external_keys
    assert cls.container_key("153104CD-477E-809D-8DC4-FF2D96AE3090") == cls.container_key("153104cd477e809d8dc4ff2d96ae3090")
    assert cls.setup_help["stateMappingExample"] and json.loads(cls.setup_help["stateMappingExample"])["property"]


# --- listing ---------------------------------------------------------------------------------------------
def test_database_listing_walks_pages_and_moves_the_high_water_mark(notion_sandbox):
    sb = notion_sandbox
    db = sb.tasks["id"]
    adapter = notion_adapter_for(sb, page_size=2)
    ids = [sb.add_page(f"Task {n}", database=db, content=f"Body {n}")["id"] for n in range(5)]
    items, cursor = walk(adapter, db)
    assert [t.external_id for t in items] == sorted(ids)  # one minute: Notion's order is then by id here
    queries = sb.requests_to(rf"^/databases/{db}/query$", "POST")
    assert queries[0].body["sorts"] == [{"timestamp": "last_edited_time", "direction": "ascending"}]
    assert "filter" not in queries[0].body and all(q.body["page_size"] == 2 for q in queries)
    assert queries[1].body["start_cursor"] and queries[0].headers["notion-version"] == "2022-06-28"
    assert queries[0].headers["authorization"] == f"Bearer {SANDBOX_TOKEN}"
    # nothing changed: nothing listed (the boundary minute's pages are recognised by their marks)
    again, cursor = walk(adapter, db, cursor)
    assert again == []
    # an edit within the same minute (Notion's last_edited_time does not move): still listed, once
    sb.update_page(ids[1], title="Task 1 (renamed)")
    again, cursor = walk(adapter, db, cursor)
    assert [(t.external_id, t.title) for t in again] == [(ids[1], "Task 1 (renamed)")]
    assert walk(adapter, db, cursor)[0] == []
    # minutes later: the filter is on_or_after the high-water minute
    sb.advance(300)
    sb.update_page(ids[3], status="In progress")
    again, cursor = walk(adapter, db, cursor)
    assert [(t.external_id, t.state.category) for t in again] == [(ids[3], "active")]
    flt = sb.requests_to(rf"^/databases/{db}/query$", "POST")[-1].body["filter"]
    assert flt["timestamp"] == "last_edited_time" and set(flt["last_edited_time"]) == {"on_or_after"}
    assert json.loads(cursor)["kind"] == "database"


def test_a_crash_between_a_page_and_its_cursor_save_lists_the_page_again(notion_sandbox):
    sb = notion_sandbox
    db = sb.tasks["id"]
    adapter = notion_adapter_for(sb, page_size=2)
    for n in range(3):
        sb.add_page(f"Task {n}", database=db)
    first = adapter.list_candidate_tasks(db, None)
    # the caller died before it stored first.cursor: the same call again returns the same page
    retry = adapter.list_candidate_tasks(db, None)
    assert [t.external_id for t in retry.items] == [t.external_id for t in first.items]
    assert [t.revision for t in retry.items] == [t.revision for t in first.items]  # same inbound keys
    assert retry.cursor == first.cursor
    rest = adapter.list_candidate_tasks(db, first.cursor)
    assert len(rest.items) == 1


def test_parent_page_and_workspace_containers(notion_sandbox):
    sb = notion_sandbox
    parent = sb.add_page("Team space", workspace=True)
    children = [sb.add_page(f"Note {n}", parent_page=parent["id"], content="hello")["id"] for n in range(3)]
    undashed = parent["id"].replace("-", "").upper()
    adapter = notion_adapter_for(sb, containers=(undashed, WORKSPACE_ID), page_size=2)
    items, cursor = walk(adapter, undashed)
    assert sorted(t.external_id for t in items) == sorted(children)
    assert {t.container_id for t in items} == {undashed}  # the configured spelling
    assert {t.state.name for t in items} == {"Open"} and items[0].description == "hello"
    assert json.loads(cursor)["kind"] == "page"
    sb.advance(120)
    sb.update_page(children[0], title="Note 0 (edited)")
    assert [t.title for t in walk(adapter, undashed, cursor)[0]] == ["Note 0 (edited)"]
    # the workspace: its top-level pages (the parent page and the real fixture's page), not the children
    sb.add_page("Quarterly plan", workspace=True, page_id=FIXTURE_PAGE_ID)
    top, _ = walk(adapter, WORKSPACE_ID)
    assert sorted(t.title for t in top) == ["Quarterly plan", "Team space"]
    assert {t.container_id for t in top} == {WORKSPACE_ID}
    fixture_page = adapter.get_task(ExternalTaskRef(FIXTURE_PAGE_ID.replace("-", "")))
    assert fixture_page.container_id == WORKSPACE_ID and fixture_page.external_id == FIXTURE_PAGE_ID


def test_a_cursor_of_another_scope_or_shape_is_cursor_invalid(notion_sandbox):
    sb = notion_sandbox
    adapter = notion_adapter_for(sb)
    with pytest.raises(ProviderError) as exc:
        adapter.list_candidate_tasks(sb.tasks["id"], json.dumps({"v": 1, "scope": "other", "since": None, "seen": []}))
    assert exc.value.category == ErrorCategory.CURSOR_INVALID
    bad = json.dumps({"v": 1, "scope": sb.tasks["id"], "since": None, "seen": [], "hw": None, "hwSeen": [],
                      "after": "not-a-cursor", "kind": "database"})
    with pytest.raises(ProviderError) as exc:
        adapter.list_candidate_tasks(sb.tasks["id"], bad)  # Notion: 400 validation_error on start_cursor
    assert exc.value.category == ErrorCategory.CURSOR_INVALID
    with pytest.raises(ProviderError) as exc:
        adapter.list_candidate_tasks("9b1c0000-0000-0000-0000-000000000000", None)
    assert exc.value.category == ErrorCategory.PROVIDER_PAYLOAD  # not a configured container


def test_since_cursor_starts_at_the_minute(notion_sandbox):
    from datetime import datetime, timezone

    adapter = notion_adapter_for(notion_sandbox)
    cursor = json.loads(adapter.since_cursor(notion_sandbox.tasks["id"], datetime(2026, 1, 1, 0, 0, 42, tzinfo=timezone.utc)))
    assert cursor["since"] == "2026-01-01T00:00:00.000Z"


# --- reads -------------------------------------------------------------------------------------------------
def test_get_task_normalizes_properties_and_content(notion_sandbox):
    sb = notion_sandbox
    other = sb.add_page("Blocker", database=sb.tasks["id"])
    page = sb.add_page("Fix login", database=sb.tasks["id"], status="In review", tags=["Bug", " UI "],
                       assignee="Grace Hopper", due="2026-02-03", priority="High", blocked_by=[other["id"]],
                       content="It crashes when @bob logs in.\n\nSecond paragraph.")
    adapter = notion_adapter_for(sb)
    task = adapter.get_task(ExternalTaskRef(page["id"]))
    assert task.title == "Fix login" and task.external_key is None
    assert (task.state.name, task.state.category) == ("In review", "review")
    assert task.description == "It crashes when bob logs in.\n\nSecond paragraph."
    assert task.labels == ("bug", "ui") and [a.display_name for a in task.assignees] == ["Grace Hopper"]
    assert task.due_at.isoformat() == "2026-02-03T00:00:00+00:00"
    assert task.priority is None and task.blocked_by == ()  # none natively: raw values in the envelope
    env = task.envelope
    assert env["priority"] == "High" and env["relations"] == {"Blocked by": [other["id"]]}
    assert env["propertySchema"]["Status"]["type"] == "status" and env["stateValue"]["name"] == "In review"
    assert [b["type"] for b in env["blocks"]] == ["paragraph", "paragraph"]
    assert env["mentionsNeutralized"] == ["bob"] and env["stateMapped"] is True
    assert task.url.endswith(page["id"].replace("-", "")) and task.container_id == sb.tasks["id"]
    # an option the mapping does not name is backlog and reported (§7.2)
    partial = notion_adapter_for(sb, state_mapping={"property": "Status", "values": {"Done": "terminal"}})
    unmapped = partial.get_task(ExternalTaskRef(page["id"]))
    assert unmapped.state.category == "backlog" and unmapped.envelope["unmappedState"] == "In review"
    # without a designated property: import-only defaults
    plain = notion_adapter_for(sb, state_mapping={}, options={"readContent": False})
    content_reads = len(sb.requests_to(rf"^/blocks/{page['id']}/children$"))
    bare = plain.get_task(ExternalTaskRef(page["id"]))
    assert (bare.state.name, bare.state.category, bare.description) == ("Open", "backlog", None)
    assert len(sb.requests_to(rf"^/blocks/{page['id']}/children$")) == content_reads  # readContent off: no read


def test_a_description_property_and_trashed_pages(notion_sandbox):
    sb = notion_sandbox
    page = sb.add_page("Fix login", database=sb.tasks["id"], description="From the property.", content="Body.")
    adapter = notion_adapter_for(sb, options={"descriptionProperty": "Description", "workspaceId": WORKSPACE_ID})
    assert adapter.get_task(ExternalTaskRef(page["id"])).description == "From the property.\n\nBody."
    sb.trash_page(page["id"])
    trashed = adapter.get_task(ExternalTaskRef(page["id"]))
    assert (trashed.state.name, trashed.state.category) == ("In trash", "terminal")


def test_get_task_and_states_for_missing_trashed_and_foreign_pages(notion_sandbox):
    sb = notion_sandbox
    adapter = notion_adapter_for(sb)
    live = sb.add_page("Live", database=sb.tasks["id"], status="In progress")
    gone = sb.add_page("Gone", database=sb.tasks["id"])
    sb.trash_page(gone["id"])
    foreign = sb.add_page("Elsewhere", workspace=True)  # the workspace is not a container here
    missing = "00000000-0000-4000-8000-000000000000"
    states = adapter.get_task_states([ExternalTaskRef(i) for i in (live["id"], gone["id"], foreign["id"], missing)])
    assert states[live["id"]].category == "active"
    assert states[gone["id"]] is None and states[foreign["id"]] is None and states[missing] is None
    for page_id in (foreign["id"], missing):
        with pytest.raises(ProviderError) as exc:
            adapter.get_task(ExternalTaskRef(page_id))
        assert (exc.value.category, exc.value.status) == (ErrorCategory.PROVIDER_STATUS, 404)


def test_comments_list_with_cursors_authors_and_markers(notion_sandbox):
    sb = notion_sandbox
    page = sb.add_page("Fix login", database=sb.tasks["id"])
    adapter = notion_adapter_for(sb, page_size=2)
    for n in range(3):
        sb.add_comment(page["id"], f"Comment {n}", actor="Dave")
    ref = ExternalTaskRef(page["id"])
    first = adapter.list_comments(ref, None)
    second = adapter.list_comments(ref, first.cursor)
    assert [c.body for c in first.items + second.items] == ["Comment 0", "Comment 1", "Comment 2"]
    assert first.items[0].author.display_name == "Dave" and not first.items[0].author.is_connector_service_account
    assert "?d=" in first.items[0].url
    assert adapter.list_comments(ref, second.cursor).items == []
    body = "**coder via Paperclip** · [PAP-1](http://127.0.0.1/issues/PAP-1)\n\nSee `config.py`\n\n<!-- paperclip:effect:7 -->"
    comment_id = adapter.post_comment(ref, body)
    everything, cursor = [], None
    while True:
        listing = adapter.list_comments(ref, cursor)
        everything += listing.items
        if not listing.cursor:
            break
        cursor = listing.cursor
    [mine] = [c for c in everything if c.external_comment_id == comment_id]
    assert mine.body == body and mine.author.is_connector_service_account  # the marker survives the round trip
    raw = next(c for c in sb.comments_of(page["id"]) if c["id"] == comment_id)
    assert raw["rich_text"][-1]["annotations"]["color"] == "gray" and raw["rich_text"][-1]["plain_text"] == \
        "paperclip:effect:7"
    assert "<!--" not in "".join(s["plain_text"] for s in raw["rich_text"])  # Notion cannot hold HTML comments


def test_user_mentions_become_plain_names():
    rich = [{"type": "text", "text": {"content": "ping "}, "plain_text": "ping "},
            {"type": "mention", "mention": {"type": "user", "user": {"id": "u1"}}, "plain_text": "@Grace Hopper"}]
    assert richtext.to_markdown(rich) == ("ping Grace Hopper", ["Grace Hopper"])
    assert richtext.plain(rich) == "ping Grace Hopper"


# --- writes --------------------------------------------------------------------------------------------------
def test_state_writes_use_the_mapped_property_and_never_invent_options(notion_sandbox):
    sb = notion_sandbox
    select_db = sb.add_database("Board", status_property="Stage", kind="select",
                                options=(("Todo", "default", ""), ("Doing", "blue", ""), ("Shipped", "green", "")))
    mapping = {"property": "Status", "values": STATE_MAPPING["values"],
               "databases": {select_db["id"].replace("-", ""): {"property": "Stage", "values": {
                   "Todo": "backlog", "Doing": "active", "Shipped": "terminal"}}}}
    adapter = notion_adapter_for(sb, containers=(sb.tasks["id"], select_db["id"]), state_mapping=mapping)
    assert adapter.validate_state_mapping(mapping) == {}
    task_page = sb.add_page("A", database=sb.tasks["id"])
    select_page = sb.add_page("B", database=select_db["id"], Stage="Todo")
    adapter.update_task_state(ExternalTaskRef(task_page["id"]), "in progress")
    assert sb.page(task_page["id"])["properties"]["Status"]["status"]["name"] == "In progress"
    ref = ExternalTaskRef(select_page["id"])
    assert adapter.state_for_category(ref, "active") == "Doing"
    adapter.update_task_state(ref, "Doing")
    assert adapter.get_task(ref).state.category == "active"
    with pytest.raises(ProviderError) as exc:
        adapter.update_task_state(ref, "Archived")
    assert exc.value.category == ErrorCategory.PROVIDER_PAYLOAD and "Todo, Doing, Shipped" in str(exc.value)
    assert [o["name"] for o in sb._databases[select_db["id"]]["properties"]["Stage"]["select"]["options"]] == \
        ["Todo", "Doing", "Shipped"]  # a select would have gained the option: it was refused before the write
    assert adapter.state_for_category(ref, "review") is None  # no review option mapped in that database


def test_set_fields_backlinks_and_create_task(notion_sandbox):
    sb = notion_sandbox
    adapter = notion_adapter_for(sb)
    page = sb.add_page("Old title", database=sb.tasks["id"])
    ref = ExternalTaskRef(page["id"])
    adapter.set_fields(ref, {"title": "New title"})
    assert adapter.get_task(ref).title == "New title"
    with pytest.raises(ProviderError):
        adapter.set_fields(ref, {"description": "not writable"})
    url = "http://127.0.0.1:8000/issues/PAP-1"
    adapter.set_backlink(ref, url)
    adapter.set_backlink(ref, url)  # idempotent: one comment
    assert adapter.find_backlinks(ref) == [url] and len(sb.comments_of(page["id"])) == 1
    # somebody quoting our format is not a backlink: only the bot's comment counts
    sb.add_comment(page["id"], f"Tracked in Paperclip: {url}", actor="Mallory")
    assert adapter.find_backlinks(ref) == [url]
    # a URL property instead, when configured
    url_db = sb.add_database("Linked", extra_properties={"Paperclip": {"id": "pc", "name": "Paperclip", "type": "url",
                                                                      "url": {}}})
    linked = sb.add_page("X", database=url_db["id"])
    by_prop = notion_adapter_for(sb, containers=(url_db["id"],), options={"backlinkProperty": "Paperclip"})
    by_prop.set_backlink(ExternalTaskRef(linked["id"]), url)
    assert by_prop.find_backlinks(ExternalTaskRef(linked["id"])) == [url] and not sb.comments_of(linked["id"])
    # create_task: a page in the database, the description as content (the export footer reads back)
    footer = "Exported from Paperclip: [PAP-2](http://127.0.0.1:8000/issues/PAP-2)\n\n<!-- paperclip:issue=42 -->"
    created = adapter.create_task(sb.tasks["id"], {"title": "Exported", "description": f"Do it.\n\n{footer}",
                                                   "state": "In progress"})
    assert created.title == "Exported" and created.state.name == "In progress"
    assert created.description == f"Do it.\n\n{footer}" and created.container_id == sb.tasks["id"]
    parent = sb.add_page("Parent", workspace=True)
    under = notion_adapter_for(sb, containers=(parent["id"],)).create_task(parent["id"], {"title": "Child"})
    assert under.container_id == parent["id"] and sb.page(under.external_id)["parent"]["page_id"] == parent["id"]


# --- rate limits and errors --------------------------------------------------------------------------------
def test_a_429_carries_retry_after_and_the_sandbox_enforces_its_rate():
    with make_sandbox(rate=0.2, burst=3) as sb:  # three requests, then one every five seconds
        adapter = notion_adapter_for(sb)
        ref = ExternalTaskRef(sb.add_page("A", database=sb.tasks["id"])["id"])
        sb.fail_next(1, "rate_limit", retry_after=7)
        with pytest.raises(ProviderError) as exc:
            adapter.get_task(ref)
        assert (exc.value.category, exc.value.status, exc.value.retry_after) == ("provider_rate_limited", 429, 7.0)
        adapter.api("GET", "/users/me")
        adapter.api("GET", "/users/me")
        adapter.api("GET", "/users/me")
        with pytest.raises(ProviderError) as exc:
            adapter.api("GET", "/users/me")
        assert exc.value.category == ErrorCategory.PROVIDER_RATE_LIMITED and exc.value.retry_after >= 1
        assert sb.requests[-1].status == 429


@pytest.mark.parametrize("mode,status,category", [
    ("auth", None, ErrorCategory.PROVIDER_AUTH), ("error", 500, ErrorCategory.PROVIDER_STATUS),
    ("error", 503, ErrorCategory.PROVIDER_STATUS),
])
def test_failures_map_to_categories(notion_sandbox, mode, status, category):
    adapter = notion_adapter_for(notion_sandbox)
    notion_sandbox.fail_next(1, mode, status=status)
    with pytest.raises(ProviderError) as exc:
        adapter.list_candidate_tasks(notion_sandbox.tasks["id"], None)
    assert exc.value.category == category


def test_a_wrong_token_is_provider_auth_and_transport_failures_are_provider_request(notion_sandbox):
    with pytest.raises(ProviderError) as exc:
        notion_adapter_for(notion_sandbox, token="secret_wrong").get_task(ExternalTaskRef(FIXTURE_PAGE_ID))
    assert (exc.value.category, exc.value.status) == (ErrorCategory.PROVIDER_AUTH, 401)
    dead = notion_adapter_for(notion_sandbox)
    dead.base_url = "http://127.0.0.1:9"  # nothing listens there
    with pytest.raises(ProviderError) as exc:
        dead.get_task(ExternalTaskRef(FIXTURE_PAGE_ID))
    assert exc.value.category == ErrorCategory.PROVIDER_REQUEST


def test_a_body_that_is_not_json_is_provider_payload(notion_sandbox):
    transport = httpx.MockTransport(lambda request: httpx.Response(200, text="<html>gateway</html>"))
    adapter = notion_adapter_for(notion_sandbox, client=httpx.Client(transport=transport))
    with pytest.raises(ProviderError) as exc:
        adapter.get_task(ExternalTaskRef(FIXTURE_PAGE_ID))
    assert exc.value.category == ErrorCategory.PROVIDER_PAYLOAD


def test_the_sandbox_insists_on_a_notion_version(notion_sandbox):
    response = httpx.get(f"{notion_sandbox.base_url}/v1/users/me", headers={"Authorization": f"Bearer {SANDBOX_TOKEN}"})
    assert response.status_code == 400 and response.json()["code"] == "missing_version"


# --- webhooks (adapter level) ---------------------------------------------------------------------------------
def _request(payload: dict, token: str = VERIFICATION_TOKEN) -> WebhookRequest:
    body = json.dumps(payload).encode()
    return WebhookRequest(body=body, headers={"X-Notion-Signature": sign(token, body)})


def _event(type_, entity_id, data, authors=({"id": "u-person", "type": "person"},)):
    return {"id": f"evt-{type_}", "timestamp": "2026-01-01T00:00:00.000Z", "workspace_id": WORKSPACE_ID,
            "type": type_, "authors": list(authors), "attempt_number": 1,
            "entity": {"id": entity_id, "type": "comment" if type_.startswith("comment") else "page"}, "data": data}


def test_verify_maps_the_sparse_events(notion_sandbox):
    sb = notion_sandbox
    adapter = notion_adapter_for(sb, containers=(sb.tasks["id"].replace("-", ""),))
    db_parent = {"id": sb.tasks["id"], "type": "database"}
    upsert = adapter.verify_webhook(_request(_event("page.content_updated", "p1", {"parent": db_parent})))
    assert (upsert.kind, upsert.task, upsert.external_task_id) == (EventKind.TASK_UPSERTED, None, "p1")
    assert upsert.container_id == sb.tasks["id"].replace("-", "") and upsert.event_id == "evt-page.content_updated"
    deleted = adapter.verify_webhook(_request(_event("page.deleted", "p1", {"parent": db_parent})))
    assert deleted.kind == EventKind.TASK_DELETED
    outside = adapter.verify_webhook(_request(_event("page.created", "p2", {"parent": {"id": "x", "type": "page"}})))
    assert outside.kind == EventKind.IGNORED and outside.external_task_id is None
    moved = adapter.verify_webhook(_request(_event("page.moved", "p1", {"parent": {"id": "x", "type": "page"}})))
    assert (moved.kind, moved.action, moved.container_id) == (EventKind.TASK_DELETED, "page.moved;transfer", None)
    comment = adapter.verify_webhook(_request(_event("comment.created", "c1", {"page_id": "p1", "parent": {
        "id": "p1", "type": "page"}})))
    assert (comment.kind, comment.sparse, comment.container_id) == (EventKind.COMMENT_UPSERTED, True, None)
    assert comment.comment.external_comment_id == "c1" and comment.external_task_id == "p1"
    schema = adapter.verify_webhook(_request(_event("database.schema_updated", sb.tasks["id"], {})))
    assert schema.kind == EventKind.IGNORED
    # echo: the bot alone is our own change; an aggregated event with a person is not
    ours = adapter.verify_webhook(_request(_event("page.properties_updated", "p1", {"parent": db_parent},
                                                  authors=[{"id": sb.bot["id"], "type": "bot"}])))
    assert ours.actor.is_connector_service_account
    mixed = adapter.verify_webhook(_request(_event("page.properties_updated", "p1", {"parent": db_parent},
                                                   authors=[{"id": sb.bot["id"], "type": "bot"},
                                                            {"id": "u-person", "type": "person"}])))
    assert not mixed.actor.is_connector_service_account


def test_verify_checks_the_signature_before_parsing(notion_sandbox):
    adapter = notion_adapter_for(notion_sandbox)
    for headers in ({}, {"X-Notion-Signature": "sha256=zz"}, {"X-Notion-Signature": sign("secret_other", b"not json")}):
        with pytest.raises(WebhookRejected):
            adapter.verify_webhook(WebhookRequest(body=b"not json", headers=headers))
    with pytest.raises(WebhookRejected):
        notion_adapter_for(notion_sandbox, webhook_secret=None).verify_webhook(_request({"id": "x", "type": "page.created"}))


def test_the_handshake_recognises_only_the_verification_request(notion_sandbox):
    adapter = notion_adapter_for(notion_sandbox, webhook_secret=None)
    reply = adapter.webhook_handshake(WebhookRequest(body=json.dumps({"verification_token": "secret_abc"}).encode(),
                                                     headers={}))
    assert reply.secret == "secret_abc" and reply.show_operator and reply.status == 200
    signed = _request(_event("page.created", "p1", {"parent": {}}))
    assert adapter.webhook_handshake(signed) is None
    assert adapter.webhook_handshake(WebhookRequest(body=b"", headers={}, method="HEAD")) is None
    assert adapter.webhook_handshake(WebhookRequest(body=b"[1]", headers={})) is None


# --- state mapping ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mapping,fields", [
    ({"values": {"Done": "terminal"}}, {"values"}),
    ({"property": "Status", "values": {"Done": "finished"}}, {"values.Done"}),
    ({"property": "", "extra": 1}, {"property", "extra"}),
    ({"property": "Status", "databases": {"abc": {"values": {"X": "nope"}, "other": 1}}},
     {"databases.abc.values.X", "databases.abc.other"}),
    ("Status", {"stateMapping"}),
])
def test_validate_state_mapping_names_the_bad_field(notion_sandbox, mapping, fields):
    assert set(notion_adapter_for(notion_sandbox).validate_state_mapping(mapping)) == fields


def test_run_mode_refusal_needs_a_property_with_an_active_option(notion_sandbox):
    assert "no status or select property" in notion_adapter_for(notion_sandbox, state_mapping={}).run_mode_refusal(
        "symphony_compatible")
    no_active = notion_adapter_for(notion_sandbox, state_mapping={"property": "Status", "values": {"Done": "terminal"}})
    assert "no option to active" in no_active.run_mode_refusal("symphony_compatible")
    assert notion_adapter_for(notion_sandbox).run_mode_refusal("symphony_compatible") is None
    assert notion_adapter_for(notion_sandbox, state_mapping={}).run_mode_refusal("paperclip_controlled") is None


def test_the_mapping_check_reads_the_live_schema(notion_sandbox, company, monkeypatch):
    sb = notion_sandbox
    monkeypatch.setenv("PAPERCLIP_SECRET_NOTION_MC", SANDBOX_TOKEN)
    common = dict(actor=SYSTEM, company=company, provider_key="notion", base_url=sb.base_url,
                  credentials="env:PAPERCLIP_SECRET_NOTION_MC", config={"workspaceId": WORKSPACE_ID})
    good = instance_create(name="good", containers=[sb.tasks["id"]], state_mapping=STATE_MAPPING, **common)
    report = mapping_report(good)
    assert report["status"] == "ok", report
    assert [s["name"] for s in report["containers"][0]["states"]] == ["Not started", "In progress", "In review", "Done"]
    typo = instance_create(name="typo", containers=[sb.tasks["id"]], state_mapping={
        "property": "Status", "values": {"Not started": "backlog", "Shipped": "terminal"}}, **common)
    report = mapping_report(typo)
    assert report["status"] == "invalid"
    assert [e["field"] for e in report["errors"]] == ["stateMapping.values.Shipped"]
    assert any("'In progress'" in w["reason"] and "unmapped" in w["reason"] for w in report["warnings"])


def test_the_demo_hooks_give_instance_fields_and_open_a_page(company, monkeypatch):
    with make_sandbox() as sb:
        fields = sb.demo_instance_fields()
        assert fields["containers"] and fields["service_account_id"] == sb.bot["id"]
        monkeypatch.setenv("PAPERCLIP_SECRET_NOTION_DEMO", SANDBOX_TOKEN)
        instance = instance_create(actor=SYSTEM, company=company, name="demo", provider_key="notion",
                                   credentials="env:PAPERCLIP_SECRET_NOTION_DEMO", **fields)
        page_id = sb.demo_open_task("Try the demo", "Hello from the demo.")
        assert sb.deliveries[-1].payload["type"] == "page.created"
        assert sb.deliveries[-1].payload["entity"]["id"] == page_id
        from connectors.services.common import adapter_for

        task = adapter_for(instance).get_task(ExternalTaskRef(page_id))
        assert task.title == "Try the demo" and task.description == "Hello from the demo."
        assert task.state.name == "Not started"
