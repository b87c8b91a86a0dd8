"""The few git commands workspaces need, with timeouts and one error type. No DB access here.

An http(s) repository is a URL any board user may set, so git reaches it only as the guarded HTTP
client would (paperclip.core.outbound_http): the address is checked just before git runs and git is
pinned to it (``http.curloptResolve``), follows no redirect and uses no proxy. It also runs without the
server's own git configuration (no system or global config: no credential helper, extra header or
cookie file of the server's reaches the tenant's URL, and no filter such as git-lfs fetches from where
the repository says): the clone, every fetch and the worktree checkout (``isolated``). Folders,
``file://`` and ssh repositories are staff-set and run unchanged.
"""
from __future__ import annotations

import fcntl
import logging
import os
import re
import subprocess
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings

from paperclip.core.outbound_http import OutboundRefused, checked_addresses

from .errors import WorkspaceConfigError, WorkspaceGitFailed

log = logging.getLogger("paperclip.workspaces")

DEFAULT_GIT_TIMEOUT = 300
# scp-like "user@host:path" or anything with a scheme ("https://", "ssh://", "file://").
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://|^[^/\s]+@[^/\s]+:")
PROXY_ENV = ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
             "NO_PROXY", "GIT_PROXY_COMMAND")
# A tenant's repository: the server's git configuration stays out (environment-given config too), and
# these reset what a repository-local config could still name.
ISOLATED_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_LFS_SKIP_SMUDGE": "1"}
ISOLATED_OPTIONS = ["-c", "credential.helper=", "-c", "http.extraHeader=", "-c", "http.cookieFile=",
                    "-c", "core.askPass=", "-c", "core.sshCommand="]


def git_timeout() -> int:
    return int(settings.PAPERCLIP.get("WORKSPACE_GIT_TIMEOUT_SECONDS", DEFAULT_GIT_TIMEOUT))


def is_url(repository: str) -> bool:
    return bool(_URL.match(repository))


def is_http_url(repository: str) -> bool:
    return repository.strip().lower().startswith(("https://", "http://"))


def guarded_options(url: str, *, label: str) -> list[str]:
    """``git -c`` options that hold git to the outbound guard for ``url`` (checked now: a refusal is
    a :class:`WorkspaceConfigError` naming ``label``, the repository as shown, and git never runs)."""
    try:
        host, port, addresses = checked_addresses(url)
    except OutboundRefused as exc:
        raise WorkspaceConfigError(f"The project repository {label} is refused: {exc}",
                                   code="workspace_repository_refused", details={"repository": label}) from None
    options = ["-c", "http.followRedirects=false", "-c", "http.proxy="]  # an empty proxy turns env proxies off too
    if host.strip("[]") not in {str(a) for a in addresses}:  # a name: connect to the checked addresses only
        pinned = ",".join(f"[{a}]" if a.version == 6 else str(a) for a in addresses)
        options += ["-c", f"http.curloptResolve={host}:{port}:{pinned}"]
    return options


def git(*args: str, cwd=None, check: bool = True, guarded: list[str] | None = None,
        isolated: bool = False) -> subprocess.CompletedProcess:
    """Run git; ``guarded`` (from :func:`guarded_options`) for a command that reaches an http(s) remote,
    ``isolated`` for any other command in the clone of one (both run without the server's git config)."""
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true", "LC_ALL": "C"}
    if guarded is not None:  # the checked address, never a proxy's
        env = {k: v for k, v in env.items() if k not in PROXY_ENV}
    options = list(guarded or [])
    if guarded is not None or isolated:
        env = {k: v for k, v in env.items() if not k.startswith("GIT_CONFIG")} | ISOLATED_ENV
        options += ISOLATED_OPTIONS
    cmd = ["git", *options, *args]
    try:
        proc = subprocess.run(cmd, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=git_timeout(),
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise WorkspaceGitFailed("A git command timed out.", details={"command": ["git", *args][:4]}) from exc
    except OSError as exc:
        raise WorkspaceGitFailed(details={"command": ["git", *args][:4], "error": str(exc)}) from exc
    if check and proc.returncode != 0:
        stderr = proc.stderr.strip()[-2000:]
        if guarded is not None:  # what a tenant's remote answered stays in the server's log
            log.warning("git %s failed (exit %s): %s", " ".join(args[:2]), proc.returncode, stderr)
            stderr = "(see the server log)"
        raise WorkspaceGitFailed(details={"command": ["git", *args][:6], "exitCode": proc.returncode,
                                          "stderr": stderr})
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
