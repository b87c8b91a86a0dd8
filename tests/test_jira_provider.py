"""Jira Cloud adapter (layer 1) and the ADF <-> Markdown converter: every real Jira fixture through
webhook verification, and every read and write operation over real HTTP against the Jira sandbox.
No database needed."""
import hashlib
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from connectors.providers import adf
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
)
from connectors.providers.jira import JiraAdapter, wiki_to_markdown
from connectors.sandbox.jira import DEFAULT_FIXTURES_DIR, JiraSandbox, sign
from tests.jira_sandbox import (
    DEFAULT_STATE_MAPPING,
    SANDBOX_EMAIL,
    SANDBOX_PROJECT,
    SANDBOX_TOKEN,
    SANDBOX_WEBHOOK_SECRET,
    jira_adapter_for,
)

FIXTURES = Path(DEFAULT_FIXTURES_DIR)
SECRET = "jira-test-secret"
FIXTURE_PROJECTS = ("BUG", "ZUL", "SP")


def adapter(containers=FIXTURE_PROJECTS, secret=SECRET, mapping=None, **kw):
    return JiraAdapter(AdapterConfig(base_url="https://example.atlassian.net", containers=tuple(containers),
                                     state_mapping=DEFAULT_STATE_MAPPING if mapping is None else mapping,
                                     credentials="bot@example.com:token", webhook_secret=secret, **kw))


def raw(name: str) -> bytes:
    return (FIXTURES / f"{name}.json").read_bytes()


def signed(body: bytes, *, secret=SECRET, identifier: str | None = "wh-1", **extra) -> WebhookRequest:
    headers = {"x-hub-signature": sign(secret, body), "content-type": "application/json"}
    if identifier:
        headers["x-atlassian-webhook-identifier"] = identifier
    headers.update(extra)
    return WebhookRequest(body=body, headers=headers)


# --- every real fixture --------------------------------------------------------------------------
def test_every_jira_fixture_is_covered():
    assert {p.stem for p in FIXTURES.glob("*.json")} == {"zulip_issue_created", "zulip_comment_created",
                                                         "zulip_comment_updated"}


def test_issue_created_fixture():
    event = adapter().verify_webhook(signed(raw("zulip_issue_created"), identifier="abc-123"))
    assert (event.kind, event.action, event.external_task_id, event.container_id, event.event_id) == (
        EventKind.TASK_UPSERTED, "jira:issue_created", "10400", "BUG", "abc-123")
    task = event.task
    assert (task.external_id, task.external_key, task.title, task.description) == ("10400", "BUG-15",
                                                                                   "New bug with hook", "Fix me please")
    # this old payload has a status without statusCategory: unmapped -> backlog, reported in the envelope
    assert (task.state.name, task.state.category) == ("Open", StateCategory.BACKLOG)
    assert task.envelope["unmappedState"] == "Open" and task.envelope["descriptionFormat"] == "wiki"
    assert task.priority == 2 and task.envelope["priority"]["name"] == "Major"  # legacy name, default mapping
    assert task.labels == () and task.assignees == () and task.due_at is None
    assert task.created_at.isoformat() == "2013-03-27T16:53:58.301000+00:00"
    assert event.actor.display_name == "Leo Franchi" and event.occurred_at.year == 2013
    assert task.url == "http://lfranchi.com:8080/browse/BUG-15"


@pytest.mark.parametrize("name,key,body,author", [
    ("zulip_comment_created", "ZUL-1", "Leaving a comment here! :)", "Eeshan Garg"),
    ("zulip_comment_updated", "SP-1", "This is a very important issue! I\u2019m on it!", "Hemanth V. Alluri"),
])
def test_comment_fixtures(name, key, body, author):
    payload = json.loads(raw(name))
    event = adapter().verify_webhook(signed(raw(name)))
    assert event.kind == EventKind.COMMENT_UPSERTED and event.action == payload["webhookEvent"]
    assert event.external_task_id == "10000" and event.container_id == key.split("-")[0]
    comment = event.comment
    assert (comment.external_comment_id, comment.external_task_id, comment.body) == ("10000", "10000", body)
    assert comment.author.display_name == author and comment.author.external_user_id == payload["comment"]["author"]["accountId"]
    assert comment.url.endswith(f"/browse/{key}?focusedCommentId=10000")
    assert comment.created_at is not None and comment.updated_at >= comment.created_at
    assert event.task is None  # comment payloads carry a partial issue; the engine reads the task itself


