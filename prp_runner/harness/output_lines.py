"""The agent's output contract lines, parsed for the process harness (standard library only).

``PAPERCLIP_RESULT`` → ``paperclip.run_result.v1`` (``reportedWorkDisposition``,
``completionClaim.objectiveSatisfied``, ``continuation.kind``):

* status done → done, true, none;
* status handoff → needs_review, false, none;
* status failed → yielded, false, retry;
* status aborted → yielded, false, same_agent;
* no status (liveness only) → yielded, false, same_agent.

``summary`` is the line's summary, else its reason, else "The agent reported <status|liveness>."
(cut to 4000 characters as seed 003 does); ``completionClaim`` has ``contractRevision``
``paperclip-result-line-v1``, no criteria, and — unless done — one ``remainingWork`` entry (the
reason or summary, ``blocksCompletion`` true); ``pr_url`` becomes an artifact ``{"kind":
"pull_request", "ref": <url>}``; ``evidence``, ``verification`` and ``attentionRequests`` are empty;
a continuation's ``idempotencyKey`` is ``<run id>:<turn id>:<kind>``. The line itself is kept as
``resultLine`` (its members as given) — liveness, reason and final_state travel there; the host
decides the issue's status from the disposition, not from ``final_state``.
"""
from __future__ import annotations

import json
import math

RESULT_PREFIX, USAGE_PREFIX = "PAPERCLIP_RESULT", "PAPERCLIP_USAGE"
RESULT_SCHEMA = "paperclip.run_result.v1"
CONTRACT_REVISION = "paperclip-result-line-v1"
# seed 003 (issues.adapters.result_line, issues.choices): the values and bounds of the output contract.
STATUSES = ("done", "handoff", "failed", "aborted")
LIVENESS = ("completed", "advanced", "plan_only", "empty_response", "blocked", "failed", "needs_followup")
FINAL_STATE_MAX, PR_URL_MAX, REASON_MAX, SUMMARY_MAX = 100, 1000, 300, 4000
DISPOSITIONS = {"done": "done", "handoff": "needs_review", "failed": "yielded", "aborted": "yielded"}
CONTINUATIONS = {"failed": "retry", "aborted": "same_agent", "": "same_agent"}
COUNTERS = ("inputTokens", "outputTokens", "cacheReadTokens", "cacheWriteTokens")
OPTIONAL_NUMBERS = ("requests", "providerCostUsd")  # null when the agent does not say
USAGE_TEXT = {"provider": 80, "model": 240, "providerSessionId": 240, "providerRequestId": 240}


class LineError(ValueError):
    """A result or usage line that cannot be used; the message says why."""


# --- PAPERCLIP_RESULT ----------------------------------------------------------------------------------
def parse_result_line(text: str) -> dict | None:
    """``PAPERCLIP_RESULT {...}`` → the contract's values (status, liveness, reason, summary,
    final_state, pr_url; empty strings when absent); None for any other line."""
    if not text.startswith(RESULT_PREFIX):
        return None
    payload = _json_object(text[len(RESULT_PREFIX):], RESULT_PREFIX)
    values = {}
    for key in ("status", "liveness", "summary", "final_state", "pr_url"):
        value = payload.get(key)
        if value is not None and not isinstance(value, str):
            raise LineError(f"{key} must be a string")
        values[key] = (value or "").strip()
    reason = payload.get("reason")
    values["reason"] = ("" if reason is None else str(reason))[:REASON_MAX]  # free text, as seed 003 keeps it
    if not (values["status"] or values["liveness"]):
        raise LineError("neither status nor liveness given")
    if values["status"] and values["status"] not in STATUSES:
        raise LineError(f"status {values['status'][:40]!r} is not one of {', '.join(STATUSES)}")
    if values["liveness"] and values["liveness"] not in LIVENESS:
        raise LineError(f"liveness {values['liveness'][:40]!r} is not one of {', '.join(LIVENESS)}")
    if len(values["final_state"]) > FINAL_STATE_MAX:
        raise LineError(f"final_state is longer than {FINAL_STATE_MAX} characters")
    url = values["pr_url"]
    if url and (len(url) > PR_URL_MAX or not url.startswith(("http://", "https://")) or any(c.isspace() for c in url)):
        raise LineError(f"pr_url must be an http(s) URL of at most {PR_URL_MAX} characters")
    values["summary"] = values["summary"][:SUMMARY_MAX]
    return values


