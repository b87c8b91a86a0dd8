"""Operator console pages of the cases app: the case list (the API's filters, sorting and
grouping via ``selectors.case_browse``), the case page (facts, linked tasks, primary task and case documents,
handoff history with retry/cancel), workflow definitions (list, create, edit with a safe
Markdown preview, fingerprint and usage), and the case panel of the issue page. Views are thin:
selectors read, services write."""
from __future__ import annotations

from django import forms
from django.contrib import messages
from django.db.models import Q
from django.http import HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.views.decorators.http import require_GET

from issues.console.base import adopt_company, error_text, perform, render_page
from issues.console.permissions import ACT_ON_WORK, console_action, console_actor, console_page, require_role
from issues.exceptions import ApiError, InvalidInput, NotFound
from issues.selectors import assignable_agents, document_list, scoped_get
from paperclip.core.markdown import render_markdown

from . import handoffs, selectors, services
from .choices import CaseGroupBy, CaseLinkRole, CaseSortField, CaseStatus, HandoffStatus, SortDir
from .filtersets import CaseFilterSet
from .models import Case, CaseHandoff, CaseIssueLink, WorkflowDefinition

CASES_PER_PAGE = 50
RETRYABLE = (HandoffStatus.HELD, HandoffStatus.FAILED, HandoffStatus.ACCEPTED)
CANCELLABLE = (HandoffStatus.PENDING, HandoffStatus.ACCEPTED, HandoffStatus.HELD)


def _company(request):
    """The current company with cases enabled; otherwise a 404 like the API."""
    if request.company is None:
        raise NotFound("No company.")
    return selectors.cases_company(actor=console_actor(request), company_id=request.company.pk)


def case_url(case) -> str:
    return reverse("cases_console:case-detail", args=[case.identifier])


# --- the issue page's case panel (registered in CasesConfig.ready(); issues never imports cases) ---


def issue_case_panel(request, issue):
    """Each case the task is the primary or a linked task of, with the case's current workflow and
    phase; nothing when there is none or cases are off for the company."""
    if not issue.company.enable_cases:
        return None
    roles = dict(CaseIssueLink.objects.filter(issue=issue, company_id=issue.company_id)
                 .values_list("case_id", "role"))
    cases = list(Case.objects.filter(Q(primary_task=issue) | Q(pk__in=list(roles)), company_id=issue.company_id)
                 .select_related("current_workflow").defer("fields").order_by("created_at", "id"))
    if not cases:
        return None
    entries = [{"case": case, "role": "primary task" if case.primary_task_id == issue.pk
                else f"{CaseLinkRole(roles[case.pk]).label.lower()} link"} for case in cases]
    return "cases/_issue_case_panel.html", {"cases": entries}


# --- case list ------------------------------------------------------------------------------------


def _filter_form(params):
    form = CaseFilterSet(data=params, queryset=Case.objects.none()).form
    form.fields["search"].widget = forms.TextInput(attrs={"type": "search", "placeholder": "Title, type or PAP-C3"})
    form.fields["search"].label = "Search"
    form.fields["status"].label = "Status"
    form.fields["type"].label = "Type"
    form.fields["status"].widget = forms.TextInput(attrs={"placeholder": "draft,in_progress",
                                                          "list": "case-status-options"})
    form.fields["type"].widget = forms.TextInput(attrs={"placeholder": "Case type"})
    form.fields["sortField"].label = "Sort by"
    form.fields["sortField"].widget = forms.Select(choices=[("", "Default (updated)"), *CaseSortField.choices])
    form.fields["sortDir"].label = "Direction"
    form.fields["sortDir"].widget = forms.Select(choices=[("", "Default"), *SortDir.choices])
    form.fields["groupBy"].label = "Group by"
    form.fields["groupBy"].widget = forms.Select(choices=CaseGroupBy.choices)
    form.fields["projectId"].widget = forms.TextInput(attrs={"placeholder": "UUID", "size": 36})
    form.fields["projectId"].label = "Project id"
    return form


def _group_label(case, group_by):
    if group_by == CaseGroupBy.STATUS:
        return case.get_status_display()
    if group_by == CaseGroupBy.TYPE:
        return case.case_type
    if group_by == CaseGroupBy.PROJECT:
        return case.project.name if case.project else "No project"
    return None


