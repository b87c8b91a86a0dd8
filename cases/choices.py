from django.db import models


class CaseStatus(models.TextChoices):
    DRAFT = "draft"
    IN_PROGRESS = "in_progress"
    IN_REVIEW = "in_review"
    APPROVED = "approved"
    DONE = "done"
    CANCELLED = "cancelled"


# Lifecycle order: how status groups and status sorting are ordered.
CASE_STATUS_ORDER = [s.value for s in CaseStatus]


class CaseLinkRole(models.TextChoices):
    ORIGIN = "origin"
    WORK = "work"
    REFERENCE = "reference"


class CaseEventKind(models.TextChoices):
    CREATED = "created"
    UPDATED = "updated"
    STATUS_CHANGED = "status_changed"
    ISSUE_LINKED = "issue_linked"
    WORKFLOW_CHANGED = "workflow_changed"
    HANDOFF = "handoff"


class WorkflowAction(models.TextChoices):
    ADOPT = "adopt"
    REFRESH = "refresh"
    PRESERVE = "preserve"
    DETACH = "detach"


class HandoffStatus(models.TextChoices):
    PENDING = "pending"
    ACCEPTED = "accepted"
    HELD = "held"
    APPLIED = "applied"
    CANCELLED = "cancelled"
    FAILED = "failed"


class CaseSortField(models.TextChoices):
    UPDATED = "updated"
    CREATED = "created"
    TITLE = "title"
    STATUS = "status"
    TYPE = "type"


class SortDir(models.TextChoices):
    ASC = "asc"
    DESC = "desc"


class CaseGroupBy(models.TextChoices):
    NONE = "none"
    STATUS = "status"
    TYPE = "type"
    PROJECT = "project"
