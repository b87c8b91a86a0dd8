"""One FilterSet per list, shared by the REST API and the console (same query parameters)."""
import re
import uuid

import django_filters as filters
from django import forms
from django.db import connection
from django.db.models import Case, Exists, IntegerField, OuterRef, Q, Value, When
from django.db.models.expressions import RawSQL

from issues.choices import AgentRole, AgentStatus, IssuePriority, IssueStatus, OriginKind
from issues.models import Agent, Issue


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


class UUIDOrNullField(forms.CharField):
    """A UUID, or the literal ``null`` (upstream: "none set")."""

    def clean(self, value):
        value = super().clean(value)
        if not value or value == "null":
            return value or None
        try:
            return uuid.UUID(value)
        except ValueError:
            raise forms.ValidationError("Must be a UUID or 'null'.")


class UUIDOrNullFilter(filters.Filter):
    field_class = UUIDOrNullField

    def filter(self, qs, value):
        if value is None:
            return qs
        if value == "null":
            return qs.filter(**{f"{self.field_name}__isnull": True})
        return qs.filter(**{self.field_name: value})


_USER_ID = re.compile(r"[0-9]{1,18}", re.ASCII)


class UserRefField(forms.CharField):
    """A user id, or ``me`` (the signed-in board user; the FilterSet resolves it)."""

    def clean(self, value):
        value = super().clean(value)
        if not value or value == "me":
            return value or None
        if not _USER_ID.fullmatch(value):
            raise forms.ValidationError("Must be a user id or 'me'.")
        return int(value)


class UserRefFilter(filters.Filter):
    field_class = UserRefField


class StrictBooleanField(forms.CharField):
    """``true``/``false`` (or ``1``/``0``); anything else is an error, not "no filter"."""

    def clean(self, value):
        value = super().clean(value)
        if not value:
            return None
        if value.lower() not in ("true", "false", "1", "0"):
            raise forms.ValidationError("Must be true or false.")
        return value.lower() in ("true", "1")


class StrictBooleanFilter(filters.Filter):
    field_class = StrictBooleanField


DEFAULT_ISSUE_ORDER = (("priority_rank", False), ("created_at", False), ("id", False))


