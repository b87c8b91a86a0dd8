"""The in-process scheduler for single-machine installs (no broker needed): dispatches queued
runs to a thread pool and runs the periodic sweep. With Celery, use `celery -A paperclip worker`
and `celery -A paperclip beat` instead; both drive the same services.

Other apps ride on the worker through ``issues.events`` (this app never imports them): ``worker_started``
once at start, ``worker_ticked`` on every loop (e.g. the connectors drain the inbox that web requests
only store into). They run on their own thread, so a slow provider never delays dispatch; with
``--once`` they run inline, before the dispatch pass."""
import logging
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from django.core.management.base import BaseCommand
from django.db import close_old_connections, connection
from django.utils import timezone

from issues import events
from issues.services import dispatch, runs, scheduling

log = logging.getLogger("paperclip.worker")


def announce(signal_, **kwargs) -> list:
    """Send a worker signal; a failing receiver is logged and never stops the worker."""
    results = []
    for receiver, result in signal_.send_robust(sender=None, **kwargs):
        if isinstance(result, Exception):
            log.error("worker hook %s failed", getattr(receiver, "__qualname__", receiver), exc_info=result)
        else:
            results.append(result)
    return results


class Command(BaseCommand):
    help = "Run agents: dispatch queued runs and sweep stale runs, retries, timers and workspaces."

    def add_arguments(self, parser):
        parser.add_argument("--concurrency", type=int, default=4, help="agent processes at once")
        parser.add_argument("--poll", type=float, default=1.0, help="seconds between dispatch passes")
        parser.add_argument("--sweep", type=float, default=15.0, help="seconds between sweeps")
        parser.add_argument("--once", action="store_true", help="one dispatch pass, wait for its runs, exit")

    def handle(self, *args, concurrency, poll, sweep, once, **options):
        owner = runs.this_owner()
        stopping = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stopping.set())
        reconciled = runs.runs_reconcile_on_start()
        self.stdout.write(f"paperclip worker {owner}: reconciled {len(reconciled)} orphaned run(s)")
        hooks = None
        if once:
            announce(events.worker_started, owner=owner)
            announce(events.worker_ticked, now=timezone.now())
        else:
            hooks = threading.Thread(target=self._hooks_loop, args=(owner, stopping, poll), daemon=True,
                                     name="worker-hooks")
            hooks.start()
        in_flight: set = set()
        lock = threading.Lock()

        def execute(run_id):
            try:
                dispatch.run_execute(run_id=run_id, owner=owner, claimed_by=owner)
            finally:
                connection.close()
                with lock:
                    in_flight.discard(run_id)

        last_sweep = 0.0
        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="run") as pool:
            while not stopping.is_set():
                close_old_connections()
                if time.monotonic() - last_sweep >= sweep:
                    scheduling.sweep(owner=owner)
                    last_sweep = time.monotonic()
                with lock:
                    free = concurrency - len(in_flight)
                # Claim only what the pool can start now: a claimed run counts as running.
                claimed = dispatch.dispatch_claim(owner=owner, max_claims=free) if free > 0 else []
                for run in claimed:
                    with lock:
                        in_flight.add(run.pk)
                    pool.submit(execute, run.pk)
                if once:
                    break
                stopping.wait(poll)
        if hooks is not None:
            stopping.set()
            hooks.join(timeout=30)

    @staticmethod
    def _hooks_loop(owner: str, stopping: threading.Event, poll: float):
        try:
            announce(events.worker_started, owner=owner)
            while not stopping.is_set():
                close_old_connections()
                announce(events.worker_ticked, now=timezone.now())
                stopping.wait(poll)
        finally:
            connection.close()
