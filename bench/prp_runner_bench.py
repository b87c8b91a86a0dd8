#!/usr/bin/env python
"""Reference PRP runner benchmark (a benchmark, not a test).

A real ``python -m prp_runner`` (fake harness, a generated script of N ``item.delta`` events with
no delays) drives one run on a real web process (this script re-executed with ``--serve``: Django's
ThreadedWSGIServer on loopback, bench/serving.py). The figure is **events/s from the runner's
outbox to committed host rows**: every event the run committed, over the time from the first
event's ``emittedAt`` (stamped when the runner stores it in its outbox) to the last row's
``received_at`` (stamped by the host as it commits the batch) — durable append with fsync, batching,
HTTP, authentication, contract validation, the intake's transaction, run log and projections.

The baseline, measured in the same run on the same database: bench/prp_intake_bench.py's bare
insert (one transaction per batch of 100 ready-made RunnerEvent rows, ``bulk_create``, nothing
else). The ratio is runner / bare.

    .venv/bin/python bench/prp_runner_bench.py [--events 3000]

Database: whichever ``DATABASE_URL`` points to (SQLite file by default). Like the test runner it
creates a throwaway test database, migrates it, and destroys it at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import serving  # noqa: E402  (needs ROOT on sys.path)
from bench.prp_intake_bench import Source, bare_poster, rate, setup_django  # noqa: E402

BATCH = 100  # the host's default maxBatchEvents: what the runner sends at most per request
RUNNER_TIMEOUT = 300


def database_url() -> str:
    """The URL of the database this process uses now (the test database), for the web process."""
    from django.db import connection

    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{os.path.abspath(s['NAME'])}"
    auth = quote(s["USER"] or "", safe="") + (":" + quote(s["PASSWORD"], safe="") if s.get("PASSWORD") else "")
    port = f":{s['PORT']}" if s.get("PORT") else ""
    return f"postgres://{auth}@{s.get('HOST') or '127.0.0.1'}{port}/{quote(s['NAME'], safe='')}"


def make_run():
    from issues.adapters.base import issue_run_key
    from issues.models import Agent, Company, HeartbeatRun

    company = Company.objects.create(name="Bench Co", issue_prefix="PRB")
    agent = Agent.objects.create(company=company, name="bench-prp", adapter_type="prp",
                                 adapter_config={"launch": "external"})
    run = HeartbeatRun.objects.create(company=company, agent=agent, status="running", adapter_type="prp")
    return run, issue_run_key(run)


def write_script(folder: Path, events: int) -> Path:
    """item.started, ``events`` deltas of ~120 bytes, item.completed, a done result, a succeeded
    terminal, exit 0: no delay anywhere, so the harness produces as fast as the outbox takes it."""
    steps = [{"kind": "event", "event_type": "item.started", "item_id": "item_bench",
              "payload": {"kind": "assistant_message", "text": ""}}]
    steps += [{"kind": "event", "event_type": "item.delta", "item_id": "item_bench",
               "payload": {"text": f"{i:06d} " + "x" * 113}} for i in range(events)]
    steps += [{"kind": "event", "event_type": "item.completed", "item_id": "item_bench",
               "payload": {"kind": "assistant_message", "text": f"{events} deltas"}},
              {"kind": "result", "payload": {
                  "schema": "paperclip.run_result.v1", "reportedWorkDisposition": "done", "summary": "bench",
                  "completionClaim": {"contractRevision": "bench", "objectiveSatisfied": True, "criteria": [],
                                      "remainingWork": []},
                  "evidence": [], "verification": [], "attentionRequests": [], "artifacts": []}},
              {"kind": "terminal", "payload": {"schema": "paperclip.prp.terminal.v1",
                                               "turnTerminalState": "completed", "runTerminalState": "succeeded",
                                               "reportedWorkDisposition": "done"}},
              {"kind": "exit", "code": 0}]
    path = folder / "bench.json"
    path.write_text(json.dumps({"schema": "paperclip.fake_harness.script.v1", "name": "bench", "steps": steps}))
    return path


def run_runner(base_url: str, run, key: str, folder: Path, events: int) -> float:
    """The runner as a subprocess until it exits (it must exit 0); its wall seconds."""
    argv = [sys.executable, "-m", "prp_runner", "--url", f"{base_url}/api/runner/v1/runs/{run.pk}/",
            "--run-id", str(run.pk), "--outbox", str(folder / "outbox.sqlite3"), "--cwd", str(folder),
            "--harness", "fake", "--script", str(write_script(folder, events))]
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    env.update({"PAPERCLIP_API_KEY": key, "PYTHONPATH": str(ROOT)})
    log = folder / "runner.log"
    started = time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT)
        try:
            code = proc.wait(timeout=RUNNER_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = None
    elapsed = time.perf_counter() - started
    if code != 0:
        sys.exit(f"prp_runner_bench: the runner exited with {code}:\n{log.read_text(errors='replace')[-4000:]}")
    return elapsed


def committed_rate(run) -> tuple[int, float]:
    """(events committed, events/s from the first outbox append to the last commit)."""
    from django.db.models import Max

    from issues.models import RunnerEvent

    rows = RunnerEvent.objects.filter(run=run)
    count = rows.count()
    first = min(datetime.fromisoformat(e["emittedAt"].replace("Z", "+00:00"))
                for e in rows.values_list("envelope", flat=True))
    last = rows.aggregate(last=Max("received_at"))["last"]
    return count, count / (last - first).total_seconds()


def serve(args):
    setup_django()
    serving.serve_wsgi(args.port)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=3000, help="item.delta events in the script (default 3000)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve(args)

    setup_django()
    from django.db import connection

    from issues.models import HeartbeatRun

    test_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    proc = None
    try:
        run, key = make_run()
        os.environ["DATABASE_URL"] = database_url()  # the web process serves the test database
        proc, base_url = serving.start_server(__file__, [], "prp_runner_bench")
        with tempfile.TemporaryDirectory(prefix="prp-runner-bench-") as folder:
            wall = run_runner(base_url, run, key, Path(folder), args.events)
        status = HeartbeatRun.objects.get(pk=run.pk).status
        count, runner_rate = committed_rate(run)
        bare = rate(bare_poster(run), Source(run, "bare"), BATCH, count)
        print(f"database: {connection.vendor} ({test_name}); one run, {count} events committed "
              f"(run {status}); runner process {wall:.1f} s wall\n")
        print(f"{'way':52} {'events/s':>10}")
        print(f"{'runner outbox -> committed host rows (real processes)':52} {runner_rate:10.0f}")
        print(f"{f'bare bulk insert, batches of {BATCH} (baseline)':52} {bare:10.0f}")
        print(f"\nratio runner / bare insert: {runner_rate / bare:.3f}  (bare is {bare / runner_rate:.1f}x faster)")
    finally:
        if proc is not None:
            serving.stop_server(proc)
        connection.creation.destroy_test_db(test_name, verbosity=0)


if __name__ == "__main__":
    main()
