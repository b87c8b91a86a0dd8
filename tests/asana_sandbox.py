"""Pytest helpers for the Asana sandbox (:mod:`connectors.sandbox.asana`).

    from tests.asana_sandbox import asana_sandbox, asana_adapter_for  # noqa: F401  (fixture import)

``asana_sandbox`` is a started :class:`AsanaSandbox` on 127.0.0.1 (random port) with project
``SANDBOX_PROJECT`` (sections To do, In Progress, Review, Done), token ``SANDBOX_TOKEN``, a pre-existing
webhook on every project signed with ``SANDBOX_WEBHOOK_SECRET`` whose deliveries are recorded in
``sandbox.deliveries`` (not sent), synchronous delivery and the deterministic clock.

Asana publishes no webhook payload files (``connectors/sandbox/fixtures`` has none): the sandbox builds
deliveries from the documented event shape (developers.asana.com, "Webhooks" guide and the
``EventResponse`` schema), and :func:`event` builds single entries the same way for tests."""
from __future__ import annotations

import pytest

from connectors.providers.asana import AsanaAdapter
from connectors.providers.base import AdapterConfig
from connectors.sandbox.asana import AsanaSandbox

SANDBOX_PROJECT = "Launch"
SANDBOX_TOKEN = "asana-sandbox-test-token"
SANDBOX_WEBHOOK_SECRET = "asana-sandbox-hook-secret"
SERVICE_USER = "Paperclip Bot"
DEFAULT_STATE_MAPPING = {"sections": {"In Progress": "active", "Review": "review"}, "completed": "terminal"}


def asana_adapter_for(sandbox: AsanaSandbox, *, containers=None, token: str | None = SANDBOX_TOKEN,
                      webhook_secret: str | None = SANDBOX_WEBHOOK_SECRET, state_mapping=None,
                      service_account_id: str | None = None, custom_fields=(), **kwargs) -> AsanaAdapter:
    """An adapter pointed at ``sandbox`` (``kwargs`` go to the adapter, e.g. ``page_size``); containers
    default to the sandbox's first project, the service account to the token's user."""
    config = AdapterConfig(base_url=sandbox.api_url,
                           containers=tuple(containers or (sandbox.project_gid(SANDBOX_PROJECT),)),
                           state_mapping=DEFAULT_STATE_MAPPING if state_mapping is None else state_mapping,
                           credentials=token, webhook_secret=webhook_secret,
                           service_account_id=service_account_id or sandbox.service_user["gid"], timeout=5.0,
                           custom_fields=tuple(custom_fields))
    return AsanaAdapter(config, **kwargs)


def make_sandbox(**kwargs) -> AsanaSandbox:
    kwargs.setdefault("projects", (SANDBOX_PROJECT,))
    kwargs.setdefault("token", SANDBOX_TOKEN)
    kwargs.setdefault("service_user", SERVICE_USER)
    kwargs.setdefault("webhook_secret", SANDBOX_WEBHOOK_SECRET)
    return AsanaSandbox(**kwargs)


def event(action: str, gid: str, resource_type: str = "task", *, subtype: str | None = "default_task",
          parent: tuple[str, str] | None = None, change: dict | None = None, user: str | None = "1204000000000999",
          created_at: str = "2026-01-01T00:00:05.000Z") -> dict:
    """One webhook event entry in Asana's documented compact shape."""
    resource = {"gid": gid, "resource_type": resource_type}
    if subtype:
        resource["resource_subtype"] = subtype
    out = {"user": {"gid": user, "resource_type": "user"} if user else None, "created_at": created_at,
           "action": action, "resource": resource,
           "parent": {"gid": parent[0], "resource_type": parent[1]} if parent else None}
    if change is not None:
        out["change"] = change
    return out


@pytest.fixture
def asana_sandbox():
    with make_sandbox() as sandbox:
        yield sandbox
