"""Company boundary of every connectors route: another company's ids -> 404 in the one error shape,
nothing changed, the same answer as for ids that do not exist. A guard test compares the table
with the URL resolver, so a new connectors route without a case fails the suite."""
import uuid
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
from django.urls import resolve
from rest_framework.test import APIClient

from connectors.choices import ConflictKind
from connectors.models import (
    Conflict,
    ConnectorInstance,
    ConnectorSecret,
    InboundEvent,
    Intervention,
    LinkTransition,
    OutboundEffect,
    RoutingRule,
    SyncCursor,
    SyncError,
    TaskExport,
    TaskLink,
)
from connectors.services import links as link_services
from issues.models import ActivityLog, Comment, Issue
from issues.services.companies import agent_api_key_create
from tests.connector_factories import SECRET, make_instance
from tests.connector_helpers import post_webhook
from tests.conftest import AgentClient
from tests.factories import AgentFactory, CompanyFactory, MembershipFactory, ProjectFactory, RunFactory, UserFactory
from tests.test_cross_company import api_routes, assert_error_shape

MODELS = (ConnectorInstance, ConnectorSecret, TaskLink, LinkTransition, InboundEvent, SyncCursor, RoutingRule,
          Conflict, SyncError, OutboundEffect, Intervention, TaskExport, Issue, Comment, ActivityLog)


def snapshot():
    return {m.__name__: list(m.objects.order_by("pk").values()) for m in MODELS}


def build(prefix, capture):
    company = CompanyFactory(issue_prefix=prefix)
    agent = AgentFactory(company=company, name=f"{prefix.lower()}-agent")
    _, raw_key = agent_api_key_create(agent=agent)
    run = RunFactory(agent=agent)
    project = ProjectFactory(company=company)
    instance, store = make_instance(company, name=f"{prefix} tracker", triage_agent_id=agent.pk)
    raw = store.add_task(1)
    body, _ = store.delivery("task", raw["id"])
    post_webhook(APIClient(), instance, body, capture=capture)
    link = TaskLink.objects.get(instance=instance)
    conflict, _ = link_services.conflict_open(link=link, kind=ConflictKind.DELETION, detail="test")
    event = InboundEvent.objects.get(instance=instance)
    InboundEvent.objects.filter(pk=event.pk).update(status="parked")  # replayable
    store.add_task(2)  # not yet linked: for import and manual link
    from tests.factories import IssueFactory

    issue2 = IssueFactory(company=company, title=f"{prefix} unlinked issue")
    effect = OutboundEffect.objects.create(company=company, instance=instance, link=link, kind="comment",
                                           source_id="xc:parked", status="parked", payload={"lines": ["x"]})
    return SimpleNamespace(company=company, agent=agent, raw_key=raw_key, run=run, project=project,
                           instance=instance, store=store, link=link, event=event, issue=link.issue, issue2=issue2,
                           conflict=conflict, effect=effect)


def ghost():
    new = SimpleNamespace
    return SimpleNamespace(company=new(pk=uuid.uuid4()), agent=new(pk=uuid.uuid4()), project=new(pk=uuid.uuid4()),
                           instance=new(pk=uuid.uuid4()), link=new(pk=uuid.uuid4()), event=new(pk=987654321),
                           effect=new(pk=987654322),
                           conflict=new(pk=uuid.uuid4()),
                           issue=new(pk=uuid.uuid4(), identifier="ZZ-9999"),
                           issue2=new(pk=uuid.uuid4(), identifier="ZZ-9998"))


@pytest.fixture
def world(db, django_capture_on_commit_callbacks):
    a, b = build("CA", django_capture_on_commit_callbacks), build("CB", django_capture_on_commit_callbacks)
    user = MembershipFactory(company=a.company, role="owner", user=UserFactory(username="conn-board-a")).user
    return SimpleNamespace(a=a, b=b, user=user)


def client(world, who):
    if who == "agent":
        return AgentClient(world.a.agent, world.a.raw_key, world.a.run)
    c = APIClient()
    c.force_login(world.user)
    return c


@dataclass(frozen=True)
class Case:
    id: str
    route: str
    method: str
    build: object  # (own, target) -> (path, body)


def s(obj):
    return str(obj.pk)


