"""Connector engine data (External Task Protocol §4): instances, secret references, task links with
their transitions, the inbound event inbox, cursors, routing rules, conflicts, sync errors and the
outbound effect outbox (drained by layer 4)."""
from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Lower

from issues.models.base import UUIDModel, choices_check

from .choices import (
    ClosePolicy,
    CommandPolicy,
    ConflictKind,
    ConflictStatus,
    ErrorCategory,
    EventKindChoice,
    EventSource,
    EventStatus,
    ExportStatus,
    InstanceStatus,
    InterventionAction,
    LinkStatus,
    OriginSide,
    OutboundKind,
    OutboundStatus,
    ReopenPolicy,
    RoutingRuleKind,
    RunMode,
    StateCategory,
    SyncMode,
)

# A secret reference: ``env:NAME`` (read from the process environment) or ``secret:<uuid>`` (a row
# of ConnectorSecret, encrypted). Anything else — in particular an inline token — is refused by
# the database itself.
SECRET_REF_REGEX = r"^(env:[A-Za-z_][A-Za-z0-9_]{0,127}|secret:[0-9a-fA-F-]{32,36})?$"


def default_write_policy():
    # §10.2 defaults; used by layer 4. Transcripts stay off.
    return {"postBacklink": True, "postProgressComments": True, "postArtifactLinks": True,
            "mirrorAgentComments": False, "postTranscripts": False, "projectStatus": True,
            "mirrorExternalComments": True}


def default_field_policy():
    # §4.1.4 defaults for originSide=external; assignee flows through routing only.
    return {"title": "external", "description": "external", "priority": "external", "labels": "external",
            "dueAt": "external", "state": "shared"}


class ConnectorSecret(UUIDModel):
    """An encrypted stored secret (Fernet). Only the ciphertext is kept; see connectors.secrets."""

    company = models.ForeignKey("issues.Company", on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=120)
    ciphertext = models.TextField(editable=False)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return f"secret:{self.pk} ({self.name})"


