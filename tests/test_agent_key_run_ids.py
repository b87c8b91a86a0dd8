"""Long-lived agent keys send their own run ids (upstream §2.3, §7), over real HTTP.

A run header naming none of the agent's host runs is the client's run id: the claim records it
(``checkoutClientRunId`` on the lock, ``client_run_id`` on the activity row, no host run FK), and,
since such an id is never a live host run, the same agent adopts its own lock under any other id
(some clients send a fresh id per request). Another agent still gets the 409 with lock details.
Host run ids keep their rules; run-scoped keys injected by the host stay strict."""
import uuid

import httpx
import pytest
from django.utils import timezone

from issues.adapters import issue_run_key
from issues.models import ActivityLog, Issue
from issues.services.companies import agent_api_key_create
from tests.factories import AgentFactory, IssueFactory, RunFactory
from tests.test_errors import error_of

DEFAULT_STATUSES = ["todo", "backlog", "blocked", "in_review"]


class Agent:
    """One agent speaking over HTTP with its long-lived key, a fresh run id per call unless given."""

    def __init__(self, live_server, agent, key):
        self.agent, self.key = agent, key
        self.http = httpx.Client(base_url=f"{live_server.url}/api", timeout=10,
                                 headers={"Authorization": f"Bearer {key}"})

    def call(self, method, path, json=None, run_id="fresh"):
        headers = {}
        if run_id == "fresh":
            run_id = str(uuid.uuid4())
        if run_id is not None:
            headers["X-Paperclip-Run-Id"] = str(run_id)
        return self.http.request(method, path, json=json, headers=headers)

    def checkout(self, issue, run_id="fresh", body=None):
        if body is None:
            body = {"agentId": str(self.agent.pk), "expectedStatuses": DEFAULT_STATUSES}
        return self.call("POST", f"/issues/{issue.pk}/checkout", body, run_id)


@pytest.fixture
def world(live_server, company):
    def agent(name):
        row = AgentFactory(company=company, name=name)
        _, key = agent_api_key_create(agent=row)
        return Agent(live_server, row, key)

    return agent("ivo"), agent("rival")


def activity(issue, action):
    return list(ActivityLog.objects.filter(entity_id=str(issue.pk), action=action).order_by("created_at", "id"))


@pytest.mark.django_db(transaction=True)
def test_checkout_with_a_client_run_id_records_it_on_the_lock_and_the_activity_row(world, company):
    me, _ = world
    issue = IssueFactory(company=company)
    client_run = uuid.uuid4()
    response = me.checkout(issue, client_run)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "in_progress" and body["assigneeAgentId"] == str(me.agent.pk)
    assert body["executionRunId"] is None  # not a host run
    row = Issue.objects.get(pk=issue.pk)
    assert row.checkout_client_run_id == client_run and row.checkout_run_id is None and row.execution_run_id is None
    [checked_out] = activity(issue, "issue.checked_out")
    assert checked_out.client_run_id == client_run and checked_out.run_id is None
    assert checked_out.details["runId"] == str(client_run)
    # The same id again is the idempotent repeat: no second activity row.
    assert me.checkout(issue, client_run).status_code == 200
    assert len(activity(issue, "issue.checked_out")) == 1


@pytest.mark.django_db(transaction=True)
def test_the_same_agent_adopts_its_own_lock_under_another_client_id(world, company):
    me, _ = world
    issue = IssueFactory(company=company)
    assert me.checkout(issue).status_code == 200
    # Writes to its in_progress issue under a different id each time pass the fences.
    for method, path, body in [
        ("PATCH", f"/issues/{issue.pk}", {"title": "Renamed by a fresh id"}),
        ("POST", f"/issues/{issue.pk}/comments", {"body": "progress"}),
        ("PUT", f"/issues/{issue.pk}/documents/plan", {"body": "1. do it"}),
    ]:
        response = me.call(method, path, body)
        assert 200 <= response.status_code < 300, (method, path, response.text)
    assert Issue.objects.get(pk=issue.pk).title == "Renamed by a fresh id"
    # A second checkout by the same agent with a new client id re-stamps the lock (adopts it).
    new_id = uuid.uuid4()
    assert me.checkout(issue, new_id).status_code == 200
    assert Issue.objects.get(pk=issue.pk).checkout_client_run_id == new_id
    assert len(activity(issue, "issue.checked_out")) == 2
    # Still run-scoped: without the header, 401.
    assert error_of(me.call("PATCH", f"/issues/{issue.pk}", {"title": "x"}, run_id=None))["code"] == "run_id_required"


