"""Goals, projects, costs, budgets, companies, dashboard and activity shapes, named as upstream
Paperclip names them (``paperclip-api.md`` §5.4-§5.9). Input serializers reject unknown fields."""
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from issues.choices import WorkspaceStrategy
from issues.cost_reports import SPEND_WINDOWS
from issues.services import projects as project_services
from issues.services.costs import BILLING_TYPES, COMPANY_STATUSES
from issues.services.goals import GOAL_LEVELS, GOAL_STATUSES, TITLE_MAX
from issues.services.projects import NAME_MAX, PROJECT_STATUSES, REF_MAX, REPOSITORY_MAX, TEMPLATE_MAX

from .serializers import IdField, StrictSerializer

BUDGET_MAX = 2**63 - 1  # the budget columns are 64-bit
# Per reported event: far above any real spend, and low enough that the reports' sums stay
# inside 64-bit integers on every database.
COST_CENTS_MAX, TOKENS_MAX = 10**12, 10**15
DOCUMENT_MAX = 200_000
LEGACY_PROJECT_STATUSES = {"active": "in_progress"}



# --- goals --------------------------------------------------------------------------------------------
class GoalSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    companyId = serializers.UUIDField(source="company_id")
    title = serializers.CharField()
    description = serializers.SerializerMethodField()
    level = serializers.CharField(help_text=f"One of {', '.join(GOAL_LEVELS)} (older rows may hold other values).")
    status = serializers.CharField(help_text=f"One of {', '.join(GOAL_STATUSES)} (older rows may hold other values).")
    parentId = serializers.UUIDField(source="parent_id", allow_null=True)
    ownerAgentId = serializers.UUIDField(source="owner_agent_id", allow_null=True)
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")

    def get_description(self, goal) -> str | None:
        return goal.description or None  # upstream: null when empty


class GoalWriteSerializer(StrictSerializer):
    """POST (``title`` required, defaults applied) and PATCH (partial: what is given)."""

    title = serializers.CharField(max_length=TITLE_MAX)
    description = serializers.CharField(required=False, allow_blank=True, allow_null=True)
    level = serializers.ChoiceField(choices=GOAL_LEVELS, default="task")
    status = serializers.ChoiceField(choices=GOAL_STATUSES, default="planned")
    parentId = IdField(required=False, allow_null=True)
    ownerAgentId = IdField(required=False, allow_null=True)


# --- projects -------------------------------------------------------------------------------------------
class ProjectWorkspaceSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    projectId = serializers.UUIDField()
    name = serializers.CharField()
    cwd = serializers.CharField(allow_null=True)
    repoUrl = serializers.CharField(allow_null=True)
    repoRef = serializers.CharField(allow_null=True)
    isPrimary = serializers.BooleanField()


class WorkspaceStrategyOutSerializer(serializers.Serializer):
    type = serializers.ChoiceField(choices=list(project_services.STRATEGY_TYPES))
    baseRef = serializers.CharField(allow_null=True)
    branchTemplate = serializers.CharField(allow_null=True)


class ExecutionWorkspacePolicyOutSerializer(serializers.Serializer):
    enabled = serializers.BooleanField()
    defaultMode = serializers.ChoiceField(choices=list(project_services.MODES))
    workspaceStrategy = WorkspaceStrategyOutSerializer()


