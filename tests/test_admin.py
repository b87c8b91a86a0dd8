"""Django admin: every model is browsable, audit fields are read-only, writes with invariants go
through the services (issues, API keys) and the activity log cannot be edited."""
import re
from types import SimpleNamespace

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.contrib.admin.sites import site
from django.urls import reverse

from issues.actors import SYSTEM, Actor
from issues.models import (
    ActivityLog,
    Agent,
    AgentApiKey,
    Approval,
    ApprovalIssue,
    Comment,
    Company,
    Document,
    DocumentRevision,
    ExecutionWorkspace,
    Goal,
    HeartbeatRun,
    Interaction,
    Issue,
    IssueRelation,
    Membership,
    Project,
    RunEvent,
    WakeupRequest,
    WorkflowDocumentCache,
    WorkProduct,
)
from issues.models import ApprovalComment, Asset, Attachment, BoardApiKey, CostEvent, Label
from issues.models import RunnerCommand, RunnerEvent, RunnerSession, RunnerSource
from issues.runner.commands import command_issue
from issues.models.agent import hash_key
from issues.services.assets import company_logo_upload
from issues.services.attachments import attachment_create
from issues.services.companies import agent_api_key_create
from issues.services.issues import issue_create, relation_add
from issues.services.wakeups import agent_wakeup
from issues.services.thread import comment_create, document_write, interaction_create
from issues.workflow.effective import effective_document
from tests.factories import AgentFactory, CompanyFactory, GoalFactory, MembershipFactory, ProjectFactory

ALL_MODELS = [
    Company, Membership, Project, Goal, Agent, AgentApiKey, Issue, IssueRelation,
    Comment, Document, DocumentRevision, WorkProduct, Interaction, Approval, ApprovalIssue, HeartbeatRun,
    WakeupRequest, ActivityLog, RunEvent, ExecutionWorkspace, WorkflowDocumentCache, BoardApiKey, Label, CostEvent,
    ApprovalComment, RunnerSession, RunnerSource, RunnerEvent, RunnerCommand, Attachment, Asset,
]


def admin_url(model, view="changelist", *args):
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}", args=args)


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def inline_management_data(client, url) -> dict:
    """The hidden inline-formset fields a browser would post back with the change form."""
    page = client.get(url).content.decode()
    return dict(re.findall(r'<input type="hidden" name="([\w-]+-(?:TOTAL|INITIAL|MIN_NUM|MAX_NUM)_FORMS)"'
                           r'[^>]*value="(\d*)"', page))


def post_issue_change(client, issue, **fields):
    url = admin_url(Issue, "change", issue.pk)
    data = {"title": issue.title, "description": "", "status": issue.status, "priority": issue.priority,
            "assignee_agent": "", "parent": "", "project": "", "goal": ""}
    data.update(inline_management_data(client, url))
    data.update(fields)
    return client.post(url, data, follow=True)


