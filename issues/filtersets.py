"""One FilterSet per list, shared by the REST API and the console (same query parameters)."""
import django_filters as filters
from django import forms
from django.db.models import Q

from issues.choices import IssuePriority, IssueStatus
from issues.models import Issue


class CommaChoicesField(forms.CharField):
    def __init__(self, *args, allowed=(), **kwargs):
        self.allowed = list(allowed)
        super().__init__(*args, **kwargs)

    def clean(self, value):
        value = super().clean(value)
        values = [v.strip() for v in (value or "").split(",") if v.strip()]
        bad = [v for v in values if v not in self.allowed]
        if bad:
            raise forms.ValidationError(f"Unknown value(s) {', '.join(bad)}; use {', '.join(self.allowed)}.")
        return values


class CommaChoicesFilter(filters.Filter):
    """``status=todo,in_progress``: a comma list checked against the choices."""

    field_class = CommaChoicesField

    def __init__(self, *args, choices, **kwargs):
        kwargs.setdefault("allowed", [c for c, _ in choices])
        super().__init__(*args, **kwargs)

    def filter(self, qs, value):
        return qs.filter(**{f"{self.field_name}__in": value}) if value else qs


class IssueFilterSet(filters.FilterSet):
    assigneeAgentId = filters.UUIDFilter(field_name="assignee_agent_id")
    assigneeUserId = filters.NumberFilter(field_name="assignee_user_id")
    status = CommaChoicesFilter(field_name="status", choices=IssueStatus.choices)
    priority = CommaChoicesFilter(field_name="priority", choices=IssuePriority.choices)
    parentId = filters.UUIDFilter(field_name="parent_id")
    projectId = filters.UUIDFilter(field_name="project_id")
    goalId = filters.UUIDFilter(field_name="goal_id")
    originIssueId = filters.UUIDFilter(field_name="origin_issue_id")
    q = filters.CharFilter(method="search")

    class Meta:
        model = Issue
        fields = []

    def search(self, qs, name, value):
        value = value.strip()
        if not value:
            return qs
        return qs.filter(Q(title__icontains=value) | Q(identifier__iexact=value) | Q(description__icontains=value))


def openapi_parameters(filterset_class):
    """Query parameters of a FilterSet for drf-spectacular (views that are plain APIViews)."""
    from drf_spectacular.utils import OpenApiParameter

    params = []
    for name, flt in filterset_class.base_filters.items():
        kind = str if not isinstance(flt, filters.UUIDFilter) else "uuid"
        if kind == "uuid":
            from drf_spectacular.types import OpenApiTypes

            kind = OpenApiTypes.UUID
        description = "Comma-separated list." if isinstance(flt, CommaChoicesFilter) else ""
        params.append(OpenApiParameter(name, kind, description=description))
    return params
