"""Agents that run elsewhere and poll the API with their own key: nothing to start."""
from __future__ import annotations

from issues.choices import AdapterType, RunEventKind

from .base import Adapter, RunContext, log_event


class NoneAdapter(Adapter):
    adapter_type = AdapterType.NONE
    needs_run_key = False  # the external agent authenticates with its own key

    def execute(self, ctx: RunContext) -> None:
        log_event(ctx, RunEventKind.SYSTEM, "external agent: waiting for it to report through the API",
                  liveness=False)
