"""A cross-company test over every endpoint: another company's ids -> 404, nothing changed.

Two companies, A and B, are built with the same shape (agent with key and live run, issues,
an in-progress issue, a project, a goal, a document with a revision, a comment, an
interaction, an approval linked to an issue). A board user is a member of A only.

Every case below is a request A's agent (or A's board user) could legitimately make against
A's own objects. Each case is run three ways:

* against B's objects (``t = B``): 404 in the one error shape, nothing in the database changed,
  and the response is byte-for-byte what a nonexistent id gets (B's ids leak nothing);
* against A's own objects (the control, ``t = A``): not a 404, so each case is sharp;

A guard test compares the case table with the URL resolver, so a new endpoint (or a new
method on an existing one) without a cross-company case fails the suite.
"""
import uuid
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import URLPattern, URLResolver, get_resolver, resolve
from django.utils import timezone
from rest_framework.test import APIClient

from cases.documents import case_document_write
from cases.models import Case as CaseRecord
from cases.handoffs import handoff_request
from cases.models import CaseEvent, CaseHandoff, CaseIssueLink, WorkflowDefinition
from cases.services import case_create, workflow_definition_create
from issues.actors import SYSTEM, Actor
from issues.choices import InteractionKind
from issues.models import (
    ActivityLog,
    Agent,
    Approval,
    ApprovalIssue,
    Asset,
    Attachment,
    BoardApiKey,
    Comment,
    Company,
    CostEvent,
    Document,
    DocumentRevision,
    Goal,
    HeartbeatRun,
    Interaction,
    Issue,
    IssueRelation,
    Label,
    Membership,
    Project,
    WakeupRequest,
)
from issues.models.attachment import attachment_storage
from issues.services.assets import company_logo_upload
from issues.services.attachments import attachment_create
from issues.services.board_keys import board_key_create
from issues.services.companies import agent_api_key_create
from issues.services.thread import comment_create, document_write, interaction_create
from tests.conftest import AgentClient
from tests.module_rows import fresh_copy, rows_for_module
from tests.test_errors import assert_error
from tests.test_errors import db_snapshot as errors_db_snapshot
from tests.factories import (
    AgentFactory,
    CompanyFactory,
    GoalFactory,
    IssueFactory,
    MembershipFactory,
    ProjectFactory,
    RunFactory,
    UserFactory,
)

# --- the two companies ---------------------------------------------------------------------

PNG = b"\x89PNG\r\n\x1a\n planted bytes"


def png(name="planted.png"):
    return SimpleUploadedFile(name, PNG, content_type="image/png")


def build_company(prefix):
    company = CompanyFactory(issue_prefix=prefix, name=f"Company {prefix}", enable_cases=True)
    # It may assign (tasks:assign), so an assignee id's 404 below comes from the company boundary.
    agent = AgentFactory(company=company, name=f"{prefix.lower()}-engineer", permissions={"canAssignTasks": True})
    agent_key, raw_key = agent_api_key_create(agent=agent)
    run = RunFactory(agent=agent, status="running", started_at=timezone.now())
    project = ProjectFactory(company=company)
    goal = GoalFactory(company=company)
    # The agent's own work (it created them): agents change only their own issues (tests/test_fences.py).
    issue = IssueFactory(company=company, title=f"{prefix} first issue", created_by_agent=agent)  # PREFIX-1
    issue2 = IssueFactory(company=company, title=f"{prefix} second issue", created_by_agent=agent)
    wip = IssueFactory(company=company, title=f"{prefix} work in progress", status="in_progress",
                       assignee_agent=agent, checkout_run=run, execution_run=run,
                       execution_locked_at=timezone.now(), started_at=timezone.now())
    revision = document_write(actor=SYSTEM, issue=issue, key="plan", body=f"{prefix} plan v1", title="Plan")
    document_write(actor=SYSTEM, issue=issue, key="notes", body=f"{prefix} notes")  # no interaction holds it
    comment = comment_create(actor=SYSTEM, issue=issue, body=f"{prefix} comment")
    interaction = interaction_create(actor=SYSTEM, issue=issue, kind=InteractionKind.REQUEST_CONFIRMATION,
                                     title=f"{prefix} confirm the plan", document_key="plan")
    approval = Approval.objects.create(company=company, title=f"{prefix} approval")
    ApprovalIssue.objects.create(approval=approval, issue=issue)
    workflow = workflow_definition_create(actor=SYSTEM, company=company, name=f"{prefix} review",
                                          prompt=f"{prefix} review procedure")
    case, _ = case_create(actor=SYSTEM, company=company, case_type="review", title=f"{prefix} case",
                          kickoff=f"{prefix} kickoff", workflow_document_text=f"{prefix} workflow",
                          project_id=project.pk)
    case_document_write(actor=SYSTEM, case=case, key="notes", body=f"{prefix} case notes")
    case2, _ = case_create(actor=SYSTEM, company=company, case_type="review", title=f"{prefix} closing case",
                           kickoff="k", workflow_document_text="w")
    # Both primary tasks are the agent's own work, so the agent may hand them off and cancel intents.
    Issue.objects.filter(pk__in=[case.primary_task_id, case2.primary_task_id]).update(assignee_agent=agent)
    handoff, _ = handoff_request(actor=SYSTEM, company=company, case=case2, to="done")  # an open closure intent
    label = Label.objects.create(company=company, name=f"{prefix} label", color="#123456")
    # Uploaded by the agent (an agent deletes only its own attachments), so DELETE's control is sharp for both;
    # under no run (the world's activity names no run: test_agent_mutation_with_other_companys_run_header...).
    attachment = attachment_create(actor=Actor(agent=agent), issue=issue,
                                   upload=png(f"{prefix.lower()}-screenshot.png"))
    logo = company_logo_upload(actor=SYSTEM, company=company, upload=png(f"{prefix.lower()}-logo.png"))
    return SimpleNamespace(company=company, agent=agent, raw_key=raw_key, run=run, project=project, goal=goal,
                           logo=logo, issue=issue, issue2=issue2, wip=wip, revision=revision, comment=comment,
                           interaction=interaction, approval=approval, case=case, case2=case2, workflow=workflow,
                           handoff=handoff, label=label, agent_key=agent_key, attachment=attachment)


def with_ids_of(content, ghost, world):
    """A ghost's answer with its ids read as ``world``'s: an error may name an id the request itself sent
    (``attachmentIds``: "<id> is not an attachment of this issue."), which tells the caller nothing new."""
    for name, obj in vars(ghost).items():
        content = content.replace(str(obj.pk).encode(), str(getattr(world, name).pk).encode())
    return content


def ghost_of(world):
    """The same shape with ids that exist nowhere: what 'not found' looks like."""
    def new():
        return SimpleNamespace(pk=uuid.uuid4(), identifier="ZZ-9999")

    return SimpleNamespace(company=new(), agent=new(), run=new(), project=new(), goal=new(), issue=new(),
                           issue2=new(), wip=new(), revision=new(), comment=new(), interaction=new(),
                           approval=new(), case=new(), case2=new(), workflow=new(), handoff=new(), label=new(),
                           board_key=new(), agent_key=new(), attachment=new(), logo=new())


def build_world():
    a, b = build_company("AA"), build_company("BB")
    board_user = MembershipFactory(company=a.company, role="owner", user=UserFactory(username="board-a")).user
    # A board API key is its user's, in that user's companies: A's board user's, and a B owner's.
    a.board_key, _ = board_key_create(actor=SYSTEM, user=board_user)
    b_owner = MembershipFactory(company=b.company, role="owner", user=UserFactory(username="board-b")).user
    b.board_key, _ = board_key_create(actor=SYSTEM, user=b_owner)
    return SimpleNamespace(a=a, b=b, board_user=board_user)


