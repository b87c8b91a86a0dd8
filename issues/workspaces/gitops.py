"""The few git commands workspaces need, with timeouts and one error type. No DB access here."""
from __future__ import annotations

import fcntl
import os
import re
import subprocess
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings

from .errors import WorkspaceGitFailed

DEFAULT_GIT_TIMEOUT = 300
# scp-like "user@host:path" or anything with a scheme ("https://", "ssh://", "file://").
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://|^[^/\s]+@[^/\s]+:")


def git_timeout() -> int:
    return int(settings.PAPERCLIP.get("WORKSPACE_GIT_TIMEOUT_SECONDS", DEFAULT_GIT_TIMEOUT))


def is_url(repository: str) -> bool:
    return bool(_URL.match(repository))


def git(*args: str, cwd=None, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true", "LC_ALL": "C"}
    cmd = ["git", *args]
    try:
        proc = subprocess.run(cmd, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=git_timeout(),
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise WorkspaceGitFailed("A git command timed out.", details={"command": cmd[:4]}) from exc
    except OSError as exc:
        raise WorkspaceGitFailed(details={"command": cmd[:4], "error": str(exc)}) from exc
    if check and proc.returncode != 0:
        raise WorkspaceGitFailed(details={"command": cmd[:6], "exitCode": proc.returncode,
                                          "stderr": proc.stderr.strip()[-2000:]})
    return proc


def has_remote(repo: Path, name: str = "origin") -> bool:
    return name in git("remote", cwd=repo).stdout.split()


def ref_exists(repo: Path, ref: str) -> bool:
    return git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", cwd=repo, check=False).returncode == 0


def current_branch(repo: Path) -> str:
    proc = git("symbolic-ref", "--quiet", "--short", "HEAD", cwd=repo, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def valid_branch_name(name: str) -> bool:
    return git("check-ref-format", "--branch", name, check=False).returncode == 0


def is_work_tree(path: Path) -> bool:
    proc = git("rev-parse", "--show-toplevel", cwd=path, check=False)
    return proc.returncode == 0 and Path(proc.stdout.strip()).resolve() == path.resolve()


def common_git_dir(path: Path) -> Path | None:
    """The main repository's git dir for a worktree (``None`` when ``path`` is not one)."""
    proc = git("rev-parse", "--path-format=absolute", "--git-common-dir", cwd=path, check=False)
    return Path(proc.stdout.strip()) if proc.returncode == 0 and proc.stdout.strip() else None


@contextmanager
def file_lock(lock_path: Path):
    """A host-wide exclusive lock (flock) serializing git work on one repository or workspace key."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
