import secrets

from django.conf import settings
from django.db import models

from .base import UUIDModel

BOARD_KEY_PREFIX = "pcp_board_"


class BoardApiKey(UUIDModel):
    """An operator's API key: requests made with it act as ``user`` (their memberships and roles).
    Only the SHA-256 is stored; the first characters are kept to recognise it."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="board_api_keys")
    name = models.CharField(max_length=120, default="default")
    prefix = models.CharField(max_length=24)
    key_hash = models.CharField(max_length=64, unique=True)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Empty: never expires.")
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return f"{self.prefix}… ({self.user})"

    @staticmethod
    def generate() -> str:
        return BOARD_KEY_PREFIX + secrets.token_urlsafe(32)
