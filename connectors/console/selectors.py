"""Reads of the connector console pages. List pages use a fixed number of grouped queries, whatever
the number of instances or conflicts (no per-row queries)."""
from __future__ import annotations

import difflib
import hashlib
import json
from datetime import timedelta

from django.db.models import Count, Max, Min, Q
from django.utils import timezone

from connectors.choices import (
    ConflictStatus,
    EventStatus,
    HealthStatus,
    InstanceStatus,
    LinkStatus,
    OutboundStatus,
    UNFINISHED_EVENT_STATUSES,
)
from connectors.models import Conflict, ConnectorInstance, InboundEvent, OutboundEffect, SyncError, TaskLink
from connectors.selectors import instance_health, link_claim_state
from issues.console.issues import revision_diff

PARKED_SHOWN = 50
AUTH_ERROR_WINDOW = timedelta(hours=1)  # how far back the list looks for errors
RECENT_ERROR_WINDOW = timedelta(minutes=15)


def instances_overview(company) -> list[dict]:
    """Every instance of ``company`` with its computed health status and counters (6 queries)."""
    now = timezone.now()
    instances = list(ConnectorInstance.objects.filter(company=company).order_by("name"))
    ids = [i.pk for i in instances]
    events = {row["instance_id"]: row for row in InboundEvent.objects.filter(instance_id__in=ids)
              .values("instance_id").annotate(
                  depth=Count("id", filter=Q(status=EventStatus.PENDING)),
                  retries=Count("id", filter=Q(status=EventStatus.FAILED)),
                  parked=Count("id", filter=Q(status=EventStatus.PARKED)),
                  oldest=Min("received_at", filter=Q(status__in=UNFINISHED_EVENT_STATUSES)))}
    conflicts = dict(Conflict.objects.filter(instance_id__in=ids, status=ConflictStatus.OPEN)
                     .values("instance_id").annotate(n=Count("id")).values_list("instance_id", "n"))
    outbound = {row["instance_id"]: row for row in OutboundEffect.objects.filter(
        instance_id__in=ids, status__in=(OutboundStatus.PENDING, OutboundStatus.PARKED)).values("instance_id")
        .annotate(retrying=Count("id", filter=Q(status=OutboundStatus.PENDING, attempts__gt=0)),
                  parked=Count("id", filter=Q(status=OutboundStatus.PARKED)))}
    links = {}
    for instance_id, status, n in (TaskLink.objects.filter(instance_id__in=ids).values("instance_id", "status")
                                   .annotate(n=Count("id")).values_list("instance_id", "status", "n")):
        links.setdefault(instance_id, {})[status] = n
    recent = {}
    for instance_id, category, at in (SyncError.objects.filter(instance_id__in=ids, at__gte=now - AUTH_ERROR_WINDOW)
                                      .values("instance_id", "category").annotate(at=Max("at"))
                                      .values_list("instance_id", "category", "at")):
        recent.setdefault(instance_id, {})[category] = at
    rows = []
    for instance in instances:
        ev = events.get(instance.pk) or {"depth": 0, "retries": 0, "parked": 0, "oldest": None}
        errs = recent.get(instance.pk, {})
        last_error_at = max(errs.values()) if errs else None
        if instance.status == InstanceStatus.PAUSED:
            status = HealthStatus.PAUSED
        elif instance.auth_error_at:  # §13.1.2, as connectors.selectors.instance_health
            status = HealthStatus.ERROR
        elif ev["parked"] or ev["retries"] or links.get(instance.pk, {}).get(LinkStatus.ERROR) or any(
                (outbound.get(instance.pk) or {}).get(k) for k in ("retrying", "parked")) or (
                instance.provider_degraded_until and instance.provider_degraded_until > now) or (
                last_error_at and now - last_error_at < RECENT_ERROR_WINDOW):
            status = HealthStatus.DEGRADED
        else:
            status = HealthStatus.HEALTHY
        instance_links = links.get(instance.pk, {})
        rows.append({
            "instance": instance, "status": status, "queue_depth": ev["depth"], "retries": ev["retries"],
            "parked": ev["parked"], "conflicts": conflicts.get(instance.pk, 0),
            "oldest_age": (now - ev["oldest"]).total_seconds() if ev["oldest"] else None,
            "links_active": sum(n for s, n in instance_links.items() if s != LinkStatus.UNLINKED),
            "links_error": instance_links.get(LinkStatus.ERROR, 0),
            "last_error_at": last_error_at,
        })
    return rows


def health_page(instance: ConnectorInstance) -> dict:
    """The §12.2 surface of one instance: ConnectorHealth plus parked events and the fingerprint the
    poller compares to decide whether anything changed."""
    health = instance_health(instance)
    parked = list(InboundEvent.objects.filter(instance=instance, status=EventStatus.PARKED)
                  .order_by("-id").only("id", "kind", "action", "external_task_id", "attempts", "error_category",
                                        "error_message", "last_attempt_at", "received_at")[:PARKED_SHOWN])
    outbound = health["outbound"]  # pending writes, scheduled retries, parked/failed (replayable)
    return {"health": health, "parked": parked, "outbound": outbound, "now": timezone.now(),
            "fingerprint": health_fingerprint(health, parked, outbound)}


