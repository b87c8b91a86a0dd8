#!/usr/bin/env python
"""Inbound apply benchmark: throughput per worker and scaling with workers (a benchmark, not a test).

A backlog of signed GitHub deliveries (the real fixtures, through the real ``webhook_intake``) is
stored with kicks off: ``--tasks`` external tasks, ``--per-task`` events each (an ``issues.opened``
import, then alternating ``issues.edited`` and ``issue_comment.created``), stored round-robin so the
events of one task are interleaved with everyone else's, as they arrive from a tracker. Every task is
labelled ``in progress`` (active: the import is ``todo`` and wakes its agent) and ``agent/aN``
(routed to one of ``--agents`` agents by a label rule), so an event writes an issue, a link, a wake
and a run, like production imports do, not the triage-fallback path.

* Baseline (same run): bare ORM inserts of the rows an import adds that the issue names, one
  ``Issue``, one ``TaskLink`` and one ``WakeupRequest`` per event, each event in one transaction,
  by this process. It is measured next to every figure it is compared with, because this machine's
  speed drifts by tens of percent within minutes: before each in-process round, and before and
  after each Celery phase.
* Apply, one worker process: this process applies a copy of the backlog with exactly the code a
  Celery worker runs (``task_events_process`` per task); events/s and the ratio to the baseline
  (target >= 0.5), in ``--rounds`` alternating baseline / apply pairs (default 3), the median ratio
  reported. ``--profile`` also prints cProfile's top functions and the statements of each event of
  one task.
* Scaling: phases of 1, 2, 2 and 1 workers (``--workers``), each on its own copy of the backlog,
  applied by real Celery workers (``celery -A paperclip worker -c 1 -Q apply_bench``, Redis broker
  on 127.0.0.1), kicked as intake's Kicker kicks a burst: one ``process_task_events_many`` message
  per ``--kick-batch`` stored events (default ``PAPERCLIP_CONNECTOR_KICK_BATCH_SIZE``, 8), naming
  their tasks; ``--kick-batch 1`` sends one ``process_task_events`` message per event. Rate = events
  over the window between the first and the last ``applied_at`` (worker start-up is not counted).
  Per-worker ratio against the mean of the baselines measured right before and after the phase.
  Ratio 2 workers / 1 worker (target >= 1.6): the mean rate of the 2-worker phases over that of the
  1-worker phases (the ABBA order cancels a steady drift), and beside it the same from the per-worker
  ratios. Then every event is checked: applied exactly once (attempts = 1, one issue and one link per
  task, one comment per comment event) and in its task's order (``applied_at`` increases with ``id``
  within a task; the last edit's title is the issue's).

    .venv/bin/python bench/apply_bench.py [--tasks 400] [--per-task 5] [--agents 8] [--profile]
                                          [--prior-issues 20000]

* ``--prior-issues N``: every company (the baseline's too) starts with N issues imported earlier from
  the same repository, so each import's §6.3 dedupe (origin, backlink, reference) runs against a
  company with history, as in production, not against an empty table.

* Database: ``DATABASE_URL`` (default ``postgres://postgres@127.0.0.1:5432/paperclip_apply_bench``),
  created if missing, migrated and flushed every run (its name must contain "bench").
* Broker: Redis database 6 on 127.0.0.1 (``--redis-db``), emptied before and after. Not 9-15: the
  Celery topology tests claim and empty those (tests/test_celery_topology.py), which would drop
  this benchmark's messages mid-run; a database carrying their claim key is refused.
* Two CPUs are shared with other work on this machine: absolute figures are noisy; read the ratios.
* Output: a table on stdout and ``bench/results/apply.json``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS = BENCH_DIR / "results" / "apply.json"
DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/paperclip_apply_bench"
FIXTURE = ROOT / "connectors" / "sandbox" / "fixtures" / "github"
SECRET = "bench-apply-secret"
REPO = "Codertocat/Hello-World"
QUEUE = "apply_bench"
TARGET_PER_WORKER = 0.5
TARGET_SCALING = 1.6
CONTROL = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK")

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import serving  # noqa: E402  (needs ROOT on sys.path)
from bench.serving import github_signature, redis_empty  # noqa: E402


def configure_env(args) -> str:
    url = serving.configure_worker_env(default_db=DEFAULT_DB, redis_db=args.redis_db, secret_name="PAPERCLIP_SECRET_BENCH_APPLY_SECRET",
                                       secret=SECRET)
    return url


def worker_env(args) -> dict:
    """The Celery workers' environment: this one, with kicks on (they apply what they are sent).
    ``--worker-conn-max-age``: PAPERCLIP_WORKER_CONN_MAX_AGE for the workers (unset: the deployment
    default, 60 s; 0 opens a database connection per message)."""
    env = dict(os.environ)
    env.pop("PAPERCLIP_CONNECTOR_KICK_ON_COMMIT", None)
    env["PYTHONFAULTHANDLER"] = "1"  # a stuck worker's stack: kill -ABRT <pool child>
    if args.worker_conn_max_age is not None:
        env["PAPERCLIP_WORKER_CONN_MAX_AGE"] = str(args.worker_conn_max_age)
    return env


# --------------------------------------------------------------------------------------- setup
def create_bench_data(args) -> dict:
    from django.core.management import call_command
    from django.db import connection

    from connectors.services.instances import instance_create
    from issues.actors import SYSTEM
    from issues.services.companies import agent_create, company_create

    call_command("migrate", interactive=False, verbosity=0)
    call_command("flush", interactive=False, verbosity=0)
    data = {"agents": {}, "instances": {}, "companies": {}}
    mapping = {"open": "backlog", "closed": "terminal", "labels": {"in progress": "active"}}
    # One company per measured backlog: every run starts from the same issue counter and table shape.
    for label in ("template", "baseline", *(f"inproc{r}" for r in range(args.rounds)),
                  *(f"celery{i}" for i in range(len(args.phases)))):
        company = company_create(name=f"Apply Bench {label}", issue_prefix=f"AB{label[:2].upper()}{len(data['companies'])}")
        data["companies"][label] = company
        agents = [agent_create(company=company, name=f"a{n}", role="engineer") for n in range(args.agents)]
        data["agents"][label] = agents
        data["instances"][label] = instance_create(
            actor=SYSTEM, company=company, name=f"apply bench {label}", provider_key="github_issues",
            base_url="https://api.github.invalid", containers=[REPO], state_mapping=mapping,
            webhook_secret="env:PAPERCLIP_SECRET_BENCH_APPLY_SECRET", triage_agent_id=agents[0].pk,
            routing_rules=[{"kind": "label", "match": {"label": "agent/*"}}])
    if args.prior_issues:
        for company in data["companies"].values():
            add_prior_issues(company, args.prior_issues)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    return data


PRIOR_NUMBERS = 1_000_000  # prior issues are numbered from here: the imports and the baseline count from 1


def add_prior_issues(company, count: int):
    """A company with history: ``count`` issues imported earlier from the same repository (their
    descriptions mention their own addresses, /issues/2000 and up, and a page of docs), which every
    §6.3 dedupe of an import must not mistake for the task it imports."""
    from issues.models import Issue

    Issue.objects.bulk_create(
        (Issue(company=company, number=PRIOR_NUMBERS + k, identifier=f"{company.issue_prefix}-{PRIOR_NUMBERS + k}",
               title=f"earlier task {k}", status="done", origin_kind="connector", origin_id=f"earlier:{k}",
               description=f"Imported from [{REPO}#{2000 + k}](https://github.com/{REPO}/issues/{2000 + k})\n\n"
                           f"Steps in https://docs.example.com/runbook/{k % 40}; logs attached.")
         for k in range(count)), batch_size=2000)


def backlog_bodies(args):
    """(event, body) in arrival order: round r of every task, then round r + 1."""
    opened = json.loads((FIXTURE / "issues_opened.payload.json").read_text())
    edited = json.loads((FIXTURE / "issues_edited.payload.json").read_text())
    commented = json.loads((FIXTURE / "issue_comment_created.payload.json").read_text())
    label_tpl = opened["issue"]["labels"][0]
    for r in range(args.per_task):
        for t in range(1, args.tasks + 1):
            stamp = f"2024-01-{1 + r // 60:02d}T00:{r % 60:02d}:00Z"
            labels = [{**label_tpl, "id": 1, "name": "in progress"},
                      {**label_tpl, "id": 2 + t % args.agents, "name": f"agent/a{t % args.agents}"}]
            base = opened if r == 0 else edited
            issue = {**base["issue"], "id": 50_000_000 + t, "number": t, "title": f"task {t} v{r}",
                     "html_url": f"https://github.com/{REPO}/issues/{t}", "updated_at": stamp, "labels": labels,
                     "assignee": None, "assignees": [], "milestone": None, "state": "open"}
            if r == 0 or r % 2 == 1:
                yield "issues", {**base, "issue": issue}
            else:
                comment = {**commented["comment"], "id": 70_000_000 + t * 100 + r, "body": f"comment {r} on {t}",
                           "updated_at": stamp, "created_at": stamp}
                yield "issue_comment", {**commented, "issue": {**issue, "title": f"task {t} v{r - 1}"},
                                        "comment": comment}


def store_backlog(instance, args) -> int:
    """Through the real intake (verification, parsing, dedupe), kicks off: nothing is applied."""
    from connectors.services.intake import webhook_intake

    n = 0
    for event, payload in backlog_bodies(args):
        body = json.dumps(payload).encode()
        headers = {"x-github-event": event, "x-github-delivery": hashlib.sha1(body).hexdigest(),
                   "x-hub-signature-256": github_signature(SECRET, body)}
        webhook_intake(instance=instance, body=body, headers=headers)
        n += 1
    return n


def copy_backlog(source, target, tasks: int | None = None) -> int:
    """The template's stored events, re-owned by ``target`` (same keys, payloads, order); optionally only
    those of the first ``tasks`` external tasks."""
    from django.db import connection

    from connectors.models import InboundEvent

    table = InboundEvent._meta.db_table
    cols = [f.column for f in InboundEvent._meta.concrete_fields if f.column not in ("id", "instance_id",
                                                                                      "company_id")]
    col_sql = ", ".join(f'"{c}"' for c in cols)
    where = ""
    params = [str(target.pk).replace("-", ""), str(target.company_id).replace("-", ""),
              str(source.pk).replace("-", "")]
    if tasks is not None:
        keep = [str(50_000_000 + t) for t in range(1, tasks + 1)]
        where = " AND external_task_id = ANY(%s)"
        params.append(keep)
    with connection.cursor() as cursor:
        cursor.execute(f'INSERT INTO "{table}" (instance_id, company_id, {col_sql}) '
                       f'SELECT %s, %s, {col_sql} FROM "{table}" WHERE instance_id = %s{where} ORDER BY id', params)
        return cursor.rowcount


# ------------------------------------------------------------------------------------ baseline
def baseline(company, agents, events: int, start: int = 1) -> dict:
    """Bare ORM inserts of one Issue, one TaskLink and one WakeupRequest per event, one transaction each;
    numbered from ``start`` (the baseline is measured several times into one company)."""
    from django.db import transaction

    from connectors.models import TaskLink
    from issues.models import Issue, WakeupRequest

    instance = company._bench_instance
    t0 = time.perf_counter()
    for n in range(start, start + events):
        agent = agents[n % len(agents)]
        with transaction.atomic():
            issue = Issue.objects.create(company=company, number=n, identifier=f"{company.issue_prefix}-{n}",
                                         title=f"task {n} v0", description="imported", status="todo",
                                         assignee_agent=agent, origin_kind="connector", origin_id=f"bench:{n}")
            TaskLink.objects.create(company=company, instance=instance, provider_key=instance.provider_key,
                                    issue=issue, external_task_id=str(n), external_key=f"{REPO}#{n}",
                                    status="healthy")
            WakeupRequest.objects.create(company=company, agent=agent, issue=issue, source="assignment",
                                         reason="issue_assigned")
    wall = time.perf_counter() - t0
    return {"events": events, "wall_s": wall, "events_per_s": events / wall}


# --------------------------------------------------------------------------- in-process apply
def task_order(instance) -> list[str]:
    from connectors.models import InboundEvent

    seen = {}
    for task_id in (InboundEvent.objects.filter(instance=instance).exclude(external_task_id="")
                    .order_by("id").values_list("external_task_id", flat=True)):
        seen.setdefault(task_id, None)
    return list(seen)


def apply_inproc(instance) -> dict:
    """This process is one worker: the tasks' queues in arrival order, exactly the worker's code."""
    from connectors.services.inbound import task_events_process

    applied = 0
    tasks = task_order(instance)
    t0 = time.perf_counter()
    for task_id in tasks:
        counts = task_events_process(instance_id=instance.pk, external_task_id=task_id)
        applied += counts["applied"] + counts["dropped"]
    wall = time.perf_counter() - t0
    return {"events": applied, "wall_s": wall, "events_per_s": applied / wall if wall else float("nan")}


def profile_one(instance, args) -> dict:
    """Statements of one import and one comment event, and cProfile's view of a few tasks."""
    import cProfile
    import io
    import pstats

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from connectors.choices import UNFINISHED_EVENT_STATUSES
    from connectors.models import InboundEvent
    from connectors.services.inbound import _process_head

    from connectors.models import ConnectorInstance

    instance = ConnectorInstance.objects.select_related("company").get(pk=instance.pk)
    tasks = task_order(instance)
    report = {}
    for task_id in tasks[:1]:
        kinds = list(InboundEvent.objects.filter(instance=instance, external_task_id=task_id,
                                                 status__in=UNFINISHED_EVENT_STATUSES).order_by("id")
                     .values_list("kind", flat=True))
        for kind in kinds:
            with CaptureQueriesContext(connection) as ctx:
                _process_head(instance.pk, task_id)
            sql = [q["sql"] for q in ctx.captured_queries if not q["sql"].upper().startswith(CONTROL)]
            report.setdefault(kind, []).append(len(sql))
            print(f"--- {kind} #{len(report[kind])}: {len(sql)} statements")
            for s in sql:
                print("   ", s[:220])
    prof = cProfile.Profile()
    prof.enable()
    t0 = time.perf_counter()
    n = 0
    for task_id in tasks[1:1 + args.profile_tasks]:
        while _process_head(instance.pk, task_id):
            n += 1
    wall = time.perf_counter() - t0
    prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("cumulative").print_stats(45)
    stats.sort_stats("tottime").print_stats(30)
    print(out.getvalue())
    report["profiled_events"], report["profiled_events_per_s"] = n, n / wall if wall else None
    return report


