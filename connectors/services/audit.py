"""§14.5 / §12.1: what the engine writes while it applies one inbound event is attributable.

:func:`attributed` wraps ``inbound.event_apply``: while the event applies, every activity row the
issues app records (issue created/updated, comment created, wakes...) carries the cause in its details
(``issues.services.activity.activity_context``; the issues app knows nothing of connectors)::

    {"source": "connector", "eventSource": "webhook"|"poll"|..., "connectorInstanceId", "providerKey",
     "linkId", "eventKey", "eventKind", "externalTaskId", "externalActor": {...} | None}

and the engine's log lines carry the §12.1 keys (services/logctx.py); one line per applied, dropped
or failed event. ``linkId`` is known once the event's link is: found (``apply_base.active_link``),
reserved by an import before it creates the issue, or created (``links.link_create``)."""
from __future__ import annotations

import functools
import logging
from contextlib import contextmanager

from issues.services.activity import activity_context, activity_context_add

from . import codec, content, logctx


def event_cause(instance, event) -> dict:
    try:
        verified = codec.event_load(event.payload)
    except Exception:  # noqa: BLE001 — the apply reports a payload it cannot read; the cause goes without an actor
        verified = None
    actor = getattr(verified, "actor", None) or getattr(getattr(verified, "comment", None), "author", None)
    return {"source": "connector", "eventSource": event.source, "connectorInstanceId": str(instance.pk),
            "providerKey": instance.provider_key, "eventKey": event.idempotency_key, "eventKind": event.kind,
            "externalTaskId": event.external_task_id, "externalActor": content.actor_dict(actor)}


def attributed(apply):
    """Decorate ``event_apply(*, instance, event) -> Outcome``."""
    @functools.wraps(apply)
    def wrapper(*, instance, event):
        with activity_context(**event_cause(instance, event)), \
                logctx.trace(connectorInstanceId=str(instance.pk), providerKey=instance.provider_key,
                             externalTaskId=event.external_task_id or None, eventKind=event.kind,
                             idempotencyKey=event.idempotency_key):
            try:
                outcome = apply(instance=instance, event=event)
            except Exception as exc:
                logctx.engine_log(logging.WARNING, "connector event failed", outcome="failed",
                                  error=f"{type(exc).__name__}: {exc}"[:300])
                raise
            logctx.engine_log(logging.INFO, f"connector event {outcome.status}", outcome=outcome.status,
                              detail=outcome.text[:300])
        return outcome
    return wrapper


def link_reserved(link_id) -> None:
    """An import creates its issue before its link: the issue's rows already name the link to be."""
    activity_context_add(linkId=str(link_id))
    logctx.trace_add(linkId=str(link_id))


def link_bound(link) -> None:
    """The event's writes go through ``link`` from now on."""
    activity_context_add(linkId=str(link.pk))
    logctx.trace_add(**logctx.link_fields(link))


@contextmanager
def operator_cause(*, instance, key: str, external_task_id: str):
    """An operator's connector action that writes issues (a manual import): its rows name the
    instance, the request's idempotency key and the link it makes, like an event's."""
    with activity_context(source="connector", eventSource="operator", connectorInstanceId=str(instance.pk),
                          providerKey=instance.provider_key, eventKey=key, externalTaskId=external_task_id,
                          externalActor=None), \
            logctx.trace(connectorInstanceId=str(instance.pk), providerKey=instance.provider_key,
                         externalTaskId=external_task_id, idempotencyKey=key, eventKind="operator.import"):
        yield
