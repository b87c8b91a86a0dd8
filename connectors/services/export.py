"""Export (§6.2.2, §4.1.4): create the external task of a Paperclip issue (``originSide=paperclip``).

One export is a ``TaskExport`` row, idempotent on (instance, idempotency key). It is recorded and
claimed *before* the provider is called, and the projection's description carries the Paperclip
backlink (a visible "Exported from Paperclip" line, plus a hidden ``<!-- paperclip:issue=<id> -->``
marker where the provider keeps HTML comments). So a retry of an attempt whose answer was lost (the
provider created the task, the client saw an error or a timeout, or the process died before the link)
first looks for the task it created, in the tasks updated since the export began, and links that one:
the key creates one external task. A new key for the same issue and container looks for the task of
the issue's earlier unlinked exports the same way (§6.3: the backlink already on the external task). Nothing is half-written: the link, the backlink effect, the
intervention and the audit rows commit together, after the provider answered; a provider failure
leaves the export ``failed`` with its error (a health entry too) and no link.

Defaults of an exported link (§4.1.4, §4.2.1):
* field policy: the instance's, with every content field it gives to ``external`` (title,
  description, priority, labels, dueAt) given to ``paperclip`` instead; ``shared`` stays shared and
  ``state`` keeps the instance's owner (``shared`` by default, mediated by §7.4 and §10.3);
* sync mode: the instance default when it writes (``bidirectional``, ``export_only``); otherwise
  (``import_only``, ``observer``, ``disabled``) ``bidirectional``: an export is a write, and the
  tracker's state changes still come back;
* run mode and write toggles: the instance's.

The projection carries the title, the description with the backlink, and the fields the provider
declares settable (``capabilities.settable_fields``): priority for Linear and Jira. Labels are
projected only for a provider declaring them settable (none today: the outbound engine never syncs
labels, and Linear refuses labels its team does not have)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from connectors.choices import ErrorCategory, ExportStatus, InstanceStatus, InterventionAction, LinkStatus, OriginSide
from connectors.models import ConnectorInstance, TaskExport, TaskLink
from connectors.providers.base import ExternalTask, ProviderError
from issues.actors import Actor
from issues.exceptions import ApiError, InvalidInput, NotFound
from issues.exceptions import Conflict as ConflictError
from issues.models import Issue
from issues.services.activity import activity_record

from . import links
from .common import adapter_class, adapter_for, conf, failure_of, sync_error_record
from .conflicts import PRIORITY_NUMBER  # Paperclip priority -> the 0-4 number the adapters write
from .export_marks import CLOCK_SKEW, created_by, export_footer
from .interventions import intervene, require_writer
from .outbound import WRITE_SYNC_MODES

log = logging.getLogger("connectors.export")

CONTENT_FIELDS = ("title", "description", "priority", "labels", "dueAt")


@dataclass(frozen=True)
class ExportOutcome:
    export: TaskExport
    link: TaskLink | None
    created: bool  # this request linked the task (API 201); False for a repeat of a linked export (200)


class ExportProviderError(ApiError):
    """The provider refused the creation or did not answer: 502 (503 when it rate-limits us)."""

    status_code = 502
    code = "provider_error"


# ----------------------------------------------------------------------------------- policies
def can_create_tasks(provider_key: str) -> bool:
    try:
        return "create_task" in adapter_class(provider_key).capabilities.operations
    except LookupError:
        return False


def export_sync_mode(instance: ConnectorInstance) -> str:
    return instance.default_sync_mode if instance.default_sync_mode in WRITE_SYNC_MODES else "bidirectional"


def export_field_policy(instance: ConnectorInstance) -> dict:
    policy = dict(instance.field_policy or {})
    for field in CONTENT_FIELDS:
        if policy.get(field, "external") == "external":
            policy[field] = "paperclip"
    policy.setdefault("state", "shared")
    return policy


def export_projection(issue: Issue, instance: ConnectorInstance) -> dict:
    settable = adapter_class(instance.provider_key).capabilities.settable_fields
    footer = export_footer(issue)
    body = (issue.description or "").strip()
    projection = {"title": issue.title, "description": f"{body}\n\n---\n{footer}" if body else footer}
    if "priority" in settable:
        projection["priority"] = PRIORITY_NUMBER.get(issue.priority)
    if "labels" in settable:
        projection["labels"] = sorted(issue.labels.values_list("name", flat=True))
    return projection


# ---------------------------------------------------------------------------------------- export
def issue_export(*, actor: Actor, instance: ConnectorInstance, issue: Issue, container: str | None,
                 idempotency_key: str, reason: str = "") -> ExportOutcome:
    """Create ``issue``'s task in ``container`` of ``instance`` and link it (board writers)."""
    require_writer(actor, instance.company_id)
    key = (idempotency_key or "").strip()[:200]
    if not key:
        raise InvalidInput(details={"idempotencyKey": ["This field is required."]})
    if issue.company_id != instance.company_id:
        raise NotFound("Connector not found.")
    existing = TaskExport.objects.select_related("link").filter(instance=instance, idempotency_key=key).first()
    if existing is not None:
        _same_request(existing, issue, container)
        if existing.status == ExportStatus.LINKED:
            return ExportOutcome(existing, _link_of(existing), created=False)
    container = _checked(instance, issue, container)
    adapter = adapter_for(instance)  # an unresolvable secret is a 422 before anything is recorded
    export = _claim(actor, instance, issue, container, key)
    if export.status == ExportStatus.LINKED:  # a concurrent request with the same key linked it meanwhile
        return ExportOutcome(export, _link_of(export), created=False)
    try:
        task, found = _create_or_find(adapter, export, issue, instance)
    except ProviderError as exc:
        _failed(actor, export, issue, exc)
        raise _provider_error(exc, export) from exc
    except Exception as exc:  # export_unconfirmed, or a bug: recorded, never left pending
        _failed(actor, export, issue, exc)
        raise
    finally:
        getattr(adapter, "close", lambda: None)()
    TaskExport.objects.filter(pk=export.pk).update(external_task_id=task.external_id[:200], updated_at=timezone.now())
    try:
        result = intervene(actor=actor, instance=instance, action=InterventionAction.TASK_EXPORT, target_id=issue.pk,
                            key=f"export:{export.pk}", reason=reason,
                            apply=lambda: _link(actor, instance, issue, export.pk, task, found))
    except ApiError as exc:
        _failed(actor, export, issue, exc)
        raise
    export = TaskExport.objects.select_related("link").get(pk=export.pk)
    log.info("connector %s exported issue %s as %s (export %s, found=%s)", instance.pk, issue.identifier,
             task.external_key or task.external_id, export.pk, result.get("found"))
    return ExportOutcome(export, _link_of(export), created=True)


