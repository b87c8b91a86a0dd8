"""Goals, projects, costs and budgets, the company record, the dashboard and the activity log over
the upstream-compatible API (paperclip-api.md §5.4-§5.9, issue #14). Board users and agents
through the API; the cost ledger end to end over real HTTP with an agent key."""
import json
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone as dt_timezone

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from issues.actors import SYSTEM
from issues.models import ActivityLog, Agent, Approval, Company, CostEvent, Goal, HeartbeatRun, Issue, Project
from issues.services.wakeups import agent_wakeup
from tests.factories import (
    AgentFactory,
    CompanyFactory,
    GoalFactory,
    IssueFactory,
    MembershipFactory,
    ProjectFactory,
    RunFactory,
    UserFactory,
)
from tests.queries import count_queries
from tests.test_errors import assert_error


def board_for(company, role="owner", **user_fields):
    client = APIClient()
    client.force_login(MembershipFactory(company=company, role=role, user=UserFactory(**user_fields)).user)
    return client


def audit(company, action):
    return ActivityLog.objects.filter(company=company, action=action).order_by("-created_at", "-id").first()


def url(company, tail=""):
    return f"/api/companies/{company.pk}{tail}"


# --- goals --------------------------------------------------------------------------------------------

def test_goal_crud_with_upstream_defaults_and_audit(board_client, company):
    owner = AgentFactory(company=company)
    created = board_client.post(url(company, "/goals"), {"title": "Ship v1", "ownerAgentId": str(owner.pk)},
                                format="json")
    assert created.status_code == 201, created.content
    goal = created.json()
    assert set(goal) == {"id", "companyId", "title", "description", "level", "status", "parentId", "ownerAgentId",
                         "createdAt", "updatedAt"}
    assert (goal["level"], goal["status"], goal["ownerAgentId"], goal["description"]) == (
        "task", "planned", str(owner.pk), None)
    child = board_client.post(url(company, "/goals"), {"title": "Docs", "level": "team", "parentId": goal["id"]},
                              format="json").json()
    assert child["parentId"] == goal["id"]
    assert [g["title"] for g in board_client.get(url(company, "/goals")).json()] == ["Ship v1", "Docs"]
    assert [g["title"] for g in board_client.get(url(company, "/goals?level=team")).json()] == ["Docs"]

    patched = board_client.patch(f"/api/goals/{goal['id']}", {"status": "achieved", "description": "done"},
                                 format="json")
    assert patched.status_code == 200 and patched.json()["status"] == "achieved"
    assert patched.json()["level"] == "task"  # a PATCH changes what it names only
    assert audit(company, "goal.updated").details == {"changedKeys": ["description", "status"]}

    deleted = board_client.delete(f"/api/goals/{goal['id']}")
    assert deleted.status_code == 200 and deleted.json()["id"] == goal["id"]
    assert_error(board_client.get(f"/api/goals/{goal['id']}"), 404, "not_found")
    assert Goal.objects.get(pk=child["id"]).parent_id is None  # the child stays, unlinked
    assert {a.action for a in ActivityLog.objects.filter(company=company, entity_type="goal")} == {
        "goal.created", "goal.updated", "goal.deleted"}


def test_goal_input_is_checked_against_upstreams_enums_and_the_tree(board_client, company):
    root = GoalFactory(company=company)
    leaf = GoalFactory(company=company, parent=root)
    foreign = GoalFactory(company=CompanyFactory())
    before = Goal.objects.count()
    assert_error(board_client.post(url(company, "/goals"), {}, format="json"), 400, fields=("title",))
    assert_error(board_client.post(url(company, "/goals"), {"title": " "}, format="json"), 400, fields=("title",))
    assert_error(board_client.post(url(company, "/goals"), {"title": "x", "level": "org"}, format="json"),
                 400, fields=("level",))
    # The docs' example uses "completed"; the enum is planned/active/achieved/cancelled.
    assert_error(board_client.post(url(company, "/goals"), {"title": "x", "status": "completed"}, format="json"),
                 400, fields=("status",))
    assert_error(board_client.post(url(company, "/goals"), {"title": "x", "parentId": str(foreign.pk)},
                                   format="json"), 404, "not_found", fields=("parentId",))
    assert_error(board_client.post(url(company, "/goals"), {"title": "x", "bogus": 1}, format="json"),
                 400, fields=("bogus",))
    assert Goal.objects.count() == before
    assert_error(board_client.patch(f"/api/goals/{root.pk}", {"parentId": str(leaf.pk)}, format="json"),
                 422, "goal_cycle", fields=("parentId",))
    assert_error(board_client.patch(f"/api/goals/{root.pk}", {"parentId": str(root.pk)}, format="json"),
                 422, "goal_cycle")
    assert_error(board_client.get(url(company, "/goals?status=done")), 400, "invalid_filter", fields=("status",))
    assert Goal.objects.get(pk=root.pk).parent_id is None