class IssueFilterSet(filters.FilterSet):
    """The upstream list parameters that map onto this model (README compatibility table).

    Ordering: priority then age; with ``q`` the best match first (title, identifier, description,
    comments), then priority; ``sortField`` (``updated`` newest first, or ``id``) with ``sortDir``
    overrides both. ``afterId`` continues after that issue in the order in effect (keyset)."""

    ME_PARAMS = ("assigneeUserId", "touchedByUserId")
    # Ids naming another company's object (or none) are a 404, as everywhere (selectors.refs_checked).
    COMPANY_REFS = {"assigneeAgentId": "issues.Agent", "participantAgentId": "issues.Agent",
                    "parentId": "issues.Issue", "parentIssueId": "issues.Issue", "descendantOf": "issues.Issue",
                    "originIssueId": "issues.Issue", "createdFromIssueId": "issues.Issue",
                    "projectId": "issues.Project", "goalId": "issues.Goal", "labelId": "issues.Label",
                    "executionWorkspaceId": "issues.ExecutionWorkspace", "workspaceId": "issues.ExecutionWorkspace"}

    assigneeAgentId = UUIDOrNullFilter(field_name="assignee_agent_id", max_length=36)
    assigneeUserId = UserRefFilter(method="user_is_assignee", max_length=18)
    status = CommaChoicesFilter(field_name="status", choices=IssueStatus.choices)
    priority = CommaChoicesFilter(field_name="priority", choices=IssuePriority.choices)
    parentId = filters.UUIDFilter(field_name="parent_id")
    parentIssueId = filters.UUIDFilter(field_name="parent_id", help_text="Alias of parentId.")
    projectId = filters.UUIDFilter(field_name="project_id")
    goalId = filters.UUIDFilter(field_name="goal_id")
    labelId = filters.UUIDFilter(field_name="labels")
    label = filters.CharFilter(field_name="labels__name", lookup_expr="iexact", max_length=48)
    originIssueId = filters.UUIDFilter(field_name="origin_issue_id")
    createdFromIssueId = filters.UUIDFilter(field_name="origin_issue_id", help_text="Alias of originIssueId.")
    originKind = CommaChoicesFilter(field_name="origin_kind", choices=OriginKind.choices)
    originKindPrefix = filters.CharFilter(field_name="origin_kind", lookup_expr="startswith", max_length=16)
    originId = filters.CharFilter(field_name="origin_id", max_length=200)
    executionWorkspaceId = filters.UUIDFilter(field_name="execution_workspace_id")
    workspaceId = filters.UUIDFilter(field_name="execution_workspace_id", help_text="Same as executionWorkspaceId.")
    descendantOf = filters.UUIDFilter(method="descendants")
    participantAgentId = filters.UUIDFilter(method="agent_participates")
    touchedByUserId = UserRefFilter(method="user_touched", max_length=18)
    hasPlanDocument = StrictBooleanFilter(method="plan_document", max_length=5)
    updatedSince = filters.IsoDateTimeFilter(field_name="updated_at", lookup_expr="gte")
    q = filters.CharFilter(method="search", max_length=MAX_TEXT_FILTER_CHARS)
    sortField = filters.ChoiceFilter(choices=[("updated", "updated"), ("id", "id")], method="ordered_later")
    sortDir = filters.ChoiceFilter(choices=[("asc", "asc"), ("desc", "desc")], method="ordered_later")
    afterId = filters.UUIDFilter(method="ordered_later")

    class Meta:
        model = Issue
        fields = []

    def __init__(self, *args, me_user_id=None, **kwargs):
        self.me_user_id = me_user_id
        self._anchor = None
        super().__init__(*args, **kwargs)

    # --- filters -----------------------------------------------------------------------------
    def _user(self, value):
        return self.me_user_id if value == "me" else value

    def user_is_assignee(self, qs, name, value):
        user_id = self._user(value)
        return qs.filter(assignee_user_id=user_id) if user_id is not None else qs.none()

    def user_touched(self, qs, name, value):
        """Created, assigned or commented by the user."""
        from issues.models import Comment

        user_id = self._user(value)
        if user_id is None:
            return qs.none()
        commented = Exists(Comment.objects.filter(issue=OuterRef("pk"), author_user_id=user_id))
        return qs.filter(Q(created_by_user_id=user_id) | Q(assignee_user_id=user_id) | commented)

    def agent_participates(self, qs, name, value):
        """Assigned to, created by, commented on or run by the agent."""
        from issues.models import Comment, HeartbeatRun

        commented = Exists(Comment.objects.filter(issue=OuterRef("pk"), author_agent_id=value))
        ran = Exists(HeartbeatRun.objects.filter(issue=OuterRef("pk"), agent_id=value))
        return qs.filter(Q(assignee_agent_id=value) | Q(created_by_agent_id=value) | commented | ran)

    def descendants(self, qs, name, value):
        """Every issue below ``value``, at any depth (one recursive query; UNION stops on a cycle)."""
        table = connection.ops.quote_name(Issue._meta.db_table)
        sql = (f'WITH RECURSIVE tree(id) AS (SELECT "id" FROM {table} WHERE "parent_id" = %s '
               f'UNION SELECT child."id" FROM {table} child JOIN tree ON child."parent_id" = tree."id") '
               'SELECT "id" FROM tree')
        return qs.filter(pk__in=RawSQL(sql, [Issue._meta.pk.get_db_prep_value(value, connection)]))

    def plan_document(self, qs, name, value):
        from issues.models import Document

        has_plan = Exists(Document.objects.filter(issue=OuterRef("pk"), key="plan"))
        return qs.filter(has_plan if value else ~has_plan)

    @staticmethod
    def _search_rank(value):
        """Upstream's relevance: a title match first, then identifier, description, comments."""
        return Case(When(title__icontains=value, then=Value(0)), When(identifier__iexact=value, then=Value(1)),
                    When(description__icontains=value, then=Value(2)), default=Value(3),
                    output_field=IntegerField())

    def search(self, qs, name, value):
        from issues.models import Comment

        value = value.strip()
        if not value:
            return qs
        in_comments = Exists(Comment.objects.filter(issue=OuterRef("pk"), body__icontains=value))
        return qs.filter(Q(title__icontains=value) | Q(identifier__iexact=value) | Q(description__icontains=value)
                         | in_comments).annotate(search_rank=self._search_rank(value))

    def ordered_later(self, qs, name, value):
        return qs  # sortField / sortDir / afterId: applied by filter_queryset, after every filter

    # --- ordering and keyset -----------------------------------------------------------------
    def ordering(self) -> list[tuple[str, bool]]:
        data = self.form.cleaned_data
        field, direction = data.get("sortField"), data.get("sortDir")
        if field == "updated":
            desc = direction != "asc"
            return [("updated_at", desc), ("id", desc)]
        if field == "id":
            return [("id", direction == "desc")]
        order = list(DEFAULT_ISSUE_ORDER)
        if (data.get("q") or "").strip():
            order.insert(0, ("search_rank", False))
        return order

    def is_valid(self):
        """Also checks that ``afterId`` names an issue of this list's company (one query)."""
        valid = super().is_valid()
        if valid and self.form.cleaned_data.get("afterId") and self._anchor is None:
            self._anchor = self._load_anchor()
            if self._anchor is None:
                self.form.add_error("afterId", "No such issue in this company.")
                return False
        return valid

    def _load_anchor(self):
        qs = self.queryset
        q = (self.form.cleaned_data.get("q") or "").strip()
        if q:
            qs = qs.annotate(search_rank=self._search_rank(q))
        return qs.filter(pk=self.form.cleaned_data["afterId"]).values(*[n for n, _ in self.ordering()]).first()

    def filter_queryset(self, queryset):
        qs = super().filter_queryset(queryset)
        order = self.ordering()
        qs = qs.order_by(*[f"-{name}" if desc else name for name, desc in order])
        if self.form.cleaned_data.get("afterId"):
            anchor = self._anchor or self._load_anchor()
            if anchor is None:
                return qs.none()
            after = Q(pk__in=[])
            for i, (name, desc) in enumerate(order):
                same = {earlier: anchor[earlier] for earlier, _ in order[:i]}
                after |= Q(**same, **{f"{name}__{'lt' if desc else 'gt'}": anchor[name]})
            qs = qs.filter(after)
        return qs


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


