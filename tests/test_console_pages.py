"""Operator console pages (dashboard, issues, runs, agents, cases, workflows) with the Django test
client against the real database: every page renders for a member and is a 404 for another
company's objects, viewers read only, and every action goes through the services (its effect and
its ActivityLog row are checked)."""
import re

import pytest
from django.test import Client
from django.urls import reverse

from cases import services as case_services
from cases.models import CaseHandoff, WorkflowDefinition
from issues.actors import Actor
from issues.models import ActivityLog, Agent, AgentApiKey, Comment, HeartbeatRun, Interaction, Issue
from issues.models.agent import hash_key
from issues.services.runs import run_append_event, run_finish
from issues.services.thread import comment_create, document_write, interaction_create
from tests.factories import AgentFactory, CompanyFactory, IssueFactory, MembershipFactory, RunFactory
from tests.queries import count_page_queries

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def text(response) -> str:
    return response.content.decode()


def login(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


class World:
    """One company with a bit of everything, plus clients for each membership role."""

    def __init__(self):
        self.company = CompanyFactory(name="Acme", enable_cases=True)
        self.users = {role: MembershipFactory(company=self.company, role=role).user
                      for role in ("owner", "admin", "operator", "viewer")}
        self.board = Actor(user=self.users["owner"])
        self.agent = AgentFactory(company=self.company, name="Linus", budget_monthly_cents=10_000,
                                  spent_monthly_cents=2_500, adapter_config={"command": ["echo", "hi"]})
        self.issue = IssueFactory(company=self.company, title="Ship the landing page",
                                  description="Some **bold** text", assignee_agent=self.agent)
        self.comment = comment_create(actor=self.board, issue=self.issue, body="Looks *good* to me")
        document_write(actor=self.board, issue=self.issue, key="plan", body="step one\nstep two\n", title="Plan")
        latest = self.issue.documents.get(key="plan").latest_revision
        document_write(actor=self.board, issue=self.issue, key="plan", body="step one\nstep 2 <b>bold</b>\n",
                       base_revision_id=latest.pk)
        self.interaction = interaction_create(actor=self.board, issue=self.issue, kind="request_confirmation",
                                              title="Approve the plan", document_key="plan")
        self.run = RunFactory(agent=self.agent, issue=self.issue, status="running")
        run_append_event(run_id=self.run.pk, kind="stdout", message="hello from the agent")
        self.definition = case_services.workflow_definition_create(
            actor=self.board, company=self.company, name="Triage", prompt="# Triage\n\n1. Read\n2. Decide")
        self.case, _ = case_services.case_create(
            actor=self.board, company=self.company, case_type="bug", title="Login broken",
            kickoff="Users cannot log in", workflow_document_text=None, fields={"severity": "high",
                                                                                   "env": {"os": "linux"}},
            workflow_definition_id=self.definition.pk)
        self.handoff = CaseHandoff.objects.create(
            company=self.company, case=self.case, to_agent=self.agent, workflow=self.definition,
            workflow_action="adopt", workflow_name="Triage", prompt_text=self.definition.prompt, phase="triage",
            status="held", principal=f"user:{self.users['owner'].pk}")

    def client(self, role) -> Client:
        return login(self.users[role])


@pytest.fixture
def world(db):
    return World()


@pytest.fixture
def stranger(db):
    """A member of another company only."""
    return MembershipFactory(company=CompanyFactory(enable_cases=True), role="owner").user


def pages(w: World) -> dict:
    return {
        "dashboard": reverse("console:dashboard"),
        "issue-list": reverse("console:issue-list"),
        "issue-board": reverse("console:issue-board"),
        "issue-detail": reverse("console:issue-detail", args=[w.issue.identifier]),
        "issue-document": reverse("console:issue-document", args=[w.issue.identifier, "plan"]),
        "run-list": reverse("console:run-list"),
        "run-detail": reverse("console:run-detail", args=[w.run.pk]),
        "agent-list": reverse("console:agent-list"),
        "agent-detail": reverse("console:agent-detail", args=[w.agent.pk]),
        "case-list": reverse("cases_console:case-list"),
        "case-detail": reverse("cases_console:case-detail", args=[w.case.identifier]),
        "workflow-list": reverse("cases_console:workflow-list"),
        "workflow-detail": reverse("cases_console:workflow-detail", args=[w.definition.pk]),
        "workflow-create": reverse("cases_console:workflow-create"),
        "workflow-edit": reverse("cases_console:workflow-edit", args=[w.definition.pk]),
    }


# Pages of one object (a member of another company gets a 404).
OBJECT_PAGES = ("issue-detail", "issue-document", "run-detail", "agent-detail", "case-detail", "workflow-detail",
                "workflow-edit")


def actions(w: World) -> list[tuple[str, str, dict]]:
    """Every console action endpoint with a valid body."""
    return [
        ("issue-change", reverse("console:issue-change", args=[w.issue.identifier]), {"status": "in_review"}),
        ("issue-comment", reverse("console:issue-comment", args=[w.issue.identifier]), {"body": "hi"}),
        ("interaction-respond", reverse("console:interaction-respond", args=[w.interaction.pk]),
         {"status": "accepted"}),
        ("agent-create", reverse("console:agent-create"), {"name": "Grace", "role": "qa", "adapter_type": "none"}),
        ("agent-pause", reverse("console:agent-pause", args=[w.agent.pk]), {}),
        ("agent-resume", reverse("console:agent-resume", args=[w.agent.pk]), {}),
        ("agent-permissions", reverse("console:agent-permissions", args=[w.agent.pk]), {"canAssignTasks": "on"}),
        ("agent-key-create", reverse("console:agent-key-create", args=[w.agent.pk]), {"name": "ci"}),
        ("agent-adapter", reverse("console:agent-adapter", args=[w.agent.pk]),
         {"adapter_type": "none", "adapter_config": "{}"}),
        ("case-change", reverse("cases_console:case-change", args=[w.case.identifier]), {"title": "Renamed"}),
        ("case-handoff", reverse("cases_console:case-handoff", args=[w.case.identifier]),
         {"to": str(w.agent.pk), "workflow": str(w.definition.pk)}),
        ("handoff-retry", reverse("cases_console:handoff-retry", args=[w.handoff.pk]), {}),
        ("handoff-cancel", reverse("cases_console:handoff-cancel", args=[w.handoff.pk]), {}),
        ("workflow-create", reverse("cases_console:workflow-create"), {"name": "New", "prompt": "x"}),
        ("workflow-edit", reverse("cases_console:workflow-edit", args=[w.definition.pk]),
         {"name": "Triage", "prompt": "changed"}),
        ("workflow-preview", reverse("cases_console:workflow-preview"), {"prompt": "# hi"}),
    ]


# --- reading ---------------------------------------------------------------------------------------------


WRITER_FORMS = ("workflow-create", "workflow-edit")


@pytest.mark.parametrize("role", ["viewer", "operator", "owner"])
def test_every_page_renders_for_a_member(world, role):
    client = world.client(role)
    for name, url in pages(world).items():
        response = client.get(url)
        expected = 403 if role == "viewer" and name in WRITER_FORMS else 200
        assert response.status_code == expected, (name, response.status_code)
        assert "<html" in text(response), name


def test_pages_show_the_data_an_operator_needs(world):
    client = world.client("viewer")
    urls = pages(world)
    dashboard = text(client.get(urls["dashboard"]))
    assert "Linus" in dashboard and "$25.00 / $100.00" in dashboard
    assert re.search(r'In Progress</span></a></th><td class="num">0</td>', dashboard)
    assert re.search(r'Todo</span></a></th><td class="num">2</td>', dashboard)
    assert f'id="run-{world.run.pk}"' in dashboard  # live runs

    issue = text(client.get(urls["issue-detail"]))
    assert "<strong>bold</strong>" in issue  # description rendered from Markdown
    assert "Looks <em>good</em> to me" in issue and world.users["owner"].username in issue  # comment + author
    assert "Approve the plan" in issue and f'id="run-{world.run.pk}"' in issue
    assert 'action="/interactions/' not in issue  # a viewer gets no action forms
    assert "hello from the agent" in issue and 'id="log-poller"' in issue  # the live run's log tail

    case = text(client.get(urls["case-detail"]))
    assert "<dt>severity</dt>" in case and "high" in case and "&quot;os&quot;: &quot;linux&quot;" in case
    assert f'id="handoff-{world.handoff.pk}"' in case and "Held" in case and "Triage" in case
    assert world.case.primary_task.identifier in case and "<code>workflow</code>" in case

    workflow = text(client.get(urls["workflow-detail"]))
    assert world.definition.fingerprint in workflow
    assert world.case.identifier in workflow  # usage: current workflow of the case
    assert "this revision" in workflow  # the handoff captured the current prompt


def test_other_companys_objects_are_404(world, stranger):
    client = login(stranger)
    urls = pages(world)
    for name in OBJECT_PAGES:
        assert client.get(urls[name]).status_code == 404, name
    assert client.get(reverse("console:run-log", args=[world.run.pk])).status_code == 404
    before = ActivityLog.objects.count()
    for name, url, body in actions(world):
        if name in ("agent-create", "workflow-create", "workflow-preview"):
            continue  # these act on the user's own current company
        assert client.post(url, body).status_code == 404, name
    assert ActivityLog.objects.count() == before
    world.issue.refresh_from_db()
    assert world.issue.status == "todo"


def test_a_member_of_two_companies_follows_a_deep_link(world):
    user = world.users["viewer"]
    own = CompanyFactory(name="Another")
    MembershipFactory(company=own, user=user, role="viewer")
    client = login(user)
    client.post(reverse("console:switch-company"), {"company_id": str(own.pk)})
    response = client.get(reverse("console:issue-detail", args=[world.issue.identifier]))
    assert response.status_code == 200
    assert client.session["company_id"] == str(world.company.pk)


def test_cases_pages_are_404_when_cases_are_disabled(world):
    world.company.enable_cases = False
    world.company.save()
    client = world.client("owner")
    for name in ("case-list", "case-detail", "workflow-list", "workflow-detail"):
        assert client.get(pages(world)[name]).status_code == 404, name
    assert "Workflows" not in text(client.get(reverse("console:dashboard")))


def test_pages_need_login(world):
    for name, url in pages(world).items():
        response = Client().get(url)
        assert response.status_code == 302 and response["Location"].startswith(reverse("login")), name


# --- permissions ------------------------------------------------------------------------------------------


def test_viewer_cannot_perform_any_action(world):
    client = world.client("viewer")
    before = ActivityLog.objects.count()
    for name, url, body in actions(world):
        response = client.post(url, body)
        assert response.status_code == 403, name
        assert "Not allowed" in text(response), name
    assert ActivityLog.objects.count() == before
    world.issue.refresh_from_db()
    world.interaction.refresh_from_db()
    world.handoff.refresh_from_db()
    assert world.issue.status == "todo" and world.interaction.status == "pending"
    assert world.handoff.status == "held" and CaseHandoff.objects.filter(case=world.case).count() == 1
    assert not Agent.objects.filter(name="Grace").exists()
    assert AgentApiKey.objects.filter(agent=world.agent).count() == 0


def test_operator_cannot_manage_agents(world):
    client = world.client("operator")
    for name, url, body in actions(world):
        if name.startswith("agent-"):
            assert client.post(url, body).status_code == 403, name
    world.agent.refresh_from_db()
    assert world.agent.status == "idle"


def test_actions_are_post_only_and_csrf_protected(world):
    url = reverse("console:issue-change", args=[world.issue.identifier])
    assert world.client("owner").get(url).status_code == 405
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.users["owner"])
    assert client.post(url, {"status": "done"}).status_code == 403
    world.issue.refresh_from_db()
    assert world.issue.status == "todo"


