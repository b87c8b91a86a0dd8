"""The console's Company page (Django test client): admins change the settings, the logo and the
brand colour through the same services as the API (audited, the same rules), archive the company,
and owners delete an archived one; viewers and operators only read; the header links to it."""
import pytest
from django.test import Client
from django.urls import reverse

from issues.models import ActivityLog, Agent, Asset, Company
from tests.attachment_files import PNG, a_file
from tests.factories import AgentFactory, CompanyFactory, MembershipFactory

pytestmark = pytest.mark.django_db

PAGE = "console:company-settings"


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def login(company, role) -> Client:
    client = Client()
    client.force_login(MembershipFactory(company=company, role=role).user)
    return client


def form_data(company, **changes):
    data = {"name": company.name, "description": company.description, "status": company.status,
            "budget_monthly_cents": company.budget_monthly_cents, "brand_color": company.brand_color}
    if company.require_board_approval_for_new_agents:
        data["require_board_approval_for_new_agents"] = "on"
    data.update(changes)
    return data


def page(client) -> str:
    response = client.get(reverse(PAGE))
    assert response.status_code == 200
    return response.content.decode()


def test_an_admin_saves_the_settings_through_the_service(company):
    admin = login(company, "admin")
    assert f'href="{reverse(PAGE)}"' in page(admin)  # the header links to it

    response = admin.post(reverse("console:company-settings-save"), form_data(
        company, name="Acme Robotics", budget_monthly_cents="5000", brand_color="#AA33CC",
        require_board_approval_for_new_agents="on"))

    assert response.status_code == 302 and response["Location"] == reverse(PAGE)
    company.refresh_from_db()
    assert (company.name, company.budget_monthly_cents, company.brand_color,
            company.require_board_approval_for_new_agents) == ("Acme Robotics", 5000, "#aa33cc", True)
    audit = ActivityLog.objects.filter(action="company.updated").latest("id")
    assert set(audit.details["changedKeys"]) == {"name", "brandColor", "requireBoardApprovalForNewAgents",
                                                 "budgetMonthlyCents"}
    assert ActivityLog.objects.filter(action="company.budget_updated").exists()
    html = page(admin)
    assert "Company settings saved." in html and 'style="border-bottom: 3px solid #aa33cc"' in html


def test_bad_input_is_shown_with_the_field_and_nothing_changes(company):
    admin = login(company, "admin")
    response = admin.post(reverse("console:company-settings-save"),
                          form_data(company, brand_color="purple", budget_monthly_cents="-1"))
    assert response.status_code == 400
    html = response.content.decode()
    assert "Use a colour as #RRGGBB, or leave it empty." in html
    assert "Ensure this value is greater than or equal to 0." in html
    before = Company.objects.get(pk=company.pk)
    assert (before.brand_color, before.budget_monthly_cents) == ("", company.budget_monthly_cents)


def test_pausing_from_the_page_stops_the_agents_as_the_api_does(company, django_capture_on_commit_callbacks):
    agent = AgentFactory(company=company, status="idle")
    admin = login(company, "admin")
    with django_capture_on_commit_callbacks(execute=True):
        admin.post(reverse("console:company-settings-save"), form_data(company, status="paused"))
    assert Agent.objects.get(pk=agent.pk).pause_reason == "company_paused"


def test_the_logo_is_uploaded_shown_and_removed(company, django_capture_on_commit_callbacks):
    admin = login(company, "admin")

    response = admin.post(reverse("console:company-logo"), {"file": a_file("logo.png")})

    assert response.status_code == 302 and response["Location"].endswith("#branding")
    company.refresh_from_db()
    asset = Asset.objects.get(pk=company.logo_asset_id)
    html = page(admin)
    assert f'src="{asset.content_path}"' in html and "Logo updated." in html
    assert b"".join(admin.get(asset.content_path).streaming_content) == PNG
    refused = admin.post(reverse("console:company-logo"), {"file": a_file("logo.svg", b"<svg/>", "image/svg+xml")},
                         follow=True)
    assert "Unsupported image type: image/svg+xml" in refused.content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        admin.post(reverse("console:company-logo-remove"))
    assert Company.objects.get(pk=company.pk).logo_asset_id is None and not Asset.objects.exists()


def test_viewers_and_operators_read_only(company):
    for role in ("viewer", "operator"):
        client = login(company, role)
        html = page(client)
        assert reverse("console:company-settings-save") not in html and reverse("console:company-logo") not in html
        assert "Changing these needs the admin role." in html
        for name in ("console:company-settings-save", "console:company-logo", "console:company-archive",
                     "console:company-delete"):
            assert client.post(reverse(name), form_data(company, name="Hijacked")).status_code == 403
    assert Company.objects.get(pk=company.pk).name == company.name


def test_archive_then_an_owner_deletes_after_typing_the_prefix(company, django_capture_on_commit_callbacks):
    owner, admin = login(company, "owner"), login(company, "admin")
    assert "Delete this company" not in page(owner)  # archive first
    with django_capture_on_commit_callbacks(execute=True):
        assert admin.post(reverse("console:company-archive")).status_code == 302
    assert Company.objects.get(pk=company.pk).status == "archived"
    assert "Only an owner may delete it." in page(admin)
    assert admin.post(reverse("console:company-delete"), {"confirm": company.issue_prefix}).status_code == 403
    assert "Delete this company" in page(owner)

    wrong = owner.post(reverse("console:company-delete"), {"confirm": "nope"}, follow=True)
    assert f"Type the company&#x27;s prefix ({company.issue_prefix}) to delete it." in wrong.content.decode()
    assert Company.objects.filter(pk=company.pk).exists()

    response = owner.post(reverse("console:company-delete"), {"confirm": company.issue_prefix})

    assert response.status_code == 302 and response["Location"] == reverse("console:home")
    assert not Company.objects.filter(pk=company.pk).exists()


def test_the_page_is_the_current_companys(company):
    other = CompanyFactory(name="Other Co")
    client = login(company, "admin")
    MembershipFactory(company=other, role="viewer", user=Company.objects.get(pk=company.pk).memberships.get().user)
    assert company.name in page(client) and "Other Co" not in page(client).split("<main")[1]


def test_it_needs_a_signed_in_user(company):
    response = Client().get(reverse(PAGE))
    assert response.status_code == 302 and "login" in response["Location"]
    assert Client().post(reverse("console:company-archive")).status_code == 302
    assert Company.objects.get(pk=company.pk).status == "active"
