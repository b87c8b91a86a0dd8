"""PRP runtime requests (permission and question requests) as issue interactions.

``runtime_request.created`` (payload ``{"request": <paperclip.runtime_request.v1|v2 or
paperclip.interaction_request.v1>}``, checked against ``request.schema.json``) becomes one
``runtime_request`` interaction on the run's issue, asked by the run's agent, with the payload
``{requestId, type, request, sourceEventId}``; a repeated ``requestId`` on the run is the same
interaction. A run without an issue has nowhere to ask: the request is kept on the session (its
snapshot on the run page) and in the run log, and ends as the runner's events say.
``runtime_request.resolved`` / ``.expired`` / ``.cancelled`` close a still-pending interaction
(answered / expired / cancelled), with no command.

The board's answer (services.thread.interaction_respond, in its transaction through
``events.interaction_responded_atomic``) becomes a ``request.resolve`` command linked to the
interaction, payload ``{"requestId": …, "response": R}``:

* permission: accepted -> ``{"decision": "allow"}``, rejected -> ``{"decision": "deny"}``;
* question (``input``): answered with a question set (v2) -> ``{"answers": {questionId:
  {"answers": [option ids or text]}}}`` checked against the questions, else ``{"text": …}``;
  rejected -> ``{"decision": "deny"}``;
* cancelled by the board -> ``{"decision": "cancel"}``; ``"choice"`` carries a listed choice key.

An answer that does not fit the request is refused (the answer rolls back). An answer after the
run ended (or before the runner said hello) still closes the interaction, with no command; its
response says ``"delivery": "not_delivered"`` and the run log says why.
"""
from __future__ import annotations

from django.utils import timezone

from issues import events
from issues.actors import Actor
from issues.choices import LIVE_RUN_STATUSES, InteractionKind, InteractionStatus
from issues.exceptions import InvalidInput
from issues.models import Agent, HeartbeatRun, Interaction, RunnerSession
from issues.services.activity import activity_record

from . import contract
from .commands import command_issue
from .host_control import log

CREATED = "runtime_request.created"
# A runner cannot flood an issue with questions: later requests are logged, not asked.
MAX_REQUESTS_PER_RUN = 50
CLOSING = {"runtime_request.resolved": InteractionStatus.ANSWERED,
           "runtime_request.expired": InteractionStatus.EXPIRED,
           "runtime_request.cancelled": InteractionStatus.CANCELLED}
RESOLVE = "request.resolve"
PERMISSION = "permission"


def request_problem(request) -> str | None:
    """Why ``request`` is no valid request document (its JSON path and the reason), or None. The
    intake already refuses such an event; this keeps the projection safe on its own."""
    try:
        contract.validate_request(request, at="$.payload.request")
    except contract.ContractError as exc:
        return f"{exc.field}: {exc.message}"
    return None


def request_type(request: dict) -> str:
    """permission / input for a runtime request; the kind of an issue-thread request."""
    return str(request.get("type") or request.get("kind") or "input")


def _envelope(event) -> dict:
    return event if isinstance(event, dict) else event.envelope


def _agent_actor(run: HeartbeatRun) -> Actor:
    """The runner asks on behalf of the run's agent, with the run (as its key's requests do)."""
    return Actor(agent=Agent.objects.get(pk=run.agent_id), _run=run)


def _interaction_for(run_id, request_id, *, lock=False):
    qs = Interaction.objects.filter(run_id=run_id, kind=InteractionKind.RUNTIME_REQUEST, payload__requestId=request_id)
    return (qs.select_for_update() if lock else qs).first()


# --- runner -> host ----------------------------------------------------------------------------------
def project_request_event(*, session: RunnerSession, event):
    """Project one runtime_request.* event (inside the intake's transaction, run and session
    locked). Returns the interaction it created or closed, if any."""
    envelope = _envelope(event)
    payload = envelope.get("payload") if isinstance(envelope.get("payload"), dict) else {}
    run = HeartbeatRun.objects.get(pk=session.pk)
    event_type = envelope.get("eventType")
    if event_type == CREATED:
        return _created(run, envelope, payload)
    if event_type in CLOSING:
        return _closed(run, envelope, payload, CLOSING[event_type])
    return None


