"""Connectors API shapes (camelCase). Input serializers reject unknown fields."""
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from paperclip.core.schema import NON_NULL_JSON

from issues.api.serializers import IdField, StrictSerializer

from ..choices import ClosePolicy, CommandPolicy, ReopenPolicy, RoutingRuleKind, RunMode, SyncMode
from ..providers import base as providers


@extend_schema_field({"oneOf": [
    {"type": "string", "pattern": r"^(env:[A-Za-z_][A-Za-z0-9_]{0,127}|secret:[0-9a-fA-F-]{32,36}|)$",
     "description": "A reference: 'env:NAME' (a name the server's allow-list gives this company), a stored "
                    "'secret:<id>' of this company, or '' for none."},
    {"type": "object", "required": ["value"], "additionalProperties": False,
     "properties": {"value": {"type": "string", "minLength": 1}}, "description": "Stored encrypted."},
]})
class SecretValueField(serializers.JSONField):
    """``"env:NAME"`` or ``{"value": "…"}`` (stored encrypted; never echoed back)."""


@extend_schema_field(NON_NULL_JSON)
class MergedValueField(serializers.JSONField):
    """merge_manual's value: any JSON value but null."""


class ProviderField(serializers.ChoiceField):
    """A registered provider key (the choices are read from the provider registry at each use)."""

    def __init__(self, **kwargs):
        try:
            keys = providers.provider_keys()
        except ModuleNotFoundError:  # a provider module is missing: the adapters that did register
            keys = sorted(providers._REGISTRY)
        super().__init__(choices=keys, **kwargs)


# The integer columns are 32-bit: bound the input so a hostile number is a 400, not a database error.
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


class RoutingRuleInputSerializer(StrictSerializer):
    order = serializers.IntegerField(required=False, min_value=INT32_MIN, max_value=INT32_MAX)
    kind = serializers.ChoiceField(choices=RoutingRuleKind.choices)
    match = serializers.DictField(required=False, default=dict)
    agentId = IdField(required=False, allow_null=True)
    routingAlias = serializers.CharField(required=False, allow_blank=True, max_length=64)
    enabled = serializers.BooleanField(required=False, default=True)


class InstanceConfigSerializer(StrictSerializer):
    baseUrl = serializers.CharField(required=False, allow_blank=True, max_length=500, source="base_url")
    containers = serializers.ListField(child=serializers.CharField(max_length=300), required=False)
    stateMapping = serializers.DictField(required=False, source="state_mapping")
    config = serializers.DictField(required=False)
    defaultSyncMode = serializers.ChoiceField(choices=SyncMode.choices, required=False, source="default_sync_mode")
    defaultRunMode = serializers.ChoiceField(choices=RunMode.choices, required=False, source="default_run_mode")
    fieldPolicy = serializers.DictField(required=False, source="field_policy")
    writePolicy = serializers.DictField(required=False, source="write_policy")
    wakeOnExternalComment = serializers.BooleanField(required=False, allow_null=True,
                                                     source="wake_on_external_comment")
    autoImport = serializers.BooleanField(required=False, source="auto_import")
    commandPolicy = serializers.ChoiceField(choices=CommandPolicy.choices, required=False, source="command_policy")
    # §7.4: closure of a busy issue (a link may override it) and reopen of a closed one
    closePolicy = serializers.ChoiceField(choices=ClosePolicy.choices, required=False, source="close_policy")
    reopenPolicy = serializers.ChoiceField(choices=ReopenPolicy.choices, required=False, source="reopen_policy")
    routingAliases = serializers.DictField(child=serializers.CharField(), required=False, source="routing_aliases")
    pollIntervalSeconds = serializers.IntegerField(min_value=1, max_value=INT32_MAX, required=False,
                                                   source="poll_interval_seconds")
    reconcileIntervalSeconds = serializers.IntegerField(min_value=1, max_value=INT32_MAX, required=False,
                                                        source="reconcile_interval_seconds")
    reconcileBatchSize = serializers.IntegerField(min_value=1, max_value=10000, required=False,
                                                  source="reconcile_batch_size")
    projectId = IdField(required=False, allow_null=True, source="project_id")
    goalId = IdField(required=False, allow_null=True, source="goal_id")
    triageAgentId = IdField(required=False, allow_null=True, source="triage_agent_id")
    serviceAccountId = serializers.CharField(required=False, allow_blank=True, max_length=200,
                                             source="service_account_id")
    serviceAccountName = serializers.CharField(required=False, allow_blank=True, max_length=200,
                                               source="service_account_name")
    routingRules = RoutingRuleInputSerializer(many=True, required=False)


