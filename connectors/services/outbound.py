"""The outbound write engine (§10, layer 4).

Effects are rows of the outbox (``OutboundEffect``), recorded inside the transaction of the
Paperclip change that caused them (connectors.receivers subscribes to the issues app's in-transaction
signals) and keyed ``(link, kind, source id)``, so a change can never produce the same write twice.
Workers drain them (``connectors.tasks.deliver_outbound`` after commit, the sweep as the safety
net) with bounded retries and backoff through the adapter's optional write methods. Every write is
checked against the link's sync mode, field policy and write toggles (§10.2 defaults) both when it
is recorded and when it is delivered; every mirrored comment carries agent attribution, the issue
link and a stable hidden marker ``<!-- paperclip:effect:<id> -->`` (§10.4).

Nothing in the issues or cases apps calls a provider: they only send signals."""
from __future__ import annotations

import logging
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from connectors.choices import (
    InstanceStatus,
    LinkStatus,
    OutboundKind,
    OutboundStatus,
    StateCategory,
)
from connectors.models import ConnectorInstance, OutboundEffect, TaskLink, default_write_policy
from connectors.providers.base import ExternalTaskRef
from issues.actors import SYSTEM
from issues.choices import IssueStatus
from issues.services.activity import activity_record

from .common import adapter_class, adapter_for, conf, failure_of, retry_backoff, sync_error_record

log = logging.getLogger("connectors.outbound")

WRITE_SYNC_MODES = ("bidirectional", "export_only")
MILESTONE_DEBOUNCE = timedelta(minutes=5)  # §10.2: per link, except claim/done/review
UNDEBOUNCED_MILESTONES = ("claim", "done", "review", "failure", "state")
DELIVERY_LEASE = timedelta(seconds=120)  # a claimed delivery is retried after this if its worker died
RECENT_OUTBOUND = timedelta(days=7)  # echo suppression window for outbound keys
MARKER = "<!-- paperclip:effect:{id} -->"

# Paperclip status -> the external state category it projects to (§10.3); todo is not projected.
STATUS_CATEGORY = {IssueStatus.BACKLOG: StateCategory.BACKLOG, IssueStatus.IN_PROGRESS: StateCategory.ACTIVE,
                   IssueStatus.IN_REVIEW: StateCategory.REVIEW, IssueStatus.BLOCKED: StateCategory.BLOCKED,
                   IssueStatus.DONE: StateCategory.TERMINAL, IssueStatus.CANCELLED: StateCategory.TERMINAL}
# state_mapping sections whose keys are not state names (Linear types, Jira categories, overrides)
NOT_STATE_NAMES = {"types", "categories", "teams", "projects", "priorities", "issuetype", "labels_override_closed"}
OPERATION = {OutboundKind.COMMENT: "post_comment", OutboundKind.BACKLINK: "set_backlink",
             OutboundKind.STATE: "update_task_state", OutboundKind.FIELDS: "set_fields"}


# ------------------------------------------------------------------------------------------ policy
def write_policy(link: TaskLink, instance: ConnectorInstance | None = None) -> dict:
    """§10.2 toggles: protocol defaults < instance write policy < link overrides."""
    instance = instance or link.instance
    return {**default_write_policy(), **(instance.write_policy or {}), **(link.write_policy or {})}


def toggle_on(link: TaskLink, name: str) -> bool:
    return bool(write_policy(link).get(name))


def write_refusal(link: TaskLink, kind: str, *, toggle: str | None = None, field: str | None = None) -> str:
    """Why this write may not happen ('' when it may): sync mode, capability, toggle, field policy."""
    if link.status == LinkStatus.UNLINKED:
        return "link unlinked"
    if link.sync_mode not in WRITE_SYNC_MODES:
        return f"sync mode {link.sync_mode}"
    try:
        operations = adapter_class(link.provider_key).capabilities.operations
    except LookupError:
        return f"unknown provider {link.provider_key}"
    if OPERATION[kind] not in operations:
        return f"provider cannot {OPERATION[kind]}"
    if toggle and not toggle_on(link, toggle):
        return f"{toggle} is off"
    if field and (link.field_policy or {}).get(field, "external") == "external":
        return f"fieldPolicy.{field} is external"
    return ""


