"""What an agent may do beyond its own work: upstream's two permission flags and the ``tasks:assign``
rule (paperclip-api.md §2.4, §5.2). A low module (no service imports): agents, issue create and
issue update read it.

Board users with a write role may assign (an operator runs the company's work); viewers never write.
An agent names or changes an assignee only with ``canAssignTasks``, ``canCreateAgents`` or the CEO
role, as upstream's ``assertCanAssignTasks``; else 403 ``Missing permission: tasks:assign``."""
from __future__ import annotations

from issues.choices import AgentRole
from issues.exceptions import Forbidden

PERMISSION_KEYS = ("canCreateAgents", "canAssignTasks")
MISSING_ASSIGN = "Missing permission: tasks:assign"


def agent_permissions(agent) -> dict:
    """Upstream's permission flags, both always present. As upstream's ``normalizeAgentPermissions``:
    ``canCreateAgents`` not set is the role's default (a CEO creates agents; a set ``false`` stays);
    ``canAssignTasks`` not set is not granted."""
    granted = agent.permissions if isinstance(agent.permissions, dict) else {}
    flags = {key: granted.get(key) is True for key in PERMISSION_KEYS}
    if not isinstance(granted.get("canCreateAgents"), bool):
        flags["canCreateAgents"] = agent.role == AgentRole.CEO
    return flags


def may_assign_tasks(agent) -> bool:
    """The agent holds ``tasks:assign``: its grant, the create-agents permission, or the CEO role."""
    flags = agent_permissions(agent)
    return agent.role == AgentRole.CEO or flags["canAssignTasks"] or flags["canCreateAgents"]


def ensure_may_assign(actor, field: str) -> None:
    """An agent actor naming or changing an assignee (``field``, for the error's details) needs
    ``tasks:assign``; board users and the host pass (their write access is checked elsewhere)."""
    if actor.is_agent and not may_assign_tasks(actor.agent):
        raise Forbidden(MISSING_ASSIGN, code="missing_permission",
                        details={field: ["Naming an assignee needs tasks:assign: the canAssignTasks grant, "
                                         "canCreateAgents or the CEO role."]})