class InstanceCreateSerializer(InstanceConfigSerializer):
    name = serializers.CharField(max_length=120)
    provider = ProviderField()
    credentials = SecretValueField(required=False)
    webhookSecret = SecretValueField(required=False)


class InstancePatchSerializer(InstanceConfigSerializer):
    name = serializers.CharField(max_length=120, required=False)


class InterventionSerializer(StrictSerializer):
    idempotencyKey = serializers.CharField(max_length=200)
    reason = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")


class ImportSerializer(StrictSerializer):
    idempotencyKey = serializers.CharField(max_length=200)
    externalKey = serializers.CharField(max_length=200, required=False)
    externalTaskId = serializers.CharField(max_length=200, required=False)


class ManualLinkSerializer(ImportSerializer):
    issueId = serializers.CharField(max_length=40)


class CredentialsRotateSerializer(InterventionSerializer):
    credentials = SecretValueField(required=False)
    webhookSecret = SecretValueField(required=False)


class InterventionResultSerializer(serializers.Serializer):
    interventionId = serializers.IntegerField()
    replayed = serializers.BooleanField()
    status = serializers.CharField(required=False)


class RoutingRuleSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    order = serializers.IntegerField()
    kind = serializers.CharField()
    match = serializers.JSONField()
    agentId = serializers.UUIDField(source="target_agent_id", allow_null=True)
    routingAlias = serializers.CharField(source="target_alias")
    enabled = serializers.BooleanField()


class CapabilitiesSerializer(serializers.Serializer):
    """§5.2 static capability declaration of the instance's provider (``Capabilities.as_dict``)."""

    operations = serializers.ListField(child=serializers.CharField())
    stateCategories = serializers.ListField(child=serializers.CharField())
    signedWebhooks = serializers.BooleanField()
    routingRuleKinds = serializers.ListField(child=serializers.CharField())
    hasExternalKeys = serializers.BooleanField()
    settableFields = serializers.ListField(child=serializers.CharField())
    commandVerbs = serializers.ListField(child=serializers.CharField(),
                                         help_text="§8.2 /paperclip verbs the connector accepts.")


class InstanceSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    companyId = serializers.UUIDField(source="company_id")
    name = serializers.CharField()
    provider = serializers.CharField(source="provider_key")
    status = serializers.CharField()
    statusDetail = serializers.CharField(source="status_detail")
    baseUrl = serializers.CharField(source="base_url")
    containers = serializers.JSONField()
    stateMapping = serializers.JSONField(source="state_mapping")
    config = serializers.JSONField()
    defaultSyncMode = serializers.CharField(source="default_sync_mode")
    defaultRunMode = serializers.CharField(source="default_run_mode")
    fieldPolicy = serializers.JSONField(source="field_policy")
    writePolicy = serializers.JSONField(source="write_policy")
    wakeOnExternalComment = serializers.BooleanField(source="wake_on_external_comment", allow_null=True)
    autoImport = serializers.BooleanField(source="auto_import")
    commandPolicy = serializers.CharField(source="command_policy")
    closePolicy = serializers.ChoiceField(choices=ClosePolicy.choices, source="close_policy")
    reopenPolicy = serializers.ChoiceField(choices=ReopenPolicy.choices, source="reopen_policy")
    routingAliases = serializers.JSONField(source="routing_aliases")
    pollIntervalSeconds = serializers.IntegerField(source="poll_interval_seconds")
    reconcileIntervalSeconds = serializers.IntegerField(source="reconcile_interval_seconds")
    reconcileBatchSize = serializers.IntegerField(source="reconcile_batch_size")
    projectId = serializers.UUIDField(source="project_id", allow_null=True)
    goalId = serializers.UUIDField(source="goal_id", allow_null=True)
    triageAgentId = serializers.UUIDField(source="triage_agent_id", allow_null=True)
    serviceAccountId = serializers.CharField(source="service_account_id")
    serviceAccountName = serializers.CharField(source="service_account_name")
    # References only ("env:NAME" / "secret:<id>"): never a secret value.
    credentialsRef = serializers.CharField(source="credentials_ref")
    webhookSecretRef = serializers.CharField(source="webhook_secret_ref")
    webhookUrl = serializers.SerializerMethodField()
    capabilities = serializers.SerializerMethodField()
    routingRules = RoutingRuleSerializer(many=True, source="routing_rules.all")
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")

    def get_webhookUrl(self, obj) -> str:
        from ..services.instances import webhook_url

        return webhook_url(obj)

    @extend_schema_field(CapabilitiesSerializer(allow_null=True))
    def get_capabilities(self, obj) -> dict | None:
        from ..services.common import adapter_class

        try:
            return adapter_class(obj.provider_key).capabilities.as_dict()
        except LookupError:
            return None


class LinkSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    companyId = serializers.UUIDField(source="company_id")
    connectorInstanceId = serializers.UUIDField(source="instance_id")
    providerKey = serializers.CharField(source="provider_key")
    projectId = serializers.UUIDField(source="project_id", allow_null=True)
    goalId = serializers.UUIDField(source="goal_id", allow_null=True)
    issueId = serializers.UUIDField(source="issue_id")
    issueIdentifier = serializers.CharField(source="issue.identifier")
    handoffHistory = serializers.JSONField(source="handoff_history")
    externalWorkspaceId = serializers.CharField(source="external_workspace_id")
    externalProjectId = serializers.CharField(source="external_project_id")
    externalTaskId = serializers.CharField(source="external_task_id")
    externalKey = serializers.CharField(source="external_key")
    externalUrl = serializers.CharField(source="external_url")
    externalTitle = serializers.CharField(source="external_title")
    externalState = serializers.SerializerMethodField()
    originSide = serializers.CharField(source="origin_side")
    syncMode = serializers.CharField(source="sync_mode")
    runMode = serializers.CharField(source="run_mode")
    closePolicy = serializers.CharField(source="close_policy", help_text="'' = the connector's closePolicy (§7.4).")
    fieldPolicy = serializers.JSONField(source="field_policy")
    writePolicy = serializers.JSONField(source="write_policy")
    baseSnapshot = serializers.JSONField(source="base_snapshot")
    lastExternalRevision = serializers.CharField(source="last_external_revision", allow_null=True)
    lastPaperclipFingerprint = serializers.CharField(source="last_paperclip_fingerprint", allow_null=True)
    lastInboundAt = serializers.DateTimeField(source="last_inbound_at", allow_null=True)
    lastOutboundAt = serializers.DateTimeField(source="last_outbound_at", allow_null=True)
    lastReconcileAt = serializers.DateTimeField(source="last_reconcile_at", allow_null=True)
    status = serializers.CharField()
    statusDetail = serializers.CharField(source="status_detail", allow_null=True)
    routing = serializers.JSONField()
    claim = serializers.SerializerMethodField()
    lastWakeAt = serializers.DateTimeField(source="last_wake_at", allow_null=True)
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")

    def get_externalState(self, obj) -> dict:
        return {"name": obj.external_state_name, "category": obj.external_state_category or None}

    def get_claim(self, obj) -> dict:
        from ..selectors import link_claim_state

        return link_claim_state(obj)


class LinkDetailSerializer(LinkSerializer):
    transitions = serializers.SerializerMethodField()
    dispatch = serializers.SerializerMethodField()
    effectiveClosePolicy = serializers.SerializerMethodField()
    reopenPolicy = serializers.ChoiceField(choices=ReopenPolicy.choices, source="instance.reopen_policy",
                                           help_text="The connector's (§7.4); set on the connector.")

    def get_effectiveClosePolicy(self, obj) -> str:
        from ..services.close_reopen import close_policy_of

        return close_policy_of(obj, obj.instance)

    def get_dispatch(self, obj) -> dict:
        """Symphony profile claim/run/retry/release state (§9.3, §12.3)."""
        from ..services.symphony import dispatch_state

        return dispatch_state(obj)

    openConflicts = serializers.SerializerMethodField()
    envelope = serializers.JSONField()

    def get_transitions(self, obj) -> list:
        return [{"from": t.from_status or None, "to": t.to_status, "cause": t.cause, "at": t.at,
                 "idempotencyKey": t.idempotency_key} for t in obj.transitions.order_by("at", "id")]

    def get_openConflicts(self, obj) -> int:
        return obj.conflicts.filter(status="open").count()