class AgentFilterSet(filters.FilterSet):
    """``GET /companies/{id}/agents``: ``status`` and ``role`` (comma lists)."""

    status = CommaChoicesFilter(field_name="status", choices=AgentStatus.choices)
    role = CommaChoicesFilter(field_name="role", choices=AgentRole.choices)

    class Meta:
        model = Agent
        fields = []


# --- #14 org: goals, projects, activity (upstream Paperclip §5.4, §5.5, §5.8) ------------------------
from issues.models import ActivityLog, Goal, Project  # noqa: E402
from issues.services.goals import GOAL_LEVELS, GOAL_STATUSES  # noqa: E402
from issues.services.projects import PROJECT_STATUSES  # noqa: E402


def _value_choices(values):
    return [(value, value) for value in values]


class GoalFilterSet(filters.FilterSet):
    """``GET /companies/{id}/goals``: upstream has no filters; these narrow the same list."""

    COMPANY_REFS = {"parentId": "issues.Goal", "ownerAgentId": "issues.Agent"}

    level = CommaChoicesFilter(field_name="level", choices=_value_choices(GOAL_LEVELS))
    status = CommaChoicesFilter(field_name="status", choices=_value_choices(GOAL_STATUSES))
    parentId = filters.UUIDFilter(field_name="parent_id")
    ownerAgentId = filters.UUIDFilter(field_name="owner_agent_id")

    class Meta:
        model = Goal
        fields = []


class ProjectFilterSet(filters.FilterSet):
    status = CommaChoicesFilter(field_name="status", choices=_value_choices(PROJECT_STATUSES))

    class Meta:
        model = Project
        fields = []


class ActivityFilterSet(filters.FilterSet):
    """``GET /companies/{id}/activity``: ``agentId`` (the acting agent), ``entityType``, ``entityId``."""

    COMPANY_REFS = {"agentId": "issues.Agent"}

    agentId = filters.UUIDFilter(field_name="actor_agent_id")
    entityType = filters.CharFilter(field_name="entity_type", max_length=32)
    entityId = filters.CharFilter(field_name="entity_id", max_length=64)
    action = filters.CharFilter(field_name="action", max_length=64)

    class Meta:
        model = ActivityLog
        fields = []


# --- #14 auth: board API keys (upstream Paperclip §2.5) ---------------------------------------------
from issues.models import BoardApiKey  # noqa: E402


class BoardApiKeyFilterSet(filters.FilterSet):
    """``GET /board-api-keys``: the caller's usable keys; ``includeInactive=true`` adds the revoked
    and expired ones (upstream's parameter; the console lists them all)."""

    includeInactive = filters.BooleanFilter(method="_keep")

    class Meta:
        model = BoardApiKey
        fields = []

    def _keep(self, queryset, name, value):
        return queryset  # applied in filter_queryset: the default (absent) narrows too

    def filter_queryset(self, queryset):
        from django.utils import timezone

        queryset = super().filter_queryset(queryset)
        if self.form.cleaned_data.get("includeInactive"):
            return queryset
        return queryset.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now()), revoked_at__isnull=True)
