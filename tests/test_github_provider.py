"""GitHub Issues adapter (layer 1): real fixture payloads through webhook verification, and every
read/write operation over real HTTP against the GitHub sandbox. No database needed."""
import hashlib
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
from datetime import datetime
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
)
from connectors.providers.github import BACKLINK_MARKER, GitHubIssuesAdapter, graphql_url_for
from connectors.providers.mentions import WORD_JOINER, neutralize_mentions
from connectors.sandbox.github import DEFAULT_FIXTURES_DIR, sign
from tests.github_sandbox import DEFAULT_STATE_MAPPING, SANDBOX_REPO, SANDBOX_WEBHOOK_SECRET, github_adapter_for

FIXTURES = Path(DEFAULT_FIXTURES_DIR)  # the real payloads, copied unchanged into the package
SECRET = "test-webhook-secret"
FIXTURE_REPO = "Codertocat/Hello-World"



def adapter(containers=(FIXTURE_REPO,), secret=SECRET, mapping=None, service_account_id=None):
    return GitHubIssuesAdapter(AdapterConfig(
        base_url="https://api.github.com", containers=tuple(containers),
        state_mapping=DEFAULT_STATE_MAPPING if mapping is None else mapping, credentials="x",
        webhook_secret=secret, service_account_id=service_account_id))


def signed(body: bytes, event: str, *, secret=SECRET, delivery="72d3162e-cc78-11e3-81ab-4c9367dc0958", **extra):
    headers = {"x-github-event": event, "x-github-delivery": delivery, "x-hub-signature-256": sign(secret, body),
               "content-type": "application/json"}
    headers.update(extra)
    return WebhookRequest(body=body, headers=headers)


def fixture_bytes(name: str) -> bytes:
    return (FIXTURES / f"{name}.payload.json").read_bytes()


def ref_of(task):
    return ExternalTaskRef(task.external_id, task.external_key)


def drain(adapter_, scope, cursor=None, *, limit=50):
    """Call list_candidate_tasks until it says 'no further page now'; returns (items, last cursor, calls)."""
    items, calls = [], 0
    while calls < limit:
        page = adapter_.list_candidate_tasks(scope, cursor)
        calls += 1
        items.extend(page.items)
        if page.cursor is None:
            return items, cursor, calls
        cursor = page.cursor
    raise AssertionError("listing never settled")


# --- signature scheme ---------------------------------------------------------------------------

def test_readme_signature_test_vector():
    body = b"Hello, World!"
    expected = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    assert sign("It's a Secret to Everybody", body) == expected
    gh = adapter(secret="It's a Secret to Everybody")
    # the signature passes; only then is the body parsed, and "Hello, World!" is not a payload
    with pytest.raises(WebhookUnparseable):
        gh.verify_webhook(WebhookRequest(body=body, headers={"x-hub-signature-256": expected, "x-github-event": "issues"}))
    with pytest.raises(WebhookRejected) as exc:
        gh.verify_webhook(WebhookRequest(body=b"Hello, World?", headers={"x-hub-signature-256": expected,
                                                                         "x-github-event": "issues"}))
    assert exc.value.category == ErrorCategory.WEBHOOK_SIGNATURE


EXPECTED = {
    "issue_comment_created": (EventKind.COMMENT_UPSERTED, "issue_comment.created"),
    "issue_comment_edited": (EventKind.COMMENT_UPSERTED, "issue_comment.edited"),
    "issues_assigned": (EventKind.TASK_UPSERTED, "issues.assigned"),
    "issues_deleted": (EventKind.TASK_DELETED, "issues.deleted"),
    "issues_edited": (EventKind.TASK_UPSERTED, "issues.edited"),
    "issues_labeled": (EventKind.TASK_UPSERTED, "issues.labeled"),
    "issues_opened": (EventKind.TASK_UPSERTED, "issues.opened"),
    "issues_reopened": (EventKind.TASK_UPSERTED, "issues.reopened"),
    "issues_unassigned": (EventKind.TASK_UPSERTED, "issues.unassigned"),
    "issues_unlabeled": (EventKind.TASK_UPSERTED, "issues.unlabeled"),
}