@console_page
@require_GET
def case_list(request):
    company = _company(request)
    params = request.GET.copy()
    params.setdefault("limit", str(CASES_PER_PAGE))
    form = _filter_form(request.GET)
    context = {"company": company, "form": form, "statuses": CaseStatus.values, "page": None, "errors": None}
    try:
        page = selectors.case_browse(company=company, params=params)
    except InvalidInput as exc:
        form.is_valid()
        context["errors"] = exc.details
    else:
        groups, current = [], object()
        for case in page["items"]:
            label = _group_label(case, page["groupBy"])
            if not groups or label != current:
                groups.append({"label": label, "cases": []})
                current = label
            groups[-1]["cases"].append(case)
        offset, limit, total = page["offset"], page["limit"], page["total"]
        context.update(page=page, groups=groups, first=offset + 1 if total else 0,
                       last=min(offset + limit, total),
                       prev_offset=max(offset - limit, 0) if offset > 0 else None,
                       next_offset=offset + limit if offset + limit < total else None)
    return render_page(request, "cases/case_list.html", "cases/_case_rows.html", context)


# --- case page ------------------------------------------------------------------------------------


def _case(request, ref):
    case = selectors.case_detail(actor=console_actor(request), pk=ref)
    adopt_company(request, case.company)
    return case


@console_page
@require_GET
def case_detail(request, ref):
    case = _case(request, ref)
    context = {
        "company": case.company,
        "case": case,
        "documents": list(document_list(issue=case.primary_task)) if case.primary_task_id else [],
        "case_documents": selectors.case_documents(case=case),
        "handoffs": list(CaseHandoff.objects.filter(case=case).select_related("from_agent", "to_agent", "workflow")
                         .order_by("-created_at", "-id")),
        "agents": assignable_agents(company=case.company),
        "definitions": WorkflowDefinition.objects.filter(company=case.company).order_by("name").only("id", "name"),
        "keep": KEEP, "detach": DETACH,
        "retryable": RETRYABLE,
        "cancellable": CANCELLABLE,
        "fact_items": sorted((case.fields or {}).items()) if isinstance(case.fields, dict) else [],
    }
    return render_page(request, "cases/case_detail.html", None, context)


@console_action
def case_change(request, ref):
    """Title and summary through ``case_update`` (status, phase and workflow move by handoffs)."""
    case = _case(request, ref)
    require_role(request, case.company_id, ACT_ON_WORK)
    changes = {name: request.POST[name].strip() for name in ("title", "summary") if name in request.POST}
    return perform(request, lambda: services.case_update(actor=console_actor(request), case=case, changes=changes),
                   success="Case updated.", redirect_to=case_url(case))


KEEP = "__keep__"
DETACH = "__detach__"


@console_action
def handoff_new(request, ref):
    """Hand the case on through ``handoffs.handoff_request``: to an agent (optionally adopting,
    refreshing or detaching a workflow and setting the phase) or to ``done`` (closure intent)."""
    case = _case(request, ref)
    require_role(request, case.company_id, ACT_ON_WORK)
    to = request.POST.get("to", "")
    workflow = request.POST.get("workflow", KEEP)
    kwargs = {}
    if to != "done":
        if workflow == DETACH:
            kwargs["workflow_id"] = None
        elif workflow and workflow != KEEP:
            kwargs["workflow_id"] = workflow
        phase = (request.POST.get("phase") or "").strip()
        if phase:
            kwargs["phase"] = phase[:200]
    note = (request.POST.get("note") or "").strip()
    return perform(
        request,
        lambda: handoffs.handoff_request(actor=console_actor(request), company=case.company, case=case, to=to,
                                         note=note, **kwargs)[0],
        success="Handoff {result.status}.", redirect_to=case_url(case) + "#handoffs",
    )


def _handoff(request, handoff_id) -> CaseHandoff:
    handoff = scoped_get(CaseHandoff.objects.select_related("case", "case__company"), console_actor(request),
                         handoff_id, "Handoff")
    adopt_company(request, handoff.case.company)
    return handoff


@console_action
def handoff_retry(request, handoff_id):
    handoff = _handoff(request, handoff_id)
    require_role(request, handoff.company_id, ACT_ON_WORK)
    return perform(request, lambda: handoffs.handoff_retry(actor=console_actor(request), handoff=handoff),
                   success="Handoff retried: {result.status}.",
                   redirect_to=case_url(handoff.case) + "#handoffs")


