"""Another company's object is a 404, in list filters too: an id parameter naming no object of the
company (another company's, or none) answers 404 naming the parameter, exactly as an unknown id does;
an id of the company's own with nothing to list is an empty page."""
import uuid

import pytest

from tests.factories import AgentFactory, CompanyFactory, GoalFactory, IssueFactory, ProjectFactory
from tests.test_errors import assert_error

ISSUE_REFS = ("assigneeAgentId", "participantAgentId", "projectId", "goalId", "parentId", "descendantOf",
              "labelId")


def world(company):
    from issues.models import Label

    agent = AgentFactory(company=company)
    project, goal = ProjectFactory(company=company), GoalFactory(company=company)
    parent = IssueFactory(company=company, title="Parent")
    label = Label.objects.create(company=company, name="bug")
    return {"assigneeAgentId": agent.pk, "participantAgentId": agent.pk, "ownerAgentId": agent.pk,
            "agentId": agent.pk, "projectId": project.pk, "goalId": goal.pk, "parentId": parent.pk,
            "descendantOf": parent.pk, "labelId": label.pk}


@pytest.fixture
def theirs(db):
    return world(CompanyFactory(enable_cases=True))


@pytest.mark.parametrize("path,param", [*[("issues", p) for p in ISSUE_REFS], ("goals", "ownerAgentId"),
                                        ("activity", "agentId"), ("cases", "projectId")])
def test_a_filter_naming_another_companys_object_is_a_404(board_client, company, theirs, path, param):
    company.enable_cases = True
    company.save()
    mine = world(company)
    url = f"/api/companies/{company.pk}/{path}"
    own = board_client.get(url, {param: str(mine[param])})
    assert own.status_code == 200, own.content  # the company's own id: a page, maybe empty
    foreign = board_client.get(url, {param: str(theirs[param])})
    unknown = board_client.get(url, {param: str(uuid.uuid4())})
    assert_error(foreign, 404, "not_found", fields=[param])
    assert foreign.json() == unknown.json()  # nothing tells another company's id from no id


def test_unassigned_is_still_a_filter_not_an_id(board_client, company):
    IssueFactory(company=company, title="Nobody's")
    url = f"/api/companies/{company.pk}/issues"
    assert [i["title"] for i in board_client.get(url, {"assigneeAgentId": "null"}).json()] == ["Nobody's"]
    IssueFactory(company=company, assignee_agent=AgentFactory(company=company))
    assert [i["title"] for i in board_client.get(url, {"assigneeAgentId": "null"}).json()] == ["Nobody's"]
    assert board_client.get(url, {"assigneeAgentId": "null", "status": "done"}).json() == []  # empty, not 404


def test_a_page_with_rows_costs_no_check(board_client, company):
    """The check runs only for an empty page: the inbox read keeps its query count."""
    agent, idle = AgentFactory(company=company), AgentFactory(company=company)
    IssueFactory(company=company, assignee_agent=agent)
    url = f"/api/companies/{company.pk}/issues"
    board_client.get(url, {"assigneeAgentId": str(agent.pk)})  # warm the session and caches
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as rows:
        assert len(board_client.get(url, {"assigneeAgentId": str(agent.pk)}).json()) == 1
    with CaptureQueriesContext(connection) as empty:
        assert board_client.get(url, {"assigneeAgentId": str(idle.pk)}).json() == []
    # a page with rows: no check; an empty one: the check, and no labels to read
    def checks(ctx):
        return [q for q in ctx.captured_queries if q["sql"].startswith('SELECT 1 AS "a" FROM "issues_agent"')]

    assert (len(checks(rows)), len(checks(empty))) == (0, 1)
    assert len(empty.captured_queries) == len(rows.captured_queries)
