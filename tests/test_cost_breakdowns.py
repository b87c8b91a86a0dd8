"""Upstream's cost breakdowns (§5.6, 2026): ``by-provider``, ``by-biller``, ``by-agent-model`` and
``window-spend``, over the same ledger and ``from``/``to`` window as the summary; each one query
whatever the ledger's size."""
from datetime import timedelta

from django.utils import timezone

from tests.factories import AgentFactory, RunFactory
from tests.queries import count_queries
from tests.test_api_org import event_body, url
from tests.test_errors import assert_error


def report(client, company, name, query=""):
    response = client.get(url(company, f"/costs/{name}{query}"))
    assert response.status_code == 200, response.content
    return response.json()


def spend(client, company, agent, **fields):
    response = client.post(url(company, "/cost-events"), event_body(agent, **fields), format="json")
    assert response.status_code == 201, response.content


def ledger(client, company):
    ada, bob = AgentFactory(company=company, name="ada"), AgentFactory(company=company, name="bob")
    run = RunFactory(agent=ada, status="succeeded", finished_at=timezone.now())
    spend(client, company, ada, provider="anthropic", model="opus", costCents=50, inputTokens=100,
          billingType="metered_api", heartbeatRunId=str(run.pk))
    spend(client, company, ada, provider="anthropic", model="opus", costCents=30, inputTokens=10,
          billingType="metered_api", heartbeatRunId=str(run.pk))
    spend(client, company, bob, provider="anthropic", model="sonnet", costCents=5, outputTokens=7,
          billingType="subscription_included")
    spend(client, company, bob, provider="openai", biller="openrouter", model="gpt", costCents=40, cachedInputTokens=3)
    return ada, bob


def test_by_provider_groups_provider_biller_billing_type_and_model(board_client, company):
    ledger(board_client, company)

    rows = report(board_client, company, "by-provider")

    assert [(r["provider"], r["biller"], r["billingType"], r["model"], r["costCents"]) for r in rows] == [
        ("anthropic", "anthropic", "metered_api", "opus", 80),
        ("openai", "openrouter", "unknown", "gpt", 40),
        ("anthropic", "anthropic", "subscription_included", "sonnet", 5)]
    assert (rows[0]["inputTokens"], rows[0]["apiRunCount"], rows[0]["subscriptionRunCount"]) == (110, 1, 0)
    assert (rows[2]["subscriptionOutputTokens"], rows[1]["cachedInputTokens"]) == (7, 3)


def test_by_biller_counts_providers_and_models(board_client, company):
    ledger(board_client, company)

    rows = report(board_client, company, "by-biller")

    assert [(r["biller"], r["costCents"], r["providerCount"], r["modelCount"]) for r in rows] == [
        ("anthropic", 85, 1, 2), ("openrouter", 40, 1, 1)]


def test_by_agent_model_is_per_agent_and_model_in_provider_order(board_client, company):
    ada, bob = ledger(board_client, company)

    rows = report(board_client, company, "by-agent-model")

    assert [(r["agentName"], r["agentId"], r["provider"], r["model"], r["costCents"]) for r in rows] == [
        ("ada", str(ada.pk), "anthropic", "opus", 80), ("bob", str(bob.pk), "anthropic", "sonnet", 5),
        ("bob", str(bob.pk), "openai", "gpt", 40)]


def test_window_spend_sums_each_provider_over_5h_24h_and_7d(board_client, company):
    agent = AgentFactory(company=company)
    now = timezone.now()
    for hours, cents, biller in ((1, 1, "anthropic"), (10, 10, "anthropic"), (100, 100, "bedrock"),
                                 (200, 1000, "anthropic")):  # the last is older than every window
        spend(board_client, company, agent, provider="anthropic", biller=biller, costCents=cents,
              occurredAt=(now - timedelta(hours=hours)).isoformat())
    spend(board_client, company, agent, provider="openai", costCents=3,
          occurredAt=(now - timedelta(hours=2)).isoformat())

    rows = report(board_client, company, "window-spend")

    assert [(r["window"], r["windowHours"], r["provider"], r["biller"], r["costCents"]) for r in rows] == [
        ("5h", 5, "openai", "openai", 3), ("5h", 5, "anthropic", "anthropic", 1),
        ("24h", 24, "anthropic", "anthropic", 11), ("24h", 24, "openai", "openai", 3),
        ("7d", 168, "anthropic", "mixed", 111), ("7d", 168, "openai", "openai", 3)]


def test_the_window_narrows_the_breakdowns_and_a_bad_date_is_a_400(board_client, company):
    agent = AgentFactory(company=company)
    spend(board_client, company, agent, costCents=9, occurredAt="2026-01-15T12:00:00Z")
    spend(board_client, company, agent, costCents=4)

    assert [r["costCents"] for r in report(board_client, company, "by-biller")] == [4]  # this month by default
    assert [r["costCents"] for r in report(board_client, company, "by-provider", "?from=2026-01-01&to=2026-01-31")] \
        == [9]
    for name in ("by-provider", "by-biller", "by-agent-model"):
        assert_error(board_client.get(url(company, f"/costs/{name}?from=yesterday")), 400, fields=("from",))


def test_agents_read_the_breakdowns_in_a_constant_number_of_queries(board_client, make_agent_client, company):
    agent_client = make_agent_client(company=company)
    ledger(board_client, company)
    agent_client.get(url(company, "/costs/summary"))  # the key's first use is recorded once
    counts = {name: count_queries(agent_client, url(company, f"/costs/{name}"))[0]
              for name in ("by-provider", "by-biller", "by-agent-model", "window-spend")}
    for i in range(20):
        spend(board_client, company, AgentFactory(company=company), provider=f"p{i}", model=f"m{i}")
    assert {name: count_queries(agent_client, url(company, f"/costs/{name}"))[0] for name in counts} == counts
