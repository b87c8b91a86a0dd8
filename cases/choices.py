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
    ISSUE_UNLINKED = "issue_unlinked"
    WORKFLOW_CHANGED = "workflow_changed"
    HANDOFF = "handoff"  # accepted: who to whom, with the captured workflow name and phase
    HANDOFF_APPLIED = "handoff_applied"  # the transfer took effect (workflow, phase, document, assignee)
    HANDOFF_HELD = "handoff_held"  # the workflow document moved past the base revision
    HANDOFF_CANCELLED = "handoff_cancelled"  # by a principal, or invalidated (stop, cancel, reassignment)
    CLOSED = "closed"  # a closure intent met the primary task's accepted completion
    DOCUMENT_REVISED = "document_revised"  # a case-owned document got a new revision


class WorkflowAction(models.TextChoices):
    ADOPT = "adopt"
    REFRESH = "refresh"
    PRESERVE = "preserve"
    DETACH = "detach"


class HandoffStatus(models.TextChoices):
    PENDING = "pending"  # legacy/unused: acceptance is synchronous
    ACCEPTED = "accepted"  # captured; waits for the outgoing execution to settle (or, for "done", completion)
    HELD = "held"  # the task document changed after the base revision: recovery needed
    APPLIED = "applied"  # transferred (or, for "done", the case closed)
    CANCELLED = "cancelled"
    FAILED = "failed"  # could not be applied (recipient gone, provenance lost); see recovery_detail


# A case has at most one open handoff at a time (a database constraint).
OPEN_HANDOFF_STATUSES = (HandoffStatus.PENDING, HandoffStatus.ACCEPTED, HandoffStatus.HELD)


class HandoffTarget(models.TextChoices):
    AGENT = "agent"
    DONE = "done"  # a closure intent: no assignment, no wake


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
