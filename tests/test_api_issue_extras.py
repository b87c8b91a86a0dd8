"""Issue extras of the upstream API (issue #14, reference §5.2): comment ``reopen`` / ``interrupt``,
child issues, ``DELETE /issues/{id}``, company labels and ``labelIds``, and the list filters."""
from datetime import timedelta

import pytest
import requests
from django.utils import timezone
from rest_framework.test import APIClient

from issues.choices import PRIORITY_RANK
from issues.models import (
    ActivityLog,
    Comment,
    Company,
    Document,
    ExecutionWorkspace,
    HeartbeatRun,
    Interaction,
    Issue,
    IssueRelation,
    Label,
    WakeupRequest,
)
from issues.services.companies import agent_api_key_create
from issues.services.runs import run_finish
from issues.services.thread import comment_create, document_write, interaction_create
from issues.actors import SYSTEM
from tests.queries import count_queries
from tests.test_errors import assert_error
from tests.factories import AgentFactory, CompanyFactory, IssueFactory, MembershipFactory, RunFactory

INTERRUPT_403 = "Only board users can interrupt active runs from issue comments"


def viewer_client(company):
    client = APIClient()
    client.force_login(MembershipFactory(company=company, role="viewer").user)
    return client


def audit(company, action):
    return ActivityLog.objects.filter(company=company, action=action).order_by("-created_at", "-id").first()


def comment(client, issue, **body):
    return client.post(f"/api/issues/{issue.pk}/comments", {"body": "Please look again", **body}, format="json")


def done_issue(company, assignee, **kwargs):
    return IssueFactory(company=company, status="done", completed_at=timezone.now(), assignee_agent=assignee,
                        **kwargs)


# --- comments: reopen ------------------------------------------------------------------------------------


def test_reopen_moves_a_done_issue_to_todo_audited_and_wakes_the_assignee(board_client, company):
    assignee = AgentFactory(company=company)
    issue = done_issue(company, assignee)

    response = comment(board_client, issue, reopen=True)

    assert response.status_code == 201, response.content
    issue.refresh_from_db()
    assert issue.status == "todo" and issue.completed_at is None
    row = audit(company, "issue.updated")
    assert row.entity_id == str(issue.pk) and row.actor_user is not None
    assert row.details["changes"]["status"] == ["done", "todo"]
    assert row.details["reopened"] is True and row.details["reopenedFrom"] == "done"
    assert audit(company, "comment.created").details == {"commentId": response.json()["id"], "reopened": True,
                                                         "reopenedFrom": "done"}
    wake = WakeupRequest.objects.get(agent=assignee)
    assert wake.reason == "issue_reopened_via_comment" and wake.status == "claimed"
    assert wake.comment_ids == [response.json()["id"]] and wake.run.status == "queued"


def test_reopen_of_a_cancelled_issue_clears_its_stamp(board_client, company):
    issue = IssueFactory(company=company, status="cancelled", cancelled_at=timezone.now())
    assert comment(board_client, issue, reopen=True).status_code == 201
    issue.refresh_from_db()
    assert (issue.status, issue.cancelled_at) == ("todo", None)


def test_a_comment_without_reopen_leaves_a_done_issue_done_and_its_assignee_asleep(board_client, company):
    assignee = AgentFactory(company=company)
    issue = done_issue(company, assignee)
    assert comment(board_client, issue).status_code == 201
    issue.refresh_from_db()
    assert issue.status == "done"
    assert not WakeupRequest.objects.filter(agent=assignee).exists()


def test_reopen_on_an_open_issue_is_an_ordinary_comment(board_client, company):
    assignee = AgentFactory(company=company)
    issue = IssueFactory(company=company, status="in_review", assignee_agent=assignee)
    assert comment(board_client, issue, reopen=True).status_code == 201
    issue.refresh_from_db()
    assert issue.status == "in_review"
    assert WakeupRequest.objects.get(agent=assignee).reason == "issue_commented"
    assert not ActivityLog.objects.filter(action="issue.updated").exists()


