"""Shapes of the upstream-compatible agent and run endpoints (paperclip-api.md §5.1), camelCase."""
from django.utils.text import slugify
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from issues.adapters.base import redacted_adapter_config
from issues.choices import AdapterType, AgentRole, AgentStatus
from issues.exceptions import Unprocessable
from issues.filtersets import MAX_LIST_ITEMS
from issues.services.agent_grants import agent_permissions

from .approval_serializers import ApprovalSerializer
from .serializers import (AgentSerializer, CompanyBriefSerializer, IdField, IssueSerializer, RunEventSerializer,
                          RunSerializer, StrictSerializer)

BIGINT_MAX = 2**63 - 1  # budgets live in 64-bit columns
CAPABILITIES_MAX = 10_000
ICON_MAX = 64  # Agent.icon's column


# --- output -------------------------------------------------------------------------------------
class AgentPermissionsSerializer(serializers.Serializer):
    canCreateAgents = serializers.BooleanField()
    canAssignTasks = serializers.BooleanField()


class AgentRecordSerializer(AgentSerializer):
    """Upstream's agent record. ``adapterConfig`` is redacted unless the context says
    ``redact=False`` (board users see it whole)."""

    urlKey = serializers.SerializerMethodField()
    adapterConfig = serializers.SerializerMethodField()
    permissions = serializers.SerializerMethodField()
    icon = serializers.SerializerMethodField()
    metadata = serializers.JSONField()
    updatedAt = serializers.DateTimeField(source="updated_at")

    def get_icon(self, agent) -> str | None:
        return agent.icon or None

    def get_urlKey(self, agent) -> str:
        return slugify(agent.name)

    @extend_schema_field({"type": "object", "additionalProperties": True})
    def get_adapterConfig(self, agent):
        config = agent.adapter_config
        return config if self.context.get("redact") is False else redacted_adapter_config(config)

    @extend_schema_field(AgentPermissionsSerializer)
    def get_permissions(self, agent):
        return agent_permissions(agent)


class ChainLinkSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    role = serializers.CharField()
    title = serializers.CharField()


class AgentDetailSerializer(AgentRecordSerializer):
    chainOfCommand = ChainLinkSerializer(many=True, source="chain_of_command")


class AgentMeSerializer(AgentDetailSerializer):
    """``GET /agents/me``: the agent record as ``GET /agents/{id}`` shows it, and its company."""

    company = CompanyBriefSerializer()


class AgentKeySerializer(serializers.Serializer):
    """A long-lived key's metadata; the token is never shown again."""

    id = serializers.UUIDField()
    name = serializers.CharField()
    prefix = serializers.CharField(help_text="The token's first characters, to recognise it.")
    createdAt = serializers.DateTimeField(source="created_at")
    lastUsedAt = serializers.DateTimeField(source="last_used_at", allow_null=True)
    revokedAt = serializers.DateTimeField(source="revoked_at", allow_null=True)


class OkSerializer(serializers.Serializer):
    ok = serializers.BooleanField()


class AgentKeyCreatedSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    token = serializers.CharField(help_text="The key itself (pcp_…): shown this once, never stored.")
    createdAt = serializers.DateTimeField(source="created_at")


class ActiveRunBriefSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    status = serializers.CharField()
    agentId = serializers.UUIDField(source="agent_id")
    startedAt = serializers.DateTimeField(source="started_at", allow_null=True)


class InboxLiteItemSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    identifier = serializers.CharField()
    title = serializers.CharField()
    status = serializers.CharField()
    priority = serializers.CharField()
    projectId = serializers.UUIDField(source="project_id", allow_null=True)
    goalId = serializers.UUIDField(source="goal_id", allow_null=True)
    parentId = serializers.UUIDField(source="parent_id", allow_null=True)
    updatedAt = serializers.DateTimeField(source="updated_at")
    activeRun = serializers.SerializerMethodField()

    @extend_schema_field(ActiveRunBriefSerializer(allow_null=True))
    def get_activeRun(self, issue):
        run = issue.execution_run if issue.execution_run_id else None
        return ActiveRunBriefSerializer(run).data if run is not None and run.is_live else None


class MineInboxItemSerializer(IssueSerializer):
    """An issue of a board member's Mine inbox (upstream's ``/agents/me/inbox/mine`` item)."""

    myLastTouchAt = serializers.SerializerMethodField(help_text="When the member created it or last commented.")
    lastExternalCommentAt = serializers.DateTimeField(source="last_external_comment_at", allow_null=True,
                                                      help_text="The newest comment by anyone else.")
    isUnreadForMe = serializers.SerializerMethodField(help_text="Someone else commented after the member's last "
                                                                "touch (this product keeps no read marks).")

    @staticmethod
    def _my_last_touch(issue):
        touches = [t for t in (issue.my_created_at, issue.my_last_comment_at) if t is not None]
        return max(touches) if touches else None

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_myLastTouchAt(self, issue):
        touch = self._my_last_touch(issue)
        return serializers.DateTimeField().to_representation(touch) if touch else None

    def get_isUnreadForMe(self, issue) -> bool:
        other, mine = issue.last_external_comment_at, self._my_last_touch(issue)
        return other is not None and (mine is None or other > mine)


class RunIssueSerializer(serializers.Serializer):
    """Upstream's ``IssueForRun``."""

    issueId = serializers.UUIDField(source="id")
    identifier = serializers.CharField()
    title = serializers.CharField()
    status = serializers.CharField()
    priority = serializers.CharField()


