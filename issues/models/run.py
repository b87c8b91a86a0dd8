"""Heartbeat runs and the wakeup requests that cause them (the run machinery builds on these)."""
from django.conf import settings
from django.db import models
from django.db.models import Q

from issues.choices import (
    LIVE_RUN_STATUSES,
    RunEventKind,
    RunLiveness,
    RunResultStatus,
    RunStatus,
    WakeSource,
    WakeStatus,
    WorkspaceStatus,
    WorkspaceStrategy,
)

from .base import UUIDModel, choices_check
from .company import Company
from .issue import Issue


# The runs that hold an agent's slot for an issue until they start (see HeartbeatRun.Meta.constraints).
UNSTARTED_SLOT = Q(status__in=(RunStatus.QUEUED, RunStatus.SCHEDULED_RETRY), stop_requested_at__isnull=True)


class HeartbeatRun(UUIDModel):
    company = models.ForeignKey(Company, on_delete=models.CASCADE, related_name="runs")
    agent = models.ForeignKey("issues.Agent", on_delete=models.CASCADE, related_name="runs")
    issue = models.ForeignKey(Issue, null=True, blank=True, on_delete=models.SET_NULL, related_name="runs")
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.QUEUED)
    invocation_source = models.CharField(max_length=16, choices=WakeSource.choices, default=WakeSource.ON_DEMAND)
    wake_reason = models.CharField(max_length=300, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    # Liveness: what the run achieved, reported by the agent or derived by the host.
    liveness = models.CharField(max_length=16, choices=RunLiveness.choices, blank=True)
    liveness_reason = models.CharField(max_length=300, blank=True)
    # The chain this run belongs to (the first run of a retry/continuation sequence).
    source_run = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="followups")
    continuation_attempt = models.PositiveIntegerField(default=0)
    retry_attempt = models.PositiveIntegerField(default=0)
    scheduled_for = models.DateTimeField(null=True, blank=True, help_text="When a scheduled retry becomes due.")
    # Who runs it: the scheduler/worker session that started the process (never stop another's).
    owner = models.CharField(max_length=200, blank=True)
    pid = models.IntegerField(null=True, blank=True)
    adapter_type = models.CharField(max_length=16, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    # Real work seen (output, API calls), unlike last_heartbeat_at which a quiet live pid refreshes:
    # stall detection reads this one.
    last_activity_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    stop_reason = models.CharField(max_length=200, blank=True)
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    cost_cents = models.PositiveBigIntegerField(default=0)
    context = models.JSONField(default=dict, blank=True, help_text="Wake context: reason, comment ids, approval.")
    workspace = models.ForeignKey(
        "issues.ExecutionWorkspace", null=True, blank=True, on_delete=models.SET_NULL, related_name="runs"
    )
    event_seq = models.PositiveBigIntegerField(default=0, help_text="Last RunEvent sequence number.")
    # The worker's output contract (seed 003): PAPERCLIP_RESULT or a final heartbeat.
    result_status = models.CharField(max_length=16, choices=RunResultStatus.choices, blank=True)
    result_final_state = models.CharField(max_length=100, blank=True)
    result_pr_url = models.CharField(max_length=1000, blank=True)  # an http(s) URL, checked by result_line
    result_summary = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["agent", "status"], name="run_agent_status_idx"),
            models.Index(fields=["status", "last_heartbeat_at"], name="run_status_heartbeat_idx"),
        ]
        constraints = [
            choices_check("status", RunStatus, "run_status_valid"),
            choices_check("invocation_source", WakeSource, "run_invocation_source_valid"),
            models.CheckConstraint(condition=Q(liveness="") | Q(liveness__in=RunLiveness.values),
                                   name="run_liveness_valid"),
            models.CheckConstraint(condition=Q(result_status="") | Q(result_status__in=RunResultStatus.values),
                                   name="run_result_status_valid"),
            models.CheckConstraint(
                condition=Q(status__in=LIVE_RUN_STATUSES) | Q(finished_at__isnull=False),
                name="run_terminal_has_finished_at",
            ),
            # One queued (or retry-scheduled) run per agent and issue: concurrent wakes coalesce
            # against this instead of a lock; a wake that creates a run after another one started
            # sees it and joins it (wakeups._place). A run being stopped leaves the slot, so the run
            # that follows it (a comment after an interrupt) can be queued beside it. Agent-level
            # runs (issue NULL) are not covered: their wakes still lock the agent row.
            models.UniqueConstraint(fields=["agent", "issue"], condition=UNSTARTED_SLOT,
                                    name="run_unstarted_unique_per_agent_issue"),
        ]

    def __str__(self):
        return f"run {self.id} ({self.status})"

    @property
    def is_live(self):
        return self.status in LIVE_RUN_STATUSES


