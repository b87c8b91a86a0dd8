"""What accumulates on an issue: comments, documents with revisions, work products, interactions."""
from django.conf import settings
from django.db import models
from django.db.models import Q

from issues.choices import AuthorType, DocumentFormat, InteractionKind, InteractionStatus, WorkProductKind

from .base import UUIDModel, choices_check
from .company import Company
from .issue import Issue


class Authored(models.Model):
    """Who wrote a row, as issues.services.thread.revision_author fills it: an agent (and its run),
    a board user, or the host (``system``)."""

    author_type = models.CharField(max_length=16, choices=AuthorType.choices)
    # RESTRICT: what an agent wrote stays attributed to it, so purging an agent that wrote here is
    # refused (issues.services.agents.agent_delete: terminate it instead); the company's deletion
    # still removes both.
    author_agent = models.ForeignKey("issues.Agent", null=True, blank=True, on_delete=models.RESTRICT,
                                     related_name="+")
    author_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    run = models.ForeignKey("issues.HeartbeatRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        abstract = True

    @staticmethod
    def author_constraints(prefix: str) -> list:
        """The author columns' rules: a known author type, and an agent's row names the agent."""
        return [
            choices_check("author_type", AuthorType, f"{prefix}_author_type_valid"),
            models.CheckConstraint(condition=~Q(author_type=AuthorType.AGENT) | Q(author_agent__isnull=False),
                                   name=f"{prefix}_agent_author_set"),
        ]


class Comment(UUIDModel, Authored):
    company = models.ForeignKey(Company, on_delete=models.CASCADE, related_name="+")
    issue = models.ForeignKey(Issue, on_delete=models.CASCADE, related_name="comments")
    body = models.TextField()
    # Where the text came from (tracker, actor, URL); anything external is untrusted.
    provenance = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["issue", "created_at"], name="comment_issue_created_idx")]
        constraints = Authored.author_constraints("comment")


class DocumentVisibility(models.Model):
    """Visibility to the bounded case page reads (cases.reading), which skip both kinds; shared by
    issue documents and case-owned ones (``cases.CaseDocument``)."""

    system = models.BooleanField(default=False, help_text="Written by the host for itself, not agent material.")
    quarantined_at = models.DateTimeField(null=True, blank=True,
                                          help_text="Set by an operator: withheld from agents' page reads.")
    quarantined_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                       related_name="+")
    quarantine_reason = models.CharField(max_length=500, blank=True)

    class Meta:
        abstract = True


class Document(UUIDModel, DocumentVisibility):
    """A key-addressed issue document (``plan``, ``workflow`` …); its text lives in revisions."""

    company = models.ForeignKey(Company, on_delete=models.CASCADE, related_name="+")
    issue = models.ForeignKey(Issue, on_delete=models.CASCADE, related_name="documents")
    key = models.CharField(max_length=64)
    title = models.CharField(max_length=300, blank=True)
    format = models.CharField(max_length=16, choices=DocumentFormat.choices, default=DocumentFormat.MARKDOWN)
    latest_revision = models.ForeignKey(
        "issues.DocumentRevision", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    revision_count = models.PositiveIntegerField(default=0)

    # Where an operator's quarantine/release is audited (issues.services.document_visibility).
    activity_entity_type = "issue"

    @property
    def activity_entity_id(self):
        return self.issue_id

    class Meta:
        ordering = ["key"]
        constraints = [
            models.UniqueConstraint(fields=["issue", "key"], name="document_key_unique_per_issue"),
            models.CheckConstraint(condition=Q(key__regex=r"^[a-z0-9][a-z0-9_-]{0,63}$"), name="document_key_format"),
            choices_check("format", DocumentFormat, "document_format_valid"),
            models.CheckConstraint(condition=Q(quarantined_at__isnull=False)
                                   | Q(quarantined_by__isnull=True, quarantine_reason=""),
                                   name="document_quarantine_fields_only_when_quarantined"),
        ]

    def __str__(self):
        return f"{self.issue_id}:{self.key}"


class DocumentRevision(UUIDModel, Authored):
    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="revisions")
    number = models.PositiveIntegerField()
    title = models.CharField(max_length=300, blank=True)
    body = models.TextField()
    # The writer's note on what this revision changed (upstream's changeSummary).
    change_summary = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["document", "number"]
        constraints = [
            models.UniqueConstraint(fields=["document", "number"], name="document_revision_number_unique"),
            *Authored.author_constraints("document_revision"),
        ]


class WorkProduct(UUIDModel):
    company = models.ForeignKey(Company, on_delete=models.CASCADE, related_name="+")
    issue = models.ForeignKey(Issue, on_delete=models.CASCADE, related_name="work_products")
    kind = models.CharField(max_length=16, choices=WorkProductKind.choices)
    title = models.CharField(max_length=300, blank=True)
    url = models.URLField(max_length=1000, blank=True)
    external_id = models.CharField(max_length=200, blank=True)
    status = models.CharField(max_length=32, blank=True)
    run = models.ForeignKey("issues.HeartbeatRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        ordering = ["created_at"]
        constraints = [choices_check("kind", WorkProductKind, "work_product_kind_valid")]


class Interaction(UUIDModel):
    """An issue-thread question for the board, e.g. a confirmation bound to a plan revision."""

    company = models.ForeignKey(Company, on_delete=models.CASCADE, related_name="+")
    issue = models.ForeignKey(Issue, on_delete=models.CASCADE, related_name="interactions")
    kind = models.CharField(max_length=32, choices=InteractionKind.choices)
    status = models.CharField(max_length=16, choices=InteractionStatus.choices, default=InteractionStatus.PENDING)
    title = models.CharField(max_length=300)
    body = models.TextField(blank=True)
    payload = models.JSONField(default=dict, blank=True)
    document_revision = models.ForeignKey(
        DocumentRevision, null=True, blank=True, on_delete=models.PROTECT, related_name="interactions"
    )
    created_by_agent = models.ForeignKey(
        "issues.Agent", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    run = models.ForeignKey("issues.HeartbeatRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    response = models.JSONField(default=dict, blank=True)
    responded_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    responded_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at"]
        constraints = [
            choices_check("kind", InteractionKind, "interaction_kind_valid"),
            choices_check("status", InteractionStatus, "interaction_status_valid"),
            models.CheckConstraint(condition=Q(title__gt=""), name="interaction_title_present"),
        ]
