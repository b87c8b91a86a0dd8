"""Linear adapter (layer 1): every real Linear fixture through webhook verification, and every read and
write operation over real HTTP against the Linear GraphQL sandbox. No database needed."""
import hashlib
import hmac
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from connectors.providers.base import (
    AdapterConfig,
    ErrorCategory,
    EventKind,
    ExternalTaskRef,
    ProviderError,
    StateCategory,
    WebhookRejected,
    WebhookRequest,
    WebhookUnparseable,
    adapter_class,
    provider_keys,
)
from connectors.providers.linear import LinearAdapter, linear_priority, linear_priority_from
from connectors.sandbox.linear import DEFAULT_FIXTURES_DIR, LinearSandbox, sign
from tests.linear_sandbox import (
    DEFAULT_STATE_MAPPING,
    SANDBOX_TEAM,
    SANDBOX_TOKEN,
    SANDBOX_WEBHOOK_SECRET,
    linear_adapter_for,
)

FIXTURES = Path(DEFAULT_FIXTURES_DIR)
SECRET = "linear-test-secret"
FIXTURE_TEAMS = ("LIN", "KOR", "WEB")


def adapter(containers=FIXTURE_TEAMS, secret=SECRET, mapping=None, clock=None, **kw):
    return LinearAdapter(AdapterConfig(base_url="https://api.linear.app", containers=tuple(containers),
                                       state_mapping=DEFAULT_STATE_MAPPING if mapping is None else mapping,
                                       credentials="lin_api_x", webhook_secret=secret, **kw), clock=clock)


def raw(name: str) -> bytes:
    return (FIXTURES / f"{name}.json").read_bytes()


def at_delivery_time(body: bytes):
    """A clock frozen at the payload's own webhookTimestamp (the fixtures are years old)."""
    stamp = json.loads(body).get("webhookTimestamp")
    return (lambda: stamp / 1000.0) if stamp else time.time


def signed(body: bytes, *, secret=SECRET, delivery: str | None = "d-1", **extra) -> WebhookRequest:
    headers = {"linear-signature": sign(secret, body), "content-type": "application/json; charset=utf-8"}
    if delivery:
        headers["linear-delivery"] = delivery
    headers.update(extra)
    return WebhookRequest(body=body, headers=headers)


# --- every real fixture --------------------------------------------------------------------------
EXPECTED = {
    # name: (kind, action, task id, container, extra checks)
    "lhc_linearCommentCreated": (EventKind.COMMENT_UPSERTED, "Comment.create", "6a17c5cc-5188-4487-ab56-44626a9b2daf", "LIN"),
    "lhc_linearCommentUpdated": (EventKind.COMMENT_UPSERTED, "Comment.update", "6a17c5cc-5188-4487-ab56-44626a9b2daf", "LIN"),
    "lhc_linearIssueCreated": (EventKind.TASK_UPSERTED, "Issue.update", "7f2cba4d-6244-415c-ac09-63eb071755a8", "LIN"),
    "lks_createIssue": (EventKind.TASK_UPSERTED, "Issue.create;no-timestamp", "236e0fe8-xxxx-xxxx-xxxx-b2df06e33810", "KOR"),
    "lks_updateIssue": (EventKind.TASK_UPSERTED, "Issue.update;no-timestamp", "236e0fe8-xxxx-xxxx-xxxx-b2df06e33810", "KOR"),
    "lks_updateIssueWithAddIssueLabel": (EventKind.TASK_UPSERTED, "Issue.update;no-timestamp",
                                         "0d69dbdd-xxxx-xxxx-xxxx-ae377ce0db02", "KOR"),
    "zulip_comment_create": (EventKind.COMMENT_UPSERTED, "Comment.create", "f9a37fcf-eb52-44be-a52c-0477f70e9952", "WEB"),
}


