"""Operator interventions (§13.3): pause/resume instance and link, resync a link, replay a parked
event, rotate credentials, unlink. Each is audit-logged with its actor and idempotency key (§14.5)
and idempotent on (company, idempotency key)."""
from __future__ import annotations

from django.db import IntegrityError, transaction
from django.utils import timezone

from connectors import secrets
from connectors.choices import (
    ConflictStatus,
    EventKindChoice,
    EventSource,
    EventStatus,
    InstanceStatus,
    InterventionAction,
    LinkStatus,
    OutboundStatus,
    UNFINISHED_EVENT_STATUSES,
)
from connectors.models import Conflict, ConnectorInstance, InboundEvent, Intervention, OutboundEffect, TaskLink
from connectors.providers.base import EventKind, ExternalTaskRef, ProviderError, VerifiedEvent
from issues.actors import Actor
from issues.choices import MemberRole
from issues.exceptions import Conflict as ConflictError
from issues.exceptions import Forbidden, InvalidInput, NotFound, Unprocessable
from issues.services.activity import activity_record

from . import audit
from .common import adapter_for, link_set_status, sync_error_record
from .credential_health import credentials_ok
from .outbound_queue import pending_kick

ADMIN_ROLES = (MemberRole.OWNER, MemberRole.ADMIN)


def require_board(actor: Actor):
    actor.ensure_board("Connector administration is for board users.")


def require_admin(actor: Actor, company_id):
    require_board(actor)
    if actor.system:
        return
    if actor.roles.get(company_id) not in ADMIN_ROLES:
        raise Forbidden("Only owners and admins manage connectors and their secrets.", code="admin_only")


def require_writer(actor: Actor, company_id):
    require_board(actor)
    actor.ensure_can_write(company_id)


def intervene(*, actor: Actor, instance: ConnectorInstance, action: str, target_id, key: str, reason: str, apply):
    """Run ``apply()`` once per idempotency key; a repeat returns the first result."""
    require_writer(actor, instance.company_id)
    if not key or not key.strip():
        raise InvalidInput(details={"idempotencyKey": ["This field is required."]})
    key = key.strip()[:200]
    existing = Intervention.objects.filter(company_id=instance.company_id, idempotency_key=key).first()
    if existing is not None:
        return _repeat(existing, action, target_id)
    try:
        with transaction.atomic():
            result = apply() or {}
            row = Intervention.objects.create(company_id=instance.company_id, instance=instance, action=action,
                                              target_id=str(target_id), idempotency_key=key,
                                              actor_user=actor.user if actor.is_board else None,
                                              reason=(reason or "")[:500], result=result)
            activity_record(actor=actor, company_id=instance.company_id, action=f"connector.{action}",
                            entity_type="connector_link" if action.startswith("link.") else "connector",
                            entity_id=target_id, details={"instanceId": str(instance.pk), "idempotencyKey": key,
                                                          "reason": reason or "", "result": result})
    except IntegrityError:
        existing = Intervention.objects.filter(company_id=instance.company_id, idempotency_key=key).first()
        if existing is None:
            raise
        return _repeat(existing, action, target_id)
    return {**row.result, "interventionId": row.pk, "replayed": False}


def _repeat(existing: Intervention, action: str, target_id):
    if existing.action != action or existing.target_id != str(target_id):
        raise ConflictError("This idempotency key was used for another intervention.", code="idempotency_key_reused",
                            details={"idempotencyKey": [existing.idempotency_key]})
    return {**existing.result, "interventionId": existing.pk, "replayed": True}


# ---------------------------------------------------------------------------------- instance level
def instance_pause(*, actor: Actor, instance: ConnectorInstance, idempotency_key: str, reason: str = "") -> dict:
    def apply():
        row = ConnectorInstance.objects.select_for_update().get(pk=instance.pk)
        previous = row.status
        row.status, row.status_detail = InstanceStatus.PAUSED, reason or "paused by an operator"
        row.save(update_fields=["status", "status_detail", "updated_at"])
        return {"status": row.status, "previous": previous}

    return intervene(actor=actor, instance=instance, action=InterventionAction.INSTANCE_PAUSE, target_id=instance.pk,
                      key=idempotency_key, reason=reason, apply=apply)