class ProjectSerializer(serializers.Serializer):
    """Upstream's project, with this project's own workspace fields beside it. ``goalId`` is the
    first of ``goalIds`` (upstream keeps it for older clients); pausing and archiving have no
    equivalent here (null)."""

    id = serializers.UUIDField()
    companyId = serializers.UUIDField(source="company_id")
    name = serializers.CharField()
    description = serializers.SerializerMethodField()
    status = serializers.SerializerMethodField()
    goalId = serializers.SerializerMethodField()
    goalIds = serializers.SerializerMethodField()
    leadAgentId = serializers.SerializerMethodField()
    targetDate = serializers.SerializerMethodField()
    color = serializers.SerializerMethodField()
    icon = serializers.SerializerMethodField()
    pausedAt = serializers.SerializerMethodField()
    archivedAt = serializers.SerializerMethodField()
    executionWorkspacePolicy = serializers.SerializerMethodField()
    workspaces = serializers.SerializerMethodField()
    primaryWorkspace = serializers.SerializerMethodField()
    workspaceStrategy = serializers.CharField(source="workspace_strategy")
    repository = serializers.SerializerMethodField()
    baseRef = serializers.CharField(source="base_ref")
    branchTemplate = serializers.CharField(source="branch_template")
    workflowDocument = serializers.CharField(source="workflow_document")
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")

    def get_description(self, project) -> str | None:
        return project.description or None

    @extend_schema_field({"type": "string", "description": f"One of {', '.join(PROJECT_STATUSES)}."})
    def get_status(self, project):
        # Rows written before the upstream enum hold "active" (the old default): upstream's in_progress.
        return LEGACY_PROJECT_STATUSES.get(project.status, project.status)

    def get_goalId(self, project) -> str | None:
        ids = self.get_goalIds(project)
        return ids[0] if ids else None

    def get_goalIds(self, project) -> list[str]:
        # Sorted in Python: the selectors prefetch the goals, and an order_by would query again.
        return [str(g.pk) for g in sorted(project.goals.all(), key=lambda g: (g.created_at, str(g.pk)))]

    def get_leadAgentId(self, project) -> str | None:
        return str(project.lead_agent_id) if project.lead_agent_id else None

    @extend_schema_field({"type": "string", "format": "date", "nullable": True})
    def get_targetDate(self, project):
        return project.target_date.isoformat() if project.target_date else None

    def get_color(self, project) -> str | None:
        return project.color or None

    def get_icon(self, project) -> str | None:
        return project.icon or None

    def get_pausedAt(self, project) -> str | None:
        return None

    def get_archivedAt(self, project) -> str | None:
        return None

    @extend_schema_field(ExecutionWorkspacePolicyOutSerializer)
    def get_executionWorkspacePolicy(self, project):
        return project_services.execution_workspace_policy(project)

    @extend_schema_field(ProjectWorkspaceSerializer(many=True))
    def get_workspaces(self, project):
        primary = project_services.primary_workspace(project)
        return [primary] if primary else []

    @extend_schema_field(ProjectWorkspaceSerializer(allow_null=True))
    def get_primaryWorkspace(self, project):
        return project_services.primary_workspace(project)

    def get_repository(self, project) -> str:
        return project_services.redact_url(project.repository or "")


class WorkspaceInputSerializer(StrictSerializer):
    """Upstream's project workspace: ``cwd`` (a server folder: staff only) or ``repoUrl``, and ``repoRef``."""

    cwd = serializers.CharField(required=False, allow_blank=True, allow_null=True, max_length=REPOSITORY_MAX)
    repoUrl = serializers.CharField(required=False, allow_blank=True, allow_null=True, max_length=REPOSITORY_MAX)
    repoRef = serializers.CharField(required=False, allow_blank=True, allow_null=True, max_length=REF_MAX)
    name = serializers.CharField(required=False, allow_blank=True, allow_null=True, max_length=200,
                                 help_text="Accepted; the workspace is named after the project.")
    isPrimary = serializers.BooleanField(required=False, help_text="Accepted; a project has one workspace here.")
    sourceType = serializers.ChoiceField(choices=["local_path", "git_repo"], required=False)

    def validate(self, attrs):
        if not (attrs.get("cwd") or "").strip() and not (attrs.get("repoUrl") or "").strip():
            raise serializers.ValidationError({"cwd": ["Workspace requires at least one of cwd or repoUrl."]})
        return attrs


class WorkspaceStrategyInputSerializer(serializers.Serializer):
    """Unknown keys are ignored here (upstream's policy has many this model does not store)."""

    type = serializers.ChoiceField(choices=[*project_services.STRATEGY_TYPES, "cloud_sandbox"], required=False,
                                   allow_null=True)
    baseRef = serializers.CharField(required=False, allow_blank=True, allow_null=True, max_length=REF_MAX)
    branchTemplate = serializers.CharField(required=False, allow_blank=True, allow_null=True, max_length=TEMPLATE_MAX)


