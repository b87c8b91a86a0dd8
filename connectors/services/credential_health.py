"""Credential failures of a connector instance (§13.1.2): health ``error`` with a visible reason, one
activity entry per incident and an operator alert on the company dashboard; links are never touched.

An incident starts with the first ``provider_auth`` health entry (a write, poll, read or webhook
refused for its credentials, or credentials that do not resolve) and ends with a successful provider write or poll,
or a credential rotation; then the instance's pending outbound writes, which waited on their
backoff meanwhile, are kicked (``outbound_queue.pending_kick``). Below the engine services (the
health-entry helper in ``common`` calls it): it imports models and the activity log only."""
from __future__ import annotations

import logging

from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from connectors.models import ConnectorInstance
from issues.actors import SYSTEM
from issues.services.activity import activity_record

log = logging.getLogger("connectors.credentials")

FAILED_ACTION = "connector.credentials_failed"
RESTORED_ACTION = "connector.credentials_restored"


def credentials_failed(instance: ConnectorInstance, detail: str, *, source: str) -> bool:
    """Mark the instance's credentials failed; returns whether this started a new incident (the
    activity entry and the log line are written once per incident, not per failing write)."""
    detail = (detail or "credentials refused")[:500]
    now = timezone.now()
    with transaction.atomic():
        started = ConnectorInstance.objects.filter(pk=instance.pk, auth_error_at__isnull=True).update(
            auth_error_at=now, auth_error_detail=detail)
        if not started:
            ConnectorInstance.objects.filter(pk=instance.pk).update(auth_error_detail=detail)
            return False
        activity_record(actor=SYSTEM, company_id=instance.company_id, action=FAILED_ACTION, entity_type="connector",
                        entity_id=instance.pk, details={"instanceId": str(instance.pk), "providerKey":
                                                        instance.provider_key, "source": source, "detail": detail})
    instance.auth_error_at, instance.auth_error_detail = now, detail
    log.error("connector %s (%s) credentials failed (%s): %s", instance.pk, instance.provider_key, source, detail)
    return True


def credentials_ok(instance: ConnectorInstance, *, cause: str) -> bool:
    """End an open incident (a write or poll went through, or the credentials were rotated); returns
    whether there was one (the caller then kicks the pending writes: ``outbound_queue.pending_kick``)."""
    with transaction.atomic():
        ended = ConnectorInstance.objects.filter(pk=instance.pk, auth_error_at__isnull=False).update(
            auth_error_at=None, auth_error_detail="")
        if not ended:
            return False
        activity_record(actor=SYSTEM, company_id=instance.company_id, action=RESTORED_ACTION, entity_type="connector",
                        entity_id=instance.pk, details={"instanceId": str(instance.pk), "cause": cause})
    instance.auth_error_at, instance.auth_error_detail = None, ""
    log.info("connector %s credentials restored (%s)", instance.pk, cause)
    return True


def dashboard_alerts(company) -> list[dict]:
    """Operator alerts for the company dashboard (registered with issues.operator_alerts)."""
    return [{"kind": FAILED_ACTION, "severity": "error", "at": row.auth_error_at,
             "title": f"{row.name}: connector credentials failed",
             "message": f"{row.auth_error_detail or 'The provider refused the credentials.'} Writes keep retrying and "
                        f"go out once the credentials work again (rotate them); links are untouched.",
             "entityType": "connector", "entityId": str(row.pk),
             "url": reverse("connectors_console:instance-detail", args=[row.pk])}
            for row in ConnectorInstance.objects.filter(company=company, auth_error_at__isnull=False)
            .only("id", "name", "auth_error_at", "auth_error_detail").order_by("auth_error_at")]
