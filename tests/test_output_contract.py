"""The worker's output contract (seed 003): an agent ends its run with status, final state, PR and
summary — as its last ``PAPERCLIP_RESULT`` line (process agents, real processes through the
dispatcher) or a final heartbeat over the API (external agents). The host records it on the run,
shows it in the console, posts the PR as a work product and decides the run's end by it."""
import sys

import pytest
import requests
from django.urls import reverse
from rest_framework.test import APIClient

from issues.actors import SYSTEM
from issues.adapters.result_line import ResultLineError, RunReport, parse_result_line
from issues.models import ActivityLog, HeartbeatRun, RunEvent, WorkProduct
from issues.services import dispatch, runs
from issues.services.companies import agent_api_key_create
from issues.services.run_results import run_result_record
from issues.services.wakeups import agent_wakeup
from tests.factories import AgentFactory, IssueFactory, MembershipFactory

PR = "https://github.com/acme/app/pull/7"

# A protocol agent in a few lines: real HTTP back to the host with its run-scoped key.
PRELUDE = """
import json, os, urllib.request
API, TASK, AGENT = os.environ["PAPERCLIP_API_URL"] + "/api", os.environ.get("PAPERCLIP_TASK_ID"), os.environ["PAPERCLIP_AGENT_ID"]
def call(method, path, body=None):
    request = urllib.request.Request(API + path, method=method, data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + os.environ["PAPERCLIP_API_KEY"], "Content-Type": "application/json",
                 "X-Paperclip-Run-Id": os.environ["PAPERCLIP_RUN_ID"]})
    with urllib.request.urlopen(request) as response:
        return json.load(response)
def checkout():
    return call("POST", f"/issues/{TASK}/checkout", {"agentId": AGENT, "expectedStatuses": ["todo"]})
def result(**fields):
    print("PAPERCLIP_RESULT " + json.dumps(fields), flush=True)
"""


@pytest.fixture
def api_url(live_server, settings):
    settings.PAPERCLIP = {**settings.PAPERCLIP, "API_URL": f"{live_server.url}/api"}
    return settings.PAPERCLIP["API_URL"]


def process_agent(company, body: str):
    return AgentFactory(company=company, adapter_type="process",
                        adapter_config={"command": [sys.executable, "-c", PRELUDE + body], "grace_seconds": 1})


def run_to_end(agent, issue=None) -> HeartbeatRun:
    """Wake the agent and drive its run through the dispatcher, as a worker does."""
    wake = agent_wakeup(actor=SYSTEM, agent=agent, reason="assigned", issue=issue)
    assert dispatch.dispatch_runs() == [wake.run_id]
    run = dispatch.run_execute(run_id=wake.run_id, owner=runs.this_owner())
    run.refresh_from_db()
    return run


def log(run, kind=None):
    events = RunEvent.objects.filter(run=run).order_by("seq")
    return [e.message for e in (events.filter(kind=kind) if kind else events)]


def board(company):
    client = APIClient()
    client.force_login(MembershipFactory(company=company, role="owner").user)
    return client


# --- the result line ---------------------------------------------------------------------------------


def test_the_result_line_parses_the_contract_and_names_what_is_wrong():
    report = parse_result_line('PAPERCLIP_RESULT {"status": "done", "final_state": "in_review", "pr_url": "%s", '
                               '"summary": "Fixed it.", "liveness": "completed", "reason": "tests green", '
                               '"commit": "abc123"}' % PR)
    assert report == RunReport(status="done", final_state="in_review", pr_url=PR, summary="Fixed it.",
                               liveness="completed", liveness_reason="tests green")
    assert parse_result_line("working on it") is None
    assert parse_result_line('PAPERCLIP_RESULT {"summary": "%s", "status": "done"}' % ("s" * 9000)).summary == "s" * 4000
    for line, says in [
        ("PAPERCLIP_RESULT {status: done}", "not valid JSON"),
        ('PAPERCLIP_RESULT ["done"]', "expected a JSON object"),
        ('PAPERCLIP_RESULT {"summary": "no status"}', "neither status nor liveness"),
        ('PAPERCLIP_RESULT {"status": "finished"}', "status 'finished' is not one of done, handoff, failed, aborted"),
        ('PAPERCLIP_RESULT {"liveness": "great"}', "liveness 'great'"),
        ('PAPERCLIP_RESULT {"status": "done", "pr_url": "javascript:alert(1)"}', "pr_url must be an http(s) URL"),
        ('PAPERCLIP_RESULT {"status": "done", "pr_url": "https://x.test/%s"}' % ("a" * 1000), "pr_url is longer"),
        ('PAPERCLIP_RESULT {"status": "done", "final_state": "%s"}' % ("x" * 101), "final_state is longer"),
        ('PAPERCLIP_RESULT {"status": 3}', "status must be a string"),
        ("PAPERCLIP_RESULT " + "[" * 100_000, "not valid JSON"),
    ]:
        with pytest.raises(ResultLineError) as refused:
            parse_result_line(line)
        assert says in str(refused.value), line


