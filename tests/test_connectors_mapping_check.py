"""State mapping setup validation (§7.2, A.1/A.2): named and per-container overrides and outboundStates are
checked against each container's live workflow (Jira project statuses, Linear team workflow states) read
over real HTTP from the sandboxes; errors reach the health surface, and the check runs from the API, the
management command and after a configuration update."""
import json
import socket
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from rest_framework.test import APIClient

from connectors.choices import ErrorCategory
from connectors.models import ConnectorInstance, SyncError
from connectors.sandbox.jira import JiraSandbox
from connectors.selectors import instance_health
from connectors.services.instances import instance_create, instance_update
from connectors.services.mapping_check import state_mapping_check
from issues.actors import SYSTEM, Actor
from issues.models import ActivityLog
from tests.factories import CompanyFactory, MembershipFactory
from tests.jira_sandbox import DEFAULT_STATE_MAPPING as JIRA_MAPPING
from tests.jira_sandbox import SANDBOX_EMAIL, SANDBOX_TOKEN
from tests.linear_sandbox import DEFAULT_STATE_MAPPING as LINEAR_MAPPING
from tests.linear_sandbox import SANDBOX_TEAM
from tests.linear_sandbox import SANDBOX_TOKEN as LINEAR_TOKEN

JIRA_AVAILABLE = "To Do, In Progress, In Review, Blocked, Done"
LINEAR_AVAILABLE = "Triage, Backlog, Todo, In Progress, In Review, Done, Canceled, Duplicate"


@pytest.fixture
def jira():
    """The Jira sandbox with two projects sharing the default workflow."""
    with JiraSandbox(projects=("ABC", "PC"), email=SANDBOX_EMAIL, token=SANDBOX_TOKEN) as sandbox:
        yield sandbox


def jira_instance(company, sandbox, *, state_mapping=None, config=None, containers=("ABC", "PC"), base_url=None,
                  name="jira-setup"):
    return instance_create(actor=SYSTEM, company=company, name=name, provider_key="jira",
                           base_url=base_url or sandbox.base_url, containers=list(containers),
                           state_mapping=JIRA_MAPPING if state_mapping is None else state_mapping,
                           config=config or {}, credentials={"value": sandbox.credentials})


def linear_instance(company, sandbox, *, state_mapping, containers=(SANDBOX_TEAM,)):
    return instance_create(actor=SYSTEM, company=company, name="linear-setup", provider_key="linear",
                           base_url=sandbox.base_url, containers=list(containers), state_mapping=state_mapping,
                           credentials={"value": LINEAR_TOKEN})


def client_for(company, role):
    client = APIClient()
    client.force_login(MembershipFactory(company=company, role=role).user)
    return client


def reasons(report, kind="errors"):
    return {(i["field"], i["container"], i["reason"]) for i in report[kind]}


def dead_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


# --- the check ------------------------------------------------------------------------------------
def test_bad_named_overrides_are_reported_with_field_path_and_available_names(company, jira):
    mapping = {**JIRA_MAPPING, "statuses": {**JIRA_MAPPING["statuses"], "QA": "review"},
               "projects": {"PC": {"statuses": {"Shipped": "terminal", "in progress": "active"}}}}
    instance = jira_instance(company, jira, state_mapping=mapping,
                             config={"outboundStates": {"review": "In Review", "terminal": "Closed"}})
    report = state_mapping_check(actor=SYSTEM, instance=instance)

    assert report["status"] == "invalid"
    assert reasons(report) == {
        ("stateMapping.projects.PC.statuses.Shipped", "PC",
         f"no status named 'Shipped' in project PC; available: {JIRA_AVAILABLE}"),
        # a top-level override no project has
        ("stateMapping.statuses.QA", "ABC", f"no status named 'QA' in project ABC; available: {JIRA_AVAILABLE}"),
        ("stateMapping.statuses.QA", "PC", f"no status named 'QA' in project PC; available: {JIRA_AVAILABLE}"),
        # an outbound target every project must have
        *{("config.outboundStates.terminal", p, f"no status named 'Closed' in project {p} (outbound changes to "
                                                f"terminal would fail there); available: {JIRA_AVAILABLE}")
          for p in ("ABC", "PC")},
    }
    assert report["warnings"] == [] and report["providerErrors"] == []
    assert [(c["container"], c["checked"], [s["name"] for s in c["states"]]) for c in report["containers"]] == [
        ("ABC", True, JIRA_AVAILABLE.split(", ")), ("PC", True, JIRA_AVAILABLE.split(", "))]
    assert [jira_req.path for jira_req in jira.requests] == ["/project/ABC/statuses", "/project/PC/statuses"]

    # the health surface shows it
    health = instance_health(ConnectorInstance.objects.get(pk=instance.pk))
    assert health["status"] == "degraded"
    assert health["lastError"]["category"] == ErrorCategory.CONFIG
    assert health["lastError"]["message"].startswith("State mapping check: 5 error(s), 0 warning(s).")
    entry = SyncError.objects.get(instance=instance)
    assert entry.details["check"] == "state_mapping" and len(entry.details["errors"]) == len(report["errors"]) == 5


