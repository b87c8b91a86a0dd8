"""Cases: a structured work record with one primary task whose ``workflow`` document holds the
procedure; links to other issues, an event history, reusable workflow definitions and handoffs."""
from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Lower

from issues.choices import ActorType, AuthorType, DocumentFormat
from issues.models.base import UUIDModel, choices_check
from issues.models.thread import DocumentVisibility

from .choices import (
    OPEN_HANDOFF_STATUSES,
    CaseEventKind,
    CaseLinkRole,
    CaseStatus,
    HandoffStatus,
    HandoffTarget,
    WorkflowAction,
)


class WorkflowDefinition(UUIDModel):
    """A company's reusable procedure: a name and a Markdown prompt, pinned by its fingerprint."""

    company = models.ForeignKey("issues.Company", on_delete=models.CASCADE, related_name="workflow_definitions")
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    prompt = models.TextField(help_text="Markdown procedure adopted into a case's task document 'workflow'.")
    fingerprint = models.CharField(max_length=64, editable=False, help_text="sha256 of the prompt (hex).")

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(Lower("name"), "company", name="workflow_definition_name_unique_per_company"),
            models.CheckConstraint(condition=~Q(name=""), name="workflow_definition_name_not_blank"),
        ]

    def __str__(self):
        return self.name


class Case(UUIDModel):
    company = models.ForeignKey("issues.Company", on_delete=models.CASCADE, related_name="cases")
    number = models.PositiveIntegerField()
    identifier = models.CharField(max_length=24, unique=True, help_text="PREFIX-C<n>.")
    case_type = models.CharField(max_length=100)
    idempotency_key = models.CharField(max_length=200, blank=True,
                                       help_text="Create-or-return key, unique per company and case type.")
    title = models.CharField(max_length=500)
    summary = models.TextField(blank=True)
    status = models.CharField(max_length=16, choices=CaseStatus.choices, default=CaseStatus.DRAFT)
    fields = models.JSONField(default=dict, blank=True, help_text="Structured facts of the case.")
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children")
    project = models.ForeignKey("issues.Project", null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="cases")
    primary_task = models.OneToOneField("issues.Issue", null=True, blank=True, on_delete=models.SET_NULL,
                                        related_name="primary_case")
    current_workflow = models.ForeignKey(WorkflowDefinition, null=True, blank=True, on_delete=models.SET_NULL,
                                         related_name="cases")
    phase = models.CharField(max_length=200, blank=True, help_text="Free-text phase inside the workflow.")
    created_by_agent = models.ForeignKey("issues.Agent", null=True, blank=True, on_delete=models.SET_NULL,
                                         related_name="created_cases")
    created_by_user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                        related_name="created_cases")

    class Meta:
        ordering = ["-updated_at", "id"]
        indexes = [models.Index(fields=["company", "status", "updated_at"], name="case_browse_idx")]
        constraints = [
            models.UniqueConstraint(fields=["company", "number"], name="case_number_unique_per_company"),
            models.UniqueConstraint(fields=["company", "case_type", "idempotency_key"],
                                    condition=~Q(idempotency_key=""), name="case_idempotency_key_unique"),
            choices_check("status", CaseStatus, "case_status_valid"),
            models.CheckConstraint(condition=~Q(parent=F("id")), name="case_not_own_parent"),
            models.CheckConstraint(condition=~Q(case_type=""), name="case_type_not_blank"),
        ]

    def __str__(self):
        return f"{self.identifier} {self.title}"


class CaseIssueLink(models.Model):
    company = models.ForeignKey("issues.Company", on_delete=models.CASCADE, related_name="+")
    case = models.ForeignKey(Case, on_delete=models.CASCADE, related_name="issue_links")
    issue = models.ForeignKey("issues.Issue", on_delete=models.CASCADE, related_name="case_links")
    role = models.CharField(max_length=16, choices=CaseLinkRole.choices, default=CaseLinkRole.WORK)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["case", "issue"], name="case_issue_link_unique"),
            choices_check("role", CaseLinkRole, "case_issue_link_role_valid"),
        ]

    def __str__(self):
        return f"{self.case_id} {self.role} {self.issue_id}"


