"""The upstream Paperclip REST contract (issue #14), written from ../shared/reference/paperclip-api.md.

Every endpoint of the reference's §5 (and §2.5/§2.6 keys) that this product claims to support in
docs/upstream-compatibility.md: method, path, required and optional fields, enum values and the
documented status codes, over real HTTP against a live server, once with a board API key
(``pcp_board_…``) and once with a long-lived agent key that sends its own client run id in
``X-Paperclip-Run-Id`` (a random uuid, never a host run). Responses are the entity itself (no
envelope); errors carry a top-level ``error`` string with ``code`` and ``details`` beside it; another
company's ids are a 404; board-only routes refuse the agent key with a 403.

Deliberate differences are ``xfail(strict=True)`` and each one is listed in the compatibility doc.
"""
from __future__ import annotations

import hashlib
import io
import json
import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Callable

import httpx
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.utils import timezone

from issues.actors import SYSTEM, Actor
from issues.models import (ActivityLog, Agent, Approval, ApprovalComment, ApprovalIssue, Attachment, BoardApiKey,
                           Comment, Company, CostEvent, Document, HeartbeatRun, Issue, Label)
from issues.services.assets import company_logo_upload
from issues.services.attachments import attachment_create
from issues.services.companies import agent_api_key_create
from issues.services.thread import document_write
from tests.factories import (
    AgentFactory,
    CompanyFactory,
    GoalFactory,
    IssueFactory,
    MembershipFactory,
    ProjectFactory,
    RunFactory,
)
from tests.test_errors import assert_error

BOARD, AGENT = "board", "agent"
CREDENTIALS = (BOARD, AGENT)

# --- enumerations (reference §4) -------------------------------------------------------------
ISSUE_STATUS = {"backlog", "todo", "in_progress", "in_review", "done", "blocked", "cancelled"}
PRIORITY = {"critical", "high", "medium", "low"}
AGENT_STATUS = {"active", "paused", "idle", "running", "error", "pending_approval", "terminated"}
AGENT_ROLE = {"ceo", "cto", "cmo", "cfo", "security", "engineer", "designer", "pm", "qa", "devops",
              "researcher", "general"}
APPROVAL_TYPE = {"hire_agent", "approve_ceo_strategy", "budget_override_required", "request_board_approval"}
APPROVAL_STATUS = {"pending", "revision_requested", "approved", "rejected", "cancelled"}
GOAL_LEVEL = {"company", "team", "agent", "task"}
GOAL_STATUS = {"planned", "active", "achieved", "cancelled"}
PROJECT_STATUS = {"backlog", "planned", "in_progress", "completed", "cancelled"}
COMPANY_STATUS = {"active", "paused", "archived"}
RUN_STATUS = {"queued", "scheduled_retry", "running", "succeeded", "interrupted", "failed", "cancelled", "timed_out"}
INVOCATION_SOURCE = {"timer", "assignment", "on_demand", "automation"}
BILLING_TYPE = {"metered_api", "subscription_included", "subscription_overage", "credits", "fixed", "unknown"}
ACTOR_TYPE = {"agent", "user", "system"}


# --- value specs: small predicates, composed into object schemas ---------------------------------
def is_uuid(v):
    try:
        return isinstance(v, str) and uuid.UUID(v) is not None
    except ValueError:
        return False


def is_dt(v):
    try:
        return isinstance(v, str) and datetime.fromisoformat(v.replace("Z", "+00:00")) is not None
    except ValueError:
        return False


def is_str(v):
    return isinstance(v, str)


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_bool(v):
    return isinstance(v, bool)


def is_dict(v):
    return isinstance(v, dict)


def is_list(v):
    return isinstance(v, list)


def is_user_id(v):
    # Upstream user ids are strings; this product's are integers (documented: "User ids").
    # test_user_ids_are_strings pins the difference.
    return isinstance(v, str) or is_int(v)


def n(spec):
    """Nullable."""
    return lambda v: v is None or spec(v)


def one_of(values):
    return lambda v: v in values


def list_of(spec):
    return lambda v: isinstance(v, list) and all(spec(x) for x in v)


def problems(obj, schema, where="") -> list[str]:
    """Every schema violation of ``obj`` (missing keys, wrong types/enum values), not just the first."""
    if not isinstance(obj, dict):
        return [f"{where or 'body'}: expected an object, got {type(obj).__name__}: {str(obj)[:200]}"]
    found = []
    for key, spec in schema.items():
        if key not in obj:
            found.append(f"{where}{key}: missing")
        elif isinstance(spec, dict):
            found.extend(problems(obj[key], spec, f"{where}{key}."))
        elif not spec(obj[key]):
            found.append(f"{where}{key}: bad value {obj[key]!r}")
    return found


def assert_schema(obj, schema, where=""):
    found = problems(obj, schema, where)
    assert not found, "; ".join(found)


# --- object schemas (reference §2, §5) ---------------------------------------------------------
ISSUE = {
    "id": is_uuid, "companyId": is_uuid, "projectId": n(is_uuid), "goalId": n(is_uuid), "parentId": n(is_uuid),
    "title": is_str, "description": n(is_str), "status": one_of(ISSUE_STATUS), "priority": one_of(PRIORITY),
    "assigneeAgentId": n(is_uuid), "assigneeUserId": n(is_user_id), "checkoutRunId": n(is_uuid),
    "executionRunId": n(is_uuid), "executionLockedAt": n(is_dt), "createdByAgentId": n(is_uuid),
    "createdByUserId": n(is_user_id), "issueNumber": is_int,
    "identifier": lambda v: isinstance(v, str) and re.fullmatch(r"[A-Z]+-\d+", v) is not None,
    "originKind": is_str, "originId": n(is_str), "executionWorkspaceId": n(is_uuid),
    "startedAt": n(is_dt), "completedAt": n(is_dt), "cancelledAt": n(is_dt),
    "labelIds": list_of(is_uuid), "labels": is_list, "billingCode": n(is_str), "createdAt": is_dt, "updatedAt": is_dt,
}
ISSUE_SUMMARY = {"id": is_uuid, "identifier": is_str, "title": is_str, "status": one_of(ISSUE_STATUS),
                 "priority": one_of(PRIORITY), "assigneeAgentId": n(is_uuid), "assigneeUserId": n(is_user_id)}
ANCESTOR = {**ISSUE_SUMMARY, "description": n(is_str), "projectId": n(is_uuid), "goalId": n(is_uuid),
            "project": n(is_dict), "goal": n(is_dict)}
RUN_ISSUE = {"identifier": is_str, "title": is_str, "status": one_of(ISSUE_STATUS), "priority": one_of(PRIORITY)}
ISSUE_DETAIL = {**ISSUE, "ancestors": list_of(lambda v: not problems(v, ANCESTOR)), "project": n(is_dict),
                "goal": n(is_dict),
                "blockedBy": list_of(lambda v: not problems(v, ISSUE_SUMMARY)),
                "blocks": list_of(lambda v: not problems(v, ISSUE_SUMMARY))}
CHAIN_ITEM = {"id": is_uuid, "name": is_str, "role": one_of(AGENT_ROLE), "title": n(is_str)}
AGENT_OBJ = {
    "id": is_uuid, "companyId": is_uuid, "name": is_str, "urlKey": is_str, "role": one_of(AGENT_ROLE),
    "title": n(is_str), "icon": n(is_str), "status": one_of(AGENT_STATUS), "reportsTo": n(is_uuid),
    "capabilities": n(is_str), "adapterType": is_str, "adapterConfig": is_dict, "runtimeConfig": is_dict,
    "budgetMonthlyCents": is_int, "spentMonthlyCents": is_int, "permissions": {"canCreateAgents": is_bool},
    "lastHeartbeatAt": n(is_dt), "metadata": n(is_dict), "createdAt": is_dt, "updatedAt": is_dt,
}
AGENT_DETAIL = {**AGENT_OBJ, "chainOfCommand": list_of(lambda v: not problems(v, CHAIN_ITEM))}
COMMENT = {"id": is_uuid, "companyId": is_uuid, "issueId": is_uuid, "authorAgentId": n(is_uuid),
           "authorUserId": n(is_user_id), "body": is_str, "createdAt": is_dt, "updatedAt": is_dt}
DOC_SUMMARY = {"id": is_uuid, "companyId": is_uuid, "issueId": is_uuid, "key": is_str, "title": n(is_str),
               "format": one_of({"markdown"}), "latestRevisionId": is_uuid, "latestRevisionNumber": is_int,
               "createdAt": is_dt, "updatedAt": is_dt}
DOCUMENT = {**DOC_SUMMARY, "body": is_str}
REVISION = {"id": is_uuid, "documentId": is_uuid, "issueId": is_uuid, "key": is_str, "revisionNumber": is_int,
            "title": n(is_str), "format": is_str, "body": is_str, "changeSummary": n(is_str), "createdAt": is_dt}
APPROVAL = {"id": is_uuid, "companyId": is_uuid, "type": one_of(APPROVAL_TYPE), "status": one_of(APPROVAL_STATUS),
            "payload": is_dict, "requestedByAgentId": n(is_uuid), "requestedByUserId": n(is_user_id),
            "decisionNote": n(is_str), "decidedByUserId": n(is_user_id), "decidedAt": n(is_dt),
            "createdAt": is_dt, "updatedAt": is_dt}