# ------------------------------------------------------------------------------- Celery workers
def publish(instance, kick_batch: int) -> int:
    """The kicks of the stored events, in arrival order, as intake's Kicker sends them under a burst:
    one ``process_task_events_many`` message per ``kick_batch`` events, naming their tasks (each once).
    ``kick_batch`` 1: one ``process_task_events`` message per event (every kick alone). Returns the
    messages sent."""
    from connectors import tasks
    from connectors.models import InboundEvent

    task_ids = list(InboundEvent.objects.filter(instance=instance).exclude(external_task_id="").order_by("id")
                    .values_list("external_task_id", flat=True))
    sent = 0
    with tasks.process_task_events.app.producer_or_acquire() as producer:
        for start in range(0, len(task_ids), kick_batch):
            chunk = list(dict.fromkeys(task_ids[start:start + kick_batch]))
            if kick_batch == 1:
                tasks.process_task_events.apply_async((str(instance.pk), chunk[0]), queue=QUEUE, producer=producer)
            else:
                tasks.process_task_events_many.apply_async(([[str(instance.pk), t] for t in chunk],), queue=QUEUE,
                                                           producer=producer)
            sent += 1
    return sent


def worker_log(tag: str, i) -> Path:
    return Path(tempfile.gettempdir()) / f"apply_bench_worker_{tag}{i}.log"


