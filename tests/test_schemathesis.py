"""Fuzzing the whole OpenAPI schema with schemathesis, in process (WSGI, no network).

Every operation of ``/api/schema/`` is exercised with generated requests (schemathesis' coverage
phase: boundary and invalid values; then its fuzzing phase: ``PAPERCLIP_FUZZ_EXAMPLES`` random
requests, 5 unless set; derandomized, so a run is reproducible), each sent as three principals:

* ``agent``: an agent's bearer key with its live run in ``X-Paperclip-Run-Id``;
* ``board``: the company owner's console session (with a CSRF token: SessionAuthentication
  enforces it on unsafe methods);
* ``anonymous``: no credentials (the webhook's signature is its only authentication).

Path parameters mostly name real objects of the principals' company (an issue, a case, a
connector with a link, a conflict and an event, ...), chosen from the generated case, so that
operations run beyond their 404s; the rest keep the generated value. Ids in valid bodies
(``agentId``, ``blockerId``, ``workflowId``, ...) are real half of the time. The webhook also gets
each fuzzed body signed with the connector's secret. Every request runs inside a savepoint that
is rolled back, so each one sees the same fixture data.

Checks: no 5xx (``not_a_server_error``), a documented status code, the documented content type and
response schema. The run never leaves the process (outbound connections other than loopback are
refused); the fixture connector talks to the in-memory fake tracker.

Longer runs: ``PAPERCLIP_FUZZ_EXAMPLES=200 .venv/bin/pytest tests/test_schemathesis.py -n auto``.
"""
import json
import os
import secrets
import socket
import zlib
from types import SimpleNamespace

import hypothesis
import pytest
import schemathesis
from django.contrib.auth import get_user_model
from django.core import signals
from django.db import close_old_connections, transaction
from django.test import Client
from django.utils import timezone
from schemathesis.checks import not_a_server_error
from schemathesis.core import NotSet
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from cases.handoffs import handoff_request
from cases.models import CaseIssueLink
from cases.services import case_create, workflow_definition_create
from connectors.choices import ConflictKind
from connectors.models import InboundEvent, TaskLink
from connectors.services import links as link_services
from issues.actors import RUN_HEADER, SYSTEM
from issues.choices import InteractionKind
from issues.models import Approval, ApprovalIssue, Issue
from issues.services.companies import agent_api_key_create
from issues.services.thread import comment_create, document_write, interaction_create
from paperclip.wsgi import application
from tests.connector_factories import SECRET, make_instance
from tests.connector_fakes import sign
from tests.connector_helpers import post_webhook
from tests.factories import (
    AgentFactory,
    CompanyFactory,
    GoalFactory,
    IssueFactory,
    MembershipFactory,
    ProjectFactory,
    RunFactory,
)

EXAMPLES = int(os.environ.get("PAPERCLIP_FUZZ_EXAMPLES", "5"))
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
PRINCIPALS = ("agent", "board", "anonymous")

CONFIG = schemathesis.Config.from_dict({
    "seed": 20260101,
    "generation": {
        "max-examples": EXAMPLES,
        "deterministic": True,
        "database": "none",
        # The principals' credentials are set by the test, never generated.
        "with-security-parameters": False,
    },
    "phases": {
        "examples": {"enabled": False},
        "stateful": {"enabled": False},
    },
})

schema = schemathesis.openapi.from_wsgi("/api/schema/", application, config=CONFIG)


# --- no network -------------------------------------------------------------------------------
def _loopback(address) -> bool:
    host = address[0] if isinstance(address, tuple) else address
    return isinstance(host, str) and (host in ("localhost", "::1") or host.startswith("127."))


@pytest.fixture
def no_network(monkeypatch):
    """Name lookups and connections beyond loopback fail (the test must never reach a network)."""
    connect, getaddrinfo = socket.socket.connect, socket.getaddrinfo

    def guarded_connect(sock, address):
        if sock.family != socket.AF_UNIX and not _loopback(address):
            raise ConnectionRefusedError(f"test_schemathesis: no network beyond loopback ({address!r})")
        return connect(sock, address)

    def guarded_getaddrinfo(host, *args, **kwargs):
        if host is not None and not _loopback(host.decode() if isinstance(host, bytes) else str(host)):
            raise socket.gaierror(socket.EAI_NONAME, f"test_schemathesis: no name lookups ({host!r})")
        return getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    monkeypatch.setattr(socket, "getaddrinfo", guarded_getaddrinfo)


