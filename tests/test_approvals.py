"""Approvals (upstream Paperclip §5.3): an agent asks over the API, a board user decides (API or
console), the requesting agent is woken with the approval in its run context; a pending approval
and an open blocker keep tracker-driven (Symphony) dispatch waiting (§9.1.3)."""
import secrets

import httpx
import pytest
from django.test import Client
from django.urls import reverse

from connectors.services.symphony import dispatchable
from issues.actors import Actor
from issues.choices import ApprovalStatus
from issues.models import ActivityLog, Approval, ApprovalComment, ApprovalIssue, HeartbeatRun, WakeupRequest
from issues.services.approvals import approval_create, approval_decide
from issues.services.companies import agent_api_key_create
from issues.services.issues import relation_add
from issues.services.runs import run_finish
from tests.connector_factories import make_instance
from tests.factories import AgentFactory, CompanyFactory, IssueFactory, MembershipFactory, RunFactory
from tests.test_connectors_symphony import connector_wakes, deliver, imported
from tests.test_errors import assert_error, board_client_for


def request_body(issue, **extra):
    return {"type": "request_board_approval", "issueIds": [str(issue.pk)],
            "payload": {"title": "Buy a staging server", "summary": "CI is slow", "risks": ["cost"]}, **extra}


def create(client, company, body):
    return client.post(f"/api/companies/{company.pk}/approvals", body, format="json")


def decide(client, approval, verb, note=None):
    body = {} if note is None else {"decisionNote": note}
    return client.post(f"/api/approvals/{approval.pk}/{verb}", body, format="json")


@pytest.fixture
def asker(make_agent_client, company):
    """An agent (key + live run) working on an issue assigned to it."""
    client = make_agent_client(company=company, name="Ivo")
    client.issue = IssueFactory(company=company, title="Speed up CI", assignee_agent=client.agent)
    return client


@pytest.fixture
def pending(asker, company):
    """A pending approval the asker requested, linked to its issue (its run has ended meanwhile)."""
    approval = approval_create(actor=Actor(agent=asker.agent, run_header=str(asker.run.pk)), company=company,
                               type="request_board_approval", payload={"title": "Buy a server"},
                               issue_ids=[asker.issue.pk])
    run_finish(run=asker.run, status="succeeded")
    return approval


def requester_wake(agent, reason):
    return WakeupRequest.objects.get(agent=agent, reason=reason)


# --- end to end over real HTTP ----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_agent_requests_board_approves_with_a_note_and_the_agent_is_woken_with_the_approval(live_server, company):
    agent = AgentFactory(company=company, name="Ivo")
    _, key = agent_api_key_create(agent=agent)
    run = RunFactory(agent=agent)
    issue = IssueFactory(company=company, title="Speed up CI", assignee_agent=agent)
    other = IssueFactory(company=company, title="Related", status="done")
    api = httpx.Client(base_url=f"{live_server.url}/api", timeout=10,
                       headers={"Authorization": f"Bearer {key}", "X-Paperclip-Run-Id": str(run.pk)})

    created = api.post(f"/companies/{company.pk}/approvals", json={
        "type": "request_board_approval", "issueIds": [str(issue.pk), str(other.pk)],
        "payload": {"title": "Buy a staging server", "summary": "CI is slow", "recommendedAction": "buy"}})
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["status"] == "pending" and body["requestedByAgentId"] == str(agent.pk)
    assert body["title"] == "Buy a staging server" and body["issueIds"] == [str(issue.pk), str(other.pk)]
    assert body["decisionNote"] is None and body["decidedAt"] is None and body["requestedByUserId"] is None
    approval_id = body["id"]
    run_finish(run=run, status="succeeded")  # the agent exits and waits to be woken

    # A board user decides over HTTP with its console session (CSRF token as the SPA would send it).
    owner = MembershipFactory(company=company, role="owner").user
    session = Client()
    session.force_login(owner)
    csrf = secrets.token_hex(16)
    board = httpx.Client(base_url=f"{live_server.url}/api", timeout=10, headers={"X-CSRFToken": csrf},
                         cookies={"sessionid": session.cookies["sessionid"].value, "csrftoken": csrf})
    assert [a["id"] for a in board.get(f"/companies/{company.pk}/approvals", params={"status": "pending"}).json()] \
        == [approval_id]
    approved = board.post(f"/approvals/{approval_id}/approve", json={"decisionNote": "Go ahead, under 200/month."})
    assert approved.status_code == 200, approved.text
    decided = approved.json()
    assert decided["status"] == "approved" and decided["decisionNote"] == "Go ahead, under 200/month."
    assert decided["decidedByUserId"] == owner.pk and decided["decidedAt"]

    wake = requester_wake(agent, "approval_approved")
    assert wake.source == "automation" and wake.issue_id == issue.pk and wake.status == "claimed"
    new_run = HeartbeatRun.objects.get(pk=wake.run_id)
    assert new_run.wake_reason == "approval_approved" and new_run.issue_id == issue.pk
    assert new_run.context["approvalId"] == approval_id and new_run.context["approvalStatus"] == "approved"
    assert new_run.context["issueIds"] == [str(issue.pk), str(other.pk)]
    assert new_run.context["issueId"] == str(issue.pk) == new_run.context["taskId"]

    # The woken agent follows up with its new run: the approval and its issues.
    api.headers["X-Paperclip-Run-Id"] = str(new_run.pk)
    assert api.get(f"/approvals/{approval_id}").json()["status"] == "approved"
    assert {i["id"] for i in api.get(f"/approvals/{approval_id}/issues").json()} == {str(issue.pk), str(other.pk)}
    assert ActivityLog.objects.filter(entity_type="approval", entity_id=approval_id, action="approval.approved",
                                      actor_user=owner, details__decisionNote="Go ahead, under 200/month.").exists()


