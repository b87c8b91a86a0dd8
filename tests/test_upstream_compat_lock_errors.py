"""Upstream's lock-contract messages (ref §6, §7, §2.3), which clients match on, and the blocker
guard on a PATCH into in_progress (ref §6: "entering in_progress (PATCH or checkout) with
unresolved blockers → 422"). The project's machine codes stay beside upstream's messages."""
import pytest
from django.urls import reverse

from issues.actors import Actor
from issues.exceptions import BlockedByOpenIssues
from issues.models import ActivityLog, Comment, Issue, IssueRelation
from issues.services.issues import issue_update
from tests.factories import AgentFactory, IssueFactory, RunFactory, UserFactory

EXPECTED = ["todo", "backlog", "blocked", "in_review"]


def checkout(client, issue, agent, expected=EXPECTED):
    return client.post(f"/api/issues/{issue.pk}/checkout", {"agentId": str(agent.pk), "expectedStatuses": expected},
                       format="json")


def refused(response, status, code, error):
    body = response.json()
    assert (response.status_code, body["code"], body["error"]) == (status, code, error), body
    return body


def blocked_by(issue, blocker):
    IssueRelation.objects.create(company=issue.company, issue=blocker, related_issue=issue)
    return blocker


# --- messages (ref §7 step 8, §2.3, §6) ----------------------------------------------------------------------


def test_checkout_held_by_a_live_run_is_issue_checkout_conflict(make_agent_client, company, issue):
    holder = make_agent_client(company=company)
    assert checkout(holder, issue, holder.agent).status_code == 200
    other = make_agent_client(company=company)
    body = refused(checkout(other, issue, other.agent), 409, "checkout_conflict", "Issue checkout conflict")
    assert body["details"]["checkoutRunId"] == str(holder.run.pk)


def test_agent_checking_out_for_another_agent_is_upstreams_403(make_agent_client, company, issue):
    me, someone = make_agent_client(company=company), AgentFactory(company=company)
    refused(checkout(me, issue, someone), 403, "agent_mismatch", "Agent can only checkout as itself")
    assert Issue.objects.get(pk=issue.pk).status == "todo"


def test_every_unclaimable_checkout_is_issue_checkout_conflict_with_its_own_code(agent_client, company):
    # Upstream's one conditional UPDATE refuses a status outside expectedStatuses and another
    # assignee alike (ref §7 steps 7-8); the code and details here say which it was.
    backlog = IssueFactory(company=company, status="backlog")
    body = refused(checkout(agent_client, backlog, agent_client.agent, ["todo"]), 409, "status_not_expected",
                   "Issue checkout conflict")
    assert body["details"]["status"] == "backlog" and body["details"]["expectedStatuses"] == ["todo"]
    someone = AgentFactory(company=company)
    theirs = IssueFactory(company=company, assignee_agent=someone)
    body = refused(checkout(agent_client, theirs, agent_client.agent), 409, "assigned_elsewhere",
                   "Issue checkout conflict")
    assert body["details"]["assigneeAgentId"] == str(someone.pk) and body["details"]["assigneeUserId"] is None
    user = UserFactory()
    users = IssueFactory(company=company, assignee_user=user)
    body = refused(checkout(agent_client, users, agent_client.agent), 409, "assigned_elsewhere",
                   "Issue checkout conflict")
    assert body["details"]["assigneeUserId"] == user.pk


def test_agent_checkout_without_run_header_is_agent_run_id_required(make_agent_client, company, issue):
    runless = make_agent_client(company=company, with_run=False)
    refused(checkout(runless, issue, runless.agent), 401, "run_id_required", "Agent run id required")
    assert Issue.objects.get(pk=issue.pk).status == "todo"


def test_own_issue_under_another_run_is_issue_run_ownership_conflict(agent_client, issue):
    assert checkout(agent_client, issue, agent_client.agent).status_code == 200
    agent_client.use_run(RunFactory(agent=agent_client.agent))
    body = refused(agent_client.patch(f"/api/issues/{issue.pk}", {"title": "hijack"}, format="json"), 409,
                   "not_checkout_owner", "Issue run ownership conflict")
    upstream = {"issueId", "status", "assigneeAgentId", "checkoutRunId", "actorAgentId", "actorRunId"}
    assert upstream <= set(body["details"])
    assert Issue.objects.get(pk=issue.pk).title == issue.title


def test_another_agents_checked_out_issue_says_so(make_agent_client, company, issue):
    holder = make_agent_client(company=company)
    assert checkout(holder, issue, holder.agent).status_code == 200
    other = make_agent_client(company=company)
    body = refused(other.post(f"/api/issues/{issue.pk}/comments", {"body": "mine?"}, format="json"), 409,
                   "not_checkout_owner", "Issue is checked out by another agent")
    assert body["details"]["holderAgentId"] == str(holder.agent.pk)


def test_in_progress_without_assignee_is_upstreams_message(board_client, issue):
    body = refused(board_client.patch(f"/api/issues/{issue.pk}", {"status": "in_progress"}, format="json"), 422,
                   "assignee_required", "in_progress issues require an assignee")
    assert "assigneeAgentId" in body["details"]


