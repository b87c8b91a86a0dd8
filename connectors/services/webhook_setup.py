"""Webhook setup (External Task Protocol Appendix A.3-A.5, §13.2).

- Handshakes: a provider's setup request answered by the webhook view instead of an event (Asana's
  ``X-Hook-Secret`` echo, Trello's ``HEAD`` check, Notion's ``verification_token``). A handshake that hands
  over a signing secret stores it encrypted (a ``ConnectorSecret``) as the instance's webhook secret, or as
  the secret of the ``?scope=`` registration it arrived for, but only while one is expected: nothing is
  stored yet for that scope, or an operator or a registration opened the handshake window. Anyone can POST
  to a webhook URL; a stored secret is never replaced by a stranger's.
- Registrations: ``webhooks_register`` creates the provider's webhook for every configured container
  (callback ``webhook_url(instance, scope=container)``), with the window open while the provider calls
  back; a container that already has an active registration is re-checked instead (idempotent).
- Re-verification: ``webhooks_reverify`` asks the provider about every registration (at worker start with
  the restart recovery pass, and on demand); a webhook the provider dropped or disabled is shown in health
  and recorded as a ``config`` health entry. Polling stays the backstop either way."""
from __future__ import annotations

import logging
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from connectors import secrets
from connectors.choices import ErrorCategory
from connectors.models import ConnectorInstance
from connectors.providers.base import HandshakeReply, ProviderError, WebhookRegistration
from issues.actors import SYSTEM, Actor
from issues.exceptions import Unprocessable
from issues.models import ActivityLog
from issues.services.activity import activity_record

from .common import adapter_class, adapter_for, container_allowed, registration_of, sync_error_record
from .instances import webhook_url
from .interventions import require_admin

log = logging.getLogger("connectors.webhooks")

HANDSHAKE_WINDOW = timedelta(minutes=15)  # an operator's "expect a handshake" (a Notion verification)
CREATION_WINDOW = timedelta(hours=1)  # a connector created without a webhook secret awaits the provider's first
REGISTRATION_WINDOW = timedelta(minutes=2)  # the provider calls back while the creation request runs


class HandshakeRefused(Exception):
    """A handshake that would replace a stored secret while none is expected (409, nothing stored)."""


# ------------------------------------------------------------------------------------------ handshakes
def handshake_expected(instance: ConnectorInstance, scope: str | None, now=None) -> bool:
    """Whether a secret-bearing handshake may be stored now. Unscoped: only inside the instance's window
    (opened when a connector is created without a webhook secret, or by an admin). Scoped: only for a
    configured container whose registration is under way (``webhooks_register`` opens that container's own
    window while it calls the provider). A stranger can never set or replace a secret outside them."""
    now = now or timezone.now()
    if not scope:
        return bool(instance.handshake_open_until and instance.handshake_open_until > now)
    if not instance.containers or not container_allowed(instance, scope):
        return False
    until = (registration_of(instance, scope) or {}).get("handshakeUntil")
    return bool(until) and until > now.isoformat()


def handshake_accept(*, instance: ConnectorInstance, reply: HandshakeReply, scope: str | None) -> HandshakeReply:
    """Record a handshake the adapter recognised and return what the view answers. Raises HandshakeRefused.
    The first secret accepted closes its window: a second handshake (a stranger racing the provider) is
    refused. The secret it replaces, if any, is deleted."""
    now = timezone.now()
    if not reply.secret:  # a callback check (Trello's HEAD): nothing to store but when it happened
        if instance.last_handshake_at is None or (now - instance.last_handshake_at).total_seconds() >= 1:
            ConnectorInstance.objects.filter(pk=instance.pk).update(
                last_handshake_at=now, last_handshake_detail=(reply.detail or "callback check answered")[:300])
        return reply
    with transaction.atomic():
        row = ConnectorInstance.objects.select_for_update().get(pk=instance.pk)
        if not handshake_expected(row, scope, now):
            raise HandshakeRefused("No handshake is expected now: a webhook secret is only taken while its "
                                   "registration runs or an admin opened the handshake window.")
        ref = secrets.secret_store(company=row.company, name=f"{row.name} webhook secret"
                                   + (f" ({scope})" if scope else ""), value=reply.secret)
        if scope:
            replaced = _put_entry(row, scope, {"secretRef": ref, "handshakeUntil": None}).get("secretRef") or ""
        else:
            replaced, row.webhook_secret_ref, row.handshake_open_until = row.webhook_secret_ref, ref, None
        detail = (reply.detail or "handshake: signing secret received") + (f" for {scope}" if scope else "")
        row.last_handshake_at, row.last_handshake_detail = now, detail[:300]
        row.webhook_verified = False  # verified again by the first delivery signed with the new secret
        row.save(update_fields=["webhook_registrations", "webhook_secret_ref", "handshake_open_until",
                                "last_handshake_at", "last_handshake_detail", "webhook_verified", "updated_at"])
        _delete_stored(row, replaced)
        activity_record(actor=SYSTEM, company_id=row.company_id, action="connector.webhook_handshake",
                        entity_type="connector", entity_id=row.pk,
                        details={"scope": scope, "detail": detail, "secretStored": True,
                                 "showOperator": reply.show_operator})
    return reply


