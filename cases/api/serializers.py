"""API shapes of cases (camelCase). Input serializers reject unknown fields."""
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from issues.api.serializers import IdField, IssueRefSerializer, StrictSerializer

from ..choices import CaseGroupBy, CaseSortField, CaseStatus, SortDir


@extend_schema_field({"type": "object", "additionalProperties": True})
class JSONObjectField(serializers.JSONField):
    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError("Must be a JSON object.")
        return super().to_internal_value(data)


class CaseStatusField(serializers.ChoiceField):
    """A case status (its own named enum in the schema: ENUM_NAME_OVERRIDES in settings)."""

    def __init__(self, **kwargs):
        super().__init__(choices=CaseStatus.choices, **kwargs)


# --- output -------------------------------------------------------------------------------
class WorkflowRefSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    fingerprint = serializers.CharField()


class CaseSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    companyId = serializers.UUIDField(source="company_id")
    identifier = serializers.CharField()
    number = serializers.IntegerField()
    type = serializers.CharField(source="case_type")
    idempotencyKey = serializers.CharField(source="idempotency_key")
    title = serializers.CharField()
    summary = serializers.CharField()
    status = CaseStatusField()
    fields = serializers.JSONField()
    parentCaseId = serializers.UUIDField(source="parent_id", allow_null=True)
    projectId = serializers.UUIDField(source="project_id", allow_null=True)
    primaryTaskId = serializers.UUIDField(source="primary_task_id", allow_null=True)
    primaryTask = IssueRefSerializer(source="primary_task", allow_null=True)
    currentWorkflow = WorkflowRefSerializer(source="current_workflow", allow_null=True)
    phase = serializers.CharField()
    createdByAgentId = serializers.UUIDField(source="created_by_agent_id", allow_null=True)
    createdByUserId = serializers.IntegerField(source="created_by_user_id", allow_null=True)
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")


class CaseIssueLinkSerializer(serializers.Serializer):
    issue = IssueRefSerializer()
    role = serializers.CharField()
    createdAt = serializers.DateTimeField(source="created_at")


class CaseEventSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    kind = serializers.CharField()
    details = serializers.JSONField()
    actorType = serializers.CharField(source="actor_type")
    actorAgentId = serializers.UUIDField(source="actor_agent_id", allow_null=True)
    actorUserId = serializers.IntegerField(source="actor_user_id", allow_null=True)
    runId = serializers.UUIDField(source="run_id", allow_null=True)
    createdAt = serializers.DateTimeField(source="created_at")


class CaseDetailSerializer(CaseSerializer):
    links = CaseIssueLinkSerializer(many=True, source="link_rows")
    events = CaseEventSerializer(many=True, source="event_rows", help_text="Newest first (up to 50).")


class CaseBrowseSerializer(serializers.Serializer):
    items = CaseSerializer(many=True)
    total = serializers.IntegerField(help_text="Size of the whole filtered, authorized result.")
    limit = serializers.IntegerField()
    offset = serializers.IntegerField()
    sortField = serializers.ChoiceField(choices=CaseSortField.choices)
    sortDir = serializers.ChoiceField(choices=SortDir.choices)
    groupBy = serializers.ChoiceField(choices=CaseGroupBy.choices)


class CaseTypesSerializer(serializers.Serializer):
    types = serializers.ListField(child=serializers.CharField())


class WorkflowDefinitionSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    companyId = serializers.UUIDField(source="company_id")
    name = serializers.CharField()
    description = serializers.CharField()
    prompt = serializers.CharField()
    fingerprint = serializers.CharField(help_text="sha256 (hex) of the prompt.")
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")


# --- input --------------------------------------------------------------------------------
class InitialDocumentSerializer(StrictSerializer):
    key = serializers.CharField(max_length=64)
    body = serializers.CharField(trim_whitespace=False, allow_blank=True)
    title = serializers.CharField(required=False, allow_blank=True, default="", max_length=200)
    format = serializers.CharField(required=False, allow_blank=True, default="")


def primary_task_field():
    return IdField(required=False, allow_null=True,
                   help_text="Bind an existing issue of the company as the primary task instead of creating one "
                             "(404 for another company's issue; 409 task_already_primary when it is another "
                             "case's primary task, workflow_document_exists when it already has a 'workflow' "
                             "document). Its title and description stay; the kickoff is posted as a comment.")


class CaseCreateSerializer(StrictSerializer):
    type = serializers.CharField(max_length=100)
    title = serializers.CharField(max_length=500)
    kickoff = serializers.CharField(trim_whitespace=False, help_text="The primary task's description: what to do first.")
    workflowDocumentText = serializers.CharField(
        required=False, trim_whitespace=False,
        help_text="Saved verbatim as the primary task's document 'workflow'. Recommended: a Mermaid "
                  "stateDiagram-v2 map plus prose for transitions, evidence, next agents and escalation. "
                  "Required unless workflowDefinitionId is given; with it, omit the text (the definition's "
                  "prompt is adopted) or repeat the prompt verbatim (a different text is a 400 "
                  "workflow_text_mismatch).")
    summary = serializers.CharField(required=False, allow_blank=True, default="")
    status = CaseStatusField(default=CaseStatus.DRAFT)
    fields = JSONObjectField(required=False, default=dict)
    parentCaseId = IdField(required=False, allow_null=True)
    projectId = IdField(required=False, allow_null=True)
    workflowDefinitionId = IdField(required=False, allow_null=True,
                                   help_text="Adopt this definition: its prompt becomes the 'workflow' document "
                                             "and its name and fingerprint are captured in the created event.")
    primaryTaskId = primary_task_field()
    phase = serializers.CharField(required=False, allow_blank=True, default="", max_length=200)
    idempotencyKey = serializers.CharField(required=False, allow_blank=True, default="", max_length=200)
    initialDocuments = InitialDocumentSerializer(
        many=True, required=False, default=list,
        help_text="Ordinary task documents written before dispatch; they share a byte budget with the "
                  "workflow text and cannot use the key 'workflow'.")


class CasePatchSerializer(StrictSerializer):
    """Facts only: status, phase, routing and permissions change through handoffs and task completion."""

    title = serializers.CharField(max_length=500, required=False)
    summary = serializers.CharField(required=False, allow_blank=True)
    fields = JSONObjectField(required=False)


class WorkflowDefinitionCreateSerializer(StrictSerializer):
    name = serializers.CharField(max_length=200)
    description = serializers.CharField(required=False, allow_blank=True, default="")
    prompt = serializers.CharField(trim_whitespace=False, help_text="Markdown procedure, stored verbatim.")


class WorkflowDefinitionPatchSerializer(StrictSerializer):
    name = serializers.CharField(max_length=200, required=False)
    description = serializers.CharField(required=False, allow_blank=True)
    prompt = serializers.CharField(required=False, trim_whitespace=False)
