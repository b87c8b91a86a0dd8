"""Every write of the cases app. Case routes are behind the company flag ``enable_cases``."""
from __future__ import annotations

import hashlib

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Max

from issues.actors import Actor
from issues.choices import DocumentFormat, IssueStatus, OriginKind
from issues.exceptions import Conflict, InvalidInput, Unprocessable
from issues.models import Company, Document, Issue, Project
from issues.services.activity import activity_record
from issues.services.fences import ensure_may_change, ensure_owning_run
from issues.services.issues import issue_create
from issues.services.lookups import company_object
from issues.services.thread import DOCUMENT_KEY, comment_create, document_write

from .choices import CaseEventKind, CaseLinkRole, CaseStatus
from .models import Case, CaseEvent, CaseIssueLink, WorkflowDefinition

WORKFLOW_DOCUMENT_KEY = "workflow"
# Facts only: status, phase, routing and permissions move through handoffs and task completion.
CASE_UPDATE_FIELDS = ("title", "summary", "fields")


def prompt_fingerprint(prompt: str) -> str:
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()


def authorize_write(actor: Actor, company_id):
    """Board writers, or an agent with a live run; returns the run (None for board users)."""
    actor.ensure_can_write(company_id)
    return actor.require_live_run() if actor.is_agent else None


def ensure_primary_task_run(actor: Actor, case: Case):
    """The issue-write fence for case writes: while the case's primary task is in progress, an agent
    writes the case only from the run that holds the task's checkout (409 ``not_checkout_owner``
    with the task's lock details). Call inside the transaction, after locking the case: it locks
    the task row so a checkout cannot slip in between the check and the write."""
    if not actor.is_agent or case.primary_task_id is None:
        return
    ensure_owning_run(actor, Issue.objects.select_for_update().get(pk=case.primary_task_id))


def case_event_record(*, actor: Actor, case: Case, kind: str, details: dict | None = None, run=None) -> CaseEvent:
    fields = actor.activity_fields()
    return CaseEvent.objects.create(
        company_id=case.company_id, case=case, kind=kind, details=details or {},
        actor_type=fields["actor_type"], actor_agent=fields["actor_agent"], actor_user=fields["actor_user"],
        run=run if run is not None else fields["run"],
    )