class CaseEvent(models.Model):
    """Append-only history of a case."""

    company = models.ForeignKey("issues.Company", on_delete=models.CASCADE, related_name="+")
    case = models.ForeignKey(Case, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=32, choices=CaseEventKind.choices)
    details = models.JSONField(default=dict, blank=True)
    actor_type = models.CharField(max_length=16, choices=ActorType.choices)
    actor_agent = models.ForeignKey("issues.Agent", null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="+")
    actor_user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    run = models.ForeignKey("issues.HeartbeatRun", null=True, blank=True, on_delete=models.SET_NULL,
                            related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            choices_check("kind", CaseEventKind, "case_event_kind_valid"),
            choices_check("actor_type", ActorType, "case_event_actor_type_valid"),
        ]

    def __str__(self):
        return f"{self.case_id} {self.kind}"


class CaseHandoff(UUIDModel):
    """Moving a case from one agent to another, optionally adopting/refreshing/detaching a workflow.

    The prompt text, workflow name and the task document's base revision are captured at acceptance;
    they are applied together once the outgoing execution settles (or held for recovery)."""

    company = models.ForeignKey("issues.Company", on_delete=models.CASCADE, related_name="+")
    case = models.ForeignKey(Case, on_delete=models.CASCADE, related_name="handoffs")
    # RESTRICT: handoff history is retained; an agent it references is terminated, never purged
    # on its own (deleting the whole company still removes both).
    from_agent = models.ForeignKey("issues.Agent", null=True, blank=True, on_delete=models.RESTRICT,
                                   related_name="handoffs_out")
    to_agent = models.ForeignKey("issues.Agent", null=True, blank=True, on_delete=models.RESTRICT,
                                 related_name="handoffs_in")
    target = models.CharField(max_length=8, choices=HandoffTarget.choices, default=HandoffTarget.AGENT)
    kickoff = models.BooleanField(default=False, help_text="The first handoff, which created the case.")
    note = models.TextField(blank=True, help_text="Message for the recipient, posted on the task at transfer.")
    workflow_action = models.CharField(max_length=16, choices=WorkflowAction.choices,
                                       default=WorkflowAction.PRESERVE)
    workflow = models.ForeignKey(WorkflowDefinition, null=True, blank=True, on_delete=models.SET_NULL,
                                 related_name="handoffs")
    workflow_name = models.CharField(max_length=200, blank=True, help_text="Captured at acceptance.")
    prompt_text = models.TextField(blank=True, help_text="Captured at acceptance.")
    phase = models.CharField(max_length=200, blank=True)
    set_phase = models.BooleanField(default=False, help_text="False: the case keeps its phase.")
    previous_workflow_name = models.CharField(max_length=200, blank=True, help_text="Captured at acceptance.")
    previous_phase = models.CharField(max_length=200, blank=True, help_text="Captured at acceptance.")
    base_revision = models.ForeignKey("issues.DocumentRevision", null=True, blank=True,
                                      on_delete=models.SET_NULL, related_name="+")
    status = models.CharField(max_length=16, choices=HandoffStatus.choices, default=HandoffStatus.PENDING)
    principal = models.CharField(max_length=80, help_text="The authenticated principal: 'agent:<id>' or 'user:<id>'.")
    idempotency_key = models.CharField(max_length=200, blank=True)
    request_fingerprint = models.CharField(max_length=64, blank=True,
                                           help_text="sha256 of the request; a reused key with another body is refused.")
    applied_revision = models.ForeignKey("issues.DocumentRevision", null=True, blank=True,
                                         on_delete=models.SET_NULL, related_name="+")
    wakeup = models.ForeignKey("issues.WakeupRequest", null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="+", help_text="The delivery wake of the recipient.")
    source_run = models.ForeignKey("issues.HeartbeatRun", null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    accepted_at = models.DateTimeField(null=True, blank=True)
    applied_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    recovery_detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["principal", "idempotency_key"], condition=~Q(idempotency_key=""),
                                    name="case_handoff_idempotency_key_unique"),
            models.UniqueConstraint(fields=["case"], condition=Q(status__in=OPEN_HANDOFF_STATUSES),
                                    name="case_handoff_one_open_per_case"),
            models.CheckConstraint(condition=Q(target=HandoffTarget.DONE, to_agent__isnull=True)
                                   | Q(target=HandoffTarget.AGENT), name="case_handoff_done_has_no_recipient"),
            choices_check("target", HandoffTarget, "case_handoff_target_valid"),
            choices_check("workflow_action", WorkflowAction, "case_handoff_workflow_action_valid"),
            choices_check("status", HandoffStatus, "case_handoff_status_valid"),
        ]

    def __str__(self):
        return f"{self.case_id} handoff {self.status}"