def instance_resume(*, actor: Actor, instance: ConnectorInstance, idempotency_key: str, reason: str = "") -> dict:
    def apply():
        row = ConnectorInstance.objects.select_for_update().get(pk=instance.pk)
        previous = row.status
        row.status, row.status_detail = InstanceStatus.ACTIVE, ""
        row.save(update_fields=["status", "status_detail", "updated_at"])
        pending = pending_task_ids(row)
        transaction.on_commit(lambda: _kick_all(row.pk, pending))
        return {"status": row.status, "previous": previous, "queuedTasks": len(pending)}

    return intervene(actor=actor, instance=instance, action=InterventionAction.INSTANCE_RESUME,
                      target_id=instance.pk, key=idempotency_key, reason=reason, apply=apply)


def pending_task_ids(instance, limit: int = 10_000) -> list[str]:
    return list(InboundEvent.objects.filter(instance=instance, status__in=UNFINISHED_EVENT_STATUSES)
                .exclude(external_task_id="").values_list("external_task_id", flat=True).distinct()[:limit])


def _kick_all(instance_id, task_ids):
    from connectors import tasks

    from .kicks import enabled

    if not enabled():
        return  # the in-process worker drains the queues (services/kicks.py)
    for task_id in task_ids:
        tasks.process_task_events.delay(str(instance_id), task_id)


def credentials_rotate(*, actor: Actor, instance: ConnectorInstance, idempotency_key: str,
                       credentials: str | None = None, webhook_secret: str | None = None, reason: str = "") -> dict:
    """Each value is a reference (``env:NAME``) or ``{"value": plaintext}`` which is stored encrypted.
    Replaced stored secrets are deleted."""
    require_admin(actor, instance.company_id)
    if credentials is None and webhook_secret is None:
        raise InvalidInput(details={"credentials": ["Give credentials and/or webhookSecret."]})

    def apply():
        from connectors.models import ConnectorSecret

        row = ConnectorInstance.objects.select_for_update().get(pk=instance.pk)
        changed, old = [], []
        for field, value, label in (("credentials_ref", credentials, "credentials"),
                                    ("webhook_secret_ref", webhook_secret, "webhook secret")):
            if value is None:
                continue
            old.append(getattr(row, field))
            setattr(row, field, secret_input(value, company=row.company, name=f"{row.name} {label}",
                                             field="credentials" if field == "credentials_ref" else "webhookSecret"))
            changed.append(field.removesuffix("_ref"))
        if "webhook_secret" in changed:
            row.webhook_verified = False
        row.save()
        stale = [r.split(":", 1)[1] for r in old if r.startswith("secret:") and r not in
                 (row.credentials_ref, row.webhook_secret_ref)]
        ConnectorSecret.objects.filter(pk__in=stale, company_id=row.company_id).delete()
        # §13.1.2: new credentials end a credential incident; pending writes retry now, not at their backoff
        credentials_ok(row, cause="credentials rotated")
        pending_kick(row.pk)
        return {"rotated": changed}

    return intervene(actor=actor, instance=instance, action=InterventionAction.CREDENTIALS_ROTATE,
                      target_id=instance.pk, key=idempotency_key, reason=reason, apply=apply)


def secret_input(value, *, company, name: str, field: str) -> str:
    """An API/CLI secret value -> a reference that resolves for ``company`` now. Strings must already
    be references; an ``env:`` name the server's allow-list does not give this company, or an unset
    one, is a 400 naming the field (one answer for both: no probing for variables), another
    company's stored secret a 404 (as if it did not exist)."""
    if isinstance(value, dict):
        plain = value.get("value")
        if not isinstance(plain, str) or not plain or set(value) != {"value"}:
            raise InvalidInput(details={field: ["Use 'env:NAME' or {\"value\": \"…\"} (stored encrypted)."]})
        return secrets.secret_store(company=company, name=name, value=plain)
    if value == "":
        return value
    if isinstance(value, str) and secrets.ENV_REF.match(value):
        try:
            secrets.resolve(value, company_id=company.pk, field=field)
        except secrets.SecretUnavailable as exc:
            raise InvalidInput(details={field: [exc.message]}) from None
        return value
    if isinstance(value, str) and secrets.STORED_REF.match(value):
        from connectors.models import ConnectorSecret

        if ConnectorSecret.objects.filter(pk=value.split(":", 1)[1], company=company).exists():
            return value
        raise NotFound("No such stored secret.", details={field: ["No such stored secret in this company."]})
    raise InvalidInput(details={field: ["Must be a secret reference ('env:NAME') or {\"value\": \"…\"}; "
                                        "inline secrets are never stored in configuration."]})


