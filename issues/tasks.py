"""Thin Celery tasks: ids in, services do the work."""
from celery import shared_task

from issues.services import dispatch, runs, scheduling


@shared_task(ignore_result=True)
def dispatch_runs():
    """One batched claim pass; each claimed run is handed to a worker, which takes it over."""
    owner = runs.this_owner()
    for run in dispatch.dispatch_claim(owner=owner):
        execute_run.delay(str(run.pk), claimed_by=owner)


@shared_task(ignore_result=True, acks_late=True)
def execute_run(run_id: str, claimed_by: str | None = None):
    # claimed_by None: a message from before batched claims, which claims the run itself.
    dispatch.run_execute(run_id=run_id, owner=runs.this_owner(), claimed_by=claimed_by)


@shared_task(ignore_result=True)
def sweep():
    """The periodic safety net (celery beat): stale runs, due retries, timer heartbeats, retention."""
    scheduling.sweep(owner=runs.this_owner())
    dispatch_runs.delay()