# --- operator actions go through the services -----------------------------------------------------------


def audit(company, action):
    return ActivityLog.objects.filter(company=company, action=action).order_by("-created_at", "-id").first()


def test_operator_changes_status_assignee_and_comments(world):
    client = world.client("operator")
    other = AgentFactory(company=world.company, name="Grace")
    url = reverse("console:issue-change", args=[world.issue.identifier])
    response = client.post(url, {"status": "in_review", "priority": "high", "assignee": str(other.pk),
                                 "comment": "Over to Grace"})
    assert response.status_code == 302 and response["Location"] == f"/issues/{world.issue.identifier}/"
    world.issue.refresh_from_db()
    assert (world.issue.status, world.issue.priority, world.issue.assignee_agent_id) == ("in_review", "high", other.pk)
    entry = audit(world.company, "issue.updated")
    assert entry.actor_user == world.users["operator"]
    assert entry.details["changes"]["status"] == ["todo", "in_review"]
    assert Comment.objects.filter(issue=world.issue, body="Over to Grace", author_user=world.users["operator"]).exists()
    assert "Issue updated." in text(client.get(response["Location"]))

    response = client.post(reverse("console:issue-comment", args=[world.issue.identifier]), {"body": "Thanks"})
    assert response.status_code == 302
    assert audit(world.company, "comment.created").actor_user == world.users["operator"]


