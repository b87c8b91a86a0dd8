"""Reads shared by the connectors API (and later the console). Everything is company-scoped."""
from __future__ import annotations

import uuid
from functools import lru_cache

from django.db import connection
from django.db.models import Count, Min, Q
from django.utils import timezone

from issues.actors import Actor
from issues.exceptions import InvalidInput
from issues.selectors import get_by_ref, list_window, scoped_get
from paperclip.core import rows

from .choices import (
    ConflictKind,
    ConflictStatus,
    EventStatus,
    HealthStatus,
    InstanceStatus,
    LinkStatus,
    OutboundStatus,
)
from .filtersets import ConflictFilterSet, InboundEventFilterSet, TaskLinkFilterSet
from .models import Conflict, ConnectorInstance, InboundEvent, OutboundEffect, SyncCursor, SyncError, TaskLink
from .services.common import adapter_class
from .services.instances import webhook_url
from .services.webhook_setup import public_registration


@lru_cache(maxsize=1)
def _delivery_instance_sql() -> str:
    table = connection.ops.quote_name(ConnectorInstance._meta.db_table)
    return f"SELECT {rows.select_list(ConnectorInstance, table)} FROM {table} WHERE id = %s"


def instance_for_delivery(pk: uuid.UUID) -> ConnectorInstance | None:
    """The instance a webhook delivery names, unscoped (the signature is the delivery's only
    credential): one statement built once, every delivery starts here."""
    return rows.fetch_one(ConnectorInstance, _delivery_instance_sql(), [rows.pk_value(ConnectorInstance, pk)])[0]


def instance_get(*, actor: Actor, pk) -> ConnectorInstance:
    return scoped_get(ConnectorInstance.objects.select_related("company", "project", "goal", "triage_agent"),
                      actor, pk, "Connector")


def link_get(*, actor: Actor, pk) -> TaskLink:
    return scoped_get(TaskLink.objects.select_related("instance", "issue", "issue__assignee_agent",
                                                      "issue__checkout_run"), actor, pk, "Link")


def event_get(*, actor: Actor, pk) -> InboundEvent:
    try:
        pk = int(pk)
    except (TypeError, ValueError):
        pk = -1
    return scoped_get(InboundEvent.objects.select_related("instance"), actor, pk, "Event")


def outbound_effect_get(*, actor: Actor, pk) -> OutboundEffect:
    """One outbound effect (the write outbox) of a company the actor belongs to; others are a 404."""
    try:
        pk = int(pk)
    except (TypeError, ValueError):
        pk = -1
    return scoped_get(OutboundEffect.objects.select_related("instance", "instance__company", "link"), actor, pk,
                      "Outbound effect")


def instance_list(*, company, params):
    limit, offset = list_window(params)
    return ConnectorInstance.objects.filter(company=company).select_related("project", "goal", "triage_agent")[
        offset:offset + limit]


def _filtered(filterset_class, queryset, params):
    filterset = filterset_class(data=params, queryset=queryset)
    if not filterset.is_valid():
        raise InvalidInput("Invalid filter.", code="invalid_filter", details=filterset.errors)
    limit, offset = list_window(params)
    return filterset.qs[offset:offset + limit]


def link_list(*, instance, params):
    qs = TaskLink.objects.filter(instance=instance).select_related("issue", "issue__assignee_agent",
                                                                   "issue__checkout_run").order_by("-created_at", "id")
    return _filtered(TaskLinkFilterSet, qs, params)


def issue_links(*, actor: Actor, issue_ref):
    from issues.models import Issue

    issue = get_by_ref(Issue.objects.all(), actor, issue_ref, "Issue")
    return TaskLink.objects.filter(issue=issue).select_related("instance", "issue", "issue__assignee_agent",
                                                               "issue__checkout_run").order_by("-created_at")


def conflict_list(*, instance, params):
    qs = Conflict.objects.filter(instance=instance).select_related("link").order_by("-detected_at", "id")
    return _filtered(ConflictFilterSet, qs, params)


def event_list(*, instance, params):
    qs = InboundEvent.objects.filter(instance=instance).order_by("-id")
    return _filtered(InboundEventFilterSet, qs, params)


def webhook_verification(instance: ConnectorInstance) -> str:
    """How the instance's deliveries are verified (§5.1.5, §14.2): ``signature`` with a webhook secret,
    ``unverified`` without one (Jira deliveries are then hints whose effects come only from reading the
    task back through the API; GitHub and Linear refuse unsigned deliveries)."""
    return "signature" if instance.webhook_secret_ref else "unverified"


def public_registrations(instance: ConnectorInstance) -> list[dict]:
    """The webhook registrations as health shows them: never their secret references."""
    return [public_registration(r) for r in instance.webhook_registrations or () if isinstance(r, dict)]


