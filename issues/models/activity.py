from django.conf import settings
from django.db import models
from django.db.models import Q

from issues.choices import ActorType

from .base import choices_check
from .company import Company


class ActivityLog(models.Model):
    """Append-only audit trail: one row per mutation."""

    company = models.ForeignKey(Company, on_delete=models.CASCADE, related_name="activity")
    actor_type = models.CharField(max_length=16, choices=ActorType.choices)
    # The nullable references are indexed only where set (Meta.indexes): most rows leave some empty,
    # and every mutation writes a row here, so an index entry per NULL is write cost for nothing.
    actor_agent = models.ForeignKey("issues.Agent", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                                    db_index=False)
    actor_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    run = models.ForeignKey("issues.HeartbeatRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                            db_index=False)
    # A long-lived agent key's own run id (not a host run), recorded as given.
    client_run_id = models.UUIDField(null=True, blank=True)
    # The operator key a board request was made with.
    board_key = models.ForeignKey("issues.BoardApiKey", null=True, blank=True, on_delete=models.SET_NULL,
                                  related_name="+", db_index=False)
    # Plain btree indexes (Meta.indexes): equality filters only, so no LIKE (pattern_ops) twins.
    action = models.CharField(max_length=64)
    entity_type = models.CharField(max_length=32)
    entity_id = models.CharField(max_length=64)
    details = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "activity log"
        constraints = [choices_check("actor_type", ActorType, "activity_actor_type_valid")]
        indexes = [
            models.Index(fields=["action"], name="activity_action_idx"),
            models.Index(fields=["entity_id"], name="activity_entity_id_idx"),
            *(models.Index(fields=[f], condition=Q(**{f"{f}__isnull": False}), name=f"activity_{f}_set_idx")
              for f in ("actor_agent", "actor_user", "run", "board_key")),
        ]

    def __str__(self):
        return f"{self.action} {self.entity_type}:{self.entity_id}"
