"""The intake under real concurrency: clients on their own threads and database connections post
at the same instant (a barrier). The run row lock serializes them, so the same batch twice is one
effect with one ACK, and overlapping batches never store an event twice nor ACK past a gap.
The evidence is PostgreSQL (row locks); SQLite serializes writers anyway and runs fewer trials."""
import threading

import pytest
from django.db import connection
from django.test import Client

from issues.models import RunEvent, RunnerEvent, RunnerSession, RunnerSource
from tests.conftest import is_postgres
from tests.runner_helpers import envelopes, hello_body, runner_run, runner_url, source_key

pytestmark = pytest.mark.django_db(transaction=True)
SRC = source_key()


def race(key, run, batches):
    """Post ``batches[i]`` from thread i, all released together; returns (status, body) each."""
    barrier = threading.Barrier(len(batches))
    results = [None] * len(batches)

    def post(index, batch):
        try:
            client = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
            barrier.wait(timeout=30)
            response = client.post(runner_url(run, "events"), {"events": batch}, content_type="application/json")
            results[index] = (response.status_code, response.json())
        finally:
            connection.close()

    threads = [threading.Thread(target=post, args=(i, b)) for i, b in enumerate(batches)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


def ready_run():
    run, key = runner_run()
    response = Client(HTTP_AUTHORIZATION=f"Bearer {key}").post(runner_url(run, "hello"), hello_body(1, 1),
                                                               content_type="application/json")
    assert response.status_code == 200, response.content
    return run, key


def test_two_clients_posting_the_same_batch_at_once_make_one_effect_and_the_same_ack():
    trials = 20 if is_postgres() else 3
    for trial in range(trials):
        run, key = ready_run()
        batch = envelopes(1, 20, run=run)
        results = race(key, run, [batch, batch])
        assert [status for status, _ in results] == [200, 200], (trial, results)
        bodies = [body for _, body in results]
        assert bodies[0]["ackedSourceSeq"] == bodies[1]["ackedSourceSeq"] == 20, (trial, bodies)
        assert sorted(body["accepted"] for body in bodies) == [0, 20], (trial, bodies)
        assert sorted(len(body["duplicates"]) for body in bodies) == [0, 20], (trial, bodies)
        assert RunnerEvent.objects.filter(run=run).count() == 20
        assert RunEvent.objects.filter(run=run, kind="runner").count() == 20
        assert RunnerSession.objects.get(pk=run.pk).event_count == 20
        assert RunnerSource.objects.get(run=run).acked_seq == 20


def test_overlapping_batches_at_once_store_each_event_once_and_never_ack_past_a_gap():
    trials = 10 if is_postgres() else 2
    for trial in range(trials):
        run, key = ready_run()
        batches = [envelopes(1, 10, run=run), envelopes(6, 15, run=run), envelopes(1, 15, run=run),
                   envelopes(11, 20, run=run)]
        results = race(key, run, batches)
        assert all(status == 200 for status, _ in results), (trial, results)
        seqs = list(RunnerEvent.objects.filter(run=run).order_by("position").values_list("source_seq", flat=True))
        assert seqs == list(range(1, len(seqs) + 1)), (trial, seqs)  # contiguous, in order, once each
        assert len(seqs) >= 15  # the 1..15 batch alone reaches 15
        cursor = RunnerSource.objects.get(run=run).acked_seq
        assert cursor == len(seqs)
        assert all(body["ackedSourceSeq"] <= cursor for _, body in results)
        assert RunEvent.objects.filter(run=run, kind="runner").count() == len(seqs)


@pytest.mark.skipif("not is_postgres()", reason="row-lock evidence needs PostgreSQL")
def test_row_locks_serialize_on_postgresql():
    """Eight clients, one batch, many trials: exactly one of them commits it."""
    for trial in range(10):
        run, key = ready_run()
        batch = envelopes(1, 50, run=run)
        results = race(key, run, [batch] * 8)
        bodies = [body for _, body in results]
        assert {body["ackedSourceSeq"] for body in bodies} == {50}, (trial, bodies)
        assert sorted(body["accepted"] for body in bodies) == [0] * 7 + [50], (trial, bodies)
        assert RunnerEvent.objects.filter(run=run).count() == 50
