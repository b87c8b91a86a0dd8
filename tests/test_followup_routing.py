"""Continuations and retries go to the issue's current assignee (issue #13): a run that ends after
the board reassigned its issue, or after a case handed it off, never wakes the old agent and
leaves no stray run; the agent's reported result (failed, aborted, done, handoff) decides."""
import pytest

from cases.models import Case, CaseHandoff
from issues.actors import SYSTEM
from issues.models import ActivityLog, HeartbeatRun, Issue
from issues.selectors import runs_with_pending_wakes
from issues.services import runs
from issues.services.wakeups import agent_wakeup
from tests.factories import AgentFactory, IssueFactory
from tests.test_case_handoffs import handoff, kickoff, start_work

LIVE = ("queued", "scheduled_retry", "running")


def wake(agent, issue, reason="assigned"):
    return agent_wakeup(actor=SYSTEM, agent=agent, issue=issue, reason=reason).run


def checkout(client, issue, run):
    client.use_run(run)
    response = client.post(f"/api/issues/{issue.pk}/checkout",
                           {"agentId": str(client.agent.pk), "expectedStatuses": ["todo"]}, format="json")
    assert response.status_code == 200, response.content


def end(run, status="succeeded", **result):
    """The run ends (``result``: what the agent reported, recorded first as the host does); a
    succeeded one with nothing to show, so a continuation would normally follow."""
    if result:
        HeartbeatRun.objects.filter(pk=run.pk).update(**result)
    return runs.run_finish(run=HeartbeatRun.objects.get(pk=run.pk), status=status,
                           liveness="empty_response" if status == "succeeded" else "")


def live_runs(agent, issue):
    """The agent's live runs on the issue as the API reads them (with wakes not yet folded in)."""
    return runs_with_pending_wakes(list(HeartbeatRun.objects.filter(agent=agent, issue=issue, status__in=LIVE)))


def dropped(run):
    return ActivityLog.objects.get(action="run.followup_dropped", entity_id=str(run.pk)).details


@pytest.fixture
def two(make_agent_client, company):
    return [make_agent_client(AgentFactory(company=company, name=name), with_run=False) for name in ("ada", "bob")]


# --- reassignment mid-run ---------------------------------------------------------------------------
@pytest.mark.django_db
def test_board_reassignment_mid_run_wakes_only_the_new_assignee(board_client, company, two):
    ada, bob = two
    issue = IssueFactory(company=company, assignee_agent=ada.agent)
    run = wake(ada.agent, issue)
    checkout(ada, issue, run)
    response = board_client.patch(f"/api/issues/{issue.pk}", {"assigneeAgentId": str(bob.agent.pk)}, format="json")
    assert response.status_code == 200, response.content

    finished = end(run)
    assert finished.liveness == "empty_response"  # would have continued for Ada before
    assert HeartbeatRun.objects.filter(agent=ada.agent).count() == 1  # no continuation for the old agent
    [bobs] = live_runs(bob.agent, issue)
    assert bobs.invocation_source == "assignment" and bobs.continuation_attempt == 0  # its own assignment wake
    assert dropped(run) == {"reason": "reassigned", "followUp": "continuation",
                            "previousAgentId": str(ada.agent.pk), "assigneeAgentId": str(bob.agent.pk)}


@pytest.mark.django_db
def test_unassigned_mid_run_drops_the_follow_up(board_client, company, two):
    ada, _ = two
    issue = IssueFactory(company=company, assignee_agent=ada.agent)
    run = wake(ada.agent, issue)
    checkout(ada, issue, run)
    assert board_client.patch(f"/api/issues/{issue.pk}", {"assigneeAgentId": None},
                              format="json").status_code == 200
    end(run, status="timed_out")  # process loss: a retry would follow
    assert not HeartbeatRun.objects.filter(status__in=LIVE).exists()
    assert dropped(run) == {"reason": "unassigned", "followUp": "retry", "previousAgentId": str(ada.agent.pk),
                            "assigneeAgentId": None}


@pytest.mark.django_db
def test_a_follow_up_goes_to_the_new_assignee_when_it_has_nothing_pending(board_client, company, two):
    ada, bob = two
    issue = IssueFactory(company=company, assignee_agent=ada.agent)
    run = wake(ada.agent, issue)  # Ada works without a checkout: Bob's wake is not deferred
    board_client.patch(f"/api/issues/{issue.pk}", {"assigneeAgentId": str(bob.agent.pk)}, format="json")
    [bobs] = live_runs(bob.agent, issue)
    runs.run_finish(run=bobs, status="succeeded", liveness="advanced")  # Bob's own run is already over
    end(run, status="timed_out")
    assert HeartbeatRun.objects.filter(agent=ada.agent).count() == 1
    [retry] = live_runs(bob.agent, issue)
    assert (retry.status, retry.retry_attempt, retry.wake_reason) == ("scheduled_retry", 1, "process_lost_retry")
    assert retry.source_run_id == run.pk and retry.context["sourceRunId"] == str(run.pk)
    assert ActivityLog.objects.filter(action="run.followup_rerouted", entity_id=str(run.pk)).exists()