@pytest.fixture(scope="module")
def _module_world(django_db_setup, django_db_blocker):
    # Built once for the module's ~900 tests (building it per test was most of their time).
    with rows_for_module(django_db_blocker, build_world) as built:
        yield built


@pytest.fixture
def world(_module_world, db):
    return fresh_copy(_module_world)


def client_for(world, who):
    if who == "agent":
        return AgentClient(world.a.agent, world.a.raw_key, world.a.run)
    client = APIClient()
    client.force_login(world.board_user)
    # A board user checks out on behalf of an agent with one of that agent's live runs.
    client.credentials(HTTP_X_PAPERCLIP_RUN_ID=str(world.a.run.pk))
    return client


SNAPSHOT_MODELS = (Company, Agent, Membership, Project, Goal, Issue, IssueRelation, Comment, Document,
                   DocumentRevision, Interaction, Approval, ApprovalIssue, ActivityLog, HeartbeatRun, WakeupRequest,
                   CaseRecord, CaseIssueLink, CaseEvent, WorkflowDefinition, CaseHandoff, Label,
                   BoardApiKey, CostEvent, Attachment, Asset)


def stored_files(folder=""):
    """Every file in the attachments storage: the bytes an upload writes or a delete removes."""
    storage = attachment_storage()
    dirs, files = storage.listdir(folder)
    return sorted([folder + name for name in files] + [f for d in dirs for f in stored_files(f"{folder}{d}/")])


def db_snapshot():
    snapshot = {model.__name__: rows for model, rows in errors_db_snapshot(SNAPSHOT_MODELS).items()}
    snapshot["attachment storage"] = stored_files()
    return snapshot


def assert_unchanged(before, label):
    after = db_snapshot()
    for name, rows in before.items():
        assert after[name] == rows, f"{label}: {name} rows changed (count {len(rows)} -> {len(after[name])})"


def content_of(response):
    """The body's bytes, also of a streamed one (attachment content is a FileResponse)."""
    # Reading a streamed body to its end closes it (the test client's wrapper: the stored file too).
    return response.getvalue() if response.streaming else response.content


def assert_error_shape(response, status, code=None):
    assert not response.streaming, (response.status_code, "streamed", content_of(response)[:200])
    return assert_error(response, status, code)


class Multipart(dict):
    """A request body sent as multipart/form-data (a file upload) rather than JSON."""


def upload(**fields):
    """An attachment upload: a fresh file (each request reads its own) and optional form fields."""
    return Multipart(file=png(), **fields)


def send(client, method, path, body):
    call = getattr(client, method.lower())
    if body is None:
        return call(path)
    return call(path, body, format="multipart" if isinstance(body, Multipart) else "json")


# --- the table: every route and method, with B's ids in the path or the body ------------


@dataclass(frozen=True)
class Case:
    id: str
    route: str  # URL name in issues/api/urls.py
    method: str
    build: object  # (own world, target world) -> (path, body or None); a Multipart body is a file upload
    # The control (target = A) is a success for both actors unless listed here.
    control_status: tuple = ()


def case_task(world):
    """The primary task of the world's case (a ghost has none: its unknown issue)."""
    return world.case.primary_task if isinstance(world.case, CaseRecord) else world.issue


def linked_issue(world):
    """``issue2`` with a work link on the world's case (made on demand; ghosts get none), so a
    DELETE of the link is sharp for the control."""
    if isinstance(world.case, CaseRecord):
        CaseIssueLink.objects.get_or_create(company=world.company, case=world.case, issue=world.issue2,
                                            defaults={"role": "work"})
    return world.issue2


def ref(obj, by):
    return obj.identifier if by == "identifier" else str(obj.pk)


def s(obj):
    return str(obj.pk)


def cost_event(world):
    """A cost event for the world's agent (issue #14 org cases)."""
    return {"agentId": s(world.agent), "provider": "p", "model": "m", "costCents": 1,
            "occurredAt": "2026-01-01T00:00:00Z"}


def issue_path_cases():
    """Cases whose path names an issue: run with B's UUID and with B's identifier (BB-1)."""
    cases = []
    for by in ("uuid", "identifier"):
        cases += [
            Case(f"issue-get[{by}]", "issue-detail", "GET",
                 lambda o, t, by=by: (f"/api/issues/{ref(t.issue, by)}", None)),
            Case(f"work-products-list[{by}]", "issue-work-products", "GET",
                 lambda o, t, by=by: (f"/api/issues/{ref(t.issue, by)}/work-products", None)),
            Case(f"work-products-create[{by}]", "issue-work-products", "POST",
                 lambda o, t, by=by: (f"/api/issues/{ref(t.issue, by)}/work-products",
                                      {"kind": "pull_request", "url": "https://example.test/pull/1"})),
            Case(f"issue-patch[{by}]", "issue-detail", "PATCH",
                 lambda o, t, by=by: (f"/api/issues/{ref(t.issue, by)}", {"title": "hijacked", "status": "done"})),
            Case(f"checkout[{by}]", "issue-checkout", "POST",
                 lambda o, t, by=by: (f"/api/issues/{ref(t.issue, by)}/checkout",
                                      {"agentId": s(o.agent), "expectedStatuses": ["todo"]})),
            Case(f"force-release[{by}]", "issue-admin-force-release", "POST",
                 lambda o, t, by=by: (f"/api/issues/{ref(t.wip, by)}/admin/force-release", None),
                 control_status=(("agent", 403),)),  # board only
            Case(f"release[{by}]", "issue-release", "POST",
                 lambda o, t, by=by: (f"/api/issues/{ref(t.wip, by)}/release", None)),
            Case(f"blockers-add[{by}]", "issue-blockers", "POST",
                 lambda o, t, by=by: (f"/api/issues/{ref(t.issue, by)}/blockers", {"blockerId": s(t.issue2)})),
            Case(f"heartbeat-context[{by}]", "issue-heartbeat-context", "GET",
                 lambda o, t, by=by: (f"/api/issues/{ref(t.issue, by)}/heartbeat-context", None)),
            Case(f"heartbeat-context-wakeCommentId[{by}]", "issue-heartbeat-context", "GET",
                 lambda o, t, by=by: (f"/api/issues/{ref(t.issue, by)}/heartbeat-context?wakeCommentId="
                                      f"{s(t.comment)}", None)),
            Case(f"comments-list[{by}]", "issue-comments", "GET",
                 lambda o, t, by=by: (f"/api/issues/{ref(t.issue, by)}/comments", None)),
            Case(f"comments-create[{by}]", "issue-comments", "POST",
                 lambda o, t, by=by: (f"/api/issues/{ref(t.issue, by)}/comments", {"body": "planted"})),
            Case(f"documents-list[{by}]", "issue-documents", "GET",
                 lambda o, t, by=by: (f"/api/issues/{ref(t.issue, by)}/documents", None)),
            Case(f"document-get[{by}]", "issue-document", "GET",
                 lambda o, t, by=by: (f"/api/issues/{ref(t.issue, by)}/documents/plan", None)),
            Case(f"document-put[{by}]", "issue-document", "PUT",
                 lambda o, t, by=by: (f"/api/issues/{ref(t.issue, by)}/documents/plan",
                                      {"body": "overwritten", "baseRevisionId": s(t.revision)})),
            Case(f"document-delete[{by}]", "issue-document", "DELETE",
                 lambda o, t, by=by: (f"/api/issues/{ref(t.issue, by)}/documents/notes", None),
                 control_status=(("agent", 403),)),
            Case(f"document-revisions[{by}]", "issue-document-revisions", "GET",
                 lambda o, t, by=by: (f"/api/issues/{ref(t.issue, by)}/documents/plan/revisions", None)),
            Case(f"document-restore[{by}]", "issue-document-restore", "POST",
                 lambda o, t, by=by: (f"/api/issues/{ref(t.issue, by)}/documents/plan/revisions/{s(t.revision)}"
                                      "/restore", None)),
            Case(f"document-quarantine[{by}]", "issue-document-quarantine", "POST",
                 lambda o, t, by=by: (f"/api/issues/{ref(t.issue, by)}/documents/plan/quarantine", {"reason": "x"}),
                 control_status=(("agent", 403),)),  # board only
            Case(f"document-release[{by}]", "issue-document-release", "POST",
                 lambda o, t, by=by: (f"/api/issues/{ref(t.issue, by)}/documents/plan/release", None),
                 control_status=(("agent", 403),)),
            Case(f"interactions-list[{by}]", "issue-interactions", "GET",
                 lambda o, t, by=by: (f"/api/issues/{ref(t.issue, by)}/interactions", None)),
            Case(f"run-stop[{by}]", "issue-run-stop", "POST",
                 lambda o, t, by=by: (f"/api/issues/{ref(t.issue, by)}/run/stop", None)),
            Case(f"interactions-create[{by}]", "issue-interactions", "POST",
                 lambda o, t, by=by: (f"/api/issues/{ref(t.issue, by)}/interactions",
                                      {"kind": "ask_question", "title": "planted question"})),
            Case(f"attachments-list[{by}]", "issue-attachments", "GET",
                 lambda o, t, by=by: (f"/api/issues/{ref(t.issue, by)}/attachments", None)),
            Case(f"attachment-upload[{by}]", "issue-attachment-upload", "POST",
                 lambda o, t, by=by: (f"/api/companies/{s(t.company)}/issues/{ref(t.issue, by)}/attachments",
                                      upload())),
            # my company in the path, another company's issue
            Case(f"attachment-upload-issue[{by}]", "issue-attachment-upload", "POST",
                 lambda o, t, by=by: (f"/api/companies/{s(o.company)}/issues/{ref(t.issue, by)}/attachments",
                                      upload())),
        ]
    return cases


