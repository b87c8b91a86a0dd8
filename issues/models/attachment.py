"""Files attached to an issue (upstream's issue attachments): the bytes live in the ``attachments``
storage (settings.STORAGES) under ``object_key``; the row keeps what a reader needs to trust them."""
from django.core.files.storage import storages
from django.db import models
from django.db.models import Q

from .base import UUIDModel
from .company import Company
from .issue import Issue
from .thread import Authored, Comment


# Shown by the browser (a new tab); anything else is served as a download.
INLINE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp", "text/plain"})


def attachment_storage():
    """Where attachments' bytes live: the ``attachments`` entry of settings.STORAGES."""
    return storages["attachments"]


class Attachment(UUIDModel, Authored):
    company = models.ForeignKey(Company, on_delete=models.CASCADE, related_name="+")
    issue = models.ForeignKey(Issue, on_delete=models.CASCADE, related_name="attachments")
    # Upstream's issueCommentId: the comment the file belongs to, when it was posted with one.
    comment = models.ForeignKey(Comment, null=True, blank=True, on_delete=models.SET_NULL, related_name="attachments")
    original_filename = models.CharField(max_length=255)
    content_type = models.CharField(max_length=255)
    byte_size = models.PositiveBigIntegerField()
    sha256 = models.CharField(max_length=64)
    # Built from ids only (never the uploaded name), so a name cannot steer where bytes are written.
    object_key = models.CharField(max_length=300, unique=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["issue", "created_at"], name="attachment_issue_created_idx")]
        constraints = [
            *Authored.author_constraints("attachment"),
            models.CheckConstraint(condition=Q(byte_size__gt=0), name="attachment_not_empty"),
            models.CheckConstraint(condition=Q(sha256__regex=r"^[0-9a-f]{64}$"), name="attachment_sha256_hex"),
            models.CheckConstraint(condition=Q(original_filename__gt=""), name="attachment_filename_present"),
        ]

    def __str__(self):
        return self.original_filename

    @property
    def content_path(self) -> str:
        return f"/api/attachments/{self.pk}/content"

    @property
    def shows_inline(self) -> bool:
        return self.content_type in INLINE_TYPES

    @property
    def served_type(self) -> str:
        """The stored type; text is sent as UTF-8 (browsers would guess a legacy encoding for agents' logs)."""
        return f"{self.content_type}; charset=utf-8" if self.content_type.startswith("text/") else self.content_type
