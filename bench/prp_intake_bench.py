#!/usr/bin/env python
"""PRP event intake benchmark (a benchmark, not a test).

Commits the same kind of event envelopes into one run three ways, for batch sizes 1, 10 and 100:

* **HTTP intake** — ``POST /api/runner/v1/runs/{id}/events`` in process (DRF, the runner key's
  authentication, contract validation, the transaction with its locks, run log, cursors, liveness
  and the projections), i.e. what a runner gets;
* **service intake** — ``issues.runner.intake.runner_events`` (the same minus HTTP and auth);
* **bare insert** (the baseline, same run, same rows) — one transaction per batch with a
  ``bulk_create`` of ready-made RunnerEvent rows: no validation, no digest, no locks, no log;

and prints events/s for each with the ratio against the bare insert, then the statements per
batch (``CaptureQueriesContext``) for each batch size, to show they do not grow with the batch.

    .venv/bin/python bench/prp_intake_bench.py [--events 1000]

Database: whichever ``DATABASE_URL`` points to (SQLite file by default). Like the test runner it
creates a throwaway test database, migrates it, and destroys it at the end.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SIZES = (1, 10, 100)


def setup_django():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "paperclip.settings")
    os.environ["DEBUG"] = "False"
    import django

    django.setup()


def make_run():
    from issues.adapters.base import issue_run_key
    from issues.models import Agent, Company, HeartbeatRun
    from issues.runner.negotiation import runner_hello

    company = Company.objects.create(name="Bench Co", issue_prefix="PRP")
    agent = Agent.objects.create(company=company, name="bench-runner", adapter_type="runner")
    run = HeartbeatRun.objects.create(company=company, agent=agent, status="running", adapter_type="runner")
    key = issue_run_key(run)
    caps = {"schema": "paperclip.prp.capabilities.v1", "sessionReusePolicy": "new_per_run",
            "driver": {"kind": "bench", "version": "1"}, "steer": True, "interrupt": True, "resume": True,
            "runtimeRequests": True, "structuredResult": True, "typedEvents": True}
    runner_hello(run=run, body={"protocolMin": 1, "protocolMax": 1, "runnerInstanceId": "bench",
                                "capabilities": caps})
    return run, key


class Source:
    """Envelopes of one source, numbered on."""

    def __init__(self, run, instance):
        self.run_id, self.instance, self.seq = str(run.pk), instance, 0

    def batch(self, size):
        out = []
        for _ in range(size):
            self.seq += 1
            out.append({"schema": "paperclip.prp.event.v1", "sourceEventId": f"{self.instance}-{self.seq}",
                        "sourceSeq": self.seq, "sourceInstanceId": self.instance, "sourceKind": "runner",
                        "runId": self.run_id, "eventType": "runtime.phase.changed", "schemaVersion": 1,
                        "priority": 1, "emittedAt": "2026-08-07T12:00:00.000Z",
                        "payload": {"phase": "running", "detail": "x" * 120}})
        return out


def http_poster(run, key):
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    url = f"/api/runner/v1/runs/{run.pk}/events"

    def post(batch):
        response = client.post(url, {"events": batch}, format="json")
        assert response.status_code == 200 and response.json()["accepted"] == len(batch), response.content[:300]
    return post


def service_poster(run):
    from issues.runner.intake import runner_events

    def post(batch):
        assert runner_events(run=run, body={"events": batch})["accepted"] == len(batch)
    return post


def bare_poster(run):
    """The same rows, inserted as-is (positions far above the intake's, so both share the run)."""
    from django.db import transaction

    from issues.models import RunnerEvent

    position = [10**12]

    def post(batch):
        rows = []
        for env in batch:
            position[0] += 1
            rows.append(RunnerEvent(run_id=run.pk, position=position[0], source_key=f"runner:{env['sourceInstanceId']}",
                                    source_event_id=env["sourceEventId"], source_seq=env["sourceSeq"],
                                    event_type=env["eventType"], digest="0" * 64, envelope=env))
        with transaction.atomic():
            RunnerEvent.objects.bulk_create(rows)
    return post


def rate(post, source, size, total):
    post(source.batch(size))  # warm
    batches = [source.batch(size) for _ in range(max(1, total // size))]
    started = time.perf_counter()
    for batch in batches:
        post(batch)
    elapsed = time.perf_counter() - started
    return len(batches) * size / elapsed


def queries_per_batch(post, source, size):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        post(source.batch(size))
    return len(queries)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1000, help="events per batch size and way (default 1000)")
    args = parser.parse_args()

    setup_django()
    from django.db import connection

    test_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    try:
        run, key = make_run()
        ways = [("HTTP intake (with projections)", http_poster(run, key), Source(run, "http")),
                ("service intake (with projections)", service_poster(run), Source(run, "service")),
                ("bare bulk insert (baseline)", bare_poster(run), Source(run, "bare"))]
        print(f"database: {connection.vendor} ({test_name}); {args.events} events per batch size and way, "
              f"one run\n")
        print(f"{'batch':>5}  {'way':36} {'events/s':>10} {'bare/this':>9}")
        for size in SIZES:
            rates = [(label, rate(post, source, size, args.events)) for label, post, source in ways]
            bare = rates[-1][1]
            for label, value in rates:
                print(f"{size:>5}  {label:36} {value:10.0f} {bare / value:9.2f}")
        print(f"\n{'batch':>5}  {'statements per batch (HTTP intake)':36} {'per event':>10}")
        http_post, http_source = ways[0][1], ways[0][2]
        for size in SIZES:
            count = queries_per_batch(http_post, http_source, size)
            print(f"{size:>5}  {count:36d} {count / size:10.2f}")
    finally:
        connection.creation.destroy_test_db(test_name, verbosity=0)


if __name__ == "__main__":
    main()
