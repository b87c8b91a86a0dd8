"""API shapes (camelCase, as in the Heartbeat Protocol). Input serializers reject unknown fields."""
import uuid

from rest_framework import serializers

from drf_spectacular.utils import extend_schema_field

from issues.adapters.result_line import FINAL_STATE_MAX, PR_URL_MAX, SUMMARY_MAX
from issues.choices import (
    CHECKOUT_FROM_STATUSES,
    DocumentFormat,
    InteractionKind,
    InteractionStatus,
    IssuePriority,
    IssueStatus,
    RunLiveness,
    RunResultStatus,
    WakeSource,
    WorkspaceStrategy,
)
from issues.filtersets import MAX_LIST_ITEMS


class StrictSerializer(serializers.Serializer):
    """Unknown fields are a 400 naming them, never silently ignored."""

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError({"non_field_errors": ["Expected a JSON object."]})
        unknown = set(data) - set(self.fields)
        if unknown:
            raise serializers.ValidationError({name: ["Unknown field."] for name in sorted(unknown)})
        return super().to_internal_value(data)


class IdField(serializers.UUIDField):
    """A UUID given as a JSON string; DRF's own field would also take an integer."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid", value=data)
        return super().to_internal_value(data)


class NullAsBlankField(serializers.CharField):
    """Upstream's nullable text (``string|null``) for a column that is never null: null is stored as ""."""

    def __init__(self, **kwargs):
        super().__init__(allow_null=True, allow_blank=True, **kwargs)

    def run_validation(self, data=serializers.empty):
        value = super().run_validation(data)
        return "" if value is None else value


@extend_schema_field({"type": "string", "nullable": True,
                      "description": "The agent's UUID or its URL key (upstream's shortname), in the issue's company."})
class AgentRefField(serializers.CharField):
    """An agent by UUID or URL key, given as a JSON string; the service resolves it in the company."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


@extend_schema_field({"type": "string", "enum": [str(s) for s in IssueStatus.values]})
class CheckoutStatusField(serializers.CharField):
    """Any issue status (upstream's enum; ``in_progress`` re-claims the agent's own issue after a
    crash). A short bounded string first, so a hostile value is refused without being echoed."""

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        if value not in IssueStatus.values:
            raise serializers.ValidationError(f"Not an issue status; use one of {', '.join(IssueStatus.values)}.")
        return value


class ErrorSerializer(serializers.Serializer):
    """Every error: upstream's top-level ``error`` string, with ``code`` and ``details`` beside it."""

    error = serializers.CharField(help_text="The human-readable message (upstream clients read this).")
    code = serializers.CharField(help_text="A stable machine-readable code, e.g. checkout_conflict.")
    details = serializers.DictField(help_text="Field errors (field -> messages) or context such as lock details.")


# --- output -------------------------------------------------------------------------------
class CompanyBriefSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    issuePrefix = serializers.CharField(source="issue_prefix")
    status = serializers.CharField()
    enableCases = serializers.BooleanField(source="enable_cases")


class AgentBriefSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    role = serializers.CharField()
    title = serializers.CharField()
    status = serializers.CharField()


class AgentSerializer(AgentBriefSerializer):
    companyId = serializers.UUIDField(source="company_id")
    reportsTo = serializers.UUIDField(source="reports_to_id", allow_null=True)
    capabilities = serializers.CharField()
    adapterType = serializers.CharField(source="adapter_type")
    runtimeConfig = serializers.JSONField(source="runtime_config")
    budgetMonthlyCents = serializers.IntegerField(source="budget_monthly_cents")
    spentMonthlyCents = serializers.IntegerField(source="spent_monthly_cents")
    pauseReason = serializers.CharField(source="pause_reason")
    lastHeartbeatAt = serializers.DateTimeField(source="last_heartbeat_at", allow_null=True)
    createdAt = serializers.DateTimeField(source="created_at")


# AgentMeSerializer lives in agent_serializers (the agent record of GET /agents/{id}, and its company).


class IssueRefSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    identifier = serializers.CharField()
    title = serializers.CharField()
    status = serializers.CharField()


