"""Agents and runs over the upstream-compatible API (paperclip-api.md §5.1, issue #14): the
company's agents, hire / update / permissions, pause / resume / terminate, keys, the on-demand
heartbeat, the agent's inbox-lite, and the board's run controls. Through the API as board users
and as agents; the terminated key is tried over real HTTP."""
import json
import urllib.error
import urllib.request

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from issues.actors import SYSTEM
from issues.choices import PRIORITY_RANK
from issues.models import ActivityLog, Agent, AgentApiKey, Company, HeartbeatRun, Issue, WakeupRequest
from issues.services.companies import agent_api_key_create
from issues.services.runs import run_append_event, run_finish, run_mark_running
from issues.services.thread import comment_create
from tests.conftest import AgentClient
from tests.factories import AgentFactory, CompanyFactory, IssueFactory, MembershipFactory, RunFactory
from tests.queries import count_queries as get_counted
from tests.test_errors import assert_error

SECRET_ENV = {"command": ["python", "agent.py"], "env": {"OPENAI_API_KEY": "sk-literal-secret", "MODE": "fast",
                                                         "GITHUB_TOKEN": {"secret_ref": "env:PAPERCLIP_SECRET_GH"}}}


def board_for(company, role="owner"):
    client = APIClient()
    client.force_login(MembershipFactory(company=company, role=role).user)
    return client


def audit(company, action):
    return ActivityLog.objects.filter(company=company, action=action).order_by("-created_at", "-id").first()


def agents_url(company):
    return f"/api/companies/{company.pk}/agents"


# --- list and detail ----------------------------------------------------------------------------

def test_list_is_upstreams_agent_record_with_config_redacted_for_agents(board_client, agent_client, company):
    coder = AgentFactory(company=company, name="Code Monkey", adapter_type="process", adapter_config=SECRET_ENV,
                         permissions={"canCreateAgents": True}, last_heartbeat_at=timezone.now())
    board = {a["id"]: a for a in board_client.get(agents_url(company)).json()}
    record = board[str(coder.pk)]
    assert set(record) >= {"id", "companyId", "name", "urlKey", "role", "title", "status", "reportsTo",
                           "capabilities", "adapterType", "adapterConfig", "runtimeConfig", "budgetMonthlyCents",
                           "spentMonthlyCents", "permissions", "lastHeartbeatAt", "createdAt", "updatedAt"}
    assert record["urlKey"] == "code-monkey" and record["companyId"] == str(company.pk)
    assert record["permissions"] == {"canCreateAgents": True, "canAssignTasks": False}
    assert record["lastHeartbeatAt"] is not None
    assert record["adapterConfig"] == SECRET_ENV  # the board sees the configuration it wrote
    seen_by_agent = {a["id"]: a for a in agent_client.get(agents_url(company)).json()}[str(coder.pk)]
    env = seen_by_agent["adapterConfig"]["env"]
    assert env == {"OPENAI_API_KEY": "[redacted]", "MODE": "fast",
                   "GITHUB_TOKEN": {"secret_ref": "env:PAPERCLIP_SECRET_GH"}}
    assert "sk-literal-secret" not in json.dumps(agent_client.get(f"/api/agents/{coder.pk}").json())


def test_list_filters_by_status_and_role_and_refuses_unknown_values(board_client, company):
    AgentFactory(company=company, name="ceo", role="ceo")
    AgentFactory(company=company, name="napping", role="engineer", status="paused")
    AgentFactory(company=company, name="worker", role="engineer")
    names = lambda q: [a["name"] for a in board_client.get(f"{agents_url(company)}?{q}").json()]  # noqa: E731
    assert names("role=engineer") == ["napping", "worker"]
    assert names("status=paused") == ["napping"]
    assert names("role=ceo,engineer&status=idle") == ["ceo", "worker"]
    assert names("limit=1&offset=1") == ["napping"]
    assert_error(board_client.get(f"{agents_url(company)}?status=sleeping"), 400, "invalid_filter", fields=("status",))
    assert_error(board_client.get(f"{agents_url(company)}?limit=0"), 400, fields=("limit",))


def test_list_query_count_is_the_same_for_10_and_10000_agents(board_client, company):
    def add(count, start):
        Agent.objects.bulk_create([Agent(company=company, name=f"bulk-{start + i:05d}", role="engineer")
                                   for i in range(count)], batch_size=1000)

    def count_queries():
        queries, body = get_counted(board_client, agents_url(company))
        return queries, len(body)

    add(10, 0)
    small = count_queries()
    add(9990, 10)
    large = count_queries()
    assert small[1] == 10 and large[1] == 500  # the default page
    assert small[0] == large[0]