def instance_health(instance: ConnectorInstance) -> dict:
    """§4.1.8 ConnectorHealth plus the §12.2 surface."""
    now = timezone.now()
    queue = InboundEvent.objects.filter(instance=instance).aggregate(
        depth=Count("id", filter=Q(status=EventStatus.PENDING)),
        retries=Count("id", filter=Q(status=EventStatus.FAILED)),
        parked=Count("id", filter=Q(status=EventStatus.PARKED)),
        oldest=Min("received_at", filter=Q(status__in=(EventStatus.PENDING, EventStatus.FAILED))),
    )
    retries = list(InboundEvent.objects.filter(instance=instance, status=EventStatus.FAILED)
                   .order_by("next_attempt_at").values("id", "idempotency_key", "external_task_id", "attempts",
                                                       "next_attempt_at", "error_category")[:50])
    conflicts_by_kind = dict(Conflict.objects.filter(instance=instance, status=ConflictStatus.OPEN)
                             .values("kind").annotate(n=Count("id")).values_list("kind", "n"))
    conflicts = sum(conflicts_by_kind.values())
    errors = list(SyncError.objects.filter(instance=instance).order_by("-at", "-id")
                  .values("category", "message", "at", "link_id", "event_id")[:50])
    links = dict(TaskLink.objects.filter(instance=instance).values("status").annotate(n=Count("id"))
                 .values_list("status", "n"))
    cursors = [{"scope": c.scope, "cursor": c.cursor, "updatedAt": c.updated_at,
                "lagSeconds": round((now - c.updated_at).total_seconds(), 1)}
               for c in SyncCursor.objects.filter(instance=instance).order_by("scope")]
    recent_error = errors[0] if errors else None
    outbound = outbound_health(instance, now)
    reason = ""
    if instance.status == InstanceStatus.PAUSED:
        status, reason = HealthStatus.PAUSED, instance.status_detail or "paused"
    elif instance.auth_error_at:  # §13.1.2: until a write or poll succeeds or the credentials are rotated
        status, reason = HealthStatus.ERROR, f"credentials failed: {instance.auth_error_detail or 'refused'}"
    elif queue["parked"] or queue["retries"] or links.get(LinkStatus.ERROR) or outbound["parkedCount"] or (
            outbound["retryingCount"]) or (instance.provider_degraded_until and instance.provider_degraded_until > now) \
            or (recent_error and (now - recent_error["at"]).total_seconds() < 900):
        status = HealthStatus.DEGRADED
        reason = "; ".join(text for text, on in (
            (f"{queue['parked']} parked event(s)", queue["parked"]),
            (f"{queue['retries']} inbound retries", queue["retries"]),
            (f"{outbound['parkedCount']} parked outbound write(s)", outbound["parkedCount"]),
            (f"{outbound['retryingCount']} outbound write(s) retrying", outbound["retryingCount"]),
            (f"{links.get(LinkStatus.ERROR, 0)} link(s) in error", links.get(LinkStatus.ERROR)),
            ("provider rate limit", instance.provider_degraded_until and instance.provider_degraded_until > now),
            (f"recent {recent_error['category'] if recent_error else ''} error",
             recent_error and (now - recent_error["at"]).total_seconds() < 900)) if on)
    else:
        status = HealthStatus.HEALTHY
    try:
        capabilities = adapter_class(instance.provider_key).capabilities.as_dict()
    except LookupError:
        capabilities = None
    return {
        "connectorInstanceId": str(instance.pk),
        "providerKey": instance.provider_key,
        "status": status,
        "statusReason": reason,
        "authError": ({"at": instance.auth_error_at, "detail": instance.auth_error_detail}
                      if instance.auth_error_at else None),
        "lastWebhookAt": instance.last_webhook_at,
        "lastPollAt": instance.last_poll_at,
        "lastReconcileAt": instance.last_reconcile_at,
        "webhookVerified": instance.webhook_verified,
        "webhookVerification": webhook_verification(instance),
        "webhookUrl": webhook_url(instance),
        # Appendix A.3-A.5 / §13.2: provider-side registrations and the last handshake
        "webhookRegistrations": public_registrations(instance),
        "handshake": {"lastAt": instance.last_handshake_at, "detail": instance.last_handshake_detail,
                      "openUntil": (instance.handshake_open_until
                                    if instance.handshake_open_until and instance.handshake_open_until > now else None)},
        "webhookRejectedCount": instance.webhook_rejected_count,
        "lastWebhookRejectedAt": instance.last_webhook_rejected_at,
        "lastWebhookRejectedReason": instance.last_webhook_rejected_reason,
        "queueDepth": queue["depth"],
        "oldestPendingAgeSeconds": round((now - queue["oldest"]).total_seconds(), 1) if queue["oldest"] else None,
        "retryCount": queue["retries"],
        "parkedCount": queue["parked"],
        "retries": [{"eventId": r["id"], "idempotencyKey": r["idempotency_key"],
                     "externalTaskId": r["external_task_id"], "attempts": r["attempts"],
                     "nextAttemptAt": r["next_attempt_at"], "errorCategory": r["error_category"]} for r in retries],
        "conflictCount": conflicts,
        # §11.2 kinds: field, deletion, closure, routing (a route that does not resolve on a linked task) and
        # policy (an edit the field policy keeps from the other side, §4.1.4)
        "conflictsByKind": {kind: conflicts_by_kind.get(kind, 0) for kind in ConflictKind.values},
        "links": {s: links.get(s, 0) for s in LinkStatus.values},
        "cursors": cursors,
        "lastError": ({"category": recent_error["category"], "message": recent_error["message"],
                       "at": recent_error["at"]} if recent_error else None),
        "errors": [{"category": e["category"], "message": e["message"], "at": e["at"],
                    "linkId": str(e["link_id"]) if e["link_id"] else None, "eventId": e["event_id"]} for e in errors],
        "capabilities": capabilities,
        "outbound": outbound,
    }