KEY = {"idempotencyKey": "xc-1"}
CASES = [
    Case("instances-list", "connector-instances", "GET", lambda o, t: (f"/api/companies/{s(t.company)}/connectors",
                                                                       None)),
    Case("instances-create", "connector-instances", "POST",
         lambda o, t: (f"/api/companies/{s(t.company)}/connectors",
                       {"name": "planted", "provider": "fake_tracker", "containers": ["x/y"]})),
    Case("instances-create-projectId", "connector-instances", "POST",
         lambda o, t: (f"/api/companies/{s(o.company)}/connectors",
                       {"name": "planted", "provider": "fake_tracker", "projectId": s(t.project)})),
    Case("instances-create-triageAgentId", "connector-instances", "POST",
         lambda o, t: (f"/api/companies/{s(o.company)}/connectors",
                       {"name": "planted", "provider": "fake_tracker", "triageAgentId": s(t.agent)})),
    Case("instance-get", "connector-detail", "GET", lambda o, t: (f"/api/connectors/{s(t.instance)}", None)),
    Case("instance-patch", "connector-detail", "PATCH",
         lambda o, t: (f"/api/connectors/{s(t.instance)}", {"pollIntervalSeconds": 1})),
    Case("instance-patch-triageAgentId", "connector-detail", "PATCH",
         lambda o, t: (f"/api/connectors/{s(o.instance)}", {"triageAgentId": s(t.agent)})),
    Case("instance-patch-rule-agentId", "connector-detail", "PATCH",
         lambda o, t: (f"/api/connectors/{s(o.instance)}",
                       {"routingRules": [{"kind": "default_route", "agentId": s(t.agent)}]})),
    Case("instance-health", "connector-health", "GET", lambda o, t: (f"/api/connectors/{s(t.instance)}/health", None)),
    Case("instance-check-mapping", "connector-check-mapping", "POST",
         lambda o, t: (f"/api/connectors/{s(t.instance)}/check-mapping", None)),
    Case("instance-webhooks-register", "connector-webhooks-register", "POST",
         lambda o, t: (f"/api/connectors/{s(t.instance)}/webhooks/register", None)),
    Case("instance-webhooks-verify", "connector-webhooks-verify", "POST",
         lambda o, t: (f"/api/connectors/{s(t.instance)}/webhooks/verify", None)),
    Case("instance-handshake-window", "connector-handshake-window", "POST",
         lambda o, t: (f"/api/connectors/{s(t.instance)}/handshake-window", None)),
    Case("instance-verification-token", "connector-verification-token", "GET",
         lambda o, t: (f"/api/connectors/{s(t.instance)}/verification-token", None)),
    Case("instance-links", "connector-links", "GET", lambda o, t: (f"/api/connectors/{s(t.instance)}/links", None)),
    Case("instance-import", "connector-import", "POST",
         lambda o, t: (f"/api/connectors/{s(t.instance)}/import", {**KEY, "externalKey": "acme/tracker#2"})),
    Case("instance-manual-link", "connector-links", "POST",
         lambda o, t: (f"/api/connectors/{s(t.instance)}/links",
                       {**KEY, "externalKey": "acme/tracker#2", "issueId": s(t.issue2)})),
    Case("instance-manual-link-issueId", "connector-links", "POST",
         lambda o, t: (f"/api/connectors/{s(o.instance)}/links",
                       {**KEY, "externalKey": "acme/tracker#2", "issueId": s(t.issue2)})),
    Case("instance-manual-link-identifier", "connector-links", "POST",
         lambda o, t: (f"/api/connectors/{s(o.instance)}/links",
                       {**KEY, "externalKey": "acme/tracker#2", "issueId": t.issue2.identifier})),
    Case("instance-conflicts", "connector-conflicts", "GET",
         lambda o, t: (f"/api/connectors/{s(t.instance)}/conflicts", None)),
    Case("instance-events", "connector-events", "GET", lambda o, t: (f"/api/connectors/{s(t.instance)}/events", None)),
    Case("instance-pause", "connector-pause", "POST", lambda o, t: (f"/api/connectors/{s(t.instance)}/pause", KEY)),
    Case("instance-resume", "connector-resume", "POST", lambda o, t: (f"/api/connectors/{s(t.instance)}/resume", KEY)),
    Case("instance-credentials", "connector-credentials", "POST",
         lambda o, t: (f"/api/connectors/{s(t.instance)}/credentials", {**KEY, "credentials": {"value": "rotated-token"}})),
    Case("link-get", "connector-link-detail", "GET", lambda o, t: (f"/api/connector-links/{s(t.link)}", None)),
    Case("link-patch", "connector-link-detail", "PATCH",
         lambda o, t: (f"/api/connector-links/{s(t.link)}", {"closePolicy": "auto_close"})),
    Case("link-activity", "connector-link-activity", "GET",
         lambda o, t: (f"/api/connector-links/{s(t.link)}/activity", None)),
    Case("link-outbound", "connector-link-outbound", "GET",
         lambda o, t: (f"/api/connector-links/{s(t.link)}/outbound", None)),
    Case("link-pause", "connector-link-pause", "POST", lambda o, t: (f"/api/connector-links/{s(t.link)}/pause", KEY)),
    Case("link-resume", "connector-link-resume", "POST",
         lambda o, t: (f"/api/connector-links/{s(t.link)}/resume", KEY)),
    Case("link-resync", "connector-link-resync", "POST",
         lambda o, t: (f"/api/connector-links/{s(t.link)}/resync", KEY)),
    Case("link-unlink", "connector-link-unlink", "POST",
         lambda o, t: (f"/api/connector-links/{s(t.link)}/unlink", KEY)),
    Case("event-replay", "connector-event-replay", "POST",
         lambda o, t: (f"/api/connector-events/{s(t.event)}/replay", KEY)),
    Case("outbound-replay", "connector-outbound-replay", "POST",
         lambda o, t: (f"/api/connector-outbound/{s(t.effect)}/replay", KEY)),
    Case("instance-outbound-replay", "connector-outbound-replay-all", "POST",
         lambda o, t: (f"/api/connectors/{s(t.instance)}/outbound/replay", KEY)),
    Case("conflict-get", "connector-conflict-detail", "GET",
         lambda o, t: (f"/api/connector-conflicts/{s(t.conflict)}", None)),
    Case("conflict-resolve", "connector-conflict-resolve", "POST",
         lambda o, t: (f"/api/connector-conflicts/{s(t.conflict)}/resolve", {"action": "dismiss", **KEY})),
    Case("issue-links[uuid]", "connector-issue-links", "GET",
         lambda o, t: (f"/api/issues/{s(t.issue)}/connector-links", None)),
    Case("issue-links[identifier]", "connector-issue-links", "GET",
         lambda o, t: (f"/api/issues/{t.issue.identifier}/connector-links", None)),
    # export (§6.2.2): another company's issue, or another company's instance for an own issue
    Case("issue-export", "connector-issue-links", "POST",
         lambda o, t: (f"/api/issues/{s(t.issue2)}/connector-links", {**KEY, "instanceId": s(t.instance)})),
    Case("issue-export-instanceId", "connector-issue-links", "POST",
         lambda o, t: (f"/api/issues/{s(o.issue2)}/connector-links", {**KEY, "instanceId": s(t.instance)})),
]
# The webhook is authenticated by the provider signature only; its boundary test is below.
NOT_COMPANY_SCOPED = {"connector-webhook"}
ACTORS = ("board", "agent")


