"""Connector agent tools (§10.1, §11.3) over the agent REST API, against the GitHub-compatible
sandbox over real HTTP: an agent lists and resolves the conflicts of its own checked-out issue through
the same service and audit as the board (unlink stays with board users), and comments on the linked
external task through the outbound write engine, once per idempotency key, under the link's policy."""
import pytest
from rest_framework.test import APIClient

from connectors.models import Conflict, OutboundEffect, TaskLink
from issues.models import ActivityLog
from tests.factories import CompanyFactory, MembershipFactory, RunFactory
from tests.test_connectors_outbound import (  # noqa: F401
    coder, forward, instance, linked, marked, open_title_conflict)

TOOLS = "/api/agent-tools/connector"


@pytest.fixture
def worker(coder, make_agent_client):
    """The assignee's client, with a running run that checked the linked issue out."""
    return make_agent_client(coder)


@pytest.fixture
def checked_out(linked, worker, django_capture_on_commit_callbacks):
    number, link = linked
    assert link.issue.assignee_agent_id == worker.agent.pk  # routed to the coder at import
    with django_capture_on_commit_callbacks(execute=True):
        got = worker.post(f"/api/issues/{link.issue.pk}/checkout",
                          {"agentId": str(worker.agent.pk), "expectedStatuses": ["todo", "backlog"]}, format="json")
    assert got.status_code == 200, got.content
    return number, TaskLink.objects.select_related("issue").get(pk=link.pk)


@pytest.fixture
def title_conflict(checked_out, github_sandbox, instance, django_capture_on_commit_callbacks):
    """The title changed on both sides since the base: one open conflict on the agent's issue."""
    number, link = checked_out
    conflict = open_title_conflict(github_sandbox, instance, django_capture_on_commit_callbacks, number, link)
    return number, TaskLink.objects.select_related("issue").get(pk=link.pk), conflict


def resolve(client, conflict, action, key, **extra):
    return client.post(f"{TOOLS}/conflicts/{conflict.pk}/resolve",
                       {"action": action, "idempotencyKey": key, **extra}, format="json")


def comment(client, link, body, key):
    return client.post(f"{TOOLS}/links/{link.pk}/comment", {"body": body, "idempotencyKey": key}, format="json")


def error(response):
    return error_of(response)


# --- conflicts ---------------------------------------------------------------------------------------


def test_the_agent_lists_the_open_conflicts_of_its_issue(title_conflict, worker):
    _, link, conflict = title_conflict
    for query in (f"?issue={link.issue.identifier}", f"?issue={link.issue.pk}", ""):
        rows = worker.get(f"{TOOLS}/conflicts{query}")
        assert rows.status_code == 200, rows.content
        assert [(r["id"], r["field"], r["externalValue"], r["paperclipValue"], r["issueId"]) for r in rows.json()] == [
            (str(conflict.pk), "title", "Tracker title", "Paperclip title", str(link.issue.pk))]


