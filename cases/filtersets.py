"""One FilterSet per list, shared by the REST API and the console (same query parameters)."""
import django_filters as filters
from django.db.models import Q

from issues.filtersets import MAX_TEXT_FILTER_CHARS, CommaChoicesFilter, CommaListFilter

from .choices import CaseGroupBy, CaseSortField, CaseStatus, SortDir
from .models import Case, WorkflowDefinition


class CaseFilterSet(filters.FilterSet):
    COMPANY_REFS = {"projectId": "issues.Project"}  # (selectors.refs_checked)
    search = filters.CharFilter(method="filter_search", max_length=MAX_TEXT_FILTER_CHARS)
    status = CommaChoicesFilter(field_name="status", choices=CaseStatus.choices)
    type = CommaListFilter(method="filter_type")
    projectId = filters.UUIDFilter(field_name="project_id")
    # Presentation parameters: validated here, applied by the selector after filtering.
    sortField = filters.ChoiceFilter(choices=CaseSortField.choices, method="keep")
    sortDir = filters.ChoiceFilter(choices=SortDir.choices, method="keep")
    groupBy = filters.ChoiceFilter(choices=CaseGroupBy.choices, method="keep")

    class Meta:
        model = Case
        fields = []

    def keep(self, qs, name, value):
        return qs

    def filter_type(self, qs, name, value):
        return qs.filter(case_type__in=value) if value else qs

    def filter_search(self, qs, name, value):
        value = value.strip()
        if not value:
            return qs
        return qs.filter(Q(title__icontains=value) | Q(identifier__iexact=value) | Q(summary__icontains=value)
                         | Q(case_type__icontains=value))


class WorkflowDefinitionFilterSet(filters.FilterSet):
    search = filters.CharFilter(method="filter_search", max_length=MAX_TEXT_FILTER_CHARS)

    class Meta:
        model = WorkflowDefinition
        fields = []

    def filter_search(self, qs, name, value):
        value = value.strip()
        return qs.filter(Q(name__icontains=value) | Q(description__icontains=value)) if value else qs
