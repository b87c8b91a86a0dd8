"""Shapes of the export endpoint (``POST /api/issues/{issueId}/connector-links``, §6.2.2), camelCase."""
from rest_framework import serializers

from issues.api.serializers import StrictSerializer

from ..choices import ExportStatus
from .serializers import LinkSerializer


class ExportRequestSerializer(StrictSerializer):
    instanceId = serializers.CharField(max_length=40, help_text="The connector instance (of the issue's company).")
    container = serializers.CharField(max_length=300, required=False, allow_blank=True,
                                      help_text="One of the instance's containers (repository, team, project). "
                                                "May be omitted when the instance has exactly one.")
    idempotencyKey = serializers.CharField(max_length=200, help_text="A retry with the same key creates one task.")
    reason = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")


class ExportSerializer(serializers.Serializer):
    id = serializers.IntegerField(source="export.pk")
    status = serializers.ChoiceField(source="export.status", choices=ExportStatus.choices)
    connectorInstanceId = serializers.UUIDField(source="export.instance_id")
    issueId = serializers.UUIDField(source="export.issue_id")
    container = serializers.CharField(source="export.container")
    idempotencyKey = serializers.CharField(source="export.idempotency_key")
    attempts = serializers.IntegerField(source="export.attempts")
    externalTaskId = serializers.CharField(source="export.external_task_id")
    errorMessage = serializers.CharField(source="export.error_message")
    replayed = serializers.SerializerMethodField(help_text="True for a repeat of an export that was already linked.")
    link = LinkSerializer(allow_null=True)
    createdAt = serializers.DateTimeField(source="export.created_at")
    updatedAt = serializers.DateTimeField(source="export.updated_at")

    def get_replayed(self, outcome) -> bool:
        return not outcome.created
