"""Connector pages of the operator console: instance list, per-instance health (§12.2), the conflict
queue (§11.3) and the link actions of the issue page's link panel (§12.3).

Roles: viewers read; operators replay parked events, act on links and resolve conflicts; admins and
owners pause/resume a whole connector. Every action calls the same service as the API
(``connectors.services.interventions``, ``connectors.services.conflicts.conflict_resolve``), which
writes the audit entry.

Live refresh of the health page (htmx polling, every ``POLL_EVERY``). Each poll carries the
fingerprint of what the page shows and how many polls in a row saw it unchanged. The server answers
**286** (htmx stops polling) when the page is idle:

* nothing changed for ``IDLE_POLLS`` polls (30 s) **and** nothing is in flight (no pending event,
  no scheduled retry) — a healthy, drained connector needs no watching; or
* nothing changed for ``MAX_IDLE_POLLS`` polls (5 min) whatever the queue says — a stuck queue that
  does not move is better looked at with a reload than polled all night.

The final fragment says that live refresh stopped and offers a button to resume it.
"""
from __future__ import annotations

import json

from django import forms
from django.contrib import messages
from django.http import HttpResponseRedirect
from django.urls import reverse
from django.views.decorators.http import require_GET

from connectors.choices import ConflictAction, ConflictKind, ConflictStatus
from connectors.filtersets import ConflictFilterSet
from connectors.models import Conflict, ConnectorInstance, InboundEvent, TaskLink
from connectors.providers.base import ProviderError
from connectors.secrets import SecretUnavailable
from connectors.services import interventions
from issues.console.base import adopt_company, error_text, perform, render_page, safe_next, wants_partial
from issues.console.runs import STOP_POLLING
from issues.console.permissions import (
    ACT_ON_WORK,
    can,
    console_action,
    console_actor,
    console_page,
    has_role,
    require_role,
)
from issues.exceptions import ApiError, Conflict as ConflictError, NotFound
from issues.selectors import scoped_get

from . import capabilities, selectors
from .common import MANAGE_CONNECTORS, instance_url, new_key
from .common import form_key as _key
from .common import instance_for as _instance
from .setup import setup_panel

POLL_EVERY = "5s"
IDLE_POLLS = 6
MAX_IDLE_POLLS = 60
CONFLICTS_SHOWN = 100
FILTER_FORM_ID = "conflict-filters"

ACTION_LABELS = {
    ConflictAction.KEEP_PAPERCLIP: "Keep Paperclip",
    ConflictAction.KEEP_EXTERNAL: "Keep external",
    ConflictAction.MERGE_MANUAL: "Merge manually",
    ConflictAction.UNLINK: "Unlink",
    ConflictAction.DISMISS: "Dismiss",
}
ACTION_EXPLAINED = {
    ConflictAction.KEEP_PAPERCLIP: "The Paperclip value wins and is written to the tracker.",
    ConflictAction.KEEP_EXTERNAL: "The tracker's value wins and is written to the Paperclip issue.",
    ConflictAction.MERGE_MANUAL: "Your edited value is written to both sides.",
    ConflictAction.UNLINK: "Sync stops for this task; neither side is deleted.",
    ConflictAction.DISMISS: "Nothing is written; the difference is accepted as it is.",
}
# Fields whose merged value is plain text (everything else is JSON).
TEXT_FIELDS = ("title", "description", "priority", "state")


def _flags(request, company) -> dict:
    """The console's usual flags plus whether connectors may be managed."""
    return {**can(request, company), "manage": has_role(request, company.pk, MANAGE_CONNECTORS)}


# --- instance list --------------------------------------------------------------------------------


@console_page
@require_GET
def instance_list(request):
    company = request.company
    context = {"company": company, "rows": []}
    if company is not None:
        context["rows"] = selectors.instances_overview(company)
        context["flags"] = _flags(request, company)
        context["form_key"] = new_key()
    return render_page(request, "connectors/instance_list.html", None, context)


# --- health page ---------------------------------------------------------------------------------


def _health_context(request, instance, *, idle: int = 0) -> dict:
    data = selectors.health_page(instance)
    return {"company": instance.company, "instance": instance, **data, "flags": _flags(request, instance.company),
            "idle": idle, "poll_every": POLL_EVERY, "live": True, "form_key": new_key(),
            "routing_rules": list(instance.routing_rules.select_related("target_agent").order_by("order", "id")),
            "capabilities": capabilities.instance_capabilities(instance)}


@console_page
@require_GET
def instance_detail(request, instance_id):

    instance = _instance(request, instance_id)
    return render_page(request, "connectors/health.html", None,
                       {**_health_context(request, instance), **setup_panel(request, instance)})


@console_page
@require_GET
def instance_health_live(request, instance_id):
    """The live part of the health page (polled). See the module docstring for when it answers 286."""
    instance = _instance(request, instance_id)
    try:
        idle = max(0, int(request.GET.get("idle", "0")))
    except ValueError:
        idle = 0
    context = _health_context(request, instance)
    idle = idle + 1 if request.GET.get("fp") == context["fingerprint"] else 0
    stop = (idle >= IDLE_POLLS and selectors.is_quiet(context["health"])) or idle >= MAX_IDLE_POLLS
    context.update(idle=idle, live=not stop)
    return render_page(request, "connectors/health.html", "connectors/_health_live.html", context,
                       status=STOP_POLLING if stop else 200)


