#!/usr/bin/env python
"""Symphony-profile dispatch latency (a benchmark, not a test).

What is measured: the time from posting a signed GitHub ``issues.labeled`` webhook that moves a
linked task into the operator-mapped *active* state ("in progress") to the moment the connector's
wake request for the assignee exists in the database (``WakeupRequest`` with source ``connector``).
The path is the production one: the HTTP webhook endpoint stores the verified event and enqueues
``connectors.tasks.process_task_events`` on commit through Redis; a real Celery worker (separate
process, prefork pool) applies it (backlog -> todo through the issue service, then the debounced
connector wake with its strictly rendered task packet). Every sample is a different task (the wake
is debounced per link), each imported beforehand by its own ``issues.opened`` webhook.

Reported: median and p99 from request start, and from the 202 answer, plus the ratio against
Symphony's default 30 s poll interval (a tracker change is picked up on the next poll tick: 30 s
worst case, 15 s on average): ``30 s / median`` and ``15 s / median``.

    .venv/bin/python bench/symphony_latency_bench.py [--samples 100] [--concurrency 4]

* Database: ``DATABASE_URL`` (default ``postgres://postgres@127.0.0.1:5432/paperclip_symphony_bench``),
  created if missing, migrated and flushed every run (its name must contain "bench").
* Broker: Redis database 10 on 127.0.0.1 (``--redis-db``), emptied before and after.
* Server: this script re-executed with ``--serve`` (Django ``ThreadedWSGIServer`` on a random port);
  worker: ``celery -A paperclip worker`` with the same environment.
* Output: a table on stdout and ``bench/results/symphony_latency.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS = BENCH_DIR / "results" / "symphony_latency.json"
DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/paperclip_symphony_bench"
FIXTURE = ROOT / "connectors" / "sandbox" / "fixtures" / "github"
SECRET = "bench-symphony-secret"
REPO = "Codertocat/Hello-World"
SYMPHONY_POLL_SECONDS = 30.0

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import serving  # noqa: E402  (needs ROOT on sys.path)
from bench.serving import github_signature, redis_empty, serve_wsgi, stop_server  # noqa: E402,F401


def configure_env(args) -> str:
    url = serving.configure_worker_env(default_db=DEFAULT_DB, redis_db=args.redis_db, secret_name="PAPERCLIP_SECRET_BENCH_SYMPHONY_SECRET",
                                       secret=SECRET)
    return url


def sign(body: bytes) -> str:
    return github_signature(SECRET, body)


def body_for(template: dict, n: int, *, labeled: bool) -> bytes:
    payload = json.loads(json.dumps(template))
    issue = payload["issue"]
    issue.update(id=20_000_000 + n, number=n, node_id=f"sym-{n}", title=f"Symphony bench {n}",
                 html_url=f"https://github.com/{REPO}/issues/{n}", state="open", closed_at=None)
    label = {"id": 77, "node_id": "L77", "url": f"https://api.github.com/repos/{REPO}/labels/in%20progress",
             "name": "in progress", "color": "ededed", "default": False, "description": ""}
    issue["labels"] = [label] if labeled else []
    # webhook payloads are applied in arrival order; a later updated_at marks the newer state
    issue["updated_at"] = f"2030-01-01T00:00:{'30' if labeled else '10'}Z"
    if labeled:
        payload["label"] = label
    return json.dumps(payload).encode()


def create_bench_data():
    from django.core.management import call_command
    from django.db import connection

    from connectors.services.instances import instance_create
    from issues.actors import SYSTEM
    from issues.services.companies import agent_create, company_create

    call_command("migrate", interactive=False, verbosity=0)
    call_command("flush", interactive=False, verbosity=0)
    company = company_create(name="Symphony Bench", issue_prefix="SYM")
    coder = agent_create(company=company, name="coder", role="engineer")  # adapter "none": nothing spawns
    instance = instance_create(
        actor=SYSTEM, company=company, name="bench symphony", provider_key="github_issues",
        base_url="https://api.github.invalid", containers=[REPO],
        state_mapping={"open": "backlog", "closed": "terminal", "labels": {"in progress": "active"}},
        webhook_secret="env:PAPERCLIP_SECRET_BENCH_SYMPHONY_SECRET", triage_agent_id=coder.pk,
        default_run_mode="symphony_compatible", routing_rules=[{"kind": "default_route", "agentId": coder.pk}])
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    return instance


# ----------------------------------------------------------------------------------- the server
def serve(args):
    configure_env(args)
    import django

    django.setup()
    serve_wsgi(args.port)


def start_server(args):
    return serving.start_server(__file__, ["--redis-db", str(args.redis_db)], "symphony_latency_bench")


def start_worker(args):
    celery = Path(sys.executable).with_name("celery")
    cmd = [str(celery), "-A", "paperclip", "worker", "--loglevel=WARNING",
           "--concurrency", str(args.worker_concurrency),
           "--without-gossip", "--without-mingle", "--hostname", f"symphony-bench-{uuid.uuid4().hex[:6]}@%h"]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def stop_worker(proc):
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def post(client, body: bytes, event: str = "issues"):
    return client.post("/api/connectors/{}/webhook".format(os.environ["BENCH_INSTANCE"]), content=body, headers={
        "Content-Type": "application/json", "X-GitHub-Event": event, "X-GitHub-Delivery": str(uuid.uuid4()),
        "X-Hub-Signature-256": sign(body), "User-Agent": "GitHub-Hookshot/bench"})


def wait_for(predicate, timeout: float, poll: float = 0.001):
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if predicate():
            return time.perf_counter()
        time.sleep(poll)
    return None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--redis-db", type=int, default=10)
    parser.add_argument("--worker-concurrency", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=30.0, help="per-sample limit (s)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return serve(args)

    from bench.checkout_bench import db_params, ensure_database

    url = configure_env(args)
    ensure_database(db_params(url))
    import django

    django.setup()
    import httpx
    from django.db import connections

    from connectors.models import TaskLink
    from issues.models import WakeupRequest

    redis_empty(args.redis_db)
    instance = create_bench_data()
    os.environ["BENCH_INSTANCE"] = str(instance.pk)
    template_opened = json.loads((FIXTURE / "issues_opened.payload.json").read_text())
    template_labeled = json.loads((FIXTURE / "issues_labeled.payload.json").read_text())
    connections.close_all()
    server, base_url = start_server(args)
    worker = start_worker(args)
    client = httpx.Client(base_url=base_url, timeout=30.0, trust_env=False)
    total = args.warmup + args.samples
    from_request, from_accept, errors = [], [], 0
    try:
        print(f"server {base_url}; celery worker pid {worker.pid} (concurrency {args.worker_concurrency}); "
              f"{args.samples} samples after {args.warmup} warm-up; load average {os.getloadavg()[0]:.2f}",
              flush=True)
        # Import every task first (backlog, unlabeled): one link per sample.
        for n in range(1, total + 1):
            response = post(client, body_for(template_opened, n, labeled=False))
            assert response.status_code == 202, response.text
        ok = wait_for(lambda: TaskLink.objects.filter(instance=instance).count() >= total, 120, poll=0.05)
        if ok is None:
            sys.exit("symphony_latency_bench: the worker did not import the tasks (is it running?)")
        links = {int(link.external_key.rsplit("#", 1)[1]): link
                 for link in TaskLink.objects.filter(instance=instance).select_related("issue")}
        assert all(link.issue.status == "backlog" for link in links.values())
        for n in range(1, total + 1):
            link = links[n]
            body = body_for(template_labeled, n, labeled=True)
            started = time.perf_counter()
            response = post(client, body)
            accepted = time.perf_counter()
            if response.status_code != 202:
                errors += 1
                continue
            done = wait_for(lambda: WakeupRequest.objects.filter(issue_id=link.issue_id, source="connector").exists(),
                            args.timeout)
            if done is None:
                errors += 1
                continue
            if n > args.warmup:
                from_request.append((done - started) * 1000)
                from_accept.append((done - accepted) * 1000)
    finally:
        client.close()
        stop_worker(worker)
        stop_server(server)
        redis_empty(args.redis_db)

    if not from_request:
        sys.exit(f"symphony_latency_bench: no sample completed ({errors} errors)")
    median = statistics.median(from_request)
    result = {
        "samples": len(from_request), "errors": errors,
        "fromRequest": {"medianMs": round(median, 2), "p99Ms": round(percentile(from_request, 0.99), 2),
                        "minMs": round(min(from_request), 2), "maxMs": round(max(from_request), 2)},
        "fromAccepted": {"medianMs": round(statistics.median(from_accept), 2),
                         "p99Ms": round(percentile(from_accept, 0.99), 2)},
        "symphonyPollSeconds": SYMPHONY_POLL_SECONDS,
        "speedupVsPollInterval": round(SYMPHONY_POLL_SECONDS * 1000 / median, 1),
        "speedupVsMeanPollWait": round(SYMPHONY_POLL_SECONDS * 500 / median, 1),
        "workerConcurrency": args.worker_concurrency, "database": "postgresql", "broker": "redis",
        "loadAverage": round(os.getloadavg()[0], 2),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"webhook -> connector wake request: median {result['fromRequest']['medianMs']} ms, "
          f"p99 {result['fromRequest']['p99Ms']} ms (from the 202: median {result['fromAccepted']['medianMs']} ms, "
          f"p99 {result['fromAccepted']['p99Ms']} ms); errors {errors}")
    print(f"Symphony default poll interval 30 s: {result['speedupVsPollInterval']}x faster than one interval, "
          f"{result['speedupVsMeanPollWait']}x faster than the mean 15 s wait")
    return 0


if __name__ == "__main__":
    sys.exit(main())
