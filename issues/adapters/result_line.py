"""The worker's output contract (seed 003): the ``PAPERCLIP_RESULT {json}`` line an agent prints last.

::

    PAPERCLIP_RESULT {"status": "done", "final_state": "in_review", "pr_url": "https://…/pull/7",
                      "summary": "Two or three sentences.", "liveness": "completed", "reason": "…"}

Every key is optional, but a line must say something (a ``status`` or a ``liveness``). Unknown keys
are ignored, so agents may add their own. A line that is not valid raises :class:`ResultLineError`
naming what is wrong; the adapter logs it and keeps the last valid line (the last one wins).
Pure parsing: no database, no Django models.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator

from issues.choices import RunLiveness, RunResultStatus

RESULT_PREFIX = "PAPERCLIP_RESULT"
# The run's columns: result_final_state (100), result_pr_url (1000), liveness_reason (300).
FINAL_STATE_MAX = 100
PR_URL_MAX = 1000
REASON_MAX = 300
SUMMARY_MAX = 4000  # "2-3 sentences for the orchestrator log"; a longer one is cut, not refused
_URL = URLValidator(schemes=("http", "https"))


class ResultLineError(ValueError):
    """A ``PAPERCLIP_RESULT`` line that cannot be used; the message says why."""


@dataclass(frozen=True)
class RunReport:
    """What the agent said about its run (PAPERCLIP_RESULT or a final heartbeat)."""

    status: str = ""  # a RunResultStatus value, or "" when only liveness was reported
    final_state: str = ""
    pr_url: str = ""
    summary: str = ""
    liveness: str = ""  # a RunLiveness value, or ""
    liveness_reason: str = ""


def is_result_line(text: str) -> bool:
    return text.startswith(RESULT_PREFIX)


def _text(payload: dict, key: str) -> str:
    value = payload.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ResultLineError(f"{key} must be a string")
    return value.strip()


def _shown(value: str) -> str:
    return repr(value if len(value) <= 40 else value[:40] + "…")


def report_from_values(*, status: str = "", final_state: str = "", pr_url: str = "", summary: str = "",
                       liveness: str = "", liveness_reason: str = "") -> RunReport:
    """Check the contract's values (shared by the result line and the final heartbeat)."""
    if status and status not in RunResultStatus.values:
        raise ResultLineError(f"status {_shown(status)} is not one of {', '.join(RunResultStatus.values)}")
    if liveness and liveness not in RunLiveness.values:
        raise ResultLineError(f"liveness {_shown(liveness)} is not one of {', '.join(RunLiveness.values)}")
    if len(final_state) > FINAL_STATE_MAX:
        raise ResultLineError(f"final_state is longer than {FINAL_STATE_MAX} characters")
    if pr_url:
        if len(pr_url) > PR_URL_MAX:
            raise ResultLineError(f"pr_url is longer than {PR_URL_MAX} characters")
        try:
            _URL(pr_url)
        except ValidationError:
            raise ResultLineError("pr_url must be an http(s) URL") from None
    return RunReport(status=status, final_state=final_state, pr_url=pr_url, summary=summary[:SUMMARY_MAX],
                     liveness=liveness, liveness_reason=liveness_reason[:REASON_MAX])


def parse_result_line(text: str) -> RunReport | None:
    """``PAPERCLIP_RESULT {...}`` -> RunReport; None when ``text`` is not a result line at all.
    Raises ResultLineError for a result line that is malformed."""
    if not is_result_line(text):
        return None
    body = text[len(RESULT_PREFIX):].strip()
    try:
        payload = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ResultLineError(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    except (ValueError, RecursionError):  # e.g. nesting deep enough to exhaust the parser's stack
        raise ResultLineError("not valid JSON") from None
    if not isinstance(payload, dict):
        raise ResultLineError("expected a JSON object after PAPERCLIP_RESULT")
    values = {"status": _text(payload, "status"), "final_state": _text(payload, "final_state"),
              "pr_url": _text(payload, "pr_url"), "summary": _text(payload, "summary"),
              "liveness": _text(payload, "liveness")}
    # "reason" was always free text; a number or the like is kept as text rather than refused.
    reason = payload.get("reason")
    values["liveness_reason"] = "" if reason is None else str(reason)
    if not (values["status"] or values["liveness"]):
        raise ResultLineError("neither status nor liveness given")
    return report_from_values(**values)
