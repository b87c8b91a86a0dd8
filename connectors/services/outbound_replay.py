"""Operator replay of parked and failed outbound writes (§13.3, §13.1.1): one effect, or every
parked/failed effect of an instance. Audited and idempotent on the operator's key (``intervene``).

A replayed effect is pending again with a fresh retry horizon and is delivered in its link's order
(it waits for an earlier write of the link that is still retrying). It keeps its marker check: a
comment whose first attempts may have reached the provider is looked up before it is posted, so a
replay never posts it twice. A state write that a later state write of the same link already
delivered is not replayed (it would move the tracker back): it is cancelled as superseded."""
from __future__ import annotations


from django.db import transaction

from connectors.choices import InterventionAction, OutboundKind, OutboundStatus
from connectors.models import ConnectorInstance, OutboundEffect
from issues.actors import Actor
from issues.exceptions import Unprocessable

from .interventions import intervene


REPLAYABLE = (OutboundStatus.PARKED, OutboundStatus.FAILED)


def effect_replay(*, actor: Actor, effect: OutboundEffect, idempotency_key: str, reason: str = "") -> dict:
    def apply():
        row = OutboundEffect.objects.select_for_update().get(pk=effect.pk)
        if row.status not in REPLAYABLE:
            raise Unprocessable("Only parked or failed outbound writes are replayed.", code="outbound_not_replayable",
                                details={"status": [row.status]})
        outcome = _requeue(row)
        if outcome == "queued":
            _kick_after_commit([row.pk])
        return {"effectId": row.pk, "status": row.status, "outcome": outcome}

    return intervene(actor=actor, instance=effect.instance, action=InterventionAction.OUTBOUND_REPLAY,
                      target_id=effect.pk, key=idempotency_key, reason=reason, apply=apply)


def instance_outbound_replay(*, actor: Actor, instance: ConnectorInstance, idempotency_key: str,
                             reason: str = "") -> dict:
    """Every parked and failed effect of ``instance``, in id order (one intervention)."""
    def apply():
        rows = list(OutboundEffect.objects.select_for_update().filter(instance=instance, status__in=REPLAYABLE)
                    .order_by("id"))
        queued, superseded = [], []
        for row in rows:
            (queued if _requeue(row) == "queued" else superseded).append(row.pk)
        heads = {}
        for row in rows:  # the first replayed write of each link; its delivery drains the rest in order
            if row.pk in queued:
                heads.setdefault(row.link_id, row.pk)
        _kick_after_commit(list(heads.values()))
        return {"status": "queued", "replayedCount": len(queued), "effectIds": queued,
                "supersededEffectIds": superseded}

    return intervene(actor=actor, instance=instance, action=InterventionAction.OUTBOUND_REPLAY,
                      target_id=instance.pk, key=idempotency_key, reason=reason, apply=apply)


def _requeue(row: OutboundEffect) -> str:
    """``queued``: pending again, due now, a fresh horizon (attempts restart; ``last_attempt_at`` is
    kept so a comment is looked up by its marker before it is posted). ``superseded``: cancelled."""
    if row.kind == OutboundKind.STATE:
        later = (OutboundEffect.objects.filter(link_id=row.link_id, kind=OutboundKind.STATE, id__gt=row.pk,
                                               status=OutboundStatus.DONE).values_list("pk", flat=True).first())
        if later:
            row.status, row.next_attempt_at = OutboundStatus.CANCELLED, None
            row.error_message = f"not replayed: superseded by state write #{later}"
            row.save(update_fields=["status", "next_attempt_at", "error_message"])
            return "superseded"
    row.status, row.attempts, row.next_attempt_at, row.parked_at = OutboundStatus.PENDING, 0, None, None
    row.save(update_fields=["status", "attempts", "next_attempt_at", "parked_at"])
    return "queued"


def _kick_after_commit(effect_ids: list[int]):
    def send():
        from .kicks import outbound_delivery

        for effect_id in effect_ids:
            outbound_delivery(effect_id)

    if effect_ids:
        transaction.on_commit(send)
