"""Pytest helpers for the Linear sandbox (:mod:`connectors.sandbox.linear`).

Use from any test module::

    from tests.linear_sandbox import linear_sandbox, linear_adapter_for  # noqa: F401  (fixture import)

    def test_something(linear_sandbox):
        adapter = linear_adapter_for(linear_sandbox)
        issue = linear_sandbox.create_issue("Hello", team=SANDBOX_TEAM)
        ...

``linear_sandbox`` is a started :class:`LinearSandbox` on 127.0.0.1 with a random port, team
``SANDBOX_TEAM`` (default workflow states Triage, Backlog, Todo, In Progress, In Review, Done, Canceled,
Duplicate), API key ``SANDBOX_TOKEN``, deliveries signed with ``SANDBOX_WEBHOOK_SECRET`` and recorded
in ``sandbox.deliveries`` (set ``sandbox.webhook_url`` to send them), synchronous delivery and the
deterministic clock. It is stopped after the test."""
from __future__ import annotations

import pytest

from connectors.providers.base import AdapterConfig
from connectors.providers.linear import LinearAdapter
from connectors.sandbox.linear import LinearSandbox

SANDBOX_TEAM = "ENG"
SANDBOX_TOKEN = "lin_api_sandbox_test_token"
SANDBOX_WEBHOOK_SECRET = "linear-sandbox-webhook-secret"
SERVICE_USER = "Paperclip Bot"
DEFAULT_STATE_MAPPING = {
    "types": {"triage": "backlog", "backlog": "backlog", "unstarted": "backlog", "started": "active",
              "completed": "terminal", "canceled": "terminal", "duplicate": "terminal"},
    "states": {"In Review": "review"},
}


def linear_adapter_for(sandbox: LinearSandbox, *, containers=(SANDBOX_TEAM,), token: str | None = SANDBOX_TOKEN,
                       webhook_secret: str | None = SANDBOX_WEBHOOK_SECRET, state_mapping=None,
                       service_account_id: str | None = None, **kwargs) -> LinearAdapter:
    """An adapter pointed at ``sandbox`` (``kwargs`` go to the adapter: ``page_size``, ``clock``).
    ``service_account_id`` defaults to the sandbox's API user id."""
    config = AdapterConfig(base_url=sandbox.base_url, containers=tuple(containers),
                           state_mapping=DEFAULT_STATE_MAPPING if state_mapping is None else state_mapping,
                           credentials=token, webhook_secret=webhook_secret,
                           service_account_id=service_account_id or sandbox.service_user["id"], timeout=5.0)
    return LinearAdapter(config, **kwargs)


@pytest.fixture
def linear_sandbox():
    with LinearSandbox(teams=(SANDBOX_TEAM,), token=SANDBOX_TOKEN, service_user=SERVICE_USER,
                       webhook_secret=SANDBOX_WEBHOOK_SECRET) as sandbox:
        yield sandbox
