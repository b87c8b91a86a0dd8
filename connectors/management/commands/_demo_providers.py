"""``demo_sandbox --provider <key>`` for the sandboxes besides GitHub (Linear, Jira, Asana, Trello, Notion).

The command starts the provider's sandbox on the demo port, creates (or re-points) a "<Provider> sandbox"
connector in the demo company with the sandbox's containers, state mapping and service account, stores a
token and webhook secret generated at the first start (encrypted connector secrets, reused later), registers
the provider's webhooks through the connector where its API can (Asana answers with a handshake, Trello
checks the callback with HEAD), and opens one task whose webhook the connector imports and routes."""
from __future__ import annotations

import importlib
import secrets as pysecrets
from dataclasses import dataclass


@dataclass(frozen=True)
class DemoProvider:
    provider_key: str
    module: str  # connectors.sandbox.<module>
    sandbox_class: str
    display: str
    signed_by_handshake: bool = False  # the webhook secret arrives with the registration's handshake


PROVIDERS = {
    "linear": DemoProvider("linear", "linear", "LinearSandbox", "Linear"),
    "jira": DemoProvider("jira", "jira", "JiraSandbox", "Jira"),
    "asana": DemoProvider("asana", "asana", "AsanaSandbox", "Asana", signed_by_handshake=True),
    "trello": DemoProvider("trello", "trello", "TrelloSandbox", "Trello"),
    "notion": DemoProvider("notion", "notion", "NotionSandbox", "Notion"),
}


def sandbox_class(spec: DemoProvider):
    return getattr(importlib.import_module(f"connectors.sandbox.{spec.module}"), spec.sandbox_class)


def ensure_connector(*, spec: DemoProvider, company, sandbox, name: str, token: str, secret: str | None):
    """The demo company's connector for ``sandbox``: created with this start's token and secret (stored
    encrypted), or re-pointed at the sandbox with them rotated in (the old stored secrets are deleted)."""
    import uuid

    from connectors.models import ConnectorInstance
    from connectors.services.instances import instance_create, instance_update
    from connectors.services.interventions import credentials_rotate
    from issues.actors import SYSTEM

    fields = dict(sandbox.demo_instance_fields())
    credentials = getattr(sandbox, "credentials", None)
    credentials = {"value": credentials if isinstance(credentials, str) else token}
    instance = ConnectorInstance.objects.filter(company=company, name=name).first()
    if instance is not None:  # the secrets first: the update's mapping check reads the new sandbox with them
        credentials_rotate(actor=SYSTEM, instance=instance, idempotency_key=f"demo-{uuid.uuid4()}",
                           credentials=credentials, webhook_secret={"value": secret} if secret else None,
                           reason="demo sandbox restarted with fresh secrets")
        instance.refresh_from_db()
        changes = {k: v for k, v in fields.items() if getattr(instance, k, None) != v}
        return instance_update(actor=SYSTEM, instance=instance, changes=changes) if changes else instance
    linus, ada = company.agents.get(name="Linus"), company.agents.get(name="Ada")
    return instance_create(
        actor=SYSTEM, company=company, name=name, provider_key=spec.provider_key, credentials=credentials,
        webhook_secret={"value": secret} if secret else None, default_sync_mode="bidirectional",
        triage_agent_id=ada.pk, poll_interval_seconds=60,
        routing_rules=[{"kind": "default_route", "agentId": str(linus.pk)}], **fields)


def new_values(spec: DemoProvider) -> tuple[str, str | None]:
    """A token and webhook secret for this start (none for a provider whose handshake hands one over)."""
    token = pysecrets.token_urlsafe(24)
    return token, None if spec.signed_by_handshake else pysecrets.token_urlsafe(24)