# -------------------------------------------------------------------------------------- link level
def link_pause(*, actor: Actor, link: TaskLink, idempotency_key: str, reason: str = "") -> dict:
    def apply():
        row = TaskLink.objects.select_for_update().get(pk=link.pk)
        if row.status == LinkStatus.UNLINKED:
            raise Unprocessable("The link is unlinked.", code="link_unlinked")
        if row.status != LinkStatus.PAUSED:
            row.paused_from_status = row.status
            link_set_status(row, LinkStatus.PAUSED, "operator pause", detail=reason or "paused by an operator",
                            key=idempotency_key, save_fields=("paused_from_status",))
        return {"status": row.status}

    return intervene(actor=actor, instance=link.instance, action=InterventionAction.LINK_PAUSE, target_id=link.pk,
                      key=idempotency_key, reason=reason, apply=apply)


def link_resume(*, actor: Actor, link: TaskLink, idempotency_key: str, reason: str = "") -> dict:
    def apply():
        row = TaskLink.objects.select_for_update().get(pk=link.pk)
        if row.status == LinkStatus.PAUSED:
            target = row.paused_from_status or LinkStatus.HEALTHY
            row.paused_from_status = ""
            link_set_status(row, target, "operator resume", detail="", key=idempotency_key,
                            save_fields=("paused_from_status",))
            resync_after_commit(row)
        return {"status": row.status}

    return intervene(actor=actor, instance=link.instance, action=InterventionAction.LINK_RESUME, target_id=link.pk,
                      key=idempotency_key, reason=reason, apply=apply)


def link_unlink(*, actor: Actor, link: TaskLink, idempotency_key: str, reason: str = "") -> dict:
    """§6.4: sever sync, delete neither side; the record is retained for audit."""
    def apply():
        row = TaskLink.objects.select_for_update().get(pk=link.pk)
        if row.status != LinkStatus.UNLINKED:
            link_set_status(row, LinkStatus.UNLINKED, "operator unlink", detail=reason or "unlinked by an operator",
                            key=idempotency_key)
            OutboundEffect.objects.filter(link=row, status=OutboundStatus.PENDING).update(
                status=OutboundStatus.CANCELLED)
            Conflict.objects.filter(link=row, status=ConflictStatus.OPEN).update(
                status=ConflictStatus.DISMISSED, resolution="unlink", resolved_at=timezone.now())
        return {"status": row.status, "issueId": str(row.issue_id)}

    return intervene(actor=actor, instance=link.instance, action=InterventionAction.LINK_UNLINK, target_id=link.pk,
                      key=idempotency_key, reason=reason, apply=apply)


def link_resync(*, actor: Actor, link: TaskLink, idempotency_key: str, reason: str = "") -> dict:
    def apply():
        if link.status == LinkStatus.UNLINKED:
            raise Unprocessable("The link is unlinked.", code="link_unlinked")
        resync_after_commit(link)
        return {"queued": True}

    return intervene(actor=actor, instance=link.instance, action=InterventionAction.LINK_RESYNC, target_id=link.pk,
                      key=idempotency_key, reason=reason, apply=apply)


def resync_after_commit(link: TaskLink):
    from connectors import tasks

    link_id = str(link.pk)
    transaction.on_commit(lambda: tasks.resync_link.delay(link_id))


def link_resync_now(*, link_id) -> dict:
    """Re-read the task and its comments and queue them as events (applied in order, idempotently)."""
    link = TaskLink.objects.select_related("instance").filter(pk=link_id).first()
    if link is None or link.status == LinkStatus.UNLINKED:
        return {"queued": 0}
    instance = link.instance
    from .inbound import event_store, kick

    ref = ExternalTaskRef(external_id=link.external_task_id, external_key=link.external_key or None)
    stamp = timezone.now().isoformat()
    try:
        adapter = adapter_for(instance)
        task = adapter.get_task(ref)
        comments, cursor = [], None
        for _ in range(50):
            page = adapter.list_comments(ref, cursor)
            comments += page.items
            if not page.cursor or page.cursor == cursor:
                break
            cursor = page.cursor
    except ProviderError as exc:
        if exc.status == 404:
            with transaction.atomic():
                event_store(instance=instance, source=EventSource.RESYNC, event=VerifiedEvent(
                    event_id=f"resync:{link.pk}:{stamp}:deleted", kind=EventKind.TASK_DELETED, action="resync.missing",
                    external_task_id=link.external_task_id))
                kick(instance.pk, link.external_task_id)
            return {"queued": 1}
        sync_error_record(instance=instance, category=exc.category, link=link, message=f"Resync failed: {exc}")
        raise
    with transaction.atomic():
        event_store(instance=instance, source=EventSource.RESYNC, event=VerifiedEvent(
            event_id=f"resync:{link.pk}:{stamp}:task", kind=EventKind.TASK_UPSERTED, action="resync",
            external_task_id=task.external_id, task=task, container_id=task.container_id))
        for comment in comments:
            event_store(instance=instance, source=EventSource.RESYNC, event=VerifiedEvent(
                event_id=f"resync:{link.pk}:comment:{comment.external_comment_id}:"
                         f"{comment.updated_at.isoformat() if comment.updated_at else ''}",
                kind=EventKind.COMMENT_UPSERTED, action="resync.comment", external_task_id=task.external_id,
                comment=comment, actor=comment.author))
        kick(instance.pk, task.external_id)
    return {"queued": 1 + len(comments)}


