"""Asana adapter (layer 1) over real HTTP against the Asana sandbox, and its webhook verification. No
database needed.

Asana publishes no webhook payload files (there are none among the real payloads in connectors/sandbox/fixtures/): the
deliveries here are the sandbox's, built from the event shape Asana documents (developers.asana.com,
"Webhooks" guide and the EventResponse schema: ``{user, created_at, action, resource {gid, resource_type,
resource_subtype}, parent, change}``), and single entries built the same way by ``tests.asana_sandbox.event``."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from connectors.providers.asana import BACKLINK_MARKER, AsanaAdapter
from connectors.providers.asana.webhook import entry_key
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
    provider_keys,
)
from connectors.sandbox.asana import sign
from tests.asana_sandbox import SANDBOX_PROJECT, SANDBOX_WEBHOOK_SECRET, asana_adapter_for, event

SECRET = "asana-test-secret"
P1, P2 = "1201000000000001", "1201000000000002"
TASK_A, TASK_B = "1201000000000101", "1201000000000102"


def offline(containers=(P1,), secret=SECRET, mapping=None, service="1204000000000999") -> AsanaAdapter:
    return AsanaAdapter(AdapterConfig(base_url="https://app.asana.com/api/1.0", containers=tuple(containers),
                                      state_mapping=mapping or {}, credentials="pat", webhook_secret=secret,
                                      service_account_id=service))


def signed(events, *, secret=SECRET, scope=None) -> WebhookRequest:
    body = json.dumps({"events": events}).encode()
    return WebhookRequest(body=body, headers={"x-hook-signature": sign(secret, body),
                                              "content-type": "application/json"}, scope=scope)


def ref(gid) -> ExternalTaskRef:
    return ExternalTaskRef(external_id=gid)


# --- handshake and signatures -----------------------------------------------------------------------
def test_the_handshake_echoes_x_hook_secret_and_hands_the_secret_over():
    reply = offline(secret=None).webhook_handshake(WebhookRequest(body=b"", headers={"x-hook-secret": "abc123"}))
    assert reply.status == 200 and dict(reply.headers) == {"X-Hook-Secret": "abc123"} and reply.secret == "abc123"
    assert not reply.show_operator
    # a delivery (no X-Hook-Secret) is not a handshake; nor is a HEAD
    assert offline().webhook_handshake(signed([])) is None
    assert offline().webhook_handshake(WebhookRequest(b"", {"x-hook-secret": "x"}, method="HEAD")) is None
    with pytest.raises(WebhookRejected):
        offline().webhook_handshake(WebhookRequest(b"", {"x-hook-secret": "x" * 600}))


@pytest.mark.parametrize("how", ["missing", "malformed", "forged", "no-secret"])
def test_bad_signatures_are_rejected_before_the_body_is_parsed(how):
    body = b"not json at all"  # a parser running first would raise WebhookUnparseable instead
    headers = {"missing": {}, "malformed": {"x-hook-signature": "zz"},
               "forged": {"x-hook-signature": sign("another-secret", body)},
               "no-secret": {"x-hook-signature": sign(SECRET, body)}}[how]
    adapter = offline(secret=None if how == "no-secret" else SECRET)
    with pytest.raises(WebhookRejected):
        adapter.verify_webhook(WebhookRequest(body=body, headers=headers))
    # correctly signed, the same bytes are a payload problem, not a signature one
    with pytest.raises(WebhookUnparseable):
        offline().verify_webhook(WebhookRequest(body=body, headers={"x-hook-signature": sign(SECRET, body)}))


def test_signature_is_hex_hmac_sha256_of_the_raw_body():
    import hashlib
    import hmac

    body = b'{"events":[]}'
    assert sign("s", body) == hmac.new(b"s", body, hashlib.sha256).hexdigest()
    upper = WebhookRequest(body=body, headers={"x-hook-signature": sign(SECRET, body).upper()})
    assert offline().verify_webhook(upper).kind == EventKind.IGNORED


# --- one POST, several events -------------------------------------------------------------------------
def test_one_post_with_several_events_is_one_event_each_with_stable_content_keys():
    entries = [event("changed", TASK_A, change={"field": "name", "action": "changed"}),
               event("added", TASK_B, parent=(P1, "project")),
               event("added", "1201000000000201", "story", subtype="comment_added", parent=(TASK_A, "task")),
               event("changed", TASK_A, change={"field": "completed", "action": "changed"},
                     created_at="2026-01-01T00:00:06.000Z")]
    first = offline().verify_webhook(signed(entries))
    events = [first, *first.carried]
    assert [(e.kind, e.external_task_id) for e in events] == [
        (EventKind.TASK_UPSERTED, TASK_A), (EventKind.TASK_UPSERTED, TASK_B),
        (EventKind.COMMENT_UPSERTED, TASK_A), (EventKind.TASK_UPSERTED, TASK_A)]
    assert [e.event_id for e in events] == [entry_key(e) for e in entries]
    assert len({e.event_id for e in events}) == 4 and all(e.event_id.startswith("asana:") for e in events)
    assert all(not e.carried for e in first.carried)
    # the same POST again (Asana's retry) gives the same keys; the key ignores JSON key order/spacing
    again = offline().verify_webhook(signed(entries))
    assert [e.event_id for e in (again, *again.carried)] == [e.event_id for e in events]
    shuffled = json.loads(json.dumps(entries[0]), object_pairs_hook=lambda p: dict(reversed(p)))
    assert entry_key(shuffled) == entry_key(entries[0])
    # sparse: nothing but ids; the engine reads the task (and the comment) back
    assert all(e.task is None for e in events)
    comment = events[2]
    assert comment.sparse is True and comment.comment.external_comment_id == "1201000000000201"
    assert all(e.trusted_content for e in events) and not any(e.sparse for e in events if e is not comment)
    assert events[0].actor.external_user_id == "1204000000000999" and events[0].actor.is_connector_service_account


def test_a_heartbeat_is_one_ignored_event_keyed_by_its_body():
    one = offline().verify_webhook(signed([]))
    assert (one.kind, one.action, one.carried) == (EventKind.IGNORED, "heartbeat", ())
    assert one.event_id.startswith("sha256:") and one.event_id == offline().verify_webhook(signed([])).event_id


CASES = [
    # (entry, scope, containers, (kind, task id, container))
    (event("added", TASK_A, parent=(P1, "project")), None, (P1, P2), (EventKind.TASK_UPSERTED, TASK_A, P1)),
    (event("changed", TASK_A, change={"field": "notes", "action": "changed"}), P2, (P1, P2),
     (EventKind.TASK_UPSERTED, TASK_A, P2)),  # parent null: the project the webhook is registered on
    (event("changed", TASK_A), None, (P1,), (EventKind.TASK_UPSERTED, TASK_A, P1)),  # the single container
    (event("changed", TASK_A), None, (P1, P2), (EventKind.TASK_UPSERTED, TASK_A, None)),  # the read-back decides
    (event("added", TASK_A, parent=("1201000000000301", "section")), P1, (P1,), (EventKind.TASK_UPSERTED, TASK_A, P1)),
    (event("removed", TASK_A, parent=("1201000000000301", "section")), P1, (P1,),
     (EventKind.TASK_UPSERTED, TASK_A, P1)),  # half of a section move
    (event("deleted", TASK_A), P1, (P1,), (EventKind.TASK_DELETED, TASK_A, P1)),
    (event("removed", TASK_A, parent=(P1, "project")), P1, (P1,), (EventKind.TASK_DELETED, TASK_A, P1)),
    (event("undeleted", TASK_A), P1, (P1,), (EventKind.TASK_UPSERTED, TASK_A, P1)),
    (event("added", TASK_A, parent=("999", "project")), P1, (P1,), (EventKind.IGNORED, None, None)),
    (event("added", "7", "story", subtype="comment_added", parent=(TASK_A, "task")), P1, (P1,),
     (EventKind.COMMENT_UPSERTED, TASK_A, P1)),
    (event("removed", "7", "story", subtype="comment_added", parent=(TASK_A, "task")), P1, (P1,),
     (EventKind.COMMENT_DELETED, TASK_A, P1)),
    (event("changed", "7", "story", subtype="comment_added"), P1, (P1,), (EventKind.IGNORED, None, None)),
    (event("added", "8", "story", subtype="section_changed", parent=(TASK_A, "task")), P1, (P1,),
     (EventKind.IGNORED, None, None)),  # a system story
    (event("changed", "9", "section", subtype=None), P1, (P1,), (EventKind.IGNORED, None, None)),
    (event("added", "10", "story", subtype=None, parent=(TASK_A, "task")), P1, (P1,),
     (EventKind.COMMENT_UPSERTED, TASK_A, P1)),  # no subtype given: the read-back decides
]


@pytest.mark.parametrize("entry,scope,containers,expected", CASES)
def test_event_translation(entry, scope, containers, expected):
    got = offline(containers=containers).verify_webhook(signed([entry], scope=scope))
    assert (got.kind, got.external_task_id, got.container_id if got.kind != EventKind.IGNORED else None) == expected


def test_a_removal_from_the_project_is_a_transfer_and_a_deletion_is_a_deletion():
    moved = offline().verify_webhook(signed([event("removed", TASK_A, parent=(P1, "project"))], scope=P1))
    assert "transferred" in moved.action  # the engine's "moved out of the connector's container"
    deleted = offline().verify_webhook(signed([event("deleted", TASK_A)], scope=P1))
    assert "transferred" not in deleted.action


@pytest.mark.parametrize("body", [b'{"events": {}}', b'{"data": []}', b"[]",
                                  json.dumps({"events": [event("exploded", TASK_A)]}).encode(),
                                  json.dumps({"events": [{"action": "changed", "resource": {}}]}).encode(),
                                  json.dumps({"events": ["x"]}).encode()])
def test_signed_bodies_that_are_not_asana_deliveries_are_unparseable(body):
    with pytest.raises(WebhookUnparseable):
        offline().verify_webhook(WebhookRequest(body=body, headers={"x-hook-signature": sign(SECRET, body)}))


def test_sandbox_deliveries_verify_and_batch_per_mutation(asana_sandbox):
    project = asana_sandbox.project_gid(SANDBOX_PROJECT)
    adapter = asana_adapter_for(asana_sandbox)
    with asana_sandbox.batch():
        a = asana_sandbox.create_task("A", project=project)
        b = asana_sandbox.create_task("B", project=project)
        asana_sandbox.move_task(a["gid"], "In Progress")
        asana_sandbox.add_comment(b["gid"], "hello")
    [delivery] = asana_sandbox.deliveries
    assert delivery.lower_headers["x-hook-signature"] == sign(SANDBOX_WEBHOOK_SECRET, delivery.body)
    assert "x-asana-delivery" not in delivery.lower_headers  # Asana sends no delivery id
    first = adapter.verify_webhook(WebhookRequest(delivery.body, delivery.lower_headers))
    events = [first, *first.carried]
    assert len(events) == len(delivery.payload["events"]) == 7
    assert [e.external_task_id for e in events] == [a["gid"]] * 2 + [b["gid"]] * 2 + [a["gid"]] * 2 + [b["gid"]]
    assert events[-1].kind == EventKind.COMMENT_UPSERTED
    asana_sandbox.heartbeat()
    assert asana_sandbox.deliveries[-1].payload == {"events": []}


# --- listing and cursors --------------------------------------------------------------------------------
def test_listing_paginates_then_polls_incrementally(asana_sandbox):
    project = asana_sandbox.project_gid()
    adapter = asana_adapter_for(asana_sandbox, page_size=2)
    gids = [asana_sandbox.create_task(f"Task {n}", project=project)["gid"] for n in range(5)]
    listed, cursor, pages = [], None, 0
    while True:
        page = adapter.list_candidate_tasks(project, cursor)
        pages += 1
        listed += [t.external_id for t in page.items]
        if page.cursor is None:
            break
        cursor = page.cursor
    assert sorted(listed) == sorted(gids) and len(listed) == 5 and pages == 4  # 2 + 2 + 1, then nothing new
    offsets = [r.query.get("offset") for r in asana_sandbox.requests_to(r"^/tasks$")]
    assert offsets[0] is None and offsets[1] and offsets[2]  # Asana's next_page.offset walked the pass
    # nothing changed: a poll lists nothing and keeps no cursor; a change lists just that task
    assert adapter.list_candidate_tasks(project, cursor).items == []
    asana_sandbox.advance(60)
    asana_sandbox.update_task(gids[0], name="Renamed")
    page = adapter.list_candidate_tasks(project, cursor)
    assert [t.title for t in page.items] == ["Renamed"]
    since = asana_sandbox.requests_to(r"^/tasks$")[-1].query["modified_since"][0]
    assert since.endswith("Z") and json.loads(cursor)["since"] == since
    assert adapter.list_candidate_tasks(project, page.cursor).items == []


def test_a_crash_between_page_and_cursor_save_lists_the_same_page_again(asana_sandbox):
    project = asana_sandbox.project_gid()
    adapter = asana_adapter_for(asana_sandbox, page_size=2)
    for n in range(3):
        asana_sandbox.create_task(f"Task {n}", project=project)
    first = adapter.list_candidate_tasks(project, None)
    # the worker died before saving first.cursor: the next poll starts from the old (None) cursor again
    again = adapter.list_candidate_tasks(project, None)
    assert [t.external_id for t in again.items] == [t.external_id for t in first.items]
    assert [t.revision for t in again.items] == [t.revision for t in first.items]  # same poll keys, idempotent
    rest = adapter.list_candidate_tasks(project, again.cursor)
    assert len(rest.items) == 1 and not {t.external_id for t in rest.items} & {t.external_id for t in first.items}


def test_since_cursor_starts_at_a_time(asana_sandbox):
    project = asana_sandbox.project_gid()
    adapter = asana_adapter_for(asana_sandbox)
    asana_sandbox.create_task("Old", project=project)
    stamp = asana_sandbox.advance(3600)
    asana_sandbox.create_task("New", project=project)
    from connectors.providers.http import parse_utc

    page = adapter.list_candidate_tasks(project, adapter.since_cursor(project, parse_utc(stamp)))
    assert [t.title for t in page.items] == ["New"]


def test_invalid_cursors_are_cursor_invalid(asana_sandbox):
    project = asana_sandbox.project_gid()
    adapter = asana_adapter_for(asana_sandbox, page_size=1)
    for n in range(2):
        asana_sandbox.create_task(f"T{n}", project=project)
    for bad in ("not json", json.dumps({"v": 2}), json.dumps({"v": 1, "scope": "other", "since": None, "seen": []})):
        with pytest.raises(ProviderError) as exc:
            adapter.list_candidate_tasks(project, bad)
        assert exc.value.category == ErrorCategory.CURSOR_INVALID
    cursor = json.loads(adapter.list_candidate_tasks(project, None).cursor)
    cursor["offset"] = "eyJpIjogMSwgInEiOiAib3RoZXIifQ=="  # an offset token of another query (Asana: 400)
    with pytest.raises(ProviderError) as exc:
        adapter.list_candidate_tasks(project, json.dumps(cursor))
    assert exc.value.category == ErrorCategory.CURSOR_INVALID and exc.value.status == 400
    with pytest.raises(ProviderError) as exc:
        adapter.list_candidate_tasks("1", None)  # not a container
    assert exc.value.category == ErrorCategory.PROVIDER_PAYLOAD


# --- reads ------------------------------------------------------------------------------------------------
def test_get_task_normalizes_an_asana_task(asana_sandbox):
    project = asana_sandbox.project_gid()
    raw = asana_sandbox.create_task("Fix @carol's login", project=project, notes="Steps: ask @bob",
                                    tags=["Bug", "UI"], assignee="Bob Builder", due_on="2026-02-03",
                                    custom_fields=[{"gid": "cf1", "name": "Team", "display_value": "Web"},
                                                   {"gid": "cf2", "name": "Size", "display_value": None}])
    task = asana_adapter_for(asana_sandbox, custom_fields=("cf1", "cf2")).get_task(ref(raw["gid"]))
    assert (task.provider_key, task.external_id, task.external_key) == ("asana", raw["gid"], None)
    assert task.title == "Fix carol's login" and task.description == "Steps: ask bob"
    assert set(task.envelope["mentionsNeutralized"]) == {"carol", "bob"}
    assert task.labels == ("bug", "ui") and task.assignees[0].display_name == "Bob Builder"
    assert task.due_at.isoformat() == "2026-02-03T00:00:00+00:00" and task.url == raw["permalink_url"]
    assert task.priority is None and task.blocked_by == ()  # Asana has no priority; dependencies not read
    assert (task.state.name, task.state.category) == ("To do", StateCategory.BACKLOG)
    assert task.container_id == project and task.revision == raw["modified_at"]
    assert task.envelope["customFields"] == {"cf1": "Web"}
    assert task.envelope["section"]["name"] == "To do" and task.envelope["completed"] is False


def test_a_multi_homed_task_binds_to_the_configured_project(asana_sandbox):
    other = asana_sandbox.add_project("Marketing")["gid"]
    mine = asana_sandbox.project_gid(SANDBOX_PROJECT)
    raw = asana_sandbox.create_task("Both", project=other, also_in=[mine])
    task = asana_adapter_for(asana_sandbox).get_task(ref(raw["gid"]))
    assert task.container_id == mine and len(task.envelope["memberships"]) == 2
    # removed from the configured project: gone for this connector (404), and None in the state refresh
    asana_sandbox.remove_from_project(raw["gid"], mine)
    with pytest.raises(ProviderError) as exc:
        asana_adapter_for(asana_sandbox).get_task(ref(raw["gid"]))
    assert exc.value.status == 404
    assert asana_adapter_for(asana_sandbox).get_task_states([ref(raw["gid"])]) == {raw["gid"]: None}


def test_states_come_from_sections_and_completion(asana_sandbox):
    project = asana_sandbox.project_gid()
    a, b, c, d = (asana_sandbox.create_task(n, project=project)["gid"] for n in "abcd")
    asana_sandbox.move_task(b, "In Progress")
    asana_sandbox.move_task(c, "Review")
    asana_sandbox.complete_task(c)
    asana_sandbox.delete_task(d)
    got = asana_adapter_for(asana_sandbox).get_task_states([ref(a), ref(b), ref(c), ref(d)])
    assert {k: (v.name, v.category) if v else None for k, v in got.items()} == {
        a: ("To do", "backlog"), b: ("In Progress", "active"), c: ("Completed", "terminal"), d: None}
    with pytest.raises(ProviderError) as exc:
        asana_adapter_for(asana_sandbox).get_task(ref(d))
    assert (exc.value.category, exc.value.status) == (ErrorCategory.PROVIDER_STATUS, 404)


def test_comments_paginate_skip_system_stories_and_mark_the_service_account(asana_sandbox):
    gid = asana_sandbox.create_task("T", project=asana_sandbox.project_gid())["gid"]
    adapter = asana_adapter_for(asana_sandbox, page_size=2)
    people = [asana_sandbox.add_comment(gid, f"comment {n}")["gid"] for n in range(3)]
    asana_sandbox.add_system_story(gid, "moved this task to In Progress")
    mine = adapter.post_comment(ref(gid), "from Paperclip")
    found, cursor = [], None
    while True:
        page = adapter.list_comments(ref(gid), cursor)
        found += page.items
        if page.cursor is None:
            break
        cursor = page.cursor
    assert [c.external_comment_id for c in found] == people + [mine]
    assert [c.author.is_connector_service_account for c in found] == [False, False, False, True]
    assert found[0].body == "comment 0" and found[0].author.display_name == "Ada Lovelace"
    assert found[0].updated_at == found[0].created_at
    # the cursor continues after the last comment; an edit has no modification time (body compared instead)
    assert adapter.list_comments(ref(gid), cursor).items == []
    asana_sandbox.edit_comment(people[0], "comment 0, edited")
    [edited] = [c for c in adapter.list_comments(ref(gid), None).items if c.external_comment_id == people[0]]
    assert edited.body == "comment 0, edited" and edited.updated_at is None and edited.envelope["isEdited"]


# --- writes -------------------------------------------------------------------------------------------------
def test_writes_round_trip(asana_sandbox):
    project = asana_sandbox.project_gid()
    adapter = asana_adapter_for(asana_sandbox)
    gid = asana_sandbox.create_task("Original", project=project)["gid"]
    adapter.update_task_state(ref(gid), "in progress")  # section names compare trimmed + lowercased
    assert asana_sandbox.section_of(gid) == "In Progress"
    adapter.update_task_state(ref(gid), "Completed")
    assert asana_sandbox.task(gid)["completed"] is True
    adapter.update_task_state(ref(gid), "Review")  # a section state re-opens a completed task
    assert asana_sandbox.task(gid)["completed"] is False and asana_sandbox.section_of(gid) == "Review"
    with pytest.raises(ProviderError) as exc:
        adapter.update_task_state(ref(gid), "Shipped")
    assert exc.value.category == ErrorCategory.PROVIDER_PAYLOAD and "To do, In Progress" in str(exc.value)
    adapter.set_fields(ref(gid), {"title": "New title", "description": "New notes", "dueAt": "2026-03-04T10:00:00Z"})
    raw = asana_sandbox.task(gid)
    assert (raw["name"], raw["notes"], raw["due_on"]) == ("New title", "New notes", "2026-03-04")
    with pytest.raises(ProviderError):
        adapter.set_fields(ref(gid), {"priority": 1})  # Asana has no priority
    created = adapter.create_task(project, {"title": "Exported", "description": "From Paperclip", "state": "Review"})
    assert created.title == "Exported" and created.state.name == "Review" and created.container_id == project
    assert asana_sandbox.task(created.external_id)["notes"] == "From Paperclip"


def test_state_for_category_reads_the_projects_sections(asana_sandbox):
    project = asana_sandbox.project_gid()
    gid = asana_sandbox.create_task("T", project=project)["gid"]
    adapter = asana_adapter_for(asana_sandbox)
    assert adapter.state_for_category(ref(gid), "active") == "In Progress"
    assert adapter.state_for_category(ref(gid), "terminal") == "Completed"
    assert adapter.state_for_category(ref(gid), "blocked") is None  # no section mapped blocked
    by_project = asana_adapter_for(asana_sandbox, state_mapping={
        "completed": "terminal", "projects": {project: {"sections": {"Done": "blocked"}}}})
    assert by_project.state_for_category(ref(gid), "blocked") == "Done"


def test_backlinks_are_marked_comments_written_once(asana_sandbox):
    gid = asana_sandbox.create_task("T", project=asana_sandbox.project_gid())["gid"]
    adapter = asana_adapter_for(asana_sandbox)
    url = "https://paperclip.example/issues/PC-1"
    asana_sandbox.add_comment(gid, f"See {url}")  # a person quoting the URL is not a backlink
    asana_sandbox.add_comment(gid, f"Tracked in Paperclip: https://evil.example/x\n\n{BACKLINK_MARKER}")  # not ours
    assert adapter.find_backlinks(ref(gid)) == []
    adapter.set_backlink(ref(gid), url)
    adapter.set_backlink(ref(gid), url)  # a retry finds the one it wrote
    assert adapter.find_backlinks(ref(gid)) == [url]
    ours = [c for c in asana_sandbox.comments_of(gid) if BACKLINK_MARKER in c["text"]]
    assert len(ours) == 2 and ours[-1]["created_by"]["gid"] == asana_sandbox.service_user["gid"]


# --- errors and rate limits ------------------------------------------------------------------------------------
def test_rate_limits_auth_and_status_errors(asana_sandbox):
    project = asana_sandbox.project_gid()
    adapter = asana_adapter_for(asana_sandbox)
    asana_sandbox.fail_next(1, "rate_limit", retry_after=7)
    with pytest.raises(ProviderError) as exc:
        adapter.list_candidate_tasks(project, None)
    assert (exc.value.category, exc.value.status, exc.value.retry_after) == (ErrorCategory.PROVIDER_RATE_LIMITED, 429, 7)
    asana_sandbox.fail_next(1, "rate_limit")
    with pytest.raises(ProviderError) as exc:
        adapter.get_task_states([ref("1")])
    assert exc.value.category == ErrorCategory.PROVIDER_RATE_LIMITED and exc.value.retry_after == 60
    asana_sandbox.fail_next(1, "error", status=503)
    with pytest.raises(ProviderError) as exc:
        adapter.list_candidate_tasks(project, None)
    assert (exc.value.category, exc.value.status) == (ErrorCategory.PROVIDER_STATUS, 503)
    with pytest.raises(ProviderError) as exc:
        asana_adapter_for(asana_sandbox, token="wrong").list_candidate_tasks(project, None)
    assert (exc.value.category, exc.value.status) == (ErrorCategory.PROVIDER_AUTH, 401)
    assert asana_sandbox.requests[-1].headers["authorization"] == "Bearer wrong"
    assert adapter.list_candidate_tasks(project, None).items == []  # recovered


def _answering(status=200, body=b'{"data": {"gid": "1"}}', headers=None) -> AsanaAdapter:
    def handler(request):
        return httpx.Response(status, content=body, headers=headers or {})

    config = AdapterConfig(base_url="https://app.asana.com/api/1.0", containers=(P1,), state_mapping={},
                           credentials="pat")
    return AsanaAdapter(config, client=httpx.Client(transport=httpx.MockTransport(handler)))


@pytest.mark.parametrize("status,body,category", [
    (200, b"<html>", ErrorCategory.PROVIDER_PAYLOAD),
    (200, b'{"gid": "1"}', ErrorCategory.PROVIDER_PAYLOAD),  # not wrapped in data
    (200, b'{"data": {"gid": "1"}, "next_page": {"path": "/x"}}', ErrorCategory.PROVIDER_PAYLOAD),
    (403, b'{"errors": [{"message": "forbidden"}]}', ErrorCategory.PROVIDER_AUTH),
    (404, b'{"errors": [{"message": "task: Unknown object"}]}', ErrorCategory.PROVIDER_STATUS),
    (502, b"", ErrorCategory.PROVIDER_STATUS),
])
def test_bad_answers_map_to_categories(status, body, category):
    adapter = _answering(status, body)
    with pytest.raises(ProviderError) as exc:
        if b"next_page" in body:
            adapter.list_comments(ref("1"), None)
        else:
            adapter.get_task(ref("1"))
    assert exc.value.category == category


def test_transport_failures_are_provider_request():
    def handler(request):
        raise httpx.ConnectError("refused")

    config = AdapterConfig(base_url="https://app.asana.com/api/1.0", containers=(P1,), state_mapping={})
    adapter = AsanaAdapter(config, client=httpx.Client(transport=httpx.MockTransport(handler)))
    with pytest.raises(ProviderError) as exc:
        adapter.get_task(ref("1"))
    assert exc.value.category == ErrorCategory.PROVIDER_REQUEST


# --- state mapping --------------------------------------------------------------------------------------------
def test_without_a_mapping_completed_is_terminal_and_sections_are_backlog(asana_sandbox):
    project = asana_sandbox.project_gid()
    gid = asana_sandbox.create_task("T", project=project, section="In Progress")["gid"]
    adapter = asana_adapter_for(asana_sandbox, state_mapping={})
    task = adapter.get_task(ref(gid))
    assert task.state.category == "backlog" and task.envelope["stateMapped"] and "unmappedState" not in task.envelope
    asana_sandbox.complete_task(gid)
    assert adapter.get_task(ref(gid)).state == type(task.state)("Completed", "terminal")


def test_per_project_overrides_and_unmapped_sections(asana_sandbox):
    project = asana_sandbox.project_gid()
    gid = asana_sandbox.create_task("T", project=project, section="Done")["gid"]
    mapping = {"sections": {"In Progress": "active"}, "projects": {project: {"sections": {"Review": "blocked"}}}}
    adapter = asana_adapter_for(asana_sandbox, state_mapping=mapping)
    task = adapter.get_task(ref(gid))
    assert task.state.category == "backlog" and task.envelope["unmappedState"] == "Done"  # §7.2: reported
    asana_sandbox.move_task(gid, "Review")
    assert adapter.get_task(ref(gid)).state.category == "blocked"
    meta = adapter.workflow_metadata(project)
    assert (meta["nameSections"], meta["overrideSection"], meta["keys"]) == (["sections"], "projects", [project])
    assert [(s["name"], s["category"], s["mapped"]) for s in meta["states"]] == [
        ("To do", "backlog", False), ("In Progress", "active", True), ("Review", "blocked", True),
        ("Done", "backlog", False), ("Completed", "terminal", True)]


@pytest.mark.parametrize("mapping,fields", [
    ({"sections": {"In Progress": "active"}, "completed": "terminal"}, set()),
    ({"projects": {P1: {"sections": {"Doing": "review"}}}}, set()),
    ({}, set()),
    ({"sections": {"In Progress": "working"}}, {"sections.In Progress"}),
    ({"sections": ["In Progress"]}, {"sections"}),
    ({"completed": "done"}, {"completed"}),
    ({"projects": {P1: {"states": {}}}}, {f"projects.{P1}.states"}),
    ({"lanes": {}}, {"lanes"}),
])
def test_validate_state_mapping(mapping, fields):
    assert set(offline().validate_state_mapping(mapping)) == fields
    assert offline().validate_state_mapping([]) == {"stateMapping": ["must be an object"]}


# --- webhook registration against the sandbox ---------------------------------------------------------------------
class _Receiver:
    """A local webhook target that answers the handshake (echoing the secret, or not)."""

    def __init__(self, echo=True):
        received = self.received = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                received.append(dict(self.headers))
                self.send_response(200)
                if echo and self.headers.get("X-Hook-Secret"):
                    self.send_header("X-Hook-Secret", self.headers["X-Hook-Secret"])
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook?scope=x"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_register_and_check_webhooks(asana_sandbox):
    project = asana_sandbox.project_gid()
    adapter = asana_adapter_for(asana_sandbox)
    receiver = _Receiver()
    try:
        reg = adapter.register_webhook(project, receiver.url)
    finally:
        receiver.close()
    assert reg.scope == project and reg.active and reg.callback_url == receiver.url and reg.external_id
    assert receiver.received and receiver.received[0]["X-Hook-Secret"]  # handshake during the creation request
    [created] = asana_sandbox.requests_to(r"^/webhooks$", "POST")
    assert created.body["data"]["resource"] == project and created.body["data"]["target"] == receiver.url
    assert {"resource_type": "story", "resource_subtype": "comment_added"} in created.body["data"]["filters"]
    assert adapter.check_webhook(reg).active
    asana_sandbox.deactivate_webhook(reg.external_id, failure="connection refused")
    checked = adapter.check_webhook(reg)
    assert not checked.active and "connection refused" in checked.detail
    gone = adapter.check_webhook(WebhookRegistration(project, "123", receiver.url))
    assert not gone.active and "no longer exists" in gone.detail
    moved = adapter.check_webhook(WebhookRegistration(project, reg.external_id, "https://elsewhere.example/hook"))
    assert not moved.active


def test_registration_fails_when_the_target_does_not_echo_the_secret(asana_sandbox):
    receiver = _Receiver(echo=False)
    try:
        with pytest.raises(ProviderError) as exc:
            asana_adapter_for(asana_sandbox).register_webhook(asana_sandbox.project_gid(), receiver.url)
    finally:
        receiver.close()
    assert exc.value.status == 400 and "handshake" in str(exc.value)
    assert asana_sandbox.webhooks() == []


# --- registry and capabilities ------------------------------------------------------------------------------------
def test_capabilities_and_registry():
    assert "asana" in provider_keys() and adapter_class("asana") is AsanaAdapter
    caps = AsanaAdapter.capabilities
    assert {"register_webhook", "check_webhook", "find_backlinks", "post_comment"} <= caps.operations
    assert "custom_field" in caps.routing_rule_kinds and "state_lane" in caps.routing_rule_kinds
    assert caps.settable_fields == {"title", "description"} and caps.signed_webhooks and not caps.has_external_keys
    assert AsanaAdapter.delivery_id_header == "" and AsanaAdapter.display_name == "Asana"
    assert {"containers", "webhooks", "stateMappingExample"} <= set(AsanaAdapter.setup_help)
    assert offline().validate_state_mapping(json.loads(AsanaAdapter.setup_help["stateMappingExample"])) == {}


# --- the demo and the standalone sandbox ------------------------------------------------------------------------
def test_demo_hooks_give_instance_fields_and_open_tasks(asana_sandbox):
    fields = asana_sandbox.demo_instance_fields()
    assert fields["containers"] == [asana_sandbox.project_gid()] and fields["base_url"] == asana_sandbox.api_url
    assert fields["service_account_id"] == asana_sandbox.service_user["gid"]
    assert offline().validate_state_mapping(fields["state_mapping"]) == {}
    gid = asana_sandbox.demo_open_task("Demo", "Body")
    assert asana_sandbox.task(gid)["notes"] == "Body" and asana_sandbox.deliveries[-1].payload["events"]


def test_standalone_sandbox_serves_the_rest_api():
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "connectors.sandbox.asana", "--port", str(port), "--token", "tok",
                             "--seed", "2"], stdout=subprocess.PIPE, text=True)
    try:
        banner = proc.stdout.readline()
        assert f"127.0.0.1:{port}/api/1.0" in banner
        base = f"http://127.0.0.1:{port}/api/1.0"
        project = banner.split("(")[1].split(")")[0]
        me = httpx.get(f"{base}/users/me", headers={"Authorization": "Bearer tok"}).json()["data"]
        assert me["name"] == "Paperclip Bot"
        tasks = httpx.get(f"{base}/tasks", params={"project": project, "limit": 1, "opt_fields": "name"},
                          headers={"Authorization": "Bearer tok"}).json()
        assert tasks["data"][0]["name"] == "Demo task 1" and tasks["next_page"]["offset"]
        assert httpx.get(f"{base}/users/me").status_code == 401
    finally:
        proc.terminate()
        proc.wait(timeout=10)
