"""Run one workspace lifecycle hook: a shell command in the workspace folder, with a timeout.

The command runs in its own process group (``start_new_session``) so a timeout kills the whole
tree, not only the shell. The environment is a small allowlist of the host's variables plus the
``PAPERCLIP_*`` workspace variables: the server's own secrets (database URL, secret key, provider
tokens) never reach a hook.
"""
from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

from django.utils import timezone

HOOK_NAMES = ("after_create", "before_run", "after_run", "before_remove")
OUTPUT_LIMIT = 4000  # bytes of output kept per hook run (head and tail)
PASSTHROUGH_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "TZ", "SHELL",
                   "TERM", "SSH_AUTH_SOCK")


@dataclass
class HookResult:
    hook: str
    command: str
    exit_code: int | None
    timed_out: bool
    duration_ms: int
    output: str
    output_truncated: bool
    run_id: str | None = None
    at: str = field(default_factory=lambda: timezone.now().isoformat())

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.exit_code == 0

    def as_log(self) -> dict:
        return {
            "hook": self.hook, "command": self.command, "exitCode": self.exit_code, "timedOut": self.timed_out,
            "durationMs": self.duration_ms, "output": self.output, "outputTruncated": self.output_truncated,
            "runId": self.run_id, "at": self.at,
        }


def hook_command(hooks: dict | None, name: str) -> str:
    """The configured command for ``name`` (a string, or a list run as one ``set -e`` script)."""
    value = (hooks or {}).get(name)
    if not value:
        return ""
    if isinstance(value, list | tuple):
        lines = [str(v) for v in value if str(v).strip()]
        return "set -e\n" + "\n".join(lines) if lines else ""
    return str(value)


def _read_output(handle) -> tuple[str, bool]:
    """Head and tail of the captured output when it is longer than ``OUTPUT_LIMIT`` bytes."""
    size = handle.seek(0, os.SEEK_END)
    handle.seek(0)
    if size <= OUTPUT_LIMIT:
        return handle.read().decode("utf-8", errors="replace"), False
    half = OUTPUT_LIMIT // 2
    head = handle.read(half)
    handle.seek(size - half)
    tail = handle.read(half)
    text = (f"{head.decode('utf-8', errors='replace')}\n…[{size - OUTPUT_LIMIT} bytes truncated]…\n"
            f"{tail.decode('utf-8', errors='replace')}")
    return text, True


def hook_env(extra: dict) -> dict:
    env = {k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ}
    env.setdefault("PATH", os.defpath)
    env.update({k: str(v) for k, v in extra.items() if v is not None})
    return env


def run_hook(*, name: str, command: str, cwd: str, timeout: float, env: dict, run_id=None) -> HookResult:
    """Run ``command`` with ``sh -c`` in ``cwd``; never raises for a failing command.

    Output goes to a temporary file (not a pipe), so a background process the hook leaves behind
    cannot keep the hook "running"; the hook ends when its shell exits.
    """
    run_id = str(run_id) if run_id else None
    started = time.monotonic()
    timed_out = False
    with tempfile.TemporaryFile() as out:
        try:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", command], cwd=cwd, env=hook_env(env), stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
        except OSError as exc:  # cwd missing, no shell
            return HookResult(name, command, None, False, int((time.monotonic() - started) * 1000),
                              f"could not start hook: {exc}", False, run_id)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the shell and everything it started
            except ProcessLookupError:
                pass
            proc.wait()
        duration_ms = int((time.monotonic() - started) * 1000)
        output, truncated = _read_output(out)
    exit_code = None if timed_out else proc.returncode
    return HookResult(name, command, exit_code, timed_out, duration_ms, output, truncated, run_id)
