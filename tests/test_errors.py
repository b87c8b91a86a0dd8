"""The API's errors: one JSON shape ``{"error": "<message>", "code", "details"}`` everywhere,
input rejected with the offending field named, auth and run-header failures with their
documented codes, and no request that fails leaves anything half-written."""
import uuid
from types import SimpleNamespace

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from issues.actors import SYSTEM
from issues.choices import InteractionKind
from issues.models import (
    ActivityLog,
    AgentApiKey,
    Comment,
    Company,
    Document,
    DocumentRevision,
    HeartbeatRun,
    Interaction,
    Issue,
    IssueRelation,
    WakeupRequest,
)
from issues.services.agents import agent_key_revoke
from issues.services.companies import agent_api_key_create
from issues.services.thread import document_write, interaction_create
from tests.conftest import AgentClient
from tests.factories import AgentFactory, IssueFactory, MembershipFactory, RunFactory, UserFactory

# --- helpers ----------------------------------------------------------------------------------


def error_of(response) -> dict:
    """The one error shape, upstream-readable: ``{"error": "<message>", "code", "details"}``.
    Returned as ``{"code", "message", "details"}`` for the assertions."""
    body = response.json()
    assert set(body) == {"error", "code", "details"}, body
    assert isinstance(body["error"], str) and body["error"], body
    assert isinstance(body["code"], str) and body["code"], body
    assert isinstance(body["details"], dict), body
    return {"code": body["code"], "message": body["error"], "details": body["details"]}


def assert_error(response, status, code=None, fields=()):
    """The one error shape; ``fields`` must each be named in details with a non-empty message."""
    assert response.status_code == status, (response.status_code, response.content[:600])
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    error = error_of(response)
    if code is not None:
        assert error["code"] == code, error
    for name in fields:
        assert name in error["details"], (name, error)
        messages = list(leaf_messages(error["details"][name]))
        assert messages and all(m.strip() for m in messages), (name, error)
    return error


