"""How cases follow the issues app's domain events (issues never imports cases)."""
import logging

from issues import events

from . import handoffs

log = logging.getLogger(__name__)


def _primary_task_changed(sender, issue, actor, changes, **kwargs):
    handoffs.on_primary_task_changed(issue=issue, actor=actor, changes=changes)


def _run_finished(sender, run, **kwargs):
    try:
        handoffs.on_run_finished(run)
    except Exception:  # never break the run's own completion; the sweep retries the transfer
        log.exception("case handoffs after run %s", run.pk)


def _sweep(sender, now, **kwargs):
    return {"caseHandoffsApplied": handoffs.handoff_apply_settled()}


def connect():
    events.issue_updated_atomic.connect(_primary_task_changed, dispatch_uid="cases.primary_task_changed")
    events.run_finished.connect(_run_finished, dispatch_uid="cases.run_finished")
    events.sweep_ticked.connect(_sweep, dispatch_uid="cases.sweep")
