"""Fences inside a company, over the API: an agent writes an in-progress issue (and the case whose
primary task it is) only from the run that holds its checkout (409 ``not_checkout_owner`` with the
lock details), and changes only issues assigned to it, created by it or assigned to its reports
(403 ``not_your_issue``). Board users keep their role rules."""
import pytest

from cases.models import Case, CaseEvent, CaseHandoff, CaseIssueLink
from issues.models import ActivityLog, Document, HeartbeatRun, Issue, IssueRelation, WorkProduct
from issues.services.runs import run_finish
from tests.factories import AgentFactory, IssueFactory, RunFactory
from tests.test_errors import error_of

WORKFLOW = "# Intake\n\nCollect the facts.\n"


@pytest.fixture
def ada(make_agent_client, company):
    return make_agent_client(AgentFactory(company=company, name="ada"))


@pytest.fixture
def bob(make_agent_client, company):
    """Bob delegates: he holds tasks:assign (tests/test_tasks_assign.py), so what refuses him here is
    the issue's owner or its lock."""
    return make_agent_client(AgentFactory(company=company, name="bob", permissions={"canAssignTasks": True}))


def error(response):
    return error_of(response)


def checkout(client, issue_id):
    response = client.post(f"/api/issues/{issue_id}/checkout",
                           {"agentId": str(client.agent.pk), "expectedStatuses": ["todo"]}, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def assert_lock_refusal(response, *, issue_id, holder, actor):
    """409 with the same code and details as every issue-write refusal."""
    assert response.status_code == 409, response.content
    err = error(response)
    assert err["code"] == "not_checkout_owner"
    details = err["details"]
    assert details["issueId"] == str(issue_id)
    assert details["status"] == "in_progress"
    assert details["checkoutRunId"] == str(holder.run.pk)
    assert details["holderAgentId"] == details["assigneeAgentId"] == str(holder.agent.pk)
    assert details["actorAgentId"] == str(actor.agent.pk)
    assert details["actorRunId"] == str(actor.run.pk)


def snapshot(issue_id):
    issue = Issue.objects.get(pk=issue_id)
    return (issue.title, issue.status, issue.priority, issue.assignee_agent_id, issue.checkout_run_id,
            issue.execution_run_id, issue.updated_at)


# --- cases: the primary task's checkout run ------------------------------------------------------


@pytest.fixture
def held_case(board_client, cases_company, ada):
    """A board-made case whose primary task is assigned to ada and checked out by her run."""
    response = board_client.post(f"/api/companies/{cases_company.pk}/cases",
                                 {"type": "claim", "title": "Claim 7", "kickoff": "Assess claim 7.",
                                  "workflowDocumentText": WORKFLOW}, format="json")
    assert response.status_code == 201, response.content
    case = Case.objects.get(pk=response.json()["id"])
    assigned = board_client.patch(f"/api/issues/{case.primary_task_id}", {"assigneeAgentId": str(ada.agent.pk)},
                                  format="json")
    assert assigned.status_code == 200, assigned.content
    checkout(ada, case.primary_task_id)
    return case


def case_state(case):
    case = Case.objects.get(pk=case.pk)
    return (case.title, case.summary, case.fields, case.updated_at, CaseEvent.objects.filter(case=case).count())


def test_agent_patching_a_case_whose_task_another_agents_run_holds_is_409_and_changes_nothing(held_case, ada, bob):
    before = case_state(held_case)
    response = bob.patch(f"/api/cases/{held_case.pk}", {"title": "Hijacked"}, format="json")
    assert_lock_refusal(response, issue_id=held_case.primary_task_id, holder=ada, actor=bob)
    assert case_state(held_case) == before


def test_the_holding_run_patches_the_case_and_another_run_of_the_same_agent_does_not(held_case, ada):
    stale = RunFactory(agent=ada.agent)
    ada_now = ada.run
    ada.use_run(stale)
    before = case_state(held_case)
    refused = ada.patch(f"/api/cases/{held_case.pk}", {"title": "From the wrong run"}, format="json")
    assert refused.status_code == 409 and error(refused)["code"] == "not_checkout_owner"
    assert error(refused)["details"]["checkoutRunId"] == str(ada_now.pk)
    assert case_state(held_case) == before
    ada.use_run(ada_now)
    response = ada.patch(f"/api/cases/{held_case.pk}", {"title": "Assessed", "summary": "ok"}, format="json")
    assert response.status_code == 200, response.content
    assert Case.objects.get(pk=held_case.pk).title == "Assessed"


def test_a_board_owner_patches_the_case_while_an_agent_holds_the_task(held_case, board_client):
    response = board_client.patch(f"/api/cases/{held_case.pk}", {"title": "Board edit"}, format="json")
    assert response.status_code == 200, response.content
    assert Case.objects.get(pk=held_case.pk).title == "Board edit"


def test_case_patch_by_another_agent_is_allowed_when_the_task_is_not_in_progress(board_client, cases_company, bob):
    response = board_client.post(f"/api/companies/{cases_company.pk}/cases",
                                 {"type": "claim", "title": "Claim 8", "kickoff": "k",
                                  "workflowDocumentText": WORKFLOW}, format="json")
    case_id = response.json()["id"]
    patched = bob.patch(f"/api/cases/{case_id}", {"summary": "noted"}, format="json")
    assert patched.status_code == 200, patched.content


def test_links_from_the_wrong_run_are_409_and_the_holder_links_and_unlinks(held_case, ada, bob, board_client,
                                                                            company):
    existing = IssueFactory(company=company)
    linked = board_client.post(f"/api/cases/{held_case.pk}/links", {"issueId": str(existing.pk), "role": "work"},
                               format="json")
    assert linked.status_code == 201, linked.content
    other = IssueFactory(company=company)
    before = case_state(held_case)

    added = bob.post(f"/api/cases/{held_case.pk}/links", {"issueId": str(other.pk), "role": "reference"},
                     format="json")
    assert_lock_refusal(added, issue_id=held_case.primary_task_id, holder=ada, actor=bob)
    removed = bob.delete(f"/api/cases/{held_case.pk}/links/{existing.pk}")
    assert_lock_refusal(removed, issue_id=held_case.primary_task_id, holder=ada, actor=bob)
    assert case_state(held_case) == before
    assert set(CaseIssueLink.objects.filter(case=held_case).values_list("issue_id", flat=True)) == {
        held_case.primary_task_id, existing.pk}

    ok = ada.post(f"/api/cases/{held_case.pk}/links", {"issueId": str(other.pk), "role": "reference"}, format="json")
    assert ok.status_code == 201, ok.content
    assert ada.delete(f"/api/cases/{held_case.pk}/links/{existing.pk}").status_code == 204


def test_handoffs_from_the_wrong_run_are_409(held_case, ada, bob, cases_company):
    url = f"/api/companies/{cases_company.pk}/case-handoffs"
    # Another agent: the lock answers first (409), before "not your work" (403).
    refused = bob.post(url, {"caseId": str(held_case.pk), "to": str(bob.agent.pk)}, format="json")
    assert_lock_refusal(refused, issue_id=held_case.primary_task_id, holder=ada, actor=bob)
    # The assignee from a run that does not hold the checkout.
    holder_run = ada.run
    ada.use_run(RunFactory(agent=ada.agent))
    stale = ada.post(url, {"caseId": str(held_case.pk), "to": str(bob.agent.pk)}, format="json")
    assert stale.status_code == 409 and error(stale)["code"] == "not_checkout_owner"
    assert not CaseHandoff.objects.filter(case=held_case).exists()

    # The holding run hands off: accepted, waiting for the execution to settle.
    ada.use_run(holder_run)
    accepted = ada.post(url, {"caseId": str(held_case.pk), "to": str(bob.agent.pk)}, format="json")
    assert accepted.status_code == 201, accepted.content
    handoff_id = accepted.json()["id"]
    assert accepted.json()["status"] == "accepted"

    base = f"/api/cases/{held_case.pk}/handoffs/{handoff_id}"
    for client in (bob, ada.use_run(RunFactory(agent=ada.agent))):
        for action in ("retry", "cancel"):
            response = client.post(f"{base}/{action}", format="json")
            assert response.status_code == 409, (action, response.content)
            assert error(response)["code"] == "not_checkout_owner", action
    assert CaseHandoff.objects.get(pk=handoff_id).status == "accepted"

    ada.use_run(holder_run)
    cancelled = ada.post(f"{base}/cancel", {"reason": "changed my mind"}, format="json")
    assert cancelled.status_code == 200, cancelled.content
    assert cancelled.json()["status"] == "cancelled"


def test_a_board_owner_hands_off_and_cancels_while_an_agent_holds_the_task(held_case, board_client, bob,
                                                                          cases_company):
    url = f"/api/companies/{cases_company.pk}/case-handoffs"
    accepted = board_client.post(url, {"caseId": str(held_case.pk), "to": str(bob.agent.pk)}, format="json")
    assert accepted.status_code == 201, accepted.content
    cancelled = board_client.post(f"/api/cases/{held_case.pk}/handoffs/{accepted.json()['id']}/cancel",
                                  format="json")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"


# --- issues: the checkout run, then ownership ---------------------------------------------------


@pytest.fixture
def adas_issue(company, ada):
    return IssueFactory(company=company, assignee_agent=ada.agent)


def test_cancelling_or_reassigning_another_agents_checked_out_issue_is_409_even_for_its_creator(company, ada, bob):
    # bob created the issue for ada: he could change it, but not while her run holds it.
    created = bob.post(f"/api/companies/{company.pk}/issues",
                       {"title": "Delegated", "assigneeAgentId": str(ada.agent.pk)}, format="json")
    assert created.status_code == 201, created.content
    issue_id = created.json()["id"]
    checkout(ada, issue_id)
    before = snapshot(issue_id)
    activity = ActivityLog.objects.count()
    for change in ({"status": "cancelled"}, {"assigneeAgentId": str(bob.agent.pk)}, {"assigneeAgentId": None},
                   {"status": "todo", "comment": "giving it to me"}):
        response = bob.patch(f"/api/issues/{issue_id}", change, format="json")
        assert_lock_refusal(response, issue_id=issue_id, holder=ada, actor=bob)
    assert snapshot(issue_id) == before
    assert ActivityLog.objects.count() == activity


def test_a_non_owner_hits_the_lock_first_on_a_checked_out_issue(adas_issue, ada, bob):
    checkout(ada, adas_issue.pk)
    response = bob.patch(f"/api/issues/{adas_issue.pk}", {"status": "cancelled"}, format="json")
    assert_lock_refusal(response, issue_id=adas_issue.pk, holder=ada, actor=bob)


def test_patching_an_issue_assigned_to_another_agent_is_403_and_the_assignee_succeeds(adas_issue, ada, bob):
    before = snapshot(adas_issue.pk)
    for change in ({"title": "Mine now"}, {"status": "cancelled"}, {"priority": "critical"},
                   {"description": "rewritten"}, {"assigneeAgentId": str(bob.agent.pk)}):
        response = bob.patch(f"/api/issues/{adas_issue.pk}", change, format="json")
        assert response.status_code == 403, response.content
        err = error(response)
        assert err["code"] == "not_your_issue"
        assert err["details"]["assigneeAgentId"] == str(ada.agent.pk)
        assert err["details"]["actorAgentId"] == str(bob.agent.pk)
    assert snapshot(adas_issue.pk) == before

    response = ada.patch(f"/api/issues/{adas_issue.pk}", {"title": "Refined", "priority": "high"}, format="json")
    assert response.status_code == 200, response.content
    assert (response.json()["title"], response.json()["priority"]) == ("Refined", "high")


def test_an_unassigned_issue_is_any_agents_to_change_another_agents_is_not(company, ada, bob):
    """Upstream: unassigned work is anyone's (a CEO assigns a board-created issue to a report);
    another agent's issue is 403 with upstream's message."""
    issue = IssueFactory(company=company)
    response = bob.patch(f"/api/issues/{issue.pk}", {"assigneeAgentId": str(ada.agent.pk)}, format="json")
    assert response.status_code == 200 and response.json()["assigneeAgentId"] == str(ada.agent.pk)
    refused = bob.patch(f"/api/issues/{issue.pk}", {"priority": "high"}, format="json")
    assert refused.status_code == 403 and error(refused)["code"] == "not_your_issue"
    assert error(refused)["message"] == "Agent cannot mutate another agent's issue"
    assert error(refused)["details"]["assigneeAgentId"] == str(ada.agent.pk)


def test_the_creator_changes_the_issue_it_delegated_while_no_run_holds_it(company, ada, bob):
    created = bob.post(f"/api/companies/{company.pk}/issues",
                       {"title": "Delegated", "assigneeAgentId": str(ada.agent.pk)}, format="json")
    issue_id = created.json()["id"]
    response = bob.patch(f"/api/issues/{issue_id}", {"priority": "high", "status": "cancelled"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "cancelled"


def test_a_manager_delegates_to_a_report_and_manages_the_reports_issues(make_agent_client, company, board_client):
    manager = make_agent_client(AgentFactory(company=company, name="mona", role="cto",
                                             permissions={"canAssignTasks": True}))  # delegating needs it
    report = make_agent_client(AgentFactory(company=company, name="rex", reports_to=manager.agent))
    peer = make_agent_client(AgentFactory(company=company, name="pia"))
    parent = IssueFactory(company=company, assignee_agent=manager.agent)
    checkout(manager, parent.pk)
    # Delegation is a creation (and blocking the manager's own held parent is the manager's change).
    child = manager.post(f"/api/companies/{company.pk}/issues",
                         {"title": "Do the part", "parentId": str(parent.pk), "assigneeAgentId": str(report.agent.pk),
                          "blockParentUntilDone": True}, format="json")
    assert child.status_code == 201, child.content
    assert Issue.objects.get(pk=parent.pk).status == "blocked"
    # The chain of command (upstream's manager override) changes a report's issue, a peer does not.
    boards_issue = IssueFactory(company=company, assignee_agent=report.agent)
    assert manager.patch(f"/api/issues/{boards_issue.pk}", {"priority": "high"}, format="json").status_code == 200
    refused = peer.patch(f"/api/issues/{boards_issue.pk}", {"priority": "low"}, format="json")
    assert refused.status_code == 403 and error(refused)["code"] == "not_your_issue"
    # ...but not while the report's run holds it.
    checkout(report, boards_issue.pk)
    held = manager.patch(f"/api/issues/{boards_issue.pk}", {"status": "cancelled"}, format="json")
    assert_lock_refusal(held, issue_id=boards_issue.pk, holder=report, actor=manager)
    # A board owner can (and has run/stop for the run itself).
    cancelled = board_client.patch(f"/api/issues/{boards_issue.pk}", {"status": "cancelled"}, format="json")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert cancelled.json()["checkoutRunId"] is None


def test_a_board_owner_reassigns_and_cancels_a_checked_out_issue(adas_issue, ada, bob, board_client):
    checkout(ada, adas_issue.pk)
    response = board_client.patch(f"/api/issues/{adas_issue.pk}", {"assigneeAgentId": str(bob.agent.pk)},
                                  format="json")
    assert response.status_code == 200, response.content
    assert (response.json()["assigneeAgentId"], response.json()["status"], response.json()["checkoutRunId"]) == (
        str(bob.agent.pk), "todo", None)


def test_comments_are_open_to_the_company_but_not_across_a_live_checkout(adas_issue, ada, bob):
    posted = bob.post(f"/api/issues/{adas_issue.pk}/comments", {"body": "FYI: the API changed"}, format="json")
    assert posted.status_code == 201, posted.content
    comment_only = bob.patch(f"/api/issues/{adas_issue.pk}", {"comment": "and the docs too"}, format="json")
    assert comment_only.status_code == 200, comment_only.content
    checkout(ada, adas_issue.pk)
    refused = bob.post(f"/api/issues/{adas_issue.pk}/comments", {"body": "ping"}, format="json")
    assert_lock_refusal(refused, issue_id=adas_issue.pk, holder=ada, actor=bob)


def test_documents_work_products_and_blockers_are_the_owners(adas_issue, ada, bob, company):
    put = bob.put(f"/api/issues/{adas_issue.pk}/documents/plan", {"body": "my plan"}, format="json")
    assert put.status_code == 403 and error(put)["code"] == "not_your_issue"
    assert not Document.objects.filter(issue=adas_issue).exists()
    product = bob.post(f"/api/issues/{adas_issue.pk}/work-products",
                       {"kind": "pull_request", "url": "https://example.com/pr/1"}, format="json")
    assert product.status_code == 403 and error(product)["code"] == "not_your_issue"
    assert not WorkProduct.objects.filter(issue=adas_issue).exists()
    blocker = IssueFactory(company=company)
    blocked = bob.post(f"/api/issues/{adas_issue.pk}/blockers", {"blockerId": str(blocker.pk)}, format="json")
    assert blocked.status_code == 403 and error(blocked)["code"] == "not_your_issue"
    assert not IssueRelation.objects.filter(related_issue=adas_issue).exists()
    # Blocking someone else's issue through a child's blockParentUntilDone is the same change.
    count = Issue.objects.count()
    child = bob.post(f"/api/companies/{company.pk}/issues",
                     {"title": "sub", "parentId": str(adas_issue.pk), "blockParentUntilDone": True}, format="json")
    assert child.status_code == 403 and error(child)["code"] == "not_your_issue"
    assert Issue.objects.count() == count and Issue.objects.get(pk=adas_issue.pk).status == "todo"

    assert ada.put(f"/api/issues/{adas_issue.pk}/documents/plan", {"body": "plan"}, format="json").status_code == 201
    assert ada.post(f"/api/issues/{adas_issue.pk}/blockers", {"blockerId": str(blocker.pk)},
                    format="json").status_code == 201


def test_release_is_the_assignees(adas_issue, ada, bob):
    checkout(ada, adas_issue.pk)
    refused = bob.post(f"/api/issues/{adas_issue.pk}/release")
    # Upstream's refusal (ref §7), with the lock details every issue-write refusal carries.
    assert refused.status_code == 409 and error(refused)["code"] == "not_assignee"
    assert error(refused)["message"] == "Only assignee can release issue"
    assert error(refused)["details"]["holderAgentId"] == str(ada.agent.pk)
    # Once ada's run has ended (its lock released), another agent still cannot release her claim.
    run_finish(run=HeartbeatRun.objects.get(pk=ada.run.pk), status="succeeded")
    assert Issue.objects.get(pk=adas_issue.pk).status == "in_progress"
    refused = bob.post(f"/api/issues/{adas_issue.pk}/release")
    assert refused.status_code == 409 and error(refused)["code"] == "not_assignee"
    assert Issue.objects.get(pk=adas_issue.pk).status == "in_progress"
    ada.use_run(RunFactory(agent=ada.agent))
    released = ada.post(f"/api/issues/{adas_issue.pk}/release")
    assert released.status_code == 200, released.content
    assert released.json()["status"] == "todo"


def test_an_agent_cannot_stop_another_agents_run_the_board_can(adas_issue, ada, bob, board_client):
    checkout(ada, adas_issue.pk)
    HeartbeatRun.objects.filter(pk=ada.run.pk).update(issue=adas_issue)
    refused = bob.post(f"/api/issues/{adas_issue.pk}/run/stop")
    assert_lock_refusal(refused, issue_id=adas_issue.pk, holder=ada, actor=bob)
    assert HeartbeatRun.objects.get(pk=ada.run.pk).stop_requested_at is None
    stopped = board_client.post(f"/api/issues/{adas_issue.pk}/run/stop")
    assert stopped.status_code == 200, stopped.content
    assert HeartbeatRun.objects.get(pk=ada.run.pk).stop_requested_at is not None
