#!/usr/bin/env python
"""Paged case-read benchmark (a benchmark, not a test).

Builds a case whose ``fields`` JSON is several megabytes, then reads it

* **whole**, two ways (the baselines, measured in the same run):
  - ``GET /api/cases/{id}`` — the existing detail view: loads the row and serializes the whole case;
  - ``ORM + json.dumps`` — ``Case.objects.get(pk).fields`` then ``json.dumps`` (no HTTP/DRF);
* **paged** — ``GET /api/cases/{id}?agentRead=true&section=fields&limitBytes=N&offsetBytes=…&snapshot=…``
  page after page until ``done``, through the real URL → view → ``cases.reading`` path
  (the database cuts each byte window; Python never holds the whole value);

and prints, side by side, the peak Python memory (``tracemalloc``, a separate pass from the
timing pass so tracing does not distort times) and the time per request, with ratios against
the whole read.

    .venv/bin/python bench/case_read_bench.py [--mb 8] [--limit-kib 64 --limit-kib 256] [--repeat 3]

Database: whichever ``DATABASE_URL`` points to (SQLite file by default). The bench never writes
to that database itself: like the test runner, it creates a throwaway test database next to it
(``test_<name>_<pid>`` / a ``var/test-<pid>.sqlite3`` file), migrates it, and destroys it at the end.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MULTI = "aé€😀"


def setup_django():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "paperclip.settings")
    os.environ["DEBUG"] = "False"  # DEBUG would keep every query (and its parameters) in memory
    import django

    django.setup()


def build_case(mb: float):
    from django.contrib.auth import get_user_model

    from cases.services import case_create
    from issues.actors import SYSTEM
    from issues.models import Company, Membership

    company = Company.objects.create(name="Bench Co", issue_prefix="BEN", enable_cases=True)
    user = get_user_model().objects.create(username="bench-board")
    Membership.objects.create(company=company, user=user, role="owner")
    from django.db import connection

    record = {"note": f"{MULTI} " * 12, "tags": ["alpha", "beta", MULTI], "score": 0.5}
    # Size by the database's own text: PostgreSQL keeps the characters (jsonb::text), SQLite
    # stores Django's json.dumps output with \u escapes.
    one = len(json.dumps(record, ensure_ascii=connection.vendor != "postgresql").encode())
    count = int(mb * 1024 * 1024 / one) + 1
    fields = {"records": [{**record, "id": i} for i in range(count)]}
    case, _ = case_create(actor=SYSTEM, company=company, case_type="bench", title=f"Bench {MULTI}", kickoff="k",
                          workflow_document_text="w", fields=fields)
    del fields
    gc.collect()
    return case, user


def client_for(user):
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(user=user)
    return client


def measure(fn, *, trace: bool):
    gc.collect()
    if trace:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        result = fn()
        peak = tracemalloc.get_traced_memory()[1] - base
        return result, peak
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def whole_view(client, case):
    def run():
        response = client.get(f"/api/cases/{case.pk}")
        assert response.status_code == 200, response.status_code
        return len(response.content)
    return run


def whole_orm(case):
    from cases.models import Case

    def run():
        return len(json.dumps(Case.objects.get(pk=case.pk).fields, ensure_ascii=False).encode())
    return run


def paged(client, case, limit):
    """A list of per-page callables is not possible (each needs the previous answer), so the walk
    yields (offset, snapshot) states; ``page(state)`` reads one page and returns the next state."""
    def page(state):
        offset, snapshot = state
        url = f"/api/cases/{case.pk}?agentRead=true&section=fields&limitBytes={limit}&offsetBytes={offset}"
        if snapshot:
            url += f"&snapshot={snapshot}"
        response = client.get(url)
        assert response.status_code == 200, response.content[:300]
        data = response.json()
        read = data["readPage"]
        return (read["nextOffsetBytes"], data["snapshot"]), read
    return page


def walk(page, *, trace: bool):
    state, values, total_bytes, pages = (0, None), [], 0, 0
    while True:
        (state, read), value = measure(lambda: page(state), trace=trace)
        values.append(value)
        pages += 1
        total_bytes = read["totalBytes"]
        if read["done"]:
            return values, pages, total_bytes


def fmt_mb(n):
    return f"{n / 1024 / 1024:8.2f} MB"


def fmt_ms(s):
    return f"{s * 1000:9.1f} ms"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=8.0, help="size of the fields JSON (MB, default 8)")
    parser.add_argument("--limit-kib", type=int, action="append", help="page budget(s) in KiB (default 64 and 256)")
    parser.add_argument("--repeat", type=int, default=3, help="timing repetitions of the whole reads")
    args = parser.parse_args()
    limits = [k * 1024 for k in (args.limit_kib or [64, 256])]

    setup_django()
    from django.conf import settings
    from django.db import connection

    settings.PAPERCLIP.setdefault("CASE_READ_MAX_BYTES", max(limits))
    settings.PAPERCLIP["CASE_READ_MAX_BYTES"] = max(settings.PAPERCLIP["CASE_READ_MAX_BYTES"], max(limits))
    old_name = connection.settings_dict["NAME"]
    test_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    try:
        case, user = build_case(args.mb)
        client = client_for(user)
        from cases.reading import sql_window
        from cases.models import Case

        size = sql_window(Case, "fields", case.pk, 0, 0, json_text=True).total
        print(f"database: {connection.vendor} ({test_name}); fields JSON text: {size:,} bytes "
              f"({size / 1024 / 1024:.2f} MB)\n")

        # Warm caches/imports once.
        whole_view(client, case)()
        paged(client, case, limits[0])((0, None))

        rows = []
        for label, fn in (("whole: GET /api/cases/{id}", whole_view(client, case)),
                          ("whole: ORM load + json.dumps", whole_orm(case))):
            times = [measure(fn, trace=False)[1] for _ in range(args.repeat)]
            tracemalloc.start()
            try:
                _, peak = measure(fn, trace=True)
            finally:
                tracemalloc.stop()
            rows.append((label, statistics.median(times), peak))
        base_time, base_peak = rows[0][1], rows[0][2]

        print(f"{'read':44} {'time/request':>12} {'peak memory':>11} {'time ratio':>10} {'mem ratio':>9}")
        for label, t, peak in rows:
            print(f"{label:44} {fmt_ms(t):>12} {fmt_mb(peak):>11} {t / base_time:10.3f} {peak / base_peak:9.4f}")

        for limit in limits:
            times, pages, total = walk(paged(client, case, limit), trace=False)
            assert total == size
            tracemalloc.start()
            try:
                peaks, _, _ = walk(paged(client, case, limit), trace=True)
            finally:
                tracemalloc.stop()
            median, worst, whole_walk = statistics.median(times), max(times), sum(times)
            peak = max(peaks)
            label = f"paged {limit // 1024} KiB: one page (median of {pages})"
            print(f"{label:44} {fmt_ms(median):>12} {fmt_mb(peak):>11} {median / base_time:10.3f} "
                  f"{peak / base_peak:9.4f}")
            label = f"paged {limit // 1024} KiB: slowest page"
            print(f"{label:44} {fmt_ms(worst):>12} {'':>11} {worst / base_time:10.3f}")
            label = f"paged {limit // 1024} KiB: all {pages} pages"
            print(f"{label:44} {fmt_ms(whole_walk):>12} {fmt_mb(peak):>11} {whole_walk / base_time:10.3f} "
                  f"{peak / base_peak:9.4f}")
        print("\nratios are against 'whole: GET /api/cases/{id}'; peak memory is the tracemalloc peak of one "
              "request above what was allocated before it (for 'all pages': the worst single page).")
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0, keepdb=False)


if __name__ == "__main__":
    main()