# --- process agents through the dispatcher ------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_done_with_a_pr_is_recorded_posted_once_and_shown_in_the_console(api_url, company):
    agent = process_agent(company, f"""
checkout()
# The agent records its PR itself too, and says it twice: the host keeps one work product.
call("POST", f"/issues/{{TASK}}/work-products", {{"kind": "pull_request", "url": "{PR}", "title": "Fix login"}})
call("PATCH", f"/issues/{{TASK}}", {{"status": "done"}})
result(status="done", final_state="done", pr_url="{PR}", summary="first draft")
result(status="done", final_state="done", pr_url="{PR}", summary="Fixed <b>login</b>. Tests green at abc123.")
""")
    issue = IssueFactory(company=company, assignee_agent=agent, title="Fix login")
    run = run_to_end(agent, issue)

    assert run.status == "succeeded", "\n".join(log(run))
    assert (run.result_status, run.result_final_state, run.result_pr_url) == ("done", "done", PR)
    assert run.result_summary == "Fixed <b>login</b>. Tests green at abc123."  # the last line wins
    assert run.liveness == "completed"
    [product] = WorkProduct.objects.filter(issue=issue)
    assert (product.kind, product.url, product.title) == ("pull_request", PR, "Fix login")
    audit = ActivityLog.objects.get(action="run.result_reported", run=run)
    assert audit.details["prUrl"] == PR and audit.details["workProductCreated"] is False
    assert audit.details["workProductId"] == str(product.pk)

    api = board(company).get(f"/api/runs/{run.pk}").json()
    assert api["result"] == {"status": "done", "finalState": "done", "prUrl": PR,
                             "summary": "Fixed <b>login</b>. Tests green at abc123."}
    page = board(company).get(reverse("console:run-detail", args=[run.pk])).content.decode()
    assert f'<a href="{PR}" rel="noopener noreferrer nofollow">{PR}</a>' in page
    assert "Fixed &lt;b&gt;login&lt;/b&gt;. Tests green at abc123." in page and "<b>login</b>" not in page
    assert ">Done</span>" in page


@pytest.mark.django_db
def test_a_reported_pr_is_one_work_product_however_often_it_is_reported(company):
    agent = AgentFactory(company=company)
    issue = IssueFactory(company=company, assignee_agent=agent)
    report = RunReport(status="done", pr_url=PR, summary="s")
    for _ in range(2):  # two runs of the issue report the same PR
        run = agent_wakeup(actor=SYSTEM, agent=agent, issue=issue).run
        run_result_record(run=run, report=report)
        run_result_record(run=run, report=report)
        runs.run_finish(run=run, status="succeeded")
    [product] = WorkProduct.objects.filter(issue=issue)
    assert product.url == PR and product.run_id is not None
    assert ActivityLog.objects.filter(action="work_product.created").count() == 1
    # A run that has ended keeps what it had: a late report changes nothing.
    late = run_result_record(run=run, report=RunReport(status="failed"))
    assert HeartbeatRun.objects.get(pk=late.pk).result_status == "done"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("line, says", [
    ("PAPERCLIP_RESULT {status: done}", "not valid JSON"),
    ('PAPERCLIP_RESULT {"status": "finished"}', "status 'finished' is not one of"),
    ('PAPERCLIP_RESULT {"status": "done", "pr_url": "ftp://x.test/pr/1"}', "pr_url must be an http(s) URL"),
])
def test_a_malformed_result_line_is_a_run_log_error_and_the_run_ends_normally(company, line, says):
    agent = process_agent(company, f"print('working'); print({line!r})")
    run = run_to_end(agent)
    assert run.status == "succeeded" and run.exit_code == 0
    assert run.result_status == "" and not WorkProduct.objects.exists()
    assert any(m.startswith("PAPERCLIP_RESULT ignored: ") and says in m for m in log(run, "system")), log(run)
    assert line in log(run, "stdout")  # the line itself stays in the log