def test_fixtures_delivered_by_the_sandbox(jira_sandbox):
    a = adapter(secret=SANDBOX_WEBHOOK_SECRET)
    for name in ("zulip_issue_created", "zulip_comment_created", "zulip_comment_updated"):
        delivery = jira_sandbox.deliver_fixture(name)
        headers = delivery.lower_headers
        assert headers["x-hub-signature"] == sign(SANDBOX_WEBHOOK_SECRET, delivery.body)
        event = a.verify_webhook(WebhookRequest(delivery.body, headers))
        assert event.event_id == headers["x-atlassian-webhook-identifier"] and event.kind != EventKind.IGNORED
    # a redelivery keeps the identifier (the inbound idempotency key) and counts the retry
    again = jira_sandbox.redeliver(jira_sandbox.deliveries[-1])
    event = a.verify_webhook(WebhookRequest(again.body, again.lower_headers))
    assert event.event_id == jira_sandbox.deliveries[-2].identifier and event.action == "comment_updated;retry=1"


# --- signatures, containers, event ids ----------------------------------------------------------
def test_bad_signatures_are_rejected():
    body = raw("zulip_comment_created")
    a = adapter()
    cases = {
        "missing": WebhookRequest(body, {"x-atlassian-webhook-identifier": "x"}),
        "no prefix": WebhookRequest(body, {"x-hub-signature": sign(SECRET, body)[len("sha256="):]}),
        "sha1": WebhookRequest(body, {"x-hub-signature": "sha1=" + "0" * 40}),
        "wrong secret": signed(body, secret="other"),
        "tampered": WebhookRequest(body.replace(b"Leaving", b"Deleting"), {"x-hub-signature": sign(SECRET, body)}),
    }
    for case, request in cases.items():
        with pytest.raises(WebhookRejected) as exc:
            a.verify_webhook(request)
        assert exc.value.category == ErrorCategory.WEBHOOK_SIGNATURE, case
    with pytest.raises(WebhookUnparseable):
        a.verify_webhook(signed(b"[1, 2"))


def test_unsigned_webhooks_are_hints_when_no_secret_is_configured():
    event = adapter(secret=None).verify_webhook(WebhookRequest(raw("zulip_issue_created"), {}))
    assert event.kind == EventKind.TASK_UPSERTED and event.trusted_content is False
    assert event.event_id == "sha256:" + hashlib.sha256(raw("zulip_issue_created")).hexdigest()


def test_foreign_project_is_rejected():
    for name in ("zulip_issue_created", "zulip_comment_created", "zulip_comment_updated"):
        with pytest.raises(WebhookRejected) as exc:
            adapter(containers=("ABC",)).verify_webhook(signed(raw(name)))
        assert exc.value.category == ErrorCategory.PROVIDER_PAYLOAD, name


def test_other_events_and_deletes():
    payload = json.loads(raw("zulip_issue_created"))
    payload["webhookEvent"] = "worklog_created"
    event = adapter().verify_webhook(signed(json.dumps(payload).encode()))
    assert event.kind == EventKind.IGNORED and event.task is None
    payload["webhookEvent"] = "jira:issue_deleted"
    event = adapter().verify_webhook(signed(json.dumps(payload).encode()))
    assert event.kind == EventKind.TASK_DELETED and event.external_task_id == "10400"
    payload = json.loads(raw("zulip_comment_created"))
    payload["webhookEvent"] = "comment_deleted"
    event = adapter().verify_webhook(signed(json.dumps(payload).encode()))
    assert event.kind == EventKind.COMMENT_DELETED and event.comment.external_comment_id == "10000"


def test_wiki_markup_is_unescaped_and_mentions_neutralized():
    assert wiki_to_markdown("Done\\! see [~accountid:5b10ac] and \\[x\\]") == "Done! see 5b10ac and [x]"
    payload = json.loads(raw("zulip_issue_created"))
    payload["issue"]["fields"]["description"] = "Ask @frank about it"
    task = adapter().verify_webhook(signed(json.dumps(payload).encode())).task
    assert task.description == "Ask frank about it" and task.envelope["mentionsNeutralized"] == ["frank"]


