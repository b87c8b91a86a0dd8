"""Shared engine helpers: settings, adapters, health entries and link status transitions."""
from __future__ import annotations

import logging
import random
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from connectors import secrets
from connectors.choices import ErrorCategory, LinkStatus
from connectors.models import ConnectorInstance, LinkTransition, SyncError, TaskLink
from connectors.providers import base
from connectors.providers.base import ProviderError

log = logging.getLogger("connectors")

DEFAULTS = {
    "WEBHOOK_MAX_BODY_BYTES": 5 * 1024 * 1024,
    "SECRETS_KEY": "",
    "MAX_ATTEMPTS": 5,
    "RETRY_BASE_SECONDS": 5.0,
    "RETRY_MAX_SECONDS": 600.0,
    "STALE_PENDING_SECONDS": 60,
    "SWEEP_BATCH": 500,
    "POLL_MAX_PAGES": 20,
    "STATE_BATCH": 100,
    "PUBLIC_BASE_URL": "http://127.0.0.1:8000",
    "EVENT_RETENTION_DAYS": 30,
}


def conf(name: str):
    return {**DEFAULTS, **(getattr(settings, "CONNECTORS", None) or {})}[name]


def adapter_class(provider_key: str) -> type[base.TaskSourceAdapter]:
    try:
        return base.adapter_class(provider_key)
    except ModuleNotFoundError:
        # The provider registry imports every provider module; while one is missing, the adapters
        # that did register (e.g. test adapters) still work.
        try:
            return base._REGISTRY[provider_key]
        except KeyError:
            raise LookupError(f"Unknown provider '{provider_key}'.") from None


def provider_known(provider_key: str) -> bool:
    try:
        adapter_class(provider_key)
        return True
    except LookupError:
        return False


def adapter_for(instance: ConnectorInstance, *, with_credentials: bool = True,
                with_webhook_secret: bool = False) -> base.TaskSourceAdapter:
    """Build the instance's adapter with its secrets resolved (raises SecretUnavailable)."""
    cls = adapter_class(instance.provider_key)
    config = base.AdapterConfig(
        base_url=instance.base_url or getattr(cls, "default_base_url", ""),
        containers=tuple(instance.containers or ()),
        state_mapping=instance.state_mapping or {},
        credentials=(secrets.resolve(instance.credentials_ref, company_id=instance.company_id, field="credentials")
                     if with_credentials else None),
        webhook_secret=(secrets.resolve(instance.webhook_secret_ref, company_id=instance.company_id,
                                        field="webhookSecret") if with_webhook_secret else None),
        service_account_id=instance.service_account_id or None,
    )
    return cls(config)


def sync_error_record(*, instance: ConnectorInstance, category: str, message: str, link: TaskLink | None = None,
                      event=None, details: dict | None = None) -> SyncError:
    log.warning("connector %s (%s) %s: %s link=%s event=%s", instance.pk, instance.provider_key, category, message,
                getattr(link, "pk", None), getattr(event, "idempotency_key", None))
    return SyncError.objects.create(instance=instance, company_id=instance.company_id, category=category,
                                    message=message[:2000], link=link, event=event, details=details or {})


def link_set_status(link: TaskLink, to_status: str, cause: str, *, detail: str | None = None,
                    key: str = "", save_fields: tuple = ()) -> bool:
    """Move a link through §6.1 and record the transition; returns whether the status changed."""
    changed = link.status != to_status
    if detail is not None:
        link.status_detail = detail
    if changed:
        LinkTransition.objects.create(link=link, from_status=link.status, to_status=to_status, cause=cause[:300],
                                      idempotency_key=key[:300])
        link.status = to_status
    if changed or detail is not None or save_fields:
        link.save(update_fields=["status", "status_detail", "updated_at", *save_fields])
    return changed


def link_first_sync_ok(link: TaskLink, key: str = ""):
    """pending -> healthy, error -> healthy after a successful apply."""
    if link.status in (LinkStatus.PENDING, LinkStatus.ERROR):
        link_set_status(link, LinkStatus.HEALTHY, "sync ok", detail="", key=key)


def now():
    return timezone.now()


def retry_backoff(attempts: int, retry_after: float | None) -> timedelta:
    """Exponential backoff with jitter for inbound events and outbound writes, never shorter than
    the provider's own ``retry_after``."""
    base = float(conf("RETRY_BASE_SECONDS"))
    delay = min(base * (2 ** max(attempts - 1, 0)), float(conf("RETRY_MAX_SECONDS")))
    if base > 0:
        delay *= random.uniform(0.8, 1.2)  # jitter
    if retry_after:
        delay = max(delay, float(retry_after))
    return timedelta(seconds=delay)


def failure_of(exc: Exception) -> tuple[str, str]:
    """(error category, message) of a failed apply or write: a provider's own category, ``config`` for
    a secret reference that does not resolve (refused or unset), else apply_failed."""
    if isinstance(exc, ProviderError) and exc.category in ErrorCategory.values:
        category = exc.category
    elif isinstance(exc, secrets.SecretUnavailable):
        category = ErrorCategory.CONFIG
    else:
        category = ErrorCategory.APPLY_FAILED
    return category, f"{type(exc).__name__}: {exc}"[:2000]


def container_allowed(instance: ConnectorInstance, container_id: str | None) -> bool:
    """A payload's container is one of the instance's (an instance without containers takes any)."""
    if not container_id or not instance.containers:
        return True
    return container_id.lower() in {str(c).lower() for c in instance.containers}