class IssueSummarySerializer(IssueRefSerializer):
    """Upstream's blocker/blocked summary on the issue detail."""
    priority = serializers.CharField()
    assigneeAgentId = serializers.UUIDField(source="assignee_agent_id", allow_null=True)
    assigneeUserId = serializers.IntegerField(source="assignee_user_id", allow_null=True)


class LabelBriefSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    color = serializers.CharField()


class IssueSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    companyId = serializers.UUIDField(source="company_id")
    identifier = serializers.CharField()
    number = serializers.IntegerField()
    issueNumber = serializers.IntegerField(source="number", help_text="Upstream's name for number.")
    title = serializers.CharField()
    description = serializers.CharField()
    status = serializers.CharField()
    priority = serializers.CharField()
    projectId = serializers.UUIDField(source="project_id", allow_null=True)
    goalId = serializers.UUIDField(source="goal_id", allow_null=True)
    parentId = serializers.UUIDField(source="parent_id", allow_null=True)
    originIssueId = serializers.UUIDField(source="origin_issue_id", allow_null=True)
    originKind = serializers.CharField(source="origin_kind")
    originId = serializers.CharField(source="origin_id")
    originRunId = serializers.UUIDField(source="origin_run_id", allow_null=True)
    assigneeAgentId = serializers.UUIDField(source="assignee_agent_id", allow_null=True)
    assigneeUserId = serializers.IntegerField(source="assignee_user_id", allow_null=True)
    createdByAgentId = serializers.UUIDField(source="created_by_agent_id", allow_null=True)
    createdByUserId = serializers.IntegerField(source="created_by_user_id", allow_null=True)
    billingCode = serializers.SerializerMethodField()
    checkoutRunId = serializers.SerializerMethodField(
        help_text="The run holding the checkout: a host run, or a long-lived key's own client run id.")
    executionRunId = serializers.UUIDField(source="execution_run_id", allow_null=True)
    executionLockedAt = serializers.DateTimeField(source="execution_locked_at", allow_null=True)
    executionWorkspaceId = serializers.UUIDField(source="execution_workspace_id", allow_null=True)
    workspaceStrategy = serializers.CharField(source="workspace_strategy")
    startedAt = serializers.DateTimeField(source="started_at", allow_null=True)
    completedAt = serializers.DateTimeField(source="completed_at", allow_null=True)
    cancelledAt = serializers.DateTimeField(source="cancelled_at", allow_null=True)
    # Read from the prefetched labels when the selector loaded them (lists: one query for all rows).
    labelIds = serializers.PrimaryKeyRelatedField(source="labels", many=True, read_only=True,
                                                  pk_field=serializers.UUIDField())
    labels = LabelBriefSerializer(many=True, read_only=True)
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")

    def get_checkoutRunId(self, issue) -> uuid.UUID | None:
        return issue.checkout_run_id or issue.checkout_client_run_id

    def get_billingCode(self, issue) -> str | None:
        return issue.billing_code or None  # upstream: null when unset


class ProjectGoalBriefs(serializers.Serializer):
    """An issue's ``project`` ({id, name}) and ``goal`` ({id, title}), as upstream nests them."""
    project = serializers.SerializerMethodField()
    goal = serializers.SerializerMethodField()

    def get_project(self, issue) -> dict | None:
        return {"id": str(issue.project.pk), "name": issue.project.name} if issue.project_id else None

    def get_goal(self, issue) -> dict | None:
        return {"id": str(issue.goal.pk), "title": issue.goal.title} if issue.goal_id else None


class IssueAncestorSerializer(IssueSummarySerializer, ProjectGoalBriefs):
    """Upstream's ancestor entry: why the task exists (each ancestor's description, project and goal)."""
    description = serializers.CharField()
    projectId = serializers.UUIDField(source="project_id", allow_null=True)
    goalId = serializers.UUIDField(source="goal_id", allow_null=True)


class IssueDetailSerializer(IssueSerializer, ProjectGoalBriefs):
    ancestors = IssueAncestorSerializer(many=True)
    blockedBy = IssueSummarySerializer(many=True, source="blocked_by")
    blocks = IssueSummarySerializer(many=True)


class ForceReleaseLockSerializer(serializers.Serializer):
    checkoutRunId = serializers.UUIDField(allow_null=True)
    executionRunId = serializers.UUIDField(allow_null=True)