class ExecutionWorkspacePolicyInputSerializer(serializers.Serializer):
    """Mapped onto ``workspaceStrategy``, ``baseRef`` and ``branchTemplate`` (see the services'
    module doc); its other keys (issue overrides, runtime services, git policies) are not stored."""

    enabled = serializers.BooleanField()
    defaultMode = serializers.ChoiceField(choices=[*project_services.MODES, "operator_branch"], required=False,
                                          allow_null=True)
    workspaceStrategy = WorkspaceStrategyInputSerializer(required=False, allow_null=True)


class ProjectWriteSerializer(StrictSerializer):
    """POST (``name`` required) and PATCH (partial: what is given)."""

    name = serializers.CharField(max_length=NAME_MAX)
    description = serializers.CharField(required=False, allow_blank=True, allow_null=True)
    status = serializers.ChoiceField(choices=PROJECT_STATUSES, required=False)
    workspace = WorkspaceInputSerializer(required=False)
    executionWorkspacePolicy = ExecutionWorkspacePolicyInputSerializer(required=False)
    workspaceStrategy = serializers.ChoiceField(choices=WorkspaceStrategy.choices, required=False)
    repository = serializers.CharField(required=False, allow_blank=True, max_length=REPOSITORY_MAX,
                                       help_text="An https URL; a server folder or ssh/file URL is set by staff only.")
    baseRef = serializers.CharField(required=False, allow_blank=True, max_length=REF_MAX)
    branchTemplate = serializers.CharField(required=False, max_length=TEMPLATE_MAX,
                                           help_text="Placeholders {identifier}, {key}, {number}, {issue_id}.")
    workflowDocument = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False,
                                             max_length=DOCUMENT_MAX)
    goalIds = serializers.ListField(child=IdField(), required=False, allow_null=True, max_length=50,
                                    help_text="Goals of this company the project serves (replaces the set).")
    goalId = IdField(required=False, allow_null=True, help_text="Deprecated upstream: one goal; goalIds wins.")
    leadAgentId = IdField(required=False, allow_null=True, help_text="An agent of this company, or null.")
    targetDate = serializers.DateField(required=False, allow_null=True, input_formats=["iso-8601", "%Y-%m-%dT%H:%M:%S%z",
                                                                                      "%Y-%m-%dT%H:%M:%S.%f%z"],
                                       help_text="A date (YYYY-MM-DD); a full timestamp is taken as its date.")
    color = serializers.CharField(required=False, allow_null=True, allow_blank=True, max_length=40)
    icon = serializers.CharField(required=False, allow_null=True, allow_blank=True, max_length=200)


# --- costs and budgets ----------------------------------------------------------------------------------
class CostEventSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    companyId = serializers.UUIDField(source="company_id")
    agentId = serializers.UUIDField(source="agent_id")
    issueId = serializers.UUIDField(source="issue_id", allow_null=True)
    projectId = serializers.UUIDField(source="project_id", allow_null=True)
    goalId = serializers.UUIDField(source="goal_id", allow_null=True)
    heartbeatRunId = serializers.UUIDField(source="run_id", allow_null=True)
    billingCode = serializers.SerializerMethodField()
    provider = serializers.CharField()
    biller = serializers.CharField()
    billingType = serializers.CharField(source="billing_type")
    model = serializers.CharField()
    inputTokens = serializers.IntegerField(source="input_tokens")
    cachedInputTokens = serializers.IntegerField(source="cached_input_tokens")
    outputTokens = serializers.IntegerField(source="output_tokens")
    costCents = serializers.IntegerField(source="cost_cents")
    costStatus = serializers.SerializerMethodField(
        help_text="Always `recorded`: every event counts as reported (no estimate / reconciliation states here).")
    occurredAt = serializers.DateTimeField(source="occurred_at")
    createdAt = serializers.DateTimeField(source="created_at")

    def get_costStatus(self, event) -> str:
        return "recorded"

    def get_billingCode(self, event) -> str | None:
        return event.billing_code or None


