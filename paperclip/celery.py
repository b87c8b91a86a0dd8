import os

from celery import Celery
from celery.signals import task_postrun, task_prerun, worker_init, worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "paperclip.settings")

app = Celery("paperclip")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_ready.connect
def reconcile_runs_on_start(**kwargs):
    """A restarted worker interrupts the running rows its dead predecessors on this host left."""
    from issues.services.runs import runs_reconcile_on_start

    runs_reconcile_on_start()


# Database connections in workers, as in gunicorn's threads across requests: kept for
# PAPERCLIP_WORKER_CONN_MAX_AGE seconds. A connection per task cost each message a new PostgreSQL
# backend (a fork, cold catalog caches, no prepared statements): measured, one worker applied 60
# events/s that way and 101 with its connection kept. Celery's own per-task close is off
# (settings.CELERY_DB_REUSE_MAX); Django's request policy runs around each task instead: a
# connection that errored, fails its health check or outlived its age is closed.
@worker_init.connect
def keep_worker_connections(**kwargs):
    """Before the pool starts (its processes or threads inherit it): the workers' CONN_MAX_AGE."""
    from django.conf import settings

    for database in settings.DATABASES.values():
        database["CONN_MAX_AGE"] = settings.PAPERCLIP["WORKER_CONN_MAX_AGE"]


@task_prerun.connect
@task_postrun.connect
def close_old_connections_around_task(task, **kwargs):
    if getattr(task.request, "is_eager", False):
        return  # an eager task runs inside its caller's connection and transaction
    from django.db import close_old_connections

    close_old_connections()