class ForceReleaseResultSerializer(serializers.Serializer):
    issue = IssueSerializer()
    previous = ForceReleaseLockSerializer(help_text="The lock the issue held.")


class ParentAdjustedSerializer(serializers.Serializer):
    requestedParentId = serializers.UUIDField(allow_null=True)
    parentId = serializers.UUIDField(allow_null=True)
    reason = serializers.ChoiceField(choices=["max_depth", "has_children"])


class IssueWriteResultSerializer(IssueSerializer):
    parentAdjusted = ParentAdjustedSerializer(required=False, allow_null=True)


class CommentSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    companyId = serializers.UUIDField(source="company_id")
    issueId = serializers.UUIDField(source="issue_id")
    authorType = serializers.CharField(source="author_type")
    authorAgentId = serializers.UUIDField(source="author_agent_id", allow_null=True)
    authorUserId = serializers.IntegerField(source="author_user_id", allow_null=True)
    runId = serializers.UUIDField(source="run_id", allow_null=True)
    body = serializers.CharField()
    provenance = serializers.JSONField()
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")


class RevisionSerializer(serializers.Serializer):
    # Reverse-manager reads (document.revisions) cache ``document`` on each row: no extra query.
    id = serializers.UUIDField()
    documentId = serializers.UUIDField(source="document_id")
    issueId = serializers.UUIDField(source="document.issue_id")
    key = serializers.CharField(source="document.key")
    number = serializers.IntegerField()
    revisionNumber = serializers.IntegerField(source="number")
    title = serializers.CharField()
    format = serializers.CharField(source="document.format")
    body = serializers.CharField()
    # Upstream's optional note per revision: null when the writer gave none.
    changeSummary = serializers.SerializerMethodField()
    authorType = serializers.CharField(source="author_type")
    authorAgentId = serializers.UUIDField(source="author_agent_id", allow_null=True)
    authorUserId = serializers.IntegerField(source="author_user_id", allow_null=True)
    runId = serializers.UUIDField(source="run_id", allow_null=True)
    createdAt = serializers.DateTimeField(source="created_at")

    @extend_schema_field({"type": "string", "nullable": True})
    def get_changeSummary(self, revision) -> str | None:
        return revision.change_summary or None


class DocumentSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    companyId = serializers.UUIDField(source="company_id")
    issueId = serializers.UUIDField(source="issue_id")
    key = serializers.CharField()
    title = serializers.CharField()
    format = serializers.CharField()
    body = serializers.CharField(source="latest_revision.body", default="")
    # Upstream names first; revisionId/revisionNumber stay for this product's own clients.
    latestRevisionId = serializers.UUIDField(source="latest_revision_id", allow_null=True)
    latestRevisionNumber = serializers.IntegerField(source="revision_count")
    revisionId = serializers.UUIDField(source="latest_revision_id", allow_null=True)
    revisionNumber = serializers.IntegerField(source="revision_count")
    # Withheld from agents' bounded case page reads: host-written, or quarantined by an operator.
    system = serializers.BooleanField()
    quarantinedAt = serializers.DateTimeField(source="quarantined_at", allow_null=True)
    quarantineReason = serializers.CharField(source="quarantine_reason")
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")


class InteractionSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    issueId = serializers.UUIDField(source="issue_id")
    kind = serializers.CharField()
    status = serializers.CharField()
    title = serializers.CharField()
    body = serializers.CharField()
    payload = serializers.JSONField()
    documentRevisionId = serializers.UUIDField(source="document_revision_id", allow_null=True)
    createdByAgentId = serializers.UUIDField(source="created_by_agent_id", allow_null=True)
    runId = serializers.UUIDField(source="run_id", allow_null=True)
    response = serializers.JSONField()
    respondedAt = serializers.DateTimeField(source="responded_at", allow_null=True)
    createdAt = serializers.DateTimeField(source="created_at")


class RunSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    companyId = serializers.UUIDField(source="company_id")
    agentId = serializers.UUIDField(source="agent_id")
    issueId = serializers.UUIDField(source="issue_id", allow_null=True)
    status = serializers.CharField()
    invocationSource = serializers.CharField(source="invocation_source")
    wakeReason = serializers.CharField(source="wake_reason")
    startedAt = serializers.DateTimeField(source="started_at", allow_null=True)
    finishedAt = serializers.DateTimeField(source="finished_at", allow_null=True)
    createdAt = serializers.DateTimeField(source="created_at")
    liveness = serializers.CharField()
    livenessReason = serializers.CharField(source="liveness_reason")
    continuationAttempt = serializers.IntegerField(source="continuation_attempt")
    retryAttempt = serializers.IntegerField(source="retry_attempt")
    sourceRunId = serializers.UUIDField(source="source_run_id", allow_null=True)
    scheduledFor = serializers.DateTimeField(source="scheduled_for", allow_null=True)
    lastHeartbeatAt = serializers.DateTimeField(source="last_heartbeat_at", allow_null=True)
    lastActivityAt = serializers.DateTimeField(source="last_activity_at", allow_null=True)
    exitCode = serializers.IntegerField(source="exit_code", allow_null=True)
    error = serializers.CharField()
    stopRequested = serializers.SerializerMethodField()
    stopReason = serializers.CharField(source="stop_reason")
    usage = serializers.SerializerMethodField()
    workspaceId = serializers.UUIDField(source="workspace_id", allow_null=True)
    context = serializers.JSONField()
    result = serializers.SerializerMethodField()

    def get_result(self, run) -> dict | None:
        """The worker's output contract (seed 003), when the agent reported one."""
        if not run.result_status:
            return None
        return {"status": run.result_status, "finalState": run.result_final_state or None,
                "prUrl": run.result_pr_url or None, "summary": run.result_summary}

    def get_stopRequested(self, run) -> bool:
        return run.stop_requested_at is not None

    def get_usage(self, run) -> dict:
        return {"inputTokens": run.input_tokens, "outputTokens": run.output_tokens, "costCents": run.cost_cents}


class RunDetailSerializer(RunSerializer):
    """``GET /api/runs/{id}``: the run, plus ``runner`` for a run a PRP runner drives (else null)."""

    runner = serializers.SerializerMethodField()

    def get_runner(self, run) -> dict | None:
        """The PRP session's projections: proposed result, terminal, the host's decision, usage,
        session goal, credential revisions (never a secret) and activity counts."""
        from issues.models import RunnerSession
        from issues.runner.projections import runner_state

        session = RunnerSession.objects.filter(pk=run.pk).first()
        return runner_state(session) if session is not None else None


class RunEventSerializer(serializers.Serializer):
    seq = serializers.IntegerField()
    kind = serializers.CharField()
    message = serializers.CharField()
    data = serializers.JSONField()
    createdAt = serializers.DateTimeField(source="created_at")


class WakeupResultSerializer(serializers.Serializer):
    wakeupRequestId = serializers.UUIDField(source="id")
    status = serializers.CharField()
    skipReason = serializers.CharField(source="skip_reason")
    runId = serializers.UUIDField(source="run_id", allow_null=True)
    coalesced = serializers.SerializerMethodField()
    run = RunSerializer(allow_null=True)

    def get_coalesced(self, wake) -> bool:
        return wake.status == "coalesced"


# --- input --------------------------------------------------------------------------------
class IssueCreateSerializer(StrictSerializer):
    title = serializers.CharField(max_length=500)
    description = NullAsBlankField(required=False, default="")
    status = serializers.ChoiceField(choices=IssueStatus.choices, required=False,
                                     help_text="Omitted: todo with an assignee, else backlog (upstream).")
    priority = serializers.ChoiceField(choices=IssuePriority.choices, default=IssuePriority.MEDIUM)
    parentId = IdField(required=False, allow_null=True)
    projectId = IdField(required=False, allow_null=True)
    goalId = IdField(required=False, allow_null=True)
    assigneeAgentId = IdField(required=False, allow_null=True)
    assigneeUserId = serializers.IntegerField(required=False, allow_null=True,
                                              help_text="A member of the company (one assignee: agent or user).")
    billingCode = NullAsBlankField(required=False, default="", max_length=200)
    blockParentUntilDone = serializers.BooleanField(required=False, default=False)
    executionWorkspaceId = IdField(required=False, allow_null=True)
    workspaceStrategy = serializers.ChoiceField(choices=WorkspaceStrategy.choices, required=False)
    inheritExecutionWorkspaceFromIssueId = IdField(required=False, allow_null=True)
    labelIds = serializers.ListField(child=IdField(), required=False, max_length=MAX_LIST_ITEMS,
                                     help_text="Labels of this company (another id is a 404 naming labelIds).")
    blockedByIssueIds = serializers.ListField(
        child=IdField(), required=False, max_length=MAX_LIST_ITEMS,
        help_text="Issues of this company that block the new one (another or unknown id is a 422).")


