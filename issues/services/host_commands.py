"""Commands on this server, and who may set them (README, "Trust boundary").

A workspace hook (``hooks.*`` in a workflow document's front matter, a project's ``workspace_hooks``)
and a local agent process (``command``, ``env`` and ``cwd`` of a ``process``, ``runner`` or locally
launched ``prp`` adapter) run as the server's own user: they can read what the server reads. So only
a staff user, or the host itself (management commands, the demo), sets or changes them. A company
admin keeps editing everything around them (a document's body and run knobs, an agent's other
settings) as long as the commands stay exactly as they are.

Hooks from a repository's ``WORKFLOW.md`` run only when the repository is one only staff set (a
folder on this server, a ``file://``/ssh URL): an ``https`` repository is any board user's choice,
so its hooks are ignored (the run's log says so) unless ``PAPERCLIP_TRUST_REPOSITORY_HOOKS`` is set
(a single-tenant server). Connector ``workflowDefaults`` are a company admin's configuration: their
hooks are refused when written and ignored when read.
"""
from __future__ import annotations

from django.conf import settings

from issues.actors import Actor
from issues.choices import AdapterType
from issues.exceptions import Forbidden
from issues.workflow.document import parse_front_matter, split
from issues.workflow.errors import PolicyInvalid
from issues.workflow.settings import HOOK_NAMES
from issues.workspaces import gitops

# adapter type -> the keys of its config that start something on this server
COMMAND_KEYS = {AdapterType.PROCESS: ("command", "env"), AdapterType.RUNNER: ("command", "env", "cwd"),
                AdapterType.PRP: ("harness", "command", "env", "cwd")}


def is_staff(actor: Actor) -> bool:
    return actor.is_board and bool(getattr(actor.user, "is_staff", False) or getattr(actor.user, "is_superuser", False))


def sets_commands(actor: Actor) -> bool:
    """Staff, or the host itself (SYSTEM: management commands, the demo seed)."""
    return actor.system or is_staff(actor)


# --- hooks --------------------------------------------------------------------------------------------
def document_hooks(text: str | None) -> dict:
    """The hook commands of a workflow document's front matter (``{}`` without any). Front matter that
    does not parse is ``{}``: such a version never applies (issues.workflow.cache keeps the last good one)."""
    try:
        config = parse_front_matter("\n".join(split(text or "")[0]))
    except PolicyInvalid:
        return {}
    hooks = config.get("hooks")
    if hooks is None:
        return {}
    if not isinstance(hooks, dict):  # an invalid version, but never let a shape slip past the comparison
        return {"hooks": hooks}
    return hooks_set(hooks)


def hooks_set(hooks: dict) -> dict:
    """The hooks of a ``hooks:`` mapping that name a command (name -> command)."""
    return {name: hooks[name] for name in HOOK_NAMES if hooks.get(name) not in (None, "", [])}


def hooks_check(actor: Actor, text: str, current: str | None, field: str) -> str:
    """``text`` if ``actor`` may store it: a non-staff user may write a document whose hooks are
    none or exactly the stored document's (a body edit keeps the hooks staff set)."""
    hooks = document_hooks(text)
    if not hooks or sets_commands(actor) or hooks == document_hooks(current):
        return text
    names = ", ".join(f"hooks.{name}" for name in hooks)
    raise Forbidden("Workspace hooks are shell commands on this server: a staff user sets or changes them.",
                    code="hooks_staff_only", details={field: [f"Only staff users set or change {names}."]})


def repository_hooks_trusted(project) -> bool:
    """A repository only staff can set (folder, ``file://``, ssh/scp); an http(s) one only with
    ``TRUST_REPOSITORY_HOOKS``."""
    if gitops.is_http_url(getattr(project, "repository", "") or ""):
        return bool(settings.PAPERCLIP.get("TRUST_REPOSITORY_HOOKS", False))
    return True


# --- local agent processes ----------------------------------------------------------------------------
def adapter_command(adapter_type: str, config) -> dict | None:
    """What an adapter config starts on this server (``None`` when nothing: http, none, an external or
    fake-harness prp runner without env)."""
    keys = COMMAND_KEYS.get(adapter_type)
    if not keys or not isinstance(config, dict):
        return None
    if adapter_type == AdapterType.PRP and config.get("launch") == "external":
        return None
    found = {key: config[key] for key in keys if config.get(key) not in (None, "", [], {})}
    if adapter_type == AdapterType.PRP and set(found) <= {"harness"} and found.get("harness") != "process":
        return None  # the bundled fake harness: a script name the adapter checks, nothing of the tenant's runs
    return {"adapterType": adapter_type, **found} if found else None


def adapter_command_check(actor: Actor, adapter_type: str, config, *, current_type: str | None = None,
                          current_config=None) -> None:
    """403 ``command_staff_only`` when a non-staff actor sets or changes what the agent starts on this
    server (an update that keeps the command, env and cwd as stored is fine)."""
    command = adapter_command(adapter_type, config)
    if command is None or sets_commands(actor) or command == adapter_command(current_type, current_config):
        return
    fields = [f"adapterConfig.{key}" for key in command if key not in ("adapterType", "harness")] or ["adapterConfig"]
    raise Forbidden("An agent process runs on this server: a staff user sets or changes its command, env and cwd.",
                    code="command_staff_only",
                    details={name: ["Only staff users set or change this for a local agent process."]
                             for name in fields})
