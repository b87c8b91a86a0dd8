"""API shapes of bounded paged reads, history and task links (camelCase)."""
from rest_framework import serializers

from issues.api.serializers import IdField, StrictSerializer

from ..choices import CaseLinkRole
from .serializers import CaseEventSerializer, CaseIssueLinkSerializer, CaseSerializer, CaseStatusField


# --- query parameters ------------------------------------------------------------------------
class CaseReadQuerySerializer(serializers.Serializer):
    agentRead = serializers.BooleanField(required=False, default=False,
                                         help_text="true: the bounded agent read (read_case) instead of the detail.")
    section = serializers.ChoiceField(choices=[("fields", "fields"), ("document", "document")], required=False,
                                      help_text="fields: page the JSON text of the case's fields; document: page a "
                                                "document body. Omitted: the whole case (structured when small).")
    documentKey = serializers.RegexField(r"^[a-z0-9][a-z0-9_-]{0,63}$", required=False,
                                         help_text="With section=document: the document key. Alone it reads the "
                                                   "case's own document of that key.")
    documentIssueId = IdField(required=False, help_text="With section=document: read the document of this task "
                                                        "instead (the primary task or a task linked to the case).")
    offsetBytes = serializers.IntegerField(required=False, min_value=0,
                                           help_text="Byte offset into the UTF-8 encoding of the paged text; "
                                                     "a previous page's nextOffsetBytes.")
    limitBytes = serializers.IntegerField(required=False, min_value=4,
                                          help_text="Page budget in UTF-8 bytes (default 64 KiB, at most 256 KiB "
                                                    "are used; at least 4: one character).")
    snapshot = serializers.CharField(required=False, help_text="Required when offsetBytes > 0: the snapshot of "
                                                               "the first page.")

    READ_ONLY_PARAMS = ("section", "documentKey", "documentIssueId", "offsetBytes", "limitBytes", "snapshot")


class WorkflowPromptQuerySerializer(serializers.Serializer):
    offsetBytes = serializers.IntegerField(required=False, min_value=0,
                                           help_text="Byte offset into the UTF-8 encoding of the prompt.")
    limitBytes = serializers.IntegerField(required=False, min_value=4,
                                          help_text="Page budget in UTF-8 bytes (default 64 KiB, at most 256 KiB "
                                                    "are used; at least 4: one character).")
    fingerprint = serializers.CharField(required=False, help_text="Required when offsetBytes > 0: the first "
                                                                  "page's fingerprint.")

    PAGE_PARAMS = ("offsetBytes", "limitBytes", "fingerprint")


# --- output ----------------------------------------------------------------------------------
class CaseReadProjectionSerializer(CaseSerializer):
    """The case projection of an agent read without ``fields`` (serialized separately so a large
    ``fields`` value is never loaded): the case's columns and its task links."""

    links = CaseIssueLinkSerializer(many=True, source="link_rows")

    def get_fields(self):
        fields = super().get_fields()
        fields.pop("fields")
        return fields


class CaseReadCaseSerializer(CaseSerializer):
    """The structured case of a small agent read: the case with ``fields`` (last) and its links."""

    links = CaseIssueLinkSerializer(many=True, source="link_rows")


class ReadPageSerializer(serializers.Serializer):
    text = serializers.CharField(trim_whitespace=False,
                                 help_text="The exact text of bytes [offsetBytes, nextOffsetBytes) of the UTF-8 "
                                           "encoding of the paged text; never splits a character.")
    offsetBytes = serializers.IntegerField()
    nextOffsetBytes = serializers.IntegerField(help_text="Where the next page starts (totalBytes when done).")
    totalBytes = serializers.IntegerField(help_text="Bytes of the whole text in UTF-8.")
    limitBytes = serializers.IntegerField(help_text="The budget applied to this page.")
    done = serializers.BooleanField()


class ReadDocumentSerializer(serializers.Serializer):
    owner = serializers.ChoiceField(choices=[("case", "case"), ("task", "task")],
                                    help_text="case: the case's own document (documentKey alone); task: a "
                                              "document of the task named by documentIssueId.")
    caseId = serializers.UUIDField()
    issueId = serializers.UUIDField(allow_null=True)
    issueIdentifier = serializers.CharField(allow_null=True)
    key = serializers.CharField()
    title = serializers.CharField()
    format = serializers.CharField()
    documentId = serializers.UUIDField()
    revisionId = serializers.UUIDField()
    revisionNumber = serializers.IntegerField()


class ReadVersionsSerializer(serializers.Serializer):
    caseId = serializers.UUIDField()
    caseUpdatedAt = serializers.DateTimeField()
    primaryTaskId = serializers.UUIDField(allow_null=True)
    primaryTaskUpdatedAt = serializers.DateTimeField(allow_null=True)
    primaryTaskStatus = serializers.CharField(allow_null=True)
    currentWorkflowId = serializers.UUIDField(allow_null=True)
    phase = serializers.CharField(allow_blank=True)
    latestHandoffId = serializers.UUIDField(allow_null=True)
    latestHandoffStatus = serializers.CharField(allow_null=True)
    documentRevisionId = serializers.UUIDField(allow_null=True)


class CaseAgentReadSerializer(serializers.Serializer):
    mode = serializers.ChoiceField(choices=[("structured", "structured"), ("text", "text")])
    projection = serializers.ChoiceField(choices=[("case", "case"), ("fields", "fields"), ("document", "document")])
    case = serializers.JSONField(allow_null=True, help_text="mode=structured: the case (CaseReadCase shape).")
    document = ReadDocumentSerializer(allow_null=True)
    readPage = ReadPageSerializer(allow_null=True)
    snapshot = serializers.CharField(help_text="Opaque; pass it with every continuation (offsetBytes > 0). "
                                               "409 read_snapshot_stale when the case, task, document or "
                                               "projection changed: restart at offsetBytes=0 without it.")
    versions = ReadVersionsSerializer()


class WorkflowPromptPageSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    companyId = serializers.UUIDField()
    name = serializers.CharField()
    fingerprint = serializers.CharField(help_text="sha256 (hex) of the whole prompt; pass it with continuations.")
    readPage = ReadPageSerializer()


class CaseEventPageSerializer(serializers.Serializer):
    items = CaseEventSerializer(many=True, help_text="Oldest first (created, then id).")
    total = serializers.IntegerField()
    limit = serializers.IntegerField()
    offset = serializers.IntegerField()


class CaseRefSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    identifier = serializers.CharField()
    title = serializers.CharField()
    type = serializers.CharField(source="case_type")
    status = CaseStatusField()
    primaryTaskId = serializers.UUIDField(source="primary_task_id", allow_null=True)
    currentWorkflowId = serializers.UUIDField(source="current_workflow_id", allow_null=True)
    phase = serializers.CharField()
    updatedAt = serializers.DateTimeField(source="updated_at")


class IssueCaseSerializer(serializers.Serializer):
    case = CaseRefSerializer()
    role = serializers.ChoiceField(choices=CaseLinkRole.choices)
    linkedAt = serializers.DateTimeField(source="created_at")


class CaseLinkCreateSerializer(StrictSerializer):
    issueId = IdField()
    role = serializers.ChoiceField(choices=[(CaseLinkRole.WORK, "work"), (CaseLinkRole.REFERENCE, "reference")],
                                   default=CaseLinkRole.WORK)
