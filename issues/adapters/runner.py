"""Start a Paperclip Runner Protocol runner as a local process and wait for it.

adapter_config (as the process adapter's, plus ``cwd``)::

    {
      "command": ["paperclip-runner", "--stdio-log"],   # argv list; never a string, never a shell
      "cwd": "/srv/checkout",                           # optional, absolute; else the run's workspace
      "env": {"MODEL": "x", "OPENAI_API_KEY": {"secret_ref": "env:PAPERCLIP_SECRET_OPENAI_API_KEY"}},
      "grace_seconds": 5                                # how long a runner may linger after its run ended
    }

The runner gets the usual agent environment plus ``PAPERCLIP_RUNNER_URL``
(``<api origin>/api/runner/v1/runs/<run id>/``), ``PAPERCLIP_RUN_ID`` and ``PAPERCLIP_API_KEY`` (the
run's key, which authenticates it there). It drives the run over HTTP — hello, events, commands —
and the run ends with its ``run.terminal`` (issues.runner.projections), not with the process.

Spawning, output capture, redaction, the run's timeout and stall detection are the process
adapter's (this class only changes what ends the process early). Differences:

* a stop request does not kill the runner: a PRP stop is a command (``turn.interrupt`` /
  ``run.cancel``); a runner that does not confirm in time is ended as lost by issues.runner;
* once the run has ended (terminal, or lost) a runner still alive after ``grace_seconds`` has its
  process group terminated (SIGTERM, then SIGKILL after ``grace_seconds`` more);
* when the process exits, a run already ended returns its own status; a run still live means the
  runner exited without ``run.terminal``: failed. A ``PAPERCLIP_RESULT`` line is not a PRP result and
  is ignored.

Adapters sit below services and issues.runner: this module reads the run row only.
"""
from __future__ import annotations

import os
from dataclasses import replace

from issues.choices import LIVE_RUN_STATUSES, AdapterType, RunStatus

from .base import AdapterConfigError, AdapterResult, RunContext
from .process import ProcessAdapter

RUNNER_PATH = "/api/runner/v1/runs/{run_id}/"
NO_TERMINAL = "runner exited without run.terminal"
# The adapter's own endings, kept as they are: the run's deadline, a stall, a refused start.
_OWN_OUTCOMES = (RunStatus.TIMED_OUT, RunStatus.CANCELLED)


def runner_url(api_origin: str, run_id) -> str:
    return api_origin.rstrip("/") + RUNNER_PATH.format(run_id=run_id)


def _run_row(run_id):
    from issues.models import HeartbeatRun

    return HeartbeatRun.objects.filter(pk=run_id).values_list("status", "error").first()


class RunnerAdapter(ProcessAdapter):
    adapter_type = AdapterType.RUNNER
    needs_run_key = True

    def validate_config(self, config: dict) -> None:
        super().validate_config(config)
        cwd = config.get("cwd")
        if cwd is not None and (not isinstance(cwd, str) or not cwd or not os.path.isabs(cwd)):
            raise AdapterConfigError("adapter_config.cwd must be an absolute directory path")

    def _stop_check(self, ctx: RunContext, now: float) -> tuple[str, str] | None:
        row = _run_row(ctx.run.pk)
        if row is None:
            return RunStatus.CANCELLED, "run deleted"
        if row[0] in LIVE_RUN_STATUSES:
            self._ended_seen = None
            return None
        if self._ended_seen is None:
            self._ended_seen = now  # the grace starts when the adapter first sees the run ended
            return None
        if now - self._ended_seen < self._linger:
            return None
        return row[0], f"run already {row[0]}; the runner did not exit within {self._linger:g}s"

    def execute(self, ctx: RunContext) -> AdapterResult:
        config = ctx.config
        self._ended_seen = None
        try:
            self.validate_config(config)
        except AdapterConfigError:
            return super().execute(ctx)  # logs and fails the same way as the process adapter
        self._linger = float(config.get("grace_seconds", self.default_grace))
        env = {**ctx.env, "PAPERCLIP_RUNNER_URL": runner_url(ctx.env.get("PAPERCLIP_API_URL", ""), ctx.run.pk)}
        result = super().execute(replace(ctx, env=env, workspace_path=config.get("cwd") or ctx.workspace_path))
        return self._outcome(ctx, result)

    def _outcome(self, ctx: RunContext, result: AdapterResult) -> AdapterResult:
        """What the process's end means for the run (see the module doc)."""
        row = _run_row(ctx.run.pk)
        if row is not None and row[0] not in LIVE_RUN_STATUSES:
            return AdapterResult(status=row[0], exit_code=result.exit_code, error=row[1] or "")
        if result.status in _OWN_OUTCOMES or result.exit_code is None:
            return replace(result, report=None, liveness="", liveness_reason="")
        error = NO_TERMINAL if result.exit_code == 0 else f"{NO_TERMINAL} ({result.error or result.exit_code})"
        return AdapterResult(status=RunStatus.FAILED, exit_code=result.exit_code, error=error)