# --- configuration ----------------------------------------------------------------------------------
def test_capabilities_and_mapping_validation():
    caps = adapter_class("jira").capabilities
    assert {"post_comment", "update_task_state", "set_fields", "set_backlink", "create_task"} <= caps.operations
    assert caps.signed_webhooks and len(caps.routing_rule_kinds) == 6
    a = adapter()
    assert a.validate_state_mapping(DEFAULT_STATE_MAPPING) == {} and a.validate_state_mapping({}) == {}
    assert a.validate_state_mapping({"projects": {"ABC": {"statuses": {"QA": "review"}}},
                                     "priorities": {"P1": 0, "P2": 1}, "issueType": "Bug"}) == {}
    errors = a.validate_state_mapping({"statuses": {"QA": "testing"}, "categories": {"open": "active"},
                                       "priorities": {"P1": 7, "P2": True}, "projects": {"ABC": {"lanes": {}}},
                                       "issueType": "", "color": 1})
    assert set(errors) == {"statuses.QA", "categories.open", "priorities.P1", "priorities.P2", "projects.ABC.lanes",
                           "issueType", "color"}


def test_status_and_priority_mapping_from_configuration():
    mapping = {"statuses": {"Open": "active"}, "projects": {"SP": {"categories": {"new": "blocked"}}},
               "priorities": {"Medium": 1}}
    a = adapter(mapping=mapping)
    task = a.verify_webhook(signed(raw("zulip_issue_created"))).task
    assert task.state.category == StateCategory.ACTIVE and "unmappedState" not in task.envelope
    assert task.priority is None and task.envelope["unmappedPriority"] == "Major"  # custom priorities replace defaults
    payload = json.loads(raw("zulip_comment_updated"))
    payload["webhookEvent"] = "jira:issue_updated"
    task = a.verify_webhook(signed(json.dumps(payload).encode())).task
    assert task.state.name == "To Do" and task.state.category == StateCategory.BLOCKED and task.priority == 1


# --- ADF <-> Markdown ----------------------------------------------------------------------------
RICH_ADF = {"type": "doc", "version": 1, "content": [
    {"type": "heading", "attrs": {"level": 2}, "content": [{"type": "text", "text": "Plan"}]},
    {"type": "paragraph", "content": [
        {"type": "text", "text": "Hi "},
        {"type": "mention", "attrs": {"id": "5b10a2844c20165700ede21g", "text": "@Ada Lovelace"}},
        {"type": "text", "text": ", read "},
        {"type": "text", "text": "the docs", "marks": [{"type": "link", "attrs": {"href": "https://example.com/d"}}]},
        {"type": "text", "text": " and run "},
        {"type": "text", "text": "make test", "marks": [{"type": "code"}]},
        {"type": "text", "text": " "},
        {"type": "text", "text": "now", "marks": [{"type": "strong"}]},
        {"type": "text", "text": "."}]},
    {"type": "bulletList", "content": [
        {"type": "listItem", "content": [{"type": "paragraph", "content": [{"type": "text", "text": "first"}]},
                                         {"type": "orderedList", "content": [
                                             {"type": "listItem", "content": [
                                                 {"type": "paragraph", "content": [{"type": "text", "text": "nested"}]}]}]}]},
        {"type": "listItem", "content": [{"type": "paragraph", "content": [{"type": "text", "text": "second"}]}]}]},
    {"type": "codeBlock", "attrs": {"language": "python"}, "content": [{"type": "text", "text": "print('hi')\nx = 1"}]},
    {"type": "blockquote", "content": [{"type": "paragraph", "content": [{"type": "text", "text": "quoted"}]}]},
    {"type": "rule"},
]}
RICH_MD = ("## Plan\n\nHi Ada Lovelace, read [the docs](https://example.com/d) and run `make test` **now**.\n\n"
           "- first\n  1. nested\n- second\n\n```python\nprint('hi')\nx = 1\n```\n\n> quoted\n\n---")


def test_adf_to_markdown_and_back():
    markdown, lossy = adf.adf_to_markdown_ex(RICH_ADF)
    assert markdown == RICH_MD and lossy == []
    back = adf.markdown_to_adf(markdown)
    # structure survives; the mention comes back as its plain display name (no account id in Markdown)
    assert [n["type"] for n in back["content"]] == ["heading", "paragraph", "bulletList", "codeBlock", "blockquote", "rule"]
    assert back["content"][3] == RICH_ADF["content"][3]
    assert back["content"][2]["content"][0]["content"][1]["type"] == "orderedList"
    assert {"type": "text", "text": "the docs", "marks": [{"type": "link", "attrs": {"href": "https://example.com/d"}}]} \
        in back["content"][1]["content"]
    assert adf.adf_to_markdown(back) == markdown  # stable after one round


