"""Hostile input found by a fuzzer: every case answers a 4xx in the one error shape
``{"error": "<message>", "code", "details"}`` (the offending field named when there is one) and
leaves nothing half-written, on SQLite and on PostgreSQL (whose integer, bytea and text types
refuse what SQLite quietly stores)."""
import hashlib
import hmac
import json
import random
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from rest_framework.test import APIClient

from cases.documents import case_document_write
from cases.models import Case, CaseEvent, WorkflowDefinition
from cases.services import case_create, workflow_definition_create
from connectors.models import Conflict, InboundEvent, OutboundEffect, TaskLink
from connectors.sandbox.github import DEFAULT_FIXTURES_DIR
from connectors.services.instances import instance_create
from issues.actors import SYSTEM
from issues.models import (
    ActivityLog,
    Agent,
    Comment,
    Company,
    HeartbeatRun,
    Interaction,
    Issue,
    RunEvent,
)
from paperclip.core.parsers import json_depth_exceeds
from tests.factories import AgentFactory, IssueFactory, MembershipFactory, RunFactory, UserFactory
from tests.test_errors import assert_error, assert_unchanged
from tests.test_errors import db_snapshot as errors_db_snapshot

BIGINT_MAX = 2**63 - 1
EXPECTED = ["todo", "backlog", "blocked", "in_review"]
GITHUB_SECRET = "hostile-input-hook-secret"
GITHUB_FIXTURES = Path(DEFAULT_FIXTURES_DIR)


# --- helpers ------------------------------------------------------------------------------------


SNAPSHOT_MODELS = (Company, Agent, Issue, Comment, Interaction, ActivityLog, HeartbeatRun, RunEvent, Case, CaseEvent,
                   WorkflowDefinition, InboundEvent, Conflict, OutboundEffect)


def db_snapshot():
    return errors_db_snapshot(SNAPSHOT_MODELS)


def post_raw(client, path, raw, method="post", **extra):
    data = raw if isinstance(raw, bytes) else raw.encode("utf-8")
    return getattr(client, method)(path, data=data, content_type="application/json", **extra)


def nested(depth: int, leaf: str = "1") -> str:
    """A JSON value nested ``depth`` containers deep (arrays inside one object member)."""
    return "[" * depth + leaf + "]" * depth


