"""The outbox's queue discipline (§13.1.1, §10): per-link order, retries over hours, parking.

Order per link: effects are delivered in the order they became due (their id order). An effect is
not delivered while an earlier effect of the same link is *active*: pending and due, waiting for its
retry after a failed attempt, or claimed by a worker. Not active, so not holding later writes: a
debounced milestone comment still inside its window (never attempted), and a parked or failed
effect; like a poison event (§13.1.7) it must not hold the link forever, so later writes go out and
the operator replays it (``outbound_replay``, which skips a state write a later one superseded).
A delivery that finishes drains the link's next due effects in the same worker, in order.

Retries: exponential backoff with jitter (``RETRY_BASE_SECONDS`` doubling per attempt, capped at
``OUTBOUND_RETRY_MAX_SECONDS``, default 30 min), never sooner than the provider's ``retry_after``,
until the backoff schedule spans ``OUTBOUND_RETRY_HORIZON_SECONDS`` (default 24 h, about 56
attempts): then the effect is PARKED with an ``outbound_parked`` health entry. The horizon counts
the schedule (time spent retrying), not the effect's age: a paused instance or a stopped worker does
not spend it, and a replay starts a new one. Outages (5xx, transport), rate limits and credential
failures retry over the horizon; a permanent refusal (a 4xx the provider will answer the same way
again: 400, 404, 410, 422 …) is FAILED at once. A rate limit also holds the instance's other writes
until the provider's reset (``provider_degraded_until``), without spending their attempts."""
from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Exists, F, Min, OuterRef, Q
from django.utils import timezone

from connectors.choices import ErrorCategory, OutboundStatus
from connectors.models import ConnectorInstance, OutboundEffect, TaskLink
from connectors.providers.base import ProviderError
from connectors.secrets import SecretUnavailable

from .common import conf, failure_of, retry_backoff, sync_error_record

log = logging.getLogger("connectors.outbound")

# The first retries are kicked by the worker itself (with a countdown); later ones are minutes
# apart and ride the periodic sweep. Also bounds the inline chain of eager (brokerless) retries.
KICKED_RETRIES = 5
# 4xx answers that retrying can fix: auth and rate limits (own categories), timeouts, conflicts, locks.
TRANSIENT_4XX = (401, 403, 408, 409, 423, 425, 429)


def lease() -> timedelta:
    """How long a claimed delivery is left to its worker before another one retries it."""
    return timedelta(seconds=float(conf("OUTBOUND_DELIVERY_LEASE_SECONDS")))


def horizon_spent(attempts: int) -> float:
    """Seconds of backoff schedule (without jitter) that ``attempts`` failed attempts have used."""
    base, cap = float(conf("RETRY_BASE_SECONDS")), float(conf("OUTBOUND_RETRY_MAX_SECONDS"))
    total, step = 0.0, base
    for n in range(attempts):
        if step >= cap:
            return total + cap * (attempts - n)
        total, step = total + step, step * 2
    return total


def is_permanent(exc: Exception) -> bool:
    """A refusal the provider will repeat: a ``provider_status`` 4xx other than TRANSIENT_4XX."""
    return (isinstance(exc, ProviderError) and exc.category == ErrorCategory.PROVIDER_STATUS
            and exc.status is not None and 400 <= exc.status < 500 and exc.status not in TRANSIENT_4XX)


# ------------------------------------------------------------------------------------------- order
def _active(now) -> Q:
    return Q(status=OutboundStatus.PENDING) & (Q(attempts__gt=0) | Q(next_attempt_at__isnull=True)
                                               | Q(next_attempt_at__lte=now))


def _due(now) -> Q:
    return Q(status=OutboundStatus.PENDING) & (Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now))


def blocker(effect: OutboundEffect, now) -> int | None:
    """The earlier active effect of the same link this one waits for, if any."""
    return (OutboundEffect.objects.filter(_active(now), link_id=effect.link_id, id__lt=effect.pk)
            .order_by("id").values_list("pk", flat=True).first())


def next_due(link_id, now=None) -> int | None:
    """The link's first due pending effect (what a finished delivery drains next)."""
    return (OutboundEffect.objects.filter(_due(now or timezone.now()), link_id=link_id).order_by("id")
            .values_list("pk", flat=True).first())


def heads_due(limit: int | None = None) -> list[int]:
    """Due pending effects that no earlier active effect of their link holds (the sweep's work;
    a lease that expired is due again)."""
    now = timezone.now()
    earlier = OutboundEffect.objects.filter(_active(now), link_id=OuterRef("link_id"), id__lt=OuterRef("id"))
    return list(OutboundEffect.objects.filter(_due(now)).exclude(Exists(earlier)).order_by("id")
                .values_list("pk", flat=True)[:limit or int(conf("SWEEP_BATCH"))])