def test_every_fixture_is_covered():
    assert sorted(p.name.split(".")[0] for p in FIXTURES.glob("*.payload.json")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_verifies_and_normalizes(name):
    body = fixture_bytes(name)
    raw = json.loads(body)
    event = "issue_comment" if name.startswith("issue_comment") else "issues"
    result = adapter().verify_webhook(signed(body, event, delivery=f"delivery-{name}"))
    kind, action = EXPECTED[name]
    assert (result.kind, result.action) == (kind, action)
    assert result.event_id == f"delivery-{name}"
    assert result.external_task_id == "444500041"
    assert result.container_id == FIXTURE_REPO
    assert result.trusted_content is True
    assert result.actor.display_name == "Codertocat" and result.actor.external_user_id == "21031067"
    assert result.actor.is_connector_service_account is False
    task = result.task
    assert task.provider_key == "github_issues"
    assert task.external_id == "444500041" and task.external_key == "Codertocat/Hello-World#1"
    assert task.url == "https://github.com/Codertocat/Hello-World/issues/1"
    assert task.title == "Spelling error in the README file"
    assert task.labels == ("bug",) and task.priority is None
    assert task.revision == raw["issue"]["updated_at"]
    assert task.updated_at.tzinfo is not None and task.updated_at.utcoffset().total_seconds() == 0
    assert task.updated_at == datetime.fromisoformat(raw["issue"]["updated_at"].replace("Z", "+00:00"))
    assert task.envelope["number"] == 1
    assert task.envelope["repository"] == {"fullName": FIXTURE_REPO, "id": 186853002}
    assert task.envelope["nodeId"] == raw["issue"]["node_id"]
    assert task.envelope["labels"] == ["bug"]
    assert [a.display_name for a in task.assignees] == [a["login"] for a in raw["issue"]["assignees"]]
    expected_state = ("closed", StateCategory.TERMINAL) if raw["issue"]["state"] == "closed" else ("open", StateCategory.BACKLOG)
    assert (task.state.name, task.state.category) == expected_state
    assert result.occurred_at is not None and result.occurred_at.tzinfo is not None
    if event == "issue_comment":
        comment = result.comment
        assert comment.external_comment_id == str(raw["comment"]["id"]) == "492700400"
        assert comment.external_task_id == "444500041"
        assert comment.body == raw["comment"]["body"]
        assert comment.url == raw["comment"]["html_url"]
        assert comment.author.display_name == "Codertocat"
        assert result.occurred_at == datetime.fromisoformat(raw["comment"]["updated_at"].replace("Z", "+00:00"))
    else:
        assert result.comment is None


def test_fixture_milestone_and_reactions_ride_in_the_envelope():
    result = adapter().verify_webhook(signed(fixture_bytes("issues_opened"), "issues"))
    assert result.task.envelope["milestone"]["title"] == "v1.0"
    assert result.task.envelope["reactions"]["total_count"] == 0 and "url" not in result.task.envelope["reactions"]
    assert result.task.envelope["authorAssociation"] == "OWNER"
    assert result.task.envelope["pullRequest"] is None


def test_service_account_is_flagged_by_id_or_login():
    for marker in ("21031067", "codertocat"):
        result = adapter(service_account_id=marker).verify_webhook(signed(fixture_bytes("issue_comment_created"), "issue_comment"))
        assert result.actor.is_connector_service_account is True
        assert result.comment.author.is_connector_service_account is True


@pytest.mark.parametrize("header", [None, "", "sha256=", "sha1=" + "a" * 40, "sha256=" + "z" * 64, "sha256=abc",
                                    "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"])
def test_missing_or_malformed_signature_rejected(header):
    request = signed(fixture_bytes("issues_opened"), "issues")
    headers = dict(request.headers)
    if header is None:
        del headers["x-hub-signature-256"]
    else:
        headers["x-hub-signature-256"] = header
    with pytest.raises(WebhookRejected) as exc:
        adapter().verify_webhook(WebhookRequest(body=request.body, headers=headers))
    assert exc.value.category == ErrorCategory.WEBHOOK_SIGNATURE


def test_wrong_secret_and_tampered_body_rejected():
    body = fixture_bytes("issues_opened")
    with pytest.raises(WebhookRejected):
        adapter().verify_webhook(signed(body, "issues", secret="another-secret"))
    request = signed(body, "issues")
    tampered = body.replace(b"Spelling error", b"Spelling errOr")
    with pytest.raises(WebhookRejected):
        adapter().verify_webhook(WebhookRequest(body=tampered, headers=request.headers))
    with pytest.raises(WebhookRejected):  # no secret configured: nothing can verify
        adapter(secret=None).verify_webhook(request)


def test_signature_is_checked_before_parsing():
    with pytest.raises(WebhookRejected):
        adapter().verify_webhook(WebhookRequest(body=b"{not json", headers={"x-github-event": "issues",
                                                                             "x-hub-signature-256": "sha256=" + "0" * 64}))


def test_other_repository_rejected_as_provider_payload():
    with pytest.raises(WebhookRejected) as exc:
        adapter(containers=("octo-org/octo-repo",)).verify_webhook(signed(fixture_bytes("issues_opened"), "issues"))
    assert exc.value.category == ErrorCategory.PROVIDER_PAYLOAD
    assert "Codertocat/Hello-World" in str(exc.value) and "octo-org/octo-repo" in str(exc.value)


def test_container_match_is_case_insensitive():
    result = adapter(containers=("codertocat/hello-world",)).verify_webhook(signed(fixture_bytes("issues_opened"), "issues"))
    assert result.container_id == "codertocat/hello-world"
    assert result.task.external_key == "codertocat/hello-world#1"


def test_pull_request_payloads_ignored():
    for name, event in (("issues_opened", "issues"), ("issue_comment_created", "issue_comment")):
        payload = json.loads(fixture_bytes(name))
        payload["issue"]["pull_request"] = {"url": "https://api.github.com/repos/Codertocat/Hello-World/pulls/1"}
        result = adapter().verify_webhook(signed(json.dumps(payload).encode(), event))
        assert result.kind == EventKind.IGNORED and result.task is None


def test_ping_and_other_events_ignored():
    ping = json.dumps({"zen": "Design for failure.", "hook_id": 1, "hook": {"type": "Repository"},
                       "repository": {"full_name": FIXTURE_REPO, "id": 186853002}}).encode()
    result = adapter().verify_webhook(signed(ping, "ping"))
    assert (result.kind, result.action, result.external_task_id) == (EventKind.IGNORED, "ping", None)
    push = json.dumps({"ref": "refs/heads/main", "repository": {"full_name": FIXTURE_REPO}}).encode()
    assert adapter().verify_webhook(signed(push, "push")).kind == EventKind.IGNORED
    # another repository is still refused, whatever the event
    with pytest.raises(WebhookRejected):
        adapter().verify_webhook(signed(json.dumps({"repository": {"full_name": "x/y"}}).encode(), "ping"))


def test_unparseable_and_missing_keys():
    gh = adapter()
    for body, event in ((b"[1, 2]", "issues"), (b"\xff\xfe", "issues"),
                        (json.dumps({"action": "opened", "repository": {"full_name": FIXTURE_REPO}}).encode(), "issues"),
                        (json.dumps({"action": "opened", "issue": {"number": 1},
                                     "repository": {"full_name": FIXTURE_REPO}}).encode(), "issues"),
                        (json.dumps({"issue": {"id": 1, "number": 1}, "repository": {"full_name": FIXTURE_REPO}}).encode(), "issues"),
                        (json.dumps({"action": "opened", "issue": {"id": 1, "number": 1}}).encode(), "issues")):
        with pytest.raises(WebhookUnparseable):
            gh.verify_webhook(signed(body, event))
    payload = json.loads(fixture_bytes("issue_comment_created"))
    del payload["comment"]
    with pytest.raises(WebhookUnparseable):
        gh.verify_webhook(signed(json.dumps(payload).encode(), "issue_comment"))
    with pytest.raises(WebhookUnparseable):  # no event header
        gh.verify_webhook(WebhookRequest(body=fixture_bytes("issues_opened"),
                                         headers={"x-hub-signature-256": sign(SECRET, fixture_bytes("issues_opened"))}))


def test_delivery_id_falls_back_to_a_content_hash():
    body = fixture_bytes("issues_opened")
    request = signed(body, "issues")
    headers = {k: v for k, v in request.headers.items() if k != "x-github-delivery"}
    result = adapter().verify_webhook(WebhookRequest(body=body, headers=headers))
    assert result.event_id == "sha256:" + hashlib.sha256(body).hexdigest()


def test_transferred_and_comment_deleted_kinds():
    payload = json.loads(fixture_bytes("issues_opened"))
    payload["action"] = "transferred"
    assert adapter().verify_webhook(signed(json.dumps(payload).encode(), "issues")).kind == EventKind.TASK_DELETED
    payload = json.loads(fixture_bytes("issue_comment_created"))
    payload["action"] = "deleted"
    result = adapter().verify_webhook(signed(json.dumps(payload).encode(), "issue_comment"))
    assert result.kind == EventKind.COMMENT_DELETED and result.comment.external_comment_id == "492700400"


def test_headers_are_case_insensitive():
    body = fixture_bytes("issues_opened")
    headers = {"X-GitHub-Event": "issues", "X-GitHub-Delivery": "abc", "X-Hub-Signature-256": sign(SECRET, body)}
    assert adapter().verify_webhook(WebhookRequest(body=body, headers=headers)).event_id == "abc"


# --- normalization units ------------------------------------------------------------------------

def test_mentions_are_neutralized():
    text, found = neutralize_mentions("Ping @octocat and @github/security; mail me@example.com.\n"
                                      "```python\n@pytest.fixture\n```\nInline `@decorator` too.")
    assert "@octocat" not in text and "octocat and github/security" in text
    assert "me@example.com" in text
    assert f"@{WORD_JOINER}pytest.fixture" in text and f"`@{WORD_JOINER}decorator`" in text
    assert found == ["octocat", "github/security", "pytest", "decorator"]
    payload = json.loads(fixture_bytes("issues_opened"))
    payload["issue"]["body"] = "cc @alice please"
    payload["issue"]["title"] = "@bob look"
    task = adapter().verify_webhook(signed(json.dumps(payload).encode(), "issues")).task
    assert task.description == "cc alice please" and task.title == "bob look"
    assert task.envelope["mentionsNeutralized"] == ["bob", "alice"]


def _issue(state="open", reason=None, labels=()):
    return {"id": 9, "number": 3, "title": "t", "body": None, "state": state, "state_reason": reason,
            "labels": [{"name": n} for n in labels], "repository_url": "https://api.github.com/repos/o/r",
            "html_url": "https://github.com/o/r/issues/3", "updated_at": "2026-01-01T00:00:00Z"}


def test_state_mapping_precedence_reasons_and_unmapped():
    gh = adapter(containers=("o/r",))
    n = gh.normalize_issue
    assert (n(_issue()).state.name, n(_issue()).state.category) == ("open", "backlog")
    assert n(_issue(labels=["In Progress "])).state == n(_issue(labels=["in progress"])).state
    assert (n(_issue(labels=["In Progress"])).state.name, n(_issue(labels=["In Progress"])).state.category) == ("in progress", "active")
    # precedence is the mapping's order (blocked first), not the issue's label order
    both = n(_issue(labels=["in progress", "blocked"]))
    assert (both.state.name, both.state.category) == ("blocked", "blocked")
    assert n(_issue("closed", "completed", ["in progress"])).state.category == "terminal"  # closed wins by default
    assert n(_issue("closed", "not_planned")).state.name == "closed:not_planned"
    assert n(_issue("closed", "duplicate")).state.category == "terminal"  # falls back to "closed"
    gh2 = adapter(containers=("o/r",), mapping={"open": "active", "closed": "terminal", "closed:duplicate": "review",
                                                "labels": [["qa", "review"]], "labels_override_closed": True})
    assert gh2.normalize_issue(_issue("closed", "duplicate")).state.category == "review"
    assert gh2.normalize_issue(_issue("closed", None, ["QA"])).state == gh2.normalize_issue(_issue(labels=["qa"])).state
    gh3 = adapter(containers=("o/r",), mapping={"open": "active", "labels": {"x": "doing"}})
    closed = gh3.normalize_issue(_issue("closed"))
    assert (closed.state.name, closed.state.category, closed.envelope["unmappedState"]) == ("closed", "backlog", "closed")
    odd = gh3.normalize_issue(_issue(labels=["x"]))
    assert (odd.state.category, odd.envelope["unmappedState"]) == ("backlog", "x")
    assert "unmappedState" not in gh3.normalize_issue(_issue()).envelope


def test_validate_state_mapping():
    gh = adapter()
    assert gh.validate_state_mapping(DEFAULT_STATE_MAPPING) == {}
    assert gh.validate_state_mapping({"Open": "ACTIVE", "closed": "terminal", "labels": [["qa", "review"]],
                                      "labels_override_closed": True}) == {}
    errors = gh.validate_state_mapping({"open": "doing", "closed:wontfix": "terminal", "labels": {"qa": "nope", "": "active"},
                                        "labels_override_closed": "yes", "extra": 1})
    assert set(errors) == {"open", "closed", "closed:wontfix", "labels.qa", "labels", "labels_override_closed", "extra"}
    assert any("unknown category" in r for r in errors["open"])
    assert any("required" in r for r in errors["closed"])
    assert gh.validate_state_mapping({"open": "backlog", "closed": "terminal", "labels": "in progress"}) == {
        "labels": ["must be an object {label: category} or a list of [label, category] pairs"]}
    assert gh.validate_state_mapping([]) == {"stateMapping": ["must be an object"]}


def test_graphql_url_derivation():
    assert graphql_url_for("https://api.github.com") == "https://api.github.com/graphql"
    assert graphql_url_for("https://api.github.com/") == "https://api.github.com/graphql"
    assert graphql_url_for("https://ghe.example.com/api/v3") == "https://ghe.example.com/api/graphql"
    assert graphql_url_for("http://127.0.0.1:8765") == "http://127.0.0.1:8765/graphql"


def test_registered_with_static_capabilities():
    assert adapter_class("github_issues") is GitHubIssuesAdapter
    caps = GitHubIssuesAdapter.capabilities.as_dict()
    assert caps["signedWebhooks"] is True and caps["hasExternalKeys"] is True
    assert {"create_task", "update_task_state", "post_comment", "set_fields", "set_backlink",
            "list_candidate_tasks", "get_task", "get_task_states", "list_comments", "verify_webhook"} <= set(caps["operations"])
    assert set(caps["stateCategories"]) == set(StateCategory.ALL)
    assert "custom_field" not in caps["routingRuleKinds"] and "label" in caps["routingRuleKinds"]


def test_refs_outside_the_containers_are_refused():
    gh = adapter(containers=("o/r",))
    for key in (None, "o/r", "o/r#x", "other/repo#1"):
        with pytest.raises(ProviderError) as exc:
            gh.get_task(ExternalTaskRef("1", key))
        assert exc.value.category == ErrorCategory.PROVIDER_PAYLOAD


# --- over HTTP against the sandbox --------------------------------------------------------------

def test_listing_paginates_skips_pull_requests_and_sends_github_headers(github_sandbox):
    sb = github_sandbox
    opened = []
    for i in range(7):
        opened.append(sb.open_issue(f"Issue {i}", f"Body {i}", labels=["Bug"] if i % 2 else []))
        if i in (2, 5):
            sb.open_pull_request(f"PR {i}")
    gh = github_adapter_for(sb, per_page=3)
    sb.clear_requests()
    items, cursor, calls = drain(gh, SANDBOX_REPO)
    assert [t.external_id for t in items] == [str(i["id"]) for i in opened]
    assert [t.external_key for t in items] == [f"{SANDBOX_REPO}#{i['number']}" for i in opened]
    assert items[1].labels == ("bug",) and items[0].state.category == "backlog"
    assert items[0].url == opened[0]["html_url"] and items[0].container_id == SANDBOX_REPO
    listing = sb.requests_to(r"/issues$", "GET")
    assert len(listing) == 3 + 1  # 9 rows / 3 per page, then one confirming call that finds nothing new
    first = listing[0]
    assert {k: v[0] for k, v in first.query.items()} == {"state": "all", "sort": "updated", "direction": "asc", "per_page": "3"}
    assert listing[1].path.startswith("/repositories/")  # followed GitHub's Link rel="next"
    assert first.headers["authorization"] == "Bearer sandbox-test-token"
    assert first.headers["accept"] == "application/vnd.github+json"
    assert first.headers["x-github-api-version"] == "2022-11-28"
    assert first.headers["user-agent"].startswith("paperclip-connector-github")
    state = json.loads(cursor)
    assert state["v"] == 1 and state["scope"] == SANDBOX_REPO and "next" not in state
    assert state["since"] == max(i["updated_at"] for i in opened + [sb.issue(3), sb.issue(7)])


def test_since_cursor_lists_only_changes(github_sandbox):
    sb = github_sandbox
    with sb.quiet():
        issues = [sb.open_issue(f"Issue {i}") for i in range(5)]
    gh = github_adapter_for(sb, per_page=2)
    items, cursor, _ = drain(gh, SANDBOX_REPO)
    assert len(items) == 5
    again, cursor2, calls = drain(gh, SANDBOX_REPO, cursor)
    assert again == [] and cursor2 == cursor and calls == 1  # nothing new: one call, cursor None
    sb.label(issues[1]["number"], "in progress")
    new = sb.open_issue("Late arrival")
    changed, cursor3, _ = drain(gh, SANDBOX_REPO, cursor)
    assert [t.external_id for t in changed] == [str(issues[1]["id"]), str(new["id"])]
    assert changed[0].state.name == "in progress" and changed[0].state.category == "active"
    assert json.loads(cursor3)["since"] == sb.issue(new["number"])["updated_at"]
    since_sent = sb.requests_to(r"/issues$")[-1].query["since"][0]
    assert since_sent == json.loads(cursor3)["since"]


def test_mid_pagination_cursor_resumes_from_next_url(github_sandbox):
    sb = github_sandbox
    with sb.quiet():
        for i in range(5):
            sb.open_issue(f"Issue {i}")
    gh = github_adapter_for(sb, per_page=2)
    page = gh.list_candidate_tasks(SANDBOX_REPO, None)
    state = json.loads(page.cursor)
    assert state["next"].startswith(sb.base_url + "/repositories/") and "page=2" in state["next"]
    # a fresh adapter (say, after a restart) resumes from the stored cursor
    rest, _, _ = drain(github_adapter_for(sb, per_page=2), SANDBOX_REPO, page.cursor)
    assert [t.title for t in page.items + rest] == [f"Issue {i}" for i in range(5)]


@pytest.mark.parametrize("cursor", [
    "garbage", "[]", json.dumps({"v": 2}), json.dumps({"v": 1, "scope": "other/repo", "since": None, "seen": []}),
    json.dumps({"v": 1, "scope": SANDBOX_REPO, "since": "yesterday", "seen": []}),
    json.dumps({"v": 1, "scope": SANDBOX_REPO, "since": None, "seen": "x"}),
    json.dumps({"v": 1, "scope": SANDBOX_REPO, "since": None, "seen": [], "next": "https://evil.example/repos/x/issues"}),
])
def test_invalid_cursor(github_sandbox, cursor):
    gh = github_adapter_for(github_sandbox)
    with pytest.raises(ProviderError) as exc:
        gh.list_candidate_tasks(SANDBOX_REPO, cursor)
    assert exc.value.category == ErrorCategory.CURSOR_INVALID
    assert github_sandbox.requests_to(r"/issues") == []  # nothing was fetched


def test_get_task_and_gone_issues(github_sandbox):
    sb = github_sandbox
    issue = sb.open_issue("Read me", "Hello @octocat", labels=["Needs Triage"], assignees=["hubot"])
    gh = github_adapter_for(sb)
    task = gh.get_task(ExternalTaskRef(str(issue["id"]), f"{SANDBOX_REPO}#{issue['number']}"))
    assert task.external_id == str(issue["id"]) and task.title == "Read me" and task.description == "Hello octocat"
    assert task.labels == ("needs triage",) and [a.display_name for a in task.assignees] == ["hubot"]
    assert task.envelope["author"]["login"] == "octocat" and task.envelope["assignees"] == ["hubot"]
    with pytest.raises(ProviderError) as exc:
        gh.get_task(ExternalTaskRef("1", f"{SANDBOX_REPO}#999"))
    assert (exc.value.category, exc.value.status) == (ErrorCategory.PROVIDER_STATUS, 404)
    sb.delete_issue(issue["number"])
    with pytest.raises(ProviderError) as exc:
        gh.get_task(ref_of(task))
    assert (exc.value.category, exc.value.status) == (ErrorCategory.PROVIDER_STATUS, 410)
    pr = sb.open_pull_request("A PR")
    with pytest.raises(ProviderError) as exc:
        gh.get_task(ExternalTaskRef(str(pr["id"]), f"{SANDBOX_REPO}#{pr['number']}"))
    assert exc.value.status == 404


def test_get_task_states_batches_graphql_per_100(github_sandbox):
    sb = github_sandbox
    with sb.quiet():
        issues = [sb.open_issue(f"Issue {i}") for i in range(150)]
        sb.close_issue(issues[3]["number"])
        sb.close_issue(issues[120]["number"], state_reason="not_planned")
        sb.label(issues[5]["number"], "In Progress")
        sb.label(issues[130]["number"], "blocked", "in review")
        sb.delete_issue(issues[7]["number"])
        pr = sb.open_pull_request("not an issue")
    gh = github_adapter_for(sb)
    refs = [ExternalTaskRef(str(i["id"]), f"{SANDBOX_REPO}#{i['number']}") for i in issues]
    refs.append(ExternalTaskRef(str(pr["id"]), f"{SANDBOX_REPO}#{pr['number']}"))
    refs.append(ExternalTaskRef("424242", f"{SANDBOX_REPO}#{issues[9]['number']}"))  # number now names another id
    sb.clear_requests()
    states = gh.get_task_states(refs)
    graphql = sb.requests_to(r"^/graphql$", "POST")
    assert len(graphql) == 2 and len(sb.requests) == 2
    assert graphql[0].query == {} and "i1: issue(number: 1)" in graphql[0].body["query"]
    assert len(states) == 152
    by_id = {str(i["id"]): i for i in issues}
    s = lambda n: states[str(issues[n]["id"])]  # noqa: E731
    assert (s(0).name, s(0).category) == ("open", "backlog")
    assert (s(3).name, s(3).category) == ("closed", "terminal")
    assert (s(120).name, s(120).category) == ("closed:not_planned", "terminal")
    assert (s(5).name, s(5).category) == ("in progress", "active")
    assert (s(130).name, s(130).category) == ("blocked", "blocked")
    assert s(7) is None and states[str(pr["id"])] is None and states["424242"] is None
    assert sum(1 for k, v in states.items() if v is None) == 3 and len(by_id) == 150


def test_transferred_issue(github_sandbox):
    sb = github_sandbox
    issue = sb.open_issue("Moving out")
    gh = github_adapter_for(sb)
    ref = ExternalTaskRef(str(issue["id"]), f"{SANDBOX_REPO}#{issue['number']}")
    new = sb.transfer_issue(issue["number"], "octo-org/elsewhere")
    with pytest.raises(ProviderError) as exc:
        gh.get_task(ref)
    assert (exc.value.category, exc.value.status) == (ErrorCategory.PROVIDER_STATUS, 301)
    assert gh.get_task_states([ref]) == {ref.external_id: None}
    transferred = [d for d in sb.deliveries if d.action == "transferred"][0]
    event = gh.verify_webhook(WebhookRequest(transferred.body, transferred.lower_headers))
    assert event.kind == EventKind.TASK_DELETED and event.external_task_id == str(issue["id"])
    assert transferred.payload["changes"]["new_issue"]["id"] == new["id"]
    opened_elsewhere = sb.deliveries[-2]  # issues.opened in the other repository: not ours
    with pytest.raises(WebhookRejected):
        gh.verify_webhook(WebhookRequest(opened_elsewhere.body, opened_elsewhere.lower_headers))


def test_get_task_states_unknown_repository_is_an_error_not_gone(github_sandbox):
    gh = github_adapter_for(github_sandbox, containers=(SANDBOX_REPO, "octo-org/missing"))
    with pytest.raises(ProviderError) as exc:
        gh.get_task_states([ExternalTaskRef("1", "octo-org/missing#1")])
    assert (exc.value.category, exc.value.status) == (ErrorCategory.PROVIDER_STATUS, 404)


def test_list_comments_since_cursor(github_sandbox):
    sb = github_sandbox
    issue = sb.open_issue("Chatty")
    first = [sb.comment(issue["number"], f"Comment {i} @someone") for i in range(3)]
    bot = sb.comment(issue["number"], "from the connector", actor="paperclip-bot")
    gh = github_adapter_for(sb, per_page=2)
    ref = ExternalTaskRef(str(issue["id"]), f"{SANDBOX_REPO}#{issue['number']}")
    comments, cursor = [], None
    while True:
        page = gh.list_comments(ref, cursor)
        comments += page.items
        if page.cursor is None:
            break
        cursor = page.cursor
    assert [c.external_comment_id for c in comments] == [str(c["id"]) for c in first + [bot]]
    assert comments[0].body == "Comment 0 someone" and comments[0].author.display_name == "octocat"
    assert comments[0].url == first[0]["html_url"] and comments[0].external_task_id == str(issue["id"])
    assert comments[0].created_at.tzinfo is not None
    assert comments[-1].author.is_connector_service_account is True
    sb.edit_comment(first[1]["id"], "Edited")
    late = sb.comment(issue["number"], "Late")
    changed, calls = [], 0
    while True:
        page = gh.list_comments(ref, cursor)
        changed += page.items
        calls += 1
        if page.cursor is None:
            break
        cursor = page.cursor
    # page 1 = [edited, bot (already seen at the boundary, filtered)], page 2 = [late], then "nothing new"
    assert [c.external_comment_id for c in changed] == [str(first[1]["id"]), str(late["id"])] and calls == 3
    assert changed[0].body == "Edited"
    assert json.loads(cursor)["since"] == late["updated_at"]
    with pytest.raises(ProviderError) as exc:
        gh.list_comments(ExternalTaskRef("x", f"{SANDBOX_REPO}#{issue['number'] + 50}"), cursor)
    assert exc.value.category == ErrorCategory.CURSOR_INVALID  # a cursor belongs to one issue


@pytest.mark.parametrize("force, status, retry_after", [
    (lambda sb: sb.force_rate_limit(reset_in=120), 403, 120),
    (lambda sb: sb.force_rate_limit(reset_in=90, status=429), 429, 90),
    (lambda sb: sb.force_secondary_rate_limit(retry_after=17), 403, 17),
    (lambda sb: sb.force_429(retry_after=5), 429, 5),
])
def test_rate_limits(github_sandbox, force, status, retry_after):
    sb = github_sandbox
    issue = sb.open_issue("x")
    gh = github_adapter_for(sb)
    force(sb)
    with pytest.raises(ProviderError) as exc:
        gh.list_candidate_tasks(SANDBOX_REPO, None)
    assert exc.value.category == ErrorCategory.PROVIDER_RATE_LIMITED and exc.value.status == status
    assert retry_after - 3 <= exc.value.retry_after <= retry_after
    force(sb)
    with pytest.raises(ProviderError) as exc:
        gh.get_task_states([ExternalTaskRef(str(issue["id"]), f"{SANDBOX_REPO}#1")])
    assert exc.value.category == ErrorCategory.PROVIDER_RATE_LIMITED
    assert gh.list_candidate_tasks(SANDBOX_REPO, None).items  # recovered


def test_rate_limit_headers_on_every_response(github_sandbox):
    response = httpx.get(github_sandbox.base_url + "/user", headers={"Authorization": "Bearer sandbox-test-token"})
    assert response.json()["login"] == "paperclip-bot"
    assert {"x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset", "x-ratelimit-used"} <= set(response.headers)
    assert "x-ratelimit-remaining" in httpx.get(github_sandbox.base_url + "/user").headers  # even on a 401


def test_server_error_auth_transport_and_payload_errors(github_sandbox):
    sb = github_sandbox
    gh = github_adapter_for(sb)
    sb.force_server_error(status=502)
    with pytest.raises(ProviderError) as exc:
        gh.list_candidate_tasks(SANDBOX_REPO, None)
    assert (exc.value.category, exc.value.status) == (ErrorCategory.PROVIDER_STATUS, 502)
    with pytest.raises(ProviderError) as exc:
        github_adapter_for(sb, token="wrong").list_candidate_tasks(SANDBOX_REPO, None)
    assert (exc.value.category, exc.value.status) == (ErrorCategory.PROVIDER_AUTH, 401)
    with pytest.raises(ProviderError) as exc:
        github_adapter_for(sb, token=None).get_task(ExternalTaskRef("1", f"{SANDBOX_REPO}#1"))
    assert exc.value.category == ErrorCategory.PROVIDER_AUTH
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(ProviderError) as exc:
        github_adapter_for(sb, base_url=dead).list_candidate_tasks(SANDBOX_REPO, None)
    assert exc.value.category == ErrorCategory.PROVIDER_REQUEST
    html = httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(200, text="<html>")))
    with pytest.raises(ProviderError) as exc:
        github_adapter_for(sb, client=html).list_candidate_tasks(SANDBOX_REPO, None)
    assert exc.value.category == ErrorCategory.PROVIDER_PAYLOAD
    forbidden = httpx.Client(transport=httpx.MockTransport(
        lambda request: httpx.Response(403, json={"message": "Resource not accessible by integration"})))
    with pytest.raises(ProviderError) as exc:
        github_adapter_for(sb, client=forbidden).list_candidate_tasks(SANDBOX_REPO, None)
    assert (exc.value.category, exc.value.status) == (ErrorCategory.PROVIDER_STATUS, 403)


