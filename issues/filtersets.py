"""One FilterSet per list, shared by the REST API and the console (same query parameters)."""
import django_filters as filters
from django import forms
from django.db.models import Q

from issues.choices import IssuePriority, IssueStatus
from issues.models import Issue


# Comma-list query parameters are bounded, so a hostile one never becomes a huge IN (...).
MAX_LIST_ITEMS = 50
MAX_LIST_CHARS = 4096
# Free-text filters (search terms, external ids) are bounded too.
MAX_TEXT_FILTER_CHARS = 1000


class CommaListField(forms.CharField):
    """``a,b,c``: at most MAX_LIST_ITEMS items and MAX_LIST_CHARS characters."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("max_length", MAX_LIST_CHARS)
        super().__init__(*args, **kwargs)

    def clean(self, value):
        value = super().clean(value)
        values = [v.strip() for v in (value or "").split(",") if v.strip()]
        if len(values) > MAX_LIST_ITEMS:
            raise forms.ValidationError(f"At most {MAX_LIST_ITEMS} comma-separated values.")
        return values


class CommaChoicesField(CommaListField):
    def __init__(self, *args, allowed=(), **kwargs):
        self.allowed = list(allowed)
        super().__init__(*args, **kwargs)

    def clean(self, value):
        values = super().clean(value)
        bad = [v for v in values if v not in self.allowed]
        if bad:
            raise forms.ValidationError(f"Unknown value(s) {', '.join(bad)}; use {', '.join(self.allowed)}.")
        return values


class CommaListFilter(filters.Filter):
    """``a,b``: a bounded comma list of free values (the filter method receives the list)."""

    field_class = CommaListField


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
    q = filters.CharFilter(method="search", max_length=MAX_TEXT_FILTER_CHARS)

    class Meta:
        model = Issue
        fields = []

    def search(self, qs, name, value):
        value = value.strip()
        if not value:
            return qs
        return qs.filter(Q(title__icontains=value) | Q(identifier__iexact=value) | Q(description__icontains=value))


def openapi_parameters(filterset_class):
    """Query parameters of a FilterSet for drf-spectacular (views that are plain APIViews): a comma
    list of choices is an array of its enum (``style: form, explode: false``), a choice its enum."""
    from drf_spectacular.types import OpenApiTypes
    from drf_spectacular.utils import OpenApiParameter

    params = []
    for name, flt in filterset_class.base_filters.items():
        kwargs = {}
        if isinstance(flt, CommaChoicesFilter | CommaListFilter):
            items = {"type": "string", "enum": list(flt.extra["allowed"])} if "allowed" in flt.extra \
                else {"type": "string", "minLength": 1}
            kind = {"type": "array", "items": items, "maxItems": MAX_LIST_ITEMS}
            kwargs = {"style": "form", "explode": False,
                      "description": f"Comma-separated list (at most {MAX_LIST_ITEMS} values, {MAX_LIST_CHARS} "
                                     f"characters)."}
        elif isinstance(flt, filters.ChoiceFilter):
            kind = {"type": "string", "enum": [value for value, _ in flt.extra["choices"]]}
        elif isinstance(flt, filters.UUIDFilter):
            kind = OpenApiTypes.UUID
        elif isinstance(flt, filters.NumberFilter):
            kind = OpenApiTypes.INT
        elif flt.extra.get("max_length"):
            kind = {"type": "string", "maxLength": flt.extra["max_length"]}
        else:
            kind = str
        params.append(OpenApiParameter(name, kind, **kwargs))
    return params
