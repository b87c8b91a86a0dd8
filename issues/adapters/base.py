"""The adapter contract: how the host starts (or wakes) an agent for one heartbeat run.

The caller (the run task) does, in order::

    adapter = get_adapter(run.agent.adapter_type)
    ctx = prepare_context(run, owner=...)          # issues a run-scoped key when the adapter needs one
    result = adapter.execute(ctx)                  # synchronous
    if result is not None:
        run_finish(run=run, status=result.status, error=result.error)   # plus exit_code / liveness

``execute`` returns

* an :class:`AdapterResult` with a terminal run status when the adapter knows how the run ended
  (the process adapter always does: it waits for the process; the HTTP adapter does when the
  wake could not be delivered);
* ``None`` when the run was handed over and the agent reports through the REST API (HTTP wake
  accepted with 2xx, or an external polling agent): the run stays live and ends by the API,
  the stale-heartbeat sweep, or a stop request. A "running" result is never returned.

Adapters never call ``run_finish``; they record the start with ``run_mark_running`` and write
the run's log with ``run_append_event``.
"""
from __future__ import annotations

import abc
import os
import re
import uuid
import weakref
from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from issues.choices import TERMINAL_RUN_STATUSES, AdapterType, RunLiveness
from paperclip.core.secret_refs import SecretMissing, SecretRefused, env_ref_name, env_ref_refusal, env_ref_resolve

from .result_line import RunReport

REDACTED = "[redacted]"
# Values shorter than this are not treated as secrets (redacting "1" would wreck every log line).
MIN_SECRET_LENGTH = 4
# Names of adapter_config["env"] entries whose literal values are redacted from the run log.
SENSITIVE_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)
# Adapters whose agent runs on this host and can read the task packet file.
LOCAL_ADAPTER_TYPES = (AdapterType.PROCESS,)


def redacted_adapter_config(config):
    """What an agent may read of an adapter configuration: literal values of secret-looking names
    (``env.OPENAI_API_KEY``, a top-level ``token``) become ``[redacted]``; ``secret_ref``
    references stay (they name a secret, they are not one)."""
    if not isinstance(config, dict):
        return config

    def hide(name, value):
        literal = not isinstance(value, dict | list) and value not in (None, "")
        return REDACTED if literal and SENSITIVE_NAME.search(str(name)) and not str(name).endswith("_ref") else value

    shown = {name: hide(name, value) for name, value in config.items() if name != "env"}
    if "env" in config:
        env = config["env"]
        shown["env"] = {name: hide(name, value) for name, value in env.items()} if isinstance(env, dict) else env
    return shown


class AdapterConfigError(ValueError):
    """An agent's adapter_config cannot be used; the message says what to fix."""


@dataclass
class RunContext:
    run: object  # issues.models.HeartbeatRun
    agent: object  # issues.models.Agent
    issue: object | None
    workspace_path: str | None  # directory the agent works in; None = a per-run temporary directory
    env: dict[str, str]  # the PAPERCLIP_* variables
    secrets: list[str] = field(default_factory=list)  # replaced by "[redacted]" in the run log
    timeout_seconds: float = 3600
    # From the run policy: stop a process without output or API activity for this long (0 = never),
    # and the "pid alive" heartbeat interval of a quiet process.
    stall_timeout_seconds: float = 0
    heartbeat_interval_seconds: float = 60
    owner: str = ""  # the worker session that owns the run (only it may stop the process)
    # The wake's facts, compact payload and task packet (issues.run_context.WakeContext).
    wake: object | None = None
    # Removes the run's temporary files (the task packet of a run without a workspace).
    cleanup: object | None = field(default=None, repr=False)
    # An adapter that delegates to another hands it a config of its own (issues.adapters.prp).
    config_override: dict | None = field(default=None, repr=False)

    @property
    def config(self) -> dict:
        if self.config_override is not None:
            return self.config_override
        return self.agent.adapter_config or {}

    def release(self):
        """Remove what the context created for the run (called when the run's process has ended)."""
        if self.cleanup is not None:
            self.cleanup()


@dataclass
class AdapterResult:
    status: str  # a terminal RunStatus: succeeded, failed, timed_out, cancelled, interrupted
    exit_code: int | None = None  # process exit code; -N when killed by signal N (Popen convention)
    error: str = ""
    liveness: str = ""  # a RunLiveness value the agent reported, else ""
    liveness_reason: str = ""
    report: RunReport | None = None  # the agent's output contract (the last valid PAPERCLIP_RESULT line)

    def __post_init__(self):
        if self.status not in TERMINAL_RUN_STATUSES:
            raise ValueError(f"AdapterResult.status must be terminal, not {self.status!r}")
        if self.liveness and self.liveness not in RunLiveness.values:
            raise ValueError(f"unknown liveness {self.liveness!r}")