def send(c, method, path, body):
    call = getattr(c, method.lower())
    return call(path) if body is None else call(path, body, format="json")


def test_every_connector_route_and_method_has_a_cross_company_case():
    routes = {r for r in api_routes() if (r[0] or "").startswith("connector") and r[0] not in NOT_COMPANY_SCOPED}
    from tests.test_connectors_agent_tools import AGENT_TOOL_CASES  # their 404 cases live in that module

    covered = {(c.route, c.method) for c in CASES + AGENT_TOOL_CASES}
    assert not routes - covered, f"connector routes without a cross-company case: {sorted(routes - covered)}"
    assert not covered - routes, f"cases for routes that no longer exist: {sorted(covered - routes)}"


@pytest.mark.parametrize("who", ACTORS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_other_companys_connector_ids_are_not_found_and_change_nothing(world, case, who):
    c = client(world, who)
    path, body = case.build(world.a, world.b)
    assert resolve(path.split("?")[0]).url_name == case.route
    before = snapshot()
    response = send(c, case.method, path, body)
    error = assert_error_shape(response, 404)
    assert error["code"] == "not_found"
    assert snapshot() == before
    ghost_path, ghost_body = case.build(world.a, ghost())
    other = send(c, case.method, ghost_path, ghost_body)
    assert (other.status_code, other.json()) == (response.status_code, response.json())
    for text in (str(world.b.company.pk), world.b.instance.name, world.b.link.external_key):
        assert text not in response.content.decode()
    assert snapshot() == before


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_same_request_with_own_ids_is_not_a_404(world, case):
    path, body = case.build(world.a, world.a)
    response = send(client(world, "board"), case.method, path, body)
    assert 200 <= response.status_code < 300, (response.status_code, response.content[:400])
    agent_response = send(client(world, "agent"), case.method, path, body)
    assert agent_response.status_code == 403  # the connectors API is for board users


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_unauthenticated_connector_requests_are_401(world, case):
    path, body = case.build(world.a, world.a)
    before = snapshot()
    assert_error_shape(send(APIClient(), case.method, path, body), 401, "unauthorized")
    assert snapshot() == before


def test_webhook_signed_with_another_companys_secret_is_rejected(world):
    from tests.connector_fakes import FakeStore

    other_secret_instance, _ = make_instance(world.b.company, secret="company-b-secret", name="b2",
                                             store=FakeStore(container="beta/tracker"))
    raw = world.a.store.add_task(9)
    body, _ = world.a.store.delivery("task", raw["id"])
    before = InboundEvent.objects.count()
    response = post_webhook(APIClient(), world.a.instance, body, secret="company-b-secret")
    assert response.status_code == 401
    # B's instance does not accept A's container either, even correctly signed for B.
    response = post_webhook(APIClient(), other_secret_instance, body, secret="company-b-secret")
    assert response.status_code == 401
    assert InboundEvent.objects.count() == before
    assert post_webhook(APIClient(), world.a.instance, body, secret=SECRET).status_code == 202
