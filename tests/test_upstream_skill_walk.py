"""The upstream agent skill's heartbeat (reference §8, skills/paperclip/SKILL.md) walked literally.

``SkillClient`` is what an agent written for upstream Paperclip does: it knows only its environment
(PAPERCLIP_API_URL as the server origin, PAPERCLIP_API_KEY, PAPERCLIP_AGENT_ID, PAPERCLIP_COMPANY_ID,
PAPERCLIP_RUN_ID, optional PAPERCLIP_APPROVAL_ID / PAPERCLIP_TASK_ID), appends ``/api`` itself,
sends ``X-Paperclip-Run-Id`` on every write, never retries a 409, and uses upstream field names.
Here the key is a long-lived agent key and the run id is the client's own (no host run), as for an
agent run outside this host.
"""
from __future__ import annotations

import uuid

import httpx
import pytest

from issues.models import ActivityLog, Approval, ApprovalIssue, Comment, Issue
from issues.services.companies import agent_api_key_create
from tests.factories import AgentFactory, CompanyFactory, GoalFactory, IssueFactory, MembershipFactory

CHECKOUT_STATUSES = ["todo", "backlog", "blocked", "in_review"]
PICK_ORDER = {"in_progress": 0, "in_review": 1, "todo": 2}
PRIORITY_ORDER = {"critical": 0, "high": 1, "medium": 2, "low": 3}