HEARTBEAT_ISSUE = {k: ISSUE[k] for k in ("id", "identifier", "title", "status", "priority", "projectId", "goalId",
                                         "parentId", "assigneeAgentId", "updatedAt")}
HEARTBEAT_ANCESTOR = {"id": is_uuid, "identifier": is_str, "title": is_str, "status": one_of(ISSUE_STATUS),
                      "priority": one_of(PRIORITY)}
ATTACHMENT_PATH = re.compile(r"/api/attachments/[0-9a-f-]{36}/content")
ATTACHMENT = {"id": is_uuid, "companyId": is_uuid, "issueId": is_uuid, "issueCommentId": n(is_uuid),
              "originalFilename": is_str, "contentType": is_str, "byteSize": is_int,
              "sha256": lambda v: isinstance(v, str) and re.fullmatch(r"[0-9a-f]{64}", v) is not None,
              "objectKey": is_str, "createdByAgentId": n(is_uuid), "createdByUserId": n(is_user_id),
              "contentPath": lambda v: isinstance(v, str) and ATTACHMENT_PATH.fullmatch(v) is not None,
              "createdAt": is_dt, "updatedAt": is_dt}
# The heartbeat context's compact entry (``filename`` there, ``originalFilename`` elsewhere).
HEARTBEAT_ATTACHMENT = {k: ATTACHMENT[k] for k in ("id", "contentType", "byteSize", "contentPath", "createdAt")}
HEARTBEAT_ATTACHMENT["filename"] = is_str
HEARTBEAT_CONTEXT = {
    "issue": lambda v: not problems(v, HEARTBEAT_ISSUE),
    "ancestors": list_of(lambda v: not problems(v, HEARTBEAT_ANCESTOR)),
    "project": n(is_dict), "goal": n(is_dict), "wakeComment": n(lambda v: not problems(v, COMMENT)),
    "commentCursor": lambda v: not problems(v, {"totalComments": is_int, "latestCommentId": n(is_uuid),
                                                "latestCommentAt": n(is_dt)}),
    "attachments": list_of(lambda v: not problems(v, HEARTBEAT_ATTACHMENT))}
ORG_NODE = {"id": is_uuid, "name": is_str, "role": one_of(AGENT_ROLE), "status": one_of(AGENT_STATUS),
            "reports": list_of(is_dict)}
HIRE = {"agent": lambda v: not problems(v, AGENT_OBJ), "approval": n(lambda v: not problems(v, APPROVAL))}
APPROVAL_COMMENT = {"id": is_uuid, "body": is_str, "createdAt": is_dt}
GOAL = {"id": is_uuid, "companyId": is_uuid, "title": is_str, "description": n(is_str), "level": one_of(GOAL_LEVEL),
        "status": one_of(GOAL_STATUS), "parentId": n(is_uuid), "ownerAgentId": n(is_uuid),
        "createdAt": is_dt, "updatedAt": is_dt}
PROJECT = {"id": is_uuid, "companyId": is_uuid, "name": is_str, "description": n(is_str),
           "status": one_of(PROJECT_STATUS), "workspaces": is_list, "primaryWorkspace": n(is_dict),
           "createdAt": is_dt, "updatedAt": is_dt}
RUN = {"id": is_uuid, "companyId": is_uuid, "agentId": is_uuid, "status": one_of(RUN_STATUS),
       "invocationSource": one_of(INVOCATION_SOURCE), "startedAt": n(is_dt), "finishedAt": n(is_dt),
       "createdAt": is_dt}
RUN_CORE = {k: v for k, v in RUN.items() if k != "companyId"}
LIVE_RUN = {"id": is_uuid, "status": one_of(RUN_STATUS), "invocationSource": one_of(INVOCATION_SOURCE),
            "triggerDetail": n(is_str), "startedAt": n(is_dt), "finishedAt": n(is_dt), "createdAt": is_dt,
            "agentId": is_uuid, "agentName": is_str, "adapterType": n(is_str), "issueId": n(is_uuid)}
INBOX_ITEM = {"id": is_uuid, "identifier": is_str, "title": is_str, "status": one_of(ISSUE_STATUS),
              "priority": one_of(PRIORITY), "projectId": n(is_uuid), "goalId": n(is_uuid), "parentId": n(is_uuid),
              "updatedAt": is_dt, "activeRun": n(is_dict)}
COST_EVENT = {"id": is_uuid, "companyId": is_uuid, "agentId": is_uuid, "issueId": n(is_uuid),
              "projectId": n(is_uuid), "goalId": n(is_uuid), "heartbeatRunId": n(is_uuid), "billingCode": n(is_str),
              "provider": is_str, "biller": is_str, "billingType": one_of(BILLING_TYPE), "model": is_str,
              "inputTokens": is_int, "cachedInputTokens": is_int, "outputTokens": is_int, "costCents": is_int,
              "costStatus": is_str, "occurredAt": is_dt, "createdAt": is_dt}
COST_SUMMARY = {"companyId": is_uuid, "spendCents": is_int, "budgetCents": is_int, "utilizationPercent": is_num}
COST_BY_AGENT = {"agentId": is_uuid, "agentName": is_str, "agentStatus": one_of(AGENT_STATUS), "costCents": is_int,
                 "inputTokens": is_int, "cachedInputTokens": is_int, "outputTokens": is_int,
                 "apiRunCount": is_int, "subscriptionRunCount": is_int, "subscriptionCachedInputTokens": is_int,
                 "subscriptionInputTokens": is_int, "subscriptionOutputTokens": is_int}
COST_BY_PROJECT = {"projectId": n(is_uuid), "projectName": n(is_str), "costCents": is_int, "inputTokens": is_int,
                   "cachedInputTokens": is_int, "outputTokens": is_int}
COST_TOTALS = {"costCents": is_int, "inputTokens": is_int, "cachedInputTokens": is_int, "outputTokens": is_int}
COST_RUN_SPLIT = {**COST_TOTALS, "apiRunCount": is_int, "subscriptionRunCount": is_int,
                  "subscriptionCachedInputTokens": is_int, "subscriptionInputTokens": is_int,
                  "subscriptionOutputTokens": is_int}
COST_BY_PROVIDER = {**COST_RUN_SPLIT, "provider": is_str, "biller": is_str, "billingType": is_str, "model": is_str}
COST_BY_BILLER = {**COST_RUN_SPLIT, "biller": is_str, "providerCount": is_int, "modelCount": is_int}
COST_BY_AGENT_MODEL = {**COST_TOTALS, "agentId": is_uuid, "agentName": is_str, "provider": is_str, "biller": is_str,
                       "billingType": is_str, "model": is_str}
COST_WINDOW = {**COST_TOTALS, "provider": is_str, "biller": is_str, "window": one_of(("5h", "24h", "7d")),
               "windowHours": is_int}
DASHBOARD = {
    "companyId": is_uuid,
    "agents": {"active": is_int, "running": is_int, "paused": is_int, "error": is_int},
    "tasks": {"open": is_int, "inProgress": is_int, "blocked": is_int, "done": is_int},
    "costs": {"monthSpendCents": is_int, "monthBudgetCents": is_int, "monthUtilizationPercent": is_num},
    "pendingApprovals": is_int,
    "budgets": {"activeIncidents": is_int, "pendingApprovals": is_int, "pausedAgents": is_int,
                "pausedProjects": is_int},
}
ACTIVITY = {"id": lambda v: is_uuid(v) or is_int(v) or is_str(v), "companyId": is_uuid,
            "actorType": one_of(ACTOR_TYPE), "actorId": n(lambda v: is_str(v) or is_int(v)), "action": is_str,
            "entityType": is_str, "entityId": is_str, "agentId": n(is_uuid), "runId": n(is_uuid),
            "details": n(is_dict), "createdAt": is_dt}
COMPANY = {"id": is_uuid, "name": is_str, "description": n(is_str), "status": one_of(COMPANY_STATUS),
           "issuePrefix": is_str, "budgetMonthlyCents": is_int, "spentMonthlyCents": is_int,
           "brandColor": n(is_str), "logoAssetId": n(is_uuid), "logoUrl": n(is_str), "createdAt": is_dt,
           "updatedAt": is_dt}
ASSET = {"assetId": is_uuid, "companyId": is_uuid, "contentType": is_str, "byteSize": is_int, "sha256": is_str,
         "objectKey": is_str, "originalFilename": is_str, "createdByAgentId": n(is_uuid), "createdByUserId": n(is_int),
         "contentPath": is_str, "createdAt": is_dt, "updatedAt": is_dt}
BOARD_KEY = {"id": is_uuid, "name": is_str, "createdAt": is_dt, "expiresAt": n(is_dt), "lastUsedAt": n(is_dt),
             "revokedAt": n(is_dt)}
AGENT_KEY = {"id": is_uuid, "name": is_str, "createdAt": is_dt, "lastUsedAt": n(is_dt), "revokedAt": n(is_dt)}
OK = {"ok": lambda v: v is True}


# --- the world -----------------------------------------------------------------------------------
PNG = b"\x89PNG\r\n\x1a\n a screenshot"