def test_existing_goal_values_read_back_and_survive_a_patch(board_client, company):
    old = GoalFactory(company=company)  # the console's defaults: level company, status active
    body = board_client.get(f"/api/goals/{old.pk}").json()
    assert (body["level"], body["status"]) == ("company", "active")
    assert board_client.patch(f"/api/goals/{old.pk}", {"title": "Renamed"}, format="json").json()["status"] == "active"


def test_agents_of_the_company_write_goals_and_viewers_only_read(make_agent_client, company):
    agent = make_agent_client(company=company)
    created = agent.post(url(company, "/goals"), {"title": "Agent goal"}, format="json")
    assert created.status_code == 201
    row = audit(company, "goal.created")
    assert (row.actor_type, row.actor_agent_id, row.run_id) == ("agent", agent.agent.pk, agent.run.pk)
    viewer = board_for(company, role="viewer")
    assert viewer.get(url(company, "/goals")).status_code == 200
    assert_error(viewer.post(url(company, "/goals"), {"title": "x"}, format="json"), 403, "read_only_role")
    assert_error(viewer.delete(f"/api/goals/{created.json()['id']}"), 403, "read_only_role")


def test_goal_list_query_count_is_the_same_for_10_and_10000_goals(board_client, company):
    def add(n, start):
        Goal.objects.bulk_create([Goal(company=company, title=f"g{start + i}") for i in range(n)], batch_size=1000)

    add(10, 0)
    small, body = count_queries(board_client, url(company, "/goals"))
    assert len(body) == 10
    add(9990, 10)
    large, body = count_queries(board_client, url(company, "/goals"))
    assert len(body) == 500 and small == large


# --- projects ------------------------------------------------------------------------------------------