def test_adf_lossy_nodes_are_reported():
    doc = {"type": "doc", "version": 1, "content": [
        {"type": "panel", "attrs": {"panelType": "info"}, "content": [{"type": "paragraph", "content": [
            {"type": "text", "text": "careful", "marks": [{"type": "underline"}]}]}]},
        {"type": "mediaSingle", "content": [{"type": "media", "attrs": {"id": "x", "type": "file"}}]},
        {"type": "taskList", "content": [{"type": "taskItem", "attrs": {"state": "DONE"}, "content": [
            {"type": "text", "text": "done item"}]}]},
        {"type": "table", "content": [
            {"type": "tableRow", "content": [{"type": "tableHeader", "content": [{"type": "paragraph", "content": [
                {"type": "text", "text": "h"}]}]}]},
            {"type": "tableRow", "content": [{"type": "tableCell", "content": [{"type": "paragraph", "content": [
                {"type": "text", "text": "c"}]}]}]}]},
    ]}
    markdown, lossy = adf.adf_to_markdown_ex(doc)
    assert markdown == "> careful\n\n[attachment]\n\n- [x] done item\n\n| h |\n|---|\n| c |"
    assert set(lossy) == {"panel", "underline", "media"}


def test_markers_are_split_out_of_adf():
    text, markers = adf.split_markers("Done.\n\n<!-- paperclip:comment:7 -->\n<!-- paperclip:agent:claude -->")
    assert text == "Done." and markers == ["paperclip:comment:7", "paperclip:agent:claude"]
    assert "<!--" not in json.dumps(adf.markdown_to_adf("a\n\n<!-- paperclip:x -->\n\nb"))


# --- over HTTP against the sandbox ---------------------------------------------------------------
def _all_pages(a, cursor=None):
    items = []
    while True:
        page = a.list_candidate_tasks(SANDBOX_PROJECT, cursor)
        items += page.items
        if page.cursor is None:
            return items, cursor
        cursor = page.cursor


def test_search_paginates_then_polls_incrementally(jira_sandbox):
    with jira_sandbox.quiet():
        keys = [jira_sandbox.create_issue(f"Task {n}", project=SANDBOX_PROJECT)["key"] for n in range(7)]
    a = jira_adapter_for(jira_sandbox, page_size=3)
    jira_sandbox.clear_requests()
    items, cursor = _all_pages(a)
    assert [t.external_key for t in items] == keys
    searches = jira_sandbox.requests_to(r"^/search/jql$", "POST")
    assert [bool(r.body.get("nextPageToken")) for r in searches[:3]] == [False, True, True]
    assert searches[0].body["jql"] == 'project = "ABC" ORDER BY updated ASC, id ASC'
    assert all(r.body["maxResults"] == 3 for r in searches)
    # nothing changed: nothing listed (JQL minute precision re-reads the boundary minute, filtered client-side)
    page = a.list_candidate_tasks(SANDBOX_PROJECT, cursor)
    assert page.items == [] and page.cursor is None
    assert 'updated >= "2026/01/01 00:00"' in jira_sandbox.requests_to(r"^/search/jql$")[-1].body["jql"]
    jira_sandbox.advance(120)
    jira_sandbox.transition(keys[1], "In Progress")
    jira_sandbox.update_issue(keys[4], summary="Renamed")
    items, _ = _all_pages(a, cursor)
    assert [(t.external_key, t.title) for t in items] == [(keys[1], "Task 1"), (keys[4], "Renamed")]
    assert items[0].state.category == StateCategory.ACTIVE


def test_incremental_jql_uses_the_api_users_time_zone():
    with JiraSandbox(projects=(SANDBOX_PROJECT,), email=SANDBOX_EMAIL, token=SANDBOX_TOKEN,
                     time_zone="America/New_York").start() as sb:
        with sb.quiet():
            first = sb.create_issue("Before", project=SANDBOX_PROJECT)
        a = jira_adapter_for(sb)
        _, cursor = _all_pages(a)
        sb.advance(3600)
        sb.update_issue(first["key"], summary="After")
        items, _ = _all_pages(a, cursor)
        # had the bound been written in UTC ("2026/01/01 00:00"), Jira would read it as 05:00Z and miss this
        assert [t.title for t in items] == ["After"]
        jqls = [r.body["jql"] for r in sb.requests_to(r"^/search/jql$")]
        assert 'updated >= "2025/12/31 19:00"' in jqls[-2]  # high-water mark 00:00:01Z in New York (UTC-5)
        assert 'updated >= "2025/12/31 20:00"' in jqls[-1]  # then 01:00:02Z
        assert len(sb.requests_to(r"^/myself$")) == 1  # the zone is fetched once per adapter


