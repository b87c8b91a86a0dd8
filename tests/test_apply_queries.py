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


def queued_import():
    """A tracker task routed to an agent, its import stored and not yet applied."""
    company = CompanyFactory()
    agent = AgentFactory(company=company, name="worker")
    instance, store = make_instance(company, rules=[{"kind": "default_route", "agentId": agent.pk}])
    raw = store.add_task(1, state="doing", labels=["x"])
    _queue(instance, store, raw, "import")
    return instance, store, raw


def imported():
    """The same, imported: an issue linked to the task, its agent woken."""
    instance, store, raw = queued_import()
    _statements(instance, raw["id"], 1)
    return instance, store, raw


def test_a_message_for_an_empty_queue_costs_one_statement():
    instance, store, raw = imported()
    assert _statements(instance, raw["id"], 0) == 1
    assert _statements(instance, "no-such-task", 0) == 1


def test_a_message_naming_drained_queues_claims_only_the_pending_ones():
    """A burst's message names a task once per event stored; the first message applies the task's
    whole queue, so the later ones find it drained. One statement tells which named tasks have
    unfinished events, and only those are claimed."""
    instance, store, raw = imported()
    other, _, other_raw = imported()  # another connector's task in the same message
    drained = [(instance.pk, raw["id"]), (instance.pk, "no-such-task"), (str(instance.pk), raw["id"]),
               (str(other.pk), other_raw["id"])]
    with CaptureQueriesContext(connection) as ctx:
        inbound.task_queues_process(drained)
    statements = [q["sql"] for q in ctx.captured_queries if not q["sql"].upper().startswith(CONTROL)]
    assert len(statements) == 1 and "ROW_NUMBER()" not in statements[0]  # the one check, no claim

    _enqueue(instance, store, raw, "edit", "pending")
    with CaptureQueriesContext(connection) as ctx:
        inbound.task_queues_process(drained)
    claims = [q for q in ctx.captured_queries if "ROW_NUMBER()" in q["sql"]]
    # The task named twice: one run, which took the whole queue it saw; the look after it finds nothing
    # more (tests/test_apply_runs.py: whoever holds a queue looks once more after its run). The task
    # with nothing pending is not claimed.
    assert len(claims) == 1
    assert InboundEvent.objects.filter(instance=instance, status="applied").count() == 2
    assert not InboundEvent.objects.filter(instance=instance).exclude(status="applied").exists()


def _enqueue(instance, store, raw, kind, tag):
    if kind == "edit":
        store.update(raw["id"], title=f"title {tag}", body=f"body {tag}")
        _queue(instance, store, raw, f"edit-{tag}")
    else:
        _queue(instance, store, raw, f"comment-{tag}", comment=store.add_comment(raw["id"], f"c {tag}"))


@pytest.mark.parametrize("kind", ["edit", "comment"])
def test_statements_per_event_are_the_same_for_any_batch(kind, settings):
    """Events applied one per transaction cost k + 2 statements each (the claim, the apply's k, the
    event's row) plus 1 (the claim that finds the queue empty). Each of these events writes one
    audit row; in runs of up to APPLY_BATCH_SIZE those are one INSERT, so a run costs its events'
    k - 1 each plus 3 (one claim, one INSERT of the audit rows, one update of the events' rows; a
    comment writes its link's last_inbound_at only if no earlier event of its run did). The queue
    ends with 1 more: a claim that finds it empty after a full run, or, after a run that took the
    whole queue it saw, a look for events stored meanwhile (no transaction: see the test below)."""
    instance, store, raw = imported()
    settings.CONNECTORS = {**settings.CONNECTORS, "APPLY_BATCH_SIZE": 1}
    alone = {}
    for n in (3, 6):
        for i in range(n):
            _enqueue(instance, store, raw, kind, f"alone {n}.{i}")
        alone[n] = _statements(instance, raw["id"], n)
    k = (alone[3] - 1) / 3 - 2
    assert k == int(k) and alone[6] == 6 * (k + 2) + 1, alone

    settings.CONNECTORS = {**settings.CONNECTORS, "APPLY_BATCH_SIZE": 4}
    batched = {}
    for n in (3, 4, 9):  # one run; one full run; runs of 4, 4 and 1
        for i in range(n):
            _enqueue(instance, store, raw, kind, f"batched {n}.{i}")
        batched[n] = _statements(instance, raw["id"], n)
    runs = {n: -(-n // 4) for n in (3, 4, 9)}
    # A comment moves its link's last_inbound_at unless an earlier event of its run did: one write per run.
    once = {n: n - runs[n] if kind == "comment" else 0 for n in runs}
    assert batched == {n: n * (k - 1) + 3 * runs[n] + 1 - once[n] for n in runs}, (k, batched)
    assert InboundEvent.objects.filter(instance=instance, status="applied").count() == 1 + 9 + 16


def test_a_run_that_took_the_whole_queue_ends_with_one_look_outside_a_transaction(settings, monkeypatch):
    """A run that claimed fewer events than it could took the whole queue it saw. What remains to
    check is whether an event was stored meanwhile: one statement, no claim and no transaction (a
    second claim would cost BEGIN and COMMIT round trips). An event that is there is still applied by
    this worker (tests/test_apply_runs.py holds that with two real workers)."""
    instance, store, raw = imported()
    settings.CONNECTORS = {**settings.CONNECTORS, "APPLY_BATCH_SIZE": 4}
    for i in range(3):
        _enqueue(instance, store, raw, "edit", f"look {i}")
    seen = []

    def record(execute, sql, params, many, context):
        seen.append((sql, connection.in_atomic_block))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        counts = inbound.task_events_process(instance_id=instance.pk, external_task_id=raw["id"])
    assert counts["applied"] == 3
    claims = [atomic for sql, atomic in seen if "ROW_NUMBER()" in sql]
    assert claims == [True]  # the one run
    last, atomic = seen[-1]
    assert "ROW_NUMBER()" not in last and "inboundevent" in last.lower() and not atomic

    # An event that arrives between a run and its look is found by the look and applied.
    real, arrived = inbound._apply_run, []

    def then_one_more(*args, **kwargs):
        results = real(*args, **kwargs)
        if not arrived:
            arrived.append(True)
            _enqueue(instance, store, raw, "edit", "meanwhile")
        return results

    _enqueue(instance, store, raw, "edit", "before")
    monkeypatch.setattr(inbound, "_apply_run", then_one_more)
    counts = inbound.task_events_process(instance_id=instance.pk, external_task_id=raw["id"])
    assert counts["applied"] == 2
    assert not InboundEvent.objects.filter(instance=instance).exclude(status="applied").exists()
