#!/usr/bin/env python
"""Wakeup and dispatcher benchmark (a benchmark, not a test).

Two figures, each next to a baseline measured in the same run and shown as a ratio:

1. Coalescing: ``--threads`` threads (each with its own database connection) call
   ``agent_wakeup`` ``--wakes-per-thread`` times each for ONE agent and ONE issue while its run is
   still queued (the debounce window), then the fold that carries the wakes into the run (what
   the worker does as the run starts; timed and included). Then exactly one HeartbeatRun must exist for that
   agent+issue, and 1 claimed + (n-1) coalesced WakeupRequest rows, the primary's
   ``coalesced_count`` = n-1 (otherwise the script aborts with exit status 2). Baseline: the same
   threads inserting the same number of bare ``WakeupRequest`` rows with ``objects.create``.
2. Dispatch: for each N in ``--sizes`` N agents (``process`` adapter, maxConcurrentRuns 1), each
   with one queued run (``agent_wakeup`` with a distinct issue); timed: one batched claim pass,
   ``dispatch_claim(owner="bench:1", limit=N)`` (claims only, no process is started). The pass's
   query count must be the same for every N (abort otherwise).
   Baseline: one SELECT of a comparable fresh set of N queued runs and one
   ``filter(pk=..., status="queued").update(status="running", ...)`` per row.

    .venv/bin/python bench/wake_bench.py [--rounds 3] [--threads 8] [--wakes-per-thread 125]

* Database: as bench/checkout_bench.py (whose helpers this imports): ``DATABASE_URL`` (default
  ``postgres://postgres@127.0.0.1:5432/paperclip_bench``), loopback only, created if missing,
  migrated and flushed every run (so its name must contain "bench").
* Every round uses fresh agents/issues; medians over ``--rounds`` are reported.
* Output: a table on stdout and ``bench/results/wakes.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.checkout_bench import (  # needs ROOT on sys.path (above)
    configure_env,
    db_params,
    django_setup,
    ensure_database,
    percentile,
    server_versions,
)

RESULTS = BENCH_DIR / "results" / "wakes.json"


TX_CONTROL = {"BEGIN", "COMMIT", "ROLLBACK"}  # CaptureQueriesContext records these too


def statements(ctx) -> int:
    """Captured SQL statements, not counting BEGIN/COMMIT."""
    return sum(1 for q in ctx.captured_queries if q["sql"] not in TX_CONTROL)


class StatementCounter:
    """``connection.execute_wrapper`` that counts SQL statements (no log, so no 9,000-entry limit);
    used for the claim loop and the baseline alike."""

    def __init__(self):
        self.count = 0

    def __call__(self, execute, sql, params, many, context):
        self.count += 1
        return execute(sql, params, many, context)


class BenchAbort(Exception):
    pass


# --------------------------------------------------------------------------------------- setup
def reset_database():
    """Same migrate + flush as checkout_bench's create_bench_data (which also builds its own data)."""
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)
    call_command("flush", interactive=False, verbosity=0)


def vacuum_analyze():
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")


class Fixtures:
    """Companies, agents and issues made through the services (issues in bulk, as checkout_bench does)."""

    def __init__(self):
        self.companies = 0

    def company(self, label: str):
        from issues.services.companies import company_create

        self.companies += 1
        return company_create(name=f"Wake bench {label}", issue_prefix=f"WB{self.companies}")

    @staticmethod
    def issues(company, count: int, label: str) -> list:
        from django.db.models import F

        from issues.models import Company, Issue

        company.refresh_from_db(fields=["issue_counter"])
        start = company.issue_counter
        rows = [Issue(company=company, number=start + i + 1, identifier=f"{company.issue_prefix}-{start + i + 1}",
                      title=f"{label} #{i}", status="todo") for i in range(count)]
        Issue.objects.bulk_create(rows, batch_size=2000)
        Company.objects.filter(pk=company.pk).update(issue_counter=F("issue_counter") + count)
        return rows

    @staticmethod
    def agent(company, name: str, runtime_config=None):
        from issues.services.companies import agent_create

        # A valid process config (agent_create validates it); the bench never starts the process.
        return agent_create(company=company, name=name, role="engineer", adapter_type="process",
                            adapter_config={"command": ["true"]}, runtime_config=runtime_config)


