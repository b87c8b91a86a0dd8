"""Reads shared by the API and the console. Everything is company-scoped and behind ``enable_cases``."""
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Case as When_, IntegerField, Value, When
from django.db.models import F

from issues.actors import Actor
from issues.exceptions import InvalidInput, NotFound
from issues.selectors import get_by_ref, list_window, refs_checked, scoped_get

from .choices import CASE_STATUS_ORDER, CaseGroupBy, CaseSortField, SortDir
from .filtersets import CaseFilterSet, WorkflowDefinitionFilterSet
from .models import Case, CaseDocument, WorkflowDefinition

CASE_RELATED = ("company", "project", "primary_task", "current_workflow")
SORT_COLUMNS = {
    CaseSortField.UPDATED: "updated_at",
    CaseSortField.CREATED: "created_at",
    CaseSortField.TITLE: "title",
    CaseSortField.STATUS: "status_rank",
    CaseSortField.TYPE: "case_type",
}


def cases_company(*, actor: Actor, company_id):
    """The company if the actor may see it and cases are enabled there; else a 404."""
    company = actor.company(company_id)
    if not company.enable_cases:
        raise NotFound("Cases are not enabled for this company.")
    return company


def _enabled(obj, label):
    if not obj.company.enable_cases:
        raise NotFound(f"{label} not found.")
    return obj


def case_get(*, actor: Actor, pk) -> Case:
    """By UUID or identifier (``PAP-C3``)."""
    return _enabled(get_by_ref(Case.objects.select_related(*CASE_RELATED), actor, pk, "Case"), "Case")


def case_detail(*, actor: Actor, pk) -> Case:
    case = case_get(actor=actor, pk=pk)
    case.link_rows = list(case.issue_links.select_related("issue").order_by("created_at", "id"))
    case.event_rows = list(case.events.order_by("-created_at", "-id")[:50])
    return case


def _status_rank():
    return When_(*[When(status=s, then=Value(i)) for i, s in enumerate(CASE_STATUS_ORDER)],
                 default=Value(len(CASE_STATUS_ORDER)), output_field=IntegerField())


def case_browse(*, company, params) -> dict:
    """Filter, then sort and group the whole (company-authorized) result, then take the page."""
    filterset = CaseFilterSet(data=params, queryset=Case.objects.filter(company=company))
    if not filterset.is_valid():
        raise InvalidInput("Invalid filter.", code="invalid_filter", details=filterset.errors)
    limit, offset = list_window(params)
    data = filterset.form.cleaned_data
    sort_field = data.get("sortField") or CaseSortField.UPDATED
    sort_dir = data.get("sortDir") or (SortDir.DESC if sort_field in (CaseSortField.UPDATED, CaseSortField.CREATED)
                                       else SortDir.ASC)
    group_by = data.get("groupBy") or CaseGroupBy.NONE

    qs = filterset.qs.select_related(*CASE_RELATED).annotate(status_rank=_status_rank())
    column = SORT_COLUMNS[sort_field]
    sort = F(column).desc() if sort_dir == SortDir.DESC else F(column).asc()
    tie = F("id").desc() if sort_dir == SortDir.DESC else F("id").asc()
    groups = {
        CaseGroupBy.NONE: [],
        CaseGroupBy.STATUS: [F("status_rank").asc()],
        CaseGroupBy.TYPE: [F("case_type").asc()],
        # Stable project ids; cases without a project last.
        CaseGroupBy.PROJECT: [F("project_id").asc(nulls_last=True)],
    }[group_by]
    qs = qs.order_by(*groups, sort, tie)
    total = qs.count()
    items = refs_checked(filterset, company.pk, list(qs[offset: offset + limit]))  # a foreign projectId: 404
    return {"items": items, "total": total, "limit": limit, "offset": offset,
            "sortField": sort_field, "sortDir": sort_dir, "groupBy": group_by}


def case_types(*, company) -> list[str]:
    return list(Case.objects.filter(company=company).order_by("case_type").values_list("case_type", flat=True)
                .distinct())


def workflow_definition_list(*, company, params):
    filterset = WorkflowDefinitionFilterSet(data=params, queryset=WorkflowDefinition.objects.filter(
        company=company).order_by("name", "id"))
    if not filterset.is_valid():
        raise InvalidInput("Invalid filter.", code="invalid_filter", details=filterset.errors)
    limit, offset = list_window(params)
    return filterset.qs[offset: offset + limit]


def workflow_definition_get(*, actor: Actor, pk) -> WorkflowDefinition:
    qs = WorkflowDefinition.objects.select_related("company")
    return _enabled(scoped_get(qs, actor, pk, "Workflow definition"), "Workflow definition")


# --- handoffs -------------------------------------------------------------------------------
HANDOFF_RELATED = ("case", "case__company", "from_agent", "to_agent", "workflow")


def case_handoffs(*, actor: Actor, case_pk) -> list:
    """A case's handoff history, oldest first."""
    case = case_get(actor=actor, pk=case_pk)
    return list(case.handoffs.select_related(*HANDOFF_RELATED).order_by("created_at", "id"))


def handoff_for_intervention(*, actor: Actor, case_pk, handoff_pk):
    """A handoff of a case in the actor's companies. Deliberately not behind ``enable_cases``:
    cancelling an existing handoff keeps working after the feature is switched off."""
    from .models import CaseHandoff

    case = get_by_ref(Case.objects.select_related("company"), actor, case_pk, "Case")
    try:
        return CaseHandoff.objects.select_related(*HANDOFF_RELATED).get(pk=handoff_pk, case=case)
    except (CaseHandoff.DoesNotExist, ValueError, TypeError, DjangoValidationError):
        raise NotFound("Handoff not found.")


# --- history and task links (bounded reads live in cases/reading.py) --------------------------
def case_events(*, case: Case, params) -> dict:
    """The case's history, oldest first (``created_at``, then id), offset-paginated."""
    from .models import CaseEvent

    limit, offset = list_window(params)
    qs = CaseEvent.objects.filter(case=case).order_by("created_at", "id")
    return {"items": list(qs[offset: offset + limit]), "total": qs.count(), "limit": limit, "offset": offset}


def case_documents(*, case: Case) -> list:
    """The case's own documents (key order) with their latest revision (one query)."""
    return list(CaseDocument.objects.filter(case=case).select_related("latest_revision").order_by("key"))


def case_document_get(*, case: Case, key: str) -> CaseDocument:
    """The case's own document ``key``; a 404 when the case has none of that key."""
    document = CaseDocument.objects.filter(case=case, key=key).select_related("latest_revision").first()
    if document is None:
        raise NotFound("Document not found.")
    return document


def case_document_revisions(*, case: Case, key: str, params):
    """Revisions (oldest first) of the case's own document ``key`` (a task's document revisions
    are at ``/api/issues/{id}/documents/{key}/revisions``)."""
    document = case_document_get(case=case, key=key)
    limit, offset = list_window(params)
    return document.revisions.order_by("number")[offset: offset + limit]


def issue_cases(*, actor: Actor, issue_id) -> list:
    """Cases linked to an issue (any role), in the issue's company, behind ``enable_cases``."""
    from issues.selectors import issue_row

    from .models import CaseIssueLink

    issue = issue_row(actor=actor, pk=issue_id)
    company = actor.company(issue.company_id)
    if not company.enable_cases:
        raise NotFound("Issue not found.")
    return list(CaseIssueLink.objects.filter(issue=issue, company_id=issue.company_id,
                                             case__company_id=issue.company_id)
                .select_related(*(f"case__{r}" for r in CASE_RELATED)).defer("case__fields")
                .order_by("created_at", "id"))
