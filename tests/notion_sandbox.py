"""Pytest helpers for the Notion sandbox (:mod:`connectors.sandbox.notion`).

    from tests.notion_sandbox import notion_sandbox, notion_adapter_for  # noqa: F401  (fixture import)

``notion_sandbox`` is a started :class:`NotionSandbox` on 127.0.0.1 (random port) with one database
(``sandbox.tasks``: a ``Status`` property Not started / In progress / In review / Done), the workspace id
of the real fixture (``zulip_page_properties_updated``: its page lives at the workspace top level),
integration token ``SANDBOX_TOKEN``, deliveries signed with ``VERIFICATION_TOKEN`` and recorded in
``sandbox.deliveries``, the deterministic clock. Stopped after the test."""
from __future__ import annotations

import pytest

from connectors.providers.base import AdapterConfig
from connectors.providers.notion import NotionAdapter
from connectors.sandbox.notion import NotionSandbox

SANDBOX_TOKEN = "secret_notion_sandbox_test_token"
VERIFICATION_TOKEN = "secret_tMrlL1qK5vuQAh1b6cZGhFChZTSYJlce98V0pYn7yBl"  # the one the real fixture hands over
WORKSPACE_ID = "13950b26-c203-4f3b-b97d-93ec06319565"  # workspace_id / data.parent.id of the real fixture
FIXTURE_PAGE_ID = "153104cd-477e-809d-8dc4-ff2d96ae3090"
STATE_MAPPING = {"property": "Status", "values": {"Not started": "backlog", "In progress": "active",
                                                  "In review": "review", "Done": "terminal"}}


def notion_adapter_for(sandbox: NotionSandbox, *, containers=None, token: str | None = SANDBOX_TOKEN,
                       webhook_secret: str | None = VERIFICATION_TOKEN, state_mapping=None, options=None,
                       service_account_id: str | None = None, **kwargs) -> NotionAdapter:
    """An adapter pointed at ``sandbox`` (``kwargs`` go to the adapter: ``page_size``)."""
    config = AdapterConfig(base_url=sandbox.base_url,
                           containers=tuple(containers if containers is not None else (sandbox.tasks["id"],)),
                           state_mapping=STATE_MAPPING if state_mapping is None else state_mapping,
                           credentials=token, webhook_secret=webhook_secret,
                           service_account_id=service_account_id or sandbox.bot["id"], timeout=5.0,
                           options={"workspaceId": WORKSPACE_ID} if options is None else options)
    return NotionAdapter(config, **kwargs)


def make_sandbox(**kwargs) -> NotionSandbox:
    sandbox = NotionSandbox(token=SANDBOX_TOKEN, webhook_secret=VERIFICATION_TOKEN, workspace_id=WORKSPACE_ID,
                            **kwargs)
    sandbox.tasks = sandbox.add_database("Tasks")
    return sandbox


@pytest.fixture
def notion_sandbox():
    with make_sandbox() as sandbox:
        yield sandbox