def start_workers(count: int, tag: str, args) -> list[subprocess.Popen]:
    procs = []
    for i in range(count):
        cmd = [str(Path(sys.executable).with_name("celery")), "-A", "paperclip", "worker", "-c", "1", "-Q", QUEUE,
               "-n", f"applybench{tag}{i}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat",
               "-l", "WARNING"]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=worker_env(args), stdout=subprocess.DEVNULL,
                                      stderr=open(worker_log(tag, i), "w")))
    return procs


def tree_cpu_seconds(pid: int) -> float:
    """utime + stime of a process and its live descendants (the Celery main process and its pool child)."""
    from bench.checkout_bench import process_cpu_seconds

    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        total += process_cpu_seconds(p) or 0.0
        try:
            todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except OSError:
            pass
    return total


def stop_workers(procs):
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def scaling(runs) -> dict:
    """Two workers' rate over one worker's, each the mean of its phases (in an ABBA order a steady drift of
    the machine's speed cancels out), and the same from the per-worker ratios to the baselines measured
    around each phase."""
    def mean(workers, key):
        values = [r[key] for r in runs if r["workers"] == workers]
        return statistics.mean(values) if values else None

    one, two = mean(1, "events_per_s"), mean(2, "events_per_s")
    if not one or not two:
        return {}
    return {"scaling_2w_over_1w": two / one,
            "scaling_2w_over_1w_baselined": 2 * mean(2, "ratio_to_baseline_per_worker")
            / mean(1, "ratio_to_baseline_per_worker")}


