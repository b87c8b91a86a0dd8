"""Per-task order under concurrent workers: several threads (each with its own database
connection) drain the same task's queue at once; every event is applied exactly once and the
last snapshot wins."""
import threading
import time

import pytest
from django.db import connection

from connectors.models import InboundEvent, TaskLink
from connectors.providers.base import EventKind, VerifiedEvent
from connectors.services import inbound
from issues.models import ActivityLog, Issue
from tests.connector_factories import make_instance
from tests.connector_fakes import FakeTrackerAdapter


@pytest.mark.django_db(transaction=True)
def test_concurrent_workers_apply_one_tasks_events_once_and_in_order():
    from tests.factories import CompanyFactory

    company = CompanyFactory()
    instance, store = make_instance(company)
    adapter = FakeTrackerAdapter(type("Config", (), {"state_mapping": instance.state_mapping,
                                                     "base_url": store.base_url, "service_account_id": None,
                                                     "containers": (store.container,)})())
    raw = store.add_task(1, title="v0")
    for n in range(40):
        store.update(raw["id"], title=f"v{n}")
        inbound.event_store(instance=instance, event=VerifiedEvent(
            event_id=f"e{n}", kind=EventKind.TASK_UPSERTED, action="task", external_task_id=raw["id"],
            task=adapter.normalize(raw)))
    barrier = threading.Barrier(4)
    errors = []

    def worker():
        try:
            barrier.wait()
            deadline = time.monotonic() + 100
            while InboundEvent.objects.filter(status__in=("pending", "failed")).exists():
                assert time.monotonic() < deadline, "events still unfinished after 100 s"
                inbound.task_events_process(instance_id=instance.pk, external_task_id=raw["id"])
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a worker thread hung"
    assert not errors, errors
    events = InboundEvent.objects.order_by("id")
    assert [e.status for e in events] == ["applied"] * 40
    assert all(e.attempts == 1 for e in events)  # none applied twice
    assert Issue.objects.count() == 1 and TaskLink.objects.count() == 1
    assert TaskLink.objects.get().issue.title == "v39"
    assert ActivityLog.objects.filter(action="connector.task_imported").count() == 1