def test_invalid_cursors(jira_sandbox):
    a = jira_adapter_for(jira_sandbox)
    for bad in ("{", json.dumps({"v": 1, "scope": "XYZ", "since": None, "seen": []}),
                json.dumps({"v": 1, "scope": SANDBOX_PROJECT, "since": "soon", "seen": []})):
        with pytest.raises(ProviderError) as exc:
            a.list_candidate_tasks(SANDBOX_PROJECT, bad)
        assert exc.value.category == ErrorCategory.CURSOR_INVALID
    rejected = json.dumps({"v": 1, "scope": SANDBOX_PROJECT, "since": None, "seen": [], "hw": None, "hwSeen": [],
                           "next": "expired-token"})
    with pytest.raises(ProviderError) as exc:
        a.list_candidate_tasks(SANDBOX_PROJECT, rejected)  # Jira answers 400 for a token it does not know
    assert exc.value.category == ErrorCategory.CURSOR_INVALID


def test_get_task_converts_adf_and_normalizes(jira_sandbox):
    blocker = jira_sandbox.create_issue("Blocker", project=SANDBOX_PROJECT, status="In Progress")
    issue = jira_sandbox.create_issue("Rich one", project=SANDBOX_PROJECT, description=RICH_ADF, labels=["Backend", "API"],
                                      priority="Highest", assignee="Ada Lovelace", duedate="2026-04-01")
    jira_sandbox.update_issue(blocker["key"], blocks=[issue["id"]])
    a = jira_adapter_for(jira_sandbox)
    task = a.get_task(ExternalTaskRef(issue["id"], issue["key"]))
    assert (task.external_id, task.external_key, task.container_id) == (issue["id"], "ABC-2", SANDBOX_PROJECT)
    assert task.description == RICH_MD and task.envelope["descriptionAdf"] == RICH_ADF
    assert task.priority == 0 and task.labels == ("backend", "api") and task.assignees[0].display_name == "Ada Lovelace"
    assert task.due_at.isoformat() == "2026-04-01T00:00:00+00:00" and task.url == f"{jira_sandbox.base_url}/browse/ABC-2"
    assert task.blocked_by[0].external_key == "ABC-1" and task.blocked_by[0].state == "In Progress"
    assert (task.state.name, task.state.category) == ("To Do", StateCategory.BACKLOG)
    assert task.envelope["status"]["categoryKey"] == "new" and task.revision.endswith("+0000")
    # the Markdown goes back as the same ADF structure (round trip through the real API)
    a.set_fields(ExternalTaskRef(issue["id"], issue["key"]), {"description": task.description})
    stored = jira_sandbox.issue(issue["key"])["fields"]["description"]
    assert stored["content"][3] == RICH_ADF["content"][3] and stored["content"][0] == RICH_ADF["content"][0]
    assert a.get_task(ExternalTaskRef(issue["id"], issue["key"])).description == RICH_MD
    with pytest.raises(ProviderError) as exc:
        a.get_task(ExternalTaskRef("99999", "ABC-999"))
    assert (exc.value.category, exc.value.status) == (ErrorCategory.PROVIDER_STATUS, 404)
    with pytest.raises(ProviderError) as exc:
        a.get_task(ExternalTaskRef("1", "XYZ-1"))  # never reads outside its projects
    assert exc.value.category == ErrorCategory.PROVIDER_PAYLOAD


def test_batched_state_refresh(jira_sandbox):
    with jira_sandbox.quiet():
        issues = [jira_sandbox.create_issue(f"T{n}", project=SANDBOX_PROJECT) for n in range(150)]
        jira_sandbox.transition(issues[0]["key"], "In Progress")
        jira_sandbox.transition(issues[1]["key"], "Done")
        jira_sandbox.transition(issues[2]["key"], "In Review")
    a = jira_adapter_for(jira_sandbox)
    jira_sandbox.clear_requests()
    refs = [ExternalTaskRef(i["id"], i["key"]) for i in issues]
    states = a.get_task_states(refs)
    searches = jira_sandbox.requests_to(r"^/search/jql$")
    assert len(jira_sandbox.requests) == len(searches) == 2
    assert searches[0].body["jql"].startswith("id in (") and searches[0].body["jql"].count(",") == 99
    assert searches[0].body["fields"] == ["status", "project"]
    assert [states[i["id"]].category for i in issues[:4]] == [StateCategory.ACTIVE, StateCategory.TERMINAL,
                                                              StateCategory.REVIEW, StateCategory.BACKLOG]
    # a deleted issue: Jira answers 400 naming it; it is reported gone and the rest re-asked once
    jira_sandbox.delete_issue(issues[3]["key"])
    jira_sandbox.clear_requests()
    states = a.get_task_states(refs[:10])
    assert states[issues[3]["id"]] is None and states[issues[0]["id"]].category == StateCategory.ACTIVE
    assert [r.status for r in jira_sandbox.requests] == [400, 200]