@pytest.mark.django_db
def test_an_agent_that_never_held_the_assignment_follows_itself_up(company):
    owner, reviewer = AgentFactory(company=company), AgentFactory(company=company)
    issue = IssueFactory(company=company, assignee_agent=owner)
    run = wake(reviewer, issue, reason="issue_comment_mentioned")
    end(run)
    assert [r.continuation_attempt for r in live_runs(reviewer, issue)] == [1]
    assert not live_runs(owner, issue)


# --- a real case handoff -----------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_case_handoff_mid_run_leaves_no_stray_run(board_client, cases_company, make_agent_client):
    ada, bob = (make_agent_client(AgentFactory(company=cases_company, name=n), with_run=False) for n in ("ada", "bob"))
    case_id = kickoff(board_client, cases_company, ada.agent, workflowDocumentText="w").json()["caseId"]
    task = Issue.objects.get(pk=Case.objects.get(pk=case_id).primary_task_id)
    run = start_work(ada, case_id)
    moved = handoff(ada, cases_company, case_id, bob.agent, note="Over to you.").json()
    assert moved["status"] == "accepted"  # applied once Ada's run settles

    end(run)  # commits: the transfer applies, then the follow-up is decided
    assert CaseHandoff.objects.get(pk=moved["id"]).status == "applied"
    assert Issue.objects.get(pk=task.pk).assignee_agent_id == bob.agent.pk
    assert HeartbeatRun.objects.filter(agent=ada.agent).count() == 1
    [bobs] = live_runs(bob.agent, task)
    assert bobs.wake_reason == "case_handoff"
    assert dropped(run)["reason"] == "reassigned"
    assert HeartbeatRun.objects.filter(status__in=LIVE).count() == 1


# --- the reported result decides ----------------------------------------------------------------------
@pytest.mark.django_db
def test_reported_failure_is_retried_with_backoff_within_the_bound(company):
    agent = AgentFactory(company=company, runtime_config={"maxRetries": 1})
    issue = IssueFactory(company=company, assignee_agent=agent)
    run = wake(agent, issue)
    end(run, status="failed", result_status="failed")
    [retry] = live_runs(agent, issue)
    assert (retry.status, retry.retry_attempt, retry.wake_reason) == ("scheduled_retry", 1, "process_lost_retry")
    assert retry.context["resultStatus"] == "failed"
    assert runs.next_retry_attempt(HeartbeatRun.objects.get(pk=run.pk), agent) == 1
    # The retry fails the same way: the bound (maxRetries 1) is reached.
    HeartbeatRun.objects.filter(pk=retry.pk).update(status="running")
    end(retry, status="failed", result_status="failed")
    assert not live_runs(agent, issue)


@pytest.mark.django_db
def test_non_zero_exit_without_a_reported_failure_is_not_retried(company):
    agent = AgentFactory(company=company)
    issue = IssueFactory(company=company, assignee_agent=agent)
    run = wake(agent, issue)
    runs.run_finish(run=run, status="failed", error="exit code 2", exit_code=2)
    assert not live_runs(agent, issue)
    assert runs.next_retry_attempt(HeartbeatRun.objects.get(pk=run.pk), agent) is None


@pytest.mark.parametrize("status,result", [("failed", "aborted"), ("timed_out", "aborted"),
                                           ("succeeded", "done"), ("succeeded", "handoff")])
@pytest.mark.django_db
def test_aborted_done_and_handoff_end_the_chain(company, status, result):
    agent = AgentFactory(company=company)
    issue = IssueFactory(company=company, assignee_agent=agent)
    run = wake(agent, issue)
    end(run, status=status, result_status=result)
    assert not live_runs(agent, issue)
    assert runs.next_retry_attempt(HeartbeatRun.objects.get(pk=run.pk), agent) is None


@pytest.mark.django_db
@pytest.mark.parametrize("ending", ["timed_out", "succeeded"], ids=["retry", "continuation"])
def test_an_agent_that_released_its_issue_mid_run_is_not_followed_up(company, two, ending):
    """Releasing gives the issue back (upstream: todo, no agent assignee): the run that released it
    neither retries nor continues it, as when the board unassigns it."""
    ada, _ = two
    issue = IssueFactory(company=company, assignee_agent=ada.agent)
    run = wake(ada.agent, issue)
    checkout(ada, issue, run)
    assert ada.post(f"/api/issues/{issue.pk}/release").status_code == 200
    end(run, status=ending)
    assert not HeartbeatRun.objects.filter(status__in=LIVE).exists()
    assert dropped(run) == {"reason": "unassigned", "followUp": "retry" if ending == "timed_out" else "continuation",
                            "previousAgentId": str(ada.agent.pk), "assigneeAgentId": None}
