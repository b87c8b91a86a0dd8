"""The backlink an exported task's description carries (§6.2.2, §6.3 step 2), and the export it names.

An export writes a visible ``Exported from Paperclip: [PAP-12](<issue url>)`` line (every provider keeps
it: Jira's ADF conversion too) and a hidden ``<!-- paperclip:issue=<id> -->`` marker (GitHub and Linear
keep HTML comments; the import dedupe reads it). Shared by the export service, which looks for the task
an attempt with a lost answer created, and the inbound import, which must not import that task as a
new issue while its export has not linked it yet (its creation webhook can beat the export's answer)."""
from __future__ import annotations

from datetime import timedelta

from connectors.choices import ExportStatus
from connectors.models import ConnectorInstance, TaskExport
from connectors.providers.base import ExternalTask
from issues.models import Issue

from .outbound import issue_url

EXPORT_HEAD = "Exported from Paperclip"
# How far a provider's clock may be behind ours when a task is matched to the export that created it.
CLOCK_SKEW = timedelta(minutes=10)
UNLINKED_EXPORTS_CHECKED = 50


def export_footer(issue: Issue) -> str:
    return f"{EXPORT_HEAD}: [{issue.identifier}]({issue_url(issue)})\n\n<!-- paperclip:issue={issue.pk} -->"


def carries_backlink(task: ExternalTask, issue: Issue) -> bool:
    text = task.description or ""
    return f"]({issue_url(issue)})" in text or f"paperclip:issue={issue.pk}" in text


def created_by(task: ExternalTask, export: TaskExport) -> bool:
    """Whether ``task`` can be the one ``export`` created: it carries the backlink and is not older."""
    same_container = not task.container_id or task.container_id.lower() == export.container.lower()
    return same_container and carries_backlink(task, export.issue) and (
        task.created_at is None or task.created_at >= export.created_at - CLOCK_SKEW)


def unlinked_export_of(instance: ConnectorInstance, task: ExternalTask) -> TaskExport | None:
    """The export of this instance (pending, or failed and waiting for its retry) that created ``task``.
    A task without our export line costs no query (the import path's statement budget)."""
    text = task.description or ""
    if EXPORT_HEAD not in text and "paperclip:issue=" not in text:
        return None
    exports = (TaskExport.objects.select_related("issue").filter(instance=instance)
               .exclude(status=ExportStatus.LINKED).order_by("-updated_at")[:UNLINKED_EXPORTS_CHECKED])
    return next((export for export in exports if created_by(task, export)), None)
