"""FilterSets of the connectors lists (shared by the API and, later, the console)."""
import django_filters as filters

from issues.filtersets import MAX_TEXT_FILTER_CHARS, CommaChoicesFilter

from .choices import ConflictKind, ConflictStatus, EventStatus, LinkStatus, OriginSide, SyncMode
from .models import Conflict, InboundEvent, TaskLink


class TaskLinkFilterSet(filters.FilterSet):
    status = CommaChoicesFilter(field_name="status", choices=LinkStatus.choices)
    syncMode = CommaChoicesFilter(field_name="sync_mode", choices=SyncMode.choices)
    originSide = CommaChoicesFilter(field_name="origin_side", choices=OriginSide.choices)
    issueId = filters.UUIDFilter(field_name="issue_id")
    externalTaskId = filters.CharFilter(field_name="external_task_id", max_length=MAX_TEXT_FILTER_CHARS)
    externalKey = filters.CharFilter(field_name="external_key", lookup_expr="iexact",
                                     max_length=MAX_TEXT_FILTER_CHARS)

    class Meta:
        model = TaskLink
        fields = []


class ConflictFilterSet(filters.FilterSet):
    status = CommaChoicesFilter(field_name="status", choices=ConflictStatus.choices)
    kind = CommaChoicesFilter(field_name="kind", choices=ConflictKind.choices)
    linkId = filters.UUIDFilter(field_name="link_id")

    class Meta:
        model = Conflict
        fields = []


class InboundEventFilterSet(filters.FilterSet):
    status = CommaChoicesFilter(field_name="status", choices=EventStatus.choices)
    externalTaskId = filters.CharFilter(field_name="external_task_id", max_length=MAX_TEXT_FILTER_CHARS)

    class Meta:
        model = InboundEvent
        fields = []
