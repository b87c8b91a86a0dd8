"""Pytest helpers for the Trello sandbox (:mod:`connectors.sandbox.trello`).

Use from any test module::

    from tests.trello_sandbox import trello_sandbox, trello_adapter_for  # noqa: F401  (fixture import)

    def test_something(trello_sandbox):
        adapter = trello_adapter_for(trello_sandbox)
        card = trello_sandbox.create_card("Hello", list="To Do")
        ...

``trello_sandbox`` is a started :class:`TrelloSandbox` on 127.0.0.1 with a random port, one board (lists
To Do, Doing, Paperclip: QA, Done), credentials ``SANDBOX_KEY:SANDBOX_TOKEN``, deliveries signed with
``SANDBOX_APP_SECRET`` and recorded in ``sandbox.deliveries`` (set ``sandbox.callback_url`` to the URL they
are signed for), synchronous delivery and the deterministic clock. It is stopped after the test."""
from __future__ import annotations

import pytest

from connectors.providers.base import AdapterConfig
from connectors.providers.trello import TrelloAdapter
from connectors.sandbox.trello import TrelloSandbox

SANDBOX_KEY = "0123456789abcdef0123456789abcdef"
SANDBOX_TOKEN = "ATTAsandboxtoken0123456789"
SANDBOX_APP_SECRET = "trello-sandbox-app-secret"
SERVICE_USERNAME = "paperclipbot"
DEFAULT_STATE_MAPPING = {"lists": {"To Do": "backlog", "Doing": "active", "Paperclip: QA": "review",
                                   "Done": "terminal"}}


def trello_adapter_for(sandbox: TrelloSandbox, *, containers=None, credentials: str | None = None,
                       webhook_secret: str | None = SANDBOX_APP_SECRET, state_mapping=None, options=None,
                       service_account_id: str | None = None, **kwargs) -> TrelloAdapter:
    """An adapter pointed at ``sandbox`` (``kwargs`` go to the adapter: ``page_size``, ``comment_page_size``).
    ``service_account_id`` defaults to the sandbox's token member id."""
    config = AdapterConfig(base_url=sandbox.base_url, containers=tuple(containers or (sandbox.board_id,)),
                           state_mapping=DEFAULT_STATE_MAPPING if state_mapping is None else state_mapping,
                           credentials=credentials or sandbox.credentials, webhook_secret=webhook_secret,
                           service_account_id=service_account_id or sandbox.service_member["id"], timeout=5.0,
                           options=options or {})
    return TrelloAdapter(config, **kwargs)


def make_trello_sandbox(**kwargs) -> TrelloSandbox:
    return TrelloSandbox(key=SANDBOX_KEY, token=SANDBOX_TOKEN, service_username=SERVICE_USERNAME,
                         webhook_secret=SANDBOX_APP_SECRET, **kwargs)


@pytest.fixture
def trello_sandbox():
    with make_trello_sandbox() as sandbox:
        yield sandbox