def test_comments_with_markers_round_trip(jira_sandbox):
    issue = jira_sandbox.create_issue("Chatty", project=SANDBOX_PROJECT)
    ref = ExternalTaskRef(issue["id"], issue["key"])
    for n in range(5):
        jira_sandbox.add_comment(issue["key"], f"human *comment* {n}")
    a = jira_adapter_for(jira_sandbox, page_size=2)
    comments, cursor = [], None
    while True:
        page = a.list_comments(ref, cursor)
        comments += page.items
        if page.cursor is None:
            break
        cursor = page.cursor
    assert [c.body for c in comments] == [f"human *comment* {n}" for n in range(5)]
    assert not any(c.author.is_connector_service_account for c in comments)
    body = "**Claude** via Paperclip: plan ready — see [PC-7](https://paperclip.example/PC-7)\n\n<!-- paperclip:comment:7 -->"
    comment_id = a.post_comment(ref, body)
    posted = jira_sandbox.requests_to(r"/comment$", "POST")[-1].body
    assert posted["properties"] == [{"key": "paperclip", "value": {"markers": ["paperclip:comment:7"]}}]
    assert "<!--" not in json.dumps(posted["body"]) and posted["body"]["type"] == "doc"
    page = a.list_comments(ref, cursor)
    assert [c.external_comment_id for c in page.items] == [comment_id]
    mine = page.items[0]
    assert mine.body == body and mine.author.is_connector_service_account
    assert a.list_comments(ref, page.cursor).items == []
    jira_sandbox.edit_comment(comments[0].external_comment_id, "edited")
    assert [c.body for c in a.list_comments(ref, page.cursor).items] == ["edited"]


def test_sandbox_webhooks_round_trip(jira_sandbox):
    a = jira_adapter_for(jira_sandbox)
    issue = jira_sandbox.create_issue("Hook me", project=SANDBOX_PROJECT, description="Hello **there**")
    jira_sandbox.transition(issue["key"], "In Progress")
    comment = jira_sandbox.add_comment(issue["key"], "a note")
    jira_sandbox.delete_comment(comment["id"])
    jira_sandbox.delete_issue(issue["key"])
    events = [a.verify_webhook(WebhookRequest(d.body, d.lower_headers)) for d in jira_sandbox.deliveries]
    assert [e.kind for e in events] == [EventKind.TASK_UPSERTED, EventKind.TASK_UPSERTED, EventKind.COMMENT_UPSERTED,
                                        EventKind.COMMENT_DELETED, EventKind.TASK_DELETED]
    assert events[1].task.state.category == StateCategory.ACTIVE and events[0].task.description == "Hello **there**"
    assert json.loads(jira_sandbox.deliveries[1].body)["changelog"]["items"][0]["toString"] == "In Progress"
    assert len({e.event_id for e in events}) == 5 and all(e.trusted_content for e in events)