def png(name):
    return SimpleUploadedFile(name, PNG, content_type="image/png")


def board_key_create(user, *args) -> dict:
    """``manage.py board_key_create --user U --json`` -> {"id", "token", "expiresAt"} (the service
    issues.services.board_keys while the command is not there; the command's own test needs it)."""
    from django.core.management import get_commands

    if "board_key_create" not in get_commands() and not args:
        from issues.services.board_keys import board_key_create as create

        key, token = create(actor=SYSTEM, user=user)
        return {"id": str(key.pk), "token": token, "expiresAt": key.expires_at.isoformat()}
    out = io.StringIO()
    call_command("board_key_create", "--user", user.username, *args, "--json", stdout=out)
    return json.loads(out.getvalue())


class Resp:
    """An httpx response seen through the Django-response interface tests.test_errors reads."""

    def __init__(self, response: httpx.Response):
        self.r = response
        self.status_code = response.status_code
        self.content = response.content

    def json(self):
        return self.r.json()

    def __getitem__(self, header):
        return self.r.headers[header]


@dataclass
class World:
    base: str
    ids: dict
    foreign: dict
    tokens: dict
    run_ids: dict = field(default_factory=dict)
    objs: dict = field(default_factory=dict)

    def client(self, cred, *, token=None, run_id=None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token or self.tokens[cred]}"}
        if cred == AGENT:
            headers["X-Paperclip-Run-Id"] = run_id or self.run_ids[AGENT]
        return httpx.Client(base_url=f"{self.base}/api", headers=headers, timeout=20)


def build_world(live_server) -> World:
    company = CompanyFactory(name="Paperclip", issue_prefix="PAP")
    other = CompanyFactory(name="Elsewhere", issue_prefix="OTH")
    board_user = MembershipFactory(company=company, role="owner").user
    other_user = MembershipFactory(company=other, role="owner").user
    board = board_key_create(board_user)
    spare_board_key = board_key_create(board_user)
    other_board_key = board_key_create(other_user)

    boss = AgentFactory(company=company, name="Mara", role="ceo", title="Chief")
    me = AgentFactory(company=company, name="Ivo", role="engineer", reports_to=boss,
                      permissions={"canAssignTasks": True})
    rival = AgentFactory(company=company, name="Rex", role="engineer")
    spare = AgentFactory(company=company, name="Spare", role="qa")
    _, me_token = agent_api_key_create(agent=me)
    me_key2, _ = agent_api_key_create(agent=me, name="second")
    goal = GoalFactory(company=company, title="Ship v1")
    spare_goal = GoalFactory(company=company, title="Scrap me")
    project = ProjectFactory(company=company, name="Website")
    label = Label.objects.create(company=company, name="bug", color="#ff0000")
    spare_label = Label.objects.create(company=company, name="chore", color="#00ff00")
    mine = IssueFactory(company=company, title="Fix login", priority="high", assignee_agent=me, project=project,
                        goal=goal, status="todo")
    mine.labels.add(label)
    child = IssueFactory(company=company, title="Login test", parent=mine, assignee_agent=me, goal=goal)
    loose = IssueFactory(company=company, title="Unassigned chore", status="todo")
    rivals = IssueFactory(company=company, title="Rival's task", assignee_agent=rival, status="todo")
    comment = Comment.objects.create(company=company, issue=mine, author_type="user", author_user=board_user,
                                     body="Customers cannot log in.")
    plan_v1 = document_write(actor=SYSTEM, issue=mine, key="plan", body="1. Reproduce", title="Plan", format="markdown")
    approval = Approval.objects.create(company=company, type="request_board_approval", title="Buy a domain",
                                       payload={"title": "Buy a domain", "summary": "s"}, requested_by_agent=me)
    ApprovalIssue.objects.create(approval=approval, issue=mine)
    rev_approval = Approval.objects.create(company=company, type="approve_ceo_strategy", title="Strategy",
                                           payload={"plan": "v1"}, requested_by_agent=me, status="revision_requested")
    run = RunFactory(agent=me, issue=mine, status="succeeded", finished_at=timezone.now())
    spare_run = RunFactory(agent=spare, status="queued")
    RunFactory(agent=rival, issue=rivals, status="running", started_at=timezone.now())
    ApprovalComment.objects.create(company=company, approval=approval, body="Why?", author_user=board_user)
    # Uploaded by the agent: an agent deletes only its own attachments.
    shot = attachment_create(actor=Actor(agent=me), issue=mine, upload=png("login-error.png"))
    CostEvent.objects.create(company=company, agent=me, issue=mine, project=project, provider="anthropic",
                             biller="anthropic", model="claude", input_tokens=10, output_tokens=5, cost_cents=7,
                             occurred_at=timezone.now())

    o_agent = AgentFactory(company=other, name="Otto")
    o_key, _ = agent_api_key_create(agent=o_agent)
    o_issue = IssueFactory(company=other, title="Their issue", assignee_agent=o_agent)
    o_comment = Comment.objects.create(company=other, issue=o_issue, author_type="user", author_user=other_user,
                                       body="theirs")
    o_plan = document_write(actor=SYSTEM, issue=o_issue, key="plan", body="theirs", title="Plan", format="markdown")
    o_goal = GoalFactory(company=other)
    o_project = ProjectFactory(company=other)
    o_label = Label.objects.create(company=other, name="bug", color="#ff0000")
    o_approval = Approval.objects.create(company=other, type="request_board_approval", title="x",
                                         requested_by_agent=o_agent)
    o_run = RunFactory(agent=o_agent, status="queued")
    o_shot = attachment_create(actor=SYSTEM, issue=o_issue, upload=png("theirs.png"))
    logo, o_logo = (company_logo_upload(actor=SYSTEM, company=c, upload=png("logo.png")) for c in (company, other))

    ids = dict(company=company.pk, agent=me.pk, boss=boss.pk, rival=rival.pk, spare=spare.pk, issue=mine.pk,
               child=child.pk, loose=loose.pk, rivals=rivals.pk, comment=comment.pk, goal=goal.pk,
               spare_goal=spare_goal.pk, project=project.pk, label=label.pk, spare_label=spare_label.pk,
               approval=approval.pk, rev_approval=rev_approval.pk, run=run.pk, spare_run=spare_run.pk,
               agent_key=me_key2.pk, board_key=spare_board_key["id"], plan_v1=plan_v1.pk, attachment=shot.pk,
               logo=logo.pk, board_user=board_user.pk)
    foreign = dict(company=other.pk, agent=o_agent.pk, boss=o_agent.pk, rival=o_agent.pk, spare=o_agent.pk,
                   issue=o_issue.pk, child=o_issue.pk, loose=o_issue.pk, rivals=o_issue.pk, comment=o_comment.pk,
                   goal=o_goal.pk, spare_goal=o_goal.pk, project=o_project.pk, label=o_label.pk,
                   spare_label=o_label.pk, approval=o_approval.pk, rev_approval=o_approval.pk, run=o_run.pk,
                   spare_run=o_run.pk, agent_key=o_key.pk, board_key=other_board_key["id"], plan_v1=o_plan.pk,
                   attachment=o_shot.pk, logo=o_logo.pk)
    return World(base=live_server.url, ids={k: str(v) for k, v in ids.items()},
                 foreign={k: str(v) for k, v in foreign.items()},
                 tokens={BOARD: board["token"], AGENT: me_token},
                 run_ids={AGENT: str(uuid.uuid4())},
                 objs=dict(company=company, other=other, board_user=board_user, board_key=board, me=me,
                           rival=rival, spare=spare, mine=mine, attachment=shot))


# --- the table -----------------------------------------------------------------------------------
Body = dict | Callable[[dict], dict] | None


@dataclass
class Case:
    name: str
    method: str
    path: str
    status: dict  # credential -> expected status
    shape: Any = None  # a schema dict (an object), array(schema) (a bare non-empty array), raw(type), or None
    body: Body = None  # JSON; with ``files``, the other multipart/form-data fields
    query: dict | None = None
    files: dict | None = None  # multipart/form-data files: {field: (filename, bytes, content type)}
    invalid: tuple = ()  # (body, field) pairs answered 400 naming the field
    setup: Callable | None = None  # (world, api) -> None, before the request
    check: Callable | None = None  # (json, or the response for raw(), world, cred) -> None, after the shape
    foreign: bool = True  # the same request with another company's ids is a 404
    refusal: str = "board_only"  # the code of the agent key's 403 where the board succeeds
    xfail: dict = field(default_factory=dict)  # credential -> reason (documented differences)

    def body_for(self, ids):
        return self.body(ids) if callable(self.body) else self.body


def both(code):
    return {BOARD: code, AGENT: code}


def board_only(code):
    return {BOARD: code, AGENT: 403}


def agent_only(code):
    return {BOARD: 401, AGENT: code}


def array(schema):
    return ("array", schema)


def raw(content_type):
    """Bytes, not JSON, answered with this Content-Type (the check gets the httpx response)."""
    return ("raw", content_type)


def released(body, w, cred):
    got = {k: body.get(k) for k in ("status", "assigneeAgentId", "checkoutRunId")}
    assert got == {"status": "todo", "assigneeAgentId": None, "checkoutRunId": None}, got


