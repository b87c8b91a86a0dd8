"""Shared helpers for the connector test modules: webhook posting with on-commit execution, and what a
round trip does on Paperclip's side (an issue change, an agent's comment or opened pull request, the
imported tracker comments).
``tracker`` is any harness with a ``capture`` (django_capture_on_commit_callbacks)."""
from __future__ import annotations

import pytest
from django.test.utils import CaptureQueriesContext  # noqa: F401  (re-exported for test modules)

from tests.connector_factories import SECRET, make_instance  # noqa: F401
from issues.actors import SYSTEM, Actor
from issues.models import Comment
from issues.services.issues import issue_update
from issues.services.thread import comment_create
from issues.services.work_products import work_product_create
from tests.connector_fakes import sign
from tests.factories import RunFactory


@pytest.fixture
def fast_retries(settings):
    settings.CONNECTORS = {**settings.CONNECTORS, "RETRY_BASE_SECONDS": 0.0}
    return settings


def delivery_headers(delivery) -> dict:
    """A sandbox delivery's headers as Django test-client ``HTTP_*`` keyword arguments (the body's own
    content type and length are the client's)."""
    return {"HTTP_" + k.upper().replace("-", "_"): v for k, v in delivery.headers.items()
            if k.lower() not in ("content-type", "content-length")}


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


def update(tracker, issue, **changes):
    """An issue change by the system, with what it queues on commit (outbound writes) run."""
    with tracker.capture(execute=True):
        return issue_update(actor=SYSTEM, issue=issue, changes=changes)[0]


def agent_says(tracker, agent, issue, body):
    """A comment by ``agent`` during a run of its own, with what it queues on commit run."""
    run = RunFactory(agent=agent, issue=issue)
    with tracker.capture(execute=True):
        return comment_create(actor=Actor(agent=agent, run_header=str(run.pk)), issue=issue, body=body)


PR_URL = "https://github.com/octo-org/octo-repo/pull/12"


def agent_opens_pr(tracker, agent, issue, title="Fix the config loader", url=PR_URL):
    """The "PR opened" milestone (§10.2, posted to the tracker at once): ``agent`` records a pull request
    during a run of its own, with what it queues on commit run."""
    run = RunFactory(agent=agent, issue=issue)
    with tracker.capture(execute=True):
        return work_product_create(actor=Actor(agent=agent, run_header=str(run.pk)), issue=issue,
                                   kind="pull_request", title=title, url=url)


def external_comments(issue):
    """The tracker comments imported onto ``issue``, oldest first."""
    return Comment.objects.filter(issue=issue, provenance__kind="external_comment").order_by("created_at", "id")
