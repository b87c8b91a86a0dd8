"""``POST /api/companies`` (paperclip-api.md §5.9): instance admins create a company and become its
owner; the issue prefix is derived from the name unless given."""
import pytest
from rest_framework.test import APIClient

from issues.actors import SYSTEM
from issues.models import ActivityLog, Company, Membership
from issues.services.board_keys import board_key_create
from issues.services.companies import issue_prefix_candidates
from tests.factories import CompanyFactory, MembershipFactory, UserFactory
from tests.test_errors import assert_error

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin():
    return UserFactory(username="instance-admin", is_staff=True)


@pytest.fixture
def admin_client(admin):
    client = APIClient()
    client.force_login(admin)
    return client


def test_an_instance_admin_creates_a_company_and_owns_it(admin, admin_client):
    response = admin_client.post("/api/companies", {"name": "Paperclip Labs", "description": "Agents at work",
                                                    "budgetMonthlyCents": 5000}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["name"], body["description"], body["issuePrefix"], body["budgetMonthlyCents"], body["status"]) == (
        "Paperclip Labs", "Agents at work", "PAP", 5000, "active")
    company = Company.objects.get(pk=body["id"])
    assert Membership.objects.get(company=company, user=admin).role == "owner"
    assert ActivityLog.objects.filter(company=company, action="company.created", actor_user=admin).exists()
    # As its owner the admin sees it and works in it at once.
    assert body["id"] in [c["id"] for c in admin_client.get("/api/companies").json()]
    issue = admin_client.post(f"/api/companies/{body['id']}/issues", {"title": "First task"}, format="json")
    assert issue.status_code == 201 and issue.json()["identifier"] == "PAP-1"


def test_derived_prefixes_skip_taken_ones_and_a_given_one_is_used(admin_client):
    CompanyFactory(issue_prefix="PAP")
    second = admin_client.post("/api/companies", {"name": "Paperclip"}, format="json").json()
    assert second["issuePrefix"] == "PAP2" and second["description"] is None and second["budgetMonthlyCents"] == 0
    given = admin_client.post("/api/companies", {"name": "Acme", "issuePrefix": "acme"}, format="json")
    assert given.status_code == 201 and given.json()["issuePrefix"] == "ACME"
    error = assert_error(admin_client.post("/api/companies", {"name": "Acme again", "issuePrefix": "ACME"},
                                           format="json"), 409, "prefix_taken", fields=["issuePrefix"])
    assert error["details"]["issuePrefix"] == ["ACME"]
    assert Company.objects.filter(name="Acme again").count() == 0


def test_prefix_candidates_follow_the_name():
    def first(name, n=1):
        candidates = issue_prefix_candidates(name)
        return [next(candidates) for _ in range(n)]

    assert first("Paperclip", 3) == ["PAP", "PAP2", "PAP3"]
    assert first("Café Ünion") == ["CAF"]
    assert first("3D Printing Co") == ["DPR"]  # a prefix starts with a letter
    assert first("X") == ["XC"] and first("42 !!!") == ["CO"] and first("数字") == ["CO"]


@pytest.mark.parametrize("body, field", [
    ({}, "name"), ({"name": "   "}, "name"), ({"name": "Acme", "budgetMonthlyCents": -1}, "budgetMonthlyCents"),
    ({"name": "Acme", "issuePrefix": "1ABC"}, "issuePrefix"), ({"name": "Acme", "issuePrefix": "A"}, "issuePrefix"),
    ({"name": "Acme", "issuePrefix": "AC-ME"}, "issuePrefix"), ({"name": "Acme", "slug": "acme"}, "slug"),
])
def test_bad_input_is_a_400_naming_the_field(admin_client, body, field):
    assert_error(admin_client.post("/api/companies", body, format="json"), 400, "validation_error", fields=[field])
    assert not Company.objects.exists()


def test_only_instance_admins_create_companies(company, make_agent_client):
    owner = MembershipFactory(company=company, role="owner").user  # owns a company, not the instance
    client = APIClient()
    client.force_login(owner)
    error = assert_error(client.post("/api/companies", {"name": "Side project"}, format="json"), 403,
                         "instance_admin_required")
    assert error["message"] == "Instance admin required"
    assert_error(make_agent_client(company=company).post("/api/companies", {"name": "Mine"}, format="json"), 403,
                 "board_only")
    assert_error(APIClient().post("/api/companies", {"name": "Anon"}, format="json"), 401)
    assert list(Company.objects.all()) == [company]


def test_a_staff_users_board_key_creates_companies(admin):
    _, token = board_key_create(actor=SYSTEM, user=admin)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    response = client.post("/api/companies", {"name": "Scripted Co"}, format="json")
    assert response.status_code == 201, response.content
    assert Membership.objects.get(company_id=response.json()["id"]).user == admin
