from django.conf import settings
from django.db import models

from issues.choices import ApprovalStatus, ApprovalType

from .base import UUIDModel, choices_check
from .company import Company
from .issue import Issue


class Approval(UUIDModel):
    company = models.ForeignKey(Company, on_delete=models.CASCADE, related_name="approvals")
    type = models.CharField(max_length=32, choices=ApprovalType.choices, default=ApprovalType.GENERIC)
    status = models.CharField(max_length=24, choices=ApprovalStatus.choices, default=ApprovalStatus.PENDING)
    title = models.CharField(max_length=300)
    payload = models.JSONField(default=dict, blank=True)
    requested_by_agent = models.ForeignKey(
        "issues.Agent", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    requested_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decision_note = models.TextField(blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    issues = models.ManyToManyField(Issue, through="ApprovalIssue", related_name="approvals")

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            choices_check("type", ApprovalType, "approval_type_valid"),
            choices_check("status", ApprovalStatus, "approval_status_valid"),
        ]

    def __str__(self):
        return self.title


class ApprovalIssue(models.Model):
    approval = models.ForeignKey(Approval, on_delete=models.CASCADE, related_name="issue_links")
    issue = models.ForeignKey(Issue, on_delete=models.CASCADE, related_name="approval_links")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["approval", "issue"], name="approval_issue_unique")]