def test_service_errors_become_a_message_not_a_crash(world):
    client = world.client("operator")
    url = reverse("console:issue-change", args=[world.issue.identifier])
    # In progress without an assignee breaks an invariant the service guards.
    response = client.post(url, {"status": "in_progress", "assignee": ""}, follow=True)
    assert response.status_code == 200
    assert "require an assignee" in text(response) and 'role="alert"' in text(response)
    world.issue.refresh_from_db()
    assert world.issue.status == "todo"
    response = client.post(url, {"status": "bogus"}, follow=True)
    assert "is not one of" in text(response)


def test_operator_accepts_a_confirmation(world):
    client = world.client("operator")
    response = client.post(reverse("console:interaction-respond", args=[world.interaction.pk]),
                           {"status": "accepted"}, **HTMX)
    assert response.status_code == 302  # htmx follows it and swaps #issue-main
    world.interaction.refresh_from_db()
    assert world.interaction.status == "accepted" and world.interaction.responded_by == world.users["operator"]
    entry = audit(world.company, "interaction.responded")
    assert entry.details == {"interactionId": str(world.interaction.pk), "status": "accepted"}
    # Answering twice is refused by the service, shown as a message.
    again = client.post(reverse("console:interaction-respond", args=[world.interaction.pk]),
                        {"status": "rejected"}, follow=True)
    assert "already answered" in text(again)


