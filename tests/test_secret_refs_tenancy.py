"""``env:NAME`` references belong to the company the server's operator gave them to.

The environment is one for every company on the server; an allow-list entry names the company it is
for (``BETA:PAPERCLIP_SECRET_BETA_*``: issue prefix or company id), and an entry without one applies to
every company only when ``PAPERCLIP_SECRET_ENV_SINGLE_TENANT`` says the server has one tenant (the rest
of the suite runs that way, tests/conftest.py). Here the default holds: company A's owner names
company Beta's variable and points the connector (or agent) at a listener A controls; the server
refuses when the reference is written and again when a row written earlier is used, and its answer
is the same whether a variable is unset or not A's."""
from __future__ import annotations

import re
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command

from connectors import secrets
from connectors.models import ConnectorInstance, SyncError
from connectors.services.instances import instance_create
from issues.actors import SYSTEM
from issues.adapters import get_adapter, prepare_context
from issues.choices import RunStatus
from issues.models import Agent
from tests.factories import AgentFactory, CompanyFactory, IssueFactory, RunFactory
from tests.test_errors import error_of
from tests.test_security_secrets_outbound import admin_http, create_connector, listener  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)

BETA_TOKEN = "ghp_BETA_ONLY_TOKEN"
BETA_REF = "env:PAPERCLIP_SECRET_BETA_GITHUB"


@pytest.fixture
def multi_tenant(settings, monkeypatch):
    """The production default: entries bound to a company; Beta's token is in the environment."""
    settings.PAPERCLIP = {**settings.PAPERCLIP, "SECRET_ENV_SINGLE_TENANT": False,
                          "SECRET_ENV_ALLOWLIST": ["BETA:PAPERCLIP_SECRET_BETA_*", "PAPERCLIP_SECRET_*"]}
    monkeypatch.setenv("PAPERCLIP_SECRET_BETA_GITHUB", BETA_TOKEN)
    return settings


@pytest.fixture
def beta(multi_tenant):
    """Company Beta with its connector referencing its own token (resolves for Beta)."""
    company = CompanyFactory(name="Beta", issue_prefix="BETA")
    instance_create(actor=SYSTEM, company=company, name="beta-gh", provider_key="github_issues",
                    base_url="https://api.github.com", containers=["beta/repo"], credentials=BETA_REF)
    assert secrets.resolve(BETA_REF, company_id=company.pk) == BETA_TOKEN
    return company


# --- connectors ------------------------------------------------------------------------------------
@pytest.mark.parametrize("field", ["credentials", "webhookSecret"])
def test_another_companys_env_secret_is_refused_when_written(admin_http, listener, beta, field):  # noqa: F811
    """The audit's scenario: A's owner names Beta's variable with a base URL A controls."""
    created = create_connector(admin_http, baseUrl=listener.url, **{field: BETA_REF})
    assert created.status_code == 400, created.text
    error = error_of(created)
    assert error["code"] == "validation_error" and list(error["details"]) == [field], error
    assert BETA_TOKEN not in created.text
    assert not ConnectorInstance.objects.filter(company=admin_http.company).exists()
    rotate_target = create_connector(admin_http, baseUrl=listener.url)
    assert rotate_target.status_code == 201, rotate_target.text
    rotated = admin_http.post(f"/connectors/{rotate_target.json()['id']}/credentials",
                              json={field: BETA_REF, "idempotencyKey": "rot-1"})
    assert rotated.status_code == 400 and list(error_of(rotated)["details"]) == [field], rotated.text
    assert listener.requests == []


def test_a_row_naming_another_companys_variable_is_refused_when_used(admin_http, listener, beta):  # noqa: F811
    """A row written before the fix (or copied by hand): every action answers 422 secret_unavailable
    naming the field, the poll records a health entry, and nothing reaches A's listener."""
    created = create_connector(admin_http, baseUrl=listener.url)
    assert created.status_code == 201, created.text
    instance_id = created.json()["id"]
    ConnectorInstance.objects.filter(pk=instance_id).update(credentials_ref=BETA_REF)

    response = admin_http.post(f"/connectors/{instance_id}/import",
                               json={"externalKey": "acme/site#1", "idempotencyKey": "imp-1"})
    assert response.status_code == 422, response.text
    error = error_of(response)
    assert error["code"] == "secret_unavailable" and "PAPERCLIP_SECRET_BETA_GITHUB" in error["details"]["credentials"][0]
    assert BETA_TOKEN not in response.text

    from connectors.services.polling import instance_poll

    instance_poll(instance_id=instance_id)
    assert SyncError.objects.filter(instance_id=instance_id, message__contains="PAPERCLIP_SECRET_BETA_GITHUB").exists()
    health = admin_http.get(f"/connectors/{instance_id}/health").json()
    assert any("PAPERCLIP_SECRET_BETA_GITHUB" in e["message"] for e in health["errors"]), health
    assert listener.requests == []  # nothing reached the URL company A configured