def test_project_create_maps_upstream_workspace_settings(board_client, company):
    response = board_client.post(url(company, "/projects"), {
        "name": "App", "description": "the app", "goalIds": [], "color": "#ff0000",
        "workspace": {"name": "main", "repoUrl": "https://git.example.com/org/app.git", "repoRef": "main"},
        "executionWorkspacePolicy": {"enabled": True, "defaultMode": "isolated_workspace",
                                     "allowIssueOverride": True,
                                     "workspaceStrategy": {"type": "git_worktree",
                                                           "branchTemplate": "pc/{identifier}"}}}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    project = Project.objects.get(pk=body["id"])
    assert (project.repository, project.base_ref, project.workspace_strategy, project.branch_template) == (
        "https://git.example.com/org/app.git", "main", "isolated_workspace", "pc/{identifier}")
    assert (body["status"], body["goalIds"], body["color"]) == ("backlog", [], "#ff0000")
    assert body["primaryWorkspace"] == {"id": body["id"], "projectId": body["id"], "name": "App", "cwd": None,
                                        "repoUrl": "https://git.example.com/org/app.git", "repoRef": "main",
                                        "isPrimary": True}
    assert body["workspaces"] == [body["primaryWorkspace"]]
    assert body["executionWorkspacePolicy"] == {
        "enabled": True, "defaultMode": "isolated_workspace",
        "workspaceStrategy": {"type": "git_worktree", "baseRef": "main", "branchTemplate": "pc/{identifier}"}}
    assert (body["workspaceStrategy"], body["repository"], body["baseRef"]) == (
        "isolated_workspace", "https://git.example.com/org/app.git", "main")
    assert audit(company, "project.created").details["name"] == "App"

    listed = board_client.get(url(company, "/projects")).json()
    assert [p["name"] for p in listed] == ["App"]
    off = board_client.patch(f"/api/projects/{body['id']}", {"executionWorkspacePolicy": {"enabled": False}},
                             format="json")
    assert off.status_code == 200 and off.json()["workspaceStrategy"] == "agent_default"
    assert off.json()["executionWorkspacePolicy"]["enabled"] is False
    shared = board_client.patch(f"/api/projects/{body['id']}", {
        "executionWorkspacePolicy": {"enabled": True, "workspaceStrategy": {"type": "project_primary"}}},
        format="json")
    assert shared.json()["workspaceStrategy"] == "shared_workspace"


def test_own_workspace_fields_and_their_conflicts_with_the_mapped_ones(board_client, company):
    created = board_client.post(url(company, "/projects"), {
        "name": "Own", "workspaceStrategy": "shared_workspace", "repository": "https://git.example.com/o.git",
        "baseRef": "develop", "branchTemplate": "work/{number}", "workflowDocument": "---\nagent: {}\n---\nDo it."},
        format="json")
    assert created.status_code == 201, created.content
    assert created.json()["workflowDocument"].endswith("Do it.")
    before = list(Project.objects.values())
    assert_error(board_client.post(url(company, "/projects"), {
        "name": "Twice", "repository": "https://git.example.com/a.git",
        "workspace": {"repoUrl": "https://git.example.com/b.git"}}, format="json"),
        400, fields=("repository", "workspace.repoUrl"))
    assert_error(board_client.post(url(company, "/projects"), {"name": "Empty", "workspace": {"name": "x"}},
                                   format="json"), 400, fields=("workspace",))
    assert_error(board_client.post(url(company, "/projects"), {"name": "Mode", "executionWorkspacePolicy": {
        "enabled": True, "defaultMode": "operator_branch"}}, format="json"), 422, "workspace_mode_unsupported")
    assert_error(board_client.post(url(company, "/projects"), {"name": "Tpl", "branchTemplate": "x/{title}"},
                                   format="json"), 400, fields=("branchTemplate",))
    assert_error(board_client.post(url(company, "/projects"), {"name": "Ref", "baseRef": "--upload-pack=x"},
                                   format="json"), 400, fields=("baseRef",))
    assert_error(board_client.post(url(company, "/projects"), {"name": "St", "status": "active"}, format="json"),
                 400, fields=("status",))
    assert_error(board_client.post(url(company, "/projects"), {"name": "Env", "env": {"A": "b"}}, format="json"),
                 400, fields=("env",))
    assert list(Project.objects.values()) == before


def test_a_server_folder_is_set_by_staff_only_and_urls_pass_the_outbound_guard(company):
    admin = board_for(company, role="admin")
    staff = board_for(company, role="owner", is_staff=True)
    refused = [
        ({"workspace": {"cwd": "/etc"}}, 403, "repository_staff_only"),
        ({"repository": "/srv/repos/app"}, 403, "repository_staff_only"),
        ({"repository": "file:///srv/repos/app"}, 403, "repository_staff_only"),
        ({"repository": "git@github.com:org/app.git"}, 403, "repository_staff_only"),
        ({"repository": "ssh://git@github.com/org/app.git"}, 403, "repository_staff_only"),
        ({"repository": "https://10.1.2.3/org/app.git"}, 400, "validation_error"),  # private address
        ({"repository": "https://TOKEN@github.com/org/app.git"}, 400, "validation_error"),  # inline credential
        ({"repository": "-uhack@x:y"}, 400, "validation_error"),
    ]
    for n, (fields, status, code) in enumerate(refused):
        assert_error(admin.post(url(company, "/projects"), {"name": f"p{n}", **fields}, format="json"), status, code)
    assert not Project.objects.filter(company=company).exists()

    ok = staff.post(url(company, "/projects"), {"name": "Local", "workspace": {"cwd": "/srv/repos/app"}},
                    format="json")
    assert ok.status_code == 201, ok.content
    assert ok.json()["primaryWorkspace"]["cwd"] == "/srv/repos/app" and ok.json()["repository"] == "/srv/repos/app"
    assert staff.post(url(company, "/projects"), {"name": "Ssh", "repository": "git@github.com:org/app.git"},
                      format="json").status_code == 201
    assert_error(staff.post(url(company, "/projects"), {"name": "Rel", "repository": "repos/app"}, format="json"),
                 400, fields=("repository",))
    # A company admin may still change the other fields of a project staff configured.
    renamed = admin.patch(f"/api/projects/{ok.json()['id']}", {"description": "moved"}, format="json")
    assert renamed.status_code == 200 and renamed.json()["repository"] == "/srv/repos/app"


def test_project_names_are_unique_per_company_ignoring_case(board_client, company):
    ProjectFactory(company=company, name="Website")
    ProjectFactory(company=CompanyFactory(), name="Mobile")
    assert_error(board_client.post(url(company, "/projects"), {"name": "WEBSITE"}, format="json"),
                 409, "project_name_taken", fields=("name",))
    other = board_client.post(url(company, "/projects"), {"name": "Mobile"}, format="json")  # another company's name
    assert other.status_code == 201
    assert_error(board_client.patch(f"/api/projects/{other.json()['id']}", {"name": "website"}, format="json"),
                 409, "project_name_taken")


def test_agents_change_name_description_and_status_but_not_workspace_settings(make_agent_client, company):
    agent = make_agent_client(company=company)
    created = agent.post(url(company, "/projects"), {"name": "Agent project", "status": "planned"}, format="json")
    assert created.status_code == 201 and created.json()["status"] == "planned"
    pid = created.json()["id"]
    assert agent.patch(f"/api/projects/{pid}", {"status": "in_progress"}, format="json").json()["status"] == \
        "in_progress"
    for fields in ({"repository": "https://git.example.com/x.git"}, {"workspaceStrategy": "shared_workspace"},
                   {"workspace": {"repoUrl": "https://git.example.com/x.git"}}, {"workflowDocument": "x"},
                   {"executionWorkspacePolicy": {"enabled": False}}):
        assert_error(agent.patch(f"/api/projects/{pid}", fields, format="json"), 403, "board_only",
                     fields=tuple(fields))
    assert_error(agent.post(url(company, "/projects"), {"name": "n", "baseRef": "main"}, format="json"),
                 403, "board_only", fields=("baseRef",))
    assert Project.objects.get(pk=pid).workspace_strategy == "agent_default"


def test_existing_active_projects_read_back(board_client, company):
    legacy = ProjectFactory(company=company)  # the model's old default status "active": upstream's in_progress
    assert board_client.get(f"/api/projects/{legacy.pk}").json()["status"] == "in_progress"
    assert board_client.patch(f"/api/projects/{legacy.pk}", {"description": "x"}, format="json").json()["status"] \
        == "in_progress"
    assert Project.objects.get(pk=legacy.pk).status == "active"  # the row keeps what it holds
    assert_error(board_client.get("/api/projects/not-a-uuid"), 404, "not_found")


def test_project_list_query_count_is_the_same_for_10_and_10000_projects(board_client, company):
    def add(n, start):
        Project.objects.bulk_create([Project(company=company, name=f"p{start + i:05d}") for i in range(n)],
                                    batch_size=1000)

    add(10, 0)
    small, body = count_queries(board_client, url(company, "/projects"))
    add(9990, 10)
    large, body2 = count_queries(board_client, url(company, "/projects"))
    assert (len(body), len(body2)) == (10, 500) and small == large


# --- costs: one ledger ------------------------------------------------------------------------------------

def event_body(agent, **fields):
    return {"agentId": str(agent.pk), "provider": "anthropic", "model": "claude", "costCents": 25,
            "occurredAt": timezone.now().isoformat(), **fields}


def test_board_reports_a_cost_event_for_an_agent(board_client, company):
    agent = AgentFactory(company=company)
    project = ProjectFactory(company=company)
    response = board_client.post(url(company, "/cost-events"), event_body(
        agent, projectId=str(project.pk), inputTokens=1000, cachedInputTokens=200, outputTokens=50,
        billingType="metered_api", billingCode="eng"), format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert set(body) == {"id", "companyId", "agentId", "issueId", "projectId", "goalId", "heartbeatRunId",
                         "billingCode", "provider", "biller", "billingType", "model", "inputTokens",
                         "cachedInputTokens", "outputTokens", "costCents", "costStatus", "occurredAt", "createdAt"}
    assert (body["biller"], body["billingType"], body["costCents"], body["projectId"]) == (
        "anthropic", "metered_api", 25, str(project.pk))
    agent.refresh_from_db()
    company.refresh_from_db()
    assert agent.spent_monthly_cents == 25 and company.spent_monthly_cents == 25
    assert audit(company, "cost.reported").details["costCents"] == 25


def test_an_agent_reports_only_its_own_costs_and_occurred_at_is_required(make_agent_client, company):
    client = make_agent_client(company=company)
    other = AgentFactory(company=company)
    assert client.post(url(company, "/cost-events"), event_body(client.agent), format="json").status_code == 201
    error = assert_error(client.post(url(company, "/cost-events"), event_body(other), format="json"), 403)
    assert error["message"] == "Agent can only report its own costs"
    body = event_body(client.agent)
    del body["occurredAt"]
    assert_error(client.post(url(company, "/cost-events"), body, format="json"), 400, fields=("occurredAt",))
    assert_error(client.post(url(company, "/cost-events"), event_body(client.agent, costCents=-1), format="json"),
                 400, fields=("costCents",))
    foreign_run = RunFactory(agent=other)
    assert_error(client.post(url(company, "/cost-events"), event_body(client.agent, heartbeatRunId=str(foreign_run.pk)),
                             format="json"), 422, "run_agent_mismatch")
    assert CostEvent.objects.filter(company=company).count() == 1
    assert Agent.objects.get(pk=other.pk).spent_monthly_cents == 0


def test_heartbeat_usage_and_cost_events_are_one_ledger_counted_once(make_agent_client, company):
    client = make_agent_client(company=company)
    run = client.run
    for total in (50, 80, 80):  # running totals; the repeat adds nothing
        response = client.post(f"/api/runs/{run.pk}/heartbeat", {"usage": {"costCents": total, "inputTokens": total * 10}},
                               format="json")
        assert response.status_code == 200, response.content
    rows = CostEvent.objects.filter(company=company)
    assert sorted(rows.values_list("cost_cents", flat=True)) == [30, 50]
    assert {(r.provider, r.run_id, r.model) for r in rows} == {("paperclip-run", run.pk, "")}
    agent = Agent.objects.get(pk=client.agent.pk)
    assert agent.spent_monthly_cents == 80
    assert client.get(url(company, "/costs/summary")).json()["spendCents"] == 80

    assert client.post(url(company, "/cost-events"), event_body(client.agent, costCents=20), format="json")\
        .status_code == 201
    agent.refresh_from_db()
    assert agent.spent_monthly_cents == 100 and Company.objects.get(pk=company.pk).spent_monthly_cents == 100
    summary = client.get(url(company, "/costs/summary")).json()
    assert summary["spendCents"] == 100
    by_agent = client.get(url(company, "/costs/by-agent")).json()
    assert [(r["agentId"], r["costCents"], r["inputTokens"], r["apiRunCount"]) for r in by_agent] == [
        (str(agent.pk), 100, 800, 1)]


def test_a_cost_event_over_the_budget_stops_the_agent_as_a_heartbeat_does(make_agent_client, company):
    client = make_agent_client(company=company, budget_monthly_cents=100)
    run = client.run
    issue = IssueFactory(company=company, assignee_agent=client.agent)
    assert client.post(url(company, "/cost-events"), event_body(client.agent, costCents=60), format="json")\
        .status_code == 201
    assert Agent.objects.get(pk=client.agent.pk).pause_reason == ""
    assert client.post(url(company, "/cost-events"), event_body(client.agent, costCents=45,
                                                                heartbeatRunId=str(run.pk)), format="json")\
        .status_code == 201
    agent = Agent.objects.get(pk=client.agent.pk)
    assert (agent.spent_monthly_cents, agent.pause_reason) == (105, "budget_exceeded")
    run.refresh_from_db()
    assert (run.status, run.stop_reason) == ("cancelled", "budget_exceeded")
    assert audit(company, "agent.budget_exceeded").details == {"spentCents": 105, "budgetCents": 100}
    assert agent_wakeup(actor=SYSTEM, agent=agent, issue=issue).skip_reason == "budget_exceeded"

    # Raising the budget lifts the stop (the board or the agent itself).
    board = board_for(company)
    lifted = board.patch(f"/api/agents/{agent.pk}/budgets", {"budgetMonthlyCents": 500}, format="json")
    assert lifted.status_code == 200, lifted.content
    assert (lifted.json()["budgetMonthlyCents"], lifted.json()["pauseReason"]) == (500, "")


def test_cost_summary_window_and_date_validation(board_client, company):
    agent = AgentFactory(company=company)
    now = timezone.now()
    last_month = (now.replace(day=1) - timedelta(days=3))
    for cents, when in ((7, last_month), (11, now)):
        assert board_client.post(url(company, "/cost-events"), event_body(agent, costCents=cents,
                                                                          occurredAt=when.isoformat()),
                                 format="json").status_code == 201
    # Last month's event is in the ledger, not in this month's spend counter.
    assert Agent.objects.get(pk=agent.pk).spent_monthly_cents == 11
    Company.objects.filter(pk=company.pk).update(budget_monthly_cents=44)
    summary = board_client.get(url(company, "/costs/summary")).json()
    assert summary == {"companyId": str(company.pk), "spendCents": 11, "budgetCents": 44, "utilizationPercent": 25.0}
    day = last_month.astimezone(dt_timezone.utc).date().isoformat()
    assert board_client.get(url(company, f"/costs/summary?from={day}&to={day}")).json()["spendCents"] == 7
    assert board_client.get(url(company, f"/costs/summary?from={day}")).json()["spendCents"] == 18
    error = assert_error(board_client.get(url(company, "/costs/summary?from=yesterday")), 400, fields=("from",))
    assert error["message"] == "invalid 'from' date"
    error = assert_error(board_client.get(url(company, "/costs/by-agent?to=2026-13-45")), 400, fields=("to",))
    assert error["message"] == "invalid 'to' date"
    assert_error(board_client.get(url(company, "/costs/by-project?from=9999-99-99T00:00")), 400, fields=("from",))


def test_costs_by_project_use_the_events_project_else_its_issues(board_client, company):
    agent = AgentFactory(company=company)
    web, api = ProjectFactory(company=company, name="Web"), ProjectFactory(company=company, name="Api")
    issue = IssueFactory(company=company, project=api)
    for body in (event_body(agent, costCents=5, projectId=str(web.pk), outputTokens=3),
                 event_body(agent, costCents=9, issueId=str(issue.pk)),
                 event_body(agent, costCents=100)):  # no project: not in this report
        assert board_client.post(url(company, "/cost-events"), body, format="json").status_code == 201
    rows = board_client.get(url(company, "/costs/by-project")).json()
    assert rows == [
        {"projectId": str(api.pk), "projectName": "Api", "costCents": 9, "inputTokens": 0, "cachedInputTokens": 0,
         "outputTokens": 0},
        {"projectId": str(web.pk), "projectName": "Web", "costCents": 5, "inputTokens": 0, "cachedInputTokens": 0,
         "outputTokens": 3}]


# --- budgets and the company record -------------------------------------------------------------------------------

def test_company_budget_is_the_boards(board_client, make_agent_client, company):
    response = board_client.patch(url(company, "/budgets"), {"budgetMonthlyCents": 12345}, format="json")
    assert response.status_code == 200 and response.json()["budgetMonthlyCents"] == 12345
    assert audit(company, "company.budget_updated").details == {"budgetMonthlyCents": 12345, "previous": 0}
    agent = make_agent_client(company=company)
    assert_error(agent.patch(url(company, "/budgets"), {"budgetMonthlyCents": 1}, format="json"), 403, "board_only")
    assert_error(board_for(company, role="viewer").patch(url(company, "/budgets"), {"budgetMonthlyCents": 1},
                                                         format="json"), 403, "read_only_role")
    assert_error(board_client.patch(url(company, "/budgets"), {"budgetMonthlyCents": -5}, format="json"),
                 400, fields=("budgetMonthlyCents",))
    assert Company.objects.get(pk=company.pk).budget_monthly_cents == 12345


def test_agent_budget_by_the_board_or_the_agent_itself(make_agent_client, company):
    client = make_agent_client(company=company)
    other = AgentFactory(company=company)
    own = client.patch(f"/api/agents/{client.agent.pk}/budgets", {"budgetMonthlyCents": 700}, format="json")
    assert own.status_code == 200 and own.json()["budgetMonthlyCents"] == 700
    assert audit(company, "agent.budget_updated").details == {"budgetMonthlyCents": 700, "previous": 0}
    error = assert_error(client.patch(f"/api/agents/{other.pk}/budgets", {"budgetMonthlyCents": 1}, format="json"),
                         403)
    assert error["message"] == "Agent can only change its own budget"
    assert Agent.objects.get(pk=other.pk).budget_monthly_cents == 0
    # A budget below this month's spend puts the agent under its budget stop at once.
    Agent.objects.filter(pk=other.pk).update(spent_monthly_cents=50, spend_period=timezone.now().strftime("%Y-%m"))
    stopped = board_for(company).patch(f"/api/agents/{other.pk}/budgets", {"budgetMonthlyCents": 40}, format="json")
    assert stopped.json()["pauseReason"] == "budget_exceeded"


def test_company_record_read_and_update(board_client, make_agent_client, company):
    agent = make_agent_client(company=company)
    record = agent.get(url(company)).json()
    assert set(record) >= {"id", "name", "description", "status", "issuePrefix", "budgetMonthlyCents",
                           "spentMonthlyCents", "requireBoardApprovalForNewAgents", "brandColor", "logoAssetId",
                           "logoUrl", "createdAt", "updatedAt"}
    assert record["issuePrefix"] == company.issue_prefix
    changed = board_client.patch(url(company), {"name": "Acme", "description": "d", "status": "paused",
                                                "budgetMonthlyCents": 900}, format="json")
    assert changed.status_code == 200, changed.content
    assert (changed.json()["name"], changed.json()["status"], changed.json()["budgetMonthlyCents"]) == (
        "Acme", "paused", 900)
    assert audit(company, "company.updated").details == {"changedKeys": ["budgetMonthlyCents", "description", "name",
                                                                         "status"]}
    assert audit(company, "company.budget_updated").details == {"budgetMonthlyCents": 900, "previous": 0}
    assert_error(board_client.patch(url(company), {"issuePrefix": "NEW"}, format="json"), 400, fields=("issuePrefix",))
    assert_error(board_client.patch(url(company), {"status": "gone"}, format="json"), 400, fields=("status",))
    assert_error(agent.patch(url(company), {"name": "Mine"}, format="json"), 403, "board_only")
    ceo = make_agent_client(company=company, role="ceo")
    assert ceo.patch(url(company), {"name": "By the CEO"}, format="json").json()["name"] == "By the CEO"
    assert_error(ceo.patch(url(company), {"budgetMonthlyCents": 1}, format="json"), 403, "board_only")
    assert_error(board_for(company, role="viewer").patch(url(company), {"name": "x"}, format="json"),
                 403, "read_only_role")
    assert Company.objects.get(pk=company.pk).issue_prefix == company.issue_prefix


# --- dashboard ------------------------------------------------------------------------------------------------------

def test_dashboard_has_upstreams_shape_and_counts(board_client, make_agent_client, company):
    AgentFactory(company=company, status="paused")
    AgentFactory(company=company, status="error", budget_monthly_cents=1, spent_monthly_cents=5,
                 pause_reason="budget_exceeded")
    client = make_agent_client(company=company)  # idle: counted as active
    IssueFactory(company=company, status="in_progress", priority="high", assignee_agent=client.agent)
    IssueFactory(company=company, status="done")
    IssueFactory(company=company, status="blocked")
    IssueFactory(company=company, status="cancelled")
    RunFactory(agent=client.agent, status="succeeded", finished_at=timezone.now())
    RunFactory(agent=client.agent, status="timed_out", finished_at=timezone.now())
    Approval.objects.create(company=company, title="a", status="pending")
    Approval.objects.create(company=company, title="b", status="pending", type="budget_override_required")
    Company.objects.filter(pk=company.pk).update(budget_monthly_cents=200)
    assert board_client.post(url(company, "/cost-events"), event_body(client.agent, costCents=50), format="json")\
        .status_code == 201

    body = client.get(url(company, "/dashboard")).json()
    assert body["companyId"] == str(company.pk)
    assert body["agents"] == {"active": 1, "running": 0, "paused": 1, "error": 1}
    assert body["tasks"] == {"open": 2, "inProgress": 1, "blocked": 1, "done": 1}
    assert body["costs"] == {"monthSpendCents": 50, "monthBudgetCents": 200, "monthUtilizationPercent": 25.0}
    assert body["pendingApprovals"] == 2
    assert body["budgets"] == {"activeIncidents": 1, "pendingApprovals": 1, "pausedAgents": 1, "pausedProjects": 0}
    today = timezone.now().astimezone(dt_timezone.utc).date()
    assert [d["date"] for d in body["runActivity"]] == [(today - timedelta(days=n)).isoformat()
                                                        for n in range(13, -1, -1)]
    # The agent client's own run is running ("other"); one succeeded, one timed out (failed).
    assert body["runActivity"][-1] == {"date": today.isoformat(), "succeeded": 1, "failed": 1, "other": 1, "total": 3}
    assert body["issueActivity"][-1]["total"] == 4
    assert body["issueActivity"][-1]["byStatus"] == {"in_progress": 1, "done": 1, "blocked": 1, "cancelled": 1}
    assert body["issueActivity"][-1]["byPriority"] == {"high": 1, "medium": 3}
    assert len(body["recentIssues"]) == 4
    assert set(body["recentIssues"][0]) == {"id", "identifier", "title", "status", "priority", "projectId",
                                            "parentId", "assigneeAgentId", "createdAt", "updatedAt",
                                            "lastActivityAt"}


def test_dashboard_query_count_is_the_same_for_10_and_10000_rows(board_client, company):
    agent = AgentFactory(company=company)
    now = timezone.now()

    def add(n, start):
        Issue.objects.bulk_create([Issue(company=company, number=start + i, identifier=f"{company.issue_prefix}-{start + i}",
                                         title=f"i{i}", status=("todo", "done", "blocked")[i % 3])
                                   for i in range(n)], batch_size=1000)
        HeartbeatRun.objects.bulk_create([HeartbeatRun(company=company, agent=agent, status="succeeded", finished_at=now)
                                          for _ in range(n)], batch_size=1000)
        CostEvent.objects.bulk_create([CostEvent(company=company, agent=agent, provider="p", model="m", cost_cents=1,
                                                 occurred_at=now) for _ in range(n)], batch_size=1000)
        Agent.objects.bulk_create([Agent(company=company, name=f"bulk-{start + i}") for i in range(n)],
                                  batch_size=1000)

    add(10, 1)
    small, body = count_queries(board_client, url(company, "/dashboard"))
    assert body["costs"]["monthSpendCents"] == 10
    add(9990, 11)
    large, body = count_queries(board_client, url(company, "/dashboard"))
    assert body["costs"]["monthSpendCents"] == 10000 and len(body["recentIssues"]) == 50
    assert body["runActivity"][-1]["succeeded"] == 10000
    assert small == large


def test_cost_reports_query_count_is_the_same_for_10_and_10000_events(board_client, company):
    agents = AgentFactory.create_batch(3, company=company)
    project = ProjectFactory(company=company)
    now = timezone.now()

    def add(n):
        CostEvent.objects.bulk_create([CostEvent(company=company, agent=agents[i % 3], provider="p", model="m",
                                                 cost_cents=2, project=project, occurred_at=now) for i in range(n)],
                                      batch_size=1000)

    add(10)
    small = [count_queries(board_client, url(company, f"/costs/{kind}"))[0]
             for kind in ("summary", "by-agent", "by-project")]
    add(9990)
    large = [count_queries(board_client, url(company, f"/costs/{kind}")) for kind in ("summary", "by-agent", "by-project")]
    assert small == [n for n, _ in large]
    assert large[0][1]["spendCents"] == 20000 and sum(r["costCents"] for r in large[1][1]) == 20000


# --- activity -------------------------------------------------------------------------------------------------------

def test_activity_lists_newest_first_with_upstream_filters(board_client, make_agent_client, company):
    client = make_agent_client(company=company)
    goal = client.post(url(company, "/goals"), {"title": "By the agent"}, format="json").json()
    board_client.post(url(company, "/goals"), {"title": "By the board"}, format="json")
    rows = board_client.get(url(company, "/activity")).json()
    assert [r["details"].get("title") for r in rows[:2]] == ["By the board", "By the agent"]
    assert set(rows[0]) == {"id", "companyId", "actorType", "actorId", "action", "entityType", "entityId", "agentId",
                            "runId", "details", "createdAt"}
    mine = client.get(url(company, f"/activity?agentId={client.agent.pk}")).json()
    assert [(r["action"], r["actorType"], r["actorId"], r["agentId"], r["runId"]) for r in mine] == [
        ("goal.created", "agent", str(client.agent.pk), str(client.agent.pk), str(client.run.pk))]
    by_entity = board_client.get(url(company, f"/activity?entityType=goal&entityId={goal['id']}")).json()
    assert [r["entityId"] for r in by_entity] == [goal["id"]]
    assert len(board_client.get(url(company, "/activity?limit=1")).json()) == 1
    assert_error(board_client.get(url(company, "/activity?agentId=nope")), 400, "invalid_filter", fields=("agentId",))
    assert_error(board_client.get(url(company, "/activity?limit=0")), 400, fields=("limit",))


def test_board_writes_activity_rows_that_name_their_real_author(board_client, board_user, make_agent_client, company):
    agent = AgentFactory(company=company)
    response = board_client.post(url(company, "/activity"), {
        "actorType": "agent", "actorId": str(agent.pk), "agentId": str(agent.pk), "action": "deploy.finished",
        "entityType": "company", "entityId": str(company.pk), "details": {"version": "1.2"}}, format="json")
    assert response.status_code == 201, response.content
    row = response.json()
    assert (row["action"], row["actorType"], row["actorId"], row["agentId"]) == (
        "deploy.finished", "user", str(board_user.pk), None)
    assert row["details"] == {"version": "1.2", "reportedActor": {"actorType": "agent", "actorId": str(agent.pk),
                                                                   "agentId": str(agent.pk)}}
    client = make_agent_client(company=company)
    before = ActivityLog.objects.count()
    body = {"actorId": "x", "action": "a", "entityType": "company", "entityId": "x"}
    assert_error(client.post(url(company, "/activity"), body, format="json"), 403, "board_only")
    assert_error(board_for(company, role="viewer").post(url(company, "/activity"), body, format="json"),
                 403, "read_only_role")
    assert_error(board_client.post(url(company, "/activity"), {**body, "action": "x" * 65}, format="json"),
                 400, fields=("action",))
    assert_error(board_client.post(url(company, "/activity"), {**body, "agentId": str(AgentFactory().pk)},
                                   format="json"), 404, fields=("agentId",))
    assert ActivityLog.objects.count() == before


def test_activity_query_count_is_the_same_for_10_and_10000_rows(board_client, company):
    agent = AgentFactory(company=company)

    def add(n):
        ActivityLog.objects.bulk_create([ActivityLog(company=company, actor_type="agent", actor_agent=agent,
                                                     action="issue.updated", entity_type="issue", entity_id=str(i))
                                         for i in range(n)], batch_size=1000)

    add(10)
    small, body = count_queries(board_client, url(company, f"/activity?agentId={agent.pk}"))
    add(9990)
    large, body2 = count_queries(board_client, url(company, f"/activity?agentId={agent.pk}"))
    assert (len(body), len(body2)) == (10, 500) and small == large


# --- over real HTTP ------------------------------------------------------------------------------------------------------

def http(live_server, method, path, key, body=None):
    request = urllib.request.Request(f"{live_server.url}{path}", method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.django_db(transaction=True)
def test_an_agent_key_reports_costs_and_reads_the_ledger_over_http(live_server, make_agent_client):
    client = make_agent_client(company=CompanyFactory(), with_run=False)
    agent, key = client.agent, client.raw_key
    company_path = f"/api/companies/{agent.company_id}"
    status, event = http(live_server, "POST", f"{company_path}/cost-events", key, {
        "agentId": str(agent.pk), "provider": "openai", "model": "gpt", "costCents": 42, "inputTokens": 7,
        "occurredAt": datetime.now(dt_timezone.utc).isoformat()})
    assert status == 201, event
    status, summary = http(live_server, "GET", f"{company_path}/costs/summary", key)
    assert (status, summary["spendCents"]) == (200, 42)
    status, rows = http(live_server, "GET", f"{company_path}/costs/by-agent", key)
    assert rows[0]["agentId"] == str(agent.pk) and rows[0]["inputTokens"] == 7
    status, board_only = http(live_server, "PATCH", f"{company_path}/budgets", key, {"budgetMonthlyCents": 1})
    assert status == 403 and board_only["code"] == "board_only"
    status, dashboard = http(live_server, "GET", f"{company_path}/dashboard", key)
    assert status == 200 and dashboard["costs"]["monthSpendCents"] == 42


def test_company_stats_count_agents_and_issues_of_the_callers_companies(
        board_client, board_user, company, make_agent_client):
    AgentFactory(company=company)
    AgentFactory(company=company)
    IssueFactory(company=company)
    empty = CompanyFactory()
    MembershipFactory(company=empty, user=board_user, role="viewer")
    stranger = CompanyFactory()
    AgentFactory(company=stranger)

    stats = board_client.get("/api/companies/stats")

    assert stats.status_code == 200, stats.content
    assert stats.json() == {str(company.pk): {"agentCount": 2, "issueCount": 1},
                            str(empty.pk): {"agentCount": 0, "issueCount": 0}}
    assert_error(make_agent_client(company=company).get("/api/companies/stats"), 403, "board_only")