CASES = [
    # company id in the path
    Case("company-issues-list", "company-issues", "GET",
         lambda o, t: (f"/api/companies/{s(t.company)}/issues", None)),
    Case("company-issues-list-filtered", "company-issues", "GET",
         lambda o, t: (f"/api/companies/{s(t.company)}/issues?assigneeAgentId={s(t.agent)}&status=todo,in_progress",
                       None)),
    Case("company-issues-create", "company-issues", "POST",
         lambda o, t: (f"/api/companies/{s(t.company)}/issues", {"title": "planted"})),
    # B's ids in the body of a create in A
    Case("create-parentId", "company-issues", "POST",
         lambda o, t: (f"/api/companies/{s(o.company)}/issues", {"title": "child", "parentId": s(t.issue)})),
    Case("create-parentId-blockParent", "company-issues", "POST",
         lambda o, t: (f"/api/companies/{s(o.company)}/issues",
                       {"title": "child", "parentId": s(t.issue), "blockParentUntilDone": True})),
    Case("create-projectId", "company-issues", "POST",
         lambda o, t: (f"/api/companies/{s(o.company)}/issues", {"title": "x", "projectId": s(t.project)})),
    Case("create-inheritExecutionWorkspaceFromIssueId", "company-issues", "POST",
         lambda o, t: (f"/api/companies/{s(o.company)}/issues",
                       {"title": "planted", "inheritExecutionWorkspaceFromIssueId": s(t.issue)})),
    Case("create-goalId", "company-issues", "POST",
         lambda o, t: (f"/api/companies/{s(o.company)}/issues", {"title": "x", "goalId": s(t.goal)})),
    Case("create-assigneeAgentId", "company-issues", "POST",
         lambda o, t: (f"/api/companies/{s(o.company)}/issues", {"title": "x", "assigneeAgentId": s(t.agent)})),
    # issue id (uuid and identifier) in the path
    *issue_path_cases(),
    Case("issue-get[lowercase-identifier]", "issue-detail", "GET",
         lambda o, t: (f"/api/issues/{t.issue.identifier.lower()}", None)),
    # B's ids in the body of a PATCH of A's issue
    Case("patch-parentId", "issue-detail", "PATCH",
         lambda o, t: (f"/api/issues/{s(o.issue)}", {"parentId": s(t.issue2)})),
    Case("patch-projectId", "issue-detail", "PATCH",
         lambda o, t: (f"/api/issues/{s(o.issue)}", {"projectId": s(t.project)})),
    Case("patch-goalId", "issue-detail", "PATCH",
         lambda o, t: (f"/api/issues/{s(o.issue)}", {"goalId": s(t.goal)})),
    Case("patch-assigneeAgentId", "issue-detail", "PATCH",
         lambda o, t: (f"/api/issues/{s(o.issue)}", {"assigneeAgentId": s(t.agent)})),
    Case("patch-valid-title-and-foreign-parentId", "issue-detail", "PATCH",
         lambda o, t: (f"/api/issues/{s(o.issue)}", {"title": "renamed", "parentId": s(t.issue2)})),
    # B's ids in other bodies
    Case("checkout-agentId", "issue-checkout", "POST",
         lambda o, t: (f"/api/issues/{s(o.issue)}/checkout", {"agentId": s(t.agent), "expectedStatuses": ["todo"]})),
    Case("blockers-blockerId", "issue-blockers", "POST",
         lambda o, t: (f"/api/issues/{s(o.issue)}/blockers", {"blockerId": s(t.issue2)})),
    Case("interactions-create-documentRevisionId", "issue-interactions", "POST",
         lambda o, t: (f"/api/issues/{s(o.issue)}/interactions",
                       {"kind": "request_confirmation", "title": "confirm", "documentRevisionId": s(t.revision)})),
    # other ids in the path
    Case("interaction-respond", "interaction-respond", "POST",
         lambda o, t: (f"/api/interactions/{s(t.interaction)}/respond", {"status": "accepted"}),
         control_status=(("agent", 403),)),  # only board users answer
    Case("approval-get", "approval-detail", "GET", lambda o, t: (f"/api/approvals/{s(t.approval)}", None)),
    Case("issue-approvals-list", "issue-approvals", "GET", lambda o, t: (f"/api/issues/{s(t.issue)}/approvals", None)),
    # linking needs the CEO role or canCreateAgents (the world's agent has neither)
    Case("issue-approvals-link", "issue-approvals", "POST",
         lambda o, t: (f"/api/issues/{s(t.issue2)}/approvals", {"approvalId": s(t.approval)}),
         control_status=(("agent", 403),)),
    Case("issue-approvals-link-approvalId", "issue-approvals", "POST",
         lambda o, t: (f"/api/issues/{s(o.issue2)}/approvals", {"approvalId": s(t.approval)}),
         control_status=(("agent", 403),)),
    Case("issue-approval-unlink", "issue-approval-link", "DELETE",
         lambda o, t: (f"/api/issues/{s(t.issue)}/approvals/{s(t.approval)}", None), control_status=(("agent", 403),)),
    Case("approval-issues", "approval-issues", "GET", lambda o, t: (f"/api/approvals/{s(t.approval)}/issues", None)),
    Case("company-approvals-list", "company-approvals", "GET",
         lambda o, t: (f"/api/companies/{s(t.company)}/approvals?status=pending", None)),
    Case("company-approvals-create", "company-approvals", "POST",
         lambda o, t: (f"/api/companies/{s(t.company)}/approvals", {"type": "generic", "payload": {}})),
    Case("approval-create-issueIds", "company-approvals", "POST",
         lambda o, t: (f"/api/companies/{s(o.company)}/approvals",
                       {"type": "generic", "payload": {}, "issueIds": [s(o.issue2), s(t.issue)]})),
    Case("approval-create-requestedByAgentId", "company-approvals", "POST",
         lambda o, t: (f"/api/companies/{s(o.company)}/approvals",
                       {"type": "generic", "payload": {}, "requestedByAgentId": s(t.agent)})),
    Case("approval-approve", "approval-approve", "POST",
         lambda o, t: (f"/api/approvals/{s(t.approval)}/approve", {"decisionNote": "planted"}),
         control_status=(("agent", 403),)),
    Case("approval-reject", "approval-reject", "POST",
         lambda o, t: (f"/api/approvals/{s(t.approval)}/reject", {}), control_status=(("agent", 403),)),
    Case("approval-request-revision", "approval-request-revision", "POST",
         lambda o, t: (f"/api/approvals/{s(t.approval)}/request-revision", {}), control_status=(("agent", 403),)),
    Case("approval-resubmit", "approval-resubmit", "POST",
         lambda o, t: (f"/api/approvals/{s(t.approval)}/resubmit", {"payload": {"x": 1}}),
         control_status=(("agent", 403), ("board", 422))),
    Case("company-heartbeat-runs", "company-heartbeat-runs", "GET",
         lambda o, t: (f"/api/companies/{s(t.company)}/heartbeat-runs", None)),
    Case("company-heartbeat-runs-agentId", "company-heartbeat-runs", "GET",
         lambda o, t: (f"/api/companies/{s(o.company)}/heartbeat-runs?agentId={s(t.agent)}", None)),
    Case("company-live-runs", "company-live-runs", "GET",
         lambda o, t: (f"/api/companies/{s(t.company)}/live-runs", None)),
    Case("run-get", "run-detail", "GET", lambda o, t: (f"/api/runs/{s(t.run)}", None)),
    Case("run-heartbeat", "run-heartbeat", "POST", lambda o, t: (f"/api/runs/{s(t.run)}/heartbeat", {})),
    Case("run-events", "run-events", "GET", lambda o, t: (f"/api/runs/{s(t.run)}/events", None)),
    Case("wakeup", "agent-wakeup", "POST", lambda o, t: (f"/api/agents/{s(t.agent)}/wakeup", {"reason": "planted"})),
    Case("wakeup-issueId", "agent-wakeup", "POST",
         lambda o, t: (f"/api/agents/{s(o.agent)}/wakeup", {"issueId": s(t.issue)})),
    Case("wakeup-commentIds", "agent-wakeup", "POST",
         lambda o, t: (f"/api/agents/{s(o.agent)}/wakeup", {"issueId": s(o.issue), "commentIds": [s(t.comment)]})),
    # cases and workflow definitions (both companies have enable_cases on)
    Case("company-cases-list", "company-cases", "GET", lambda o, t: (f"/api/companies/{s(t.company)}/cases", None)),
    Case("company-cases-list-filtered", "company-cases", "GET",
         lambda o, t: (f"/api/companies/{s(t.company)}/cases?projectId={s(t.project)}&groupBy=project", None)),
    Case("company-cases-create", "company-cases", "POST",
         lambda o, t: (f"/api/companies/{s(t.company)}/cases",
                       {"type": "review", "title": "planted", "kickoff": "k", "workflowDocumentText": "w"})),
    Case("case-create-projectId", "company-cases", "POST",
         lambda o, t: (f"/api/companies/{s(o.company)}/cases",
                       {"type": "review", "title": "x", "kickoff": "k", "workflowDocumentText": "w",
                        "projectId": s(t.project)})),
    Case("case-create-parentCaseId", "company-cases", "POST",
         lambda o, t: (f"/api/companies/{s(o.company)}/cases",
                       {"type": "review", "title": "x", "kickoff": "k", "workflowDocumentText": "w",
                        "parentCaseId": s(t.case)})),
    Case("case-create-workflowDefinitionId", "company-cases", "POST",
         lambda o, t: (f"/api/companies/{s(o.company)}/cases",
                       {"type": "review", "title": "x", "kickoff": "k", "workflowDefinitionId": s(t.workflow)})),
    Case("company-case-types", "company-case-types", "GET",
         lambda o, t: (f"/api/companies/{s(t.company)}/cases/types", None)),
    Case("case-get[uuid]", "case-detail", "GET", lambda o, t: (f"/api/cases/{s(t.case)}", None)),
    Case("case-get[identifier]", "case-detail", "GET", lambda o, t: (f"/api/cases/{t.case.identifier}", None)),
    Case("case-patch", "case-detail", "PATCH",
         lambda o, t: (f"/api/cases/{s(t.case)}", {"title": "hijacked", "fields": {"x": 1}})),
    Case("company-workflows-list", "company-workflows", "GET",
         lambda o, t: (f"/api/companies/{s(t.company)}/workflows", None)),
    Case("company-workflows-create", "company-workflows", "POST",
         lambda o, t: (f"/api/companies/{s(t.company)}/workflows", {"name": "planted", "prompt": "p"})),
    Case("workflow-get", "workflow-detail", "GET",
         lambda o, t: (f"/api/workflows/{s(t.workflow)}", None)),
    Case("workflow-patch", "workflow-detail", "PATCH",
         lambda o, t: (f"/api/workflows/{s(t.workflow)}", {"prompt": "hijacked"})),
    # bounded paged reads, history and task links (cases/api/read_urls.py)
    Case("case-agent-read", "case-detail", "GET", lambda o, t: (f"/api/cases/{s(t.case)}?agentRead=true", None)),
    Case("case-agent-read-fields", "case-detail", "GET",
         lambda o, t: (f"/api/cases/{s(t.case)}?agentRead=true&section=fields&limitBytes=8", None)),
    Case("case-agent-read-document", "case-detail", "GET",
         lambda o, t: (f"/api/cases/{s(t.case)}?agentRead=true&section=document&documentKey=notes", None)),
    Case("case-agent-read-documentIssueId", "case-detail", "GET",
         lambda o, t: (f"/api/cases/{s(o.case)}?agentRead=true&section=document&documentKey=workflow"
                       f"&documentIssueId={s(case_task(t))}", None)),
    Case("workflow-prompt-page", "workflow-detail", "GET",
         lambda o, t: (f"/api/workflows/{s(t.workflow)}?offsetBytes=0&limitBytes=8", None)),
    Case("case-events", "case-events", "GET", lambda o, t: (f"/api/cases/{s(t.case)}/events", None)),
    # case-owned documents (cases/api/document_views.py)
    Case("case-documents", "case-documents", "GET", lambda o, t: (f"/api/cases/{s(t.case)}/documents", None)),
    Case("case-document-get", "case-document", "GET",
         lambda o, t: (f"/api/cases/{s(t.case)}/documents/notes", None)),
    Case("case-document-put", "case-document", "PUT",
         lambda o, t: (f"/api/cases/{s(t.case)}/documents/hijack", {"body": "hijacked"})),
    Case("case-document-revisions", "case-document-revisions", "GET",
         lambda o, t: (f"/api/cases/{s(t.case)}/documents/notes/revisions", None)),
    Case("case-document-quarantine", "case-document-quarantine", "POST",
         lambda o, t: (f"/api/cases/{s(t.case)}/documents/notes/quarantine", {"reason": "x"}),
         control_status=(("agent", 403),)),  # board only
    Case("case-document-release", "case-document-release", "POST",
         lambda o, t: (f"/api/cases/{s(t.case)}/documents/notes/release", None), control_status=(("agent", 403),)),
    Case("case-links-create", "case-links", "POST",
         lambda o, t: (f"/api/cases/{s(t.case)}/links", {"issueId": s(t.issue2), "role": "work"})),
    Case("case-links-create-issueId", "case-links", "POST",
         lambda o, t: (f"/api/cases/{s(o.case)}/links", {"issueId": s(t.issue2), "role": "reference"})),
    Case("case-link-delete", "case-link-detail", "DELETE",
         lambda o, t: (f"/api/cases/{s(t.case)}/links/{s(linked_issue(t))}", None)),
    Case("case-link-delete-issueId", "case-link-detail", "DELETE",
         lambda o, t: (f"/api/cases/{s(o.case)}/links/{s(linked_issue(t))}", None)),
    Case("issue-cases[uuid]", "issue-cases", "GET", lambda o, t: (f"/api/issues/{s(case_task(t))}/cases", None)),
    Case("issue-cases[identifier]", "issue-cases", "GET",
         lambda o, t: (f"/api/issues/{case_task(t).identifier}/cases", None)),
    # handoffs
    Case("handoff-kickoff", "company-case-handoffs", "POST",
         lambda o, t: (f"/api/companies/{s(t.company)}/case-handoffs",
                       {"to": s(t.agent), "type": "review", "title": "planted", "kickoff": "k",
                        "workflowDocumentText": "w"})),
    Case("handoff-kickoff-to", "company-case-handoffs", "POST",
         lambda o, t: (f"/api/companies/{s(o.company)}/case-handoffs",
                       {"to": s(t.agent), "type": "review", "title": "x", "kickoff": "k",
                        "workflowDocumentText": "w"})),
    Case("handoff-kickoff-workflowId", "company-case-handoffs", "POST",
         lambda o, t: (f"/api/companies/{s(o.company)}/case-handoffs",
                       {"to": s(o.agent), "type": "review", "title": "x", "kickoff": "k",
                        "workflowId": s(t.workflow)})),
    Case("handoff-caseId", "company-case-handoffs", "POST",
         lambda o, t: (f"/api/companies/{s(o.company)}/case-handoffs",
                       {"caseId": s(t.case), "to": s(o.agent), "idempotencyKey": "x"})),
    Case("case-handoffs-list", "case-handoffs", "GET", lambda o, t: (f"/api/cases/{s(t.case)}/handoffs", None)),
    Case("case-handoff-retry", "case-handoff-retry", "POST",
         lambda o, t: (f"/api/cases/{s(t.case2)}/handoffs/{s(t.handoff)}/retry", None)),
    Case("case-handoff-retry[foreign handoff]", "case-handoff-retry", "POST",
         lambda o, t: (f"/api/cases/{s(o.case2)}/handoffs/{s(t.handoff)}/retry", None)),
    Case("case-handoff-cancel", "case-handoff-cancel", "POST",
         lambda o, t: (f"/api/cases/{s(t.case2)}/handoffs/{s(t.handoff)}/cancel", None)),
    Case("case-handoff-cancel[foreign handoff]", "case-handoff-cancel", "POST",
         lambda o, t: (f"/api/cases/{s(o.case2)}/handoffs/{s(t.handoff)}/cancel", None)),
    # --- issue #14 (upstream compatibility): each area adds its cases after its own marker
    # --- #14 auth (board keys)
    Case("board-api-key-revoke", "board-api-key", "DELETE",
         lambda o, t: (f"/api/board-api-keys/{s(t.board_key)}", None), control_status=(("agent", 403),)),
    # --- #14 agents and runs
    Case("company-agents-list", "company-agents", "GET",
         lambda o, t: (f"/api/companies/{s(t.company)}/agents?status=idle,active&role=engineer", None)),
    Case("company-agents-create", "company-agents", "POST",
         lambda o, t: (f"/api/companies/{s(t.company)}/agents", {"name": "planted", "adapterType": "none"}),
         control_status=(("agent", 403),)),  # an agent needs canCreateAgents
    Case("company-agents-create-reportsTo", "company-agents", "POST",
         lambda o, t: (f"/api/companies/{s(o.company)}/agents",
                       {"name": "planted", "adapterType": "none", "reportsTo": s(t.agent)}),
         control_status=(("agent", 403),)),
    Case("company-archive", "company-archive", "POST", lambda o, t: (f"/api/companies/{s(t.company)}/archive", None),
         control_status=(("agent", 403),)),
    Case("company-org", "company-org", "GET", lambda o, t: (f"/api/companies/{s(t.company)}/org", None)),
    Case("company-agent-hires", "company-agent-hires", "POST",
         lambda o, t: (f"/api/companies/{s(t.company)}/agent-hires", {"name": "planted", "adapterType": "none"}),
         control_status=(("agent", 403),)),  # as create: an agent needs canCreateAgents
    Case("agent-hires-sourceIssueIds", "company-agent-hires", "POST",
         lambda o, t: (f"/api/companies/{s(o.company)}/agent-hires",
                       {"name": "planted", "adapterType": "none", "sourceIssueIds": [s(t.issue)]}),
         control_status=(("agent", 403),)),
    Case("agent-get", "agent-detail", "GET", lambda o, t: (f"/api/agents/{s(t.agent)}", None)),
    Case("agent-patch", "agent-detail", "PATCH", lambda o, t: (f"/api/agents/{s(t.agent)}", {"title": "hijacked"}),
         control_status=(("agent", 403),)),
    # A's agent is named by its case handoffs: its own purge is the 409 that keeps them.
    Case("agent-delete", "agent-detail", "DELETE", lambda o, t: (f"/api/agents/{s(t.agent)}", None),
         control_status=(("agent", 403), ("board", 409))),
    Case("agent-patch-reportsTo", "agent-detail", "PATCH",
         lambda o, t: (f"/api/agents/{s(o.agent)}", {"reportsTo": s(t.agent)}),
         control_status=(("agent", 403), ("board", 422))),  # own id: the agent cannot report to itself
    Case("agent-permissions", "agent-permissions", "PATCH",
         lambda o, t: (f"/api/agents/{s(t.agent)}/permissions", {"canCreateAgents": True}),
         control_status=(("agent", 403),)),
    Case("agent-pause", "agent-pause", "POST", lambda o, t: (f"/api/agents/{s(t.agent)}/pause", None),
         control_status=(("agent", 403),)),
    Case("agent-resume", "agent-resume", "POST", lambda o, t: (f"/api/agents/{s(t.agent)}/resume", None),
         control_status=(("agent", 403),)),
    Case("agent-terminate", "agent-terminate", "POST", lambda o, t: (f"/api/agents/{s(t.agent)}/terminate", None),
         control_status=(("agent", 403),)),
    Case("agent-keys-create", "agent-keys", "POST", lambda o, t: (f"/api/agents/{s(t.agent)}/keys", {"name": "x"}),
         control_status=(("agent", 403),)),
    Case("agent-keys-list", "agent-keys", "GET", lambda o, t: (f"/api/agents/{s(t.agent)}/keys", None),
         control_status=(("agent", 403),)),
    Case("agent-key-revoke", "agent-key", "DELETE",
         lambda o, t: (f"/api/agents/{s(t.agent)}/keys/{s(t.agent_key)}", None), control_status=(("agent", 403),)),
    Case("agent-key-revoke[foreign key]", "agent-key", "DELETE",  # my agent, another company's key
         lambda o, t: (f"/api/agents/{s(o.agent)}/keys/{s(t.agent_key)}", None), control_status=(("agent", 403),)),
    Case("agent-heartbeat-invoke", "agent-heartbeat-invoke", "POST",
         lambda o, t: (f"/api/agents/{s(t.agent)}/heartbeat/invoke", None)),
    Case("heartbeat-run-cancel", "heartbeat-run-cancel", "POST",
         lambda o, t: (f"/api/heartbeat-runs/{s(t.run)}/cancel", None), control_status=(("agent", 403),)),
    Case("heartbeat-run-events", "heartbeat-run-events", "GET",
         lambda o, t: (f"/api/heartbeat-runs/{s(t.run)}/events?afterSeq=0&limit=10", None)),
    Case("heartbeat-run-issues", "heartbeat-run-issues", "GET",
         lambda o, t: (f"/api/heartbeat-runs/{s(t.run)}/issues", None)),
    *[Case(f"issue-{name}[{by}]", f"issue-{name}", "GET",
           lambda o, t, by=by, name=name: (f"/api/issues/{ref(t.wip, by)}/{name}", None))
      for name in ("live-runs", "active-run", "runs", "activity") for by in ("uuid", "identifier")],
    # --- #14 issue extras (children, labels, delete, comments, active run)
    # One comment: another company's issue is a 404, and so is another issue's comment under my issue.
    Case("issue-comment-get-other-issue", "issue-comment-detail", "GET",
         lambda o, t: (f"/api/issues/{s(o.issue)}/comments/{s(t.comment)}", None)),
    *[case for by in ("uuid", "identifier") for case in (
        Case(f"issue-comment-get[{by}]", "issue-comment-detail", "GET",
             lambda o, t, by=by: (f"/api/issues/{ref(t.issue, by)}/comments/{s(t.comment)}", None)),
        Case(f"issue-children-list[{by}]", "issue-children", "GET",
             lambda o, t, by=by: (f"/api/issues/{ref(t.issue, by)}/children?status=todo", None)),
        Case(f"issue-children-create[{by}]", "issue-children", "POST",
             lambda o, t, by=by: (f"/api/issues/{ref(t.issue, by)}/children", {"title": "planted child"})),
        Case(f"issue-delete[{by}]", "issue-detail", "DELETE",
             lambda o, t, by=by: (f"/api/issues/{ref(t.issue, by)}", None), control_status=(("agent", 403),)),
        Case(f"comments-create-reopen[{by}]", "issue-comments", "POST",
             lambda o, t, by=by: (f"/api/issues/{ref(t.issue, by)}/comments", {"body": "again", "reopen": True})),
        Case(f"comments-create-interrupt[{by}]", "issue-comments", "POST",
             lambda o, t, by=by: (f"/api/issues/{ref(t.issue, by)}/comments", {"body": "stop", "interrupt": True}),
             control_status=(("agent", 403),)),  # board only
    )],
    Case("issue-children-create-labelIds", "issue-children", "POST",
         lambda o, t: (f"/api/issues/{s(o.issue)}/children", {"title": "x", "labelIds": [s(t.label)]})),
    Case("create-labelIds", "company-issues", "POST",
         lambda o, t: (f"/api/companies/{s(o.company)}/issues", {"title": "x", "labelIds": [s(t.label)]})),
    Case("patch-labelIds", "issue-detail", "PATCH",
         lambda o, t: (f"/api/issues/{s(o.issue)}", {"labelIds": [s(t.label)]})),
    Case("company-issues-list-labels", "company-issues", "GET",
         lambda o, t: (f"/api/companies/{s(t.company)}/issues?labelId={s(t.label)}&label=x&descendantOf={s(t.issue)}",
                       None)),
    Case("company-labels-list", "company-labels", "GET", lambda o, t: (f"/api/companies/{s(t.company)}/labels", None)),
    Case("company-labels-create", "company-labels", "POST",
         lambda o, t: (f"/api/companies/{s(t.company)}/labels", {"name": "planted", "color": "#abcdef"})),
    Case("label-delete", "label-detail", "DELETE", lambda o, t: (f"/api/labels/{s(t.label)}", None)),
    # --- issue attachments (issues/api/attachments.py; the issue-path cases are in issue_path_cases)
    Case("attachment-upload-companyId", "issue-attachment-upload", "POST",  # another company, my issue
         lambda o, t: (f"/api/companies/{s(t.company)}/issues/{s(o.issue)}/attachments", upload())),
    Case("attachment-upload-issueCommentId", "issue-attachment-upload", "POST",
         lambda o, t: (f"/api/companies/{s(o.company)}/issues/{s(o.issue)}/attachments",
                       upload(issueCommentId=s(t.comment)))),
    # B's attachment tied to a comment on A's issue (upstream's attachmentIds)
    Case("patch-attachmentIds", "issue-detail", "PATCH",
         lambda o, t: (f"/api/issues/{s(o.issue)}", {"comment": "see the file", "attachmentIds": [s(t.attachment)]})),
    Case("comments-create-attachmentIds", "issue-comments", "POST",
         lambda o, t: (f"/api/issues/{s(o.issue)}/comments", {"body": "see the file",
                                                              "attachmentIds": [s(t.attachment)]})),
    Case("attachment-get", "attachment-detail", "GET", lambda o, t: (f"/api/attachments/{s(t.attachment)}", None)),
    Case("attachment-content", "attachment-content", "GET",
         lambda o, t: (f"/api/attachments/{s(t.attachment)}/content", None)),
    Case("attachment-delete", "attachment-detail", "DELETE",
         lambda o, t: (f"/api/attachments/{s(t.attachment)}", None)),
    # --- #14 org (goals, projects, costs, dashboard, activity)
    Case("company-goals-list", "company-goals", "GET",
         lambda o, t: (f"/api/companies/{s(t.company)}/goals?level=task,company", None)),
    Case("company-goals-create", "company-goals", "POST",
         lambda o, t: (f"/api/companies/{s(t.company)}/goals", {"title": "planted"})),
    Case("company-goals-create-parentId", "company-goals", "POST",
         lambda o, t: (f"/api/companies/{s(o.company)}/goals", {"title": "x", "parentId": s(t.goal)})),
    Case("company-goals-create-ownerAgentId", "company-goals", "POST",
         lambda o, t: (f"/api/companies/{s(o.company)}/goals", {"title": "x", "ownerAgentId": s(t.agent)})),
    Case("goal-get", "goal-detail", "GET", lambda o, t: (f"/api/goals/{s(t.goal)}", None)),
    Case("goal-patch", "goal-detail", "PATCH",
         lambda o, t: (f"/api/goals/{s(t.goal)}", {"title": "hijacked", "status": "cancelled"})),
    Case("goal-patch-parentId", "goal-detail", "PATCH",
         lambda o, t: (f"/api/goals/{s(o.goal)}", {"parentId": s(t.goal)}),
         control_status=(("agent", 422), ("board", 422))),  # own goal as its own parent: found, a cycle
    Case("goal-delete", "goal-detail", "DELETE", lambda o, t: (f"/api/goals/{s(t.goal)}", None)),
    Case("company-projects-list", "company-projects", "GET",
         lambda o, t: (f"/api/companies/{s(t.company)}/projects?status=backlog", None)),
    Case("company-projects-create", "company-projects", "POST",
         lambda o, t: (f"/api/companies/{s(t.company)}/projects", {"name": "planted"})),
    Case("project-get", "project-detail", "GET", lambda o, t: (f"/api/projects/{s(t.project)}", None)),
    Case("project-patch", "project-detail", "PATCH",
         lambda o, t: (f"/api/projects/{s(t.project)}", {"description": "hijacked", "status": "cancelled"})),
    Case("company-cost-events-create", "company-cost-events", "POST",
         lambda o, t: (f"/api/companies/{s(t.company)}/cost-events", cost_event(t))),
    *[Case(f"company-cost-events-create-{field}", "company-cost-events", "POST",
           lambda o, t, field=field, key=key: (f"/api/companies/{s(o.company)}/cost-events",
                                               {**cost_event(o), field: s(getattr(t, key))}))
      for field, key in (("agentId", "agent"), ("issueId", "issue"), ("projectId", "project"), ("goalId", "goal"),
                         ("heartbeatRunId", "run"))],
    Case("company-costs-summary", "company-costs-summary", "GET",
         lambda o, t: (f"/api/companies/{s(t.company)}/costs/summary?from=2020-01-01", None)),
    Case("company-costs-by-agent", "company-costs-by-agent", "GET",
         lambda o, t: (f"/api/companies/{s(t.company)}/costs/by-agent", None)),
    Case("company-costs-by-project", "company-costs-by-project", "GET",
         lambda o, t: (f"/api/companies/{s(t.company)}/costs/by-project", None)),
    *[Case(f"company-costs-{name}", f"company-costs-{name}", "GET",
           lambda o, t, name=name: (f"/api/companies/{s(t.company)}/costs/{name}", None))
      for name in ("by-provider", "by-biller", "by-agent-model", "window-spend")],
    Case("company-budgets-patch", "company-budgets", "PATCH",
         lambda o, t: (f"/api/companies/{s(t.company)}/budgets", {"budgetMonthlyCents": 1}),
         control_status=(("agent", 403),)),
    Case("agent-budgets-patch", "agent-budgets", "PATCH",
         lambda o, t: (f"/api/agents/{s(t.agent)}/budgets", {"budgetMonthlyCents": 1})),
    Case("company-get", "company-detail", "GET", lambda o, t: (f"/api/companies/{s(t.company)}", None)),
    Case("company-patch", "company-detail", "PATCH",
         lambda o, t: (f"/api/companies/{s(t.company)}", {"name": "hijacked", "budgetMonthlyCents": 1}),
         control_status=(("agent", 403),)),
    # The control: A's owner reaches the archive rule (A is active), past the company boundary.
    Case("company-delete", "company-detail", "DELETE", lambda o, t: (f"/api/companies/{s(t.company)}", None),
         control_status=(("agent", 403), ("board", 409))),
    Case("company-patch-logoAssetId", "company-detail", "PATCH",  # my company, another company's image
         lambda o, t: (f"/api/companies/{s(o.company)}", {"logoAssetId": s(t.logo)}),
         control_status=(("agent", 403),)),
    Case("company-logo-upload", "company-logo", "POST",
         lambda o, t: (f"/api/companies/{s(t.company)}/logo", upload()), control_status=(("agent", 403),)),
    Case("asset-content", "asset-content", "GET", lambda o, t: (f"/api/assets/{s(t.logo)}/content", None)),
    Case("company-dashboard", "company-dashboard", "GET",
         lambda o, t: (f"/api/companies/{s(t.company)}/dashboard", None)),
    Case("company-activity-list", "company-activity", "GET",
         lambda o, t: (f"/api/companies/{s(t.company)}/activity?agentId={s(t.agent)}&entityType=issue", None)),
    Case("company-activity-create", "company-activity", "POST",
         lambda o, t: (f"/api/companies/{s(t.company)}/activity",
                       {"actorId": "x", "action": "planted", "entityType": "company", "entityId": s(t.company)}),
         control_status=(("agent", 403),)),
    # --- #14 approvals (comments)
    Case("approval-comments-list", "approval-comments", "GET",
         lambda o, t: (f"/api/approvals/{s(t.approval)}/comments", None)),
    Case("approval-comments-create", "approval-comments", "POST",
         lambda o, t: (f"/api/approvals/{s(t.approval)}/comments", {"body": "planted"})),
]

