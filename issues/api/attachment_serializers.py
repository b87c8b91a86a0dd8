"""Shapes of upstream's issue attachments (ref §5 "Attachments")."""
from rest_framework import serializers


class AttachmentSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    companyId = serializers.UUIDField(source="company_id")
    issueId = serializers.UUIDField(source="issue_id")
    issueCommentId = serializers.UUIDField(source="comment_id", allow_null=True)
    originalFilename = serializers.CharField(source="original_filename")
    contentType = serializers.CharField(source="content_type")
    byteSize = serializers.IntegerField(source="byte_size")
    sha256 = serializers.CharField()
    objectKey = serializers.CharField(source="object_key")
    authorType = serializers.CharField(source="author_type")
    createdByAgentId = serializers.UUIDField(source="author_agent_id", allow_null=True)
    createdByUserId = serializers.IntegerField(source="author_user_id", allow_null=True)
    runId = serializers.UUIDField(source="run_id", allow_null=True)
    contentPath = serializers.CharField(source="content_path", help_text="GET it for the bytes.")
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")


class HeartbeatAttachmentSerializer(serializers.Serializer):
    """The heartbeat context's compact entry (upstream's ``filename`` there, ``originalFilename`` elsewhere)."""
    id = serializers.UUIDField()
    filename = serializers.CharField(source="original_filename")
    contentType = serializers.CharField(source="content_type")
    byteSize = serializers.IntegerField(source="byte_size")
    contentPath = serializers.CharField(source="content_path")
    createdAt = serializers.DateTimeField(source="created_at")


class AttachmentUploadSerializer(serializers.Serializer):
    """multipart/form-data: one ``file`` and an optional ``issueCommentId``."""
    file = serializers.FileField(allow_empty_file=True,  # an empty file is the service's 422, as upstream
                                 help_text="The file (one); its part's Content-Type is kept, or guessed from the "
                                           "name when missing or application/octet-stream.")
    issueCommentId = serializers.UUIDField(required=False, allow_null=True,
                                           help_text="A comment of this issue the file belongs to.")


class AssetSerializer(serializers.Serializer):
    """A company asset (upstream's logo upload answer)."""
    assetId = serializers.UUIDField(source="id")
    companyId = serializers.UUIDField(source="company_id")
    originalFilename = serializers.CharField(source="original_filename")
    contentType = serializers.CharField(source="content_type")
    byteSize = serializers.IntegerField(source="byte_size")
    sha256 = serializers.CharField()
    objectKey = serializers.CharField(source="object_key")
    createdByAgentId = serializers.UUIDField(source="created_by_agent_id", allow_null=True)
    createdByUserId = serializers.IntegerField(source="created_by_user_id", allow_null=True)
    contentPath = serializers.CharField(source="content_path", help_text="GET it for the bytes.")
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")


class LogoUploadSerializer(serializers.Serializer):
    """multipart/form-data: one ``file``, a PNG, JPEG, GIF or WebP image."""
    file = serializers.FileField(allow_empty_file=True, help_text="The image (one).")
