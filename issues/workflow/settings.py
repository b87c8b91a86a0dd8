"""The settings a WORKFLOW.md front matter may carry (Symphony's ``SPEC.md`` §5–6 and seed 003).

Three kinds of keys:

- **applied** by the host (through :mod:`issues.services.run_policy`): the hooks and their
  timeout, ``agent.max_concurrent_agents``, ``agent.max_turns`` (continuations),
  ``agent.stall_timeout_ms`` (Symphony's reference puts it under ``codex``; that spelling is read
  too, ``agent`` wins), ``agent.heartbeat_interval_ms`` and ``agent.heartbeat_stale_ms``;
- **recognised, not applied**: the rest of Symphony's keys (tracker, polling, workspace, the agent
  command and its timeouts, retry backoff …). Their types are still checked;
- **unknown**: kept in the stored front matter and shown, never fatal. ``tracker`` keys beyond
  Symphony's belong to the tracker adapter and count as recognised.

A ``null`` value means "not set" (Symphony drops nil values). A known key with a value of the wrong
type makes the whole document version invalid (``workflow_setting_invalid`` naming the key), so the
last good version stays in force.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .errors import PolicyInvalid

HOOK_NAMES = ("after_create", "before_run", "after_run", "before_remove")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_int(value):
    return None if _is_int(value) and value > 0 else "must be a positive integer"


def _integer(value):
    return None if _is_int(value) else "must be an integer (0 or less disables it)"


def _port(value):
    return None if _is_int(value) and value >= 0 else "must be an integer of 0 or more"


def _string(value):
    return None if isinstance(value, str) else "must be a string"


def _boolean(value):
    return None if isinstance(value, bool) else "must be true or false"


def _mapping(value):
    return None if isinstance(value, dict) else "must be a mapping"


def _string_or_mapping(value):
    return None if isinstance(value, str | dict) else "must be a string or a mapping"


def _strings(value):
    ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    return None if ok else "must be a list of strings"


def _command(value):
    ok = isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))
    return None if ok else "must be a shell command (a string or a list of strings)"


def _state_limits(value):
    ok = isinstance(value, dict) and all(str(k).strip() and _is_int(v) and v > 0 for k, v in value.items())
    return None if ok else "must map state names to positive integers"


# dotted key -> (type check, applied by the host)
KEYS: dict[str, tuple] = {
    **{f"hooks.{name}": (_command, True) for name in HOOK_NAMES},
    "hooks.timeout_ms": (_positive_int, True),
    "agent.max_concurrent_agents": (_positive_int, True),
    "agent.max_turns": (_positive_int, True),
    "agent.stall_timeout_ms": (_integer, True),
    "agent.heartbeat_interval_ms": (_positive_int, True),
    "agent.heartbeat_stale_ms": (_positive_int, True),
    "codex.stall_timeout_ms": (_integer, True),
    "agent.max_retry_backoff_ms": (_positive_int, False),  # the host's retry backoff is global
    "agent.max_concurrent_agents_by_state": (_state_limits, False),
    "agent.command": (_string, False),
    "agent.turn_timeout_ms": (_positive_int, False),
    "agent.read_timeout_ms": (_positive_int, False),
    "tracker.kind": (_string, False),
    "tracker.endpoint": (_string, False),
    "tracker.api_key": (_string, False),
    "tracker.project_slug": (_string, False),
    "tracker.assignee": (_string, False),
    "tracker.active_states": (_strings, False),
    "tracker.terminal_states": (_strings, False),
    "tracker.required_labels": (_strings, False),
    "polling.interval_ms": (_positive_int, False),
    "workspace.root": (_string, False),
    "codex.command": (_string, False),
    "codex.approval_policy": (_string_or_mapping, False),
    "codex.thread_sandbox": (_string, False),
    "codex.turn_sandbox_policy": (_mapping, False),
    "codex.turn_timeout_ms": (_positive_int, False),
    "codex.read_timeout_ms": (_positive_int, False),
    "worker.ssh_hosts": (_strings, False),
    "observability.dashboard_enabled": (_boolean, False),
    "observability.refresh_ms": (_positive_int, False),
    "observability.render_interval_ms": (_positive_int, False),
    "server.port": (_port, False),
    "server.host": (_string, False),
}
SECTIONS = {key.split(".", 1)[0] for key in KEYS}
OPEN_SECTIONS = {"tracker"}  # extra keys belong to the tracker adapter (Symphony: "preserved")


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _invalid(key: str, problem: str, value) -> PolicyInvalid:
    return PolicyInvalid("workflow_setting_invalid", f"{key} {problem}, got {_shown(value)}", key=key)


def _sections(config: dict):
    """(section name, its mapping) for each known section present; raises when one is not a mapping."""
    for name in sorted(SECTIONS):
        value = config.get(name)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise _invalid(name, "must be a mapping", value)
        yield name, value


def validate_front_matter(config: dict) -> None:
    """Raise :class:`PolicyInvalid` (``workflow_setting_invalid``) for the first known key whose value
    has the wrong type. Unknown keys pass."""
    if not isinstance(config, dict):
        raise PolicyInvalid("workflow_front_matter_not_a_map", f"the front matter is a {type(config).__name__}, "
                                                               "not a mapping")
    for section, values in _sections(config):
        for sub, value in values.items():
            check = KEYS.get(f"{section}.{sub}")
            if check is not None and value is not None:
                problem = check[0](value)
                if problem:
                    raise _invalid(f"{section}.{sub}", problem, value)


@dataclass(frozen=True)
class SettingsView:
    """The front matter sorted for display: dotted key -> value."""

    applied: dict = field(default_factory=dict)
    recognised: dict = field(default_factory=dict)  # recognised, not applied by the host
    unknown: dict = field(default_factory=dict)  # kept, shown, never fatal


def describe(config: dict | None) -> SettingsView:
    """Each key of a (valid) front matter as applied, recognised-not-applied or unknown."""
    applied, recognised, unknown = {}, {}, {}
    config = config if isinstance(config, dict) else {}
    for top, value in config.items():
        if top not in SECTIONS:
            unknown[top] = value
        elif isinstance(value, dict):
            for sub, sub_value in value.items():
                key = f"{top}.{sub}"
                if key in KEYS:
                    (applied if KEYS[key][1] else recognised)[key] = sub_value
                elif top in OPEN_SECTIONS:
                    recognised[key] = sub_value
                else:
                    unknown[key] = sub_value
    return SettingsView(applied, recognised, unknown)


def _seconds(ms: int) -> int:
    """Milliseconds as whole seconds, rounded up (a 1500 ms limit never becomes 1 s)."""
    return math.ceil(ms / 1000)


@dataclass(frozen=True)
class WorkflowKnobs:
    """The applied settings in the host's units (RunPolicy field names)."""

    values: dict = field(default_factory=dict)  # knob name -> int
    hooks: dict = field(default_factory=dict)  # hook name -> command (string or list)
    hook_timeout_seconds: int | None = None


