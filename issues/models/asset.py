"""A company's stored images (upstream's assets): today, its logo. The bytes live in the
``attachments`` storage beside issue attachments, under ``<company>/assets/<id>``; the row keeps
what a reader needs to trust them."""
from django.conf import settings
from django.db import models
from django.db.models import Q

from .base import UUIDModel
from .company import Company

# Raster images only: upstream also takes SVG after sanitising it, which this product does not do, so
# an SVG (a document that can carry script) is never stored as a logo.
IMAGE_TYPES = ("image/gif", "image/jpeg", "image/png", "image/webp")


class Asset(UUIDModel):
    company = models.ForeignKey(Company, on_delete=models.CASCADE, related_name="assets")
    original_filename = models.CharField(max_length=255)
    content_type = models.CharField(max_length=255)
    byte_size = models.PositiveBigIntegerField()
    sha256 = models.CharField(max_length=64)
    # Built from ids only (never the uploaded name), so a name cannot steer where bytes are written.
    object_key = models.CharField(max_length=300, unique=True)
    # Who uploaded it, for the record only (an upload is no authored history: purging the agent clears it).
    created_by_agent = models.ForeignKey("issues.Agent", null=True, blank=True, on_delete=models.SET_NULL,
                                         related_name="+")
    created_by_user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                        related_name="+")

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.CheckConstraint(condition=Q(content_type__in=IMAGE_TYPES), name="asset_is_raster_image"),
            models.CheckConstraint(condition=Q(byte_size__gt=0), name="asset_not_empty"),
            models.CheckConstraint(condition=Q(sha256__regex=r"^[0-9a-f]{64}$"), name="asset_sha256_hex"),
        ]

    def __str__(self):
        return self.original_filename

    @property
    def content_path(self) -> str:
        return f"/api/assets/{self.pk}/content"