def test_detail_has_the_chain_of_command_manager_first(agent_client, company):
    ceo = AgentFactory(company=company, name="boss", role="ceo", title="Chief")
    cto = AgentFactory(company=company, name="cto", role="cto", reports_to=ceo)
    dev = AgentFactory(company=company, name="dev", reports_to=cto)
    body = agent_client.get(f"/api/agents/{dev.pk}").json()
    assert body["reportsTo"] == str(cto.pk)
    assert body["chainOfCommand"] == [{"id": str(cto.pk), "name": "cto", "role": "cto", "title": ""},
                                      {"id": str(ceo.pk), "name": "boss", "role": "ceo", "title": "Chief"}]
    assert_error(agent_client.get("/api/agents/00000000-0000-0000-0000-000000000000"), 404, "not_found")


# --- create ------------------------------------------------------------------------------------

def test_board_creates_an_agent_with_upstream_fields(board_client, board_user, company):
    board_user.is_staff = True  # a local process command is staff's (tests/test_server_execution_boundary.py)
    board_user.save(update_fields=["is_staff"])
    boss = AgentFactory(company=company, role="ceo")
    response = board_client.post(agents_url(company), {
        "name": "Grace", "title": "Reviewer", "reportsTo": str(boss.pk), "capabilities": "reviews PRs",
        "adapterType": "process", "adapterConfig": {"command": ["python", "agent.py"]},
        "runtimeConfig": {"maxConcurrentRuns": 2}, "budgetMonthlyCents": 5000,
        "permissions": {"canAssignTasks": True}}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["role"], body["status"], body["reportsTo"], body["budgetMonthlyCents"]) == (
        "general", "idle", str(boss.pk), 5000)
    assert body["permissions"] == {"canCreateAgents": False, "canAssignTasks": True}
    agent = Agent.objects.get(pk=body["id"])
    assert (agent.capabilities, agent.runtime_config) == ("reviews PRs", {"maxConcurrentRuns": 2})
    assert audit(company, "agent.created").entity_id == body["id"]


@pytest.mark.parametrize("body,field", [
    ({"adapterType": "none"}, "name"),
    ({"name": "x"}, "adapterType"),
    ({"name": "x", "adapterType": "claude_local"}, "adapterType"),
    ({"name": "x", "adapterType": "process", "adapterConfig": {"command": "python agent.py"}}, "adapterConfig"),
    ({"name": "x", "adapterType": "none", "budgetMonthlyCents": -1}, "budgetMonthlyCents"),
    ({"name": "x", "adapterType": "none", "role": "wizard"}, "role"),
    ({"name": "x", "adapterType": "none", "runtimeConfig": {"maxRetries": "many"}}, "runtimeConfig"),
    ({"name": "x", "adapterType": "none", "icon": "r" * 65}, "icon"),
    ({"name": "x", "adapterType": "none", "metadata": ["not", "an", "object"]}, "metadata"),
])
def test_create_refuses_bad_input_naming_the_field(board_client, company, body, field):
    before = Agent.objects.count()
    assert_error(board_client.post(agents_url(company), body, format="json"), 400, fields=(field,))
    assert Agent.objects.count() == before


def test_create_conflicts_on_a_taken_name_and_viewers_are_read_only(board_client, company):
    AgentFactory(company=company, name="Grace")
    assert_error(board_client.post(agents_url(company), {"name": "grace", "adapterType": "none"}, format="json"),
                 409, "agent_name_taken")
    viewer = board_for(company, role="viewer")
    assert_error(viewer.post(agents_url(company), {"name": "new", "adapterType": "none"}, format="json"),
                 403, "read_only_role")


def test_an_agent_creates_agents_only_with_the_create_permission(make_agent_client, company):
    plain = make_agent_client(company=company)
    error = assert_error(plain.post(agents_url(company), {"name": "hire", "adapterType": "none"}, format="json"),
                         403, "missing_permission")
    assert error["message"] == "Missing permission: agents:create"
    hirer = make_agent_client(company=company, permissions={"canCreateAgents": True})
    created = hirer.post(agents_url(company), {"name": "hire", "adapterType": "none"}, format="json")
    assert created.status_code == 201, created.content
    assert audit(company, "agent.created").actor_agent_id == hirer.agent.pk
    # Granting permissions stays with the board.
    assert_error(hirer.post(agents_url(company), {"name": "hire2", "adapterType": "none",
                                                  "permissions": {"canCreateAgents": True}}, format="json"),
                 403, "board_only")
    assert not Agent.objects.filter(name="hire2").exists()