def test_a_valid_mapping_is_clean(company, jira):
    instance = jira_instance(company, jira, config={"outboundStates": {"review": "in review", "terminal": "Done"}},
                             state_mapping={**JIRA_MAPPING, "projects": {"abc": {"statuses": {"Blocked": "blocked"}}}})
    report = state_mapping_check(actor=SYSTEM, instance=instance)
    assert (report["status"], report["errors"], report["warnings"], report["providerErrors"]) == ("ok", [], [], [])
    states = {(s["name"], s["category"], s["mapped"]) for s in report["containers"][0]["states"]}
    assert states == {("To Do", "backlog", True), ("In Progress", "active", True), ("In Review", "review", True),
                      ("Blocked", "blocked", True), ("Done", "terminal", True)}
    assert not SyncError.objects.filter(instance=instance).exists()
    assert instance_health(instance)["status"] == "healthy"
    activity = ActivityLog.objects.get(action="connector.mapping_checked", entity_id=str(instance.pk))
    assert activity.details == {"status": "ok", "trigger": "manual", "errors": 0, "warnings": 0, "unreadable": []}


def test_override_for_a_project_the_connector_does_not_have_is_a_warning(company, jira):
    instance = jira_instance(company, jira, containers=("ABC",),
                             state_mapping={"projects": {"XYZ": {"statuses": {"Shipped": "terminal"}}}})
    report = state_mapping_check(actor=SYSTEM, instance=instance)
    assert report["status"] == "ok" and report["errors"] == []
    assert reasons(report, "warnings") == {
        ("stateMapping.projects.XYZ", None,
         "project XYZ is not one of this connector's containers; the override never applies")}


def test_per_project_workflow_variance(company):
    """A top-level override that exists in one project only is a warning there, never an error."""
    workflow = (("Open", "new", "Reopen"), ("Doing", "indeterminate", "Start"), ("Closed", "done", "Close"))
    with JiraSandbox(projects=("ABC",), email=SANDBOX_EMAIL, token=SANDBOX_TOKEN) as first, \
            JiraSandbox(projects=("PC",), email=SANDBOX_EMAIL, token=SANDBOX_TOKEN, workflow=workflow) as second:
        a = jira_instance(company, first, containers=("ABC",), name="a",
                          state_mapping={"statuses": {"Doing": "active"}})
        report = state_mapping_check(actor=SYSTEM, instance=a)
        assert reasons(report) == {("stateMapping.statuses.Doing", "ABC",
                                    f"no status named 'Doing' in project ABC; available: {JIRA_AVAILABLE}")}
        b = jira_instance(company, second, containers=("PC",), name="b",
                          state_mapping={"statuses": {"Doing": "active"}})
        assert state_mapping_check(actor=SYSTEM, instance=b)["status"] == "ok"