@pytest.fixture
def world(db, admin_user):
    """One row of every model, made the way the product makes them (services where they exist)."""
    company = CompanyFactory(name="Acme Robots", issue_prefix="ACME")
    membership = MembershipFactory(company=company)
    project = ProjectFactory(company=company, name="Website", workflow_document="---\nagent:\n  max_turns: 3\n---\nGo")
    effective_document(project=project)  # the host stores the last good version it read
    goal = GoalFactory(company=company, title="Launch v1")
    agent = AgentFactory(company=company, name="Linus")
    key, raw_key = agent_api_key_create(agent=agent, name="ci")
    board = Actor(user=admin_user)
    issue, _ = issue_create(actor=board, company=company, title="Ship the landing page", project_id=project.pk,
                            goal_id=goal.pk, assignee_agent_id=agent.pk)
    blocker, _ = issue_create(actor=board, company=company, title="Buy the domain name", status="backlog")
    relation = relation_add(actor=board, blocker=blocker, blocked=issue)
    comment = comment_create(actor=board, issue=issue, body="Please start with the hero section.")
    revision = document_write(actor=board, issue=issue, key="plan", body="1. hero\n2. pricing", title="Plan")
    interaction = interaction_create(actor=board, issue=issue, kind="request_confirmation", title="Confirm the plan",
                                     document_key="plan")
    work_product = WorkProduct.objects.create(company=company, issue=issue, kind="pull_request", title="PR #1",
                                              url="https://example.com/pr/1")
    approval = Approval.objects.create(company=company, title="Hire a designer", requested_by_agent=agent)
    approval_issue = ApprovalIssue.objects.create(approval=approval, issue=issue)
    wakeup = agent_wakeup(actor=SYSTEM, agent=agent, issue=issue, reason="assigned")
    run_event = RunEvent.objects.create(run=wakeup.run, seq=1, kind="stdout", message="hello")
    workspace = ExecutionWorkspace.objects.create(company=company, project=project, source_issue=issue,
                                                  strategy="isolated_workspace", key="ACME-1", path="/tmp/ws/ACME-1")
    raw_board = BoardApiKey.generate()
    board_key = BoardApiKey.objects.create(user=admin_user, name="ops", prefix=raw_board[:16], key_hash=hash_key(raw_board))
    label = Label.objects.create(company=company, name="frontend", color="#3366ff")
    cost = CostEvent.objects.create(company=company, agent=agent, issue=issue, provider="openai", model="gpt",
                                    cost_cents=12, occurred_at=issue.created_at)
    approval_comment = ApprovalComment.objects.create(company=company, approval=approval, body="Looks fine",
                                                      author_user=admin_user)
    session = RunnerSession.objects.create(run=wakeup.run, company=company, protocol_version=2,
                                           runner_instance_id="runner_1", capabilities={"steer": True})
    source = RunnerSource.objects.create(run=wakeup.run, source_key="runner:runner_1", acked_seq=1)
    runner_event = RunnerEvent.objects.create(
        run=wakeup.run, position=1, source_key="runner:runner_1", source_event_id="event_1", source_seq=1,
        event_type="session.started", digest="0" * 64, envelope={"eventType": "session.started"})
    command = command_issue(session=session, command_type="run.prepare")
    attachment = attachment_create(actor=board, issue=issue, upload=SimpleUploadedFile(
        "hero.png", b"\x89PNG hero", content_type="image/png"), comment_id=comment.pk)
    logo = company_logo_upload(actor=board, company=company, upload=SimpleUploadedFile(
        "logo.png", b"\x89PNG logo", content_type="image/png"))
    return SimpleNamespace(run_event=run_event, session=session, source=source, runner_event=runner_event,
        command=command, attachment=attachment, logo=logo, workspace=workspace, board_key=board_key, label=label, cost=cost,
        approval_comment=approval_comment,
        workflow_cache=WorkflowDocumentCache.objects.get(project=project),
        company=company, membership=membership, project=project, goal=goal, agent=agent, key=key, raw_key=raw_key,
        issue=issue, blocker=blocker, relation=relation, comment=comment, document=revision.document,
        revision=revision, interaction=interaction, work_product=work_product, approval=approval,
        approval_issue=approval_issue, run=wakeup.run, wakeup=wakeup,
        activity=ActivityLog.objects.filter(company=company).first(),
    )


def objects_of(world):
    return {
        Company: world.company, Membership: world.membership, Project: world.project, Goal: world.goal,
        Agent: world.agent, AgentApiKey: world.key, Issue: world.issue, IssueRelation: world.relation,
        Comment: world.comment, Document: world.document, DocumentRevision: world.revision,
        WorkProduct: world.work_product, Interaction: world.interaction, Approval: world.approval,
        ApprovalIssue: world.approval_issue, HeartbeatRun: world.run, WakeupRequest: world.wakeup,
        ActivityLog: world.activity, RunEvent: world.run_event, ExecutionWorkspace: world.workspace,
        WorkflowDocumentCache: world.workflow_cache, BoardApiKey: world.board_key, Label: world.label,
        CostEvent: world.cost, ApprovalComment: world.approval_comment, RunnerSession: world.session,
        RunnerSource: world.source, RunnerEvent: world.runner_event, RunnerCommand: world.command,
        Attachment: world.attachment, Asset: world.logo,
    }


def test_every_issues_model_is_registered():
    from django.apps import apps

    registered = {model for model in site._registry if model._meta.app_label == "issues"}
    assert registered == set(apps.get_app_config("issues").get_models())
    assert set(ALL_MODELS) == registered


