"""``POST /api/companies/{id}/archive`` (paperclip-api.md §5.9): board only; archiving stops the
company's agents as ``PATCH status: archived`` does."""
import pytest
from rest_framework.test import APIClient

from issues.models import ActivityLog
from tests.factories import AgentFactory, CompanyFactory, MembershipFactory

pytestmark = pytest.mark.django_db


def url(company):
    return f"/api/companies/{company.pk}/archive"


def test_the_board_archives_and_the_agents_stop(board_client, company, django_capture_on_commit_callbacks):
    agent = AgentFactory(company=company)
    with django_capture_on_commit_callbacks(execute=True):
        response = board_client.post(url(company))
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "archived"
    agent.refresh_from_db()
    assert (agent.status, agent.pause_reason) == ("paused", "company_archived")
    assert ActivityLog.objects.filter(action="company.updated", entity_id=str(company.pk)).count() == 1
    again = board_client.post(url(company))
    assert again.status_code == 200 and again.json()["status"] == "archived"
    assert ActivityLog.objects.filter(action="company.updated", entity_id=str(company.pk)).count() == 1


def test_agents_and_viewers_are_refused(make_agent_client, company):
    ceo = make_agent_client(company=company, role="ceo")
    response = ceo.post(url(company))
    assert response.status_code == 403 and response.json()["code"] == "board_only", response.content
    viewer = APIClient()
    viewer.force_login(MembershipFactory(company=company, role="viewer").user)
    assert viewer.post(url(company)).status_code == 403
    company.refresh_from_db()
    assert company.status == "active"


def test_another_companys_archive_is_a_404(board_client):
    other = CompanyFactory()
    assert board_client.post(url(other)).status_code == 404
    other.refresh_from_db()
    assert other.status == "active"
