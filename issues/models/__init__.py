from .activity import ActivityLog
from .agent import Agent, AgentApiKey
from .approval import Approval, ApprovalIssue
from .asset import Asset
from .attachment import Attachment
from .board_key import BoardApiKey
from .company import Company, Goal, Membership, Project
from .costs import ApprovalComment, CostEvent, Label
from .issue import Issue, IssueRelation
from .run import ExecutionWorkspace, HeartbeatRun, RunEvent, WakeupRequest
from .runner import RunnerCommand, RunnerEvent, RunnerSession, RunnerSource
from .thread import Comment, Document, DocumentRevision, Interaction, WorkProduct
from .workflow import WorkflowDocumentCache

__all__ = [
    "ActivityLog",
    "Agent",
    "AgentApiKey",
    "Approval",
    "ApprovalComment",
    "ApprovalIssue",
    "Asset",
    "Attachment",
    "BoardApiKey",
    "Comment",
    "Company",
    "CostEvent",
    "Document",
    "DocumentRevision",
    "ExecutionWorkspace",
    "Goal",
    "HeartbeatRun",
    "Interaction",
    "Issue",
    "IssueRelation",
    "Label",
    "Membership",
    "Project",
    "RunEvent",
    "RunnerCommand",
    "RunnerEvent",
    "RunnerSession",
    "RunnerSource",
    "WakeupRequest",
    "WorkProduct",
    "WorkflowDocumentCache",
]
