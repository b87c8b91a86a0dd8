"""Attach mode: a runner the operator runs elsewhere asks the host for its agent's next run.

``POST <api>/api/runner/v1/attach`` with the agent's long-lived key (``PAPERCLIP_AGENT_KEY``)
answers a run of the agent whose adapter is ``prp`` with ``launch: "external"`` — its run-scoped
key, runner URL and the agent environment — or 204 when none waits. The runner then drives that
run exactly as one the host started, and asks again (``--once``: after one run).
"""
from __future__ import annotations

import logging
import os
import time

import httpx

log = logging.getLogger("prp_runner")


class AttachRefused(Exception):
    """The host refused the attach request (a bad or revoked key, a run-scoped key): not retried."""


def attach_next(api_url: str, agent_key: str, *, timeout: float = 30.0) -> dict | None:
    """The next run handed to this runner, or None when none waits (connection errors raise)."""
    response = httpx.post(api_url.rstrip("/") + "/api/runner/v1/attach", timeout=timeout,
                          headers={"Authorization": f"Bearer {agent_key}"})
    if response.status_code == 204:
        return None
    if response.status_code != 200:
        raise AttachRefused(f"attach refused: HTTP {response.status_code} {response.text[:300]}")
    return response.json()


def attach_loop(api_url: str, agent_key: str, run_one, *, once: bool, poll_seconds: float) -> int:
    """Claim runs and drive each with ``run_one(claimed) -> exit code``; the last code is returned."""
    code, previous_env = 0, set()
    while True:
        try:
            claimed = attach_next(api_url, agent_key)
        except httpx.HTTPError as exc:
            log.warning("attach: host unreachable (%s); retrying", exc.__class__.__name__)
            claimed = None
        except AttachRefused as exc:
            log.error("%s", exc)
            return 3
        if claimed is None:
            time.sleep(poll_seconds)  # nothing waits: ask again later (a loop, not a retry of a race)
            continue
        for name in previous_env - set(claimed["env"]):
            os.environ.pop(name, None)  # a variable of the previous run (e.g. its task) must not leak
        os.environ.update(claimed["env"])
        previous_env = set(claimed["env"])
        log.info("attach: run %s", claimed["runId"])
        code = run_one(claimed)
        if once:
            return code
