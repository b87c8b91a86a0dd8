"""A runner that the operator runs elsewhere asks for its next run (``POST /api/runner/v1/attach``).

The agent's long-lived key proves who asks (a run-scoped key speaks for one run only). The host
hands out the agent's oldest running ``prp`` run whose adapter says ``launch: "external"`` and
that no runner has attached yet: a run-scoped key minted for it (shown once; revoked when the run
ends like every run key), the runner URL and the agent environment a harness's command expects.
The session row is created in the same transaction, under the run's row lock, so two runners
asking at once never get the same run.
"""
from __future__ import annotations

from django.conf import settings
from django.db import IntegrityError, transaction

from issues.actors import Actor
from issues.adapters.base import build_run_env, issue_run_key
from issues.adapters.runner import runner_url
from issues.choices import AdapterType, RunEventKind, RunStatus
from issues.exceptions import Forbidden
from issues.models import Agent, HeartbeatRun, RunnerSession
from issues.services.activity import activity_record
from issues.services.runs import run_append_event


def agent_key_required() -> Forbidden:
    return Forbidden("Attaching takes the agent's own long-lived key, not a run-scoped key.",
                     code="agent_key_required")


def runner_attach(*, agent: Agent) -> dict | None:
    """Claim the agent's next external run for a runner; None when no run is waiting."""
    for _attempt in range(5):
        with transaction.atomic():
            run = (HeartbeatRun.objects.select_for_update(skip_locked=True, of=("self",))
                   .filter(agent=agent, adapter_type=AdapterType.PRP, status=RunStatus.RUNNING,
                           runner_session__isnull=True)
                   .select_related("agent", "issue").order_by("started_at", "created_at").first())
            if run is None or (run.agent.adapter_config or {}).get("launch") != "external":
                return None
            try:
                with transaction.atomic():
                    RunnerSession.objects.create(run=run, company_id=run.company_id)
            except IntegrityError:
                continue  # another runner took it between the read and the write (no row locks: SQLite)
            return _handed_out(agent, run)
    return None


def _handed_out(agent: Agent, run: HeartbeatRun) -> dict:
    key = issue_run_key(run)
    env = build_run_env(run=run, agent=run.agent, issue=run.issue, api_url=settings.PAPERCLIP["API_URL"],
                        api_key=key, wake_reason=run.wake_reason or (run.context or {}).get("reason", ""))
    url = runner_url(env["PAPERCLIP_API_URL"], run.pk)
    env["PAPERCLIP_RUNNER_URL"] = url
    run_append_event(run_id=run.pk, kind=RunEventKind.SYSTEM, message="prp: an external runner attached",
                     data={"runnerAttached": True})
    activity_record(actor=Actor(agent=agent, _run=run), company_id=run.company_id, action="run.runner_attached",
                    entity_type="run", entity_id=run.pk, run=run, details={})
    return {"runId": str(run.pk), "runnerUrl": url, "apiKey": key, "env": env}