def test_linear_per_team_overrides_and_unmapped_states(company, linear_sandbox):
    ops = linear_sandbox.add_team("OPS", states=(("Queue", "unstarted"), ("Parked", "paused"), ("Live", "completed")))
    mapping = {**LINEAR_MAPPING, "states": {"In Review": "review"},
               "teams": {"ENG": {"states": {"Shipped": "terminal", "Todo": "active"}},
                         ops["id"]: {"states": {"Queue": "active", "In Progress": "active"}}}}
    instance = linear_instance(company, linear_sandbox, state_mapping=mapping, containers=(SANDBOX_TEAM, "OPS"))
    report = state_mapping_check(actor=SYSTEM, instance=instance)
    ops_available = "Queue, Parked, Live"
    assert report["status"] == "invalid"
    assert reasons(report) == {
        ("stateMapping.teams.ENG.states.Shipped", "ENG",
         f"no status named 'Shipped' in team ENG; available: {LINEAR_AVAILABLE}"),
        # per-team overrides may be keyed by the team id
        (f"stateMapping.teams.{ops['id']}.states.In Progress", "OPS",
         f"no status named 'In Progress' in team OPS; available: {ops_available}"),
    }
    assert reasons(report, "warnings") == {
        # exists in ENG only: it just does not apply in OPS
        ("stateMapping.states.In Review", "OPS",
         f"no status named 'In Review' in team OPS (only in ENG; the override does not apply here); "
         f"available: {ops_available}"),
        ("stateMapping", "OPS", "status 'Parked' in team OPS is unmapped (type paused); tasks in it are "
                                "treated as backlog"),
    }
    ops_states = next(c for c in report["containers"] if c["container"] == "OPS")["states"]
    assert ops_states == [{"name": "Queue", "category": "active", "mapped": True},
                          {"name": "Parked", "category": "backlog", "mapped": False},
                          {"name": "Live", "category": "terminal", "mapped": True}]


def test_linear_valid_mapping_is_clean(company, linear_sandbox):
    instance = linear_instance(company, linear_sandbox, state_mapping={
        **LINEAR_MAPPING, "teams": {"eng": {"states": {"Todo": "active"}, "types": {"backlog": "backlog"}}}})
    report = state_mapping_check(actor=SYSTEM, instance=instance)
    assert (report["status"], report["errors"], report["warnings"]) == ("ok", [], [])
    todo = next(s for s in report["containers"][0]["states"] if s["name"] == "Todo")
    assert todo == {"name": "Todo", "category": "active", "mapped": True}


@pytest.mark.parametrize("mode,category", [("auth", ErrorCategory.PROVIDER_AUTH),
                                           ("rate_limit", ErrorCategory.PROVIDER_RATE_LIMITED)])
def test_auth_and_rate_limit_failures_are_a_result_not_a_crash(company, jira, mode, category):
    instance = jira_instance(company, jira, state_mapping={"projects": {"PC": {"statuses": {"Shipped": "terminal"}}}})
    jira.fail_next(1, mode, retry_after=7)
    report = state_mapping_check(actor=SYSTEM, instance=instance)
    assert report["status"] == "unavailable" and report["errors"] == []
    assert [(e["container"], e["category"]) for e in report["providerErrors"]] == [("ABC", category)]
    assert report["providerErrors"][0]["retryAfter"] == (7 if mode == "rate_limit" else None)
    # the failure holds for the whole site: PC is not asked (and not waited for) again
    assert [(c["container"], c["checked"]) for c in report["containers"]] == [("ABC", False), ("PC", False)]
    assert [r.path for r in jira.requests] == ["/project/ABC/statuses"]
    entry = SyncError.objects.get(instance=instance)
    assert entry.category == category and "could not read the workflow of ABC" in entry.message
    assert ActivityLog.objects.get(action="connector.mapping_checked").details["unreadable"] == ["ABC"]


