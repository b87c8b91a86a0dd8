"""The issue page's "Export to tracker" action (§6.2.2): a panel (registered in AppConfig.ready()) listing
the connectors the issue can be exported to (active, whose provider declares create_task, not yet
linked to the issue; one option per container) and the issue's exports that did not link, each with a
retry under its own key (which finds a task an attempt with a lost answer created). Operators and up;
the form posts to :func:`issue_export_view`, which calls the same service as the API."""
from __future__ import annotations

from django.contrib import messages
from django.http import HttpResponseRedirect
from django.urls import reverse

from connectors.models import ConnectorInstance, TaskExport
from connectors.services.export import export_targets, issue_export, unfinished_exports
from issues.console.base import adopt_company, error_text, safe_next
from issues.console.permissions import ACT_ON_WORK, console_action, console_actor, has_role, require_role
from issues.exceptions import ApiError, Forbidden, NotFound
from issues.models import Issue
from issues.selectors import scoped_get

from .common import new_key
from .common import form_key as _key

TARGET_SEPARATOR = "::"


def _issue_url(issue) -> str:
    return reverse("console:issue-detail", args=[issue.identifier])


def issue_export_panel(request, issue):
    """Nothing for viewers, or when no connector can take the issue and no export waits for a retry."""
    if not has_role(request, issue.company_id, ACT_ON_WORK):
        return None
    targets = [{"value": f"{instance.pk}{TARGET_SEPARATOR}{container}", "instance": instance, "container": container}
               for instance, containers in export_targets(issue) for container in containers]
    retries = unfinished_exports(issue)
    if not targets and not retries:
        return None
    return "connectors/_issue_export_panel.html", {
        "targets": targets, "retries": retries, "form_key": new_key(),
        "action": reverse("connectors_console:issue-export", args=[issue.identifier]),
        "next": _issue_url(issue) + "#export-panel"}


@console_action
def issue_export_view(request, identifier):
    actor = console_actor(request)
    issue = scoped_get(Issue.objects.select_related("company"), actor, str(identifier).upper(), "Issue",
                       field="identifier")
    adopt_company(request, issue.company)
    require_role(request, issue.company_id, ACT_ON_WORK)
    back = safe_next(request, _issue_url(issue) + "#export-panel")
    retry = (request.POST.get("retry") or "").strip()
    if retry:  # the same export again, under its own key
        export = scoped_get(TaskExport.objects.select_related("instance").filter(issue=issue), actor,
                            int(retry) if retry.isdigit() else -1, "Export")
        instance, container, key = export.instance, export.container, export.idempotency_key
    else:
        instance_id, _, container = (request.POST.get("target") or "").partition(TARGET_SEPARATOR)
        if not instance_id:
            messages.error(request, "Choose a connector and a container to export to.")
            return HttpResponseRedirect(back)
        instance = scoped_get(ConnectorInstance.objects.filter(company_id=issue.company_id), actor, instance_id,
                              "Connector")
        key = _key(request)
    try:
        outcome = issue_export(actor=actor, instance=instance, issue=issue, container=container, idempotency_key=key)
    except (NotFound, Forbidden):
        raise
    except ApiError as exc:
        messages.error(request, f"Export to {instance.name} failed: {error_text(exc)}")
        return HttpResponseRedirect(back)
    link = outcome.link
    messages.success(request, f"{issue.identifier} exported to {instance.name} as "
                              f"{link.external_key or link.external_task_id}.")
    return HttpResponseRedirect(back)
