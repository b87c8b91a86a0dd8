"""Start the agent as a local process and wait for it.

adapter_config::

    {
      "command": ["python", "agent.py"],          # argv list; never a string, never a shell
      "env": {"MODEL": "x",                        # literal values (names like *KEY*/*TOKEN* are redacted)
              "OPENAI_API_KEY": {"secret_ref": "env:PAPERCLIP_SECRET_OPENAI_API_KEY"}},   # from the host env (allow-listed)
      "grace_seconds": 5                           # SIGTERM -> SIGKILL delay when stopping
    }

The run's timeout is RunContext.timeout_seconds (run policy: runtime_config["timeoutSeconds"], …,
PAPERCLIP["RUN_TIMEOUT_SECONDS"]); a process without output or API activity for
RunContext.stall_timeout_seconds is stopped as timed_out ("stalled: …") and retried.
The process runs in its own session (process group) with a minimal environment: PATH, HOME, LANG, PYTHONPATH (when set on the host), the config's env and the PAPERCLIP_* variables (those
win). Its stdout/stderr become run events line by line, with every secret replaced by
"[redacted]". A last stdout line ``PAPERCLIP_RESULT {"status": ..., "pr_url": ..., "liveness": ...}``
reports the run's result (the output contract, .result_line); a malformed one is logged and ignored.
"""
from __future__ import annotations

import json
import os
import queue
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time

from django.conf import settings

from issues.choices import AdapterType, RunEventKind, RunStatus

from .base import (
    SENSITIVE_NAME,
    Adapter,
    AdapterConfigError,
    AdapterResult,
    RunContext,
    log_event,
    redact,
    resolve_secret_ref,
    secret_ref_check,
    run_stop_state,
)
from .result_line import RESULT_PREFIX, ResultLineError
from .result_line import parse_result_line as parse_report

INHERITED_ENV = ("PATH", "HOME", "LANG", "PYTHONPATH")
MAX_LINE_BYTES = 1024 * 1024  # a longer line is split into several events
MAX_EVENT_CHARS = 64 * 1024  # and each event's message is capped
_EOF = object()