def github_signature(body: bytes, secret: str = GITHUB_SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def deliver(instance, body: bytes, *, signed=True, event="issues"):
    headers = {"HTTP_X_GITHUB_EVENT": event, "HTTP_X_GITHUB_DELIVERY": str(uuid.uuid4())}
    if signed:
        headers["HTTP_X_HUB_SIGNATURE_256"] = github_signature(body)
    return APIClient().post(f"/api/connectors/{instance.pk}/webhook", data=body, content_type="application/json",
                            **headers)


@pytest.fixture
def w(company, make_agent_client, monkeypatch):
    """A company with cases on: an agent (key + live run), a board owner, an issue assigned to the
    agent, a case, a workflow definition, a GitHub connector with one link."""
    company.enable_cases = True
    company.save()
    me = make_agent_client(company=company)
    owner = UserFactory(username=f"owner-{uuid.uuid4().hex[:8]}")
    MembershipFactory(company=company, user=owner, role="owner")
    board = APIClient()
    board.force_login(owner)
    issue = IssueFactory(company=company, title="Hostile", assignee_agent=me.agent)
    case, _ = case_create(actor=SYSTEM, company=company, case_type="review", title="A case", kickoff="k",
                          workflow_document_text="w", fields={"a": 1})
    case_document_write(actor=SYSTEM, case=case, key="notes", body="case notes")
    workflow = workflow_definition_create(actor=SYSTEM, company=company, name="Procedure", prompt="Do it. " * 20)
    monkeypatch.setenv("PAPERCLIP_SECRET_HOSTILE_HOOK", GITHUB_SECRET)
    instance = instance_create(actor=SYSTEM, company=company, name="gh", provider_key="github_issues",
                               base_url="https://api.github.invalid", containers=["Codertocat/Hello-World"],
                               webhook_secret="env:PAPERCLIP_SECRET_HOSTILE_HOOK")
    link = TaskLink.objects.create(
        company=company, instance=instance, provider_key=instance.provider_key, issue=issue,
        external_task_id="1", external_key="Codertocat/Hello-World#1", external_title="Task",
        external_url="https://example.invalid/1", external_state_name="open", external_state_category="active")
    return SimpleNamespace(company=company, me=me, board=board, issue=issue, case=case, workflow=workflow,
                           instance=instance, link=link)


# --- 1. list windows: offset / limit ----------------------------------------------------------------


def list_endpoints(w):
    """Every list endpoint with offset pagination: (label, client, path)."""
    c, i, link = w.company.pk, w.instance.pk, w.link.pk
    return [
        ("issues", w.me, f"/api/companies/{c}/issues"),
        ("cases", w.board, f"/api/companies/{c}/cases"),
        ("workflows", w.board, f"/api/companies/{c}/workflows"),
        ("connectors", w.board, f"/api/companies/{c}/connectors"),
        ("case-events", w.board, f"/api/cases/{w.case.pk}/events"),
        ("case-document-revisions", w.board, f"/api/cases/{w.case.pk}/documents/notes/revisions"),
        ("agent-tool-conflicts", w.me, f"/api/agent-tools/connector/conflicts?issue={w.issue.pk}"),
        ("link-activity", w.board, f"/api/connector-links/{link}/activity"),
        ("link-outbound", w.board, f"/api/connector-links/{link}/outbound"),
        ("connector-links", w.board, f"/api/connectors/{i}/links"),
        ("connector-conflicts", w.board, f"/api/connectors/{i}/conflicts"),
        ("connector-events", w.board, f"/api/connectors/{i}/events"),
    ]


LIST_LABELS = ["issues", "cases", "workflows", "connectors", "case-events", "case-document-revisions",
               "agent-tool-conflicts", "link-activity", "link-outbound", "connector-links", "connector-conflicts",
               "connector-events"]

BAD_WINDOWS = [
    ("offset", str(2**63)),  # one past the 64-bit range
    ("offset", str(2**64 + 5)),
    ("offset", "9" * 40),
    ("offset", str(2**31)),  # past the bound (PostgreSQL's integer range)
    ("offset", "-1"),
    ("offset", "1.5"),
    ("offset", "1e3"),
    ("offset", "ten"),
    ("offset", ""),
    ("offset", " 7"),
    ("offset", "\u0661\u0662"),  # Arabic-Indic digits: int() takes them, a query parameter should not
    ("limit", str(2**63)),
    ("limit", "9" * 40),
    ("limit", "-3"),
    ("limit", "0"),
    ("limit", "2.0"),
]


def with_query(path, name, value):
    from urllib.parse import quote

    return f"{path}{'&' if '?' in path else '?'}{name}={quote(value)}"


def test_list_endpoint_table_is_complete(w):
    assert [e[0] for e in list_endpoints(w)] == LIST_LABELS


@pytest.mark.parametrize("label", LIST_LABELS)
def test_list_endpoints_accept_a_sane_window(w, label):
    _, client, path = next(e for e in list_endpoints(w) if e[0] == label)
    response = client.get(with_query(with_query(path, "limit", "5"), "offset", str(2**31 - 1)))
    assert response.status_code == 200, (response.status_code, response.content[:400])
    # Bigger than the page-size maximum but a sane number: clamped to the maximum, as documented.
    assert client.get(with_query(path, "limit", "100000")).status_code == 200


@pytest.mark.parametrize("label", LIST_LABELS)
def test_list_window_out_of_range_or_not_an_integer_is_400_naming_it(w, label):
    _, client, path = next(e for e in list_endpoints(w) if e[0] == label)
    for name, value in BAD_WINDOWS:
        response = client.get(with_query(path, name, value))
        error = assert_error(response, 400, "validation_error", fields=[name])
        assert set(error["details"]) == {name}, (name, value, error)


def test_cursor_endpoints_bound_their_numbers_too(w):
    assert_error(w.me.get(f"/api/runs/{w.me.run.pk}/events?after={2**63}"), 400, fields=["after"])
    assert_error(w.me.get(f"/api/runs/{w.me.run.pk}/events?limit={2**64}"), 400, fields=["limit"])
    assert_error(w.me.get(f"/api/issues/{w.issue.pk}/comments?limit={'9' * 30}"), 400, fields=["limit"])


@pytest.mark.parametrize("body,field", [
    ({"pollIntervalSeconds": 2**31}, "pollIntervalSeconds"),
    ({"reconcileIntervalSeconds": 2**63}, "reconcileIntervalSeconds"),
    ({"routingRules": [{"kind": "label", "match": {"label": "x"}, "order": 2**31}]}, "routingRules"),
    ({"routingRules": [{"kind": "label", "match": {"label": "x"}, "order": -(2**31) - 1}]}, "routingRules"),
])
def test_connector_integers_beyond_their_columns_are_400(w, body, field):
    before = db_snapshot()
    response = w.board.patch(f"/api/connectors/{w.instance.pk}", body, format="json")
    assert_error(response, 400, "validation_error", fields=[field])
    assert_unchanged(before)


# --- 2. paged byte reads --------------------------------------------------------------------------------


HUGE_OFFSETS = [2**31 - 2, 2**31 - 1, 2**31, 2**32 + 3, 2**63 - 1, 2**63, 10**30]


@pytest.mark.parametrize("offset", HUGE_OFFSETS)
def test_case_agent_read_past_the_end_is_the_documented_400(w, offset):
    first = w.board.get(f"/api/cases/{w.case.pk}?agentRead=true&section=fields&limitBytes=4").json()
    response = w.board.get(f"/api/cases/{w.case.pk}?agentRead=true&section=fields&limitBytes=4"
                           f"&offsetBytes={offset}&snapshot={first['snapshot']}")
    error = assert_error(response, 400, "invalid_offset", fields=["offsetBytes"])
    assert "past the end" in error["message"]
    # Same for the whole-case projection and a document section.
    case_first = w.board.get(f"/api/cases/{w.case.pk}?agentRead=true&limitBytes=8").json()
    response = w.board.get(f"/api/cases/{w.case.pk}?agentRead=true&limitBytes=8&offsetBytes={offset}"
                           f"&snapshot={case_first['snapshot']}")
    assert_error(response, 400, "invalid_offset", fields=["offsetBytes"])
    doc = f"section=document&documentKey=workflow&documentIssueId={w.case.primary_task_id}"
    doc_first = w.board.get(f"/api/cases/{w.case.pk}?agentRead=true&{doc}").json()
    response = w.board.get(f"/api/cases/{w.case.pk}?agentRead=true&{doc}"
                           f"&offsetBytes={offset}&snapshot={doc_first['snapshot']}")
    assert_error(response, 400, "invalid_offset", fields=["offsetBytes"])


@pytest.mark.parametrize("offset", HUGE_OFFSETS)
def test_workflow_prompt_read_past_the_end_is_the_documented_400(w, offset):
    fingerprint = w.board.get(f"/api/workflows/{w.workflow.pk}?offsetBytes=0&limitBytes=16").json()["fingerprint"]
    response = w.board.get(f"/api/workflows/{w.workflow.pk}?offsetBytes={offset}&fingerprint={fingerprint}")
    error = assert_error(response, 400, "invalid_offset", fields=["offsetBytes"])
    assert "past the end" in error["message"]


def test_byte_read_offsets_just_past_the_end_still_report_the_total(w):
    first = w.board.get(f"/api/workflows/{w.workflow.pk}?offsetBytes=0&limitBytes=16").json()
    total = first["readPage"]["totalBytes"]
    response = w.board.get(f"/api/workflows/{w.workflow.pk}?offsetBytes={total + 1}"
                           f"&fingerprint={first['fingerprint']}")
    error = assert_error(response, 400, "invalid_offset", fields=["offsetBytes"])
    assert str(total) in error["details"]["offsetBytes"][0]


def test_byte_read_limits_out_of_range(w):
    # A huge budget is clamped to the maximum (documented); not an integer at all is a 400.
    assert w.board.get(f"/api/workflows/{w.workflow.pk}?offsetBytes=0&limitBytes={10**30}").status_code == 200
    assert_error(w.board.get(f"/api/workflows/{w.workflow.pk}?offsetBytes=0&limitBytes=1e999"), 400,
                 fields=["limitBytes"])
    assert_error(w.board.get(f"/api/cases/{w.case.pk}?agentRead=true&offsetBytes=-{2**63}"), 400,
                 fields=["offsetBytes"])


# --- 3. JSON nested too deep ------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [65, 1000, 100_000])
def test_request_body_nested_too_deep_is_400_malformed_json(w, depth):
    before = db_snapshot()
    body = '{"kind": "ask_question", "title": "Q", "payload": {"x": ' + nested(depth) + "}}"
    response = post_raw(w.me, f"/api/issues/{w.issue.pk}/interactions", body)
    error = assert_error(response, 400, "malformed_json")
    assert "deep" in error["message"]
    assert_unchanged(before)


def test_nesting_at_the_configured_depth_is_accepted(w, settings):
    settings.PAPERCLIP = {**settings.PAPERCLIP, "JSON_MAX_DEPTH": 6}
    # The body object is level 1, the payload object 2: four arrays inside make six.
    ok = '{"kind": "ask_question", "title": "Q", "payload": {"x": ' + nested(4) + "}}"
    assert post_raw(w.me, f"/api/issues/{w.issue.pk}/interactions", ok).status_code == 201
    before = db_snapshot()
    deeper = '{"kind": "ask_question", "title": "Q", "payload": {"x": ' + nested(5) + "}}"
    assert_error(post_raw(w.me, f"/api/issues/{w.issue.pk}/interactions", deeper), 400, "malformed_json")
    assert_unchanged(before)


@pytest.mark.parametrize("text,too_deep", [
    ("[[[1]]]", False), ("[[[[1]]]]", True),
    ('["[[[[[[", "]]]]]]"]', False),  # brackets inside strings do not count
    ('["\\"[[[[[["]', False),  # nor after an escaped quote
    ('{"a": {"b": {"c": 1}}}', False), ('{"a": {"b": {"c": {}}}}', True),
    ('"[[[[[[[[', False),  # an unterminated string is malformed JSON, not deep JSON
    ('"\\' + '\\"' * 5000, False),  # pathological escapes stay linear
])
def test_depth_scanner(text, too_deep):
    assert json_depth_exceeds(text, 3) is too_deep


def _depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def test_depth_scanner_agrees_with_the_parser_on_generated_documents():
    """Documents whose strings (and keys) are full of brackets, quotes, backslashes and non-ASCII
    text, written with and without ASCII escapes: the scanner's answer is the parsed depth's."""
    rng = random.Random(19)
    alphabet = ['[', ']', '{', '}', '"', '\\', '\\"', '"\\', 'a', ' ', 'é', '✓', '/', ':', ',', '\n']

    def text():
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6)))

    def document(level):
        kind = rng.random() if level < 9 else 1.0
        if kind < 0.35:
            return [document(level + 1) for _ in range(rng.randint(0, 3))]
        if kind < 0.7:
            return {text(): document(level + 1) for _ in range(rng.randint(0, 3))}
        return rng.choice([text(), 7, None, True, 2.5])

    for _ in range(400):
        doc = document(0)
        depth = _depth(doc)
        for dumped in (json.dumps(doc), json.dumps(doc, ensure_ascii=False)):
            for limit in range(1, 10):
                assert json_depth_exceeds(dumped, limit) is (depth > limit), (dumped, limit, depth)
                assert json_depth_exceeds(dumped.encode(), limit) is (depth > limit), (dumped, limit, depth)


