"""The operator console: login, the company switcher, and the issue list (full page + htmx partial)."""
import re

import pytest
from django.contrib.staticfiles import finders
from django.test import Client
from django.urls import reverse

from tests.factories import TEST_PASSWORD, AgentFactory, CompanyFactory, IssueFactory, MembershipFactory, UserFactory

ISSUES_URL = "/issues/"
HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def console(board_user):
    client = Client()
    client.force_login(board_user)
    return client


def rows(response) -> list[str]:
    """Issue identifiers in the rendered table, in order."""
    return re.findall(r'<tr id="issue-([A-Z0-9]+-\d+)"', response.content.decode())


def text(response) -> str:
    return response.content.decode()


# --- authentication ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_issue_list_requires_login(client):
    response = client.get(ISSUES_URL)
    assert response.status_code == 302
    assert response["Location"] == f"{reverse('login')}?next={ISSUES_URL}"


@pytest.mark.django_db
def test_root_redirects_to_the_issue_list(client):
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"] == ISSUES_URL


def test_login_with_password_then_logout(client, board_user, company):
    IssueFactory(company=company, title="Visible after login")
    page = client.get(reverse("login"))
    assert page.status_code == 200
    assert 'name="csrfmiddlewaretoken"' in text(page)

    response = client.post(reverse("login"), {"username": board_user.username, "password": TEST_PASSWORD})
    assert response.status_code == 302
    assert response["Location"] == ISSUES_URL
    assert "Visible after login" in text(client.get(ISSUES_URL))

    assert client.get(reverse("logout")).status_code == 405  # logout is POST only
    response = client.post(reverse("logout"))
    assert response.status_code == 302
    assert response["Location"] == reverse("login")
    assert client.get(ISSUES_URL).status_code == 302


def test_wrong_password_shows_an_error(client, board_user):
    response = client.post(reverse("login"), {"username": board_user.username, "password": "nope"})
    assert response.status_code == 200
    assert 'role="alert"' in text(response)
    assert "_auth_user_id" not in client.session


# --- the list ----------------------------------------------------------------------------------------


def test_list_shows_only_the_current_companys_issues(console, company):
    mine = IssueFactory(company=company, title="Ours to do")
    other = IssueFactory(company=CompanyFactory(), title="Somebody else's")
    response = console.get(ISSUES_URL)
    assert response.status_code == 200
    assert rows(response) == [mine.identifier]
    assert "Somebody else&#x27;s" not in text(response) and other.identifier not in text(response)


def test_rows_show_identifier_title_status_priority_assignee(console, company):
    agent = AgentFactory(company=company, name="Linus")
    IssueFactory(company=company, title="Ship it", status="in_progress", priority="high", priority_rank=1,
                 assignee_agent=agent)
    IssueFactory(company=company, title="Unowned", status="backlog")
    body = text(console.get(ISSUES_URL))
    row = re.search(r'<tr id="issue-[^"]+">.*?Ship it.*?</tr>', body, re.S).group(0)
    assert company.issue_prefix in row
    assert "status-in_progress" in row and "In Progress" in row
    assert "prio-high" in row
    assert "Linus" in row
    assert "<time datetime=" in row
    assert "Unassigned" in body


def test_status_comma_list_filters_full_page(console, company):
    todo = IssueFactory(company=company, status="todo")
    backlog = IssueFactory(company=company, status="backlog")
    IssueFactory(company=company, status="done")
    response = console.get(ISSUES_URL, {"status": "todo,backlog"})
    assert response.status_code == 200
    assert sorted(rows(response)) == sorted([todo.identifier, backlog.identifier])
    assert "<html" in text(response)
    # The form shows the filter it applied (reads work without JavaScript).
    assert 'value="todo,backlog"' in text(response)


def test_htmx_request_gets_only_the_rows_partial(console, company):
    todo = IssueFactory(company=company, status="todo", title="Alpha task")
    IssueFactory(company=company, status="done", title="Alpha done")
    IssueFactory(company=company, status="todo", title="Beta task")
    response = console.get(ISSUES_URL, {"status": "todo,in_progress", "q": "alpha"}, **HTMX)
    assert response.status_code == 200
    body = text(response)
    assert "<html" not in body and "<form" not in body
    assert rows(response) == [todo.identifier]
    assert "HX-Request" in response["Vary"]


def test_q_searches_title_and_identifier(console, company):
    wanted = IssueFactory(company=company, title="Fix the footer link")
    other = IssueFactory(company=company, title="Write hero copy")
    assert rows(console.get(ISSUES_URL, {"q": "FOOTER"})) == [wanted.identifier]
    assert rows(console.get(ISSUES_URL, {"q": other.identifier.lower()}, **HTMX)) == [other.identifier]