class ConnectorInstance(UUIDModel):
    """One installed connector configuration bound to exactly one company (§14.1)."""

    company = models.ForeignKey("issues.Company", on_delete=models.CASCADE, related_name="connector_instances")
    name = models.CharField(max_length=120)
    provider_key = models.CharField(max_length=40)
    status = models.CharField(max_length=16, choices=InstanceStatus.choices, default=InstanceStatus.ACTIVE)
    status_detail = models.CharField(max_length=500, blank=True)
    base_url = models.CharField(max_length=500, blank=True, help_text="Provider API base URL (blank: provider default).")
    containers = models.JSONField(default=list, blank=True, help_text="Provider containers, e.g. ['octo/repo'].")
    state_mapping = models.JSONField(default=dict, blank=True)
    config = models.JSONField(default=dict, blank=True, help_text="Provider-specific settings (never secrets).")
    # Defaults for new links.
    default_sync_mode = models.CharField(max_length=16, choices=SyncMode.choices, default=SyncMode.IMPORT_ONLY)
    default_run_mode = models.CharField(max_length=24, choices=RunMode.choices, default=RunMode.PAPERCLIP_CONTROLLED)
    field_policy = models.JSONField(default=default_field_policy, blank=True)
    write_policy = models.JSONField(default=default_write_policy, blank=True)
    wake_on_external_comment = models.BooleanField(
        null=True, blank=True, help_text="Blank: on, except for links in external_observer run mode.")
    auto_import = models.BooleanField(default=True, help_text="Import non-terminal external tasks as they arrive.")
    command_policy = models.CharField(max_length=16, choices=CommandPolicy.choices, default=CommandPolicy.ANY_MEMBER)
    routing_aliases = models.JSONField(default=dict, blank=True, help_text="alias -> agent id, e.g. {'qa': '…'}.")
    poll_interval_seconds = models.PositiveIntegerField(default=300)
    reconcile_interval_seconds = models.PositiveIntegerField(default=900)
    reconcile_batch_size = models.PositiveIntegerField(default=200, help_text="Links read per reconcile tick.")
    project = models.ForeignKey("issues.Project", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    goal = models.ForeignKey("issues.Goal", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    triage_agent = models.ForeignKey("issues.Agent", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    service_account_id = models.CharField(max_length=200, blank=True, help_text="The connector's own provider user id.")
    service_account_name = models.CharField(max_length=200, blank=True)
    credentials_ref = models.CharField(max_length=200, blank=True)
    webhook_secret_ref = models.CharField(max_length=200, blank=True)
    created_by_user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                        related_name="+")
    # Health (§4.1.8); queue depth, retries and conflicts are counted from their tables.
    last_webhook_at = models.DateTimeField(null=True, blank=True)
    last_poll_at = models.DateTimeField(null=True, blank=True)
    last_reconcile_at = models.DateTimeField(null=True, blank=True)
    webhook_verified = models.BooleanField(default=False)
    webhook_rejected_count = models.PositiveIntegerField(default=0)
    last_webhook_rejected_at = models.DateTimeField(null=True, blank=True)
    last_webhook_rejected_reason = models.CharField(max_length=300, blank=True)
    provider_degraded_until = models.DateTimeField(null=True, blank=True)
    # §13.1.2: a credential failure is an instance-level health error (links are not touched).
    auth_error_at = models.DateTimeField(null=True, blank=True)
    auth_error_detail = models.CharField(max_length=500, blank=True)
    # Webhook setup (Appendix A.3-A.5, §13.2): provider-side registrations the connector created, one per
    # container: {"scope", "externalId", "callbackUrl", "active", "detail", "checkedAt", "secretRef"} (an
    # Asana webhook signs with its own handshake secret, a secret reference). A handshake that hands over a
    # secret is accepted only while none is stored or until ``handshake_open_until``.
    webhook_registrations = models.JSONField(default=list, blank=True)
    handshake_open_until = models.DateTimeField(null=True, blank=True)
    last_handshake_at = models.DateTimeField(null=True, blank=True)
    last_handshake_detail = models.CharField(max_length=300, blank=True)
    # §7.4 policies for new links (a link may override the close policy).
    close_policy = models.CharField(max_length=16, choices=ClosePolicy.choices, default=ClosePolicy.CONFLICT)
    reopen_policy = models.CharField(max_length=16, choices=ReopenPolicy.choices, default=ReopenPolicy.FOLLOW_UP)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(Lower("name"), "company", name="connector_name_unique_per_company"),
            choices_check("status", InstanceStatus, "connector_status_valid"),
            choices_check("default_sync_mode", SyncMode, "connector_sync_mode_valid"),
            choices_check("default_run_mode", RunMode, "connector_run_mode_valid"),
            choices_check("command_policy", CommandPolicy, "connector_command_policy_valid"),
            choices_check("close_policy", ClosePolicy, "connector_close_policy_valid"),
            choices_check("reopen_policy", ReopenPolicy, "connector_reopen_policy_valid"),
            models.CheckConstraint(condition=Q(credentials_ref__regex=SECRET_REF_REGEX),
                                   name="connector_credentials_is_reference"),
            models.CheckConstraint(condition=Q(webhook_secret_ref__regex=SECRET_REF_REGEX),
                                   name="connector_webhook_secret_is_reference"),
            models.CheckConstraint(condition=Q(poll_interval_seconds__gt=0) & Q(reconcile_interval_seconds__gt=0)
                                   & Q(reconcile_batch_size__gt=0), name="connector_intervals_positive"),
            models.CheckConstraint(condition=~Q(provider_key=""), name="connector_provider_present"),
        ]

    def __str__(self):
        return f"{self.name} ({self.provider_key})"


class TaskLink(UUIDModel):
    """§4.1.3: one external task <-> one Paperclip issue, with its sync state."""

    company = models.ForeignKey("issues.Company", on_delete=models.CASCADE, related_name="+")
    instance = models.ForeignKey(ConnectorInstance, on_delete=models.CASCADE, related_name="links")
    provider_key = models.CharField(max_length=40)
    project = models.ForeignKey("issues.Project", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    goal = models.ForeignKey("issues.Goal", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    issue = models.ForeignKey("issues.Issue", on_delete=models.RESTRICT, related_name="connector_links")
    handoff_history = models.JSONField(default=list, blank=True)
    external_workspace_id = models.CharField(max_length=200, blank=True)
    external_project_id = models.CharField(max_length=200, blank=True)
    external_task_id = models.CharField(max_length=200)
    external_key = models.CharField(max_length=200, blank=True)
    external_url = models.URLField(max_length=1000, blank=True)
    external_title = models.CharField(max_length=500, blank=True)
    external_state_name = models.CharField(max_length=200, blank=True)
    external_state_category = models.CharField(max_length=16, choices=StateCategory.choices, blank=True)
    external_updated_at = models.DateTimeField(null=True, blank=True)
    origin_side = models.CharField(max_length=16, choices=OriginSide.choices, default=OriginSide.EXTERNAL)
    sync_mode = models.CharField(max_length=16, choices=SyncMode.choices, default=SyncMode.IMPORT_ONLY)
    run_mode = models.CharField(max_length=24, choices=RunMode.choices, default=RunMode.PAPERCLIP_CONTROLLED)
    field_policy = models.JSONField(default=default_field_policy, blank=True)
    write_policy = models.JSONField(default=dict, blank=True, help_text="Per-link overrides of the instance toggles.")
    wake_on_external_comment = models.BooleanField(null=True, blank=True)
    base_snapshot = models.JSONField(default=dict, blank=True)
    last_external_revision = models.CharField(max_length=200, blank=True, null=True)
    last_paperclip_fingerprint = models.CharField(max_length=128, blank=True, null=True)
    last_inbound_at = models.DateTimeField(null=True, blank=True)
    last_outbound_at = models.DateTimeField(null=True, blank=True)
    last_reconcile_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=LinkStatus.choices, default=LinkStatus.PENDING)
    status_detail = models.CharField(max_length=500, blank=True, null=True)
    paused_from_status = models.CharField(max_length=16, choices=LinkStatus.choices, blank=True)
    routing = models.JSONField(default=dict, blank=True, help_text="The routing decision that chose the assignee.")
    envelope = models.JSONField(default=dict, blank=True)
    # Layer 3/4 bookkeeping: the connector wake debounce (§9) and the milestone comment debounce (§10.2).
    last_wake_at = models.DateTimeField(null=True, blank=True)
    last_milestone_at = models.DateTimeField(null=True, blank=True)
    close_policy = models.CharField(max_length=16, choices=ClosePolicy.choices, blank=True,
                                    help_text="Blank: the instance's close policy (§7.4).")

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["instance", "status"], name="link_instance_status_idx"),
                   # every import reads the task's links of any instance and status (backlinks.task_pairings)
                   models.Index(fields=["company", "external_task_id", "provider_key"], name="link_task_pairings_idx")]
        constraints = [
            models.UniqueConstraint(fields=["instance", "external_task_id"], condition=~Q(status=LinkStatus.UNLINKED),
                                    name="link_one_active_per_external_task"),
            models.UniqueConstraint(fields=["instance", "issue"], condition=~Q(status=LinkStatus.UNLINKED),
                                    name="link_one_active_per_issue"),
            choices_check("status", LinkStatus, "link_status_valid"),
            choices_check("origin_side", OriginSide, "link_origin_side_valid"),
            choices_check("sync_mode", SyncMode, "link_sync_mode_valid"),
            choices_check("run_mode", RunMode, "link_run_mode_valid"),
            models.CheckConstraint(condition=Q(external_state_category="") | Q(
                external_state_category__in=StateCategory.values), name="link_state_category_valid"),
            models.CheckConstraint(condition=Q(paused_from_status="") | Q(
                paused_from_status__in=LinkStatus.values), name="link_paused_from_valid"),
            models.CheckConstraint(condition=~Q(external_task_id=""), name="link_external_task_id_present"),
            models.CheckConstraint(condition=Q(close_policy="") | Q(close_policy__in=ClosePolicy.values),
                                   name="link_close_policy_valid"),
        ]

    def __str__(self):
        return f"{self.external_key or self.external_task_id} -> {self.issue_id} ({self.status})"


