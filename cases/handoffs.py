"""Case handoffs: moving a case's primary task to another agent, optionally adopting, refreshing or
detaching a reusable workflow, or recording a closure intent (``to: "done"``).

Lifecycle (one open handoff per case, a database constraint):

* **accept** — the request is checked and captured: recipient, workflow action, the definition's
  name and prompt text, the phase, and the base revision of the task's ``workflow`` document.
  Idempotency belongs to the authenticated principal: the same key with the same request returns
  the same handoff; with another request it is refused.
* **apply** — once the outgoing execution on the task has settled (no live run holds it), the
  workflow, phase, document revision and assignee change together in one transaction and the
  recipient is woken. If the ``workflow`` document moved past the base revision the handoff is
  **held** instead: nothing is overwritten; recovery cancels it and hands off again after reading.
* a closure intent (``done``) neither assigns nor wakes: the primary task's accepted completion
  closes the case in the same transaction; a Stop of the execution, a task cancellation or a
  reassignment invalidates it.
"""
from __future__ import annotations

import hashlib
import json
import logging

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from issues.actors import SYSTEM, Actor
from issues.choices import (LIVE_RUN_STATUSES, NO_WORK_AGENT_STATUSES, WRITE_ROLES, AgentStatus, IssueStatus, RunStatus,
                            WakeSource)
from issues.exceptions import Conflict, Forbidden, InvalidInput, Unprocessable
from issues.models import Agent, Company, Document, HeartbeatRun, Issue
from issues.services.activity import activity_record
from issues.services.fences import ensure_owning_run
from issues.services.issues import issue_update
from issues.services.lookups import company_object
from issues.services.thread import comment_create, document_write
from issues.services.wakeups import agent_wakeup

from .choices import (
    OPEN_HANDOFF_STATUSES,
    CaseEventKind,
    CaseStatus,
    HandoffStatus,
    HandoffTarget,
    WorkflowAction,
)
from .models import Case, CaseHandoff, WorkflowDefinition
from .services import WORKFLOW_DOCUMENT_KEY, authorize_write, case_create, case_event_record

log = logging.getLogger(__name__)

UNSET = object()  # "workflow omitted" (preserve) is different from "workflow: null" (detach)
CLOSED_CASE_STATUSES = (CaseStatus.DONE, CaseStatus.CANCELLED)


# --- small helpers --------------------------------------------------------------------------
def principal_of(actor: Actor) -> str:
    if actor.is_agent:
        return f"agent:{actor.agent.pk}"
    if actor.is_board:
        return f"user:{actor.user.pk}"
    return "system"