class CaseDocument(UUIDModel, DocumentVisibility):
    """A document of the case itself (seed 001's "historical case-owned document"), beside the
    primary and linked tasks' own documents. Key-addressed and revisioned like an issue document,
    with the same visibility flags: agents' bounded page reads skip system and quarantined ones."""

    company = models.ForeignKey("issues.Company", on_delete=models.CASCADE, related_name="+")
    case = models.ForeignKey(Case, on_delete=models.CASCADE, related_name="documents")
    key = models.CharField(max_length=64)
    title = models.CharField(max_length=300, blank=True)
    format = models.CharField(max_length=16, choices=DocumentFormat.choices, default=DocumentFormat.MARKDOWN)
    latest_revision = models.ForeignKey("cases.CaseDocumentRevision", null=True, blank=True,
                                        on_delete=models.SET_NULL, related_name="+")
    revision_count = models.PositiveIntegerField(default=0)

    # Where an operator's quarantine/release is audited (issues.services.document_visibility).
    activity_entity_type = "case"

    @property
    def activity_entity_id(self):
        return self.case_id

    class Meta:
        ordering = ["key"]
        constraints = [
            models.UniqueConstraint(fields=["case", "key"], name="case_document_key_unique_per_case"),
            models.CheckConstraint(condition=Q(key__regex=r"^[a-z0-9][a-z0-9_-]{0,63}$"),
                                   name="case_document_key_format"),
            choices_check("format", DocumentFormat, "case_document_format_valid"),
            models.CheckConstraint(condition=Q(quarantined_at__isnull=False)
                                   | Q(quarantined_by__isnull=True, quarantine_reason=""),
                                   name="case_document_quarantine_fields_only_when_quarantined"),
        ]

    def __str__(self):
        return f"{self.case_id}:{self.key}"


class CaseDocumentRevision(UUIDModel):
    document = models.ForeignKey(CaseDocument, on_delete=models.CASCADE, related_name="revisions")
    number = models.PositiveIntegerField()
    title = models.CharField(max_length=300, blank=True)
    body = models.TextField()
    author_type = models.CharField(max_length=16, choices=AuthorType.choices)
    author_agent = models.ForeignKey("issues.Agent", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    author_user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="+")
    run = models.ForeignKey("issues.HeartbeatRun", null=True, blank=True, on_delete=models.SET_NULL,
                            related_name="+")

    class Meta:
        ordering = ["document", "number"]
        constraints = [
            models.UniqueConstraint(fields=["document", "number"], name="case_document_revision_number_unique"),
            choices_check("author_type", AuthorType, "case_document_revision_author_type_valid"),
        ]


__all__ = ["Case", "CaseDocument", "CaseDocumentRevision", "CaseEvent", "CaseHandoff", "CaseIssueLink",
           "WorkflowDefinition", "CaseEventKind", "CaseLinkRole"]