def github_issue_body(**replace) -> bytes:
    payload = json.loads((GITHUB_FIXTURES / "issues_opened.payload.json").read_bytes())
    payload.update(replace)
    return json.dumps(payload).encode()


@pytest.mark.parametrize("depth", [70, 5000, 200_000])
def test_signed_webhook_nested_too_deep_is_400_webhook_unparseable_and_stores_nothing(w, depth):
    before = db_snapshot()
    body = github_issue_body()[:-1] + b', "extra": ' + nested(depth).encode() + b"}"
    response = deliver(w.instance, body)
    assert_error(response, 400, "webhook_unparseable")
    assert_unchanged(before)
    # Unsigned, the same body is refused for its signature first (401), as any unsigned delivery.
    assert_error(deliver(w.instance, body, signed=False), 401)


def test_signed_webhook_of_normal_depth_is_still_stored(w):
    response = deliver(w.instance, github_issue_body())
    assert response.status_code == 202, response.content
    assert InboundEvent.objects.filter(instance=w.instance).count() == 1


# --- 4. heartbeat usage ----------------------------------------------------------------------------------


def heartbeat(client, run, usage):
    return client.post(f"/api/runs/{run.pk}/heartbeat", {"usage": usage}, format="json")


@pytest.mark.parametrize("value", [2**31, 2**32 + 7, BIGINT_MAX])
def test_heartbeat_usage_within_64_bits_is_stored(w, value):
    response = heartbeat(w.me, w.me.run, {"inputTokens": value, "outputTokens": value, "costCents": value})
    assert response.status_code == 200, response.content[:400]
    run = HeartbeatRun.objects.get(pk=w.me.run.pk)
    assert (run.input_tokens, run.output_tokens, run.cost_cents) == (value, value, value)
    agent = Agent.objects.get(pk=w.me.agent.pk)
    assert agent.spent_monthly_cents == value
    assert Company.objects.get(pk=w.company.pk).spent_monthly_cents == value


