"""Enumerations of the connectors app (External Task Protocol §4.2, §5.4, §11.2)."""
from django.db import models

from connectors.providers.base import ErrorCategory as ProviderErrorCategory
from connectors.providers.base import StateCategory as _StateCategory


class InstanceStatus(models.TextChoices):
    ACTIVE = "active"
    PAUSED = "paused"


class HealthStatus(models.TextChoices):
    """§4.1.8 ``status`` (computed, never stored)."""

    HEALTHY = "healthy"
    DEGRADED = "degraded"
    ERROR = "error"
    PAUSED = "paused"


class SyncMode(models.TextChoices):
    IMPORT_ONLY = "import_only"
    EXPORT_ONLY = "export_only"
    BIDIRECTIONAL = "bidirectional"
    OBSERVER = "observer"
    DISABLED = "disabled"


class RunMode(models.TextChoices):
    PAPERCLIP_CONTROLLED = "paperclip_controlled"
    SYMPHONY_COMPATIBLE = "symphony_compatible"
    EXTERNAL_OBSERVER = "external_observer"


class LinkStatus(models.TextChoices):
    PENDING = "pending"
    HEALTHY = "healthy"
    CONFLICT = "conflict"
    ERROR = "error"
    PAUSED = "paused"
    UNLINKED = "unlinked"


class OriginSide(models.TextChoices):
    PAPERCLIP = "paperclip"
    EXTERNAL = "external"
    MANUAL_LINK = "manual_link"


class FieldOwner(models.TextChoices):
    EXTERNAL = "external"
    PAPERCLIP = "paperclip"
    SHARED = "shared"


class StateCategory(models.TextChoices):
    BACKLOG = _StateCategory.BACKLOG
    ACTIVE = _StateCategory.ACTIVE
    REVIEW = _StateCategory.REVIEW
    BLOCKED = _StateCategory.BLOCKED
    TERMINAL = _StateCategory.TERMINAL


class EventSource(models.TextChoices):
    WEBHOOK = "webhook"
    POLL = "poll"
    RECONCILE = "reconcile"
    RESYNC = "resync"


class EventKindChoice(models.TextChoices):
    """The provider-neutral kinds of connectors.providers.base.EventKind."""

    TASK_UPSERTED = "task.upserted"
    TASK_DELETED = "task.deleted"
    COMMENT_UPSERTED = "comment.upserted"
    COMMENT_DELETED = "comment.deleted"
    IGNORED = "ignored"
    UNPARSED = "unparsed"  # verified, but the body did not parse (schema drift, §13.1.8): kept raw, parked


class EventStatus(models.TextChoices):
    PENDING = "pending"
    APPLIED = "applied"
    DROPPED = "dropped"
    FAILED = "failed"  # failed at least once, retry scheduled at next_attempt_at
    PARKED = "parked"  # gave up after the bounded retry count; replayable


UNFINISHED_EVENT_STATUSES = (EventStatus.PENDING, EventStatus.FAILED)


class ErrorCategory(models.TextChoices):
    """§5.4 provider categories plus the engine's own health-entry categories."""

    PROVIDER_AUTH = ProviderErrorCategory.PROVIDER_AUTH
    PROVIDER_RATE_LIMITED = ProviderErrorCategory.PROVIDER_RATE_LIMITED
    PROVIDER_REQUEST = ProviderErrorCategory.PROVIDER_REQUEST
    PROVIDER_STATUS = ProviderErrorCategory.PROVIDER_STATUS
    PROVIDER_PAYLOAD = ProviderErrorCategory.PROVIDER_PAYLOAD
    CURSOR_INVALID = ProviderErrorCategory.CURSOR_INVALID
    WEBHOOK_SIGNATURE = ProviderErrorCategory.WEBHOOK_SIGNATURE
    APPLY_FAILED = "apply_failed"
    EVENT_PARKED = "event_parked"
    STATE_UNMAPPED = "state_unmapped"
    ROUTING = "routing"
    CONFIG = "config"
    COMMAND = "command"
    POLICY = "policy"  # a Paperclip-side change the field policy keeps from the tracker (§4.1.4)
    SCHEMA_DRIFT = "schema_drift"  # a verified delivery or poll record that did not parse (§13.1.8)
    OUTBOUND_PARKED = "outbound_parked"  # an outbound write that exhausted its retry horizon