class Adapter(abc.ABC):
    adapter_type: str = ""
    # Whether execute() hands the agent a run-scoped API key (PAPERCLIP_API_KEY).
    needs_run_key: bool = True

    def validate_config(self, config: dict) -> None:
        """Raise AdapterConfigError when ``config`` cannot work. Cheap; no I/O."""

    def secrets_from_config(self, config: dict, *, company_id) -> list[str]:
        """Values in ``config`` that must never appear in the run log (resolved for the agent's company)."""
        return []

    @abc.abstractmethod
    def execute(self, ctx: RunContext) -> AdapterResult | None:
        """Run or wake the agent for ``ctx.run``. See the module docstring for the contract."""


# --- environment and keys ----------------------------------------------------------------------


def api_origin(url: str) -> str:
    """``PAPERCLIP_API_URL`` as upstream hands it out: the server origin without ``/api`` (clients
    append ``/api/...``). A configured value ending in ``/api`` (this project's old default) is
    accepted and trimmed; a path prefix before it (a server behind a proxy path) is kept."""
    url = (url or "").strip().rstrip("/")
    if url.lower().endswith("/api"):
        url = url[: -len("/api")].rstrip("/")
    return url


def _uuid_text(value) -> str | None:
    try:
        return str(uuid.UUID(str(value))) if value else None
    except ValueError:
        return None


def build_run_env(*, run, agent, issue, api_url: str, api_key: str, wake_reason: str = "",
                  comment_ids=(), approval_id=None, task_id=None) -> dict[str, str]:
    """The always-set variables of paperclip-api.md §3 plus the wake's task and reason (each only
    when known). ``task_id`` (the wake context's ``taskId``/``issueId``) names the task when the run
    has no issue of its own (e.g. an approval whose linked issues are all closed)."""
    env = {
        "PAPERCLIP_API_URL": api_origin(api_url),
        "PAPERCLIP_API_KEY": api_key,
        "PAPERCLIP_RUN_ID": str(run.pk),
        "PAPERCLIP_AGENT_ID": str(agent.pk),
        "PAPERCLIP_COMPANY_ID": str(agent.company_id),
        "PAPERCLIP_WAKE_COMMENT_IDS": ",".join(str(c) for c in comment_ids or ()),
    }
    if wake_reason:
        env["PAPERCLIP_WAKE_REASON"] = wake_reason
    task = str(issue.pk) if issue is not None else _uuid_text(task_id)
    if task:
        env["PAPERCLIP_TASK_ID"] = task
    if approval_id:
        env["PAPERCLIP_APPROVAL_ID"] = str(approval_id)
    return env


def issue_run_key(run) -> str:
    """Create an API key bound to ``run`` (it dies with the run) and return the raw key once."""
    from issues.models import AgentApiKey
    from issues.services.companies import agent_api_key_create

    with transaction.atomic():
        key, raw = agent_api_key_create(agent=run.agent, name="run")
        AgentApiKey.objects.filter(pk=key.pk).update(run=run)
    return raw


def run_keys_revoke(run) -> int:
    """Revoke every key issued for ``run`` (call when the run ends). Returns how many."""
    from issues.models import AgentApiKey

    return AgentApiKey.objects.filter(run=run, revoked_at__isnull=True).update(revoked_at=timezone.now())


def secret_ref_check(ref, where: str) -> None:
    """An adapter's own rule for an ``env:NAME`` reference: well-formed. Whether the server gives
    NAME to the agent's company is secret_refs_check's (it needs the company)."""
    if not isinstance(ref, str) or env_ref_name(ref) is None:
        raise AdapterConfigError(f"{where}: A reference must look like 'env:NAME'.")