@pytest.mark.parametrize("field", ["inputTokens", "outputTokens", "costCents"])
@pytest.mark.parametrize("value", [2**63, 2**64, 10**40, -1])
def test_heartbeat_usage_beyond_64_bits_is_400_naming_the_field(w, field, value):
    before = db_snapshot()
    response = heartbeat(w.me, w.me.run, {field: value})
    error = assert_error(response, 400, "validation_error", fields=["usage"])
    assert field in error["details"]["usage"]
    assert_unchanged(before)


def test_running_spend_totals_saturate_instead_of_overflowing(w, make_agent_client):
    second = RunFactory(agent=w.me.agent)
    assert heartbeat(w.me, w.me.run, {"costCents": BIGINT_MAX}).status_code == 200
    assert heartbeat(w.me.use_run(second), second, {"costCents": BIGINT_MAX}).status_code == 200
    assert Agent.objects.get(pk=w.me.agent.pk).spent_monthly_cents == BIGINT_MAX
    assert Company.objects.get(pk=w.company.pk).spent_monthly_cents == BIGINT_MAX
    other = make_agent_client(company=w.company)
    assert heartbeat(other, other.run, {"costCents": 5}).status_code == 200
    assert Company.objects.get(pk=w.company.pk).spent_monthly_cents == BIGINT_MAX
    assert Agent.objects.get(pk=other.agent.pk).spent_monthly_cents == 5