def test_a_failing_or_missing_project_does_not_hide_the_others(company, jira):
    instance = jira_instance(company, jira, containers=("ABC", "NOPE", "PC"),
                             state_mapping={"projects": {"PC": {"statuses": {"Shipped": "terminal"}}}})
    jira.fail_next(1, "error", status=503)
    report = state_mapping_check(actor=SYSTEM, instance=instance)
    assert report["status"] == "invalid"
    assert [(e["container"], e["category"]) for e in report["providerErrors"]] == [
        ("ABC", ErrorCategory.PROVIDER_STATUS)]
    assert [(c["container"], c["checked"]) for c in report["containers"]] == [
        ("ABC", False), ("NOPE", False), ("PC", True)]
    assert [(i["field"], i["container"]) for i in report["errors"]] == [
        ("containers", "NOPE"), ("stateMapping.projects.PC.statuses.Shipped", "PC")]
    assert "NOPE was not found" in report["errors"][0]["reason"]
    assert set(SyncError.objects.filter(instance=instance).values_list("category", flat=True)) == {
        ErrorCategory.PROVIDER_STATUS, ErrorCategory.CONFIG}


def test_unreachable_provider_and_missing_credentials(company, jira, monkeypatch):
    instance = jira_instance(company, jira, base_url=dead_url())
    report = state_mapping_check(actor=SYSTEM, instance=instance)
    assert report["status"] == "unavailable" and report["errors"] == []
    assert {e["category"] for e in report["providerErrors"]} == {ErrorCategory.PROVIDER_REQUEST}
    assert "could not be read" in report["message"]

    ConnectorInstance.objects.filter(pk=instance.pk).update(credentials_ref="env:PAPERCLIP_SECRET_MAPPING_CHECK_UNSET")
    monkeypatch.delenv("PAPERCLIP_SECRET_MAPPING_CHECK_UNSET", raising=False)
    report = state_mapping_check(actor=SYSTEM, instance=ConnectorInstance.objects.get(pk=instance.pk))
    assert report["status"] == "unavailable"
    assert [(e["container"], e["category"]) for e in report["providerErrors"]] == [(None, ErrorCategory.CONFIG)]
    assert SyncError.objects.filter(instance=instance, category=ErrorCategory.CONFIG,
                                    message__contains="Credentials unavailable").exists()


def test_github_has_no_workflow_metadata(company, monkeypatch):
    from tests.github_sandbox import DEFAULT_STATE_MAPPING as GITHUB_MAPPING

    monkeypatch.setenv("PAPERCLIP_SECRET_MAPPING_CHECK_NEVER_READ", "exported-but-never-read")

    instance = instance_create(actor=SYSTEM, company=company, name="gh", provider_key="github_issues",
                               base_url=dead_url(), containers=["octo/repo"], state_mapping=GITHUB_MAPPING,
                               credentials="env:PAPERCLIP_SECRET_MAPPING_CHECK_NEVER_READ")
    report = state_mapping_check(actor=SYSTEM, instance=instance)
    assert report["status"] == "not_applicable" and "no workflow metadata" in report["message"]
    assert not SyncError.objects.filter(instance=instance).exists()