def checked_out(body, w, cred):
    assert body["status"] == "in_progress" and body["assigneeAgentId"] == w.ids["agent"], body
    if cred == AGENT:  # the lock records the client's own run id (reference §7 step 7)
        assert body["checkoutRunId"] == w.run_ids[AGENT], body


def in_progress_for_release(w, api):
    """The agent checks its issue out over HTTP; for the board, the issue is already in progress."""
    if "X-Paperclip-Run-Id" not in api.headers:
        Issue.objects.filter(pk=w.ids["issue"]).update(status="in_progress", started_at=timezone.now())
        return
    r = api.post(f"/issues/{w.ids['issue']}/checkout", json={"agentId": w.ids["agent"], "expectedStatuses": ["todo"]})
    assert r.status_code == 200, r.text


def hires_need_approval(w, api):
    Company.objects.filter(pk=w.ids["company"]).update(require_board_approval_for_new_agents=True)


def pending_hire(body, w, cred):
    agent, approval = body["agent"], body["approval"]
    assert agent["status"] == "pending_approval" and approval["type"] == "hire_agent", body
    assert approval["payload"]["agentId"] == agent["id"] and approval["issueIds"] == [w.ids["issue"]], body


def archived(w, api):
    """A company is deleted once archived and its runs have ended (differs: upstream deletes an active one)."""
    Company.objects.filter(pk=w.ids["company"]).update(status="archived")
    HeartbeatRun.objects.filter(company_id=w.ids["company"]).update(status="cancelled", finished_at=timezone.now())


def staff_board(w, api):
    """A local agent process's command is set by staff (issues.services.host_commands)."""
    from django.contrib.auth import get_user_model

    from issues.models import Membership

    get_user_model().objects.filter(pk__in=Membership.objects.filter(company_id=w.ids["company"])
                                    .values("user_id")).update(is_staff=True)


def pause_spare(w, api):
    Agent.objects.filter(pk=w.ids["spare"]).update(status="paused", pause_reason="manual")


def mark_done(w, api):
    Issue.objects.filter(pk=w.ids["issue"]).update(status="done", completed_at=timezone.now())


def expect(key, value):
    def check(body, w, cred):
        assert body.get(key) == (w.ids[value[1:]] if isinstance(value, str) and value.startswith("@") else value), body
    return check


def has_ids(*names):
    def check(body, w, cred):
        got = {item["id"] for item in body}
        assert {w.ids[n] for n in names} <= got, (names, got)
    return check


def no_token(body, w, cred):
    assert all("token" not in item for item in body), body


def new_agent_key(body, w, cred):
    assert body["token"].startswith("pcp_") and not body["token"].startswith("pcp_board_"), body


def new_board_key(body, w, cred):
    assert body["token"].startswith("pcp_board_"), body
    expires = datetime.fromisoformat(body["expiresAt"].replace("Z", "+00:00"))
    assert timedelta(days=29) < expires - timezone.now() <= timedelta(days=30, minutes=1), body


def chain_is_boss(body, w, cred):
    assert [c["id"] for c in body["chainOfCommand"]] == [w.ids["boss"]], body["chainOfCommand"]


def requested_by_me_if_agent(body, w, cred):
    assert body["status"] == "pending", body
    if cred == AGENT:
        assert body["requestedByAgentId"] == w.ids["agent"], body


def invoked(body, w, cred):
    # 202 with the queued run, or {"status": "skipped"} when coalesced
    assert body.get("status") == "skipped" or (is_uuid(body.get("id")) and body["status"] in RUN_STATUS), body


def goal_defaults(body, w, cred):
    assert body["level"] == "task" and body["status"] == "planned", body


def project_default(body, w, cred):
    assert body["status"] == "backlog", body


def subtask_of_issue(body, w, cred):
    assert body["parentId"] == w.ids["issue"] and body["goalId"] == w.ids["goal"], body


def patch_echo(body, w, cred):
    assert body["title"] == "Fix login (renamed)", body
    assert "comment" in body and not problems(body["comment"], COMMENT), body.get("comment")


TRACE = b"Traceback (most recent call last):\n  login failed\n"


def attachment_added(body, w, cred):
    got = {k: body[k] for k in ("issueId", "issueCommentId", "originalFilename", "contentType", "byteSize", "sha256")}
    assert got == {"issueId": w.ids["issue"], "issueCommentId": w.ids["comment"], "originalFilename": "trace.txt",
                   "contentType": "text/plain", "byteSize": len(TRACE),
                   "sha256": hashlib.sha256(TRACE).hexdigest()}, body
    assert body["contentPath"] == f"/api/attachments/{body['id']}/content", body
    assert body["createdByAgentId"] == (w.ids["agent"] if cred == AGENT else None), body


def attachment_bytes(response, w, cred):
    assert response.content == PNG, response.content[:100]
    assert response.headers["content-length"] == str(len(PNG)), response.headers


def attachment_gone(body, w, cred):
    assert not Attachment.objects.filter(pk=w.ids["attachment"]).exists(), "not deleted"


def heartbeat_of_issue(body, w, cred):
    assert body["issue"]["id"] == w.ids["issue"] and body["goal"]["id"] == w.ids["goal"], body
    assert body["commentCursor"]["totalComments"] >= 1, body
    # The compact entry, nothing more: the issue's one attachment.
    attachments = body["attachments"]
    assert [(a["id"], a["filename"]) for a in attachments] == [(w.ids["attachment"], "login-error.png")], attachments
    assert set(attachments[0]) == set(HEARTBEAT_ATTACHMENT), attachments


AGENT_DELETE_XFAIL = "differs: DELETE /issues/{id} is board-only here (upstream lets agents through the PATCH gate)"
WAKEUP_XFAIL = "differs: POST /agents/{id}/wakeup answers 201 with {runId, ...} (this product's wake contract)"
BOARD_CHECKOUT_XFAIL = ("differs: a board user checks out for an agent only naming one of that agent's live runs in "
                        "X-Paperclip-Run-Id (every in-progress lock names a run); without one it is 422 run_required")

CHECKOUT_BODY = (lambda i: {"agentId": i["agent"], "expectedStatuses": ["todo", "backlog", "blocked", "in_review"]})

