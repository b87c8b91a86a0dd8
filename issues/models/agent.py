import hashlib
import secrets

from django.db import models
from django.db.models.functions import Lower

from issues.choices import AdapterType, AgentRole, AgentStatus

from .base import UUIDModel, choices_check
from .company import Company


class Agent(UUIDModel):
    company = models.ForeignKey(Company, on_delete=models.CASCADE, related_name="agents")
    name = models.CharField(max_length=120)
    title = models.CharField(max_length=200, blank=True)
    role = models.CharField(max_length=32, choices=AgentRole.choices, default=AgentRole.GENERAL)
    status = models.CharField(max_length=16, choices=AgentStatus.choices, default=AgentStatus.IDLE)
    reports_to = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="reports")
    capabilities = models.TextField(blank=True)
    adapter_type = models.CharField(max_length=16, choices=AdapterType.choices, default=AdapterType.NONE)
    adapter_config = models.JSONField(default=dict, blank=True)
    runtime_config = models.JSONField(default=dict, blank=True)
    budget_monthly_cents = models.PositiveBigIntegerField(default=0, help_text="0 means no limit.")
    spent_monthly_cents = models.PositiveBigIntegerField(default=0)
    spend_period = models.CharField(max_length=7, blank=True, help_text="The month (YYYY-MM) spend counts for.")
    pause_reason = models.CharField(max_length=200, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    # Upstream's agent permissions: {"canCreateAgents": bool, "canAssignTasks": bool}.
    permissions = models.JSONField(default=dict, blank=True)
    icon = models.CharField(max_length=64, blank=True)
    metadata = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(Lower("name"), "company", name="agent_name_unique_per_company"),
            choices_check("role", AgentRole, "agent_role_valid"),
            choices_check("status", AgentStatus, "agent_status_valid"),
            choices_check("adapter_type", AdapterType, "agent_adapter_type_valid"),
            models.CheckConstraint(condition=~models.Q(reports_to=models.F("id")), name="agent_not_own_manager"),
        ]

    def __str__(self):
        return self.name

    # DRF treats the authenticated principal as request.user.
    is_authenticated = True
    is_anonymous = False


KEY_PREFIX = "pcp_"


def hash_key(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


class AgentApiKey(UUIDModel):
    """Only the SHA-256 of a key is stored; the first characters are kept to recognise it."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=120, default="default")
    prefix = models.CharField(max_length=16)
    key_hash = models.CharField(max_length=64, unique=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # A run-scoped key is handed to one agent process and dies with its run.
    run = models.ForeignKey("issues.HeartbeatRun", null=True, blank=True, on_delete=models.CASCADE,
                            related_name="api_keys")

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return f"{self.prefix}… ({self.agent})"

    @staticmethod
    def generate() -> str:
        return KEY_PREFIX + secrets.token_urlsafe(32)
