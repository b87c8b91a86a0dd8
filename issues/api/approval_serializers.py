"""Approval shapes, named as upstream Paperclip names them (``paperclip-api.md`` §5.3)."""
from rest_framework import serializers

from issues.choices import ApprovalType
from issues.filtersets import MAX_LIST_ITEMS
from issues.services.approval_comments import BODY_MAX
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
    """``comment`` is an alias of ``decisionNote`` (some clients send it). When both are given,
    ``decisionNote`` wins (as upstream, which ignores ``comment``); ``comment`` is used only when
    ``decisionNote`` is absent or null."""

    decisionNote = serializers.CharField(required=False, allow_null=True, allow_blank=True, max_length=NOTE_MAX)
    comment = serializers.CharField(required=False, allow_null=True, allow_blank=True, max_length=NOTE_MAX,
                                    help_text="Alias of decisionNote; ignored when decisionNote is given.")

    def validate(self, attrs):
        alias = attrs.pop("comment", None)
        if attrs.get("decisionNote") is None and alias is not None:
            attrs["decisionNote"] = alias
        return attrs


class ApprovalLinkSerializer(StrictSerializer):
    approvalId = IdField()


class ApprovalResubmitSerializer(StrictSerializer):
    payload = serializers.DictField(required=False, help_text="Replaces the payload; omitted keeps it.")


class ApprovalCommentSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    companyId = serializers.UUIDField(source="company_id")
    approvalId = serializers.UUIDField(source="approval_id")
    authorAgentId = serializers.UUIDField(source="author_agent_id", allow_null=True)
    authorUserId = serializers.IntegerField(source="author_user_id", allow_null=True)
    body = serializers.CharField()
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")


class ApprovalCommentCreateSerializer(StrictSerializer):
    body = serializers.CharField(max_length=BODY_MAX, trim_whitespace=False)  # stored as written; blank is a 400