def test_rate_limit_auth_and_status_errors(jira_sandbox):
    a = jira_adapter_for(jira_sandbox)
    jira_sandbox.fail_next(1, "rate_limit", retry_after=12)
    with pytest.raises(ProviderError) as exc:
        a.list_candidate_tasks(SANDBOX_PROJECT, None)
    assert (exc.value.category, exc.value.status, exc.value.retry_after) == (ErrorCategory.PROVIDER_RATE_LIMITED, 429, 12)
    jira_sandbox.fail_next(1, "rate_limit", retry_after=None)
    with pytest.raises(ProviderError) as exc:
        a.get_task_states([ExternalTaskRef("10001", "ABC-1")])
    assert exc.value.category == ErrorCategory.PROVIDER_RATE_LIMITED and exc.value.retry_after == 60
    with pytest.raises(ProviderError) as exc:
        jira_adapter_for(jira_sandbox, credentials=f"{SANDBOX_EMAIL}:wrong").list_candidate_tasks(SANDBOX_PROJECT, None)
    assert (exc.value.category, exc.value.status) == (ErrorCategory.PROVIDER_AUTH, 401)
    jira_sandbox.fail_next(1, "auth", status=403)
    with pytest.raises(ProviderError) as exc:
        a.list_candidate_tasks(SANDBOX_PROJECT, None)
    assert exc.value.category == ErrorCategory.PROVIDER_AUTH
    jira_sandbox.fail_next(1, "error", status=503)
    with pytest.raises(ProviderError) as exc:
        a.list_candidate_tasks(SANDBOX_PROJECT, None)
    assert (exc.value.category, exc.value.status) == (ErrorCategory.PROVIDER_STATUS, 503)
    assert a.list_candidate_tasks(SANDBOX_PROJECT, None).items == []
    assert jira_sandbox.requests[-1].headers["authorization"].startswith("Basic ")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = JiraAdapter(AdapterConfig(base_url=f"http://127.0.0.1:{port}", containers=(SANDBOX_PROJECT,),
                                     state_mapping={}, credentials="a:b", timeout=2.0))
    with pytest.raises(ProviderError) as exc:
        dead.get_task(ExternalTaskRef("1", "ABC-1"))
    assert exc.value.category == ErrorCategory.PROVIDER_REQUEST


def test_writes_round_trip(jira_sandbox):
    a = jira_adapter_for(jira_sandbox)
    issue = jira_sandbox.create_issue("Ship it", project=SANDBOX_PROJECT)
    ref = ExternalTaskRef(issue["id"], issue["key"])
    jira_sandbox.clear_requests()
    a.update_task_state(ref, "in review")  # target *status* name; the transition is called "Request review"
    assert [(r.method, r.path) for r in jira_sandbox.requests] == [("GET", "/issue/ABC-1/transitions"),
                                                                   ("POST", "/issue/ABC-1/transitions")]
    assert jira_sandbox.requests[-1].body == {"transition": {"id": "31"}}
    assert a.get_task(ref).state == a.get_task(ref).state.__class__("In Review", StateCategory.REVIEW)
    a.update_task_state(ref, "Resolve")  # a transition name works too
    assert jira_sandbox.issue("ABC-1")["fields"]["status"]["name"] == "Done"
    a.update_task_state(ref, "Done")  # already there: no-op
    with pytest.raises(ProviderError) as exc:
        a.update_task_state(ref, "Shipped")
    assert exc.value.category == ErrorCategory.PROVIDER_PAYLOAD and "Start progress -> In Progress" in str(exc.value)

    a.set_fields(ref, {"title": "Ship it now", "priority": 1, "labels": ["needs review"], "dueAt": "2026-06-30"})
    put = jira_sandbox.requests_to(r"^/issue/ABC-1$", "PUT")[-1].body
    assert put == {"fields": {"summary": "Ship it now", "priority": {"name": "High"}, "labels": ["needs-review"],
                              "duedate": "2026-06-30"}}
    task = a.get_task(ref)
    assert (task.title, task.priority, task.labels, task.due_at.date().isoformat()) == (
        "Ship it now", 1, ("needs-review",), "2026-06-30")
    with pytest.raises(ProviderError):
        a.set_fields(ref, {"colour": "red"})

    a.set_backlink(ref, "https://paperclip.example/issues/PC-1")
    a.set_backlink(ref, "https://paperclip.example/issues/PC-1")
    links = jira_sandbox.remote_links_of("ABC-1")
    assert len(links) == 1 and links[0]["globalId"] == "paperclip:backlink"
    assert links[0]["object"]["url"] == "https://paperclip.example/issues/PC-1"

    created = a.create_task(SANDBOX_PROJECT, {"title": "From Paperclip", "description": "Do **this**\n\n- a\n- b",
                                              "priority": 0, "labels": ["agent"], "state": "In Progress"})
    assert created.external_key == "ABC-2" and created.state.category == StateCategory.ACTIVE
    assert created.description == "Do **this**\n\n- a\n- b" and created.priority == 0 and created.labels == ("agent",)
    body = jira_sandbox.requests_to(r"^/issue$", "POST")[-1].body["fields"]
    assert body["issuetype"] == {"name": "Task"} and body["description"]["type"] == "doc"


