"""Reads for the run page of a PRP run: the session, its live snapshot (the session reducer over
the stored envelopes in position order), the command lane, the goal with the controls the runner
advertises, the credential namespace, activity counts and the host's decision.

The snapshot is cached by ``(run, session.event_count)``: a poll that finds no new event reuses
it, and the reducer runs again only after a commit added events. It reduces at most
``SNAPSHOT_MAX_EVENTS`` envelopes (the first ones: a prefix is a true snapshot as of that event,
a suffix would invent gaps), and the page says when it is bounded. Lists shown are bounded too
(the last ``TIMELINE_SHOWN`` timeline entries, ``COMMANDS_SHOWN`` commands) with their counts.
"""
from __future__ import annotations

import logging

from django.core.cache import cache
from django.db.models import Count

from issues.choices import InteractionKind
from issues.models import HeartbeatRun, Interaction, RunnerCommand, RunnerEvent, RunnerSession

from . import reducer
from .goals import goal_capability, goal_controls

log = logging.getLogger(__name__)

SNAPSHOT_MAX_EVENTS = 5000
TIMELINE_SHOWN = 50
REQUESTS_SHOWN = 100
COMMANDS_SHOWN = 50
CACHE_SECONDS = 3600


def session_events(session: RunnerSession, limit: int | None = None) -> list[dict]:
    """The stored envelopes of the session's run in position (commit) order, at most ``limit``
    (default SNAPSHOT_MAX_EVENTS)."""
    return list(RunnerEvent.objects.filter(run_id=session.pk).order_by("position")
                .values_list("envelope", flat=True)[:limit or SNAPSHOT_MAX_EVENTS])


def session_snapshot(session: RunnerSession) -> tuple[dict | None, str]:
    """``(snapshot, error)``: the reducer's snapshot of the session (cached by event count), or
    None and why it could not be built (the page still shows everything else)."""
    key = f"issues.runner.snapshot:{session.pk}:{session.event_count}:{SNAPSHOT_MAX_EVENTS}"
    snapshot = cache.get(key)
    if snapshot is not None:
        return snapshot, ""
    # The run id last: a runner-supplied identity never renames the run.
    identity = {**(session.identity if isinstance(session.identity, dict) else {}), "runId": str(session.pk)}
    capabilities = session.capabilities if isinstance(session.capabilities, dict) else {}
    try:
        snapshot = reducer.reduce_session(identity=identity, capabilities=capabilities,
                                          events=session_events(session))
    except Exception as exc:  # a page, not the intake: show the rest and say why
        log.exception("session snapshot of run %s", session.pk)
        return None, f"{type(exc).__name__}: {exc}"[:500]
    cache.set(key, snapshot, CACHE_SECONDS)
    return snapshot, ""


def _credential_rows(credentials) -> list[dict]:
    """auth.credentials.updated entries as the projection keeps them: ``{"provider/binding": entry}``."""
    if not isinstance(credentials, dict):
        return []
    return [{"key": key, **entry} for key, entry in sorted(credentials.items()) if isinstance(entry, dict)]


def _activity_rows(activity) -> list[dict]:
    """runtime.activity.recorded counts (``{namespace: {activityKey: {"count": n, …}}}``) as rows."""
    if not isinstance(activity, dict):
        return []
    return [{"namespace": namespace, "activityKey": key, "count": entry.get("count")}
            for namespace, keys in sorted(activity.items()) if isinstance(keys, dict)
            for key, entry in sorted(keys.items()) if isinstance(entry, dict)]


def runner_fingerprint(run: HeartbeatRun, session: RunnerSession | None = None) -> str | None:
    """What the panel shows changes only with one of these: a poll that sends the same
    fingerprint back is answered without building the view (None: the run has no session)."""
    session = session or RunnerSession.objects.filter(pk=run.pk).first()
    if session is None:
        return None
    counts = RunnerCommand.objects.filter(run_id=run.pk).aggregate(results=Count("result_at"),
                                                                    delivered=Count("delivered_at"))
    stamp = int(session.updated_at.timestamp() * 1000) if session.updated_at else 0
    return (f"{run.status}.{session.event_count}.{session.controller_seq}.{stamp}."
            f"{counts['results']}.{counts['delivered']}")


def runner_run_view(run: HeartbeatRun) -> dict | None:
    """Everything the run page shows about the run's PRP session; None for a run without one."""
    session = RunnerSession.objects.filter(pk=run.pk).first()
    if session is None:
        return None
    snapshot, snapshot_error = session_snapshot(session) if session.event_count else (None, "")
    timeline = (snapshot or {}).get("timeline") or []
    commands = list(RunnerCommand.objects.filter(run_id=run.pk).select_related("interaction")
                    .order_by("-controller_seq")[:COMMANDS_SHOWN])[::-1]
    requests = list(Interaction.objects.filter(run_id=run.pk, kind=InteractionKind.RUNTIME_REQUEST)
                    .select_related("issue").order_by("created_at")[:REQUESTS_SHOWN])
    return {
        "session": session,
        "fingerprint": runner_fingerprint(run, session),
        "snapshot": snapshot,
        "snapshot_error": snapshot_error,
        "snapshot_bounded": session.event_count > SNAPSHOT_MAX_EVENTS,
        "snapshot_max": SNAPSHOT_MAX_EVENTS,
        "timeline": timeline[-TIMELINE_SHOWN:],
        "timeline_count": len(timeline),
        "commands": commands,
        "command_count": session.controller_seq,
        "request_interactions": requests,
        "goal": session.goal if isinstance(session.goal, dict) else None,
        "goal_capability": goal_capability(session),
        "goal_controls": goal_controls(session),
        "credentials": _credential_rows(session.credentials),
        "activity": _activity_rows(session.activity),
        "decision": session.decision if isinstance(session.decision, dict) else {},
    }