class IssuePatchSerializer(StrictSerializer):
    title = serializers.CharField(max_length=500, required=False)
    description = NullAsBlankField(required=False)
    status = serializers.ChoiceField(choices=IssueStatus.choices, required=False)
    priority = serializers.ChoiceField(choices=IssuePriority.choices, required=False)
    parentId = IdField(required=False, allow_null=True)
    projectId = IdField(required=False, allow_null=True)
    goalId = IdField(required=False, allow_null=True)
    assigneeAgentId = AgentRefField(required=False, allow_null=True, max_length=200)
    assigneeUserId = serializers.IntegerField(required=False, allow_null=True,
                                              help_text="A member of the company; replaces an agent assignee.")
    billingCode = NullAsBlankField(required=False, max_length=200)
    labelIds = serializers.ListField(child=IdField(), required=False, max_length=MAX_LIST_ITEMS,
                                     help_text="Replaces the issue's labels; [] clears them.")
    blockedByIssueIds = serializers.ListField(
        child=IdField(), required=False, max_length=MAX_LIST_ITEMS,
        help_text="Replaces the issue's blockers; [] clears them. Same company, not itself, no cycles (422).")
    comment = serializers.CharField(required=False, allow_blank=False, trim_whitespace=False)
    reopen = serializers.BooleanField(required=False, default=False,
                                      help_text="With comment: a done or cancelled issue goes back to todo.")
    interrupt = serializers.BooleanField(required=False, default=False,
                                         help_text="With comment, board only: stops the issue's live run first.")
    attachmentIds = serializers.ListField(
        child=IdField(), required=False, max_length=MAX_LIST_ITEMS,
        help_text="With comment: attachments of this issue that belong to it (another id is a 404 naming the field).")


class CheckoutSerializer(StrictSerializer):
    # Both optional for an agent: itself, and the default statuses (CHECKOUT_FROM_STATUSES); a
    # board user must name the agent (400 naming agentId).
    agentId = IdField(required=False, help_text="The agent to check out for; an agent may omit it (itself).")
    # Bounded: a status is a short word and there are only a handful of them.
    expectedStatuses = serializers.ListField(
        child=CheckoutStatusField(max_length=32), allow_empty=False, min_length=1, max_length=MAX_LIST_ITEMS,
        required=False, help_text="Statuses the issue may be claimed from; default: "
                                  + ", ".join(CHECKOUT_FROM_STATUSES) + ".")


class CommentCreateSerializer(StrictSerializer):
    body = serializers.CharField(trim_whitespace=False, help_text="Markdown, stored as sent (indentation kept).")
    reopen = serializers.BooleanField(required=False, default=False,
                                      help_text="A done or cancelled issue goes back to todo; the assignee wakes.")
    interrupt = serializers.BooleanField(required=False, default=False,
                                         help_text="Board only: stops the issue's live run before the comment "
                                                   "starts the next one.")
    attachmentIds = serializers.ListField(
        child=IdField(), required=False, max_length=MAX_LIST_ITEMS,
        help_text="Attachments of this issue that belong to the comment (another id is a 404 naming the field).")


class DocumentWriteSerializer(StrictSerializer):
    body = serializers.CharField(allow_blank=True, trim_whitespace=False)  # stored verbatim
    title = serializers.CharField(required=False, allow_blank=True, max_length=300)
    format = serializers.ChoiceField(choices=DocumentFormat.choices, required=False)
    baseRevisionId = IdField(required=False, allow_null=True)


