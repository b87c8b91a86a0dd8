"""The host's decision from a PRP terminal (issues.runner.decisions): the reported disposition is
advisory. The rule table (pure), then each case end to end through the intake: pending approvals,
pending interactions and open blockers keep a done issue in progress (named), a contradictory
claim sends it to review, blocked posts a system comment naming the blocker, needs_review goes to
review, yielded changes nothing, a failed run never changes the issue."""
import pytest

from issues.choices import RunStatus
from issues.models import Approval, ApprovalIssue, Comment, HeartbeatRun, Interaction, IssueRelation, RunEvent
from issues.runner import decisions
from tests.factories import AgentFactory, IssueFactory
from tests.test_runner_projections import make_runner, result, terminal

BLOCKER = {"reasonCode": "missing_credentials", "owner": {"kind": "board"}, "unblockAction": "Add the deploy key.",
           "scope": "task_wide"}
HELD = {"issue": {"id": "i1", "identifier": "PAP-1", "status": "in_progress", "checkedOutByRun": True}}


def facts(**extra) -> dict:
    return {**HELD, **extra}


def claim(**changes) -> dict:
    doc = result()
    doc["completionClaim"] = {**doc["completionClaim"], **changes}
    return doc


# --- the rule table (no database) ---------------------------------------------------------------------
@pytest.mark.parametrize("disposition,res,extra,status,outcome,codes", [
    ("done", result(), {}, "done", "done", ["claim_supported"]),
    ("done", result(), {"pendingApprovals": [{"id": "a1", "type": "generic", "title": "Spend", "status": "pending"}]},
     None, "kept_in_progress", ["pending_approvals"]),
    ("done", result(), {"pendingInteractions": [{"id": "x1", "kind": "request_confirmation", "title": "Plan?"}]},
     None, "kept_in_progress", ["pending_interactions"]),
    ("done", result(), {"openBlockers": [{"id": "b1", "identifier": "PAP-9", "status": "todo", "title": "Infra"}]},
     None, "kept_in_progress", ["open_blockers"]),
    ("done", claim(objectiveSatisfied=False), {}, "in_review", "kept_for_review", ["objective_not_satisfied"]),
    ("done", claim(remainingWork=[{"description": "Write docs", "blocksCompletion": True}]), {}, "in_review",
     "kept_for_review", ["remaining_work_blocks_completion"]),
    ("done", claim(remainingWork=[{"description": "Polish", "blocksCompletion": False}]), {}, "done", "done",
     ["claim_supported"]),
    ("done", claim(criteria=[{"criterionId": "c1", "status": "not_satisfied", "evidenceRefs": []}]), {},
     "in_review", "kept_for_review", ["criteria_not_satisfied"]),
    ("done", result(verification=[{"commandOrCheck": "pytest", "status": "failed"}]), {}, "in_review",
     "kept_for_review", ["verification_failed"]),
    ("done", None, {}, "in_review", "kept_for_review", ["no_result"]),
    ("done", result("needs_review"), {}, "in_review", "kept_for_review", ["disposition_mismatch"]),
    ("needs_review", result("needs_review"), {}, "in_review", "in_review", ["reported_needs_review"]),
    ("blocked", result("blocked", blocker=BLOCKER), {}, "blocked", "blocked", ["reported_blocked"]),
    ("blocked", None, {}, "blocked", "blocked", ["reported_blocked"]),
    ("yielded", result("yielded", continuation={"kind": "same_agent", "summary": "More", "idempotencyKey": "k"}),
     {}, None, "unchanged", ["reported_yielded"]),
])
def test_rule_table_for_a_succeeded_run_holding_its_issue(disposition, res, extra, status, outcome, codes):
    decision = decisions.rule(terminal=terminal("succeeded", disposition), result=res, facts=facts(**extra))
    assert (decision["issueStatus"], decision["outcome"]) == (status, outcome)
    assert [r["code"] for r in decision["reasons"]] == codes
    assert all(r["message"] for r in decision["reasons"])