def _created(run: HeartbeatRun, envelope: dict, payload: dict):
    request = payload.get("request")
    problem = request_problem(request)
    event_id = envelope.get("sourceEventId")
    if problem:
        log(run.pk, f"Runtime request not asked: {problem}.", sourceEventId=event_id)
        return None
    request_id, kind = request["requestId"], request_type(request)
    existing = _interaction_for(run.pk, request_id)
    if existing is not None:
        log(run.pk, f"Runtime request {request_id} was already asked (interaction {existing.pk}); not asked twice.",
            requestId=request_id, sourceEventId=event_id)
        return existing
    if request.get("status", "pending") != "pending":
        log(run.pk, f"Runtime request {request_id} arrived {request['status']}; nothing to ask.", requestId=request_id)
        return None
    if run.issue_id is None:
        log(run.pk, f"Runtime request {request_id} ({kind}) has no issue to be asked on: it stays on the "
                    "run's session until the runner resolves, expires or cancels it.", requestId=request_id)
        return None
    asked = Interaction.objects.filter(run_id=run.pk, kind=InteractionKind.RUNTIME_REQUEST).count()
    if asked >= MAX_REQUESTS_PER_RUN:
        log(run.pk, f"Runtime request {request_id} ({kind}) not asked: the run already asked {asked} "
                    f"(at most {MAX_REQUESTS_PER_RUN} per run).", requestId=request_id, sourceEventId=event_id)
        return None
    prompt = str(request.get("prompt") or (request.get("payload") or {}).get("title") or f"Runner request {request_id}")
    question_set = request.get("input") if isinstance(request.get("input"), dict) else {}
    interaction = Interaction.objects.create(
        company_id=run.company_id, issue_id=run.issue_id, kind=InteractionKind.RUNTIME_REQUEST,
        title=prompt[:300], body=prompt if len(prompt) > 300 else str(question_set.get("description") or ""),
        payload={"requestId": request_id, "type": kind, "request": request, "sourceEventId": event_id},
        created_by_agent_id=run.agent_id, run=run)
    activity_record(actor=_agent_actor(run), company_id=run.company_id, action="interaction.created",
                    entity_type="issue", entity_id=run.issue_id, run=run,
                    details={"interactionId": str(interaction.pk), "kind": InteractionKind.RUNTIME_REQUEST,
                             "requestId": request_id, "requestType": kind, "documentRevisionId": None})
    log(run.pk, f"Runtime request {request_id} ({kind}) asked on the issue as interaction {interaction.pk}.",
        requestId=request_id, interactionId=str(interaction.pk))
    return interaction


def _closed(run: HeartbeatRun, envelope: dict, payload: dict, status: str):
    request = payload.get("request") if isinstance(payload.get("request"), dict) else {}
    request_id = payload.get("requestId") or request.get("requestId")
    if not isinstance(request_id, str) or not request_id:
        log(run.pk, f"{envelope.get('eventType')} names no requestId; nothing closed.")
        return None
    interaction = _interaction_for(run.pk, request_id, lock=True)
    if interaction is None or interaction.status != InteractionStatus.PENDING:
        return interaction  # never asked (no issue), or the board answered it already
    interaction.status, interaction.responded_at = status, timezone.now()
    interaction.response = {"closedBy": "runner", "eventType": envelope.get("eventType"),
                            "sourceEventId": envelope.get("sourceEventId")}
    interaction.save(update_fields=["status", "responded_at", "response", "updated_at"])
    activity_record(actor=_agent_actor(run), company_id=run.company_id, action="interaction.closed",
                    entity_type="issue", entity_id=interaction.issue_id, run=run,
                    details={"interactionId": str(interaction.pk), "status": status, "requestId": request_id})
    log(run.pk, f"Runtime request {request_id} {status} by the runner; interaction {interaction.pk} closed.",
        requestId=request_id, interactionId=str(interaction.pk))
    return interaction


# --- board -> runner -----------------------------------------------------------------------------------
def _words(values) -> list[str]:
    if values is None:
        return []
    values = values if isinstance(values, list) else [values]
    return [str(v).strip() for v in values if str(v).strip()]


def _text_problem(value: str, rules: dict) -> str | None:
    if "minLength" in rules and len(value) < rules["minLength"]:
        return f"At least {rules['minLength']} characters."
    if "maxLength" in rules and len(value) > rules["maxLength"]:
        return f"At most {rules['maxLength']} characters."
    kind = rules.get("inputType")
    if kind in ("number", "integer"):
        try:
            number = int(value) if kind == "integer" else float(value)
        except ValueError:
            return f"An {kind} is required." if kind == "integer" else "A number is required."
        if "minimum" in rules and number < rules["minimum"]:
            return f"At least {rules['minimum']}."
        if "maximum" in rules and number > rules["maximum"]:
            return f"At most {rules['maximum']}."
    # textValidation.pattern is not evaluated here: it is the runner's regex (a backtracking one
    # would hang this worker under the run's lock); the runner checks its own pattern.
    return None


