"""Paths that stay inside the workspace root (Symphony §9: reject the root itself and symlink escapes)."""
from __future__ import annotations

import os
from pathlib import Path

from .errors import WorkspacePathEscape


def safe_path(root, *parts) -> Path:
    """``root/part/...`` resolved (symlinks followed); raises :class:`WorkspacePathEscape` unless
    the result lies strictly inside the resolved root."""
    root_resolved = Path(os.path.abspath(os.fspath(root))).resolve()
    if not parts:
        raise WorkspacePathEscape("A workspace path must be below the root, not the root itself.")
    for part in parts:
        text = os.fspath(part)
        if not text or "\x00" in text or os.path.isabs(text):
            raise WorkspacePathEscape(details={"part": text.replace("\x00", "\\0")})
    candidate = root_resolved.joinpath(*map(os.fspath, parts))
    try:
        resolved = candidate.resolve()  # non-strict: follows every symlink that exists
    except (OSError, RuntimeError) as exc:  # symlink loop
        raise WorkspacePathEscape(details={"path": str(candidate), "reason": str(exc)}) from exc
    if resolved == root_resolved or not resolved.is_relative_to(root_resolved):
        raise WorkspacePathEscape(details={"root": str(root_resolved), "path": str(candidate)})
    return resolved