def run_result(report: dict, *, run_id: str, turn_id: str) -> dict:
    """The ``paperclip.run_result.v1`` payload of a parsed result line (see the module doc)."""
    status = report["status"]
    said = status or f"liveness {report['liveness']}"
    summary = report["summary"] or report["reason"] or f"The agent reported {said}."
    remaining = [] if status == "done" else [
        {"description": report["reason"] or report["summary"] or f"The agent reported {said}.",
         "blocksCompletion": True}]
    result = {
        "schema": RESULT_SCHEMA,
        "reportedWorkDisposition": DISPOSITIONS.get(status, "yielded"),
        "summary": summary,
        "completionClaim": {"contractRevision": CONTRACT_REVISION, "objectiveSatisfied": status == "done",
                            "criteria": [], "remainingWork": remaining},
        "evidence": [],
        "verification": [],
        "attentionRequests": [],
        "artifacts": [{"kind": "pull_request", "ref": report["pr_url"], "title": "Pull request"}]
        if report["pr_url"] else [],
        "resultLine": {key: value for key, value in report.items() if value},
    }
    if result["reportedWorkDisposition"] == "yielded":
        kind = CONTINUATIONS[status]
        result["continuation"] = {"kind": kind, "summary": summary, "idempotencyKey": f"{run_id}:{turn_id}:{kind}"}
    return result


# --- PAPERCLIP_USAGE -----------------------------------------------------------------------------------
def parse_usage_line(text: str) -> dict | None:
    """``PAPERCLIP_USAGE {...}`` → the increment's values; None for any other line."""
    if not text.startswith(USAGE_PREFIX):
        return None
    payload = _json_object(text[len(USAGE_PREFIX):], USAGE_PREFIX)
    usage = {}
    for key, limit in USAGE_TEXT.items():
        value = payload.get(key)
        if value is not None and (not isinstance(value, str) or not 0 < len(value) <= limit):
            raise LineError(f"{key} must be a string of 1 to {limit} characters")
        usage[key] = value
    usage["provider"] = usage["provider"] or "unknown"
    for key in COUNTERS + ("activeSeconds",) + OPTIONAL_NUMBERS:
        value = payload.get(key)
        if value is None:
            usage[key] = None if key in OPTIONAL_NUMBERS else 0
            continue
        integral = key in COUNTERS or key == "requests"
        if isinstance(value, bool) or not isinstance(value, int if integral else (int, float)) \
                or not math.isfinite(value) or value < 0:  # json.loads takes NaN and Infinity
            raise LineError(f"{key} must be a{'n integer' if integral else ' number'} ≥ 0")
        usage[key] = value
    return usage


class UsageTotals:
    """This run's usage by provider and model: the ``cumulative`` of each report."""

    def __init__(self):
        self._totals: dict[tuple, dict] = {}

    def report(self, usage: dict) -> dict:
        """The ``usage.reported`` payload (usage.schema.json) of one increment."""
        delta = {key: usage[key] for key in COUNTERS + ("activeSeconds",) + OPTIONAL_NUMBERS}
        key = (usage["provider"], usage["model"])
        total = self._totals.get(key)
        total = dict(delta) if total is None else {k: _add(total[k], v) for k, v in delta.items()}
        self._totals[key] = total
        payload = {"provider": usage["provider"], "model": usage["model"], "cumulative": dict(total),
                   "runDelta": delta, "runDeltaAvailable": True,
                   "costSource": "provider_reported" if usage["providerCostUsd"] is not None else "unknown"}
        payload.update({k: usage[k] for k in ("providerSessionId", "providerRequestId") if usage[k] is not None})
        return payload


def _add(a, b):
    return None if a is None and b is None else (a or 0) + (b or 0)


def _json_object(body: str, prefix: str) -> dict:
    try:
        payload = json.loads(body.strip())
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise LineError(f"not valid JSON ({getattr(exc, 'msg', exc)})") from None
    if not isinstance(payload, dict):
        raise LineError(f"expected a JSON object after {prefix}")
    return payload


# --- the harness ---------------------------------------------------------------------------------------
