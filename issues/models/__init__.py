from .activity import ActivityLog
from .agent import Agent, AgentApiKey
from .approval import Approval, ApprovalIssue
from .company import Company, Goal, Membership, Project
from .issue import Issue, IssueRelation
from .run import ExecutionWorkspace, HeartbeatRun, RunEvent, WakeupRequest
from .thread import Comment, Document, DocumentRevision, Interaction, WorkProduct
from .workflow import WorkflowDocumentCache

__all__ = [
    "ActivityLog",
    "Agent",
    "AgentApiKey",
    "Approval",
    "ApprovalIssue",
    "Comment",
    "Company",
    "Document",
    "DocumentRevision",
    "ExecutionWorkspace",
    "Goal",
    "HeartbeatRun",
    "Interaction",
    "Issue",
    "IssueRelation",
    "Membership",
    "Project",
    "RunEvent",
    "WakeupRequest",
    "WorkProduct",
    "WorkflowDocumentCache",
]