@console_action
def handoff_cancel(request, handoff_id):
    handoff = _handoff(request, handoff_id)
    require_role(request, handoff.company_id, ACT_ON_WORK)
    reason = (request.POST.get("reason") or "").strip()[:200]
    return perform(request, lambda: handoffs.handoff_cancel(actor=console_actor(request), handoff=handoff,
                                                            reason=reason or "cancelled from the console"),
                   success="Handoff cancelled.", redirect_to=case_url(handoff.case) + "#handoffs")


# --- workflow definitions ------------------------------------------------------------------------


class WorkflowDefinitionForm(forms.Form):
    name = forms.CharField(max_length=200)
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    prompt = forms.CharField(widget=forms.Textarea(attrs={"rows": 16, "spellcheck": "false"}),
                             strip=False, help_text="Markdown. Adopted into a case task's 'workflow' document.")


def workflow_url(definition) -> str:
    return reverse("cases_console:workflow-detail", args=[definition.pk])


def _definition(request, definition_id) -> WorkflowDefinition:
    definition = selectors.workflow_definition_get(actor=console_actor(request), pk=definition_id)
    adopt_company(request, definition.company)
    return definition


@console_page
@require_GET
def workflow_list(request):
    company = _company(request)
    definitions = list(selectors.workflow_definition_list(company=company, params=request.GET))
    return render_page(request, "cases/workflow_list.html", None,
                       {"company": company, "definitions": definitions, "search": request.GET.get("search", "")})


def _save_definition(request, form, save):
    """Validate, call the service; service errors land on the form."""
    if form.is_valid():
        try:
            definition = save(form.cleaned_data)
        except ApiError as exc:
            if isinstance(exc, NotFound):
                raise
            form.add_error(None, error_text(exc))
        else:
            return definition
    return None


@console_page
def workflow_create(request):
    company = _company(request)
    require_role(request, company.pk, ACT_ON_WORK)  # the form is for writers only
    if request.method == "POST":
        form = WorkflowDefinitionForm(request.POST)
        definition = _save_definition(request, form, lambda data: services.workflow_definition_create(
            actor=console_actor(request), company=company, name=data["name"], description=data["description"],
            prompt=data["prompt"]))
        if definition is not None:
            messages.success(request, f"Workflow “{definition.name}” created.")
            return HttpResponseRedirect(workflow_url(definition))
        status = 400
    else:
        form, status = WorkflowDefinitionForm(), 200
    return render_page(request, "cases/workflow_form.html", None,
                       {"company": company, "form": form, "definition": None,
                        "preview": render_markdown(form["prompt"].value() or "")}, status=status)


@console_page
def workflow_edit(request, definition_id):
    definition = _definition(request, definition_id)
    require_role(request, definition.company_id, ACT_ON_WORK)  # the form is for writers only
    if request.method == "POST":
        form = WorkflowDefinitionForm(request.POST)
        saved = _save_definition(request, form, lambda data: services.workflow_definition_update(
            actor=console_actor(request), definition=definition, changes=dict(data)))
        if saved is not None:
            messages.success(request, f"Workflow “{saved.name}” saved.")
            return HttpResponseRedirect(workflow_url(saved))
        status = 400
    else:
        form = WorkflowDefinitionForm(initial={"name": definition.name, "description": definition.description,
                                               "prompt": definition.prompt})
        status = 200
    return render_page(request, "cases/workflow_form.html", None,
                       {"company": definition.company, "form": form, "definition": definition,
                        "preview": render_markdown(form["prompt"].value() or "")}, status=status)


@console_page
@require_GET
def workflow_detail(request, definition_id):
    definition = _definition(request, definition_id)
    captured = list(CaseHandoff.objects.filter(workflow=definition).select_related("case", "to_agent")
                    .order_by("-created_at")[:100])
    for handoff in captured:  # which revision of the prompt each handoff adopted
        handoff.captured_fingerprint = services.prompt_fingerprint(handoff.prompt_text) if handoff.prompt_text else ""
    context = {
        "company": definition.company,
        "definition": definition,
        "rendered": render_markdown(definition.prompt),
        "cases": list(Case.objects.filter(current_workflow=definition).order_by("-updated_at")[:100]),
        "handoffs": captured,
    }
    return render_page(request, "cases/workflow_detail.html", None, context)


@console_action
def workflow_preview(request):
    """The sanitized HTML of the posted Markdown (for the editor's live preview)."""
    company = _company(request)
    require_role(request, company.pk, ACT_ON_WORK)
    html = render_markdown(request.POST.get("prompt", ""))
    return HttpResponse(html or '<p class="muted">Nothing to preview.</p>')