@pytest.mark.django_db(transaction=True)
def test_another_agent_gets_the_409_with_the_lock_details(world, company):
    me, rival = world
    issue = IssueFactory(company=company)
    client_run = uuid.uuid4()
    assert me.checkout(issue, client_run).status_code == 200
    refused = rival.checkout(issue)
    assert refused.status_code == 409, refused.text
    details = error_of(refused)["details"]
    assert details["assigneeAgentId"] == str(me.agent.pk) and details["status"] == "in_progress"
    assert details["checkoutRunId"] == str(client_run)  # what the lock holds, as upstream reports it
    # Writes under any id are refused too (the lock is the other agent's), and change nothing.
    write = rival.call("POST", f"/issues/{issue.pk}/comments", {"body": "hijack"})
    assert write.status_code == 409 and error_of(write)["code"] == "not_checkout_owner"
    assert error_of(write)["details"]["holderAgentId"] == str(me.agent.pk)
    release = rival.call("POST", f"/issues/{issue.pk}/release")
    assert release.status_code == 409
    row = Issue.objects.get(pk=issue.pk)
    assert row.assignee_agent_id == me.agent.pk and row.checkout_client_run_id == client_run


@pytest.mark.django_db(transaction=True)
def test_release_clears_the_client_run_id(world, company):
    me, _ = world
    issue = IssueFactory(company=company)
    assert me.checkout(issue).status_code == 200
    released = me.call("POST", f"/issues/{issue.pk}/release")  # another fresh id: still its own lock
    assert released.status_code == 200, released.text
    row = Issue.objects.get(pk=issue.pk)
    assert row.status == "todo" and row.checkout_client_run_id is None
    assert [r.client_run_id is not None for r in activity(issue, "issue.released")] == [True]


@pytest.mark.django_db(transaction=True)
def test_leaving_in_progress_clears_the_client_run_id(world, company):
    me, _ = world
    issue = IssueFactory(company=company, created_by_agent=me.agent)
    assert me.checkout(issue).status_code == 200
    response = me.call("PATCH", f"/issues/{issue.pk}", {"status": "in_review"})
    assert response.status_code == 200, response.text
    row = Issue.objects.get(pk=issue.pk)
    assert row.status == "in_review" and row.checkout_client_run_id is None


@pytest.mark.django_db(transaction=True)
def test_a_client_id_never_takes_a_lock_a_live_host_run_holds(world, company):
    me, _ = world
    issue = IssueFactory(company=company)
    host_run = RunFactory(agent=me.agent)
    assert me.checkout(issue, host_run.pk).json()["checkoutRunId"] == str(host_run.pk)
    refused = me.checkout(issue)
    assert refused.status_code == 409 and error_of(refused)["code"] == "checkout_conflict"
    write = me.call("PATCH", f"/issues/{issue.pk}", {"title": "from a client id"})
    assert write.status_code == 409 and error_of(write)["code"] == "not_checkout_owner"
    # A host run of the agent adopts a client-id lock (the client's id is never live).
    other = IssueFactory(company=company)
    assert me.checkout(other).status_code == 200
    adopted = me.checkout(other, host_run.pk)
    assert adopted.status_code == 200 and adopted.json()["checkoutRunId"] == str(host_run.pk)
    assert Issue.objects.get(pk=other.pk).checkout_client_run_id is None


@pytest.mark.django_db(transaction=True)
def test_a_header_naming_the_agents_own_ended_run_is_still_409_run_not_live(world, company):
    me, _ = world
    ended = RunFactory(agent=me.agent, status="succeeded", started_at=timezone.now(), finished_at=timezone.now())
    response = me.checkout(IssueFactory(company=company), ended.pk)
    assert response.status_code == 409 and error_of(response)["code"] == "run_not_live"