def test_every_linear_fixture_is_covered():
    assert {p.stem for p in FIXTURES.glob("*.json")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_verifies_and_normalizes(name):
    body = raw(name)
    kind, action, task_id, container = EXPECTED[name]
    event = adapter(clock=at_delivery_time(body)).verify_webhook(signed(body, delivery=f"delivery-{name}"))
    assert (event.kind, event.action, event.external_task_id, event.container_id) == (kind, action, task_id, container)
    assert event.event_id == f"delivery-{name}" and event.trusted_content
    payload = json.loads(body)
    if kind == EventKind.TASK_UPSERTED:
        task = event.task
        assert task.provider_key == "linear" and task.external_id == payload["data"]["id"]
        assert task.container_id == container and task.title == payload["data"]["title"]
        assert task.priority is None  # every fixture has Linear priority 0 = "No priority"
        assert task.envelope["priorityLabel"] == "No priority"
        assert task.envelope["workflowState"]["type"] == payload["data"]["state"]["type"]
        assert event.comment is None
    else:
        comment = event.comment
        assert comment.external_comment_id == payload["data"]["id"]
        assert comment.external_task_id == task_id and comment.body == payload["data"]["body"]
        assert comment.author.display_name == payload["data"]["user"]["name"]
        assert comment.author.external_user_id == payload["data"]["user"]["id"]
        assert comment.url == payload["url"] and event.task is None


def test_fixture_details_state_labels_keys():
    body = raw("lks_updateIssueWithAddIssueLabel")
    task = adapter(clock=at_delivery_time(body)).verify_webhook(signed(body)).task
    # "In Review" is a *started*-type state; the named-state mapping makes it review, not active
    assert task.state.name == "In Review" and task.state.category == StateCategory.REVIEW
    assert task.labels == ("improvement",) and task.envelope["labels"][0]["name"] == "Improvement"
    assert task.external_key == "KOR-57" and task.envelope["cycle"]["number"] == 25

    todo = adapter().verify_webhook(signed(raw("lks_updateIssue"))).task
    assert (todo.state.name, todo.state.category) == ("Todo", StateCategory.BACKLOG)  # unstarted -> backlog
    assert todo.assignees[0].display_name == "user@example.com" and todo.external_key == "KOR-11"

    backlog = adapter(clock=at_delivery_time(raw("lhc_linearIssueCreated"))).verify_webhook(
        signed(raw("lhc_linearIssueCreated"))).task
    assert (backlog.state.name, backlog.state.category) == ("Backlog", StateCategory.BACKLOG)
    assert backlog.external_key == "LIN-34" and backlog.description == ""
    assert backlog.url == "https://linear.app/linear-hill-charts/issue/LIN-34/foobar"
    assert backlog.envelope["project"] == {"id": "30c1f0c4-086a-4f38-bd9c-48c63e2be880", "name": "Testing"}


def test_fixture_delivered_by_the_sandbox_verifies(linear_sandbox):
    delivery = linear_sandbox.deliver_fixture("lhc_linearIssueCreated", {"webhookTimestamp": int(time.time() * 1000)})
    headers = delivery.lower_headers
    assert headers["linear-signature"] == sign(SANDBOX_WEBHOOK_SECRET, delivery.body)
    event = adapter(containers=("LIN",), secret=SANDBOX_WEBHOOK_SECRET).verify_webhook(
        WebhookRequest(delivery.body, headers))
    assert event.event_id == headers["linear-delivery"] and event.task.external_key == "LIN-34"


# --- signatures, replay, containers -----------------------------------------------------------------
def test_bad_signatures_are_rejected_before_parsing():
    body = raw("lhc_linearCommentCreated")
    a = adapter(clock=at_delivery_time(body))
    cases = {
        "missing": WebhookRequest(body, {}),
        "prefixed": WebhookRequest(body, {"linear-signature": "sha256=" + sign(SECRET, body)}),
        "not hex": WebhookRequest(body, {"linear-signature": "z" * 64}),
        "wrong secret": signed(body, secret="another-secret"),
        "tampered": WebhookRequest(body.replace(b"This is a comment", b"This is a COMMENT"),
                                   {"linear-signature": sign(SECRET, body)}),
    }
    for case, request in cases.items():
        with pytest.raises(WebhookRejected) as exc:
            a.verify_webhook(request)
        assert exc.value.category == ErrorCategory.WEBHOOK_SIGNATURE, case
    # garbage with a *valid* signature is unparseable, not rejected
    with pytest.raises(WebhookUnparseable):
        a.verify_webhook(signed(b"not json"))
    # no secret configured: nothing can be verified
    with pytest.raises(WebhookRejected):
        adapter(secret=None).verify_webhook(signed(body))


def test_webhook_timestamp_window():
    body = raw("lhc_linearCommentCreated")
    stamp = json.loads(body)["webhookTimestamp"] / 1000.0
    assert adapter(clock=lambda: stamp + 59).verify_webhook(signed(body)).kind == EventKind.COMMENT_UPSERTED
    assert adapter(clock=lambda: stamp - 59).verify_webhook(signed(body)).kind == EventKind.COMMENT_UPSERTED
    for skew in (61, -61, 3600):
        with pytest.raises(WebhookRejected, match="stale or replayed"):
            adapter(clock=lambda s=skew: stamp + s).verify_webhook(signed(body))
    # with the real clock, a 2023 delivery is a replay
    with pytest.raises(WebhookRejected):
        adapter().verify_webhook(signed(body))
    # payloads of the older generation carry no webhookTimestamp: accepted, and the history says so
    event = adapter().verify_webhook(signed(raw("lks_createIssue")))
    assert event.action.endswith(";no-timestamp")


def test_foreign_team_is_rejected():
    for name in ("lhc_linearIssueCreated", "lhc_linearCommentCreated", "lks_createIssue", "zulip_comment_create"):
        body = raw(name)
        with pytest.raises(WebhookRejected) as exc:
            adapter(containers=("ENG",), clock=at_delivery_time(body)).verify_webhook(signed(body))
        assert exc.value.category == ErrorCategory.PROVIDER_PAYLOAD, name
    # a container spelled by team id works too
    body = raw("lks_createIssue")
    event = adapter(containers=("eeaa0cbd-xxxx-xxxx-xxxx-1c701c3485f1",)).verify_webhook(signed(body))
    assert event.container_id == "eeaa0cbd-xxxx-xxxx-xxxx-1c701c3485f1"


def test_event_ids_and_other_types():
    body = raw("lks_createIssue")
    first = adapter().verify_webhook(signed(body, delivery=None))
    again = adapter().verify_webhook(signed(body, delivery=None))
    assert first.event_id == again.event_id == "sha256:" + hashlib.sha256(body).hexdigest()
    payload = json.loads(body)
    payload["type"] = "Reaction"
    other = json.dumps(payload).encode()
    event = adapter().verify_webhook(signed(other))
    assert event.kind == EventKind.IGNORED and event.task is None
    payload = json.loads(raw("lks_createIssue"))
    payload["action"] = "remove"
    event = adapter().verify_webhook(signed(json.dumps(payload).encode()))
    assert event.kind == EventKind.TASK_DELETED and event.external_task_id == payload["data"]["id"]


def test_mentions_are_neutralized_in_issue_bodies():
    payload = json.loads(raw("lks_createIssue"))
    payload["data"]["description"] = ("Ping @alice and [@Bob Smith](https://linear.app/org/profiles/bob) "
                                      "but keep `@code` and mail a@b.c")
    task = adapter().verify_webhook(signed(json.dumps(payload).encode())).task
    assert "@alice" not in task.description and "[@Bob" not in task.description
    assert task.description.startswith("Ping alice and Bob Smith but keep `@\u2060code` and mail a@b.c")
    assert set(task.envelope["mentionsNeutralized"]) >= {"alice", "Bob Smith"}


# --- config, capabilities --------------------------------------------------------------------------
def test_priority_mapping():
    assert [linear_priority(v) for v in (0, 1, 2, 3, 4, None, "x", 9)] == [None, 0, 1, 2, 3, None, None, None]
    assert [linear_priority_from(v) for v in (None, 0, 1, 2, 3, 4)] == [0, 1, 2, 3, 4, 4]


def test_capabilities_and_registry():
    assert {"linear", "jira"} <= set(provider_keys())
    caps = adapter_class("linear").capabilities
    assert {"post_comment", "update_task_state", "set_fields", "set_backlink", "create_task"} <= caps.operations
    assert caps.signed_webhooks and caps.state_categories == frozenset(StateCategory.ALL)
    # Linear issues have no custom fields: custom_field routing is not declared (issue #16, §5.2)
    assert caps.routing_rule_kinds == frozenset({"default_route", "label", "state_lane",
                                                 "comment_command", "user_mapping"})


def test_validate_state_mapping():
    a = adapter()
    assert a.validate_state_mapping(DEFAULT_STATE_MAPPING) == {}
    assert a.validate_state_mapping({}) == {}
    assert a.validate_state_mapping({"teams": {"ENG": {"states": {"QA": "review"}, "types": {"started": "review"}}}}) == {}
    errors = a.validate_state_mapping({"types": {"started": "running", "weird": "active"}, "states": {"QA": 3},
                                       "teams": {"ENG": {"colors": {}}}, "extra": 1})
    assert set(errors) == {"types.started", "types.weird", "states.QA", "teams.ENG.colors", "extra"}
    assert a.validate_state_mapping([]) == {"stateMapping": ["must be an object"]}


def test_per_team_overrides_and_unmapped_states():
    mapping = {"types": {"started": "active"}, "teams": {"KOR": {"states": {"in review": "blocked"}}}}
    body = raw("lks_updateIssueWithAddIssueLabel")
    task = adapter(mapping=mapping).verify_webhook(signed(body)).task
    assert task.state.category == StateCategory.BLOCKED  # team override beats the default names
    payload = json.loads(raw("lks_updateIssue"))
    payload["data"]["state"]["type"] = "someNewType"
    task = adapter().verify_webhook(signed(json.dumps(payload).encode())).task
    assert task.state.category == StateCategory.BACKLOG and task.envelope["unmappedState"] == "Todo"


# --- over HTTP against the sandbox ---------------------------------------------------------------
def test_full_listing_paginates_then_polls_incrementally(linear_sandbox):
    with linear_sandbox.quiet():
        ids = [linear_sandbox.create_issue(f"Task {n}", team=SANDBOX_TEAM, labels=["Bug"])["id"] for n in range(7)]
    a = linear_adapter_for(linear_sandbox, page_size=3)
    linear_sandbox.clear_requests()
    seen, cursor, pages = [], None, 0
    while True:
        page = a.list_candidate_tasks(SANDBOX_TEAM, cursor)
        pages += 1
        seen += [t.external_id for t in page.items]
        if page.cursor is None:
            break
        cursor = page.cursor
    assert seen == ids and pages == 4  # 3 + 3 + 1, then one empty call that ends with cursor=None
    listings = linear_sandbox.requests_for("Issues")
    assert len(listings) == 4
    assert [r.variables["first"] for r in listings] == [3, 3, 3, 3]
    assert listings[1].variables["after"] and "updatedAt" not in listings[1].variables["filter"]
    assert listings[3].variables["filter"]["updatedAt"]["gte"]  # incremental after the first pass
    # nothing changed: one request, nothing listed
    empty = a.list_candidate_tasks(SANDBOX_TEAM, cursor)
    assert empty.items == [] and empty.cursor is None
    # two issues change: exactly they are listed
    linear_sandbox.advance(5)
    linear_sandbox.move_issue(ids[2], "In Progress")
    linear_sandbox.update_issue(ids[5], title="Renamed")
    page = a.list_candidate_tasks(SANDBOX_TEAM, cursor)
    assert [t.external_id for t in page.items] == [ids[2], ids[5]]
    assert page.items[0].state.category == StateCategory.ACTIVE and page.items[1].title == "Renamed"
    assert a.list_candidate_tasks(SANDBOX_TEAM, page.cursor).items == []


def test_incremental_boundary_with_identical_timestamps():
    with LinearSandbox(teams=(SANDBOX_TEAM,), token=SANDBOX_TOKEN, tick=0).start() as sb:
        with sb.quiet():
            ids = [sb.create_issue(f"Same second {n}", team=SANDBOX_TEAM)["id"] for n in range(5)]
        a = linear_adapter_for(sb, page_size=2)
        listed, cursor = [], None
        while True:
            page = a.list_candidate_tasks(SANDBOX_TEAM, cursor)
            listed += [t.external_id for t in page.items]
            if page.cursor is None:
                break
            cursor = page.cursor
        assert sorted(listed) == sorted(ids) and len(listed) == 5  # no tie skipped, none repeated
        sb.tick = 1
        sb.update_issue(ids[0], title="later")
        assert [t.external_id for t in a.list_candidate_tasks(SANDBOX_TEAM, cursor).items] == [ids[0]]


def test_invalid_cursors(linear_sandbox):
    a = linear_adapter_for(linear_sandbox)
    for bad in ("not json", json.dumps({"v": 2}), json.dumps({"v": 1, "scope": "OPS", "since": None, "seen": []}),
                json.dumps({"v": 1, "scope": SANDBOX_TEAM, "since": "yesterday", "seen": []})):
        with pytest.raises(ProviderError) as exc:
            a.list_candidate_tasks(SANDBOX_TEAM, bad)
        assert exc.value.category == ErrorCategory.CURSOR_INVALID
    rejected = json.dumps({"v": 1, "scope": SANDBOX_TEAM, "since": None, "seen": [], "hw": None, "hwSeen": [],
                           "after": "bm90LWEtY3Vyc29y"})
    with pytest.raises(ProviderError) as exc:
        a.list_candidate_tasks(SANDBOX_TEAM, rejected)  # Linear answers INVALID_INPUT for the "after" cursor
    assert exc.value.category == ErrorCategory.CURSOR_INVALID
    with pytest.raises(ProviderError) as exc:
        a.list_candidate_tasks("OPS", None)
    assert exc.value.category == ErrorCategory.PROVIDER_PAYLOAD


def test_get_task_normalizes(linear_sandbox):
    blocker = linear_sandbox.create_issue("Blocker", team=SANDBOX_TEAM, state="In Progress")
    issue = linear_sandbox.create_issue("Fix @carol's login", team=SANDBOX_TEAM, state="Backlog",
                                        description="Ask @dave.\n\n```\n@keep\n```", labels=["Bug", "Backend"],
                                        priority=1, assignee="Carol Danvers", due_date="2026-02-03")
    linear_sandbox.update_issue(blocker["id"], blocks=[issue["id"]])
    task = linear_adapter_for(linear_sandbox).get_task(ExternalTaskRef(issue["id"], issue["identifier"]))
    assert (task.external_id, task.external_key, task.container_id) == (issue["id"], "ENG-2", SANDBOX_TEAM)
    assert task.title == "Fix carol's login" and task.description == "Ask dave.\n\n```\n@\u2060keep\n```"
    assert task.priority == 0 and task.envelope["priority"] == 1 and task.envelope["priorityLabel"] == "Urgent"
    assert task.labels == ("bug", "backend") and task.state.category == StateCategory.BACKLOG
    assert task.due_at.isoformat() == "2026-02-03T00:00:00+00:00" and task.assignees[0].display_name == "Carol Danvers"
    assert task.blocked_by[0].external_key == "ENG-1" and task.blocked_by[0].state == "In Progress"
    assert task.branch_name and task.revision == linear_sandbox.issue(issue["id"])["updatedAt"]
    with pytest.raises(ProviderError) as exc:
        linear_adapter_for(linear_sandbox).get_task(ExternalTaskRef("00000000-0000-0000-0000-000000000000"))
    assert (exc.value.category, exc.value.status) == (ErrorCategory.PROVIDER_STATUS, 404)


def test_batched_state_refresh(linear_sandbox):
    linear_sandbox.add_team("OPS")
    with linear_sandbox.quiet():
        ids = [linear_sandbox.create_issue(f"T{n}", team=SANDBOX_TEAM, state="Todo")["id"] for n in range(150)]
        linear_sandbox.move_issue(ids[0], "In Progress")
        linear_sandbox.move_issue(ids[1], "Done")
        linear_sandbox.delete_issue(ids[2])
        foreign = linear_sandbox.create_issue("Other team", team="OPS")["id"]
    a = linear_adapter_for(linear_sandbox)
    linear_sandbox.clear_requests()
    states = a.get_task_states([ExternalTaskRef(i) for i in ids] + [ExternalTaskRef(foreign)])
    assert len(linear_sandbox.requests_for("IssueStates")) == 2 and len(linear_sandbox.requests) == 2
    assert [len(r.variables["ids"]) for r in linear_sandbox.requests_for("IssueStates")] == [100, 51]
    assert states[ids[0]].category == StateCategory.ACTIVE and states[ids[1]].category == StateCategory.TERMINAL
    assert states[ids[2]] is None and states[foreign] is None
    assert states[ids[3]].name == "Todo" and len(states) == 151


def test_comments_paginate_and_mark_the_service_account(linear_sandbox):
    issue = linear_sandbox.create_issue("Chatty", team=SANDBOX_TEAM)
    for n in range(5):
        linear_sandbox.add_comment(issue["id"], f"human comment {n} for @erin")
    a = linear_adapter_for(linear_sandbox, page_size=2)
    ref = ExternalTaskRef(issue["id"], issue["identifier"])
    comments, cursor = [], None
    while True:
        page = a.list_comments(ref, cursor)
        comments += page.items
        if page.cursor is None:
            break
        cursor = page.cursor
    assert [c.body for c in comments] == [f"human comment {n} for erin" for n in range(5)]
    assert not any(c.author.is_connector_service_account for c in comments)
    marker = "<!-- paperclip:comment:42 -->"
    comment_id = a.post_comment(ref, f"**Claude** via Paperclip: plan ready\n\n{marker}")
    page = a.list_comments(ref, cursor)
    assert [c.external_comment_id for c in page.items] == [comment_id]
    mine = page.items[0]
    assert marker in mine.body and mine.author.is_connector_service_account
    # the webhook for our own comment carries the marker and the service account as author
    delivery = linear_sandbox.deliveries[-1]
    event = a.verify_webhook(WebhookRequest(delivery.body, delivery.lower_headers))
    assert event.kind == EventKind.COMMENT_UPSERTED and event.comment.author.is_connector_service_account
    assert marker in event.comment.body


def test_sandbox_webhooks_round_trip(linear_sandbox):
    a = linear_adapter_for(linear_sandbox)
    issue = linear_sandbox.create_issue("Hook me", team=SANDBOX_TEAM, labels=["Bug"])
    linear_sandbox.move_issue(issue["id"], "In Progress")
    linear_sandbox.delete_issue(issue["id"])
    events = [a.verify_webhook(WebhookRequest(d.body, d.lower_headers)) for d in linear_sandbox.deliveries]
    assert [e.kind for e in events] == [EventKind.TASK_UPSERTED, EventKind.TASK_UPSERTED, EventKind.TASK_DELETED]
    assert events[1].task.state.category == StateCategory.ACTIVE and events[1].task.external_key == issue["identifier"]
    assert json.loads(linear_sandbox.deliveries[1].body)["updatedFrom"]["stateId"]
    assert len({e.event_id for e in events}) == 3 and all(not e.action.endswith("no-timestamp") for e in events)


def test_rate_limits_auth_and_status_errors(linear_sandbox):
    a = linear_adapter_for(linear_sandbox)
    linear_sandbox.fail_next(1, "rate_limit", retry_after=7)
    with pytest.raises(ProviderError) as exc:
        a.list_candidate_tasks(SANDBOX_TEAM, None)
    assert (exc.value.category, exc.value.status, exc.value.retry_after) == (ErrorCategory.PROVIDER_RATE_LIMITED, 429, 7)
    linear_sandbox.fail_next(1, "ratelimited_400", retry_after=30)  # HTTP 400 + RATELIMITED + reset header (ms)
    with pytest.raises(ProviderError) as exc:
        a.get_task_states([ExternalTaskRef("x")])
    assert exc.value.category == ErrorCategory.PROVIDER_RATE_LIMITED and 25 <= exc.value.retry_after <= 30
    linear_sandbox.fail_next(1, "auth")
    with pytest.raises(ProviderError) as exc:
        a.list_candidate_tasks(SANDBOX_TEAM, None)
    assert exc.value.category == ErrorCategory.PROVIDER_AUTH
    with pytest.raises(ProviderError) as exc:  # a wrong key: Linear's AUTHENTICATION_ERROR
        linear_adapter_for(linear_sandbox, token="lin_api_wrong").list_candidate_tasks(SANDBOX_TEAM, None)
    assert exc.value.category == ErrorCategory.PROVIDER_AUTH
    linear_sandbox.fail_next(1, "error", status=502)
    with pytest.raises(ProviderError) as exc:
        a.list_candidate_tasks(SANDBOX_TEAM, None)
    assert (exc.value.category, exc.value.status) == (ErrorCategory.PROVIDER_STATUS, 502)
    assert a.list_candidate_tasks(SANDBOX_TEAM, None).items == []  # recovered
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = LinearAdapter(AdapterConfig(base_url=f"http://127.0.0.1:{port}", containers=(SANDBOX_TEAM,),
                                       state_mapping={}, credentials=SANDBOX_TOKEN, timeout=2.0))
    with pytest.raises(ProviderError) as exc:
        dead.list_candidate_tasks(SANDBOX_TEAM, None)
    assert exc.value.category == ErrorCategory.PROVIDER_REQUEST


def test_auth_header_shapes(linear_sandbox):
    linear_adapter_for(linear_sandbox).list_candidate_tasks(SANDBOX_TEAM, None)
    assert linear_sandbox.requests[-1].headers["authorization"] == SANDBOX_TOKEN  # personal key: no "Bearer"
    oauth = LinearSandbox(teams=(SANDBOX_TEAM,), token="oauth-access-token").start()
    try:
        linear_adapter_for(oauth, token="oauth-access-token").list_candidate_tasks(SANDBOX_TEAM, None)
        assert oauth.requests[-1].headers["authorization"] == "Bearer oauth-access-token"
    finally:
        oauth.stop()


def test_writes_round_trip(linear_sandbox):
    a = linear_adapter_for(linear_sandbox)
    issue = linear_sandbox.create_issue("Ship it", team=SANDBOX_TEAM, state="Todo")
    ref = ExternalTaskRef(issue["id"], issue["identifier"])
    a.update_task_state(ref, "  in review ")  # names compare trimmed + lowercased
    assert linear_sandbox.issue(issue["id"])["state"]["name"] == "In Review"
    update = linear_sandbox.requests_for("IssueUpdate")[-1]
    review = linear_sandbox.state_named(SANDBOX_TEAM, "In Review")
    assert update.variables == {"id": issue["id"], "input": {"stateId": review["id"]}}
    assert a.get_task(ref).state.category == StateCategory.REVIEW
    with pytest.raises(ProviderError) as exc:
        a.update_task_state(ref, "Shipped")
    assert exc.value.category == ErrorCategory.PROVIDER_PAYLOAD and "In Review" in str(exc.value)

    linear_sandbox.add_label(SANDBOX_TEAM, "Feature")
    a.set_fields(ref, {"title": "Ship it now", "description": "New **body**", "priority": 1, "labels": ["feature"],
                       "dueAt": "2026-05-01"})
    task = a.get_task(ref)
    assert (task.title, task.description, task.priority, task.labels) == ("Ship it now", "New **body**", 1, ("feature",))
    assert task.due_at.date().isoformat() == "2026-05-01"
    with pytest.raises(ProviderError):
        a.set_fields(ref, {"labels": ["does-not-exist"]})
    with pytest.raises(ProviderError):
        a.set_fields(ref, {"colour": "red"})

    a.set_backlink(ref, "https://paperclip.example/issues/PC-1")
    a.set_backlink(ref, "https://paperclip.example/issues/PC-1")
    links = linear_sandbox.attachments_of(issue["id"])
    assert len(links) == 1 and links[0]["metadata"] == {"paperclip": "backlink"}

    created = a.create_task(SANDBOX_TEAM, {"title": "From Paperclip", "description": "body", "priority": 2,
                                           "labels": ["Feature"], "state": "In Progress"})
    assert created.external_key == "ENG-2" and created.state.category == StateCategory.ACTIVE
    assert created.priority == 2 and created.labels == ("feature",)
    assert linear_sandbox.issue(created.external_id)["creator"]["id"] == linear_sandbox.service_user["id"]


def test_workflow_states_for_setup(linear_sandbox):
    states = linear_adapter_for(linear_sandbox).workflow_states(SANDBOX_TEAM)
    by_name = {s["name"]: s["category"] for s in states}
    assert by_name == {"Triage": "backlog", "Backlog": "backlog", "Todo": "backlog", "In Progress": "active",
                       "In Review": "review", "Done": "terminal", "Canceled": "terminal", "Duplicate": "terminal"}


def test_standalone_sandbox_serves_graphql(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"LINEAR_SANDBOX_TOKEN": "lin_api_demo", "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen([sys.executable, "-m", "connectors.sandbox.linear", "--port", str(port), "--seed", "3"],
                            cwd=str(Path(__file__).resolve().parents[1]), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        assert f"127.0.0.1:{port}/graphql" in line
        a = LinearAdapter(AdapterConfig(base_url=f"http://127.0.0.1:{port}", containers=("ENG",), state_mapping={},
                                        credentials="lin_api_demo"))
        assert [t.title for t in a.list_candidate_tasks("ENG", None).items] == ["Demo issue 1", "Demo issue 2",
                                                                                 "Demo issue 3"]
        r = httpx.post(f"http://127.0.0.1:{port}/graphql", json={"query": "query Issues { x }"})
        assert r.status_code == 400 and r.json()["errors"][0]["extensions"]["code"] == "AUTHENTICATION_ERROR"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_signature_helper_matches_hmac():
    body = b'{"type":"Issue"}'
    assert sign("s", body) == hmac.new(b"s", body, hashlib.sha256).hexdigest()


# --- through the real webhook endpoint (database) ----------------------------------------------------
def _fresh(body: bytes) -> bytes:
    """The fixture bytes unchanged except a current webhookTimestamp (a live delivery of that payload)."""
    import re
    return re.sub(rb'"webhookTimestamp": \d+', b'"webhookTimestamp": %d' % int(time.time() * 1000), body)


@pytest.fixture
def linear_instance(company, monkeypatch):
    from connectors.services.instances import instance_create
    from issues.actors import SYSTEM

    monkeypatch.setenv("PAPERCLIP_SECRET_LINEAR_FIXTURE_HOOK_SECRET", SECRET)
    return instance_create(actor=SYSTEM, company=company, name="linear-fixtures", provider_key="linear",
                           containers=list(FIXTURE_TEAMS), state_mapping=DEFAULT_STATE_MAPPING,
                           webhook_secret="env:PAPERCLIP_SECRET_LINEAR_FIXTURE_HOOK_SECRET")


def _post(instance, body: bytes, *, secret=SECRET, delivery=None):
    from rest_framework.test import APIClient

    headers = {"HTTP_LINEAR_SIGNATURE": sign(secret, body), "HTTP_LINEAR_EVENT": json.loads(body).get("type", "")}
    if delivery:
        headers["HTTP_LINEAR_DELIVERY"] = delivery
    return APIClient().post(f"/api/connectors/{instance.pk}/webhook", data=body, content_type="application/json",
                            **headers)


def test_every_fixture_through_the_webhook_endpoint(linear_instance, django_capture_on_commit_callbacks):
    from connectors.models import InboundEvent, TaskLink

    order = ["lks_createIssue", "lks_updateIssue", "lks_updateIssueWithAddIssueLabel", "lhc_linearIssueCreated",
             "lhc_linearCommentCreated", "lhc_linearCommentUpdated", "zulip_comment_create"]
    for name in order:
        body = _fresh(raw(name))
        for _ in range(2):  # a retried delivery is the same inbound event
            with django_capture_on_commit_callbacks(execute=True):
                response = _post(linear_instance, body, delivery=f"delivery-{name}")
            assert response.status_code == 202, (name, response.content)
    events = {e.idempotency_key: e for e in InboundEvent.objects.filter(instance=linear_instance)}
    assert set(events) == {f"delivery-{n}" for n in order}
    assert all(e.verified and e.status in ("applied", "dropped") for e in events.values()), \
        [(k, e.status, e.outcome) for k, e in events.items()]
    links = {link.external_key: link for link in TaskLink.objects.filter(instance=linear_instance)}
    assert {"KOR-11", "LIN-34"} <= set(links)  # KOR-57 is "In Review" (review): imported too unless terminal
    assert links["LIN-34"].external_task_id == "7f2cba4d-6244-415c-ac09-63eb071755a8"


def test_endpoint_rejects_forged_stale_and_foreign(linear_instance, django_capture_on_commit_callbacks):
    from connectors.models import InboundEvent

    body = _fresh(raw("lhc_linearIssueCreated"))
    assert _post(linear_instance, body, secret="forged").status_code == 401
    assert _post(linear_instance, raw("lhc_linearIssueCreated")).status_code == 401  # 2023 timestamp: replay
    payload = json.loads(raw("lks_createIssue"))
    payload["data"]["team"]["key"], payload["data"]["team"]["id"] = "OPS", "another-team"
    payload["data"]["teamId"] = "another-team"
    assert _post(linear_instance, json.dumps(payload).encode()).status_code == 401
    assert not InboundEvent.objects.exists()
    linear_instance.refresh_from_db()
    assert linear_instance.webhook_rejected_count == 3