def test_enterprise_style_base_url(github_sandbox):
    sb = github_sandbox
    sb.open_issue("On GHES")
    gh = github_adapter_for(sb, base_url=sb.enterprise_base_url, per_page=1)
    assert gh.graphql_url == sb.base_url + "/api/graphql"
    items, _, _ = drain(gh, SANDBOX_REPO)
    assert [t.title for t in items] == ["On GHES"]
    assert gh.get_task_states([ref_of(items[0])])[items[0].external_id].name == "open"


def test_writes_round_trip(github_sandbox):
    sb = github_sandbox
    gh = github_adapter_for(sb)
    task = gh.create_task(SANDBOX_REPO, {"title": "Made by Paperclip", "description": "Details", "labels": ["Bug"]})
    ref = ref_of(task)
    assert task.external_key == f"{SANDBOX_REPO}#1" and task.labels == ("bug",)
    assert sb.issue(1)["user"]["login"] == "paperclip-bot"
    comment_id = gh.post_comment(ref, "Working on it")
    assert sb.comments_of(1)[-1]["id"] == int(comment_id)
    gh.set_fields(ref, {"title": "Renamed", "description": "New body", "labels": ["bug", "docs"]})
    after = gh.get_task(ref)
    assert (after.title, after.description, after.labels) == ("Renamed", "New body", ("bug", "docs"))
    gh.update_task_state(ref, "In Progress")
    after = gh.get_task(ref)
    assert (after.state.name, after.state.category) == ("in progress", "active") and "bug" in after.labels
    gh.update_task_state(ref, "in review")
    after = gh.get_task(ref)
    assert after.state.name == "in review" and "in progress" not in after.labels
    gh.update_task_state(ref, "closed:not_planned")
    assert (sb.issue(1)["state"], sb.issue(1)["state_reason"]) == ("closed", "not_planned")
    assert gh.get_task_states([ref])[ref.external_id].category == "terminal"
    gh.update_task_state(ref, "open")
    issue = sb.issue(1)
    assert issue["state"] == "open" and issue["state_reason"] == "reopened"
    assert [label["name"].lower() for label in issue["labels"]] == ["bug", "docs"]  # GitHub keeps the spelling
    gh.update_task_state(ref, "closed")
    assert sb.issue(1)["state_reason"] == "completed"
    gh.update_task_state(ref, "blocked")  # a convention on a closed issue reopens it
    assert sb.issue(1)["state"] == "open" and gh.get_task(ref).state.category == "blocked"
    with pytest.raises(ProviderError):
        gh.update_task_state(ref, "doing")
    with pytest.raises(ProviderError):
        gh.set_fields(ref, {"priority": 1})
    gh.set_backlink(ref, "https://paperclip.example/issues/PC-1")
    gh.set_backlink(ref, "https://paperclip.example/issues/PC-2")
    backlinks = [c for c in sb.comments_of(1) if BACKLINK_MARKER in c["body"]]
    assert len(backlinks) == 1 and backlinks[0]["body"].endswith("PC-2")
    created = gh.create_task(SANDBOX_REPO, {"title": "Starts active", "state": "in progress"})
    assert created.state.category == "active"
    # the connector's own writes come back flagged as the service account (echo suppression)
    events = [gh.verify_webhook(WebhookRequest(d.body, d.lower_headers)) for d in sb.deliveries]
    assert events and all(e.actor.is_connector_service_account for e in events)