# --- the API ----------------------------------------------------------------------------------------
def test_api_runs_the_check(company, jira):
    instance = jira_instance(company, jira, state_mapping={"projects": {"PC": {"statuses": {"Shipped": "terminal"}}}})
    url = f"/api/connectors/{instance.pk}/check-mapping"
    response = client_for(company, "operator").post(url, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "invalid" and body["providerKey"] == "jira"
    assert body["errors"] == [{"field": "stateMapping.projects.PC.statuses.Shipped", "container": "PC",
                               "reason": f"no status named 'Shipped' in project PC; available: {JIRA_AVAILABLE}"}]
    health = client_for(company, "viewer").get(f"/api/connectors/{instance.pk}/health").json()
    assert health["lastError"]["category"] == "config" and "Shipped" in health["lastError"]["message"]


def test_api_permissions(company, jira, make_agent_client):
    instance = jira_instance(company, jira)
    url = f"/api/connectors/{instance.pk}/check-mapping"
    viewer = client_for(company, "viewer").post(url, format="json")
    assert viewer.status_code == 403 and viewer.json()["code"] == "read_only_role"
    assert make_agent_client(company=company).post(url, format="json").status_code == 403
    other = client_for(CompanyFactory(), "owner").post(url, format="json")
    assert other.status_code == 404 and other.json()["code"] == "not_found"
    assert make_agent_client(company=CompanyFactory()).post(url, format="json").status_code == 404
    assert client_for(company, "owner").post("/api/connectors/not-a-uuid/check-mapping").status_code == 404
    assert jira.requests == []  # nobody above got as far as the provider
    assert not ActivityLog.objects.filter(action="connector.mapping_checked").exists()


# --- the management command -------------------------------------------------------------------------
def test_command_prints_the_report(company, jira):
    instance = jira_instance(company, jira)
    out = StringIO()
    call_command("connector_check_mapping", str(instance.pk), stdout=out)
    text = out.getvalue()
    assert text.startswith("jira-setup (jira): ok") and "ABC: To Do=backlog, In Progress=active" in text

    ConnectorInstance.objects.filter(pk=instance.pk).update(
        state_mapping={"projects": {"PC": {"statuses": {"Shipped": "terminal"}}}})
    out = StringIO()
    with pytest.raises(CommandError, match="invalid"):
        call_command("connector_check_mapping", str(instance.pk), stdout=out)
    assert (f"ERROR stateMapping.projects.PC.statuses.Shipped: no status named 'Shipped' in project PC; "
            f"available: {JIRA_AVAILABLE}") in out.getvalue()

    out = StringIO()
    with pytest.raises(CommandError):
        call_command("connector_check_mapping", str(instance.pk), "--json", stdout=out)
    assert json.loads(out.getvalue())["errors"][0]["container"] == "PC"
    with pytest.raises(CommandError, match="No connector instance"):
        call_command("connector_check_mapping", "nope")


# --- after a configuration update -------------------------------------------------------------------
def test_update_with_a_bad_override_records_health(company, jira, django_capture_on_commit_callbacks):
    admin = Actor(user=MembershipFactory(company=company, role="admin").user)
    instance = jira_instance(company, jira)
    with django_capture_on_commit_callbacks(execute=True):
        row = instance_update(actor=admin, instance=instance, changes={
            "state_mapping": {**JIRA_MAPPING, "projects": {"PC": {"statuses": {"Shipped": "terminal"}}}}})
    assert row.state_mapping["projects"]["PC"]["statuses"] == {"Shipped": "terminal"}  # the update stands
    entry = SyncError.objects.get(instance=instance)
    assert entry.category == ErrorCategory.CONFIG and entry.details["trigger"] == "update"
    assert entry.details["errors"] == [{"field": "stateMapping.projects.PC.statuses.Shipped", "container": "PC",
                                        "reason": f"no status named 'Shipped' in project PC; "
                                                  f"available: {JIRA_AVAILABLE}"}]
    assert instance_health(row)["lastError"]["category"] == "config"
    checked = ActivityLog.objects.get(action="connector.mapping_checked")
    assert checked.actor_user == admin.user and checked.details["status"] == "invalid"

    # fixing it records a clean check; a change that does not touch the mapping checks nothing
    with django_capture_on_commit_callbacks(execute=True):
        instance_update(actor=admin, instance=row, changes={"config": {"outboundStates": {"terminal": "Done"}}})
    assert ActivityLog.objects.filter(action="connector.mapping_checked").count() == 2
    with django_capture_on_commit_callbacks(execute=True):
        instance_update(actor=admin, instance=row, changes={"name": "renamed", "config": {
            "outboundStates": {"terminal": "Done"}}})
    assert ActivityLog.objects.filter(action="connector.mapping_checked").count() == 2


def test_update_never_breaks_when_the_provider_is_down(company, jira, django_capture_on_commit_callbacks):
    admin = Actor(user=MembershipFactory(company=company, role="admin").user)
    instance = jira_instance(company, jira)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        row = instance_update(actor=admin, instance=instance, changes={"base_url": dead_url()})
    assert len(callbacks) == 1
    assert ConnectorInstance.objects.get(pk=instance.pk).base_url == row.base_url
    assert SyncError.objects.get(instance=instance).category == ErrorCategory.PROVIDER_REQUEST