@pytest.fixture
def in_process_wsgi(world):
    """Django's test client keeps the test's connection across requests (and reconnects the
    handlers after each of its own requests, e.g. while the world is built); so does this."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


# --- the company the principals work in -------------------------------------------------------
def build_world(capture):
    company = CompanyFactory(issue_prefix="FZ", name="Fuzz Co", enable_cases=True)
    user = get_user_model()(username="fuzz-owner")
    user.set_unusable_password()
    user.save()
    MembershipFactory(company=company, user=user, role="owner")
    agent = AgentFactory(company=company, name="fuzz-engineer")
    _, raw_key = agent_api_key_create(agent=agent)
    run = RunFactory(agent=agent, status="running", started_at=timezone.now())
    project, goal = ProjectFactory(company=company), GoalFactory(company=company)
    todo = IssueFactory(company=company, title="A todo issue", project=project, goal=goal)
    wip = IssueFactory(company=company, title="Work in progress", status="in_progress", assignee_agent=agent,
                       checkout_run=run, execution_run=run, execution_locked_at=timezone.now(),
                       started_at=timezone.now())
    child = IssueFactory(company=company, title="A child", parent=wip, assignee_agent=agent)
    document_write(actor=SYSTEM, issue=todo, key="plan", body="The plan", title="Plan")
    document_write(actor=SYSTEM, issue=wip, key="plan", body="The plan of the work", title="Plan")
    comment_create(actor=SYSTEM, issue=wip, body="A comment")
    interaction = interaction_create(actor=SYSTEM, issue=todo, kind=InteractionKind.REQUEST_CONFIRMATION,
                                     title="Confirm the plan", document_key="plan")
    approval = Approval.objects.create(company=company, title="An approval")
    ApprovalIssue.objects.create(approval=approval, issue=todo)
    workflow = workflow_definition_create(actor=SYSTEM, company=company, name="Review",
                                          prompt="# Review\n\nRead, then hand on.")
    case, _ = case_create(actor=SYSTEM, company=company, case_type="review", title="A case", kickoff="Kick off",
                          project_id=project.pk,
                          workflow_definition_id=workflow.pk, fields={"customer": "ACME", "n": 1})
    case2, _ = case_create(actor=SYSTEM, company=company, case_type="review", title="A closing case",
                           kickoff="k", workflow_document_text="w")
    Issue.objects.filter(pk__in=[case.primary_task_id, case2.primary_task_id]).update(assignee_agent=agent)
    handoff, _ = handoff_request(actor=SYSTEM, company=company, case=case2, to="done")
    CaseIssueLink.objects.create(company=company, case=case, issue=todo, role="work")
    instance, store = make_instance(company, name="Fuzz tracker", triage_agent_id=agent.pk)
    task = store.add_task(1)
    body, _ = store.delivery("task", task["id"])
    post_webhook(Client(), instance, body, capture=capture)
    link = TaskLink.objects.get(instance=instance)
    Issue.objects.filter(pk=link.issue_id).update(assignee_agent=agent)
    conflict, _ = link_services.conflict_open(link=link, kind=ConflictKind.DELETION, detail="fuzz")
    event = InboundEvent.objects.get(instance=instance)
    InboundEvent.objects.filter(pk=event.pk).update(status="parked")
    store.add_task(2)  # not linked yet: import and manual link have something to find

    revision = wip.documents.get(key="plan").latest_revision_id
    body_values = {
        "agentId": [agent.pk], "assigneeAgentId": [agent.pk], "triageAgentId": [agent.pk], "to": [agent.pk, "done"],
        "issueId": [todo.pk, wip.pk], "blockerId": [todo.pk, child.pk], "parentId": [wip.pk, todo.pk],
        "caseId": [case.pk, case2.pk], "parentCaseId": [case2.pk], "workflowId": [workflow.pk],
        "workflowDefinitionId": [workflow.pk], "projectId": [project.pk], "goalId": [goal.pk],
        "baseRevisionId": [revision], "documentRevisionId": [revision],
    }
    session = Client()
    session.force_login(user)
    csrf = secrets.token_hex(16)
    issues = [wip.pk, todo.pk, wip.identifier, case.primary_task_id, link.issue_id, child.pk]
    path_values = {
        "company_id": [company.pk],
        "issue_id": issues,
        "key": ["plan", "workflow"],
        "agent_id": [agent.pk],
        "interaction_id": [interaction.pk],
        "approval_id": [approval.pk],
        "run_id": [run.pk],
        "case_id": [case.pk, case.identifier, case2.pk],
        "definition_id": [workflow.pk],
        "handoff_id": [handoff.pk],
        "instance_id": [instance.pk],
        "link_id": [link.pk],
        "event_id": [event.pk],
        "conflict_id": [conflict.pk],
    }
    return SimpleNamespace(
        path_values={name: [str(v) for v in values] for name, values in path_values.items()},
        body_values={name: [str(v) for v in values] for name, values in body_values.items()},
        headers={
            "agent": {"Authorization": f"Bearer {raw_key}", RUN_HEADER: str(run.pk)},
            "board": {"X-CSRFToken": csrf, RUN_HEADER: str(run.pk)},
            "anonymous": {},
        },
        cookies={
            "agent": {},
            "board": {"sessionid": session.cookies["sessionid"].value, "csrftoken": csrf},
            "anonymous": {},
        },
    )


@pytest.fixture
def world(db, django_capture_on_commit_callbacks, no_network):
    return build_world(django_capture_on_commit_callbacks)


def digest(case) -> int:
    """A stable number from the generated case, taken before any real id is put in (the ids differ
    from run to run; str hashes are salted): every choice below is reproducible."""
    body = None if isinstance(case.body, NotSet) else case.body  # its repr carries an address
    text = repr((case.path_parameters, case.query, case.headers, body))
    return zlib.crc32(text.encode("utf-8", "surrogatepass"))


def pick(number: int, name: str) -> int:
    return zlib.crc32(f"{number}:{name}".encode())


def with_real_objects(case, world, number):
    """Three in four path parameters name a real object of the principals' company, picked by the
    generated case; the rest keep the generated value. Ids in bodies likewise, one in two."""
    for name in list(case.path_parameters or {}):
        choices, chosen = world.path_values.get(name), pick(number, name)
        if choices and chosen % 4:
            case.path_parameters[name] = choices[(chosen // 4) % len(choices)]
    # Ids in valid JSON bodies: half of them name a real object too; an issue id is sometimes the
    # issue of the path itself (self-references).
    if isinstance(case.body, dict) and case.meta is not None and case.meta.generation.mode.value == "positive":
        path_issue = (case.path_parameters or {}).get("issue_id")
        for name in list(case.body):
            choices, chosen = world.body_values.get(name), pick(number, "body:" + name)
            if choices and chosen % 2:
                if name in ("issueId", "blockerId", "parentId") and path_issue:
                    choices = [path_issue, *choices]
                case.body[name] = choices[(chosen // 2) % len(choices)]


def principals_for(case, number):
    """Fuzzing cases go to all three principals; the (many, deterministic) coverage cases to the
    agent or the board user in turn, picked by the case's content."""
    if case.meta is None or case.meta.phase.name.value != "coverage":
        return PRINCIPALS
    return (PRINCIPALS[number % 2],)