def leaf_messages(value):
    """Messages under a details key: a list of strings, or nested per item ({"0": [...]})."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from leaf_messages(item)
    elif isinstance(value, list):
        for item in value:
            yield from leaf_messages(item)
    else:
        raise AssertionError(f"Unexpected message {value!r}")


SNAPSHOT_MODELS = (Company, Issue, IssueRelation, Comment, Document, DocumentRevision, Interaction, ActivityLog,
                   HeartbeatRun, WakeupRequest)


# An agent's API call made from a run is that run's liveness (runs.run_touch_activity): these
# columns move on every such call, reads included, and are not a write the request made.
LIVENESS_COLUMNS = {HeartbeatRun: {"last_heartbeat_at", "last_activity_at"}}


def db_snapshot(models=SNAPSHOT_MODELS):
    return {m: [{k: v for k, v in row.items() if k not in LIVENESS_COLUMNS.get(m, ())}
                for row in m.objects.order_by("pk").values()] for m in models}


def assert_unchanged(before):
    after = db_snapshot(tuple(before))
    for model, rows in before.items():
        assert after[model] == rows, f"{model.__name__} changed ({len(rows)} -> {len(after[model])} rows)"


def board_client_for(company, role, username):
    user = UserFactory(username=username)
    MembershipFactory(company=company, user=user, role=role)
    client = APIClient()
    client.force_login(user)
    return client


def send(client, method, path, body=None, **extra):
    call = getattr(client, method.lower())
    return call(path, **extra) if body is None else call(path, body, format="json", **extra)


@pytest.fixture
def w(company, make_agent_client):
    """One company with an agent (key + live run), a second agent, issues, a document, an interaction."""
    me = make_agent_client(company=company)
    other = make_agent_client(company=company)
    # The agent's own work (it created it): agents change only their own issues (tests/test_fences.py).
    issue = IssueFactory(company=company, title="Original title", description="Original description",
                         created_by_agent=me.agent)
    issue2 = IssueFactory(company=company, title="Second")
    wip = IssueFactory(company=company, title="In progress", status="in_progress", assignee_agent=me.agent,
                       checkout_run=me.run, execution_run=me.run, execution_locked_at=timezone.now())
    revision = document_write(actor=SYSTEM, issue=issue, key="plan", body="v1")
    interaction = interaction_create(actor=SYSTEM, issue=issue, kind=InteractionKind.ASK_QUESTION, title="Which?")
    return SimpleNamespace(company=company, me=me, other=other, issue=issue, issue2=issue2, wip=wip,
                           revision=revision, interaction=interaction)


def agent_mutations(w):
    """Every mutation an agent makes from a run: (label, method, path, body)."""
    return [
        ("issue-create", "POST", f"/api/companies/{w.company.pk}/issues", {"title": "New"}),
        ("issue-patch", "PATCH", f"/api/issues/{w.issue.pk}", {"title": "Changed"}),
        ("checkout", "POST", f"/api/issues/{w.issue.pk}/checkout",
         {"agentId": str(w.me.agent.pk), "expectedStatuses": ["todo"]}),
        ("release", "POST", f"/api/issues/{w.wip.pk}/release", None),
        ("blocker-add", "POST", f"/api/issues/{w.issue.pk}/blockers", {"blockerId": str(w.issue2.pk)}),
        ("comment", "POST", f"/api/issues/{w.issue.pk}/comments", {"body": "hello"}),
        ("document-put", "PUT", f"/api/issues/{w.issue.pk}/documents/plan",
         {"body": "v2", "baseRevisionId": str(w.revision.pk)}),
        ("interaction-create", "POST", f"/api/issues/{w.issue.pk}/interactions",
         {"kind": "ask_question", "title": "Q?"}),
    ]


MUTATION_LABELS = ["issue-create", "issue-patch", "checkout", "release", "blocker-add", "comment", "document-put",
                   "interaction-create"]
# Run-scoped writes need the run header (ref §2.3); the others here take it only when given (writes to
# the agent's own in_progress issue: tests/test_upstream_compat_agent_writes.py).
RUN_SCOPED_LABELS = ["checkout", "release"]


def mutation(w, label):
    return next(m for m in agent_mutations(w) if m[0] == label)


def test_agent_mutation_table_is_complete(w):
    assert [m[0] for m in agent_mutations(w)] == MUTATION_LABELS


@pytest.mark.parametrize("label", MUTATION_LABELS)
def test_agent_mutations_succeed_with_a_live_run(w, label):
    """Control for the run-header tests below: with the live run each request goes through."""
    _, method, path, body = mutation(w, label)
    response = send(w.me, method, path, body)
    assert 200 <= response.status_code < 300, (response.status_code, response.content[:500])


# --- one error shape for every status ---------------------------------------------------------


def test_every_error_status_uses_the_one_shape(w):
    anonymous = APIClient()
    viewer = board_client_for(w.company, "viewer", "viewer-shape")
    issue_url = f"/api/issues/{w.issue.pk}"
    cases = [
        (send(w.me, "POST", f"{issue_url}/comments", {"nope": 1}), 400, "validation_error"),
        (w.me.post(f"{issue_url}/comments", data='{"body": ', content_type="application/json"), 400,
         "malformed_json"),
        (send(w.me, "GET", f"/api/companies/{w.company.pk}/issues?status=bogus"), 400, "invalid_filter"),
        (send(anonymous, "GET", issue_url), 401, "unauthorized"),
        (send(viewer, "PATCH", issue_url, {"title": "x"}), 403, "read_only_role"),
        (send(w.me, "GET", f"/api/issues/{uuid.uuid4()}"), 404, "not_found"),
        (send(w.me, "GET", "/api/no-such-endpoint"), 404, "not_found"),
        (send(w.me, "PUT", issue_url), 405, "method_not_allowed"),  # (DELETE exists since #14)
        (w.me.post(f"{issue_url}/comments", data="body=hi", content_type="application/x-www-form-urlencoded"),
         415, "unsupported_media_type"),
        (send(w.other, "POST", f"/api/issues/{w.wip.pk}/checkout",
              {"agentId": str(w.other.agent.pk), "expectedStatuses": ["todo"]}), 409, "checkout_conflict"),
        (send(w.me, "POST", f"/api/companies/{w.company.pk}/issues", {"title": "x", "status": "in_progress"}),
         422, "use_checkout"),
    ]
    for response, status, code in cases:
        assert_error(response, status, code)


# --- malformed and non-object bodies ------------------------------------------------------------


BODY_ENDPOINTS = [label for label in MUTATION_LABELS if label != "release"]  # release takes no body


@pytest.mark.parametrize("raw", ['{"title": "x",', "{'title': 'x'}", "{", "tru"])
@pytest.mark.parametrize("label", BODY_ENDPOINTS)
def test_malformed_json_is_400_malformed_json_and_changes_nothing(w, label, raw):
    _, method, path, _ = mutation(w, label)
    before = db_snapshot()
    response = getattr(w.me, method.lower())(path, data=raw, content_type="application/json")
    assert_error(response, 400, "malformed_json")
    assert_unchanged(before)


@pytest.mark.parametrize("raw", ["[]", '[{"title": "x"}]', '"a string"', "42", "null", "true"])
@pytest.mark.parametrize("label", BODY_ENDPOINTS)
def test_non_object_json_body_is_400(w, label, raw):
    _, method, path, _ = mutation(w, label)
    before = db_snapshot()
    response = getattr(w.me, method.lower())(path, data=raw, content_type="application/json")
    assert_error(response, 400, "validation_error", fields=["non_field_errors"])
    assert_unchanged(before)


@pytest.mark.parametrize("raw", ["[]", "null"])
def test_non_object_body_on_board_only_endpoints_is_400(w, raw):
    owner = board_client_for(w.company, "owner", "owner-nonobj")
    before = db_snapshot()
    response = owner.post(f"/api/interactions/{w.interaction.pk}/respond", data=raw, content_type="application/json")
    assert_error(response, 400, "validation_error", fields=["non_field_errors"])
    assert_unchanged(before)


# --- unknown fields -------------------------------------------------------------------------------


@pytest.mark.parametrize("label", BODY_ENDPOINTS)
def test_unknown_fields_are_400_naming_each_field(w, label):
    _, method, path, body = mutation(w, label)
    before = db_snapshot()
    response = send(w.me, method, path, {**(body or {}), "colour": "red", "assignee_agent_id": "x"})
    error = assert_error(response, 400, "validation_error", fields=["colour", "assignee_agent_id"])
    assert set(error["details"]) == {"colour", "assignee_agent_id"}
    assert_unchanged(before)


def test_unknown_field_on_interaction_respond_is_named(w):
    owner = board_client_for(w.company, "owner", "owner-unknown")
    before = db_snapshot()
    response = send(owner, "POST", f"/api/interactions/{w.interaction.pk}/respond",
                    {"status": "answered", "answer": "yes"})
    assert_error(response, 400, "validation_error", fields=["answer"])
    assert_unchanged(before)


# --- wrong types ------------------------------------------------------------------------------------


def wrong_type_cases(w):
    issue, company = w.issue.pk, w.company.pk
    checkout = f"/api/issues/{issue}/checkout"
    me = str(w.me.agent.pk)
    return [
        ("expectedStatuses-string", "POST", checkout, {"agentId": me, "expectedStatuses": "todo"}, ["expectedStatuses"]),
        ("expectedStatuses-number", "POST", checkout, {"agentId": me, "expectedStatuses": 3}, ["expectedStatuses"]),
        ("expectedStatuses-object", "POST", checkout, {"agentId": me, "expectedStatuses": {"todo": 1}},
         ["expectedStatuses"]),
        ("expectedStatuses-empty", "POST", checkout, {"agentId": me, "expectedStatuses": []}, ["expectedStatuses"]),
        ("agentId-not-uuid", "POST", checkout, {"agentId": "me", "expectedStatuses": ["todo"]}, ["agentId"]),
        ("patch-status-not-a-choice", "PATCH", f"/api/issues/{issue}", {"status": "bogus"}, ["status"]),
        ("patch-priority-not-a-choice", "PATCH", f"/api/issues/{issue}", {"priority": "urgent"}, ["priority"]),
        ("patch-parentId-not-uuid", "PATCH", f"/api/issues/{issue}", {"parentId": "PAP-1"}, ["parentId"]),
        ("patch-title-not-string", "PATCH", f"/api/issues/{issue}", {"title": {"a": 1}}, ["title"]),
        ("patch-title-null", "PATCH", f"/api/issues/{issue}", {"title": None}, ["title"]),
        ("patch-several-bad", "PATCH", f"/api/issues/{issue}",
         {"status": 7, "assigneeAgentId": 12, "projectId": "12"}, ["status", "assigneeAgentId", "projectId"]),
        ("create-title-missing", "POST", f"/api/companies/{company}/issues", {"description": "x"}, ["title"]),
        ("create-status-not-a-choice", "POST", f"/api/companies/{company}/issues", {"title": "x", "status": "open"},
         ["status"]),
        ("create-blockParent-not-bool", "POST", f"/api/companies/{company}/issues",
         {"title": "x", "blockParentUntilDone": "sometimes"}, ["blockParentUntilDone"]),
        ("create-goalId-not-uuid", "POST", f"/api/companies/{company}/issues", {"title": "x", "goalId": "five"},
         ["goalId"]),
        ("blockerId-not-uuid", "POST", f"/api/issues/{issue}/blockers", {"blockerId": "PAP-2"}, ["blockerId"]),
        ("comment-body-list", "POST", f"/api/issues/{issue}/comments", {"body": ["hi"]}, ["body"]),
        ("document-baseRevisionId-not-uuid", "PUT", f"/api/issues/{issue}/documents/plan",
         {"body": "x", "baseRevisionId": "latest"}, ["baseRevisionId"]),
        ("interaction-payload-list", "POST", f"/api/issues/{issue}/interactions",
         {"kind": "ask_question", "title": "Q", "payload": [1, 2]}, ["payload"]),
        ("wakeup-commentIds-not-uuids", "POST", f"/api/agents/{w.other.agent.pk}/wakeup",
         {"commentIds": ["first"]}, ["commentIds"]),
        ("wakeup-source-not-a-choice", "POST", f"/api/agents/{w.other.agent.pk}/wakeup", {"source": "cron"},
         ["source"]),
    ]


WRONG_TYPE_IDS = [
    "expectedStatuses-string", "expectedStatuses-number", "expectedStatuses-object", "expectedStatuses-empty",
    "agentId-not-uuid", "patch-status-not-a-choice", "patch-priority-not-a-choice", "patch-parentId-not-uuid",
    "patch-title-not-string", "patch-title-null", "patch-several-bad", "create-title-missing",
    "create-status-not-a-choice", "create-blockParent-not-bool", "create-goalId-not-uuid", "blockerId-not-uuid",
    "comment-body-list", "document-baseRevisionId-not-uuid", "interaction-payload-list",
    "wakeup-commentIds-not-uuids", "wakeup-source-not-a-choice",
]


def test_wrong_type_table_is_complete(w):
    assert [c[0] for c in wrong_type_cases(w)] == WRONG_TYPE_IDS


@pytest.mark.parametrize("case_id", WRONG_TYPE_IDS)
def test_wrong_types_are_400_naming_the_fields(w, case_id):
    _, method, path, body, fields = next(c for c in wrong_type_cases(w) if c[0] == case_id)
    before = db_snapshot()
    response = send(w.me, method, path, body)
    error = assert_error(response, 400, "validation_error", fields=fields)
    assert set(error["details"]) == set(fields)
    assert_unchanged(before)


def test_expected_statuses_outside_the_status_enum_are_rejected(w):
    before = db_snapshot()
    response = send(w.me, "POST", f"/api/issues/{w.issue.pk}/checkout",
                    {"agentId": str(w.me.agent.pk), "expectedStatuses": ["finished", "todo"]})
    assert_error(response, 400, "validation_error", fields=["expectedStatuses"])
    assert_unchanged(before)
    assert Issue.objects.get(pk=w.issue.pk).status == "todo"


# --- invalid list filters -----------------------------------------------------------------------------


@pytest.mark.parametrize("query,field", [
    ("status=bogus", "status"),
    ("status=todo,bogus", "status"),
    ("priority=urgent", "priority"),
    ("assigneeAgentId=not-a-uuid", "assigneeAgentId"),
    ("assigneeUserId=bob", "assigneeUserId"),
    ("parentId=PAP-1", "parentId"),
    ("limit=-1", "limit"),
    ("limit=0", "limit"),
    ("limit=ten", "limit"),
    ("offset=-5", "offset"),
])
def test_invalid_issue_list_filters_are_400_naming_the_parameter(w, query, field):
    response = w.me.get(f"/api/companies/{w.company.pk}/issues?{query}")
    error = assert_error(response, 400, fields=[field])
    assert field in error["details"]


def test_valid_issue_list_filters_are_accepted(w):
    response = w.me.get(f"/api/companies/{w.company.pk}/issues?status=todo,in_progress&priority=medium&limit=1")
    assert response.status_code == 200
    assert len(response.json()) == 1


def test_invalid_comment_cursor_is_400(w):
    assert_error(w.me.get(f"/api/issues/{w.issue.pk}/comments?after=yesterday"), 400, fields=["after"])
    assert_error(w.me.get(f"/api/issues/{w.issue.pk}/comments?limit=-1"), 400, fields=["limit"])


# --- authentication ---------------------------------------------------------------------------------


def test_revoked_api_key_is_401(w):
    assert w.me.get("/api/agents/me").status_code == 200
    key = AgentApiKey.objects.get(agent=w.me.agent)
    agent_key_revoke(actor=SYSTEM, agent=key.agent, key_id=key.pk)
    before = db_snapshot()
    for method, path, body in [("GET", "/api/agents/me", None),
                               ("GET", f"/api/issues/{w.issue.pk}", None),
                               ("POST", f"/api/issues/{w.issue.pk}/comments", {"body": "still here?"})]:
        response = send(w.me, method, path, body)
        assert_error(response, 401, "unauthorized")
        assert response["WWW-Authenticate"].lower().startswith("bearer")
    assert_unchanged(before)


def test_another_key_of_the_same_agent_keeps_working_after_a_revocation(w):
    _, second_raw = agent_api_key_create(agent=w.me.agent, name="second")
    key = AgentApiKey.objects.get(agent=w.me.agent, name="default")
    agent_key_revoke(actor=SYSTEM, agent=key.agent, key_id=key.pk)
    assert AgentClient(w.me.agent, second_raw, w.me.run).get("/api/agents/me").status_code == 200
    assert_error(w.me.get("/api/agents/me"), 401, "unauthorized")


@pytest.mark.parametrize("header", ["Bearer pcp_not-a-real-key", "Bearer", "Bearer two parts", "bearer "])
def test_bad_bearer_credentials_are_401(db, header):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    assert_error(client.get("/api/agents/me"), 401, "unauthorized")


def test_terminated_agent_key_is_401(w):
    w.me.agent.status = "terminated"
    w.me.agent.save()
    assert_error(w.me.get("/api/agents/me"), 401, "unauthorized")


# --- the run header -----------------------------------------------------------------------------------


@pytest.mark.parametrize("label", RUN_SCOPED_LABELS)
def test_agent_mutation_without_run_header_is_401_run_id_required(w, label):
    _, method, path, body = mutation(w, label)
    client = AgentClient(w.me.agent, w.me.raw_key, run=None)
    before = db_snapshot()
    assert_error(send(client, method, path, body), 401, "run_id_required")
    assert_unchanged(before)


@pytest.mark.parametrize("label", MUTATION_LABELS)
def test_agent_mutation_naming_another_agents_run_is_only_a_client_run_id(w, label):
    """A header naming none of the agent's host runs is the client's own run id (upstream, §2.3):
    recorded on the activity rows, never trusted as that run (tests/test_agent_key_run_ids.py)."""
    _, method, path, body = mutation(w, label)
    client = AgentClient(w.me.agent, w.me.raw_key, run=w.other.run)
    other_run = HeartbeatRun.objects.values("status", "last_activity_at", "last_heartbeat_at").get(pk=w.other.run.pk)
    last_row = ActivityLog.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    response = send(client, method, path, body)
    if label == "release":  # w.wip is held by the agent's live host run, and a client id is never live
        assert_error(response, 409, "not_checkout_owner")
    else:
        assert 200 <= response.status_code < 300, (response.status_code, response.content[:500])
        rows = list(ActivityLog.objects.filter(pk__gt=last_row, actor_agent=w.me.agent))
        assert rows and all(r.client_run_id == w.other.run.pk for r in rows), rows
        # (a wake's row names the run it woke, which here is the other agent's own)
        assert all(r.run_id is None for r in rows if r.action != "agent.wakeup_requested"), rows
    assert HeartbeatRun.objects.values("status", "last_activity_at", "last_heartbeat_at").get(
        pk=w.other.run.pk) == other_run
    assert not Issue.objects.filter(checkout_run=w.other.run).exists()  # no lock names the other's run


def test_agent_mutation_with_a_malformed_run_header_is_400(w):
    client = AgentClient(w.me.agent, w.me.raw_key, run=None)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {w.me.raw_key}", HTTP_X_PAPERCLIP_RUN_ID="not-a-uuid")
    before = db_snapshot()
    assert_error(send(client, "POST", f"/api/issues/{w.issue.pk}/comments", {"body": "x"}), 400, "invalid_run_id",
                 fields=["X-Paperclip-Run-Id"])
    assert_unchanged(before)


@pytest.mark.parametrize("label,status", [*[(label, "succeeded") for label in MUTATION_LABELS],
                                          *[("comment", s) for s in ("failed", "cancelled", "timed_out", "interrupted")]])
def test_agent_mutation_with_an_ended_run_is_409_run_not_live(w, label, status):
    ended = RunFactory(agent=w.me.agent, status=status, started_at=timezone.now(), finished_at=timezone.now())
    _, method, path, body = mutation(w, label)
    client = AgentClient(w.me.agent, w.me.raw_key, run=ended)
    before = db_snapshot()
    error = assert_error(send(client, method, path, body), 409, "run_not_live")
    assert error["details"] == {"runId": str(ended.pk), "status": status}
    assert_unchanged(before)


def test_agent_reads_need_no_run_header(w):
    client = AgentClient(w.me.agent, w.me.raw_key, run=None)
    for path in ["/api/agents/me", f"/api/companies/{w.company.pk}/issues", f"/api/issues/{w.issue.pk}",
                 f"/api/issues/{w.issue.pk}/comments", f"/api/issues/{w.issue.pk}/documents/plan"]:
        assert client.get(path).status_code == 200, path


# --- read-only board role -------------------------------------------------------------------------------


def board_mutations(w):
    return [*[(m[1], m[2], m[3]) for m in agent_mutations(w)],
            ("POST", f"/api/agents/{w.other.agent.pk}/wakeup", {"reason": "help"}),  # (agents wake only themselves)
            ("POST", f"/api/interactions/{w.interaction.pk}/respond", {"status": "answered"})]


def test_viewer_cannot_mutate_anything(w):
    viewer = board_client_for(w.company, "viewer", "viewer-mutate")
    # A board user checks out for an agent with that agent's live run.
    viewer.credentials(HTTP_X_PAPERCLIP_RUN_ID=str(w.me.run.pk))
    operator = board_client_for(w.company, "operator", "operator-control")
    operator.credentials(HTTP_X_PAPERCLIP_RUN_ID=str(w.me.run.pk))
    before = db_snapshot()
    for method, path, body in board_mutations(w):
        assert_error(send(viewer, method, path, body), 403, "read_only_role")
        assert_unchanged(before)
    # The same requests from a writing role go through (the 403 is the role, not the request).
    for method, path, body in board_mutations(w):
        response = send(operator, method, path, body)
        assert 200 <= response.status_code < 300, (method, path, response.content[:400])


def test_viewer_can_read(w):
    viewer = board_client_for(w.company, "viewer", "viewer-read")
    issue = f"/api/issues/{w.issue.pk}"
    for path in ["/api/companies", f"/api/companies/{w.company.pk}/issues", issue, f"/api/issues/{w.issue.identifier}",
                 f"{issue}/comments", f"{issue}/documents", f"{issue}/documents/plan",
                 f"{issue}/documents/plan/revisions", f"{issue}/interactions", f"/api/runs/{w.me.run.pk}"]:
        response = viewer.get(path)
        assert response.status_code == 200, (path, response.content[:300])
    assert viewer.get(issue).json()["title"] == "Original title"


# --- nothing half-written ------------------------------------------------------------------------------


def half_written_patches(w):
    return [
        ("invalid-choice", {"title": "New title", "status": "bogus"}, 400),
        ("unknown-field", {"title": "New title", "colour": "red"}, 400),
        ("bad-uuid", {"title": "New title", "priority": "high", "parentId": "nope"}, 400),
        ("missing-parent", {"title": "New title", "priority": "high", "parentId": str(uuid.uuid4())}, 404),
        ("missing-assignee", {"title": "New title", "assigneeAgentId": str(uuid.uuid4())}, 404),
        ("missing-goal", {"description": "New", "priority": "critical", "goalId": str(uuid.uuid4())}, 404),
        ("own-parent", {"title": "New title", "parentId": str(w.issue.pk)}, 422),
        ("agent-in-progress", {"title": "New title", "status": "in_progress"}, 422),
        ("blank-comment", {"title": "New title", "comment": ""}, 400),
    ]


HALF_IDS = ["invalid-choice", "unknown-field", "bad-uuid", "missing-parent", "missing-assignee", "missing-goal",
            "own-parent", "agent-in-progress", "blank-comment"]


@pytest.mark.parametrize("case_id", HALF_IDS)
def test_patch_with_a_valid_and_an_invalid_field_changes_nothing(w, case_id):
    assert [c[0] for c in half_written_patches(w)] == HALF_IDS
    _, body, status = next(c for c in half_written_patches(w) if c[0] == case_id)
    before = db_snapshot()
    response = send(w.me, "PATCH", f"/api/issues/{w.issue.pk}", body)
    assert_error(response, status)
    assert_unchanged(before)
    fresh = w.me.get(f"/api/issues/{w.issue.pk}").json()
    assert (fresh["title"], fresh["description"], fresh["priority"], fresh["status"]) == \
        ("Original title", "Original description", "medium", "todo")


def test_board_patch_to_in_progress_without_assignee_changes_nothing(w):
    owner = board_client_for(w.company, "owner", "owner-half")
    before = db_snapshot()
    response = send(owner, "PATCH", f"/api/issues/{w.issue.pk}", {"title": "New title", "status": "in_progress"})
    assert_error(response, 422, "assignee_required", fields=["assigneeAgentId"])
    assert_unchanged(before)


def test_work_cannot_be_assigned_to_a_terminated_agent(w):
    owner = board_client_for(w.company, "owner", "owner-terminated")
    gone = AgentFactory(company=w.company, name="retired-bot", status="terminated")
    before = db_snapshot()
    response = send(owner, "PATCH", f"/api/issues/{w.issue.pk}", {"title": "New title", "assigneeAgentId": str(gone.pk)})
    assert_error(response, 409, "agent_terminated", fields=["assigneeAgentId"])  # upstream's 409
    assert response.json()["error"] == "Cannot assign work to terminated agents"
    assert "terminated" in response.json()["details"]["assigneeAgentId"][0]
    response = send(owner, "POST", f"/api/companies/{w.company.pk}/issues",
                    {"title": "For the retired", "assigneeAgentId": str(gone.pk)})
    assert_error(response, 409, "agent_terminated", fields=["assigneeAgentId"])
    assert_unchanged(before)


def test_an_assignee_the_caller_already_read_is_checked_like_an_id(company):
    """issue_create(assignee_agent=...) (the connector import passes the agent routing read): another
    company's agent is a 404 and a terminated one a 409, as for assigneeAgentId, and nothing is written."""
    from issues.exceptions import Conflict, NotFound
    from issues.services.issues import issue_create

    elsewhere = AgentFactory(name="elsewhere-bot")  # another company
    gone = AgentFactory(company=company, name="retired-bot", status="terminated")
    before = db_snapshot()
    with pytest.raises(NotFound) as missing:
        issue_create(actor=SYSTEM, company=company, title="Routed", assignee_agent=elsewhere)
    assert "assigneeAgentId" in missing.value.details
    with pytest.raises(Conflict) as terminated:
        issue_create(actor=SYSTEM, company=company, title="Routed", assignee_agent=gone)
    assert "terminated" in terminated.value.details["assigneeAgentId"][0]
    assert_unchanged(before)
    ready = AgentFactory(company=company, name="ready-bot")
    issue, _ = issue_create(actor=SYSTEM, company=company, title="Routed", assignee_agent=ready)
    assert issue.assignee_agent_id == ready.pk


