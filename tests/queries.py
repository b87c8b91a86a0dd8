"""The one query-counting GET used by the constant-query-count tests."""
from django.db import connection
from django.test.utils import CaptureQueriesContext


def count_queries(client, path, expected_status=200):
    """(statements the request ran, its JSON body), after checking the status."""
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(path)
    assert response.status_code == expected_status, response.content[:500]
    return len(ctx.captured_queries), response.json()
