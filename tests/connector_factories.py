"""Building connector instances for tests (through the services, as the product does)."""
from __future__ import annotations

from connectors.services.instances import instance_create
from issues.actors import SYSTEM
from tests.connector_fakes import PROVIDER, SERVICE_LOGIN, FakeStore

SECRET = "fake-webhook-secret"
STATE_MAPPING = {"todo": "backlog", "doing": "active", "review": "review", "stuck": "blocked", "done": "terminal"}


def make_instance(company, *, store: FakeStore | None = None, secret: str = SECRET, name: str | None = None,
                  rules=None, **fields):
    store = store or FakeStore()
    fields.setdefault("containers", [store.container])
    fields.setdefault("state_mapping", STATE_MAPPING)
    fields.setdefault("service_account_id", SERVICE_LOGIN)
    instance = instance_create(actor=SYSTEM, company=company, name=name or f"tracker-{store.base_url[-6:]}",
                               provider_key=PROVIDER, credentials={"value": "fake-token"},
                               webhook_secret={"value": secret} if secret else None, routing_rules=rules, base_url=store.base_url,
                               **fields)
    return instance, store
