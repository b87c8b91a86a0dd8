"""Workspace keys: a filesystem-safe name derived from an issue identifier (Symphony §9).

Every character outside ``[A-Za-z0-9._-]`` becomes ``_``. When that (or anything else) changed
the identifier, a stable suffix ``--`` + 16 hex chars of SHA-256 of the *original* identifier is
appended, so ``a/b`` and ``a_b`` never share a key. An identifier that is already safe is its
own key.
"""
from __future__ import annotations

import hashlib
import re

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
# ExecutionWorkspace.key is 120 characters; leave room for the 18-character suffix.
MAX_BODY = 100
SUFFIX_HEX = 16


def workspace_key(identifier: str) -> str:
    """The sanitized key for ``identifier``; a hash suffix only when sanitizing changed it."""
    if not isinstance(identifier, str):
        raise TypeError("identifier must be a string")
    body = _UNSAFE.sub("_", identifier)
    # "", "." and ".." are made of allowed characters but are not usable folder names.
    if body in ("", ".", ".."):
        body = body.replace(".", "_") or "_"
    body = body[:MAX_BODY]
    if body == identifier:
        return body
    digest = hashlib.sha256(identifier.encode("utf-8")).hexdigest()[:SUFFIX_HEX]
    return f"{body}--{digest}"