def signed_delivery(case):
    """The webhook case again with its body as raw bytes signed with the fixture connector's secret
    (the fake tracker's X-Fake-Signature), so the delivery gets past signature verification."""
    if isinstance(case.body, bytes | bytearray):
        raw = bytes(case.body)
    elif isinstance(case.body, NotSet):
        raw = b""
    else:
        raw = json.dumps(case.body).encode()
    signed = case.operation.Case(path_parameters=dict(case.path_parameters), body=raw,
                                 media_type="application/octet-stream")
    return signed, {"X-Fake-Signature": sign(SECRET, raw)}


def send_and_check(case, headers, cookies=None):
    """One request in a savepoint that is rolled back (every request sees the fixture data; on
    PostgreSQL a failed statement cannot poison the requests after it), then the checks."""
    savepoint = transaction.savepoint()
    try:
        response = case.call(headers=headers, cookies=cookies)
    finally:
        transaction.savepoint_rollback(savepoint)
    case.validate_response(response, checks=CHECKS, headers=headers)


@schema.parametrize()
@hypothesis.settings(suppress_health_check=list(hypothesis.HealthCheck), deadline=None)
def test_api_conforms_to_its_schema(case, world, in_process_wsgi):
    number = digest(case)
    with_real_objects(case, world, number)
    principals = principals_for(case, number)
    for principal in principals:
        send_and_check(case, world.headers[principal], world.cookies[principal])
    if case.operation.path.endswith("/webhook") and principals == PRINCIPALS:
        send_and_check(*signed_delivery(case))
