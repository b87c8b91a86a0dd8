from django.db import models


class CompanyStatus(models.TextChoices):
    ACTIVE = "active"
    PAUSED = "paused"
    ARCHIVED = "archived"


class MemberRole(models.TextChoices):
    OWNER = "owner"
    ADMIN = "admin"
    OPERATOR = "operator"
    VIEWER = "viewer"


# Roles that may change things; viewers only read.
WRITE_ROLES = (MemberRole.OWNER, MemberRole.ADMIN, MemberRole.OPERATOR)


class AgentRole(models.TextChoices):
    CEO = "ceo"
    CTO = "cto"
    CMO = "cmo"
    CFO = "cfo"
    ENGINEER = "engineer"
    DESIGNER = "designer"
    PM = "pm"
    QA = "qa"
    DEVOPS = "devops"
    RESEARCHER = "researcher"
    GENERAL = "general"


class AgentStatus(models.TextChoices):
    ACTIVE = "active"
    IDLE = "idle"
    RUNNING = "running"
    PAUSED = "paused"
    ERROR = "error"
    PENDING_APPROVAL = "pending_approval"  # hired while the company requires board approval
    TERMINATED = "terminated"


# Agents that take no work: assigning or handing work to them is refused (upstream's 409s).
NO_WORK_AGENT_STATUSES = (AgentStatus.TERMINATED, AgentStatus.PENDING_APPROVAL)
# Agents whose runs never start (their wakes are skipped): the paused too.
NOT_RUNNABLE_AGENT_STATUSES = (AgentStatus.PAUSED, *NO_WORK_AGENT_STATUSES)


class AdapterType(models.TextChoices):
    PROCESS = "process"
    HTTP = "http"
    NONE = "none"
    RUNNER = "runner"  # a Paperclip Runner Protocol runner drives the run (issues.runner)
    PRP = "prp"  # the reference runner (prp_runner) drives the run, or one the operator attaches


# Runs that end with their runner's run.terminal and are stopped over the PRP command lane.
PROTOCOL_ADAPTER_TYPES = (AdapterType.RUNNER, AdapterType.PRP)


class IssueStatus(models.TextChoices):
    BACKLOG = "backlog"
    TODO = "todo"
    IN_PROGRESS = "in_progress"
    IN_REVIEW = "in_review"
    BLOCKED = "blocked"
    DONE = "done"
    CANCELLED = "cancelled"


TERMINAL_ISSUE_STATUSES = (IssueStatus.DONE, IssueStatus.CANCELLED)
# What a checkout may claim from (Heartbeat Protocol step 5).
CHECKOUT_FROM_STATUSES = (IssueStatus.TODO, IssueStatus.BACKLOG, IssueStatus.BLOCKED, IssueStatus.IN_REVIEW)


class IssuePriority(models.TextChoices):
    CRITICAL = "critical"
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"


PRIORITY_RANK = {IssuePriority.CRITICAL: 0, IssuePriority.HIGH: 1, IssuePriority.MEDIUM: 2, IssuePriority.LOW: 3}


class OriginKind(models.TextChoices):
    MANUAL = "manual"
    AGENT = "agent"
    CONNECTOR = "connector"
    CASE = "case"
    ROUTINE = "routine"


class RelationKind(models.TextChoices):
    BLOCKS = "blocks"


class AuthorType(models.TextChoices):
    USER = "user"
    AGENT = "agent"
    SYSTEM = "system"
    EXTERNAL = "external"


class DocumentFormat(models.TextChoices):
    MARKDOWN = "markdown"
    TEXT = "text"
    JSON = "json"


class WorkProductKind(models.TextChoices):
    PULL_REQUEST = "pull_request"
    BRANCH = "branch"
    ARTIFACT = "artifact"
    DOCUMENT = "document"


class InteractionKind(models.TextChoices):
    REQUEST_CONFIRMATION = "request_confirmation"
    ASK_QUESTION = "ask_question"
    CHOOSE_TASKS = "choose_tasks"
    RUNTIME_REQUEST = "runtime_request"  # a PRP runner's permission or question request