class LinkTransition(models.Model):
    """§6.1: every link status change with its timestamp and cause."""

    link = models.ForeignKey(TaskLink, on_delete=models.CASCADE, related_name="transitions")
    from_status = models.CharField(max_length=16, choices=LinkStatus.choices, blank=True)
    to_status = models.CharField(max_length=16, choices=LinkStatus.choices)
    cause = models.CharField(max_length=300)
    idempotency_key = models.CharField(max_length=300, blank=True)
    at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["at", "id"]
        constraints = [
            choices_check("to_status", LinkStatus, "link_transition_to_valid"),
            models.CheckConstraint(condition=Q(from_status="") | Q(from_status__in=LinkStatus.values),
                                   name="link_transition_from_valid"),
        ]

    def __str__(self):
        return f"{self.from_status or '∅'} -> {self.to_status}: {self.cause}"


class InboundEvent(models.Model):
    """The inbox: a verified delivery (or a poll/reconcile observation), stored before it is applied.

    The auto-increment ``id`` is the per-task sequence: events of one external task are applied in
    ``id`` order."""

    instance = models.ForeignKey(ConnectorInstance, on_delete=models.CASCADE, related_name="events")
    company = models.ForeignKey("issues.Company", on_delete=models.CASCADE, related_name="+")
    idempotency_key = models.CharField(max_length=300)
    source = models.CharField(max_length=16, choices=EventSource.choices, default=EventSource.WEBHOOK)
    kind = models.CharField(max_length=40, choices=EventKindChoice.choices)
    action = models.CharField(max_length=100, blank=True)
    external_task_id = models.CharField(max_length=200, blank=True)
    raw_headers = models.JSONField(default=dict, blank=True)
    raw_body = models.BinaryField(blank=True, default=b"")
    payload = models.JSONField(default=dict, blank=True, help_text="The normalized event, as verified.")
    verified = models.BooleanField(default=False)
    verification = models.CharField(max_length=40, blank=True)
    status = models.CharField(max_length=16, choices=EventStatus.choices, default=EventStatus.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    applied_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=300, blank=True)
    error_category = models.CharField(max_length=32, choices=ErrorCategory.choices, blank=True)
    error_message = models.TextField(blank=True)
    occurred_at = models.DateTimeField(null=True, blank=True)
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["instance", "external_task_id", "status"], name="event_task_queue_idx"),
            models.Index(fields=["status", "next_attempt_at"], name="event_due_idx"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["instance", "idempotency_key"], name="event_idempotency_unique"),
            choices_check("status", EventStatus, "event_status_valid"),
            choices_check("source", EventSource, "event_source_valid"),
            choices_check("kind", EventKindChoice, "event_kind_valid"),
            models.CheckConstraint(condition=Q(error_category="") | Q(error_category__in=ErrorCategory.values),
                                   name="event_error_category_valid"),
        ]

    def __str__(self):
        return f"#{self.pk} {self.kind} {self.external_task_id} ({self.status})"

    @property
    def sequence(self):
        return self.pk