@pytest.mark.django_db(transaction=True)
def test_a_malformed_line_after_a_valid_one_keeps_the_valid_one(company):
    agent = process_agent(company, 'result(status="aborted", summary="no tracker docs"); print("PAPERCLIP_RESULT {")')
    run = run_to_end(agent)
    assert (run.result_status, run.result_summary) == ("aborted", "no tracker docs")
    assert any(m.startswith("PAPERCLIP_RESULT ignored: not valid JSON") for m in log(run, "system"))


@pytest.mark.django_db(transaction=True)
def test_handoff_while_in_progress_leaves_the_issue_in_review(api_url, company):
    agent = process_agent(company, 'checkout(); result(status="handoff", final_state="in_review", summary="Ready.")')
    issue = IssueFactory(company=company, assignee_agent=agent)
    run = run_to_end(agent, issue)
    issue.refresh_from_db()
    assert run.status == "succeeded", "\n".join(log(run))
    assert issue.status == "in_review" and issue.checkout_run_id is None
    assert (run.result_status, run.liveness, run.liveness_reason) == ("handoff", "completed", "reported handoff")
    change = ActivityLog.objects.get(action="issue.updated", entity_id=str(issue.pk))
    assert change.details["changes"]["status"] == ["in_progress", "in_review"]
    assert (change.actor_type, change.actor_agent_id, change.run_id) == ("agent", agent.pk, run.pk)
    assert ActivityLog.objects.get(action="run.result_reported").details["issueStatus"] == ["in_progress",
                                                                                             "in_review"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("status", ["failed", "aborted"])
def test_failed_or_aborted_with_exit_0_fails_the_run(company, status):
    agent = process_agent(company, f'result(status="{status}", summary="tests red")')
    issue = IssueFactory(company=company, assignee_agent=agent)
    run = run_to_end(agent, issue)
    assert (run.status, run.exit_code, run.error) == ("failed", 0, f"agent reported {status}")
    assert (run.result_status, run.liveness) == (status, "failed")
    # runs._follow_up reads result_status: failed is retried with backoff, aborted never.
    retries = HeartbeatRun.objects.filter(issue=issue, status="scheduled_retry")
    if status == "failed":
        [retry] = retries
        assert (retry.retry_attempt, retry.source_run_id) == (1, run.pk) and retry.scheduled_for is not None
    else:
        assert not retries.exists() and HeartbeatRun.objects.filter(issue=issue).count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_process_agent_may_report_by_final_heartbeat_and_its_exit_ends_the_run(api_url, company):
    agent = process_agent(company, """
run = call("POST", "/runs/" + os.environ["PAPERCLIP_RUN_ID"] + "/heartbeat",
           {"final": True, "status": "failed", "summary": "could not build"})
print("still", run["status"])
""")
    run = run_to_end(agent, IssueFactory(company=company, assignee_agent=agent))
    assert "still running" in log(run, "stdout")  # recorded, not ended under the process
    assert (run.status, run.exit_code, run.result_status) == ("failed", 0, "failed")


# --- external agents: the final heartbeat -------------------------------------------------------------


def external_agent(company):
    agent = AgentFactory(company=company, adapter_type="none")
    _, raw = agent_api_key_create(agent=agent)
    return agent, raw


@pytest.mark.django_db(transaction=True)
def test_a_final_heartbeat_ends_an_external_agents_run_with_its_result(live_server, company):
    agent, raw = external_agent(company)
    issue = IssueFactory(company=company, assignee_agent=agent)
    wake = board(company).post(f"/api/agents/{agent.pk}/wakeup", {"issueId": str(issue.pk)}, format="json").json()
    run_id = wake["run"]["id"]
    http = requests.Session()
    http.headers.update({"Authorization": f"Bearer {raw}", "X-Paperclip-Run-Id": run_id})
    api = f"{live_server.url}/api"
    assert http.post(f"{api}/issues/{issue.pk}/checkout",
                     json={"agentId": str(agent.pk), "expectedStatuses": ["todo"]}).status_code == 200
    assert http.post(f"{api}/runs/{run_id}/heartbeat", json={"liveness": "advanced"}).json()["status"] == "running"

    final = http.post(f"{api}/runs/{run_id}/heartbeat", json={
        "final": True, "status": "handoff", "finalState": "in_review", "prUrl": PR, "summary": "Please review."})
    assert final.status_code == 200, final.text
    body = final.json()
    assert body["status"] == "succeeded" and body["finishedAt"]
    assert body["result"] == {"status": "handoff", "finalState": "in_review", "prUrl": PR, "summary": "Please review."}
    # The final word (handoff) decides over an earlier heartbeat's liveness.
    assert (body["liveness"], body["livenessReason"]) == ("completed", "reported handoff")
    issue.refresh_from_db()
    assert issue.status == "in_review" and issue.checkout_run_id is None
    assert WorkProduct.objects.filter(issue=issue, url=PR, kind="pull_request").count() == 1
    again = http.post(f"{api}/runs/{run_id}/heartbeat", json={"final": True, "status": "done"})
    assert again.status_code == 409 and again.json()["code"] == "run_not_live"


@pytest.mark.django_db
@pytest.mark.parametrize("status", ["failed", "aborted"])
def test_a_final_failed_or_aborted_heartbeat_fails_the_run(company, status):
    agent, raw = external_agent(company)
    run = agent_wakeup(actor=SYSTEM, agent=agent, issue=IssueFactory(company=company, assignee_agent=agent)).run
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}", HTTP_X_PAPERCLIP_RUN_ID=str(run.pk))
    response = client.post(f"/api/runs/{run.pk}/heartbeat", {"final": True, "status": status}, format="json")
    assert response.status_code == 200
    body = response.json()
    assert (body["status"], body["error"], body["result"]["status"]) == ("failed", f"agent reported {status}", status)
    assert (body["liveness"], body["livenessReason"]) == ("failed", f"reported {status}")