class InteractionStatus(models.TextChoices):
    PENDING = "pending"
    ACCEPTED = "accepted"
    REJECTED = "rejected"
    ANSWERED = "answered"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


class ApprovalType(models.TextChoices):
    HIRE_AGENT = "hire_agent"
    APPROVE_STRATEGY = "approve_ceo_strategy"
    BUDGET_OVERRIDE = "budget_override_required"
    REQUEST_BOARD_APPROVAL = "request_board_approval"
    GENERIC = "generic"


class ApprovalStatus(models.TextChoices):
    PENDING = "pending"
    REVISION_REQUESTED = "revision_requested"
    APPROVED = "approved"
    REJECTED = "rejected"
    CANCELLED = "cancelled"


class RunStatus(models.TextChoices):
    QUEUED = "queued"
    SCHEDULED_RETRY = "scheduled_retry"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    INTERRUPTED = "interrupted"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"


LIVE_RUN_STATUSES = (RunStatus.QUEUED, RunStatus.SCHEDULED_RETRY, RunStatus.RUNNING)
TERMINAL_RUN_STATUSES = (
    RunStatus.SUCCEEDED,
    RunStatus.INTERRUPTED,
    RunStatus.FAILED,
    RunStatus.CANCELLED,
    RunStatus.TIMED_OUT,
)


class WakeSource(models.TextChoices):
    TIMER = "timer"
    ASSIGNMENT = "assignment"
    ON_DEMAND = "on_demand"
    AUTOMATION = "automation"
    CONNECTOR = "connector"


class WakeStatus(models.TextChoices):
    QUEUED = "queued"
    DEFERRED_ISSUE_EXECUTION = "deferred_issue_execution"
    CLAIMED = "claimed"
    COALESCED = "coalesced"
    SKIPPED = "skipped"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class ActorType(models.TextChoices):
    USER = "user"
    AGENT = "agent"
    SYSTEM = "system"


class RunLiveness(models.TextChoices):
    COMPLETED = "completed"
    ADVANCED = "advanced"
    PLAN_ONLY = "plan_only"
    EMPTY_RESPONSE = "empty_response"
    BLOCKED = "blocked"
    FAILED = "failed"
    NEEDS_FOLLOWUP = "needs_followup"


# Only these may enqueue a liveness continuation (Heartbeat Protocol, run liveness).
CONTINUABLE_LIVENESS = (RunLiveness.PLAN_ONLY, RunLiveness.EMPTY_RESPONSE)


class RunResultStatus(models.TextChoices):
    """The worker's output contract (seed 003): how the agent says its run ended."""

    DONE = "done"
    HANDOFF = "handoff"
    FAILED = "failed"
    ABORTED = "aborted"


class RunEventKind(models.TextChoices):
    STDOUT = "stdout"
    STDERR = "stderr"
    SYSTEM = "system"
    USAGE = "usage"
    HEARTBEAT = "heartbeat"
    RUNNER = "runner"  # one PRP event (issues.runner): data names its source identity


class WorkspaceStrategy(models.TextChoices):
    SHARED = "shared_workspace"
    ISOLATED = "isolated_workspace"
    AGENT_DEFAULT = "agent_default"


class WorkspaceStatus(models.TextChoices):
    ACTIVE = "active"
    REMOVED = "removed"
    FAILED = "failed"


class RunnerCommandStatus(models.TextChoices):
    """A host -> runner command of the PRP command lane (issues.runner.commands)."""
    PENDING = "pending"  # stored, not yet fetched by the runner
    DELIVERED = "delivered"  # offered to the runner at least once
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    REJECTED = "rejected"  # the runner refused it (unsupported, invalid)
    EXPIRED = "expired"  # the host gave up waiting (a stop not confirmed in time)


RUNNER_COMMAND_OPEN = (RunnerCommandStatus.PENDING, RunnerCommandStatus.DELIVERED)
# What a runner may report as a command's result.
RUNNER_COMMAND_RESULTS = (RunnerCommandStatus.SUCCEEDED, RunnerCommandStatus.FAILED, RunnerCommandStatus.REJECTED)