def _request_fingerprint(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def _replayed(actor: Actor, idempotency_key: str, fingerprint: str) -> CaseHandoff | None:
    """The handoff this principal already made under ``idempotency_key``, or None."""
    if not idempotency_key:
        return None
    existing = CaseHandoff.objects.filter(principal=principal_of(actor), idempotency_key=idempotency_key).first()
    if existing is not None and existing.request_fingerprint != fingerprint:
        raise Conflict("This idempotency key was already used for a different handoff.",
                       code="idempotency_key_reused",
                       details={"idempotencyKey": ["Use a new key for a different request."],
                                "handoffId": str(existing.pk)})
    return existing


def _workflow_document(task: Issue) -> Document | None:
    return Document.objects.select_related("latest_revision").filter(issue=task, key=WORKFLOW_DOCUMENT_KEY).first()


def _execution_live(task: Issue) -> bool:
    """True while a run works the task (started, or holding its locks): the transfer waits for it
    to settle. A queued run that has not started yet is not an execution to wait for."""
    holders = [r for r in (task.checkout_run_id, task.execution_run_id) if r]
    return HeartbeatRun.objects.filter(
        Q(issue_id=task.pk, status=RunStatus.RUNNING) | Q(pk__in=holders, status__in=LIVE_RUN_STATUSES)
    ).exists()


class _Replay(Exception):
    """A concurrent request with the same principal and key won: roll ours back, answer with theirs."""

    def __init__(self, handoff):
        self.handoff = handoff


def _recipient(company_id, to) -> Agent:
    agent = company_object(Agent, company_id, to, "to")
    if agent.status in NO_WORK_AGENT_STATUSES:
        what = "terminated" if agent.status == AgentStatus.TERMINATED else "waiting for its hire to be approved"
        raise Unprocessable(f"The recipient agent is {what}.", code="recipient_unavailable",
                            details={"to": [f"This agent is {what}."]})
    return agent


def _workflow_choice(company_id, workflow_id, current_workflow_id):
    """(action, definition) for the request's workflow field."""
    if workflow_id is UNSET:
        return WorkflowAction.PRESERVE, None
    if workflow_id is None:
        return WorkflowAction.DETACH, None
    definition = company_object(WorkflowDefinition, company_id, workflow_id, "workflowId")
    action = WorkflowAction.REFRESH if definition.pk == current_workflow_id else WorkflowAction.ADOPT
    return action, definition


def _record(actor: Actor, handoff: CaseHandoff, kind: str, action: str, extra: dict | None = None, run=None):
    details = handoff_summary(handoff) | (extra or {})
    case_event_record(actor=actor, case=handoff.case, kind=kind, details=details, run=run)
    activity_record(actor=actor, company_id=handoff.company_id, action=action, entity_type="case",
                    entity_id=handoff.case_id, details=details, run=run)


def handoff_summary(handoff: CaseHandoff) -> dict:
    """What history, events and the audit log show of a transition: the captured workflow names
    and phases (``phaseKept``: the case kept its phase), the case and its task, and ``transition``,
    one line naming them for an audit reader."""
    case = handoff.case
    return {
        "handoffId": str(handoff.pk), "target": handoff.target, "kickoff": handoff.kickoff,
        "caseIdentifier": case.identifier, "taskId": str(case.primary_task_id) if case.primary_task_id else None,
        "fromAgentId": str(handoff.from_agent_id) if handoff.from_agent_id else None,
        "toAgentId": str(handoff.to_agent_id) if handoff.to_agent_id else None,
        "workflowAction": handoff.workflow_action, "workflowId": str(handoff.workflow_id) if handoff.workflow_id else None,
        "workflowName": handoff.workflow_name, "previousWorkflowName": handoff.previous_workflow_name,
        "phase": handoff.phase if handoff.set_phase else handoff.previous_phase,
        "previousPhase": handoff.previous_phase, "phaseKept": not handoff.set_phase,
        "transition": transition_text(handoff), "status": handoff.status,
    }


def transition_text(handoff: CaseHandoff) -> str:
    """E.g. 'workflow "Intake" -> "Review"; phase "intake" -> "review"' or 'workflow "Review" kept;
    phase "review" kept'. A closure intent changes neither."""
    if handoff.target == HandoffTarget.DONE:
        return "closure intent: workflow and phase kept"
    new, old = f'"{handoff.workflow_name}"', f'"{handoff.previous_workflow_name}"'
    action = handoff.workflow_action
    if handoff.kickoff:
        workflow = f"workflow {new} adopted" if action == WorkflowAction.ADOPT else "inline workflow"
    elif action == WorkflowAction.ADOPT:
        workflow = f"workflow {old} -> {new}" if handoff.previous_workflow_name else f"workflow {new} adopted"
    elif action == WorkflowAction.REFRESH:
        workflow = f"workflow {new} refreshed"
    elif action == WorkflowAction.DETACH:
        workflow = f"workflow {old} detached" if handoff.previous_workflow_name else "no workflow to detach"
    else:
        workflow = f"workflow {new} kept" if handoff.workflow_name else "no workflow (kept)"
    if not handoff.set_phase:
        phase = f'phase "{handoff.previous_phase}" kept' if handoff.previous_phase else "no phase (kept)"
    elif handoff.kickoff or handoff.previous_phase == handoff.phase:
        phase = f'phase "{handoff.phase}"' if handoff.phase else "no phase"
    else:
        phase = f'phase "{handoff.previous_phase}" -> "{handoff.phase}"'
    return f"{workflow}; {phase}"


def _lock(handoff_pk):
    handoff = CaseHandoff.objects.select_for_update().get(pk=handoff_pk)
    case = Case.objects.select_for_update(of=("self",)).select_related("current_workflow").get(pk=handoff.case_id)
    handoff.case = case
    task = Issue.objects.select_for_update().get(pk=case.primary_task_id) if case.primary_task_id else None
    return handoff, case, task


def _create(*, actor, case, task, run, target, to_agent, action, definition, phase, set_phase, note, key,
            fingerprint, kickoff=False) -> CaseHandoff:
    document = _workflow_document(task)
    # A kickoff has no "before": the case did not exist.
    current_name = case.current_workflow.name if case.current_workflow and not kickoff else ""
    try:
        with transaction.atomic():
            handoff = CaseHandoff.objects.create(
                company_id=case.company_id, case=case, kickoff=kickoff, target=target,
                from_agent=actor.agent if actor.is_agent else None, to_agent=to_agent,
                workflow_action=action, workflow=definition,
                workflow_name=definition.name if definition else ("" if action == WorkflowAction.DETACH else current_name),
                prompt_text=definition.prompt if definition else "",
                phase=phase or "", set_phase=set_phase, previous_workflow_name=current_name,
                previous_phase="" if kickoff else case.phase, base_revision=document.latest_revision if document else None,
                status=HandoffStatus.ACCEPTED, principal=principal_of(actor), idempotency_key=key,
                request_fingerprint=fingerprint, source_run=run, note=note or "", accepted_at=timezone.now(),
            )
    except IntegrityError:
        replay = _replayed(actor, key, fingerprint)
        if replay is not None:
            raise _Replay(replay)
        raise _open_conflict(case)
    handoff.case = case
    _record(actor, handoff, CaseEventKind.HANDOFF, "case.handoff_accepted", run=run)
    return handoff


def _open_conflict(case: Case) -> Conflict:
    open_ = CaseHandoff.objects.filter(case=case, status__in=OPEN_HANDOFF_STATUSES).first()
    return Conflict("This case already has an open handoff; cancel it or wait for it to apply.",
                    code="handoff_open", details={"handoffId": str(open_.pk) if open_ else None,
                                                  "status": open_.status if open_ else None})


# --- accept ---------------------------------------------------------------------------------
def handoff_request(*, actor: Actor, company: Company, case: Case, to, workflow_id=UNSET, phase=UNSET,
                    note: str = "", idempotency_key: str = "") -> tuple[CaseHandoff, bool]:
    """Hand an existing case on (``to`` an agent id or ``"done"``). Returns ``(handoff, created)``."""
    fingerprint = _request_fingerprint({
        "companyId": str(company.pk), "caseId": str(case.pk), "to": str(to),
        "workflowId": "<omitted>" if workflow_id is UNSET else workflow_id,
        "phase": "<omitted>" if phase is UNSET else phase, "note": note})
    replay = _replayed(actor, idempotency_key, fingerprint)
    if replay is not None:
        return replay, False
    run = authorize_write(actor, company.pk)
    target = HandoffTarget.DONE if to == "done" else HandoffTarget.AGENT
    if target == HandoffTarget.DONE and (workflow_id is not UNSET or phase is not UNSET):
        raise InvalidInput("A closure intent changes neither workflow nor phase.",
                           details={"to": ["'done' cannot be combined with workflowId or phase."]})
    try:
        return _request(actor, company, case, run, target, to, workflow_id, phase, note, idempotency_key,
                        fingerprint), True
    except _Replay as replay:
        return replay.handoff, False


def _request(actor, company, case, run, target, to, workflow_id, phase, note, idempotency_key, fingerprint):
    with transaction.atomic():
        case = Case.objects.select_for_update(of=("self",)).select_related("current_workflow").get(pk=case.pk)
        replay = _replayed(actor, idempotency_key, fingerprint)  # re-checked under the case lock
        if replay is not None:
            raise _Replay(replay)
        if case.status in CLOSED_CASE_STATUSES:
            raise Unprocessable("The case is closed.", code="case_closed", details={"status": case.status})
        if case.primary_task_id is None:
            raise Unprocessable("The case has no primary task to hand off.", code="no_primary_task")
        task = Issue.objects.select_for_update().get(pk=case.primary_task_id)
        if actor.is_agent:
            ensure_owning_run(actor, task)  # the lock first (409), as for issue writes
            if task.assignee_agent_id != actor.agent.pk:
                raise Forbidden("Agents hand off only their own work: the primary task is not assigned to you.",
                                code="not_your_work", details={"assigneeAgentId": str(task.assignee_agent_id or "")})
        if task.status == IssueStatus.CANCELLED:
            raise Unprocessable("The primary task is cancelled.", code="task_cancelled")
        if CaseHandoff.objects.filter(case=case, status__in=OPEN_HANDOFF_STATUSES).exists():
            raise _open_conflict(case)
        to_agent = _recipient(company.pk, to) if target == HandoffTarget.AGENT else None
        action, definition = _workflow_choice(company.pk, workflow_id, case.current_workflow_id)
        handoff = _create(actor=actor, case=case, task=task, run=run, target=target, to_agent=to_agent,
                          action=action, definition=definition, phase=None if phase is UNSET else phase,
                          set_phase=phase is not UNSET, note=note, key=idempotency_key, fingerprint=fingerprint)
        if note and target == HandoffTarget.AGENT:
            comment_create(actor=actor, issue=task, body=note, _locked=True)
        if target == HandoffTarget.AGENT and not _execution_live(task):
            handoff = _apply(handoff.pk)
    return handoff


def handoff_kickoff(*, actor: Actor, company: Company, to, case_type: str, title: str, kickoff: str,
                    workflow_id=None, workflow_document_text: str | None = None, summary: str = "",
                    fields: dict | None = None, parent_id=None, project_id=None, phase: str = "",
                    note: str = "", initial_documents=(), idempotency_key: str = "",
                    case_idempotency_key: str = "", primary_task_id=None) -> tuple[CaseHandoff, bool]:
    """Create a case (with its primary task and ``workflow`` document from a definition or inline
    text) and hand it to its first agent, in one transaction. ``primary_task_id`` binds an
    existing issue as the primary task instead of creating one (``case_create`` checks it); later
    handoffs reuse that task, and a replay of the principal's key returns the same handoff."""
    errors = {}
    if to == "done":
        errors["to"] = ["A kickoff hands the new case to an agent."]
    if (workflow_id is None) == (workflow_document_text is None):
        errors["workflowId"] = ["Give exactly one of workflowId or workflowDocumentText."]
    if errors:
        raise InvalidInput(details=errors)
    fingerprint = _request_fingerprint({
        "companyId": str(company.pk), "to": str(to), "type": case_type, "title": title, "kickoff": kickoff,
        "workflowId": workflow_id, "workflowDocumentText": workflow_document_text, "summary": summary,
        "fields": fields, "parentId": parent_id, "projectId": project_id, "phase": phase, "note": note,
        "initialDocuments": list(initial_documents), "caseIdempotencyKey": case_idempotency_key,
        "primaryTaskId": str(primary_task_id) if primary_task_id else None})
    replay = _replayed(actor, idempotency_key, fingerprint)
    if replay is not None:
        return replay, False
    try:
        return _kickoff(actor, company, to, case_type, title, kickoff, workflow_id, workflow_document_text, summary,
                        fields, parent_id, project_id, phase, note, initial_documents, idempotency_key,
                        case_idempotency_key, fingerprint, primary_task_id), True
    except _Replay as replay:
        return replay.handoff, False


def _kickoff(actor, company, to, case_type, title, kickoff, workflow_id, workflow_document_text, summary, fields,
             parent_id, project_id, phase, note, initial_documents, idempotency_key, case_idempotency_key,
             fingerprint, primary_task_id):
    with transaction.atomic():
        if idempotency_key:
            # Replays of one kickoff serialize on the company row, then find the winner's handoff.
            Company.objects.select_for_update().get(pk=company.pk)
            replay = _replayed(actor, idempotency_key, fingerprint)
            if replay is not None:
                raise _Replay(replay)
        definition = company_object(WorkflowDefinition, company.pk, workflow_id, "workflowId")
        to_agent = _recipient(company.pk, to)
        case, created = case_create(
            actor=actor, company=company, case_type=case_type, title=title, kickoff=kickoff,
            workflow_document_text=definition.prompt if definition else workflow_document_text,
            summary=summary, fields=fields, parent_id=parent_id, project_id=project_id,
            workflow_definition_id=definition.pk if definition else None, phase=phase,
            idempotency_key=case_idempotency_key, initial_documents=initial_documents,
            primary_task_id=primary_task_id)
        if not created:
            raise Conflict("A case with this idempotency key already exists; hand it off instead.",
                           code="case_exists", details={"caseId": str(case.pk)})
        case = Case.objects.select_for_update(of=("self",)).select_related("current_workflow").get(pk=case.pk)
        task = Issue.objects.select_for_update().get(pk=case.primary_task_id)
        handoff = _create(actor=actor, case=case, task=task, run=actor.run if actor.is_agent else None,
                          target=HandoffTarget.AGENT, to_agent=to_agent,
                          action=WorkflowAction.ADOPT if definition else WorkflowAction.PRESERVE,
                          definition=definition, phase=phase, set_phase=True, note=note, key=idempotency_key,
                          fingerprint=fingerprint, kickoff=True)
        if note:
            comment_create(actor=actor, issue=task, body=note, _locked=True)
        return _apply(handoff.pk)


# --- apply ----------------------------------------------------------------------------------
def _authority_lost(handoff: CaseHandoff, task: Issue) -> str:
    """Re-check, at transfer time, that the requester may still move this work (server-derived
    provenance; a missing provenance fails closed)."""
    kind, _, ident = handoff.principal.partition(":")
    if kind == "agent":
        if handoff.kickoff:
            return ""
        agent = Agent.objects.filter(pk=ident, company_id=handoff.company_id).first()
        if agent is None or agent.status == AgentStatus.TERMINATED:
            return "requester_unavailable"
        if task.assignee_agent_id != agent.pk:
            return "task_reassigned"
        return ""
    if kind == "user":
        from django.contrib.auth import get_user_model

        user = get_user_model().objects.filter(pk=ident).first()
        if user is None:
            return "requester_unavailable"
        # The same role rule as every board write (superusers own every company).
        role = Actor(user=user).roles.get(handoff.company_id)
        return "" if role in WRITE_ROLES else "requester_not_authorized"
    return "" if kind == "system" else "provenance_missing"


def _fail(handoff: CaseHandoff, reason: str, detail: dict | None = None) -> CaseHandoff:
    handoff.status = HandoffStatus.FAILED
    handoff.recovery_detail = {"reason": reason, **(detail or {})}
    handoff.save(update_fields=["status", "recovery_detail", "updated_at"])
    _record(SYSTEM, handoff, CaseEventKind.HANDOFF_CANCELLED, "case.handoff_failed", {"reason": reason})
    return handoff


def _apply(handoff_pk) -> CaseHandoff:
    """Transfer now if the outgoing execution has settled; otherwise leave it accepted."""
    with transaction.atomic():
        handoff, case, task = _lock(handoff_pk)
        if handoff.status != HandoffStatus.ACCEPTED or handoff.target != HandoffTarget.AGENT:
            return handoff
        if task is None or task.status == IssueStatus.CANCELLED:
            return _fail(handoff, "task_unavailable")
        if _execution_live(task):
            return handoff
        reason = _authority_lost(handoff, task)
        if reason:
            return _fail(handoff, reason)
        recipient = Agent.objects.filter(pk=handoff.to_agent_id).first()
        if recipient is None or recipient.status in NO_WORK_AGENT_STATUSES:
            return _fail(handoff, "recipient_unavailable")
        document = _workflow_document(task)
        current = document.latest_revision if document else None
        writes = handoff.workflow_action in (WorkflowAction.ADOPT, WorkflowAction.REFRESH)
        if writes and (current.pk if current else None) != handoff.base_revision_id:
            handoff.status = HandoffStatus.HELD
            handoff.recovery_detail = {
                "reason": "workflow_document_changed",
                "baseRevisionId": str(handoff.base_revision_id) if handoff.base_revision_id else None,
                "currentRevisionId": str(current.pk) if current else None,
                "currentRevisionNumber": current.number if current else 0,
                "recovery": "Cancel this handoff, read the current workflow document, then hand off again.",
            }
            handoff.save(update_fields=["status", "recovery_detail", "updated_at"])
            _record(SYSTEM, handoff, CaseEventKind.HANDOFF_HELD, "case.handoff_held",
                    {"reason": "workflow_document_changed"})
            return handoff
        applied = current
        if writes and (current is None or current.body != handoff.prompt_text):
            applied = document_write(actor=SYSTEM, issue=task, key=WORKFLOW_DOCUMENT_KEY, body=handoff.prompt_text,
                                     title="Workflow", base_revision_id=current.pk if current else None)
        if writes:
            case.current_workflow_id = handoff.workflow_id
        elif handoff.workflow_action == WorkflowAction.DETACH:
            case.current_workflow_id = None
        if handoff.set_phase:
            case.phase = handoff.phase
        previous_status = case.status
        if case.status == CaseStatus.DRAFT:
            case.status = CaseStatus.IN_PROGRESS
        case.save()
        if previous_status != case.status:
            case_event_record(actor=SYSTEM, case=case, kind=CaseEventKind.STATUS_CHANGED,
                              details={"from": previous_status, "to": case.status, "handoffId": str(handoff.pk)})
        changes = {}
        if task.assignee_agent_id != recipient.pk:
            changes["assignee_agent_id"] = recipient.pk
        if task.status not in (IssueStatus.TODO, IssueStatus.BLOCKED):
            changes["status"] = IssueStatus.TODO
        if changes:
            issue_update(actor=SYSTEM, issue=task, changes=changes)
        task.refresh_from_db()
        wake = agent_wakeup(actor=SYSTEM, agent=recipient, source=WakeSource.ASSIGNMENT, reason="case_handoff",
                            issue=task, idempotency_key=f"case-handoff:{handoff.pk}",
                            context={"caseId": str(case.pk), "handoffId": str(handoff.pk)})
        handoff.status, handoff.applied_at = HandoffStatus.APPLIED, timezone.now()
        handoff.applied_revision, handoff.wakeup = applied, wake
        handoff.save(update_fields=["status", "applied_at", "applied_revision", "wakeup", "updated_at"])
        _record(SYSTEM, handoff, CaseEventKind.HANDOFF_APPLIED, "case.handoff_applied",
                {"appliedRevisionId": str(applied.pk) if applied else None, "wakeupId": str(wake.pk)})
    return handoff


def handoff_apply_settled(*, task_ids=None, limit: int = 200) -> int:
    """Apply accepted transfers whose task has no live execution (after a run ends, and from the
    periodic sweep so a crash between run end and transfer is recovered). Returns how many applied."""
    qs = CaseHandoff.objects.filter(status=HandoffStatus.ACCEPTED, target=HandoffTarget.AGENT)
    if task_ids is not None:
        qs = qs.filter(case__primary_task_id__in=task_ids)
    applied = 0
    for pk in qs.order_by("accepted_at").values_list("pk", flat=True)[:limit]:
        try:
            if _apply(pk).status == HandoffStatus.APPLIED:
                applied += 1
        except Exception:  # one broken handoff must not stop the others; the sweep retries
            log.exception("case handoff %s could not be applied", pk)
    return applied


# --- retry / cancel -------------------------------------------------------------------------
def _authorize_intervention(actor: Actor, handoff: CaseHandoff, task: Issue | None):
    """Board writers, the requesting agent, or the agent that currently owns the task; an agent
    needs the run that holds the task's checkout while the task is in progress (409 first)."""
    actor.ensure_can_write(handoff.company_id)
    if not actor.is_agent:
        return None
    run = actor.require_live_run()
    if task is not None:
        ensure_owning_run(actor, task)  # ``task`` is locked by ``_lock``
    owns_task = task is not None and task.assignee_agent_id == actor.agent.pk
    if handoff.principal != principal_of(actor) and not owns_task:
        raise Forbidden("Only the requesting agent or the task's current owner may change this handoff.",
                        code="not_your_work")
    return run


def handoff_cancel(*, actor: Actor, handoff: CaseHandoff, reason: str = "") -> CaseHandoff:
    """Cancel an open handoff. Works whether or not cases are enabled for the company."""
    with transaction.atomic():
        handoff, case, task = _lock(handoff.pk)
        run = _authorize_intervention(actor, handoff, task)
        if handoff.status not in OPEN_HANDOFF_STATUSES:
            if handoff.status == HandoffStatus.CANCELLED:
                return handoff
            raise Conflict(f"A {handoff.status} handoff cannot be cancelled.", code="handoff_not_open",
                           details={"status": handoff.status})
        handoff.status, handoff.cancelled_at = HandoffStatus.CANCELLED, timezone.now()
        handoff.recovery_detail = {**handoff.recovery_detail, "cancelledBy": principal_of(actor),
                                   "cancelReason": reason or "cancelled"}
        handoff.save(update_fields=["status", "cancelled_at", "recovery_detail", "updated_at"])
        _record(actor, handoff, CaseEventKind.HANDOFF_CANCELLED, "case.handoff_cancelled",
                {"reason": reason or "cancelled"}, run=run)
    return handoff


def handoff_retry(*, actor: Actor, handoff: CaseHandoff) -> CaseHandoff:
    """Try a held or failed handoff again with its captured base: it applies if the document is
    back at the base revision and the execution settled, and stays held otherwise."""
    with transaction.atomic():
        handoff, case, task = _lock(handoff.pk)
        _authorize_intervention(actor, handoff, task)
        if handoff.status not in (HandoffStatus.HELD, HandoffStatus.FAILED, HandoffStatus.ACCEPTED):
            raise Conflict(f"A {handoff.status} handoff cannot be retried.", code="handoff_not_retryable",
                           details={"status": handoff.status})
        if handoff.target != HandoffTarget.AGENT:
            return handoff
        if handoff.status == HandoffStatus.FAILED and CaseHandoff.objects.filter(
                case=case, status__in=OPEN_HANDOFF_STATUSES).exists():
            raise _open_conflict(case)
        handoff.status = HandoffStatus.ACCEPTED
        handoff.recovery_detail = {**handoff.recovery_detail, "retriedBy": principal_of(actor)}
        handoff.save(update_fields=["status", "recovery_detail", "updated_at"])
        return _apply(handoff.pk)


# --- reactions to the primary task ----------------------------------------------------------
def _open_closure_intent(task: Issue) -> CaseHandoff | None:
    return CaseHandoff.objects.select_for_update().filter(
        case__primary_task=task, target=HandoffTarget.DONE, status=HandoffStatus.ACCEPTED).first()


def _invalidate(handoff: CaseHandoff, reason: str):
    handoff.status, handoff.cancelled_at = HandoffStatus.CANCELLED, timezone.now()
    handoff.recovery_detail = {**handoff.recovery_detail, "cancelReason": reason, "invalidated": True}
    handoff.save(update_fields=["status", "cancelled_at", "recovery_detail", "updated_at"])
    _record(SYSTEM, handoff, CaseEventKind.HANDOFF_CANCELLED, "case.handoff_cancelled", {"reason": reason})


def on_primary_task_changed(*, issue: Issue, actor: Actor, changes: dict):
    """Inside the task change's transaction: completion closes the case (closure intent), a
    cancellation or reassignment invalidates the intent."""
    if not ({"status", "assignee_agent"} & set(changes)):
        return
    intent = _open_closure_intent(issue)
    if intent is None:
        return
    new_status = changes.get("status", [None, None])[1]
    if new_status == IssueStatus.DONE:
        case = Case.objects.select_for_update().get(pk=intent.case_id)
        intent.case = case
        previous = case.status
        case.status = CaseStatus.DONE
        case.save(update_fields=["status", "updated_at"])
        intent.status, intent.applied_at = HandoffStatus.APPLIED, timezone.now()
        intent.save(update_fields=["status", "applied_at", "updated_at"])
        case_event_record(actor=actor, case=case, kind=CaseEventKind.STATUS_CHANGED,
                          details={"from": previous, "to": CaseStatus.DONE, "handoffId": str(intent.pk)})
        _record(actor, intent, CaseEventKind.CLOSED, "case.closed", {"taskId": str(issue.pk)})
    elif new_status == IssueStatus.CANCELLED:
        intent.case = Case.objects.get(pk=intent.case_id)
        _invalidate(intent, "task_cancelled")
    elif "assignee_agent" in changes:
        intent.case = Case.objects.get(pk=intent.case_id)
        _invalidate(intent, "task_reassigned")


def on_run_finished(run: HeartbeatRun):
    """After a run ends: a stopped run invalidates the handoffs it made and the closure intent of
    the task it executed; then transfers waiting for that task to settle are applied."""
    if run.stop_requested_at is not None:  # the row run_finish locked and saved: current
        with transaction.atomic():
            stale = list(CaseHandoff.objects.select_for_update().select_related("case").filter(
                Q(source_run=run) | Q(case__primary_task_id=run.issue_id, target=HandoffTarget.DONE),
                status__in=OPEN_HANDOFF_STATUSES, created_at__lte=run.stop_requested_at))
            for handoff in stale:
                _invalidate(handoff, "execution_stopped")
    task_ids = [run.issue_id] if run.issue_id else []
    task_ids += list(CaseHandoff.objects.filter(source_run=run, status=HandoffStatus.ACCEPTED)
                     .values_list("case__primary_task_id", flat=True))
    if task_ids:
        handoff_apply_settled(task_ids=task_ids)
