#!/usr/bin/env python
"""Checkout benchmark (a benchmark, not a test).

Measures ``POST /api/issues/{id}/checkout`` throughput and p50/p99 latency with N concurrent
HTTP clients against PostgreSQL, next to a baseline measured in the same run: a bare Django
view that does one ``SELECT ... FOR UPDATE`` and one ``UPDATE`` of a comparable issue row. A third
phase, the DRF floor, runs that same bare claim inside a DRF view with the app's agent-key
authentication and body parsing: the part of the gap any authenticated API request pays.

    .venv/bin/python bench/checkout_bench.py [--per-client 250] [--rounds 3] [--contended]
                                             [--server gunicorn [--workers 2] [--threads 8]]

* Database: ``DATABASE_URL`` (default ``postgres://postgres@127.0.0.1:5432/paperclip_bench``);
  created if missing, migrated, and flushed every run (so its name must contain "bench").
* Server: a child process on 127.0.0.1 (random free port) serving ``bench.bench_urls`` (the
  real app's URLs plus the baseline endpoint), so checkout and baseline share one server. A
  separate process keeps the clients' GIL out of the server's way. ``--server threaded``
  (default): this script re-executed with ``--serve``, a Django ``ThreadedWSGIServer``, exiting
  when this process closes its stdin or ends. ``--server gunicorn``: the production server
  (``gunicorn.conf.py``, gthread ``--workers`` x ``--threads``; bench/serving.py).
* Clients: threads, each with its own keep-alive ``httpx.Client``; one agent (API key + live
  run) per client; every request claims a distinct fresh ``todo`` issue (uncontended).
  Baseline, DRF floor and checkout phases alternate for ``--rounds`` rounds (``--no-drf-floor``
  leaves the floor out); medians are reported.
* Output: a table on stdout and ``bench/results/checkout.json``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS = BENCH_DIR / "results" / "checkout.json"
DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/paperclip_bench"
LOOPBACK = {"127.0.0.1", "localhost", "::1", ""}
TARGET_RATIO = 0.8  # issue #19: checkout >= 0.8 of the bare baseline
PHASES = ("baseline", "drf", "checkout")  # drf: the bare claim behind DRF + agent-key authentication

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import serving  # noqa: E402  (needs ROOT on sys.path)
from bench.serving import serve_wsgi, stop_server  # noqa: E402,F401  (stop_server is used by the other benches)


# --------------------------------------------------------------------------------------- setup
def configure_env(args) -> str:
    """Environment for both processes; must run before Django is imported."""
    url = os.environ.get("DATABASE_URL") or DEFAULT_DB
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "paperclip.settings"
    os.environ["DEBUG"] = "False"  # DEBUG would record every query in memory
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    serving.ensure_secret_key()  # shared with the server, which refuses the development key under gunicorn
    if args.conn_max_age is not None:
        os.environ["CONN_MAX_AGE"] = str(args.conn_max_age)
    return url


def db_params(url: str) -> dict:
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql", "pgsql"):
        sys.exit(f"checkout_bench: DATABASE_URL must be PostgreSQL, got {parts.scheme!r}")
    if (parts.hostname or "") not in LOOPBACK:
        sys.exit(f"checkout_bench: refusing a non-loopback database host {parts.hostname!r}")
    name = parts.path.lstrip("/")
    if "bench" not in name:
        sys.exit(f"checkout_bench: the database is flushed on every run, so its name must contain "
                 f"'bench' (got {name!r})")
    return {"host": parts.hostname or None, "port": parts.port or 5432, "user": parts.username or "postgres",
            "password": parts.password, "dbname": name}


def ensure_database(params: dict):
    import psycopg
    from psycopg import sql

    admin = {k: v for k, v in params.items() if k != "dbname" and v is not None}
    with psycopg.connect(dbname="postgres", autocommit=True, connect_timeout=10, **admin) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [params["dbname"]]).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(params["dbname"])))
            print(f"created database {params['dbname']}")


def django_setup():
    import django
    from django.conf import settings

    settings.ROOT_URLCONF = "bench.bench_urls"
    django.setup()


def create_bench_data(args) -> dict:
    """Flush, then one company, one agent (key + live run) per client, and the issue pools."""
    from django.core.management import call_command
    from django.db import connection

    from issues.actors import SYSTEM
    from issues.models import Company, Issue
    from issues.services.companies import (
        agent_api_key_create,
        agent_create,
        company_create,
    )
    from issues.services.wakeups import agent_wakeup

    call_command("migrate", interactive=False, verbosity=0)
    call_command("flush", interactive=False, verbosity=0)

    company = company_create(name="Bench Co", issue_prefix="BEN")
    agents = []
    for i in range(args.clients):
        agent = agent_create(company=company, name=f"bench-agent-{i}", role="engineer")
        _, raw_key = agent_api_key_create(agent=agent, name="bench")
        run = agent_wakeup(actor=SYSTEM, agent=agent, reason="checkout benchmark").run  # queued; live
        agents.append({"agentId": str(agent.pk), "runId": str(run.pk), "key": raw_key})

    counter = [0]
    rows: list[Issue] = []

    def pool(label: str, count: int) -> list[str]:
        ids = []
        for i in range(count):
            counter[0] += 1
            n = counter[0]
            issue = Issue(company=company, number=n, identifier=f"BEN-{n}", title=f"bench {label} #{i}",
                          status="todo")
            rows.append(issue)
            ids.append(str(issue.pk))
        return ids

    pools: dict = {}
    for phase in phases_of(args):
        pools[("warmup", phase)] = [pool(f"warmup {phase} c{c}", args.warmup) for c in range(args.clients)]
        for r in range(args.rounds):
            pools[(r, phase)] = [pool(f"{phase} r{r} c{c}", args.per_client) for c in range(args.clients)]
        if args.contended:
            shared = pool(f"contended {phase}", args.per_client)
            pools[("contended", phase)] = [shared] * args.clients
    Issue.objects.bulk_create(rows, batch_size=2000)
    Company.objects.filter(pk=company.pk).update(issue_counter=counter[0])
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    return {"company": str(company.pk), "agents": agents, "pools": pools, "issues": counter[0]}


# ----------------------------------------------------------------------------------- the server
def serve(args):
    """Child process: the real app over HTTP on loopback until stdin closes."""
    configure_env(args)
    django_setup()
    serve_wsgi(args.port)


def start_server(args) -> tuple[subprocess.Popen, str]:
    extra = ["--conn-max-age", str(args.conn_max_age)] if args.conn_max_age is not None else []
    return serving.launch(args, __file__, extra, "checkout_bench", urlconf="bench.bench_urls")


# ---------------------------------------------------------------------------------- the clients
def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    if not sorted_values:
        return float("nan")
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def phases_of(args) -> list[str]:
    """The phases this run measures, in the order they alternate."""
    return [p for p in PHASES if p != "drf" or args.drf_floor]


def request_for(phase: str, agent: dict, issue_id: str, baseline_path: str) -> tuple[str, dict]:
    if phase == "checkout":
        return f"/api/issues/{issue_id}/checkout", {"agentId": agent["agentId"], "expectedStatuses": ["todo"]}
    if phase == "drf":
        return f"/bench/drf-floor/{issue_id}/claim", {"agentId": agent["agentId"], "runId": agent["runId"]}
    return f"{baseline_path}/{issue_id}/claim", {"agentId": agent["agentId"], "runId": agent["runId"]}


def process_cpu_seconds(pid: int) -> float | None:
    """utime + stime of the server process and its workers (Linux /proc), or None where unavailable."""
    return serving.tree_cpu_seconds(pid)


def run_phase(label: str, phase: str, clients: list, agents: list, pools: list[list[str]], args,
              allowed=(200,)) -> dict:
    """Every client claims its list of issues as fast as it can; returns timing and status counts."""
    n = len(clients)
    latencies: list[list[float]] = [[] for _ in range(n)]
    statuses: list[dict] = [{} for _ in range(n)]
    failures: list[list[str]] = [[] for _ in range(n)]
    barrier = threading.Barrier(n + 1)
    deadline = time.monotonic() + args.phase_timeout

    def worker(i: int):
        client, agent, lat, st, bad = clients[i], agents[i], latencies[i], statuses[i], failures[i]
        requests = [request_for(phase, agent, issue_id, args.baseline_path) for issue_id in pools[i]]
        barrier.wait()
        for url, body in requests:
            if time.monotonic() > deadline:
                bad.append("phase timeout")
                return
            t0 = time.perf_counter()
            try:
                response = client.post(url, json=body)
                code = response.status_code
            except Exception as exc:  # noqa: BLE001 - every failure is counted and reported
                code, response = f"{type(exc).__name__}", None
            lat.append(time.perf_counter() - t0)
            st[code] = st.get(code, 0) + 1
            if code not in allowed and len(bad) < 3:
                bad.append(f"{code} {url}: {response.text[:300] if response is not None else ''}")

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    server_cpu0 = process_cpu_seconds(args.server_pid)
    db_cpu0 = serving.database_cpu_seconds()
    client_cpu0 = time.process_time()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join(timeout=max(1.0, deadline - time.monotonic() + 5))
    wall = time.perf_counter() - t0
    client_cpu = time.process_time() - client_cpu0
    server_cpu1 = process_cpu_seconds(args.server_pid)
    db_cpu1 = serving.database_cpu_seconds()

    all_lat = sorted(x for lat in latencies for x in lat)
    counts: dict = {}
    for st in statuses:
        for code, c in st.items():
            counts[str(code)] = counts.get(str(code), 0) + c
    errors = sum(c for code, c in counts.items() if code not in {str(a) for a in allowed})
    errors += sum(1 for t in threads if t.is_alive())
    return {
        "label": label, "phase": phase, "requests": len(all_lat), "wall_s": wall,
        "throughput_rps": len(all_lat) / wall if wall else float("nan"),
        "p50_ms": percentile(all_lat, 50) * 1000, "p99_ms": percentile(all_lat, 99) * 1000,
        # CPU per request of the server process and of this (client) process: less noisy than wall time.
        "server_cpu_ms_per_req": ((server_cpu1 - server_cpu0) * 1000 / len(all_lat)
                                  if all_lat and server_cpu0 is not None and server_cpu1 is not None else None),
        "client_cpu_ms_per_req": client_cpu * 1000 / len(all_lat) if all_lat else None,
        "db_cpu_ms_per_req": ((db_cpu1 - db_cpu0) * 1000 / len(all_lat)
                              if all_lat and db_cpu0 is not None and db_cpu1 is not None else None),
        "statuses": counts, "errors": errors, "error_samples": [m for f in failures for m in f][:5],
    }


def verify_claims(pools: list[list[str]], agents: list[dict]) -> str | None:
    """Off the clock: every issue of the phase is in progress, held by the right agent and run."""
    from issues.models import Issue

    expected = {}
    for i, ids in enumerate(pools):
        for issue_id in ids:
            expected.setdefault(issue_id, set()).add((agents[i]["agentId"], agents[i]["runId"]))
    rows = Issue.objects.filter(pk__in=list(expected)).values_list("pk", "status", "assignee_agent_id",
                                                                     "checkout_run_id")
    bad = 0
    for pk, status, agent_id, run_id in rows:
        if status != "in_progress" or (str(agent_id), str(run_id)) not in expected[str(pk)]:
            bad += 1
    if bad or len(rows) != len(expected):
        return f"{bad} of {len(expected)} issues not claimed as expected"
    return None


def check(result: dict, verify_error: str | None = None):
    if result["errors"] or verify_error:
        print(f"\nABORT: {result['label']} had {result['errors']} errors; statuses={result['statuses']}"
              + (f"; {verify_error}" if verify_error else ""), file=sys.stderr)
        for sample in result["error_samples"]:
            print("   ", sample, file=sys.stderr)
        raise SystemExit(2)


# ------------------------------------------------------------------------------------- reporting
def row(name: str, requests, rps: float, p50: float, p99: float, cpu=None) -> str:
    cpu_text = f"{cpu:>14.2f}" if cpu is not None else f"{'n/a':>14}"
    return f"{name:<24} {requests:>9} {rps:>14.1f} {p50:>9.2f} {p99:>9.2f} {cpu_text}"


def summarize(results: list[dict], phase: str) -> dict:
    rs = [r for r in results if r["phase"] == phase]
    return {
        "rounds": len(rs),
        "requests": sum(r["requests"] for r in rs),
        "throughput_rps": statistics.median(r["throughput_rps"] for r in rs),
        "p50_ms": statistics.median(r["p50_ms"] for r in rs),
        "p99_ms": statistics.median(r["p99_ms"] for r in rs),
        "server_cpu_ms_per_req": (statistics.median(r["server_cpu_ms_per_req"] for r in rs)
                                  if all(r["server_cpu_ms_per_req"] is not None for r in rs) else None),
        "db_cpu_ms_per_req": (statistics.median(r["db_cpu_ms_per_req"] for r in rs)
                              if all(r.get("db_cpu_ms_per_req") is not None for r in rs) else None),
        "client_cpu_ms_per_req": statistics.median(r["client_cpu_ms_per_req"] for r in rs),
    }


def server_versions() -> dict:
    import django
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        pg = cursor.fetchone()[0]
    from django.conf import settings

    return {"python": platform.python_version(), "django": django.get_version(), "postgresql": pg,
            "cpus": os.cpu_count(),  # (the server's CONN_MAX_AGE is in its config: serving.server_config)
            "debug": settings.DEBUG}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    parser.add_argument("--per-client", type=int, default=250, help="requests per client per phase (default 250)")
    parser.add_argument("--rounds", type=int, default=3, help="baseline+checkout rounds (default 3; medians)")
    parser.add_argument("--warmup", type=int, default=20, help="warm-up requests per client per phase")
    parser.add_argument("--contended", action="store_true",
                        help="also run one contended round: all clients race for the same issues")
    parser.add_argument("--no-drf-floor", dest="drf_floor", action="store_false",
                        help="leave out the DRF floor phase (the bare claim behind DRF and authentication)")
    parser.add_argument("--baseline", choices=("sql", "orm"), default="sql",
                        help="baseline view: raw SQL (default) or ORM select_for_update().get")
    parser.add_argument("--conn-max-age", type=int, default=None,
                        help="server CONN_MAX_AGE (default: the settings' value, env CONN_MAX_AGE or 0)")
    parser.add_argument("--phase-timeout", type=float, default=300, help="seconds before a phase is abandoned")
    serving.add_server_arguments(parser)
    parser.add_argument("--output", type=Path, default=None,
                        help="results file (default bench/results/checkout.json, checkout-gunicorn.json "
                             "with --server gunicorn)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.baseline_path = "/bench/baseline" if args.baseline == "sql" else "/bench/baseline-orm"
    if args.output is None:
        args.output = RESULTS if args.server == "threaded" else RESULTS.with_name(f"checkout-{args.server}.json")

    if args.serve:
        return serve(args)
    if not (1 <= args.clients <= 64 and 1 <= args.per_client <= 10_000 and 1 <= args.rounds <= 20):
        parser.error("--clients 1..64, --per-client 1..10000, --rounds 1..20")

    url = configure_env(args)
    ensure_database(db_params(url))
    django_setup()
    import httpx

    t_setup = time.perf_counter()
    data = create_bench_data(args)
    params = db_params(url)
    print(f"setup: database {params['dbname']} on {params['host']}:{params['port']}; {data['issues']} issues, "
          f"{args.clients} agents in {time.perf_counter() - t_setup:.1f}s")
    versions = server_versions()
    server = serving.server_config(args)
    from django.db import connections

    connections.close_all()

    proc, base_url = start_server(args)
    args.server_pid = proc.pid
    clients = []
    try:
        agents = data["agents"]
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        for agent in agents:
            clients.append(httpx.Client(
                base_url=base_url, timeout=30.0, limits=limits, trust_env=False,
                headers={"Authorization": f"Bearer {agent['key']}", "X-Paperclip-Run-Id": agent["runId"]},
            ))
        print(f"server: {serving.describe(server)} at {base_url} (pid {proc.pid})")
        print(f"load average {os.getloadavg()[0]:.2f}; {args.clients} clients x {args.per_client} requests, "
              f"{args.rounds} rounds, baseline={args.baseline}, CONN_MAX_AGE={server['conn_max_age']}")

        phases = phases_of(args)
        for phase in phases:
            r = run_phase(f"warmup {phase}", phase, clients, agents, data["pools"][("warmup", phase)], args)
            check(r)

        results = []
        for rnd in range(args.rounds):
            for phase in phases:
                pools = data["pools"][(rnd, phase)]
                r = run_phase(f"{phase} #{rnd + 1}", phase, clients, agents, pools, args)
                check(r, verify_claims(pools, agents))
                results.append(r)
                print(f"  {r['label']:<12} {r['throughput_rps']:8.1f} req/s  p50 {r['p50_ms']:6.2f} ms  "
                      f"p99 {r['p99_ms']:7.2f} ms", flush=True)

        contended = []
        if args.contended:
            pools = data["pools"][("contended", "baseline")]
            r = run_phase("baseline contended", "baseline", clients, agents, pools, args)
            check(r)
            contended.append(r)
            pools = data["pools"][("contended", "checkout")]
            r = run_phase("checkout contended", "checkout", clients, agents, pools, args, allowed=(200, 409))
            wins = r["statuses"].get("200", 0)
            verify = verify_claims(pools, agents)
            if wins != args.per_client:
                verify = (verify or "") + f" {wins} checkouts won for {args.per_client} issues (expected one each)"
            check(r, verify)
            r["wins"] = wins
            contended.append(r)
    finally:
        for client in clients:
            client.close()
        stop_server(proc)

    base, chk = summarize(results, "baseline"), summarize(results, "checkout")
    floor = summarize(results, "drf") if args.drf_floor else None
    ratio = chk["throughput_rps"] / base["throughput_rps"]
    p50_ratio = chk["p50_ms"] / base["p50_ms"]
    p99_ratio = chk["p99_ms"] / base["p99_ms"]

    header = f"{'phase':<24} {'requests':>9} {'throughput/s':>14} {'p50 ms':>9} {'p99 ms':>9} {'server CPU ms':>14}"
    print()
    print(f"Checkout benchmark: {args.clients} concurrent clients, PostgreSQL {versions['postgresql']}, "
          f"{versions['cpus']} CPUs, Django {versions['django']}, Python {versions['python']}")
    print(f"server: {serving.describe(server)}; baseline and checkout served by it alike")
    print(header)
    print("-" * len(header))
    for r in results:
        print(row(r["label"], r["requests"], r["throughput_rps"], r["p50_ms"], r["p99_ms"], r["server_cpu_ms_per_req"]))
    print("-" * len(header))
    print(row(f"baseline (median of {base['rounds']})", base["requests"], base["throughput_rps"],
              base["p50_ms"], base["p99_ms"], base["server_cpu_ms_per_req"]))
    if floor:
        print(row(f"DRF floor (median of {floor['rounds']})", floor["requests"], floor["throughput_rps"],
                  floor["p50_ms"], floor["p99_ms"], floor["server_cpu_ms_per_req"]))
    print(row(f"checkout (median of {chk['rounds']})", chk["requests"], chk["throughput_rps"],
              chk["p50_ms"], chk["p99_ms"], chk["server_cpu_ms_per_req"]))
    for r in contended:
        extra = f"   ({r['wins']} won, {r['statuses'].get('409', 0)} x 409)" if "wins" in r else ""
        print(row(r["label"], r["requests"], r["throughput_rps"], r["p50_ms"], r["p99_ms"],
                  r["server_cpu_ms_per_req"]) + extra)
    print()
    print(f"ratio (checkout / baseline throughput) = {ratio:.2f}  (target >= {TARGET_RATIO:.2f})"
          f"{'' if ratio >= TARGET_RATIO else '  BELOW TARGET'}")
    if floor:
        print(f"DRF floor / baseline = {floor['throughput_rps'] / base['throughput_rps']:.2f} (the bare claim behind "
              f"DRF and agent-key authentication); checkout / DRF floor = "
              f"{chk['throughput_rps'] / floor['throughput_rps']:.2f} (the checkout's own work); server CPU "
              f"{floor['server_cpu_ms_per_req'] or float('nan'):.2f} ms, database CPU "
              f"{floor['db_cpu_ms_per_req'] or float('nan'):.2f} ms per request")
    print(f"latency, checkout vs baseline: p50 {chk['p50_ms']:.2f} vs {base['p50_ms']:.2f} ms ({p50_ratio:.2f}x), "
          f"p99 {chk['p99_ms']:.2f} vs {base['p99_ms']:.2f} ms ({p99_ratio:.2f}x)")
    if base["server_cpu_ms_per_req"] and chk["server_cpu_ms_per_req"]:
        where = ("the server is one GIL-bound process" if server["server"] == "threaded"
                 else f"summed over the {server['workers']} gunicorn worker(s) and master")
        print(f"server CPU per request: checkout {chk['server_cpu_ms_per_req']:.2f} ms vs baseline "
              f"{base['server_cpu_ms_per_req']:.2f} ms ({chk['server_cpu_ms_per_req'] / base['server_cpu_ms_per_req']:.2f}x; "
              f"{where})")

    if base["db_cpu_ms_per_req"] and chk["db_cpu_ms_per_req"]:
        print(f"database CPU per request: checkout {chk['db_cpu_ms_per_req']:.2f} ms vs baseline "
              f"{base['db_cpu_ms_per_req']:.2f} ms (PostgreSQL's backends); "
              f"client CPU {chk['client_cpu_ms_per_req']:.2f} vs {base['client_cpu_ms_per_req']:.2f} ms")

    report = {
        "benchmark": "checkout", "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": {"clients": args.clients, "per_client": args.per_client, "rounds": args.rounds,
                   "warmup": args.warmup, "baseline": args.baseline, "contended": args.contended},
        "server": server, "environment": versions, "rounds": results, "contended": contended,
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "summary": {"baseline": base, "checkout": chk, "drf_floor": floor,
                    "drf_floor_ratio": floor["throughput_rps"] / base["throughput_rps"] if floor else None,
                    "throughput_ratio": ratio, "p50_ratio": p50_ratio,
                    "p99_ratio": p99_ratio, "p99_ms": {"checkout": chk["p99_ms"], "baseline": base["p99_ms"]},
                    "target_ratio": TARGET_RATIO, "meets_target": ratio >= TARGET_RATIO},
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"results written to {args.output.relative_to(ROOT) if args.output.is_relative_to(ROOT) else args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
