"""The Heartbeat Protocol, steps 1-8, walked by an agent over real HTTP against a live server."""
import httpx
import pytest

from issues.models import ActivityLog, Approval, ApprovalIssue, Comment, Issue
from issues.services.companies import agent_api_key_create
from tests.factories import AgentFactory, IssueFactory, MembershipFactory


@pytest.mark.django_db(transaction=True)
def test_agent_walks_the_heartbeat_protocol(live_server, company):
    manager = AgentFactory(company=company, name="Mara", role="cto")
    me = AgentFactory(company=company, name="Ivo", reports_to=manager)
    _, key = agent_api_key_create(agent=me)
    rival = AgentFactory(company=company)
    _, rival_key = agent_api_key_create(agent=rival)
    board = MembershipFactory(company=company).user

    urgent = IssueFactory(company=company, title="Fix login", priority="critical", assignee_agent=me)
    later = IssueFactory(company=company, title="Polish docs", priority="low", assignee_agent=me)
    IssueFactory(company=company, title="Someone else's", assignee_agent=rival)
    approval = Approval.objects.create(company=company, title="Hire a designer", status="approved")
    ApprovalIssue.objects.create(approval=approval, issue=later)
    Comment.objects.create(company=company, issue=urgent, author_type="user", author_user=board,
                           body="Customers cannot log in since this morning.")

    api = httpx.Client(base_url=f"{live_server.url}/api", headers={"Authorization": f"Bearer {key}"}, timeout=10)

    # An agent started outside the host obtains its run id by waking itself.
    wake = api.post(f"/agents/{me.pk}/wakeup", json={"reason": "manual start", "issueId": str(urgent.pk)})
    assert wake.status_code == 201
    run_id = wake.json()["runId"]
    api.headers["X-Paperclip-Run-Id"] = run_id

    # Step 1: identity, with chain of command.
    ident = api.get("/agents/me").json()
    assert ident["id"] == str(me.pk) and ident["companyId"] == str(company.pk)
    assert [m["name"] for m in ident["chainOfCommand"]] == ["Mara"]

    # Step 2: approval follow-up.
    assert api.get(f"/approvals/{approval.pk}").json()["status"] == "approved"
    assert [i["id"] for i in api.get(f"/approvals/{approval.pk}/issues").json()] == [str(later.pk)]

    # Step 3: the inbox, sorted by priority.
    inbox = api.get(f"/companies/{company.pk}/issues",
                    params={"assigneeAgentId": str(me.pk), "status": "todo,in_progress,in_review,blocked"}).json()
    assert [i["title"] for i in inbox] == ["Fix login", "Polish docs"]

    # Step 4-5: pick the most urgent task and check it out; a rival is refused and must not retry.
    task = inbox[0]
    claimed = api.post(f"/issues/{task['id']}/checkout",
                       json={"agentId": str(me.pk), "expectedStatuses": ["todo", "backlog", "blocked", "in_review"]})
    assert claimed.status_code == 200 and claimed.json()["checkoutRunId"] == run_id
    rival_wake = httpx.post(f"{live_server.url}/api/agents/{rival.pk}/wakeup", json={},
                            headers={"Authorization": f"Bearer {rival_key}"}).json()
    refused = httpx.post(f"{live_server.url}/api/issues/{task['id']}/checkout",
                         json={"agentId": str(rival.pk), "expectedStatuses": ["todo"]},
                         headers={"Authorization": f"Bearer {rival_key}", "X-Paperclip-Run-Id": rival_wake["runId"]})
    assert refused.status_code == 409

    # Step 6: context, ancestors and the thread.
    detail = api.get(f"/issues/{task['id']}").json()
    assert detail["ancestors"] == [] and detail["status"] == "in_progress"
    thread = api.get(f"/issues/{task['id']}/comments").json()
    assert thread[0]["body"].startswith("Customers cannot log in")

    # Step 7: durable progress — a plan document, a confirmation bound to it, a comment, a subtask.
    plan = api.put(f"/issues/{task['id']}/documents/plan", json={"title": "Plan", "body": "1. Reproduce\n2. Fix"})
    assert plan.status_code == 201
    confirm = api.post(f"/issues/{task['id']}/interactions",
                       json={"kind": "request_confirmation", "title": "Approve the plan?", "documentKey": "plan"})
    assert confirm.json()["documentRevisionId"] == plan.json()["revisionId"]
    assert api.post(f"/issues/{task['id']}/comments", json={"body": "Reproduced; fixing the session cookie."}
                    ).status_code == 201
    sub = api.post(f"/companies/{company.pk}/issues",
                   json={"title": "Add a login regression test", "parentId": task["id"]}).json()
    assert sub["parentId"] == task["id"] and sub["originIssueId"] == task["id"]
    newer = api.get(f"/issues/{task['id']}/comments", params={"after": thread[0]["id"]}).json()
    assert [c["body"] for c in newer] == ["Reproduced; fixing the session cookie."]

    # Step 8: status update with a comment, carrying the run id.
    done = api.patch(f"/issues/{task['id']}", json={"status": "done", "comment": "Fixed the cookie domain."})
    assert done.status_code == 200
    body = done.json()
    assert body["status"] == "done" and body["completedAt"] and body["checkoutRunId"] is None

    issue = Issue.objects.get(pk=task["id"])
    assert issue.comments.filter(author_agent=me).count() == 2
    actions = set(ActivityLog.objects.filter(run_id=run_id).values_list("action", flat=True))
    assert {"issue.checked_out", "comment.created", "document.revised", "interaction.created",
            "issue.created", "issue.updated"} <= actions