def test_checkout_blocked_lists_unresolved_blocker_uuids(agent_client, company, issue):
    blocker = blocked_by(issue, IssueFactory(company=company))
    body = refused(checkout(agent_client, issue, agent_client.agent), 422, "blocked_by_open_issues",
                   "Issue is blocked by unresolved blockers")
    assert body["details"] == {"unresolvedBlockerIssueIds": [str(blocker.pk)], "blockers": [blocker.identifier]}


# --- PATCH into in_progress applies the blocker guard (ref §6) ------------------------------------------------


def test_board_patch_into_in_progress_with_an_open_blocker_is_422_and_writes_nothing(board_client, agent_client,
                                                                                     company):
    issue = IssueFactory(company=company, assignee_agent=agent_client.agent)
    blocker = blocked_by(issue, IssueFactory(company=company, status="in_review"))
    before = ActivityLog.objects.count()
    response = board_client.patch(f"/api/issues/{issue.identifier}",
                                  {"status": "in_progress", "title": "Started", "comment": "go"}, format="json")
    body = refused(response, 422, "blocked_by_open_issues", "Issue is blocked by unresolved blockers")
    assert body["details"] == {"unresolvedBlockerIssueIds": [str(blocker.pk)], "blockers": [blocker.identifier]}
    issue = Issue.objects.get(pk=issue.pk)
    assert (issue.status, issue.title != "Started", issue.started_at) == ("todo", True, None)
    assert ActivityLog.objects.count() == before and not Comment.objects.filter(issue=issue).exists()
    # The same body as checkout's refusal of the same issue.
    assert checkout(agent_client, issue, agent_client.agent).json() == body


@pytest.mark.parametrize("resolved", ["done", "cancelled"])
def test_done_and_cancelled_blockers_count_as_resolved_only_those(board_client, company, resolved):
    assignee = AgentFactory(company=company)
    issue = IssueFactory(company=company, assignee_agent=assignee)
    blocked_by(issue, IssueFactory(company=company, status=resolved))
    open_one = blocked_by(issue, IssueFactory(company=company, status="blocked"))
    body = refused(board_client.patch(f"/api/issues/{issue.pk}", {"status": "in_progress"}, format="json"), 422,
                   "blocked_by_open_issues", "Issue is blocked by unresolved blockers")
    assert body["details"]["unresolvedBlockerIssueIds"] == [str(open_one.pk)]
    Issue.objects.filter(pk=open_one.pk).update(status=resolved)
    response = board_client.patch(f"/api/issues/{issue.pk}", {"status": "in_progress"}, format="json")
    assert response.status_code == 200 and response.json()["status"] == "in_progress"
    # Only entering in_progress is guarded: a later blocker does not stop other changes.
    Issue.objects.filter(pk=open_one.pk).update(status="todo")
    assert board_client.patch(f"/api/issues/{issue.pk}", {"title": "Still going"}, format="json").status_code == 200


def test_patch_counts_the_blocker_set_it_sets(board_client, company):
    issue = IssueFactory(company=company, assignee_agent=AgentFactory(company=company))
    old = blocked_by(issue, IssueFactory(company=company))
    new = IssueFactory(company=company)
    body = refused(board_client.patch(f"/api/issues/{issue.pk}", {"status": "in_progress",
                                                                  "blockedByIssueIds": [str(new.pk)]},
                                      format="json"), 422, "blocked_by_open_issues",
                   "Issue is blocked by unresolved blockers")
    assert body["details"]["unresolvedBlockerIssueIds"] == [str(new.pk)]
    assert list(IssueRelation.objects.filter(related_issue=issue).values_list("issue_id", flat=True)) == [old.pk]
    # Clearing the blockers in the same PATCH lets it start.
    response = board_client.patch(f"/api/issues/{issue.pk}", {"status": "in_progress", "blockedByIssueIds": []},
                                  format="json")
    assert response.status_code == 200 and response.json()["status"] == "in_progress"


def test_service_callers_get_the_guard_too(board_user, company):
    # The console and the Django admin change issues through issue_update with the board user.
    issue = IssueFactory(company=company, assignee_agent=AgentFactory(company=company))
    blocker = blocked_by(issue, IssueFactory(company=company))
    with pytest.raises(BlockedByOpenIssues) as refusal:
        issue_update(actor=Actor(user=board_user), issue=issue, changes={"status": "in_progress"})
    assert refusal.value.details["unresolvedBlockerIssueIds"] == [str(blocker.pk)]
    assert Issue.objects.get(pk=issue.pk).status == "todo"


def test_console_status_change_into_in_progress_is_refused_with_the_message(board_client, company):
    issue = IssueFactory(company=company, assignee_agent=AgentFactory(company=company))
    blocked_by(issue, IssueFactory(company=company))
    response = board_client.post(reverse("console:issue-change", args=[issue.identifier]), {"status": "in_progress"},
                           follow=True)
    assert response.status_code == 200
    assert "Issue is blocked by unresolved blockers" in response.content.decode()
    assert Issue.objects.get(pk=issue.pk).status == "todo"