@pytest.mark.parametrize("model", ALL_MODELS, ids=lambda m: m.__name__)
def test_changelist_and_change_page_render_for_a_superuser(admin_client, world, model):
    obj = objects_of(world)[model]
    assert obj is not None
    changelist = admin_client.get(admin_url(model))
    assert changelist.status_code == 200
    assert admin_url(model, "change", obj.pk) in changelist.content.decode()
    change = admin_client.get(admin_url(model, "change", obj.pk))
    assert change.status_code == 200


@pytest.mark.parametrize("model", ALL_MODELS, ids=lambda m: m.__name__)
def test_changelist_search_and_filters_do_not_crash(admin_client, world, model):
    model_admin = site._registry[model]
    assert model_admin.search_fields, f"{model.__name__} admin has no search"
    assert admin_client.get(admin_url(model), {"q": "zz-no-such-thing"}).status_code == 200
    assert admin_client.get(admin_url(model), {"q": str(world.company.pk)}).status_code == 200


def test_issue_search_finds_by_identifier_and_title(admin_client, world):
    page = admin_client.get(admin_url(Issue), {"q": world.blocker.identifier}).content.decode()
    assert "Buy the domain name" in page and "Ship the landing page" not in page
    page = admin_client.get(admin_url(Issue), {"q": "landing"}).content.decode()
    assert "Ship the landing page" in page and "Buy the domain name" not in page
    assert "1 result" in page


def test_issue_changelist_filters_by_status(admin_client, world):
    page = admin_client.get(admin_url(Issue), {"status__exact": "backlog"}).content.decode()
    assert world.blocker.identifier in page and world.issue.identifier not in page


def test_issue_audit_and_lock_fields_are_read_only(admin_client, world):
    page = admin_client.get(admin_url(Issue, "change", world.issue.pk)).content.decode()
    for name in ("identifier", "number", "checkout_run", "execution_run", "execution_locked_at", "created_at",
                 "updated_at", "priority_rank", "company"):
        assert f'name="{name}"' not in page, name
    assert world.issue.identifier in page
    assert 'name="title"' in page and 'name="status"' in page
    # The comments are shown read-only inside the issue.
    assert "Please start with the hero section." in page
    assert 'name="comments-0-body"' not in page


def test_issues_are_not_added_in_the_admin(admin_client, world):
    assert admin_client.get(admin_url(Issue, "add")).status_code == 403


def test_issue_change_goes_through_the_service(admin_client, world, admin_user):
    issue = world.issue
    response = post_issue_change(admin_client, issue, title="Ship the landing page now", priority="critical",
                                 assignee_agent=str(world.agent.pk), project=str(world.project.pk),
                                 goal=str(world.goal.pk))
    assert response.redirect_chain[-1][0] == admin_url(Issue)
    assert "was changed successfully" in response.content.decode()
    issue.refresh_from_db()
    assert issue.title == "Ship the landing page now"
    assert issue.status == "todo"
    assert (issue.priority, issue.priority_rank) == ("critical", 0)
    entry = ActivityLog.objects.filter(action="issue.updated", entity_id=str(issue.pk)).latest("created_at")
    assert entry.actor_user == admin_user
    assert entry.details["changes"]["priority"] == ["medium", "critical"]


def test_issue_change_rejected_by_the_service_is_not_saved(admin_client, world):
    blocker = world.blocker  # unassigned: cannot be in progress
    response = post_issue_change(admin_client, blocker, status="in_progress")
    assert response.redirect_chain[-1][0] == admin_url(Issue, "change", blocker.pk)
    assert "Not saved" in response.content.decode() and "require an assignee" in response.content.decode()
    blocker.refresh_from_db()
    assert blocker.status == "backlog"


def test_issue_change_refuses_objects_of_another_company(admin_client, world):
    foreign_agent = AgentFactory(company=CompanyFactory())
    response = post_issue_change(admin_client, world.blocker, assignee_agent=str(foreign_agent.pk))
    assert response.redirect_chain == []
    assert "Must belong to the same company" in response.content.decode()
    world.blocker.refresh_from_db()
    assert world.blocker.assignee_agent_id is None