@pytest.mark.parametrize("action, extra, title, tracker_title", [
    ("keep_external", {}, "Tracker title", "Tracker title"),
    ("merge_manual", {"mergedValue": "Merged title"}, "Merged title", "Merged title"),
    ("dismiss", {}, "Paperclip title", "Tracker title"),
])
def test_the_agent_resolves_a_conflict_on_its_own_issue(
        title_conflict, worker, github_sandbox, instance, action, extra, title, tracker_title,
        django_capture_on_commit_callbacks):
    number, link, conflict = title_conflict
    capture = django_capture_on_commit_callbacks
    start = len(github_sandbox.deliveries)
    with capture(execute=True):
        got = resolve(worker, conflict, action, f"res-{action}", **extra)
    assert got.status_code == 200, got.content
    body = got.json()
    assert (body["status"], body["resolution"], body["linkStatus"]) == (
        "dismissed" if action == "dismiss" else "resolved", action, "healthy")
    assert body["resolvedByUserId"] is None and body["resolutionKey"] == f"res-{action}"
    link.refresh_from_db()
    link.issue.refresh_from_db()
    assert link.issue.title == title
    # the base advanced on both sides, so the same divergence is never detected again (the external
    # side is what the tracker showed, or what the write engine then wrote there)
    assert link.base_snapshot["external"]["title"] in {"Tracker title", tracker_title}
    assert link.base_snapshot["paperclip"]["title"] == title
    assert github_sandbox.issue(number)["title"] == tracker_title  # merge_manual wrote the tracker, once
    forward(github_sandbox, instance, capture, start=start)  # our own writes come back: echoes
    assert not Conflict.objects.filter(status="open").exists()
    # audited like the board's resolution, attributed to the agent and its run
    entry = ActivityLog.objects.get(action="connector.conflict_resolved")
    assert (entry.actor_type, entry.actor_agent_id, entry.actor_user_id, entry.run_id) == (
        "agent", worker.agent.pk, None, worker.run.pk)
    assert (entry.details["action"], entry.details["idempotencyKey"]) == (action, f"res-{action}")
    assert entry.entity_id == str(link.pk)
    # the same request again is the recorded resolution; anything else is 409 conflict_not_open
    again = resolve(worker, conflict, action, f"res-{action}", **extra)
    assert again.status_code == 200 and again.json()["resolution"] == action
    late = resolve(worker, conflict, "keep_paperclip", "res-other")
    assert late.status_code == 409 and error(late)["code"] == "conflict_not_open"
    assert ActivityLog.objects.filter(action="connector.conflict_resolved").count() == 1


def test_unlink_is_reserved_to_board_users(title_conflict, worker):
    _, link, conflict = title_conflict
    got = resolve(worker, conflict, "unlink", "u-1")
    assert got.status_code == 403 and error(got)["code"] == "board_only"
    conflict.refresh_from_db()
    link.refresh_from_db()
    assert conflict.status == "open" and link.status == "conflict"


def test_an_agent_not_assigned_gets_403_and_changes_nothing(title_conflict, company, make_agent_client):
    _, link, conflict = title_conflict
    other = make_agent_client(company=company)  # same company, the issue is not theirs
    got = other.get(f"{TOOLS}/conflicts?issue={link.issue.identifier}")
    assert got.status_code == 403 and error(got)["code"] == "not_assignee"
    assert other.get(f"{TOOLS}/conflicts").json() == []
    got = resolve(other, conflict, "keep_external", "x-1")
    assert got.status_code == 403 and error(got)["code"] == "not_assignee"
    got = comment(other, link, "not mine", "x-2")
    assert got.status_code == 403 and error(got)["code"] == "not_assignee"
    conflict.refresh_from_db()
    assert conflict.status == "open"
    assert not OutboundEffect.objects.filter(source_id__startswith="agent-tool:").exists()


def test_writes_need_the_run_that_checked_the_issue_out(title_conflict, worker):
    _, link, conflict = title_conflict
    checkout_run = worker.run
    worker.use_run(RunFactory(agent=worker.agent))  # the same agent, another (live) run
    got = resolve(worker, conflict, "keep_external", "r-1")
    assert got.status_code == 409 and error(got)["code"] == "not_checkout_owner"
    got = comment(worker, link, "hello", "r-2")
    assert got.status_code == 409 and error(got)["code"] == "not_checkout_owner"
    worker.use_run(None)
    got = resolve(worker, conflict, "keep_external", "r-3")
    assert got.status_code == 401 and error(got)["code"] == "run_id_required"
    # reading needs no checkout
    assert worker.get(f"{TOOLS}/conflicts?issue={link.issue.pk}").status_code == 200
    worker.use_run(checkout_run)
    assert resolve(worker, conflict, "keep_external", "r-4").status_code == 200


def test_another_companys_conflict_link_and_issue_are_404(title_conflict, make_agent_client):
    _, link, conflict = title_conflict
    stranger = make_agent_client(company=CompanyFactory())
    for got in (resolve(stranger, conflict, "dismiss", "s-1"), comment(stranger, link, "hi", "s-2"),
                stranger.get(f"{TOOLS}/conflicts?issue={link.issue.pk}"),
                stranger.post(f"{TOOLS}/conflicts/00000000-0000-0000-0000-000000000000/resolve",
                              {"action": "dismiss", "idempotencyKey": "s-3"}, format="json")):
        assert got.status_code == 404, got.content
    conflict.refresh_from_db()
    assert conflict.status == "open"