# --- update and permissions ---------------------------------------------------------------------

def test_board_patches_an_agent_and_the_budget_is_audited(board_client, company):
    agent = AgentFactory(company=company, budget_monthly_cents=100)
    response = board_client.patch(f"/api/agents/{agent.pk}", {"title": "Lead", "budgetMonthlyCents": 900,
                                                               "role": "qa"}, format="json")
    assert response.status_code == 200, response.content
    assert (response.json()["title"], response.json()["budgetMonthlyCents"], response.json()["role"]) == (
        "Lead", 900, "qa")
    assert set(audit(company, "agent.updated").details["changes"]) == {"title", "budgetMonthlyCents", "role"}
    assert audit(company, "agent.budget_updated").details == {"from": 100, "to": 900}


def test_icon_and_metadata_are_kept_and_shown_on_every_agent_record(board_client, agent_client, company):
    created = board_client.post(agents_url(company), {"name": "Iris", "adapterType": "none", "icon": "robot",
                                                      "metadata": {"team": "web", "tier": 2}}, format="json")
    assert created.status_code == 201, created.content
    assert (created.json()["icon"], created.json()["metadata"]) == ("robot", {"team": "web", "tier": 2})
    agent_id = created.json()["id"]
    patched = board_client.patch(f"/api/agents/{agent_id}", {"icon": "owl", "metadata": {"team": "api"}},
                                 format="json").json()
    assert (patched["icon"], patched["metadata"]) == ("owl", {"team": "api"})
    assert set(audit(company, "agent.updated").details["changes"]) == {"icon", "metadata"}
    for record in (agent_client.get(f"/api/agents/{agent_id}").json(),
                   next(a for a in agent_client.get(agents_url(company)).json() if a["id"] == agent_id)):
        assert (record["icon"], record["metadata"]) == ("owl", {"team": "api"})
    cleared = board_client.patch(f"/api/agents/{agent_id}", {"icon": None, "metadata": None}, format="json").json()
    assert (cleared["icon"], cleared["metadata"]) == (None, {})
    assert_error(board_client.patch(f"/api/agents/{agent_id}", {"icon": "x" * 65}, format="json"), 400,
                 fields=("icon",))


def test_me_is_the_full_agent_record_and_refuses_board_credentials(board_client, make_agent_client, company):
    boss = AgentFactory(company=company, name="boss", role="ceo")
    client = make_agent_client(company=company, reports_to=boss, icon="bee", metadata={"k": 1},
                               adapter_type="process", adapter_config=SECRET_ENV)
    me = client.get("/api/agents/me").json()
    record = client.get(f"/api/agents/{client.agent.pk}").json()
    assert {k: v for k, v in me.items() if k != "company"} == record  # the same record as GET /agents/{id}
    assert me["company"]["id"] == str(company.pk)
    assert (me["icon"], me["metadata"], me["urlKey"]) == ("bee", {"k": 1}, client.agent.name.lower())
    assert me["adapterConfig"]["env"]["OPENAI_API_KEY"] == "[redacted]"
    assert [c["id"] for c in me["chainOfCommand"]] == [str(boss.pk)]
    for path in ("/api/agents/me", "/api/agents/me/wake", "/api/agents/me/inbox-lite"):
        error = assert_error(board_client.get(path), 401, "agent_auth_required")
        assert error["message"] == "Agent authentication required"


def test_patch_refusals(board_client, agent_client, company):
    boss = AgentFactory(company=company)
    agent = AgentFactory(company=company, reports_to=boss)
    url = f"/api/agents/{agent.pk}"
    error = assert_error(board_client.patch(url, {"permissions": {"canCreateAgents": True}}, format="json"), 422,
                         "use_permissions_endpoint")
    assert error["message"] == "Use /api/agents/:id/permissions for permission changes"
    assert_error(board_client.patch(url, {"status": "terminated"}, format="json"), 422, "status_not_settable")
    assert_error(board_client.patch(f"/api/agents/{boss.pk}", {"reportsTo": str(agent.pk)}, format="json"), 422,
                 "reporting_cycle")
    assert_error(board_client.patch(url, {"nickname": "x"}, format="json"), 400, fields=("nickname",))
    assert_error(agent_client.patch(url, {"title": "mine now"}, format="json"), 403, "board_only")
    agent.refresh_from_db()
    assert (agent.title, agent.permissions, boss.reports_to_id) == ("", {}, None)


