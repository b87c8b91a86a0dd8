"""``blockedByIssueIds`` on issue create and PATCH, and the detail's ``blockedBy`` / ``blocks``
(reference §5.2): same company, never itself, no cycles (422); a PATCH replaces the whole set."""
from django.test.utils import CaptureQueriesContext
from django.db import connection

from issues.models import ActivityLog, IssueRelation
from tests.factories import CompanyFactory, IssueFactory
from tests.test_errors import assert_error


def blockers_of(issue):
    return set(IssueRelation.objects.filter(related_issue=issue, kind="blocks").values_list("issue_id", flat=True))


def test_create_with_blockers_and_the_detail_shows_both_sides(board_client, company):
    first, second = IssueFactory(company=company), IssueFactory(company=company, status="done")
    response = board_client.post(f"/api/companies/{company.pk}/issues", {
        "title": "Ship it", "blockedByIssueIds": [str(first.pk), str(second.pk)]}, format="json")
    assert response.status_code == 201, response.content
    new_id = response.json()["id"]
    assert blockers_of(new_id) == {first.pk, second.pk}

    detail = board_client.get(f"/api/issues/{new_id}").json()
    # Every blocker is listed with its status (a done one included), as upstream's summaries.
    assert {b["id"]: b["status"] for b in detail["blockedBy"]} == {str(first.pk): "todo", str(second.pk): "done"}
    assert set(detail["blockedBy"][0]) >= {"id", "identifier", "title", "status", "priority", "assigneeAgentId"}
    assert [b["id"] for b in board_client.get(f"/api/issues/{first.pk}").json()["blocks"]] == [new_id]


def test_patch_replaces_the_whole_set_and_empty_clears(board_client, company):
    issue, a, b = (IssueFactory(company=company) for _ in range(3))
    url = f"/api/issues/{issue.pk}"
    assert board_client.patch(url, {"blockedByIssueIds": [str(a.pk)]}, format="json").status_code == 200
    assert board_client.patch(url, {"blockedByIssueIds": [str(b.pk)]}, format="json").status_code == 200
    assert blockers_of(issue) == {b.pk}
    entry = ActivityLog.objects.filter(entity_id=issue.pk, action="issue.updated").order_by("created_at").last()
    assert entry.details["changes"]["blockedByIssueIds"] == [[str(a.pk)], [str(b.pk)]]
    assert board_client.patch(url, {"blockedByIssueIds": []}, format="json").status_code == 200
    assert blockers_of(issue) == set()


def test_self_cycles_and_other_companies_are_422_and_change_nothing(board_client, company):
    a, b, c = (IssueFactory(company=company) for _ in range(3))
    foreign = IssueFactory(company=CompanyFactory())
    board_client.patch(f"/api/issues/{b.pk}", {"blockedByIssueIds": [str(a.pk)]}, format="json")  # a blocks b
    board_client.patch(f"/api/issues/{c.pk}", {"blockedByIssueIds": [str(b.pk)]}, format="json")  # b blocks c
    for target, ids in ((a, [a.pk]), (a, [c.pk]), (a, [b.pk]), (a, [foreign.pk])):
        response = board_client.patch(f"/api/issues/{target.pk}", {"blockedByIssueIds": [str(i) for i in ids]},
                                      format="json")
        assert_error(response, 422, fields=("blockedByIssueIds",))
    assert blockers_of(a) == set()
    response = board_client.post(f"/api/companies/{company.pk}/issues",
                                 {"title": "x", "blockedByIssueIds": [str(foreign.pk)]}, format="json")
    assert_error(response, 422, fields=("blockedByIssueIds",))


def test_issue_detail_reads_blockers_in_constant_queries(board_client, company):
    issue = IssueFactory(company=company)

    def count():
        with CaptureQueriesContext(connection) as ctx:
            assert board_client.get(f"/api/issues/{issue.pk}").status_code == 200
        return len(ctx)

    few = [IssueFactory(company=company) for _ in range(2)]
    board_client.patch(f"/api/issues/{issue.pk}", {"blockedByIssueIds": [str(i.pk) for i in few]}, format="json")
    baseline = count()
    many = few + [IssueFactory(company=company) for _ in range(20)]
    board_client.patch(f"/api/issues/{issue.pk}", {"blockedByIssueIds": [str(i.pk) for i in many]}, format="json")
    assert count() == baseline
