"""``GET /api/agents/me/inbox/mine?userId=`` (upstream §5.1): an agent reads a board member's Mine
inbox — the issues the member created, was assigned or commented on — with when the member last
touched each one and whether someone else has commented since."""
from datetime import timedelta

from django.utils import timezone

from issues.actors import SYSTEM, Actor
from issues.models import Comment
from issues.services.thread import comment_create
from tests.factories import CompanyFactory, IssueFactory, MembershipFactory
from tests.test_errors import assert_error


def mine(client, user_id, query=""):
    return client.get(f"/api/agents/me/inbox/mine?userId={user_id}{query}")


def backdate(comment, minutes):
    Comment.objects.filter(pk=comment.pk).update(created_at=timezone.now() - timedelta(minutes=minutes))


def test_the_members_issues_with_their_last_touch_and_unread_state(agent_client, company):
    member = MembershipFactory(company=company, role="operator").user
    created = IssueFactory(company=company, title="Created by the member", created_by_user=member)
    assigned = IssueFactory(company=company, title="Assigned to the member", assignee_user=member)
    discussed = IssueFactory(company=company, title="Discussed", status="done", completed_at=timezone.now())
    backdate(comment_create(actor=Actor(user=member), issue=discussed, body="Is this fixed?"), 10)
    answer = comment_create(actor=Actor(agent=agent_client.agent), issue=discussed, body="Yes, shipped.")
    backdate(answer, 5)
    IssueFactory(company=company, title="Untouched")
    cancelled = IssueFactory(company=company, title="Cancelled", status="cancelled", created_by_user=member,
                             cancelled_at=timezone.now())

    response = mine(agent_client, member.pk)

    assert response.status_code == 200, response.content
    rows = {row["title"]: row for row in response.json()}
    assert set(rows) == {"Created by the member", "Assigned to the member", "Discussed"}
    assert rows["Discussed"]["isUnreadForMe"] is True
    assert rows["Discussed"]["lastExternalCommentAt"] is not None
    assert rows["Discussed"]["myLastTouchAt"] < rows["Discussed"]["lastExternalCommentAt"]
    assert rows["Created by the member"]["myLastTouchAt"] is not None
    assert rows["Created by the member"]["isUnreadForMe"] is False
    assert (rows["Assigned to the member"]["myLastTouchAt"], rows["Assigned to the member"]["isUnreadForMe"]) == (
        None, False)
    # The member answers: read again.
    comment_create(actor=Actor(user=member), issue=discussed, body="Thanks")
    assert {r["title"]: r["isUnreadForMe"] for r in mine(agent_client, member.pk).json()}["Discussed"] is False
    # The list's filters apply: status narrows or widens the default.
    assert [r["id"] for r in mine(agent_client, member.pk, "&status=cancelled").json()] == [str(cancelled.pk)]
    assert {r["id"] for r in mine(agent_client, member.pk, "&status=todo").json()} == {str(created.pk),
                                                                                       str(assigned.pk)}


def test_user_id_is_required_and_must_be_a_member_of_the_company(agent_client, company):
    assert_error(agent_client.get("/api/agents/me/inbox/mine"), 400, fields=("userId",))
    outsider = MembershipFactory(company=CompanyFactory()).user
    IssueFactory(company=outsider.memberships.get().company, created_by_user=outsider)
    for user_id in (outsider.pk, 987654, "abc"):
        error = assert_error(mine(agent_client, user_id), 404, fields=("userId",))
        assert error["details"]["userId"] == ["No such member of this company."]
    assert_error(mine(agent_client, outsider.pk, "&status=nope"), 404)  # the member check comes first


def test_it_is_the_agents_route(board_client, board_user, company):
    assert_error(mine(board_client, board_user.pk), 401, "agent_auth_required")


def test_a_bad_filter_is_a_400_naming_it(agent_client, company):
    member = MembershipFactory(company=company).user
    comment_create(actor=SYSTEM, issue=IssueFactory(company=company, created_by_user=member), body="x")
    assert_error(mine(agent_client, member.pk, "&status=nope"), 400, fields=("status",))