def test_an_agent_reopens_only_its_own_issues(agent_client, company):
    owner = AgentFactory(company=company)
    theirs = done_issue(company, owner)
    refused = comment(agent_client, theirs, reopen=True)
    assert_error(refused, 403, "not_your_issue")
    theirs.refresh_from_db()
    assert theirs.status == "done" and not Comment.objects.filter(issue=theirs).exists()

    mine = done_issue(company, owner, created_by_agent=agent_client.agent)
    assert comment(agent_client, mine, reopen=True).status_code == 201
    mine.refresh_from_db()
    assert mine.status == "todo"
    assert WakeupRequest.objects.get(agent=owner).reason == "issue_reopened_via_comment"


def test_patch_with_comment_and_reopen_reopens_and_an_explicit_status_wins(board_client, company):
    issue = done_issue(company, AgentFactory(company=company))
    response = board_client.patch(f"/api/issues/{issue.pk}", {"comment": "Not fixed", "reopen": True}, format="json")
    assert response.status_code == 200 and response.json()["status"] == "todo"
    posted = Comment.objects.get(issue=issue)
    assert posted.body == "Not fixed"
    assert response.json()["comment"]["id"] == str(posted.pk)  # upstream: the issue plus its comment
    assert board_client.patch(f"/api/issues/{issue.pk}", {"title": "t"}, format="json").json()["comment"] is None

    other = done_issue(company, None)
    response = board_client.patch(f"/api/issues/{other.pk}",
                                  {"comment": "Park it", "reopen": True, "status": "backlog"}, format="json")
    assert response.json()["status"] == "backlog"


def test_patch_flags_without_a_comment_are_refused(board_client, company):
    issue = done_issue(company, None)
    error = assert_error(board_client.patch(f"/api/issues/{issue.pk}", {"interrupt": True}, format="json"), 400,
                         fields=("interrupt",))
    assert error["message"] == "Interrupt is only supported when posting a comment"
    assert_error(board_client.patch(f"/api/issues/{issue.pk}", {"reopen": True}, format="json"), 400,
                 fields=("reopen",))
    assert_error(comment(board_client, issue, reopen="maybe"), 400, fields=("reopen",))
    issue.refresh_from_db()
    assert issue.status == "done" and not Comment.objects.exists()


# --- comments: interrupt ---------------------------------------------------------------------------------


def working_issue(company, **run_fields):
    assignee = AgentFactory(company=company)
    issue = IssueFactory(company=company, status="in_progress", assignee_agent=assignee, started_at=timezone.now())
    run = RunFactory(agent=assignee, issue=issue, status="running", started_at=timezone.now(), **run_fields)
    Issue.objects.filter(pk=issue.pk).update(checkout_run=run, execution_run=run, execution_locked_at=timezone.now())
    issue.refresh_from_db()
    return issue, run


def test_board_interrupt_stops_the_live_run_and_the_comment_starts_the_next(board_client, company):
    issue, run = working_issue(company)

    response = comment(board_client, issue, body="Stop, wrong branch", interrupt=True)

    assert response.status_code == 201, response.content
    run.refresh_from_db()
    assert run.status == "cancelled" and run.stop_reason == "issue_stop"
    issue.refresh_from_db()
    assert issue.checkout_run_id is None and issue.execution_run_id is None
    assert audit(company, "run.stop_requested").entity_id == str(run.pk)
    assert audit(company, "comment.created").details["interruptedRunIds"] == [str(run.pk)]
    following = HeartbeatRun.objects.exclude(pk=run.pk).get(agent=run.agent)
    assert following.status == "queued" and following.issue_id == issue.pk
    assert following.context["commentIds"] == [response.json()["id"]]


def test_interrupt_of_a_run_whose_process_is_being_killed_does_not_lose_the_comment(board_client, company):
    """A process run stays live until its adapter kills it: the comment must not join it."""
    issue, run = working_issue(company, pid=2**30)

    response = comment(board_client, issue, body="Stop", interrupt=True)

    assert response.status_code == 201
    run.refresh_from_db()
    assert run.status == "running" and run.stop_requested_at is not None
    following = HeartbeatRun.objects.exclude(pk=run.pk).get(agent=run.agent)
    assert following.status == "queued" and following.source_run_id == run.pk
    wake = WakeupRequest.objects.get(agent=run.agent)
    assert wake.status == "claimed" and wake.run_id == following.pk and wake.comment_ids == [response.json()["id"]]


