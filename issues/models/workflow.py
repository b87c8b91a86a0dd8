from django.db import models
from django.db.models import Q

from .company import Company, Project


class WorkflowDocumentCache(models.Model):
    """The last good workflow document (WORKFLOW.md format) of one project and source: the project's
    workflow document or its repository ``WORKFLOW.md``. An invalid edit keeps runs and dispatch on
    this version, across processes; ``error_hash`` is the invalid version already reported, so it is
    reported once. The host reads its front matter for run settings (issues.workflow); the connectors
    read its body for the task packet."""

    SOURCES = (("project", "Project workflow document"), ("repository", "Repository WORKFLOW.md"))

    company = models.ForeignKey(Company, on_delete=models.CASCADE, related_name="+")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    source = models.CharField(max_length=16, choices=SOURCES)
    content_hash = models.CharField(max_length=64, blank=True,
                                    help_text="SHA-256 of the last good document; empty while none was valid.")
    front_matter = models.JSONField(default=dict, blank=True)
    template = models.TextField(blank=True, help_text="The trimmed Liquid body; empty = use the next layer.")
    loaded_at = models.DateTimeField()
    error_hash = models.CharField(max_length=64, blank=True, help_text="SHA-256 of the invalid version reported.")
    last_error = models.TextField(blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "source"], name="workflow_document_unique_source"),
            models.CheckConstraint(condition=Q(source__in=["project", "repository"]),
                                   name="workflow_document_source_valid"),
        ]

    def __str__(self):
        return f"{self.project_id} {self.source} {self.content_hash[:12]}"