def _delete_stored(instance: ConnectorInstance, ref: str):
    """A stored secret a handshake replaced (an ``env:`` reference is the operator's and stays)."""
    from connectors.models import ConnectorSecret

    match = secrets.STORED_REF.match(ref or "")
    if match:
        ConnectorSecret.objects.filter(pk=match.group(1), company_id=instance.company_id).delete()


def token_offered(instance: ConnectorInstance) -> bool:
    """The instance's secret came from a handshake whose provider wants it shown to the operator (Notion's
    verification token is pasted back into Notion); never another provider's secret."""
    last = (ActivityLog.objects.filter(company_id=instance.company_id, entity_type="connector",
                                       entity_id=str(instance.pk), action="connector.webhook_handshake")
            .order_by("-created_at", "-id").values_list("details", flat=True).first())
    return bool(instance.webhook_secret_ref and last and not last.get("scope") and last.get("showOperator"))


def handshake_window_open(*, actor: Actor, instance: ConnectorInstance, duration: timedelta = HANDSHAKE_WINDOW):
    """An operator expects a provider handshake that replaces the stored secret (Notion resends its
    verification token; an Asana webhook is re-created by hand)."""
    require_admin(actor, instance.company_id)
    until = timezone.now() + duration
    ConnectorInstance.objects.filter(pk=instance.pk).update(handshake_open_until=until)
    activity_record(actor=actor, company_id=instance.company_id, action="connector.handshake_window_opened",
                    entity_type="connector", entity_id=instance.pk, details={"until": until.isoformat()})
    return until


def verification_token(*, actor: Actor, instance: ConnectorInstance) -> str | None:
    """The stored signing secret a handshake handed over, for the operator to paste back into the provider
    (Notion's verification step). Owners and admins only; audited."""
    require_admin(actor, instance.company_id)
    if not token_offered(instance):
        return None
    value = secrets.resolve(instance.webhook_secret_ref, company_id=instance.company_id, field="webhookSecret")
    activity_record(actor=actor, company_id=instance.company_id, action="connector.verification_token_shown",
                    entity_type="connector", entity_id=instance.pk, details={})
    return value


# --------------------------------------------------------------------------------------- registrations
def _registration_dict(reg: WebhookRegistration, *, secret_ref: str = "", now=None) -> dict:
    return {"scope": reg.scope, "externalId": reg.external_id, "callbackUrl": reg.callback_url,
            "active": bool(reg.active), "detail": (reg.detail or "")[:300],
            "checkedAt": (now or timezone.now()).isoformat(), "secretRef": secret_ref}


def _registration_obj(entry: dict) -> WebhookRegistration:
    return WebhookRegistration(scope=str(entry.get("scope") or ""), external_id=str(entry.get("externalId") or ""),
                               callback_url=str(entry.get("callbackUrl") or ""), active=bool(entry.get("active")),
                               detail=str(entry.get("detail") or ""))


def _put_entry(row: ConnectorInstance, scope: str, changes: dict) -> dict:
    """Set ``changes`` on ``row``'s registration for ``scope`` (added when it has none); returns the entry as
    it was ({} when new). The caller saves the row."""
    key = adapter_class(row.provider_key).container_key
    entries, previous = [], None
    for item in row.webhook_registrations or ():
        if previous is None and isinstance(item, dict) and key(str(item.get("scope") or "")) == key(scope):
            previous, item = item, {**item, **changes}
        entries.append(item)
    if previous is None:
        entries.append({"scope": scope, **changes})
    row.webhook_registrations = entries
    return previous or {}


def _save_entry(instance_id, entry: dict):
    """Merge one container's registration into the row; an entry without a secret keeps the one a handshake
    stored meanwhile."""
    with transaction.atomic():
        row = ConnectorInstance.objects.select_for_update().get(pk=instance_id)
        _put_entry(row, entry["scope"], {k: v for k, v in entry.items() if k != "secretRef" or v})
        row.save(update_fields=["webhook_registrations", "updated_at"])


