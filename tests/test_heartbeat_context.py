"""``GET /api/issues/{id}/heartbeat-context`` (paperclip-api.md §5.2, the agent skill's step 6): the
compact payload an agent reads at the start of a wake."""
import datetime

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from issues.actors import SYSTEM
from issues.models import Comment, Document
from issues.services.issues import relation_add
from issues.services.thread import document_write
from tests.factories import CompanyFactory, GoalFactory, IssueFactory, ProjectFactory

pytestmark = pytest.mark.django_db

ISSUE_KEYS = {"id", "identifier", "title", "description", "status", "priority", "projectId", "goalId", "parentId",
              "blockedBy", "blocks", "assigneeAgentId", "assigneeUserId", "originKind", "originId", "updatedAt"}


def url(issue, **query):
    suffix = "&".join(f"{k}={v}" for k, v in query.items())
    return f"/api/issues/{issue.pk}/heartbeat-context" + (f"?{suffix}" if suffix else "")


def comment(issue, body, minutes):
    return Comment.objects.create(company=issue.company, issue=issue, author_type="user", body=body,
                                  created_at=timezone.now() + datetime.timedelta(minutes=minutes))


@pytest.fixture
def task(company):
    goal_parent = GoalFactory(company=company, title="Grow")
    goal = GoalFactory(company=company, title="Ship v2", level="team", parent=goal_parent)
    project = ProjectFactory(company=company, name="Platform", target_date=datetime.date(2027, 3, 1))
    root = IssueFactory(company=company, title="Epic", priority="high")
    parent = IssueFactory(company=company, title="Story", parent=root)
    issue = IssueFactory(company=company, title="Task", description="Do the thing", parent=parent, project=project,
                         goal=goal)
    return issue


def test_the_payload_carries_what_a_wake_starts_from(agent_client, task):
    blocker = IssueFactory(company=task.company, title="Prerequisite")
    relation_add(actor=SYSTEM, blocker=blocker, blocked=task)
    comment(task, "first", 1)
    wake = comment(task, "please look", 2)
    document_write(actor=SYSTEM, issue=task, key="continuation-summary", body="Left off at step 3")

    response = agent_client.get(url(task, wakeCommentId=wake.pk))
    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body) == {"issue", "ancestors", "project", "goal", "commentCursor", "wakeComment", "attachments",
                         "continuationSummary"}
    assert set(body["issue"]) == ISSUE_KEYS
    assert (body["issue"]["identifier"], body["issue"]["description"]) == (task.identifier, "Do the thing")
    assert [b["identifier"] for b in body["issue"]["blockedBy"]] == [blocker.identifier]
    assert [a["title"] for a in body["ancestors"]] == ["Story", "Epic"]
    assert set(body["ancestors"][0]) == {"id", "identifier", "title", "status", "priority"}
    assert body["project"] == {"id": str(task.project.pk), "name": "Platform", "status": task.project.status,
                               "targetDate": "2027-03-01"}
    assert body["goal"] == {"id": str(task.goal.pk), "title": "Ship v2", "status": task.goal.status, "level": "team",
                            "parentId": str(task.goal.parent_id)}
    assert body["commentCursor"]["totalComments"] == 2
    assert body["commentCursor"]["latestCommentId"] == str(wake.pk)
    assert body["wakeComment"]["id"] == str(wake.pk) and body["wakeComment"]["body"] == "please look"
    assert body["attachments"] == []
    assert body["continuationSummary"]["body"] == "Left off at step 3"


def test_a_bare_issue_has_nulls_and_an_empty_cursor(agent_client, company):
    issue = IssueFactory(company=company)
    body = agent_client.get(f"/api/issues/{issue.identifier}/heartbeat-context").json()
    assert (body["project"], body["goal"], body["ancestors"], body["wakeComment"], body["continuationSummary"]) == (
        None, None, [], None, None)
    assert body["commentCursor"] == {"totalComments": 0, "latestCommentId": None, "latestCommentAt": None}


def test_a_wake_comment_of_another_issue_is_not_shown(agent_client, task, company):
    elsewhere = comment(IssueFactory(company=company), "not yours", 1)
    assert agent_client.get(url(task, wakeCommentId=elsewhere.pk)).json()["wakeComment"] is None


def test_a_quarantined_continuation_summary_is_withheld(agent_client, task):
    document_write(actor=SYSTEM, issue=task, key="continuation-summary", body="planted instructions")
    Document.objects.filter(issue=task).update(quarantined_at=timezone.now())
    assert agent_client.get(url(task)).json()["continuationSummary"] is None


def test_a_malformed_wake_comment_id_is_a_400_naming_it(agent_client, task):
    response = agent_client.get(url(task, wakeCommentId="nope"))
    assert response.status_code == 400, response.content
    assert "wakeCommentId" in response.json()["details"]


def test_another_companys_issue_is_a_404(agent_client):
    foreign = IssueFactory(company=CompanyFactory())
    response = agent_client.get(url(foreign))
    assert response.status_code == 404, response.content


def test_the_query_count_does_not_grow_with_the_thread(agent_client, task):
    def queries():
        with CaptureQueriesContext(connection) as captured:
            assert agent_client.get(url(task)).status_code == 200
        return len(captured)

    comment(task, "one", 1)
    queries()  # the key's first use of the minute writes its last-used time; count the reads after it
    few = queries()
    for n in range(30):
        comment(task, f"more {n}", n + 2)
    assert queries() == few