def apply_celery(instance, workers: int, args, tag: str) -> dict:
    from connectors.choices import UNFINISHED_EVENT_STATUSES
    from connectors.models import InboundEvent

    redis_empty(args.redis_db)
    events = InboundEvent.objects.filter(instance=instance)
    total = events.count()
    published = publish(instance, args.kick_batch)
    procs = start_workers(workers, tag, args)
    deadline = time.monotonic() + args.phase_timeout
    samples, waits, cpu = 0, {}, float("nan")
    load0 = os.getloadavg()[0]
    try:
        while time.monotonic() < deadline:
            left = events.filter(status__in=UNFINISHED_EVENT_STATUSES).count()
            if not left:
                break
            samples += 1
            for query in lock_waits():
                waits[query] = waits.get(query, 0) + 1
            if any(p.poll() is not None for p in procs):
                sys.exit(f"apply_bench: a Celery worker exited (see {worker_log(tag, '*')})")
            time.sleep(0.25)  # polling the benchmark's own progress, not a race in the code under test
        cpu = sum(tree_cpu_seconds(p.pid) for p in procs)
    finally:
        stop_workers(procs)
    stamps = sorted(events.exclude(applied_at=None).values_list("applied_at", flat=True))
    window = (stamps[-1] - stamps[0]).total_seconds() if len(stamps) > 1 else float("nan")
    left = events.filter(status__in=UNFINISHED_EVENT_STATUSES).count()
    return {"workers": workers, "events": total, "messages": published, "left": left, "window_s": window,
            "events_per_s": (len(stamps) - 1) / window if window else float("nan"),
            "worker_cpu_ms_per_event": cpu * 1000 / total if total else None,
            "load_average": [load0, os.getloadavg()[0]],
            "lock_wait_samples": {"samples": samples, "waiting": dict(sorted(waits.items(), key=lambda kv: -kv[1]))}}


