"""Statements of the inbound apply, as a worker runs it: a constant number per applied event of each
kind (not growing with the backlog or the batch), and one statement for a message that finds its
task's queue empty (the common case: intake kicks once per event, the first message of a task
applies the whole queue)."""
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from connectors.models import InboundEvent
from connectors.services import inbound
from tests.connector_factories import make_instance
from tests.factories import AgentFactory, CompanyFactory
from tests.test_connectors_queries import CONTROL, _queue

pytestmark = pytest.mark.django_db(transaction=True)


def _statements(instance, task_id, expected):
    with CaptureQueriesContext(connection) as ctx:
        counts = inbound.task_events_process(instance_id=instance.pk, external_task_id=task_id)
    assert counts["applied"] == expected, counts
    return len([q for q in ctx.captured_queries if not q["sql"].upper().startswith(CONTROL)])


def _world():
    company = CompanyFactory()
    agent = AgentFactory(company=company, name="worker")
    instance, store = make_instance(company, rules=[{"kind": "default_route", "agentId": agent.pk}])
    raw = store.add_task(1, state="doing", labels=["x"])
    _queue(instance, store, raw, "import")
    _statements(instance, raw["id"], 1)
    return instance, store, raw


def test_a_message_for_an_empty_queue_costs_one_statement():
    instance, store, raw = _world()
    assert _statements(instance, raw["id"], 0) == 1
    assert _statements(instance, "no-such-task", 0) == 1


@pytest.mark.parametrize("kind", ["edit", "comment"])
def test_statements_per_event_are_the_same_for_any_batch(kind):
    """n events cost n * k + 1 statements (the 1: the claim that finds the queue empty)."""
    instance, store, raw = _world()
    totals = {}
    for n in (3, 6):
        for i in range(n):
            if kind == "edit":
                store.update(raw["id"], title=f"title {n}.{i}", body=f"body {n}.{i}")
                _queue(instance, store, raw, f"edit-{n}-{i}")
            else:
                _queue(instance, store, raw, f"comment-{n}-{i}", comment=store.add_comment(raw["id"], f"c {n}.{i}"))
        totals[n] = _statements(instance, raw["id"], n)
    per_event = (totals[3] - 1) / 3
    assert per_event == int(per_event) and totals[6] == 6 * per_event + 1, totals
    assert InboundEvent.objects.filter(instance=instance, status="applied").count() == 10
