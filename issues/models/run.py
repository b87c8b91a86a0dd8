"""Heartbeat runs and the wakeup requests that cause them (the run machinery builds on these)."""
from django.conf import settings
from django.db import models
from django.db.models import Q

from issues.choices import LIVE_RUN_STATUSES, RunStatus, WakeSource, WakeStatus

from .base import UUIDModel, choices_check
from .company import Company
from .issue import Issue


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

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["agent", "status"], name="run_agent_status_idx")]
        constraints = [
            choices_check("status", RunStatus, "run_status_valid"),
            choices_check("invocation_source", WakeSource, "run_invocation_source_valid"),
            models.CheckConstraint(
                condition=Q(status__in=LIVE_RUN_STATUSES) | Q(finished_at__isnull=False),
                name="run_terminal_has_finished_at",
            ),
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
    requested_by_agent = models.ForeignKey(
        "issues.Agent", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    requested_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    skip_reason = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            choices_check("source", WakeSource, "wakeup_source_valid"),
            choices_check("status", WakeStatus, "wakeup_status_valid"),
            models.UniqueConstraint(
                fields=["agent", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="wakeup_idempotency_unique_per_agent",
            ),
        ]
