"""Thin Celery tasks: ids in, services do the work."""
from celery import shared_task

from issues.services import dispatch, runs, scheduling


@shared_task(ignore_result=True)
def dispatch_runs():
    for run_id in dispatch.dispatch_runs():
        execute_run.delay(str(run_id))


@shared_task(ignore_result=True, acks_late=True)
def execute_run(run_id: str):
    dispatch.run_execute(run_id=run_id, owner=runs.this_owner())


@shared_task(ignore_result=True)
def sweep():
    """The periodic safety net (celery beat): stale runs, due retries, timer heartbeats, retention."""
    scheduling.sweep(owner=runs.this_owner())
    dispatch_runs.delay()