def case_create(
    *,
    actor: Actor,
    company: Company,
    case_type: str,
    title: str,
    kickoff: str,
    workflow_document_text: str | None = None,
    summary: str = "",
    status: str = CaseStatus.DRAFT,
    fields: dict | None = None,
    parent_id=None,
    project_id=None,
    workflow_definition_id=None,
    phase: str = "",
    idempotency_key: str = "",
    initial_documents=(),
    primary_task_id=None,
) -> tuple[Case, bool]:
    """Create a case with its primary task, or return the case already created under the same
    (company, type, idempotency key). Returns ``(case, created)``.

    The primary task's description is the kickoff; the workflow text is saved verbatim as the
    task's document ``workflow``; ``initial_documents`` (``{key, body, title?, format?}``) are
    written as ordinary task documents before anything is dispatched. Missing kickoff or workflow
    text, a bad seed document or an over-budget seed is rejected before any write.

    A ``workflow_definition_id`` is adopted: its prompt becomes the ``workflow`` document and its
    name and fingerprint are captured in the ``created`` event (as a kickoff handoff captures
    them). Inline text that differs from that prompt is refused (400
    ``workflow_text_mismatch``), so a case is never labelled with one procedure while holding
    another.

    ``primary_task_id`` binds an existing issue of the company instead of creating one (see
    :func:`_bindable_task`): its title and description stay, the kickoff is posted on it as a
    comment, and the ``workflow`` document is created on it (create-only: a task that already
    has one is a 409)."""
    errors = {}
    if not (kickoff or "").strip():
        errors["kickoff"] = ["This field may not be blank."]
    if workflow_definition_id is None and not (workflow_document_text or "").strip():
        errors["workflowDocumentText"] = ["This field may not be blank."]
    if not (case_type or "").strip():
        errors["type"] = ["This field may not be blank."]
    if errors:
        raise InvalidInput(details=errors)
    workflow = company_object(WorkflowDefinition, company.pk, workflow_definition_id, "workflowDefinitionId")
    workflow_document_text = adopted_workflow_text(workflow, workflow_document_text)
    errors = _seed_errors(workflow_document_text, initial_documents)
    if errors:
        raise InvalidInput(details=errors)
    run = authorize_write(actor, company.pk)
    with transaction.atomic():
        parent = company_object(Case, company.pk, parent_id, "parentCaseId")
        project = company_object(Project, company.pk, project_id, "projectId")
        # The company row serializes numbering and the idempotent upsert.
        Company.objects.select_for_update().get(pk=company.pk)
        if idempotency_key:
            existing = Case.objects.filter(company=company, case_type=case_type,
                                           idempotency_key=idempotency_key).first()
            if existing is not None:
                return existing, False
        bound = _bindable_task(actor, company, primary_task_id) if primary_task_id is not None else None
        if bound is not None and project is None:
            project = bound.project
        number = (Case.objects.filter(company=company).aggregate(n=Max("number"))["n"] or 0) + 1
        try:
            with transaction.atomic():
                case = Case.objects.create(
                    company=company, number=number, identifier=f"{company.issue_prefix}-C{number}",
                    case_type=case_type, idempotency_key=idempotency_key or "", title=title, summary=summary,
                    status=status, fields=fields or {}, parent=parent, project=project, current_workflow=workflow,
                    phase=phase, created_by_agent=actor.agent, created_by_user=actor.user if actor.is_board else None,
                )
        except IntegrityError:
            existing = Case.objects.filter(company=company, case_type=case_type,
                                           idempotency_key=idempotency_key).first() if idempotency_key else None
            if existing is not None:
                return existing, False
            raise Conflict("The case was created concurrently; retry.", code="case_conflict")
        if bound is None:
            task, _ = issue_create(actor=actor, company=company, title=title, description=kickoff,
                                   project_id=project.pk if project else None, origin_kind=OriginKind.CASE,
                                   origin_id=str(case.pk))
        else:
            task = bound
            comment_create(actor=actor, issue=task, body=kickoff, _locked=True)
        revision = document_write(actor=actor, issue=task, key=WORKFLOW_DOCUMENT_KEY, body=workflow_document_text,
                                  title="Workflow", format=DocumentFormat.MARKDOWN)
        for seed in initial_documents:
            document_write(actor=actor, issue=task, key=seed["key"], body=seed["body"],
                           title=seed.get("title") or "", format=seed.get("format") or DocumentFormat.MARKDOWN)
        case.primary_task = task
        try:
            with transaction.atomic():
                case.save(update_fields=["primary_task", "updated_at"])
        except IntegrityError:  # another case bound the task concurrently (one primary case per task)
            raise _already_primary(task)
        CaseIssueLink.objects.create(company=company, case=case, issue=task, role=CaseLinkRole.ORIGIN)
        captured = {
            "workflowDefinitionId": str(workflow.pk) if workflow else None,
            "workflowName": workflow.name if workflow else "",
            "workflowFingerprint": prompt_fingerprint(workflow_document_text),
        }
        case_event_record(actor=actor, case=case, kind=CaseEventKind.CREATED, run=run, details={
            "identifier": case.identifier, "type": case_type, "status": status,
            "primaryTaskId": str(task.pk), "boundExistingTask": bound is not None,
            "workflowRevisionId": str(revision.pk), **captured,
        })
        case_event_record(actor=actor, case=case, kind=CaseEventKind.ISSUE_LINKED, run=run,
                          details={"issueId": str(task.pk), "role": CaseLinkRole.ORIGIN})
        activity_record(actor=actor, company_id=company.pk, action="case.created", entity_type="case",
                        entity_id=case.pk, details={"identifier": case.identifier, "primaryTaskId": str(task.pk),
                                                    "boundExistingTask": bound is not None, **captured},
                        run=run)
    return case, True


