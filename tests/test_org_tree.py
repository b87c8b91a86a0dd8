"""``GET /api/companies/{id}/org`` (paperclip-api.md §5.1): upstream's lean org chart."""
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from issues.models import Agent
from tests.factories import AgentFactory, CompanyFactory

pytestmark = pytest.mark.django_db


def org(client, company):
    response = client.get(f"/api/companies/{company.pk}/org")
    assert response.status_code == 200, response.content
    return response.json()


def shape(nodes):
    return [(n["name"], shape(n["reports"])) for n in nodes]


def test_the_chart_nests_reports_by_name_and_leaves_out_the_terminated(board_client, company):
    ceo = AgentFactory(company=company, name="Ada", role="ceo")
    cto = AgentFactory(company=company, name="Turing", role="cto", reports_to=ceo)
    AgentFactory(company=company, name="Bob", reports_to=cto)
    AgentFactory(company=company, name="Alice", reports_to=cto)
    gone = AgentFactory(company=company, name="Gone", reports_to=ceo, status="terminated")
    AgentFactory(company=company, name="Orphan", reports_to=gone)  # its manager left: a root
    AgentFactory(company=CompanyFactory(), name="Elsewhere")
    nodes = org(board_client, company)
    assert shape(nodes) == [("Ada", [("Turing", [("Alice", []), ("Bob", [])])]), ("Orphan", [])]
    assert nodes[0] == {"id": str(ceo.pk), "name": "Ada", "role": "ceo", "status": ceo.status,
                        "reports": nodes[0]["reports"]}


def test_agents_read_it_too_in_one_query(agent_client, company):
    boss = AgentFactory(company=company, name="Boss")
    for n in range(10):
        AgentFactory(company=company, name=f"Report {n}", reports_to=boss)
    org(agent_client, company)  # the key's first use of the minute writes its last-used time; count the reads after it
    with CaptureQueriesContext(connection) as few:
        org(agent_client, company)
    for n in range(10, 30):
        AgentFactory(company=company, name=f"Report {n}", reports_to=boss)
    with CaptureQueriesContext(connection) as many:
        nodes = org(agent_client, company)
    assert len(many) == len(few)
    assert len(next(n for n in nodes if n["name"] == "Boss")["reports"]) == 30


def test_a_reporting_cycle_written_past_the_services_still_shows_everyone_once(board_client, company):
    a = AgentFactory(company=company, name="A")
    b = AgentFactory(company=company, name="B", reports_to=a)
    Agent.objects.filter(pk=a.pk).update(reports_to=b)
    nodes = org(board_client, company)
    assert shape(nodes) == [("A", [("B", [])])]


def test_another_companys_chart_is_a_404(board_client):
    response = board_client.get(f"/api/companies/{CompanyFactory().pk}/org")
    assert response.status_code == 404, response.content
