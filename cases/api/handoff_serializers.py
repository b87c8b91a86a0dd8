"""API shapes of case handoffs (camelCase). ``to`` is an agent id or ``"done"``; omitting
``workflowId`` preserves the case's workflow, naming one adopts or refreshes it, null detaches."""
from rest_framework import serializers

from issues.api.serializers import IdField, StrictSerializer

from ..choices import HandoffStatus, HandoffTarget, WorkflowAction
from .serializers import InitialDocumentSerializer, JSONObjectField, primary_task_field


class HandoffRequestSerializer(StrictSerializer):
    caseId = IdField(required=False, help_text="Omit for a kickoff, which creates the case.")
    to = serializers.CharField(help_text='The recipient agent id, or "done" for a closure intent.')
    workflowId = IdField(required=False, allow_null=True,
                         help_text="Omit to preserve; an id adopts (or refreshes the current one); null detaches.")
    phase = serializers.CharField(required=False, allow_blank=True, max_length=200, allow_null=True)
    note = serializers.CharField(required=False, allow_blank=True, default="",
                                 help_text="Posted on the primary task for the recipient.")
    idempotencyKey = serializers.CharField(required=False, allow_blank=True, default="", max_length=200,
                                           help_text="Per authenticated principal: a replay returns the same handoff.")
    # kickoff only
    type = serializers.CharField(required=False, max_length=100)
    title = serializers.CharField(required=False, max_length=500)
    kickoff = serializers.CharField(required=False, trim_whitespace=False)
    workflowDocumentText = serializers.CharField(required=False, trim_whitespace=False)
    summary = serializers.CharField(required=False, allow_blank=True, default="")
    fields = JSONObjectField(required=False, default=dict)
    parentCaseId = IdField(required=False, allow_null=True)
    projectId = IdField(required=False, allow_null=True)
    caseIdempotencyKey = serializers.CharField(required=False, allow_blank=True, default="", max_length=200)
    initialDocuments = InitialDocumentSerializer(many=True, required=False, default=list)
    primaryTaskId = primary_task_field()

    KICKOFF_ONLY = ("type", "title", "kickoff", "workflowDocumentText", "parentCaseId", "projectId",
                    "initialDocuments", "caseIdempotencyKey", "primaryTaskId")

    def validate(self, attrs):
        errors = {}
        if "caseId" in attrs:
            for name in self.KICKOFF_ONLY:
                if name in self.initial_data:
                    errors[name] = ["Only a kickoff (no caseId) takes this field."]
        else:
            for name in ("type", "title", "kickoff"):
                if not (attrs.get(name) or "").strip():
                    errors[name] = ["Required for a kickoff (no caseId)."]
            if "workflowId" not in attrs and "workflowDocumentText" not in attrs:
                errors["workflowDocumentText"] = ["A kickoff needs workflowDocumentText or workflowId."]
            elif attrs.get("workflowId") is None and "workflowDocumentText" not in attrs:
                errors["workflowId"] = ["A kickoff cannot detach a workflow it does not have."]
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


class HandoffSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    caseId = serializers.UUIDField(source="case_id")
    kickoff = serializers.BooleanField()
    target = serializers.ChoiceField(choices=HandoffTarget.choices)
    fromAgentId = serializers.UUIDField(source="from_agent_id", allow_null=True)
    toAgentId = serializers.UUIDField(source="to_agent_id", allow_null=True)
    workflowAction = serializers.ChoiceField(source="workflow_action", choices=WorkflowAction.choices)
    workflowId = serializers.UUIDField(source="workflow_id", allow_null=True)
    workflowName = serializers.CharField(source="workflow_name", help_text="Captured at acceptance.")
    previousWorkflowName = serializers.CharField(source="previous_workflow_name")
    phase = serializers.SerializerMethodField()
    previousPhase = serializers.CharField(source="previous_phase")
    baseRevisionId = serializers.UUIDField(source="base_revision_id", allow_null=True)
    appliedRevisionId = serializers.UUIDField(source="applied_revision_id", allow_null=True)
    status = serializers.ChoiceField(choices=HandoffStatus.choices)
    requestedBy = serializers.SerializerMethodField()
    idempotencyKey = serializers.CharField(source="idempotency_key")
    sourceRunId = serializers.UUIDField(source="source_run_id", allow_null=True)
    wakeupId = serializers.UUIDField(source="wakeup_id", allow_null=True)
    note = serializers.CharField()
    recoveryDetail = serializers.JSONField(source="recovery_detail")
    acceptedAt = serializers.DateTimeField(source="accepted_at", allow_null=True)
    appliedAt = serializers.DateTimeField(source="applied_at", allow_null=True)
    cancelledAt = serializers.DateTimeField(source="cancelled_at", allow_null=True)
    createdAt = serializers.DateTimeField(source="created_at")

    def get_phase(self, obj) -> str:
        return obj.phase if obj.set_phase else obj.previous_phase

    def get_requestedBy(self, obj) -> dict:
        kind, _, ident = obj.principal.partition(":")
        return {"type": kind, "id": ident or None}


class HandoffCancelSerializer(StrictSerializer):
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=500)


class HandoffListSerializer(serializers.Serializer):
    items = HandoffSerializer(many=True)