CASES = [
    # §2.5 board API keys
    Case("board_keys_list", "GET", "/board-api-keys", board_only(200), array(BOARD_KEY), check=no_token,
         foreign=False),
    Case("board_keys_create", "POST", "/board-api-keys", board_only(201), {**BOARD_KEY, "token": is_str},
         body={"name": "ci"}, invalid=(({"name": "ci", "expiresAt": "soon"}, "expiresAt"),), check=new_board_key,
         foreign=False),
    Case("board_keys_revoke", "DELETE", "/board-api-keys/{board_key}", board_only(200),
         {**OK, "keyId": is_uuid}),
    # §2.6 agent API keys
    Case("agent_keys_list", "GET", "/agents/{agent}/keys", board_only(200), array(AGENT_KEY), check=no_token),
    Case("agent_keys_create", "POST", "/agents/{agent}/keys", board_only(201),
         {"id": is_uuid, "name": is_str, "token": is_str, "createdAt": is_dt}, body={"name": "laptop"},
         invalid=(({"name": ""}, "name"),), check=new_agent_key),
    Case("agent_keys_revoke", "DELETE", "/agents/{agent}/keys/{agent_key}", board_only(200), OK),
    # §5.1 agents
    Case("agents_me", "GET", "/agents/me", agent_only(200), AGENT_DETAIL, check=chain_is_boss, foreign=False),
    Case("agents_me_inbox_lite", "GET", "/agents/me/inbox-lite", agent_only(200), array(INBOX_ITEM),
         check=has_ids("issue", "child"), foreign=False),
    Case("agents_me_inbox_mine", "GET", "/agents/me/inbox/mine", agent_only(200),
         array({**ISSUE, "myLastTouchAt": n(is_dt), "lastExternalCommentAt": n(is_dt), "isUnreadForMe": is_bool}),
         query=lambda i: {"userId": i["board_user"]}, check=has_ids("issue"), foreign=False),
    Case("company_agents_list", "GET", "/companies/{company}/agents", both(200), array(AGENT_OBJ),
         check=has_ids("agent", "boss", "rival")),
    Case("agents_get", "GET", "/agents/{agent}", both(200), AGENT_DETAIL, check=chain_is_boss),
    Case("agents_create", "POST", "/companies/{company}/agents", board_only(201), AGENT_OBJ,
         body={"name": "Nova", "role": "designer", "title": "Designer", "adapterType": "process",
               "adapterConfig": {"command": ["echo", "hi"]}, "budgetMonthlyCents": 500},
         refusal="missing_permission", setup=staff_board,
         invalid=(({"adapterType": "process"}, "name"),
                  ({"name": "Nova", "adapterType": "process", "role": "wizard"}, "role"),
                  ({"name": "Nova", "adapterType": "process", "budgetMonthlyCents": -1}, "budgetMonthlyCents")),
         check=expect("role", "designer")),
    Case("company_org", "GET", "/companies/{company}/org", both(200), array(ORG_NODE),
         check=lambda b, w, c: w.ids["agent"] in str(b) or pytest.fail(str(b))),
    Case("agent_hires_create", "POST", "/companies/{company}/agent-hires", board_only(201), HIRE,
         body=lambda i: {"name": "Hired", "role": "qa", "adapterType": "none", "sourceIssueId": i["issue"]},
         refusal="missing_permission", setup=hires_need_approval,
         invalid=(({"adapterType": "none"}, "name"),
                  ({"name": "Hired", "adapterType": "none", "sourceIssueIds": [7]}, "sourceIssueIds")),
         check=pending_hire),
    Case("agents_update", "PATCH", "/agents/{spare}", board_only(200), AGENT_OBJ,
         body={"title": "Tester", "budgetMonthlyCents": 1200},
         invalid=(({"role": "wizard"}, "role"), ({"budgetMonthlyCents": -5}, "budgetMonthlyCents")),
         check=expect("budgetMonthlyCents", 1200)),
    Case("agents_pause", "POST", "/agents/{spare}/pause", board_only(200), AGENT_OBJ, check=expect("status", "paused")),
    Case("agents_resume", "POST", "/agents/{spare}/resume", board_only(200), AGENT_OBJ, setup=pause_spare,
         check=lambda b, w, c: b["status"] in {"active", "idle"} or pytest.fail(str(b))),
    Case("agents_terminate", "POST", "/agents/{spare}/terminate", board_only(200), AGENT_OBJ,
         check=expect("status", "terminated")),
    Case("agents_wakeup", "POST", "/agents/{agent}/wakeup", both(202), None, body={"reason": "contract"},
         check=invoked, xfail={BOARD: WAKEUP_XFAIL, AGENT: WAKEUP_XFAIL}),
    Case("agents_heartbeat_invoke", "POST", "/agents/{agent}/heartbeat/invoke", both(202), None, check=invoked),
    Case("company_heartbeat_runs", "GET", "/companies/{company}/heartbeat-runs", both(200), array(RUN),
         query=lambda i: {"agentId": i["agent"], "limit": 10}, check=has_ids("run")),
    Case("company_live_runs", "GET", "/companies/{company}/live-runs", both(200), array(LIVE_RUN),
         check=has_ids("spare_run")),
    Case("heartbeat_runs_cancel", "POST", "/heartbeat-runs/{spare_run}/cancel", board_only(200), RUN,
         check=expect("status", "cancelled")),
    Case("heartbeat_runs_issues", "GET", "/heartbeat-runs/{run}/issues", both(200), array(RUN_ISSUE),
         check=lambda b, w, c: [x.get("id", x.get("issueId")) for x in b] == [w.ids["issue"]] or pytest.fail(str(b)),
         foreign=False),
    Case("issues_live_runs", "GET", "/issues/{rivals}/live-runs", both(200), array(LIVE_RUN)),
    Case("issues_runs", "GET", "/issues/{issue}/runs", both(200),
         array({**RUN, "runId": is_uuid, "adapterType": is_str}), check=has_ids("run")),
    Case("issues_active_run", "GET", "/issues/{rivals}/active-run", both(200), RUN_CORE),
    # §5.2 issues
    Case("company_issues_list", "GET", "/companies/{company}/issues", both(200), array(ISSUE),
         query={"status": "todo,in_progress"}, check=has_ids("issue", "loose")),
    Case("issues_get", "GET", "/issues/{issue}", both(200), ISSUE_DETAIL,
         check=lambda b, w, c: (b["labelIds"] == [w.ids["label"]] and b["goal"]["id"] == w.ids["goal"])
         or pytest.fail(str(b))),
    Case("issues_create", "POST", "/companies/{company}/issues", both(201), ISSUE,
         body=lambda i: {"title": "Add a regression test", "description": "From the contract", "status": "todo",
                         "priority": "low", "assigneeAgentId": i["agent"], "parentId": i["issue"],
                         "goalId": i["goal"], "projectId": i["project"], "labelIds": [i["label"]],
                         "blockedByIssueIds": [i["loose"]]},
         invalid=(({}, "title"), ({"title": "x", "status": "nope"}, "status"),
                  ({"title": "x", "priority": "urgent"}, "priority")),
         check=subtask_of_issue),
    Case("issues_update", "PATCH", "/issues/{issue}", both(200), {**ISSUE, "comment": n(is_dict)},
         body={"title": "Fix login (renamed)", "comment": "Renamed for clarity."},
         invalid=(({"status": "nope"}, "status"), ({"priority": "urgent"}, "priority")), check=patch_echo),
    Case("issues_delete", "DELETE", "/issues/{loose}", both(200), ISSUE, xfail={AGENT: AGENT_DELETE_XFAIL}),
    Case("issues_children_list", "GET", "/issues/{issue}/children", both(200), array(ISSUE), check=has_ids("child")),
    Case("issues_children_create", "POST", "/issues/{issue}/children", both(201), ISSUE,
         body=lambda i: {"title": "Child via route", "goalId": i["goal"]}, invalid=(({}, "title"),),
         check=subtask_of_issue),
    Case("issues_checkout", "POST", "/issues/{issue}/checkout", both(200), ISSUE, body=CHECKOUT_BODY,
         invalid=((lambda i: {"agentId": i["agent"], "expectedStatuses": []}, "expectedStatuses"),
                  (lambda i: {"agentId": i["agent"], "expectedStatuses": ["nope"]}, "expectedStatuses")),
         check=checked_out, xfail={BOARD: BOARD_CHECKOUT_XFAIL}),
    Case("issues_release", "POST", "/issues/{issue}/release", both(200), ISSUE, setup=in_progress_for_release,
         check=released),
    Case("issues_heartbeat_context", "GET", "/issues/{issue}/heartbeat-context", both(200), HEARTBEAT_CONTEXT,
         check=heartbeat_of_issue),
    Case("issues_comments_list", "GET", "/issues/{issue}/comments", both(200), array(COMMENT),
         query={"order": "asc"}, check=has_ids("comment")),
    Case("issues_comments_get", "GET", "/issues/{issue}/comments/{comment}", both(200), COMMENT,
         check=expect("id", "@comment")),
    Case("issues_comments_create", "POST", "/issues/{issue}/comments", both(201), COMMENT,
         body={"body": "Looking into it."}, invalid=(({}, "body"), ({"body": ""}, "body")),
         check=expect("body", "Looking into it.")),
    Case("issues_comments_reopen", "POST", "/issues/{issue}/comments", both(201), COMMENT, setup=mark_done,
         body={"body": "Still broken.", "reopen": True},
         check=lambda b, w, c: Issue.objects.get(pk=w.ids["issue"]).status == "todo" or pytest.fail("not reopened")),
    Case("issues_documents_list", "GET", "/issues/{issue}/documents", both(200), array(DOC_SUMMARY)),
    Case("issues_documents_get", "GET", "/issues/{issue}/documents/plan", both(200), DOCUMENT,
         check=expect("body", "1. Reproduce")),
    Case("issues_documents_put_new", "PUT", "/issues/{issue}/documents/notes", both(201), DOCUMENT,
         body={"title": "Notes", "format": "markdown", "body": "hello", "baseRevisionId": None},
         invalid=(({"format": "markdown"}, "body"),)),
    Case("issues_documents_restore", "POST", "/issues/{issue}/documents/plan/revisions/{plan_v1}/restore",
         both(200), DOCUMENT, check=lambda b, w, c: b["latestRevisionNumber"] == 2 or pytest.fail(str(b))),
    Case("issues_documents_delete", "DELETE", "/issues/{issue}/documents/plan", board_only(200), {"ok": is_bool},
         check=lambda b, w, c: not Document.objects.filter(issue_id=w.ids["issue"], key="plan").exists()
         or pytest.fail("still there")),
    Case("issues_admin_force_release", "POST", "/issues/{issue}/admin/force-release", board_only(200),
         {"issue": lambda v: not problems(v, ISSUE), "previous": is_dict}, query={"clearAssignee": "false"}),
    Case("issues_documents_revisions", "GET", "/issues/{issue}/documents/plan/revisions", both(200),
         array(REVISION)),
    # attachments (multipart upload; the content is bytes)
    Case("issues_attachments_create", "POST", "/companies/{company}/issues/{issue}/attachments", both(201),
         ATTACHMENT, files={"file": ("trace.txt", TRACE, "text/plain")},
         body=lambda i: {"issueCommentId": i["comment"]},
         invalid=(({"issueCommentId": "nope"}, "issueCommentId"),), check=attachment_added),
    Case("issues_attachments_list", "GET", "/issues/{issue}/attachments", both(200), array(ATTACHMENT),
         check=has_ids("attachment")),
    Case("attachments_retrieve", "GET", "/attachments/{attachment}", both(200), ATTACHMENT,
         check=expect("id", "@attachment")),
    Case("attachments_content", "GET", "/attachments/{attachment}/content", both(200), raw("image/png"),
         check=attachment_bytes),
    Case("attachments_delete", "DELETE", "/attachments/{attachment}", both(200), OK,
         check=attachment_gone),
    Case("labels_list", "GET", "/companies/{company}/labels", both(200),
         array({"id": is_uuid, "name": is_str, "color": is_str}), check=has_ids("label")),
    Case("labels_create", "POST", "/companies/{company}/labels", both(201),
         {"id": is_uuid, "name": is_str, "color": is_str}, body={"name": "urgent", "color": "#112233"},
         invalid=(({"name": "x", "color": "red"}, "color"), ({"color": "#112233"}, "name"))),
    Case("labels_delete", "DELETE", "/labels/{spare_label}", both(200), None),
    # §5.3 approvals
    Case("issues_approvals_list", "GET", "/issues/{issue}/approvals", both(200), array(APPROVAL),
         check=lambda b, w, c: [a["id"] for a in b] == [w.ids["approval"]] or pytest.fail(str(b))),
    # linking needs the CEO role or canCreateAgents: the world's agent has neither
    Case("issues_approvals_link", "POST", "/issues/{loose}/approvals", board_only(201), array(APPROVAL),
         body=lambda i: {"approvalId": i["approval"]}, refusal="missing_permission",
         invalid=(({"approvalId": "x"}, "approvalId"),),
         check=lambda b, w, c: [a["id"] for a in b] == [w.ids["approval"]] or pytest.fail(str(b))),
    Case("issues_approvals_unlink", "DELETE", "/issues/{issue}/approvals/{approval}", board_only(200), OK,
         refusal="missing_permission"),
    Case("approvals_list", "GET", "/companies/{company}/approvals", both(200), array(APPROVAL),
         query={"status": "pending"},
         check=lambda b, w, c: [a["id"] for a in b] == [w.ids["approval"]] or pytest.fail(str(b))),
    Case("approvals_get", "GET", "/approvals/{approval}", both(200), APPROVAL),
    Case("approvals_create", "POST", "/companies/{company}/approvals", both(201), APPROVAL,
         body=lambda i: {"type": "request_board_approval", "issueIds": [i["issue"]],
                         "payload": {"title": "Rent a server", "summary": "Need CI", "recommendedAction": "approve",
                                     "risks": []}},
         invalid=(({"payload": {}}, "type"), ({"type": "nope", "payload": {}}, "type")),
         check=requested_by_me_if_agent),
    Case("approvals_issues", "GET", "/approvals/{approval}/issues", both(200), array(ISSUE_SUMMARY),
         check=has_ids("issue")),
    Case("approvals_approve", "POST", "/approvals/{approval}/approve", board_only(200), APPROVAL,
         body={"decisionNote": "Go ahead"},
         check=lambda b, w, c: (b["status"], b["decisionNote"]) == ("approved", "Go ahead") or pytest.fail(str(b))),
    Case("approvals_reject", "POST", "/approvals/{approval}/reject", board_only(200), APPROVAL,
         body={"decisionNote": "No"}, check=expect("status", "rejected")),
    Case("approvals_request_revision", "POST", "/approvals/{approval}/request-revision", board_only(200), APPROVAL,
         body={"decisionNote": "More detail"}, check=expect("status", "revision_requested")),
    Case("approvals_resubmit", "POST", "/approvals/{rev_approval}/resubmit", both(200), APPROVAL,
         body={"payload": {"plan": "v2"}}, check=expect("status", "pending")),
    Case("approvals_comments_list", "GET", "/approvals/{approval}/comments", both(200), array(APPROVAL_COMMENT)),
    Case("approvals_comments_create", "POST", "/approvals/{approval}/comments", both(201), APPROVAL_COMMENT,
         body={"body": "Any update?"}, invalid=(({"body": ""}, "body"),)),
    # §5.4 goals
    Case("goals_list", "GET", "/companies/{company}/goals", both(200), array(GOAL), check=has_ids("goal")),
    Case("goals_get", "GET", "/goals/{goal}", both(200), GOAL),
    Case("goals_create", "POST", "/companies/{company}/goals", both(201), GOAL,
         body=lambda i: {"title": "Grow", "parentId": i["goal"], "ownerAgentId": i["agent"]},
         invalid=(({}, "title"), ({"title": "x", "level": "galaxy"}, "level"),
                  ({"title": "x", "status": "completed"}, "status")),
         check=goal_defaults),
    Case("goals_update", "PATCH", "/goals/{goal}", both(200), GOAL, body={"status": "achieved", "level": "company"},
         invalid=(({"status": "completed"}, "status"),), check=expect("status", "achieved")),
    Case("goals_delete", "DELETE", "/goals/{spare_goal}", both(200), GOAL),
    # §5.5 projects
    Case("projects_list", "GET", "/companies/{company}/projects", both(200), array(PROJECT), check=has_ids("project")),
    Case("projects_get", "GET", "/projects/{project}", both(200), PROJECT),
    Case("projects_create", "POST", "/companies/{company}/projects", both(201), PROJECT,
         body={"name": "API", "description": "The API"},
         invalid=(({}, "name"), ({"name": "x", "status": "active-ish"}, "status")), check=project_default),
    Case("projects_update", "PATCH", "/projects/{project}", both(200), PROJECT, body={"status": "in_progress"},
         invalid=(({"status": "nope"}, "status"),), check=expect("status", "in_progress")),
    # §5.6 costs
    Case("cost_events_create", "POST", "/companies/{company}/cost-events", both(201), COST_EVENT,
         body=lambda i: {"agentId": i["agent"], "issueId": i["issue"], "provider": "anthropic",
                         "model": "claude-sonnet", "inputTokens": 1000, "outputTokens": 200, "costCents": 12,
                         "billingType": "metered_api", "occurredAt": "2026-01-15T10:00:00Z"},
         invalid=((lambda i: {"agentId": i["agent"], "provider": "p", "model": "m", "costCents": 1}, "occurredAt"),
                  (lambda i: {"agentId": i["agent"], "provider": "p", "model": "m", "costCents": -1,
                              "occurredAt": "2026-01-15T10:00:00Z"}, "costCents"),
                  (lambda i: {"agentId": i["agent"], "provider": "p", "model": "m", "costCents": 1,
                              "billingType": "barter", "occurredAt": "2026-01-15T10:00:00Z"}, "billingType")),
         check=lambda b, w, c: (b["biller"], b["cachedInputTokens"]) == ("anthropic", 0) or pytest.fail(str(b))),
    Case("costs_summary", "GET", "/companies/{company}/costs/summary", both(200), COST_SUMMARY,
         query={"from": "2026-01-01T00:00:00Z", "to": "2026-02-01T00:00:00Z"}),
    Case("costs_by_agent", "GET", "/companies/{company}/costs/by-agent", both(200), array(COST_BY_AGENT)),
    Case("costs_by_project", "GET", "/companies/{company}/costs/by-project", both(200), array(COST_BY_PROJECT)),
    Case("costs_by_provider", "GET", "/companies/{company}/costs/by-provider", both(200), array(COST_BY_PROVIDER),
         check=lambda b, w, c: [r["provider"] for r in b] == ["anthropic"] or pytest.fail(str(b))),
    Case("costs_by_biller", "GET", "/companies/{company}/costs/by-biller", both(200), array(COST_BY_BILLER)),
    Case("costs_by_agent_model", "GET", "/companies/{company}/costs/by-agent-model", both(200),
         array(COST_BY_AGENT_MODEL), check=lambda b, w, c: [r["agentId"] for r in b] == [w.ids["agent"]]
         or pytest.fail(str(b))),
    Case("costs_window_spend", "GET", "/companies/{company}/costs/window-spend", both(200), array(COST_WINDOW),
         check=lambda b, w, c: [r["window"] for r in b] == ["5h", "24h", "7d"] or pytest.fail(str(b))),
    # §5.7 dashboard, §5.8 activity
    Case("dashboard", "GET", "/companies/{company}/dashboard", both(200), DASHBOARD),
    Case("activity_list", "GET", "/companies/{company}/activity", both(200), array(ACTIVITY),
         query=lambda i: {"entityType": "issue", "entityId": i["issue"]}),
    Case("issues_activity", "GET", "/issues/{issue}/activity", both(200), array(ACTIVITY),
         check=lambda b, w, c: (b and all((x["entityType"], x["entityId"]) == ("issue", w.ids["issue"]) for x in b))
         or pytest.fail(str(b))),
    # §5.9 companies
    Case("companies_list", "GET", "/companies", board_only(200), array(COMPANY), foreign=False),
    Case("companies_create", "POST", "/companies", board_only(201), COMPANY, body={"name": "Contract Clips"},
         setup=staff_board, invalid=(({}, "name"),), foreign=False,
         check=lambda b, w, c: (b["name"], b["issuePrefix"][:3]) == ("Contract Clips", "CON") or pytest.fail(str(b))),
    Case("companies_stats", "GET", "/companies/stats", board_only(200), None, foreign=False,
         check=lambda b, w, c: (w.ids["company"] in b and w.foreign["company"] not in b
                                and all(set(v) == {"agentCount", "issueCount"} for v in b.values())
                                and b[w.ids["company"]]["agentCount"] >= 1) or pytest.fail(str(b))),
    Case("companies_get", "GET", "/companies/{company}", both(200), COMPANY),
    Case("companies_update", "PATCH", "/companies/{company}", board_only(200), COMPANY,
         body={"budgetMonthlyCents": 10000, "description": "We make clips"},
         invalid=(({"budgetMonthlyCents": -1}, "budgetMonthlyCents"),), check=expect("budgetMonthlyCents", 10000)),
    Case("companies_update_branding", "PATCH", "/companies/{company}", board_only(200), COMPANY,
         body=lambda i: {"brandColor": "#336699", "logoAssetId": i["logo"]},
         invalid=(({"brandColor": "blue"}, "brandColor"), ({"logoAssetId": "nope"}, "logoAssetId")),
         check=lambda b, w, c: (b["brandColor"], b["logoUrl"]) == ("#336699", f"/api/assets/{w.ids['logo']}/content")
         or pytest.fail(str(b))),
    Case("companies_delete", "DELETE", "/companies/{company}", board_only(200), OK, setup=archived,
         check=lambda b, w, c: not Company.objects.filter(pk=w.ids["company"]).exists() or pytest.fail("kept")),
    Case("companies_logo_upload", "POST", "/companies/{company}/logo", board_only(201), ASSET,
         files={"file": ("logo.png", PNG, "image/png")},
         check=lambda b, w, c: (b["contentType"], b["byteSize"]) == ("image/png", len(PNG)) or pytest.fail(str(b))),
    Case("assets_content", "GET", "/assets/{logo}/content", both(200), raw("image/png"), check=attachment_bytes),
]