def test_create_with_a_bad_reference_creates_nothing_and_uses_no_number(w):
    counter = Company.objects.get(pk=w.company.pk).issue_counter
    before = db_snapshot()
    response = send(w.me, "POST", f"/api/companies/{w.company.pk}/issues",
                    {"title": "Child", "parentId": str(w.issue.pk), "projectId": str(uuid.uuid4()),
                     "blockParentUntilDone": True})
    assert_error(response, 404, "not_found", fields=["projectId"])
    assert_unchanged(before)
    created = send(w.me, "POST", f"/api/companies/{w.company.pk}/issues", {"title": "Next"})
    assert created.status_code == 201
    assert created.json()["number"] == counter + 1


# --- unknown paths --------------------------------------------------------------------------------------


@pytest.mark.parametrize("method,path", [
    ("GET", "/api/no-such-endpoint"),
    ("POST", "/api/no-such-endpoint"),
    ("GET", "/api/issues/PAP-1/nonsense"),
    ("GET", "/api/approvals/not-a-uuid"),
    ("GET", "/api/runs/123"),
    ("DELETE", "/api/v2/issues"),
    ("GET", "/api/"),
])
def test_unknown_api_path_is_a_json_404(w, method, path):
    for client in (w.me, APIClient()):
        response = getattr(client, method.lower())(path)
        assert_error(response, 404, "not_found")


def test_unknown_path_outside_the_api_is_not_json(db):
    response = APIClient().get("/no-such-page-here/")
    assert response.status_code == 404
    assert not response["Content-Type"].startswith("application/json")


def test_wrong_method_on_a_known_path_is_405_in_the_error_shape(w):
    for method, path in [("PUT", f"/api/issues/{w.issue.pk}"), ("PUT", f"/api/issues/{w.issue.pk}/comments"),
                         ("POST", f"/api/runs/{w.me.run.pk}"), ("PATCH", "/api/agents/me")]:
        assert_error(send(w.me, method, path, {}), 405, "method_not_allowed")


def test_ids_must_be_json_strings(board_client, company):
    response = board_client.post(f"/api/companies/{company.pk}/issues", {"title": "x", "goalId": 5}, format="json")
    assert response.status_code == 400
    assert "goalId" in response.json()["details"]