def test_board_users_use_the_board_api_not_the_agent_tools(title_conflict, company):
    _, link, conflict = title_conflict
    board = APIClient()
    board.force_login(MembershipFactory(company=company, role="owner").user)
    for got in (board.get(f"{TOOLS}/conflicts"), resolve(board, conflict, "dismiss", "b-1"),
                comment(board, link, "hi", "b-2")):
        assert got.status_code == 403 and error(got)["code"] == "agent_only"


def test_invalid_resolutions_are_400(title_conflict, worker):
    _, _, conflict = title_conflict
    got = resolve(worker, conflict, "merge_manual", "m-1")
    assert got.status_code == 400 and "mergedValue" in error(got)["details"]
    got = worker.post(f"{TOOLS}/conflicts/{conflict.pk}/resolve", {"action": "dismiss"}, format="json")
    assert got.status_code == 400 and "idempotencyKey" in error(got)["details"]
    got = resolve(worker, conflict, "dismiss", "m-2", extra=1)
    assert got.status_code == 400 and "extra" in error(got)["details"]


# --- comments on the external task ---------------------------------------------------------------------


def test_the_agent_comments_on_the_external_task_once(
        checked_out, worker, github_sandbox, django_capture_on_commit_callbacks):
    number, link = checked_out
    before = len(marked(github_sandbox, number))
    text = "Reproduced on 1.4; the fix is in the config loader.\n\nPR to follow."
    with django_capture_on_commit_callbacks(execute=True):
        got = comment(worker, link, text, "c-1")
    assert got.status_code == 202, got.content
    assert (got.json()["kind"], got.json()["replayed"]) == ("comment", False)
    posted = marked(github_sandbox, number)[before:]
    assert len(posted) == 1
    assert text in posted[0]["body"]
    assert "coder via Paperclip" in posted[0]["body"] and link.issue.identifier in posted[0]["body"]
    effect = OutboundEffect.objects.get(pk=got.json()["id"])
    assert effect.status == "done" and effect.external_ref == str(posted[0]["id"])
    # a retry of the same call posts nothing more; the key cannot be reused for another text
    with django_capture_on_commit_callbacks(execute=True):
        again = comment(worker, link, text, "c-1")
    assert again.status_code == 202 and again.json()["id"] == effect.pk and again.json()["replayed"] is True
    assert len(marked(github_sandbox, number)) == before + 1
    reused = comment(worker, link, "something else", "c-1")
    assert reused.status_code == 409 and error(reused)["code"] == "idempotency_key_reused"
    entry = ActivityLog.objects.get(action="connector.agent_tool_comment")
    assert (entry.actor_agent_id, entry.run_id, entry.entity_id) == (worker.agent.pk, worker.run.pk, str(link.pk))
    assert entry.details["outboundEffectId"] == effect.pk and entry.details["idempotencyKey"] == "c-1"


def test_an_import_only_link_refuses_the_comment_with_its_reason(
        checked_out, worker, github_sandbox, django_capture_on_commit_callbacks):
    number, link = checked_out
    TaskLink.objects.filter(pk=link.pk).update(sync_mode="import_only")
    before = github_sandbox.comments_of(number)
    with django_capture_on_commit_callbacks(execute=True):
        got = comment(worker, link, "status update", "i-1")
    assert got.status_code == 409 and error(got)["code"] == "outbound_write_refused"
    assert error(got)["details"]["reason"] == "sync mode import_only"
    assert "import_only" in error(got)["message"]
    assert not OutboundEffect.objects.filter(source_id__startswith="agent-tool:").exists()
    assert not ActivityLog.objects.filter(action="connector.agent_tool_comment").exists()
    assert github_sandbox.comments_of(number) == before