def test_patch_status_paused_pauses_and_stops_live_runs(board_client, company):
    agent = AgentFactory(company=company)
    run = RunFactory(agent=agent, status="queued")
    response = board_client.patch(f"/api/agents/{agent.pk}", {"status": "paused"}, format="json")
    assert response.json()["status"] == "paused"
    assert HeartbeatRun.objects.get(pk=run.pk).status == "cancelled"
    assert board_client.patch(f"/api/agents/{agent.pk}", {"status": "idle"}, format="json").json()["status"] == "idle"
    assert Agent.objects.get(pk=agent.pk).pause_reason == ""


def test_permissions_endpoint_is_board_only(board_client, agent_client, company):
    agent = AgentFactory(company=company)
    url = f"/api/agents/{agent.pk}/permissions"
    body = board_client.patch(url, {"canCreateAgents": True, "canAssignTasks": True}, format="json").json()
    assert body["permissions"] == {"canCreateAgents": True, "canAssignTasks": True}
    assert board_client.patch(url, {"canAssignTasks": False}, format="json").json()["permissions"] == {
        "canCreateAgents": True, "canAssignTasks": False}
    assert audit(company, "agent.permissions_updated").details["to"] == {"canCreateAgents": True,
                                                                         "canAssignTasks": False}
    assert_error(agent_client.patch(url, {"canCreateAgents": False}, format="json"), 403, "board_only")
    assert_error(board_client.patch(url, {"canCreateAgents": "maybe"}, format="json"), 400,
                 fields=("canCreateAgents",))


# --- pause, resume, terminate --------------------------------------------------------------------

def test_pause_cancels_the_agents_live_runs(board_client, company):
    agent = AgentFactory(company=company)
    queued = RunFactory(agent=agent, status="queued")
    external = RunFactory(agent=agent, status="running", started_at=timezone.now())  # no process here
    with_process = RunFactory(agent=agent, status="running", started_at=timezone.now(), pid=999_999)
    other = RunFactory(agent=AgentFactory(company=company), status="running")
    response = board_client.post(f"/api/agents/{agent.pk}/pause")
    assert response.status_code == 200 and response.json()["status"] == "paused"
    statuses = dict(HeartbeatRun.objects.values_list("pk", "status"))
    assert (statuses[queued.pk], statuses[external.pk], statuses[other.pk]) == ("cancelled", "cancelled", "running")
    # A process is stopped by its adapter (it polls the stop request); the run ends when it exits.
    with_process.refresh_from_db()
    assert with_process.status == "running" and with_process.stop_requested_at is not None
    assert with_process.stop_reason == "agent_paused"
    assert audit(company, "agent.paused") is not None
    assert ActivityLog.objects.filter(action="heartbeat.cancelled", entity_id=str(queued.pk)).exists()


def test_resume_and_the_terminal_state(board_client, agent_client, company):
    agent = AgentFactory(company=company, status="paused", pause_reason="night")
    assert agent_client.post(f"/api/agents/{agent.pk}/resume").status_code == 403
    assert board_client.post(f"/api/agents/{agent.pk}/resume").json()["status"] == "idle"
    assert board_client.post(f"/api/agents/{agent.pk}/resume").json()["status"] == "idle"  # not paused: as it is
    assert audit(company, "agent.resumed") is not None
    assert board_client.post(f"/api/agents/{agent.pk}/terminate").json()["status"] == "terminated"
    assert_error(board_client.post(f"/api/agents/{agent.pk}/resume"), 409, "agent_terminated")
    assert_error(board_client.post(f"/api/agents/{agent.pk}/pause"), 409, "agent_terminated")
    assert_error(board_client.patch(f"/api/agents/{agent.pk}", {"status": "idle"}, format="json"), 409,
                 "agent_terminated")
    assert_error(board_client.post(f"/api/agents/{agent.pk}/keys", {}, format="json"), 409, "agent_terminated")
    for action in ("pause", "terminate"):
        assert_error(agent_client.post(f"/api/agents/{agent_client.agent.pk}/{action}"), 403, "board_only")