class SyncCursor(models.Model):
    """§4.1.7: saved in the same transaction as the effects of the page it describes."""

    instance = models.ForeignKey(ConnectorInstance, on_delete=models.CASCADE, related_name="cursors")
    scope = models.CharField(max_length=300)
    cursor = models.TextField(blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["scope"]
        constraints = [models.UniqueConstraint(fields=["instance", "scope"], name="cursor_unique_per_scope")]

    def __str__(self):
        return f"{self.scope}={self.cursor[:40]}"


class RoutingRule(models.Model):
    """§4.1.5. Rules run in pipeline order (§8.1 kind precedence), then by ``order``."""

    instance = models.ForeignKey(ConnectorInstance, on_delete=models.CASCADE, related_name="routing_rules")
    order = models.IntegerField(default=0)
    kind = models.CharField(max_length=20, choices=RoutingRuleKind.choices)
    match = models.JSONField(default=dict, blank=True)
    target_agent = models.ForeignKey("issues.Agent", null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="+")
    target_alias = models.CharField(max_length=64, blank=True)
    enabled = models.BooleanField(default=True)
    description = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["instance", "order", "id"]
        constraints = [
            choices_check("kind", RoutingRuleKind, "routing_rule_kind_valid"),
            models.CheckConstraint(condition=Q(target_agent__isnull=True) | Q(target_alias=""),
                                   name="routing_rule_single_target"),
        ]

    def __str__(self):
        return f"{self.order}. {self.kind} {self.match}"


class Conflict(UUIDModel):
    """§11.2; structural kinds (deletion, closure, routing) are raised by this layer."""

    company = models.ForeignKey("issues.Company", on_delete=models.CASCADE, related_name="+")
    instance = models.ForeignKey(ConnectorInstance, on_delete=models.CASCADE, related_name="conflicts")
    link = models.ForeignKey(TaskLink, on_delete=models.CASCADE, related_name="conflicts")
    kind = models.CharField(max_length=16, choices=ConflictKind.choices)
    field = models.CharField(max_length=64, blank=True)
    status = models.CharField(max_length=16, choices=ConflictStatus.choices, default=ConflictStatus.OPEN)
    base_value = models.JSONField(null=True, blank=True)
    external_value = models.JSONField(null=True, blank=True)
    paperclip_value = models.JSONField(null=True, blank=True)
    actors = models.JSONField(default=dict, blank=True)
    detail = models.CharField(max_length=500, blank=True)
    detected_at = models.DateTimeField(auto_now_add=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolution = models.CharField(max_length=32, blank=True)
    resolution_key = models.CharField(max_length=200, blank=True, help_text="Idempotency key of the resolution.")
    resolution_value = models.JSONField(null=True, blank=True, help_text="The value the resolution kept.")
    resolved_by_user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                         related_name="+")

    class Meta:
        ordering = ["-detected_at"]
        constraints = [
            choices_check("kind", ConflictKind, "conflict_kind_valid"),
            choices_check("status", ConflictStatus, "conflict_status_valid"),
            # The same divergence is never queued twice while open.
            models.UniqueConstraint(fields=["link", "kind", "field"], condition=Q(status=ConflictStatus.OPEN),
                                    name="conflict_one_open_per_link_kind_field"),
        ]

    def __str__(self):
        return f"{self.kind} {self.field} ({self.status})"


class SyncError(models.Model):
    """A health entry: the last 50 are shown per instance (§12.2)."""

    instance = models.ForeignKey(ConnectorInstance, on_delete=models.CASCADE, related_name="sync_errors")
    company = models.ForeignKey("issues.Company", on_delete=models.CASCADE, related_name="+")
    category = models.CharField(max_length=32, choices=ErrorCategory.choices)
    message = models.TextField()
    link = models.ForeignKey(TaskLink, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    event = models.ForeignKey(InboundEvent, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    details = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["instance", "-at"], name="sync_error_recent_idx")]
        constraints = [choices_check("category", ErrorCategory, "sync_error_category_valid")]

    def __str__(self):
        return f"{self.category}: {self.message[:60]}"


class OutboundEffect(models.Model):
    """The outbox (§4.3 outbound idempotency key): drained by the layer-4 write engine."""

    company = models.ForeignKey("issues.Company", on_delete=models.CASCADE, related_name="+")
    instance = models.ForeignKey(ConnectorInstance, on_delete=models.CASCADE, related_name="outbound_effects")
    link = models.ForeignKey(TaskLink, on_delete=models.CASCADE, related_name="outbound_effects")
    kind = models.CharField(max_length=16, choices=OutboundKind.choices)
    source_id = models.CharField(max_length=300)
    status = models.CharField(max_length=16, choices=OutboundStatus.choices, default=OutboundStatus.PENDING)
    payload = models.JSONField(default=dict, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    external_ref = models.CharField(max_length=300, blank=True)
    error_message = models.TextField(blank=True)
    error_category = models.CharField(max_length=32, choices=ErrorCategory.choices, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    parked_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    done_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="outbound_due_idx")]
        constraints = [
            models.UniqueConstraint(fields=["link", "kind", "source_id"], name="outbound_idempotency_unique"),
            choices_check("kind", OutboundKind, "outbound_kind_valid"),
            choices_check("status", OutboundStatus, "outbound_status_valid"),
            models.CheckConstraint(condition=Q(error_category="") | Q(error_category__in=ErrorCategory.values),
                                   name="outbound_error_category_valid"),
        ]

    def __str__(self):
        return f"{self.kind} {self.source_id} ({self.status})"


class ExternalCommentLink(models.Model):
    """Which host comment an external comment became (so a re-delivery never posts it twice)."""

    instance = models.ForeignKey(ConnectorInstance, on_delete=models.CASCADE, related_name="+")
    link = models.ForeignKey(TaskLink, on_delete=models.CASCADE, related_name="comment_links")
    external_comment_id = models.CharField(max_length=200)
    comment = models.ForeignKey("issues.Comment", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    external_updated_at = models.DateTimeField(null=True, blank=True)
    # sha256 of the imported body: the comment backstop sees an edit even without an updated time
    content_digest = models.CharField(max_length=64, blank=True)
    deleted = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["instance", "external_comment_id"],
                                               name="external_comment_unique_per_instance")]

    def __str__(self):
        return f"{self.external_comment_id} -> {self.comment_id}"