def test_workflow_statuses_for_setup(jira_sandbox):
    statuses = jira_adapter_for(jira_sandbox, state_mapping={"statuses": {"In Review": "review"},
                                                             "categories": {"new": "backlog", "done": "terminal"}}
                                ).workflow_statuses(SANDBOX_PROJECT)
    assert [(s["name"], s["statusCategory"], s["category"], s["mapped"]) for s in statuses] == [
        ("To Do", "new", "backlog", True), ("In Progress", "indeterminate", "active", True),
        ("In Review", "indeterminate", "review", True), ("Blocked", "indeterminate", "blocked", True),
        ("Done", "done", "terminal", True)]
    unmapped = jira_adapter_for(jira_sandbox, state_mapping={"statuses": {}, "categories": {"new": "backlog"}})
    # defaults still apply for categories not overridden; only an explicit mapping gap is unmapped
    assert all(s["mapped"] for s in unmapped.workflow_statuses(SANDBOX_PROJECT))


def test_standalone_sandbox(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"JIRA_SANDBOX_TOKEN": "demo-token", "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen([sys.executable, "-m", "connectors.sandbox.jira", "--port", str(port), "--seed", "2"],
                            cwd=str(Path(__file__).resolve().parents[1]), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        assert f"127.0.0.1:{port}" in proc.stdout.readline()
        a = JiraAdapter(AdapterConfig(base_url=f"http://127.0.0.1:{port}", containers=("ABC",), state_mapping={},
                                      credentials="bot@example.com:demo-token"))
        tasks = a.list_candidate_tasks("ABC", None).items
        assert [t.title for t in tasks] == ["Demo issue 1", "Demo issue 2"]
        assert tasks[0].description == "Seeded by the sandbox (1/2)."
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# --- through the real webhook endpoint (database) ----------------------------------------------------
@pytest.fixture
def jira_instance(company, monkeypatch):
    from connectors.services.instances import instance_create
    from issues.actors import SYSTEM

    monkeypatch.setenv("PAPERCLIP_SECRET_JIRA_FIXTURE_HOOK_SECRET", SECRET)
    return instance_create(actor=SYSTEM, company=company, name="jira-fixtures", provider_key="jira",
                           base_url="https://example.atlassian.invalid", containers=list(FIXTURE_PROJECTS),
                           state_mapping=DEFAULT_STATE_MAPPING, webhook_secret="env:PAPERCLIP_SECRET_JIRA_FIXTURE_HOOK_SECRET")


def _post(instance, body: bytes, *, secret=SECRET, identifier=None, retry="0"):
    from rest_framework.test import APIClient

    headers = {"HTTP_X_ATLASSIAN_WEBHOOK_RETRY": retry}
    if secret:
        headers["HTTP_X_HUB_SIGNATURE"] = sign(secret, body)
    if identifier:
        headers["HTTP_X_ATLASSIAN_WEBHOOK_IDENTIFIER"] = identifier
    return APIClient().post(f"/api/connectors/{instance.pk}/webhook", data=body, content_type="application/json",
                            **headers)


def test_every_fixture_through_the_webhook_endpoint(jira_instance, django_capture_on_commit_callbacks):
    from connectors.models import InboundEvent, TaskLink

    names = ["zulip_issue_created", "zulip_comment_created", "zulip_comment_updated"]
    for name in names:
        for retry in ("0", "1"):  # Jira retries with the same identifier
            with django_capture_on_commit_callbacks(execute=True):
                response = _post(jira_instance, raw(name), identifier=f"wh-{name}", retry=retry)
            assert response.status_code == 202, (name, response.content)
    events = {e.idempotency_key: e for e in InboundEvent.objects.filter(instance=jira_instance)}
    assert set(events) == {f"wh-{n}" for n in names}
    assert all(e.verified and e.status in ("applied", "dropped") for e in events.values()), \
        [(k, e.status, e.outcome) for k, e in events.items()]
    link = TaskLink.objects.get(instance=jira_instance, external_task_id="10400")
    assert link.external_key == "BUG-15" and link.issue.title == "New bug with hook"


def test_endpoint_rejects_forged_unsigned_and_foreign(jira_instance):
    from connectors.models import InboundEvent

    body = raw("zulip_issue_created")
    assert _post(jira_instance, body, secret="forged").status_code == 401
    assert _post(jira_instance, body, secret=None).status_code == 401  # the instance has a secret
    payload = json.loads(body)
    payload["issue"]["fields"]["project"]["key"] = "OPS"
    assert _post(jira_instance, json.dumps(payload).encode()).status_code == 401
    assert not InboundEvent.objects.exists()
    jira_instance.refresh_from_db()
    assert jira_instance.webhook_rejected_count == 3