def adopted_workflow_text(definition: WorkflowDefinition | None, text: str | None) -> str:
    """The ``workflow`` document body of a new case: the definition's prompt when one is named
    (inline text may repeat it verbatim, never contradict it), else the inline text."""
    if definition is None:
        return text
    if text and text != definition.prompt:
        raise InvalidInput(
            "workflowDocumentText differs from the prompt of workflowDefinitionId; omit it to adopt the "
            "definition's prompt.", code="workflow_text_mismatch",
            details={"workflowDocumentText": ["Differs from the prompt of the named workflow definition."],
                     "workflowDefinitionId": str(definition.pk), "workflowFingerprint": definition.fingerprint})
    return definition.prompt


def _already_primary(task: Issue, case_id=None) -> Conflict:
    case_id = case_id or Case.objects.filter(primary_task_id=task.pk).values_list("pk", flat=True).first()
    return Conflict("This issue is already the primary task of another case.", code="task_already_primary",
                    details={"primaryTaskId": ["Already the primary task of another case."],
                             "caseId": str(case_id) if case_id else None})


def _bindable_task(actor: Actor, company: Company, issue_id) -> Issue:
    """An existing issue a new case may take as its primary task, locked: of the company (else
    404), changeable by the actor under the ordinary task fences (an agent's checkout run and
    ownership), not cancelled, not the primary task of another case, and without a ``workflow``
    document yet (the case's is created, never overwritten)."""
    task = company_object(Issue, company.pk, issue_id, "primaryTaskId")
    task = Issue.objects.select_for_update().get(pk=task.pk)
    ensure_may_change(actor, task)
    if task.status == IssueStatus.CANCELLED:
        raise Unprocessable("A cancelled issue cannot become a case's primary task.", code="task_cancelled",
                            details={"primaryTaskId": ["This issue is cancelled."]})
    other = Case.objects.filter(primary_task_id=task.pk).values_list("pk", flat=True).first()
    if other is not None:
        raise _already_primary(task, other)
    existing = Document.objects.filter(issue=task, key=WORKFLOW_DOCUMENT_KEY).first()
    if existing is not None:
        raise Conflict("This issue already has a 'workflow' document; a bound case creates its own.",
                       code="workflow_document_exists",
                       details={"primaryTaskId": ["The issue already has a 'workflow' document."],
                                "currentRevisionId": str(existing.latest_revision_id or "") or None})
    return task


def _seed_errors(workflow_document_text, initial_documents) -> dict:
    """Seed documents share one byte budget with the workflow text and can never replace it."""
    errors, seen = {}, set()
    budget = settings.PAPERCLIP["CASE_SEED_BUDGET_BYTES"]
    used = len((workflow_document_text or "").encode("utf-8"))
    for i, seed in enumerate(initial_documents or ()):
        key = seed.get("key") or ""
        if key == WORKFLOW_DOCUMENT_KEY:
            errors[f"initialDocuments[{i}].key"] = ["The workflow document comes from workflowDocumentText."]
        elif not DOCUMENT_KEY.match(key):
            errors[f"initialDocuments[{i}].key"] = ["Use 1-64 characters: lowercase letters, digits, '-' and '_'."]
        elif key in seen:
            errors[f"initialDocuments[{i}].key"] = [f"'{key}' appears twice."]
        seen.add(key)
        if seed.get("format") and seed["format"] not in DocumentFormat.values:
            errors[f"initialDocuments[{i}].format"] = [f"Use one of {', '.join(DocumentFormat.values)}."]
        used += len((seed.get("body") or "").encode("utf-8"))
    if used > budget:
        errors["initialDocuments"] = [f"Workflow text and seed documents exceed {budget} bytes together."]
    return errors