def public_registration(entry: dict) -> dict:
    """A registration as health, the API and the console show it: never its secret reference."""
    return {k: v for k, v in entry.items() if k != "secretRef"} | {"hasOwnSecret": bool(entry.get("secretRef"))}


def webhooks_register(*, instance: ConnectorInstance, actor: Actor = SYSTEM) -> list[dict]:
    """Create (or re-check) the provider webhook of every configured container. Runs outside a transaction:
    the provider's handshake arrives on another connection while its creation request is open."""
    require_admin(actor, instance.company_id)
    adapter = adapter_for(instance)
    if "register_webhook" not in adapter.capabilities.operations:
        raise Unprocessable(f"{instance.provider_key} webhooks cannot be created through its API; configure them in "
                            "the provider with the webhook URL (polling is the backstop).",
                            code="webhook_registration_unsupported", details={"provider": [instance.provider_key]})
    if not instance.containers:
        raise Unprocessable("Name the containers to register webhooks for.", code="webhook_registration_unsupported",
                            details={"containers": ["At least one container is required."]})
    results = []
    for scope in [str(c) for c in instance.containers]:
        instance.refresh_from_db()
        existing = registration_of(instance, scope)
        # this container's own handshake window, committed before the provider calls back
        _save_entry(instance.pk, {**(existing or {"scope": scope, "externalId": "", "active": False,
                                                 "callbackUrl": webhook_url(instance, scope), "detail": "registering",
                                                 "checkedAt": None}),
                                  "handshakeUntil": (timezone.now() + REGISTRATION_WINDOW).isoformat()})
        try:
            if existing and existing.get("externalId"):
                reg = adapter.check_webhook(_registration_obj(existing))
                if not reg.active:  # gone or disabled at the provider: create it again
                    reg = adapter.register_webhook(scope, webhook_url(instance, scope))
            else:
                reg = adapter.register_webhook(scope, webhook_url(instance, scope))
            entry = _registration_dict(reg)
        except ProviderError as exc:
            entry = {**(existing or {}), **_registration_dict(WebhookRegistration(
                scope=scope, external_id=(existing or {}).get("externalId", ""),
                callback_url=webhook_url(instance, scope), active=False, detail=f"registration failed: {exc}"))}
            sync_error_record(instance=instance, category=exc.category,
                              message=f"Webhook registration for {scope} failed: {exc}")
        except Exception:
            _save_entry(instance.pk, {**(existing or {"scope": scope}), "handshakeUntil": None})
            raise
        entry["handshakeUntil"] = None  # the window closes whatever the provider answered
        _save_entry(instance.pk, entry)
        results.append(entry)
    activity_record(actor=actor, company_id=instance.company_id, action="connector.webhooks_registered",
                    entity_type="connector", entity_id=instance.pk,
                    details={"registrations": [{k: r.get(k) for k in ("scope", "externalId", "active", "detail")}
                                               for r in results]})
    return [public_registration(r) for r in results]


def webhooks_reverify(*, instance: ConnectorInstance, actor: Actor | None = None) -> list[dict]:
    """§13.2: the provider's current view of every registration; an inactive one becomes a health entry.
    ``actor``: an operator asking (owners and admins); the worker's start-up pass has none."""
    if actor is not None:
        require_admin(actor, instance.company_id)
    entries = [r for r in instance.webhook_registrations or () if isinstance(r, dict) and r.get("externalId")]
    if not entries:
        return []
    adapter = adapter_for(instance)
    results = []
    for existing in entries:
        try:
            reg = adapter.check_webhook(_registration_obj(existing))
            entry = _registration_dict(reg, secret_ref=existing.get("secretRef") or "")
        except ProviderError as exc:
            entry = {**existing, "checkedAt": timezone.now().isoformat(), "detail": f"check failed: {exc}"[:300]}
            sync_error_record(instance=instance, category=exc.category,
                              message=f"Webhook check for {existing.get('scope')} failed: {exc}")
        else:
            if not reg.active:
                sync_error_record(instance=instance, category=ErrorCategory.CONFIG,
                                  message=f"The {instance.provider_key} webhook for {reg.scope} is not active: "
                                          f"{reg.detail or 'gone or disabled'}; run connector_register_webhooks "
                                          "(polling continues meanwhile).")
        _save_entry(instance.pk, entry)
        results.append(public_registration(entry))
    return results