# --- decisions --------------------------------------------------------------------------------


@pytest.mark.parametrize("verb,status,reason", [("reject", "rejected", "approval_rejected"),
                                                ("request-revision", "revision_requested",
                                                 "approval_revision_requested")])
def test_reject_and_request_revision_wake_the_requester_with_their_reason(
        board_client, board_user, asker, pending, verb, status, reason):
    response = decide(board_client, pending, verb, note="Not like this")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == status and response.json()["decisionNote"] == "Not like this"
    pending.refresh_from_db()
    assert pending.status == status and pending.decided_by_user == board_user and pending.decided_at
    run = HeartbeatRun.objects.get(pk=requester_wake(asker.agent, reason).run_id)
    assert run.context["approvalStatus"] == status and run.context["approvalId"] == str(pending.pk)
    assert ActivityLog.objects.filter(entity_id=str(pending.pk), action=f"approval.{status}").count() == 1


def test_the_wake_names_the_first_open_issue_and_lists_every_linked_one(board_client, asker, company):
    done = IssueFactory(company=company, status="done")
    approval = approval_create(actor=Actor(agent=asker.agent, run_header=str(asker.run.pk)), company=company,
                               type="approve_ceo_strategy", payload={"plan": "x"},
                               issue_ids=[done.pk, asker.issue.pk])
    assert approval.title == "Approve ceo strategy"  # no payload title: the type in words
    decide(board_client, approval, "approve")
    wake = requester_wake(asker.agent, "approval_approved")
    assert wake.issue_id == asker.issue.pk and wake.status != "skipped"
    assert wake.context["issueIds"] == [str(done.pk), str(asker.issue.pk)] and wake.context["issueId"] == str(done.pk)


def test_an_agent_cannot_decide(asker, pending):
    for verb in ("approve", "reject", "request-revision"):
        assert_error(decide(asker, pending, verb), 403, "board_only")
    pending.refresh_from_db()
    assert pending.status == "pending" and not WakeupRequest.objects.filter(reason__startswith="approval_").exists()


def test_a_viewer_cannot_decide(company, pending):
    viewer = board_client_for(company, "viewer", "vera")
    assert_error(decide(viewer, pending, "approve"), 403, "read_only_role")
    pending.refresh_from_db()
    assert pending.status == "pending" and pending.decided_at is None
    assert viewer.get(f"/api/approvals/{pending.pk}").status_code == 200  # reading is fine


@pytest.mark.parametrize("start,verb,message", [
    ("rejected", "approve", "Only pending or revision requested approvals can be approved"),
    ("approved", "reject", "Only pending or revision requested approvals can be rejected"),
    ("revision_requested", "request-revision", "Only pending approvals can request revision"),
    ("cancelled", "approve", "Only pending or revision requested approvals can be approved"),
])
def test_a_decision_from_the_wrong_state_is_422_with_upstreams_message(board_client, pending, start, verb, message):
    Approval.objects.filter(pk=pending.pk).update(status=start)
    error = assert_error(decide(board_client, pending, verb), 422)
    assert error["message"] == message
    assert Approval.objects.get(pk=pending.pk).status == start