def test_priority_and_assignee_filters(console, company):
    agent = AgentFactory(company=company)
    assigned = IssueFactory(company=company, assignee_agent=agent, priority="critical", priority_rank=0)
    IssueFactory(company=company, priority="critical", priority_rank=0)
    IssueFactory(company=company, assignee_agent=agent, priority="low", priority_rank=3)
    response = console.get(ISSUES_URL, {"assigneeAgentId": str(agent.pk), "priority": "critical,high"})
    assert rows(response) == [assigned.identifier]
    # The assignee select lists the company's agents and keeps the chosen one selected.
    assert f'<option value="{agent.pk}" selected>{agent.name}</option>' in text(response)


def test_rows_are_sorted_by_priority_then_age(console, company):
    low = IssueFactory(company=company, priority="low", priority_rank=3)
    critical = IssueFactory(company=company, priority="critical", priority_rank=0)
    medium = IssueFactory(company=company)
    assert rows(console.get(ISSUES_URL)) == [critical.identifier, medium.identifier, low.identifier]


@pytest.mark.parametrize("headers", [{}, HTMX], ids=["full-page", "htmx"])
def test_invalid_status_shows_the_field_error(console, company, headers):
    IssueFactory(company=company)
    response = console.get(ISSUES_URL, {"status": "todo,bogus"}, **headers)
    assert response.status_code == 200
    body = text(response)
    assert 'role="alert"' in body
    assert "Unknown value(s) bogus" in body
    assert rows(response) == []


def test_invalid_uuid_shows_an_error_not_a_crash(console, company):
    response = console.get(ISSUES_URL, {"assigneeAgentId": "not-a-uuid", "parentId": "x"})
    assert response.status_code == 200
    body = text(response)
    assert "Assignee:" in body and "Parent issue id:" in body
    assert "has-error" in body


@pytest.mark.parametrize("headers", [{}, HTMX], ids=["full-page", "htmx"])
def test_a_filter_naming_another_companys_object_says_so_as_the_api_does(console, company, headers):
    IssueFactory(company=company)
    foreign = AgentFactory(company=CompanyFactory())
    response = console.get(ISSUES_URL, {"assigneeAgentId": str(foreign.pk)}, **headers)
    assert response.status_code == 200
    body = text(response)
    assert 'role="alert"' in body and "No such agent in this company." in body
    assert "No issues match these filters." not in body and rows(response) == []


def test_empty_results_say_so(console, company):
    IssueFactory(company=company, status="todo")
    assert "No issues match these filters." in text(console.get(ISSUES_URL, {"status": "done"}, **HTMX))


def test_pages_of_fifty_keep_the_filters(console, company):
    for _ in range(51):
        IssueFactory(company=company, status="todo")
    IssueFactory(company=company, status="done")
    first = console.get(ISSUES_URL, {"status": "todo"})
    assert len(rows(first)) == 50
    assert "page 1 of 2" in text(first)
    assert 'href="?status=todo&amp;page=2"' in text(first)
    second = console.get(ISSUES_URL, {"status": "todo", "page": "2"}, **HTMX)
    assert len(rows(second)) == 1


def test_other_filterset_parameters_survive_the_form(console, company):
    goal_issue = IssueFactory(company=company)
    response = console.get(ISSUES_URL, {"goalId": "8a3e1f8e-0000-4000-8000-000000000000"})
    assert rows(response) == []
    assert '<input type="hidden" name="goalId" value="8a3e1f8e-0000-4000-8000-000000000000">' in text(response)
    assert goal_issue.identifier not in text(response)


def test_user_without_membership_sees_an_empty_state(db):
    IssueFactory(company=CompanyFactory(), title="Not yours")
    client = Client()
    client.force_login(UserFactory())
    for headers in ({}, HTMX):
        response = client.get(ISSUES_URL, **headers)
        assert response.status_code == 200
        assert "You are not a member of any company" in text(response)
        assert "Not yours" not in text(response)


def test_viewer_role_can_read(db):
    membership = MembershipFactory(role="viewer")
    issue = IssueFactory(company=membership.company)
    client = Client()
    client.force_login(membership.user)
    assert rows(client.get(ISSUES_URL)) == [issue.identifier]


# --- company switcher --------------------------------------------------------------------------------


@pytest.fixture
def second_company(board_user):
    other = CompanyFactory(name="Zeta Works")
    MembershipFactory(company=other, user=board_user, role="viewer")
    return other