def closure_allowed(link: TaskLink) -> bool:
    """§10.3: done/cancelled project to a terminal state only when fieldPolicy.state gives Paperclip the
    closure (``paperclip``, or ``closure: paperclip`` next to a shared state)."""
    policy = link.field_policy or {}
    return policy.get("state") == "paperclip" or policy.get("closure") == "paperclip"


def state_name_for(link: TaskLink, category: str) -> str | None:
    """The inverse of the state mapping (§10.3): the operator-mapped state name of a category, or None.
    ``config.outboundStates`` ({category: name}) wins; otherwise the first mapped name in the mapping."""
    instance = link.instance
    explicit = (instance.config or {}).get("outboundStates") or {}
    if isinstance(explicit.get(category), str) and explicit[category].strip():
        return explicit[category].strip()

    def walk(mapping):
        if isinstance(mapping, dict):
            items = list(mapping.items())
        elif isinstance(mapping, (list, tuple)):
            items = [tuple(p) for p in mapping if isinstance(p, (list, tuple)) and len(p) == 2]
        else:
            return None
        for key, value in items:
            if str(key).lower() in NOT_STATE_NAMES:
                continue
            if isinstance(value, str) and value == category:
                return str(key)
            if isinstance(value, (dict, list, tuple)):
                found = walk(value)
                if found:
                    return found
        return None

    return walk(instance.state_mapping or {})


def issue_url(issue) -> str:
    return f"{conf('PUBLIC_BASE_URL').rstrip('/')}/issues/{issue.identifier}"


def attribution(agent_name: str | None, issue) -> str:
    who = f"{agent_name} via Paperclip" if agent_name else "Paperclip"
    return f"**{who}** · [{issue.identifier}]({issue_url(issue)})"


def marker(effect_id) -> str:
    return MARKER.format(id=effect_id)


# ---------------------------------------------------------------------------------------- recording
def _links_of(issue_id):
    return list(TaskLink.objects.select_related("instance").filter(issue_id=issue_id)
                .exclude(status=LinkStatus.UNLINKED))


def effect_record(*, link: TaskLink, kind: str, source_id: str, payload: dict,
                  milestone: str = "") -> OutboundEffect | None:
    """Insert the effect once per (link, kind, source id) in the caller's transaction and drain it
    after commit. Progress milestones are debounced per link (batched into one pending comment)."""
    now = timezone.now()
    due = now
    payload = {**payload, **({"milestone": milestone} if milestone else {})}
    if kind == OutboundKind.COMMENT and milestone and milestone not in UNDEBOUNCED_MILESTONES:
        # Callers hold the issue's row lock (every issue change takes it), which serializes this per link;
        # the link row is not locked here (the inbound path locks link+issue together: no lock cycle).
        row = TaskLink.objects.only("pk", "last_milestone_at").get(pk=link.pk)
        pending = (OutboundEffect.objects.select_for_update().filter(
            link=link, kind=OutboundKind.COMMENT, status=OutboundStatus.PENDING, payload__milestone=milestone,
            attempts=0).order_by("id").first())
        if pending is not None:
            # batch into the comment already waiting for its window (one comment per 5 minutes)
            pending.payload = {**pending.payload, "lines": [*pending.payload.get("lines", []),
                                                             *payload.get("lines", [])][-10:]}
            pending.save(update_fields=["payload"])
            return pending
        if row.last_milestone_at and row.last_milestone_at + MILESTONE_DEBOUNCE > now:
            due = row.last_milestone_at + MILESTONE_DEBOUNCE
        TaskLink.objects.filter(pk=link.pk).update(last_milestone_at=due)
    effect, created = OutboundEffect.objects.get_or_create(
        link=link, kind=kind, source_id=source_id[:300],
        defaults={"company_id": link.company_id, "instance_id": link.instance_id, "payload": payload,
                  "next_attempt_at": due})
    if created:
        _kick(effect.pk, due)
    return effect


def _kick(effect_id, due):
    from connectors import tasks

    def send():
        try:
            countdown = max((due - timezone.now()).total_seconds(), 0)
            if countdown:
                tasks.deliver_outbound.apply_async((effect_id,), countdown=countdown)
            else:
                tasks.deliver_outbound.delay(effect_id)
        except Exception:  # broker down: the sweep delivers it
            log.warning("outbound effect %s not kicked; the sweep will deliver it", effect_id)

    transaction.on_commit(send)