def test_the_answer_is_the_same_for_an_unset_and_a_refused_variable(admin_http, beta, monkeypatch):  # noqa: F811
    """No probing: Beta's variable (set, not A's), an unset one in Beta's range, an unlisted one that is
    set and an unlisted one that is not all get one answer, the name aside."""
    monkeypatch.setenv("UNLISTED_TOKEN", "set-but-unlisted")
    answers = set()
    for name in ("PAPERCLIP_SECRET_BETA_GITHUB", "PAPERCLIP_SECRET_BETA_NEVER_EXPORTED", "UNLISTED_TOKEN",
                 "UNLISTED_NEVER_EXPORTED", "PAPERCLIP_SECRET_ACME_GITHUB"):
        response = create_connector(admin_http, credentials=f"env:{name}")
        answers.add((response.status_code, response.text.replace(name, "<NAME>")))
    assert len(answers) == 1, answers
    assert {status for status, _ in answers} == {400}
    # the same answer at use time
    assert str(_unavailable(BETA_REF, admin_http.company)).replace("PAPERCLIP_SECRET_BETA_GITHUB", "<NAME>") == \
        str(_unavailable("env:UNLISTED_NEVER_EXPORTED", admin_http.company)).replace("UNLISTED_NEVER_EXPORTED", "<NAME>")


def _unavailable(ref, company):
    with pytest.raises(secrets.SecretUnavailable) as caught:
        secrets.resolve(ref, company_id=company.pk)
    return caught.value.message


def test_an_entry_binds_by_issue_prefix_or_company_id(multi_tenant, monkeypatch):
    acme, other = CompanyFactory(issue_prefix="ACME"), CompanyFactory()
    monkeypatch.setenv("PAPERCLIP_SECRET_ACME_GITHUB", "acme-token")
    monkeypatch.setenv("PAPERCLIP_SECRET_OTHER_GITHUB", "other-token")
    multi_tenant.PAPERCLIP = {**multi_tenant.PAPERCLIP, "SECRET_ENV_ALLOWLIST": [
        "acme:PAPERCLIP_SECRET_ACME_*", f"{other.pk}:PAPERCLIP_SECRET_OTHER_GITHUB"]}
    assert secrets.resolve("env:PAPERCLIP_SECRET_ACME_GITHUB", company_id=acme.pk) == "acme-token"
    assert secrets.resolve("env:PAPERCLIP_SECRET_OTHER_GITHUB", company_id=other.pk) == "other-token"
    _unavailable("env:PAPERCLIP_SECRET_ACME_GITHUB", other)
    _unavailable("env:PAPERCLIP_SECRET_OTHER_GITHUB", acme)


def test_unbound_entries_apply_to_every_company_only_on_a_single_tenant_server(multi_tenant, monkeypatch):
    company = CompanyFactory()
    monkeypatch.setenv("PAPERCLIP_SECRET_SHARED", "shared-token")
    assert "not provided to this company" in _unavailable("env:PAPERCLIP_SECRET_SHARED", company)
    multi_tenant.PAPERCLIP = {**multi_tenant.PAPERCLIP, "SECRET_ENV_SINGLE_TENANT": True}
    assert secrets.resolve("env:PAPERCLIP_SECRET_SHARED", company_id=company.pk) == "shared-token"


@pytest.mark.parametrize("single_tenant", [False, True])
def test_the_servers_own_variables_stay_refused_even_for_a_bound_entry(multi_tenant, monkeypatch, single_tenant):
    company = CompanyFactory(issue_prefix="ACME")
    monkeypatch.setenv("SECRET_KEY", "server-only-value")
    monkeypatch.setenv("PAPERCLIP_SECRET_ENV_SINGLE_TENANT", "true")
    multi_tenant.PAPERCLIP = {**multi_tenant.PAPERCLIP, "SECRET_ENV_SINGLE_TENANT": single_tenant,
                              "SECRET_ENV_ALLOWLIST": ["ACME:*", "*"]}
    for name in ("SECRET_KEY", "DATABASE_URL", "PAPERCLIP_SECRET_ENV_SINGLE_TENANT", "PAPERCLIP_SECRET_ENV_ALLOWLIST"):
        assert "server's own configuration" in _unavailable(f"env:{name}", company)


# --- agent adapters --------------------------------------------------------------------------------
PRINT_GH = [sys.executable, "-c", "import os; print('GH=' + str(os.environ.get('GH')))"]


