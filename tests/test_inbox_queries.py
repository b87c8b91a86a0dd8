"""Agent inbox query count is constant for 10 and 1,000 assigned issues; the inbox is sorted by
priority (critical first) then age (oldest first)."""
import itertools
from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from issues.choices import PRIORITY_RANK
from issues.models import Company, Issue
from tests.factories import AgentFactory, IssueFactory

INBOX_STATUSES = ("todo", "in_progress", "in_review", "blocked")
PRIORITIES = ("low", "critical", "medium", "high")  # deliberately not in rank order
BASE_TIME = timezone.now() - timedelta(days=30)


def inbox_url(company, agent, limit=1000):
    return (f"/api/companies/{company.pk}/issues?assigneeAgentId={agent.pk}"
            f"&status={','.join(INBOX_STATUSES)}&limit={limit}")


def add_assigned_issues(company, agent, count, run):
    """bulk_create ``count`` inbox issues with mixed priorities and statuses and distinct ages.

    Ages are interleaved with priorities so that neither insertion order nor creation time
    alone gives the inbox order. Returns the issues in the order the inbox must list them.
    """
    start = company.issue_counter
    issues = []
    for i in range(count):
        number = start + i + 1
        priority = PRIORITIES[(i * 7) % len(PRIORITIES)]
        status = INBOX_STATUSES[i % len(INBOX_STATUSES)]
        lock = {"checkout_run": run, "execution_run": run, "execution_locked_at": BASE_TIME} \
            if status == "in_progress" else {}
        issues.append(Issue(company=company, number=number, identifier=f"{company.issue_prefix}-{number}",
                            title=f"Inbox issue {number}", status=status, priority=priority,
                            priority_rank=PRIORITY_RANK[priority], assignee_agent=agent, **lock))
    Issue.objects.bulk_create(issues, batch_size=250)
    # auto_now_add stamps every row "now": give each a distinct age, later numbers older.
    for issue in issues:
        issue.created_at = BASE_TIME - timedelta(minutes=issue.number)
    Issue.objects.bulk_update(issues, ["created_at"], batch_size=250)
    Company.objects.filter(pk=company.pk).update(issue_counter=start + count)
    company.refresh_from_db(fields=["issue_counter"])
    return sorted(issues, key=lambda issue: (issue.priority_rank, issue.created_at))


def add_noise(company, agent, other_agent, other_company):
    """Issues that must never show in the agent's inbox."""
    IssueFactory(company=company, assignee_agent=agent, status="done", priority="critical", priority_rank=0)
    IssueFactory(company=company, assignee_agent=agent, status="backlog", priority="critical", priority_rank=0)
    IssueFactory(company=company, assignee_agent=agent, status="cancelled", priority="critical", priority_rank=0)
    IssueFactory(company=company, assignee_agent=other_agent, status="todo", priority="critical", priority_rank=0)
    IssueFactory(company=company, assignee_agent=None, status="todo", priority="critical", priority_rank=0)
    IssueFactory(company=other_company, status="todo", priority="critical", priority_rank=0)


def get_inbox(client, url):
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url)
    assert response.status_code == 200, response.content[:500]
    return response.json(), ctx


def test_inbox_query_count_is_the_same_for_10_and_1000_assigned_issues(agent_client, company, make_agent_client):
    agent = agent_client.agent
    other = AgentFactory(company=company)
    other_company = make_agent_client().agent.company
    add_noise(company, agent, other, other_company)
    url = inbox_url(company, agent)
    expected = add_assigned_issues(company, agent, 10, agent_client.run)
    agent_client.get(url)  # first request of the key records last_used_at; measure steady state

    small, small_queries = get_inbox(agent_client, url)

    expected = sorted([*expected, *add_assigned_issues(company, agent, 990, agent_client.run)],
                      key=lambda issue: (issue.priority_rank, issue.created_at))
    large, large_queries = get_inbox(agent_client, url)

    assert len(small) == 10
    assert len(large) == 1000
    assert len(large_queries) == len(small_queries), (
        "inbox queries grew with the number of issues:\n"
        + "\n".join(q["sql"][:200] for q in large_queries.captured_queries))
    assert len(small_queries) <= 4, [q["sql"][:200] for q in small_queries.captured_queries]
    assert [row["id"] for row in large] == [str(issue.pk) for issue in expected]
    assert {row["assigneeAgentId"] for row in large} == {str(agent.pk)}
    assert {row["status"] for row in large} == set(INBOX_STATUSES)


@pytest.mark.parametrize("count", [10, 1000])
def test_inbox_returns_every_assigned_issue_in_priority_then_age_order(agent_client, company, count):
    agent = agent_client.agent
    expected = add_assigned_issues(company, agent, count, agent_client.run)
    rows, _ = get_inbox(agent_client, inbox_url(company, agent))

    assert len(rows) == count
    assert [row["identifier"] for row in rows] == [issue.identifier for issue in expected]
    ranks = [PRIORITY_RANK[row["priority"]] for row in rows]
    assert ranks == sorted(ranks)
    assert rows[0]["priority"] == "critical" and rows[-1]["priority"] == "low"
    for _, group in itertools.groupby(rows, key=lambda row: row["priority"]):
        created = [datetime.fromisoformat(row["createdAt"]) for row in group]
        assert created == sorted(created), "within a priority the oldest issue comes first"


def test_mixed_priorities_are_sorted_critical_first_then_oldest_first(agent_client, company, make_agent_client):
    """Issues made one by one (not in any useful order) come back critical → low, oldest first."""
    agent = agent_client.agent
    other = AgentFactory(company=company)
    add_noise(company, agent, other, make_agent_client().agent.company)
    plan = [  # (title, priority, status, age in hours)
        ("low-old", "low", "todo", 50),
        ("medium-new", "medium", "in_review", 1),
        ("critical-new", "critical", "todo", 2),
        ("high-old", "high", "blocked", 40),
        ("critical-old", "critical", "blocked", 30),
        ("low-new", "low", "in_review", 3),
        ("medium-old", "medium", "todo", 20),
        ("high-new", "high", "todo", 4),
        ("critical-mid", "critical", "in_review", 10),
    ]
    now = timezone.now()
    for title, priority, status, hours in plan:
        issue = IssueFactory(company=company, title=title, status=status, priority=priority,
                             priority_rank=PRIORITY_RANK[priority], assignee_agent=agent)
        Issue.objects.filter(pk=issue.pk).update(created_at=now - timedelta(hours=hours))

    rows, _ = get_inbox(agent_client, inbox_url(company, agent))

    assert [row["title"] for row in rows] == [
        "critical-old", "critical-mid", "critical-new",
        "high-old", "high-new",
        "medium-old", "medium-new",
        "low-old", "low-new",
    ]


def test_inbox_limit_and_offset_page_through_the_same_order(agent_client, company):
    agent = agent_client.agent
    expected = add_assigned_issues(company, agent, 30, agent_client.run)
    base = inbox_url(company, agent, limit=12)
    pages = [get_inbox(agent_client, f"{base}&offset={offset}")[0] for offset in (0, 12, 24)]
    assert [len(page) for page in pages] == [12, 12, 6]
    assert [row["id"] for page in pages for row in page] == [str(issue.pk) for issue in expected]


def test_inbox_limit_is_capped_at_1000(agent_client, company):
    agent = agent_client.agent
    add_assigned_issues(company, agent, 1005, agent_client.run)
    rows, _ = get_inbox(agent_client, inbox_url(company, agent, limit=5000))
    assert len(rows) == 1000