def test_budget_columns_hold_64_bit_values(w):
    Agent.objects.filter(pk=w.me.agent.pk).update(budget_monthly_cents=BIGINT_MAX, spent_monthly_cents=2**40)
    Company.objects.filter(pk=w.company.pk).update(budget_monthly_cents=BIGINT_MAX, spent_monthly_cents=2**40)
    response = w.me.get("/api/agents/me")
    assert response.status_code == 200
    assert response.json()["budgetMonthlyCents"] == BIGINT_MAX


# --- 5. infinity and NaN ----------------------------------------------------------------------------------


NON_FINITE = ["1e999", "-1e999", "NaN", "Infinity", "-Infinity", "1E400", "[1e999]"]


@pytest.mark.parametrize("literal", NON_FINITE)
def test_non_finite_numbers_in_interaction_payload_are_400(w, literal):
    before = db_snapshot()
    body = '{"kind": "ask_question", "title": "Q", "payload": {"n": ' + literal + "}}"
    error = assert_error(post_raw(w.me, f"/api/issues/{w.issue.pk}/interactions", body), 400, "malformed_json")
    assert "finite" in error["message"] or "NaN" in error["message"] or "Infinity" in error["message"]
    assert_unchanged(before)


@pytest.mark.parametrize("literal", NON_FINITE)
def test_non_finite_numbers_in_case_fields_are_400(w, literal):
    before = db_snapshot()
    create = ('{"type": "review", "title": "T", "kickoff": "k", "workflowDocumentText": "w", '
              '"fields": {"amount": ' + literal + "}}")
    assert_error(post_raw(w.board, f"/api/companies/{w.company.pk}/cases", create), 400, "malformed_json")
    patch = '{"fields": {"amount": ' + literal + "}}"
    assert_error(post_raw(w.board, f"/api/cases/{w.case.pk}", patch, method="patch"), 400, "malformed_json")
    assert_unchanged(before)