def test_interrupt_is_board_only_and_changes_nothing_for_an_agent(make_agent_client, company):
    issue, run = working_issue(company)
    client = make_agent_client(run.agent, with_run=False).use_run(run)  # even the run's own agent

    error = assert_error(comment(client, issue, interrupt=True), 403, "board_only")

    assert error["message"] == INTERRUPT_403
    run.refresh_from_db()
    assert run.status == "running" and run.stop_requested_at is None
    assert not Comment.objects.filter(issue=issue).exists()
    patch = client.patch(f"/api/issues/{issue.pk}", {"comment": "x", "interrupt": True}, format="json")
    assert assert_error(patch, 403, "board_only")["message"] == INTERRUPT_403


def test_interrupt_without_a_live_run_is_just_a_comment(board_client, company):
    assignee = AgentFactory(company=company)
    issue = IssueFactory(company=company, assignee_agent=assignee)
    assert comment(board_client, issue, interrupt=True).status_code == 201
    assert WakeupRequest.objects.get(agent=assignee).reason == "issue_commented"


def test_viewer_cannot_interrupt(company):
    issue, run = working_issue(company)
    assert_error(comment(viewer_client(company), issue, interrupt=True), 403, "read_only_role")
    run.refresh_from_db()
    assert run.stop_requested_at is None


# --- children ---------------------------------------------------------------------------------------------


def children_url(issue, query=""):
    return f"/api/issues/{issue.pk}/children{query}"


def test_children_lists_direct_children_with_the_issue_list_filters(board_client, company):
    parent = IssueFactory(company=company)
    low = IssueFactory(company=company, parent=parent, priority="low", priority_rank=PRIORITY_RANK["low"])
    high = IssueFactory(company=company, parent=parent, priority="high", priority_rank=PRIORITY_RANK["high"])
    IssueFactory(company=company, parent=high)  # a grandchild is not a child
    IssueFactory(company=company, parent=parent, status="done")
    IssueFactory(company=company)

    rows = board_client.get(children_url(parent, "?status=todo")).json()
    assert [row["id"] for row in rows] == [str(high.pk), str(low.pk)]
    assert len(board_client.get(children_url(parent)).json()) == 3
    assert len(board_client.get(children_url(parent, "?limit=1")).json()) == 1
    assert_error(board_client.get(children_url(parent, "?limit=0")), 400, fields=("limit",))
    by_identifier = board_client.get(f"/api/issues/{parent.identifier}/children?status=todo").json()
    assert [row["id"] for row in by_identifier] == [str(high.pk), str(low.pk)]


def add_children(company, parent, count, label):
    start = company.issue_counter
    rows = [Issue(company=company, number=start + i + 1, identifier=f"{company.issue_prefix}-{start + i + 1}",
                  title=f"child {i}", status="todo", parent=parent) for i in range(count)]
    Issue.objects.bulk_create(rows, batch_size=500)
    Issue.labels.through.objects.bulk_create(
        [Issue.labels.through(issue_id=row.pk, label_id=label.pk) for row in rows], batch_size=500)
    Company.objects.filter(pk=company.pk).update(issue_counter=start + count)
    company.refresh_from_db(fields=["issue_counter"])


def test_children_list_query_count_is_the_same_for_10_and_10000_children(board_client, company):
    parent = IssueFactory(company=company)
    label = Label.objects.create(company=company, name="bulk", color="#000000")
    add_children(company, parent, 10, label)
    board_client.get(children_url(parent))  # warm the session

    small_queries, small = count_queries(board_client, children_url(parent))
    add_children(company, parent, 9990, label)
    large_queries, large = count_queries(board_client, children_url(parent, "?limit=1000"))

    assert len(small) == 10 and len(large) == 1000
    assert large_queries == small_queries
    assert large[0]["labels"] == [{"id": str(label.pk), "name": "bulk", "color": "#000000"}]
    assert all(row["parentId"] == str(parent.pk) for row in large)