def test_sandbox_deliveries_verify_with_the_adapter(github_sandbox):
    sb = github_sandbox
    gh = github_adapter_for(sb)
    issue = sb.open_issue("Hook me", labels=["bug"])
    n = issue["number"]
    comment = sb.comment(n, "Hi @paperclip")
    sb.edit_comment(comment["id"], "Hi again")
    sb.label(n, "in progress")
    sb.unlabel(n, "bug")
    sb.assign(n, "hubot")
    sb.unassign(n, "hubot")
    sb.edit_issue(n, title="Hook me harder")
    sb.close_issue(n, state_reason="not_planned")
    sb.reopen_issue(n)
    sb.delete_comment(comment["id"])
    sb.open_pull_request("PR")
    sb.delete_issue(n)
    results = [gh.verify_webhook(WebhookRequest(d.body, d.lower_headers)) for d in sb.deliveries]
    assert [(r.action, r.kind) for r in results] == [
        ("issues.opened", EventKind.TASK_UPSERTED),
        ("issue_comment.created", EventKind.COMMENT_UPSERTED),
        ("issue_comment.edited", EventKind.COMMENT_UPSERTED),
        ("issues.labeled", EventKind.TASK_UPSERTED),
        ("issues.unlabeled", EventKind.TASK_UPSERTED),
        ("issues.assigned", EventKind.TASK_UPSERTED),
        ("issues.unassigned", EventKind.TASK_UPSERTED),
        ("issues.edited", EventKind.TASK_UPSERTED),
        ("issues.closed", EventKind.TASK_UPSERTED),
        ("issues.reopened", EventKind.TASK_UPSERTED),
        ("issue_comment.deleted", EventKind.COMMENT_DELETED),
        ("pull_request.opened", EventKind.IGNORED),
        ("issues.deleted", EventKind.TASK_DELETED),
    ]
    assert len({r.event_id for r in results}) == len(results)
    assert results[1].comment.body == "Hi paperclip" and results[1].comment.external_comment_id == str(comment["id"])
    assert results[3].task.state.category == "active"
    assert (results[8].task.state.name, results[8].task.state.category) == ("closed:not_planned", "terminal")
    assert all(r.external_task_id == str(issue["id"]) for r in results if r.kind != EventKind.IGNORED)