def test_large_finite_numbers_are_still_numbers(w):
    body = '{"kind": "ask_question", "title": "Q", "payload": {"n": 1.7976931348623157e308, "i": ' + "9" * 60 + "}}"
    response = post_raw(w.me, f"/api/issues/{w.issue.pk}/interactions", body)
    assert response.status_code == 201, response.content[:400]
    # (PostgreSQL's jsonb keeps it as a numeric and gives it back as an integer of the same value.)
    assert float(Interaction.objects.get(pk=response.json()["id"]).payload["n"]) == 1.7976931348623157e308


# --- 6. NUL characters -------------------------------------------------------------------------------------


@pytest.mark.parametrize("payload", [{"k": "a\u0000b"}, {"a\u0000": 1}, {"deep": [{"x": ["\u0000"]}]}])
def test_nul_in_interaction_payload_is_400_naming_payload(w, payload):
    before = db_snapshot()
    response = w.me.post(f"/api/issues/{w.issue.pk}/interactions",
                         {"kind": "ask_question", "title": "Q", "payload": payload}, format="json")
    error = assert_error(response, 400, "validation_error", fields=["payload"])
    assert "NUL" in json.dumps(error["details"])
    assert_unchanged(before)


def test_nul_in_case_fields_is_400_naming_fields(w):
    before = db_snapshot()
    create = {"type": "review", "title": "T", "kickoff": "k", "workflowDocumentText": "w", "fields": {"x": "\u0000"}}
    assert_error(w.board.post(f"/api/companies/{w.company.pk}/cases", create, format="json"), 400,
                 "validation_error", fields=["fields"])
    assert_error(w.board.patch(f"/api/cases/{w.case.pk}", {"fields": {"\u0000": 1}}, format="json"), 400,
                 "validation_error", fields=["fields"])
    assert_unchanged(before)


@pytest.mark.parametrize("method,path,body,field", [
    ("post", "/api/issues/{issue}/comments", {"body": "hi\u0000there"}, "body"),
    ("patch", "/api/issues/{issue}", {"title": "t\u0000"}, "title"),
    ("post", "/api/companies/{company}/issues", {"title": "ok", "description": "\u0000"}, "description"),
    ("patch", "/api/cases/{case}", {"summary": "s\u0000"}, "summary"),
    ("post", "/api/issues/{issue}/interactions", {"kind": "ask_question", "title": "Q\u0000"}, "title"),
])
def test_nul_in_text_fields_is_400_naming_the_field(w, method, path, body, field):
    client = w.board if "cases" in path else w.me
    path = path.format(issue=w.issue.pk, company=w.company.pk, case=w.case.pk)
    before = db_snapshot()
    assert_error(getattr(client, method)(path, body, format="json"), 400, "validation_error", fields=[field])
    assert_unchanged(before)