def test_post_progress_comments_governs_the_comment_tool(
        checked_out, worker, github_sandbox, django_capture_on_commit_callbacks):
    number, link = checked_out
    # mirrorAgentComments (the automatic thread mirror) neither enables nor blocks the tool
    TaskLink.objects.filter(pk=link.pk).update(write_policy={"postProgressComments": False,
                                                             "mirrorAgentComments": True})
    got = comment(worker, link, "status update", "p-1")
    assert got.status_code == 409 and error(got)["details"]["reason"] == "postProgressComments is off"
    TaskLink.objects.filter(pk=link.pk).update(write_policy={"postProgressComments": True,
                                                             "mirrorAgentComments": False})
    before = len(marked(github_sandbox, number))
    with django_capture_on_commit_callbacks(execute=True):
        got = comment(worker, link, "status update", "p-1")
    assert got.status_code == 202
    assert len(marked(github_sandbox, number)) == before + 1


def test_a_queued_tool_comment_is_rechecked_when_it_is_delivered(
        checked_out, worker, github_sandbox, django_capture_on_commit_callbacks):
    from connectors.services.outbound import effect_deliver

    number, link = checked_out
    before = len(marked(github_sandbox, number))
    got = comment(worker, link, "status update", "late-1")  # queued; its delivery kick is not run
    assert got.status_code == 202
    TaskLink.objects.filter(pk=link.pk).update(write_policy={"postProgressComments": False})
    assert effect_deliver(effect_id=got.json()["id"]) == "cancelled"
    effect = OutboundEffect.objects.get(pk=got.json()["id"])
    assert effect.status == "cancelled" and "postProgressComments is off" in effect.error_message
    assert len(marked(github_sandbox, number)) == before


def test_comment_input_is_validated(checked_out, worker):
    _, link = checked_out
    got = comment(worker, link, "   ", "v-1")
    assert got.status_code == 400 and "body" in error(got)["details"]
    got = worker.post(f"{TOOLS}/links/{link.pk}/comment", {"body": "hi"}, format="json")
    assert got.status_code == 400 and "idempotencyKey" in error(got)["details"]


# --- the company boundary, in the form of tests/test_connectors_cross_company.py ------------------------
# AGENT_TOOL_CASES covers this module's routes there: both actors get the same 404 for another company's
# ids as for ids that do not exist, and nothing changes (the own-id check differs: these are agent tools).
from tests.test_connectors_cross_company import Case, KEY, client, ghost, s, send, snapshot, world  # noqa: E402,F401
from tests.test_errors import error_of  # noqa: E402

AGENT_TOOL_CASES = [
    Case("agent-tools-conflicts[issue]", "connector-agent-tools-conflicts", "GET",
         lambda o, t: (f"{TOOLS}/conflicts?issue={s(t.issue)}", None)),
    Case("agent-tools-conflicts[identifier]", "connector-agent-tools-conflicts", "GET",
         lambda o, t: (f"{TOOLS}/conflicts?issue={t.issue.identifier}", None)),
    Case("agent-tools-conflict-resolve", "connector-agent-tools-conflict-resolve", "POST",
         lambda o, t: (f"{TOOLS}/conflicts/{s(t.conflict)}/resolve", {"action": "dismiss", **KEY})),
    Case("agent-tools-link-comment", "connector-agent-tools-link-comment", "POST",
         lambda o, t: (f"{TOOLS}/links/{s(t.link)}/comment", {"body": "hello", **KEY})),
]


@pytest.mark.parametrize("who", ("board", "agent"))
@pytest.mark.parametrize("case", AGENT_TOOL_CASES, ids=lambda c: c.id)
def test_other_companys_ids_are_404_for_the_agent_tools(world, case, who):  # noqa: F811
    from django.urls import resolve as url_resolve

    from tests.test_cross_company import assert_error_shape

    c = client(world, who)
    path, body = case.build(world.a, world.b)
    assert url_resolve(path.split("?")[0]).url_name == case.route
    before = snapshot()
    response = send(c, case.method, path, body)
    assert assert_error_shape(response, 404)["code"] == "not_found"
    ghost_path, ghost_body = case.build(world.a, ghost())
    other = send(c, case.method, ghost_path, ghost_body)
    assert (other.status_code, other.json()) == (response.status_code, response.json())
    assert str(world.b.company.pk) not in response.content.decode()
    assert snapshot() == before
