"""Pytest helpers for the Jira sandbox (:mod:`connectors.sandbox.jira`).

Use from any test module::

    from tests.jira_sandbox import jira_sandbox, jira_adapter_for  # noqa: F401  (fixture import)

    def test_something(jira_sandbox):
        adapter = jira_adapter_for(jira_sandbox)
        issue = jira_sandbox.create_issue("Hello", project=SANDBOX_PROJECT)
        ...

``jira_sandbox`` is a started :class:`JiraSandbox` on 127.0.0.1 with a random port, project
``SANDBOX_PROJECT`` (workflow To Do/new, In Progress, In Review, Blocked/indeterminate, Done/done;
transitions named "Back to do", "Start progress", "Request review", "Block", "Resolve"), basic auth
``SANDBOX_EMAIL:SANDBOX_TOKEN``, deliveries signed with ``SANDBOX_WEBHOOK_SECRET`` (``X-Hub-Signature``)
and recorded in ``sandbox.deliveries``, synchronous delivery, the deterministic clock, and it is
stopped after the test."""
from __future__ import annotations

import pytest

from connectors.providers.base import AdapterConfig
from connectors.providers.jira import JiraAdapter
from connectors.sandbox.jira import JiraSandbox

SANDBOX_PROJECT = "ABC"
SANDBOX_EMAIL = "paperclip-bot@example.com"
SANDBOX_TOKEN = "jira-sandbox-test-token"
SANDBOX_WEBHOOK_SECRET = "jira-sandbox-webhook-secret"
DEFAULT_STATE_MAPPING = {
    "statuses": {"In Review": "review", "Blocked": "blocked"},
    "categories": {"new": "backlog", "indeterminate": "active", "done": "terminal"},
}


def jira_adapter_for(sandbox: JiraSandbox, *, containers=(SANDBOX_PROJECT,), credentials: str | None = None,
                     webhook_secret: str | None = SANDBOX_WEBHOOK_SECRET, state_mapping=None,
                     service_account_id: str | None = None, **kwargs) -> JiraAdapter:
    """An adapter pointed at ``sandbox`` (``kwargs`` go to the adapter, e.g. ``page_size=2``).
    ``service_account_id`` defaults to the sandbox API user's accountId."""
    config = AdapterConfig(base_url=sandbox.base_url, containers=tuple(containers),
                           state_mapping=DEFAULT_STATE_MAPPING if state_mapping is None else state_mapping,
                           credentials=credentials or sandbox.credentials, webhook_secret=webhook_secret,
                           service_account_id=service_account_id or sandbox.service_user["accountId"], timeout=5.0)
    return JiraAdapter(config, **kwargs)


@pytest.fixture
def jira_sandbox():
    with JiraSandbox(projects=(SANDBOX_PROJECT,), email=SANDBOX_EMAIL, token=SANDBOX_TOKEN,
                     webhook_secret=SANDBOX_WEBHOOK_SECRET) as sandbox:
        yield sandbox