def _comment(link: TaskLink, source_id: str, milestone: str, text: str, agent_name: str | None, toggle: str):
    if write_refusal(link, OutboundKind.COMMENT, toggle=toggle):
        return None
    return effect_record(link=link, kind=OutboundKind.COMMENT, source_id=source_id, milestone=milestone,
                         payload={"lines": [text], "agent": agent_name or "", "issueId": str(link.issue_id)})


def _agent_name(issue) -> str | None:
    agent = issue.assignee_agent if issue.assignee_agent_id else None
    return agent.name if agent else None


def status_changed(*, issue, old: str, new: str, actor=None):
    """§10.3 status projection for every linked, write-enabled link of the issue."""
    stamp = (issue.updated_at or timezone.now()).isoformat()
    for link in _links_of(issue.pk):
        if write_refusal(link, OutboundKind.COMMENT) and write_refusal(link, OutboundKind.STATE):
            continue
        category = STATUS_CATEGORY.get(new)
        if category is None:
            continue
        name = _agent_name(issue)
        source = f"status:{new}:{stamp}"
        state_ok = not write_refusal(link, OutboundKind.STATE, toggle="projectStatus", field="state")
        if category == StateCategory.TERMINAL:
            target = state_name_for(link, StateCategory.TERMINAL) if closure_allowed(link) else None
            if target and state_ok and link.external_state_category != StateCategory.TERMINAL:
                effect_record(link=link, kind=OutboundKind.STATE, source_id=source,
                              payload={"stateName": target, "category": category, "status": new})
                _comment(link, f"done:{stamp}", "done", f"Marked {new} in Paperclip; the task was moved to "
                                                         f"'{target}'.", name, "postProgressComments")
            else:
                _comment(link, f"done:{stamp}", "done",
                         f"Work is {new} in Paperclip. Closing the task is left to you here.", name,
                         "postProgressComments")
            continue
        if category == StateCategory.REVIEW:
            target = state_name_for(link, StateCategory.REVIEW)
            if target and state_ok:
                if link.external_state_category != StateCategory.REVIEW:
                    effect_record(link=link, kind=OutboundKind.STATE, source_id=source,
                                  payload={"stateName": target, "category": category, "status": new})
                _comment(link, f"review:{stamp}", "review", "Ready for review.", name, "postProgressComments")
            elif toggle_on(link, "projectStatus"):
                _comment(link, f"review:{stamp}", "review", "Review requested: the work is ready for review.",
                         name, "projectStatus")
            continue
        if link.external_state_category == category:
            continue  # already there (e.g. the change came from the tracker)
        target = state_name_for(link, category)
        if target and state_ok:
            effect_record(link=link, kind=OutboundKind.STATE, source_id=source,
                          payload={"stateName": target, "category": category, "status": new})
        elif toggle_on(link, "projectStatus"):
            _comment(link, f"status:{new}:{stamp}", "state", f"Status in Paperclip is now '{new}'.", name,
                     "projectStatus")


def claimed(*, issue, run_id):
    """Checkout is the claim (§9.2); projected as a status comment (§10.3 claim/run state)."""
    for link in _links_of(issue.pk):
        name = _agent_name(issue)
        _comment(link, f"claim:{run_id}", "claim", f"{name or 'An agent'} picked this up (run {str(run_id)[:8]}).",
                 name, "postProgressComments")
    if issue.status == IssueStatus.IN_PROGRESS:
        status_changed(issue=issue, old="", new=IssueStatus.IN_PROGRESS)  # checkout moved it to in_progress


def agent_comment(*, comment):
    """mirrorAgentComments mirrors the whole comment; otherwise postProgressComments posts a concise,
    debounced progress line. Only agent-authored comments leave Paperclip."""
    if not comment.author_agent_id:
        return
    issue = comment.issue
    agent_name = comment.author_agent.name if comment.author_agent_id else None
    for link in _links_of(issue.pk):
        if toggle_on(link, "mirrorAgentComments"):
            _comment(link, f"comment:{comment.pk}", "mirror", comment.body, agent_name, "mirrorAgentComments")
            continue
        first = next((line.strip() for line in comment.body.splitlines() if line.strip()), "")
        if first:
            summary = first if len(first) <= 280 else first[:277] + "…"
            _comment(link, f"progress:{comment.pk}", "progress", summary, agent_name, "postProgressComments")


FAILED_RUN_STATUSES = ("failed", "timed_out", "interrupted")