class WakeupRequest(UUIDModel):
    company = models.ForeignKey(Company, on_delete=models.CASCADE, related_name="+")
    agent = models.ForeignKey("issues.Agent", on_delete=models.CASCADE, related_name="wakeups")
    issue = models.ForeignKey(Issue, null=True, blank=True, on_delete=models.SET_NULL, related_name="wakeups")
    source = models.CharField(max_length=16, choices=WakeSource.choices, default=WakeSource.ON_DEMAND)
    status = models.CharField(max_length=32, choices=WakeStatus.choices, default=WakeStatus.QUEUED)
    reason = models.CharField(max_length=300, blank=True)
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)
    coalesced_count = models.PositiveIntegerField(default=0)
    comment_ids = models.JSONField(default=list, blank=True)
    run = models.ForeignKey(HeartbeatRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="wakeups")
    # Mostly empty references, indexed only where set (Meta.indexes): a burst of wakes writes no
    # index entries for them.
    requested_by_agent = models.ForeignKey(
        "issues.Agent", null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    requested_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    skip_reason = models.CharField(max_length=200, blank=True)
    # Deferred while another run holds the issue's execution lock; promoted when it ends.
    deferred_for_run = models.ForeignKey(
        HeartbeatRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="deferred_wakeups",
        db_index=False,
    )
    context = models.JSONField(default=dict, blank=True)
    # False: a coalesced wake recorded by the insert-only fast path whose reason, context and count
    # are not yet carried into its run and primary wake (services.wakeups.wakeups_fold does that).
    folded = models.BooleanField(default=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # The wake that created a run, found on every coalesce without scanning coalesced rows.
            models.Index(fields=["run", "created_at"], condition=~Q(status="coalesced"), name="wakeup_run_primary_idx"),
            # The wakes still to fold, per run (fold at start, finish and on the sweep).
            models.Index(fields=["run", "created_at"], condition=Q(folded=False), name="wakeup_unfolded_idx"),
            *(models.Index(fields=[f], condition=Q(**{f"{f}__isnull": False}), name=f"wakeup_{short}_set_idx")
              for f, short in (("requested_by_agent", "by_agent"), ("requested_by_user", "by_user"),
                               ("deferred_for_run", "deferred"))),
        ]
        constraints = [
            choices_check("source", WakeSource, "wakeup_source_valid"),
            choices_check("status", WakeStatus, "wakeup_status_valid"),
            models.UniqueConstraint(
                fields=["agent", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="wakeup_idempotency_unique_per_agent",
            ),
        ]


class RunEvent(models.Model):
    """The run's log and events, paged by ``seq`` (a cursor that never repeats within a run)."""

    run = models.ForeignKey(HeartbeatRun, on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveBigIntegerField()
    kind = models.CharField(max_length=16, choices=RunEventKind.choices)
    message = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="run_event_seq_unique"),
            choices_check("kind", RunEventKind, "run_event_kind_valid"),
        ]


class ExecutionWorkspace(UUIDModel):
    """Where an issue's runs work: a git worktree of its own, or the project's shared folder."""

    company = models.ForeignKey(Company, on_delete=models.CASCADE, related_name="+")
    project = models.ForeignKey("issues.Project", null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="workspaces")
    source_issue = models.ForeignKey(Issue, null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="created_workspaces")
    strategy = models.CharField(max_length=24, choices=WorkspaceStrategy.choices)
    key = models.CharField(max_length=120)
    path = models.CharField(max_length=1000)
    branch = models.CharField(max_length=200, blank=True)
    base_ref = models.CharField(max_length=200, blank=True)
    status = models.CharField(max_length=16, choices=WorkspaceStatus.choices, default=WorkspaceStatus.ACTIVE)
    # The run writing in a shared workspace; a second writer waits (workspace_busy).
    writer_run = models.ForeignKey(HeartbeatRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    hook_log = models.JSONField(default=list, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    removed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            choices_check("strategy", WorkspaceStrategy, "workspace_strategy_valid"),
            choices_check("status", WorkspaceStatus, "workspace_status_valid"),
            models.UniqueConstraint(fields=["company", "key"], condition=Q(status="active"),
                                    name="workspace_active_key_unique"),
        ]

    def __str__(self):
        return f"{self.key} ({self.strategy})"
