import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from issues.models import Company


def test_create_company_prints_ids_and_working_keys(db):
    out = StringIO()
    call_command("create_company", "--name", "Acme", "--prefix", "acme", "--agent", "Alice:engineer",
                 "--agent", "Bob", "--enable-cases", "--json", stdout=out)
    result = json.loads(out.getvalue())
    company = Company.objects.get(pk=result["companyId"])
    assert company.issue_prefix == "ACME" and company.enable_cases
    assert [(a["name"], a["role"]) for a in result["agents"]] == [("Alice", "engineer"), ("Bob", "general")]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {result['agents'][0]['apiKey']}")
    assert client.get("/api/agents/me").json()["name"] == "Alice"


def test_create_company_rejects_bad_role_and_duplicate_prefix_atomically(db):
    with pytest.raises(CommandError):
        call_command("create_company", "--name", "X", "--prefix", "XX", "--agent", "A:wizard", stdout=StringIO())
    call_command("create_company", "--name", "X", "--prefix", "XX", stdout=StringIO())
    with pytest.raises(CommandError):
        call_command("create_company", "--name", "Y", "--prefix", "XX", "--agent", "A", stdout=StringIO())
    assert Company.objects.filter(issue_prefix="XX").count() == 1


def test_seed_demo_is_repeatable_and_prints_a_login(db, monkeypatch):
    # As `make demo` does: the sandbox connector's references must resolve when it is created.
    monkeypatch.setenv("PAPERCLIP_SECRET_GITHUB_SANDBOX_TOKEN", "demo-token")
    monkeypatch.setenv("PAPERCLIP_SECRET_GITHUB_SANDBOX_WEBHOOK_SECRET", "demo-hook-secret")
    first, second = StringIO(), StringIO()
    call_command("seed_demo", stdout=first)
    call_command("seed_demo", stdout=second)
    assert Company.objects.filter(issue_prefix="DEMO").count() == 1
    assert "password:" in second.getvalue()
    client = APIClient()
    password = second.getvalue().split("password: ")[1].split()[0]
    assert client.login(username="admin", password=password)


def test_agent_create_and_key_create_for_an_existing_company(db):
    call_command("create_company", "--name", "Acme", "--prefix", "ACME", stdout=StringIO())
    out = StringIO()
    call_command("agent_create", "--company", "acme", "--name", "Cleo", "--role", "engineer", "--adapter", "process",
                 "--adapter-config", '{"command": ["true"]}', "--json", stdout=out)
    created = json.loads(out.getvalue())
    out = StringIO()
    call_command("agent_key_create", "--company", "ACME", "--agent", "Cleo", "--json", stdout=out)
    second = json.loads(out.getvalue())
    assert second["agentId"] == created["agentId"] and second["apiKey"] != created["apiKey"]
    for raw in (created["apiKey"], second["apiKey"]):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
        me = client.get("/api/agents/me").json()
        assert (me["name"], me["role"]) == ("Cleo", "engineer")


@pytest.mark.parametrize("args, message", [
    (["agent_create", "--company", "NOPE", "--name", "X"], "No company"),
    (["agent_create", "--company", "ACME", "--name", "X", "--role", "wizard"], "role"),
    (["agent_create", "--company", "ACME", "--name", "X", "--adapter-config", "[1]"], "JSON object"),
    (["agent_key_create", "--company", "ACME", "--agent", "ghost"], "No agent"),
])
def test_agent_commands_refuse_bad_arguments_clearly(db, args, message):
    call_command("create_company", "--name", "Acme", "--prefix", "ACME", stdout=StringIO())
    with pytest.raises(CommandError, match=message):
        call_command(*args, stdout=StringIO())