def _link_of(export: TaskExport) -> TaskLink | None:
    if export.link_id is None:
        return None
    return TaskLink.objects.select_related("instance", "issue", "issue__assignee_agent",
                                           "issue__checkout_run").get(pk=export.link_id)


def _same_request(export: TaskExport, issue: Issue, container: str | None):
    if export.issue_id != issue.pk or (container and container.strip().lower() != export.container.lower()):
        raise ConflictError("This idempotency key was used for another export.", code="idempotency_key_reused",
                            details={"idempotencyKey": [export.idempotency_key]})


def _checked(instance: ConnectorInstance, issue: Issue, container: str | None) -> str:
    """The container to create in, after the checks that need no provider call."""
    if not can_create_tasks(instance.provider_key):
        raise InvalidInput(f"The {instance.provider_key} connector cannot create tasks.", code="capability_missing",
                           details={"instanceId": [f"Provider {instance.provider_key} does not declare create_task."]})
    if instance.status == InstanceStatus.PAUSED:
        raise ConflictError("The connector is paused; resume it to export.", code="connector_paused",
                            details={"instanceId": [str(instance.pk)]})
    containers = [str(c) for c in instance.containers or ()]
    wanted = (container or "").strip()
    if not wanted and len(containers) == 1:
        wanted = containers[0]
    key = adapter_class(instance.provider_key).container_key  # Notion ids match with or without dashes
    match = next((c for c in containers if key(c) == key(wanted)), None) if wanted else None
    if match is None:
        known = ", ".join(containers) or "none configured"
        reason = "This field is required" if not wanted else "Not one of this connector's containers"
        raise InvalidInput(details={"container": [f"{reason} ({known})."]})
    active = TaskLink.objects.filter(instance=instance, issue=issue).exclude(status=LinkStatus.UNLINKED).first()
    if active is not None:
        raise ConflictError(f"{issue.identifier} is already linked to {active.external_key or active.external_task_id} "
                            f"on this connector.", code="already_linked",
                            details={"issueId": [str(issue.pk)], "linkId": [str(active.pk)]})
    return match


