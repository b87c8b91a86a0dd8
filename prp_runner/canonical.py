"""Canonical JSON: the byte form the host compares a redelivered event (or command result) with.

Sorted keys, no whitespace, UTF-8 (not ASCII-escaped), NaN/Infinity refused, and a whole number
written one way (``1.0`` and ``1e2`` as ``1`` and ``100``, as RFC 8785 writes them) — the same rules
as the host's ``issues.runner.contract.canonical_json``, so bytes stored in the outbox are what the
host digests on every resend, whichever way a serialiser wrote a number.
"""
from __future__ import annotations

import hashlib
import json


def whole_numbers(doc):
    """``doc`` with every float that holds a whole number (exactly, below 2**53) as an int."""
    if isinstance(doc, float) and doc.is_integer() and abs(doc) < 2 ** 53:
        return int(doc)
    if isinstance(doc, dict):
        return {key: whole_numbers(value) for key, value in doc.items()}
    if isinstance(doc, list):
        return [whole_numbers(value) for value in doc]
    return doc


def canonical_json(doc) -> bytes:
    return json.dumps(whole_numbers(doc), sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def digest(doc) -> str:
    """sha256 hex of :func:`canonical_json`."""
    return hashlib.sha256(canonical_json(doc)).hexdigest()
