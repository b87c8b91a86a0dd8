"""Shared engine helpers: settings, adapters, health entries and link status transitions."""
from __future__ import annotations

import logging
import random
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from connectors import secrets
from connectors.choices import ErrorCategory, LinkStatus
from connectors.models import ConnectorInstance, LinkTransition, SyncCursor, SyncError, TaskLink
from connectors.providers import base
from connectors.providers.base import ProviderError

from .credential_health import credentials_failed
from .logctx import engine_log

log = logging.getLogger("connectors")

DEFAULTS = {
    "WEBHOOK_MAX_BODY_BYTES": 5 * 1024 * 1024,
    "SECRETS_KEY": "",
    "MAX_ATTEMPTS": 5,
    "RETRY_BASE_SECONDS": 5.0,
    "RETRY_MAX_SECONDS": 600.0,
    "OUTBOUND_RETRY_HORIZON_SECONDS": 24 * 3600.0,
    "OUTBOUND_RETRY_MAX_SECONDS": 1800.0,
    "OUTBOUND_DELIVERY_LEASE_SECONDS": 120.0,
    "STALE_PENDING_SECONDS": 60,
    "KICK_BATCH_SIZE": 8,
    "KICK_LINGER_MS": 10.0,
    "APPLY_BATCH_SIZE": 8,
    "SWEEP_BATCH": 500,
    "POLL_MAX_PAGES": 20,
    "STATE_BATCH": 100,
    "PUBLIC_BASE_URL": "http://127.0.0.1:8000",
    "EVENT_RETENTION_DAYS": 30,
    "COMMENT_POLL_BATCH": 50,
    "COMMENT_POLL_MAX_PAGES": 5,
    "COMMENT_RECONCILE_BATCH": 25,
    "COMMENT_FULL_MAX_PAGES": 20,
    "TRANSCRIPT_MAX_CHARS": 4000,
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


def registration_of(instance: ConnectorInstance, scope: str | None) -> dict | None:
    """The instance's webhook registration for container ``scope`` (``webhook_registrations``), or None."""
    if not scope:
        return None
    cls = adapter_class(instance.provider_key)
    key = cls.container_key(scope)
    return next((r for r in instance.webhook_registrations or () if isinstance(r, dict)
                 and cls.container_key(str(r.get("scope") or "")) == key), None)


def webhook_secret_ref(instance: ConnectorInstance, scope: str | None = None) -> str:
    """The reference of the secret deliveries for ``scope`` are signed with: a per-container registration's
    own (an Asana webhook's handshake secret), else the instance's."""
    registration = registration_of(instance, scope)
    return (registration or {}).get("secretRef") or instance.webhook_secret_ref


def adapter_for(instance: ConnectorInstance, *, with_credentials: bool = True,
                with_webhook_secret: bool = False, scope: str | None = None) -> base.TaskSourceAdapter:
    """Build the instance's adapter with its secrets resolved (raises SecretUnavailable). ``scope``: the
    container a delivery's callback URL names, whose registration may carry its own signing secret."""
    cls = adapter_class(instance.provider_key)
    config = base.AdapterConfig(
        base_url=instance.base_url or getattr(cls, "default_base_url", ""),
        containers=tuple(instance.containers or ()),
        state_mapping=instance.state_mapping or {},
        credentials=(secrets.resolve(instance.credentials_ref, company_id=instance.company_id, field="credentials")
                     if with_credentials else None),
        webhook_secret=(secrets.resolve(webhook_secret_ref(instance, scope), company_id=instance.company_id,
                                        field="webhookSecret") if with_webhook_secret else None),
        service_account_id=instance.service_account_id or None,
        custom_fields=_routed_custom_fields(instance, cls),
        options=dict(instance.config or {}),
    )
    return cls(config)


def _routed_custom_fields(instance: ConnectorInstance, cls) -> tuple[str, ...]:
    """Ids the enabled ``custom_field`` routing rules read (§8.1); no query for a provider without them."""
    from connectors.choices import RoutingRuleKind

    if RoutingRuleKind.CUSTOM_FIELD not in cls.capabilities.routing_rule_kinds or instance._state.adding:
        return ()
    ids = {m["field"].strip() for m in instance.routing_rules.filter(
        kind=RoutingRuleKind.CUSTOM_FIELD, enabled=True).values_list("match", flat=True)
        if isinstance(m, dict) and isinstance(m.get("field"), str) and m["field"].strip()}
    return tuple(sorted(ids))


def sync_error_record(*, instance: ConnectorInstance, category: str, message: str, link: TaskLink | None = None,
                      event=None, details: dict | None = None) -> SyncError:
    """A health entry (§12.2). A ``provider_auth`` one also opens the instance's credential incident
    (§13.1.2: health ``error``, one activity entry, a dashboard alert; links untouched)."""
    engine_log(logging.WARNING, f"connector health entry: {message[:500]}", outcome=f"error:{category}",
               instance=instance, link=link, event=event, category=category)
    row = SyncError.objects.create(instance=instance, company_id=instance.company_id, category=category,
                                   message=message[:2000], link=link, event=event, details=details or {})
    if category == ErrorCategory.PROVIDER_AUTH:
        credentials_failed(instance, message, source="health entry")
    return row


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


def retry_backoff(attempts: int, retry_after: float | None, *, cap: float | None = None) -> timedelta:
    """Exponential backoff with jitter for inbound events and outbound writes, never shorter than
    the provider's own ``retry_after``; ``cap`` (default RETRY_MAX_SECONDS) bounds the interval."""
    base = float(conf("RETRY_BASE_SECONDS"))
    cap = float(conf("RETRY_MAX_SECONDS")) if cap is None else cap
    delay = min(base * (2 ** min(max(attempts - 1, 0), 64)), cap)
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


def cursor_get(instance, scope: str) -> str | None:
    """§4.1.7: the saved cursor of ``scope`` (None when there is none)."""
    value = SyncCursor.objects.filter(instance=instance, scope=scope).values_list("cursor", flat=True).first()
    return value or None


def cursor_save(instance, scope: str, value: str | None):
    """Save ``scope``'s cursor; call it in the transaction of the effects of the page it describes."""
    SyncCursor.objects.update_or_create(instance=instance, scope=scope, defaults={"cursor": value or ""})


def provider_degrade(instance, exc: ProviderError):
    """§13.1.5: the provider asked us to wait (``retry_after``): polling and reconciliation are shed
    until then (due_instances skips the instance)."""
    if exc.retry_after:
        ConnectorInstance.objects.filter(pk=instance.pk).update(
            provider_degraded_until=timezone.now() + timedelta(seconds=float(exc.retry_after)))


def container_allowed(instance: ConnectorInstance, container_id: str | None) -> bool:
    """A payload's container is one of the instance's (an instance without containers takes any)."""
    if not container_id or not instance.containers:
        return True
    key = adapter_class(instance.provider_key).container_key
    return key(container_id) in {key(str(c)) for c in instance.containers}
