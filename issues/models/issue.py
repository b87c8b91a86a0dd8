from django.conf import settings
from django.db import models
from django.db.models import F, Q

from issues.choices import IssuePriority, IssueStatus, OriginKind, RelationKind, WorkspaceStrategy

from .base import UUIDModel, choices_check
from .company import Company, Goal, Project


class Issue(UUIDModel):
    company = models.ForeignKey(Company, on_delete=models.CASCADE, related_name="issues")
    project = models.ForeignKey(Project, null=True, blank=True, on_delete=models.SET_NULL, related_name="issues")
    goal = models.ForeignKey(Goal, null=True, blank=True, on_delete=models.SET_NULL, related_name="issues")
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children")
    # Server-set provenance: the task whose run asked for this one (seed 004).
    origin_issue = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="originated", editable=False
    )
    origin_kind = models.CharField(max_length=16, choices=OriginKind.choices, default=OriginKind.MANUAL)
    origin_id = models.CharField(max_length=200, blank=True)
    origin_run = models.ForeignKey(
        "issues.HeartbeatRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="originated_issues"
    )
    number = models.PositiveIntegerField()
    identifier = models.CharField(max_length=24, unique=True)
    title = models.CharField(max_length=500)
    description = models.TextField(blank=True)
    status = models.CharField(max_length=16, choices=IssueStatus.choices, default=IssueStatus.TODO)
    priority = models.CharField(max_length=16, choices=IssuePriority.choices, default=IssuePriority.MEDIUM)
    # Sort key for priority (0 = critical) kept in the row so the inbox sorts on an index.
    priority_rank = models.PositiveSmallIntegerField(default=2, editable=False)
    assignee_agent = models.ForeignKey(
        "issues.Agent", null=True, blank=True, on_delete=models.SET_NULL, related_name="assigned_issues"
    )
    assignee_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="assigned_issues"
    )
    created_by_agent = models.ForeignKey(
        "issues.Agent", null=True, blank=True, on_delete=models.SET_NULL, related_name="created_issues"
    )
    # Upstream's billingCode: who pays for cross-team work (free text; cost events carry their own).
    billing_code = models.CharField(max_length=200, blank=True)
    created_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="created_issues"
    )
    # The claim: which run checked the issue out, and which run holds the execution lock.
    checkout_run = models.ForeignKey(
        "issues.HeartbeatRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="checked_out_issues"
    )
    execution_run = models.ForeignKey(
        "issues.HeartbeatRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="executing_issues"
    )
    execution_locked_at = models.DateTimeField(null=True, blank=True)
    # A long-lived agent key's own run id (X-Paperclip-Run-Id naming none of the host's runs): never a
    # live host run, so the same agent adopts the lock when it presents another id (upstream).
    checkout_client_run_id = models.UUIDField(null=True, blank=True)
    labels = models.ManyToManyField("issues.Label", blank=True, related_name="issues")
    # Workspace binding and preference. A child never inherits these from its parent (seed 000).
    execution_workspace = models.ForeignKey(
        "issues.ExecutionWorkspace", null=True, blank=True, on_delete=models.SET_NULL, related_name="bound_issues"
    )
    workspace_strategy = models.CharField(max_length=24, choices=WorkspaceStrategy.choices, blank=True,
                                          help_text="Blank: the project's strategy.")
    workspace_reuse_existing = models.BooleanField(default=False)
    workspace_branch = models.CharField(max_length=200, blank=True, help_text="A pinned branch, if any.")
    started_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["priority_rank", "created_at"]
        indexes = [
            models.Index(fields=["company", "assignee_agent", "status"], name="issue_inbox_idx"),
            models.Index(fields=["company", "status", "priority_rank", "created_at"], name="issue_list_idx"),
            # imports find an issue by its origin (§6.3 dedupe, a reopen's follow-up); on PostgreSQL the
            # addresses its description mentions are indexed too (migration 0015, issues/mentioned_addresses.py)
            models.Index(fields=["company", "origin_kind", "origin_id"], name="issue_origin_idx"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["company", "number"], name="issue_number_unique_per_company"),
            choices_check("status", IssueStatus, "issue_status_valid"),
            choices_check("priority", IssuePriority, "issue_priority_valid"),
            choices_check("origin_kind", OriginKind, "issue_origin_kind_valid"),
            models.CheckConstraint(condition=~Q(parent=F("id")), name="issue_not_own_parent"),
            models.CheckConstraint(
                condition=Q(assignee_agent__isnull=True) | Q(assignee_user__isnull=True),
                name="issue_single_assignee",
            ),
            # Work in progress always has an owner.
            models.CheckConstraint(
                condition=~Q(status=IssueStatus.IN_PROGRESS)
                | Q(assignee_agent__isnull=False)
                | Q(assignee_user__isnull=False),
                name="issue_in_progress_has_assignee",
            ),
            # Locks exist only while work is in progress; leaving in_progress clears them.
            models.CheckConstraint(
                condition=Q(status=IssueStatus.IN_PROGRESS)
                | (Q(checkout_run__isnull=True) & Q(execution_run__isnull=True) & Q(execution_locked_at__isnull=True)
                   & Q(checkout_client_run_id__isnull=True)),
                name="issue_lock_only_in_progress",
            ),
        ]

    def __str__(self):
        return f"{self.identifier} {self.title}"


class IssueRelation(models.Model):
    """``issue`` blocks ``related_issue`` until ``issue`` is done."""

    company = models.ForeignKey(Company, on_delete=models.CASCADE, related_name="+")
    issue = models.ForeignKey(Issue, on_delete=models.CASCADE, related_name="outgoing_relations")
    related_issue = models.ForeignKey(Issue, on_delete=models.CASCADE, related_name="incoming_relations")
    kind = models.CharField(max_length=16, choices=RelationKind.choices, default=RelationKind.BLOCKS)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["issue", "related_issue", "kind"], name="issue_relation_unique"),
            models.CheckConstraint(condition=~Q(issue=F("related_issue")), name="issue_relation_not_self"),
            choices_check("kind", RelationKind, "issue_relation_kind_valid"),
        ]

    def __str__(self):
        return f"{self.issue_id} {self.kind} {self.related_issue_id}"
