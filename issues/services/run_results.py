"""The worker's output contract (seed 003): what the host does with the result an agent reports.

An agent ends its run with ``status`` (done, handoff, failed, aborted), ``final_state``, ``pr_url``
and ``summary`` — the last ``PAPERCLIP_RESULT`` line of a process, or a final heartbeat over the
API. :func:`run_result_record` (called before ``run_finish``) records it on the run, posts
``pr_url`` as a pull-request work product on the run's issue, and applies the issue effects:

* ``handoff`` leaves the issue in review: an issue still in progress under this run's checkout
  moves to ``in_review`` through the normal issue service (audited, on behalf of the run);
* ``done`` changes nothing by itself — the agent PATCHes its issue; the host does not mark work
  complete from the agent's memory (seed 003);
* ``failed`` and ``aborted`` end the run ``failed`` even on exit 0 (:func:`finish_status`);
  ``result_status`` then tells the follow-up rules apart: ``failed`` is retried with backoff,
  ``aborted`` never (issues.services.runs). ``aborted`` is a failed run rather than a cancelled
  one because nobody stopped it: the agent gave up.

Liveness the agent did not report is derived from the status: handoff -> completed,
failed/aborted -> failed, done -> completed only when the issue is done or in review (otherwise
run_finish derives it from the durable progress, as for any run).
"""
from __future__ import annotations

from django.db import transaction

from issues.actors import SYSTEM, Actor
from issues.adapters.result_line import RunReport
from issues.choices import (
    LIVE_RUN_STATUSES,
    AdapterType,
    IssueStatus,
    RunLiveness,
    RunResultStatus,
    RunStatus,
    WorkProductKind,
)
from issues.exceptions import ApiError, Conflict, Forbidden
from issues.models import HeartbeatRun, Issue

from .activity import activity_record

FAILED_RESULTS = (RunResultStatus.FAILED, RunResultStatus.ABORTED)
SUMMARY_IN_AUDIT = 500


def finish_status(result_status: str, status: str, error: str = "") -> tuple[str, str]:
    """The run status (and error) to finish with: a run whose agent reported failed or aborted
    is failed even when its process exited 0; otherwise the process (or API) outcome stands."""
    if result_status in FAILED_RESULTS and status == RunStatus.SUCCEEDED:
        return RunStatus.FAILED, f"agent reported {result_status}"
    return status, error


def _derived_liveness(report: RunReport, issue_status: str | None) -> tuple[str, str]:
    if report.liveness:
        return report.liveness, report.liveness_reason
    if report.status == RunResultStatus.HANDOFF:
        return RunLiveness.COMPLETED, "reported handoff"
    if report.status in FAILED_RESULTS:
        return RunLiveness.FAILED, f"reported {report.status}"
    if report.status == RunResultStatus.DONE and issue_status in (IssueStatus.DONE, IssueStatus.IN_REVIEW):
        return RunLiveness.COMPLETED, f"reported done; issue {issue_status}"
    return "", ""  # run_finish derives it


def _on_behalf_of_run(actor: Actor, run: HeartbeatRun) -> Actor:
    """Issue changes the result implies are the run's own (its agent said so); a board user who
    ended the run over the API acts as themself."""
    return actor if actor.is_board else Actor(agent=run.agent, _run=run)


def _hand_off(actor: Actor, run: HeartbeatRun) -> dict:
    """handoff: an issue still in progress under this run's checkout goes to review."""
    from .issues import issue_update

    issue = Issue.objects.filter(pk=run.issue_id).first()
    if issue is None or issue.status != IssueStatus.IN_PROGRESS or issue.checkout_run_id != run.pk:
        return {}
    try:
        issue_update(actor=_on_behalf_of_run(actor, run), issue=issue, changes={"status": IssueStatus.IN_REVIEW})
    except ApiError as exc:  # e.g. reassigned in the meantime: the run still ends, the refusal is audited
        return {"handoffRefused": exc.code}
    return {"issueStatus": [IssueStatus.IN_PROGRESS, IssueStatus.IN_REVIEW]}


def run_result_record(*, run: HeartbeatRun, report: RunReport, actor: Actor = SYSTEM) -> HeartbeatRun:
    """Record the agent's report on ``run`` (still live) and apply its effects; see the module doc.
    A run that has already ended keeps what it had: a late report changes nothing."""
    with transaction.atomic():
        run = HeartbeatRun.objects.select_for_update().select_related("agent").get(pk=run.pk)
        if run.status not in LIVE_RUN_STATUSES:
            return run
        run.result_status, run.result_final_state = report.status, report.final_state
        run.result_pr_url, run.result_summary = report.pr_url, report.summary
        run.save(update_fields=["result_status", "result_final_state", "result_pr_url", "result_summary",
                                "updated_at"])
    details = {"status": report.status, "finalState": report.final_state, "prUrl": report.pr_url,
               "summary": report.summary[:SUMMARY_IN_AUDIT]}
    if report.pr_url and run.issue_id:
        from .work_products import work_product_record_for_run

        work_product, created = work_product_record_for_run(run=run, kind=WorkProductKind.PULL_REQUEST,
                                                            url=report.pr_url)
        details.update(workProductId=str(work_product.pk), workProductCreated=created)
    if report.status == RunResultStatus.HANDOFF and run.issue_id:
        details.update(_hand_off(actor, run))
    issue_status = Issue.objects.filter(pk=run.issue_id).values_list("status", flat=True).first()
    liveness, reason = _derived_liveness(report, issue_status)
    if liveness:
        # run_finish keeps a liveness already on the row for a succeeded run (as from a heartbeat).
        HeartbeatRun.objects.filter(pk=run.pk).update(liveness=liveness, liveness_reason=reason[:300])
        run.liveness, run.liveness_reason = liveness, reason[:300]
        details["liveness"] = liveness
    activity_record(actor=actor, company_id=run.company_id, action="run.result_reported", entity_type="run",
                    entity_id=run.pk, run=run, details=details)
    return run


def run_report_final(*, actor: Actor, run: HeartbeatRun, report: RunReport) -> HeartbeatRun:
    """A final heartbeat (``POST /api/runs/{id}/heartbeat`` with ``final: true``): record the result
    and end the run — succeeded, or failed when the agent reported failed or aborted. A run with a
    local process (the process adapter) is only recorded: its process exit ends it, so the host
    never kills an agent that is on its way out."""
    from .runs import run_finish

    if actor.is_agent and actor.agent.pk != run.agent_id:
        raise Forbidden("Agents heartbeat their own runs only.", code="run_mismatch")
    actor.ensure_can_write(run.company_id)
    current = HeartbeatRun.objects.filter(pk=run.pk).values_list("status", flat=True).first()
    if current not in LIVE_RUN_STATUSES:
        raise Conflict("The run has ended.", code="run_not_live", details={"status": current})
    run = run_result_record(run=run, report=report, actor=actor)
    if run.adapter_type == AdapterType.PROCESS:
        return run
    status, error = finish_status(run.result_status, RunStatus.SUCCEEDED)
    return run_finish(run=run, status=status, error=error, liveness=run.liveness if run.result_status else "",
                      liveness_reason=run.liveness_reason if run.result_status else "", actor=actor)
