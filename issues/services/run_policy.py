"""The run knobs one run works under, and where each value came from.

Precedence, highest first (README, "Run settings"):

1. the agent's ``runtime_config`` (per-agent operator setting, camelCase key),
2. the project's ``run_settings`` (and its explicit hook fields),
3. the front matter of the effective workflow document (project document, then the repository's
   ``WORKFLOW.md``, then connector defaults; issues.workflow),
4. the global default in ``settings.PAPERCLIP``.

The workflow layer (``issues.workflow.settings``): milliseconds become seconds rounded up, a stall
timeout of 0 or less turns stall detection off. Hooks go per hook: a name set in the project's
``workspace_hooks`` (even to "", which turns it off) beats the document's ``hooks.<name>``; the hook
timeout is ``project.hook_timeout_seconds``, else ``hooks.timeout_ms``, else ``DEFAULT_HOOK_TIMEOUT``.
``sources`` names the layer of each knob, ``hooks.<name>`` and ``hook_timeout_seconds``.

Hooks are commands on this server (issues.services.host_commands): a document's hooks apply only from
the project's own document (staff-set) or a repository only staff can set; an https repository's
(unless ``TRUST_REPOSITORY_HOOKS``) and a connector's ``workflowDefaults``' are left out and named in
``hooks_ignored`` (hook name -> why), which the workspace writes to the run's log.

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
    hooks_ignored: dict = field(default_factory=dict)  # hook name -> why the document's command does not run


def _int_value(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _camel_knobs(cfg: dict) -> dict:
    """An agent's or project's camelCase settings as knob values (a wrong type is ignored here; the
    admin and the API validate them)."""
    values = {}
    for name, (key, _default) in KNOBS.items():
        value = _int_value(cfg.get(key)) if isinstance(cfg, dict) else None
        if value is not None:
            values[name] = value
    return values


def run_policy_for(*, agent, issue=None, project=None) -> RunPolicy:
    """The policy for a run of ``agent`` on ``issue`` (or in ``project``)."""
    return run_policy_and_document(agent=agent, issue=issue, project=project)[0]


def run_policy_and_document(*, agent, issue=None, project=None):
    """:func:`run_policy_for` and the effective workflow document it used (for display)."""
    from issues.workflow.effective import effective_document
    from issues.workflow.settings import HOOK_NAMES, workflow_knobs
    from issues.workspaces.service import DEFAULT_HOOK_TIMEOUT

    if project is None and issue is not None and issue.project_id:
        project = issue.project
    document = effective_document(issue=issue, project=project)
    workflow = workflow_knobs(document.config)
    layers = (("agent", _camel_knobs((agent.runtime_config or {}) if agent is not None else {})),
              ("project", _camel_knobs((project.run_settings or {}) if project is not None else {})),
              ("workflow", workflow.values))
    values, sources = {}, {}
    for name, (_key, default_key) in KNOBS.items():
        for source, layer in layers:
            if name in layer:
                values[name], sources[name] = layer[name], source
                break
        else:
            values[name], sources[name] = int(settings.PAPERCLIP[default_key]), "default"
    # Hooks, per hook: a key the project sets (even to "", which turns the hook off) beats the document.
    project_hooks = (project.workspace_hooks or {}) if project is not None else {}
    project_hooks = project_hooks if isinstance(project_hooks, dict) else {}
    hooks, ignored = {}, {}
    untrusted = _untrusted_hooks_reason(document.source, project)
    for name in HOOK_NAMES:
        if name in project_hooks:
            hooks[name], sources[f"hooks.{name}"] = project_hooks[name], "project"
        elif name in workflow.hooks and untrusted:
            ignored[name] = untrusted
        elif name in workflow.hooks:
            hooks[name], sources[f"hooks.{name}"] = workflow.hooks[name], "workflow"
    if project is not None and project.hook_timeout_seconds:
        hook_timeout, sources["hook_timeout_seconds"] = project.hook_timeout_seconds, "project"
    elif workflow.hook_timeout_seconds:
        hook_timeout, sources["hook_timeout_seconds"] = workflow.hook_timeout_seconds, "workflow"
    else:
        hook_timeout, sources["hook_timeout_seconds"] = DEFAULT_HOOK_TIMEOUT, "default"
    policy = RunPolicy(**values, hooks=hooks, hook_timeout_seconds=hook_timeout, sources=sources,
                       hooks_ignored=ignored)
    return policy, document


def _untrusted_hooks_reason(source, project) -> str:
    """Why the effective document's hooks must not run here ("" when they may)."""
    from issues.services.host_commands import repository_hooks_trusted

    if source == "connector":
        return "the connector's workflowDefaults are a company admin's configuration, never commands on this server"
    if source == "repository" and not repository_hooks_trusted(project):
        return ("the repository is an https URL any board user may set (WORKFLOW.md hooks from it run only with "
                "PAPERCLIP_TRUST_REPOSITORY_HOOKS)")
    return ""