def run_finished(*, run):
    """A failed or abandoned run is reported on the tracker visibly, with what happens next."""
    if run.status not in FAILED_RUN_STATUSES or run.issue_id is None:
        return
    from issues.services.runs import next_retry_attempt, runtime_setting

    links = _links_of(run.issue_id)
    if not links:
        return
    attempt = next_retry_attempt(run, run.agent)  # the host's own retry rule, not a guess at it
    if attempt is not None:
        limit = runtime_setting(run.agent, "maxRetries", "RUN_MAX_RETRIES")
        nxt = f"Paperclip retries automatically (attempt {attempt} of {limit})."
    else:
        nxt = "No automatic retry is left: the issue waits for someone in Paperclip to look at it."
    reason = (run.error or run.liveness_reason or run.status).strip().splitlines()[0][:300] if (
        run.error or run.liveness_reason) else run.status
    for link in links:
        _comment(link, f"run:{run.pk}:failure", "failure",
                 f"The agent run {run.status.replace('_', ' ')}: {reason}. {nxt}", run.agent.name,
                 "postProgressComments")


# ---------------------------------------------------------------------------------------- delivery
def _render(effect: OutboundEffect, link: TaskLink) -> str:
    payload = effect.payload or {}
    lines = payload.get("lines") or ([payload["body"]] if payload.get("body") else [])
    text = "\n\n".join(lines) if payload.get("milestone") == "mirror" else "\n".join(
        f"- {line}" if len(lines) > 1 else line for line in lines)
    head = attribution(payload.get("agent") or None, link.issue)
    return f"{head}\n\n{text}\n\n{marker(effect.pk)}"


def _refusal_at_delivery(effect: OutboundEffect, link: TaskLink) -> str:
    milestone = (effect.payload or {}).get("milestone", "")
    toggle = {"mirror": "mirrorAgentComments", "state": "projectStatus"}.get(milestone, "postProgressComments") \
        if effect.kind == OutboundKind.COMMENT and milestone else None
    if effect.kind == OutboundKind.STATE:
        return write_refusal(link, effect.kind, toggle="projectStatus", field="state")
    if effect.kind == OutboundKind.BACKLINK:
        return write_refusal(link, effect.kind, toggle="postBacklink")
    if effect.kind == OutboundKind.FIELDS:
        for field in (effect.payload or {}).get("fields", {}):
            refusal = write_refusal(link, effect.kind, field=field)
            if refusal and not str(effect.source_id).startswith("conflict:"):
                return refusal
        return write_refusal(link, effect.kind)
    return write_refusal(link, effect.kind, toggle=toggle)



def effect_deliver(*, effect_id) -> str:
    """Deliver one due effect: claim it under a lease, write through the adapter outside any
    transaction, then record the outcome. A retry after a lost outcome (the write may have reached
    the provider) looks for the effect's marker first, so a comment is posted once."""
    now = timezone.now()
    with transaction.atomic():
        effect = (OutboundEffect.objects.select_for_update(skip_locked=True)
                  .filter(pk=effect_id, status=OutboundStatus.PENDING).first())
        if effect is None:
            return "not_pending"
        if effect.next_attempt_at and effect.next_attempt_at > now:
            return "not_due"
        link = TaskLink.objects.select_related("instance", "issue").get(pk=effect.link_id)
        if link.instance.status == InstanceStatus.PAUSED or link.status == LinkStatus.PAUSED:
            return "held"  # resumes with the link/instance (the sweep retries)
        refusal = _refusal_at_delivery(effect, link)
        if refusal:
            effect.status, effect.error_message = OutboundStatus.CANCELLED, f"not written: {refusal}"
            effect.save(update_fields=["status", "error_message"])
            return "cancelled"
        resumed = effect.attempts > 0
        effect.attempts += 1
        effect.next_attempt_at = now + DELIVERY_LEASE
        effect.save(update_fields=["attempts", "next_attempt_at"])
    try:
        external_ref = _perform(effect, link, resumed)
    except NotImplementedError:
        OutboundEffect.objects.filter(pk=effect.pk).update(status=OutboundStatus.CANCELLED,
                                                           error_message="the provider does not implement it")
        return "cancelled"
    except Exception as exc:  # provider errors and anything else: retry with backoff, then give up
        return _failed(effect, link, exc)
    with transaction.atomic():
        OutboundEffect.objects.filter(pk=effect.pk).update(status=OutboundStatus.DONE, external_ref=external_ref or "",
                                                           done_at=timezone.now(), error_message="",
                                                           next_attempt_at=None)
        fields = {"last_outbound_at": timezone.now()}
        if effect.kind == OutboundKind.STATE:
            # what we wrote is now the tracker's state: the echo is not a change (and not a conflict)
            row = TaskLink.objects.select_for_update().get(pk=link.pk)
            base = dict(row.base_snapshot or {})
            ext = dict(base.get("external") or {})
            ext.update(state=effect.payload.get("stateName"), category=effect.payload.get("category"))
            fields.update(external_state_name=(effect.payload.get("stateName") or "")[:200],
                          external_state_category=effect.payload.get("category") or "",
                          base_snapshot={**base, "external": ext})
        TaskLink.objects.filter(pk=link.pk).update(**fields)
        activity_record(actor=SYSTEM, company_id=link.company_id, action="connector.outbound_written",
                        entity_type="connector_link", entity_id=link.pk,
                        details={"effectId": effect.pk, "kind": effect.kind, "sourceId": effect.source_id,
                                 "externalRef": external_ref or "", "attempts": effect.attempts,
                                 "instanceId": str(link.instance_id), "externalKey": link.external_key})
    return "done"