# ------------------------------------------------------------------------------ thread harness
def run_threads(label: str, threads: int, per_thread: int, op, timeout: float) -> dict:
    """``op(thread_index, call_index)`` per_thread times in each thread, each thread on its own
    connection (opened before the clock starts, closed at thread end)."""
    from django.db import connection

    latencies: list[list[tuple[float, float]]] = [[] for _ in range(threads)]
    errors: list[str] = []
    barrier = threading.Barrier(threads + 1)
    deadline = time.monotonic() + timeout

    def worker(i: int):
        lat = latencies[i]
        try:
            connection.ensure_connection()
            barrier.wait()
            for j in range(per_thread):
                if time.monotonic() > deadline:
                    errors.append(f"thread {i}: phase timeout")
                    return
                t0 = time.perf_counter()
                op(i, j)
                lat.append((t0, time.perf_counter() - t0))
        except threading.BrokenBarrierError:
            errors.append(f"thread {i}: barrier broken")
        except Exception as exc:  # noqa: BLE001 - reported and aborts the run
            errors.append(f"thread {i}: {type(exc).__name__}: {exc}")
            barrier.abort()
        finally:
            connection.close()

    pool = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
    for t in pool:
        t.start()
    try:
        barrier.wait(timeout=60)
    except threading.BrokenBarrierError:
        pass
    t0 = time.perf_counter()
    for t in pool:
        t.join(timeout=max(1.0, deadline - time.monotonic() + 5))
    wall = time.perf_counter() - t0
    if any(t.is_alive() for t in pool):
        errors.append("threads still running after the timeout")
    samples = sorted((x for lat in latencies for x in lat), key=lambda s: s[0])  # by start time
    values = sorted(s[1] for s in samples)
    tenth = max(1, len(samples) // 10)
    return {
        "label": label, "calls": len(values), "wall_s": wall,
        "throughput_per_s": len(values) / wall if wall else float("nan"),
        "p50_ms": percentile(values, 50) * 1000, "p99_ms": percentile(values, 99) * 1000,
        # first vs last tenth of the calls (by start time): does a call get slower as wakes pile up?
        "p50_first_tenth_ms": percentile(sorted(s[1] for s in samples[:tenth]), 50) * 1000,
        "p50_last_tenth_ms": percentile(sorted(s[1] for s in samples[-tenth:]), 50) * 1000,
        "errors": errors[:5],
    }


# ------------------------------------------------------------------------ scenario 1: coalescing
def retire_runs(company):
    """Off the clock: end the company's still-queued runs so the dispatch phase sees only its own."""
    from django.utils import timezone

    from issues.choices import RunStatus
    from issues.models import HeartbeatRun

    now = timezone.now()
    HeartbeatRun.objects.filter(company=company, status=RunStatus.QUEUED).update(
        status=RunStatus.CANCELLED, finished_at=now, error="wake benchmark: retired", updated_at=now)


def coalesce_round(fx: Fixtures, company, tag: str, args, verify: bool = True) -> tuple[dict, dict]:
    from issues.actors import SYSTEM
    from issues.choices import WakeSource, WakeStatus
    from issues.models import HeartbeatRun, WakeupRequest
    from issues.services.wakeups import agent_wakeup

    total = args.threads * args.wakes_per_thread
    agent_b = fx.agent(company, f"baseline-{tag}")
    agent_w = fx.agent(company, f"wake-{tag}")
    issue_b, issue_w = fx.issues(company, 2, f"coalesce {tag}")

    def baseline_op(i, j):
        WakeupRequest.objects.create(company_id=agent_b.company_id, agent_id=agent_b.pk, issue_id=issue_b.pk,
                                     source=WakeSource.ON_DEMAND, reason=f"bench t{i} #{j}")

    def wake_op(i, j):
        agent_wakeup(actor=SYSTEM, agent=agent_w, issue=issue_w, reason=f"bench t{i} #{j}")

    base = run_threads(f"baseline {tag}", args.threads, args.wakes_per_thread, baseline_op, args.phase_timeout)
    wake = run_threads(f"wakes {tag}", args.threads, args.wakes_per_thread, wake_op, args.phase_timeout)
    for r in (base, wake):
        if r["errors"]:
            raise BenchAbort(f"{r['label']}: {r['errors']}")
    # On the clock too: the fold that carries the burst's wakes into the run (the worker does it
    # as the run starts), so the figure is the whole cost of the wakes, not just their inserts.
    from issues.services.wakeups import wakeups_fold

    t0 = time.perf_counter()
    for run_id in HeartbeatRun.objects.filter(agent=agent_w, issue=issue_w).values_list("pk", flat=True):
        wakeups_fold(run_id=run_id)
    wake["fold_ms"] = (time.perf_counter() - t0) * 1000
    wake["wall_s"] += wake["fold_ms"] / 1000
    wake["throughput_per_s"] = wake["calls"] / wake["wall_s"]
    if not verify:
        return base, wake

    problems = []
    if (n := WakeupRequest.objects.filter(agent=agent_b, issue=issue_b).count()) != total:
        problems.append(f"baseline inserted {n} rows, expected {total}")
    runs = list(HeartbeatRun.objects.filter(agent=agent_w, issue=issue_w))
    wakes = WakeupRequest.objects.filter(agent=agent_w, issue=issue_w)
    counts = {s: wakes.filter(status=s).count() for s in (WakeStatus.CLAIMED, WakeStatus.COALESCED)}
    if len(runs) != 1:
        problems.append(f"{len(runs)} HeartbeatRuns for the agent+issue, expected exactly 1")
    if (n := wakes.count()) != total:
        problems.append(f"{n} WakeupRequest rows, expected {total}")
    if counts[WakeStatus.CLAIMED] != 1 or counts[WakeStatus.COALESCED] != total - 1:
        problems.append(f"{counts[WakeStatus.CLAIMED]} claimed + {counts[WakeStatus.COALESCED]} coalesced, "
                        f"expected 1 + {total - 1}")
    primary = wakes.filter(status=WakeStatus.CLAIMED).first()
    if primary is None or primary.coalesced_count != total - 1:
        problems.append(f"primary coalesced_count = {getattr(primary, 'coalesced_count', None)}, expected {total - 1}")
    if runs and wakes.exclude(run=runs[0]).exists():
        problems.append("some wakes are not attached to the one run")
    from issues.models import ActivityLog

    if (n := ActivityLog.objects.filter(action="agent.wakeup_requested", entity_id=str(agent_w.pk)).count()) != total:
        problems.append(f"{n} agent.wakeup_requested activity rows, expected {total}")
    if problems:
        raise BenchAbort(f"coalescing {tag}: " + "; ".join(problems))
    wake["verified"] = {"runs": len(runs), "wakes": total, "claimed": 1, "coalesced": total - 1,
                        "primary_coalesced_count": primary.coalesced_count}
    return base, wake


def queries_per_coalesced_wake(fx: Fixtures, company) -> list[str]:
    """Off the clock: the SQL of one coalesced wake (the run already exists)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from issues.actors import SYSTEM
    from issues.services.wakeups import agent_wakeup

    agent = fx.agent(company, "query-count")
    (issue,) = fx.issues(company, 1, "query count")
    agent_wakeup(actor=SYSTEM, agent=agent, issue=issue, reason="first")
    connection.queries_log.clear()
    with CaptureQueriesContext(connection) as ctx:
        agent_wakeup(actor=SYSTEM, agent=agent, issue=issue, reason="second")
    return [q["sql"] for q in ctx.captured_queries if q["sql"] not in TX_CONTROL]


# -------------------------------------------------------------------------- scenario 2: dispatch
def queued_set(fx: Fixtures, n: int, tag: str):
    """A company with n agents (process adapter, maxConcurrentRuns 1), each with one queued run."""
    from django.db import transaction

    from issues.actors import SYSTEM
    from issues.services.wakeups import agent_wakeup

    company = fx.company(tag)
    issues = fx.issues(company, n, tag)
    run_ids = []
    with transaction.atomic():  # one commit for the whole set: setup only, the rows are the same
        for i in range(n):
            agent = fx.agent(company, f"{tag}-{i}", runtime_config={"maxConcurrentRuns": 1})
            wake = agent_wakeup(actor=SYSTEM, agent=agent, issue=issues[i], reason=f"{tag} #{i}")
            run_ids.append(wake.run_id)
    return company, run_ids


def dispatch_round(fx: Fixtures, n: int, tag: str) -> tuple[dict, dict]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from issues.choices import RunStatus
    from issues.models import HeartbeatRun
    from issues.services.dispatch import dispatch_claim

    if HeartbeatRun.objects.filter(status=RunStatus.QUEUED).exists():
        raise BenchAbort("queued runs left over from an earlier phase")
    # The baseline set is created first (older), run first and drained, so dispatch_claim, which
    # takes the oldest queued runs of every company, then sees exactly its own set.
    base_company, base_ids = queued_set(fx, n, f"B{tag}")
    _, disp_ids = queued_set(fx, n, f"D{tag}")
    vacuum_analyze()

    # Baseline: one SELECT of the queued rows, one conditional UPDATE per row.
    counter = StatementCounter()
    with connection.execute_wrapper(counter):
        t0 = time.perf_counter()
        rows = list(HeartbeatRun.objects.filter(company_id=base_company.pk, status=RunStatus.QUEUED)
                    .order_by("created_at").values_list("pk", flat=True)[:n])
        claimed = 0
        for pk in rows:
            now = timezone.now()
            claimed += HeartbeatRun.objects.filter(pk=pk, status=RunStatus.QUEUED).update(
                status=RunStatus.RUNNING, owner="bench:baseline", started_at=now, last_heartbeat_at=now,
                updated_at=now)
        base_wall = time.perf_counter() - t0
    base = {"n": n, "claimed": claimed, "wall_s": base_wall, "queries": counter.count,
            "throughput_per_s": claimed / base_wall}
    if claimed != n or set(map(str, rows)) != set(map(str, base_ids)):
        raise BenchAbort(f"baseline N={n}: claimed {claimed}, not exactly the {n} queued runs of its set")

    # The dispatcher: one batched claim pass (one transaction) over the N queued runs.
    connection.queries_log.clear()  # CaptureQueriesContext counts in a bounded deque: start it empty
    with CaptureQueriesContext(connection) as dctx:
        t0 = time.perf_counter()
        picked = [run.pk for run in dispatch_claim(owner="bench:1", limit=n)]
        wall = time.perf_counter() - t0
    claimed = len(picked)
    disp = {"n": n, "picked": len(picked), "claimed": claimed, "wall_s": wall, "dispatch_ms": wall * 1000,
            "claims_s": wall, "dispatch_queries": statements(dctx),
            "dispatch_sql": [q["sql"][:200] for q in dctx.captured_queries],
            "queries_per_claim": statements(dctx) / max(1, claimed),
            "throughput_per_s": claimed / wall}
    problems = []
    if set(map(str, picked)) != set(map(str, disp_ids)):
        problems.append(f"dispatch_claim claimed {len(picked)} runs, not exactly the {n} queued runs of its set")
    states = HeartbeatRun.objects.filter(pk__in=disp_ids, status=RunStatus.RUNNING, owner="bench:1").count()
    if states != n:
        problems.append(f"{states} of {n} runs are running for bench:1")
    if problems:
        raise BenchAbort(f"dispatch N={n}: " + "; ".join(problems))
    return base, disp


# ------------------------------------------------------------------------------------- reporting
def med(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--wakes-per-thread", type=int, default=125)
    parser.add_argument("--sizes", default="100,1000", help="dispatch set sizes N (default 100,1000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per figure (medians; default 3)")
    parser.add_argument("--conn-max-age", type=int, default=None)
    parser.add_argument("--phase-timeout", type=float, default=300, help="seconds before a phase is abandoned")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if not (1 <= args.threads <= 64 and 1 <= args.wakes_per_thread <= 2000 and 1 <= args.rounds <= 10
            and sizes and all(1 <= s <= 5000 for s in sizes)):
        parser.error("--threads 1..64, --wakes-per-thread 1..2000, --rounds 1..10, --sizes 1..5000")

    url = configure_env(SimpleNamespace(conn_max_age=args.conn_max_age))
    os.environ["CELERY_BROKER_URL"] = ""  # no broker: wakes never kick a real worker
    params = db_params(url)
    ensure_database(params)
    django_setup()
    from django.db import connections

    t_setup = time.perf_counter()
    reset_database()
    versions = server_versions()
    fx = Fixtures()
    company = fx.company("coalescing")
    vacuum_analyze()
    print(f"database {params['dbname']} on {params['host']}:{params['port']}; PostgreSQL {versions['postgresql']}, "
          f"{versions['cpus']} CPUs, Django {versions['django']}, Python {versions['python']}; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)

    total = args.threads * args.wakes_per_thread
    try:
        # 1. coalescing
        warm = SimpleNamespace(**{**vars(args), "wakes_per_thread": min(10, args.wakes_per_thread)})
        coalesce_round(fx, company, "warmup", warm, verify=False)
        co_base, co_wake = [], []
        for r in range(args.rounds):
            b, w = coalesce_round(fx, company, f"r{r + 1}", args)
            co_base.append(b)
            co_wake.append(w)
            print(f"  coalesce round {r + 1}: baseline {b['throughput_per_s']:8.1f}/s   "
                  f"wakes {w['throughput_per_s']:8.1f}/s  p50 {w['p50_ms']:.2f} ms  p99 {w['p99_ms']:.2f} ms",
                  flush=True)
        wake_sql = queries_per_coalesced_wake(fx, company)

        retire_runs(company)

        # 2. dispatch
        dispatch_round(fx, 20, "warm")
        dispatch: dict[int, dict] = {}
        for n in sizes:
            bases, disps = [], []
            for r in range(args.rounds):
                b, d = dispatch_round(fx, n, f"{n}r{r + 1}")
                bases.append(b)
                disps.append(d)
                print(f"  dispatch N={n} round {r + 1}: baseline {b['throughput_per_s']:8.1f}/s   "
                      f"dispatcher {d['throughput_per_s']:8.1f}/s  ({d['dispatch_queries']} dispatch queries, "
                      f"{d['queries_per_claim']:.1f} per claim)", flush=True)
            dispatch[n] = {"baseline": bases, "dispatcher": disps}
    except BenchAbort as exc:
        print(f"\nABORT: {exc}", file=sys.stderr)
        return 2
    finally:
        connections.close_all()

    dispatch_counts = {n: sorted({d["dispatch_queries"] for d in v["dispatcher"]}) for n, v in dispatch.items()}
    constant = len({c for cs in dispatch_counts.values() for c in cs}) == 1
    setup_s = time.perf_counter() - t_setup

    # --- table
    wake_tp, base_tp = med(co_wake, "throughput_per_s"), med(co_base, "throughput_per_s")
    print()
    print(f"1. {total:,} wakes for one agent and issue inside the debounce window -> exactly one run "
          f"({args.threads} threads, median of {args.rounds}; verified every round: 1 run, 1 claimed + "
          f"{total - 1} coalesced, coalesced_count {total - 1})")
    header = f"   {'phase':<34} {'per second':>11} {'p50 ms':>8} {'p99 ms':>8} {'p50 1st/last 10%':>18}"
    print(header)
    print("   " + "-" * (len(header) - 3))
    for name, rows in (("baseline: bare WakeupRequest insert", co_base), ("agent_wakeup (coalescing)", co_wake)):
        print(f"   {name:<34} {med(rows, 'throughput_per_s'):>11.1f} {med(rows, 'p50_ms'):>8.2f} "
              f"{med(rows, 'p99_ms'):>8.2f} {med(rows, 'p50_first_tenth_ms'):>8.2f}/{med(rows, 'p50_last_tenth_ms'):<9.2f}")
    print(f"   ratio (wake / baseline throughput) = {wake_tp / base_tp:.2f}   "
          f"SQL statements per coalesced wake = {len(wake_sql)} (+ BEGIN/COMMIT); the wakes' fold into the run "
          f"(timed, included) {med(co_wake, 'fold_ms'):.1f} ms")
    print()
    print(f"2. dispatcher throughput for N queued wakes (median of {args.rounds}; claims only, no process started)")
    header = (f"   {'N':>5} {'baseline/s':>11} {'dispatcher/s':>13} {'ratio':>6} {'pass queries':>14} "
              f"{'dispatch ms':>12} {'stmts/claim':>14} {'baseline queries':>17}")
    print(header)
    print("   " + "-" * (len(header) - 3))
    summary_dispatch = {}
    for n, v in dispatch.items():
        b, d = med(v["baseline"], "throughput_per_s"), med(v["dispatcher"], "throughput_per_s")
        qpc = med(v["dispatcher"], "queries_per_claim")
        summary_dispatch[n] = {"baseline_per_s": b, "dispatcher_per_s": d, "ratio": d / b,
                               "dispatch_queries": dispatch_counts[n], "queries_per_claim": qpc,
                               "dispatch_ms": med(v["dispatcher"], "dispatch_ms"),
                               "baseline_queries": v["baseline"][0]["queries"]}
        print(f"   {n:>5} {b:>11.1f} {d:>13.1f} {d / b:>6.2f} {'/'.join(map(str, dispatch_counts[n])) + ' queries':>14} "
              f"{summary_dispatch[n]['dispatch_ms']:>12.2f} {qpc:>14.1f} {v['baseline'][0]['queries']:>17}")
    print("   (statement counts exclude BEGIN/COMMIT; the claim pass is one transaction, each baseline UPDATE "
          "autocommits)")
    print(f"   claim pass query count constant across N: {'yes' if constant else 'NO'} "
          f"({', '.join(f'N={n}: {c}' for n, c in dispatch_counts.items())})")

    report = {
        "benchmark": "wakes", "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": {"threads": args.threads, "wakes_per_thread": args.wakes_per_thread, "sizes": sizes,
                   "rounds": args.rounds},
        "environment": versions, "wall_s": setup_s,
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "coalescing": {"baseline": co_base, "wakes": co_wake, "queries_per_coalesced_wake": len(wake_sql),
                       "coalesced_wake_sql": [s[:300] for s in wake_sql]},
        "dispatch": {str(n): v for n, v in dispatch.items()},
        "summary": {
            "coalescing": {"baseline_per_s": base_tp, "wakes_per_s": wake_tp, "ratio": wake_tp / base_tp,
                           "p50_ms": med(co_wake, "p50_ms"), "p99_ms": med(co_wake, "p99_ms"),
                           "baseline_p50_ms": med(co_base, "p50_ms"), "baseline_p99_ms": med(co_base, "p99_ms")},
            "dispatch": {str(n): v for n, v in summary_dispatch.items()},
            "dispatch_queries_constant": constant,
        },
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"results written to {args.output.relative_to(ROOT) if args.output.is_relative_to(ROOT) else args.output}")
    if not constant:
        print(f"\nABORT: claim pass query count differs across N: {dispatch_counts}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
