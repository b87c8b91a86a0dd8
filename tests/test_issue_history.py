"""An issue's own history over the upstream routes (paperclip-api.md §5.2 "Other issue routes"):
``GET /issues/{id}/activity`` (its audit rows) and ``GET /issues/{id}/runs`` (the runs woken for it
and the runs that wrote to it)."""
from datetime import timedelta

from django.utils import timezone

from issues.models import Comment
from tests.factories import IssueFactory, RunFactory
from tests.queries import count_queries
from tests.test_errors import assert_error


def actions(response):
    assert response.status_code == 200, response.content
    return [row["action"] for row in response.json()]


def test_activity_lists_the_issue_rows_newest_first_and_nothing_of_other_issues(board_client, company):
    issue, other = IssueFactory(company=company), IssueFactory(company=company)
    board_client.patch(f"/api/issues/{issue.pk}", {"priority": "high"}, format="json")
    board_client.post(f"/api/issues/{issue.pk}/comments", {"body": "On it"}, format="json")
    board_client.patch(f"/api/issues/{other.pk}", {"priority": "low"}, format="json")

    got = actions(board_client.get(f"/api/issues/{issue.identifier}/activity"))

    assert got == ["comment.created", "issue.updated"]
    rows = board_client.get(f"/api/issues/{issue.pk}/activity").json()
    assert {(r["entityType"], r["entityId"]) for r in rows} == {("issue", str(issue.pk))}


def test_activity_takes_the_activity_filters_and_a_bounded_window(board_client, company):
    issue = IssueFactory(company=company)
    for priority in ("high", "low", "medium"):
        board_client.patch(f"/api/issues/{issue.pk}", {"priority": priority}, format="json")
    board_client.post(f"/api/issues/{issue.pk}/comments", {"body": "note"}, format="json")

    assert actions(board_client.get(f"/api/issues/{issue.pk}/activity?action=issue.updated")) == ["issue.updated"] * 3
    assert len(board_client.get(f"/api/issues/{issue.pk}/activity?limit=2").json()) == 2
    assert_error(board_client.get(f"/api/issues/{issue.pk}/activity?limit=0"), 400, fields=("limit",))


def test_activity_is_one_query_after_the_issue_whatever_its_length(board_client, company):
    issue = IssueFactory(company=company)

    def page_queries(total):
        while Comment.objects.filter(issue=issue).count() < total:
            board_client.post(f"/api/issues/{issue.pk}/comments", {"body": "note"}, format="json")
        queries, body = count_queries(board_client, f"/api/issues/{issue.pk}/activity")
        assert len(body) == total
        return queries

    assert page_queries(1) == page_queries(20)


def test_runs_are_those_woken_for_the_issue_and_those_that_wrote_to_it(make_agent_client, board_client, company):
    issue, other = IssueFactory(company=company), IssueFactory(company=company)
    writer = make_agent_client(company=company)  # its run was woken for nothing; it comments on the issue
    woken = RunFactory(agent=writer.agent, issue=issue, status="succeeded", adapter_type="process",
                       finished_at=timezone.now())
    RunFactory(agent=writer.agent, issue=other, status="succeeded", finished_at=timezone.now())
    earlier = timezone.now() - timedelta(minutes=5)
    type(woken).objects.filter(pk=woken.pk).update(created_at=earlier)
    assert writer.post(f"/api/issues/{issue.pk}/comments", {"body": "Found it"}, format="json").status_code == 201

    response = board_client.get(f"/api/issues/{issue.identifier}/runs")

    assert response.status_code == 200, response.content
    body = response.json()
    assert [r["id"] for r in body] == [str(writer.run.pk), str(woken.pk)]  # newest first
    assert all(r["runId"] == r["id"] for r in body)
    assert body[1]["adapterType"] == "process" and body[1]["issueId"] == str(issue.pk)
    assert "context" not in body[0]


def test_runs_are_bounded_by_limit_and_refuse_a_bad_one(board_client, company):
    issue = IssueFactory(company=company)
    for _ in range(3):
        RunFactory(company=company, agent__company=company, issue=issue)

    assert len(board_client.get(f"/api/issues/{issue.pk}/runs?limit=2").json()) == 2
    assert_error(board_client.get(f"/api/issues/{issue.pk}/runs?limit=0"), 400, fields=("limit",))
    assert_error(board_client.get(f"/api/issues/{issue.pk}/runs?limit=abc"), 400, fields=("limit",))


def test_an_agent_reads_its_company_issue_history(agent_client, board_client, company):
    issue = IssueFactory(company=company)
    run = RunFactory(agent=agent_client.agent, issue=issue)
    board_client.patch(f"/api/issues/{issue.pk}", {"priority": "high"}, format="json")
    runs = agent_client.get(f"/api/issues/{issue.pk}/runs")
    assert runs.status_code == 200 and [r["id"] for r in runs.json()] == [str(run.pk)]
    assert actions(agent_client.get(f"/api/issues/{issue.pk}/activity")) == ["issue.updated"]
