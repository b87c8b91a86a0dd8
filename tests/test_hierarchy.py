"""Two-level agent task trees (seed 004): agents nest parent + child, board users any depth."""
from issues.models import ActivityLog, Issue, IssueRelation
from tests.factories import IssueFactory, RunFactory


def create(client, company, **body):
    return client.post(f"/api/companies/{company.pk}/issues", {"title": "t", **body}, format="json")


def test_agent_grandchild_request_is_placed_beside_the_requester(agent_client, company):
    root = IssueFactory(company=company)
    child = IssueFactory(company=company, parent=root)
    response = create(agent_client, company, title="follow-up", parentId=str(child.pk))
    assert response.status_code == 201
    body = response.json()
    assert body["parentId"] == str(root.pk)
    assert body["parentAdjusted"] == {"requestedParentId": str(child.pk), "parentId": str(root.pk),
                                      "reason": "max_depth"}
    row = ActivityLog.objects.get(action="issue.created", entity_id=body["id"])
    assert row.details["parentAdjusted"]["reason"] == "max_depth"


def test_agent_child_of_top_level_task_is_kept(agent_client, company):
    root = IssueFactory(company=company)
    body = create(agent_client, company, parentId=str(root.pk)).json()
    assert body["parentId"] == str(root.pk)
    assert body["parentAdjusted"] is None


def test_board_users_nest_to_any_depth_and_deep_trees_stay_valid(board_client, company, agent_client):
    parent = None
    for depth in range(5):
        body = create(board_client, company, title=f"level {depth}",
                      **({"parentId": parent} if parent else {})).json()
        assert body["parentId"] == parent and body["parentAdjusted"] is None
        parent = body["id"]
    deepest = Issue.objects.get(pk=parent)
    assert deepest.parent.parent.parent.parent is not None
    # An agent may still work inside the deep tree; its new task goes beside the requester.
    response = create(agent_client, company, parentId=parent)
    assert response.json()["parentId"] == str(deepest.parent_id)


def test_origin_issue_records_the_requesting_task(make_agent_client, company):
    requester = IssueFactory(company=company)
    client = make_agent_client(company=company, with_run=False)
    client.use_run(RunFactory(agent=client.agent, issue=requester))
    unrelated_parent = IssueFactory(company=company)
    body = create(client, company, parentId=str(unrelated_parent.pk)).json()
    assert body["originIssueId"] == str(requester.pk)
    assert body["originRunId"] == str(client.run.pk)
    assert body["originKind"] == "agent"


def test_origin_issue_falls_back_to_requested_parent_and_is_server_set(agent_client, company):
    requester = IssueFactory(company=company)
    body = create(agent_client, company, parentId=str(requester.pk)).json()
    assert body["originIssueId"] == str(requester.pk)
    response = create(agent_client, company, originIssueId=str(requester.pk))
    assert response.status_code == 400
    assert "originIssueId" in response.json()["details"]


def test_board_created_issue_has_no_origin_issue(board_client, company):
    parent = IssueFactory(company=company)
    body = create(board_client, company, parentId=str(parent.pk)).json()
    assert body["originIssueId"] is None and body["originKind"] == "manual"


def test_agent_move_of_task_with_children_skips_only_the_parent_change(agent_client, company):
    task = IssueFactory(company=company, assignee_agent=agent_client.agent)  # agents move their own tasks
    IssueFactory(company=company, parent=task)
    new_parent = IssueFactory(company=company)
    response = agent_client.patch(f"/api/issues/{task.pk}", {"parentId": str(new_parent.pk), "title": "renamed"},
                                  format="json")
    assert response.status_code == 200
    body = response.json()
    assert body["parentId"] is None and body["title"] == "renamed"
    assert body["parentAdjusted"]["reason"] == "has_children"


def test_agent_move_under_a_child_is_flattened(agent_client, company):
    root = IssueFactory(company=company)
    child = IssueFactory(company=company, parent=root)
    task = IssueFactory(company=company, assignee_agent=agent_client.agent)
    body = agent_client.patch(f"/api/issues/{task.pk}", {"parentId": str(child.pk)}, format="json").json()
    assert body["parentId"] == str(root.pk) and body["parentAdjusted"]["reason"] == "max_depth"


def test_board_move_nests_freely_but_never_into_a_cycle(board_client, company):
    root = IssueFactory(company=company)
    child = IssueFactory(company=company, parent=root)
    grandchild = IssueFactory(company=company, parent=child)
    task = IssueFactory(company=company)
    assert board_client.patch(f"/api/issues/{task.pk}", {"parentId": str(grandchild.pk)},
                              format="json").json()["parentId"] == str(grandchild.pk)
    cycle = board_client.patch(f"/api/issues/{root.pk}", {"parentId": str(task.pk)}, format="json")
    assert cycle.status_code == 422 and cycle.json()["code"] == "parent_cycle"
    assert Issue.objects.get(pk=root.pk).parent_id is None


def test_block_parent_until_done_blocks_the_requester(agent_client, company):
    requester = IssueFactory(company=company, assignee_agent=agent_client.agent)  # blocking it changes it
    body = create(agent_client, company, parentId=str(requester.pk), blockParentUntilDone=True).json()
    requester.refresh_from_db()
    assert requester.status == "blocked"
    assert IssueRelation.objects.filter(issue_id=body["id"], related_issue=requester, kind="blocks").exists()


def test_block_parent_until_done_blocks_the_requester_even_when_flattened(agent_client, company):
    root = IssueFactory(company=company)
    requester = IssueFactory(company=company, parent=root, assignee_agent=agent_client.agent)
    body = create(agent_client, company, parentId=str(requester.pk), blockParentUntilDone=True).json()
    assert body["parentId"] == str(root.pk)
    requester.refresh_from_db()
    root.refresh_from_db()
    assert requester.status == "blocked" and root.status == "todo"


def test_requested_status_is_honoured(agent_client, company):
    for status in ("backlog", "todo", "blocked"):
        assert create(agent_client, company, status=status).json()["status"] == status
    response = create(agent_client, company, status="in_progress")
    assert response.status_code == 422 and response.json()["code"] == "use_checkout"


def test_identifiers_count_up_per_company(board_client, company):
    first = create(board_client, company).json()
    second = create(board_client, company).json()
    assert first["identifier"] == f"{company.issue_prefix}-1"
    assert second["identifier"] == f"{company.issue_prefix}-2"
    assert board_client.get(f"/api/issues/{second['identifier']}").json()["id"] == second["id"]