def deferred_until(instance: ConnectorInstance, now) -> datetime | None:
    """While the provider's rate limit lasts, writes wait for its reset instead of spending attempts."""
    until = instance.provider_degraded_until
    return until if until and until > now else None


# ----------------------------------------------------------------------------------------- failure
def failure_record(effect: OutboundEffect, link: TaskLink, exc: Exception) -> str:
    """Record a failed attempt: ``retry`` (backoff), ``parked`` (horizon spent) or ``failed``
    (permanent refusal), with a health entry for the first failure of a kind and for the outcome."""
    category, message = failure_of(exc)
    if isinstance(exc, SecretUnavailable):  # credentials that do not resolve: the credential path (§13.1.2)
        category = ErrorCategory.PROVIDER_AUTH
    now = timezone.now()
    retry_after = getattr(exc, "retry_after", None)
    with transaction.atomic():
        row = OutboundEffect.objects.select_for_update().filter(pk=effect.pk).first()
        if row is None or row.status != OutboundStatus.PENDING:
            return "not_pending"  # cancelled meanwhile (unlink)
        # a health entry for the first failure of a kind (one provider_auth entry also opens the
        # instance's credential incident again after a write went through meanwhile)
        new_kind = row.attempts <= 1 or row.error_category != category or (
            category == ErrorCategory.PROVIDER_AUTH and not link.instance.auth_error_at)
        row.error_message, row.error_category = message, category
        what = f"Outbound {row.kind} {row.source_id}"
        horizon = float(conf("OUTBOUND_RETRY_HORIZON_SECONDS"))
        if is_permanent(exc):
            row.status, row.next_attempt_at, result = OutboundStatus.FAILED, None, "failed"
        elif horizon_spent(row.attempts) >= horizon:
            row.status, row.next_attempt_at, row.parked_at, result = OutboundStatus.PARKED, None, now, "parked"
        else:
            row.next_attempt_at = now + retry_backoff(row.attempts, retry_after,
                                                      cap=float(conf("OUTBOUND_RETRY_MAX_SECONDS")))
            result = "retry"
        row.save(update_fields=["status", "error_message", "error_category", "next_attempt_at", "parked_at"])
        details = {"effectId": row.pk, "attempts": row.attempts, "lastCategory": category}
        if result == "parked":
            sync_error_record(instance=link.instance, category=ErrorCategory.OUTBOUND_PARKED, link=link,
                              details=details, message=f"{what} parked after {row.attempts} attempts over the "
                                                       f"{horizon / 3600:g} h retry horizon: {message}")
        elif result == "failed":
            sync_error_record(instance=link.instance, category=category, link=link, details=details,
                              message=f"{what} refused by the provider, not retried: {message}")
        elif new_kind:
            sync_error_record(instance=link.instance, category=category, link=link, details=details,
                              message=f"{what} (attempt {row.attempts}) failed; retrying with backoff: {message}")
        if category == ErrorCategory.PROVIDER_RATE_LIMITED and retry_after:
            ConnectorInstance.objects.filter(pk=link.instance_id).filter(
                Q(provider_degraded_until__isnull=True) | Q(provider_degraded_until__lt=now + timedelta(
                    seconds=float(retry_after)))).update(provider_degraded_until=now + timedelta(
                        seconds=float(retry_after)))
    log.info("outbound effect %s link=%s instance=%s kind=%s attempt=%s outcome=%s category=%s", row.pk,
             link.pk, link.instance_id, row.kind, row.attempts, result, category)
    if result == "retry" and row.attempts < KICKED_RETRIES:
        _kick_retry(row)
    return result


def pending_kick(instance_id):
    """Make the instance's retrying writes due now (not the ones a worker holds) and deliver the
    first pending write of each link after commit; its delivery drains the rest of the link."""
    now = timezone.now()
    pending = OutboundEffect.objects.filter(instance_id=instance_id, status=OutboundStatus.PENDING)
    in_flight = Q(last_attempt_at__isnull=False, next_attempt_at=F("last_attempt_at") + lease())
    pending.filter(attempts__gt=0, next_attempt_at__gt=now).exclude(in_flight).update(next_attempt_at=now)
    heads = list(pending.values("link_id").annotate(first=Min("id")).values_list("first", flat=True))

    def send():
        from .kicks import outbound_delivery

        for effect_id in heads:
            outbound_delivery(effect_id)

    if heads:
        transaction.on_commit(send)


def _kick_retry(row: OutboundEffect):
    from .kicks import outbound_delivery

    outbound_delivery(row.pk, max((row.next_attempt_at - timezone.now()).total_seconds(), 0))