def _params():
    for case in CASES:
        for cred in CREDENTIALS:
            marks = [pytest.mark.xfail(strict=True, reason=case.xfail[cred])] if cred in case.xfail else []
            yield pytest.param(case, cred, id=f"{case.name}-{cred}", marks=marks)


def _send(api, case, ids, body):
    query = case.query(ids) if callable(case.query) else case.query
    kwargs = {"params": query}
    if case.files:  # multipart/form-data: the files, and the body's fields beside them
        kwargs["files"] = case.files
        kwargs["data"] = body
    elif body is not None:
        kwargs["json"] = body
    return api.request(case.method, case.path.format(**ids), **kwargs)


def _check_shape(data, shape):
    if shape is None:
        return
    if isinstance(shape, tuple) and shape[0] == "raw":
        assert data.headers["content-type"].split(";")[0] == shape[1], data.headers["content-type"]
        assert data.content, "expected bytes"
        return
    if isinstance(shape, tuple):
        assert isinstance(data, list), f"expected a bare array, got {str(data)[:300]}"
        assert data, "expected a non-empty array for this world"
        for i, item in enumerate(data):
            assert_schema(item, shape[1], f"[{i}].")
    else:
        assert_schema(data, shape)


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("case,cred", list(_params()))
def test_endpoint_contract(live_server, case, cred):
    w = build_world(live_server)
    expected = case.status[cred]
    with w.client(cred) as api:
        if case.setup:
            case.setup(w, api)
        refused = expected in (401, 403)
        if case.foreign and not refused:
            foreign = _send(api, case, w.foreign, case.body_for(w.foreign))
            assert_error(Resp(foreign), 404)
        if not refused:
            for bad, name in case.invalid:
                bad_body = bad(w.ids) if callable(bad) else bad
                assert_error(Resp(_send(api, case, w.ids, bad_body)), 400, fields=(name,))
        response = _send(api, case, w.ids, case.body_for(w.ids))
        if refused:
            error = assert_error(Resp(response), expected)
            if expected == 403 and case.status[BOARD] < 400:
                assert error["code"] == case.refusal, error
            return
        assert response.status_code == expected, (response.status_code, response.text[:800])
        is_raw = isinstance(case.shape, tuple) and case.shape[0] == "raw"
        data = response if is_raw else response.json() if response.content else None
        failures = []
        for step in (lambda: _check_shape(data, case.shape), lambda: case.check and case.check(data, w, cred)):
            try:  # report the shape and the behaviour together: one missing key must not hide the rest
                step()
            except AssertionError as exc:
                failures.append(str(exc).splitlines()[0][:600])
        assert not failures, " | ".join(failures)


