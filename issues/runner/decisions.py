"""The host's decision from a PRP run's terminal: the reported work disposition is advisory.

A runner ends its run with ``run.terminal`` (``runTerminalState`` succeeded / failed / cancelled,
``reportedWorkDisposition`` done / blocked / needs_review / yielded), usually after a
``run.result.proposed`` (``paperclip.run_result.v1``: summary, completion claim, blocker, …). The
host does not take the disposition at its word. :func:`decide` gathers the facts (the issue, and
for a ``done`` claim what still holds the issue open) and :func:`rule` — pure — applies these
rules, in order:

1. A run that did not succeed never changes the issue (``run_failed`` / ``run_cancelled``).
2. Only an issue still ``in_progress`` under this run's checkout is changed, as
   ``run_results._hand_off`` does (``no_issue`` / ``issue_not_checked_out``).
3. ``done``: kept in progress while something the host knows of holds the issue open —
   pending approvals linked to it, pending interactions on it, open blockers (each named);
   otherwise kept for review (``in_review``) when the claim does not support itself — no
   structured result to check it against, a result with another disposition, ``objectiveSatisfied``
   false, remaining work that ``blocksCompletion``, a criterion ``not_satisfied`` or a failed
   verification; otherwise ``done``.
4. ``needs_review`` -> ``in_review``; ``blocked`` -> ``blocked``, with a system comment naming the
   blocker (reasonCode, unblockAction, owner, scope) when the result has one; ``yielded`` leaves
   the issue as it is (a continuation may follow by the usual liveness rules).

:func:`apply` makes the change on behalf of the run (``issue_update`` with the run's agent and
run, audited like any agent change; a refusal is recorded, the run still ends) and says in the
run log what the host decided and why. The decision dict is stored on ``RunnerSession.decision``.

The run's result fields follow the decision so that services.runs' follow-up rules behave as for
other runs (:func:`result_fields`): ``result_status`` done (done claim, even when the issue was
kept open: the agent is finished, a wake from the approval or blocker continues it), handoff
(needs_review or blocked: the issue waits for someone else), failed (a failed run: retried with
backoff as a reported failure), and none for yielded (the liveness continuation rule decides) or
cancelled (a stop ends the chain by itself). ``result_final_state`` is the issue status after the
decision, ``result_summary`` the proposed result's summary.
"""
from __future__ import annotations

from issues.actors import SYSTEM, Actor
from issues.choices import AuthorType, InteractionStatus, IssueStatus, RunResultStatus, RunStatus
from issues.exceptions import ApiError
from issues.models import Approval, HeartbeatRun, Interaction, Issue
from issues.selectors import open_blockers

from .commands import iso_now
from .host_control import log

DONE, BLOCKED, NEEDS_REVIEW, YIELDED = "done", "blocked", "needs_review", "yielded"
RUN_STATUSES = {"succeeded": RunStatus.SUCCEEDED, "failed": RunStatus.FAILED, "cancelled": RunStatus.CANCELLED}
OPEN_APPROVALS = ("pending", "revision_requested")  # services.approvals.RESOLVABLE
NAMED_MAX = 20  # at most this many approvals / interactions / blockers named in a decision
SUMMARY_MAX = 12000  # result.schema.json's bound on summary


def _obj(value) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value) -> list:
    return value if isinstance(value, list) else []


# --- facts (queries) -------------------------------------------------------------------------------
def gather_facts(run: HeartbeatRun, disposition: str) -> dict:
    """What the rules look at: the run's issue and, for a done claim on an issue this run holds,
    what keeps it open. At most four queries."""
    issue = Issue.objects.filter(pk=run.issue_id).first() if run.issue_id else None
    if issue is None:
        return {"issue": None}
    facts = {"issue": {"id": str(issue.pk), "identifier": issue.identifier, "status": issue.status,
                       "checkedOutByRun": issue.checkout_run_id == run.pk}}
    if disposition == DONE and issue.status == IssueStatus.IN_PROGRESS and issue.checkout_run_id == run.pk:
        facts["pendingApprovals"] = [
            {"id": str(a.pk), "type": a.type, "title": a.title, "status": a.status}
            for a in Approval.objects.filter(issue_links__issue=issue, status__in=OPEN_APPROVALS)
            .order_by("created_at")[:NAMED_MAX]]
        facts["pendingInteractions"] = [
            {"id": str(i.pk), "kind": i.kind, "title": i.title}
            for i in Interaction.objects.filter(issue=issue, status=InteractionStatus.PENDING)
            .order_by("created_at")[:NAMED_MAX]]
        facts["openBlockers"] = [{"id": str(b.pk), "identifier": b.identifier, "status": b.status, "title": b.title}
                                 for b in open_blockers(issue)[:NAMED_MAX]]
    return facts