class SkillClient:
    """A literal, minimal reading of SKILL.md's heartbeat; every request is logged."""

    def __init__(self, env: dict):
        self.env = env
        origin = env["PAPERCLIP_API_URL"].rstrip("/")
        if origin.endswith("/api"):  # the SKILL strips a trailing /api defensively
            origin = origin[: -len("/api")]
        self.origin = origin
        self.http = httpx.Client(base_url=f"{origin}/api", timeout=20,
                                 headers={"Authorization": f"Bearer {env['PAPERCLIP_API_KEY']}"})
        self.log: list[tuple[str, str, int]] = []

    def call(self, method, path, *, write=False, **kwargs):
        headers = {"X-Paperclip-Run-Id": self.env["PAPERCLIP_RUN_ID"]} if write else {}
        response = self.http.request(method, path, headers=headers, **kwargs)
        self.log.append((method, path, response.status_code))
        return response

    def calls(self, method, path):
        return [entry for entry in self.log if entry[:2] == (method, path)]

    # Step 1
    def identity(self):
        me = self.call("GET", "/agents/me")
        assert me.status_code == 200, me.text
        return me.json()

    # Step 2
    def approval_follow_up(self):
        approval_id = self.env.get("PAPERCLIP_APPROVAL_ID")
        if not approval_id:
            return None
        approval = self.call("GET", f"/approvals/{approval_id}").json()
        linked = self.call("GET", f"/approvals/{approval_id}/issues").json()
        for issue in linked:
            if approval["status"] == "approved":
                closed = self.call("PATCH", f"/issues/{issue['id']}", write=True,
                                   json={"status": "done", "comment": f"Approval {approval_id} granted; closing."})
                assert closed.status_code == 200 and closed.json()["status"] == "done", closed.text
            else:
                self.call("POST", f"/issues/{issue['id']}/comments", write=True,
                          json={"body": f"Approval {approval_id} is {approval['status']}; waiting."})
        return approval, linked

    # Step 3
    def assignments(self):
        inbox = self.call("GET", "/agents/me/inbox-lite")
        if inbox.status_code == 200:
            return inbox.json()
        return self.fallback_assignments()

    def fallback_assignments(self):
        listed = self.call("GET", f"/companies/{self.env['PAPERCLIP_COMPANY_ID']}/issues",
                           params={"assigneeAgentId": self.env["PAPERCLIP_AGENT_ID"],
                                   "status": "todo,in_progress,in_review,blocked"})
        assert listed.status_code == 200, listed.text
        return listed.json()

    # Step 4
    def pick(self, issues):
        task_id = self.env.get("PAPERCLIP_TASK_ID")
        candidates = [i for i in issues if i["status"] in PICK_ORDER]  # skip blocked
        candidates.sort(key=lambda i: (i["id"] != task_id, PICK_ORDER[i["status"]], PRIORITY_ORDER[i["priority"]]))
        return candidates

    # Step 5: the first candidate that checks out; a 409 moves on, never retried
    def checkout(self, candidates, expected=CHECKOUT_STATUSES):
        for issue in candidates:
            claimed = self.call("POST", f"/issues/{issue['id']}/checkout", write=True,
                                json={"agentId": self.env["PAPERCLIP_AGENT_ID"], "expectedStatuses": expected})
            if claimed.status_code == 409:
                continue
            assert claimed.status_code == 200, claimed.text
            return claimed.json()
        return None

    # Step 6
    def context(self, issue_id):
        compact = self.call("GET", f"/issues/{issue_id}/heartbeat-context")
        assert compact.status_code == 200, compact.text
        issue, cursor = compact.json()["issue"], compact.json()["commentCursor"]
        if not cursor["totalComments"]:  # nothing to read: the skill skips the thread
            return issue, []
        thread = self.call("GET", f"/issues/{issue_id}/comments")  # a cold start reads it whole
        assert thread.status_code == 200, thread.text
        assert len(thread.json()) == cursor["totalComments"] and thread.json()[0]["id"] == cursor["latestCommentId"]
        return issue, thread.json()

    # Step 7
    def write_plan(self, issue_id, body):
        plan = self.call("PUT", f"/issues/{issue_id}/documents/plan", write=True,
                         json={"title": "Plan", "format": "markdown", "body": body, "baseRevisionId": None})
        assert plan.status_code == 201, plan.text
        return plan.json()

    def update_plan(self, issue_id, body, base_revision_id):
        plan = self.call("PUT", f"/issues/{issue_id}/documents/plan", write=True,
                         json={"title": "Plan", "format": "markdown", "body": body, "baseRevisionId": base_revision_id})
        assert plan.status_code == 200, plan.text
        return plan.json()

    def attach(self, issue_id, filename, content, content_type):
        """Files go to POST /api/companies/{companyId}/issues/{issueId}/attachments (multipart ``file``)."""
        attached = self.call("POST", f"/companies/{self.env['PAPERCLIP_COMPANY_ID']}/issues/{issue_id}/attachments",
                             write=True, files={"file": (filename, content, content_type)})
        assert attached.status_code == 201, attached.text
        return attached.json()

    def download(self, content_path):
        """``contentPath`` is a path on the server's origin (it starts with /api)."""
        return self.http.get(f"{self.origin}{content_path}")

    def comment(self, issue_id, body):
        posted = self.call("POST", f"/issues/{issue_id}/comments", write=True, json={"body": body})
        assert posted.status_code == 201, posted.text
        return posted.json()

    # Step 8: the response must echo the update
    def update(self, issue_id, **fields):
        updated = self.call("PATCH", f"/issues/{issue_id}", write=True, json=fields)
        assert updated.status_code == 200 and updated.content, updated.text
        return updated.json()

    # Step 9: always parentId + goalId
    def delegate(self, parent, **fields):
        body = {"parentId": parent["id"], "goalId": parent["goalId"], "status": "todo", "priority": "medium", **fields}
        created = self.call("POST", f"/companies/{self.env['PAPERCLIP_COMPANY_ID']}/issues", write=True, json=body)
        assert created.status_code == 201, created.text
        return created.json()