@console_action
def instance_pause_view(request, instance_id):
    instance = _instance(request, instance_id)
    require_role(request, instance.company_id, MANAGE_CONNECTORS)
    return perform(request, lambda: interventions.instance_pause(
        actor=console_actor(request), instance=instance, idempotency_key=_key(request),
        reason=(request.POST.get("reason") or "").strip()[:300]),
        success=f"{instance.name} paused: nothing is applied or written until it is resumed.",
        redirect_to=safe_next(request, instance_url(instance)))


@console_action
def instance_resume_view(request, instance_id):
    instance = _instance(request, instance_id)
    require_role(request, instance.company_id, MANAGE_CONNECTORS)
    return perform(request, lambda: interventions.instance_resume(
        actor=console_actor(request), instance=instance, idempotency_key=_key(request)),
        success=f"{instance.name} resumed; " + "{result[queuedTasks]} task(s) queued.",
        redirect_to=safe_next(request, instance_url(instance)))


@console_action
def event_replay_view(request, event_id):
    actor = console_actor(request)
    try:
        pk = int(event_id)
    except ValueError:
        raise NotFound("Event not found.") from None
    event = scoped_get(InboundEvent.objects.select_related("instance", "instance__company"), actor, pk, "Event")
    adopt_company(request, event.instance.company)
    require_role(request, event.company_id, ACT_ON_WORK)
    return perform(request, lambda: interventions.event_replay(actor=actor, event=event,
                                                               idempotency_key=_key(request)),
                   success=f"Event #{event.pk} queued for replay.",
                   redirect_to=safe_next(request, instance_url(event.instance) + "#parked"))


# --- link actions (from the issue page) ----------------------------------------------------------


def _link(request, link_id) -> TaskLink:
    link = scoped_get(TaskLink.objects.select_related("instance", "issue", "company"), console_actor(request),
                      link_id, "Link")
    adopt_company(request, link.company)
    require_role(request, link.company_id, ACT_ON_WORK)
    return link


def _issue_url(link) -> str:
    return reverse("console:issue-detail", args=[link.issue.identifier]) + "#link-panel"


LINK_ACTIONS = {
    "resync": (interventions.link_resync, "Resync of {key} queued."),
    "pause": (interventions.link_pause, "Sync of {key} paused."),
    "resume": (interventions.link_resume, "Sync of {key} resumed."),
    "unlink": (interventions.link_unlink, "{key} unlinked; both sides are kept."),
}


@console_action
def link_action(request, link_id, action):
    if action not in LINK_ACTIONS:
        raise NotFound("No such action.")
    link = _link(request, link_id)
    if not capabilities.link_offers(link.provider_key).get(action, True):  # hidden on the page; refused here too
        messages.error(request, f"The {link.provider_key} connector cannot "
                                f"{capabilities.WHAT[capabilities.LINK_ACTIONS[action]]}.")
        return HttpResponseRedirect(safe_next(request, _issue_url(link)))
    service, success = LINK_ACTIONS[action]
    success = success.format(key=link.external_key or link.external_task_id)
    redirect_to = safe_next(request, _issue_url(link))
    try:
        return perform(request, lambda: service(actor=console_actor(request), link=link,
                                                idempotency_key=_key(request),
                                                reason=(request.POST.get("reason") or "").strip()[:300]),
                       success=success, redirect_to=redirect_to)
    except (SecretUnavailable, ProviderError) as exc:
        # The intervention is committed; only the resync it kicks (run inline without a broker) failed.
        messages.warning(request, f"{success} The resync it started failed: {exc}")
        return HttpResponseRedirect(redirect_to)


# --- conflict queue ------------------------------------------------------------------------------