def health_fingerprint(health: dict, parked, outbound) -> str:
    """A digest of everything shown except ages that move with the clock."""
    stable = {k: v for k, v in health.items() if k not in ("oldestPendingAgeSeconds", "cursors", "outbound")}
    stable["cursors"] = [(c["scope"], c["cursor"], c["updatedAt"]) for c in health["cursors"]]
    stable["parked"] = [p.pk for p in parked]
    stable["outbound"] = {k: v for k, v in outbound.items() if k != "oldestPendingAgeSeconds"}
    return hashlib.sha256(json.dumps(stable, sort_keys=True, default=str).encode()).hexdigest()[:16]


def is_quiet(health: dict) -> bool:
    """Nothing is in flight: no pending event, no scheduled retry, no pending outbound write."""
    return not health["queueDepth"] and not health["retryCount"] and not health["outbound"]["pendingCount"]


# --- conflicts ------------------------------------------------------------------------------------


def value_text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def value_diff(old, new) -> dict:
    """A readable diff from ``old`` to ``new`` (the template escapes every piece).

    One-line values: word-level segments ``(op, text)`` with op equal/del/add. Longer values: the
    lines of a unified diff ``(kind, line)`` with kind hunk/add/del/ctx."""
    a, b = value_text(old), value_text(new)
    if "\n" not in a and "\n" not in b:
        wa, wb = a.split(" "), b.split(" ")
        segments = []
        for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=wa, b=wb, autojunk=False).get_opcodes():
            if op == "equal":
                segments.append(("equal", " ".join(wa[i1:i2])))
                continue
            if i2 > i1:
                segments.append(("del", " ".join(wa[i1:i2])))
            if j2 > j1:
                segments.append(("add", " ".join(wb[j1:j2])))
        return {"inline": segments, "lines": None, "same": a == b}
    return {"inline": None, "lines": revision_diff(a, b, n=2), "same": a == b}


def conflict_rows(conflicts) -> list[dict]:
    rows = []
    for conflict in conflicts:
        rows.append({
            "conflict": conflict,
            "base": value_text(conflict.base_value),
            "external": value_text(conflict.external_value),
            "paperclip": value_text(conflict.paperclip_value),
            "diff": value_diff(conflict.paperclip_value, conflict.external_value),
            "actors": sorted((conflict.actors or {}).items()) if isinstance(conflict.actors, dict) else [],
        })
    return rows


# --- the issue's link panel -------------------------------------------------------------------------


def issue_link_surface(issue) -> list[dict]:
    """§12.3 for every link of ``issue`` (the unlinked ones last, for the record)."""
    links = list(TaskLink.objects.filter(issue=issue).select_related("instance", "issue", "issue__assignee_agent",
                                                                      "issue__checkout_run")
                 .order_by("status", "-created_at"))
    if not links:
        return []
    ids = [link.pk for link in links]
    conflicts = {}
    for conflict in Conflict.objects.filter(link_id__in=ids, status=ConflictStatus.OPEN).order_by("-detected_at"):
        conflicts.setdefault(conflict.link_id, []).append(conflict)
    events = {}
    for row in (InboundEvent.objects.filter(instance_id__in={link.instance_id for link in links},
                                            external_task_id__in={link.external_task_id for link in links},
                                            status__in=(*UNFINISHED_EVENT_STATUSES, EventStatus.PARKED))
                .values("instance_id", "external_task_id")
                .annotate(pending=Count("id", filter=Q(status=EventStatus.PENDING)),
                          retrying=Count("id", filter=Q(status=EventStatus.FAILED)),
                          parked=Count("id", filter=Q(status=EventStatus.PARKED)),
                          next_due=Min("next_attempt_at", filter=Q(status=EventStatus.FAILED)))):
        events[(row["instance_id"], row["external_task_id"])] = row
    outbound = dict(OutboundEffect.objects.filter(link_id__in=ids, status=OutboundStatus.PENDING)
                    .values("link_id").annotate(n=Count("id")).values_list("link_id", "n"))
    surface = []
    active = [link for link in links if link.status != LinkStatus.UNLINKED]
    for link in active + [link for link in links if link.status == LinkStatus.UNLINKED]:
        ev = events.get((link.instance_id, link.external_task_id)) or {}
        surface.append({
            "link": link,
            "claim": link_claim_state(link),
            "conflicts": conflicts.get(link.pk, []),
            "field_policy": sorted((link.field_policy or {}).items()),
            "routing": link.routing or {},
            "inbound_pending": ev.get("pending", 0), "inbound_retrying": ev.get("retrying", 0),
            "inbound_parked": ev.get("parked", 0), "next_retry_at": ev.get("next_due"),
            "outbound_pending": outbound.get(link.pk, 0),
        })
    return surface


def dashboard_summary(company) -> dict:
    rows = instances_overview(company)
    counts = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    return {"rows": rows, "counts": counts, "conflicts": sum(r["conflicts"] for r in rows),
            "parked": sum(r["parked"] for r in rows), "queue": sum(r["queue_depth"] for r in rows)}
