"""The one terminal a run ends with when its harness did not report one: derived from facts.

The facts are the harness's exit code, the last proposed result, and whether the host asked to
interrupt the turn or cancel the run. A stop wins over the exit code (a harness that exits 0 after
an interrupt was still stopped), and an error exit is a failed run whatever result was proposed:
a ``done`` result never turns a crash into a success.
"""
from __future__ import annotations

TERMINAL_SCHEMA = "paperclip.prp.terminal.v1"
YIELDED = "yielded"
DISPOSITIONS = ("done", "blocked", "needs_review", YIELDED)


def derive_terminal(*, exit_code: int | None, result: dict | None, interrupted: bool, cancelled: bool) -> dict:
    """A ``paperclip.prp.terminal.v1`` payload. ``exit_code`` None means the harness crashed."""
    if cancelled:
        turn, run, disposition = "cancelled", "cancelled", YIELDED
    elif interrupted:
        turn, run, disposition = "interrupted", "cancelled", YIELDED
    elif exit_code == 0:
        disposition = result.get("reportedWorkDisposition") if isinstance(result, dict) else None
        turn, run = "completed", "succeeded"
        disposition = disposition if disposition in DISPOSITIONS else YIELDED
    else:
        turn, run, disposition = "failed", "failed", YIELDED
    return {"schema": TERMINAL_SCHEMA, "turnTerminalState": turn, "runTerminalState": run,
            "reportedWorkDisposition": disposition}