def test_terminate_cancels_runs_and_revokes_every_key(board_client, make_agent_client, company):
    client = make_agent_client(company=company)
    assert client.get("/api/agents/me").status_code == 200
    response = board_client.post(f"/api/agents/{client.agent.pk}/terminate")
    assert response.status_code == 200 and response.json()["status"] == "terminated"
    assert not AgentApiKey.objects.filter(agent=client.agent, revoked_at__isnull=True).exists()
    assert HeartbeatRun.objects.get(pk=client.run.pk).status == "cancelled"
    assert audit(company, "agent.terminated").details["revokedKeys"] == 1
    assert_error(client.get("/api/agents/me"), 401, "unauthorized")


@pytest.mark.django_db(transaction=True)
def test_a_terminated_agents_key_is_refused_over_http(live_server):
    company = CompanyFactory()
    agent = AgentFactory(company=company)
    owner = MembershipFactory(company=company).user
    _, raw = agent_api_key_create(agent=agent)

    def call(path, key, method="GET"):
        request = urllib.request.Request(f"{live_server.url}{path}", method=method,
                                         headers={"Authorization": f"Bearer {key}"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    assert call("/api/agents/me", raw)[0] == 200
    board = APIClient()
    board.force_login(owner)
    assert board.post(f"/api/agents/{agent.pk}/terminate").status_code == 200
    status, body = call("/api/agents/me", raw)
    assert status == 401 and body["code"] == "unauthorized" and isinstance(body["error"], str)


# --- keys -------------------------------------------------------------------------------------------

def test_board_mints_a_key_shown_once(board_client, agent_client, company):
    agent = AgentFactory(company=company)
    response = board_client.post(f"/api/agents/{agent.pk}/keys", {"name": "ci"}, format="json")
    assert response.status_code == 201
    body = response.json()
    assert set(body) == {"id", "name", "token", "createdAt"} and body["name"] == "ci"
    assert body["token"].startswith("pcp_")
    assert AgentClient(agent, body["token"]).get("/api/agents/me").json()["id"] == str(agent.pk)
    assert body["token"] not in json.dumps(list(AgentApiKey.objects.filter(pk=body["id"]).values()), default=str)
    assert board_client.post(f"/api/agents/{agent.pk}/keys").json()["name"] == "default"
    assert_error(agent_client.post(f"/api/agents/{agent.pk}/keys", {}, format="json"), 403, "board_only")


def test_board_lists_an_agents_keys_without_tokens(board_client, agent_client, company):
    agent = AgentFactory(company=company)
    first, _ = agent_api_key_create(agent=agent, name="laptop")
    second, _ = agent_api_key_create(agent=agent, name="ci")
    agent_api_key_create(agent=AgentFactory(company=company))  # another agent's: not listed
    AgentApiKey.objects.create(agent=agent, run=RunFactory(agent=agent), prefix="pcp_run", key_hash="f" * 64)
    AgentApiKey.objects.filter(pk=first.pk).update(revoked_at=timezone.now())
    body = board_client.get(f"/api/agents/{agent.pk}/keys").json()
    assert [k["id"] for k in body] == [str(second.pk), str(first.pk)]  # newest first, revoked ones too
    assert set(body[0]) == {"id", "name", "prefix", "createdAt", "lastUsedAt", "revokedAt"}
    assert body[0]["revokedAt"] is None and body[1]["revokedAt"] is not None
    assert_error(agent_client.get(f"/api/agents/{agent.pk}/keys"), 403, "board_only")


def test_key_list_query_count_is_the_same_for_10_and_10000_keys(board_client, company):
    agent = AgentFactory(company=company)

    def add(count, start):
        AgentApiKey.objects.bulk_create([AgentApiKey(agent=agent, name=f"k{start + i}", prefix="pcp_x",
                                                     key_hash=f"{start + i:064d}") for i in range(count)],
                                        batch_size=1000)

    def count_queries():
        queries, body = get_counted(board_client, f"/api/agents/{agent.pk}/keys")
        return queries, len(body)

    add(10, 0)
    small = count_queries()
    add(9990, 10)
    large = count_queries()
    assert small[1] == 10 and large[1] == 500  # the default page
    assert small[0] == large[0]


def test_board_revokes_a_key_and_its_requests_are_refused(board_client, make_agent_client, company):
    client = make_agent_client(company=company, with_run=False)
    key = AgentApiKey.objects.get(agent=client.agent)
    other, _ = agent_api_key_create(agent=AgentFactory(company=company))
    # another agent's key under this agent's path is a 404, and it stays usable
    assert_error(board_client.delete(f"/api/agents/{client.agent.pk}/keys/{other.pk}"), 404, "not_found")
    assert AgentApiKey.objects.get(pk=other.pk).revoked_at is None
    assert_error(client.delete(f"/api/agents/{client.agent.pk}/keys/{key.pk}"), 403, "board_only")
    assert client.get("/api/agents/me").status_code == 200
    response = board_client.delete(f"/api/agents/{client.agent.pk}/keys/{key.pk}")
    assert (response.status_code, response.json()) == (200, {"ok": True})
    assert_error(client.get("/api/agents/me"), 401, "unauthorized")
    assert audit(company, "agent_key.revoked").entity_id == str(key.pk)
    # revoking again changes nothing (no second audit row)
    assert board_client.delete(f"/api/agents/{client.agent.pk}/keys/{key.pk}").status_code == 200
    assert ActivityLog.objects.filter(company=company, action="agent_key.revoked").count() == 1


# --- heartbeat/invoke ------------------------------------------------------------------------------

def test_invoke_is_an_on_demand_wake_answered_202(board_client, company):
    agent = AgentFactory(company=company)
    first = board_client.post(f"/api/agents/{agent.pk}/heartbeat/invoke")
    assert first.status_code == 202
    run = first.json()
    assert run["status"] == "queued" and run["agentId"] == str(agent.pk) and run["invocationSource"] == "on_demand"
    wake = WakeupRequest.objects.get(pk=run["wakeupRequestId"])
    assert (wake.source, wake.status, str(wake.run_id)) == ("on_demand", "claimed", run["id"])
    assert audit(company, "agent.wakeup_requested") is not None  # the same service as /wakeup
    assert audit(company, "heartbeat.invoked").details["wakeupId"] == str(wake.pk)
    again = board_client.post(f"/api/agents/{agent.pk}/heartbeat/invoke")
    assert again.status_code == 202 and again.json()["id"] == run["id"]  # joins the live run
    assert HeartbeatRun.objects.filter(agent=agent).count() == 1


def test_invoke_of_a_paused_agent_is_skipped_with_the_reason(board_client, company):
    agent = AgentFactory(company=company, status="paused")
    response = board_client.post(f"/api/agents/{agent.pk}/heartbeat/invoke")
    assert response.status_code == 202
    body = response.json()
    assert (body["status"], body["reason"]) == ("skipped", "agent_paused") and body["wakeupRequestId"]
    assert not HeartbeatRun.objects.filter(agent=agent).exists()


def test_an_agent_invokes_only_itself(make_agent_client, company):
    client = make_agent_client(company=company, with_run=False)
    own = client.post(f"/api/agents/{client.agent.pk}/heartbeat/invoke")
    assert own.status_code == 202 and own.json()["status"] == "queued"
    other = AgentFactory(company=company)
    error = assert_error(client.post(f"/api/agents/{other.pk}/heartbeat/invoke"), 403, "agent_self_only")
    assert error["message"] == "Agent can only invoke itself"
    assert not WakeupRequest.objects.filter(agent=other).exists()
    viewer = board_for(company, role="viewer")
    assert_error(viewer.post(f"/api/agents/{other.pk}/heartbeat/invoke"), 403, "read_only_role")


# --- inbox-lite ---------------------------------------------------------------------------------------

def ranked(priority):
    return {"priority": priority, "priority_rank": PRIORITY_RANK[priority]}


def test_inbox_lite_lists_the_callers_actionable_issues(agent_client, board_client, company):
    agent = agent_client.agent
    wip = IssueFactory(company=company, assignee_agent=agent, status="in_progress", **ranked("low"),
                       checkout_run=agent_client.run, execution_run=agent_client.run,
                       execution_locked_at=timezone.now())
    todo = IssueFactory(company=company, assignee_agent=agent, **ranked("critical"))
    review = IssueFactory(company=company, assignee_agent=agent, status="in_review", **ranked("high"))
    blocked = IssueFactory(company=company, assignee_agent=agent, status="blocked", **ranked("high"), parent=todo)
    for status in ("backlog", "done", "cancelled"):
        IssueFactory(company=company, assignee_agent=agent, status=status)
    IssueFactory(company=company, assignee_agent=AgentFactory(company=company))
    Issue.objects.filter(pk=review.pk).update(updated_at=timezone.now())  # the newer of the two "high"
    body = agent_client.get("/api/agents/me/inbox-lite").json()
    assert [i["id"] for i in body] == [str(todo.pk), str(review.pk), str(blocked.pk), str(wip.pk)]
    assert set(body[0]) == {"id", "identifier", "title", "status", "priority", "projectId", "goalId", "parentId",
                            "updatedAt", "activeRun"}
    assert body[2]["parentId"] == str(todo.pk) and body[0]["activeRun"] is None
    assert body[3]["activeRun"] == {"id": str(agent_client.run.pk), "status": "running", "agentId": str(agent.pk),
                                    "startedAt": None}
    assert_error(board_client.get("/api/agents/me/inbox-lite"), 401, "agent_auth_required")
    assert_error(APIClient().get("/api/agents/me/inbox-lite"), 401, "unauthorized")


def test_inbox_lite_query_count_is_the_same_for_10_and_10000_issues(agent_client, company):
    agent, run = agent_client.agent, agent_client.run
    statuses = ("todo", "in_progress", "in_review", "blocked", "done")

    def add(count):
        start = Company.objects.get(pk=company.pk).issue_counter
        rows = []
        for i in range(count):
            number, status = start + i + 1, statuses[i % len(statuses)]
            lock = {"checkout_run": run, "execution_run": run} if status == "in_progress" else {}
            priority = ("critical", "high", "medium", "low")[i % 4]
            rows.append(Issue(company=company, number=number, identifier=f"{company.issue_prefix}-{number}",
                              title=f"bulk {number}", status=status, priority=priority,
                              priority_rank=PRIORITY_RANK[priority], assignee_agent=agent, **lock))
        Issue.objects.bulk_create(rows, batch_size=1000)
        Company.objects.filter(pk=company.pk).update(issue_counter=start + count)

    def count_queries():
        return get_counted(agent_client, "/api/agents/me/inbox-lite")

    agent_client.get("/api/agents/me")  # the key's and run's throttled bookkeeping writes happen once
    add(10)
    small_count, small = count_queries()
    add(9990)
    large_count, large = count_queries()
    assert len(small) == 8 and len(large) == 500  # done issues are left out; the default page
    assert any(item["activeRun"] for item in large)
    assert small_count == large_count


# --- the board's run controls -----------------------------------------------------------------------

def test_cancel_is_board_only_and_ends_a_queued_run(board_client, agent_client, company):
    run = RunFactory(agent=agent_client.agent, status="queued")
    assert_error(agent_client.post(f"/api/heartbeat-runs/{run.pk}/cancel"), 403, "board_only")
    assert HeartbeatRun.objects.get(pk=run.pk).status == "queued"
    body = board_client.post(f"/api/heartbeat-runs/{run.pk}/cancel").json()
    assert (body["id"], body["status"], body["stopRequested"], body["stopReason"]) == (
        str(run.pk), "cancelled", True, "board_cancel")
    assert audit(company, "heartbeat.cancelled").entity_id == str(run.pk)
    # An ended run is answered as it is; a process is signalled, not ended here.
    assert board_client.post(f"/api/heartbeat-runs/{run.pk}/cancel").json()["status"] == "cancelled"
    busy = RunFactory(agent=agent_client.agent, status="running", pid=999_999)
    body = board_client.post(f"/api/heartbeat-runs/{busy.pk}/cancel").json()
    assert (body["status"], body["stopRequested"]) == ("running", True)
    viewer = board_for(company, role="viewer")
    assert_error(viewer.post(f"/api/heartbeat-runs/{busy.pk}/cancel"), 403, "read_only_role")
    assert_error(board_client.post("/api/heartbeat-runs/00000000-0000-0000-0000-000000000000/cancel"), 404)


def test_run_events_alias_pages_with_after_seq(board_client, agent_client):
    run = agent_client.run
    for n in range(5):
        run_append_event(run_id=run.pk, kind="stdout", message=f"line {n}")
    url = f"/api/heartbeat-runs/{run.pk}/events"
    assert [e["seq"] for e in agent_client.get(url).json()] == [1, 2, 3, 4, 5]
    page = board_client.get(f"{url}?afterSeq=2&limit=2").json()
    assert [(e["seq"], e["eventType"], e["message"], e["runId"]) for e in page] == [
        (3, "stdout", "line 2", str(run.pk)), (4, "stdout", "line 3", str(run.pk))]
    assert_error(board_client.get(f"{url}?afterSeq=-1"), 400, fields=("afterSeq",))


def test_run_issues_are_the_issues_the_run_touched(agent_client, company):
    agent, run = agent_client.agent, agent_client.run
    woken_for = IssueFactory(company=company, assignee_agent=agent)
    commented = IssueFactory(company=company, assignee_agent=agent)
    checked_out = IssueFactory(company=company, assignee_agent=agent)
    IssueFactory(company=company, assignee_agent=agent)  # untouched
    HeartbeatRun.objects.filter(pk=run.pk).update(issue=woken_for)
    comment = agent_client.post(f"/api/issues/{commented.pk}/comments", {"body": "on it"}, format="json")
    assert comment.status_code == 201
    assert agent_client.post(f"/api/issues/{checked_out.pk}/checkout",
                             {"agentId": str(agent.pk), "expectedStatuses": ["todo"]}, format="json").status_code == 200
    comment_create(actor=SYSTEM, issue=woken_for, body="not from the run")
    body = agent_client.get(f"/api/heartbeat-runs/{run.pk}/issues").json()
    assert [i["issueId"] for i in body] == [str(woken_for.pk), str(commented.pk), str(checked_out.pk)]
    assert set(body[0]) == {"issueId", "identifier", "title", "status", "priority"}
    other_run = RunFactory(agent=AgentFactory(company=company))
    assert agent_client.get(f"/api/heartbeat-runs/{other_run.pk}/issues").json() == []
    # Upstream answers [] for an unknown run; here it is a 404, as another company's run is.
    assert_error(agent_client.get("/api/heartbeat-runs/00000000-0000-0000-0000-000000000000/issues"), 404)


@pytest.mark.parametrize("source,detail", [("on_demand", "manual"), ("timer", "system"), ("assignment", "system"),
                                           ("automation", "system"), ("connector", "callback")])
def test_live_runs_carry_upstreams_trigger_detail(board_client, company, source, detail):
    RunFactory(agent=AgentFactory(company=company), status="queued", invocation_source=source)
    (run,) = board_client.get(f"/api/companies/{company.pk}/live-runs").json()
    assert (run["invocationSource"], run["triggerDetail"]) == (source, detail)


def test_issue_live_runs_and_active_run(board_client, agent_client, company):
    issue = IssueFactory(company=company, assignee_agent=agent_client.agent)
    assert board_client.get(f"/api/issues/{issue.pk}/live-runs").json() == []
    none = board_client.get(f"/api/issues/{issue.identifier}/active-run")
    assert none.status_code == 200 and none.content == b"null"
    queued = RunFactory(agent=agent_client.agent, issue=issue, status="queued")
    running = RunFactory(agent=agent_client.agent, issue=issue, status="running")
    RunFactory(agent=agent_client.agent, issue=issue, status="succeeded", finished_at=timezone.now())
    live = agent_client.get(f"/api/issues/{issue.pk}/live-runs").json()
    assert [r["id"] for r in live] == [str(running.pk), str(queued.pk)]
    assert live[0]["agentName"] == agent_client.agent.name
    assert live[0]["triggerDetail"] == {"on_demand": "manual", "timer": "system", "assignment": "system",
                                        "automation": "system", "connector": "callback"}[running.invocation_source]
    active = agent_client.get(f"/api/issues/{issue.pk}/active-run").json()
    assert (active["id"], active["status"], active["agentName"]) == (str(running.pk), "running",
                                                                     agent_client.agent.name)
    # The run holding the execution lock wins, even while it is still queued.
    Issue.objects.filter(pk=issue.pk).update(status="in_progress", execution_run=queued, checkout_run=queued)
    assert agent_client.get(f"/api/issues/{issue.pk}/active-run").json()["id"] == str(queued.pk)


# --- lastHeartbeatAt ----------------------------------------------------------------------------------

def test_last_heartbeat_at_follows_the_agents_runs(board_client, agent_client, company):
    agent = agent_client.agent
    url = f"/api/agents/{agent.pk}"
    assert board_client.get(url).json()["lastHeartbeatAt"] is None
    run = RunFactory(agent=agent, status="queued")
    run_mark_running(run=run, owner="test:1", pid=None)
    started = Agent.objects.get(pk=agent.pk).last_heartbeat_at
    assert started is not None
    assert agent_client.post(f"/api/runs/{agent_client.run.pk}/heartbeat", {}, format="json").status_code == 200
    beat = Agent.objects.get(pk=agent.pk).last_heartbeat_at
    assert beat > started
    run_finish(run=run, status="succeeded")
    ended = Agent.objects.get(pk=agent.pk).last_heartbeat_at
    assert ended > beat
    assert board_client.get(url).json()["lastHeartbeatAt"] == ended.isoformat().replace("+00:00", "Z")