class IssueDocumentWriteSerializer(DocumentWriteSerializer):
    """Upstream's issue-document PUT body: ``title`` may be null (no title), plus ``changeSummary``."""

    title = NullAsBlankField(required=False, max_length=300)
    changeSummary = NullAsBlankField(required=False, max_length=500,
                                     help_text="What this revision changed; shown on the revision.")


class InteractionCreateSerializer(StrictSerializer):
    kind = serializers.ChoiceField(choices=InteractionKind.choices)
    title = serializers.CharField(max_length=300)
    body = serializers.CharField(required=False, allow_blank=True, default="")
    payload = serializers.DictField(required=False, default=dict)
    documentKey = serializers.CharField(required=False)
    documentRevisionId = IdField(required=False)


# What a response may set (which of them an interaction takes depends on its kind: the service).
RESPONSE_STATUSES = (InteractionStatus.ACCEPTED, InteractionStatus.REJECTED, InteractionStatus.ANSWERED,
                     InteractionStatus.CANCELLED)


class InteractionRespondSerializer(StrictSerializer):
    status = serializers.ChoiceField(choices=[(s.value, s.label) for s in RESPONSE_STATUSES])
    response = serializers.DictField(required=False, default=dict)


class WakeupSerializer(StrictSerializer):
    source = serializers.ChoiceField(choices=WakeSource.choices, default=WakeSource.ON_DEMAND)
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=300)
    issueId = IdField(required=False, allow_null=True)
    idempotencyKey = serializers.CharField(required=False, max_length=200)
    commentIds = serializers.ListField(child=IdField(), required=False, default=list, max_length=MAX_LIST_ITEMS)
    # Upstream's wakeAgentSchema (ref §5.1); kept in the wake's context (wakeups.agent_wakeup_request).
    triggerDetail = serializers.ChoiceField(choices=["manual", "ping", "callback", "system"], required=False)
    payload = serializers.DictField(required=False, allow_null=True)
    forceFreshSession = serializers.BooleanField(required=False, default=False)


class BlockerSerializer(StrictSerializer):
    blockerId = IdField()


# Usage totals are stored in 64-bit columns (and added to 64-bit spend, which saturates).
USAGE_MAX = 2**63 - 1


class UsageSerializer(StrictSerializer):
    inputTokens = serializers.IntegerField(min_value=0, max_value=USAGE_MAX, required=False, default=0)
    outputTokens = serializers.IntegerField(min_value=0, max_value=USAGE_MAX, required=False, default=0)
    costCents = serializers.IntegerField(min_value=0, max_value=USAGE_MAX, required=False, default=0)


RESULT_FIELDS = ("status", "finalState", "prUrl", "summary")


class RunHeartbeatSerializer(StrictSerializer):
    """A heartbeat; with ``final: true`` also the run's result (the output contract), which ends
    the run. The result fields are refused on a heartbeat that is not final."""

    liveness = serializers.ChoiceField(choices=RunLiveness.choices, required=False)
    livenessReason = serializers.CharField(required=False, allow_blank=True, default="", max_length=300)
    usage = UsageSerializer(required=False)
    final = serializers.BooleanField(required=False, default=False,
                                     help_text="The run's last heartbeat: records the result and ends the run.")
    status = serializers.ChoiceField(choices=RunResultStatus.choices, required=False,
                                     help_text="How the run ended (required when final).")
    finalState = serializers.CharField(required=False, allow_blank=True, default="", max_length=FINAL_STATE_MAX,
                                       help_text="The issue state the agent left it in, or 'unchanged'.")
    prUrl = serializers.URLField(required=False, allow_blank=True, default="", max_length=PR_URL_MAX,
                                 help_text="An http(s) URL of the pull request the run opened.")
    summary = serializers.CharField(required=False, allow_blank=True, default="", max_length=SUMMARY_MAX)

    def validate_prUrl(self, value):
        if value and not value.lower().startswith(("http://", "https://")):
            raise serializers.ValidationError("Enter an http(s) URL.")
        return value

    def validate(self, data):
        if data["final"] and not data.get("status"):
            raise serializers.ValidationError({"status": ["Required when final is true."]})
        if not data["final"]:
            given = [name for name in RESULT_FIELDS if name in self.initial_data]
            if given:
                raise serializers.ValidationError(
                    {name: ["Only a final heartbeat (final: true) reports the result."] for name in given})
        return data