def lock_waits() -> list[str]:
    """The statements worker backends are blocked on (a row or advisory lock) right now: serialisation
    between workers shows up here, CPU starvation does not."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT left(query, 90) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'")
        return [row[0] for row in cursor.fetchall()]


# --------------------------------------------------------------------------------- verification
def verify(instance, args) -> list[str]:
    """Exactly once and in order, for every event and task of the backlog."""
    from collections import defaultdict

    from connectors.models import InboundEvent, TaskLink
    from issues.models import Comment, Issue

    problems = []
    rows = list(InboundEvent.objects.filter(instance=instance).order_by("id")
                .values_list("id", "external_task_id", "status", "attempts", "applied_at", "kind"))
    by_task = defaultdict(list)
    for row in rows:
        by_task[row[1]].append(row)
        if row[2] not in ("applied", "dropped") or row[3] != 1:
            problems.append(f"event {row[0]} ({row[1]}): status {row[2]}, attempts {row[3]}")
    for task_id, events in by_task.items():
        stamps = [e[4] for e in events]
        if any(a is None or b is None or not a < b for a, b in zip(stamps, stamps[1:])):
            problems.append(f"task {task_id}: applied out of order")
    links = list(TaskLink.objects.filter(instance=instance).values_list("external_task_id", "issue_id"))
    if len(links) != len(by_task) or len({t for t, _ in links}) != len(by_task):
        problems.append(f"{len(links)} links for {len(by_task)} tasks")
    issues = dict(Issue.objects.filter(pk__in=[i for _, i in links]).values_list("pk", "title"))
    comments = defaultdict(int)
    for issue_id in Comment.objects.filter(issue_id__in=issues, provenance__kind="external_comment").values_list(
            "issue_id", flat=True):
        comments[issue_id] += 1
    want_comments = sum(1 for r in range(args.per_task) if r and r % 2 == 0)
    last_title = max((r for r in range(args.per_task) if r == 0 or r % 2 == 1))
    for task_id, issue_id in links:
        t = int(task_id) - 50_000_000
        if comments[issue_id] != want_comments:
            problems.append(f"task {task_id}: {comments[issue_id]} comments, expected {want_comments}")
        if not issues.get(issue_id, "").endswith(f"task {t} v{last_title}"):
            problems.append(f"task {task_id}: title {issues.get(issue_id)!r}, expected the last edit's")
    return problems


# ------------------------------------------------------------------------------------------ main
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=400)
    parser.add_argument("--per-task", type=int, default=5)
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--inproc-tasks", type=int, default=100, help="tasks of the in-process apply")
    parser.add_argument("--baseline-events", type=int, default=1000)
    parser.add_argument("--prior-issues", type=int, default=0,
                        help="issues every company already has (imported earlier from the same repository): "
                             "the §6.3 dedupe of each import searches them")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating baseline / in-process apply pairs (the median ratio is reported)")
    parser.add_argument("--redis-db", type=int, default=6)
    parser.add_argument("--phase-timeout", type=float, default=600)
    parser.add_argument("--worker-conn-max-age", type=int, default=None)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--profile-tasks", type=int, default=20)
    parser.add_argument("--kick-batch", type=int, default=None,
                        help="events whose kicks share a message (default: PAPERCLIP_CONNECTOR_KICK_BATCH_SIZE, "
                             "as intake under a burst; 1: a message per event)")
    parser.add_argument("--skip-celery", action="store_true")
    parser.add_argument("--skip-inproc", action="store_true")
    parser.add_argument("--workers", default="1,2,2,1",
                        help="Celery worker counts of the phases, in order, each on its own copy of the backlog "
                             "(the default's 1, 2, 2, 1 cancels a drift of the machine's speed over the run)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    args.phases = [] if args.skip_celery else [int(w) for w in args.workers.split(",")]

    from bench.checkout_bench import db_params, ensure_database

    url = configure_env(args)
    ensure_database(db_params(url))
    os.environ["PAPERCLIP_CONNECTOR_KICK_ON_COMMIT"] = "False"  # this process stores; workers apply
    import django

    django.setup()
    from django.db import connection

    from connectors.choices import InstanceStatus
    from connectors.models import ConnectorInstance

    if args.kick_batch is None:
        from connectors.services.common import conf

        args.kick_batch = int(conf("KICK_BATCH_SIZE"))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    import redis

    if redis.Redis(host="127.0.0.1", port=6379, db=args.redis_db).exists("paperclip-test-topology-claim"):
        sys.exit(f"apply_bench: Redis database {args.redis_db} is claimed by a test run; pick another --redis-db")
    redis_empty(args.redis_db)
    print(f"load average {os.getloadavg()[0]:.2f}; {args.tasks} tasks x {args.per_task} events, "
          f"{args.agents} agents, {args.prior_issues} prior issues per company")
    data = create_bench_data(args)
    inst = data["instances"]
    t0 = time.perf_counter()
    stored = store_backlog(inst["template"], args)
    store_s = time.perf_counter() - t0
    ConnectorInstance.objects.filter(pk=inst["template"].pk).update(status=InstanceStatus.PAUSED)
    copied = {f"inproc{r}": copy_backlog(inst["template"], inst[f"inproc{r}"], tasks=args.inproc_tasks)
              for r in range(args.rounds)}
    if not args.skip_celery:
        for i in range(len(args.phases)):  # (a copy for each phase)
            copied[f"celery{i}"] = copy_backlog(inst["template"], inst[f"celery{i}"])
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    print(f"stored {stored} events through webhook_intake in {store_s:.1f}s; copies {copied}")

    base_company = data["companies"]["baseline"]
    base_company._bench_instance = inst["baseline"]
    bases = []  # every baseline measured, in order: each measured figure is compared with the ones next to it

    def measure_baseline() -> dict:
        b = baseline(base_company, data["agents"]["baseline"], args.baseline_events,
                     start=1 + len(bases) * args.baseline_events)
        bases.append(b)
        print(f"baseline #{len(bases)} (bare Issue + TaskLink + WakeupRequest inserts, one transaction per "
              f"event): {b['events_per_s']:.1f} events/s", flush=True)
        return b

    out = {"tasks": args.tasks, "per_task": args.per_task, "agents": args.agents, "rounds": args.rounds,
           "prior_issues": args.prior_issues,
           "kick_batch": args.kick_batch, "worker_conn_max_age": args.worker_conn_max_age,
           "load_average_start": os.getloadavg()[0]}
    if args.profile:
        out["profile"] = profile_one(inst["inproc0"], args)
    inproc_rounds = []
    for r in range(args.rounds if not args.skip_inproc else 0):
        base = measure_baseline()  # (the round's pair: its baseline, then its apply)
        one = apply_inproc(inst[f"inproc{r}"])
        one["problems"] = verify(inst[f"inproc{r}"], args) if not args.profile else []
        one["baseline_events_per_s"] = base["events_per_s"]
        one["ratio_to_baseline"] = one["events_per_s"] / base["events_per_s"]
        inproc_rounds.append(one)
        print(f"apply, one worker process (in-process), round {r + 1}: {one['events']} events, "
              f"{one['events_per_s']:.1f} events/s = {one['ratio_to_baseline']:.2f} x its baseline; "
              f"{len(one['problems'])} problems", flush=True)
    if inproc_rounds:
        ratios = [one["ratio_to_baseline"] for one in inproc_rounds]
        out["inproc"] = {"rounds": inproc_rounds, "ratio_to_baseline": statistics.median(ratios),
                         "events_per_s": statistics.median(one["events_per_s"] for one in inproc_rounds),
                         "problems": [p for one in inproc_rounds for p in one["problems"]]}
        print(f"apply, one worker process (in-process): median ratio {out['inproc']['ratio_to_baseline']:.2f} x "
              f"baseline over {len(ratios)} alternating rounds ({', '.join(f'{x:.2f}' for x in ratios)}; "
              f"target >= {TARGET_PER_WORKER})", flush=True)
    if args.phases:
        runs = []
        for i, workers in enumerate(args.phases):
            label = f"celery{i}"
            before = measure_baseline()
            r = apply_celery(inst[label], workers, args, tag=f"{i}w{workers}")
            after = measure_baseline()
            r["problems"] = verify(inst[label], args)
            # Against the baselines measured right before and right after it: the machine's speed drifts.
            r["baseline_events_per_s"] = (before["events_per_s"] + after["events_per_s"]) / 2
            r["ratio_to_baseline_per_worker"] = r["events_per_s"] / workers / r["baseline_events_per_s"]
            runs.append(r)
            print(f"apply, {workers} Celery worker(s): {r['events']} events ({r['messages']} messages) in "
                  f"{r['window_s']:.1f}s = {r['events_per_s']:.1f} events/s "
                  f"({r['ratio_to_baseline_per_worker']:.2f} x the baselines around it, per worker); "
                  f"left {r['left']}; {len(r['problems'])} problems {r['problems'][:3]}", flush=True)
            print(f"    worker CPU {r['worker_cpu_ms_per_event']:.1f} ms/event (Celery processes, start-up "
                  f"included); load average {r['load_average'][0]:.1f} -> {r['load_average'][1]:.1f}")
            w = r["lock_wait_samples"]
            print(f"    lock waits over {w['samples']} samples: {json.dumps(w['waiting'])[:400]}", flush=True)
        out["celery"] = runs
        out.update(scaling(runs))
        if "scaling_2w_over_1w" in out:
            print(f"scaling: 2 workers / 1 worker = {out['scaling_2w_over_1w']:.2f} (mean rates of the "
                  f"{'/'.join(map(str, args.phases))} phases; target >= {TARGET_SCALING}); against the "
                  f"baselines around each phase: {out['scaling_2w_over_1w_baselined']:.2f}")
    out["baselines"] = bases
    out["baseline"] = {"events_per_s": statistics.median(b["events_per_s"] for b in bases)} if bases else {}
    redis_empty(args.redis_db)
    out["load_average_end"] = os.getloadavg()[0]
    args.output.write_text(json.dumps(out, indent=2, default=str))
    print(f"results: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