def env_for(live_server, agent, key, **extra):
    return {"PAPERCLIP_API_URL": live_server.url, "PAPERCLIP_API_KEY": key, "PAPERCLIP_AGENT_ID": str(agent.pk),
            "PAPERCLIP_COMPANY_ID": str(agent.company_id), "PAPERCLIP_RUN_ID": str(uuid.uuid4()), **extra}


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.mark.django_db(transaction=True)
def test_the_skill_heartbeat_walked_literally(live_server):
    company = CompanyFactory(name="Paperclip", issue_prefix="PAP")
    ceo = AgentFactory(company=company, name="Mara", role="ceo")
    me = AgentFactory(company=company, name="Ivo", role="cto", reports_to=ceo, permissions={"canAssignTasks": True})
    report = AgentFactory(company=company, name="Lea", role="engineer", reports_to=me)
    rival = AgentFactory(company=company, name="Rex", role="engineer")
    _, key = agent_api_key_create(agent=me)
    _, rival_key = agent_api_key_create(agent=rival)
    board = MembershipFactory(company=company, role="owner").user
    goal = GoalFactory(company=company, title="Ship v1")

    stolen = IssueFactory(company=company, title="Hot fix", priority="critical", assignee_agent=me, goal=goal)
    urgent = IssueFactory(company=company, title="Fix login", priority="high", assignee_agent=me, goal=goal)
    later = IssueFactory(company=company, title="Polish docs", priority="low", assignee_agent=me, goal=goal)
    waiting = IssueFactory(company=company, title="Wait on vendor", status="blocked", assignee_agent=me)
    approved = IssueFactory(company=company, title="Buy the domain", assignee_agent=me)
    IssueFactory(company=company, title="Someone else's", assignee_agent=rival)
    approval = Approval.objects.create(company=company, type="request_board_approval", title="Buy the domain",
                                       status="approved", requested_by_agent=me)
    ApprovalIssue.objects.create(approval=approval, issue=approved)
    Comment.objects.create(company=company, issue=urgent, author_type="user", author_user=board,
                           body="Customers cannot log in since this morning.")

    agent = SkillClient(env_for(live_server, me, key, PAPERCLIP_APPROVAL_ID=str(approval.pk)))

    # 1. identity
    ident = agent.identity()
    assert ident["id"] == str(me.pk) and ident["companyId"] == str(company.pk) and ident["role"] == "cto"
    assert [m["id"] for m in ident["chainOfCommand"]] == [str(ceo.pk)]
    assert isinstance(ident["budgetMonthlyCents"], int) and isinstance(ident["spentMonthlyCents"], int)

    # 2. approval follow-up: the linked issue is closed with a comment
    _, linked = agent.approval_follow_up()
    assert [i["id"] for i in linked] == [str(approved.pk)]
    assert Issue.objects.get(pk=approved.pk).status == "done"

    # 3. assignments: inbox-lite, and the documented fallback list agrees
    inbox = agent.assignments()
    assert agent.calls("GET", "/agents/me/inbox-lite")[0][2] == 200
    expected = {str(i.pk) for i in (stolen, urgent, later, waiting)}
    assert {i["id"] for i in inbox} == expected
    assert {i["id"] for i in agent.fallback_assignments()} == expected

    # 4. pick: in_progress first, then todo by priority; blocked skipped
    candidates = agent.pick(inbox)
    assert [c["id"] for c in candidates] == [str(stolen.pk), str(urgent.pk), str(later.pk)]

    # Between the inbox read and the checkout the board hands the hot fix to a rival who claims it.
    Issue.objects.filter(pk=stolen.pk).update(assignee_agent=rival)
    rival_claim = httpx.post(f"{live_server.url}/api/issues/{stolen.pk}/checkout", timeout=20,
                             json={"agentId": str(rival.pk), "expectedStatuses": ["todo"]},
                             headers={"Authorization": f"Bearer {rival_key}", "X-Paperclip-Run-Id": str(uuid.uuid4())})
    assert rival_claim.status_code == 200, rival_claim.text

    # 5. checkout: the 409 on the hot fix is not retried; the next candidate is claimed
    task = agent.checkout(candidates)
    assert [e[2] for e in agent.calls("POST", f"/issues/{stolen.pk}/checkout")] == [409]
    assert task["id"] == str(urgent.pk) and task["status"] == "in_progress"

    # 6. context
    issue, thread = agent.context(task["id"])
    assert issue["id"] == task["id"] and issue["status"] == "in_progress"
    assert thread[0]["body"].startswith("Customers cannot log in")

    # 7. work: a plan document, then its revision against the latest revision id
    plan = agent.write_plan(task["id"], "1. Reproduce\n2. Fix the cookie")
    assert plan["key"] == "plan" and plan["format"] == "markdown" and plan["latestRevisionNumber"] == 1
    revised = agent.update_plan(task["id"], "1. Reproduce\n2. Fix the cookie\n3. Test", plan["latestRevisionId"])
    assert revised["latestRevisionNumber"] == 2
    progress = agent.comment(task["id"], "Reproduced; fixing the session cookie.")
    assert progress["authorAgentId"] == str(me.pk) and progress["issueId"] == task["id"]
    log = agent.attach(task["id"], "repro.log", b"Set-Cookie: domain mismatch\n", "text/plain")
    assert (log["originalFilename"], log["contentType"], log["byteSize"]) == ("repro.log", "text/plain", 28)
    downloaded = agent.download(log["contentPath"])
    assert downloaded.status_code == 200 and downloaded.content == b"Set-Cookie: domain mismatch\n"
    listed = agent.call("GET", f"/issues/{task['id']}/heartbeat-context").json()["attachments"]
    assert [(a["id"], a["filename"]) for a in listed] == [(log["id"], "repro.log")]

    # 8. update: done with a comment, echoed back
    done = agent.update(task["id"], status="done", comment="Fixed the cookie domain.")
    assert done["status"] == "done" and done["completedAt"] and done["checkoutRunId"] is None
    assert done["comment"]["body"] == "Fixed the cookie domain."

    # 9. delegate a follow-up to a report: parentId + goalId
    sub = agent.delegate(done, title="Add a login regression test", description="Cover the cookie domain.",
                         assigneeAgentId=str(report.pk))
    assert sub["parentId"] == task["id"] and sub["goalId"] == str(goal.pk)
    assert sub["assigneeAgentId"] == str(report.pk) and sub["status"] == "todo"

    # Every write carried the client's run id and is audited with it.
    run_id = agent.env["PAPERCLIP_RUN_ID"]
    audited = set(ActivityLog.objects.filter(client_run_id=run_id).values_list("action", flat=True))
    assert {"issue.checked_out", "issue.updated", "issue.created"} <= audited, audited
    # The checkout response names the lock's run: the client's own id (reference §7 step 7).
    assert task["checkoutRunId"] == run_id


