from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Lower

from .base import UUIDModel
from .company import Company, Goal, Project
from .issue import Issue


class CostEvent(UUIDModel):
    """One reported spend (upstream ``POST /companies/{id}/cost-events``). Run heartbeats' usage is
    the same ledger: it is added to the agent's spend as it arrives, never twice."""

    company = models.ForeignKey(Company, on_delete=models.CASCADE, related_name="cost_events")
    agent = models.ForeignKey("issues.Agent", on_delete=models.CASCADE, related_name="cost_events")
    issue = models.ForeignKey(Issue, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    project = models.ForeignKey(Project, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    goal = models.ForeignKey(Goal, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    run = models.ForeignKey("issues.HeartbeatRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    billing_code = models.CharField(max_length=200, blank=True)
    provider = models.CharField(max_length=100)
    biller = models.CharField(max_length=100, blank=True)
    billing_type = models.CharField(max_length=32, default="unknown")
    model = models.CharField(max_length=200)
    input_tokens = models.PositiveBigIntegerField(default=0)
    cached_input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    cost_cents = models.PositiveBigIntegerField(default=0)
    occurred_at = models.DateTimeField()

    class Meta:
        ordering = ["-occurred_at"]
        indexes = [models.Index(fields=["company", "occurred_at"], name="cost_company_occurred_idx")]


class Label(UUIDModel):
    company = models.ForeignKey(Company, on_delete=models.CASCADE, related_name="labels")
    name = models.CharField(max_length=48)
    color = models.CharField(max_length=7, default="#6b7280")

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(Lower("name"), "company", name="label_name_unique_per_company"),
            models.CheckConstraint(condition=Q(color__regex=r"^#[0-9A-Fa-f]{6}$"), name="label_color_hex"),
        ]

    def __str__(self):
        return self.name


class ApprovalComment(UUIDModel):
    company = models.ForeignKey(Company, on_delete=models.CASCADE, related_name="+")
    approval = models.ForeignKey("issues.Approval", on_delete=models.CASCADE, related_name="comments")
    body = models.TextField()
    author_agent = models.ForeignKey("issues.Agent", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    author_user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="+")

    class Meta:
        ordering = ["created_at", "id"]