OUTBOUND_LISTED = 50


def outbound_health(instance: ConnectorInstance, now=None) -> dict:
    """§12.2 for the write outbox: pending writes (count, oldest, next due time), the scheduled retries
    and the parked/failed writes an operator can replay (3 queries)."""
    now = now or timezone.now()
    agg = OutboundEffect.objects.filter(instance=instance).aggregate(
        pending=Count("id", filter=Q(status=OutboundStatus.PENDING)),
        retrying=Count("id", filter=Q(status=OutboundStatus.PENDING, attempts__gt=0)),
        parked=Count("id", filter=Q(status=OutboundStatus.PARKED)),
        failed=Count("id", filter=Q(status=OutboundStatus.FAILED)),
        oldest=Min("created_at", filter=Q(status=OutboundStatus.PENDING)),
        next_retry=Min("next_attempt_at", filter=Q(status=OutboundStatus.PENDING, attempts__gt=0)),
        next_due=Min("next_attempt_at", filter=Q(status=OutboundStatus.PENDING)))
    fields = ("id", "link_id", "kind", "source_id", "status", "attempts", "next_attempt_at", "last_attempt_at",
              "parked_at", "error_category", "error_message", "created_at")
    retries = OutboundEffect.objects.filter(instance=instance, status=OutboundStatus.PENDING, attempts__gt=0) \
        .order_by("next_attempt_at", "id").values(*fields)[:OUTBOUND_LISTED]
    stuck = OutboundEffect.objects.filter(instance=instance, status__in=(OutboundStatus.PARKED, OutboundStatus.FAILED)) \
        .order_by("-id").values(*fields)[:OUTBOUND_LISTED]
    return {
        "pendingCount": agg["pending"], "retryingCount": agg["retrying"],
        "parkedCount": agg["parked"], "failedCount": agg["failed"],
        "oldestPendingAt": agg["oldest"],
        "oldestPendingAgeSeconds": round((now - agg["oldest"]).total_seconds(), 1) if agg["oldest"] else None,
        # the next retry of a write that failed (later writes of its link wait for it), else the next due write
        "nextAttemptAt": agg["next_retry"] or agg["next_due"],
        "retries": [_effect_row(r) for r in retries],
        "replayable": [_effect_row(r) for r in stuck],
    }


def _effect_row(row: dict) -> dict:
    return {"effectId": row["id"], "linkId": str(row["link_id"]), "kind": row["kind"], "sourceId": row["source_id"],
            "status": row["status"], "attempts": row["attempts"], "nextAttemptAt": row["next_attempt_at"],
            "lastAttemptAt": row["last_attempt_at"], "parkedAt": row["parked_at"],
            "errorCategory": row["error_category"], "errorMessage": (row["error_message"] or "")[:500],
            "createdAt": row["created_at"]}


def link_claim_state(link: TaskLink) -> dict:
    """§12.3: the host's claim/run state of the linked issue."""
    issue = link.issue
    run = issue.checkout_run
    return {"status": issue.status, "claimed": issue.checkout_run_id is not None,
            "checkoutRunId": str(issue.checkout_run_id) if issue.checkout_run_id else None,
            "runStatus": run.status if run else None,
            "assigneeAgentId": str(issue.assignee_agent_id) if issue.assignee_agent_id else None,
            "assigneeAgentName": issue.assignee_agent.name if issue.assignee_agent_id else None}


def link_activity(*, link: TaskLink, params):
    """§14.5: the audit entries of one link, newest first (limit/offset): its own (imports, commands,
    conflicts, interventions) and the rows of the issues it carried (the current one and those of its
    handoff history) that an event applied through this link caused (``details.linkId``, written by
    services/audit.py). Both are found through the indexed ``entity_id``."""
    from issues.models import ActivityLog

    limit, offset = list_window(params)
    issue_ids = {str(link.issue_id), *(str(h.get("issueId")) for h in link.handoff_history or () if h.get("issueId"))}
    caused = Q(entity_id__in=sorted(issue_ids), details__linkId=str(link.pk))
    own = Q(entity_type="connector_link", entity_id=str(link.pk))
    return ActivityLog.objects.filter(own | caused, company_id=link.company_id).order_by(
        "-created_at", "-id")[offset:offset + limit]