class CostEventCreateSerializer(StrictSerializer):
    agentId = IdField()
    issueId = IdField(required=False, allow_null=True)
    projectId = IdField(required=False, allow_null=True)
    goalId = IdField(required=False, allow_null=True)
    heartbeatRunId = IdField(required=False, allow_null=True)
    billingCode = serializers.CharField(required=False, allow_blank=True, allow_null=True, max_length=200)
    provider = serializers.CharField(max_length=100)
    biller = serializers.CharField(required=False, allow_blank=True, allow_null=True, max_length=100,
                                   help_text="Defaults to provider.")
    billingType = serializers.ChoiceField(choices=BILLING_TYPES, default="unknown")
    model = serializers.CharField(max_length=200)
    inputTokens = serializers.IntegerField(min_value=0, max_value=TOKENS_MAX, default=0)
    cachedInputTokens = serializers.IntegerField(min_value=0, max_value=TOKENS_MAX, default=0)
    outputTokens = serializers.IntegerField(min_value=0, max_value=TOKENS_MAX, default=0)
    costCents = serializers.IntegerField(min_value=0, max_value=COST_CENTS_MAX)
    occurredAt = serializers.DateTimeField(help_text="Required (upstream's validator requires it; its docs omit it).")


class CostSummarySerializer(serializers.Serializer):
    companyId = serializers.UUIDField()
    spendCents = serializers.IntegerField()
    budgetCents = serializers.IntegerField()
    utilizationPercent = serializers.FloatField()


class CostByAgentSerializer(serializers.Serializer):
    agentId = serializers.UUIDField()
    agentName = serializers.CharField()
    agentStatus = serializers.CharField()
    costCents = serializers.IntegerField()
    inputTokens = serializers.IntegerField()
    cachedInputTokens = serializers.IntegerField()
    outputTokens = serializers.IntegerField()
    apiRunCount = serializers.IntegerField()
    subscriptionRunCount = serializers.IntegerField()
    subscriptionCachedInputTokens = serializers.IntegerField()
    subscriptionInputTokens = serializers.IntegerField()
    subscriptionOutputTokens = serializers.IntegerField()


class CostByProjectSerializer(serializers.Serializer):
    projectId = serializers.UUIDField()
    projectName = serializers.CharField()
    costCents = serializers.IntegerField()
    inputTokens = serializers.IntegerField()
    cachedInputTokens = serializers.IntegerField()
    outputTokens = serializers.IntegerField()


class CostTotalsSerializer(serializers.Serializer):
    costCents = serializers.IntegerField()
    inputTokens = serializers.IntegerField()
    cachedInputTokens = serializers.IntegerField()
    outputTokens = serializers.IntegerField()


class CostRunSplitSerializer(CostTotalsSerializer):
    apiRunCount = serializers.IntegerField()
    subscriptionRunCount = serializers.IntegerField()
    subscriptionCachedInputTokens = serializers.IntegerField()
    subscriptionInputTokens = serializers.IntegerField()
    subscriptionOutputTokens = serializers.IntegerField()


class CostByProviderSerializer(CostRunSplitSerializer):
    provider = serializers.CharField()
    biller = serializers.CharField()
    billingType = serializers.CharField()
    model = serializers.CharField()


class CostByBillerSerializer(CostRunSplitSerializer):
    biller = serializers.CharField()
    providerCount = serializers.IntegerField()
    modelCount = serializers.IntegerField()


class CostByAgentModelSerializer(CostTotalsSerializer):
    agentId = serializers.UUIDField()
    agentName = serializers.CharField()
    provider = serializers.CharField()
    biller = serializers.CharField()
    billingType = serializers.CharField()
    model = serializers.CharField()


