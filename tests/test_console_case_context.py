"""Cases in the operator console's context, with the Django test client on the real database: the
issue page names the task's case (as its primary or a linked task) with the case's current
workflow and phase, and the case page's handoff table shows a kept phase as kept (not cleared)."""
import re

import pytest
from django.urls import reverse

from cases.models import Case, CaseHandoff
from issues.models import Issue
from tests.factories import AgentFactory, IssueFactory
from tests.test_case_handoffs import definition, handoff, kickoff
from tests.test_console import console, fast_password_hashing  # noqa: F401  (fixtures)


@pytest.fixture
def agents(cases_company):
    return [AgentFactory(company=cases_company, name=name) for name in ("ada", "bob")]


def page(client, url) -> str:
    response = client.get(url)
    assert response.status_code == 200, response.content[:500]
    return response.content.decode()


def section(html, element_id) -> str:
    """The HTML of the element with ``element_id`` up to its closing tag (the panels are flat sections)."""
    match = re.search(rf'<(section|tr|div)[^>]*id="{element_id}".*?</\1>', html, re.S)
    assert match, f"#{element_id} not on the page"
    return match.group(0)


def issue_page(client, issue_id) -> str:
    return page(client, reverse("console:issue-detail", args=[Issue.objects.get(pk=issue_id).identifier]))


def plain(html) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


def test_the_primary_tasks_page_shows_its_case_workflow_and_phase(console, board_client, cases_company, agents):
    ada, bob = agents
    intake = definition(board_client, cases_company, "Intake", "# Intake\n")
    review = definition(board_client, cases_company, "Review", "# Review\n")
    case_id = kickoff(board_client, cases_company, ada, workflowId=intake["id"], phase="intake").json()["caseId"]
    case = Case.objects.get(pk=case_id)

    panel = section(issue_page(console, case.primary_task_id), "case-panel")
    assert case.identifier in panel and "Claim 7" in panel
    assert reverse("cases_console:case-detail", args=[case.identifier]) in panel
    assert "primary task" in plain(section(panel, f"case-{case.pk}"))
    assert plain(re.search(r'class="case-workflow">.*?</dd>', panel, re.S).group(0)).endswith("Intake")
    assert reverse("cases_console:workflow-detail", args=[intake["id"]]) in panel
    assert ">intake<" in panel

    # The case moves on (new workflow and phase): the task's page follows the case.
    moved = handoff(board_client, cases_company, case_id, bob, workflowId=review["id"], phase="review")
    assert moved.status_code == 201 and moved.json()["status"] == "applied", moved.content
    panel = section(issue_page(console, case.primary_task_id), "case-panel")
    assert reverse("cases_console:workflow-detail", args=[review["id"]]) in panel
    assert ">Review<" in panel and ">review<" in panel and ">intake<" not in panel


def test_a_linked_tasks_page_shows_the_case_with_its_role(console, board_client, cases_company, agents):
    ada, _ = agents
    intake = definition(board_client, cases_company, "Intake", "# Intake\n")
    case_id = kickoff(board_client, cases_company, ada, workflowId=intake["id"], phase="triage").json()["caseId"]
    case = Case.objects.get(pk=case_id)
    evidence = IssueFactory(company=cases_company, title="Collect the receipts")
    linked = board_client.post(f"/api/cases/{case_id}/links", {"issueId": str(evidence.pk), "role": "reference"},
                               format="json")
    assert linked.status_code == 201, linked.content

    entry = plain(section(section(issue_page(console, evidence.pk), "case-panel"), f"case-{case.pk}"))
    assert case.identifier in entry and "reference link" in entry
    assert "Intake" in entry and "triage" in entry and "primary task" not in entry


def test_no_case_panel_for_an_ordinary_task_or_when_cases_are_off(console, board_client, cases_company, agents):
    ada, _ = agents
    ordinary = IssueFactory(company=cases_company, title="Plain work")
    assert 'id="case-panel"' not in issue_page(console, ordinary.pk)
    case_id = kickoff(board_client, cases_company, ada, workflowDocumentText="w").json()["caseId"]
    task_id = Case.objects.get(pk=case_id).primary_task_id
    assert 'id="case-panel"' in issue_page(console, task_id)  # an inline workflow: no definition named
    cases_company.enable_cases = False
    cases_company.save(update_fields=["enable_cases"])
    assert 'id="case-panel"' not in issue_page(console, task_id)


def test_the_handoff_table_shows_a_kept_phase_as_kept(console, board_client, cases_company, agents):
    ada, bob = agents
    intake = definition(board_client, cases_company, "Intake", "# Intake\n")
    case_id = kickoff(board_client, cases_company, ada, workflowId=intake["id"], phase="intake").json()["caseId"]
    kept = handoff(board_client, cases_company, case_id, bob).json()  # no phase given: the case keeps "intake"
    changed = handoff(board_client, cases_company, case_id, ada, phase="review").json()
    cleared = handoff(board_client, cases_company, case_id, bob, phase="").json()
    assert CaseHandoff.objects.get(pk=kept["id"]).set_phase is False
    assert Case.objects.get(pk=case_id).phase == ""

    html = page(console, reverse("cases_console:case-detail", args=[Case.objects.get(pk=case_id).identifier]))

    def phase_cell(handoff_id):
        row = section(html, f"handoff-{handoff_id}")
        return plain(re.search(r'<td class="handoff-phase">.*?</td>', row, re.S).group(0))

    assert phase_cell(kept["id"]) == "intake kept"
    assert phase_cell(changed["id"]) == "review (was intake)"
    assert phase_cell(cleared["id"]) == "cleared (was review)"
    kickoff_id = CaseHandoff.objects.get(case_id=case_id, kickoff=True).pk
    assert phase_cell(kickoff_id) == "intake"
