"""How cases follow the issues app's domain events (issues never imports cases)."""
import logging

from django.db import transaction
from django.db.models import Q

from issues import events
from issues.exceptions import Conflict

from . import handoffs
from .models import CaseHandoff

log = logging.getLogger(__name__)


def _primary_task_changed(sender, issue, actor, changes, **kwargs):
    handoffs.on_primary_task_changed(issue=issue, actor=actor, changes=changes)


def _run_finished(sender, run, **kwargs):
    try:
        handoffs.on_run_finished(run)
    except Exception:  # never break the run's own completion; the sweep retries the transfer
        log.exception("case handoffs after run %s", run.pk)


def _run_finished_atomic(sender, run, **kwargs):
    """Inside the transaction that ends the run, before its follow-up is decided: the transfer
    lands first, so a continuation goes to the new assignee (or is dropped), never to the agent
    that handed the work away. A run ended inside a larger transaction (the runner's event intake)
    would otherwise decide its follow-up before the on-commit receiver ran; that receiver stays
    as the backstop (both are idempotent). A savepoint keeps any failure out of the run's end."""
    try:
        with transaction.atomic():
            handoffs.on_run_finished(run)
    except Exception:
        log.exception("case handoffs inside the end of run %s", run.pk)


def _agent_purging(sender, agent, **kwargs):
    """Handoff history is retained: an agent it names is terminated, never purged on its own
    (the RESTRICT foreign keys hold the same rule; this answers with what holds the agent)."""
    count = CaseHandoff.objects.filter(Q(from_agent=agent) | Q(to_agent=agent)).count()
    if count:
        raise Conflict("Case handoffs reference this agent; terminate it instead (its history is kept).",
                       code="agent_case_history_retained",
                       details={"agentId": str(agent.pk), "handoffs": count})


def _sweep(sender, now, **kwargs):
    return {"caseHandoffsApplied": handoffs.handoff_apply_settled()}


def connect():
    events.issue_updated_atomic.connect(_primary_task_changed, dispatch_uid="cases.primary_task_changed")
    events.run_finished_atomic.connect(_run_finished_atomic, dispatch_uid="cases.run_finished_atomic")
    events.run_finished.connect(_run_finished, dispatch_uid="cases.run_finished")
    events.agent_purging_atomic.connect(_agent_purging, dispatch_uid="cases.agent_purging")
    events.sweep_ticked.connect(_sweep, dispatch_uid="cases.sweep")