def test_issue_list_with_labels_keeps_a_constant_query_count(board_client, company):
    label = Label.objects.create(company=company, name="bulk", color="#000000")
    parent = IssueFactory(company=company)
    add_children(company, parent, 10, label)
    url = f"/api/companies/{company.pk}/issues?labelId={label.pk}&limit=1000"
    board_client.get(url)
    small_queries, small = count_queries(board_client, url)
    add_children(company, parent, 990, label)
    large_queries, large = count_queries(board_client, url)
    assert (len(small), len(large)) == (10, 1000) and large_queries == small_queries


def test_board_creates_a_child_under_the_path_issue(board_client, company):
    parent = IssueFactory(company=company)
    response = board_client.post(children_url(parent), {"title": "Write tests", "priority": "high"}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["parentId"] == str(parent.pk) and body["priority"] == "high" and body["parentAdjusted"] is None
    assert audit(company, "issue.created").entity_id == body["id"]


def test_agent_child_of_a_child_goes_beside_it(agent_client, company):
    root = IssueFactory(company=company)
    child = IssueFactory(company=company, parent=root)
    body = agent_client.post(children_url(child), {"title": "deeper"}, format="json").json()
    assert body["parentId"] == str(root.pk)
    assert body["parentAdjusted"] == {"requestedParentId": str(child.pk), "parentId": str(root.pk),
                                      "reason": "max_depth"}


def test_child_create_takes_the_parent_from_the_path_and_can_block_it(board_client, company):
    parent = IssueFactory(company=company)
    other = IssueFactory(company=company)
    assert_error(board_client.post(children_url(parent), {"title": "x", "parentId": str(other.pk)}, format="json"),
                 400, fields=("parentId",))
    response = board_client.post(children_url(parent), {"title": "first", "blockParentUntilDone": True},
                                 format="json")
    assert response.status_code == 201
    parent.refresh_from_db()
    assert parent.status == "blocked"
    assert IssueRelation.objects.filter(issue_id=response.json()["id"], related_issue=parent).exists()
    assert_error(viewer_client(company).post(children_url(parent), {"title": "x"}, format="json"), 403,
                 "read_only_role")


# --- delete -------------------------------------------------------------------------------------------------


def test_board_deletes_an_issue_with_its_thread_and_keeps_its_children(board_client, company):
    label = Label.objects.create(company=company, name="bug", color="#ff0000")
    issue = IssueFactory(company=company, title="Obsolete")
    issue.labels.add(label)
    child = IssueFactory(company=company, parent=issue)
    dependent = IssueFactory(company=company, status="blocked")
    IssueRelation.objects.create(company=company, issue=issue, related_issue=dependent, kind="blocks")
    comment_create(actor=SYSTEM, issue=issue, body="note")
    document_write(actor=SYSTEM, issue=issue, key="plan", body="v1")
    interaction_create(actor=SYSTEM, issue=issue, kind="request_confirmation", title="ok?", document_key="plan")

    response = board_client.delete(f"/api/issues/{issue.identifier}")

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["id"] == str(issue.pk) and body["title"] == "Obsolete"
    assert body["labels"] == [{"id": str(label.pk), "name": "bug", "color": "#ff0000"}]
    assert not Issue.objects.filter(pk=issue.pk).exists()
    assert not Comment.objects.filter(issue_id=issue.pk).exists()
    assert not Document.objects.filter(issue_id=issue.pk).exists()
    assert not Interaction.objects.filter(issue_id=issue.pk).exists()
    assert not IssueRelation.objects.filter(related_issue=dependent).exists()
    child.refresh_from_db()
    dependent.refresh_from_db()
    assert child.parent_id is None and dependent.status == "blocked"
    assert Label.objects.filter(pk=label.pk).exists()
    row = audit(company, "issue.deleted")
    assert row.entity_id == str(issue.pk)
    assert row.details == {"identifier": issue.identifier, "title": "Obsolete", "status": "todo",
                           "childrenDetached": 1}
    assert_error(board_client.delete(f"/api/issues/{issue.pk}"), 404, "not_found")


def test_delete_of_an_issue_linked_to_a_tracker_item_is_refused_and_changes_nothing(board_client, company):
    from connectors.models import TaskLink
    from tests.connector_factories import make_instance

    issue = IssueFactory(company=company)
    comment_create(actor=SYSTEM, issue=issue, body="kept")
    instance, _ = make_instance(company)
    TaskLink.objects.create(company=company, instance=instance, provider_key=instance.provider_key, issue=issue,
                            external_task_id="T-7")

    error = assert_error(board_client.delete(f"/api/issues/{issue.pk}"), 409, "issue_delete_restricted")

    assert error["details"] == {"issueId": str(issue.pk), "linkedBy": ["task link"]}
    assert Issue.objects.filter(pk=issue.pk).exists() and Comment.objects.filter(issue=issue).exists()
    assert not ActivityLog.objects.filter(action="issue.deleted").exists()


def test_delete_is_board_only(agent_client, company):
    issue = IssueFactory(company=company, created_by_agent=agent_client.agent)
    assert assert_error(agent_client.delete(f"/api/issues/{issue.pk}"), 403, "board_only")["message"] == \
        "Board access required"
    assert_error(viewer_client(company).delete(f"/api/issues/{issue.pk}"), 403, "read_only_role")
    assert Issue.objects.filter(pk=issue.pk).exists()


def test_delete_is_refused_while_a_run_holds_or_works_the_issue(board_client, company):
    issue, run = working_issue(company)
    error = assert_error(board_client.delete(f"/api/issues/{issue.pk}"), 409, "issue_run_active")
    assert error["details"]["liveRunIds"] == [str(run.pk)]
    assert error["details"]["checkoutRunId"] == str(run.pk)

    queued_only = IssueFactory(company=company)
    queued = RunFactory(agent=run.agent, issue=queued_only, status="queued")
    assert_error(board_client.delete(f"/api/issues/{queued_only.pk}"), 409, "issue_run_active")
    assert Issue.objects.filter(pk__in=[issue.pk, queued_only.pk]).count() == 2
    assert not ActivityLog.objects.filter(action="issue.deleted").exists()

    # Stopped by the board (the documented way out), the issue can go.
    assert board_client.post(f"/api/issues/{issue.pk}/run/stop").status_code == 200
    run_finish(run=queued, status="cancelled")
    assert board_client.delete(f"/api/issues/{issue.pk}").status_code == 200
    assert board_client.delete(f"/api/issues/{queued_only.pk}").status_code == 200
    assert HeartbeatRun.objects.get(pk=run.pk).issue_id is None  # the run's history stays


# --- labels ---------------------------------------------------------------------------------------------------


def labels_url(company):
    return f"/api/companies/{company.pk}/labels"


def test_labels_are_created_listed_and_deleted(board_client, company):
    response = board_client.post(labels_url(company), {"name": " Bug ", "color": "#FF0000"}, format="json")
    assert response.status_code == 201, response.content
    label = response.json()
    assert set(label) == {"id", "companyId", "name", "color", "createdAt", "updatedAt"}
    assert (label["name"], label["color"], label["companyId"]) == ("Bug", "#FF0000", str(company.pk))
    assert audit(company, "label.created").details == {"name": "Bug", "color": "#FF0000"}
    board_client.post(labels_url(company), {"name": "api", "color": "#00ff00"}, format="json")
    Label.objects.create(company=CompanyFactory(), name="elsewhere", color="#000000")

    assert [row["name"] for row in board_client.get(labels_url(company)).json()] == ["Bug", "api"]
    assert len(board_client.get(labels_url(company) + "?limit=1").json()) == 1

    issue = IssueFactory(company=company)
    issue.labels.add(label["id"])
    deleted = board_client.delete(f"/api/labels/{label['id']}")
    assert deleted.status_code == 200 and deleted.json()["id"] == label["id"]
    assert audit(company, "label.deleted").entity_id == label["id"]
    assert issue.labels.count() == 0
    assert_error(board_client.delete(f"/api/labels/{label['id']}"), 404, "not_found")


def test_label_names_are_unique_ignoring_case_and_validated(board_client, company):
    assert board_client.post(labels_url(company), {"name": "bug", "color": "#ff0000"}, format="json").status_code == 201
    assert_error(board_client.post(labels_url(company), {"name": "BUG", "color": "#00ff00"}, format="json"), 409,
                 "label_exists", fields=("name",))
    # The same name in another company is fine.
    other = CompanyFactory()
    assert Label.objects.create(company=other, name="bug").pk
    assert_error(board_client.post(labels_url(company), {"name": "x", "color": "red"}, format="json"), 400,
                 fields=("color",))
    assert_error(board_client.post(labels_url(company), {"name": "x" * 49, "color": "#000000"}, format="json"), 400,
                 fields=("name",))
    assert_error(board_client.post(labels_url(company), {"name": "x"}, format="json"), 400, fields=("color",))
    assert_error(board_client.post(labels_url(company), {"name": "x", "color": "#000000", "icon": "y"},
                                   format="json"), 400, fields=("icon",))
    assert Label.objects.filter(company=company).count() == 1


def test_agents_manage_labels_from_a_run_and_viewers_only_read(agent_client, company):
    response = agent_client.post(labels_url(company), {"name": "agent-made", "color": "#123456"}, format="json")
    assert response.status_code == 201
    assert audit(company, "label.created").actor_agent_id == agent_client.agent.pk
    viewer = viewer_client(company)
    assert viewer.get(labels_url(company)).status_code == 200
    assert_error(viewer.post(labels_url(company), {"name": "v", "color": "#123456"}, format="json"), 403,
                 "read_only_role")
    assert_error(viewer.delete(f"/api/labels/{response.json()['id']}"), 403, "read_only_role")
    assert agent_client.delete(f"/api/labels/{response.json()['id']}").status_code == 200


def test_issue_create_and_patch_carry_label_ids(board_client, company):
    bug = Label.objects.create(company=company, name="bug", color="#ff0000")
    api = Label.objects.create(company=company, name="api", color="#00ff00")
    response = board_client.post(f"/api/companies/{company.pk}/issues",
                                 {"title": "Labelled", "labelIds": [str(bug.pk), str(api.pk)]}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["labels"] == [{"id": str(api.pk), "name": "api", "color": "#00ff00"},
                              {"id": str(bug.pk), "name": "bug", "color": "#ff0000"}]
    assert sorted(body["labelIds"]) == sorted([str(bug.pk), str(api.pk)])
    assert audit(company, "issue.created").details["labelIds"] == sorted([str(bug.pk), str(api.pk)])

    url = f"/api/issues/{body['id']}"
    patched = board_client.patch(url, {"labelIds": [str(bug.pk)]}, format="json").json()
    assert patched["labelIds"] == [str(bug.pk)]
    assert audit(company, "issue.updated").details["changes"]["labelIds"] == [
        sorted([str(bug.pk), str(api.pk)]), [str(bug.pk)]]
    assert board_client.get(url).json()["labelIds"] == [str(bug.pk)]
    assert board_client.patch(url, {"labelIds": []}, format="json").json()["labels"] == []


def test_label_ids_must_belong_to_the_company(board_client, company):
    foreign = Label.objects.create(company=CompanyFactory(), name="theirs")
    before = Issue.objects.count()
    response = board_client.post(f"/api/companies/{company.pk}/issues",
                                 {"title": "x", "labelIds": [str(foreign.pk)]}, format="json")
    assert_error(response, 404, "not_found", fields=("labelIds",))
    assert Issue.objects.count() == before
    issue = IssueFactory(company=company)
    assert_error(board_client.patch(f"/api/issues/{issue.pk}", {"labelIds": [str(foreign.pk)]}, format="json"),
                 404, fields=("labelIds",))
    assert_error(board_client.patch(f"/api/issues/{issue.pk}", {"labelIds": ["nope"]}, format="json"), 400,
                 fields=("labelIds",))
    assert issue.labels.count() == 0


# --- list filters ------------------------------------------------------------------------------------------------


def listed(client, company, query):
    response = client.get(f"/api/companies/{company.pk}/issues?{query}")
    assert response.status_code == 200, response.content[:300]
    return [row["id"] for row in response.json()]


def ids(*issues):
    return [str(issue.pk) for issue in issues]


def test_label_filters_by_id_and_by_name(board_client, company):
    bug = Label.objects.create(company=company, name="Bug", color="#ff0000")
    api = Label.objects.create(company=company, name="api", color="#00ff00")
    both = IssueFactory(company=company)
    both.labels.add(bug, api)
    only_bug = IssueFactory(company=company)
    only_bug.labels.add(bug)
    IssueFactory(company=company)
    assert sorted(listed(board_client, company, f"labelId={bug.pk}")) == sorted(ids(both, only_bug))
    assert listed(board_client, company, "label=API") == ids(both)
    assert listed(board_client, company, f"labelId={bug.pk}&label=api") == ids(both)
    assert listed(board_client, company, "label=none") == []
    assert_error(board_client.get(f"/api/companies/{company.pk}/issues?labelId=x"), 400, fields=("labelId",))


def test_assignee_filters(board_client, board_user, agent_client, company):
    agent = AgentFactory(company=company)
    assigned = IssueFactory(company=company, assignee_agent=agent)
    mine = IssueFactory(company=company, assignee_user=board_user)
    unassigned = IssueFactory(company=company)
    assert listed(board_client, company, f"assigneeAgentId={agent.pk}") == ids(assigned)
    # ``null``: no agent assignee (upstream), whether or not a user holds it.
    assert sorted(listed(board_client, company, "assigneeAgentId=null")) == sorted(ids(mine, unassigned))
    assert_error(board_client.get(f"/api/companies/{company.pk}/issues?assigneeAgentId=bob"), 400,
                 fields=("assigneeAgentId",))
    assert listed(board_client, company, "assigneeUserId=me") == ids(mine)
    assert listed(board_client, company, f"assigneeUserId={board_user.pk}") == ids(mine)
    error = assert_error(agent_client.get(f"/api/companies/{company.pk}/issues?assigneeUserId=me"), 403)
    assert error["message"] == "assigneeUserId=me requires board authentication"


def test_q_searches_title_identifier_description_and_comments_best_match_first(board_client, company):
    in_comment = IssueFactory(company=company, title="Plain", priority="critical", priority_rank=0)
    comment_create(actor=SYSTEM, issue=in_comment, body="the flaky checkout test again")
    in_description = IssueFactory(company=company, title="Other", description="Flaky on CI")
    in_title = IssueFactory(company=company, title="Fix flaky test", priority="low", priority_rank=3)
    IssueFactory(company=company, title="Unrelated")
    assert listed(board_client, company, "q=flaky") == ids(in_title, in_description, in_comment)
    assert listed(board_client, company, f"q={in_description.identifier.lower()}") == ids(in_description)


def test_tree_origin_and_workspace_filters(board_client, company, agent_client):
    root = IssueFactory(company=company)
    child = IssueFactory(company=company, parent=root)
    grandchild = IssueFactory(company=company, parent=child)
    IssueFactory(company=company)
    assert sorted(listed(board_client, company, f"descendantOf={root.pk}")) == sorted(ids(child, grandchild))
    assert listed(board_client, company, f"parentIssueId={root.pk}") == ids(child)

    from_case = IssueFactory(company=company, origin_kind="case", origin_id="CASE-7", origin_issue=root)
    assert listed(board_client, company, "originKind=case") == ids(from_case)
    assert listed(board_client, company, "originKindPrefix=ca") == ids(from_case)
    assert listed(board_client, company, "originId=CASE-7") == ids(from_case)
    assert listed(board_client, company, f"createdFromIssueId={root.pk}") == ids(from_case)
    assert_error(board_client.get(f"/api/companies/{company.pk}/issues?originKind=alien"), 400,
                 fields=("originKind",))

    workspace = ExecutionWorkspace.objects.create(company=company, strategy="isolated_workspace", key="k",
                                                  path="/tmp/ws-filter")
    bound = IssueFactory(company=company, execution_workspace=workspace)
    assert listed(board_client, company, f"executionWorkspaceId={workspace.pk}") == ids(bound)
    assert listed(board_client, company, f"workspaceId={workspace.pk}") == ids(bound)


def test_participant_touched_and_plan_document_filters(board_client, board_user, agent_client, company):
    agent = agent_client.agent
    commented = IssueFactory(company=company)
    comment_create(actor=SYSTEM, issue=commented, body="x")
    Comment.objects.filter(issue=commented).update(author_agent=agent, author_type="agent")
    ran = IssueFactory(company=company)
    RunFactory(agent=agent, issue=ran, status="succeeded", finished_at=timezone.now())
    created = IssueFactory(company=company, created_by_agent=agent)
    IssueFactory(company=company)
    assert sorted(listed(board_client, company, f"participantAgentId={agent.pk}")) == sorted(
        ids(commented, ran, created))

    by_me = IssueFactory(company=company, created_by_user=board_user)
    assert listed(board_client, company, "touchedByUserId=me") == ids(by_me)

    planned = IssueFactory(company=company)
    document_write(actor=SYSTEM, issue=planned, key="plan", body="steps")
    assert listed(board_client, company, "hasPlanDocument=true") == ids(planned)
    assert str(planned.pk) not in listed(board_client, company, "hasPlanDocument=false")
    assert_error(board_client.get(f"/api/companies/{company.pk}/issues?hasPlanDocument=maybe"), 400,
                 fields=("hasPlanDocument",))


def test_updated_since_sorting_and_keyset_paging(board_client, company):
    now = timezone.now()
    issues = [IssueFactory(company=company, title=f"i{n}") for n in range(5)]
    for age, issue in enumerate(issues):
        Issue.objects.filter(pk=issue.pk).update(updated_at=now - timedelta(hours=age))
    newest_first = ids(*issues)
    assert listed(board_client, company, "sortField=updated") == newest_first
    assert listed(board_client, company, "sortField=updated&sortDir=asc") == newest_first[::-1]
    since = (now - timedelta(hours=2, minutes=30)).isoformat().replace("+00:00", "Z")
    assert listed(board_client, company, f"updatedSince={since}") == ids(*issues[:3])
    assert_error(board_client.get(f"/api/companies/{company.pk}/issues?updatedSince=yesterday"), 400,
                 fields=("updatedSince",))

    pages, after = [], ""
    while True:
        page = listed(board_client, company, f"sortField=updated&limit=2{after}")
        if not page:
            break
        pages.append(page)
        after = f"&afterId={page[-1]}"
    assert [len(p) for p in pages] == [2, 2, 1] and sum(pages, []) == newest_first
    # The default order (priority, age) pages the same way.
    default = listed(board_client, company, "")
    assert listed(board_client, company, f"afterId={default[1]}") == default[2:]
    foreign = IssueFactory(company=CompanyFactory())
    assert_error(board_client.get(f"/api/companies/{company.pk}/issues?afterId={foreign.pk}"), 400,
                 fields=("afterId",))
    assert_error(board_client.get(f"/api/companies/{company.pk}/issues?sortField=title"), 400, fields=("sortField",))


# --- over HTTP with an agent key ----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_an_agent_labels_and_splits_its_work_over_http(live_server):
    company = CompanyFactory()
    agent = AgentFactory(company=company)
    _, key = agent_api_key_create(agent=agent)
    run = RunFactory(agent=agent, status="running", started_at=timezone.now())
    task = IssueFactory(company=company, title="Big task", assignee_agent=agent)
    api = requests.Session()
    api.headers.update({"Authorization": f"Bearer {key}", "X-Paperclip-Run-Id": str(run.pk)})
    base = f"{live_server.url}/api"

    label = api.post(f"{base}/companies/{company.pk}/labels", json={"name": "frontend", "color": "#336699"})
    assert label.status_code == 201, label.text
    child = api.post(f"{base}/issues/{task.identifier}/children",
                     json={"title": "Build the form", "labelIds": [label.json()["id"]], "blockParentUntilDone": True})
    assert child.status_code == 201, child.text
    assert child.json()["parentId"] == str(task.pk) and child.json()["labels"][0]["name"] == "frontend"

    listed_ = api.get(f"{base}/companies/{company.pk}/issues", params={"label": "FRONTEND"}).json()
    assert [row["id"] for row in listed_] == [child.json()["id"]]
    children = api.get(f"{base}/issues/{task.pk}/children").json()
    assert [row["title"] for row in children] == ["Build the form"]
    refused = api.delete(f"{base}/issues/{child.json()['id']}")
    assert refused.status_code == 403 and refused.json()["code"] == "board_only"
    assert Issue.objects.get(pk=task.pk).status == "blocked"