class LinkPatchSerializer(StrictSerializer):
    closePolicy = serializers.ChoiceField(choices=[("", "the connector's"), *ClosePolicy.choices], allow_blank=True,
                                          required=False, source="close_policy",
                                          help_text="§7.4 for this link; '' follows the connector's closePolicy.")


class ConflictSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    linkId = serializers.UUIDField(source="link_id")
    kind = serializers.CharField()
    field = serializers.CharField()
    status = serializers.CharField()
    baseValue = serializers.JSONField(source="base_value")
    externalValue = serializers.JSONField(source="external_value")
    paperclipValue = serializers.JSONField(source="paperclip_value")
    actors = serializers.JSONField()
    detail = serializers.CharField()
    detectedAt = serializers.DateTimeField(source="detected_at")
    resolvedAt = serializers.DateTimeField(source="resolved_at", allow_null=True)
    resolution = serializers.CharField()


class EventSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    sequence = serializers.IntegerField(source="pk")
    idempotencyKey = serializers.CharField(source="idempotency_key")
    source = serializers.CharField()
    kind = serializers.CharField()
    action = serializers.CharField()
    externalTaskId = serializers.CharField(source="external_task_id")
    verified = serializers.BooleanField()
    # signature | unverified (an unsigned hint, not confirmed) | read-back (confirmed by the API) | api-read
    verification = serializers.CharField()
    status = serializers.CharField()
    attempts = serializers.IntegerField()
    nextAttemptAt = serializers.DateTimeField(source="next_attempt_at", allow_null=True)
    outcome = serializers.CharField()
    errorCategory = serializers.CharField(source="error_category")
    errorMessage = serializers.CharField(source="error_message")
    receivedAt = serializers.DateTimeField(source="received_at")
    appliedAt = serializers.DateTimeField(source="applied_at", allow_null=True)


class ActivitySerializer(serializers.Serializer):
    id = serializers.IntegerField()
    action = serializers.CharField()
    entityType = serializers.CharField(source="entity_type")  # connector_link, or issue for a caused row
    entityId = serializers.CharField(source="entity_id")
    actorType = serializers.CharField(source="actor_type")
    actorUserId = serializers.IntegerField(source="actor_user_id", allow_null=True)
    actorAgentId = serializers.UUIDField(source="actor_agent_id", allow_null=True)
    details = serializers.JSONField()
    createdAt = serializers.DateTimeField(source="created_at")


class ConflictDetailSerializer(ConflictSerializer):
    connectorInstanceId = serializers.UUIDField(source="instance_id")
    issueId = serializers.UUIDField(source="link.issue_id")
    linkStatus = serializers.CharField(source="link.status")
    resolutionKey = serializers.CharField(source="resolution_key")
    resolutionValue = serializers.JSONField(source="resolution_value")
    resolvedByUserId = serializers.IntegerField(source="resolved_by_user_id", allow_null=True)


class ConflictResolveSerializer(StrictSerializer):
    action = serializers.ChoiceField(choices=["keep_paperclip", "keep_external", "merge_manual", "unlink", "dismiss"])
    mergedValue = MergedValueField(required=False)
    idempotencyKey = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    expectedStatus = serializers.ChoiceField(choices=["open", "resolved", "dismissed"], required=False,
                                             default="open")


class OutboundEffectSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    linkId = serializers.UUIDField(source="link_id")
    kind = serializers.CharField()
    sourceId = serializers.CharField(source="source_id")
    status = serializers.CharField()
    payload = serializers.JSONField()
    attempts = serializers.IntegerField()
    nextAttemptAt = serializers.DateTimeField(source="next_attempt_at", allow_null=True)
    externalRef = serializers.CharField(source="external_ref")
    errorMessage = serializers.CharField(source="error_message")
    errorCategory = serializers.CharField(source="error_category")
    lastAttemptAt = serializers.DateTimeField(source="last_attempt_at", allow_null=True)
    parkedAt = serializers.DateTimeField(source="parked_at", allow_null=True)
    createdAt = serializers.DateTimeField(source="created_at")
    doneAt = serializers.DateTimeField(source="done_at", allow_null=True)