def _claim(actor: Actor, instance: ConnectorInstance, issue: Issue, container: str, key: str) -> TaskExport:
    """Record the export (or take the failed/stale one of this key) and count the attempt, committed
    before the provider is called. An attempt still within its lease belongs to another request."""
    now = timezone.now()
    with transaction.atomic():
        try:
            with transaction.atomic():
                row, _ = TaskExport.objects.get_or_create(
                    instance=instance, idempotency_key=key,
                    defaults={"company_id": instance.company_id, "issue": issue, "container": container,
                              "requested_by_user": actor.user if actor.is_board else None})
        except IntegrityError:
            row = TaskExport.objects.get(instance=instance, idempotency_key=key)
        row = TaskExport.objects.select_for_update().get(pk=row.pk)
        _same_request(row, issue, container)
        if row.status == ExportStatus.LINKED:
            return row
        lease = timedelta(seconds=float(conf("OUTBOUND_DELIVERY_LEASE_SECONDS")))
        if row.status == ExportStatus.PENDING and row.attempts and row.updated_at > now - lease:
            raise ConflictError("This export is being created by another request; try again shortly.",
                                code="export_in_progress", details={"exportId": [str(row.pk)]})
        row.attempts += 1
        row.status, row.error_message = ExportStatus.PENDING, ""
        row.save(update_fields=["attempts", "status", "error_message", "updated_at"])
    return row


def _create_or_find(adapter, export: TaskExport, issue: Issue,
                    instance: ConnectorInstance) -> tuple[ExternalTask, bool]:
    """(task, found). An earlier attempt, of this export or of another unlinked export of the issue to the
    same container (a new key after a failure), may have created the task with its answer lost: the
    task it created is looked for first (§6.3: the backlink already present on the external task)."""
    earlier = [row for row in TaskExport.objects.select_related("issue").filter(
        instance=instance, issue=issue, container__iexact=export.container, attempts__gt=0).exclude(
        status=ExportStatus.LINKED) if row.pk != export.pk or row.attempts > 1]
    if earlier:
        task = find_exported_task(adapter, export.container, earlier)
        if task is not None:
            return task, True
    return adapter.create_task(export.container, export_projection(issue, instance)), False


def find_exported_task(adapter, container: str, exports: list[TaskExport]) -> ExternalTask | None:
    """The task one of ``exports`` created: in ``container``, created since that export began (give or
    take the clock skew) and carrying the issue's backlink. A listing longer than the poll bound without
    it is refused rather than risking a second task."""
    since = min(row.created_at for row in exports) - CLOCK_SKEW
    recorded = {row.external_task_id for row in exports if row.external_task_id}
    cursor = adapter.since_cursor(container, since)
    matches = []
    for _ in range(int(conf("POLL_MAX_PAGES"))):
        page = adapter.list_candidate_tasks(container, cursor)
        matches += [task for task in page.items if any(created_by(task, row) for row in exports)]
        if not page.cursor or page.cursor == cursor:
            break
        cursor = page.cursor
    else:
        if not matches:
            raise ConflictError("Could not confirm whether an earlier attempt created the task (too many tasks "
                                "changed in the container since); check the tracker and link the task by hand "
                                "if it exists.", code="export_unconfirmed",
                                details={"exportId": [str(row.pk) for row in exports]})
    # an id an attempt recorded (its answer arrived, the link did not) first, else the earliest created
    return min(matches, key=lambda t: (t.external_id not in recorded, t.created_at or since), default=None)


def _link(actor: Actor, instance: ConnectorInstance, issue: Issue, export_id, task: ExternalTask, found: bool) -> dict:
    """Inside the intervention's transaction: the link (origin paperclip), its policies, the backlink
    effect (§10.2 postBacklink: the provider's own backlink kind), the export marked linked, the audit."""
    Issue.objects.select_for_update().filter(pk=issue.pk).first()  # the issue lock every issue change takes
    row = TaskExport.objects.select_for_update().get(pk=export_id)
    try:
        with transaction.atomic():
            link = links.link_create(instance=instance, issue=issue, task=task, origin_side=OriginSide.PAPERCLIP,
                                     key=row.idempotency_key, cause="exported", status=LinkStatus.HEALTHY)
    except IntegrityError:
        link = _adopt(instance, issue, task)
    link.origin_side = OriginSide.PAPERCLIP
    link.sync_mode = export_sync_mode(instance)
    link.field_policy = export_field_policy(instance)
    link.last_outbound_at = timezone.now()
    link.save(update_fields=["origin_side", "sync_mode", "field_policy", "last_outbound_at", "updated_at"])
    links.backlink_record(link=link, instance=instance, issue=issue)
    row.status, row.link, row.error_message = ExportStatus.LINKED, link, ""
    row.external_task_id = task.external_id[:200]
    row.save(update_fields=["status", "link", "error_message", "external_task_id", "updated_at"])
    result = {"exportId": row.pk, "linkId": str(link.pk), "issueId": str(issue.pk), "container": row.container,
              "externalTaskId": task.external_id, "externalKey": task.external_key or "",
              "externalUrl": task.url or "", "found": found, "attempts": row.attempts}
    activity_record(actor=actor, company_id=instance.company_id, action="connector.task_exported",
                    entity_type="connector_link", entity_id=link.pk,
                    details={**result, "instanceId": str(instance.pk), "identifier": issue.identifier,
                             "idempotencyKey": row.idempotency_key, "syncMode": link.sync_mode,
                             "fieldPolicy": link.field_policy})
    return result