def test_switcher_lists_only_the_users_companies(console, company, second_company):
    stranger = CompanyFactory(name="Stranger Inc")
    body = text(console.get(ISSUES_URL))
    switcher = re.search(r'<form class="switcher".*?</form>', body, re.S).group(0)
    assert 'name="csrfmiddlewaretoken"' in switcher
    assert f'value="{company.pk}" selected' in switcher
    assert f'value="{second_company.pk}"' in switcher
    assert str(stranger.pk) not in switcher and "Stranger Inc" not in body


def test_switching_company_changes_the_list(console, company, second_company):
    IssueFactory(company=company, title="First company issue")
    theirs = IssueFactory(company=second_company, title="Second company issue")
    response = console.post(reverse("console:switch-company"), {"company_id": str(second_company.pk),
                                                                  "next": ISSUES_URL})
    assert response.status_code == 302 and response["Location"] == ISSUES_URL
    assert console.session["company_id"] == str(second_company.pk)
    listing = console.get(ISSUES_URL)
    assert rows(listing) == [theirs.identifier]
    assert f'value="{second_company.pk}" selected' in text(listing)


def test_switching_to_a_company_of_which_the_user_is_not_a_member_is_404(console, company):
    stranger = CompanyFactory()
    IssueFactory(company=stranger, title="Secret")
    response = console.post(reverse("console:switch-company"), {"company_id": str(stranger.pk)})
    assert response.status_code == 404
    assert "company_id" not in console.session
    for bogus in ("", "not-a-uuid"):
        assert console.post(reverse("console:switch-company"), {"company_id": bogus}).status_code == 404
    assert "Secret" not in text(console.get(ISSUES_URL))


def test_a_stale_session_company_falls_back_to_a_membership(console, company):
    stranger = CompanyFactory()
    IssueFactory(company=stranger, title="Secret")
    mine = IssueFactory(company=company)
    session = console.session
    session["company_id"] = str(stranger.pk)  # e.g. the membership was removed since
    session.save()
    assert rows(console.get(ISSUES_URL)) == [mine.identifier]


def test_switch_redirect_refuses_other_hosts(console, company):
    response = console.post(reverse("console:switch-company"),
                            {"company_id": str(company.pk), "next": "https://evil.example/"})
    assert response["Location"] == ISSUES_URL


def test_switch_is_post_only_and_csrf_protected(board_user, company):
    client = Client(enforce_csrf_checks=True)
    client.force_login(board_user)
    assert client.get(reverse("console:switch-company")).status_code == 405
    assert client.post(reverse("console:switch-company"), {"company_id": str(company.pk)}).status_code == 403


def test_superuser_may_switch_to_any_company(db, admin_user):
    first, second = CompanyFactory(name="A Co"), CompanyFactory(name="B Co")
    issue = IssueFactory(company=second)
    client = Client()
    client.force_login(admin_user)
    assert client.post(reverse("console:switch-company"), {"company_id": str(second.pk)}).status_code == 302
    assert rows(client.get(ISSUES_URL)) == [issue.identifier]
    assert str(first.pk) in text(client.get(ISSUES_URL))


# --- layout ------------------------------------------------------------------------------------------


def test_htmx_is_served_from_local_static(console, company):
    body = text(console.get(ISSUES_URL))
    sources = re.findall(r'<script src="([^"]+)"', body)
    htmx = [src for src in sources if "htmx" in src]
    assert htmx, sources
    assert all(src.startswith("/static/") for src in sources)
    assert finders.find(htmx[0].removeprefix("/static/")) is not None
    assert re.search(r'<link rel="stylesheet" href="/static/css/app.css">', body)
    assert finders.find("css/app.css") is not None


def test_login_page_uses_the_same_layout_without_the_switcher(client):
    body = text(client.get(reverse("login")))
    assert "/static/css/app.css" in body and "Paperclip" in body
    assert 'class="switcher"' not in body and "Log out" not in body


def test_filter_form_works_without_javascript(console, company):
    body = text(console.get(ISSUES_URL))
    form = re.search(r'<form id="issue-filters"[^>]*>', body, re.S).group(0)
    assert 'method="get"' in form and f'action="{ISSUES_URL}"' in form
    assert f'hx-get="{ISSUES_URL}"' in form and 'hx-target="#issue-results"' in form


def test_htmx_history_restore_gets_the_full_page(console, company):
    response = console.get(ISSUES_URL, HTTP_HX_REQUEST="true", HTTP_HX_HISTORY_RESTORE_REQUEST="true")
    assert "<html" in text(response)