# --- behaviour beyond the table -------------------------------------------------------------------
@pytest.mark.xfail(strict=True, reason="differs: user ids (assigneeUserId, createdByUserId, authorUserId, …) "
                                       "are integers")
@pytest.mark.django_db(transaction=True)
def test_user_ids_are_strings(live_server):
    """Upstream user ids are strings (Better Auth); this product's are integers."""
    w = build_world(live_server)
    with w.client(BOARD) as api:
        created = api.post(f"/companies/{w.ids['company']}/issues", json={"title": "by a user"}).json()
    assert isinstance(created["createdByUserId"], str), created["createdByUserId"]


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="differs: work starts with a checkout; creating an issue in_progress is a "
                          "422 use_checkout")
@pytest.mark.django_db(transaction=True)
def test_an_issue_may_be_created_in_progress(live_server):
    """Upstream creates an issue in_progress when it has an assignee."""
    w = build_world(live_server)
    with w.client(BOARD) as api:
        created = api.post(f"/companies/{w.ids['company']}/issues",
                           json={"title": "Started", "status": "in_progress", "assigneeAgentId": w.ids["agent"]})
    assert created.status_code == 201, created.text


@pytest.mark.django_db(transaction=True)
def test_naming_an_assignee_needs_tasks_assign(live_server):
    """Upstream: an agent without the grant (not CEO, no canCreateAgents) naming an assignee is a 403."""
    w = build_world(live_server)
    Agent.objects.filter(pk=w.ids["rival"]).update(permissions={}, role="engineer")  # no grant, not the CEO
    rival = Agent.objects.get(pk=w.ids["rival"])
    _, token = agent_api_key_create(agent=rival)
    run = RunFactory(agent=rival, status="running")
    with w.client(AGENT, token=token, run_id=str(run.pk)) as api:
        created = api.post(f"/companies/{w.ids['company']}/issues",
                           json={"title": "For Spare", "assigneeAgentId": w.ids["spare"]})
    assert created.status_code == 403, created.text
    assert created.json()["error"] == "Missing permission: tasks:assign"


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="differs: an agent's task tree stays two levels deep (seed 004); a "
                          "grandchild is placed beside the requester (parentAdjusted)")
@pytest.mark.django_db(transaction=True)
def test_an_agent_creates_a_grandchild_under_the_parent_it_names(live_server):
    w = build_world(live_server)
    with w.client(AGENT) as api:
        created = api.post(f"/companies/{w.ids['company']}/issues",
                           json={"title": "Deeper", "parentId": w.ids["child"]})
    assert created.status_code == 201 and created.json()["parentId"] == w.ids["child"], created.text


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="differs: within a priority the list is oldest first (a work queue); "
                          "sortField=updated&sortDir=desc gives upstream's most recent first")
@pytest.mark.django_db(transaction=True)
def test_the_list_shows_the_most_recently_active_first_within_a_priority(live_server):
    w = build_world(live_server)
    company = Company.objects.get(pk=w.ids["company"])
    older = IssueFactory(company=company, title="Older", priority="low")
    newer = IssueFactory(company=company, title="Newer", priority="low")
    with w.client(BOARD) as api:
        listed = [i["id"] for i in api.get(f"/companies/{w.ids['company']}/issues", params={"priority": "low"}).json()]
    assert listed.index(str(newer.pk)) < listed.index(str(older.pk)), listed


@pytest.mark.django_db(transaction=True)
def test_issue_paths_accept_the_identifier_and_the_list_needs_a_company(live_server):
    w = build_world(live_server)
    with w.client(BOARD) as api:
        by_identifier = api.get(f"/issues/{w.objs['mine'].identifier.lower()}")
        assert by_identifier.status_code == 200 and by_identifier.json()["id"] == w.ids["issue"]
        assert_error(Resp(api.get("/issues")), 400)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("cred", CREDENTIALS)
def test_issue_list_filters(live_server, cred):
    w = build_world(live_server)
    i = w.ids
    with w.client(cred) as api:
        def ids_for(**params):
            r = api.get(f"/companies/{i['company']}/issues", params=params)
            assert r.status_code == 200, r.text
            return {row["id"] for row in r.json()}

        assert ids_for(assigneeAgentId=i["agent"]) == {i["issue"], i["child"]}
        assert ids_for(status="todo,in_progress", assigneeAgentId=i["rival"]) == {i["rivals"]}
        assert ids_for(projectId=i["project"]) == {i["issue"]}
        assert ids_for(parentId=i["issue"]) == {i["child"]}
        assert ids_for(labelId=i["label"]) == {i["issue"]}
        assert i["issue"] in ids_for(q="login")
        assert_error(Resp(api.get(f"/companies/{i['company']}/issues", params={"limit": "0"})), 400)
        assert_error(Resp(api.get(f"/companies/{i['company']}/issues", params={"status": "nope"})), 400)


@pytest.mark.django_db(transaction=True)
def test_issue_semantic_rules_are_422(live_server):
    w = build_world(live_server)
    with w.client(BOARD) as api:
        assert_error(Resp(api.patch(f"/issues/{w.ids['loose']}", json={"status": "in_progress"})), 422)
        assert_error(Resp(api.post(f"/issues/{w.ids['issue']}/comments",
                                   json={"body": "x", "interrupt": "maybe"})), 400, fields=("interrupt",))


