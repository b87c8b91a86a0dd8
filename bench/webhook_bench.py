#!/usr/bin/env python
"""Webhook intake and apply benchmark (a benchmark, not a test).

Intake: ``POST /api/connectors/{id}/webhook`` (GitHub signatures, ``issues.opened`` bodies built
from the real fixture, each a distinct issue and delivery id) against a baseline measured in the
same run: a bare Django view that reads the raw body and INSERTs it into a table. N concurrent
keep-alive HTTP clients; baseline and intake rounds alternate; medians are reported; the ratio is
intake throughput / baseline throughput (target >= 0.8), with the p50 and p99 of both side by side.

Apply: the stored events are then applied by this process (one worker process, sequentially,
exactly the code a Celery worker runs): events applied per second, and statements per applied
event (transaction control not counted) for edit + comment events on an instance with 10 links and
on one with 10,000 links.

    .venv/bin/python bench/webhook_bench.py [--clients 8] [--per-client 200] [--rounds 3]
                                            [--server gunicorn [--workers 2] [--threads 8]] [--skip-apply]

* Database: ``DATABASE_URL`` (default ``postgres://postgres@127.0.0.1:5432/paperclip_webhook_bench``),
  created if missing, migrated and flushed every run (its name must contain "bench").
* Broker: Redis database 8 on 127.0.0.1 (``--redis-db``), emptied before and after, so intake
  pays the real enqueue-on-commit (no worker consumes during intake).
* Server: on 127.0.0.1 (random port), serving the app's URLs plus the baseline (this module is the
  server's URLconf), so intake and baseline share one server. ``--server threaded`` (default): this
  script re-executed with ``--serve``, a Django ``ThreadedWSGIServer``; ``--server gunicorn``: the
  production server (``gunicorn.conf.py``, gthread ``--workers`` x ``--threads``; bench/serving.py).
* Output: a table on stdout and ``bench/results/webhook.json`` (``webhook-gunicorn.json`` with
  ``--server gunicorn``).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS = BENCH_DIR / "results" / "webhook.json"
DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/paperclip_webhook_bench"
FIXTURE = ROOT / "connectors" / "sandbox" / "fixtures" / "github"  # the real payloads, copied unchanged
SECRET = "bench-webhook-secret"
REPO = "Codertocat/Hello-World"
TARGET_RATIO = 0.8  # issue #19: webhook intake >= 0.8 of the bare baseline
RAW_TABLE = "bench_raw_webhook_body"
CONTROL = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK")

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import serving  # noqa: E402  (needs ROOT on sys.path)
from bench.serving import github_signature, redis_empty, serve_wsgi, stop_server  # noqa: E402,F401


# ----------------------------------------------------------------------- the server's URLconf
def _baseline(request):
    """Bare Django: read the raw body, store it in one INSERT, answer 202."""
    from django.db import connection
    from django.http import JsonResponse

    body = request.body
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {RAW_TABLE} (body, received_at) VALUES (%s, now()) RETURNING id", [body])
        row_id = cursor.fetchone()[0]
    return JsonResponse({"id": row_id}, status=202)


def __getattr__(name):  # PEP 562: Django reads ``urlpatterns`` from this module after setup
    if name == "urlpatterns":
        from django.urls import path
        from django.views.decorators.csrf import csrf_exempt

        from paperclip.urls import urlpatterns as app_urlpatterns

        return [path("bench/raw-webhook", csrf_exempt(_baseline)), *app_urlpatterns]
    if name in ("handler404", "handler500"):
        import paperclip.urls

        return getattr(paperclip.urls, name)
    raise AttributeError(name)


# --------------------------------------------------------------------------------------- setup
def configure_env(args) -> str:
    url = serving.configure_worker_env(default_db=DEFAULT_DB, redis_db=args.redis_db,
                                       secret_name="PAPERCLIP_SECRET_BENCH_WEBHOOK_SECRET", secret=SECRET)
    serving.ensure_secret_key()  # shared with the server, which refuses the development key under gunicorn
    if args.conn_max_age is not None:
        os.environ["CONN_MAX_AGE"] = str(args.conn_max_age)
    return url


def django_setup():
    import django
    from django.conf import settings

    settings.ROOT_URLCONF = "bench.webhook_bench"
    django.setup()


def sign(body: bytes) -> str:
    return github_signature(SECRET, body)


def opened_body(template: dict, n: int) -> bytes:
    payload = json.loads(json.dumps(template))
    payload["issue"]["id"] = 10_000_000 + n
    payload["issue"]["number"] = n
    payload["issue"]["node_id"] = f"bench-{n}"
    payload["issue"]["title"] = f"Bench issue {n}"
    payload["issue"]["html_url"] = f"https://github.com/{REPO}/issues/{n}"
    return json.dumps(payload).encode()


def create_bench_data(args) -> dict:
    from django.core.management import call_command
    from django.db import connection

    from connectors.services.instances import instance_create
    from issues.actors import SYSTEM
    from issues.services.companies import agent_create, company_create

    call_command("migrate", interactive=False, verbosity=0)
    call_command("flush", interactive=False, verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {RAW_TABLE}")
        cursor.execute(f"CREATE TABLE {RAW_TABLE} (id bigserial PRIMARY KEY, body bytea NOT NULL, "
                       f"received_at timestamptz NOT NULL)")
    company = company_create(name="Webhook Bench", issue_prefix="WHB")
    triage = agent_create(company=company, name="triage", role="engineer")
    mapping = {"open": "backlog", "closed": "terminal", "labels": {"in progress": "active"}}
    instances = {}
    for label in ("intake", "small", "large"):
        instances[label] = instance_create(
            actor=SYSTEM, company=company, name=f"bench {label}", provider_key="github_issues",
            base_url="https://api.github.invalid", containers=[REPO], state_mapping=mapping,
            webhook_secret="env:PAPERCLIP_SECRET_BENCH_WEBHOOK_SECRET", triage_agent_id=triage.pk)
    template = json.loads((FIXTURE / "issues_opened.payload.json").read_text())
    total = (args.rounds + 1) * args.clients * args.per_client
    bodies = [opened_body(template, n) for n in range(1, total + 1)]
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    return {"company": company, "instances": instances, "bodies": bodies, "template": template}


# ----------------------------------------------------------------------------------- the server
def serve(args):
    configure_env(args)
    django_setup()
    serve_wsgi(args.port)


def start_server(args):
    extra = ["--redis-db", str(args.redis_db)]
    if args.conn_max_age is not None:
        extra += ["--conn-max-age", str(args.conn_max_age)]
    return serving.launch(args, __file__, extra, "webhook_bench", urlconf="bench.webhook_bench")


# ---------------------------------------------------------------------------------- the clients
def run_phase(label, phase, clients, work, args, server_pid) -> dict:
    from bench.checkout_bench import percentile, process_cpu_seconds

    n = len(clients)
    latencies = [[] for _ in range(n)]
    statuses = [{} for _ in range(n)]
    barrier = threading.Barrier(n + 1)

    def worker(i):
        client, lat, st = clients[i], latencies[i], statuses[i]
        items = work[i]
        barrier.wait()
        for url, body, headers in items:
            t0 = time.perf_counter()
            try:
                code = client.post(url, content=body, headers=headers).status_code
            except Exception as exc:  # noqa: BLE001 - counted and reported
                code = type(exc).__name__
            lat.append(time.perf_counter() - t0)
            st[code] = st.get(code, 0) + 1

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    cpu0, db0 = process_cpu_seconds(server_pid), serving.database_cpu_seconds()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join(timeout=args.phase_timeout)
    wall = time.perf_counter() - t0
    cpu1, db1 = process_cpu_seconds(server_pid), serving.database_cpu_seconds()
    all_lat = sorted(x for lat in latencies for x in lat)
    counts = {}
    for st in statuses:
        for code, c in st.items():
            counts[str(code)] = counts.get(str(code), 0) + c
    return {"label": label, "phase": phase, "requests": len(all_lat), "wall_s": wall,
            "throughput_rps": len(all_lat) / wall if wall else float("nan"),
            "p50_ms": percentile(all_lat, 50) * 1000, "p99_ms": percentile(all_lat, 99) * 1000,
            "server_cpu_ms_per_req": (cpu1 - cpu0) * 1000 / len(all_lat) if all_lat and cpu0 is not None else None,
            "db_cpu_ms_per_req": (db1 - db0) * 1000 / len(all_lat) if all_lat and db0 is not None else None,
            "statuses": counts, "errors": sum(c for code, c in counts.items() if code != "202")}


def work_for(phase, bodies, instance_id, clients, per_client):
    items = []
    for i in range(clients):
        chunk = bodies[i * per_client:(i + 1) * per_client]
        if phase == "baseline":
            items.append([("/bench/raw-webhook", b, {"content-type": "application/json"}) for b in chunk])
        else:
            items.append([(f"/api/connectors/{instance_id}/webhook", b,
                           {"content-type": "application/json", "x-github-event": "issues",
                            "x-github-delivery": f"bench-{hashlib.sha1(b).hexdigest()}",
                            "x-hub-signature-256": sign(b)}) for b in chunk])
    return items


# ------------------------------------------------------------------------------------- applying
def apply_all(instance, *, capture=False) -> dict:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from connectors.choices import UNFINISHED_EVENT_STATUSES
    from connectors.models import InboundEvent
    from connectors.services.inbound import task_events_process

    task_ids = list(InboundEvent.objects.filter(instance=instance, status__in=UNFINISHED_EVENT_STATUSES)
                    .values_list("external_task_id", flat=True).distinct())
    applied = statements = 0
    t0 = time.perf_counter()
    ctx = CaptureQueriesContext(connection) if capture else None
    if ctx is not None:
        ctx.__enter__()
    try:
        for task_id in task_ids:
            counts = task_events_process(instance_id=instance.pk, external_task_id=task_id)
            applied += counts["applied"] + counts["dropped"]
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)
            statements = sum(1 for q in ctx.captured_queries if not q["sql"].upper().startswith(CONTROL))
    wall = time.perf_counter() - t0
    left = InboundEvent.objects.filter(instance=instance, status__in=UNFINISHED_EVENT_STATUSES).count()
    return {"events": applied, "wall_s": wall, "events_per_s": applied / wall if wall else float("nan"),
            "statements_per_event": statements / applied if capture and applied else None, "left": left}


def queue_updates(instance, template_dir, tasks: int, per_task: int):
    """Edit + comment events (signed, verified by the real adapter) on ``tasks`` linked issues."""
    from connectors.services.intake import webhook_intake

    opened = json.loads((template_dir / "issues_opened.payload.json").read_text())
    edited = json.loads((template_dir / "issues_edited.payload.json").read_text())
    commented = json.loads((template_dir / "issue_comment_created.payload.json").read_text())

    def post(event, payload):
        body = json.dumps(payload).encode()
        headers = {"x-github-event": event, "x-github-delivery": hashlib.sha1(body).hexdigest(),
                   "x-hub-signature-256": sign(body)}
        webhook_intake(instance=instance, body=body, headers=headers)

    for t in range(1, tasks + 1):
        issue = {**opened["issue"], "id": 50_000_000 + t, "number": t, "title": f"linked {t}",
                 "html_url": f"https://github.com/{REPO}/issues/{t}", "updated_at": "2024-01-01T00:00:00Z"}
        post("issues", {**opened, "issue": issue})
    apply_all(instance)
    for k in range(per_task):
        for t in range(1, tasks + 1):
            stamp = f"2024-01-02T00:{k // 60:02d}:{k % 60:02d}Z"
            issue = {**edited["issue"], "id": 50_000_000 + t, "number": t, "title": f"linked {t} v{k}",
                     "html_url": f"https://github.com/{REPO}/issues/{t}", "updated_at": stamp}
            post("issues", {**edited, "issue": issue})
            comment = {**commented["comment"], "id": 70_000_000 + t * 1000 + k, "body": f"comment {k}",
                       "updated_at": stamp, "created_at": stamp}
            post("issue_comment", {**commented, "issue": issue, "comment": comment})


def bulk_links(instance, count: int):
    from connectors.models import TaskLink
    from issues.models import Company, Issue

    company = Company.objects.get(pk=instance.company_id)
    start = company.issue_counter
    issues = [Issue(company=company, number=start + n, identifier=f"{company.issue_prefix}-{start + n}",
                    title=f"bulk {n}") for n in range(1, count + 1)]
    Issue.objects.bulk_create(issues, batch_size=2000)
    Company.objects.filter(pk=company.pk).update(issue_counter=start + count)
    TaskLink.objects.bulk_create([TaskLink(company=company, instance=instance, provider_key=instance.provider_key,
                                           issue=i, external_task_id=f"bulk-{n}", external_key=f"{REPO}#{90000 + n}",
                                           status="healthy") for n, i in enumerate(issues)], batch_size=2000)


# ------------------------------------------------------------------------------------------ main
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--per-client", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--redis-db", type=int, default=8)
    parser.add_argument("--conn-max-age", type=int, default=None)
    parser.add_argument("--phase-timeout", type=float, default=300)
    serving.add_server_arguments(parser)
    parser.add_argument("--skip-apply", action="store_true", help="intake over HTTP only, no apply phase")
    parser.add_argument("--output", type=Path, default=None,
                        help="results file (default bench/results/webhook.json, webhook-gunicorn.json "
                             "with --server gunicorn)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return serve(args)
    if args.output is None:
        args.output = RESULTS if args.server == "threaded" else RESULTS.with_name(f"webhook-{args.server}.json")

    from bench.checkout_bench import db_params, ensure_database

    url = configure_env(args)
    ensure_database(db_params(url))
    django_setup()
    import httpx
    from django.db import connections

    redis_empty(args.redis_db)
    data = create_bench_data(args)
    connections.close_all()
    server = serving.server_config(args)
    proc, base_url = start_server(args)
    clients = [httpx.Client(base_url=base_url, timeout=30.0, trust_env=False,
                            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1))
               for _ in range(args.clients)]
    block = args.clients * args.per_client
    bodies = data["bodies"]
    intake_id = data["instances"]["intake"].pk
    results = []
    try:
        print(f"server: {serving.describe(server)} at {base_url} (pid {proc.pid})")
        print(f"{args.clients} clients x {args.per_client} requests, "
              f"{args.rounds} rounds; load average {os.getloadavg()[0]:.2f}")
        warm = [min(20, args.per_client)] * args.clients
        for phase in ("baseline", "intake"):
            run_phase("warmup", phase, clients, [w[:warm[0]] for w in work_for(
                phase, bodies[:block], intake_id, args.clients, args.per_client)], args, proc.pid)
        for rnd in range(args.rounds):
            chunk = bodies[(rnd + 1) * block:(rnd + 2) * block]
            for phase in ("baseline", "intake"):
                r = run_phase(f"{phase} #{rnd + 1}", phase, clients,
                              work_for(phase, chunk, intake_id, args.clients, args.per_client), args, proc.pid)
                results.append(r)
                print(f"  {r['label']:<12} {r['throughput_rps']:8.1f} req/s  p50 {r['p50_ms']:6.2f} ms  "
                      f"p99 {r['p99_ms']:7.2f} ms  errors {r['errors']}", flush=True)
    finally:
        for c in clients:
            c.close()
        stop_server(proc)

    def med(phase, key):
        return statistics.median(r[key] for r in results if r["phase"] == phase)

    summary = {p: {k: med(p, k) if all(r[k] is not None for r in results) else None
                   for k in ("throughput_rps", "p50_ms", "p99_ms", "server_cpu_ms_per_req", "db_cpu_ms_per_req")}
               for p in ("baseline", "intake")}
    ratio = summary["intake"]["throughput_rps"] / summary["baseline"]["throughput_rps"]
    p99_ratio = summary["intake"]["p99_ms"] / summary["baseline"]["p99_ms"]
    for p in ("baseline", "intake"):
        summary[p]["requests"] = sum(r["requests"] for r in results if r["phase"] == p)
        summary[p]["errors"] = sum(r["errors"] for r in results if r["phase"] == p)
    print()
    print(f"Webhook intake: {args.clients} clients, server: {serving.describe(server)} "
          f"(baseline and intake served by it alike)")
    print(f"{'':<22}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'server CPU ms/req':>20}{'database CPU ms/req':>22}"
          f"{'errors':>8}")
    for p in ("baseline", "intake"):
        s = summary[p]
        cpu = f"{s['server_cpu_ms_per_req']:.2f}" if s["server_cpu_ms_per_req"] is not None else "n/a"
        db = f"{s['db_cpu_ms_per_req']:.2f}" if s["db_cpu_ms_per_req"] is not None else "n/a"
        print(f"{p:<22}{s['throughput_rps']:>10.1f}{s['p50_ms']:>10.2f}{s['p99_ms']:>10.2f}{cpu:>20}{db:>22}"
              f"{s['errors']:>8}")
    print(f"intake / baseline throughput ratio: {ratio:.2f} (target >= {TARGET_RATIO})"
          f"{'' if ratio >= TARGET_RATIO else '  BELOW TARGET'}; p50 {summary['intake']['p50_ms']:.2f} vs "
          f"{summary['baseline']['p50_ms']:.2f} ms, p99 {summary['intake']['p99_ms']:.2f} vs "
          f"{summary['baseline']['p99_ms']:.2f} ms ({p99_ratio:.2f}x)")
    out = {"server": server, "intake": summary, "ratio": ratio, "p99_ratio": p99_ratio,
           "target_ratio": TARGET_RATIO, "rounds": results, "clients": args.clients,
           "per_client": args.per_client, "load_average": os.getloadavg()}
    if args.skip_apply:
        from connectors.models import InboundEvent

        redis_empty(args.redis_db)
        out["stored_events"] = InboundEvent.objects.filter(instance_id=intake_id).count()
        print(f"stored events: {out['stored_events']} (every accepted delivery exactly once)")
        return write_results(args, out)

    # Apply phase: this process is one worker; the broker's kicks are dropped (we drain directly).
    redis_empty(args.redis_db)
    from connectors.models import InboundEvent

    stored = InboundEvent.objects.filter(instance_id=intake_id).count()
    apply_imports = apply_all(data["instances"]["intake"])
    small, large = data["instances"]["small"], data["instances"]["large"]
    bulk_links(large, 10_000)
    per_links = {}
    for label, instance in (("10 links", small), ("10,000 links", large)):
        queue_updates(instance, FIXTURE, tasks=10, per_task=10)
        per_links[label] = apply_all(instance, capture=True)
    redis_empty(args.redis_db)

    print(f"stored events: {stored} (every accepted delivery exactly once)")
    print(f"apply, one worker process: {apply_imports['events']} imports in {apply_imports['wall_s']:.1f}s = "
          f"{apply_imports['events_per_s']:.1f} events/s (each creates an issue and a link)")
    for label, r in per_links.items():
        if not r["events"]:  # nothing was left for this worker to apply: say so instead of a figure
            print(f"apply edit+comment events with {label}: no events left to apply ({r['left']} unfinished)")
            continue
        print(f"apply edit+comment events with {label}: {r['events']} events, "
              f"{r['statements_per_event']:.1f} statements/event (transaction control not counted), "
              f"{r['events_per_s']:.1f} events/s under query capture")
    out.update({"stored_events": stored, "apply_imports": apply_imports, "apply_updates": per_links})
    return write_results(args, out)


def write_results(args, out: dict) -> int:
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=2, default=str))
    print(f"results: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