class HeartbeatRunEventSerializer(RunEventSerializer):
    """Our run event with upstream's names beside ours (``eventType`` = kind, ``payload`` = data;
    both redacted when written)."""

    runId = serializers.UUIDField(source="run_id")
    eventType = serializers.CharField(source="kind")
    payload = serializers.JSONField(source="data")


class ActiveRunSerializer(RunSerializer):
    """The run and the live-runs item fields (the schema says both)."""

    agentName = serializers.CharField(source="agent.name")
    adapterType = serializers.CharField(source="adapter_type")
    triggerDetail = serializers.SerializerMethodField()

    @extend_schema_field({"type": "string", "enum": ["manual", "ping", "callback", "system"], "nullable": True})
    def get_triggerDetail(self, run):
        from .wake import trigger_detail

        return trigger_detail(run)


class InvokeSkippedSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=["skipped"])
    reason = serializers.CharField()
    wakeupRequestId = serializers.UUIDField()


class InvokedRunSerializer(RunSerializer):
    wakeupRequestId = serializers.UUIDField()


# --- input --------------------------------------------------------------------------------------
# Wrapped in anyOf so the enum hook leaves it inline: another choice set is already named "role"
# (an ENUM_NAME_OVERRIDES entry in settings would name it AgentRoleEnum instead).
@extend_schema_field({"anyOf": [{"type": "string", "enum": list(AgentRole.values)}]})
class AgentRoleField(serializers.ChoiceField):
    """Agent roles (upstream's enum minus ``security``)."""

    def __init__(self, **kwargs):
        super().__init__(choices=AgentRole.choices, **kwargs)


class AgentPermissionsInputSerializer(StrictSerializer):
    canCreateAgents = serializers.BooleanField(required=False)
    canAssignTasks = serializers.BooleanField(required=False)


class AgentCreateSerializer(StrictSerializer):
    name = serializers.CharField(max_length=120)
    role = AgentRoleField(default=AgentRole.GENERAL)
    title = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    reportsTo = IdField(required=False, allow_null=True)
    capabilities = serializers.CharField(max_length=CAPABILITIES_MAX, required=False, allow_blank=True,
                                         default="")
    adapterType = serializers.ChoiceField(choices=AdapterType.choices)
    adapterConfig = serializers.DictField(required=False, default=dict)
    runtimeConfig = serializers.DictField(required=False, default=dict)
    budgetMonthlyCents = serializers.IntegerField(min_value=0, max_value=BIGINT_MAX, default=0)
    permissions = AgentPermissionsInputSerializer(required=False, help_text="Board users only.")
    icon = serializers.CharField(max_length=ICON_MAX, required=False, allow_blank=True, allow_null=True, default="")
    metadata = serializers.DictField(required=False, allow_null=True, default=dict)


class AgentHireSerializer(AgentCreateSerializer):
    """``POST /companies/{id}/agent-hires``: a new agent's fields and the issues the hire was asked for in."""

    sourceIssueId = IdField(required=False, allow_null=True)
    sourceIssueIds = serializers.ListField(child=IdField(), required=False, max_length=MAX_LIST_ITEMS)

    def validate(self, attrs):
        one = attrs.pop("sourceIssueId", None)
        attrs["sourceIssueIds"] = list(dict.fromkeys([*([one] if one else []), *attrs.get("sourceIssueIds", [])]))
        return attrs


class OrgNodeSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    role = serializers.CharField()
    status = serializers.CharField()
    reports = serializers.ListField(child=serializers.DictField(),
                                    help_text="The agent's direct reports: nodes of this same shape.")


class AgentHireResultSerializer(serializers.Serializer):
    agent = AgentRecordSerializer()
    approval = ApprovalSerializer(allow_null=True, help_text="The pending hire_agent approval when the company "
                                                             "requires board approval for new agents, else null.")


class AgentPatchSerializer(StrictSerializer):
    """A partial update; ``permissions`` has its own endpoint (422 here, as upstream)."""

    name = serializers.CharField(max_length=120, required=False)
    role = AgentRoleField(required=False)
    title = serializers.CharField(max_length=200, required=False, allow_blank=True)
    reportsTo = IdField(required=False, allow_null=True)
    capabilities = serializers.CharField(max_length=CAPABILITIES_MAX, required=False, allow_blank=True)
    adapterType = serializers.ChoiceField(choices=AdapterType.choices, required=False)
    adapterConfig = serializers.DictField(required=False)
    runtimeConfig = serializers.DictField(required=False)
    budgetMonthlyCents = serializers.IntegerField(min_value=0, max_value=BIGINT_MAX, required=False)
    icon = serializers.CharField(max_length=ICON_MAX, required=False, allow_blank=True, allow_null=True)
    metadata = serializers.DictField(required=False, allow_null=True)
    status = serializers.ChoiceField(choices=AgentStatus.choices, required=False,
                                     help_text="active, idle, paused (stops live runs) or error; "
                                               "terminate with POST /agents/{id}/terminate.")

    def to_internal_value(self, data):
        if isinstance(data, dict) and "permissions" in data:
            raise Unprocessable("Use /api/agents/:id/permissions for permission changes",
                                code="use_permissions_endpoint", details={"permissions": ["Not accepted here."]})
        return super().to_internal_value(data)


class AgentKeyCreateSerializer(StrictSerializer):
    name = serializers.CharField(max_length=120, required=False, default="default")