def test_a_confirmation_for_a_stale_revision_expires(world):
    latest = world.issue.documents.get(key="plan").latest_revision
    document_write(actor=world.board, issue=world.issue, key="plan", body="new", base_revision_id=latest.pk)
    response = world.client("operator").post(
        reverse("console:interaction-respond", args=[world.interaction.pk]), {"status": "accepted"}, follow=True)
    assert "document changed after this confirmation" in text(response)
    world.interaction.refresh_from_db()
    assert world.interaction.status == "expired"


def test_operator_edits_a_case_cancels_a_held_handoff_and_hands_off(world):
    client = world.client("operator")
    case_url = reverse("cases_console:case-detail", args=[world.case.identifier])
    response = client.post(reverse("cases_console:case-change", args=[world.case.identifier]),
                           {"title": "Login broken on Safari", "summary": "Only *Safari*"})
    assert response.status_code == 302
    world.case.refresh_from_db()
    assert (world.case.title, world.case.summary) == ("Login broken on Safari", "Only *Safari*")
    assert audit(world.company, "case.updated").actor_user == world.users["operator"]

    # One open handoff per case: a new one is refused while the held one is open.
    refused = client.post(reverse("cases_console:case-handoff", args=[world.case.identifier]),
                          {"to": str(world.agent.pk)}, follow=True)
    assert "already has an open handoff" in text(refused)

    response = client.post(reverse("cases_console:handoff-cancel", args=[world.handoff.pk]))
    assert response.status_code == 302
    world.handoff.refresh_from_db()
    assert world.handoff.status == "cancelled" and world.handoff.cancelled_at is not None
    assert audit(world.company, "case.handoff_cancelled").actor_user == world.users["operator"]
    assert "Handoff cancelled." in text(client.get(case_url))

    release = case_services.workflow_definition_create(actor=world.board, company=world.company, name="Release",
                                                       prompt="# Release")
    response = client.post(reverse("cases_console:case-handoff", args=[world.case.identifier]),
                           {"to": str(world.agent.pk), "workflow": str(release.pk), "phase": "ship", "note": "go"})
    assert response.status_code == 302
    handoff = CaseHandoff.objects.filter(case=world.case).order_by("-created_at").first()
    assert (handoff.workflow_action, handoff.workflow_name, handoff.phase) == ("adopt", "Release", "ship")
    assert handoff.status == "applied"  # nothing was running on the task
    world.case.refresh_from_db()
    assert world.case.current_workflow_id == release.pk and world.case.phase == "ship"
    assert audit(world.company, "case.handoff_accepted").actor_user == world.users["operator"]
    assert audit(world.company, "case.handoff_applied") is not None
    page = text(client.get(case_url))
    assert f'id="handoff-{handoff.pk}"' in page and "Applied" in page


