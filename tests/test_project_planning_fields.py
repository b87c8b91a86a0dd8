"""A project's planning fields (upstream §5.5: goalIds, leadAgentId, targetDate, color, icon) are
stored and read back, scoped to the project's company, and audited like its other fields."""
from issues.models import ActivityLog, Project
from tests.factories import AgentFactory, CompanyFactory, GoalFactory, ProjectFactory
from tests.test_errors import assert_error


def _create(client, company, **fields):
    return client.post(f"/api/companies/{company.pk}/projects", {"name": "Launch", **fields}, format="json")


def test_planning_fields_are_stored_and_read_back(board_client, company):
    lead = AgentFactory(company=company)
    first, second = GoalFactory(company=company), GoalFactory(company=company)
    response = _create(board_client, company, goalIds=[str(first.pk), str(second.pk)], leadAgentId=str(lead.pk),
                       targetDate="2027-03-31", color="#6366f1", icon="rocket")
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["goalIds"], body["goalId"]) == ([str(first.pk), str(second.pk)], str(first.pk))
    assert (body["leadAgentId"], body["targetDate"], body["color"], body["icon"]) == (
        str(lead.pk), "2027-03-31", "#6366f1", "rocket")
    assert board_client.get(f"/api/projects/{body['id']}").json() == body
    listed = board_client.get(f"/api/companies/{company.pk}/projects").json()
    assert [(p["goalIds"], p["leadAgentId"]) for p in listed] == [(body["goalIds"], str(lead.pk))]
    created = ActivityLog.objects.get(action="project.created", entity_id=body["id"])
    assert {"goalIds", "leadAgentId", "targetDate", "color", "icon"} <= set(created.details["changedKeys"])


def test_patch_replaces_goals_and_clears_fields_with_null(board_client, company):
    goal, other_goal = GoalFactory(company=company), GoalFactory(company=company)
    project = ProjectFactory(company=company)
    changed = board_client.patch(f"/api/projects/{project.pk}", {
        "goalIds": [str(goal.pk)], "leadAgentId": str(AgentFactory(company=company).pk),
        "targetDate": "2027-01-15T18:30:00Z", "color": "#000000"}, format="json")
    assert changed.status_code == 200, changed.content
    assert (changed.json()["goalIds"], changed.json()["targetDate"]) == ([str(goal.pk)], "2027-01-15")

    # goalId (deprecated upstream) alone sets the one goal; null clears the others.
    again = board_client.patch(f"/api/projects/{project.pk}", {"goalId": str(other_goal.pk), "leadAgentId": None,
                                                                "targetDate": None, "color": None}, format="json")
    body = again.json()
    assert (body["goalIds"], body["leadAgentId"], body["targetDate"], body["color"]) == (
        [str(other_goal.pk)], None, None, None)
    update = ActivityLog.objects.filter(action="project.updated", entity_id=str(project.pk)).order_by("-created_at")[0]
    assert set(update.details["changedKeys"]) == {"goalIds", "leadAgentId", "targetDate", "color"}

    cleared = board_client.patch(f"/api/projects/{project.pk}", {"goalIds": None}, format="json").json()
    assert cleared["goalIds"] == [] and cleared["goalId"] is None
    # The same values again change nothing and write no activity row.
    rows = ActivityLog.objects.filter(action="project.updated", entity_id=str(project.pk)).count()
    assert board_client.patch(f"/api/projects/{project.pk}", {"goalIds": []}, format="json").status_code == 200
    assert ActivityLog.objects.filter(action="project.updated", entity_id=str(project.pk)).count() == rows


def test_another_companys_lead_or_goal_is_not_found_and_nothing_is_written(board_client, company):
    other = CompanyFactory()
    assert_error(_create(board_client, company, leadAgentId=str(AgentFactory(company=other).pk)), 404, "not_found",
                 fields=("leadAgentId",))
    assert_error(_create(board_client, company, goalIds=[str(GoalFactory(company=other).pk)]), 404, "not_found",
                 fields=("goalIds",))
    assert not Project.objects.filter(company=company).exists()
    project = ProjectFactory(company=company)
    assert_error(board_client.patch(f"/api/projects/{project.pk}", {"goalIds": [str(GoalFactory(company=other).pk)]},
                                    format="json"), 404, "not_found", fields=("goalIds",))
    assert not project.goals.exists()


def test_bad_planning_values_name_the_field(board_client, company):
    assert_error(_create(board_client, company, targetDate="next spring"), 400, "validation_error", fields=("targetDate",))
    assert_error(_create(board_client, company, goalIds=["not-a-uuid"]), 400, "validation_error", fields=("goalIds",))
    assert_error(_create(board_client, company, color="x" * 41), 400, "validation_error", fields=("color",))
