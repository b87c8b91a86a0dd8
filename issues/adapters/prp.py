"""Agents driven by the reference PRP runner (``python -m prp_runner``), or by a runner the operator
runs elsewhere.

adapter_config::

    {"harness": "process",                                  # the agent is a command the runner supervises
     "command": ["python", "examples/heartbeat_agent.py"],  # argv list, no shell
     "env": {"MODEL": "x", "API_KEY": {"secret_ref": "env:PAPERCLIP_SECRET_X"}},
     "cwd": "/srv/checkout",                                 # optional, absolute; else the run's workspace
     "grace_seconds": 5, "drain_timeout_seconds": 600}
    {"harness": "fake", "script": "happy-path"}              # a bundled fake-harness script (prp_runner/scripts)
    {"launch": "external"}                                   # start nothing: a runner attaches (issues.runner.attach)

With ``launch: "local"`` (the default) the host starts the reference runner through the runner
adapter (same environment, stop, grace and outcome rules), with a durable outbox of its own under
``PAPERCLIP_RUNNER_OUTBOX_DIR``; the run's liveness, stops, budget and result then flow only through
the protocol. With ``launch: "external"`` the run stays live and waits: a runner elsewhere asks for it
with the agent's own key (``POST /api/runner/v1/attach``) and drives it with the run key it gets.
Only bundled script names are accepted (a tenant never names a file on the server).
"""
from __future__ import annotations

import os
import re
import sys
from dataclasses import replace
from importlib import resources
from pathlib import Path

from django.conf import settings

from issues.choices import AdapterType, RunEventKind, RunStatus

from .base import Adapter, AdapterConfigError, AdapterResult, RunContext, log_event
from .runner import RunnerAdapter

HARNESSES = ("process", "fake")
LAUNCHES = ("local", "external")
SCRIPT_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,79}$")
_LOCAL_KEYS = {"launch", "harness", "command", "script", "env", "cwd", "grace_seconds", "drain_timeout_seconds"}


def bundled_script(name: str) -> Path | None:
    """The path of a fake-harness script shipped with prp_runner, or None."""
    if not isinstance(name, str) or not SCRIPT_NAME.match(name):
        return None
    path = resources.files("prp_runner") / "scripts" / f"{name}.json"
    return Path(str(path)) if path.is_file() else None


def outbox_path(run_id) -> str:
    root = Path(settings.PAPERCLIP["RUNNER_OUTBOX_DIR"])
    root.mkdir(parents=True, exist_ok=True)
    return str(root / f"{run_id}.sqlite3")


class PrpAdapter(Adapter):
    adapter_type = AdapterType.PRP
    needs_run_key = True

    def validate_config(self, config: dict) -> None:
        launch = config.get("launch", "local")
        if launch not in LAUNCHES:
            raise AdapterConfigError(f"adapter_config.launch must be one of {', '.join(LAUNCHES)}")
        if launch == "external":
            extra = sorted(set(config) - {"launch"})
            if extra:
                raise AdapterConfigError(f"adapter_config.{extra[0]}: an external runner brings its own harness")
            return
        unknown = sorted(set(config) - _LOCAL_KEYS)
        if unknown:
            raise AdapterConfigError(f"adapter_config.{unknown[0]} is not a prp adapter setting")
        harness = config.get("harness")
        if harness not in HARNESSES:
            raise AdapterConfigError(f"adapter_config.harness must be one of {', '.join(HARNESSES)}")
        if harness == "fake":
            if "command" in config:
                raise AdapterConfigError("adapter_config.command: the fake harness plays a script, not a command")
            if bundled_script(config.get("script")) is None:
                raise AdapterConfigError("adapter_config.script must name a bundled fake-harness script "
                                         f"({', '.join(self.script_names())})")
        elif "script" in config:
            raise AdapterConfigError("adapter_config.script: only the fake harness plays scripts")
        elif "command" not in config:
            raise AdapterConfigError("adapter_config.command (the agent's argv list) is required by the process harness")
        drain = config.get("drain_timeout_seconds", 600)
        if not isinstance(drain, (int, float)) or isinstance(drain, bool) or drain <= 0:
            raise AdapterConfigError("adapter_config.drain_timeout_seconds must be a positive number")
        # command, env, cwd and grace_seconds follow the runner (and process) adapter's rules.
        shared = {name: config[name] for name in ("command", "env", "cwd", "grace_seconds") if name in config}
        RunnerAdapter().validate_config({"command": ["prp_runner"], **shared})

    @staticmethod
    def script_names() -> list[str]:
        folder = resources.files("prp_runner") / "scripts"
        return sorted(p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json"))

    def secrets_from_config(self, config: dict, *, company_id) -> list[str]:
        return RunnerAdapter().secrets_from_config({"env": config.get("env") or {}}, company_id=company_id)

    @staticmethod
    def _runner_config(config: dict, *, outbox: str) -> dict:
        """The runner adapter's config: the reference runner's command line around the harness."""
        argv = [sys.executable, "-m", "prp_runner", "--outbox", outbox,
                "--drain-timeout", f"{config.get('drain_timeout_seconds', 600):g}"]
        if config.get("harness") == "fake":
            argv += ["--harness", "fake", "--script", str(bundled_script(config.get("script")) or "")]
        else:
            command = config.get("command")
            argv += ["--harness", "process", "--", *(command if isinstance(command, list) else [command])]
        derived = {"command": argv, "env": config.get("env") or {}}
        for name in ("cwd", "grace_seconds"):
            if name in config:
                derived[name] = config[name]
        return derived

    def execute(self, ctx: RunContext) -> AdapterResult | None:
        try:
            self.validate_config(ctx.config)
        except AdapterConfigError as exc:
            log_event(ctx, RunEventKind.SYSTEM, f"adapter config error: {exc}", liveness=False)
            return AdapterResult(status=RunStatus.FAILED, error=f"adapter config error: {exc}")
        if ctx.config.get("launch") == "external":
            log_event(ctx, RunEventKind.SYSTEM, "prp: waiting for an external runner to attach "
                                                "(POST /api/runner/v1/attach with the agent's key)", liveness=False)
            return None
        outbox = outbox_path(ctx.run.pk)
        try:
            return RunnerAdapter().execute(replace(ctx, config_override=self._runner_config(ctx.config, outbox=outbox)))
        finally:
            # A runner that finished cleanly removed its outbox; one that did not has nothing left to
            # deliver to an ended run, and a retry is a new run with a new outbox.
            for suffix in ("", "-wal", "-shm"):
                try:
                    os.unlink(outbox + suffix)
                except FileNotFoundError:
                    pass
