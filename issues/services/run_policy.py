"""The run knobs one run works under, and where each value came from.

Precedence, highest first (README, "Run settings"):

1. the agent's ``runtime_config`` (per-agent operator setting, camelCase key),
2. the project's ``run_settings`` (and its explicit hook fields),
3. the front matter of the effective workflow document (project document, then the repository's
   ``WORKFLOW.md``, then connector defaults; issues.workflow),
4. the global default in ``settings.PAPERCLIP``.

Every consumer (dispatch, the process adapter's stall check, the stale sweep, continuations,
workspace hooks) asks this module, so the precedence lives in one place.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from django.conf import settings

# name -> (agent/project camelCase key, PAPERCLIP default key)
KNOBS = {
    "stall_timeout_seconds": ("stallTimeoutSeconds", "RUN_STALL_TIMEOUT_SECONDS"),
    "max_turns": ("maxContinuations", "RUN_MAX_CONTINUATIONS"),
    "max_retries": ("maxRetries", "RUN_MAX_RETRIES"),
    "max_concurrent_agents": ("maxConcurrentAgents", "RUN_MAX_CONCURRENT_AGENTS"),
    "heartbeat_interval_seconds": ("heartbeatIntervalSeconds", "RUN_HEARTBEAT_INTERVAL_SECONDS"),
    "heartbeat_stale_seconds": ("heartbeatStaleSeconds", "RUN_HEARTBEAT_STALE_SECONDS"),
    "timeout_seconds": ("timeoutSeconds", "RUN_TIMEOUT_SECONDS"),
}


@dataclass(frozen=True)
class RunPolicy:
    stall_timeout_seconds: int  # 0 disables stall detection
    max_turns: int  # automatic liveness continuations per run chain
    max_retries: int
    max_concurrent_agents: int  # running runs per project at once (0 = no project limit)
    heartbeat_interval_seconds: int
    heartbeat_stale_seconds: int
    timeout_seconds: int
    hooks: dict = field(default_factory=dict)  # after_create|before_run|after_run|before_remove -> command
    hook_timeout_seconds: int = 120
    sources: dict = field(default_factory=dict)  # knob name -> "agent" | "project" | "workflow" | "default"


def _int_value(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def run_policy_for(*, agent, issue=None, project=None) -> RunPolicy:
    """The policy for a run of ``agent`` on ``issue`` (or in ``project``)."""
    from issues.workspaces.service import DEFAULT_HOOK_TIMEOUT

    if project is None and issue is not None and issue.project_id:
        project = issue.project
    agent_cfg = (agent.runtime_config or {}) if agent is not None else {}
    project_cfg = (project.run_settings or {}) if project is not None else {}
    workflow_cfg: dict = {}  # filled in by the workflow document layer (issues.workflow)
    values, sources = {}, {}
    for name, (key, default_key) in KNOBS.items():
        for source, cfg in (("agent", agent_cfg), ("project", project_cfg), ("workflow", workflow_cfg)):
            value = _int_value(cfg.get(key))
            if value is not None:
                values[name], sources[name] = value, source
                break
        else:
            values[name], sources[name] = int(settings.PAPERCLIP[default_key]), "default"
    hooks = dict((project.workspace_hooks or {}) if project is not None else {})
    hook_timeout = (project.hook_timeout_seconds if project is not None else None) or DEFAULT_HOOK_TIMEOUT
    return RunPolicy(**values, hooks=hooks, hook_timeout_seconds=hook_timeout, sources=sources)