def case_update(*, actor: Actor, case: Case, changes: dict) -> Case:
    """Change the facts: title, summary, fields (whole object). Agents need the primary task's
    checkout run while the task is in progress."""
    unknown = set(changes) - set(CASE_UPDATE_FIELDS)
    if unknown:
        raise InvalidInput(details={name: ["This field cannot be changed here."] for name in sorted(unknown)})
    run = authorize_write(actor, case.company_id)
    with transaction.atomic():
        case = Case.objects.select_for_update().get(pk=case.pk)
        ensure_primary_task_run(actor, case)
        diff = {}
        for name, value in changes.items():
            old = getattr(case, name)
            if old != value:
                diff[name] = [old, value]
                setattr(case, name, value)
        if not diff:
            return case
        case.save()
        if "status" in diff:
            case_event_record(actor=actor, case=case, kind=CaseEventKind.STATUS_CHANGED, run=run,
                              details={"from": diff["status"][0], "to": diff["status"][1]})
        case_event_record(actor=actor, case=case, kind=CaseEventKind.UPDATED, run=run,
                          details={"changes": sorted(diff)})
        activity_record(actor=actor, company_id=case.company_id, action="case.updated", entity_type="case",
                        entity_id=case.pk, details={"changes": sorted(diff)}, run=run)
    return case


def _name_taken(company_id, name, exclude_pk=None) -> bool:
    qs = WorkflowDefinition.objects.filter(company_id=company_id, name__iexact=name)
    if exclude_pk is not None:
        qs = qs.exclude(pk=exclude_pk)
    return qs.exists()


def _name_conflict(name):
    return Conflict("A workflow definition with this name already exists.", code="workflow_name_taken",
                    details={"name": [f"'{name}' is already used in this company."]})


def workflow_definition_create(*, actor: Actor, company: Company, name: str, prompt: str,
                               description: str = "") -> WorkflowDefinition:
    name = (name or "").strip()
    if not name:
        raise InvalidInput(details={"name": ["This field may not be blank."]})
    run = authorize_write(actor, company.pk)
    try:
        with transaction.atomic():
            if _name_taken(company.pk, name):
                raise _name_conflict(name)
            definition = WorkflowDefinition.objects.create(company=company, name=name, description=description,
                                                           prompt=prompt, fingerprint=prompt_fingerprint(prompt))
            activity_record(actor=actor, company_id=company.pk, action="workflow_definition.created",
                            entity_type="workflow_definition", entity_id=definition.pk,
                            details={"name": name, "fingerprint": definition.fingerprint}, run=run)
    except IntegrityError:
        raise _name_conflict(name)
    return definition


def workflow_definition_update(*, actor: Actor, definition: WorkflowDefinition, changes: dict) -> WorkflowDefinition:
    """Change name, description or prompt; a prompt change moves the fingerprint. Cases keep their
    own copies in their task documents: shared edits affect future adoptions only."""
    unknown = set(changes) - {"name", "description", "prompt"}
    if unknown:
        raise InvalidInput(details={name: ["This field cannot be changed here."] for name in sorted(unknown)})
    if "name" in changes:
        changes = {**changes, "name": (changes["name"] or "").strip()}
        if not changes["name"]:
            raise InvalidInput(details={"name": ["This field may not be blank."]})
    run = authorize_write(actor, definition.company_id)
    try:
        with transaction.atomic():
            definition = WorkflowDefinition.objects.select_for_update().get(pk=definition.pk)
            if "name" in changes and _name_taken(definition.company_id, changes["name"], exclude_pk=definition.pk):
                raise _name_conflict(changes["name"])
            diff = sorted(k for k, v in changes.items() if getattr(definition, k) != v)
            if not diff:
                return definition
            for name, value in changes.items():
                setattr(definition, name, value)
            definition.fingerprint = prompt_fingerprint(definition.prompt)
            definition.save()
            activity_record(actor=actor, company_id=definition.company_id, action="workflow_definition.updated",
                            entity_type="workflow_definition", entity_id=definition.pk,
                            details={"changes": diff, "fingerprint": definition.fingerprint}, run=run)
    except IntegrityError:
        raise _name_conflict(changes.get("name", definition.name))
    return definition
