"""Shapes of the issue extras (issue #14): child issues and labels (upstream field names)."""
from rest_framework import serializers

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