def test_approving_twice_returns_it_unchanged_and_wakes_once(board_client, asker, pending):
    first = decide(board_client, pending, "approve", note="yes").json()
    again = decide(board_client, pending, "approve", note="changed my mind?")
    assert again.status_code == 200 and again.json() == first
    assert WakeupRequest.objects.filter(agent=asker.agent, reason="approval_approved").count() == 1


def test_approve_and_reject_also_close_a_revision_request(board_client, pending):
    decide(board_client, pending, "request-revision")
    assert decide(board_client, pending, "reject").json()["status"] == "rejected"


# --- creating ---------------------------------------------------------------------------------


def test_bad_issue_ids_are_refused_before_anything_is_written(asker, company):
    foreign = IssueFactory(company=CompanyFactory())
    before = ActivityLog.objects.count()
    assert_error(create(asker, company, request_body(asker.issue, issueIds=[str(asker.issue.pk), str(foreign.pk)])),
                 404, fields=["issueIds"])
    assert_error(create(asker, company, request_body(asker.issue, issueIds=["not-a-uuid"])), 400, fields=["issueIds"])
    assert_error(create(asker, company, request_body(asker.issue, issueIds=[7])), 400, fields=["issueIds"])
    assert not Approval.objects.exists() and not ApprovalIssue.objects.exists()
    assert ActivityLog.objects.count() == before


@pytest.mark.parametrize("body,fields", [
    ({"payload": {}}, ["type"]),
    ({"type": "request_board_approval"}, ["payload"]),
    ({"type": "nope", "payload": {}}, ["type"]),
    ({"type": "generic", "payload": []}, ["payload"]),
    ({"type": "generic", "payload": {}, "title": "  "}, ["title"]),
    ({"type": "generic", "payload": {}, "idempotent": True}, ["idempotent"]),
])
def test_invalid_create_bodies_are_400_naming_the_field(asker, company, body, fields):
    assert_error(create(asker, company, body), 400, fields=fields)
    assert not Approval.objects.exists()


def test_agents_create_without_a_run_header_and_board_users_need_a_write_role(asker, company, board_client,
                                                                              board_user):
    ended = RunFactory(agent=asker.agent, status="succeeded", finished_at=asker.run.created_at)
    asker.use_run(ended)  # a header given must name a live run
    assert_error(create(asker, company, request_body(asker.issue)), 409, "run_not_live")
    asker.use_run(None)  # approvals are not run-scoped (ref §2.3)
    assert create(asker, company, request_body(asker.issue)).status_code == 201
    viewer = board_client_for(company, "viewer", "vera")
    assert_error(create(viewer, company, request_body(asker.issue)), 403, "read_only_role")
    created = create(board_client, company, {**request_body(asker.issue), "requestedByAgentId": str(asker.agent.pk)})
    assert created.status_code == 201
    assert created.json()["requestedByUserId"] == board_user.pk
    assert created.json()["requestedByAgentId"] == str(asker.agent.pk)
    foreign_agent = AgentFactory(company=CompanyFactory())
    foreign_requester = {**request_body(asker.issue), "requestedByAgentId": str(foreign_agent.pk)}
    assert_error(create(board_client, company, foreign_requester), 404, fields=["requestedByAgentId"])
    assert Approval.objects.count() == 2


def test_list_filters_by_status_and_puts_open_ones_first(board_client, company, asker, pending):
    done = approval_create(actor=Actor(user=MembershipFactory(company=company).user), company=company,
                           type="generic", payload={})
    Approval.objects.filter(pk=done.pk).update(status="approved")
    listed = board_client.get(f"/api/companies/{company.pk}/approvals").json()
    assert [a["id"] for a in listed] == [str(pending.pk), str(done.pk)]
    assert listed[0]["issueIds"] == [str(asker.issue.pk)]
    assert [a["id"] for a in board_client.get(f"/api/companies/{company.pk}/approvals?status=approved").json()] \
        == [str(done.pk)]
    assert_error(board_client.get(f"/api/companies/{company.pk}/approvals?status=maybe"), 400, fields=["status"])


