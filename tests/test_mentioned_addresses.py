"""What a description mentions (§6.3 dedupe by reference): PostgreSQL's index of mentioned
addresses (migration 0015's SQL function) agrees with the regular expression SQLite's search uses,
on generated texts full of near-misses; addresses the index cannot hold are searched instead."""
import random
import re

import pytest
from django.db import connection

from issues import mentioned_addresses
from issues.mentioned_addresses import indexed, mention_pattern

ADDRESSES = ["https://x.io/a/1", "https://x.io/a/12", "https://x.io/a", "http://x.io/a/1", "https://x.io",
             "https://tracker.example/acme/ENG-1", "https://y.io/b?u=1", "https://x.io/a/1/", "https://x.io/a/1#c"]
PIECES = ["https://", "http://", "x.io", "y.io", "tracker.example", "/acme", "/ENG-1", "/ENG-12", "/a", "/b",
          "/1", "/12", "2", "#c", "#c-2", "?u=", "1", "-", "_", ".", ",", ")", "(", "]", "[", "<", ">", " ", "\n",
          "\t", "é", "see ", "HTTPS://", "x", "/", ":", "%20", "\u00a0"]


def _text(rng):
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 14)))


def test_only_an_indexable_address_is_answered_by_the_index():
    assert indexed("https://github.com/o/r/issues/1", "postgresql")
    assert indexed("http://x.io/a?b=1#c", "postgresql")
    assert not indexed("https://github.com/o/r/issues/1", "sqlite")  # no such index there
    for address in ["", "HTTPS://x.io/a", "ftp://x.io/a", "https://x.io/a b", "https://x.io/é",
                    "https://x.io/?u=https://y.io/1", "https://x.io/http://y"]:
        assert not indexed(address, "postgresql"), address


@pytest.mark.django_db
@pytest.mark.skipif(connection.vendor != "postgresql", reason="the mentions index is PostgreSQL's (SQLite searches)")
def test_the_index_agrees_with_the_search_on_generated_texts():
    rng = random.Random(1906)
    texts = [_text(rng) for _ in range(3000)]
    texts += [f"{prefix}{address}{suffix}" for address in ADDRESSES for prefix in ("", "x", "(", "https://q.io/?u=")
              for suffix in ("", "2", "-", "_", "/", "#", ")", ".", " ", "http://z.io", "https://z.io", "é")]
    assert all(indexed(address, "postgresql") for address in ADDRESSES)
    with connection.cursor() as cursor:
        cursor.execute("SELECT t, paperclip_mentioned_addresses(t) FROM unnest(%s::text[]) AS t", [texts])
        found = dict(cursor.fetchall())
    disagree = [(text, address) for text in texts for address in ADDRESSES
                if (address in found[text]) != (re.search(mention_pattern(address), text) is not None)]
    assert disagree == []
    assert sum(address in found[text] for text in texts for address in ADDRESSES) > 200  # the property has cases


@pytest.mark.django_db
@pytest.mark.skipif(connection.vendor != "postgresql", reason="the mentions index is PostgreSQL's (SQLite searches)")
def test_a_lookup_by_mention_is_an_index_probe():
    """The planner answers the §6.3 condition from the expression index (no scan of descriptions)."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN SELECT id FROM issues_issue s WHERE "
                       + mentioned_addresses.indexed_condition("s.description"), ["https://x.io/a/1"])
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "issue_mentioned_addresses_idx" in plan, plan


@pytest.mark.django_db
@pytest.mark.skipif(connection.vendor != "postgresql", reason="the mentions index is PostgreSQL's (SQLite searches)")
def test_the_reference_lookup_stays_index_probes_when_statistics_lag_a_burst_of_imports():
    """§6.3's reference lookup runs on every import. A burst of imports outruns ANALYZE (and, between
    vacuums, GIN's pending list would grow by an entry per issue written): the lookup must still be
    index probes, never the mentions function called on each of the company's issues."""
    from django.test.utils import CaptureQueriesContext

    from connectors.providers.base import ExternalState, ExternalTask
    from connectors.services import links
    from issues.models import Issue
    from tests.connector_factories import make_instance
    from tests.factories import CompanyFactory

    company = CompanyFactory()
    instance, _ = make_instance(company)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE issues_issue")  # the statistics of a company with no issues yet
    url = "https://github.com/acme/tracker/issues/1207"
    descriptions = [f"Imported from https://github.com/acme/tracker/issues/{n}" for n in range(1000, 1400)]
    Issue.objects.bulk_create(Issue(company=company, number=n, identifier=f"{company.issue_prefix}-{n}",
                                    title=f"Issue {n}", description=text, status="todo")
                              for n, text in enumerate(descriptions, start=1))
    task = ExternalTask(provider_key="github", external_id="1207", external_key="#1207", title="t", description="",
                        state=ExternalState(name="open", category="active"), url=url)

    with CaptureQueriesContext(connection) as queries:
        found = links._referencing_issue(instance, task)
    assert found is not None and found.description.endswith("/issues/1207")
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + queries.captured_queries[-1]["sql"])
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "issue_mentioned_addresses_idx" in plan and "issue_origin_idx" in plan, plan
    filters = [line for line in plan.splitlines() if "Filter:" in line and "Recheck" not in line]
    assert not any("paperclip_mentioned_addresses" in line for line in filters), plan
