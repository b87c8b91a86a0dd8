#!/usr/bin/env python
"""Reading timestamps from PostgreSQL (a benchmark, not a test).

Reads a page of issues the way every list and checkout does (``Issue`` rows through the ORM, four
``timestamptz`` values each) with the loader ``paperclip.core.pg_timestamps`` registers on each
connection (psycopg's compiled one), against the baseline measured in the same run: the same reads
with Django's own loader (a Python subclass of psycopg's pure-Python loader), registered on the
connection as Django registers it. Rounds alternate; medians reported;
the ratio is rows/s with the project's loader over rows/s with Django's (higher is better).

    .venv/bin/python bench/timestamp_load_bench.py [--issues 200] [--reads 200] [--rounds 5]

* Database: ``DATABASE_URL`` (default ``postgres://postgres@127.0.0.1:5432/paperclip_timestamp_bench``),
  created if missing, migrated and flushed every run (its name must contain "bench").
* Output: a table on stdout and ``bench/results/timestamps.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS = BENCH_DIR / "results" / "timestamps.json"
DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/paperclip_timestamp_bench"

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--issues", type=int, default=200, help="rows per read (a page)")
    parser.add_argument("--reads", type=int, default=200, help="reads per round and phase")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    from bench.checkout_bench import db_params, ensure_database

    url = os.environ.setdefault("DATABASE_URL", DEFAULT_DB)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "paperclip.settings")
    ensure_database(db_params(url))
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.db.backends.postgresql.psycopg_any import register_tzloader
    from django.utils import timezone

    from issues.models import Issue
    from issues.services.companies import company_create

    call_command("migrate", interactive=False, verbosity=0)
    call_command("flush", interactive=False, verbosity=0)
    company = company_create(name="Timestamp Bench", issue_prefix="TSB")
    now = timezone.now()
    Issue.objects.bulk_create(Issue(company=company, number=n, identifier=f"TSB-{n}", title=f"issue {n}",
                                    status="done", started_at=now, completed_at=now)
                              for n in range(1, args.issues + 1))
    query = Issue.objects.filter(company=company).only("id", "created_at", "updated_at", "started_at", "completed_at")

    def phase(djangos_loader: bool) -> float:
        connection.ensure_connection()  # a fresh connection: the project's loader registered on it
        if djangos_loader:
            register_tzloader(connection.timezone, connection.connection)
        t0 = time.perf_counter()
        for _ in range(args.reads):
            rows = list(query.all())  # (a fresh queryset: no result cache)
        wall = time.perf_counter() - t0
        assert len(rows) == args.issues and rows[0].started_at == now
        connection.close()  # the next phase starts from a fresh connection
        return args.reads * args.issues / wall

    phase(False), phase(True)  # warm-up
    ours, theirs = [], []
    for _ in range(args.rounds):
        theirs.append(phase(True))
        ours.append(phase(False))
    loader = "psycopg compiled" if "binary" in __import__("psycopg").pq.__impl__ else "psycopg (pure Python)"
    out = {"issues_per_read": args.issues, "timestamps_per_row": 4, "rounds": args.rounds,
           "djangos_loader_rows_per_s": statistics.median(theirs), "project_loader_rows_per_s": statistics.median(ours),
           "ratio": statistics.median(ours) / statistics.median(theirs), "loader": loader}
    print(f"{args.issues} issues per read (4 timestamps each), {args.rounds} alternating rounds, medians:")
    print(f"  Django's loader (baseline):         {out['djangos_loader_rows_per_s']:10.0f} rows/s")
    print(f"  paperclip.core.pg_timestamps ({loader}): {out['project_loader_rows_per_s']:10.0f} rows/s")
    print(f"  ratio: {out['ratio']:.2f}x")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
