"""The query-counting GETs used by the constant-query-count tests (API bodies and console pages)."""
from django.db import connection
from django.test.utils import CaptureQueriesContext


def count_queries(client, path, expected_status=200):
    """(statements the request ran, its JSON body), after checking the status."""
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(path)
    assert response.status_code == expected_status, response.content[:500]
    return len(ctx.captured_queries), response.json()


def count_page_queries(client, path) -> int:
    """Statements a page's GET ran, after checking it answered 200."""
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(path)
    assert response.status_code == 200, response.content[:500]
    return len(ctx.captured_queries)