def _perform(effect: OutboundEffect, link: TaskLink, resumed: bool) -> str:
    adapter = adapter_for(link.instance)
    ref = ExternalTaskRef(external_id=link.external_task_id, external_key=link.external_key or None)
    payload = effect.payload or {}
    if effect.kind == OutboundKind.COMMENT:
        if resumed:
            found = _find_marked(adapter, ref, marker(effect.pk))
            if found:
                return found
        return str(adapter.post_comment(ref, _render(effect, link)) or "")
    if effect.kind == OutboundKind.STATE:
        adapter.update_task_state(ref, payload["stateName"])
        return payload["stateName"]
    if effect.kind == OutboundKind.FIELDS:
        adapter.set_fields(ref, payload.get("fields") or {})
        return ""
    if effect.kind == OutboundKind.BACKLINK:
        adapter.set_backlink(ref, payload.get("url") or issue_url(link.issue))
        return ""
    raise NotImplementedError(effect.kind)


def _find_marked(adapter, ref, mark: str) -> str | None:
    cursor = None
    for _ in range(20):
        page = adapter.list_comments(ref, cursor)
        for comment in page.items:
            if mark in (comment.body or ""):
                return comment.external_comment_id
        if not page.cursor or page.cursor == cursor:
            return None
        cursor = page.cursor
    return None


def _failed(effect: OutboundEffect, link: TaskLink, exc: Exception) -> str:
    category, message = failure_of(exc)
    with transaction.atomic():
        row = OutboundEffect.objects.select_for_update().get(pk=effect.pk)
        row.error_message = message
        if row.attempts >= int(conf("MAX_ATTEMPTS")):
            row.status, row.next_attempt_at = OutboundStatus.FAILED, None
            result = "failed"
        else:
            row.next_attempt_at = timezone.now() + retry_backoff(row.attempts, getattr(exc, "retry_after", None))
            result = "retry"
        row.save(update_fields=["status", "error_message", "next_attempt_at"])
        sync_error_record(instance=link.instance, category=category, link=link,
                          message=f"Outbound {row.kind} {row.source_id} (attempt {row.attempts}) "
                                  f"{'gave up' if result == 'failed' else 'failed'}: {message}",
                          details={"effectId": row.pk})
    if result == "retry":
        from connectors import tasks

        try:
            tasks.deliver_outbound.apply_async((row.pk,), countdown=max(
                (row.next_attempt_at - timezone.now()).total_seconds(), 0))
        except Exception:
            pass
    return result


def effects_due(limit: int | None = None) -> list[int]:
    """Pending effects whose time has come (new, retry due, or a lease that expired)."""
    now = timezone.now()
    from django.db.models import Q

    return list(OutboundEffect.objects.filter(status=OutboundStatus.PENDING)
                .filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now))
                .order_by("id").values_list("pk", flat=True)[:limit or int(conf("SWEEP_BATCH"))])


def recent_outbound_ref(instance, external_ref: str) -> bool:
    """Echo suppression (§10.4): an inbound object we wrote ourselves recently."""
    if not external_ref:
        return False
    return OutboundEffect.objects.filter(instance=instance, external_ref=str(external_ref),
                                         done_at__gte=timezone.now() - RECENT_OUTBOUND).exists()