# --- the rules (pure) -----------------------------------------------------------------------------------
def _claim_problems(result: dict | None) -> list[dict]:
    """Why a done claim does not support itself (empty: it does)."""
    if not isinstance(result, dict):
        return [{"code": "no_result", "message": "no structured result (run.result.proposed) backs the done claim"}]
    problems = []
    reported = result.get("reportedWorkDisposition")
    if reported != DONE:
        problems.append({"code": "disposition_mismatch",
                         "message": f"the proposed result says {reported!r}, the terminal says 'done'"})
    claim = _obj(result.get("completionClaim"))
    if claim.get("objectiveSatisfied") is False:
        problems.append({"code": "objective_not_satisfied", "message": "the completion claim says the objective "
                                                                       "is not satisfied"})
    blocking = [str(_obj(w).get("description", ""))[:200] for w in _list(claim.get("remainingWork"))
                if _obj(w).get("blocksCompletion") is True]
    if blocking:
        problems.append({"code": "remaining_work_blocks_completion", "items": blocking,
                         "message": "remaining work blocks completion: " + "; ".join(blocking)})
    unmet = [str(_obj(c).get("criterionId", "")) for c in _list(claim.get("criteria"))
             if _obj(c).get("status") == "not_satisfied"]
    if unmet:
        problems.append({"code": "criteria_not_satisfied", "items": unmet,
                         "message": "criteria not satisfied: " + ", ".join(unmet)})
    failed = [str(_obj(v).get("commandOrCheck", ""))[:200] for v in _list(result.get("verification"))
              if _obj(v).get("status") == "failed"]
    if failed:
        problems.append({"code": "verification_failed", "items": failed,
                         "message": "verification failed: " + "; ".join(failed)})
    return problems


def _holds(facts: dict) -> list[dict]:
    """What keeps the issue open, each named."""
    reasons = []
    approvals = facts.get("pendingApprovals") or []
    if approvals:
        reasons.append({"code": "pending_approvals", "ids": [a["id"] for a in approvals],
                        "message": "pending approvals: " + ", ".join(f"{a['title']} ({a['status']})"
                                                                    for a in approvals)})
    interactions = facts.get("pendingInteractions") or []
    if interactions:
        reasons.append({"code": "pending_interactions", "ids": [i["id"] for i in interactions],
                        "message": "pending interactions: " + ", ".join(f"{i['kind']} {i['title']!r}"
                                                                       for i in interactions)})
    blockers = facts.get("openBlockers") or []
    if blockers:
        reasons.append({"code": "open_blockers", "ids": [b["id"] for b in blockers],
                        "message": "open blockers: " + ", ".join(f"{b['identifier']} ({b['status']})"
                                                                 for b in blockers)})
    return reasons


def rule(*, terminal: dict, result: dict | None, facts: dict) -> dict:
    """The decision (no I/O): ``issueStatus`` is the status the host sets (None: unchanged),
    ``outcome`` a short name, ``reasons`` why (each ``{code, message}``)."""
    run_state = terminal.get("runTerminalState")
    disposition = terminal.get("reportedWorkDisposition")
    issue = facts.get("issue")
    decision = {"runStatus": RUN_STATUSES.get(run_state, RunStatus.FAILED), "reportedWorkDisposition": disposition,
                "turnTerminalState": terminal.get("turnTerminalState"),
                "issueId": issue["id"] if issue else None, "issueStatusBefore": issue["status"] if issue else None,
                "issueStatus": None, "outcome": "unchanged", "reasons": []}
    if isinstance(result, dict) and isinstance(result.get("continuation"), dict):
        decision["continuation"] = result["continuation"]

    def keep(code: str, message: str, **extra):
        decision["reasons"].append({"code": code, "message": message, **extra})
        return decision

    if run_state != "succeeded":
        return keep("run_failed" if run_state == "failed" else "run_cancelled",
                    f"the run {run_state or 'ended'}: the issue is not changed")
    if issue is None:
        return keep("no_issue", "the run has no issue")
    if issue["status"] != IssueStatus.IN_PROGRESS or not issue["checkedOutByRun"]:
        return keep("issue_not_checked_out", f"{issue['identifier']} is {issue['status']} and not checked out "
                                             "by this run: the host changes only an issue it holds")
    if disposition == DONE:
        holds = _holds(facts)
        problems = _claim_problems(result)
        decision["reasons"] = holds + problems
        if holds:
            decision["outcome"] = "kept_in_progress"
        elif problems:
            decision.update(issueStatus=IssueStatus.IN_REVIEW, outcome="kept_for_review")
        else:
            decision.update(issueStatus=IssueStatus.DONE, outcome="done")
            decision["reasons"].append({"code": "claim_supported", "message": "the completion claim is "
                                        "consistent and nothing holds the issue open"})
        return decision
    if disposition == NEEDS_REVIEW:
        decision.update(issueStatus=IssueStatus.IN_REVIEW, outcome="in_review")
        return keep("reported_needs_review", "the runner asked for review")
    if disposition == BLOCKED:
        blocker = _obj(_obj(result).get("blocker")) or None
        decision.update(issueStatus=IssueStatus.BLOCKED, outcome="blocked")
        if blocker:
            decision["blocker"] = blocker
            return keep("reported_blocked", f"blocked: {blocker.get('reasonCode')} — {blocker.get('unblockAction')}")
        return keep("reported_blocked", "the runner reported the work blocked without naming a blocker")
    return keep("reported_yielded", "the runner yielded: the issue stays as it is (a continuation may follow)")