def test_sandbox_payloads_have_the_real_fixture_shape(github_sandbox):
    sb = github_sandbox
    sb.comment(sb.open_issue("Shape")["number"], "c")
    real = json.loads(fixture_bytes("issues_opened"))
    sent = sb.deliveries[0].payload
    assert set(real) <= set(sent) and set(real["issue"]) - {"draft"} <= set(sent["issue"])
    assert set(real["repository"]) <= set(sent["repository"]) and set(real["sender"]) <= set(sent["sender"])
    real_comment = json.loads(fixture_bytes("issue_comment_created"))["comment"]
    assert set(real_comment) <= set(sb.deliveries[1].payload["comment"])


def test_deliver_fixture_retargets_and_signs(github_sandbox):
    sb = github_sandbox
    gh = github_adapter_for(sb)
    for name in sorted(EXPECTED):
        (delivery,) = sb.deliver_fixture(name)
        result = gh.verify_webhook(WebhookRequest(delivery.body, delivery.lower_headers))
        assert (result.kind, result.action) == EXPECTED[name]
        assert result.container_id == SANDBOX_REPO and result.task.external_key == f"{SANDBOX_REPO}#1"
    (delivery,) = sb.deliver_fixture("issues_labeled", {"issue": {"labels": [{"name": "In Progress"}], "title": "Over"}})
    result = gh.verify_webhook(WebhookRequest(delivery.body, delivery.lower_headers))
    assert result.task.title == "Over" and result.task.state.category == "active"
    # deliveries signed for another secret are refused
    with pytest.raises(WebhookRejected):
        github_adapter_for(sb, webhook_secret="other").verify_webhook(WebhookRequest(delivery.body, delivery.lower_headers))


