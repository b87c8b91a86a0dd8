"""Waiting work wakes by itself (issue #13): blockers resolved, children finished, mentions and
answered interactions each wake the right agent once, through the wakeup service."""
import threading

import httpx
import pytest
from django.db import connection

from issues.models import ActivityLog, HeartbeatRun, Issue, IssueRelation, WakeupRequest
from issues.services.companies import agent_api_key_create
from tests.factories import AgentFactory, CompanyFactory, IssueFactory


def wakes(agent, reason):
    return list(WakeupRequest.objects.filter(agent=agent, reason=reason).order_by("created_at"))


def patch(client, issue, **body):
    response = client.patch(f"/api/issues/{issue.pk}", body, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def comment(client, issue, body):
    response = client.post(f"/api/issues/{issue.pk}/comments", {"body": body}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def block(board_client, blocked, *blockers):
    for blocker in blockers:
        assert board_client.post(f"/api/issues/{blocked.pk}/blockers", {"blockerId": str(blocker.pk)},
                                 format="json").status_code == 201


# --- blockers resolved -----------------------------------------------------------------------------

def test_last_blocker_done_returns_the_blocked_issue_to_todo_and_wakes_its_assignee(
        make_agent_client, board_client, company):
    worker = make_agent_client(company=company)
    owner = AgentFactory(company=company)
    blocker = IssueFactory(company=company, assignee_agent=worker.agent)
    waiting = IssueFactory(company=company, assignee_agent=owner, status="blocked")
    block(board_client, waiting, blocker)

    patch(worker, blocker, status="done")

    waiting.refresh_from_db()
    assert waiting.status == "todo"
    [wake] = wakes(owner, "issue_blockers_resolved")
    assert wake.issue_id == waiting.pk and wake.status == "claimed"
    assert wake.context == {"blockerIssueIds": [str(blocker.pk)], "resolvedBlockerId": str(blocker.pk)}
    run = board_client.get(f"/api/runs/{wake.run_id}").json()
    assert run["wakeReason"] == "issue_blockers_resolved" and run["issueId"] == str(waiting.pk)
    assert run["context"]["blockerIssueIds"] == [str(blocker.pk)]
    audit = ActivityLog.objects.get(entity_id=str(waiting.pk), action="issue.updated",
                                    details__changes__status=["blocked", "todo"])
    assert audit.actor_type == "system"


def test_one_of_two_blockers_done_keeps_the_issue_blocked_and_a_cancelled_one_counts_as_resolved(
        make_agent_client, board_client, company):
    worker = make_agent_client(company=company)
    owner = AgentFactory(company=company)
    first = IssueFactory(company=company, assignee_agent=worker.agent)
    second = IssueFactory(company=company, assignee_agent=worker.agent)
    waiting = IssueFactory(company=company, assignee_agent=owner, status="blocked")
    block(board_client, waiting, first, second)

    patch(worker, first, status="done")
    waiting.refresh_from_db()
    assert waiting.status == "blocked" and wakes(owner, "issue_blockers_resolved") == []

    patch(worker, second, status="cancelled")
    waiting.refresh_from_db()
    assert waiting.status == "todo"
    [wake] = wakes(owner, "issue_blockers_resolved")
    assert wake.context["blockerIssueIds"] == sorted([str(first.pk), str(second.pk)])
    assert wake.context["resolvedBlockerId"] == str(second.pk)
    # The woken owner can claim it: checkout treats the cancelled blocker as resolved too.
    owner_client = make_agent_client(owner)
    claimed = owner_client.post(f"/api/issues/{waiting.pk}/checkout",
                                {"agentId": str(owner.pk), "expectedStatuses": ["todo"]}, format="json")
    assert claimed.status_code == 200 and claimed.json()["status"] == "in_progress", claimed.content


def test_a_retried_finish_wakes_once(make_agent_client, board_client, company):
    worker = make_agent_client(company=company)
    owner = AgentFactory(company=company)
    blocker = IssueFactory(company=company, assignee_agent=worker.agent)
    waiting = IssueFactory(company=company, assignee_agent=owner, status="blocked")
    block(board_client, waiting, blocker)
    patch(worker, blocker, status="done")
    patch(worker, blocker, status="done")  # the same PATCH again changes nothing
    # Reopened and finished again while the dependent was blocked once more: back to todo, no second wake.
    patch(board_client, waiting, status="blocked")
    patch(worker, blocker, status="todo")
    patch(worker, blocker, status="done")
    waiting.refresh_from_db()
    assert waiting.status == "todo"
    assert len(wakes(owner, "issue_blockers_resolved")) == 1
    assert HeartbeatRun.objects.filter(agent=owner, issue=waiting).count() == 1


def test_an_open_blocker_does_not_wake_a_finished_dependent(make_agent_client, board_client, company):
    worker = make_agent_client(company=company)
    owner = AgentFactory(company=company)
    blocker = IssueFactory(company=company, assignee_agent=worker.agent)
    finished = IssueFactory(company=company, assignee_agent=owner, status="done")
    block(board_client, finished, blocker)
    patch(worker, blocker, status="done")
    assert Issue.objects.get(pk=finished.pk).status == "done" and not WakeupRequest.objects.filter(agent=owner).exists()


def test_a_dependent_that_was_not_marked_blocked_is_woken_without_a_status_change(
        make_agent_client, board_client, company):
    worker = make_agent_client(company=company)
    owner = AgentFactory(company=company)
    blocker = IssueFactory(company=company, assignee_agent=worker.agent)
    waiting = IssueFactory(company=company, assignee_agent=owner)  # todo: its checkout was refused meanwhile
    block(board_client, waiting, blocker)
    patch(worker, blocker, status="done")
    assert len(wakes(owner, "issue_blockers_resolved")) == 1
    assert not ActivityLog.objects.filter(entity_id=str(waiting.pk), action="issue.updated").exists()


@pytest.mark.django_db(transaction=True)
def test_block_parent_until_done_child_finished_wakes_the_parent_once_over_http(live_server, company):
    manager = AgentFactory(company=company, name="Mara", permissions={"canAssignTasks": True})  # she delegates
    worker = AgentFactory(company=company, name="Ivo")
    _, manager_key = agent_api_key_create(agent=manager)
    _, worker_key = agent_api_key_create(agent=worker)
    parent = IssueFactory(company=company, title="Ship the release", assignee_agent=manager)

    def api(key):
        return httpx.Client(base_url=f"{live_server.url}/api", headers={"Authorization": f"Bearer {key}"}, timeout=10)

    mara = api(manager_key)
    mara.headers["X-Paperclip-Run-Id"] = mara.post(f"/agents/{manager.pk}/wakeup", json={}).json()["runId"]
    created = mara.post(f"/companies/{company.pk}/issues", json={
        "title": "Write the changelog", "parentId": str(parent.pk), "assigneeAgentId": str(worker.pk),
        "blockParentUntilDone": True})
    assert created.status_code == 201
    child = created.json()
    assert mara.get(f"/issues/{parent.pk}").json()["status"] == "blocked"

    # The worker was woken by the assignment; it uses that run to check out and finish the child.
    [assigned] = wakes(worker, "issue_assigned")
    ivo = api(worker_key)
    ivo.headers["X-Paperclip-Run-Id"] = str(assigned.run_id)
    assert ivo.post(f"/issues/{child['id']}/checkout",
                    json={"agentId": str(worker.pk), "expectedStatuses": ["todo"]}).status_code == 200
    assert ivo.patch(f"/issues/{child['id']}", json={"status": "done", "comment": "Done."}).status_code == 200

    assert mara.get(f"/issues/{parent.pk}").json()["status"] == "todo"
    [resolved] = wakes(manager, "issue_blockers_resolved")
    [completed] = wakes(manager, "issue_children_completed")
    assert resolved.context["blockerIssueIds"] == [child["id"]]
    assert completed.context == {"childIssueIds": [child["id"]]}
    # Blockers first (a new queued run), then the children wake coalesces into that same run.
    assert (resolved.status, completed.status) == ("claimed", "coalesced")
    [run] = HeartbeatRun.objects.filter(agent=manager, issue=parent)
    assert run.pk == resolved.run_id == completed.run_id and run.status == "queued"


# --- children finished -----------------------------------------------------------------------------

def test_all_children_terminal_wakes_the_parent_once_per_set_of_children(make_agent_client, board_client, company):
    worker = make_agent_client(company=company)
    owner = AgentFactory(company=company)
    parent = IssueFactory(company=company, assignee_agent=owner)
    first = IssueFactory(company=company, parent=parent, assignee_agent=worker.agent)
    second = IssueFactory(company=company, parent=parent, assignee_agent=worker.agent)

    patch(worker, first, status="done")
    assert wakes(owner, "issue_children_completed") == []
    patch(worker, second, status="cancelled")
    [wake] = wakes(owner, "issue_children_completed")
    assert wake.issue_id == parent.pk and wake.context == {"childIssueIds": sorted([str(first.pk), str(second.pk)])}

    patch(worker, second, status="done")  # cancelled -> done: still the same set
    patch(worker, first, status="todo")
    patch(worker, first, status="done")  # reopened and re-done
    assert len(wakes(owner, "issue_children_completed")) == 1

    third = IssueFactory(company=company, parent=parent, assignee_agent=worker.agent)
    patch(worker, third, status="done")  # a child added later makes a new set
    assert [len(w.context["childIssueIds"]) for w in wakes(owner, "issue_children_completed")] == [2, 3]
    assert HeartbeatRun.objects.filter(agent=owner, issue=parent).count() == 1  # the second coalesced


def test_a_finished_parent_is_not_woken_by_its_children(make_agent_client, company):
    worker = make_agent_client(company=company)
    owner = AgentFactory(company=company)
    parent = IssueFactory(company=company, assignee_agent=owner, status="done")
    child = IssueFactory(company=company, parent=parent, assignee_agent=worker.agent)
    patch(worker, child, status="done")
    assert not WakeupRequest.objects.filter(agent=owner).exists()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="concurrent writers need PostgreSQL row locks")
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("blocked_by_children", [True, False])
def test_the_last_two_children_finished_at_once_wake_the_parent_exactly_once(make_agent_client, company,
                                                                             blocked_by_children):
    owner = AgentFactory(company=company)
    parent = IssueFactory(company=company, assignee_agent=owner, status="blocked" if blocked_by_children else "todo")
    workers = [make_agent_client(company=company) for _ in range(2)]
    children = [IssueFactory(company=company, parent=parent, assignee_agent=w.agent) for w in workers]
    if blocked_by_children:
        for child in children:
            IssueRelation.objects.create(company=company, issue=child, related_issue=parent, kind="blocks")
    barrier = threading.Barrier(2)
    codes = []

    def finish(worker, child):
        try:
            barrier.wait(timeout=30)
            codes.append(worker.patch(f"/api/issues/{child.pk}", {"status": "done"}, format="json").status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=finish, args=pair) for pair in zip(workers, children)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert codes == [200, 200]
    parent.refresh_from_db()
    assert parent.status == "todo"
    assert len(wakes(owner, "issue_blockers_resolved")) == int(blocked_by_children)
    assert len(wakes(owner, "issue_children_completed")) == 1
    assert HeartbeatRun.objects.filter(agent=owner, issue=parent).count() == 1


# --- mentions ------------------------------------------------------------------------------------

@pytest.fixture
def thread(make_agent_client, company):
    """An issue assigned to Grace; the commenting agent is Hopper; Bob, Ada and Ada Lovelace look on."""
    author = make_agent_client(company=company, name="Hopper")
    grace = AgentFactory(company=company, name="Grace")
    bob = AgentFactory(company=company, name="Bob")
    AgentFactory(company=company, name="Ada")
    lovelace = AgentFactory(company=company, name="Ada Lovelace")
    issue = IssueFactory(company=company, assignee_agent=grace)
    return author, issue, grace, bob, lovelace


def test_a_mention_wakes_a_bystander_with_the_comment_and_the_assignee_still_hears_of_it(thread):
    author, issue, grace, bob, _ = thread
    posted = comment(author, issue, "@bob, could you review this?")
    [wake] = wakes(bob, "issue_comment_mentioned")
    assert wake.issue_id == issue.pk and wake.comment_ids == [posted["id"]]
    assert wake.context == {"wakeCommentId": posted["id"]}
    assert HeartbeatRun.objects.get(pk=wake.run_id).context["wakeCommentId"] == posted["id"]
    assert len(wakes(grace, "issue_commented")) == 1 and wakes(grace, "issue_comment_mentioned") == []


def test_mentions_by_name_with_spaces_url_key_and_any_case(thread):
    author, issue, _, bob, lovelace = thread
    comment(author, issue, "Thanks @Ada Lovelace! And @BOB.")
    comment(author, issue, "cc @ada-lovelace")
    assert len(wakes(lovelace, "issue_comment_mentioned")) == 2
    assert len(wakes(bob, "issue_comment_mentioned")) == 1
    ada = lovelace.company.agents.get(name="Ada")
    assert wakes(ada, "issue_comment_mentioned") == []  # "@Ada Lovelace" names the longer name only


def test_code_emails_and_self_mentions_wake_nobody(thread):
    author, issue, grace, bob, _ = thread
    comment(author, issue, "Run `@bob deploy` first.")
    comment(author, issue, "```\n@bob\n```\n\n    @bob indented\n")
    comment(author, issue, "Mail bob@example.com, or @Hopper (that is me).")
    assert wakes(bob, "issue_comment_mentioned") == []
    assert not WakeupRequest.objects.filter(agent=author.agent).exists()
    assert len(wakes(grace, "issue_commented")) == 3


def test_mentioning_the_assignee_gives_one_wake_with_the_mention_reason(thread, board_client):
    _, issue, grace, _, _ = thread
    posted = comment(board_client, issue, "@Grace please pick this up")
    [wake] = WakeupRequest.objects.filter(agent=grace)
    assert (wake.reason, wake.comment_ids) == ("issue_comment_mentioned", [posted["id"]])


def test_another_companys_agent_is_never_woken_by_a_mention(thread):
    author, issue, _, _, _ = thread
    stranger = AgentFactory(company=CompanyFactory(), name="Zed")
    comment(author, issue, "@Zed, are you there?")
    assert not WakeupRequest.objects.filter(agent=stranger).exists()


# --- interactions answered -------------------------------------------------------------------------

def ask(agent_client, issue, **body):
    created = agent_client.post(f"/api/issues/{issue.pk}/interactions",
                                {"kind": "request_confirmation", "title": "Go?", **body}, format="json")
    assert created.status_code == 201, created.content
    return created.json()


@pytest.mark.parametrize("answer", ["accepted", "rejected"])
def test_an_answered_confirmation_wakes_the_agent_that_asked(make_agent_client, board_client, company, answer):
    asker = make_agent_client(company=company)
    issue = IssueFactory(company=company, assignee_agent=asker.agent)
    interaction = ask(asker, issue)
    assert board_client.post(f"/api/interactions/{interaction['id']}/respond", {"status": answer},
                             format="json").status_code == 200
    [wake] = wakes(asker.agent, "interaction_responded")
    assert wake.issue_id == issue.pk
    run = board_client.get(f"/api/runs/{wake.run_id}").json()
    assert run["wakeReason"] == "interaction_responded"
    assert (run["context"]["interactionId"], run["context"]["interactionStatus"]) == (interaction["id"], answer)


def test_an_expired_confirmation_still_wakes_the_agent_that_asked(make_agent_client, board_client, company):
    asker = make_agent_client(company=company)
    issue = IssueFactory(company=company, assignee_agent=asker.agent)
    v1 = board_client.put(f"/api/issues/{issue.pk}/documents/plan", {"body": "v1"}, format="json").json()
    interaction = ask(asker, issue, documentKey="plan")
    board_client.put(f"/api/issues/{issue.pk}/documents/plan", {"body": "v2", "baseRevisionId": v1["revisionId"]},
                     format="json")
    refused = board_client.post(f"/api/interactions/{interaction['id']}/respond", {"status": "accepted"},
                                format="json")
    assert refused.status_code == 409
    [wake] = wakes(asker.agent, "interaction_responded")
    assert wake.context == {"interactionId": interaction["id"], "interactionStatus": "expired"}


def test_assignment_and_comment_wakes_use_upstream_reason_names(board_client, company):
    agent = AgentFactory(company=company)
    created = board_client.post(f"/api/companies/{company.pk}/issues",
                                {"title": "T", "assigneeAgentId": str(agent.pk)}, format="json").json()
    issue = Issue.objects.get(pk=created["id"])
    comment(board_client, issue, "More detail")
    assert [w.reason for w in WakeupRequest.objects.filter(agent=agent).order_by("created_at")] == [
        "issue_assigned", "issue_commented"]