def test_another_companys_approval_is_404(company, pending, asker):
    stranger_company = CompanyFactory()
    stranger = board_client_for(stranger_company, "owner", "sam")
    for path in (f"/api/approvals/{pending.pk}", f"/api/approvals/{pending.pk}/issues",
                 f"/api/companies/{company.pk}/approvals"):
        assert_error(stranger.get(path), 404)
    for verb in ("approve", "reject", "request-revision", "resubmit"):
        assert_error(decide(stranger, pending, verb), 404)
    assert_error(create(stranger, company, request_body(asker.issue)), 404)
    pending.refresh_from_db()
    assert pending.status == "pending" and Approval.objects.count() == 1


# --- resubmit -----------------------------------------------------------------------------------


def test_resubmit_after_a_revision_request(board_client, make_agent_client, company, asker, pending):
    resubmit = f"/api/approvals/{pending.pk}/resubmit"
    assert_error(board_client.post(resubmit, {}, format="json"), 422)  # still pending
    decide(board_client, pending, "request-revision", note="Add a cost estimate")
    wake = requester_wake(asker.agent, "approval_revision_requested")
    asker.use_run(HeartbeatRun.objects.get(pk=wake.run_id))  # the woken run revises and resubmits

    rival = make_agent_client(company=company)
    error = assert_error(rival.post(resubmit, {"payload": {"title": "mine"}}, format="json"), 403)
    assert error["message"] == "Only requesting agent can resubmit this approval"

    response = asker.post(resubmit, {"payload": {"title": "Buy a server", "costPerMonth": 180}}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "pending" and body["payload"]["costPerMonth"] == 180
    assert body["decisionNote"] is None and body["decidedAt"] is None and body["decidedByUserId"] is None
    # The earlier decision stays in the history; the board can now approve the new version.
    actions = list(ActivityLog.objects.filter(entity_type="approval", entity_id=str(pending.pk))
                   .order_by("created_at", "id").values_list("action", flat=True))
    assert actions == ["approval.created", "approval.revision_requested", "approval.resubmitted"]
    assert decide(board_client, pending, "approve").json()["status"] == "approved"
    assert_error(asker.post(resubmit, {}, format="json"), 422)


def test_board_users_may_resubmit_too(board_client, pending):
    decide(board_client, pending, "request-revision")
    response = board_client.post(f"/api/approvals/{pending.pk}/resubmit", {}, format="json")
    assert response.status_code == 200 and response.json()["payload"] == {"title": "Buy a server"}


# --- console ------------------------------------------------------------------------------------


def test_console_operator_approves_with_a_note_through_the_service(company, asker, pending):
    owner = MembershipFactory(company=company, role="owner").user
    client = Client()
    client.force_login(owner)
    listing = client.get(reverse("console:approval-list"))
    assert listing.status_code == 200 and "Buy a server" in listing.content.decode()
    page = client.get(reverse("console:approval-detail", args=[pending.pk])).content.decode()
    assert "Request revision" in page and asker.issue.identifier in page and "Ivo" in page

    response = client.post(reverse("console:approval-decide", args=[pending.pk]),
                           {"decision": "approve", "note": "Fine by me"}, follow=True)
    assert response.status_code == 200 and "approved" in response.content.decode()
    pending.refresh_from_db()
    assert pending.status == "approved" and pending.decision_note == "Fine by me" and pending.decided_by_user == owner
    assert requester_wake(asker.agent, "approval_approved").context["approvalId"] == str(pending.pk)
    history = client.get(reverse("console:approval-detail", args=[pending.pk])).content.decode()
    assert "approval.approved" in history and "Fine by me" in history and 'name="decision"' not in history
    assert "Buy a server" not in client.get(reverse("console:approval-list"), {"status": "pending"}).content.decode()
    assert "Buy a server" in client.get(reverse("console:approval-list"), {"status": "approved"}).content.decode()
    # Deciding again from the wrong state is a message, not a crash.
    again = client.post(reverse("console:approval-decide", args=[pending.pk]), {"decision": "request_revision"},
                        follow=True)
    assert "Only pending approvals can request revision" in again.content.decode()


def test_console_viewer_sees_no_buttons_and_cannot_post(company, pending):
    viewer = MembershipFactory(company=company, role="viewer").user
    client = Client()
    client.force_login(viewer)
    page = client.get(reverse("console:approval-detail", args=[pending.pk])).content.decode()
    assert 'name="decision"' not in page
    assert client.post(reverse("console:approval-decide", args=[pending.pk]), {"decision": "approve"}).status_code \
        == 403
    pending.refresh_from_db()
    assert pending.status == "pending"


def test_console_actions_need_csrf_and_other_companies_are_404(company, pending):
    owner = MembershipFactory(company=company, role="owner").user
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(owner)
    assert strict.post(reverse("console:approval-decide", args=[pending.pk]), {"decision": "approve"}).status_code \
        == 403
    stranger = Client()
    stranger.force_login(MembershipFactory(company=CompanyFactory(), role="owner").user)
    assert stranger.get(reverse("console:approval-detail", args=[pending.pk])).status_code == 404
    assert stranger.post(reverse("console:approval-decide", args=[pending.pk]), {"decision": "approve"}).status_code \
        == 404
    pending.refresh_from_db()
    assert pending.status == "pending"


# --- Symphony dispatch (§9.1.3) ---------------------------------------------------------------------


@pytest.fixture
def coder(company):
    return AgentFactory(company=company, name="coder", status="idle")


@pytest.fixture
def symphony(company, coder):
    return make_instance(company, triage_agent_id=coder.pk, default_run_mode="symphony_compatible",
                         rules=[{"kind": "default_route", "agentId": coder.pk}])


def test_a_pending_approval_keeps_tracker_dispatch_waiting(symphony, company, django_capture_on_commit_callbacks):
    instance, store = symphony
    capture = django_capture_on_commit_callbacks
    raw, link = imported(symphony, capture, number=1)
    owner = Actor(user=MembershipFactory(company=company, role="owner").user)
    approval = approval_create(actor=owner, company=company, type="request_board_approval", payload={},
                               issue_ids=[link.issue_id])
    store.update(raw["id"], state="doing")
    deliver(instance, store, raw["id"], capture)
    link.refresh_from_db()
    assert link.issue.status == "todo" and not dispatchable(link, link.issue)
    assert not connector_wakes().exists()
    approval_decide(actor=owner, approval=approval, status="revision_requested")
    assert not dispatchable(link, link.issue)  # a revision request still waits
    approval_decide(actor=owner, approval=approval, status="approved")
    assert dispatchable(link, link.issue)
    for state in ("todo", "doing"):  # the task becomes active again: now the assignee is woken
        store.update(raw["id"], state=state)
        deliver(instance, store, raw["id"], capture)
    assert connector_wakes().count() == 1


def test_an_open_blocker_keeps_tracker_dispatch_waiting(symphony, company, django_capture_on_commit_callbacks):
    instance, store = symphony
    capture = django_capture_on_commit_callbacks
    raw, link = imported(symphony, capture, number=1)
    blocker = IssueFactory(company=company, title="Migrate the database first")
    relation_add(actor=Actor(user=MembershipFactory(company=company, role="owner").user), blocker=blocker,
                 blocked=link.issue)
    store.update(raw["id"], state="doing")
    deliver(instance, store, raw["id"], capture)
    link.refresh_from_db()
    assert link.issue.status == "todo" and not dispatchable(link, link.issue)
    assert not connector_wakes().exists()
    blocker.status = "done"
    blocker.save(update_fields=["status"])
    assert dispatchable(link, link.issue)


# --- `comment` as an alias of decisionNote (issue #14) ------------------------------------------------


@pytest.mark.parametrize("verb,status", [("approve", "approved"), ("reject", "rejected"),
                                         ("request-revision", "revision_requested")])
def test_comment_is_accepted_as_the_decision_note(board_client, pending, verb, status):
    response = board_client.post(f"/api/approvals/{pending.pk}/{verb}", {"comment": "Sent as comment"},
                                 format="json")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == status and response.json()["decisionNote"] == "Sent as comment"
    pending.refresh_from_db()
    assert pending.decision_note == "Sent as comment"
    assert ActivityLog.objects.get(entity_id=str(pending.pk), action=f"approval.{status}").details["decisionNote"] \
        == "Sent as comment"


@pytest.mark.parametrize("body,note", [
    ({"decisionNote": "the note", "comment": "the alias"}, "the note"),  # decisionNote wins, as upstream
    ({"decisionNote": None, "comment": "the alias"}, "the alias"),  # a null note falls back to the alias
    ({"decisionNote": "", "comment": "the alias"}, None),  # an empty note is a note (none)
    ({"comment": None}, None),
])
def test_decision_note_wins_over_comment(board_client, pending, body, note):
    response = board_client.post(f"/api/approvals/{pending.pk}/approve", body, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["decisionNote"] == note


def test_an_overlong_or_non_string_comment_is_a_400_naming_it(board_client, pending):
    assert_error(board_client.post(f"/api/approvals/{pending.pk}/approve", {"comment": "x" * 20_001},
                                   format="json"), 400, fields=["comment"])
    assert_error(board_client.post(f"/api/approvals/{pending.pk}/approve", {"comment": {"a": 1}}, format="json"),
                 400, fields=["comment"])
    pending.refresh_from_db()
    assert pending.status == "pending"


# --- the status filter takes every approval status ----------------------------------------------------


def test_the_status_filter_takes_every_approval_status_and_refuses_anything_else(board_client, company):
    owner = Actor(user=MembershipFactory(company=company).user)
    by_status = {}
    for status in ApprovalStatus.values:
        approval = approval_create(actor=owner, company=company, type="generic", payload={})
        Approval.objects.filter(pk=approval.pk).update(status=status)
        by_status[status] = str(approval.pk)
    url = f"/api/companies/{company.pk}/approvals"
    for status, approval_id in by_status.items():
        response = board_client.get(url, {"status": status})
        assert response.status_code == 200, (status, response.content)
        assert [a["id"] for a in response.json()] == [approval_id]
    for bad in ("Pending", "pending,approved", "done", " pending"):
        assert_error(board_client.get(url, {"status": bad}), 400, fields=["status"])
    assert len(board_client.get(url).json()) == len(ApprovalStatus.values)


# --- comments (issue #14) ---------------------------------------------------------------------------


def comments_url(approval):
    return f"/api/approvals/{approval.pk}/comments"


COMMENT_FIELDS = {"id", "companyId", "approvalId", "authorAgentId", "authorUserId", "body", "createdAt", "updatedAt"}


@pytest.mark.django_db(transaction=True)
def test_agent_and_board_discuss_an_approval_over_http_and_the_board_decides_with_comment(live_server, company):
    agent = AgentFactory(company=company, name="Ivo")
    _, key = agent_api_key_create(agent=agent)
    run = RunFactory(agent=agent)
    issue = IssueFactory(company=company, assignee_agent=agent)
    api = httpx.Client(base_url=f"{live_server.url}/api", timeout=10,
                       headers={"Authorization": f"Bearer {key}", "X-Paperclip-Run-Id": str(run.pk)})
    approval_id = api.post(f"/companies/{company.pk}/approvals", json={
        "type": "request_board_approval", "payload": {"title": "Buy a server"}, "issueIds": [str(issue.pk)]}).json()["id"]
    posted = api.post(f"/approvals/{approval_id}/comments", json={"body": "Quote attached: 180/month."})
    assert posted.status_code == 201, posted.text
    mine = posted.json()
    assert set(mine) == COMMENT_FIELDS
    assert mine["approvalId"] == approval_id and mine["companyId"] == str(company.pk)
    assert mine["authorAgentId"] == str(agent.pk) and mine["authorUserId"] is None
    assert mine["body"] == "Quote attached: 180/month."

    owner = MembershipFactory(company=company, role="owner").user
    session = Client()
    session.force_login(owner)
    csrf = secrets.token_hex(16)
    board = httpx.Client(base_url=f"{live_server.url}/api", timeout=10, headers={"X-CSRFToken": csrf},
                         cookies={"sessionid": session.cookies["sessionid"].value, "csrftoken": csrf})
    reply = board.post(f"/approvals/{approval_id}/comments", json={"body": "Can it be 150?"})
    assert reply.status_code == 201, reply.text
    assert reply.json()["authorUserId"] == owner.pk and reply.json()["authorAgentId"] is None
    thread = api.get(f"/approvals/{approval_id}/comments").json()
    assert [(c["body"], c["authorAgentId"]) for c in thread] == [
        ("Quote attached: 180/month.", str(agent.pk)), ("Can it be 150?", None)]

    decided = board.post(f"/approvals/{approval_id}/approve", json={"comment": "Go, at 150."})
    assert decided.status_code == 200 and decided.json()["decisionNote"] == "Go, at 150."
    # Still open for discussion after the decision; every comment is audited.
    assert board.post(f"/approvals/{approval_id}/comments", json={"body": "Ordered."}).status_code == 201
    audited = ActivityLog.objects.filter(entity_type="approval", entity_id=approval_id,
                                         action="approval.comment_added").order_by("created_at", "id")
    assert [row.details["commentId"] for row in audited][:2] == [mine["id"], reply.json()["id"]]
    assert [(row.actor_agent_id, row.actor_user_id) for row in audited] == [
        (agent.pk, None), (None, owner.pk), (None, owner.pk)]


@pytest.mark.parametrize("body", [{}, {"body": ""}, {"body": "   \n"}, {"body": None}, {"body": ["x"]},
                                  {"body": "x" * 100_001}])
def test_a_comment_needs_a_body(board_client, pending, body):
    assert_error(board_client.post(comments_url(pending), body, format="json"), 400, fields=["body"])
    assert not ApprovalComment.objects.exists()


def test_unknown_comment_fields_are_refused(board_client, pending):
    assert_error(board_client.post(comments_url(pending), {"body": "x", "reopen": True}, format="json"), 400,
                 fields=["reopen"])
    assert not ApprovalComment.objects.exists()


def test_agents_comment_without_a_run_header_and_viewers_only_read(asker, pending, company, make_agent_client):
    # The asker's run has ended (the `pending` fixture): a header given must name a live run.
    assert_error(asker.post(comments_url(pending), {"body": "late"}, format="json"), 409, "run_not_live")
    viewer = board_client_for(company, "viewer", "vera")
    assert_error(viewer.post(comments_url(pending), {"body": "looks fine"}, format="json"), 403, "read_only_role")
    assert not ApprovalComment.objects.exists()
    assert not ActivityLog.objects.filter(action="approval.comment_added").exists()
    asker.use_run(None)  # approvals are not run-scoped (ref §2.3)
    assert asker.post(comments_url(pending), {"body": "no run"}, format="json").status_code == 201

    colleague = make_agent_client(company=company)  # any agent of the company may take part
    assert colleague.post(comments_url(pending), {"body": "I can help."}, format="json").status_code == 201
    assert [c["body"] for c in viewer.get(comments_url(pending)).json()] == ["no run", "I can help."]


def test_another_companys_approval_comments_are_404_and_nothing_is_written(pending, make_agent_client):
    stranger_company = CompanyFactory()
    stranger = board_client_for(stranger_company, "owner", "sam")
    outsider = make_agent_client(company=stranger_company)
    ApprovalComment.objects.create(company=pending.company, approval=pending, body="internal")
    for client in (stranger, outsider):
        assert_error(client.get(comments_url(pending)), 404)
        assert_error(client.post(comments_url(pending), {"body": "planted"}, format="json"), 404)
    assert list(ApprovalComment.objects.values_list("body", flat=True)) == ["internal"]
    assert not ActivityLog.objects.filter(action="approval.comment_added").exists()


def test_comment_list_is_oldest_first_paged_and_a_constant_number_of_queries(board_client, pending):
    from datetime import timedelta

    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    def rows(n, start):
        return [ApprovalComment(company=pending.company, approval=pending, body=f"c{start + i}") for i in range(n)]

    base = timezone.now() - timedelta(days=1)
    for i, comment in enumerate(ApprovalComment.objects.bulk_create(rows(10, 0))):
        # Distinct times, in the reverse of the insertion order: the list sorts by time, not by insertion.
        ApprovalComment.objects.filter(pk=comment.pk).update(created_at=base - timedelta(seconds=i))
    with CaptureQueriesContext(connection) as few:
        first = board_client.get(comments_url(pending))
    assert [c["body"] for c in first.json()] == [f"c{i}" for i in reversed(range(10))]  # oldest first
    ApprovalComment.objects.bulk_create(rows(9_990, 10), batch_size=1000)
    with CaptureQueriesContext(connection) as many:
        page = board_client.get(comments_url(pending))
    assert len(many) == len(few)
    assert len(page.json()) == 500  # the default limit (PAPERCLIP["API_LIST_DEFAULT_LIMIT"])
    window = board_client.get(comments_url(pending), {"limit": 3, "offset": 9_997}).json()
    assert len(window) == 3
    assert_error(board_client.get(comments_url(pending), {"limit": 0}), 400, fields=["limit"])
