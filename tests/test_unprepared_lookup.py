"""The §6.3 reference lookup is planned on every run, never server-side prepared: a generic plan
settled on while a company has a few issues stays a scan of all of them as a burst of imports grows
it (measured: 9 imports/s at 5,000). Every other repeated statement is still prepared."""
from types import SimpleNamespace

import pytest
from django.db import connection

from connectors.services import links
from paperclip.core import rows
from tests.connector_factories import make_instance
from tests.factories import IssueFactory

pytestmark = pytest.mark.skipif(connection.vendor != "postgresql",
                                reason="server-side prepared statements are PostgreSQL's")


def prepared_statements() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def test_the_reference_lookup_is_planned_on_every_run_while_others_are_prepared(company):
    instance, _ = make_instance(company)
    IssueFactory(company=company, description="see https://tracker.example/t/7")
    task = SimpleNamespace(external_id="42", url="https://tracker.example/t/42")
    threshold = connection.connection.prepare_threshold
    assert threshold, "the suite runs with DATABASE_PREPARE_THRESHOLD on"
    for _ in range(threshold + 2):
        assert links._referencing_issue(instance, task) is None
        assert rows.fetch_row("SELECT %s::int + 1 AS control", [1]) == (2,)
    statements = prepared_statements()
    assert any("AS control" in s for s in statements)  # prepares are on for everything else
    assert not any("origin_id" in s for s in statements)  # the lookup (origin probe) is not among them
    assert connection.connection.prepare_threshold == threshold  # restored after each lookup
    found = SimpleNamespace(external_id="7", url="https://tracker.example/t/7")
    assert links._referencing_issue(instance, found) is not None  # the lookup still finds what it should