def question_answers(questions: list, answers) -> dict:
    """``{questionId: {"answers": [...]}}`` for a question set, or InvalidInput naming each
    question whose answer does not fit (required, option ids, custom answers, text rules)."""
    answers = answers if isinstance(answers, dict) else {}
    known = {q["id"] for q in questions}
    errors = {qid: ["No such question."] for qid in answers if qid not in known}
    resolved = {}
    for question in questions:
        values = _words(answers.get(question["id"]))
        options = {o["id"] for o in question.get("options") or []}
        custom = (question.get("customAnswer") or {}).get("enabled") is True
        mode = question["answerMode"]
        problem = None
        if not values:
            problem = "An answer is required." if question.get("required") else None
        elif mode in ("single_select", "text") and len(values) > 1:
            problem = "One answer only."
        elif mode == "text":
            problem = _text_problem(values[0], question.get("textValidation") or {})
        elif not custom and any(v not in options for v in values):
            problem = f"Choose from: {', '.join(sorted(options))}."
        elif custom and sum(v not in options for v in values) > 1:
            problem = "One custom answer only."
        if problem:
            errors[question["id"]] = [problem]
        elif values:
            resolved[question["id"]] = {"answers": values}
    if errors:
        raise InvalidInput("The answer does not fit the runner's questions.", details={"answers": errors})
    return resolved


def resolve_response(interaction: Interaction) -> dict:
    """The ``response`` of the request.resolve command for the board's answer (see the module
    docstring), or InvalidInput when the answer does not fit the request."""
    request = interaction.payload.get("request") or {}
    kind, status = interaction.payload.get("type"), interaction.status
    answer = interaction.response if isinstance(interaction.response, dict) else {}
    choice = answer.get("choice")
    choices = {c.get("key") for c in request.get("choices") or [] if isinstance(c, dict)}
    if choice is not None and choice not in choices:
        raise InvalidInput(details={"choice": [f"Choose from: {', '.join(sorted(map(str, choices))) or 'none'}."]})
    extra = {"choice": choice} if choice is not None else {}
    if status == InteractionStatus.CANCELLED:
        return {"decision": "cancel"}
    if kind == PERMISSION:
        if status == InteractionStatus.ANSWERED:
            raise InvalidInput(details={"status": ["A permission request is accepted (allow) or rejected (deny)."]})
        return {"decision": "allow" if status == InteractionStatus.ACCEPTED else "deny", **extra}
    if status == InteractionStatus.ACCEPTED:
        raise InvalidInput(details={"status": ["A question is answered or rejected."]})
    if status == InteractionStatus.REJECTED:
        return {"decision": "deny"}
    questions = (request.get("input") or {}).get("questions") if isinstance(request.get("input"), dict) else None
    if questions:
        return {"answers": question_answers(questions, answer.get("answers"))}
    text = str(answer.get("answer") or answer.get("text") or "").strip()
    if not text and not extra:
        raise InvalidInput(details={"answer": ["An answer is required."]})
    return {"text": text, **extra} if text else extra


def _on_answer(sender, interaction, actor, **kwargs):
    """interaction_responded_atomic: the board answered a runner's request (run row locked by
    interaction_respond, before the interaction)."""
    if interaction.kind != InteractionKind.RUNTIME_REQUEST:
        return
    response = resolve_response(interaction)
    request_id = interaction.payload.get("requestId")
    run = HeartbeatRun.objects.filter(pk=interaction.run_id).first() if interaction.run_id else None
    session = run and RunnerSession.objects.filter(pk=run.pk, protocol_version__isnull=False).first()
    answer = dict(interaction.response or {})
    if run is None or session is None or run.status not in LIVE_RUN_STATUSES:
        why = "the run has ended" if run is not None else "the run is gone"
        answer["delivery"] = {"status": "not_delivered", "reason": why}
        if run is not None:
            log(run.pk, f"The answer to runtime request {request_id} was recorded but not sent: {why}.",
                requestId=request_id, interactionId=str(interaction.pk))
    else:
        command = command_issue(session=session, command_type=RESOLVE,
                                payload={"requestId": request_id, "response": response}, interaction=interaction)
        answer["delivery"] = {"status": "sent", "commandId": command.command_id, "controllerSeq": command.controller_seq}
        log(run.pk, f"The board answered runtime request {request_id} ({interaction.status}): request.resolve sent "
                    f"as command {command.controller_seq}.", requestId=request_id, commandId=command.command_id)
    interaction.response = answer
    Interaction.objects.filter(pk=interaction.pk).update(response=answer)


def connect():
    events.interaction_responded_atomic.connect(_on_answer, dispatch_uid="issues.runner.request_resolve")
