"""PostgreSQL prepares the statements a connection repeats (DATABASE_PREPARE_THRESHOLD)."""
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from issues.models import Issue
from paperclip.core.database_options import prepared_statements_options
from tests.factories import IssueFactory


def test_the_threshold_turns_on_server_side_binding():
    assert prepared_statements_options("5") == {"server_side_binding": True, "prepare_threshold": 5}
    assert prepared_statements_options(" 1 ") == {"server_side_binding": True, "prepare_threshold": 1}
    assert prepared_statements_options("") == {"server_side_binding": True, "prepare_threshold": 5}  # unset


@pytest.mark.parametrize("off", ["off", "OFF", "false", "none"])
def test_off_keeps_client_side_binding(off):
    assert prepared_statements_options(off) == {}


@pytest.mark.parametrize("bad", ["-3", "five", "2.5"])
def test_a_bad_threshold_refuses_to_start_naming_the_variable(bad):
    with pytest.raises(ImproperlyConfigured, match="DATABASE_PREPARE_THRESHOLD"):
        prepared_statements_options(bad)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements are PostgreSQL's")
@pytest.mark.django_db
def test_a_repeated_statement_is_prepared_on_its_connection():
    threshold = connection.settings_dict["OPTIONS"].get("prepare_threshold")
    if threshold is None:
        pytest.skip("DATABASE_PREPARE_THRESHOLD=off in this environment: nothing is prepared")
    issue = IssueFactory()

    def prepared() -> int:
        """Prepared statements of this connection that read an issue's key by its title."""
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
                           ['%FROM "issues_issue" WHERE%NOT ("issues_issue"."title" = $%'])
            return cursor.fetchone()[0]

    probe = Issue.objects.filter(pk=issue.pk).exclude(title="probe").values_list("pk", flat=True)
    for _ in range(threshold):
        assert list(probe.all()) == [issue.pk]
    assert prepared() == 0  # not yet: psycopg prepares after `threshold` runs
    assert list(probe.all()) == [issue.pk]
    assert prepared() == 1  # its parameters are bound by the server, so every run is one statement