class _Receiver:
    """A real HTTP endpoint that runs the adapter's verify_webhook on what it receives."""

    def __init__(self, gh):
        self.results, receiver = [], self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                headers = {k.lower(): v for k, v in self.headers.items()}
                try:
                    receiver.results.append(gh.verify_webhook(WebhookRequest(body, headers)))
                    status = 202
                except WebhookRejected:
                    status = 401
                except WebhookUnparseable:
                    status = 400
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/github"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_real_http_deliveries_sync_and_queued(github_sandbox):
    sb = github_sandbox
    gh = github_adapter_for(sb)
    receiver = _Receiver(gh)
    try:
        good = sb.add_hook(receiver.url, SANDBOX_WEBHOOK_SECRET)
        sb.add_hook(receiver.url, "wrong-secret")
        sb.open_issue("Delivered")
        sent = [d for d in sb.deliveries if d.url]
        assert [d.status for d in sent] == [202, 401] and sent[0].hook_id == good["id"]
        assert receiver.results[0].action == "issues.opened"
        sb.delivery_mode = "queued"
        via_api = httpx.post(sb.base_url + f"/repos/{SANDBOX_REPO}/issues/1/comments", json={"body": "queued"},
                             headers={"Authorization": "Bearer sandbox-test-token"})
        assert via_api.status_code == 201
        assert len(sb.pending_deliveries) == 2 and len(receiver.results) == 1
        flushed = sb.flush()
        assert [d.status for d in flushed] == [202, 401] and receiver.results[-1].kind == EventKind.COMMENT_UPSERTED
        assert receiver.results[-1].actor.is_connector_service_account is True
    finally:
        receiver.close()