def _secret_refs(value, where: str):
    # Every reference of a config, wherever the adapter keeps it (http: top level; process, runner,
    # prp: env.NAME = {"secret_ref": …}), so a new adapter's references are fenced too.
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "secret_ref" and isinstance(item, str) and (where == "adapter_config" or len(value) == 1):
                yield f"{where}.{key}", item
            else:
                yield from _secret_refs(item, f"{where}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _secret_refs(item, f"{where}[{index}]")


def secret_refs_check(config, *, company_id) -> None:
    """Write-time rule for an adapter config's references: each admitted by the server's secret
    allow-list for the agent's company (paperclip.core.secret_refs)."""
    for where, ref in _secret_refs(config, "adapter_config"):
        refusal = env_ref_refusal(ref, company_id=company_id)
        if refusal:
            raise AdapterConfigError(f"{where}: {refusal}")


def resolve_secret_ref(ref: str, *, company_id) -> str:
    """``env:NAME`` -> its value, when the allow-list gives NAME to the agent's company (checked again
    here: a config written before the rule existed is refused too). Other schemes are not supported."""
    try:
        return env_ref_resolve(ref, company_id=company_id)
    except (SecretRefused, SecretMissing) as exc:
        raise AdapterConfigError(f"secret_ref {ref!r}: {exc}") from None


def redact(text: str, secrets) -> str:
    # Longest first, so a secret that contains another is replaced whole.
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        if len(secret) >= MIN_SECRET_LENGTH and secret in text:
            text = text.replace(secret, REDACTED)
    return text


def prepare_context(run, *, owner: str | None = None, api_url: str | None = None,
                    timeout_seconds: float | None = None, workspace_path: str | None = None,
                    adapter: Adapter | None = None) -> RunContext:
    """Everything an adapter needs for ``run``: env, run-scoped key (when needed), secrets, timeout.

    The wake's facts come from ``run.context`` through :mod:`issues.run_context` (the same for
    every adapter: the optional ``PAPERCLIP_*`` variables, ``PAPERCLIP_WAKE_PAYLOAD_JSON``, the
    workspace variables, and ``ctx.wake`` for the HTTP payload). An adapter running on this host
    also gets the task packet as a file (``PAPERCLIP_TASK_PACKET_PATH``).
    The timeout is ``timeout_seconds``, else the run policy's (runtime_config["timeoutSeconds"],
    project, workflow, PAPERCLIP["RUN_TIMEOUT_SECONDS"]); so are the stall timeout and heartbeat.
    The workspace is ``run.workspace`` (the caller may pass the
    path of the workspace it admitted instead).
    """
    from issues import run_context
    from issues.services.run_policy import run_policy_for
    from issues.services.runs import this_owner

    from .registry import get_adapter

    agent, issue = run.agent, run.issue
    adapter = adapter or get_adapter(agent.adapter_type)
    config = agent.adapter_config or {}
    raw_key = issue_run_key(run) if adapter.needs_run_key else ""
    context = run.context or {}
    env = build_run_env(
        run=run, agent=agent, issue=issue, api_url=api_url or settings.PAPERCLIP["API_URL"], api_key=raw_key,
        wake_reason=run.wake_reason or context.get("reason", ""), comment_ids=context.get("commentIds") or (),
        approval_id=context.get("approvalId"), task_id=context.get("taskId") or context.get("issueId"),
    )
    if not raw_key:
        env.pop("PAPERCLIP_API_KEY")
    try:
        config_secrets = adapter.secrets_from_config(config, company_id=agent.company_id)
    except AdapterConfigError:
        config_secrets = []  # execute() reports the config error
    policy = run_policy_for(agent=agent, issue=issue)
    if timeout_seconds is None:
        timeout_seconds = policy.timeout_seconds
    workspace = run.workspace if run.workspace_id else None
    workspace_path = workspace_path or (workspace.path if workspace is not None else None)
    wake = run_context.build(run, issue)
    env.update(wake.env)
    env.update(run_context.workspace_env(workspace))
    if workspace_path:
        env["PAPERCLIP_WORKSPACE_CWD"] = workspace_path
    ctx = RunContext(
        run=run, agent=agent, issue=issue, workspace_path=workspace_path,
        env=env, secrets=[s for s in [raw_key, *config_secrets] if s], timeout_seconds=float(timeout_seconds),
        owner=owner or this_owner(), wake=wake,
        stall_timeout_seconds=float(policy.stall_timeout_seconds),
        heartbeat_interval_seconds=float(policy.heartbeat_interval_seconds),
    )
    if adapter.adapter_type in LOCAL_ADAPTER_TYPES:
        path, temporary = run_context.packet_file_write(wake.packet, workspace_path=workspace_path, run_id=run.pk)
        env["PAPERCLIP_TASK_PACKET_PATH"] = path
        if temporary:  # removed by release() after execute; a finalizer covers contexts never released
            ctx.cleanup = weakref.finalize(ctx, _remove_quietly, path)
    return ctx


def _remove_quietly(path: str):
    try:
        os.unlink(path)
    except OSError:
        pass


def run_stop_state(run_id) -> str | None:
    """Why the run must not (keep) running, or None: stop requested, ended elsewhere, or gone."""
    from issues.choices import LIVE_RUN_STATUSES
    from issues.models import HeartbeatRun

    row = HeartbeatRun.objects.filter(pk=run_id).values_list("status", "stop_requested_at", "stop_reason").first()
    if row is None:
        return "run deleted"
    status, stop_requested_at, stop_reason = row
    if stop_requested_at is not None:
        return f"stop requested: {stop_reason}" if stop_reason else "stop requested"
    if status not in LIVE_RUN_STATUSES:
        return f"run already {status}"
    return None


def log_event(ctx: RunContext, kind: str, message: str, secrets=None, *, liveness: bool = True, **data):
    """Append a run event with every secret redacted (``secrets`` defaults to ctx.secrets)."""
    from issues.services.runs import run_append_event

    return run_append_event(run_id=ctx.run.pk, kind=kind, message=redact(message, secrets or ctx.secrets),
                            data=data, liveness=liveness)