def test_holds_come_before_the_claim_and_every_one_is_named():
    decision = decisions.rule(terminal=terminal(), result=claim(objectiveSatisfied=False), facts=facts(
        pendingApprovals=[{"id": "a1", "type": "generic", "title": "Budget raise", "status": "revision_requested"}],
        openBlockers=[{"id": "b1", "identifier": "PAP-9", "status": "todo", "title": "Infra"}]))
    assert decision["issueStatus"] is None and decision["outcome"] == "kept_in_progress"
    assert [r["code"] for r in decision["reasons"]] == ["pending_approvals", "open_blockers", "objective_not_satisfied"]
    assert "Budget raise (revision_requested)" in decision["reasons"][0]["message"]
    assert "PAP-9 (todo)" in decision["reasons"][1]["message"]


@pytest.mark.parametrize("run_state,code", [("failed", "run_failed"), ("cancelled", "run_cancelled")])
@pytest.mark.parametrize("disposition", ["done", "blocked", "needs_review", "yielded"])
def test_a_run_that_did_not_succeed_never_changes_the_issue(run_state, code, disposition):
    decision = decisions.rule(terminal=terminal(run_state, disposition), result=result(disposition, blocker=BLOCKER),
                              facts=facts())
    assert decision["issueStatus"] is None and [r["code"] for r in decision["reasons"]] == [code]


@pytest.mark.parametrize("issue", [
    {"id": "i1", "identifier": "PAP-1", "status": "todo", "checkedOutByRun": False},
    {"id": "i1", "identifier": "PAP-1", "status": "in_progress", "checkedOutByRun": False},
    {"id": "i1", "identifier": "PAP-1", "status": "in_review", "checkedOutByRun": True},
])
def test_only_an_issue_in_progress_under_this_run_is_changed(issue):
    decision = decisions.rule(terminal=terminal(), result=result(), facts={"issue": issue})
    assert decision["issueStatus"] is None and decision["reasons"][0]["code"] == "issue_not_checked_out"


@pytest.mark.parametrize("run_state,disposition,expected", [
    ("succeeded", "done", "done"), ("succeeded", "needs_review", "handoff"), ("succeeded", "blocked", "handoff"),
    ("succeeded", "yielded", ""), ("failed", "done", "failed"), ("cancelled", "done", ""),
])
def test_result_fields_feed_the_follow_up_rules(run_state, disposition, expected):
    decision = decisions.rule(terminal=terminal(run_state, disposition), result=result(disposition, blocker=BLOCKER),
                              facts=facts())
    fields = decisions.result_fields(decision, result(summary="S"))
    assert fields["result_status"] == expected and fields["result_summary"] == "S"


# --- end to end ---------------------------------------------------------------------------------------
def finish(prp, disposition="done", res=None, run_state="succeeded"):
    events = [prp.ev("run.result.proposed", res)] if res is not None else []
    events.append(prp.ev("run.terminal", terminal(run_state, disposition,
                                                  "completed" if run_state == "succeeded" else run_state)))
    prp.send(*events)
    prp.refresh()
    return prp.session.decision


def decision_line(run) -> str:
    [line] = RunEvent.objects.filter(run=run, kind="system", message__startswith="Host decision").values_list(
        "message", flat=True)
    return line


def test_a_pending_approval_keeps_a_done_issue_in_progress(db):
    prp = make_runner()
    approval = Approval.objects.create(company=prp.run.company, title="Spend $500", requested_by_agent=prp.run.agent)
    ApprovalIssue.objects.create(approval=approval, issue=prp.issue)
    decision = finish(prp, res=result())
    assert prp.issue.status == "in_progress" and prp.issue.checkout_run_id is None
    assert decision["outcome"] == "kept_in_progress" and decision["reasons"][0]["ids"] == [str(approval.pk)]
    assert "pending approvals: Spend $500 (pending)" in decision_line(prp.run)
    assert prp.run.status == RunStatus.SUCCEEDED and prp.run.result_status == "done"
    assert prp.run.result_final_state == "in_progress"


def test_a_pending_interaction_keeps_a_done_issue_in_progress(db):
    prp = make_runner()
    interaction = Interaction.objects.create(company=prp.run.company, issue=prp.issue, kind="request_confirmation",
                                             title="Confirm the plan")
    decision = finish(prp, res=result())
    assert prp.issue.status == "in_progress" and decision["reasons"][0]["ids"] == [str(interaction.pk)]
    assert "pending interactions: request_confirmation 'Confirm the plan'" in decision_line(prp.run)


