"""Shared helpers for the connector test modules (webhook posting with on-commit execution)."""
from __future__ import annotations

import pytest
from django.test.utils import CaptureQueriesContext  # noqa: F401  (re-exported for test modules)

from tests.connector_factories import SECRET, make_instance  # noqa: F401
from tests.connector_fakes import sign


@pytest.fixture
def fast_retries(settings):
    settings.CONNECTORS = {**settings.CONNECTORS, "RETRY_BASE_SECONDS": 0.0}
    return settings


def post_webhook(client, instance, body: bytes, *, secret: str | None = SECRET, signature: str | None = None,
                 capture=None, **extra):
    headers = {}
    if signature is not None:
        headers["HTTP_X_FAKE_SIGNATURE"] = signature
    elif secret is not None:
        headers["HTTP_X_FAKE_SIGNATURE"] = sign(secret, body)
    headers.update(extra)
    url = f"/api/connectors/{instance.pk}/webhook"
    if capture is None:
        return client.post(url, data=body, content_type="application/json", **headers)
    with capture(execute=True):
        return client.post(url, data=body, content_type="application/json", **headers)
