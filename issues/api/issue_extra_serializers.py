"""Shapes of the issue extras (issue #14): child issues, labels and the heartbeat context (upstream field
names)."""
from rest_framework import serializers

from . import serializers as s
from .attachment_serializers import HeartbeatAttachmentSerializer
from .serializers import CommentSerializer, IssueCreateSerializer, IssueWriteResultSerializer, StrictSerializer


class ChildIssueCreateSerializer(IssueCreateSerializer):
    """The issue-create body; the parent is the issue in the path (a ``parentId`` is a 400)."""

    parentId = None


class LabelSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    companyId = serializers.UUIDField(source="company_id")
    name = serializers.CharField()
    color = serializers.CharField()
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")


class LabelCreateSerializer(StrictSerializer):
    name = serializers.CharField(max_length=48, help_text="Unique in the company, ignoring case.")
    color = serializers.RegexField(r"^#[0-9A-Fa-f]{6}$", max_length=7, help_text='A hex color, "#RRGGBB".',
                                   error_messages={"invalid": "Color must be a 6-digit hex color (#RRGGBB)."})


class IssueUpdateResultSerializer(IssueWriteResultSerializer):
    """``PATCH /issues/{id}``: the issue plus the comment the call posted (``null`` without one), as upstream."""

    comment = CommentSerializer(allow_null=True)


# --- GET /issues/{id}/heartbeat-context (ref §5.2, 2026) -------------------------------------------
class HeartbeatIssueSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    identifier = serializers.CharField()
    title = serializers.CharField()
    description = serializers.CharField()
    status = serializers.CharField()
    priority = serializers.CharField()
    projectId = serializers.UUIDField(source="project_id", allow_null=True)
    goalId = serializers.UUIDField(source="goal_id", allow_null=True)
    parentId = serializers.UUIDField(source="parent_id", allow_null=True)
    blockedBy = s.IssueSummarySerializer(many=True, source="blocked_by")
    blocks = s.IssueSummarySerializer(many=True)
    assigneeAgentId = serializers.UUIDField(source="assignee_agent_id", allow_null=True)
    assigneeUserId = serializers.IntegerField(source="assignee_user_id", allow_null=True)
    originKind = serializers.CharField(source="origin_kind")
    originId = serializers.CharField(source="origin_id")
    updatedAt = serializers.DateTimeField(source="updated_at")


class HeartbeatAncestorSerializer(s.IssueRefSerializer):
    priority = serializers.CharField()


class HeartbeatProjectSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    status = serializers.CharField()
    targetDate = serializers.DateField(source="target_date", allow_null=True)


class HeartbeatGoalSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    title = serializers.CharField()
    status = serializers.CharField()
    level = serializers.CharField()
    parentId = serializers.UUIDField(source="parent_id", allow_null=True)


class CommentCursorSerializer(serializers.Serializer):
    totalComments = serializers.IntegerField()
    latestCommentId = serializers.UUIDField(allow_null=True)
    latestCommentAt = serializers.DateTimeField(allow_null=True)


class HeartbeatContextSerializer(serializers.Serializer):
    issue = HeartbeatIssueSerializer()
    ancestors = HeartbeatAncestorSerializer(many=True, help_text="Parent chain, nearest first.")
    project = HeartbeatProjectSerializer(allow_null=True)
    goal = HeartbeatGoalSerializer(allow_null=True)
    commentCursor = CommentCursorSerializer(
        help_text="Read the thread from here: GET /issues/{id}/comments?after={lastSeenId}&order=asc.")
    wakeComment = s.CommentSerializer(allow_null=True,
                                      help_text="The wakeCommentId's comment when it is this issue's, else null.")
    attachments = HeartbeatAttachmentSerializer(many=True, help_text="The issue's attachments, oldest first.")
    continuationSummary = s.DocumentSerializer(
        allow_null=True, help_text="The issue's `continuation-summary` document, unless quarantined.")