@pytest.mark.parametrize("query,field", [("q=a%00b", "q"), ("status=todo%00", "status"),
                                         ("assigneeAgentId=%00", "assigneeAgentId")])
def test_nul_in_query_parameters_is_400(w, query, field):
    assert_error(w.me.get(f"/api/companies/{w.company.pk}/issues?{query}"), 400, fields=[field])


def test_nul_in_path_identifiers_is_404_or_400(w):
    for path in (f"/api/issues/{w.company.issue_prefix}-%00", f"/api/cases/{w.company.issue_prefix}-C%00"):
        response = w.board.get(path)
        assert response.status_code in (400, 404), (path, response.status_code)
        assert_error(response, response.status_code)


def test_signed_webhook_with_nul_in_the_payload_is_stored_without_it(w):
    """A tracker's text may hold a NUL (PostgreSQL cannot store it): the verified event is kept with
    U+FFFD in its place, the raw body exactly as received."""
    payload = json.loads(github_issue_body())
    payload["issue"]["title"] = "before\u0000after"
    payload["issue"]["labels"] = [{"name": "bug\u0000", "id": 1}]
    body = json.dumps(payload).encode()
    response = deliver(w.instance, body)
    assert response.status_code == 202, response.content[:400]
    event = InboundEvent.objects.get(instance=w.instance)
    assert bytes(event.raw_body) == body
    assert "\\u0000" not in json.dumps(event.payload)
    assert event.payload["task"]["title"] == "before\ufffdafter"


# --- 7. bodies over the size limit -------------------------------------------------------------------------