def test_operator_creates_and_edits_a_workflow_definition(world):
    client = world.client("operator")
    response = client.post(reverse("cases_console:workflow-create"),
                           {"name": "Release", "description": "Ship it", "prompt": "# Release\n\n- tag"})
    assert response.status_code == 302
    definition = WorkflowDefinition.objects.get(company=world.company, name="Release")
    assert response["Location"] == f"/workflows/{definition.pk}/"
    assert audit(world.company, "workflow_definition.created").actor_user == world.users["operator"]
    old_fingerprint = definition.fingerprint

    response = client.post(reverse("cases_console:workflow-edit", args=[definition.pk]),
                           {"name": "Release", "description": "Ship it", "prompt": "# Release\n\n- tag\n- push"})
    assert response.status_code == 302
    definition.refresh_from_db()
    assert definition.fingerprint != old_fingerprint
    assert audit(world.company, "workflow_definition.updated").details["changes"] == ["prompt"]

    duplicate = client.post(reverse("cases_console:workflow-create"), {"name": "triage", "prompt": "x"})
    assert duplicate.status_code == 400 and "already exists" in text(duplicate)


def test_markdown_is_sanitized_everywhere(world):
    client = world.client("operator")
    evil = '# Title\n\n<script>alert("x")</script>\n\n<img src=x onerror="alert(1)"> [link](javascript:alert(1))'
    preview = text(client.post(reverse("cases_console:workflow-preview"), {"prompt": evil}))
    assert "<h1>Title</h1>" in preview
    assert "<script" not in preview and "alert" not in preview.replace("[link](javascript:alert(1))", "")
    assert "onerror" not in preview and 'href="javascript' not in preview
    comment_create(actor=world.board, issue=world.issue, body=evil)
    page = text(client.get(reverse("console:issue-detail", args=[world.issue.identifier])))
    assert '<script>alert("x")' not in page and "onerror" not in page


# --- documents, runs ---------------------------------------------------------------------------------------


def test_document_history_and_escaped_diff(world):
    url = reverse("console:issue-document", args=[world.issue.identifier, "plan"])
    body = text(world.client("viewer").get(url))
    assert "Revision 2" in body and "Revision 1" in body
    assert '<span class="diff-del">-step two</span>' in body
    assert '<span class="diff-add">+step 2 &lt;b&gt;bold&lt;/b&gt;</span>' in body
    partial = world.client("viewer").get(url, {"from": "0", "to": "1"}, **HTMX)
    assert "<html" not in text(partial) and '<span class="diff-add">+step one</span>' in text(partial)
    assert world.client("viewer").get(url, {"to": "9"}).status_code == 404


def test_run_log_polls_until_the_run_ends(world):
    client = world.client("viewer")
    page = text(client.get(reverse("console:run-detail", args=[world.run.pk])))
    assert "hello from the agent" in page and 'id="log-poller"' in page and "every 2s" in page

    log_url = reverse("console:run-log", args=[world.run.pk])
    run_append_event(run_id=world.run.pk, kind="stderr", message="second <line>")
    live = client.get(log_url, {"after": "1"}, **HTMX)
    assert live.status_code == 200
    assert "second &lt;line&gt;" in text(live) and "hello from the agent" not in text(live)
    assert 'after=2"' in text(live)  # the next poll continues after the last line

    run_finish(run=HeartbeatRun.objects.get(pk=world.run.pk), status="succeeded")
    done = client.get(log_url, {"after": "2"}, **HTMX)
    assert done.status_code == 286  # htmx stops polling
    assert "Run ended" in text(done) and 'id="log-poller"' not in text(done)
    assert 'hx-swap-oob="true"' in text(done)  # the status badge is refreshed too
    page = text(client.get(reverse("console:run-detail", args=[world.run.pk])))
    assert 'id="log-poller"' not in page


# --- agents -------------------------------------------------------------------------------------------


def test_admin_creates_an_agent(world):
    client = world.client("admin")
    response = client.post(reverse("console:agent-create"), {
        "name": "Grace", "role": "qa", "title": "QA", "reports_to": str(world.agent.pk),
        "adapter_type": "none", "budget_dollars": "12.50"})
    assert response.status_code == 302
    grace = Agent.objects.get(company=world.company, name="Grace")
    assert (grace.budget_monthly_cents, grace.reports_to_id) == (1250, world.agent.pk)
    assert audit(world.company, "agent.created").actor_user == world.users["admin"]
    taken = client.post(reverse("console:agent-create"), {"name": "grace", "role": "qa", "adapter_type": "none"})
    assert taken.status_code == 400 and "exists" in text(taken)