def test_another_companys_variable_is_refused_in_an_agent_config_when_written(admin_http, beta):  # noqa: F811
    company = admin_http.company
    process = {"command": PRINT_GH, "env": {"GH": {"secret_ref": BETA_REF}}}
    created = admin_http.post(f"/companies/{company.pk}/agents",
                              json={"name": "Thief", "adapterType": "process", "adapterConfig": process})
    assert created.status_code == 400, created.text
    assert list(error_of(created)["details"]) == ["adapterConfig"]
    assert "adapter_config.env.GH.secret_ref" in created.text and BETA_TOKEN not in created.text
    http = {"url": "https://agents.example.com/wake", "secret_ref": BETA_REF}
    created = admin_http.post(f"/companies/{company.pk}/agents",
                              json={"name": "Thief", "adapterType": "http", "adapterConfig": http})
    assert created.status_code == 400 and "adapter_config.secret_ref" in created.text, created.text
    agent = AgentFactory(company=company, adapter_type="process", adapter_config={"command": PRINT_GH})
    patched = admin_http.patch(f"/agents/{agent.pk}", json={"adapterConfig": process})
    assert patched.status_code == 400, patched.text
    assert not Agent.objects.filter(company=company, name="Thief").exists()
    agent.refresh_from_db()
    assert agent.adapter_config == {"command": PRINT_GH}


def test_a_process_agent_stored_with_another_companys_variable_fails_without_it(beta, tmp_path):
    agent = AgentFactory(adapter_type="process", adapter_config={"command": PRINT_GH,
                                                                 "env": {"GH": {"secret_ref": BETA_REF}}})
    run = RunFactory(agent=agent, issue=IssueFactory(company=agent.company, assignee_agent=agent))
    result = get_adapter("process").execute(prepare_context(run, owner="test"))
    assert result.status == RunStatus.FAILED and "PAPERCLIP_SECRET_BETA_GITHUB" in result.error
    assert not run.events.filter(message__contains=BETA_TOKEN).exists()
    assert not run.events.filter(message__contains="GH=").exists()  # the process never started


def test_an_http_agent_stored_with_another_companys_variable_sends_nothing(beta, listener):  # noqa: F811
    agent = AgentFactory(adapter_type="http", adapter_config={"url": f"{listener.url}/wake", "secret_ref": BETA_REF})
    run = RunFactory(agent=agent, issue=IssueFactory(company=agent.company, assignee_agent=agent))
    result = get_adapter("http").execute(prepare_context(run, owner="test"))
    assert result.status == RunStatus.FAILED and "PAPERCLIP_SECRET_BETA_GITHUB" in result.error
    assert listener.requests == []


def test_the_company_the_variable_is_bound_to_gets_it(beta):
    agent = AgentFactory(company=beta, adapter_type="process",
                         adapter_config={"command": PRINT_GH, "env": {"GH": {"secret_ref": BETA_REF}}})
    run = RunFactory(agent=agent, issue=IssueFactory(company=beta, assignee_agent=agent))
    result = get_adapter("process").execute(prepare_context(run, owner="test"))
    assert result.status == RunStatus.SUCCEEDED, result.error
    assert run.events.filter(message__contains="GH=[redacted]").exists()  # delivered, and redacted in the log


# --- the demo ----------------------------------------------------------------------------------------
def _makefile_allowlist() -> list[str]:
    makefile = (Path(django_settings.BASE_DIR) / "Makefile").read_text()
    found = re.search(r"^run demo: export PAPERCLIP_SECRET_ENV_ALLOWLIST\s*:?=\s*(.+)$", makefile, re.MULTILINE)
    assert found, "make run binds the demo's variables to the demo company"
    return [entry.strip() for entry in found.group(1).split(",")]


def test_make_runs_allow_list_gives_the_demo_its_sandbox_secrets(settings, monkeypatch, tmp_path):
    settings.PAPERCLIP = {**settings.PAPERCLIP, "SECRET_ENV_SINGLE_TENANT": False,
                          "SECRET_ENV_ALLOWLIST": _makefile_allowlist()}
    monkeypatch.setenv("PAPERCLIP_SECRET_GITHUB_SANDBOX_TOKEN", "demo-token")
    monkeypatch.setenv("PAPERCLIP_SECRET_GITHUB_SANDBOX_WEBHOOK_SECRET", "demo-secret")
    call_command("seed_demo", "--repo-dir", str(tmp_path / "repo"), stdout=StringIO())
    instance = ConnectorInstance.objects.get(company__issue_prefix="DEMO", name="GitHub sandbox")
    assert secrets.resolve(instance.credentials_ref, company_id=instance.company_id) == "demo-token"
    assert secrets.resolve(instance.webhook_secret_ref, company_id=instance.company_id) == "demo-secret"
    _unavailable(instance.credentials_ref, CompanyFactory())  # and no other company's