@pytest.mark.django_db(transaction=True)
def test_run_scoped_keys_stay_strict(live_server, company):
    agent = AgentFactory(company=company)
    run = RunFactory(agent=agent)
    client = Agent(live_server, agent, issue_run_key(run))
    issue = IssueFactory(company=company)
    mismatch = client.checkout(issue)  # a fresh id is not the key's run
    assert mismatch.status_code == 403 and error_of(mismatch)["code"] == "run_mismatch"
    assert Issue.objects.get(pk=issue.pk).status == "todo"
    # The key implies its run: no header, or the run's own id.
    claimed = client.checkout(issue, run_id=None)
    assert claimed.status_code == 200 and claimed.json()["checkoutRunId"] == str(run.pk)


@pytest.mark.django_db(transaction=True)
def test_crash_re_claim_with_in_progress_in_expected_statuses(world, company):
    """The documented re-claim: the agent's own in_progress issue whose run died, with
    expectedStatuses ["in_progress"] (under a new host run, or a client id)."""
    me, _ = world
    for next_run in ("host", "client"):
        crashed = RunFactory(agent=me.agent)
        issue = IssueFactory(company=company)
        assert me.checkout(issue, crashed.pk).status_code == 200
        # It died without run_finish's clean-up (the recovery sweep has not come by yet).
        type(crashed).objects.filter(pk=crashed.pk).update(status="failed", finished_at=timezone.now())
        run_id = RunFactory(agent=me.agent).pk if next_run == "host" else uuid.uuid4()
        response = me.checkout(issue, run_id, body={"agentId": str(me.agent.pk), "expectedStatuses": ["in_progress"]})
        assert response.status_code == 200, (next_run, response.text)
        row = Issue.objects.get(pk=issue.pk)
        assert row.status == "in_progress" and row.assignee_agent_id == me.agent.pk
        assert (row.checkout_run_id, row.checkout_client_run_id) == (
            (run_id, None) if next_run == "host" else (None, run_id))
    # ["in_progress"] never takes another agent's work, nor a todo issue.
    todo = IssueFactory(company=company)
    refused = me.checkout(todo, body={"agentId": str(me.agent.pk), "expectedStatuses": ["in_progress"]})
    assert refused.status_code == 409 and error_of(refused)["code"] == "status_not_expected"


@pytest.mark.django_db(transaction=True)
def test_empty_body_checkout_is_this_agent_with_the_default_statuses(world, company):
    me, _ = world
    issue = IssueFactory(company=company, status="backlog")
    response = me.checkout(issue, body={})
    assert response.status_code == 200, response.text
    assert response.json()["assigneeAgentId"] == str(me.agent.pk)
    # No body at all is the same; a status outside the defaults is refused by them.
    done = IssueFactory(company=company, status="done")
    refused = me.call("POST", f"/issues/{done.pk}/checkout")
    assert refused.status_code == 409 and error_of(refused)["code"] == "status_not_expected"
    assert error_of(refused)["details"]["expectedStatuses"] == DEFAULT_STATUSES
    # ...and every status of the enum may be named.
    assert me.checkout(done, body={"expectedStatuses": ["done"]}).status_code == 200


def test_reassigning_an_in_progress_issue_clears_the_old_agents_client_run_id(company, board_user):
    """Ref §6 / §5.2: changing the agent assignee clears the checkout, whoever held it: the client
    run id of a long-lived key too, not only host runs (else the new assignee's run adopts it)."""
    from issues.actors import Actor
    from issues.services.issues import issue_update

    old, new = AgentFactory(company=company), AgentFactory(company=company)
    issue = IssueFactory(company=company, status="in_progress", assignee_agent=old,
                         checkout_client_run_id=uuid.uuid4())
    issue, _, _ = issue_update(actor=Actor(user=board_user), issue=issue,
                               changes={"assignee_agent_id": new.pk, "status": "in_progress"})
    row = Issue.objects.get(pk=issue.pk)
    assert row.assignee_agent_id == new.pk and row.status == "in_progress"
    assert row.checkout_client_run_id is None and row.checkout_run_id is None