# ------------------------------------------------------------------------------------------ events
def event_replay(*, actor: Actor, event: InboundEvent, idempotency_key: str, reason: str = "") -> dict:
    def apply():
        row = InboundEvent.objects.select_for_update().get(pk=event.pk)
        if row.status != EventStatus.PARKED:
            raise Unprocessable("Only parked events are replayed.", code="event_not_parked",
                                details={"status": row.status})
        if row.kind == EventKindChoice.UNPARSED:  # §13.1.8: verify and parse the raw body again, with this code
            from .intake import unparsed_replay

            return unparsed_replay(event=row)
        row.status, row.attempts, row.next_attempt_at = EventStatus.PENDING, 0, None
        row.outcome = "replay requested"
        row.save(update_fields=["status", "attempts", "next_attempt_at", "outcome"])
        if row.external_task_id:
            from .inbound import kick

            kick(row.instance_id, row.external_task_id)
        return {"eventId": row.pk, "status": row.status}

    return intervene(actor=actor, instance=event.instance, action=InterventionAction.EVENT_REPLAY,
                      target_id=event.pk, key=idempotency_key, reason=reason, apply=apply)


def _fetch_task(instance: ConnectorInstance, external_task_id: str | None, external_key: str | None):
    if not (external_task_id or external_key):
        raise InvalidInput(details={"externalKey": ["Give externalKey or externalTaskId."]})
    try:
        return adapter_for(instance).get_task(ExternalTaskRef(external_id=external_task_id or "",
                                                              external_key=external_key or None))
    except ProviderError as exc:
        if exc.status in (404, 410):
            raise InvalidInput(details={"externalKey": ["No such external task."]})
        raise Unprocessable(f"The provider could not be read: {exc}", code=exc.category)


def task_import_manual(*, actor: Actor, instance: ConnectorInstance, idempotency_key: str,
                       external_task_id: str | None = None, external_key: str | None = None) -> dict:
    """§6.2 import by an operator (also for terminal tasks); dedupe of §6.3 applies."""
    require_writer(actor, instance.company_id)
    task = _fetch_task(instance, external_task_id, external_key)
    from .apply_base import active_link
    from .apply_tasks import task_import

    def apply():
        with transaction.atomic():
            existing = active_link(instance, task.external_id)
            if existing is not None:
                return {"linkId": str(existing.pk), "issueId": str(existing.issue_id), "created": False}
            with audit.operator_cause(instance=instance, key=idempotency_key, external_task_id=task.external_id):
                task_import(instance=instance, task=task, key=idempotency_key, manual=True)
            link = active_link(instance, task.external_id)
            return {"linkId": str(link.pk), "issueId": str(link.issue_id), "created": True}

    return intervene(actor=actor, instance=instance, action=InterventionAction.TASK_IMPORT,
                      target_id=task.external_id, key=idempotency_key, reason="", apply=apply)


def link_manual_create(*, actor: Actor, instance: ConnectorInstance, issue, idempotency_key: str,
                       external_task_id: str | None = None, external_key: str | None = None) -> dict:
    require_writer(actor, instance.company_id)
    task = _fetch_task(instance, external_task_id, external_key)
    from .links import link_manual

    def apply():
        link = link_manual(actor=actor, instance=instance, issue=issue, task=task, key=idempotency_key)
        return {"linkId": str(link.pk), "issueId": str(issue.pk), "status": link.status}

    return intervene(actor=actor, instance=instance, action=InterventionAction.LINK_CREATE,
                      target_id=task.external_id, key=idempotency_key, reason="", apply=apply)
