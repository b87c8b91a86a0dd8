import json
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from issues.models import ActivityLog, Agent, Company, Issue, Membership, WakeupRequest
from tests.factories import UserFactory


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
    # Hopper runs the example agent through the reference PRP runner, woken once for its task.
    [hopper] = Agent.objects.filter(company__issue_prefix="DEMO", name="Hopper")
    assert hopper.adapter_type == "prp" and hopper.adapter_config["harness"] == "process"
    assert list(Issue.objects.filter(assignee_agent=hopper).values_list("title", flat=True)) == ["Tidy the changelog"]
    assert WakeupRequest.objects.filter(agent=hopper).count() == 1
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


# --- headless operator set-up (issue #14) -------------------------------------------------------------


def run_json(*args) -> dict:
    out = StringIO()
    call_command(*args, "--json", stdout=out)
    return json.loads(out.getvalue())


def session_for(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def test_create_company_with_an_owner_who_can_then_work_in_it(db):
    owner = UserFactory(username="olga")
    result = run_json("create_company", "--name", "Acme", "--prefix", "ACME", "--owner", "olga")
    assert result["owner"] == {"userId": owner.pk, "username": "olga", "role": "owner"}
    membership = Membership.objects.get(company_id=result["companyId"], user=owner)
    assert membership.role == "owner"
    client = session_for(owner)
    assert [c["id"] for c in client.get("/api/companies").json()] == [result["companyId"]]
    created = client.post(f"/api/companies/{result['companyId']}/issues", {"title": "First"}, format="json")
    assert created.status_code == 201, created.content
    assert ActivityLog.objects.filter(action="membership.set", company_id=result["companyId"],
                                      details__user="olga", details__role="owner").exists()


def test_create_company_with_an_unknown_owner_creates_nothing(db):
    with pytest.raises(CommandError, match="No user 'ghost'"):
        call_command("create_company", "--name", "Acme", "--prefix", "ACME", "--owner", "ghost", "--agent", "A",
                     stdout=StringIO())
    assert not Company.objects.exists() and not Membership.objects.exists()


def test_membership_set_creates_and_updates_the_role_and_the_api_follows_it(db):
    call_command("create_company", "--name", "Acme", "--prefix", "ACME", stdout=StringIO())
    user = UserFactory(username="vera")
    company = Company.objects.get(issue_prefix="ACME")
    first = run_json("membership_set", "--company", "acme", "--user", "vera", "--role", "viewer")
    assert first == {"companyId": str(company.pk), "issuePrefix": "ACME", "userId": user.pk, "username": "vera",
                     "role": "viewer", "previousRole": None, "userCreated": False}
    client = session_for(user)
    refused = client.post(f"/api/companies/{company.pk}/issues", {"title": "x"}, format="json")
    assert refused.status_code == 403 and refused.json()["code"] == "read_only_role"

    second = run_json("membership_set", "--company", str(company.pk), "--user", "vera", "--role", "operator")
    assert (second["role"], second["previousRole"]) == ("operator", "viewer")
    assert Membership.objects.filter(user=user).count() == 1
    assert client.post(f"/api/companies/{company.pk}/issues", {"title": "x"}, format="json").status_code == 201
    assert list(ActivityLog.objects.filter(action="membership.set", company=company).order_by("created_at", "id")
                .values_list("details__role", flat=True)) == ["viewer", "operator"]
    text = StringIO()
    call_command("membership_set", "--company", "ACME", "--user", "vera", "--role", "admin", stdout=text)
    assert "vera is admin of ACME (was operator)" in text.getvalue()


def test_membership_set_can_create_the_user_and_prints_its_password_once(db):
    call_command("create_company", "--name", "Acme", "--prefix", "ACME", stdout=StringIO())
    created = run_json("membership_set", "--company", "ACME", "--user", "ops-bot", "--role", "owner", "--create-user")
    assert created["userCreated"] is True and created["role"] == "owner" and len(created["password"]) >= 20
    assert APIClient().login(username="ops-bot", password=created["password"])
    user = get_user_model().objects.get(username="ops-bot")
    assert created["password"] not in user.password  # only the hash is stored
    again = run_json("membership_set", "--company", "ACME", "--user", "ops-bot", "--role", "owner", "--create-user")
    assert again["userCreated"] is False and "password" not in again and again["previousRole"] == "owner"


@pytest.mark.parametrize("args, message", [
    (["--company", "NOPE", "--user", "vera", "--role", "viewer"], "No company with prefix or id 'NOPE'"),
    (["--company", "ACME", "--user", "ghost", "--role", "viewer"], "No user 'ghost'"),
    (["--company", "ACME", "--user", "vera", "--role", "member"], "invalid choice"),
    (["--company", "ACME", "--user", "vera"], "--role"),
])
def test_membership_set_refuses_bad_arguments_clearly(db, args, message):
    call_command("create_company", "--name", "Acme", "--prefix", "ACME", stdout=StringIO())
    UserFactory(username="vera")
    with pytest.raises(CommandError, match=message):
        call_command("membership_set", *args, stdout=StringIO())
    assert not Membership.objects.exists()
    assert not get_user_model().objects.filter(username="ghost").exists()