def workflow_knobs(config: dict | None) -> WorkflowKnobs:
    """Map a valid front matter onto the run knobs: ms become seconds (rounded up), a stall timeout of
    0 or less disables stall detection (0)."""
    config = config if isinstance(config, dict) else {}
    agent = config.get("agent") if isinstance(config.get("agent"), dict) else {}
    codex = config.get("codex") if isinstance(config.get("codex"), dict) else {}
    hooks_cfg = config.get("hooks") if isinstance(config.get("hooks"), dict) else {}
    values = {}
    stall = agent.get("stall_timeout_ms")
    if not _is_int(stall):
        stall = codex.get("stall_timeout_ms")
    if _is_int(stall):
        values["stall_timeout_seconds"] = _seconds(stall) if stall > 0 else 0
    for name, key in (("max_turns", "max_turns"), ("max_concurrent_agents", "max_concurrent_agents")):
        if _is_int(agent.get(key)) and agent[key] > 0:
            values[name] = agent[key]
    for name, key in (("heartbeat_interval_seconds", "heartbeat_interval_ms"),
                      ("heartbeat_stale_seconds", "heartbeat_stale_ms")):
        if _is_int(agent.get(key)) and agent[key] > 0:
            values[name] = _seconds(agent[key])
    hooks = {name: hooks_cfg[name] for name in HOOK_NAMES if hooks_cfg.get(name) and not _command(hooks_cfg[name])}
    timeout = hooks_cfg.get("timeout_ms")
    return WorkflowKnobs(values, hooks, _seconds(timeout) if _is_int(timeout) and timeout > 0 else None)
