"""Canonical JSON: the byte form the host compares a redelivered event (or command result) with.

Sorted keys, no whitespace, UTF-8 (not ASCII-escaped), NaN/Infinity refused — the same rules as
the host's ``issues.runner.contract.canonical_json``, so bytes stored in the outbox are what the
host digests on every resend.
"""
from __future__ import annotations

import hashlib
import json


def canonical_json(doc) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def digest(doc) -> str:
    """sha256 hex of :func:`canonical_json`."""
    return hashlib.sha256(canonical_json(doc)).hexdigest()