def test_api_hook_registration_pings(github_sandbox):
    sb = github_sandbox
    gh = github_adapter_for(sb)
    receiver = _Receiver(gh)
    try:
        response = httpx.post(sb.base_url + f"/repos/{SANDBOX_REPO}/hooks",
                              json={"config": {"url": receiver.url, "secret": SANDBOX_WEBHOOK_SECRET}, "events": ["issues"]},
                              headers={"Authorization": "Bearer sandbox-test-token"})
        assert response.status_code == 201
        assert receiver.results[-1].action == "ping" and receiver.results[-1].kind == EventKind.IGNORED
        sb.comment(sb.open_issue("x")["number"], "not subscribed")
        assert [r.action for r in receiver.results] == ["ping", "issues.opened"]
    finally:
        receiver.close()


def test_sandbox_runs_standalone():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "GITHUB_SANDBOX_TOKEN": "demo-token"}
    proc = subprocess.Popen([sys.executable, "-m", "connectors.sandbox.github", "--port", str(port), "--repo", "demo/app",
                             "--seed", "3"], cwd=Path(__file__).resolve().parent.parent, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        banner = proc.stdout.readline()
        assert f"127.0.0.1:{port}" in banner, (banner, proc.stderr.read() if proc.poll() is not None else "")
        client = httpx.Client(headers={"Authorization": "Bearer demo-token"})
        listed = client.get(f"http://127.0.0.1:{port}/repos/demo/app/issues", params={"state": "all"})
        assert [i["title"] for i in listed.json()] == ["Demo issue 3", "Demo issue 2", "Demo issue 1"]
        opened = client.post(f"http://127.0.0.1:{port}/_sandbox/open_issue", json={"title": "From curl"})
        assert opened.status_code == 200 and opened.json()["number"] == 4
        assert client.get(f"http://127.0.0.1:{port}/_sandbox/deliveries").json() == []  # no hook configured
        assert httpx.get(f"http://127.0.0.1:{port}/repos/demo/app/issues").status_code == 401
    finally:
        proc.terminate()
        proc.wait(timeout=10)
