"""``python -m prp_runner``: run one Paperclip run's turn through a harness, over PRP.

    python -m prp_runner [--url URL --key KEY --run-id ID] [--outbox PATH] [--keep-outbox]
                         [--cwd DIR] [--drain-timeout S] [--max-pending-events N] [--max-pending-bytes B]
                         [--poll-wait S] [--max-line-bytes N]
                         --harness fake --script NAME_OR_PATH
    python -m prp_runner ... --harness process -- COMMAND [ARGS...]
    python -m prp_runner ... --harness module:package.module:factory [--script X] [-- ARGS...]
    python -m prp_runner --attach API_URL [--once] [--outbox-dir DIR] --harness ...   (PAPERCLIP_AGENT_KEY)

``--url`` / ``--key`` / ``--run-id`` default to ``PAPERCLIP_RUNNER_URL`` / ``PAPERCLIP_API_KEY`` /
``PAPERCLIP_RUN_ID`` (prefer the environment for the key: flags show in process listings).
``module:…`` imports ``factory`` from an importable module and calls it with the options dict
(``script``, ``command``, ``max_line_bytes``); it must return a harness (``prp_runner.harness``'s
protocol). Exit codes: 0 delivered, 2 usage, 3 fatal, 4 drain timed out, 128+N signal N
(see prp_runner.session). ``--attach`` asks the host for the agent's external runs with the
agent's own key instead of being given one run (prp_runner.attach).
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from .session import Runner, RunnerConfig

EXIT_USAGE = 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m prp_runner", description="The reference PRP runner.")
    p.add_argument("--url", default=os.environ.get("PAPERCLIP_RUNNER_URL"),
                   help="the run's runner URL, …/api/runner/v1/runs/<run id>/ (PAPERCLIP_RUNNER_URL)")
    p.add_argument("--key", default=os.environ.get("PAPERCLIP_API_KEY"),
                   help="the run-scoped key (PAPERCLIP_API_KEY; never printed)")
    p.add_argument("--run-id", default=os.environ.get("PAPERCLIP_RUN_ID"), help="the run's id (PAPERCLIP_RUN_ID)")
    p.add_argument("--outbox", help="the outbox file (default ./prp-outbox-<run id>.sqlite3)")
    p.add_argument("--keep-outbox", action="store_true", help="keep the outbox file after a delivered run")
    p.add_argument("--cwd", help="the harness's working directory (default: the current one)")
    p.add_argument("--drain-timeout", type=float, default=600.0,
                   help="seconds to wait for the host to acknowledge everything at the end (default 600)")
    p.add_argument("--max-pending-events", type=int, default=10000,
                   help="unacknowledged events kept before P1/P2 events are dropped (default 10000)")
    p.add_argument("--max-pending-bytes", type=int, default=64 << 20,
                   help="unacknowledged bytes kept before P1/P2 events are dropped (default 64 MiB)")
    p.add_argument("--poll-wait", type=float, default=20.0, help="command long-poll seconds (default 20)")
    p.add_argument("--max-line-bytes", type=int, default=65536,
                   help="longest harness output line; a longer one fails the run (default 64 KiB)")
    p.add_argument("--harness", required=True, help="fake, process, or module:package.module:factory")
    p.add_argument("--script", help="the fake harness's script: a name (happy-path, …) or a path")
    p.add_argument("--attach", metavar="API_URL",
                   help="ask this host for the agent's external prp runs (key: PAPERCLIP_AGENT_KEY) and drive each")
    p.add_argument("--once", action="store_true", help="with --attach: stop after one run")
    p.add_argument("--attach-poll", type=float, default=5.0, help="with --attach: seconds between asks (default 5)")
    p.add_argument("--outbox-dir", default=".", help="with --attach: where each run's outbox goes (default .)")
    p.add_argument("command", nargs="*", help="after --: the process harness's command")
    return p


def load_harness(name: str, options: dict):
    """A harness by registry name, or ``module:package.module:factory`` (an operator's own)."""
    if name.startswith("module:"):
        module_name, _, attr = name.removeprefix("module:").rpartition(":")
        if not module_name or not attr:
            raise ValueError(f"--harness {name}: expected module:package.module:factory")
        return getattr(importlib.import_module(module_name), attr)(options)
    from .harness import get_harness  # imported here: the harness registry is a separate package

    return get_harness(name, options)


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.attach:
        return _attached(parser, args)
    missing = [flag for flag, value in (("--url", args.url), ("--key", args.key), ("--run-id", args.run_id))
               if not value]
    if missing:
        parser.error(f"{', '.join(missing)} required (or PAPERCLIP_RUNNER_URL / PAPERCLIP_API_KEY / PAPERCLIP_RUN_ID)")
    if f"/runs/{args.run_id}" not in args.url:
        parser.error("--url does not name the run given by --run-id")
    _logging()
    return _run(args, url=args.url, key=args.key, run_id=args.run_id,
                outbox=args.outbox or f"prp-outbox-{args.run_id}.sqlite3")


def _logging():
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="prp-runner: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is not a notable step


def _attached(parser, args) -> int:
    from .attach import attach_loop

    agent_key = os.environ.get("PAPERCLIP_AGENT_KEY")
    if not agent_key:
        parser.error("--attach needs the agent's long-lived key in PAPERCLIP_AGENT_KEY")
    _logging()

    def run_one(claimed: dict) -> int:
        outbox = os.path.join(args.outbox_dir, f"prp-outbox-{claimed['runId']}.sqlite3")
        return _run(args, url=claimed["runnerUrl"], key=claimed["apiKey"], run_id=claimed["runId"], outbox=outbox)

    return attach_loop(args.attach, agent_key, run_one, once=args.once, poll_seconds=args.attach_poll)


def _run(args, *, url: str, key: str, run_id: str, outbox: str) -> int:
    options = {"max_line_bytes": args.max_line_bytes}
    if args.script:
        options["script"] = args.script
    if args.command:
        options["command"] = list(args.command)
    try:
        harness = load_harness(args.harness, options)
    except (ImportError, AttributeError, LookupError, ValueError, OSError) as exc:
        print(f"prp-runner: harness {args.harness!r} unavailable: {exc}", file=sys.stderr)
        return EXIT_USAGE
    config = RunnerConfig(url=url, key=key, run_id=run_id, outbox_path=outbox, keep_outbox=args.keep_outbox,
                          cwd=args.cwd, drain_timeout=args.drain_timeout, max_pending_events=args.max_pending_events,
                          max_pending_bytes=args.max_pending_bytes, poll_wait=args.poll_wait)
    logging.getLogger("prp_runner").info("runner for run %s at %s, harness %s", run_id, url, args.harness)
    return Runner(config, harness).run()


def _exit(code: int):
    """End the process without interpreter finalization: a worker thread may still be inside a
    long-poll (httpx) or sqlite3 when the run is over, and tearing modules down under a running
    daemon thread can crash the process after a clean run. Everything durable is committed and
    the outbox closed by now; only the standard streams need flushing."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit(main())