def test_an_open_blocker_keeps_a_done_issue_in_progress(db):
    prp = make_runner()
    blocker = IssueFactory(company=prp.run.company, title="Infra first")
    IssueRelation.objects.create(company=prp.run.company, issue=blocker, related_issue=prp.issue, kind="blocks")
    decision = finish(prp, res=result())
    assert prp.issue.status == "in_progress"
    assert decision["reasons"][0] == {"code": "open_blockers", "ids": [str(blocker.pk)],
                                      "message": f"open blockers: {blocker.identifier} (todo)"}


def test_a_resolved_approval_or_a_done_blocker_does_not_hold(db):
    prp = make_runner()
    approval = Approval.objects.create(company=prp.run.company, title="Old", status="approved")
    ApprovalIssue.objects.create(approval=approval, issue=prp.issue)
    blocker = IssueFactory(company=prp.run.company, status="done")
    IssueRelation.objects.create(company=prp.run.company, issue=blocker, related_issue=prp.issue, kind="blocks")
    Interaction.objects.create(company=prp.run.company, issue=prp.issue, kind="request_confirmation", title="Old",
                               status="accepted")
    assert finish(prp, res=result())["outcome"] == "done" and prp.issue.status == "done"


def test_a_contradictory_claim_goes_to_review(db):
    prp = make_runner()
    decision = finish(prp, res=claim(remainingWork=[{"description": "Migrate data", "blocksCompletion": True}]))
    assert prp.issue.status == "in_review" and decision["outcome"] == "kept_for_review" and decision["applied"]
    assert "remaining work blocks completion: Migrate data" in decision_line(prp.run)
    assert prp.run.result_status == "done" and prp.run.result_final_state == "in_review"


def test_needs_review_goes_to_review(db):
    prp = make_runner()
    finish(prp, "needs_review", result("needs_review"))
    assert prp.issue.status == "in_review" and prp.run.result_status == "handoff"
    assert prp.run.liveness == "completed"


def test_blocked_sets_blocked_with_a_system_comment_naming_the_blocker(db):
    prp = make_runner()
    decision = finish(prp, "blocked", result("blocked", blocker=BLOCKER))
    assert prp.issue.status == "blocked" and prp.run.liveness == "blocked"
    comment = Comment.objects.get(issue=prp.issue)
    assert comment.author_type == "system" and str(comment.pk) == decision["commentId"]
    assert "missing_credentials" in comment.body and "Add the deploy key." in comment.body
    assert "kind: board" in comment.body and comment.provenance["kind"] == "runner_blocker"


def test_yielded_leaves_the_issue_and_lets_the_liveness_rules_decide(db):
    prp = make_runner()
    continuation = {"kind": "same_agent", "summary": "Next step", "idempotencyKey": "k1"}
    decision = finish(prp, "yielded", result("yielded", continuation=continuation))
    assert prp.issue.status == "in_progress" and prp.run.result_status == ""
    assert decision["outcome"] == "unchanged" and decision["continuation"] == continuation


@pytest.mark.parametrize("run_state", ["failed", "cancelled"])
def test_a_failed_or_cancelled_run_never_changes_the_issue(db, run_state):
    prp = make_runner()
    decision = finish(prp, "blocked", result("blocked", blocker=BLOCKER), run_state=run_state)
    assert prp.issue.status == "in_progress" and not Comment.objects.filter(issue=prp.issue).exists()
    assert decision["applied"] is False and prp.run.status == run_state


def test_an_issue_not_held_by_the_run_is_not_changed(db):
    prp = make_runner()
    other = HeartbeatRun.objects.create(company=prp.run.company, agent=prp.run.agent, status="running")
    prp.issue.checkout_run = other
    prp.issue.save(update_fields=["checkout_run"])
    decision = finish(prp, res=result())
    assert prp.issue.status == "in_progress" and decision["reasons"][0]["code"] == "issue_not_checked_out"


def test_a_refused_change_is_recorded_and_the_run_still_ends(db):
    """The issue was reassigned to another agent while the run held the checkout: the agent may no
    longer change it; the refusal is on the decision and in the log, the run ends anyway."""
    prp = make_runner()
    prp.issue.assignee_agent = AgentFactory(company=prp.run.company)
    prp.issue.save(update_fields=["assignee_agent"])
    decision = finish(prp, res=result())
    assert prp.run.status == RunStatus.SUCCEEDED and prp.issue.status == "in_progress"
    assert decision["applied"] is False and decision["refused"]["code"]
    assert "refused" in decision_line(prp.run)
