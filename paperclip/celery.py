import os

from celery import Celery
from celery.signals import worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "paperclip.settings")

app = Celery("paperclip")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_ready.connect
def reconcile_runs_on_start(**kwargs):
    """A restarted worker interrupts the running rows its dead predecessors on this host left."""
    from issues.services.runs import runs_reconcile_on_start

    runs_reconcile_on_start()