def test_body_over_the_request_limit_is_413_json(w, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2000
    before = db_snapshot()
    body = json.dumps({"body": "x" * 5000})
    error = assert_error(post_raw(w.me, f"/api/issues/{w.issue.pk}/comments", body), 413, "payload_too_large")
    assert "2000" in error["message"]
    response = post_raw(w.board, f"/api/cases/{w.case.pk}", json.dumps({"summary": "y" * 5000}), method="patch")
    assert_error(response, 413, "payload_too_large")
    assert_unchanged(before)
    # Under the limit the same request goes through.
    assert post_raw(w.me, f"/api/issues/{w.issue.pk}/comments", json.dumps({"body": "x" * 100})).status_code == 201


def test_request_limit_comes_from_the_environment_setting():
    from django.conf import settings

    assert settings.PAPERCLIP["MAX_REQUEST_BYTES"] == 2_621_440  # Django's own default, unless set
    assert settings.DATA_UPLOAD_MAX_MEMORY_SIZE == settings.PAPERCLIP["MAX_REQUEST_BYTES"]


def test_webhook_between_the_two_limits_follows_the_webhook_rule(w, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2000
    body = github_issue_body()
    assert len(body) > 2000
    settings.CONNECTORS = {**settings.CONNECTORS, "WEBHOOK_MAX_BODY_BYTES": len(body) + 10}
    response = deliver(w.instance, body)
    assert response.status_code == 202, response.content[:400]
    settings.CONNECTORS = {**settings.CONNECTORS, "WEBHOOK_MAX_BODY_BYTES": len(body) - 10}
    before = db_snapshot()
    assert_error(deliver(w.instance, body), 413, "payload_too_large")
    assert_unchanged(before)


# --- 8. checkout refusals say what refused them (the code and details; the message is upstream's) ------------


def checkout(client, issue, agent, expected=EXPECTED):
    return client.post(f"/api/issues/{issue.pk}/checkout", {"agentId": str(agent.pk), "expectedStatuses": expected},
                       format="json")


@pytest.mark.parametrize("status,expected", [("backlog", ["todo"]), ("done", EXPECTED), ("cancelled", EXPECTED),
                                             ("in_review", ["todo", "blocked"])])
def test_checkout_refused_by_status_says_so(w, status, expected):
    issue = IssueFactory(company=w.company, status=status)
    before = db_snapshot()
    error = assert_error(checkout(w.me, issue, w.me.agent, expected), 409, "status_not_expected",
                         fields=["status", "expectedStatuses"])
    assert error["details"]["status"] == status
    assert error["details"]["expectedStatuses"] == expected
    assert error["message"] == "Issue checkout conflict"  # upstream's one 409 message (ref §7)
    assert error["details"]["checkoutRunId"] is None
    assert_unchanged(before)


def test_checkout_refused_by_another_assignee_says_so(w):
    someone = AgentFactory(company=w.company)
    issue = IssueFactory(company=w.company, assignee_agent=someone)
    error = assert_error(checkout(w.me, issue, w.me.agent), 409, "assigned_elsewhere")
    assert error["details"]["assigneeAgentId"] == str(someone.pk)
    assert error["message"] == "Issue checkout conflict"


def test_checkout_held_by_a_live_run_is_still_checkout_conflict(w, make_agent_client):
    holder = make_agent_client(company=w.company)
    issue = IssueFactory(company=w.company)
    assert checkout(holder, issue, holder.agent).status_code == 200
    error = assert_error(checkout(w.me, issue, w.me.agent), 409, "checkout_conflict")
    assert error["details"]["checkoutRunId"] == str(holder.run.pk)


# --- 9. bounded list parameters ----------------------------------------------------------------------------


def test_expected_statuses_list_is_bounded(w):
    before = db_snapshot()
    response = checkout(w.me, w.issue, w.me.agent, ["todo"] * 51)
    assert_error(response, 400, "validation_error", fields=["expectedStatuses"])
    response = checkout(w.me, w.issue, w.me.agent, ["todo" * 2000])
    assert_error(response, 400, "validation_error", fields=["expectedStatuses"])
    assert_unchanged(before)
    assert checkout(w.me, w.issue, w.me.agent, ["todo"] * 50).status_code == 200


@pytest.mark.parametrize("path,name", [
    ("/api/companies/{company}/issues", "status"),
    ("/api/companies/{company}/issues", "priority"),
    ("/api/companies/{company}/cases", "status"),
    ("/api/companies/{company}/cases", "type"),
    ("/api/connectors/{instance}/links", "status"),
    ("/api/connectors/{instance}/events", "status"),
])
def test_comma_list_filters_are_bounded(w, path, name):
    client = w.me if "issues" in path else w.board
    path = path.format(company=w.company.pk, instance=w.instance.pk)
    value = {"status": "todo", "priority": "low", "type": "review"}.get(name, "todo")
    if "connectors" in path:
        value = "pending" if "events" in path else "healthy"
    if "cases" in path and name == "status":
        value = "draft"
    assert client.get(f"{path}?{name}={','.join([value] * 50)}").status_code == 200
    assert_error(client.get(f"{path}?{name}={','.join([value] * 51)}"), 400, "invalid_filter", fields=[name])
    assert_error(client.get(f"{path}?{name}={'x' * 5000}"), 400, "invalid_filter", fields=[name])


def test_free_text_filters_are_bounded(w):
    assert_error(w.me.get(f"/api/companies/{w.company.pk}/issues?q={'a' * 5000}"), 400, "invalid_filter",
                 fields=["q"])
    assert_error(w.board.get(f"/api/companies/{w.company.pk}/cases?search={'a' * 5000}"), 400, "invalid_filter",
                 fields=["search"])


# --- found by the schema fuzzer ----------------------------------------------------------------------
def test_an_issue_blocking_itself_is_400_naming_blocker_id(w):
    before = db_snapshot()
    response = w.board.post(f"/api/issues/{w.issue.pk}/blockers", {"blockerId": str(w.issue.pk)}, format="json")
    assert_error(response, 400, "validation_error", fields=("blockerId",))
    assert_unchanged(before)