@pytest.mark.django_db
def test_only_a_final_heartbeat_reports_a_result(company):
    """A progress heartbeat naming a result field is a 400 naming each field it sent (the check reads
    what the body named, also when one validating serializer per thread serves every request)."""
    agent, raw = external_agent(company)
    run = agent_wakeup(actor=SYSTEM, agent=agent, issue=IssueFactory(company=company, assignee_agent=agent)).run
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}", HTTP_X_PAPERCLIP_RUN_ID=str(run.pk))
    url = f"/api/runs/{run.pk}/heartbeat"
    for body, named in (({"summary": "halfway"}, ["summary"]), ({"final": False, "prUrl": PR, "status": "done"},
                                                                ["prUrl", "status"])):
        response = client.post(url, body, format="json")
        assert response.status_code == 400, response.content
        assert sorted(response.json()["details"]) == named
    assert client.post(url, {}, format="json").status_code == 200  # the same thread's serializer, a clean call
    run.refresh_from_db()
    assert run.status in ("queued", "running")


@pytest.mark.django_db
def test_liveness_in_the_final_heartbeat_wins_over_the_derivation(company):
    agent, raw = external_agent(company)
    run = agent_wakeup(actor=SYSTEM, agent=agent, issue=IssueFactory(company=company, assignee_agent=agent)).run
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}", HTTP_X_PAPERCLIP_RUN_ID=str(run.pk))
    body = client.post(f"/api/runs/{run.pk}/heartbeat", {"final": True, "status": "done", "liveness": "needs_followup",
                                                          "livenessReason": "CI still running"}, format="json").json()
    assert (body["status"], body["liveness"], body["livenessReason"]) == ("succeeded", "needs_followup",
                                                                         "CI still running")


@pytest.mark.django_db
@pytest.mark.parametrize("payload, field", [
    ({"final": True}, "status"),
    ({"final": True, "status": "finished"}, "status"),
    ({"final": True, "status": "done", "prUrl": "javascript:alert(1)"}, "prUrl"),
    ({"final": True, "status": "done", "prUrl": "ftp://x.test/pr/1"}, "prUrl"),
    ({"final": True, "status": "done", "prUrl": "https://x.test/" + "a" * 1000}, "prUrl"),
    ({"final": True, "status": "done", "finalState": "x" * 101}, "finalState"),
    ({"final": True, "status": "done", "summary": "s" * 4001}, "summary"),
    ({"final": "perhaps", "status": "done"}, "final"),
    ({"status": "done"}, "status"),  # the result belongs to the final heartbeat only
    ({"summary": "halfway"}, "summary"),
])
def test_bad_final_heartbeats_are_400_naming_the_field(company, payload, field):
    agent, raw = external_agent(company)
    run = agent_wakeup(actor=SYSTEM, agent=agent).run
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}", HTTP_X_PAPERCLIP_RUN_ID=str(run.pk))
    response = client.post(f"/api/runs/{run.pk}/heartbeat", payload, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["details"]
    run.refresh_from_db()
    assert run.is_live and run.result_status == ""