def test_admin_pauses_and_resumes_an_agent(world):
    client = world.client("admin")
    client.post(reverse("console:agent-pause", args=[world.agent.pk]), {"reason": "night"})
    world.agent.refresh_from_db()
    assert (world.agent.status, world.agent.pause_reason) == ("paused", "night")
    assert audit(world.company, "agent.paused").actor_user == world.users["admin"]
    client.post(reverse("console:agent-resume", args=[world.agent.pk]))
    world.agent.refresh_from_db()
    assert (world.agent.status, world.agent.pause_reason) == ("idle", "")
    assert audit(world.company, "agent.resumed") is not None
    again = client.post(reverse("console:agent-resume", args=[world.agent.pk]), follow=True)
    assert "not paused" in text(again)


def test_admin_grants_and_withdraws_tasks_assign(world):
    client = world.client("admin")
    page = text(client.get(reverse("console:agent-detail", args=[world.agent.pk])))
    assert "assigns no tasks" in page and 'name="canAssignTasks"' in page
    client.post(reverse("console:agent-permissions", args=[world.agent.pk]), {"canAssignTasks": "on"})
    world.agent.refresh_from_db()
    assert world.agent.permissions == {"canCreateAgents": False, "canAssignTasks": True}
    entry = audit(world.company, "agent.permissions_updated")
    assert entry.actor_user == world.users["admin"] and entry.details["to"]["canAssignTasks"] is True
    assert "assigns tasks" in text(client.get(reverse("console:agent-detail", args=[world.agent.pk])))
    client.post(reverse("console:agent-permissions", args=[world.agent.pk]), {})  # both boxes unchecked
    world.agent.refresh_from_db()
    assert world.agent.permissions == {"canCreateAgents": False, "canAssignTasks": False}


def test_api_key_is_shown_once(world):
    client = world.client("admin")
    response = client.post(reverse("console:agent-key-create", args=[world.agent.pk]), {"name": "ci"})
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    raw = re.search(r'<code class="secret" id="raw-key">(pcp_[^<]+)</code>', text(response)).group(1)
    key = AgentApiKey.objects.get(agent=world.agent, name="ci")
    assert key.key_hash == hash_key(raw) and raw.startswith(key.prefix)
    assert audit(world.company, "agent_key.created").actor_user == world.users["admin"]
    again = text(client.get(reverse("console:agent-detail", args=[world.agent.pk])))
    assert raw not in again and f"{key.prefix}…" in again
    # The key works against the API.
    api = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert api.get("/api/agents/me").status_code == 200

    client.post(reverse("console:agent-key-revoke", args=[world.agent.pk, key.pk]))
    key.refresh_from_db()
    assert key.revoked_at is not None and audit(world.company, "agent_key.revoked") is not None


def test_admin_edits_the_adapter_config(world):
    world.users["admin"].is_staff = True  # a local process command is staff's (test_server_execution_boundary)
    world.users["admin"].save(update_fields=["is_staff"])
    client = world.client("admin")
    url = reverse("console:agent-adapter", args=[world.agent.pk])
    bad = client.post(url, {"adapter_type": "process", "adapter_config": "{not json"})
    assert bad.status_code == 400 and "Not valid JSON" in text(bad)
    assert client.post(url, {"adapter_type": "process", "adapter_config": "[1]"}).status_code == 400
    good = client.post(url, {"adapter_type": "process", "adapter_config": '{"command": ["python", "a.py"]}'})
    assert good.status_code == 302
    world.agent.refresh_from_db()
    assert world.agent.adapter_type == "process" and world.agent.adapter_config == {"command": ["python", "a.py"]}
    assert audit(world.company, "agent.adapter_updated").details["changes"] == ["adapter_config", "adapter_type"]


def test_admin_points_an_agent_at_the_reference_runner(world):
    client = world.client("admin")
    url = reverse("console:agent-adapter", args=[world.agent.pk])
    refused = client.post(url, {"adapter_type": "prp", "adapter_config": '{"harness": "fake", "script": "/etc/passwd"}'})
    assert refused.status_code == 400 and "adapter_config.script must name a bundled fake-harness script" in text(refused)
    assert "/etc/passwd" in text(refused)  # the input is kept in the form
    good = client.post(url, {"adapter_type": "prp", "adapter_config": '{"harness": "fake", "script": "happy-path"}'})
    assert good.status_code == 302
    world.agent.refresh_from_db()
    assert world.agent.adapter_type == "prp" and world.agent.adapter_config["script"] == "happy-path"


