"""Issue fields upstream clients send (reference §5.2, the agent skill): ``billingCode``, a user
assignee (``assigneeUserId``: the skill's "reassign to them and set in_review" hand-back), and the
ancestors' context on ``GET /api/issues/:id`` (the skill's fallback for heartbeat-context)."""
from issues.models import ActivityLog, Issue, WakeupRequest
from tests.factories import AgentFactory, GoalFactory, IssueFactory, MembershipFactory, ProjectFactory, UserFactory
from tests.test_errors import assert_error
from tests.test_upstream_compat_comments_documents import create


def test_billing_code_is_taken_on_create_and_patch_and_shown(board_client, company):
    created = create(board_client, company, title="Cross-team work", billingCode="OPS-42")
    assert created.status_code == 201 and created.json()["billingCode"] == "OPS-42"
    issue_id = created.json()["id"]
    assert board_client.get(f"/api/issues/{issue_id}").json()["billingCode"] == "OPS-42"
    listed = board_client.get(f"/api/companies/{company.pk}/issues").json()
    assert [i["billingCode"] for i in listed if i["id"] == issue_id] == ["OPS-42"]
    cleared = board_client.patch(f"/api/issues/{issue_id}", {"billingCode": None}, format="json")
    assert cleared.status_code == 200 and cleared.json()["billingCode"] is None
    assert create(board_client, company, title="Plain").json()["billingCode"] is None
    assert_error(create(board_client, company, title="Long", billingCode="x" * 201), 400, fields=["billingCode"])


def test_a_member_can_be_the_assignee_and_only_one_assignee_is_taken(board_client, company, board_user):
    agent = AgentFactory(company=company)
    created = create(board_client, company, title="For a person", assigneeUserId=board_user.pk)
    assert created.status_code == 201, created.content
    assert (created.json()["assigneeUserId"], created.json()["assigneeAgentId"], created.json()["status"]) == (
        board_user.pk, None, "todo")
    assert not WakeupRequest.objects.exists()  # a person is not woken
    before = Issue.objects.count()
    both = create(board_client, company, title="Two", assigneeUserId=board_user.pk, assigneeAgentId=str(agent.pk))
    assert_error(both, 422, "one_assignee", fields=["assigneeUserId"])
    outsider = UserFactory()  # not a member of this company
    assert_error(create(board_client, company, title="X", assigneeUserId=outsider.pk), 404, fields=["assigneeUserId"])
    elsewhere = MembershipFactory().user  # a member of another company
    assert_error(create(board_client, company, title="Y", assigneeUserId=elsewhere.pk), 404,
                 fields=["assigneeUserId"])
    assert Issue.objects.count() == before
    # an agent assignee replaces the person, and the person replaces the agent
    issue_id = created.json()["id"]
    to_agent = board_client.patch(f"/api/issues/{issue_id}", {"assigneeAgentId": str(agent.pk)}, format="json").json()
    assert (to_agent["assigneeAgentId"], to_agent["assigneeUserId"]) == (str(agent.pk), None)
    to_user = board_client.patch(f"/api/issues/{issue_id}", {"assigneeUserId": board_user.pk}, format="json").json()
    assert (to_user["assigneeAgentId"], to_user["assigneeUserId"]) == (None, board_user.pk)
    changes = ActivityLog.objects.filter(action="issue.updated", entity_id=issue_id).order_by("id").last()
    assert changes.details["changes"]["assignee_user"] == [None, board_user.pk]


def test_an_agent_hands_its_issue_back_to_a_person_for_review(make_agent_client, company, board_user):
    """The skill: "If a human asks to take the task back, reassign to them and set in_review". Handing
    the issue back to the person who created it needs no tasks:assign (upstream's one exception)."""
    coder = make_agent_client(AgentFactory(company=company, name="coder"))
    issue = IssueFactory(company=company, assignee_agent=coder.agent, created_by_user=board_user)
    claimed = coder.post(f"/api/issues/{issue.pk}/checkout",
                         {"agentId": str(coder.agent.pk), "expectedStatuses": ["todo"]}, format="json")
    assert claimed.status_code == 200, claimed.content
    handed = coder.patch(f"/api/issues/{issue.pk}", {"assigneeUserId": board_user.pk, "status": "in_review",
                                                      "comment": "Over to you."}, format="json")
    assert handed.status_code == 200, handed.content
    body = handed.json()
    assert (body["assigneeUserId"], body["assigneeAgentId"], body["status"], body["checkoutRunId"]) == (
        board_user.pk, None, "in_review", None)
    assert body["comment"]["body"] == "Over to you."


def test_ancestors_carry_the_context_of_why_the_task_exists(board_client, company):
    project = ProjectFactory(company=company, name="Launch")
    goal = GoalFactory(company=company, title="Ship v1")
    agent = AgentFactory(company=company)
    root = IssueFactory(company=company, title="Ship the site", description="Why: the launch date is fixed.",
                        project=project, goal=goal, assignee_agent=agent, priority="high")
    middle = IssueFactory(company=company, title="Landing page", parent=root)
    leaf = IssueFactory(company=company, title="Hero image", parent=middle)
    body = board_client.get(f"/api/issues/{leaf.pk}").json()
    assert [a["title"] for a in body["ancestors"]] == ["Landing page", "Ship the site"]
    top = body["ancestors"][1]
    assert top["description"] == "Why: the launch date is fixed." and top["priority"] == "high"
    assert (top["assigneeAgentId"], top["assigneeUserId"]) == (str(agent.pk), None)
    assert (top["projectId"], top["goalId"]) == (str(project.pk), str(goal.pk))
    assert top["project"] == {"id": str(project.pk), "name": "Launch"}
    assert top["goal"] == {"id": str(goal.pk), "title": "Ship v1"}
    assert body["ancestors"][0]["project"] is None