class ConflictFilterForm(forms.Form):
    instance = forms.ChoiceField(required=False, label="Connector")
    kind = forms.ChoiceField(required=False, label="Kind", choices=[("", "Any kind"), *ConflictKind.choices])
    status = forms.ChoiceField(required=False, label="Status",
                               choices=[("open", "Open"), ("resolved", "Resolved"), ("dismissed", "Dismissed"),
                                        ("all", "Any status")])

    def __init__(self, *args, company, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["instance"].choices = [("", "All connectors"), *[
            (str(pk), name) for pk, name in ConnectorInstance.objects.filter(company=company)
            .order_by("name").values_list("pk", "name")]]


def _queue_params(request) -> dict:
    params = {k: request.GET.get(k, "") for k in ("instance", "kind", "status", "linkId")}
    params["status"] = params["status"] or ConflictStatus.OPEN
    return params


@console_page
@require_GET
def conflict_list(request):
    company = request.company
    context = {"company": company, "rows": [], "labels": ACTION_LABELS}
    if company is not None:
        params = _queue_params(request)
        form = ConflictFilterForm(params, company=company)
        qs = (Conflict.objects.filter(company=company)
              .select_related("instance", "link", "link__issue", "resolved_by_user")
              .order_by("-detected_at", "id"))
        errors = None
        if form.is_valid():
            if params["instance"]:
                qs = qs.filter(instance_id=params["instance"])
            filters = {k: v for k, v in (("kind", params["kind"]), ("linkId", params["linkId"]),
                                         ("status", "" if params["status"] == "all" else params["status"])) if v}
            filterset = ConflictFilterSet(data=filters, queryset=qs)
            if filterset.is_valid():
                qs = filterset.qs
            else:
                errors = filterset.errors
        else:
            errors = form.errors
        conflicts = list(qs[:CONFLICTS_SHOWN]) if not errors else []
        context.update(form=form, errors=errors, rows=selectors.conflict_rows(conflicts),
                       truncated=len(conflicts) >= CONFLICTS_SHOWN, flags=_flags(request, company),
                       query=request.GET.urlencode(), actions=ACTION_LABELS, text_fields=TEXT_FIELDS)
        for row in context["rows"]:
            row["form_key"] = new_key()
            row["keep_paperclip_gap"] = capabilities.keep_paperclip_gap(row["conflict"])  # §5.2: hide, explain
    # Only the filter form swaps the rows alone; other htmx requests (e.g. the queue page an action
    # redirects to) get the whole page and select what they need from it.
    partial = "connectors/_conflict_rows.html" if request.headers.get("HX-Trigger") == FILTER_FORM_ID else None
    return render_page(request, "connectors/conflict_list.html", partial, context)


def _explained(conflict, action: str) -> str:
    """What the action will do to this conflict: routing entries decide the assignee, not a field value."""
    if conflict.kind == ConflictKind.ROUTING:
        from connectors.services.routing_conflicts import ACTION_MEANING

        return ACTION_MEANING[action]
    gap = capabilities.keep_paperclip_gap(conflict) if action == ConflictAction.KEEP_PAPERCLIP else ""
    if gap:
        return f"{gap}: the Paperclip value is kept here and nothing is written to the tracker."
    return ACTION_EXPLAINED[action]


def _merged_value(conflict, raw: str):
    if conflict.field in TEXT_FIELDS or isinstance(conflict.paperclip_value, str) \
            or isinstance(conflict.external_value, str):
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


@console_action
def conflict_resolve_view(request, conflict_id):
    """Two steps without JavaScript dialogs: the first POST shows what the action will do and asks
    for confirmation; the confirmed POST calls ``conflict_resolve`` (optimistic concurrency: a
    conflict resolved elsewhere meanwhile answers with a clear message and changes nothing)."""
    from connectors.services.conflicts import conflict_resolve

    actor = console_actor(request)
    conflict = scoped_get(Conflict.objects.select_related("instance", "link", "link__issue", "company"), actor,
                          conflict_id, "Conflict")
    adopt_company(request, conflict.company)
    require_role(request, conflict.company_id, ACT_ON_WORK)
    action = request.POST.get("action", "")
    back = safe_next(request, reverse("connectors_console:conflict-list"))
    if action not in ACTION_LABELS:
        messages.error(request, f"Unknown action '{action}'.")
        return HttpResponseRedirect(back)
    merged = request.POST.get("merged_value")
    if request.POST.get("confirmed") != "1":
        row = selectors.conflict_rows([conflict])[0]
        return render_page(request, "connectors/conflict_confirm.html", None, {
            "company": conflict.company, "row": row, "conflict": conflict, "action": action,
            "action_label": ACTION_LABELS[action], "explained": _explained(conflict, action),
            "merged_value": merged if merged is not None else row["paperclip"],
            "form_key": _key(request), "next": back, "in_queue": wants_partial(request),
            "expected_status": request.POST.get("expected_status") or ConflictStatus.OPEN})
    kwargs = {}
    if action == ConflictAction.MERGE_MANUAL:
        kwargs["merged_value"] = _merged_value(conflict, merged or "")
    subject = f"{conflict.link.external_key or conflict.link.external_task_id} {conflict.field or conflict.kind}"
    try:
        conflict_resolve(actor=actor, conflict=conflict, action=action, idempotency_key=_key(request),
                         expected_status=request.POST.get("expected_status") or ConflictStatus.OPEN, **kwargs)
    except ConflictError as exc:
        current = Conflict.objects.select_related("resolved_by_user").get(pk=conflict.pk) \
            if exc.code == "conflict_not_open" else None
        if current is not None:
            who = getattr(getattr(current, "resolved_by_user", None), "username", None) or "someone else"
            messages.error(request, f"Not changed: the {subject} conflict was already {current.status} "
                                    f"({current.resolution or 'no resolution'}) by {who} meanwhile.")
        else:
            messages.error(request, error_text(exc))
        return HttpResponseRedirect(back)
    except (NotFound,):
        raise
    except ApiError as exc:
        messages.error(request, error_text(exc))
        return HttpResponseRedirect(back)
    messages.success(request, f"Conflict on {subject}: {ACTION_LABELS[action].lower()} done.")
    return HttpResponseRedirect(back)