# Routes with no id to swap: each has its own test below proving it only shows the caller's company.
NO_ID_ROUTES = {("agent-me", "GET"), ("agent-me-wake", "GET"), ("company-list", "GET"),
                ("company-list", "POST"),  # a new company, instance admins only: tests/test_company_create.py
                ("agent-me-inbox-lite", "GET"),  # its own test: tests/test_api_agents.py
                ("agent-me-inbox-mine", "GET"),  # another company's member is a 404: tests/test_mine_inbox.py
                ("board-api-keys", "GET"), ("board-api-keys", "POST"),  # the caller's own: tests/test_board_keys.py
                ("issues-without-company", "GET"),  # always a 400: test_issues_without_a_company_is_a_400
                ("company-stats", "GET")}  # the caller's companies only: tests/test_api_org.py
# /api/ routes that are not company data at all (the OpenAPI schema and its viewers).
NOT_COMPANY_SCOPED = {"schema", "api-docs", "api-redoc", "health"}  # health: staff only, host-wide
ACTORS = ("agent", "board")


def api_routes():
    """(url name, method) for every view mounted under /api/, read from the URL resolver."""
    found = set()

    def walk(patterns, prefix):
        for p in patterns:
            if isinstance(p, URLResolver):
                walk(p.url_patterns, prefix + str(p.pattern))
            elif isinstance(p, URLPattern) and (prefix + str(p.pattern)).startswith("api/"):
                view = getattr(p.callback, "view_class", None) or getattr(p.callback, "cls", None)
                methods = [m.upper() for m in ("get", "post", "put", "patch", "delete") if view and hasattr(view, m)]
                for method in methods or ["GET"]:
                    found.add((p.name, method))

    walk(get_resolver().url_patterns, "")
    return found