def test_api_keys_cannot_be_added_and_the_hash_is_never_editable(admin_client, world):
    assert admin_client.get(admin_url(AgentApiKey, "add")).status_code == 403
    page = admin_client.get(admin_url(AgentApiKey, "change", world.key.pk)).content.decode()
    assert 'name="key_hash"' not in page
    assert not re.search(r'<input[^>]+name="(prefix|agent|revoked_at|last_used_at)"', page)
    assert world.raw_key not in page
    # Posting a hash does not change it.
    admin_client.post(admin_url(AgentApiKey, "change", world.key.pk), {"name": "renamed", "key_hash": "0" * 64})
    world.key.refresh_from_db()
    assert world.key.name == "renamed"
    assert world.key.key_hash == hash_key(world.raw_key)


def test_revoke_action_uses_the_service(admin_client, world, admin_user):
    response = admin_client.post(admin_url(AgentApiKey), {
        "action": "revoke_keys", "_selected_action": [str(world.key.pk)],
    })
    assert response.status_code == 302
    world.key.refresh_from_db()
    assert world.key.revoked_at is not None
    entry = ActivityLog.objects.get(action="agent_key.revoked", entity_id=str(world.key.pk))
    assert entry.actor_user == admin_user


def test_activity_log_is_read_only(admin_client, world):
    entry = world.activity
    assert admin_client.get(admin_url(ActivityLog, "add")).status_code == 403
    assert admin_client.get(admin_url(ActivityLog, "delete", entry.pk)).status_code == 403
    page = admin_client.get(admin_url(ActivityLog, "change", entry.pk)).content.decode()
    assert 'name="_save"' not in page and 'name="action"' not in page
    before = (entry.action, entry.details)
    assert admin_client.post(admin_url(ActivityLog, "change", entry.pk), {"action": "forged"}).status_code == 403
    entry.refresh_from_db()
    assert (entry.action, entry.details) == before
    changelist = admin_client.get(admin_url(ActivityLog)).content.decode()
    assert 'value="delete_selected"' not in changelist


def test_revisions_and_runs_are_view_only(admin_client, world):
    for model, obj in ((DocumentRevision, world.revision), (HeartbeatRun, world.run), (WakeupRequest, world.wakeup),
                       (Attachment, world.attachment), (Asset, world.logo)):
        assert admin_client.get(admin_url(model, "add")).status_code == 403
        page = admin_client.get(admin_url(model, "change", obj.pk)).content.decode()
        assert 'name="_save"' not in page
    assert admin_client.get(admin_url(DocumentRevision, "delete", world.revision.pk)).status_code == 403
    # Files go through the API or the console, which audit the removal and take the stored bytes along.
    assert admin_client.get(admin_url(Attachment, "delete", world.attachment.pk)).status_code == 403
    assert admin_client.get(admin_url(Asset, "delete", world.logo.pk)).status_code == 403


def test_company_page_has_member_inline_and_fixed_prefix(admin_client, world):
    page = admin_client.get(admin_url(Company, "change", world.company.pk)).content.decode()
    assert 'name="memberships-0-role"' in page
    assert 'name="issue_prefix"' not in page and "ACME" in page
    assert 'name="issue_counter"' not in page
    assert admin_client.get(admin_url(Company, "add")).status_code == 200


def test_company_add_validates_the_prefix_constraint(admin_client, db):
    response = admin_client.post(admin_url(Company, "add"), {
        "name": "Bad", "issue_prefix": "bad prefix", "description": "", "status": "active",
        "budget_monthly_cents": 0,
        "memberships-TOTAL_FORMS": 0, "memberships-INITIAL_FORMS": 0,
    })
    assert response.status_code == 200
    assert "company_prefix_format" in response.content.decode()
    assert not Company.objects.filter(name="Bad").exists()


def test_document_page_shows_revisions_read_only(admin_client, world):
    page = admin_client.get(admin_url(Document, "change", world.document.pk)).content.decode()
    assert "Plan" in page
    assert 'name="revisions-0-body"' not in page and 'name="key"' not in page


def test_staff_without_permissions_cannot_open_the_admin_changelists(client, db):
    from tests.factories import UserFactory

    staff = UserFactory(is_staff=True)
    client.force_login(staff)
    assert client.get(admin_url(Issue)).status_code == 403