def _leader_exited(pid: int) -> bool:
    """Has the process exited? Leaves it a zombie (not reaped), so its pid/pgid cannot be reused."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _group_alive(pgid: int) -> bool:
    """Does the process group still have a live (non-zombie) member?"""
    if os.path.isdir("/proc/self"):
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as fh:
                    stat = fh.read()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2:].split()
            if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
                return True
        return False
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _signal_group(pgid: int, sig: int):
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def terminate_group(pgid: int, grace: float) -> bool:
    """SIGTERM the whole group, SIGKILL what is left after ``grace`` seconds. True if it had to kill."""
    if not _group_alive(pgid):
        return False
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not _group_alive(pgid):
            return False
        time.sleep(0.05)
    _signal_group(pgid, signal.SIGKILL)
    return True


def _reader(stream, kind: str, out: queue.Queue):
    try:
        while True:
            chunk = stream.readline(MAX_LINE_BYTES)
            if not chunk:
                break
            out.put((kind, chunk))
    except (OSError, ValueError):
        pass
    finally:
        out.put((kind, _EOF))


def parse_result_line(text: str) -> tuple[str, str] | None:
    """``PAPERCLIP_RESULT {"liveness": "completed", "reason": "..."}`` -> (liveness, reason); None
    when the line is no valid result line or reports no liveness. The whole contract (status,
    pr_url, …) is :func:`issues.adapters.result_line.parse_result_line`."""
    try:
        report = parse_report(text)
    except ResultLineError:
        return None
    return (report.liveness, report.liveness_reason) if report and report.liveness else None


class _StallWatch:
    """Symphony's stall_timeout: the run stalled when the process printed nothing and the agent
    made no API call (the run's last_activity_at) for ``timeout`` seconds (0 disables). The row
    is read only once the process has been quiet that long, and then not again until the API
    activity it saw could have gone stale."""

    def __init__(self, run_id, timeout: float):
        self.run_id, self.timeout, self.recheck_at = run_id, timeout, 0.0

    def stalled(self, last_output: float, now: float) -> bool:
        if not self.timeout or now - last_output < self.timeout or now < self.recheck_at:
            return False
        from django.utils import timezone

        from issues.models import HeartbeatRun

        seen = HeartbeatRun.objects.filter(pk=self.run_id).values_list("last_activity_at", flat=True).first()
        quiet = (timezone.now() - seen).total_seconds() if seen else self.timeout
        if quiet >= self.timeout:
            return True
        self.recheck_at = now + self.timeout - quiet
        return False


class ProcessAdapter(Adapter):
    adapter_type = AdapterType.PROCESS
    needs_run_key = True
    poll_interval = 0.5  # how often the run row is read for a stop request
    default_grace = 5.0
    heartbeat_interval: float | None = None  # None: PAPERCLIP["RUN_HEARTBEAT_INTERVAL_SECONDS"]

    # --- configuration ---------------------------------------------------------------------------
    def validate_config(self, config: dict) -> None:
        command = config.get("command")
        if isinstance(command, str):
            raise AdapterConfigError(
                "adapter_config.command must be a list of argv strings, not a string (no shell is used): "
                'e.g. ["python", "agent.py"]'
            )
        if not isinstance(command, list) or not command or not command[0] or not all(isinstance(a, str) for a in command):
            raise AdapterConfigError("adapter_config.command must be a non-empty list of argv strings")
        env = config.get("env", {})
        if not isinstance(env, dict):
            raise AdapterConfigError("adapter_config.env must be an object of NAME: value")
        for name, value in env.items():
            if not isinstance(name, str) or not name or "=" in name:
                raise AdapterConfigError(f"adapter_config.env: invalid variable name {name!r}")
            if name.startswith("PAPERCLIP_"):
                raise AdapterConfigError(f"adapter_config.env: {name} is set by the host")
            if isinstance(value, dict):
                if set(value) != {"secret_ref"}:
                    raise AdapterConfigError(f"adapter_config.env.{name}: an object must be {{\"secret_ref\": \"env:NAME\"}}")
                secret_ref_check(value["secret_ref"], f"adapter_config.env.{name}.secret_ref")
            elif not isinstance(value, (str, int, float, bool)):
                raise AdapterConfigError(f"adapter_config.env.{name}: must be a string or a secret_ref")
        grace = config.get("grace_seconds", self.default_grace)
        if not isinstance(grace, (int, float)) or isinstance(grace, bool) or grace <= 0:
            raise AdapterConfigError("adapter_config.grace_seconds must be a positive number")

    def _config_env(self, config: dict, company_id) -> tuple[dict[str, str], list[str]]:
        env, secrets = {}, []
        for name, value in (config.get("env") or {}).items():
            if isinstance(value, dict):
                env[name] = resolve_secret_ref(value["secret_ref"], company_id=company_id)
                secrets.append(env[name])
            else:
                env[name] = value if isinstance(value, str) else json.dumps(value)
                if SENSITIVE_NAME.search(name):
                    secrets.append(env[name])
        return env, secrets

    def secrets_from_config(self, config: dict, *, company_id) -> list[str]:
        return self._config_env(config, company_id)[1]

    # --- execution -------------------------------------------------------------------------------
    def _stop_check(self, ctx: RunContext, now: float) -> tuple[str, str] | None:
        """Polled while the process runs: ``(outcome, error)`` to end it now, or None. A stop
        request or a run ended elsewhere ends it (the runner adapter overrides this)."""
        stopped = run_stop_state(ctx.run.pk)
        return (RunStatus.CANCELLED, stopped) if stopped else None

    def execute(self, ctx: RunContext) -> AdapterResult:
        from issues.services.runs import run_mark_running

        config = ctx.config
        secrets = list(ctx.secrets) + [ctx.env.get("PAPERCLIP_API_KEY", "")]
        try:
            self.validate_config(config)
            config_env, config_secrets = self._config_env(config, ctx.agent.company_id)
        except AdapterConfigError as exc:
            log_event(ctx, RunEventKind.SYSTEM, f"adapter config: {exc}", secrets)
            return AdapterResult(status=RunStatus.FAILED, error=f"adapter config: {exc}")
        secrets += config_secrets

        stopped = run_stop_state(ctx.run.pk)
        if stopped:
            return AdapterResult(status=RunStatus.CANCELLED, error=f"not started: {stopped}")

        env = {name: os.environ[name] for name in INHERITED_ENV if name in os.environ}
        env.update(config_env)
        env.update(ctx.env)
        command = config["command"]
        temp_dir = None
        if ctx.workspace_path:
            if not os.path.isdir(ctx.workspace_path):
                return AdapterResult(status=RunStatus.FAILED, error=f"workspace {ctx.workspace_path} does not exist")
            cwd = ctx.workspace_path
        else:
            cwd = temp_dir = tempfile.mkdtemp(prefix=f"paperclip-run-{ctx.run.pk}-")
        try:
            try:
                proc = subprocess.Popen(
                    command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
                )
            except OSError as exc:
                error = redact(f"could not start {command[0]}: {exc.strerror or exc}", secrets)
                log_event(ctx, RunEventKind.SYSTEM, error, secrets)
                return AdapterResult(status=RunStatus.FAILED, error=error)
            return self._supervise(ctx, proc, command, cwd, secrets, float(config.get("grace_seconds",
                                                                                    self.default_grace)),
                                   run_mark_running)
        finally:
            if temp_dir:
                shutil.rmtree(temp_dir, ignore_errors=True)

    def _supervise(self, ctx, proc, command, cwd, secrets, grace, run_mark_running) -> AdapterResult:
        pgid = proc.pid  # start_new_session: the leader's pid is the group id
        lines: queue.Queue = queue.Queue()
        readers = [threading.Thread(target=_reader, args=(proc.stdout, RunEventKind.STDOUT, lines), daemon=True),
                   threading.Thread(target=_reader, args=(proc.stderr, RunEventKind.STDERR, lines), daemon=True)]
        for thread in readers:
            thread.start()
        # last_event: anything logged (heartbeats too); last_output: the agent's own output (stall detection).
        state = {"open": 2, "result": None, "last_event": time.monotonic(), "last_output": time.monotonic()}
        heartbeat_every = (self.heartbeat_interval or ctx.heartbeat_interval_seconds
                           or settings.PAPERCLIP["RUN_HEARTBEAT_INTERVAL_SECONDS"])
        stall = _StallWatch(ctx.run.pk, ctx.stall_timeout_seconds)
        outcome, error = None, ""
        reaped = False

        def store(kind, chunk):
            if chunk is _EOF:
                state["open"] -= 1
                return
            # NUL cannot be stored in a PostgreSQL text column.
            text = redact(chunk.decode("utf-8", "replace").rstrip("\r\n").replace("\x00", "\ufffd"), secrets)
            refused = None
            if kind == RunEventKind.STDOUT:
                try:
                    report = parse_report(text)
                except ResultLineError as exc:
                    report, refused = None, str(exc)
                if report:
                    state["result"] = report  # the last valid result line wins
            log_event(ctx, kind, text[:MAX_EVENT_CHARS], secrets)
            if refused:
                log_event(ctx, RunEventKind.SYSTEM, f"{RESULT_PREFIX} ignored: {refused}", secrets)
            state["last_event"] = state["last_output"] = time.monotonic()

        def drain(wait: float, batch: int = 500):
            # Bounded, so a flood of output cannot starve the stop and timeout checks.
            try:
                store(*lines.get(timeout=wait))
                for _ in range(batch):
                    store(*lines.get_nowait())
            except queue.Empty:
                pass

        try:
            run = run_mark_running(run=ctx.run, owner=ctx.owner, pid=proc.pid)
            log_event(ctx, RunEventKind.SYSTEM, f"started pid {proc.pid} in {cwd}: {shlex.join(command)}", secrets,
                      pid=proc.pid)
            if run.status != RunStatus.RUNNING:
                outcome, error = RunStatus.CANCELLED, f"run already {run.status}"
            deadline = time.monotonic() + ctx.timeout_seconds
            next_poll = time.monotonic() + self.poll_interval
            while outcome is None:
                drain(0.05)
                if _leader_exited(proc.pid):
                    break
                now = time.monotonic()
                if now >= deadline:
                    outcome, error = RunStatus.TIMED_OUT, f"timed out after {ctx.timeout_seconds:g}s"
                elif now >= next_poll:
                    next_poll = now + self.poll_interval
                    stopped = self._stop_check(ctx, now)
                    if stopped:
                        outcome, error = stopped
                    elif stall.stalled(state["last_output"], now):
                        outcome, error = RunStatus.TIMED_OUT, (f"stalled: no output or API activity for "
                                                               f"{stall.timeout:g}s")
                    elif now - state["last_event"] >= heartbeat_every:
                        # A quiet agent is still alive: keep the run's heartbeat fresh for the stale sweep.
                        log_event(ctx, RunEventKind.HEARTBEAT, f"pid {proc.pid} alive", secrets, pid=proc.pid)
                        state["last_event"] = now
            if outcome is not None:
                log_event(ctx, RunEventKind.SYSTEM, f"{error}; terminating process group {pgid}", secrets)
            # Also ends whatever the agent left behind in its group after a normal exit.
            if terminate_group(pgid, grace) and outcome is not None:
                log_event(ctx, RunEventKind.SYSTEM, f"process group {pgid} killed after {grace:g}s grace", secrets)
            end = time.monotonic() + max(grace, 1.0)
            while state["open"] and time.monotonic() < end:
                drain(0.1)
            while not lines.empty():
                drain(0)
            returncode = proc.wait()
            reaped = True
        finally:
            if not reaped:  # an error in the loop above must not leave the agent running
                _signal_group(pgid, signal.SIGKILL)
                proc.wait()
            for thread, stream in zip(readers, (proc.stdout, proc.stderr)):
                thread.join(timeout=0.5)
                # A pipe still held by a process that escaped the group keeps its (daemon) reader
                # blocked; closing it under the reader could hang, so it is left to the GC.
                if not thread.is_alive():
                    try:
                        stream.close()
                    except OSError:
                        pass

        report = state["result"]
        liveness, reason = (report.liveness, report.liveness_reason) if report else ("", "")
        if outcome is None:
            if returncode == 0:
                outcome = RunStatus.SUCCEEDED
            elif returncode > 0:
                outcome, error = RunStatus.FAILED, f"exit code {returncode}"
            else:
                outcome = RunStatus.INTERRUPTED
                try:
                    error = f"killed by signal {signal.Signals(-returncode).name}"
                except ValueError:
                    error = f"killed by signal {-returncode}"
        log_event(ctx, RunEventKind.SYSTEM, f"process exited with code {returncode}: {outcome}", secrets,
                  exitCode=returncode)
        return AdapterResult(status=outcome, exit_code=returncode, error=error, liveness=liveness,
                             liveness_reason=reason, report=report)