@pytest.mark.django_db(transaction=True)
def test_crash_reclaim_with_in_progress_and_a_rival_409_is_not_retried(live_server):
    company = CompanyFactory(name="Paperclip", issue_prefix="PAP")
    me = AgentFactory(company=company, name="Ivo")
    rival = AgentFactory(company=company, name="Rex")
    _, key = agent_api_key_create(agent=me)
    _, rival_key = agent_api_key_create(agent=rival)
    task = IssueFactory(company=company, title="Long job", priority="high", assignee_agent=me)

    first = SkillClient(env_for(live_server, me, key))
    claimed = first.checkout(first.pick(first.assignments()))
    assert claimed["id"] == str(task.pk)

    # The process dies; the next heartbeat comes with a new run id and finds its issue in progress.
    second = SkillClient(env_for(live_server, me, key))
    inbox = second.assignments()
    assert [(i["id"], i["status"]) for i in inbox] == [(str(task.pk), "in_progress")]
    reclaimed = second.checkout(second.pick(inbox), expected=["in_progress"])
    assert reclaimed is not None, second.log
    assert str(Issue.objects.get(pk=task.pk).checkout_client_run_id) == second.env["PAPERCLIP_RUN_ID"]
    second.comment(str(task.pk), "Resumed after a crash.")
    assert ActivityLog.objects.filter(entity_id=str(task.pk),
                                      client_run_id=second.env["PAPERCLIP_RUN_ID"]).exists()

    # Another agent asking for the same issue gets the 409 and does not retry.
    other = SkillClient(env_for(live_server, rival, rival_key))
    assert other.checkout([{"id": str(task.pk)}], expected=["in_progress"]) is None
    assert [e[2] for e in other.calls("POST", f"/issues/{task.pk}/checkout")] == [409]
    assert Issue.objects.get(pk=task.pk).assignee_agent_id == me.pk
    # The checkout responses name the lock's run: each client's own id (reference §7 step 7).
    assert (claimed["checkoutRunId"], reclaimed["checkoutRunId"]) == (first.env["PAPERCLIP_RUN_ID"],
                                                                      second.env["PAPERCLIP_RUN_ID"])


@pytest.mark.django_db(transaction=True)
def test_api_url_with_a_trailing_api_still_works(live_server):
    """Agents configured with `$PAPERCLIP_API_URL/api` (this product's old value) keep working."""
    company = CompanyFactory(name="Paperclip", issue_prefix="PAP")
    me = AgentFactory(company=company, name="Ivo")
    _, key = agent_api_key_create(agent=me)
    agent = SkillClient({**env_for(live_server, me, key), "PAPERCLIP_API_URL": f"{live_server.url}/api/"})
    assert agent.identity()["id"] == str(me.pk)