def test_every_api_route_and_method_has_a_cross_company_case():
    # Connector routes have their own guard and cases in tests/test_connectors_cross_company.py, and
    # runner routes (run keys, not agent or board actors) in tests/test_runner_transport.py.
    routes = {r for r in api_routes() if r[0] not in NOT_COMPANY_SCOPED
              and not (r[0] or "").startswith(("connector", "runner-"))}
    covered = {(c.route, c.method) for c in CASES} | NO_ID_ROUTES
    missing = routes - covered
    assert not missing, f"API routes without a cross-company case: {sorted(missing)}"
    stale = covered - routes
    assert not stale, f"Cases for routes/methods that no longer exist: {sorted(stale)}"
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("who", ACTORS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_other_companys_ids_are_not_found_and_change_nothing(world, case, who):
    client = client_for(world, who)
    path, body = case.build(world.a, world.b)
    assert resolve(path.split("?")[0]).url_name == case.route
    before = db_snapshot()
    b_issues = list(Issue.objects.filter(company=world.b.company).order_by("pk").values())

    response = send(client, case.method, path, body)

    error = assert_error_shape(response, 404)
    assert error["code"] == "not_found"
    assert_unchanged(before, f"{who} {case.method} {path}")
    assert list(Issue.objects.filter(company=world.b.company).order_by("pk").values()) == b_issues
    # Nothing about B's object is revealed: a nonexistent id gets the very same answer.
    ghost_world = ghost_of(world.b)
    ghost_path, ghost_body = case.build(world.a, ghost_world)
    ghost = send(client, case.method, ghost_path, ghost_body)
    assert ((ghost.status_code, with_ids_of(content_of(ghost), ghost_world, world.b))
            == (response.status_code, content_of(response)))
    for text in (str(world.b.company.pk), world.b.company.name, world.b.issue.title, world.b.agent.name):
        assert text not in response.content.decode()
    assert_unchanged(before, f"{who} ghost {case.method} {ghost_path}")


@pytest.mark.parametrize("who", ACTORS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_same_request_with_own_ids_is_not_a_404(world, case, who):
    """The control: each case is sharp (the 404 above comes from the company boundary)."""
    client = client_for(world, who)
    path, body = case.build(world.a, world.a)
    response = send(client, case.method, path, body)
    content = content_of(response)
    expected = dict(case.control_status).get(who)
    if expected is not None:
        assert response.status_code == expected, content[:500]
    else:
        assert 200 <= response.status_code < 300, (response.status_code, content[:500])


# --- references that are not 404 by design still reveal nothing about B -----------------

FOREIGN_REFERENCES_NOT_404 = [
    # ?after= is a cursor among this issue's comments: any other id is a 400.
    ("comments-after", "GET", lambda o, t: (f"/api/issues/{s(o.issue)}/comments?after={s(t.comment)}", None), 400),
    # A base revision that is not the document's latest is a stale write (409 with A's current revision).
    ("document-put-baseRevisionId", "PUT",
     lambda o, t: (f"/api/issues/{s(o.issue)}/documents/plan", {"body": "x", "baseRevisionId": s(t.revision)}), 409),
    # Blockers of another company break upstream's same-company rule: a 422, as an unknown id is.
    ("create-blockedByIssueIds", "POST",
     lambda o, t: (f"/api/companies/{s(o.company)}/issues", {"title": "x", "blockedByIssueIds": [s(t.issue)]}), 422),
    ("patch-blockedByIssueIds", "PATCH",
     lambda o, t: (f"/api/issues/{s(o.issue)}", {"blockedByIssueIds": [s(o.issue2), s(t.issue)]}), 422),
]


@pytest.mark.parametrize("who", ACTORS)
@pytest.mark.parametrize("label,method,build,status", FOREIGN_REFERENCES_NOT_404,
                         ids=[c[0] for c in FOREIGN_REFERENCES_NOT_404])
def test_foreign_references_answer_like_nonexistent_ids(world, who, label, method, build, status):
    client = client_for(world, who)
    before = db_snapshot()
    path, body = build(world.a, world.b)
    response = send(client, method, path, body)
    assert_error_shape(response, status)
    ghost_path, ghost_body = build(world.a, ghost_of(world.b))
    ghost = send(client, method, ghost_path, ghost_body)
    assert (ghost.status_code, ghost.json()) == (response.status_code, response.json())
    assert str(world.b.revision.pk) not in response.content.decode()
    assert_unchanged(before, label)


def test_agent_mutation_with_other_companys_run_header_touches_nothing_of_b(world):
    """B's run id in X-Paperclip-Run-Id names none of A's agent's runs: it is only A's client run
    id (upstream, §2.3), recorded on A's rows and never trusted as B's run: nothing of B changes
    and no row points at B's run."""
    def b_rows():
        return [list(model.objects.filter(company=world.b.company).order_by("pk").values())
                for model in (Issue, HeartbeatRun, ActivityLog, Comment)]

    client = AgentClient(world.a.agent, world.a.raw_key, world.b.run)
    before = b_rows()
    for method, path, body in [
        ("POST", f"/api/companies/{s(world.a.company)}/issues", {"title": "x"}),
        ("PATCH", f"/api/issues/{s(world.a.issue)}", {"title": "x"}),
        ("POST", f"/api/issues/{s(world.a.issue)}/comments", {"body": "x"}),
        ("POST", f"/api/issues/{s(world.a.issue)}/checkout",
         {"agentId": s(world.a.agent), "expectedStatuses": ["todo"]}),
    ]:
        response = send(client, method, path, body)
        assert 200 <= response.status_code < 300, (method, path, response.content[:300])
        assert s(world.b.company) not in response.content.decode()
    assert b_rows() == before
    assert not ActivityLog.objects.filter(run=world.b.run).exists()
    assert ActivityLog.objects.filter(company=world.a.company, client_run_id=world.b.run.pk).count() >= 4
    assert Issue.objects.get(pk=world.a.issue.pk).checkout_client_run_id == world.b.run.pk
    assert HeartbeatRun.objects.get(pk=world.b.run.pk).status == "running"


def test_board_checkout_with_other_companys_run_is_refused(world):
    """A board user cannot hand A's agent a checkout under B's run."""
    client = client_for(world, "board")
    client.credentials(HTTP_X_PAPERCLIP_RUN_ID=str(world.b.run.pk))
    before = db_snapshot()
    response = client.post(f"/api/issues/{s(world.a.issue)}/checkout",
                           {"agentId": s(world.a.agent), "expectedStatuses": ["todo"]}, format="json")
    assert_error_shape(response, 422, "run_required")
    assert_unchanged(before, "board checkout with B's run")


# --- routes without an id ------------------------------------------------------------------


def test_agent_me_is_the_callers_own_agent(world):
    response = client_for(world, "agent").get("/api/agents/me")
    assert response.status_code == 200
    data = response.json()
    assert data["id"] == s(world.a.agent) and data["companyId"] == s(world.a.company)
    assert data["company"]["id"] == s(world.a.company)
    assert str(world.b.company.pk) not in response.content.decode()


def test_agent_me_is_not_a_board_endpoint(world):
    before = db_snapshot()
    assert_error_shape(client_for(world, "board").get("/api/agents/me"), 401, "agent_auth_required")
    assert_unchanged(before, "board agents/me")


def test_own_wake_read_shows_only_the_callers_wakes_and_runs(world):
    from issues.actors import SYSTEM
    from issues.services.wakeups import agent_wakeup

    mine = agent_wakeup(actor=SYSTEM, agent=world.a.agent, reason="planted-a", issue=world.a.issue2)
    agent_wakeup(actor=SYSTEM, agent=world.b.agent, reason="planted-b", issue=world.b.issue2)
    response = client_for(world, "agent").get("/api/agents/me/wake")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["agentId"] == s(world.a.agent)
    run_ids = {r["id"] for r in body["runs"]}
    assert str(mine.run_id) in run_ids and all(r["wakeReason"] != "planted-b" for r in body["runs"])
    assert all(w["reason"] != "planted-b" for w in body["pendingWakes"])
    assert client_for(world, "board").get("/api/agents/me/wake").status_code == 401


@pytest.mark.parametrize("who", ACTORS)
def test_company_list_shows_only_the_callers_companies(world, who):
    response = client_for(world, who).get("/api/companies")
    if who == "agent":  # board only, as upstream; an agent reads its company at /companies/{id}
        assert_error(response, 403, "board_only")
        return
    assert response.status_code == 200
    assert [c["id"] for c in response.json()] == [s(world.a.company)]


# --- no credentials ----------------------------------------------------------------------------


UNAUTHENTICATED = sorted({(c.route, c.method): c for c in CASES}.values(), key=lambda c: (c.route, c.method)) + [
    Case("agent-me", "agent-me", "GET", lambda o, t: ("/api/agents/me", None)),
    Case("agent-me-wake", "agent-me-wake", "GET", lambda o, t: ("/api/agents/me/wake", None)),
    Case("agent-me-inbox-lite", "agent-me-inbox-lite", "GET", lambda o, t: ("/api/agents/me/inbox-lite", None)),
    Case("company-list", "company-list", "GET", lambda o, t: ("/api/companies", None)),
]


@pytest.mark.parametrize("case", UNAUTHENTICATED, ids=lambda c: f"{c.method} {c.route}")
def test_unauthenticated_request_is_401_with_the_error_shape(world, case):
    path, body = case.build(world.a, world.a)
    before = db_snapshot()
    response = send(APIClient(), case.method, path, body)
    assert_error_shape(response, 401, "unauthorized")
    assert response["WWW-Authenticate"].lower().startswith("bearer")
    assert_unchanged(before, f"anonymous {case.method} {path}")


@pytest.mark.parametrize("who", ACTORS)
def test_issues_without_a_company_is_a_400(world, who):
    """``GET /api/issues`` names no company: upstream's 400 pointing at the company route, nothing listed."""
    response = client_for(world, who).get("/api/issues")
    error = assert_error(response, 400)
    assert error["message"] == "Missing companyId in path. Use /api/companies/{companyId}/issues.", error
