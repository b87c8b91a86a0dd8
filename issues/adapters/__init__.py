"""Adapters start (or wake) an agent for one heartbeat run. See ``base`` for the contract."""
from .base import (
    Adapter,
    AdapterConfigError,
    AdapterResult,
    RunContext,
    build_run_env,
    issue_run_key,
    prepare_context,
    redact,
    run_keys_revoke,
)
from .registry import get_adapter

__all__ = [
    "Adapter",
    "AdapterConfigError",
    "AdapterResult",
    "RunContext",
    "build_run_env",
    "get_adapter",
    "issue_run_key",
    "prepare_context",
    "redact",
    "run_keys_revoke",
]
