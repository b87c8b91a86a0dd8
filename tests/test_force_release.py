"""``POST /api/issues/{id}/admin/force-release[?clearAssignee=true]`` (paperclip-api.md §5.2, 2026): the
board clears a stranded checkout and execution lock; always audited."""
import pytest
from django.utils import timezone

from issues.models import ActivityLog, Issue
from tests.factories import AgentFactory, CompanyFactory, IssueFactory, MembershipFactory, RunFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def stranded(company):
    """An in-progress issue whose lock names a run that failed without clearing it."""
    agent = AgentFactory(company=company)
    dead = RunFactory(agent=agent, status="failed", started_at=timezone.now(), finished_at=timezone.now())
    return IssueFactory(company=company, status="in_progress", assignee_agent=agent, checkout_run=dead,
                        execution_run=dead, execution_locked_at=timezone.now(), started_at=timezone.now())


def url(issue, **query):
    suffix = "&".join(f"{k}={v}" for k, v in query.items())
    return f"/api/issues/{issue.pk}/admin/force-release" + (f"?{suffix}" if suffix else "")


def test_the_board_clears_the_lock_and_keeps_status_and_assignee(board_client, board_user, stranded):
    dead = stranded.checkout_run_id
    response = board_client.post(url(stranded))
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["previous"] == {"checkoutRunId": str(dead), "executionRunId": str(dead)}
    kept = (body["issue"]["status"], body["issue"]["assigneeAgentId"])
    assert kept == ("in_progress", str(stranded.assignee_agent_id))
    assert body["issue"]["checkoutRunId"] is None and body["issue"]["executionRunId"] is None
    stranded.refresh_from_db()
    assert (stranded.checkout_run_id, stranded.execution_run_id, stranded.execution_locked_at) == (None, None, None)
    entry = ActivityLog.objects.get(action="issue.admin_force_release", entity_id=str(stranded.pk))
    assert entry.actor_user == board_user
    assert entry.details == {"issueId": str(stranded.pk), "actorUserId": str(board_user.pk),
                             "prevCheckoutRunId": str(dead), "prevExecutionRunId": str(dead), "clearAssignee": False}


def test_clear_assignee_detaches_the_agent_too(board_client, stranded):
    response = board_client.post(url(stranded, clearAssignee="true"))
    assert response.status_code == 200, response.content
    assert response.json()["issue"]["assigneeAgentId"] is None
    stranded.refresh_from_db()
    # in progress needs an owner (a database constraint): the work goes back to the queue, as a release
    assert stranded.assignee_agent_id is None and stranded.status == "todo"
    assert response.json()["issue"]["status"] == "todo"


def test_with_clear_assignee_another_agent_takes_the_work_over(board_client, company, stranded, make_agent_client):
    """The stranded work's agent is gone for good: the board frees the issue and someone else claims it."""
    other = make_agent_client(company=company, name="Successor")
    body = {"agentId": str(other.agent.pk), "expectedStatuses": ["todo", "in_progress"]}
    refused = other.post(f"/api/issues/{stranded.pk}/checkout", body, format="json")
    assert refused.status_code == 409, refused.content
    assert board_client.post(url(stranded, clearAssignee="true")).status_code == 200
    claimed = other.post(f"/api/issues/{stranded.pk}/checkout", body, format="json")
    assert claimed.status_code == 200, claimed.content
    owner = (claimed.json()["assigneeAgentId"], claimed.json()["checkoutRunId"])
    assert owner == (str(other.agent.pk), str(other.run.pk))


@pytest.mark.parametrize("who", ["agent", "viewer"])
def test_agents_and_viewers_are_refused_and_nothing_changes(who, company, stranded, make_agent_client, client):
    if who == "agent":
        caller = make_agent_client(company=company, role="ceo")
    else:
        client.force_login(MembershipFactory(company=company, role="viewer").user)
        caller = client
    before = Issue.objects.filter(pk=stranded.pk).values().get()
    response = caller.post(url(stranded))
    assert response.status_code == 403, response.content
    assert Issue.objects.filter(pk=stranded.pk).values().get() == before
    assert not ActivityLog.objects.filter(action="issue.admin_force_release").exists()


def test_a_bad_flag_names_it_and_another_companys_issue_is_a_404(board_client, stranded):
    response = board_client.post(url(stranded, clearAssignee="yes"))
    assert response.status_code == 400 and "clearAssignee" in response.json()["details"], response.content
    stranded.refresh_from_db()
    assert stranded.checkout_run_id is not None
    foreign = IssueFactory(company=CompanyFactory())
    assert board_client.post(url(foreign)).status_code == 404


def test_the_console_shows_the_lock_and_releases_it(board_client, stranded):
    from django.urls import reverse

    page = board_client.get(reverse("console:issue-detail", args=[stranded.identifier])).content.decode()
    assert 'id="lock"' in page and str(stranded.checkout_run_id) in page
    response = board_client.post(reverse("console:issue-force-release", args=[stranded.identifier]),
                                 {"clear_assignee": "on"})
    assert response.status_code == 302, response.content
    stranded.refresh_from_db()
    assert (stranded.checkout_run_id, stranded.assignee_agent_id, stranded.status) == (None, None, "todo")
    page = board_client.get(reverse("console:issue-detail", args=[stranded.identifier])).content.decode()
    assert 'id="lock"' not in page and "Lock released. The agent is unassigned." in page


def test_a_console_viewer_sees_the_lock_but_cannot_release_it(client, company, stranded):
    from django.urls import reverse

    client.force_login(MembershipFactory(company=company, role="viewer").user)
    page = client.get(reverse("console:issue-detail", args=[stranded.identifier])).content.decode()
    assert 'id="lock"' in page and reverse("console:issue-force-release", args=[stranded.identifier]) not in page
    response = client.post(reverse("console:issue-force-release", args=[stranded.identifier]))
    assert response.status_code == 403
    stranded.refresh_from_db()
    assert stranded.checkout_run_id is not None