class RoutingRuleKind(models.TextChoices):
    COMMENT_COMMAND = "comment_command"
    CUSTOM_FIELD = "custom_field"
    LABEL = "label"
    STATE_LANE = "state_lane"
    USER_MAPPING = "user_mapping"
    DEFAULT_ROUTE = "default_route"


# §8.1: the pipeline order; the first matching enabled rule wins.
ROUTING_PRECEDENCE = {kind: i for i, kind in enumerate(RoutingRuleKind.values)}


class ConflictKind(models.TextChoices):
    FIELD = "field"
    DELETION = "deletion"
    CLOSURE = "closure"
    ROUTING = "routing"
    POLICY = "policy"


class ConflictStatus(models.TextChoices):
    OPEN = "open"
    RESOLVED = "resolved"
    DISMISSED = "dismissed"


class OutboundKind(models.TextChoices):
    COMMENT = "comment"
    BACKLINK = "backlink"
    STATE = "state"
    FIELDS = "fields"


class OutboundStatus(models.TextChoices):
    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"  # a permanent refusal by the provider (e.g. 4xx other than auth/rate limit)
    CANCELLED = "cancelled"
    PARKED = "parked"  # retried over the whole horizon without success; replayable by an operator


class CommandPolicy(models.TextChoices):
    """Who may use ``/paperclip`` commands (§8.2: documented, implementation-defined)."""

    ANY_MEMBER = "any_member"  # anyone who can comment on the external task (except the service account)
    MAPPED_USERS = "mapped_users"  # only external users named in an enabled user_mapping rule
    DISABLED = "disabled"


class InterventionAction(models.TextChoices):
    INSTANCE_PAUSE = "instance.pause"
    INSTANCE_RESUME = "instance.resume"
    LINK_PAUSE = "link.pause"
    LINK_RESUME = "link.resume"
    LINK_RESYNC = "link.resync"
    LINK_UNLINK = "link.unlink"
    EVENT_REPLAY = "event.replay"
    CREDENTIALS_ROTATE = "credentials.rotate"
    CONFLICT_DISMISS = "conflict.dismiss"
    TASK_IMPORT = "task.import"
    LINK_CREATE = "link.create"
    OUTBOUND_REPLAY = "outbound.replay"
    TASK_EXPORT = "task.export"


class ConflictAction(models.TextChoices):
    """§11.3 resolution actions."""

    KEEP_PAPERCLIP = "keep_paperclip"
    KEEP_EXTERNAL = "keep_external"
    MERGE_MANUAL = "merge_manual"
    UNLINK = "unlink"
    DISMISS = "dismiss"


class ClosePolicy(models.TextChoices):
    """§7.4: what an external move to a terminal state does to a linked issue that is not terminal."""

    CONFLICT = "conflict"  # default: a closure conflict, nothing closed
    AUTO_CLOSE = "auto_close"  # close the issue only when idle: no run, no pending approval/review, no blockers


class ReopenPolicy(models.TextChoices):
    """§7.4: what an external reopen of a task whose issue is terminal does."""

    FOLLOW_UP = "follow_up"  # RECOMMENDED default: a follow-up issue carries the link
    REOPEN = "reopen"  # reopen the same issue (subject to the host's rules)


class ExportStatus(models.TextChoices):
    """§6.2.2 export of a Paperclip issue to the tracker, idempotent on its key."""

    PENDING = "pending"  # recorded; the external task may or may not exist yet
    LINKED = "linked"  # the external task exists and the link is active
    FAILED = "failed"  # the provider refused the creation (retryable by repeating the request)
