"""Pytest helpers for the GitHub sandbox (:mod:`connectors.sandbox.github`).

Use from any test module::

    from tests.github_sandbox import github_sandbox, github_adapter_for  # noqa: F401  (fixture import)

    def test_something(github_sandbox):
        adapter = github_adapter_for(github_sandbox)
        issue = github_sandbox.open_issue("Hello")
        ...

``github_sandbox`` is a started :class:`GitHubSandbox` on 127.0.0.1 with a random port, repository
``SANDBOX_REPO``, token ``SANDBOX_TOKEN``, a record-only hook signed with ``SANDBOX_WEBHOOK_SECRET``
(``sandbox.deliveries`` holds every signed delivery; add a real receiver with ``add_hook(url, secret)``),
synchronous deliveries and the deterministic clock. It is stopped after the test."""
from __future__ import annotations

import pytest

from connectors.providers.base import AdapterConfig
from connectors.providers.github import GitHubIssuesAdapter
from connectors.sandbox.github import GitHubSandbox

SANDBOX_REPO = "octo-org/octo-repo"
SANDBOX_TOKEN = "sandbox-test-token"
SANDBOX_WEBHOOK_SECRET = "sandbox-webhook-secret"
SERVICE_LOGIN = "paperclip-bot"
DEFAULT_STATE_MAPPING = {
    "open": "backlog",
    "closed": "terminal",
    "closed:not_planned": "terminal",
    "labels": {"blocked": "blocked", "in review": "review", "in progress": "active"},
}


def github_adapter_for(sandbox: GitHubSandbox, *, containers=(SANDBOX_REPO,), token: str | None = SANDBOX_TOKEN,
                       webhook_secret: str | None = SANDBOX_WEBHOOK_SECRET, state_mapping=None,
                       service_account_id: str | None = SERVICE_LOGIN, base_url: str | None = None,
                       **kwargs) -> GitHubIssuesAdapter:
    """An adapter pointed at ``sandbox`` (``kwargs`` go to the adapter, e.g. ``per_page=3``)."""
    config = AdapterConfig(base_url=base_url or sandbox.base_url, containers=tuple(containers),
                           state_mapping=DEFAULT_STATE_MAPPING if state_mapping is None else state_mapping,
                           credentials=token, webhook_secret=webhook_secret, service_account_id=service_account_id,
                           timeout=5.0)
    return GitHubIssuesAdapter(config, **kwargs)


@pytest.fixture
def github_sandbox():
    with GitHubSandbox(repos=(SANDBOX_REPO,), token=SANDBOX_TOKEN, service_login=SERVICE_LOGIN,
                       webhook_secret=SANDBOX_WEBHOOK_SECRET) as sandbox:
        yield sandbox