def _adopt(instance: ConnectorInstance, issue: Issue, task: ExternalTask) -> TaskLink:
    """The task's own webhook can race the provider's answer: the inbound dedupe then linked it to this
    issue through the backlink first. That link is the export's; anything else is a real conflict."""
    existing = (TaskLink.objects.filter(instance=instance, external_task_id=task.external_id)
                .exclude(status=LinkStatus.UNLINKED).first())
    if existing is not None and existing.issue_id == issue.pk:
        return existing
    raise ConflictError(f"The created task {task.external_key or task.external_id} or {issue.identifier} was linked "
                        f"elsewhere meanwhile; the task was created but not linked.", code="already_linked",
                        details={"issueId": [str(issue.pk)], "externalTaskId": [task.external_id]})


def _failed(actor: Actor, export: TaskExport, issue: Issue, exc: Exception):
    """The export is ``failed`` with the error (a retry with the same key tries again, looking first for
    a task this attempt may have created), a health entry and an audit row. No link was written."""
    category, message = (exc.code, exc.message) if isinstance(exc, ApiError) else failure_of(exc)
    instance = export.instance
    with transaction.atomic():
        TaskExport.objects.filter(pk=export.pk).exclude(status=ExportStatus.LINKED).update(
            status=ExportStatus.FAILED, error_message=message[:2000], updated_at=timezone.now())
        if category in ErrorCategory.values:
            sync_error_record(instance=instance, category=category,
                              message=f"Export of {issue.identifier} to {export.container} failed: {message}",
                              details={"exportId": export.pk, "issueId": str(issue.pk)})
        activity_record(actor=actor, company_id=instance.company_id, action="connector.task_export_failed",
                        entity_type="connector", entity_id=instance.pk,
                        details={"exportId": export.pk, "issueId": str(issue.pk), "identifier": issue.identifier,
                                 "container": export.container, "idempotencyKey": export.idempotency_key,
                                 "attempts": export.attempts, "category": category, "error": message[:500]})


def _provider_error(exc: ProviderError, export: TaskExport) -> ApiError:
    status = 503 if exc.category == ErrorCategory.PROVIDER_RATE_LIMITED else 422 \
        if exc.category == ErrorCategory.CONFIG else 502
    return ExportProviderError(f"The provider did not create the task: {exc}", code=exc.category,
                               status_code=status,
                               details={"exportId": str(export.pk), "category": exc.category,
                                        "providerStatus": exc.status, "retryAfter": exc.retry_after})


# -------------------------------------------------------------------------------------- reads
def export_targets(issue: Issue) -> list[tuple[ConnectorInstance, list[str]]]:
    """The instances (and their containers) ``issue`` can be exported to now: active, able to create
    tasks, with containers, and not already linked to the issue."""
    linked = TaskLink.objects.filter(issue=issue).exclude(status=LinkStatus.UNLINKED).values("instance_id")
    out = []
    for instance in (ConnectorInstance.objects.filter(company_id=issue.company_id, status=InstanceStatus.ACTIVE)
                     .exclude(pk__in=linked).order_by("name")):
        containers = [str(c) for c in instance.containers or ()]
        if containers and can_create_tasks(instance.provider_key):
            out.append((instance, containers))
    return out


def unfinished_exports(issue: Issue, limit: int = 5) -> list[TaskExport]:
    """The issue's exports that did not link (failed, or pending after a crash), to instances the issue is
    not linked to (another export, or a manual link, did it since): retried with their key."""
    linked = TaskLink.objects.filter(issue=issue).exclude(status=LinkStatus.UNLINKED).values("instance_id")
    return list(TaskExport.objects.select_related("instance").filter(issue=issue).exclude(
        status=ExportStatus.LINKED).exclude(instance_id__in=linked).order_by("-updated_at")[:limit])
