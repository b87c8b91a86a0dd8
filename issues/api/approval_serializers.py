"""Approval shapes, named as upstream Paperclip names them (``paperclip-api.md`` §5.3)."""
from rest_framework import serializers

from issues.choices import ApprovalType
from issues.filtersets import MAX_LIST_ITEMS
from issues.services.approvals import NOTE_MAX, TITLE_MAX

from .serializers import IdField, StrictSerializer


class ApprovalSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    companyId = serializers.UUIDField(source="company_id")
    type = serializers.CharField()
    status = serializers.CharField()
    title = serializers.CharField()
    payload = serializers.JSONField()
    requestedByAgentId = serializers.UUIDField(source="requested_by_agent_id", allow_null=True)
    requestedByUserId = serializers.IntegerField(source="requested_by_user_id", allow_null=True)
    decisionNote = serializers.SerializerMethodField()
    decidedByUserId = serializers.IntegerField(source="decided_by_user_id", allow_null=True)
    decidedAt = serializers.DateTimeField(source="decided_at", allow_null=True)
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")
    issueIds = serializers.SerializerMethodField()

    def get_decisionNote(self, approval) -> str | None:
        return approval.decision_note or None  # upstream: null until a decision carries a note

    def get_issueIds(self, approval) -> list[str]:
        # Sorted here so a prefetched list (selectors.approval_list) and a plain one agree.
        links = sorted(approval.issue_links.all(), key=lambda link: (link.created_at, link.pk))
        return [str(link.issue_id) for link in links]


class ApprovalCreateSerializer(StrictSerializer):
    type = serializers.ChoiceField(choices=ApprovalType.choices)
    payload = serializers.DictField()
    title = serializers.CharField(required=False, max_length=TITLE_MAX)
    requestedByAgentId = IdField(required=False, allow_null=True,
                                 help_text="Defaults to the calling agent (none for a board user).")
    issueIds = serializers.ListField(child=IdField(), required=False, default=list, max_length=MAX_LIST_ITEMS,
                                     help_text="Issues of the same company to link (404 naming issueIds otherwise).")


class ApprovalDecisionSerializer(StrictSerializer):
    decisionNote = serializers.CharField(required=False, allow_null=True, allow_blank=True, max_length=NOTE_MAX)


class ApprovalResubmitSerializer(StrictSerializer):
    payload = serializers.DictField(required=False, help_text="Replaces the payload; omitted keeps it.")