# --- htmx fragments and lists --------------------------------------------------------------------------------


def test_board_filters_with_the_shared_filterset(world):
    IssueFactory(company=world.company, title="Done thing", status="done")
    client = world.client("viewer")
    full = text(client.get(reverse("console:issue-board")))
    assert "<html" in full and 'hx-target="#board"' in full
    partial = client.get(reverse("console:issue-board"), {"status": "done"}, **HTMX)
    body = text(partial)
    assert "<html" not in body and "Done thing" in body and "Ship the landing page" not in body
    assert "HX-Request" in partial["Vary"]
    assert "Unknown value(s) bogus" in text(client.get(reverse("console:issue-board"), {"status": "bogus"}, **HTMX))
    foreign = AgentFactory(company=CompanyFactory())  # another company's agent: said so, as the API's 404
    body = text(client.get(reverse("console:issue-board"), {"assigneeAgentId": str(foreign.pk)}, **HTMX))
    assert "No such agent in this company." in body and "Ship the landing page" not in body


def test_issue_list_rows_link_to_the_issue_page(world):
    body = text(world.client("viewer").get(reverse("console:issue-list")))
    assert f'href="/issues/{world.issue.identifier}/"' in body


def cases_in(body) -> list[str]:
    return re.findall(r'<tr id="case-([A-Z0-9]+-C\d+)"', body)


def test_case_list_sorts_and_groups_like_the_api(world):
    for title, status, case_type in [("Alpha", "done", "bug"), ("Beta", "draft", "feature"),
                                     ("Gamma", "in_review", "bug")]:
        case, _ = case_services.case_create(actor=world.board, company=world.company, case_type=case_type,
                                            title=title, kickoff="k", workflow_document_text="w", status=status)
    client = world.client("viewer")
    url = reverse("cases_console:case-list")
    by_title = text(client.get(url, {"sortField": "title", "sortDir": "asc"}, **HTMX))
    titles = re.findall(r'<a href="/cases/[^"]+/">([^<]+)</a>', by_title)
    assert titles == sorted(titles) and len(titles) == 4
    grouped = text(client.get(url, {"groupBy": "status", "sortField": "title"}, **HTMX))
    groups = re.findall(r'<tr class="group-row"><th scope="rowgroup" colspan="8">([^<]+?) <span', grouped)
    assert groups == ["Draft", "In Review", "Done"]  # lifecycle order
    assert "grouped by status" in grouped
    bad = text(client.get(url, {"sortField": "nope"}))
    assert 'role="alert"' in bad and "sortField" in bad and "<html" in bad
    assert "[invalid name]" not in bad and ">Search</label>" in bad


@pytest.mark.parametrize("name", ["dashboard", "agent-list", "issue-list", "issue-board", "run-list", "case-list"])
def test_list_pages_keep_a_constant_query_count(world, name):
    client = world.client("viewer")
    url = pages(world)[name]

    def grow(n):
        for i in range(n):
            agent = AgentFactory(company=world.company, reports_to=world.agent)
            issue = IssueFactory(company=world.company, assignee_agent=agent, status=["todo", "done"][i % 2])
            RunFactory(agent=agent, issue=issue, status="running")
            case_services.case_create(actor=world.board, company=world.company, case_type=f"t{i % 3}",
                                      title=f"case {i}", kickoff="k", workflow_document_text="w")

    grow(2)
    small = count_page_queries(client, url)
    grow(15)
    assert count_page_queries(client, url) == small


def test_issue_count_on_the_page_is_the_query_not_the_model(world):
    assert Issue.objects.filter(company=world.company).count() == 2  # the issue and the case's primary task
    assert Interaction.objects.filter(company=world.company, status="pending").count() == 1
    assert "pending interactions" in text(world.client("viewer").get(reverse("console:dashboard")))


def test_other_apps_add_dashboard_panels(world):
    from issues.console.dashboard import DASHBOARD_PANELS, register_dashboard_panel

    def panel(company):
        return "console/_panel.html", {"title": "Connector health", "rows": [("GitHub <main>", "healthy", None)]}

    register_dashboard_panel(panel)
    try:
        body = text(world.client("viewer").get(reverse("console:dashboard")))
    finally:
        DASHBOARD_PANELS.remove(panel)
    assert "Connector health" in body and "GitHub &lt;main&gt;" in body and "healthy" in body