# --- authentication modes (§2) -------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_board_key_command_and_api_lifecycle(live_server):
    w = build_world(live_server)
    user = w.objs["board_user"]
    forever = board_key_create(user, "--no-expiry")
    assert forever["token"].startswith("pcp_board_") and forever["expiresAt"] is None
    five = board_key_create(user, "--expires-days", "5")
    expires = datetime.fromisoformat(five["expiresAt"].replace("Z", "+00:00"))
    assert timedelta(days=4) < expires - timezone.now() <= timedelta(days=5, minutes=1)
    # hashed at rest: only the SHA-256 is stored
    row = BoardApiKey.objects.get(pk=forever["id"])
    assert row.key_hash == hashlib.sha256(forever["token"].encode()).hexdigest()
    assert forever["token"] not in {row.key_hash, row.prefix}

    with w.client(BOARD) as api:
        never = api.post("/board-api-keys", json={"name": "forever", "expiresAt": None})
        assert never.status_code == 201 and never.json()["expiresAt"] is None, never.text
        listed = api.get("/board-api-keys").json()
        used = next(k for k in listed if k["id"] == w.objs["board_key"]["id"])
        assert used["lastUsedAt"] is not None  # recorded on use
        revoked = api.delete(f"/board-api-keys/{forever['id']}")
        assert revoked.status_code == 200 and revoked.json() == {"ok": True, "keyId": forever["id"]}
    with w.client(BOARD, token=forever["token"]) as api:
        assert_error(Resp(api.get(f"/companies/{w.ids['company']}/issues")), 401)
    BoardApiKey.objects.filter(pk=five["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    with w.client(BOARD, token=five["token"]) as api:
        assert_error(Resp(api.get(f"/companies/{w.ids['company']}/issues")), 401)


@pytest.mark.django_db(transaction=True)
def test_board_key_acts_as_its_user_audited_without_csrf(live_server):
    w = build_world(live_server)
    run_id = str(uuid.uuid4())
    with w.client(BOARD) as api:
        created = api.post(f"/companies/{w.ids['company']}/issues", json={"title": "From a script"},
                           headers={"X-Paperclip-Run-Id": run_id})
        assert created.status_code == 201, created.text
    row = ActivityLog.objects.get(action="issue.created", entity_id=created.json()["id"])
    assert row.actor_type == "user" and row.actor_user_id == w.objs["board_user"].pk
    assert str(row.board_key_id) == w.objs["board_key"]["id"]
    assert str(row.client_run_id) == run_id and row.run_id is None  # recorded, never trusted as a run

    viewer = MembershipFactory(company=w.objs["company"], role="viewer").user
    token = board_key_create(viewer)["token"]
    with w.client(BOARD, token=token) as api:
        assert api.get(f"/companies/{w.ids['company']}/issues").status_code == 200
        assert_error(Resp(api.post(f"/companies/{w.ids['company']}/issues", json={"title": "nope"})), 403,
                     code="read_only_role")


@pytest.mark.django_db(transaction=True)
def test_long_lived_agent_key_client_run_ids(live_server):
    """§2.3/§7 with the new upstream semantics: the header is required on run-scoped writes, names
    no host run, is recorded on the lock and the activity row, and a fresh id adopts the own lock."""
    w = build_world(live_server)
    issue = w.ids["issue"]
    with w.client(AGENT) as api:
        api.headers.pop("X-Paperclip-Run-Id")
        assert_error(Resp(api.post(f"/issues/{issue}/checkout", json={})), 401)
    first = w.run_ids[AGENT]
    with w.client(AGENT) as api:
        claimed = api.post(f"/issues/{issue}/checkout", json={})  # empty body: this agent, default statuses
        assert claimed.status_code == 200 and claimed.json()["status"] == "in_progress", claimed.text
    assert ActivityLog.objects.filter(entity_id=issue, action="issue.checked_out", client_run_id=first).exists()
    assert str(Issue.objects.get(pk=issue).checkout_client_run_id) == first
    second = str(uuid.uuid4())
    with w.client(AGENT, run_id=second) as api:
        again = api.post(f"/issues/{issue}/checkout",
                         json={"agentId": w.ids["agent"], "expectedStatuses": ["in_progress"]})
        assert again.status_code == 200, again.text
        assert str(Issue.objects.get(pk=issue).checkout_client_run_id) == second
        third = str(uuid.uuid4())  # some clients send a fresh id per request
        patched = api.patch(f"/issues/{issue}", json={"comment": "progress"}, headers={"X-Paperclip-Run-Id": third})
        assert patched.status_code == 200, patched.text
    _, rival_token = agent_api_key_create(agent=w.objs["rival"])
    with w.client(AGENT, token=rival_token) as api:
        conflict = api.post(f"/issues/{issue}/checkout",
                            json={"agentId": w.ids["rival"], "expectedStatuses": ["in_progress"]})
        error = assert_error(Resp(conflict), 409)
        assert {"issueId", "status", "assigneeAgentId", "checkoutRunId", "executionRunId"} <= set(error["details"])
        assert_error(Resp(api.post(f"/issues/{issue}/checkout",
                                   json={"agentId": w.ids["agent"], "expectedStatuses": ["todo"]})), 403)
        assert_error(Resp(api.patch(f"/issues/{w.ids['child']}", json={"title": "mine now"})), 403)
    # Upstream's response names the lock's run: the client's own id (reference §7 step 7).
    assert (claimed.json()["checkoutRunId"], again.json()["checkoutRunId"]) == (first, second)


@pytest.mark.django_db(transaction=True)
def test_every_status_is_accepted_in_expected_statuses(live_server):
    w = build_world(live_server)
    with w.client(AGENT) as api:
        r = api.post(f"/issues/{w.ids['issue']}/checkout",
                     json={"agentId": w.ids["agent"], "expectedStatuses": sorted(ISSUE_STATUS)})
        assert r.status_code == 200, r.text
    with w.client(BOARD) as api:
        assert_error(Resp(api.post(f"/issues/{w.ids['loose']}/checkout", json={})), 400, fields=("agentId",))


@pytest.mark.django_db(transaction=True)
def test_host_run_scoped_key_stays_strict(live_server):
    from issues.adapters.base import issue_run_key

    w = build_world(live_server)
    run = RunFactory(agent=w.objs["me"], status="running")
    token = issue_run_key(run)
    with w.client(AGENT, token=token, run_id=str(uuid.uuid4())) as api:
        response = api.post(f"/issues/{w.ids['issue']}/checkout", json={})
        assert response.status_code in (403, 422), response.text
        assert_error(Resp(response), response.status_code)
    with w.client(AGENT, token=token, run_id=str(run.pk)) as api:
        ok = api.post(f"/issues/{w.ids['issue']}/checkout", json={})
        assert ok.status_code == 200 and ok.json()["checkoutRunId"] == str(run.pk), ok.text


# --- the approval state machine (§5.3) ------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_approval_lifecycle_errors(live_server):
    w = build_world(live_server)
    approval, rev = w.ids["approval"], w.ids["rev_approval"]
    with w.client(BOARD) as api:
        assert_error(Resp(api.post(f"/approvals/{approval}/resubmit", json={})), 422)  # pending, not revision
        ok = api.post(f"/approvals/{approval}/reject", json={"comment": "Not now"})  # `comment` aliases decisionNote
        assert ok.status_code == 200 and ok.json()["decisionNote"] == "Not now", ok.text
        assert_error(Resp(api.post(f"/approvals/{approval}/approve", json={})), 422)
        assert_error(Resp(api.post(f"/approvals/{approval}/request-revision", json={})), 422)
    _, rival_token = agent_api_key_create(agent=w.objs["rival"])
    with w.client(AGENT, token=rival_token) as api:
        assert_error(Resp(api.post(f"/approvals/{rev}/resubmit", json={})), 403)


@pytest.mark.django_db(transaction=True)
def test_costs_errors(live_server):
    w = build_world(live_server)
    with w.client(AGENT) as api:
        other = api.post(f"/companies/{w.ids['company']}/cost-events",
                         json={"agentId": w.ids["rival"], "provider": "p", "model": "m", "costCents": 1,
                               "occurredAt": "2026-01-15T10:00:00Z"})
        assert_error(Resp(other), 403)
        assert_error(Resp(api.get(f"/companies/{w.ids['company']}/costs/summary", params={"from": "yesterday"})),
                     400)


@pytest.mark.django_db(transaction=True)
def test_document_revision_conflicts(live_server):
    w = build_world(live_server)
    with w.client(BOARD) as api:
        base = f"/issues/{w.ids['issue']}/documents"
        current = api.get(f"{base}/plan").json()
        assert_error(Resp(api.put(f"{base}/plan", json={"format": "markdown", "body": "no base"})), 409)
        stale = api.put(f"{base}/plan", json={"format": "markdown", "body": "x", "baseRevisionId": str(uuid.uuid4())})
        error = assert_error(Resp(stale), 409)
        assert error["details"].get("currentRevisionId") == current["latestRevisionId"], error
        ok = api.put(f"{base}/plan", json={"format": "markdown", "body": "2", "baseRevisionId":
                                           current["latestRevisionId"]})
        assert ok.status_code == 200 and ok.json()["latestRevisionNumber"] == 2, ok.text
        assert_error(Resp(api.put(f"{base}/Bad Key!", json={"format": "markdown", "body": "x"})), 400)