class CostWindowSpendSerializer(CostTotalsSerializer):
    provider = serializers.CharField()
    biller = serializers.CharField(help_text="The provider's biller in the window, or `mixed`.")
    window = serializers.ChoiceField(choices=[label for label, _hours in SPEND_WINDOWS])
    windowHours = serializers.IntegerField()


class BudgetSerializer(StrictSerializer):
    budgetMonthlyCents = serializers.IntegerField(min_value=0, max_value=BUDGET_MAX)


# --- companies -------------------------------------------------------------------------------------------
class CompanySerializer(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    description = serializers.SerializerMethodField()
    status = serializers.CharField()
    issuePrefix = serializers.CharField(source="issue_prefix")
    budgetMonthlyCents = serializers.IntegerField(source="budget_monthly_cents")
    spentMonthlyCents = serializers.IntegerField(source="spent_monthly_cents")
    requireBoardApprovalForNewAgents = serializers.BooleanField(source="require_board_approval_for_new_agents")
    brandColor = serializers.SerializerMethodField()
    logoAssetId = serializers.SerializerMethodField()
    logoUrl = serializers.SerializerMethodField()
    enableCases = serializers.BooleanField(source="enable_cases")
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")

    def get_description(self, company) -> str | None:
        return company.description or None

    def get_brandColor(self, company) -> str | None:
        return company.brand_color or None

    def get_logoAssetId(self, company) -> str | None:
        return str(company.logo_asset_id) if company.logo_asset_id else None

    def get_logoUrl(self, company) -> str | None:
        return company.logo_url


class CompanyCreateSerializer(StrictSerializer):
    name = serializers.CharField(max_length=200)
    description = serializers.CharField(required=False, allow_blank=True, allow_null=True)
    budgetMonthlyCents = serializers.IntegerField(min_value=0, max_value=BUDGET_MAX, required=False, default=0)
    issuePrefix = serializers.CharField(
        required=False, max_length=10,
        help_text="An addition: the identifier prefix (ACME for ACME-12). Omitted: derived from the name "
                  "(its first three letters, then a number if taken). It never changes afterwards.")


class CompanyPatchSerializer(StrictSerializer):
    name = serializers.CharField(max_length=200, required=False)
    description = serializers.CharField(required=False, allow_blank=True, allow_null=True)
    status = serializers.ChoiceField(choices=COMPANY_STATUSES, required=False)
    budgetMonthlyCents = serializers.IntegerField(min_value=0, max_value=BUDGET_MAX, required=False)
    requireBoardApprovalForNewAgents = serializers.BooleanField(
        required=False, help_text="Board users: hires (POST /companies/{id}/agent-hires) wait as pending_approval "
                                  "until their hire_agent approval is approved.")
    brandColor = serializers.CharField(required=False, allow_blank=True, allow_null=True, max_length=7,
                                       help_text="#RRGGBB; null or empty clears it.")
    logoAssetId = serializers.UUIDField(required=False, allow_null=True,
                                        help_text="An asset of this company (POST /companies/{id}/logo); null clears.")

    def to_internal_value(self, data):
        if isinstance(data, dict) and "issuePrefix" in data:
            raise serializers.ValidationError({"issuePrefix": ["The issue prefix cannot be changed (identifiers "
                                                               "are built from it)."]})
        return super().to_internal_value(data)


# --- dashboard and activity -------------------------------------------------------------------------------
class DashboardRecentIssueSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    identifier = serializers.CharField()
    title = serializers.CharField()
    status = serializers.CharField()
    priority = serializers.CharField()
    projectId = serializers.UUIDField(source="project_id", allow_null=True)
    parentId = serializers.UUIDField(source="parent_id", allow_null=True)
    assigneeAgentId = serializers.UUIDField(source="assignee_agent_id", allow_null=True)
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")
    lastActivityAt = serializers.DateTimeField(source="updated_at")


class DashboardRunDaySerializer(serializers.Serializer):
    date = serializers.DateField()
    succeeded = serializers.IntegerField()
    failed = serializers.IntegerField()
    other = serializers.IntegerField()
    total = serializers.IntegerField()


class DashboardIssueDaySerializer(serializers.Serializer):
    date = serializers.DateField()
    total = serializers.IntegerField()
    byPriority = serializers.DictField(child=serializers.IntegerField())
    byStatus = serializers.DictField(child=serializers.IntegerField())


class DashboardCostsSerializer(serializers.Serializer):
    monthSpendCents = serializers.IntegerField()
    monthBudgetCents = serializers.IntegerField()
    monthUtilizationPercent = serializers.FloatField()


class DashboardAgentsSerializer(serializers.Serializer):
    active = serializers.IntegerField()
    running = serializers.IntegerField()
    paused = serializers.IntegerField()
    error = serializers.IntegerField()


class DashboardTasksSerializer(serializers.Serializer):
    open = serializers.IntegerField()
    inProgress = serializers.IntegerField()
    blocked = serializers.IntegerField()
    done = serializers.IntegerField()


class DashboardBudgetsSerializer(serializers.Serializer):
    activeIncidents = serializers.IntegerField(help_text="Agents under their monthly budget stop.")
    pendingApprovals = serializers.IntegerField(help_text="Pending budget_override_required approvals.")
    pausedAgents = serializers.IntegerField(help_text="Agents under their monthly budget stop.")
    pausedProjects = serializers.IntegerField(help_text="Always 0: projects are not paused here.")


class DashboardAlertSerializer(serializers.Serializer):
    kind = serializers.CharField(help_text="e.g. connector.credentials_failed")
    severity = serializers.ChoiceField(choices=["error", "warning"])
    title = serializers.CharField()
    message = serializers.CharField()
    at = serializers.DateTimeField(allow_null=True)
    entityType = serializers.CharField()
    entityId = serializers.CharField()
    url = serializers.CharField(help_text="The console page to act on it.")


class DashboardSerializer(serializers.Serializer):
    companyId = serializers.UUIDField()
    agents = DashboardAgentsSerializer()
    tasks = DashboardTasksSerializer()
    costs = DashboardCostsSerializer()
    pendingApprovals = serializers.IntegerField()
    budgets = DashboardBudgetsSerializer()
    runActivity = DashboardRunDaySerializer(many=True)
    issueActivity = DashboardIssueDaySerializer(many=True)
    recentIssues = DashboardRecentIssueSerializer(many=True)
    alerts = DashboardAlertSerializer(many=True, help_text="Operator alerts (e.g. a connector whose credentials "
                                                           "failed), errors first. Not in upstream's shape.")


class ActivityEntrySerializer(serializers.Serializer):
    id = serializers.IntegerField()
    companyId = serializers.UUIDField(source="company_id")
    actorType = serializers.CharField(source="actor_type")
    actorId = serializers.SerializerMethodField()
    action = serializers.CharField()
    entityType = serializers.CharField(source="entity_type")
    entityId = serializers.CharField(source="entity_id")
    agentId = serializers.UUIDField(source="actor_agent_id", allow_null=True)
    runId = serializers.SerializerMethodField()
    details = serializers.JSONField()
    createdAt = serializers.DateTimeField(source="created_at")

    def get_actorId(self, row) -> str:
        if row.actor_agent_id:
            return str(row.actor_agent_id)
        return str(row.actor_user_id) if row.actor_user_id else "system"

    def get_runId(self, row) -> str | None:
        run_id = row.run_id or getattr(row, "client_run_id", None)
        return str(run_id) if run_id else None


class ActivityCreateSerializer(StrictSerializer):
    """Upstream's board-written activity row. The row records who really wrote it (this board
    user); a claimed ``actorType``/``actorId``/``agentId`` is kept in ``details.reportedActor``."""

    actorType = serializers.ChoiceField(choices=["agent", "user", "system"], default="system")
    actorId = serializers.CharField(max_length=200)
    action = serializers.CharField(max_length=64)
    entityType = serializers.CharField(max_length=32)
    entityId = serializers.CharField(max_length=64)
    agentId = IdField(required=False, allow_null=True)
    details = serializers.DictField(required=False, default=dict)