class Intervention(models.Model):
    """An operator intervention (§13.3), idempotent on (company, idempotency key) and audit-logged."""

    company = models.ForeignKey("issues.Company", on_delete=models.CASCADE, related_name="+")
    instance = models.ForeignKey(ConnectorInstance, on_delete=models.CASCADE, related_name="interventions")
    action = models.CharField(max_length=32, choices=InterventionAction.choices)
    target_id = models.CharField(max_length=64)
    idempotency_key = models.CharField(max_length=200)
    actor_user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    reason = models.CharField(max_length=500, blank=True)
    result = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-at"]
        constraints = [
            models.UniqueConstraint(fields=["company", "idempotency_key"], name="intervention_idempotency_unique"),
            choices_check("action", InterventionAction, "intervention_action_valid"),
        ]

    def __str__(self):
        return f"{self.action} {self.target_id}"


class TaskExport(models.Model):
    """§6.2.2: one export of a Paperclip issue to a tracker container, idempotent on its key. Recorded
    before the provider is called, so a retry after a lost answer finds the task it created (by the
    backlink marker the projection carries) instead of creating a second one."""

    company = models.ForeignKey("issues.Company", on_delete=models.CASCADE, related_name="+")
    instance = models.ForeignKey(ConnectorInstance, on_delete=models.CASCADE, related_name="exports")
    issue = models.ForeignKey("issues.Issue", on_delete=models.CASCADE, related_name="connector_exports")
    idempotency_key = models.CharField(max_length=200)
    container = models.CharField(max_length=300)
    status = models.CharField(max_length=16, choices=ExportStatus.choices, default=ExportStatus.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    external_task_id = models.CharField(max_length=200, blank=True)
    link = models.ForeignKey(TaskLink, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    error_message = models.TextField(blank=True)
    requested_by_user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                          related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["instance", "idempotency_key"], name="export_idempotency_unique"),
            choices_check("status", ExportStatus, "export_status_valid"),
            models.CheckConstraint(condition=~Q(container=""), name="export_container_present"),
        ]

    def __str__(self):
        return f"export {self.issue_id} -> {self.container} ({self.status})"