def result_fields(decision: dict, result: dict | None) -> dict:
    """The run's result columns (see the module doc for why each)."""
    status, disposition = decision["runStatus"], decision["reportedWorkDisposition"]
    if status == RunStatus.FAILED:
        result_status = RunResultStatus.FAILED
    elif status != RunStatus.SUCCEEDED or disposition == YIELDED:
        result_status = ""
    elif disposition == DONE:
        result_status = RunResultStatus.DONE
    else:  # needs_review, blocked
        result_status = RunResultStatus.HANDOFF
    final_state = decision["issueStatus"] or decision["issueStatusBefore"] or ""
    summary = _obj(result).get("summary")
    return {"result_status": result_status, "result_final_state": str(final_state)[:100],
            "result_summary": summary[:SUMMARY_MAX] if isinstance(summary, str) else ""}


def decide(*, run: HeartbeatRun, terminal: dict, result: dict | None, terminal_event_id: str) -> dict:
    """The host's decision for ``run`` from its first terminal and latest proposed result."""
    facts = gather_facts(run, terminal.get("reportedWorkDisposition"))
    decision = rule(terminal=terminal, result=result, facts=facts)
    decision.update(terminalEventId=terminal_event_id, decidedAt=iso_now())
    return decision


# --- applying it -------------------------------------------------------------------------------------------
def _blocker_comment(decision: dict, run: HeartbeatRun) -> str:
    blocker = decision["blocker"]
    owner = _obj(blocker.get("owner"))
    lines = [f"The runner of run {run.pk} reported this issue blocked.",
             f"- Reason: {blocker.get('reasonCode')}", f"- To unblock: {blocker.get('unblockAction')}"]
    if owner:
        shown = [f"{k}: {v}" for k, v in sorted(owner.items()) if isinstance(v, (str, int))]
        if shown:
            lines.append("- Owner: " + ", ".join(shown))
    if blocker.get("scope"):
        lines.append(f"- Scope: {blocker.get('scope')}")
    return "\n".join(lines)[:4000]


def _line(decision: dict) -> str:
    reasons = "; ".join(r["message"] for r in decision["reasons"]) or "no reason recorded"
    target = decision["issueStatus"]
    if decision.get("refused"):
        verdict = f"wanted {target}, refused ({decision['refused']['code']})"
    elif target:
        verdict = f"issue -> {target}"
    else:
        verdict = "issue unchanged"
    return (f"Host decision on run.terminal ({decision['runStatus']}, reported {decision['reportedWorkDisposition']}): "
            f"{verdict} ({decision['outcome']}): {reasons}.")[:4000]


def apply(*, run: HeartbeatRun, decision: dict) -> dict:
    """Make the decided issue change on behalf of the run (before the run ends, while it still holds
    the checkout) and log the decision. Returns ``decision`` with ``applied`` / ``refused`` set."""
    from issues.services.issues import issue_update
    from issues.services.thread import comment_create

    target = decision["issueStatus"]
    decision["applied"] = False
    if target:
        issue = Issue.objects.get(pk=decision["issueId"])
        try:
            issue_update(actor=Actor(agent=run.agent, _run=run), issue=issue, changes={"status": target})
            decision["applied"] = True
        except ApiError as exc:  # e.g. reassigned meanwhile: the run still ends, the refusal is recorded
            decision["refused"] = {"code": exc.code, "message": str(exc.message)[:300]}
        if decision["applied"] and decision.get("blocker"):
            comment = comment_create(actor=SYSTEM, issue=issue, body=_blocker_comment(decision, run),
                                     author_type=AuthorType.SYSTEM,
                                     provenance={"kind": "runner_blocker", "runId": str(run.pk),
                                                 "terminalEventId": decision.get("terminalEventId")})
            decision["commentId"] = str(comment.pk)
    log(run.pk, _line(decision), hostDecision={k: decision.get(k) for k in (
        "outcome", "issueStatus", "applied", "reportedWorkDisposition", "terminalEventId")},
        reasons=[r["code"] for r in decision["reasons"]])
    return decision
